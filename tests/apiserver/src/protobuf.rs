//! Request bodies in the Kubernetes protobuf encoding, turned into the JSON
//! the rest of the server works on, and answers in it for the kinds whose
//! tables are complete (a Lease, a Status).
//!
//! kubectl's typed commands (`create namespace|configmap|secret|
//! serviceaccount|token|clusterrole|role|clusterrolebinding|rolebinding`,
//! `certificate approve|deny`) send protobuf and take
//! a JSON answer. The real server decodes with generated code; here each
//! served kind has a table of its fields (numbers from the upstream
//! `generated.proto` files), so adding a kind is adding data. Go's JSON
//! encoding drops zero values of plain fields (`omitempty`) while optional
//! (pointer) fields keep an explicit zero; the tables say which is which.

use base64::Engine;
use serde_json::{Map, Value};

/// The four bytes every protobuf-encoded Kubernetes object starts with.
const MAGIC: &[u8] = b"k8s\0";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProtobufError {
    #[error("the body does not start with the Kubernetes protobuf magic number")]
    NoMagic,
    #[error("truncated or malformed protobuf in field {field} of {message}")]
    Malformed { message: &'static str, field: u32 },
    #[error("protobuf bodies of {api_version}/{kind} are not decoded by this server")]
    UnknownKind { api_version: String, kind: String },
}

/// A field's wire shape and how its JSON looks.
#[derive(Clone, Copy)]
enum Kind {
    String,
    /// Base64 in JSON, as Go encodes `[]byte`.
    Bytes,
    /// int32/int64 varints.
    Int,
    Bool,
    /// meta/v1 Time: seconds and nanos, RFC 3339 (seconds) in JSON.
    Time,
    /// meta/v1 MicroTime: the same message, microseconds in JSON.
    MicroTime,
    /// meta/v1 FieldsV1: a message whose one field holds JSON bytes, an
    /// object in JSON.
    FieldsV1,
    Message(&'static Message),
    /// `map<string, string>`.
    StringMap,
    /// `map<string, bytes>`.
    BytesMap,
    /// `map<string, ExtraValue>`, ExtraValue being `repeated string
    /// items = 1`, a plain list in JSON.
    StringListMap,
}

#[derive(Clone, Copy, PartialEq)]
enum Presence {
    /// A plain Go value with `omitempty`: zero values are left out.
    Plain,
    /// A Go pointer (proto2 optional): present means set, even when zero.
    Pointer,
    /// A list.
    Repeated,
}

struct Field {
    number: u32,
    name: &'static str,
    kind: Kind,
    presence: Presence,
}

pub struct Message {
    name: &'static str,
    fields: &'static [Field],
}

const fn plain(number: u32, name: &'static str, kind: Kind) -> Field {
    Field {
        number,
        name,
        kind,
        presence: Presence::Plain,
    }
}

const fn pointer(number: u32, name: &'static str, kind: Kind) -> Field {
    Field {
        number,
        name,
        kind,
        presence: Presence::Pointer,
    }
}

const fn repeated(number: u32, name: &'static str, kind: Kind) -> Field {
    Field {
        number,
        name,
        kind,
        presence: Presence::Repeated,
    }
}

/// Decodes a whole protobuf request body into the object's JSON, with its
/// `apiVersion` and `kind` from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let unknown = decode_message(envelope, &UNKNOWN)?;
    let api_version = unknown
        .pointer("/typeMeta/apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let kind = unknown
        .pointer("/typeMeta/kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let message = schema_of(&api_version, &kind).ok_or_else(|| ProtobufError::UnknownKind {
        api_version: api_version.clone(),
        kind: kind.clone(),
    })?;
    let raw = raw_field(envelope)?;
    let mut object = decode_message(raw, message)?;
    if let Value::Object(map) = &mut object {
        map.insert("apiVersion".into(), Value::String(api_version));
        map.insert("kind".into(), Value::String(kind));
    }
    Ok(object)
}

/// The envelope's `raw` bytes (runtime.Unknown field 2), kept as bytes
/// rather than base64-decoded back from JSON.
fn raw_field(envelope: &[u8]) -> Result<&[u8], ProtobufError> {
    let mut reader = Reader::new(envelope, UNKNOWN.name);
    let mut raw: &[u8] = &[];
    while let Some((number, value)) = reader.next_field()? {
        if let (2, Wire::Bytes(bytes)) = (number, value) {
            raw = bytes;
        }
    }
    Ok(raw)
}

fn schema_of(api_version: &str, kind: &str) -> Option<&'static Message> {
    Some(match (api_version, kind) {
        ("v1", "Namespace") => &NAMESPACE,
        ("v1", "ConfigMap") => &CONFIG_MAP,
        ("v1", "Secret") => &SECRET,
        ("v1", "ServiceAccount") => &SERVICE_ACCOUNT,
        ("authentication.k8s.io/v1", "TokenRequest") => &TOKEN_REQUEST,
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => &CSR,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding" | "RoleBinding") => &ROLE_BINDING,
        ("rbac.authorization.k8s.io/v1", "ClusterRole" | "Role") => &ROLE,
        ("coordination.k8s.io/v1", "Lease") => &LEASE,
        ("v1", "Status") => &STATUS,
        _ => return None,
    })
}

