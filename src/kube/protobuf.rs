//! The little the agent reads of answers in the Kubernetes protobuf
//! encoding: an object's `metadata.resourceVersion`, and a `Status`'s
//! reason and message. Asking for protobuf on the Lease renewal, sent every
//! 10 s, trims its answer by a third on a link billed by the byte; the rest
//! of an answer is skipped, not decoded, so no generated code is needed.
//!
//! Every length is checked against the bytes there are; nothing recurses
//! and nothing is allocated beyond the strings returned.

use crate::protobuf_wire::{self, Value};

/// The four bytes every protobuf-encoded Kubernetes object starts with.
const MAGIC: &[u8] = b"k8s\0";

/// The media type, as upstream's clients name it in Accept.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProtobufError {
    #[error("the answer does not start with the Kubernetes protobuf magic number")]
    NoMagic,
    #[error("truncated or malformed protobuf at byte {offset}")]
    Malformed { offset: usize },
    #[error("the answer has no {0}")]
    Missing(&'static str),
    #[error("{0} is not UTF-8")]
    NotText(&'static str),
}

/// `metadata.resourceVersion` of a protobuf-encoded object: every
/// top-level kind has its ObjectMeta at field 1, resourceVersion at 6.
pub fn resource_version(body: &[u8]) -> Result<String, ProtobufError> {
    let object = raw_object(body)?;
    let metadata = field(object, 1)?.ok_or(ProtobufError::Missing("metadata"))?;
    let version = field(metadata, 6)?.ok_or(ProtobufError::Missing("resourceVersion"))?;
    text(version, "resourceVersion")
}

/// A `Status`'s reason (field 4) and message (field 3), where present.
pub fn status_reason_and_message(
    body: &[u8],
) -> Result<(Option<String>, Option<String>), ProtobufError> {
    let status = raw_object(body)?;
    let reason = field(status, 4)?.map(|r| text(r, "reason")).transpose()?;
    let message = field(status, 3)?.map(|m| text(m, "message")).transpose()?;
    Ok((reason, message))
}

/// The object inside the `runtime.Unknown` envelope (its field 2).
fn raw_object(body: &[u8]) -> Result<&[u8], ProtobufError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    field(envelope, 2)?.ok_or(ProtobufError::Missing("object"))
}

fn text(bytes: &[u8], what: &'static str) -> Result<String, ProtobufError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| ProtobufError::NotText(what))
}

/// The last length-delimited value of field `number` in a message (the
/// last wins, as protobuf merges a repeated scalar), or `None`. Fields of
/// other wire types are skipped; a field `number` that is not
/// length-delimited is malformed for what we read.
fn field(message: &[u8], number: u32) -> Result<Option<&[u8]>, ProtobufError> {
    let mut fields = protobuf_wire::fields(message);
    let mut found = None;
    loop {
        let next = fields
            .next_field()
            .map_err(|protobuf_wire::Malformed(offset)| ProtobufError::Malformed { offset })?;
        match next {
            None => return Ok(found),
            Some((n, Value::Bytes(bytes))) if n == number => found = Some(bytes),
            Some((n, _)) if n == number => {
                return Err(ProtobufError::Malformed {
                    offset: message.len(),
                });
            }
            Some(_) => {}
        }
    }
}

/// For the fuzz target: either call may fail on any input, never panic.
pub mod fuzzing {
    pub fn answer(data: &[u8]) {
        let _ = super::resource_version(data);
        let _ = super::status_reason_and_message(data);
    }
}

/// The test API server's answer to a renewal on a stale version.
#[cfg(test)]
pub(crate) fn conflict_status() -> Vec<u8> {
    from_hex(include_str!(
        "../../tests/fixtures/protobuf/status-conflict.hex"
    ))
}

#[cfg(test)]
fn from_hex(hex: &str) -> Vec<u8> {
    hex.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap_or(0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Lease as the test API server answers a renewal (its encoder
    /// writes kubectl's bytes for the kinds kubectl sends, byte for byte):
    /// envelope, ObjectMeta with ownerReferences and managedFields, spec.
    fn lease() -> Vec<u8> {
        from_hex(include_str!(
            "../../tests/fixtures/protobuf/lease-renewal.hex"
        ))
    }

    #[test]
    fn reads_a_lease_resource_version() {
        assert_eq!(resource_version(&lease()).as_deref(), Ok("20"));
    }

    /// The test API server's answer to a renewal with a stale version
    /// (kubectl decodes its Status encoding, and prints its reason).
    #[test]
    fn reads_a_status() {
        let body = conflict_status();
        let (reason, message) = status_reason_and_message(&body).unwrap_or_default();
        assert_eq!(reason.as_deref(), Some("Conflict"));
        assert!(message.is_some_and(|m| m.contains("the object has been modified")));
    }

    #[test]
    fn refuses_hostile_answers() {
        let whole = lease();
        assert_eq!(resource_version(b"{}"), Err(ProtobufError::NoMagic));
        // Every truncation fails cleanly (or still finds the version, when
        // only the tail after it went).
        for end in 0..whole.len() {
            let _ = resource_version(&whole[..end]);
        }
        assert!(resource_version(&whole[..whole.len() / 2]).is_err());
        // A length at the maximum, past the end.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[
            0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ]);
        assert!(matches!(
            resource_version(&huge),
            Err(ProtobufError::Malformed { .. })
        ));
        // A varint that never ends; a wire type that does not exist.
        let mut endless = MAGIC.to_vec();
        endless.extend_from_slice(&[0x80; 11]);
        assert!(resource_version(&endless).is_err());
        let mut odd = MAGIC.to_vec();
        odd.extend_from_slice(&[0x0f, 0x00]);
        assert!(resource_version(&odd).is_err());
        // The object's field holding a number, not a message.
        let mut number = MAGIC.to_vec();
        number.extend_from_slice(&[0x10, 0x05]);
        assert!(resource_version(&number).is_err());
        // No metadata; a version that is not text.
        let mut empty = MAGIC.to_vec();
        empty.extend_from_slice(&[0x12, 0x00]);
        assert_eq!(
            resource_version(&empty),
            Err(ProtobufError::Missing("metadata"))
        );
        let mut binary = MAGIC.to_vec();
        binary.extend_from_slice(&[0x12, 0x05, 0x0a, 0x03, 0x32, 0x01, 0xff]);
        assert_eq!(
            resource_version(&binary),
            Err(ProtobufError::NotText("resourceVersion"))
        );
    }
}
