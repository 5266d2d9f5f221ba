//! Label and field selectors, as the API server applies the `labelSelector`
//! and `fieldSelector` query parameters of list and watch requests.
//!
//! Parsing follows `k8s.io/apimachinery/pkg/labels.Parse` and
//! `k8s.io/apimachinery/pkg/fields.ParseSelector` closely, including their
//! error messages, because clients (kubectl, client-go based tests) surface
//! those messages verbatim and tests may assert on them.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

/// Why a selector was refused. `Display` gives the message the real server
/// puts in the 400 `Status` it answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The selector text does not parse.
    #[error("{reason}")]
    Invalid { selector: String, reason: String },
    /// A field selector names a field the resource cannot be selected by.
    #[error("{reason}")]
    UnsupportedField { field: String, reason: String },
}

fn invalid(selector: &str, reason: String) -> SelectorError {
    SelectorError::Invalid {
        selector: selector.to_string(),
        reason,
    }
}

// ---------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    /// Sorted and deduplicated, as upstream keeps them in a `sets.String`.
    values: Vec<String>,
}

impl Requirement {
    fn has_value(&self, value: &str) -> bool {
        self.values.iter().any(|v| v == value)
    }

    fn matches(&self, labels: &Map<String, Value>) -> bool {
        let value = labels.get(&self.key).and_then(label_text);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                value.is_some_and(|v| self.has_value(&v))
            }
            Operator::NotIn | Operator::NotEquals => value.is_none_or(|v| !self.has_value(&v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                // Upstream treats unparsable numbers on either side as "no match"
                // rather than an error, so a bad label never fails a list.
                let Some(have) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let [want] = self.values.as_slice() else {
                    return false;
                };
                let Ok(want) = want.parse::<i64>() else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in ",
            Operator::NotIn => " notin ",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
        };
        let values = self.values.join(",");
        if matches!(self.operator, Operator::In | Operator::NotIn) {
            write!(f, "{op}({values})")
        } else {
            write!(f, "{op}{values}")
        }
    }
}