/// Whether a client's Accept header puts plain protobuf first, as client-go
/// does when it is configured for protobuf (`application/vnd.kubernetes.protobuf,
/// application/json`). A protobuf range with parameters (`as=Table`) asks
/// for something else.
pub fn wanted(accept: &str) -> bool {
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        if media == PROTOBUF {
            return parts.all(|p| p.starts_with("q="));
        }
        if matches!(media, "application/json" | "application/*" | "*/*") {
            return false;
        }
    }
    false
}

/// The protobuf media type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Kinds this server answers in protobuf: those whose tables hold every
/// field of the kind, so that nothing is lost in the encoding. Other kinds
/// are answered in JSON, which every protobuf client accepts as well.
fn encodable(api_version: &str, kind: &str) -> Option<&'static Message> {
    match (api_version, kind) {
        ("coordination.k8s.io/v1", "Lease") => Some(&LEASE),
        ("v1", "Status") => Some(&STATUS),
        _ => None,
    }
}

/// An object in the protobuf encoding, as the real server's generated code
/// writes it: fields in number order, plain fields always (an empty string
/// is two bytes), pointer fields when set, map entries sorted by key, in a
/// `runtime.Unknown` envelope. `None` for a kind without a complete table,
/// or an object with a field the table does not know.
pub fn encode(object: &Value) -> Option<Vec<u8>> {
    let api_version = object.get("apiVersion")?.as_str()?;
    let kind = object.get("kind")?.as_str()?;
    encode_as(object, encodable(api_version, kind)?)
}

