//! The three PATCH body formats the Kubernetes API server accepts, applied to
//! `serde_json::Value` documents:
//!
//! - `application/merge-patch+json`: RFC 7386 JSON merge patch ([`merge_patch`]);
//! - `application/json-patch+json`: RFC 6902 JSON patch ([`json_patch`]);
//! - `application/strategic-merge-patch+json`: Kubernetes strategic merge
//!   patch ([`strategic_merge_patch`]).
//!
//! The strategic merge patch follows the server side of
//! `k8s.io/apimachinery/pkg/util/strategicpatch` (`StrategicMergeMapPatch`),
//! including its list ordering rules, so that tests observe what a real API
//! server would store. Where the Go code keeps patch directives in the
//! result (which the real server then drops while decoding into typed
//! objects), this module drops them straight away.

use serde_json::{Map, Number, Value};

type Object = Map<String, Value>;

/// Why a patch could not be applied.
///
/// For reference, the real API server answers 400 for a malformed JSON patch
/// document, 422 for a JSON patch that fails to apply (including a failed
/// `test`), and 400, 422 or 500 for strategic merge patch errors depending
/// on the error.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PatchError {
    /// The patch document itself is malformed: wrong JSON type, unknown
    /// operation or directive, missing member, missing merge key, bad JSON
    /// pointer syntax.
    #[error("invalid patch: {0}")]
    InvalidPatch(String),
    /// A JSON patch `test` operation found a different value.
    #[error("test operation failed: {0}")]
    TestFailed(String),
    /// A well-formed JSON patch operation does not fit the document: the
    /// path does not exist, an array index is out of range, and so on.
    #[error("patch does not apply: {0}")]
    CannotApply(String),
}

fn invalid(message: impl Into<String>) -> PatchError {
    PatchError::InvalidPatch(message.into())
}

fn cannot_apply(message: impl Into<String>) -> PatchError {
    PatchError::CannotApply(message.into())
}

/// JSON equality where numbers compare by value: Go decodes every JSON
/// number to float64, so `80` and `80.0` are the same merge key or `test`
/// value there, while `serde_json` keeps them apart.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => number_eq(x, y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| json_eq(x, y)))
        }
        _ => a == b,
    }
}

fn number_eq(x: &Number, y: &Number) -> bool {
    if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
        return x == y;
    }
    matches!((x.as_f64(), y.as_f64()), (Some(x), Some(y)) if x == y)
}

// ---------------------------------------------------------------------------
// RFC 7386 JSON merge patch
// ---------------------------------------------------------------------------

/// RFC 7386 JSON merge patch (Content-Type `application/merge-patch+json`).
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    let mut result = target.clone();
    merge_patch_in_place(&mut result, patch);
    result
}

fn merge_patch_in_place(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Object::new());
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch_in_place(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

// ---------------------------------------------------------------------------
// RFC 6902 JSON patch
// ---------------------------------------------------------------------------

/// RFC 6902 JSON patch (Content-Type `application/json-patch+json`).
///
/// Operations apply in order to a copy of `target`; the first failure
/// aborts the whole patch. Besides RFC 6902 this accepts negative array
/// indices counting from the end, and a `test` of `null` against an absent
/// object member succeeds, as in the evanphx/json-patch library the API
/// server uses.
pub fn json_patch(target: &Value, patch: &Value) -> Result<Value, PatchError> {
    let Value::Array(operations) = patch else {
        return Err(invalid("a JSON patch must be an array of operations"));
    };
    let mut document = target.clone();
    for operation in operations {
        apply_operation(&mut document, operation)?;
    }
    Ok(document)
}

fn apply_operation(document: &mut Value, operation: &Value) -> Result<(), PatchError> {
    let Value::Object(operation) = operation else {
        return Err(invalid(format!(
            "operation {operation} is not a JSON object"
        )));
    };
    let op = member_str(operation, "op")?;
    let path_text = member_str(operation, "path")?;
    let path = parse_pointer(path_text)?;
    match op {
        "add" => {
            let value = member_value(operation, op)?.clone();
            add(document, &path, value, path_text)
        }
        "remove" => remove(document, &path, path_text).map(drop),
        "replace" => {
            let value = member_value(operation, op)?.clone();
            let slot = resolve_mut(document, &path).ok_or_else(|| missing(path_text))?;
            *slot = value;
            Ok(())
        }
        "move" => {
            let from_text = member_str(operation, "from")?;
            let from = parse_pointer(from_text)?;
            if resolve(document, &from).is_none() {
                return Err(missing(from_text));
            }
            if from == path {
                return Ok(());
            }
            if path.starts_with(&from) {
                return Err(cannot_apply(format!(
                    "cannot move {from_text:?} into its own child {path_text:?}"
                )));
            }
            let value = remove(document, &from, from_text)?;
            add(document, &path, value, path_text)
        }
        "copy" => {
            let from_text = member_str(operation, "from")?;
            let from = parse_pointer(from_text)?;
            let value = resolve(document, &from)
                .cloned()
                .ok_or_else(|| missing(from_text))?;
            add(document, &path, value, path_text)
        }
        "test" => {
            let expected = member_value(operation, op)?;
            let matches = match resolve(document, &path) {
                Some(actual) => json_eq(actual, expected),
                None => {
                    expected.is_null()
                        && path.split_last().is_some_and(|(_, parent)| {
                            matches!(resolve(document, parent), Some(Value::Object(_)))
                        })
                }
            };
            if matches {
                Ok(())
            } else {
                Err(PatchError::TestFailed(format!(
                    "the value at {path_text:?} is not {expected}"
                )))
            }
        }
        other => Err(invalid(format!("unknown JSON patch operation {other:?}"))),
    }
}

fn member_str<'a>(operation: &'a Object, name: &str) -> Result<&'a str, PatchError> {
    operation
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("operation has no string {name:?} member")))
}

fn member_value<'a>(operation: &'a Object, op: &str) -> Result<&'a Value, PatchError> {
    operation
        .get("value")
        .ok_or_else(|| invalid(format!("{op} operation has no \"value\" member")))
}

fn missing(path_text: &str) -> PatchError {
    cannot_apply(format!("path {path_text:?} does not exist"))
}

/// Splits an RFC 6901 JSON pointer into unescaped reference tokens.
fn parse_pointer(text: &str) -> Result<Vec<String>, PatchError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = text.strip_prefix('/') else {
        return Err(invalid(format!(
            "JSON pointer {text:?} does not start with '/'"
        )));
    };
    rest.split('/').map(|token| unescape(token, text)).collect()
}

fn unescape(token: &str, pointer: &str) -> Result<String, PatchError> {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('~'),
            Some('1') => out.push('/'),
            _ => {
                return Err(invalid(format!(
                    "JSON pointer {pointer:?} has an invalid '~' escape"
                )));
            }
        }
    }
    Ok(out)
}

/// Resolves an array reference token. `-` (one past the end) only makes
/// sense where an element is being inserted.
fn parse_index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if token == "-" {
        return allow_end.then_some(len);
    }
    let (negative, digits) = match token.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, token),
    };
    // RFC 6901 array indices have no sign and no leading zeros.
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    let n: usize = digits.parse().ok()?;
    if negative {
        (n != 0 && n <= len).then(|| len - n)
    } else {
        (n < len || (allow_end && n == len)).then_some(n)
    }
}

fn resolve<'a>(document: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(document, |current, token| match current {
            Value::Object(map) => map.get(token),
            Value::Array(items) => items.get(parse_index(token, items.len(), false)?),
            _ => None,
        })
}

fn resolve_mut<'a>(document: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter()
        .try_fold(document, |current, token| match current {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => {
                let index = parse_index(token, items.len(), false)?;
                items.get_mut(index)
            }
            _ => None,
        })
}

fn add(
    document: &mut Value,
    path: &[String],
    value: Value,
    path_text: &str,
) -> Result<(), PatchError> {
    let Some((last, parent)) = path.split_last() else {
        *document = value;
        return Ok(());
    };
    match resolve_mut(document, parent) {
        Some(Value::Object(map)) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(items)) => {
            let index = parse_index(last, items.len(), true).ok_or_else(|| {
                cannot_apply(format!("array index in {path_text:?} is out of range"))
            })?;
            items.insert(index, value);
            Ok(())
        }
        Some(_) => Err(cannot_apply(format!(
            "cannot add {path_text:?}: its parent is neither an object nor an array"
        ))),
        None => Err(cannot_apply(format!(
            "cannot add {path_text:?}: its parent does not exist"
        ))),
    }
}