/// A label value as a string; `None` when the label is absent. Labels are
/// strings in valid objects, other scalars are compared by their JSON text.
fn label_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// A parsed `labelSelector`: the AND of its requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// Sorted by key (stable), as upstream sorts after parsing.
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the string form: `""`, `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
    /// `a notin (x)`, `a`, `!a`, `a>1`, `a<1`, comma-separated (AND).
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut parser = Parser::new(text);
        let mut requirements = parser.parse().map_err(|reason| invalid(text, reason))?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement; an
    /// object without labels is treated as having none.
    pub fn matches(&self, object: &Value) -> bool {
        match object
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
        {
            Some(labels) => self.matches_labels(labels),
            None => self.matches_labels(&Map::new()),
        }
    }

    /// Whether a label map satisfies every requirement.
    pub fn matches_labels(&self, labels: &Map<String, Value>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector selects everything.
    #[allow(dead_code)] // selector API pinned by the tests; the server matches whole selectors
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// The canonical form upstream's `Selector.String()` gives: requirements
/// sorted by key, set values sorted.
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// Upstream's lexer can produce it in theory; kept so the parser's error
    /// paths stay identical if that ever happens.
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn keyword_token(literal: &[u8]) -> Option<Token> {
    Some(match literal {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(ch: u8) -> bool {
    matches!(ch, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// A byte-level port of upstream's lexer, NUL-as-end quirk included, so that
/// odd inputs tokenize the same way.
struct Lexer<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn read(&mut self) -> u8 {
        match self.text.as_bytes().get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    // Token boundaries always fall on ASCII bytes, so the slice is on char
    // boundaries; `get` keeps that an invariant rather than a panic.
    fn slice(&self, start: usize, end: usize) -> &'a str {
        self.text.get(start..end).unwrap_or_default()
    }

    fn lex(&mut self) -> (Token, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return (Token::EndOfString, String::new());
        }
        self.unread();
        if is_special_symbol(ch) {
            self.scan_special_symbol()
        } else {
            self.scan_id_or_keyword()
        }
    }

    fn scan_id_or_keyword(&mut self) -> (Token, String) {
        let start = self.pos;
        let mut end = start;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special_symbol(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            end = self.pos;
        }
        let literal = self.slice(start, end);
        let token = keyword_token(literal.as_bytes()).unwrap_or(Token::Identifier);
        (token, literal.to_string())
    }

    fn scan_special_symbol(&mut self) -> (Token, String) {
        let start = self.pos;
        let mut last: Option<(Token, usize)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special_symbol(ch) {
                self.unread();
                break;
            }
            match keyword_token(self.slice(start, self.pos).as_bytes()) {
                Some(token) => last = Some((token, self.pos)),
                None if last.is_some() => {
                    self.unread();
                    break;
                }
                None => {}
            }
        }
        match last {
            Some((token, end)) => (token, self.slice(start, end).to_string()),
            None => (
                Token::Error,
                format!(
                    "error expected: keyword found '{}'",
                    self.slice(start, self.pos)
                ),
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    /// `in` and `notin` are plain identifiers here, so `in in (in)` parses.
    Values,
}

struct Parser {
    items: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn new(text: &str) -> Self {
        let mut lexer = Lexer { text, pos: 0 };
        let mut items = Vec::new();
        loop {
            let item = lexer.lex();
            let end = item.0 == Token::EndOfString;
            items.push(item);
            if end {
                break;
            }
        }
        Parser { items, position: 0 }
    }

    fn item(&self, position: usize, context: Context) -> (Token, String) {
        let (token, literal) = self
            .items
            .get(position)
            .cloned()
            .unwrap_or((Token::EndOfString, String::new()));
        let token = match (context, token) {
            (Context::Values, Token::In | Token::NotIn) => Token::Identifier,
            (_, token) => token,
        };
        (token, literal)
    }

    fn lookahead(&self, context: Context) -> (Token, String) {
        self.item(self.position, context)
    }

    fn consume(&mut self, context: Context) -> (Token, String) {
        self.position += 1;
        self.item(self.position - 1, context)
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    let requirement = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(requirement);
                    let (token, literal) = self.consume(Context::Values);
                    match token {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (next, literal) = self.lookahead(Context::Values);
                            if next != Token::Identifier && next != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{literal}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => {
                            return Err(format!(
                                "found '{literal}', expected: ',' or 'end of string'"
                            ));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, inferred) = self.parse_key_and_infer_operator()?;
        if let Some(operator) = inferred {
            return new_requirement(key, operator, Vec::new());
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, operator, values.into_iter().collect())
    }

    /// Returns the key and, for `!key` and a bare `key`, the unary operator.
    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut operator = None;
        let (mut token, mut literal) = self.consume(Context::Values);
        if token == Token::DoesNotExist {
            operator = Some(Operator::DoesNotExist);
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        // Upstream validates the key here with a nil field path, which is
        // where the odd "<nil>: Invalid value" prefix of its message comes from.
        if let Err(detail) = validate_label_key(&literal) {
            return Err(field_invalid("<nil>", &literal, &detail));
        }
        let (next, _) = self.lookahead(Context::Values);
        if (next == Token::EndOfString || next == Token::Comma) && operator.is_none() {
            operator = Some(Operator::Exists);
        }
        Ok((literal, operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (token, literal) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{literal}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{literal}' expected: '('"));
        }
        let (token, literal) = self.lookahead(Context::Values);
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                let (token, _) = self.consume(Context::Values);
                if token != Token::ClosedPar {
                    // Upstream reports the token after '(' here, not the
                    // offending one; kept for identical messages.
                    return Err(format!("found '{literal}', expected: ')'"));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!(
                "found '{literal}', expected: ',', ')' or identifier"
            )),
        }
    }

    /// Empty entries (`(,a)`, `(a,,b)`, `(a,)`) stand for the empty value.
    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut values = BTreeSet::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.insert(literal);
                    let (next, literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        _ => return Err(format!("found '{literal}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    let (next, _) = self.lookahead(Context::Values);
                    if next == Token::ClosedPar {
                        values.insert(String::new());
                        return Ok(values);
                    }
                    if next == Token::Comma {
                        self.consume(Context::Values);
                        values.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{literal}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        let (token, _) = self.lookahead(Context::Values);
        if token == Token::EndOfString || token == Token::Comma {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (token, literal) = self.consume(Context::Values);
        if token == Token::Identifier {
            Ok(BTreeSet::from([literal]))
        } else {
            Err(format!("found '{literal}', expected: identifier"))
        }
    }
}

/// Mirrors `labels.NewRequirement`'s value checks (the key was already
/// validated by the parser); errors are aggregated the way upstream does.
fn new_requirement(
    key: String,
    operator: Operator,
    values: Vec<String>,
) -> Result<Requirement, String> {
    let mut errors = Vec::new();
    if matches!(operator, Operator::GreaterThan | Operator::LessThan) {
        for (i, value) in values.iter().enumerate() {
            if value.parse::<i64>().is_err() {
                errors.push(field_invalid(
                    &format!("values[{i}]"),
                    value,
                    "for 'Gt', 'Lt' operators, the value must be an integer",
                ));
            }
        }
    }
    for (i, value) in values.iter().enumerate() {
        if let Err(detail) = validate_label_value(value) {
            errors.push(field_invalid(
                &format!("values[{i}][{key}]"),
                value,
                &detail,
            ));
        }
    }
    if errors.is_empty() {
        Ok(Requirement {
            key,
            operator,
            values,
        })
    } else {
        Err(aggregate(errors))
    }
}

/// `field.Invalid(path, value, detail).Error()` for a string value.
fn field_invalid(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {}: {detail}", go_quote(value))
}

/// `utilerrors.NewAggregate(...).Error()`: one error alone, several
/// deduplicated inside brackets.
fn aggregate(errors: Vec<String>) -> String {
    if errors.len() == 1 {
        return errors.into_iter().collect();
    }
    let mut seen: Vec<String> = Vec::new();
    for error in errors {
        if !seen.contains(&error) {
            seen.push(error);
        }
    }
    if seen.len() == 1 {
        return seen.into_iter().collect();
    }
    format!("[{}]", seen.join(", "))
}

/// Go's `%q` for strings, so bad values appear exactly as upstream quotes them.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                if (c as u32) <= 0xffff {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MAX_LENGTH: usize = 63;
const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

/// `validation.RegexError`, whose odd double spaces are part of the message.
fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    let mut out = format!("{message} (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{example}', "));
    }
    out.push_str(&format!("regex used for validation is '{format}')"));
    out
}

fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`, checked by hand to avoid a
/// regex dependency.
fn is_qualified_name_body(name: &str) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn is_dns1123_subdomain_body(value: &str) -> bool {
    value.split('.').all(|label| {
        let bytes = label.as_bytes();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                let end_ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
                end_ok(first) && end_ok(last) && bytes.iter().all(|b| end_ok(b) || *b == b'-')
            }
            _ => false,
        }
    })
}