fn encode_as(object: &Value, message: &Message) -> Option<Vec<u8>> {
    let api_version = object.get("apiVersion")?.as_str()?;
    let kind = object.get("kind")?.as_str()?;
    let mut fields = object.as_object()?.clone();
    fields.remove("apiVersion");
    fields.remove("kind");
    let mut raw = Vec::new();
    encode_message(&fields, message, &mut raw)?;
    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    put_bytes(&mut out, 1, &type_meta);
    put_bytes(&mut out, 2, &raw);
    put_bytes(&mut out, 3, b"");
    put_bytes(&mut out, 4, b"");
    Some(out)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_bytes(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_varint(out, u64::from(number) << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_int(out: &mut Vec<u8>, number: u32, value: i64) {
    put_varint(out, u64::from(number) << 3);
    // Negative int32/int64 values are ten bytes, sign-extended, as in Go.
    put_varint(out, value as u64);
}

fn encode_message(object: &Map<String, Value>, message: &Message, out: &mut Vec<u8>) -> Option<()> {
    if object
        .keys()
        .any(|key| !message.fields.iter().any(|f| f.name == key))
    {
        return None;
    }
    let mut fields: Vec<&Field> = message.fields.iter().collect();
    fields.sort_by_key(|f| f.number);
    for field in fields {
        let value = object.get(field.name).filter(|v| !v.is_null());
        match (field.presence, value) {
            (Presence::Repeated, Some(Value::Array(items))) => {
                for item in items {
                    encode_field(field, item, out)?;
                }
            }
            (Presence::Repeated, Some(_)) => return None,
            (Presence::Repeated | Presence::Pointer, None) => {}
            // A nil []byte is left out; only a set one is written.
            (Presence::Plain, None) if matches!(field.kind, Kind::Bytes) => {}
            (_, value) => encode_field(field, value.unwrap_or(&Value::Null), out)?,
        }
    }
    Some(())
}

/// One field; `Null` stands for a plain field's zero value.
fn encode_field(field: &Field, value: &Value, out: &mut Vec<u8>) -> Option<()> {
    let number = field.number;
    match field.kind {
        Kind::String => put_bytes(out, number, text(value)?.as_bytes()),
        Kind::Bytes => put_bytes(out, number, &base64_bytes(value)?),
        Kind::Int => put_int(
            out,
            number,
            if value.is_null() { 0 } else { value.as_i64()? },
        ),
        Kind::Bool => put_int(out, number, i64::from(value.as_bool().unwrap_or(false))),
        Kind::Time | Kind::MicroTime => {
            let mut time = Vec::new();
            if let Some(stamp) = value.as_str() {
                let stamp: jiff::Timestamp = stamp.parse().ok()?;
                // Time keeps whole seconds on the wire, as upstream's
                // ProtoTime; MicroTime its microseconds.
                let nanos = match field.kind {
                    Kind::MicroTime => stamp.subsec_microsecond() * 1000,
                    _ => 0,
                };
                put_int(&mut time, 1, stamp.as_second());
                put_int(&mut time, 2, i64::from(nanos));
            }
            put_bytes(out, number, &time);
        }
        Kind::FieldsV1 => {
            let mut fields = Vec::new();
            put_bytes(&mut fields, 1, &serde_json::to_vec(value).ok()?);
            put_bytes(out, number, &fields);
        }
        Kind::Message(message) => {
            let empty = Map::new();
            let object = match value {
                Value::Null => &empty,
                other => other.as_object()?,
            };
            let mut inner = Vec::new();
            encode_message(object, message, &mut inner)?;
            put_bytes(out, number, &inner);
        }
        Kind::StringMap | Kind::BytesMap | Kind::StringListMap => {
            let empty = Map::new();
            let entries = match value {
                Value::Null => &empty,
                other => other.as_object()?,
            };
            let mut keys: Vec<&String> = entries.keys().collect();
            keys.sort();
            for key in keys {
                let mut entry = Vec::new();
                put_bytes(&mut entry, 1, key.as_bytes());
                match field.kind {
                    Kind::StringMap => put_bytes(&mut entry, 2, text(&entries[key])?.as_bytes()),
                    Kind::BytesMap => put_bytes(&mut entry, 2, &base64_bytes(&entries[key])?),
                    _ => {
                        let mut items = Vec::new();
                        for item in entries[key].as_array()? {
                            put_bytes(&mut items, 1, item.as_str()?.as_bytes());
                        }
                        put_bytes(&mut entry, 2, &items);
                    }
                }
                put_bytes(out, number, &entry);
            }
        }
    }
    Some(())
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::Null => Some(""),
        other => other.as_str(),
    }
}

fn base64_bytes(value: &Value) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(text(value)?)
        .ok()
}

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// Fixed 32/64-bit values: no served field uses them; skipped.
    Fixed,
}

struct Reader<'a> {
    data: &'a [u8],
    message: &'static str,
    field: u32,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8], message: &'static str) -> Self {
        Reader {
            data,
            message,
            field: 0,
        }
    }

    fn malformed(&self) -> ProtobufError {
        ProtobufError::Malformed {
            message: self.message,
            field: self.field,
        }
    }

    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut value = 0u64;
        for (i, byte) in self.data.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.data = &self.data[i + 1..];
                return Ok(value);
            }
        }
        Err(self.malformed())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtobufError> {
        if n > self.data.len() {
            return Err(self.malformed());
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    fn next_field(&mut self) -> Result<Option<(u32, Wire<'a>)>, ProtobufError> {
        if self.data.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        self.field = u32::try_from(key >> 3).map_err(|_| self.malformed())?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| self.malformed())?;
                Wire::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed
            }
            _ => return Err(self.malformed()),
        };
        Ok(Some((self.field, value)))
    }
}