fn remove(document: &mut Value, path: &[String], path_text: &str) -> Result<Value, PatchError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(cannot_apply("cannot remove the whole document"));
    };
    match resolve_mut(document, parent) {
        Some(Value::Object(map)) => map.remove(last).ok_or_else(|| missing(path_text)),
        Some(Value::Array(items)) => {
            let index = parse_index(last, items.len(), false).ok_or_else(|| missing(path_text))?;
            Ok(items.remove(index))
        }
        _ => Err(missing(path_text)),
    }
}

// ---------------------------------------------------------------------------
// Strategic merge patch
// ---------------------------------------------------------------------------

const DIRECTIVE_MARKER: &str = "$patch";
const RETAIN_KEYS_DIRECTIVE: &str = "$retainKeys";
const SET_ELEMENT_ORDER_PREFIX: &str = "$setElementOrder";
const DELETE_FROM_PRIMITIVE_LIST_PREFIX: &str = "$deleteFromPrimitiveList";

/// How a list field merges, i.e. its Go `patchStrategy`/`patchMergeKey` tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListStrategy {
    /// No patch strategy: the patch list replaces the stored one.
    Replace,
    /// `patchStrategy:"merge"` on a list of scalars: set union.
    MergePrimitives,
    /// `patchStrategy:"merge" patchMergeKey:"<key>"` on a list of objects.
    MergeByKey(&'static str),
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

/// The patch strategy of list `field` inside an object held by field
/// `parent` (for list items, the list's own field name), taken from the Go
/// struct tags of core/v1, meta/v1 and coordination/v1. The parent is
/// needed because the same name means different lists, e.g. `ports` of a
/// container versus `ports` of a Service.
///
/// The pod status `*containerStatuses` lists, node `taints`, `tolerations`,
/// node `images`, `readinessGates`, `command` and `args` carry no patch
/// strategy upstream, so a patch replaces them as a whole.
fn list_strategy(parent: &str, field: &str) -> ListStrategy {
    use ListStrategy::{MergeByKey, MergePrimitives, Replace};
    let in_container = CONTAINER_LISTS.contains(&parent);
    match (parent, field) {
        ("metadata", "finalizers") => MergePrimitives,
        ("metadata", "ownerReferences") => MergeByKey("uid"),
        (
            "spec",
            "containers"
            | "initContainers"
            | "ephemeralContainers"
            | "volumes"
            | "imagePullSecrets"
            | "schedulingGates"
            | "resourceClaims",
        ) => MergeByKey("name"),
        ("spec", "hostAliases") => MergeByKey("ip"),
        ("spec", "topologySpreadConstraints") => MergeByKey("topologyKey"),
        ("spec", "podCIDRs") => MergePrimitives,
        // Pod specs have no top-level `ports`, so this is a Service's.
        ("spec", "ports") => MergeByKey("port"),
        ("status", "conditions" | "addresses") => MergeByKey("type"),
        ("status", "podIPs" | "hostIPs") => MergeByKey("ip"),
        ("status", "resourceClaimStatuses") => MergeByKey("name"),
        (_, "env") if in_container => MergeByKey("name"),
        (_, "ports") if in_container => MergeByKey("containerPort"),
        (_, "volumeMounts") if in_container => MergeByKey("mountPath"),
        (_, "volumeDevices") if in_container => MergeByKey("devicePath"),
        _ => Replace,
    }
}

/// Strategic merge patch (Content-Type
/// `application/strategic-merge-patch+json`), as Kubernetes applies it to
/// core/v1 and coordination.k8s.io/v1 objects.
///
/// Maps merge recursively and `null` deletes a key. Lists merge or get
/// replaced according to the field's patch strategy (see `list_strategy`),
/// and the directives `$patch`, `$retainKeys`, `$setElementOrder/<list>` and
/// `$deleteFromPrimitiveList/<list>` are honoured and never left in the
/// result.
///
/// Merged lists are ordered the way the Go implementation orders them:
/// `$setElementOrder` when given, else the order of the patch list, with the
/// stored items the patch does not mention slotted in by their stored
/// position. That means an item new to the list lands before the untouched
/// stored items, not after them, unless `$setElementOrder` says otherwise.
pub fn strategic_merge_patch(target: &Value, patch: &Value) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(invalid("a strategic merge patch must be a JSON object"));
    };
    let Value::Object(original) = target else {
        return Err(cannot_apply(
            "a strategic merge patch only applies to a JSON object",
        ));
    };
    merge_map(original.clone(), patch.clone(), "").map(Value::Object)
}

/// Merges `patch` into `original`, both held by field `field` (empty at the
/// top level), which decides the strategy of the lists inside.
fn merge_map(mut original: Object, mut patch: Object, field: &str) -> Result<Object, PatchError> {
    if let Some(directive) = patch.remove(DIRECTIVE_MARKER) {
        return match directive.as_str() {
            Some("replace") => Ok(materialize_object(patch)),
            // Upstream leaves an empty map behind rather than removing the key.
            Some("delete") => Ok(Object::new()),
            _ => Err(invalid(format!("unknown patch type {directive} in map"))),
        };
    }

    apply_retain_keys(&mut original, &mut patch)?;

    // Ordering directives go first: they consume their list from the patch.
    let order_keys: Vec<String> = patch
        .keys()
        .filter(|key| key.starts_with(SET_ELEMENT_ORDER_PREFIX))
        .cloned()
        .collect();
    for key in order_keys {
        let order = patch.remove(&key).unwrap_or(Value::Null);
        let list_field = directive_target(&key, SET_ELEMENT_ORDER_PREFIX)?;
        let patch_list = patch.remove(list_field);
        apply_set_element_order(&mut original, list_field, order, patch_list, field)?;
    }

    let mut deletions = Vec::new();
    for (key, patch_value) in patch {
        if key.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX) {
            deletions.push((key, patch_value));
            continue;
        }
        if patch_value.is_null() {
            original.remove(&key);
            continue;
        }
        let Some(slot) = original.get_mut(&key) else {
            if let Some(value) = materialize(patch_value) {
                original.insert(key, value);
            }
            continue;
        };
        let existing = slot.take();
        match merge_value(existing, patch_value, field, &key)? {
            Some(value) => *slot = value,
            None => {
                original.remove(&key);
            }
        }
    }

    for (key, values) in deletions {
        let list_field = directive_target(&key, DELETE_FROM_PRIMITIVE_LIST_PREFIX)?;
        // Like upstream, a deletion list that does not fit the stored value
        // is ignored rather than rejected.
        let Value::Array(values) = values else {
            continue;
        };
        if let Some(Value::Array(items)) = original.get_mut(list_field) {
            items.retain(|item| !values.iter().any(|value| json_eq(item, value)));
        }
    }

    Ok(original)
}

/// Merges one patch value into the stored value of field `key` of an object
/// held by `parent`. `None` means the field should disappear.
fn merge_value(
    existing: Value,
    patch: Value,
    parent: &str,
    key: &str,
) -> Result<Option<Value>, PatchError> {
    match (existing, patch) {
        (Value::Object(original), Value::Object(patch)) => {
            merge_map(original, patch, key).map(|merged| Some(Value::Object(merged)))
        }
        (Value::Array(original), Value::Array(patch)) => {
            merge_list(original, patch, list_strategy(parent, key), key)
                .map(|merged| Some(Value::Array(merged)))
        }
        (_, patch) => Ok(materialize(patch)),
    }
}

fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    strategy: ListStrategy,
    field: &str,
) -> Result<Vec<Value>, PatchError> {
    match strategy {
        ListStrategy::Replace => Ok(materialize_list(patch)),
        ListStrategy::MergePrimitives => merge_slice(original, patch, None, field),
        ListStrategy::MergeByKey(key) => merge_slice(original, patch, Some(key), field),
    }
}

/// "`$setElementOrder/x`" → "`x`".
fn directive_target<'a>(key: &'a str, prefix: &str) -> Result<&'a str, PatchError> {
    key.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or_else(|| invalid(format!("invalid patch format of {prefix}: {key:?}")))
}

fn apply_retain_keys(original: &mut Object, patch: &mut Object) -> Result<(), PatchError> {
    let Some(retain) = patch.remove(RETAIN_KEYS_DIRECTIVE) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(invalid("invalid patch format of retainKeys: not a list"));
    };
    let retained = |key: &str| retain.iter().any(|kept| kept.as_str() == Some(key));
    // Upstream insists the patch does not set a field it asks to clear.
    for (key, value) in patch.iter() {
        if value.is_null()
            || key.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
            || key.starts_with(SET_ELEMENT_ORDER_PREFIX)
        {
            continue;
        }
        if !retained(key) {
            return Err(invalid(format!(
                "invalid patch format of retainKeys: {key:?} is patched but not in $retainKeys"
            )));
        }
    }
    original.retain(|key, _| retained(key));
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