fn validate_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !is_dns1123_subdomain_body(value) {
        errors.push(regex_error(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errors
}

/// `validation.IsQualifiedName`, with its messages joined by "; ".
fn validate_label_key(key: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_string());
            } else {
                errors.extend(
                    validate_dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            return Err(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errors.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !is_qualified_name_body(name) {
        errors.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// `validation.IsValidLabelValue`, with its messages joined by "; ".
fn validate_label_value(value: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errors.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !is_qualified_name_body(value) {
        errors.push(regex_error(
            LABEL_VALUE_ERR_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

// ---------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldOperator {
    /// `=` or `==`, which upstream treats alike.
    Equals,
    NotEquals,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    operator: FieldOperator,
    value: String,
}

/// A parsed `fieldSelector`: the AND of its terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// In the order of their sorted source text, as upstream evaluates them,
    /// so the first unsupported field reported is the one upstream reports.
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses `a=b`, `a==b`, `a!=b`, comma-separated (AND). Values may
    /// contain the escapes `\,` `\=` `\\`; field names are taken verbatim
    /// (no trimming), as upstream does.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(text);
        parts.sort_unstable();
        let mut terms = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, operator, raw)) = split_term(part) else {
                return Err(invalid(
                    text,
                    format!("invalid selector: '{text}'; can't understand '{part}'"),
                ));
            };
            let value = unescape_value(raw).map_err(|reason| invalid(text, reason))?;
            terms.push(FieldTerm {
                field: field.to_string(),
                operator,
                value,
            });
        }
        Ok(FieldSelector { terms })
    }

    /// The field paths used, each once, in evaluation order.
    #[allow(dead_code)] // selector API pinned by the tests; the server matches whole selectors
    pub fn fields(&self) -> Vec<&str> {
        let mut fields: Vec<&str> = Vec::new();
        for term in &self.terms {
            if !fields.contains(&term.field.as_str()) {
                fields.push(&term.field);
            }
        }
        fields
    }

    /// Rejects fields the real server refuses for this resource, with the
    /// message its field label conversion gives. Custom resources are not
    /// covered: their accepted fields come from the CRD.
    pub fn check_supported(&self, group: &str, plural: &str) -> Result<(), SelectorError> {
        let supported = supported_fields(group, plural);
        match self
            .terms
            .iter()
            .find(|t| !supported.contains(&t.field.as_str()))
        {
            Some(term) => Err(SelectorError::UnsupportedField {
                field: term.field.clone(),
                reason: unsupported_message(group, plural, &term.field),
            }),
            None => Ok(()),
        }
    }

    /// Whether every term holds for the object.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|term| {
            let actual = field_value(object, &term.field);
            match term.operator {
                FieldOperator::Equals => actual == term.value,
                FieldOperator::NotEquals => actual != term.value,
            }
        })
    }

    /// Whether the selector selects everything.
    #[allow(dead_code)] // selector API pinned by the tests; the server matches whole selectors
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The value an equality term requires of `field`, if any, so a caller
    /// can narrow a list (e.g. by `metadata.name`) before matching.
    #[allow(dead_code)] // selector API pinned by the tests; the server matches whole selectors
    pub fn required(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| {
                t.operator == FieldOperator::Equals
                    && (t.field == field || canonical_field(&t.field) == field)
            })
            .map(|t| t.value.as_str())
    }
}

/// Upstream's `Selector.String()`: terms joined by ",", values re-escaped.
impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = match term.operator {
                FieldOperator::Equals => "=",
                FieldOperator::NotEquals => "!=",
            };
            write!(f, "{}{op}{}", term.field, escape_value(&term.value))?;
        }
        Ok(())
    }
}

/// Splits on commas not escaped by a backslash; the backslashes stay in the
/// terms for `unescape_value` to handle.
fn split_terms(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in text.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(text.get(start..i).unwrap_or_default());
            start = i + 1;
        }
    }
    terms.push(text.get(start..).unwrap_or_default());
    terms
}

/// Splits at the first operator; the field part supports no escaping.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    const OPERATORS: [(&str, FieldOperator); 3] = [
        ("!=", FieldOperator::NotEquals),
        ("==", FieldOperator::Equals),
        ("=", FieldOperator::Equals),
    ];
    for (i, _) in term.char_indices() {
        let rest = term.get(i..).unwrap_or_default();
        for (symbol, operator) in OPERATORS {
            if let Some(value) = rest.strip_prefix(symbol) {
                return Some((term.get(..i).unwrap_or_default(), operator, value));
            }
        }
    }
    None
}