fn decode_message(data: &[u8], message: &'static Message) -> Result<Value, ProtobufError> {
    let mut reader = Reader::new(data, message.name);
    let mut object = Map::new();
    while let Some((number, wire)) = reader.next_field()? {
        // Fields this server does not know are dropped, as a decoder
        // generated from an older .proto does.
        let Some(field) = message.fields.iter().find(|f| f.number == number) else {
            continue;
        };
        let value = decode_value(&wire, field, &reader)?;
        match field.presence {
            Presence::Repeated => {
                if let Some(value) = value {
                    let list = object
                        .entry(field.name)
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(items) = list {
                        items.push(value);
                    }
                }
            }
            Presence::Plain | Presence::Pointer => match field.kind {
                Kind::StringMap | Kind::BytesMap | Kind::StringListMap => {
                    if let Some(Value::Array(pair)) = value {
                        let entries = object
                            .entry(field.name)
                            .or_insert_with(|| Value::Object(Map::new()));
                        if let (Value::Object(entries), [Value::String(key), value]) =
                            (entries, pair.as_slice())
                        {
                            entries.insert(key.clone(), value.clone());
                        }
                    }
                }
                _ => match value {
                    Some(value) if field.presence == Presence::Pointer || !is_zero(&value) => {
                        object.insert(field.name.into(), value);
                    }
                    _ => {
                        object.remove(field.name);
                    }
                },
            },
        }
    }
    Ok(Value::Object(object))
}

/// Go's `omitempty` zero: empty strings, 0, false, empty objects.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_i64() == Some(0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        // Go's omitempty keeps empty structs (`spec: {}`), but a message
        // that decoded to nothing is what an unset one looks like too;
        // dropping it matches what the JSON clients send.
        Value::Object(o) => o.is_empty(),
    }
}

/// One wire value as JSON; map entries come back as `[key, value]`.
fn decode_value(
    wire: &Wire<'_>,
    field: &Field,
    reader: &Reader<'_>,
) -> Result<Option<Value>, ProtobufError> {
    let malformed = || reader.malformed();
    Ok(Some(match (field.kind, wire) {
        (Kind::Int, Wire::Varint(v)) => Value::from(*v as i64),
        (Kind::Bool, Wire::Varint(v)) => Value::Bool(*v != 0),
        (Kind::String, Wire::Bytes(b)) => {
            Value::String(String::from_utf8(b.to_vec()).map_err(|_| malformed())?)
        }
        (Kind::Bytes, Wire::Bytes(b)) => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        (Kind::Time, Wire::Bytes(b)) => time_json(&decode_message(b, &TIME)?, false),
        (Kind::MicroTime, Wire::Bytes(b)) => time_json(&decode_message(b, &TIME)?, true),
        (Kind::FieldsV1, Wire::Bytes(b)) => {
            let fields = raw_field_of(b, reader)?;
            serde_json::from_slice(fields).map_err(|_| malformed())?
        }
        (Kind::Message(m), Wire::Bytes(b)) => decode_message(b, m)?,
        (Kind::StringMap, Wire::Bytes(b)) => map_entry(decode_message(b, &STRING_ENTRY)?),
        (Kind::BytesMap, Wire::Bytes(b)) => map_entry(decode_message(b, &BYTES_ENTRY)?),
        (Kind::StringListMap, Wire::Bytes(b)) => {
            let entry = decode_message(b, &EXTRA_ENTRY)?;
            let key = entry
                .get("key")
                .cloned()
                .unwrap_or(Value::String(String::new()));
            let items = entry
                .pointer("/value/items")
                .cloned()
                .unwrap_or(Value::Array(Vec::new()));
            Value::Array(vec![key, items])
        }
        (_, Wire::Fixed) => return Ok(None),
        _ => return Err(malformed()),
    }))
}

fn map_entry(entry: Value) -> Value {
    let key = entry
        .get("key")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    // An entry with an empty value omits it on the wire; JSON keeps "".
    let value = entry
        .get("value")
        .cloned()
        .unwrap_or(Value::String(String::new()));
    Value::Array(vec![key, value])
}

/// FieldsV1's one field, its JSON bytes.
fn raw_field_of<'a>(message: &'a [u8], outer: &Reader<'_>) -> Result<&'a [u8], ProtobufError> {
    let mut reader = Reader::new(message, "FieldsV1");
    let mut raw: &[u8] = b"{}";
    while let Some((number, value)) = reader.next_field().map_err(|_| outer.malformed())? {
        if let (1, Wire::Bytes(bytes)) = (number, value) {
            raw = bytes;
        }
    }
    Ok(raw)
}

/// A zero Time (no seconds) is what Go encodes for an unset one: null,
/// which `is_zero` drops.
fn time_json(time: &Value, micro: bool) -> Value {
    let seconds = time.get("seconds").and_then(Value::as_i64).unwrap_or(0);
    if seconds == 0 {
        return Value::Null;
    }
    let nanos = time.get("nanos").and_then(Value::as_i64).unwrap_or(0);
    let (nanos, format) = match micro {
        true => (nanos / 1000 * 1000, "%Y-%m-%dT%H:%M:%S%.6fZ"),
        false => (0, "%Y-%m-%dT%H:%M:%SZ"),
    };
    match jiff::Timestamp::new(seconds, i32::try_from(nanos).unwrap_or(0)) {
        Ok(t) => Value::String(t.strftime(format).to_string()),
        Err(_) => Value::Null,
    }
}

