//! What changed between two versions of an object we sent, as a patch:
//! only the changed fields travel, which is what keeps idle uplink traffic
//! small.

use serde_json::{Map, Value};

/// A JSON merge patch (RFC 7386) turning `old` into `new`, or `None` when
/// they are equal. Lists are sent whole when they differ; under a strategic
/// merge patch, lists with a merge key (conditions, addresses) then merge
/// by that key and atomic lists are replaced, both as upstream kubelets
/// rely on.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, new_value) in new {
                match old.get(key) {
                    Some(old_value) => {
                        if let Some(d) = merge_diff(old_value, new_value) {
                            patch.insert(key.clone(), d);
                        }
                    }
                    None => {
                        patch.insert(key.clone(), new_value.clone());
                    }
                }
            }
            for key in old.keys() {
                if !new.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_changes_travel() {
        let old = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1], "gone": true});
        let new = json!({"a": 1, "b": {"c": 2, "d": 4}, "e": [1, 2], "f": "x"});
        assert_eq!(
            merge_diff(&old, &new),
            Some(json!({"b": {"d": 4}, "e": [1, 2], "f": "x", "gone": null}))
        );
        assert_eq!(merge_diff(&new, &new), None);
        assert_eq!(
            merge_diff(&json!(1), &json!({"a": 1})),
            Some(json!({"a": 1}))
        );
    }
}
