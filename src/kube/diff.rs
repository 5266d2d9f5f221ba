//! What changed between two versions of an object we sent, as a patch:
//! only the changed fields travel, which is what keeps idle uplink traffic
//! small.

use serde_json::{Map, Value, json};

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

/// Status lists merged by a key under a strategic merge patch: (field,
/// merge key), as the API types declare them.
const MERGE_KEYS: &[(&str, &str)] = &[
    ("conditions", "type"),
    ("addresses", "type"),
    ("podIPs", "ip"),
    ("hostIPs", "ip"),
];

/// A strategic merge patch turning `old` into `new` for status objects:
/// like [`merge_diff`], but a list with a merge key sends each changed
/// element with its key and explicit nulls for fields it lost, and
/// `$patch: delete` for elements that went away — elements merge on the
/// server, so a missing field would otherwise survive. Order is set with
/// `$setElementOrder`, as upstream's two-way patches do.
pub fn strategic_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(old_map), Value::Object(new_map)) => {
            let mut patch = Map::new();
            for (key, new_value) in new_map {
                let merge_key = MERGE_KEYS.iter().find(|(f, _)| f == key).map(|(_, k)| *k);
                let diff = match (old_map.get(key), merge_key) {
                    (Some(Value::Array(a)), Some(k)) if new_value.is_array() => {
                        let b = new_value.as_array().map(Vec::as_slice).unwrap_or_default();
                        keyed_list_diff(a, b, k).map(|(list, order)| {
                            patch.insert(format!("$setElementOrder/{key}"), order);
                            list
                        })
                    }
                    (Some(old_value), _) => strategic_diff(old_value, new_value),
                    (None, _) => Some(new_value.clone()),
                };
                if let Some(d) = diff {
                    patch.insert(key.clone(), d);
                }
            }
            for key in old_map.keys() {
                if !new_map.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ => merge_diff(old, new),
    }
}

/// The changed elements of a keyed list and the new order of its keys.
fn keyed_list_diff(old: &[Value], new: &[Value], key: &str) -> Option<(Value, Value)> {
    let key_of = |v: &Value| v.get(key).cloned();
    let mut items = Vec::new();
    for element in new {
        let Some(k) = key_of(element) else {
            continue;
        };
        match old.iter().find(|o| key_of(o).as_ref() == Some(&k)) {
            Some(before) => {
                if let Some(Value::Object(mut d)) = merge_diff(before, element) {
                    d.insert(key.to_owned(), k);
                    items.push(Value::Object(d));
                }
            }
            None => items.push(element.clone()),
        }
    }
    for element in old {
        if let Some(k) = key_of(element)
            && !new.iter().any(|n| key_of(n).as_ref() == Some(&k))
        {
            items.push(json!({key: k, "$patch": "delete"}));
        }
    }
    if items.is_empty() {
        return None;
    }
    let order: Vec<Value> = new
        .iter()
        .filter_map(|n| key_of(n).map(|k| json!({key: k})))
        .collect();
    Some((Value::Array(items), Value::Array(order)))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn keyed_lists_send_changed_elements_with_nulls_and_deletes() {
        let old = json!({"phase": "Pending", "conditions": [
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
            {"type": "PodScheduled", "status": "True"},
            {"type": "Gone", "status": "True"}
        ]});
        let new = json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "PodScheduled", "status": "True"}
        ]});
        assert_eq!(
            strategic_diff(&old, &new),
            Some(json!({
                "phase": "Running",
                "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": null},
                    {"type": "Gone", "$patch": "delete"}
                ]
            }))
        );
        assert_eq!(strategic_diff(&new, &new), None);
        // Lists without a merge key are sent whole, as under merge_diff.
        assert_eq!(
            strategic_diff(&json!({"images": [1]}), &json!({"images": [2]})),
            Some(json!({"images": [2]}))
        );
    }
}