// Field tables, from the upstream generated.proto files (apimachinery
// runtime and meta/v1, api core/v1, authentication/v1, certificates/v1, rbac/v1). Go pointer fields are `pointer`, the rest `plain`.

static UNKNOWN: Message = Message {
    name: "runtime.Unknown",
    fields: &[
        plain(1, "typeMeta", Kind::Message(&RUNTIME_TYPE_META)),
        plain(3, "contentEncoding", Kind::String),
        plain(4, "contentType", Kind::String),
    ],
};

static RUNTIME_TYPE_META: Message = Message {
    name: "runtime.TypeMeta",
    fields: &[
        plain(1, "apiVersion", Kind::String),
        plain(2, "kind", Kind::String),
    ],
};

static TIME: Message = Message {
    name: "Time",
    fields: &[plain(1, "seconds", Kind::Int), plain(2, "nanos", Kind::Int)],
};

static STRING_ENTRY: Message = Message {
    name: "map<string, string> entry",
    fields: &[
        plain(1, "key", Kind::String),
        plain(2, "value", Kind::String),
    ],
};

static BYTES_ENTRY: Message = Message {
    name: "map<string, bytes> entry",
    fields: &[
        plain(1, "key", Kind::String),
        plain(2, "value", Kind::Bytes),
    ],
};

static EXTRA_ENTRY: Message = Message {
    name: "map<string, ExtraValue> entry",
    fields: &[
        plain(1, "key", Kind::String),
        plain(2, "value", Kind::Message(&EXTRA_VALUE)),
    ],
};

static EXTRA_VALUE: Message = Message {
    name: "ExtraValue",
    fields: &[repeated(1, "items", Kind::String)],
};

static OBJECT_META: Message = Message {
    name: "ObjectMeta",
    fields: &[
        plain(1, "name", Kind::String),
        plain(2, "generateName", Kind::String),
        plain(3, "namespace", Kind::String),
        plain(4, "selfLink", Kind::String),
        plain(5, "uid", Kind::String),
        plain(6, "resourceVersion", Kind::String),
        plain(7, "generation", Kind::Int),
        plain(8, "creationTimestamp", Kind::Time),
        pointer(9, "deletionTimestamp", Kind::Time),
        pointer(10, "deletionGracePeriodSeconds", Kind::Int),
        plain(11, "labels", Kind::StringMap),
        plain(12, "annotations", Kind::StringMap),
        repeated(13, "ownerReferences", Kind::Message(&OWNER_REFERENCE)),
        repeated(14, "finalizers", Kind::String),
        repeated(17, "managedFields", Kind::Message(&MANAGED_FIELDS_ENTRY)),
    ],
};

static MANAGED_FIELDS_ENTRY: Message = Message {
    name: "ManagedFieldsEntry",
    fields: &[
        plain(1, "manager", Kind::String),
        plain(2, "operation", Kind::String),
        plain(3, "apiVersion", Kind::String),
        pointer(4, "time", Kind::Time),
        plain(6, "fieldsType", Kind::String),
        pointer(7, "fieldsV1", Kind::FieldsV1),
        plain(8, "subresource", Kind::String),
    ],
};

static LEASE: Message = Message {
    name: "Lease",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        plain(2, "spec", Kind::Message(&LEASE_SPEC)),
    ],
};

static LEASE_SPEC: Message = Message {
    name: "LeaseSpec",
    fields: &[
        pointer(1, "holderIdentity", Kind::String),
        pointer(2, "leaseDurationSeconds", Kind::Int),
        pointer(3, "acquireTime", Kind::MicroTime),
        pointer(4, "renewTime", Kind::MicroTime),
        pointer(5, "leaseTransitions", Kind::Int),
        pointer(6, "strategy", Kind::String),
        pointer(7, "preferredHolder", Kind::String),
    ],
};

