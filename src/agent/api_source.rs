//! The API server as a pod source: the pods bound to this node, from the
//! reflector's snapshot, sorted into those to run, those being deleted and
//! those nanolet refuses (with the reason their status will carry).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use serde_json::Value;

use super::API_SOURCE;
use super::admission::{self, NodeView};
use crate::pod::Pod;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Default)]
pub struct ApiPods {
    pub run: HashMap<String, Pod>,
    /// Pods with a deletionTimestamp, and the grace period it set.
    pub deleting: HashMap<String, (PodRef, Option<Duration>)>,
    /// Pods refused: reason and message for their status.
    pub rejected: Vec<(PodRef, String, String)>,
    /// Running pods whose new spec nanolet cannot take (an ephemeral
    /// container it cannot run): they go on as they were, with why.
    pub kept: HashMap<String, String>,
}

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Sorts the snapshot. `running` tells whether a worker runs a UID: a pod
/// already terminal in the API is not started again unless it runs here.
/// A new pod must fit `node` (see `admission::fits_node`).
pub fn sort(
    objects: &HashMap<String, Value>,
    node: &NodeView,
    running: impl Fn(&str) -> bool,
) -> ApiPods {
    let mut pods = ApiPods::default();
    for (uid, object) in objects {
        let reference = PodRef {
            uid: uid.clone(),
            namespace: text(object, "/metadata/namespace").to_owned(),
            name: text(object, "/metadata/name").to_owned(),
        };
        // Mirrors of static pods run from the manifest directory, not from here.
        if super::mirror::mirror_of(object).is_some() {
            continue;
        }
        if object.pointer("/metadata/deletionTimestamp").is_some() {
            let grace = object
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_u64)
                .map(Duration::from_secs);
            pods.deleting.insert(uid.clone(), (reference, grace));
            continue;
        }
        let phase = text(object, "/status/phase");
        if (phase == "Succeeded" || phase == "Failed") && !running(uid) {
            continue;
        }
        match crate::pod::validate(object, API_SOURCE, uid)
            .and_then(|pod| crate::pod::apparmor::admit_on_host(&pod).map(|()| pod))
        {
            Ok(pod) => {
                // Checked once, before the pod first runs: a label changed
                // later does not stop it (IgnoredDuringExecution).
                if !running(uid)
                    && let Err((reason, message)) = admission::fits_node(&pod.manifest, node, true)
                {
                    pods.rejected.push((reference, reason, message));
                    continue;
                }
                pods.run.insert(uid.clone(), pod);
            }
            Err(e) if running(uid) => {
                pods.kept.insert(uid.clone(), e.to_string());
            }
            Err(e) => {
                let reason = match e {
                    crate::pod::PodError::Unsupported { .. } => "UnsupportedPodSpec",
                    crate::pod::PodError::Invalid { .. } => "InvalidPodSpec",
                    crate::pod::PodError::AppArmor(_) => "AppArmor",
                };
                pods.rejected
                    .push((reference, reason.to_owned(), e.to_string()));
            }
        }
    }
    pods
}

/// The status of a pod nanolet refuses to run, as upstream reports a pod
/// its admission rejected.
pub fn rejected_status(reason: &str, message: &str) -> core::PodStatus {
    core::PodStatus {
        phase: Some("Failed".into()),
        reason: Some(reason.to_owned()),
        message: Some(format!("Pod was rejected: {message}")),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, extra_meta: Value, spec_extra: Value) -> Value {
        let mut p = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": "default", "uid": uid, "resourceVersion": "7"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Pending"}
        });
        for (k, v) in extra_meta.as_object().unwrap() {
            p["metadata"][k] = v.clone();
        }
        for (k, v) in spec_extra.as_object().unwrap() {
            p["spec"][k] = v.clone();
        }
        p
    }

    #[test]
    fn sorts_run_deleting_rejected_and_done() {
        let mut objects = HashMap::new();
        objects.insert("a".into(), pod("a", json!({}), json!({})));
        objects.insert(
            "b".into(),
            pod(
                "b",
                json!({"deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 5}),
                json!({}),
            ),
        );
        objects.insert(
            "c".into(),
            pod(
                "c",
                json!({}),
                json!({"containers": [{"name": "c", "image": "busybox", "volumeDevices": [{"name": "v", "devicePath": "/dev/v"}]}]}),
            ),
        );
        let mut done = pod("d", json!({}), json!({}));
        done["status"]["phase"] = json!("Succeeded");
        objects.insert("d".into(), done);
        let mut selected = pod("e", json!({}), json!({"nodeSelector": {"disk": "ssd"}}));
        objects.insert("e".into(), selected.clone());
        let node = NodeView {
            name: "n".into(),
            labels: [("disk".to_owned(), "hdd".to_owned())].into(),
            ..Default::default()
        };
        let sorted = sort(&objects, &node, |_| false);
        assert_eq!(sorted.run.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(sorted.run["a"].source, API_SOURCE);
        assert_eq!(sorted.deleting["b"].1, Some(Duration::from_secs(5)));
        let mut rejected = sorted.rejected.clone();
        rejected.sort_by(|a, b| a.0.uid.cmp(&b.0.uid));
        assert_eq!(rejected.len(), 2);
        assert_eq!(rejected[0].1, "UnsupportedPodSpec");
        assert!(rejected[0].2.contains("volumeDevices"), "{}", rejected[0].2);
        assert_eq!(rejected[1].1, "NodeAffinity");
        // One that runs goes on as it was, its new spec ignored.
        let running_c = sort(&objects, &node, |uid| uid == "c");
        assert!(running_c.kept["c"].contains("volumeDevices"));
        assert!(!running_c.rejected.iter().any(|r| r.0.uid == "c"));
        // A terminal pod that still runs here stays.
        assert!(
            sort(&objects, &node, |uid| uid == "d")
                .run
                .contains_key("d")
        );
        selected["spec"]["nodeSelector"]["disk"] = json!("hdd");
        objects.insert("e".into(), selected);
        assert!(sort(&objects, &node, |_| false).run.contains_key("e"));
    }
}