fn kind_of(value: &Value) -> Kind {
    match value {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(_) => Kind::Number,
        Value::String(_) => Kind::String,
        Value::Array(_) => Kind::Array,
        Value::Object(_) => Kind::Object,
    }
}

/// The common element kind of two lists; `None` if both are empty.
fn element_kind(
    original: &[Value],
    patch: &[Value],
    field: &str,
) -> Result<Option<Kind>, PatchError> {
    let mut kind = None;
    for value in original.iter().chain(patch) {
        let this = kind_of(value);
        if this == Kind::Array {
            return Err(invalid(format!(
                "lists of lists are not supported ({field})"
            )));
        }
        match kind {
            None => kind = Some(this),
            Some(previous) if previous != this => {
                return Err(invalid(format!(
                    "list element types are not identical in {field}"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(kind)
}

fn no_merge_key(item: &Value, key: &str) -> PatchError {
    invalid(format!(
        "map: {item} does not contain declared merge key: {key}"
    ))
}

/// The merge key values of `items`, which must all have one.
fn merge_key_values(items: &[Value], key: &str) -> Result<Vec<Value>, PatchError> {
    items
        .iter()
        .map(|item| {
            item.get(key)
                .cloned()
                .ok_or_else(|| no_merge_key(item, key))
        })
        .collect()
}

/// A list item with what identifies it for ordering: its merge key value,
/// or the item itself in a list of scalars.
struct Entry {
    id: Value,
    item: Value,
}

fn entries(items: Vec<Value>, merge_key: Option<&str>) -> Result<Vec<Entry>, PatchError> {
    items
        .into_iter()
        .map(|item| {
            let id = match merge_key {
                Some(key) => item
                    .get(key)
                    .cloned()
                    .ok_or_else(|| no_merge_key(&item, key))?,
                None => item.clone(),
            };
            Ok(Entry { id, item })
        })
        .collect()
}

fn position(ids: &[Value], id: &Value) -> Option<usize> {
    ids.iter().position(|candidate| json_eq(candidate, id))
}

/// Splits `items` into those named in `ids` and the rest, keeping order.
fn partition_by_presence(items: Vec<Entry>, ids: &[Value]) -> (Vec<Entry>, Vec<Entry>) {
    items
        .into_iter()
        .partition(|entry| position(ids, &entry.id).is_some())
}

/// Upstream's `normalizeElementOrder`: sorts the patch items by
/// `patch_order` and the server-only items by `server_order`, then walks
/// both, taking a server-only item first only when it precedes the next
/// patch item in `server_order`.
fn normalize_element_order(
    mut patch_items: Vec<Entry>,
    mut server_only: Vec<Entry>,
    patch_order: &[Value],
    server_order: &[Value],
) -> Vec<Value> {
    patch_items.sort_by_key(|entry| position(patch_order, &entry.id).unwrap_or(usize::MAX));
    server_only.sort_by_key(|entry| position(server_order, &entry.id).unwrap_or(usize::MAX));

    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (position(server_order, &l.id), position(server_order, &r.id)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        if let Some(entry) = next {
            out.push(entry.item);
        }
    }
    out
}

/// Upstream's `mergeSlice` for lists with a merge strategy.
fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    merge_key: Option<&str>,
    field: &str,
) -> Result<Vec<Value>, PatchError> {
    let Some(kind) = element_kind(&original, &patch, field)? else {
        return Ok(original);
    };

    if kind != Kind::Object {
        if let Some(key) = merge_key {
            return Err(invalid(format!(
                "{field} is merged by {key:?} but holds {kind:?} values instead of objects"
            )));
        }
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for value in original.iter().chain(&patch) {
            if !merged.iter().any(|seen| json_eq(seen, value)) {
                merged.push(value.clone());
            }
        }
        let (in_patch, server_only) = partition_by_presence(entries(merged, None)?, &patch);
        return Ok(normalize_element_order(
            in_patch,
            server_only,
            &patch,
            &original,
        ));
    }

    let Some(key) = merge_key else {
        return Err(invalid(format!(
            "cannot merge lists without merge key for {field}"
        )));
    };
    let (original, patch) = apply_list_directives(original, patch, key)?;
    let server_order = merge_key_values(&original, key)?;
    let patch_order = merge_key_values(&patch, key)?;

    let mut merged = original;
    for item in patch {
        let Value::Object(item) = item else {
            return Err(invalid(format!(
                "list element types are not identical in {field}"
            )));
        };
        let id = item.get(key).cloned().unwrap_or(Value::Null);
        let existing = merged.iter().position(|stored| {
            stored
                .get(key)
                .is_some_and(|stored_id| json_eq(stored_id, &id))
        });
        match existing {
            Some(index) => {
                let stored = match merged[index].take() {
                    Value::Object(stored) => stored,
                    _ => Object::new(),
                };
                merged[index] = Value::Object(merge_map(stored, item, field)?);
            }
            None => {
                if let Some(value) = materialize(Value::Object(item)) {
                    merged.push(value);
                }
            }
        }
    }

    let (in_patch, server_only) = partition_by_presence(entries(merged, Some(key))?, &patch_order);
    Ok(normalize_element_order(
        in_patch,
        server_only,
        &patch_order,
        &server_order,
    ))
}

/// Applies the list items that carry `$patch`, returning the stored list
/// they leave and the remaining patch items.
fn apply_list_directives(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut remaining = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let Some(directive) = item.get(DIRECTIVE_MARKER) else {
            remaining.push(item);
            continue;
        };
        match directive.as_str() {
            Some("delete") => {
                let id = item.get(key).ok_or_else(|| no_merge_key(&item, key))?;
                original.retain(|stored| {
                    !stored
                        .get(key)
                        .is_some_and(|stored_id| json_eq(stored_id, id))
                });
            }
            // Keep scanning so later delete items are still validated.
            Some("replace") => replace = true,
            Some("merge") => {
                return Err(invalid(
                    "merging lists cannot yet be specified in the patch",
                ));
            }
            _ => {
                return Err(invalid(format!(
                    "unknown patch type {directive} in list item {item}"
                )));
            }
        }
    }
    if replace {
        Ok((materialize_list(remaining), Vec::new()))
    } else {
        Ok((original, remaining))
    }
}

fn merge_key_value_equal(
    patch_item: &Value,
    order_item: &Value,
    merge_key: Option<&str>,
) -> Result<bool, PatchError> {
    let Some(key) = merge_key else {
        return Ok(json_eq(patch_item, order_item));
    };
    let left = patch_item
        .get(key)
        .ok_or_else(|| no_merge_key(patch_item, key))?;
    let right = order_item
        .get(key)
        .ok_or_else(|| no_merge_key(order_item, key))?;
    Ok(json_eq(left, right))
}

/// Upstream's `validatePatchWithSetOrderList`: the patch list must name its
/// items in the same relative order as `$setElementOrder`.
fn validate_patch_with_set_order(
    patch_list: &[Value],
    order: &[Value],
    merge_key: Option<&str>,
) -> Result<(), PatchError> {
    if order.is_empty() || patch_list.is_empty() {
        return Ok(());
    }
    let mut candidates = Vec::with_capacity(patch_list.len());
    for item in patch_list {
        if merge_key.is_some() {
            if !item.is_object() {
                return Err(invalid(format!("list item {item} is not an object")));
            }
            if item.get(DIRECTIVE_MARKER).and_then(Value::as_str) == Some("delete") {
                continue;
            }
        }
        candidates.push(item);
    }
    let (mut patch_index, mut order_index) = (0, 0);
    while patch_index < candidates.len() && order_index < order.len() {
        if candidates[patch_index].get(DIRECTIVE_MARKER).is_some() {
            patch_index += 1;
            continue;
        }
        if merge_key_value_equal(candidates[patch_index], &order[order_index], merge_key)? {
            patch_index += 1;
        }
        order_index += 1;
    }
    if patch_index < candidates.len() {
        return Err(invalid(format!(
            "the order in patch list {} doesn't match {SET_ELEMENT_ORDER_PREFIX} list {}",
            Value::Array(patch_list.to_vec()),
            Value::Array(order.to_vec()),
        )));
    }
    Ok(())
}

/// Upstream's `mergePatchIntoOriginal` for one `$setElementOrder/<list>`:
/// merges the patch list (if any) into the stored list (if any), then puts
/// the items named in `order` in that order, slotting the others in by
/// their stored position.
fn apply_set_element_order(
    original: &mut Object,
    list_field: &str,
    order: Value,
    patch_list: Option<Value>,
    parent: &str,
) -> Result<(), PatchError> {
    let Value::Array(order) = order else {
        return Err(invalid(format!(
            "invalid patch format of {SET_ELEMENT_ORDER_PREFIX}/{list_field}: not a list"
        )));
    };
    let stored = match original.get(list_field) {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(items.clone()),
        Some(_) => {
            return Err(invalid(format!(
                "{SET_ELEMENT_ORDER_PREFIX}/{list_field} orders a field that is not a list"
            )));
        }
    };
    let patch_list = match patch_list {
        None => None,
        Some(Value::Array(items)) => Some(items),
        Some(_) => {
            return Err(invalid(format!(
                "{list_field} must be a list alongside {SET_ELEMENT_ORDER_PREFIX}/{list_field}"
            )));
        }
    };
    let strategy = list_strategy(parent, list_field);
    let merge_key = match strategy {
        ListStrategy::MergeByKey(key) => Some(key),
        ListStrategy::Replace | ListStrategy::MergePrimitives => None,
    };
    validate_patch_with_set_order(patch_list.as_deref().unwrap_or_default(), &order, merge_key)?;

    let stored_items = stored.clone().unwrap_or_default();
    let kind = element_kind(
        &stored_items,
        patch_list.as_deref().unwrap_or_default(),
        list_field,
    )?;
    let merged = match (stored, patch_list) {
        (Some(stored), None) => stored,
        (None, Some(patch_list)) => materialize_list(patch_list),
        (Some(stored), Some(patch_list)) => merge_list(stored, patch_list, strategy, list_field)?,
        (None, None) => return Ok(()),
    };

    let ordered = match kind {
        None => merged,
        Some(Kind::Object) => {
            let Some(key) = merge_key else {
                return Err(invalid(format!(
                    "{SET_ELEMENT_ORDER_PREFIX}/{list_field} cannot order a list without merge key"
                )));
            };
            let order_ids = merge_key_values(&order, key)?;
            let server_ids = merge_key_values(&stored_items, key)?;
            let (listed, unlisted) = partition_by_presence(entries(merged, Some(key))?, &order_ids);
            normalize_element_order(listed, unlisted, &order_ids, &server_ids)
        }
        Some(kind) => {
            if merge_key.is_some() {
                return Err(invalid(format!(
                    "{list_field} holds {kind:?} values instead of objects"
                )));
            }
            let (listed, unlisted) = partition_by_presence(entries(merged, None)?, &order);
            normalize_element_order(listed, unlisted, &order, &stored_items)
        }
    };

    match original.get_mut(list_field) {
        Some(slot) => *slot = Value::Array(ordered),
        None => {
            original.insert(list_field.to_owned(), Value::Array(ordered));
        }
    }
    Ok(())
}

fn is_directive_key(key: &str) -> bool {
    key == DIRECTIVE_MARKER
        || key == RETAIN_KEYS_DIRECTIVE
        || key.starts_with(SET_ELEMENT_ORDER_PREFIX)
        || key.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
}

/// What a patch value becomes where there is nothing stored to merge it
/// with: nulls vanish, and so does any map carrying `$patch` (upstream's
/// `removeDirectives`); the other directive keys are dropped too.
fn materialize(value: Value) -> Option<Value> {
    match value {
        Value::Object(map) if map.contains_key(DIRECTIVE_MARKER) => None,
        Value::Object(map) => Some(Value::Object(materialize_object(map))),
        Value::Array(items) => Some(Value::Array(materialize_list(items))),
        other => Some(other),
    }
}

fn materialize_object(map: Object) -> Object {
    map.into_iter()
        .filter(|(key, value)| !value.is_null() && !is_directive_key(key))
        .filter_map(|(key, value)| materialize(value).map(|value| (key, value)))
        .collect()
}

fn materialize_list(items: Vec<Value>) -> Vec<Value> {
    items.into_iter().filter_map(materialize).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // -- RFC 7386 -----------------------------------------------------------

    #[test]
    fn rfc7386_appendix_a_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (target, patch, expected) in cases {
            assert_eq!(merge_patch(&target, &patch), expected, "{target} + {patch}");
        }
    }

    #[test]
    fn rfc7386_section_3_example() {
        let target = json!({
            "title": "Goodbye!",
            "author": {"givenName": "John", "familyName": "Doe"},
            "tags": ["example", "sample"],
            "content": "This will be unchanged"
        });
        let patch = json!({
            "title": "Hello!",
            "phoneNumber": "+01-123-456-7890",
            "author": {"familyName": null},
            "tags": ["example"]
        });
        let expected = json!({
            "title": "Hello!",
            "author": {"givenName": "John"},
            "tags": ["example"],
            "content": "This will be unchanged",
            "phoneNumber": "+01-123-456-7890"
        });
        assert_eq!(merge_patch(&target, &patch), expected);
    }

    #[test]
    fn merge_patch_leaves_target_untouched() {
        let target = json!({"metadata": {"labels": {"a": "1"}}});
        let patched = merge_patch(
            &target,
            &json!({"metadata": {"labels": {"a": null, "b": "2"}}}),
        );
        assert_eq!(patched, json!({"metadata": {"labels": {"b": "2"}}}));
        assert_eq!(target, json!({"metadata": {"labels": {"a": "1"}}}));
    }

    // -- RFC 6902 -----------------------------------------------------------

    fn apply(target: Value, patch: Value) -> Result<Value, PatchError> {
        json_patch(&target, &patch)
    }

    #[test]
    fn rfc6902_a1_adding_an_object_member() {
        let result = apply(
            json!({"foo": "bar"}),
            json!([{"op": "add", "path": "/baz", "value": "qux"}]),
        );
        assert_eq!(result, Ok(json!({"baz": "qux", "foo": "bar"})));
    }

    #[test]
    fn rfc6902_a2_adding_an_array_element() {
        let result = apply(
            json!({"foo": ["bar", "baz"]}),
            json!([{"op": "add", "path": "/foo/1", "value": "qux"}]),
        );
        assert_eq!(result, Ok(json!({"foo": ["bar", "qux", "baz"]})));
    }

    #[test]
    fn rfc6902_a3_removing_an_object_member() {
        let result = apply(
            json!({"baz": "qux", "foo": "bar"}),
            json!([{"op": "remove", "path": "/baz"}]),
        );
        assert_eq!(result, Ok(json!({"foo": "bar"})));
    }

    #[test]
    fn rfc6902_a4_removing_an_array_element() {
        let result = apply(
            json!({"foo": ["bar", "qux", "baz"]}),
            json!([{"op": "remove", "path": "/foo/1"}]),
        );
        assert_eq!(result, Ok(json!({"foo": ["bar", "baz"]})));
    }

    #[test]
    fn rfc6902_a5_replacing_a_value() {
        let result = apply(
            json!({"baz": "qux", "foo": "bar"}),
            json!([{"op": "replace", "path": "/baz", "value": "boo"}]),
        );
        assert_eq!(result, Ok(json!({"baz": "boo", "foo": "bar"})));
    }

    #[test]
    fn rfc6902_a6_moving_a_value() {
        let result = apply(
            json!({"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}}),
            json!([{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}]),
        );
        assert_eq!(
            result,
            Ok(json!({"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}}))
        );
    }

    #[test]
    fn rfc6902_a7_moving_an_array_element() {
        let result = apply(
            json!({"foo": ["all", "grass", "cows", "eat"]}),
            json!([{"op": "move", "from": "/foo/1", "path": "/foo/3"}]),
        );
        assert_eq!(result, Ok(json!({"foo": ["all", "cows", "eat", "grass"]})));
    }

    #[test]
    fn rfc6902_a8_testing_a_value_success() {
        let target = json!({"baz": "qux", "foo": ["a", 2, "c"]});
        let result = apply(
            target.clone(),
            json!([
                {"op": "test", "path": "/baz", "value": "qux"},
                {"op": "test", "path": "/foo/1", "value": 2}
            ]),
        );
        assert_eq!(result, Ok(target));
    }

    #[test]
    fn rfc6902_a9_testing_a_value_error() {
        let result = apply(
            json!({"baz": "qux"}),
            json!([{"op": "test", "path": "/baz", "value": "bar"}]),
        );
        assert!(
            matches!(result, Err(PatchError::TestFailed(_))),
            "{result:?}"
        );
    }

    #[test]
    fn rfc6902_a10_adding_a_nested_member_object() {
        let result = apply(
            json!({"foo": "bar"}),
            json!([{"op": "add", "path": "/child", "value": {"grandchild": {}}}]),
        );
        assert_eq!(
            result,
            Ok(json!({"foo": "bar", "child": {"grandchild": {}}}))
        );
    }

    #[test]
    fn rfc6902_a11_ignoring_unrecognized_elements() {
        let result = apply(
            json!({"foo": "bar"}),
            json!([{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}]),
        );
        assert_eq!(result, Ok(json!({"foo": "bar", "baz": "qux"})));
    }

    #[test]
    fn rfc6902_a12_adding_to_a_nonexistent_target() {
        let result = apply(
            json!({"foo": "bar"}),
            json!([{"op": "add", "path": "/baz/bat", "value": "qux"}]),
        );
        assert!(
            matches!(result, Err(PatchError::CannotApply(_))),
            "{result:?}"
        );
    }

    /// A.13's duplicate "op" member cannot survive parsing into a `Value`
    /// (the last one wins), so this checks the malformed operations that can.
    #[test]
    fn rfc6902_a13_invalid_json_patch_documents() {
        let target = json!({"foo": "bar"});
        for patch in [
            json!({"op": "add", "path": "/baz", "value": "qux"}),
            json!(["add"]),
            json!([{"path": "/baz", "value": "qux"}]),
            json!([{"op": 1, "path": "/baz", "value": "qux"}]),
            json!([{"op": "add", "value": "qux"}]),
            json!([{"op": "add", "path": "/baz"}]),
            json!([{"op": "move", "path": "/baz"}]),
            json!([{"op": "frobnicate", "path": "/baz"}]),
            json!([{"op": "add", "path": "baz", "value": 1}]),
            json!([{"op": "add", "path": "/a~2b", "value": 1}]),
        ] {
            let result = json_patch(&target, &patch);
            assert!(
                matches!(result, Err(PatchError::InvalidPatch(_))),
                "{patch}: {result:?}"
            );
        }
    }

    #[test]
    fn rfc6902_a14_escape_ordering() {
        let target = json!({"/": 9, "~1": 10});
        let result = apply(
            target.clone(),
            json!([{"op": "test", "path": "/~01", "value": 10}]),
        );
        assert_eq!(result, Ok(target));
    }

    #[test]
    fn rfc6902_a15_comparing_strings_and_numbers() {
        let result = apply(
            json!({"/": 9, "~1": 10}),
            json!([{"op": "test", "path": "/~01", "value": "10"}]),
        );
        assert!(
            matches!(result, Err(PatchError::TestFailed(_))),
            "{result:?}"
        );
    }

    #[test]
    fn rfc6902_a16_adding_an_array_value() {
        let result = apply(
            json!({"foo": ["bar"]}),
            json!([{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}]),
        );
        assert_eq!(result, Ok(json!({"foo": ["bar", ["abc", "def"]]})));
    }

    #[test]
    fn json_patch_copy() {
        let result = apply(
            json!({"spec": {"a": {"x": 1}}, "status": {}}),
            json!([{"op": "copy", "from": "/spec/a", "path": "/status/a"}]),
        );
        assert_eq!(
            result,
            Ok(json!({"spec": {"a": {"x": 1}}, "status": {"a": {"x": 1}}}))
        );
        let result = apply(
            json!({"a": 1}),
            json!([{"op": "copy", "from": "/missing", "path": "/b"}]),
        );
        assert!(
            matches!(result, Err(PatchError::CannotApply(_))),
            "{result:?}"
        );
    }

    #[test]
    fn json_patch_tilde1_escapes_slash_in_label_keys() {
        let result = apply(
            json!({"metadata": {"labels": {"app.kubernetes.io/name": "x", "~": "t"}}}),
            json!([
                {"op": "replace", "path": "/metadata/labels/app.kubernetes.io~1name", "value": "y"},
                {"op": "add", "path": "/metadata/annotations", "value": {}},
                {"op": "add", "path": "/metadata/annotations/example.com~1a~0b", "value": "z"},
                {"op": "remove", "path": "/metadata/labels/~0"}
            ]),
        );
        assert_eq!(
            result,
            Ok(json!({"metadata": {
                "labels": {"app.kubernetes.io/name": "y"},
                "annotations": {"example.com/a~b": "z"}
            }}))
        );
    }

    #[test]
    fn json_patch_dash_appends() {
        let result = apply(
            json!({"metadata": {"finalizers": ["a"]}}),
            json!([
                {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "c"}
            ]),
        );
        assert_eq!(
            result,
            Ok(json!({"metadata": {"finalizers": ["a", "b", "c"]}}))
        );
        // "-" names no existing element, so only "add" may use it.
        let result = apply(json!({"a": [1]}), json!([{"op": "remove", "path": "/a/-"}]));
        assert!(
            matches!(result, Err(PatchError::CannotApply(_))),
            "{result:?}"
        );
    }

    #[test]
    fn json_patch_add_replaces_existing_member_and_root() {
        assert_eq!(
            apply(
                json!({"a": 1}),
                json!([{"op": "add", "path": "/a", "value": 2}])
            ),
            Ok(json!({"a": 2}))
        );
        assert_eq!(
            apply(
                json!({"a": 1}),
                json!([{"op": "add", "path": "", "value": [1]}])
            ),
            Ok(json!([1]))
        );
        assert_eq!(
            apply(
                json!({"a": 1}),
                json!([{"op": "replace", "path": "", "value": {"b": 2}}])
            ),
            Ok(json!({"b": 2}))
        );
    }

    #[test]
    fn json_patch_errors_on_missing_or_out_of_range_targets() {
        let target = json!({"a": [1, 2], "b": {"c": 1}});
        for patch in [
            json!([{"op": "remove", "path": "/missing"}]),
            json!([{"op": "replace", "path": "/missing", "value": 1}]),
            json!([{"op": "remove", "path": "/a/2"}]),
            json!([{"op": "add", "path": "/a/3", "value": 1}]),
            json!([{"op": "add", "path": "/a/01", "value": 1}]),
            json!([{"op": "add", "path": "/a/x", "value": 1}]),
            json!([{"op": "add", "path": "/b/c/d", "value": 1}]),
            json!([{"op": "remove", "path": ""}]),
            json!([{"op": "move", "from": "/b", "path": "/b/c/d"}]),
        ] {
            let result = json_patch(&target, &patch);
            assert!(
                matches!(result, Err(PatchError::CannotApply(_))),
                "{patch}: {result:?}"
            );
        }
    }

    #[test]
    fn json_patch_is_all_or_nothing() {
        let target = json!({"a": 1});
        let result = apply(
            target.clone(),
            json!([
                {"op": "replace", "path": "/a", "value": 2},
                {"op": "test", "path": "/a", "value": 1}
            ]),
        );
        assert!(
            matches!(result, Err(PatchError::TestFailed(_))),
            "{result:?}"
        );
        assert_eq!(target, json!({"a": 1}));
    }

    #[test]
    fn json_patch_test_semantics() {
        let target = json!({"n": 1, "o": {"x": [1, {"y": null}]}});
        let ok = [
            json!([{"op": "test", "path": "/n", "value": 1.0}]),
            json!([{"op": "test", "path": "/o", "value": {"x": [1.0, {"y": null}]}}]),
            json!([{"op": "test", "path": "", "value": {"o": {"x": [1, {"y": null}]}, "n": 1}}]),
            // evanphx/json-patch, used by the API server, counts an absent member as null.
            json!([{"op": "test", "path": "/absent", "value": null}]),
        ];
        for patch in ok {
            assert_eq!(json_patch(&target, &patch), Ok(target.clone()), "{patch}");
        }
        let failing = [
            json!([{"op": "test", "path": "/n", "value": 2}]),
            json!([{"op": "test", "path": "/o/x", "value": [1]}]),
            json!([{"op": "test", "path": "/absent", "value": 0}]),
        ];
        for patch in failing {
            let result = json_patch(&target, &patch);
            assert!(
                matches!(result, Err(PatchError::TestFailed(_))),
                "{patch}: {result:?}"
            );
        }
    }

    #[test]
    fn json_patch_negative_indices_count_from_the_end() {
        let result = apply(
            json!({"a": [1, 2, 3]}),
            json!([
                {"op": "remove", "path": "/a/-1"},
                {"op": "add", "path": "/a/-1", "value": 9}
            ]),
        );
        assert_eq!(result, Ok(json!({"a": [1, 9, 2]})));
        let result = apply(
            json!({"a": [1]}),
            json!([{"op": "remove", "path": "/a/-2"}]),
        );
        assert!(
            matches!(result, Err(PatchError::CannotApply(_))),
            "{result:?}"
        );
    }

    #[test]
    fn json_patch_move_onto_itself_is_a_no_op() {
        let target = json!({"a": {"b": 1}});
        assert_eq!(
            apply(
                target.clone(),
                json!([{"op": "move", "from": "/a", "path": "/a"}])
            ),
            Ok(target)
        );
    }

    // -- strategic merge patch ----------------------------------------------

    fn smp(target: &Value, patch: Value) -> Value {
        strategic_merge_patch(target, &patch).expect("strategic merge patch applies")
    }

    fn smp_err(target: &Value, patch: Value) -> PatchError {
        strategic_merge_patch(target, &patch).expect_err("strategic merge patch is rejected")
    }

    fn running_pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web",
                "namespace": "default",
                "uid": "0b6c9f7e",
                "labels": {"app": "web", "tier": "frontend"},
                "annotations": {"note": "keep"},
                "finalizers": ["example.com/a"]
            },
            "spec": {
                "nodeName": "node-1",
                "containers": [
                    {
                        "name": "app",
                        "image": "app:1",
                        "command": ["/app", "--serve"],
                        "args": ["--port", "8080"],
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    },
                    {"name": "sidecar", "image": "sidecar:1"}
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [
                    {"key": "a", "operator": "Exists"},
                    {"key": "b", "operator": "Exists"}
                ]
            },
            "status": {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}
                ],
                "podIPs": [{"ip": "10.0.0.5"}],
                "containerStatuses": [
                    {"name": "app", "ready": false, "restartCount": 0,
                     "state": {"waiting": {"reason": "ContainerCreating"}}},
                    {"name": "sidecar", "ready": false, "restartCount": 0,
                     "state": {"waiting": {"reason": "ContainerCreating"}}}
                ]
            }
        })
    }

    fn condition_types(object: &Value) -> Vec<&str> {
        object["status"]["conditions"]
            .as_array()
            .expect("conditions list")
            .iter()
            .map(|condition| condition["type"].as_str().expect("condition type"))
            .collect()
    }

    #[test]
    fn smp_pod_conditions_merge_by_type() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "reason": null},
                {"type": "ContainersReady", "status": "True"}
            ]}}),
        );
        assert_eq!(patched["status"]["phase"], "Running");
        assert_eq!(
            patched["status"]["conditions"],
            json!([
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"}
            ])
        );
        // Everything else is untouched.
        assert_eq!(patched["spec"], pod["spec"]);
        assert_eq!(
            patched["status"]["containerStatuses"],
            pod["status"]["containerStatuses"]
        );
    }

    /// Upstream PodStatus.containerStatuses has no patch strategy (it is an
    /// atomic list), so a status patch must carry every container's status:
    /// a partial list wipes the others, as it would on a real API server.
    #[test]
    fn smp_pod_container_statuses_are_replaced_whole() {
        let pod = running_pod();
        let app_running = json!({"name": "app", "ready": true, "restartCount": 0,
                                 "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}});
        let patched = smp(
            &pod,
            json!({"status": {"containerStatuses": [app_running.clone()]}}),
        );
        assert_eq!(
            patched["status"]["containerStatuses"],
            json!([app_running.clone()])
        );

        // Updating one container while keeping the other means sending both,
        // which is what the kubelet's two-way patches do.
        let sidecar = pod["status"]["containerStatuses"][1].clone();
        let patched = smp(
            &pod,
            json!({"status": {"containerStatuses": [app_running.clone(), sidecar.clone()]}}),
        );
        assert_eq!(
            patched["status"]["containerStatuses"],
            json!([app_running, sidecar])
        );
        assert_eq!(patched["status"]["conditions"], pod["status"]["conditions"]);
    }

    #[test]
    fn smp_kubelet_style_status_patch() {
        let pod = running_pod();
        let statuses = json!([
            {"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}},
            {"name": "sidecar", "ready": true, "restartCount": 0, "state": {"running": {}}}
        ]);
        let patched = smp(
            &pod,
            json!({
                "metadata": {"uid": "0b6c9f7e"},
                "status": {
                    "$setElementOrder/conditions": [
                        {"type": "PodScheduled"}, {"type": "Initialized"},
                        {"type": "ContainersReady"}, {"type": "Ready"}
                    ],
                    "conditions": [
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "Ready", "status": "True", "reason": null}
                    ],
                    "containerStatuses": statuses.clone(),
                    "phase": "Running"
                }
            }),
        );
        assert_eq!(
            condition_types(&patched),
            ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
        );
        assert_eq!(
            patched["status"]["conditions"][3],
            json!({"type": "Ready", "status": "True"})
        );
        assert_eq!(patched["status"]["containerStatuses"], statuses);
        assert_eq!(patched["status"]["podIPs"], pod["status"]["podIPs"]);
    }

    #[test]
    fn smp_node_status_merges_addresses_and_conditions_and_replaces_images() {
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-1"},
            "spec": {"podCIDRs": ["10.0.0.0/24"], "taints": [{"key": "a", "effect": "NoSchedule"}]},
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "192.168.0.10"},
                    {"type": "Hostname", "address": "node-1"}
                ],
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady"}
                ],
                "images": [
                    {"names": ["a:1"], "sizeBytes": 1},
                    {"names": ["b:1"], "sizeBytes": 2}
                ],
                "capacity": {"cpu": "2", "memory": "1Gi"}
            }
        });
        let patched = smp(
            &node,
            json!({
                "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "192.168.0.11"}],
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                        {"type": "DiskPressure", "status": "False"}
                    ],
                    "images": [{"names": ["c:1"], "sizeBytes": 3}],
                    "capacity": {"memory": "2Gi"}
                }
            }),
        );
        assert_eq!(
            patched["status"]["addresses"],
            json!([
                {"type": "InternalIP", "address": "192.168.0.11"},
                {"type": "Hostname", "address": "node-1"}
            ])
        );
        assert_eq!(
            patched["status"]["conditions"],
            json!([
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "DiskPressure", "status": "False"}
            ])
        );
        assert_eq!(
            patched["status"]["images"],
            json!([{"names": ["c:1"], "sizeBytes": 3}])
        );
        assert_eq!(
            patched["status"]["capacity"],
            json!({"cpu": "2", "memory": "2Gi"})
        );
        // Node taints have no patch strategy upstream either.
        assert_eq!(
            patched["spec"]["taints"],
            json!([{"key": "b", "effect": "NoExecute"}])
        );
        assert_eq!(patched["spec"]["podCIDRs"], json!(["10.0.0.0/24"]));
    }

    #[test]
    fn smp_delete_directive_removes_list_items() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({
                "spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]},
                "status": {"conditions": [
                    {"type": "Initialized", "$patch": "delete"},
                    {"type": "NotThere", "$patch": "delete"}
                ]}
            }),
        );
        let names: Vec<&Value> = patched["spec"]["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .map(|container| &container["name"])
            .collect();
        assert_eq!(names, [&json!("app")]);
        assert_eq!(
            patched["spec"]["containers"][0],
            pod["spec"]["containers"][0]
        );
        assert_eq!(condition_types(&patched), ["PodScheduled", "Ready"]);
    }

    #[test]
    fn smp_delete_directive_removes_all_duplicates() {
        let target = json!({"spec": {"containers": [
            {"name": "1"}, {"name": "1"}, {"name": "2", "image": "a"}, {"name": "3"}, {"name": "3"}
        ]}});
        let patched = smp(
            &target,
            json!({"spec": {"containers": [
                {"name": "1", "$patch": "delete"},
                {"name": "3", "$patch": "delete"}
            ]}}),
        );
        assert_eq!(
            patched,
            json!({"spec": {"containers": [{"name": "2", "image": "a"}]}})
        );
    }

    #[test]
    fn smp_delete_directive_needs_the_merge_key() {
        let error = smp_err(
            &running_pod(),
            json!({"spec": {"containers": [{"$patch": "delete"}]}}),
        );
        assert!(
            matches!(&error, PatchError::InvalidPatch(m) if m.contains("merge key")),
            "{error:?}"
        );
    }

    #[test]
    fn smp_missing_merge_key_is_an_error() {
        let pod = running_pod();
        for patch in [
            json!({"spec": {"containers": [{"image": "x"}]}}),
            json!({"status": {"conditions": [{"status": "True"}]}}),
            json!({"spec": {"containers": [{"name": "app", "env": [{"value": "1"}]}]}}),
            json!({"spec": {"volumes": [{"emptyDir": {}}]}}),
        ] {
            let error = smp_err(&pod, patch.clone());
            assert!(
                matches!(&error, PatchError::InvalidPatch(m)
                    if m.contains("does not contain declared merge key")),
                "{patch}: {error:?}"
            );
        }
    }

    #[test]
    fn smp_set_element_order_reorders_conditions() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"status": {"$setElementOrder/conditions": [
                {"type": "Ready"}, {"type": "PodScheduled"}, {"type": "Initialized"}
            ]}}),
        );
        assert_eq!(
            condition_types(&patched),
            ["Ready", "PodScheduled", "Initialized"]
        );
        assert_eq!(
            patched["status"]["conditions"][0],
            pod["status"]["conditions"][2]
        );
        assert!(
            patched["status"]
                .get("$setElementOrder/conditions")
                .is_none()
        );
    }

    /// The case from the upstream design proposal. The design text promises
    /// C, D, E, A, B; the Go code (followed here) only moves a stored item
    /// ahead of a listed one when it was stored before it.
    #[test]
    fn smp_set_element_order_slots_unlisted_items_by_stored_position() {
        let target = json!({"status": {"conditions": [
            {"type": "C"}, {"type": "B"}, {"type": "D"}, {"type": "A"}, {"type": "E"}
        ]}});
        let patched = smp(
            &target,
            json!({"status": {
                "$setElementOrder/conditions": [{"type": "A"}, {"type": "B"}],
                "conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "True"}]
            }}),
        );
        assert_eq!(condition_types(&patched), ["C", "D", "A", "B", "E"]);
        assert_eq!(
            patched["status"]["conditions"][2],
            json!({"type": "A", "status": "True"})
        );
    }

    #[test]
    fn smp_set_element_order_ignores_unknown_entries() {
        let target = json!({"spec": {"containers": [{"name": "1"}, {"name": "3"}]}});
        let patched = smp(
            &target,
            json!({"spec": {
                "$setElementOrder/containers": [{"name": "3"}, {"name": "2"}, {"name": "1"}],
                "containers": [{"name": "3", "image": "c"}, {"name": "1", "image": "a"}]
            }}),
        );
        assert_eq!(
            patched,
            json!({"spec": {"containers": [{"name": "3", "image": "c"}, {"name": "1", "image": "a"}]}})
        );
    }

    #[test]
    fn smp_set_element_order_must_agree_with_patch_list() {
        let target = json!({"spec": {"containers": [{"name": "1"}, {"name": "3"}, {"name": "2"}]}});
        let error = smp_err(
            &target,
            json!({"spec": {
                "$setElementOrder/containers": [{"name": "1"}, {"name": "2"}, {"name": "3"}],
                "containers": [{"name": "3", "image": "c"}, {"name": "1", "image": "a"}]
            }}),
        );
        assert!(
            matches!(&error, PatchError::InvalidPatch(m) if m.contains("doesn't match")),
            "{error:?}"
        );
    }

    #[test]
    fn smp_set_element_order_adds_and_deletes_items() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"spec": {
                "$setElementOrder/containers": [{"name": "init"}, {"name": "app"}],
                "containers": [
                    {"name": "init", "image": "init:1"},
                    {"name": "sidecar", "$patch": "delete"}
                ]
            }}),
        );
        let containers = patched["spec"]["containers"]
            .as_array()
            .expect("containers");
        assert_eq!(containers.len(), 2);
        assert_eq!(containers[0], json!({"name": "init", "image": "init:1"}));
        assert_eq!(containers[1], pod["spec"]["containers"][0]);
    }

    #[test]
    fn smp_set_element_order_on_primitive_list() {
        let target = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        let patched = smp(
            &target,
            json!({"metadata": {
                "$setElementOrder/finalizers": ["c", "a", "d"],
                "$deleteFromPrimitiveList/finalizers": ["b"],
                "finalizers": ["d"]
            }}),
        );
        assert_eq!(
            patched,
            json!({"metadata": {"finalizers": ["c", "a", "d"]}})
        );
    }

    #[test]
    fn smp_set_element_order_on_new_list() {
        let patched = smp(
            &json!({"status": {}}),
            json!({"status": {
                "$setElementOrder/conditions": [{"type": "B"}, {"type": "A"}],
                "conditions": [{"type": "B"}, {"type": "A"}, {"type": "X", "$patch": "delete"}]
            }}),
        );
        assert_eq!(
            patched,
            json!({"status": {"conditions": [{"type": "B"}, {"type": "A"}]}})
        );
    }

    #[test]
    fn smp_retain_keys_clears_unlisted_fields() {
        let target = json!({"spec": {"volumes": [
            {"name": "data", "emptyDir": {"medium": "Memory"}}
        ]}});
        let patched = smp(
            &target,
            json!({"spec": {"volumes": [
                {"name": "data", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/d"}}
            ]}}),
        );
        assert_eq!(
            patched,
            json!({"spec": {"volumes": [{"name": "data", "hostPath": {"path": "/d"}}]}})
        );

        let patched = smp(
            &json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": null}}}),
        );
        assert_eq!(patched, json!({"spec": {"strategy": {"type": "Recreate"}}}));
    }

    #[test]
    fn smp_retain_keys_must_list_every_patched_field() {
        let target = json!({"spec": {"strategy": {"type": "RollingUpdate"}}});
        let error = smp_err(
            &target,
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "other": 1}}}),
        );
        assert!(
            matches!(&error, PatchError::InvalidPatch(m) if m.contains("retainKeys")),
            "{error:?}"
        );
        let error = smp_err(
            &target,
            json!({"spec": {"strategy": {"$retainKeys": "type"}}}),
        );
        assert!(
            matches!(&error, PatchError::InvalidPatch(m) if m.contains("retainKeys")),
            "{error:?}"
        );
    }

    #[test]
    fn smp_finalizers_union() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"metadata": {"finalizers": ["example.com/b", "example.com/a", "example.com/b"]}}),
        );
        // New values come first, as upstream orders them without $setElementOrder.
        assert_eq!(
            patched["metadata"]["finalizers"],
            json!(["example.com/b", "example.com/a"])
        );
    }

    #[test]
    fn smp_delete_from_primitive_list() {
        let target = json!({"metadata": {"finalizers": ["a", "b", "c", "b"]}});
        let patched = smp(
            &target,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "x"]}}),
        );
        assert_eq!(patched, json!({"metadata": {"finalizers": ["a", "c"]}}));
        // Deleting from an absent list does not create it.
        let patched = smp(
            &json!({"metadata": {"name": "x"}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}),
        );
        assert_eq!(patched, json!({"metadata": {"name": "x"}}));
        // Upstream also honours it on lists without a merge strategy.
        let patched = smp(
            &json!({"spec": {"containers": [{"name": "a", "args": ["-v", "-x"]}]}}),
            json!({"spec": {"containers": [{"name": "a", "$deleteFromPrimitiveList/args": ["-x"]}]}}),
        );
        assert_eq!(
            patched,
            json!({"spec": {"containers": [{"name": "a", "args": ["-v"]}]}})
        );
    }

    #[test]
    fn smp_null_deletes_keys_in_nested_maps() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({
                "metadata": {"labels": {"tier": null, "new": "yes"}, "annotations": null},
                "spec": {"containers": [{"name": "app", "command": null, "ports": null}]},
                "status": {"conditions": [{"type": "Ready", "reason": null}]}
            }),
        );
        assert_eq!(
            patched["metadata"]["labels"],
            json!({"app": "web", "new": "yes"})
        );
        assert!(patched["metadata"].get("annotations").is_none());
        let app = &patched["spec"]["containers"][0];
        assert!(app.get("command").is_none());
        assert!(app.get("ports").is_none());
        assert_eq!(app["args"], pod["spec"]["containers"][0]["args"]);
        assert_eq!(
            patched["status"]["conditions"][2],
            json!({"type": "Ready", "status": "False"})
        );
        // A null for an absent key is dropped rather than stored.
        let patched = smp(
            &json!({"a": {}}),
            json!({"a": {"b": null}, "c": {"d": null, "e": 1}}),
        );
        assert_eq!(patched, json!({"a": {}, "c": {"e": 1}}));
    }

    #[test]
    fn smp_lists_without_merge_key_are_replaced() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"spec": {
                "tolerations": [{"key": "c", "operator": "Exists"}],
                "containers": [{"name": "app", "command": ["/other"], "args": []}]
            }}),
        );
        assert_eq!(
            patched["spec"]["tolerations"],
            json!([{"key": "c", "operator": "Exists"}])
        );
        let app = &patched["spec"]["containers"][0];
        assert_eq!(app["command"], json!(["/other"]));
        assert_eq!(app["args"], json!([]));
        assert_eq!(app["image"], "app:1");
    }

    #[test]
    fn smp_nested_keyed_lists_merge_inside_containers() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"spec": {"containers": [{
                "name": "app",
                "image": "app:2",
                "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}],
                "ports": [{"containerPort": 8080.0, "name": "http"}, {"containerPort": 9090}],
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]
            }]}}),
        );
        let app = &patched["spec"]["containers"][0];
        assert_eq!(app["image"], "app:2");
        assert_eq!(
            app["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "20"}, {"name": "C", "value": "3"}])
        );
        assert_eq!(
            app["ports"],
            // The merge key matched numerically; the patched scalar then replaced the stored one.
            json!([{"containerPort": 8080.0, "protocol": "TCP", "name": "http"}, {"containerPort": 9090}])
        );
        assert_eq!(
            app["volumeMounts"],
            json!([{"name": "cache", "mountPath": "/cache"}, {"name": "data", "mountPath": "/data"}])
        );
        assert_eq!(
            patched["spec"]["containers"][1],
            pod["spec"]["containers"][1]
        );
    }

    #[test]
    fn smp_owner_references_and_pod_ips_merge() {
        let target = json!({
            "metadata": {"ownerReferences": [{"uid": "1", "kind": "ReplicaSet", "name": "rs"}]},
            "status": {"podIPs": [{"ip": "10.0.0.5"}], "hostIPs": [{"ip": "192.168.0.1"}]}
        });
        let patched = smp(
            &target,
            json!({
                "metadata": {"ownerReferences": [{"uid": "1", "controller": true}, {"uid": "2", "kind": "Node"}]},
                "status": {"podIPs": [{"ip": "fd00::5"}], "hostIPs": [{"ip": "192.168.0.1"}]}
            }),
        );
        assert_eq!(
            patched,
            json!({
                "metadata": {"ownerReferences": [
                    {"uid": "1", "kind": "ReplicaSet", "name": "rs", "controller": true},
                    {"uid": "2", "kind": "Node"}
                ]},
                "status": {"podIPs": [{"ip": "fd00::5"}, {"ip": "10.0.0.5"}], "hostIPs": [{"ip": "192.168.0.1"}]}
            })
        );
    }

    /// Without $setElementOrder upstream orders by the patch list, putting a
    /// stored item ahead of a patch item only when both are stored and it
    /// comes first; so new items go before untouched stored ones.
    #[test]
    fn smp_merged_list_order_follows_upstream() {
        let list = |names: &[&str]| -> Value {
            Value::Array(names.iter().map(|name| json!({"name": name})).collect())
        };
        let cases = [
            (
                list(&["1", "2", "3"]),
                list(&["3", "1", "2"]),
                list(&["3", "1", "2"]),
            ),
            (
                list(&["1", "2", "3"]),
                list(&["3", "1"]),
                list(&["2", "3", "1"]),
            ),
            (list(&["A", "B"]), list(&["C"]), list(&["C", "A", "B"])),
            (list(&["A", "B"]), list(&["A", "C"]), list(&["A", "C", "B"])),
            (
                list(&["B", "C", "A"]),
                list(&["A", "B", "D"]),
                list(&["C", "A", "B", "D"]),
            ),
        ];
        for (stored, patch, expected) in cases {
            let patched = smp(
                &json!({"spec": {"containers": stored.clone()}}),
                json!({"spec": {"containers": patch.clone()}}),
            );
            assert_eq!(
                patched["spec"]["containers"], expected,
                "{stored} + {patch}"
            );
        }
        let patched = smp(
            &json!({"metadata": {"finalizers": ["1", "2", "3"]}}),
            json!({"metadata": {"finalizers": ["3", "1"]}}),
        );
        assert_eq!(patched["metadata"]["finalizers"], json!(["2", "3", "1"]));
    }

    #[test]
    fn smp_map_directives() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"metadata": {"labels": {"$patch": "replace", "only": "this", "gone": null}}}),
        );
        assert_eq!(patched["metadata"]["labels"], json!({"only": "this"}));
        assert_eq!(
            patched["metadata"]["annotations"],
            pod["metadata"]["annotations"]
        );

        // Upstream leaves an empty map where the deleted one was.
        let patched = smp(
            &pod,
            json!({"metadata": {"annotations": {"$patch": "delete"}}}),
        );
        assert_eq!(patched["metadata"]["annotations"], json!({}));

        let patched = smp(&pod, json!({"$patch": "replace", "kind": "Pod"}));
        assert_eq!(patched, json!({"kind": "Pod"}));
        let patched = smp(&pod, json!({"$patch": "delete"}));
        assert_eq!(patched, json!({}));

        let error = smp_err(&pod, json!({"metadata": {"labels": {"$patch": "merge"}}}));
        assert!(matches!(error, PatchError::InvalidPatch(_)), "{error:?}");
    }

    #[test]
    fn smp_list_replace_directive() {
        let pod = running_pod();
        let patched = smp(
            &pod,
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "x"}]}}),
        );
        assert_eq!(
            patched["spec"]["containers"],
            json!([{"name": "only", "image": "x"}])
        );
        let patched = smp(
            &pod,
            json!({"status": {"conditions": [{"$patch": "replace"}]}}),
        );
        assert_eq!(patched["status"]["conditions"], json!([]));
        let error = smp_err(
            &pod,
            json!({"status": {"conditions": [{"$patch": "merge"}]}}),
        );
        assert!(matches!(error, PatchError::InvalidPatch(_)), "{error:?}");
        let error = smp_err(
            &pod,
            json!({"status": {"conditions": [{"$patch": 7, "type": "x"}]}}),
        );
        assert!(matches!(error, PatchError::InvalidPatch(_)), "{error:?}");
    }

    #[test]
    fn smp_directives_never_reach_new_fields() {
        let patched = smp(
            &json!({"metadata": {"name": "x"}}),
            json!({
                "metadata": {"$setElementOrder/finalizers": ["a"], "finalizers": ["a"]},
                "spec": {
                    "containers": [
                        {"name": "a", "image": "a", "env": [{"name": "X", "$patch": "delete"}],
                         "$setElementOrder/env": [{"name": "Y"}], "resources": null},
                        {"name": "gone", "$patch": "delete"}
                    ],
                    "affinity": {"$patch": "replace", "nodeAffinity": {}},
                    "securityContext": {"$retainKeys": ["runAsUser"], "runAsUser": 1}
                }
            }),
        );
        assert_eq!(
            patched,
            json!({
                "metadata": {"name": "x", "finalizers": ["a"]},
                "spec": {
                    "containers": [{"name": "a", "image": "a", "env": []}],
                    "securityContext": {"runAsUser": 1}
                }
            })
        );
    }

    #[test]
    fn smp_type_changes_replace_the_value() {
        let patched = smp(
            &json!({"a": {"b": 1}, "c": [1], "d": "x"}),
            json!({"a": "s", "c": {"e": null, "f": 1}, "d": [1]}),
        );
        assert_eq!(patched, json!({"a": "s", "c": {"f": 1}, "d": [1]}));
    }

    #[test]
    fn smp_lease_renewal() {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "node-1", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                     "renewTime": "2024-01-01T00:00:00.000000Z"}
        });
        let patched = smp(
            &lease,
            json!({"spec": {"renewTime": "2024-01-01T00:00:10.000000Z"}}),
        );
        assert_eq!(patched["spec"]["renewTime"], "2024-01-01T00:00:10.000000Z");
        assert_eq!(patched["spec"]["holderIdentity"], "node-1");
        assert_eq!(patched["metadata"], lease["metadata"]);
    }

    #[test]
    fn smp_rejects_malformed_input() {
        let pod = running_pod();
        for patch in [
            json!([]),
            json!("x"),
            json!({"status": {"conditions": [{"type": "Ready"}, "Ready"]}}),
            json!({"status": {"conditions": [["Ready"]]}}),
            json!({"metadata": {"finalizers": [{"name": "a"}]}}),
            json!({"metadata": {"$setElementOrder": ["a"]}}),
            json!({"metadata": {"$deleteFromPrimitiveListfinalizers": ["a"]}}),
            json!({"status": {"$setElementOrder/conditions": "Ready"}}),
            json!({"status": {"$setElementOrder/conditions": ["Ready"]}}),
            json!({"spec": {"$setElementOrder/tolerations": [{"key": "a"}]}}),
        ] {
            let result = strategic_merge_patch(&pod, &patch);
            assert!(
                matches!(result, Err(PatchError::InvalidPatch(_))),
                "{patch}: {result:?}"
            );
        }
        let result = strategic_merge_patch(&json!([1]), &json!({}));
        assert!(
            matches!(result, Err(PatchError::CannotApply(_))),
            "{result:?}"
        );
    }

    #[test]
    fn smp_leaves_target_untouched_and_no_directives_in_output() {
        let pod = running_pod();
        let before = pod.clone();
        let patched = smp(
            &pod,
            json!({"status": {
                "$setElementOrder/conditions": [{"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "True"}]
            }}),
        );
        assert_eq!(pod, before);
        fn has_directive(value: &Value) -> bool {
            match value {
                Value::Object(map) => map
                    .iter()
                    .any(|(k, v)| is_directive_key(k) || has_directive(v)),
                Value::Array(items) => items.iter().any(has_directive),
                _ => false,
            }
        }
        assert!(!has_directive(&patched));
    }
}