static STATUS: Message = Message {
    name: "Status",
    fields: &[
        plain(1, "metadata", Kind::Message(&LIST_META)),
        plain(2, "status", Kind::String),
        plain(3, "message", Kind::String),
        plain(4, "reason", Kind::String),
        pointer(5, "details", Kind::Message(&STATUS_DETAILS)),
        plain(6, "code", Kind::Int),
    ],
};

static LIST_META: Message = Message {
    name: "ListMeta",
    fields: &[
        plain(1, "selfLink", Kind::String),
        plain(2, "resourceVersion", Kind::String),
        plain(3, "continue", Kind::String),
        pointer(4, "remainingItemCount", Kind::Int),
    ],
};

static STATUS_DETAILS: Message = Message {
    name: "StatusDetails",
    fields: &[
        plain(1, "name", Kind::String),
        plain(2, "group", Kind::String),
        plain(3, "kind", Kind::String),
        repeated(4, "causes", Kind::Message(&STATUS_CAUSE)),
        plain(5, "retryAfterSeconds", Kind::Int),
        plain(6, "uid", Kind::String),
    ],
};

static STATUS_CAUSE: Message = Message {
    name: "StatusCause",
    fields: &[
        plain(1, "reason", Kind::String),
        plain(2, "message", Kind::String),
        plain(3, "field", Kind::String),
    ],
};

static OWNER_REFERENCE: Message = Message {
    name: "OwnerReference",
    fields: &[
        plain(1, "kind", Kind::String),
        plain(3, "name", Kind::String),
        plain(4, "uid", Kind::String),
        plain(5, "apiVersion", Kind::String),
        pointer(6, "controller", Kind::Bool),
        pointer(7, "blockOwnerDeletion", Kind::Bool),
    ],
};

static NAMESPACE: Message = Message {
    name: "Namespace",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        plain(2, "spec", Kind::Message(&NAMESPACE_SPEC)),
        plain(3, "status", Kind::Message(&NAMESPACE_STATUS)),
    ],
};

static NAMESPACE_SPEC: Message = Message {
    name: "NamespaceSpec",
    fields: &[repeated(1, "finalizers", Kind::String)],
};

static NAMESPACE_STATUS: Message = Message {
    name: "NamespaceStatus",
    fields: &[
        plain(1, "phase", Kind::String),
        repeated(2, "conditions", Kind::Message(&NAMESPACE_CONDITION)),
    ],
};

static NAMESPACE_CONDITION: Message = Message {
    name: "NamespaceCondition",
    fields: &[
        plain(1, "type", Kind::String),
        plain(2, "status", Kind::String),
        plain(4, "lastTransitionTime", Kind::Time),
        plain(5, "reason", Kind::String),
        plain(6, "message", Kind::String),
    ],
};

static CONFIG_MAP: Message = Message {
    name: "ConfigMap",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        plain(2, "data", Kind::StringMap),
        plain(3, "binaryData", Kind::BytesMap),
        pointer(4, "immutable", Kind::Bool),
    ],
};

static SECRET: Message = Message {
    name: "Secret",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        plain(2, "data", Kind::BytesMap),
        plain(3, "type", Kind::String),
        plain(4, "stringData", Kind::StringMap),
        pointer(5, "immutable", Kind::Bool),
    ],
};

static SERVICE_ACCOUNT: Message = Message {
    name: "ServiceAccount",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        repeated(2, "secrets", Kind::Message(&OBJECT_REFERENCE)),
        repeated(
            3,
            "imagePullSecrets",
            Kind::Message(&LOCAL_OBJECT_REFERENCE),
        ),
        pointer(4, "automountServiceAccountToken", Kind::Bool),
    ],
};

static OBJECT_REFERENCE: Message = Message {
    name: "ObjectReference",
    fields: &[
        plain(1, "kind", Kind::String),
        plain(2, "namespace", Kind::String),
        plain(3, "name", Kind::String),
        plain(4, "uid", Kind::String),
        plain(5, "apiVersion", Kind::String),
        plain(6, "resourceVersion", Kind::String),
        plain(7, "fieldPath", Kind::String),
    ],
};

static LOCAL_OBJECT_REFERENCE: Message = Message {
    name: "LocalObjectReference",
    fields: &[plain(1, "name", Kind::String)],
};

static TOKEN_REQUEST: Message = Message {
    name: "TokenRequest",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        plain(2, "spec", Kind::Message(&TOKEN_REQUEST_SPEC)),
        plain(3, "status", Kind::Message(&TOKEN_REQUEST_STATUS)),
    ],
};

