//! Admission plugins that change or refuse a pod as it is created, past
//! validation and defaults: RuntimeClass.

use serde_json::{Map, Value};

/// The RuntimeClass admission plugin: a pod naming a class gets the
/// class's `overhead.podFixed` and its `scheduling` (node selector and
/// tolerations); a pod naming a class that does not exist, or setting an
/// overhead of its own that disagrees, is refused. `class` is the named
/// class as stored, `None` when it does not exist. The error is the
/// reason after upstream's `pods "x" is forbidden: `.
pub fn runtime_class(pod: &mut Value, class: Option<&Value>) -> Result<(), String> {
    let named = pod
        .pointer("/spec/runtimeClassName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    let class = match (&named, class) {
        (None, _) => None,
        (Some(_), Some(class)) => Some(class),
        (Some(name), None) => return Err(format!("pod rejected: RuntimeClass {name:?} not found")),
    };
    let fixed = class.and_then(|c| c.pointer("/overhead/podFixed")).cloned();
    let own = pod.pointer("/spec/overhead").cloned();
    match (own, fixed) {
        (Some(own), Some(fixed)) if own != fixed => {
            return Err(
                "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into(),
            );
        }
        (Some(_), None) => {
            return Err(
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
                    .into(),
            );
        }
        (None, Some(fixed)) => pod["spec"]["overhead"] = fixed,
        _ => {}
    }
    let Some(scheduling) = class.and_then(|c| c.get("scheduling")) else {
        return Ok(());
    };
    if let Some(selector) = scheduling.get("nodeSelector").and_then(Value::as_object) {
        let own = pod["spec"].as_object_mut().map(|spec| {
            spec.entry("nodeSelector")
                .or_insert_with(|| Map::new().into())
        });
        if let Some(Value::Object(own)) = own {
            for (key, wanted) in selector {
                match own.get(key) {
                    Some(have) if have != wanted => {
                        return Err(format!(
                            "conflict: runtimeClass.scheduling.nodeSelector[{key}] = {}; pod.spec.nodeSelector[{key}] = {}",
                            wanted.as_str().unwrap_or(""),
                            have.as_str().unwrap_or("")
                        ));
                    }
                    Some(_) => {}
                    None => {
                        own.insert(key.clone(), wanted.clone());
                    }
                }
            }
        }
    }
    if let Some(tolerations) = scheduling.get("tolerations").and_then(Value::as_array) {
        let own = pod["spec"].as_object_mut().map(|spec| {
            spec.entry("tolerations")
                .or_insert_with(|| Vec::<Value>::new().into())
        });
        if let Some(Value::Array(own)) = own {
            for toleration in tolerations {
                if !own.contains(toleration) {
                    own.push(toleration.clone());
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn a_class_that_does_not_exist_refuses_the_pod() {
        let mut p = pod(json!({"runtimeClassName": "kata"}));
        assert_eq!(
            runtime_class(&mut p, None).unwrap_err(),
            "pod rejected: RuntimeClass \"kata\" not found"
        );
        let mut unnamed = pod(json!({}));
        assert_eq!(runtime_class(&mut unnamed, None), Ok(()));
    }

    #[test]
    fn the_class_gives_its_overhead_and_scheduling() {
        let class = json!({
            "handler": "runc",
            "overhead": {"podFixed": {"cpu": "100m", "memory": "16Mi"}},
            "scheduling": {
                "nodeSelector": {"runtime": "native"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
            },
        });
        let mut p = pod(json!({
            "runtimeClassName": "native",
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "k", "operator": "Exists"}],
        }));
        runtime_class(&mut p, Some(&class)).unwrap();
        assert_eq!(
            p["spec"]["overhead"],
            json!({"cpu": "100m", "memory": "16Mi"})
        );
        assert_eq!(
            p["spec"]["nodeSelector"],
            json!({"zone": "a", "runtime": "native"})
        );
        assert_eq!(
            p["spec"]["tolerations"],
            json!([{"key": "k", "operator": "Exists"}])
        );
    }

    #[test]
    fn a_pods_own_overhead_or_selector_must_agree_with_the_class() {
        let class = json!({"handler": "runc", "overhead": {"podFixed": {"cpu": "100m"}},
            "scheduling": {"nodeSelector": {"runtime": "native"}}});
        let mut other = pod(json!({"runtimeClassName": "c", "overhead": {"cpu": "1"}}));
        assert!(
            runtime_class(&mut other, Some(&class))
                .unwrap_err()
                .contains("doesn't match")
        );
        let mut unclassed = pod(json!({"overhead": {"cpu": "1"}}));
        assert!(
            runtime_class(&mut unclassed, None)
                .unwrap_err()
                .contains("without corresponding RuntimeClass")
        );
        let mut conflict = pod(json!({"runtimeClassName": "c", "nodeSelector": {"runtime": "vm"}}));
        assert_eq!(
            runtime_class(&mut conflict, Some(&class)).unwrap_err(),
            "conflict: runtimeClass.scheduling.nodeSelector[runtime] = native; pod.spec.nodeSelector[runtime] = vm"
        );
    }
}
