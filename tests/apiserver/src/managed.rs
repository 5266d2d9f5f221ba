//! `metadata.managedFields` as the real server writes them on every
//! create, update and patch: an entry per manager, operation and
//! subresource, with the FieldsV1 set of what it set. Clients receive them
//! in every object and every watch event, which is much of a kubelet's
//! traffic. Approximations: list items are keyed by the usual merge keys
//! without the schema, and ownership is not taken away from an earlier
//! manager when another one changes its fields.

use serde_json::{Map, Value, json};

/// Metadata the server owns: never a manager's.
const SERVER_METADATA: [&str; 8] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
];

/// A list item's key in FieldsV1 (`k:{"name":"c"}`), or None for lists
/// the server treats as atomic.
fn item_key(item: &Value) -> Option<String> {
    let map = item.as_object()?;
    let keys: &[&str] = if map.contains_key("containerPort") {
        &["containerPort", "protocol"]
    } else if map.contains_key("name") {
        &["name"]
    } else if map.contains_key("type") {
        &["type"]
    } else if map.contains_key("mountPath") {
        &["mountPath"]
    } else {
        return None;
    };
    let mut key = Map::new();
    for k in keys {
        if let Some(v) = map.get(*k) {
            key.insert((*k).to_owned(), v.clone());
        }
    }
    Some(format!("k:{}", Value::Object(key)))
}

/// The FieldsV1 set of a value's fields.
fn fields(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut set = Map::new();
            for (k, v) in map {
                set.insert(format!("f:{k}"), fields_of_member(v));
            }
            Value::Object(set)
        }
        _ => json!({}),
    }
}

fn fields_of_member(value: &Value) -> Value {
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut set = fields(value);
            set[".".to_owned()] = json!({});
            set
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(|i| item_key(i).is_some()) => {
            let mut set = Map::new();
            set.insert(".".into(), json!({}));
            for item in items {
                if let Some(key) = item_key(item) {
                    let mut inner = fields(item);
                    inner[".".to_owned()] = json!({});
                    set.insert(key, inner);
                }
            }
            Value::Object(set)
        }
        _ => json!({}),
    }
}

/// What of `new` differs from `old`, as a sub-object of `new`.
fn changed(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, v) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(c) = changed(ov, v) {
                            out.insert(k.clone(), c);
                        }
                    }
                    None => {
                        out.insert(k.clone(), v.clone());
                    }
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ => (old != new).then(|| new.clone()),
    }
}

/// The union of two FieldsV1 sets.
fn union(into: &mut Value, from: &Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        for (k, v) in b {
            match a.get_mut(k) {
                Some(existing) => union(existing, v),
                None => {
                    a.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// Records that `manager` wrote `updated` (over `current`, None on
/// create) through `subresource`.
pub fn record(
    current: Option<&Value>,
    updated: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) {
    let mut entries: Vec<Value> = current
        .and_then(|c| c.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut written = updated.clone();
    if let Some(meta) = written.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in SERVER_METADATA {
            meta.remove(field);
        }
    }
    if let Some(map) = written.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
        // A status write owns status; anything else owns the rest.
        match subresource {
            Some("status") => map.retain(|k, _| k == "status"),
            _ => {
                map.remove("status");
            }
        }
    }
    let before = current.cloned().unwrap_or(Value::Null);
    let Some(set) = changed(&before, &written).map(|c| fields(&c)) else {
        if let Some(meta) = updated.get_mut("metadata") {
            meta["managedFields"] = Value::Array(entries);
        }
        return;
    };
    let api_version = updated["apiVersion"].clone();
    let operation = "Update";
    let same = |e: &Value| {
        e["manager"] == manager
            && e["operation"] == operation
            && e.get("subresource").and_then(Value::as_str) == subresource
    };
    match entries.iter_mut().find(|e| same(e)) {
        Some(entry) => {
            union(&mut entry["fieldsV1"], &set);
            entry["time"] = now.into();
            entry["apiVersion"] = api_version;
        }
        None => {
            let mut entry = json!({
                "manager": manager, "operation": operation, "apiVersion": api_version,
                "time": now, "fieldsType": "FieldsV1", "fieldsV1": set,
            });
            if let Some(sub) = subresource {
                entry["subresource"] = sub.into();
            }
            entries.push(entry);
        }
    }
    if let Some(meta) = updated.get_mut("metadata") {
        meta["managedFields"] = Value::Array(entries);
    }
}

/// The manager of a request without `fieldManager`: its User-Agent up to
/// the first `/`, as the real server names it.
pub fn manager_from_user_agent(user_agent: &str) -> String {
    let name = user_agent.split('/').next().unwrap_or("").trim();
    if name.is_empty() {
        "unknown".into()
    } else {
        name.chars().take(128).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_then_a_status_write_make_two_entries() {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "uid": "u", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "protocol": "TCP"}]}],
                     "restartPolicy": "Always"},
            "status": {"phase": "Pending"}});
        record(None, &mut pod, "kubectl-create", None, "t1");
        let entries = pod["metadata"]["managedFields"].as_array().unwrap().clone();
        assert_eq!(entries.len(), 1);
        let set = &entries[0]["fieldsV1"];
        assert!(set["f:metadata"]["f:labels"]["f:app"].is_object());
        assert!(set["f:metadata"].get("f:name").is_none());
        let container = &set["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"];
        assert!(container["f:image"].is_object());
        assert!(container["f:ports"]["k:{\"containerPort\":80,\"protocol\":\"TCP\"}"].is_object());
        assert!(set.get("f:status").is_none());

        let current = pod.clone();
        pod["status"] =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        record(Some(&current), &mut pod, "kubelet", Some("status"), "t2");
        let entries = pod["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1]["subresource"], "status");
        assert!(
            entries[1]["fieldsV1"]["f:status"]["f:conditions"]["k:{\"type\":\"Ready\"}"]
                .is_object()
        );
        // The same write again changes nothing and adds nothing.
        let current = pod.clone();
        record(Some(&current), &mut pod, "kubelet", Some("status"), "t3");
        assert_eq!(
            pod["metadata"]["managedFields"],
            current["metadata"]["managedFields"]
        );
    }
}