fn unescape_value(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut in_slash = false;
    for c in raw.chars() {
        if in_slash {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                ));
            }
            out.push(c);
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // Upstream formats the rune with %v, i.e. as its number.
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    c as u32
                ));
            }
            c => out.push(c),
        }
    }
    if in_slash {
        return Err("invalid field selector: invalid escape sequence: \\".to_string());
    }
    Ok(out)
}

fn escape_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The name a field selector label is converted to before matching.
#[allow(dead_code)] // selector API pinned by the tests; the server matches whole selectors
fn canonical_field(field: &str) -> &str {
    match field {
        // Old v1 clients still send it; the pod conversion renames it.
        "spec.host" => "spec.nodeName",
        other => other,
    }
}

/// Where in the JSON a selectable field lives: candidate paths (the first
/// one with a non-empty value wins) and the value when none has one.
///
/// Upstream builds these fields from typed objects, so some differ from a
/// plain JSON lookup: Go zero values for bools and counts, renamed fields,
/// and events served under two groups with different field names.
fn json_path(field: &str) -> (Vec<String>, &'static str) {
    let paths = |list: &[&str]| list.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    match field {
        "source" => (
            paths(&[
                "source.component",
                "deprecatedSource.component",
                "reportingComponent",
                "reportingController",
            ]),
            "",
        ),
        "reportingComponent" | "reportingController" => {
            (paths(&["reportingComponent", "reportingController"]), "")
        }
        "spec.host" => (paths(&["spec.nodeName"]), ""),
        "spec.hostNetwork" => (paths(&["spec.hostNetwork"]), "false"),
        "spec.unschedulable" => (paths(&["spec.unschedulable"]), "false"),
        // Upstream reads podIPs[0]; the v1 podIP field mirrors it.
        "status.podIP" => (paths(&["status.podIPs.0.ip", "status.podIP"]), ""),
        // Accepted by the pod conversion but absent from the pod's field set,
        // so it always compares as empty.
        "status.podIPs" => (Vec::new(), ""),
        "status.replicas" => (paths(&["status.replicas"]), "0"),
        "status.successful" => (paths(&["status.succeeded"]), "0"),
        other => {
            let regarding = other
                .strip_prefix("involvedObject.")
                .or_else(|| other.strip_prefix("regarding."));
            match regarding {
                Some(rest) => (
                    vec![
                        format!("involvedObject.{rest}"),
                        format!("regarding.{rest}"),
                    ],
                    "",
                ),
                None => (vec![other.to_string()], ""),
            }
        }
    }
}

fn field_value(object: &Value, field: &str) -> String {
    let (paths, default) = json_path(field);
    paths
        .iter()
        .filter_map(|path| lookup(object, path).and_then(scalar_text))
        .find(|text| !text.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// Walks a dotted path; numeric segments index arrays.
fn lookup<'v>(object: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(object, |current, segment| match current {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        })
}

/// Scalars as upstream would format them; objects and arrays are not
/// selectable, so they read as absent.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

// ---------------------------------------------------------------------------
// Supported fields per resource
// ---------------------------------------------------------------------------

/// How a resource's field label conversion words its refusal.
enum Refusal {
    /// `field label not supported: <field>`
    NotSupported,
    /// batch/v1 Job: `field label "<field>" not supported for Job`
    Job,
    /// resource.k8s.io ResourceSlice, which names its GroupVersionKind.
    ResourceSlice,
    /// No conversion registered: `runtime.DefaultMetaV1FieldSelectorConversion`.
    Default,
}

const DEFAULT_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

fn field_rules(group: &str, plural: &str) -> (&'static [&'static str], Refusal) {
    // From the AddFieldLabelConversionFunc registrations in
    // pkg/apis/{core,batch,events,certificates,resource}/v1.
    match (group, plural) {
        ("", "pods") => (
            &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.podIPs",
                "status.nominatedNodeName",
                "spec.host",
            ],
            Refusal::NotSupported,
        ),
        // Cluster-scoped kinds with their own conversion accept no
        // metadata.namespace, unlike those falling back to the default.
        ("", "nodes") => (
            &["metadata.name", "spec.unschedulable"],
            Refusal::NotSupported,
        ),
        ("", "namespaces") => (&["metadata.name", "status.phase"], Refusal::NotSupported),
        ("", "replicationcontrollers") => (
            &["metadata.name", "metadata.namespace", "status.replicas"],
            Refusal::NotSupported,
        ),
        ("", "secrets") => (
            &["metadata.name", "metadata.namespace", "type"],
            Refusal::NotSupported,
        ),
        ("", "services") => (
            &[
                "metadata.name",
                "metadata.namespace",
                "spec.clusterIP",
                "spec.type",
            ],
            Refusal::NotSupported,
        ),
        ("", "events") => (
            &[
                "metadata.name",
                "metadata.namespace",
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            Refusal::NotSupported,
        ),
        ("events.k8s.io", "events") => (
            &[
                "metadata.name",
                "metadata.namespace",
                "regarding.kind",
                "regarding.namespace",
                "regarding.name",
                "regarding.uid",
                "regarding.apiVersion",
                "regarding.resourceVersion",
                "regarding.fieldPath",
                "reason",
                "reportingController",
                "source",
                "type",
            ],
            Refusal::NotSupported,
        ),
        ("batch", "jobs") => (
            &["metadata.name", "metadata.namespace", "status.successful"],
            Refusal::Job,
        ),
        ("certificates.k8s.io", "certificatesigningrequests" | "clustertrustbundles") => {
            (&["metadata.name", "spec.signerName"], Refusal::NotSupported)
        }
        ("certificates.k8s.io", "podcertificaterequests") => (
            &[
                "metadata.name",
                "spec.signerName",
                "spec.podName",
                "spec.nodeName",
            ],
            Refusal::NotSupported,
        ),
        ("resource.k8s.io", "resourceslices") => (
            &["metadata.name", "spec.nodeName", "spec.driver"],
            Refusal::ResourceSlice,
        ),
        _ => (DEFAULT_FIELDS, Refusal::Default),
    }
}