static TOKEN_REQUEST_SPEC: Message = Message {
    name: "TokenRequestSpec",
    fields: &[
        repeated(1, "audiences", Kind::String),
        pointer(3, "boundObjectRef", Kind::Message(&BOUND_OBJECT_REFERENCE)),
        pointer(4, "expirationSeconds", Kind::Int),
    ],
};

static TOKEN_REQUEST_STATUS: Message = Message {
    name: "TokenRequestStatus",
    fields: &[
        plain(1, "token", Kind::String),
        plain(2, "expirationTimestamp", Kind::Time),
    ],
};

static BOUND_OBJECT_REFERENCE: Message = Message {
    name: "BoundObjectReference",
    fields: &[
        plain(1, "kind", Kind::String),
        plain(2, "apiVersion", Kind::String),
        plain(3, "name", Kind::String),
        plain(4, "uid", Kind::String),
    ],
};

/// ClusterRoleBinding and RoleBinding have the same fields, as do
/// ClusterRole and Role (a Role has no aggregationRule).
static ROLE_BINDING: Message = Message {
    name: "RoleBinding",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        repeated(2, "subjects", Kind::Message(&SUBJECT)),
        plain(3, "roleRef", Kind::Message(&ROLE_REF)),
    ],
};

static SUBJECT: Message = Message {
    name: "Subject",
    fields: &[
        plain(1, "kind", Kind::String),
        plain(2, "apiGroup", Kind::String),
        plain(3, "name", Kind::String),
        plain(4, "namespace", Kind::String),
    ],
};

static ROLE_REF: Message = Message {
    name: "RoleRef",
    fields: &[
        plain(1, "apiGroup", Kind::String),
        plain(2, "kind", Kind::String),
        plain(3, "name", Kind::String),
    ],
};

static ROLE: Message = Message {
    name: "Role",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        repeated(2, "rules", Kind::Message(&POLICY_RULE)),
    ],
};

static POLICY_RULE: Message = Message {
    name: "PolicyRule",
    fields: &[
        repeated(1, "verbs", Kind::String),
        repeated(2, "apiGroups", Kind::String),
        repeated(3, "resources", Kind::String),
        repeated(4, "resourceNames", Kind::String),
        repeated(5, "nonResourceURLs", Kind::String),
    ],
};

static CSR: Message = Message {
    name: "CertificateSigningRequest",
    fields: &[
        plain(1, "metadata", Kind::Message(&OBJECT_META)),
        plain(2, "spec", Kind::Message(&CSR_SPEC)),
        plain(3, "status", Kind::Message(&CSR_STATUS)),
    ],
};

static CSR_SPEC: Message = Message {
    name: "CertificateSigningRequestSpec",
    fields: &[
        plain(1, "request", Kind::Bytes),
        plain(2, "username", Kind::String),
        plain(3, "uid", Kind::String),
        repeated(4, "groups", Kind::String),
        repeated(5, "usages", Kind::String),
        plain(6, "extra", Kind::StringListMap),
        plain(7, "signerName", Kind::String),
        pointer(8, "expirationSeconds", Kind::Int),
    ],
};

static CSR_STATUS: Message = Message {
    name: "CertificateSigningRequestStatus",
    fields: &[
        repeated(1, "conditions", Kind::Message(&CSR_CONDITION)),
        plain(2, "certificate", Kind::Bytes),
    ],
};

