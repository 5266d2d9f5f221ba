//! Pod manifest files (the static pod source): YAML or JSON, one or more
//! documents per file.

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Pod, validate};

/// One document of a manifest file: a pod, or why it is not one.
#[derive(Debug)]
pub enum Document {
    Pod(Box<Pod>),
    Rejected {
        index: usize,
        /// namespace/name when the document has them, to name it to users.
        namespace: Option<String>,
        name: Option<String>,
        reason: String,
    },
}

/// Whether a directory entry is a manifest (upstream skips dot files).
pub fn is_manifest_name(name: &str) -> bool {
    !name.starts_with('.')
        && (name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json"))
}

/// Parses a manifest file's text. `source` is its path, used in reasons and
/// mixed into static pod UIDs so that the same pod in two files is two pods.
pub fn parse(text: &str, source: &str) -> Vec<Document> {
    let mut documents = Vec::new();
    let mut index = 0;
    for de in serde_yaml_ng::Deserializer::from_str(text) {
        let value = match Value::deserialize(de) {
            Ok(Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                // libyaml cannot resynchronise after a syntax error: the rest
                // of the file is unreadable.
                documents.push(Document::Rejected {
                    index,
                    namespace: None,
                    name: None,
                    reason: format!("invalid YAML: {e}"),
                });
                break;
            }
        };
        let uid = static_pod_uid(source, &value);
        let admitted = validate(&value, source, &uid)
            .and_then(|pod| super::apparmor::admit_on_host(&pod).map(|()| pod));
        documents.push(match admitted {
            Ok(pod) => Document::Pod(Box::new(pod)),
            Err(e) => {
                let meta = |key: &str| {
                    value
                        .get("metadata")
                        .and_then(|m| m.get(key))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                Document::Rejected {
                    index,
                    namespace: meta("namespace").or_else(|| meta("name").map(|_| "default".into())),
                    name: meta("name"),
                    reason: e.to_string(),
                }
            }
        });
        index += 1;
    }
    documents
}

/// A UID from the file and the document's content, formatted as a UUID. Any
/// edit gives a new UID, so an edited manifest replaces its pod.
pub fn static_pod_uid(source: &str, document: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(source.as_bytes());
    hasher.update([0]);
    hasher.update(document.to_string().as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    crate::state::uuid(&first)
}

/// The one pod of a test manifest.
#[cfg(test)]
pub fn parse_one(text: &str) -> Pod {
    match parse(text, "test.yaml").remove(0) {
        Document::Pod(p) => *p,
        Document::Rejected { reason, .. } => panic!("{reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: busybox}]\n---\n{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {\"name\": \"b\"}, \"spec\": {\"containers\": [{\"name\": \"c\", \"image\": \"busybox\"}]}}\n";

    #[test]
    fn several_documents_and_stable_uids() {
        let docs = parse(TWO, "/m/a.yaml");
        assert_eq!(docs.len(), 2);
        let uids: Vec<String> = docs
            .iter()
            .map(|d| match d {
                Document::Pod(p) => p.uid.clone(),
                Document::Rejected { reason, .. } => panic!("{reason}"),
            })
            .collect();
        assert_ne!(uids[0], uids[1]);
        let again = parse(TWO, "/m/a.yaml");
        let Document::Pod(p) = &again[0] else {
            panic!()
        };
        assert_eq!(p.uid, uids[0]);
        let other_file = parse(TWO, "/m/b.yaml");
        let Document::Pod(p) = &other_file[0] else {
            panic!()
        };
        assert_ne!(p.uid, uids[0]);
        let edited = parse(
            &TWO.replace("image: busybox}", "image: busybox:1}"),
            "/m/a.yaml",
        );
        let Document::Pod(p) = &edited[0] else {
            panic!()
        };
        assert_ne!(p.uid, uids[0]);
    }

    #[test]
    fn bad_documents_are_reported_not_fatal() {
        let docs = parse(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n---\nkey: [unclosed\n",
            "f",
        );
        assert_eq!(docs.len(), 2);
        assert!(
            matches!(&docs[0], Document::Rejected { reason, .. } if reason.contains("image: required"))
        );
        assert!(
            matches!(&docs[1], Document::Rejected { reason, .. } if reason.contains("invalid YAML"))
        );
    }

    #[test]
    fn manifest_names() {
        assert!(is_manifest_name("a.yaml"));
        assert!(is_manifest_name("a.json"));
        assert!(!is_manifest_name(".a.yaml.swp"));
        assert!(!is_manifest_name(".hidden.yaml"));
        assert!(!is_manifest_name("README"));
    }
}