/// Every field selector label the real server accepts for a built-in
/// resource, `metadata.name`/`metadata.namespace` included where accepted
/// (cluster-scoped kinds with their own conversion, like nodes, refuse
/// `metadata.namespace`). Unknown resources get the default pair.
pub fn supported_fields(group: &str, plural: &str) -> Vec<&'static str> {
    field_rules(group, plural).0.to_vec()
}

fn unsupported_message(group: &str, plural: &str, field: &str) -> String {
    match field_rules(group, plural).1 {
        Refusal::NotSupported => format!("field label not supported: {field}"),
        Refusal::Job => format!("field label {} not supported for Job", go_quote(field)),
        Refusal::ResourceSlice => {
            format!("field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {field}")
        }
        Refusal::Default => format!(
            "{} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
            go_quote(field)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NAME_PART_REGEX: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const VALUE_REGEX: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    fn label_error(text: &str) -> String {
        match LabelSelector::parse(text) {
            Ok(s) => panic!("{text:?} parsed as {s}"),
            Err(e) => e.to_string(),
        }
    }

    fn field_error(text: &str) -> String {
        match FieldSelector::parse(text) {
            Ok(s) => panic!("{text:?} parsed as {s}"),
            Err(e) => e.to_string(),
        }
    }

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "labels": labels}})
    }

    fn lmatch(selector: &str, object: &Value) -> bool {
        LabelSelector::parse(selector).unwrap().matches(object)
    }

    fn fmatch(selector: &str, object: &Value) -> bool {
        FieldSelector::parse(selector).unwrap().matches(object)
    }

    // --- label selector parsing -------------------------------------------

    #[test]
    fn label_parse_canonical_forms() {
        let cases = [
            ("", ""),
            ("   ", ""),
            ("a=b", "a=b"),
            ("a==b", "a==b"),
            ("a!=b", "a!=b"),
            ("a in (x,y)", "a in (x,y)"),
            ("a notin (x)", "a notin (x)"),
            ("a", "a"),
            ("!a", "!a"),
            ("a=", "a="),
            ("a>1", "a>1"),
            ("a<10", "a<10"),
            ("b=1,a in (y,x,y)", "a in (x,y),b=1"),
            ("  a  =  b  ,  c in ( x , y )  ,  !d ", "a=b,c in (x,y),!d"),
            (
                "x in (foo,,baz),y,z notin ()",
                "x in (,baz,foo),y,z notin ()",
            ),
            ("a in (,x)", "a in (,x)"),
            ("a in (x,)", "a in (,x)"),
            ("in in (in,notin)", "in in (in,notin)"),
            ("example.com/app=web", "example.com/app=web"),
            ("a.b-c_d=E.f-G_h", "a.b-c_d=E.f-G_h"),
            ("a=b,a!=c", "a=b,a!=c"),
            ("a\tin\n(x)", "a in (x)"),
        ];
        for (text, canonical) in cases {
            let selector = LabelSelector::parse(text).unwrap();
            assert_eq!(selector.to_string(), canonical, "{text:?}");
            assert_eq!(selector.is_empty(), canonical.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn label_key_validation_messages() {
        assert_eq!(
            label_error("a_=b"),
            format!("unable to parse requirement: <nil>: Invalid value: \"a_\": {NAME_PART_REGEX}")
        );
        assert_eq!(
            label_error("app:monolith"),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"app:monolith\": {NAME_PART_REGEX}"
            )
        );
        let long = "k".repeat(64);
        assert_eq!(
            label_error(&long),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"{long}\": name part must be no more than 63 characters"
            )
        );
        assert!(LabelSelector::parse(&"k".repeat(63)).is_ok());
        assert_eq!(
            label_error("a/b/c ?=? def"),
            "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        );
        assert_eq!(
            label_error("/a=b"),
            "unable to parse requirement: <nil>: Invalid value: \"/a\": prefix part must be non-empty"
        );
        assert_eq!(
            label_error("a/=b"),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"a/\": name part must be non-empty; {NAME_PART_REGEX}"
            )
        );
        assert_eq!(
            label_error("app.kubernetes_io/name=x"),
            "unable to parse requirement: <nil>: Invalid value: \"app.kubernetes_io/name\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        );
        assert!(
            label_error(&format!("{}/a", "p".repeat(254)))
                .contains("prefix part must be no more than 253 characters")
        );
        assert!(label_error("a\"b").contains("Invalid value: \"a\\\"b\""));
    }

    #[test]
    fn label_value_validation_messages() {
        assert_eq!(
            label_error("a=b@"),
            format!(
                "unable to parse requirement: values[0][a]: Invalid value: \"b@\": {VALUE_REGEX}"
            )
        );
        let long = "v".repeat(64);
        assert_eq!(
            label_error(&format!("a={long}")),
            format!(
                "unable to parse requirement: values[0][a]: Invalid value: \"{long}\": must be no more than 63 characters"
            )
        );
        assert!(LabelSelector::parse(&format!("a={}", "v".repeat(63))).is_ok());
        // Several bad values aggregate, indexed in sorted order.
        assert_eq!(
            label_error("a in (y_,-x)"),
            format!(
                "unable to parse requirement: [values[0][a]: Invalid value: \"-x\": {VALUE_REGEX}, values[1][a]: Invalid value: \"y_\": {VALUE_REGEX}]"
            )
        );
        assert_eq!(
            label_error("a>x"),
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert_eq!(
            label_error("a<"),
            "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
    }

    #[test]
    fn label_syntax_errors() {
        let cases = [
            (
                "a in x",
                "unable to parse requirement: found 'x' expected: '('",
            ),
            (
                "a in",
                "unable to parse requirement: found '' expected: '('",
            ),
            (
                "a in (x",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "a in (x y)",
                "unable to parse requirement: found 'y', expected: ',' or ')'",
            ),
            (
                "a in (=)",
                "unable to parse requirement: found '=', expected: ',', ')' or identifier",
            ),
            (
                "a in (,=)",
                "unable to parse requirement: found '=', expected: ',', or identifier",
            ),
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a=(b)",
                "unable to parse requirement: found '(', expected: identifier",
            ),
            (
                "!",
                "unable to parse requirement: found '', expected: identifier",
            ),
            (
                "!!a",
                "unable to parse requirement: found '!', expected: identifier",
            ),
            (
                "!=a",
                "found '!=', expected: !, identifier, or 'end of string'",
            ),
            ("a=b c", "found 'c', expected: ',' or 'end of string'"),
            ("!a=b", "found '=', expected: ',' or 'end of string'"),
            ("a=b,", "found '', expected: identifier after ','"),
            ("a,,b", "found ',', expected: identifier after ','"),
            (
                ",",
                "found ',', expected: !, identifier, or 'end of string'",
            ),
            (
                "=a",
                "found '=', expected: !, identifier, or 'end of string'",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(label_error(text), message, "{text:?}");
        }
    }

    #[test]
    fn label_error_keeps_selector() {
        assert_eq!(
            LabelSelector::parse("a b"),
            Err(SelectorError::Invalid {
                selector: "a b".into(),
                reason:
                    "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
                        .into(),
            })
        );
    }

    // --- label selector matching ------------------------------------------

    #[test]
    fn label_matching_with_labels() {
        let object = labelled(json!({"app": "web", "tier": "front", "n": "5", "empty": ""}));
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("app in (db,web)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("app notin (web)", false),
            ("app", true),
            ("!app", false),
            ("zone", false),
            ("!zone", true),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("n>4", true),
            ("n>5", false),
            ("n<6", true),
            ("app>1", false),
            ("empty=", true),
            ("empty in ()", true),
            ("empty", true),
            ("missing=", false),
        ];
        for (selector, expected) in cases {
            assert_eq!(lmatch(selector, &object), expected, "{selector:?}");
        }
    }

    #[test]
    fn label_matching_without_labels() {
        for object in [
            json!({}),
            json!({"metadata": {"name": "x"}}),
            labelled(json!(null)),
        ] {
            assert!(lmatch("", &object));
            assert!(!lmatch("a", &object));
            assert!(lmatch("!a", &object));
            assert!(lmatch("a!=b", &object));
            assert!(lmatch("a notin (x)", &object));
            assert!(!lmatch("a in (x)", &object));
            assert!(!lmatch("a=", &object));
            assert!(!lmatch("a<5", &object));
        }
    }

    #[test]
    fn label_matching_label_map() {
        let selector = LabelSelector::parse("a=1").unwrap();
        let mut labels = Map::new();
        assert!(!selector.matches_labels(&labels));
        labels.insert("a".into(), json!("1"));
        assert!(selector.matches_labels(&labels));
    }

    // --- field selector parsing -------------------------------------------

    #[test]
    fn field_parse_and_display() {
        let cases = [
            ("", ""),
            (",", ""),
            ("metadata.name=foo", "metadata.name=foo"),
            ("metadata.name==foo", "metadata.name=foo"),
            ("status.phase!=Running", "status.phase!=Running"),
            ("b=1,a=2", "a=2,b=1"),
            ("a=b,,c=d", "a=b,c=d"),
            ("spec.nodeName=", "spec.nodeName="),
            (r"a=x\,y\=z\\w", r"a=x\,y\=z\\w"),
        ];
        for (text, canonical) in cases {
            let selector = FieldSelector::parse(text).unwrap();
            assert_eq!(selector.to_string(), canonical, "{text:?}");
            assert_eq!(selector.is_empty(), canonical.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn field_escapes() {
        let selector = FieldSelector::parse(r"metadata.name=a\,b\=c\\d,type=x").unwrap();
        assert_eq!(selector.required("metadata.name"), Some(r"a,b=c\d"));
        assert_eq!(selector.required("type"), Some("x"));
        assert!(selector.matches(&json!({"metadata": {"name": r"a,b=c\d"}, "type": "x"})));
        assert!(!selector.matches(&json!({"metadata": {"name": "a"}, "type": "x"})));
    }

    #[test]
    fn field_syntax_errors() {
        let cases = [
            ("foo", "invalid selector: 'foo'; can't understand 'foo'"),
            (
                "a=b,foo",
                "invalid selector: 'a=b,foo'; can't understand 'foo'",
            ),
            ("a!b", "invalid selector: 'a!b'; can't understand 'a!b'"),
            (
                r"a=b\x",
                r"invalid field selector: invalid escape sequence: \x",
            ),
            (
                r"a=b\",
                r"invalid field selector: invalid escape sequence: \",
            ),
            (
                "a=b=c",
                "invalid field selector: unescaped character in value: 61",
            ),
            (
                "a===b",
                "invalid field selector: unescaped character in value: 61",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(field_error(text), message, "{text:?}");
        }
        assert_eq!(
            FieldSelector::parse("foo"),
            Err(SelectorError::Invalid {
                selector: "foo".into(),
                reason: "invalid selector: 'foo'; can't understand 'foo'".into(),
            })
        );
    }

    #[test]
    fn field_names_are_verbatim_and_sorted() {
        let selector =
            FieldSelector::parse("status.phase=Running,metadata.name =x,status.phase!=y").unwrap();
        assert_eq!(selector.fields(), vec!["metadata.name ", "status.phase"]);
        assert_eq!(selector.required("metadata.name"), None);
        assert_eq!(selector.required("status.phase"), Some("Running"));
        assert_eq!(FieldSelector::parse("a!=b").unwrap().required("a"), None);
        assert_eq!(FieldSelector::parse("=b").unwrap().fields(), vec![""]);
    }

    #[test]
    fn field_required_follows_spec_host_rename() {
        let selector = FieldSelector::parse("spec.host=node-1").unwrap();
        assert_eq!(selector.required("spec.nodeName"), Some("node-1"));
        assert!(selector.matches(&json!({"spec": {"nodeName": "node-1"}})));
    }

    // --- field selector matching ------------------------------------------

    #[test]
    fn field_node_name_empty_matches_unscheduled_pods() {
        let unscheduled = json!({"metadata": {"name": "p"}, "spec": {}});
        let null_node = json!({"metadata": {"name": "p"}, "spec": {"nodeName": null}});
        let scheduled = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        assert!(fmatch("spec.nodeName=", &unscheduled));
        assert!(fmatch("spec.nodeName=", &null_node));
        assert!(fmatch("spec.nodeName=", &json!({})));
        assert!(!fmatch("spec.nodeName=", &scheduled));
        assert!(fmatch("spec.nodeName!=", &scheduled));
        assert!(fmatch("spec.nodeName=n1", &scheduled));
    }

    #[test]
    fn field_phase_and_multiple_terms() {
        let running =
            json!({"metadata": {"name": "a", "namespace": "ns"}, "status": {"phase": "Running"}});
        let pending =
            json!({"metadata": {"name": "b", "namespace": "ns"}, "status": {"phase": "Pending"}});
        assert!(!fmatch("status.phase!=Running", &running));
        assert!(fmatch("status.phase!=Running", &pending));
        assert!(fmatch(
            "metadata.namespace=ns,status.phase=Pending",
            &pending
        ));
        assert!(!fmatch(
            "metadata.namespace=ns,status.phase=Pending",
            &running
        ));
        assert!(!fmatch(
            "metadata.name=b,metadata.namespace=other",
            &pending
        ));
        assert!(fmatch(
            "metadata.name!=a,status.phase!=Succeeded,status.phase!=Failed",
            &pending
        ));
        assert!(fmatch("", &running));
    }

    #[test]
    fn field_booleans_and_numbers() {
        let host = json!({"spec": {"hostNetwork": true}});
        let plain = json!({"spec": {}});
        assert!(fmatch("spec.hostNetwork=true", &host));
        assert!(!fmatch("spec.hostNetwork=false", &host));
        // Upstream formats the Go zero value, so a missing bool is "false".
        assert!(fmatch("spec.hostNetwork=false", &plain));
        assert!(fmatch("spec.unschedulable=false", &json!({"spec": {}})));
        assert!(fmatch(
            "spec.unschedulable=true",
            &json!({"spec": {"unschedulable": true}})
        ));
        assert!(fmatch(
            "status.replicas=3",
            &json!({"status": {"replicas": 3}})
        ));
        assert!(fmatch("status.replicas=0", &json!({})));
        assert!(fmatch(
            "status.successful=1",
            &json!({"status": {"succeeded": 1}})
        ));
        assert!(fmatch("status.successful=0", &json!({"status": {}})));
        // Fields without a Go default compare their JSON text, or "" when missing.
        assert!(fmatch("spec.count=7", &json!({"spec": {"count": 7}})));
        assert!(fmatch("spec.flag=true", &json!({"spec": {"flag": true}})));
        assert!(fmatch("spec.flag=", &json!({"spec": {}})));
        assert!(fmatch("spec.list=", &json!({"spec": {"list": [1]}})));
    }

    #[test]
    fn field_event_aliases() {
        let core = json!({
            "involvedObject": {"kind": "Pod", "name": "p", "uid": "u1"},
            "source": {"component": "kubelet"},
            "reportingComponent": "kubelet-x",
            "reason": "Started",
            "type": "Normal"
        });
        assert!(fmatch("source=kubelet", &core));
        assert!(fmatch("reportingComponent=kubelet-x", &core));
        assert!(fmatch(
            "involvedObject.uid=u1,involvedObject.kind=Pod,reason=Started,type=Normal",
            &core
        ));
        assert!(fmatch("regarding.name=p", &core));
        // Without source.component, upstream falls back to the reporting controller.
        let new_style = json!({
            "regarding": {"kind": "Node", "name": "n"},
            "reportingController": "ctrl",
            "reason": "X"
        });
        assert!(fmatch("source=ctrl", &new_style));
        assert!(fmatch("reportingController=ctrl", &new_style));
        assert!(fmatch("regarding.kind=Node", &new_style));
        assert!(fmatch("involvedObject.name=n", &new_style));
        assert!(fmatch("source=", &json!({})));
    }

    #[test]
    fn field_pod_ip() {
        let pod = json!({"status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}});
        assert!(fmatch("status.podIP=10.0.0.1", &pod));
        assert!(fmatch(
            "status.podIP=10.0.0.2",
            &json!({"status": {"podIP": "10.0.0.2"}})
        ));
        assert!(fmatch("status.podIP=", &json!({"status": {}})));
        // Accepted upstream but never part of the pod's field set.
        assert!(fmatch("status.podIPs=", &pod));
        assert!(!fmatch("status.podIPs=10.0.0.1", &pod));
    }

    // --- supported fields -------------------------------------------------

    #[test]
    fn supported_fields_per_resource() {
        let pods = supported_fields("", "pods");
        for field in [
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ] {
            assert!(pods.contains(&field), "{field}");
        }
        assert_eq!(
            supported_fields("", "nodes"),
            vec!["metadata.name", "spec.unschedulable"]
        );
        assert_eq!(
            supported_fields("", "namespaces"),
            vec!["metadata.name", "status.phase"]
        );
        assert!(supported_fields("", "secrets").contains(&"type"));
        assert!(supported_fields("", "events").contains(&"source"));
        assert!(supported_fields("", "events").contains(&"involvedObject.uid"));
        assert!(supported_fields("events.k8s.io", "events").contains(&"regarding.uid"));
        assert!(
            supported_fields("certificates.k8s.io", "certificatesigningrequests")
                .contains(&"spec.signerName")
        );
        assert_eq!(supported_fields("", "configmaps"), DEFAULT_FIELDS.to_vec());
        assert_eq!(
            supported_fields("apps", "deployments"),
            DEFAULT_FIELDS.to_vec()
        );
    }

    #[test]
    fn check_supported_messages() {
        let check = |text: &str, group: &str, plural: &str| {
            FieldSelector::parse(text)
                .unwrap()
                .check_supported(group, plural)
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            check("spec.nodeName=,status.phase!=Failed", "", "pods"),
            Ok(())
        );
        assert_eq!(check("spec.host=n", "", "pods"), Ok(()));
        assert_eq!(
            check("spec.foo=x", "", "pods"),
            Err("field label not supported: spec.foo".into())
        );
        // The first refusal in sorted term order is the one reported.
        assert_eq!(
            check("z=1,b=2,metadata.name=x", "", "pods"),
            Err("field label not supported: b".into())
        );
        assert_eq!(
            check("metadata.namespace=x", "", "nodes"),
            Err("field label not supported: metadata.namespace".into())
        );
        assert_eq!(
            check("spec.x=1", "", "configmaps"),
            Err("\"spec.x\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"".into())
        );
        assert_eq!(
            check("status.active=1", "batch", "jobs"),
            Err("field label \"status.active\" not supported for Job".into())
        );
        assert_eq!(
            check("spec.pool=p", "resource.k8s.io", "resourceslices"),
            Err(
                "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.pool"
                    .into()
            )
        );
        assert_eq!(
            FieldSelector::parse("x=1")
                .unwrap()
                .check_supported("", "secrets"),
            Err(SelectorError::UnsupportedField {
                field: "x".into(),
                reason: "field label not supported: x".into(),
            })
        );
    }

    #[test]
    fn go_quote_escapes_like_go() {
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote("\n\t\u{01}é"), "\"\\n\\t\\x01é\"");
    }
}