static CSR_CONDITION: Message = Message {
    name: "CertificateSigningRequestCondition",
    fields: &[
        plain(1, "type", Kind::String),
        plain(2, "reason", Kind::String),
        plain(3, "message", Kind::String),
        plain(4, "lastUpdateTime", Kind::Time),
        plain(5, "lastTransitionTime", Kind::Time),
        plain(6, "status", Kind::String),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/tests/fixtures/protobuf/{name}.pb",
            env!("CARGO_MANIFEST_DIR")
        );
        let bytes = std::fs::read(&path).unwrap();
        decode(&bytes).unwrap()
    }

    #[test]
    fn kubectl_create_namespace() {
        assert_eq!(
            fixture("ns"),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "foo"}})
        );
    }

    #[test]
    fn kubectl_create_configmap_and_secret() {
        assert_eq!(
            fixture("cm"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1"},
                   "data": {"a": "b", "c": "d"}})
        );
        assert_eq!(
            fixture("secret"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"},
                   "data": {"k": "dg=="}, "type": "Opaque"})
        );
    }

    #[test]
    fn kubectl_create_serviceaccount_and_token() {
        assert_eq!(
            fixture("sa"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa1"}})
        );
        assert_eq!(
            fixture("token"),
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": ["aud1"], "expirationSeconds": 3600}})
        );
    }

    #[test]
    fn kubectl_certificate_approve() {
        let csr = fixture("csr-approve");
        assert_eq!(csr["kind"], "CertificateSigningRequest");
        assert_eq!(csr["metadata"]["name"], "csr1");
        assert!(
            csr["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
        let request = base64::engine::general_purpose::STANDARD
            .decode(csr["spec"]["request"].as_str().unwrap())
            .unwrap();
        assert!(request.starts_with(b"-----BEGIN CERTIFICATE REQUEST-----"));
        assert_eq!(
            csr["spec"]["signerName"],
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        assert_eq!(
            csr["spec"]["usages"],
            json!(["digital signature", "client auth"])
        );
        let condition = &csr["status"]["conditions"][0];
        assert_eq!(condition["type"], "Approved");
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], "KubectlApprove");
        let annotations = csr["metadata"]["annotations"].as_object().unwrap();
        assert!(annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    }

    /// The encoder writes what kubectl's generated code wrote, byte for
    /// byte: zero plain fields, empty times, sorted maps, the envelope.
    #[test]
    fn encodes_as_kubectl_does() {
        for name in ["ns", "cm", "secret", "sa", "token", "csr-approve"] {
            let bytes = fixture_bytes(name);
            let object = decode(&bytes).unwrap();
            let message = schema_of(
                object["apiVersion"].as_str().unwrap(),
                object["kind"].as_str().unwrap(),
            )
            .unwrap();
            assert_eq!(encode_as(&object, message).unwrap(), bytes, "{name}");
        }
    }

    #[test]
    fn a_lease_and_a_status_round_trip() {
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "n1", "namespace": "kube-node-lease", "uid": "u", "resourceVersion": "77",
                "creationTimestamp": "2026-12-06T17:17:49Z",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n"}],
                "managedFields": [{"manager": "nanolet", "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
                    "time": "2026-12-06T17:20:13Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:renewTime": {}}}}]},
            "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": "2026-12-06T17:20:13.377043Z"}});
        let bytes = encode(&lease).unwrap();
        assert!(bytes.starts_with(MAGIC));
        assert_eq!(decode(&bytes).unwrap(), lease);
        let status = json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": "leases \"n1\" conflict", "reason": "Conflict", "code": 409,
            "details": {"name": "n1", "group": "coordination.k8s.io", "kind": "leases"}});
        let mut decoded = decode(&encode(&status).unwrap()).unwrap();
        // The decoder drops empty messages (an empty ListMeta).
        decoded["metadata"] = json!({});
        assert_eq!(decoded, status);
        // Kinds without a complete table, and fields a table lacks, are
        // answered in JSON.
        assert!(encode(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {}})).is_none());
        let mut odd = lease.clone();
        odd["spec"]["future"] = json!(1);
        assert!(encode(&odd).is_none());
    }

    #[test]
    fn protobuf_is_wanted_when_listed_first() {
        assert!(wanted(
            "application/vnd.kubernetes.protobuf, application/json"
        ));
        assert!(wanted("application/vnd.kubernetes.protobuf"));
        assert!(!wanted(
            "application/json, application/vnd.kubernetes.protobuf"
        ));
        assert!(!wanted("application/json"));
        assert!(!wanted("*/*"));
        assert!(!wanted(""));
        assert!(!wanted(
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json"
        ));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert_eq!(decode(b"{}"), Err(ProtobufError::NoMagic));
        // A Pod envelope: a kind without a table.
        let mut pod = MAGIC.to_vec();
        pod.extend_from_slice(&[
            0x0a, 0x09, 0x0a, 0x02, b'v', b'1', 0x12, 0x03, b'P', b'o', b'd',
        ]);
        assert!(matches!(
            decode(&pod),
            Err(ProtobufError::UnknownKind { .. })
        ));
        // A length running past the end.
        let mut truncated = fixture_bytes("ns");
        truncated.truncate(30);
        assert!(matches!(
            decode(&truncated),
            Err(ProtobufError::Malformed { .. })
        ));
    }

    fn fixture_bytes(name: &str) -> Vec<u8> {
        std::fs::read(format!(
            "{}/tests/fixtures/protobuf/{name}.pb",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }
}
