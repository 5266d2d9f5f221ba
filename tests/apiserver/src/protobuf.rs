//! Request bodies in the Kubernetes protobuf encoding, turned into the JSON
//! the rest of the server works on.
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
        _ => return None,
    })
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
        (Kind::Time, Wire::Bytes(b)) => time_json(&decode_message(b, &TIME)?),
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

/// A zero Time (no seconds) is what Go encodes for an unset one: null,
/// which `is_zero` drops.
fn time_json(time: &Value) -> Value {
    let seconds = time.get("seconds").and_then(Value::as_i64).unwrap_or(0);
    if seconds == 0 {
        return Value::Null;
    }
    match jiff::Timestamp::from_second(seconds) {
        Ok(t) => Value::String(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
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
        plain(9, "deletionTimestamp", Kind::Time),
        pointer(10, "deletionGracePeriodSeconds", Kind::Int),
        plain(11, "labels", Kind::StringMap),
        plain(12, "annotations", Kind::StringMap),
        repeated(13, "ownerReferences", Kind::Message(&OWNER_REFERENCE)),
        repeated(14, "finalizers", Kind::String),
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
