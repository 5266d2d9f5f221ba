//! Stand-ins for the controllers whose writes a kubelet sees: the
//! scheduler's filters (node selector, required node affinity, taints) and
//! the DaemonSet controller, which makes one pod per eligible node the way
//! the real one writes it (node affinity on `metadata.name`, its
//! tolerations, labels and owner reference).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use nanolet::pod::scheduling::{self, NodeFields};
use serde_json::{Value, json};

use crate::api::{Api, Query};
use crate::resources::Resource;

fn text<'a>(o: &'a Value, pointer: &str) -> &'a str {
    o.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Whether a pod with `spec` may be scheduled to `node`: what the default
/// scheduler's NodeAffinity and TaintToleration filters check (resources
/// aside: the kubelet checks them again).
pub fn schedulable(spec: &Value, node: &Value) -> bool {
    let Ok(spec) = serde_json::from_value::<core::PodSpec>(spec.clone()) else {
        return false;
    };
    let labels: BTreeMap<String, String> = node
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    let fields = NodeFields {
        name: text(node, "/metadata/name"),
        labels: &labels,
    };
    let taints: Vec<core::Taint> = node
        .pointer("/spec/taints")
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default();
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    scheduling::node_matches(&spec, &fields)
        && scheduling::untolerated(tolerations, &taints, &["NoSchedule", "NoExecute"]).is_none()
}

/// The tolerations the DaemonSet controller adds to every pod it makes
/// (the network one only on the host network).
fn daemon_tolerations(host_network: bool) -> Vec<Value> {
    let mut list = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        list.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    list.into_iter()
        .map(|(key, effect)| json!({"key": key, "operator": "Exists", "effect": effect}))
        .collect()
}

/// A DaemonSet's pod spec as it would run on any node: the template with
/// the controller's tolerations (upstream checks eligibility with them).
fn daemon_spec(template_spec: &Value) -> Value {
    let mut spec = template_spec.clone();
    let host_network = spec["hostNetwork"] == true;
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for toleration in daemon_tolerations(host_network) {
        if !tolerations.contains(&toleration) {
            tolerations.push(toleration);
        }
    }
    spec["tolerations"] = Value::Array(tolerations);
    spec
}

/// The pod for `node`: the required node affinity replaced by one term on
/// the node's name, as upstream's `ReplaceDaemonSetPodNodeNameNodeAffinity`.
fn daemon_pod(ds: &Value, node: &str, revision: &str) -> Value {
    let template = &ds["spec"]["template"];
    let mut spec = daemon_spec(&template["spec"]);
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}
        ]}]
    });
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["controller-revision-hash"] = revision.into();
    labels["pod-template-generation"] = ds["metadata"]["generation"]
        .as_i64()
        .unwrap_or(1)
        .to_string()
        .into();
    let mut metadata = json!({
        "generateName": format!("{}-", text(ds, "/metadata/name")),
        "labels": labels,
        "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "name": text(ds, "/metadata/name"), "uid": text(ds, "/metadata/uid"),
            "controller": true, "blockOwnerDeletion": true
        }]
    });
    if let Some(annotations) = template["metadata"].get("annotations") {
        metadata["annotations"] = annotations.clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// A revision name from the template, as stable as upstream's hash.
fn revision_hash(template: &Value) -> String {
    // FNV-1a: the real controller uses its own hash; only stability matters.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in template.to_string().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:x}", hash & 0xff_ffff_ffff)
}

/// The node a DaemonSet's pod is for: its affinity term's name, else where
/// it is bound.
fn node_of(pod: &Value) -> String {
    let term = pod.pointer(
        "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0",
    );
    term.and_then(Value::as_str)
        .unwrap_or_else(|| text(pod, "/spec/nodeName"))
        .to_owned()
}

fn owner_uid(pod: &Value) -> Option<&str> {
    pod.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r["kind"] == "DaemonSet" && r["controller"] == true)?
        .get("uid")?
        .as_str()
}

fn ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// One pass of the DaemonSet controller: pods made for eligible nodes
/// that have none, deleted from nodes that are no longer eligible and
/// when their DaemonSet is gone (the garbage collector's part), and each
/// DaemonSet's status counted.
pub fn daemonsets(api: &Api) {
    let (Some(pods), Some(daemonsets)) = (
        Resource::find("", "v1", "pods"),
        Resource::find("apps", "v1", "daemonsets"),
    ) else {
        return;
    };
    let all_pods = api.store.borrow().list("/pods", None);
    let nodes = api.store.borrow().list("/nodes", None);
    let sets = api.store.borrow().list(&daemonsets.id(), None);
    let delete = |pod: &Value| {
        let ns = text(pod, "/metadata/namespace");
        let name = text(pod, "/metadata/name");
        if pod.pointer("/metadata/deletionTimestamp").is_none()
            && let Err(e) = api.delete(pods, Some(ns), name, &json!({}))
        {
            log::warn!("daemonset pod {ns}/{name}: {}", e.message);
        }
    };
    for pod in &all_pods {
        if let Some(uid) = owner_uid(pod)
            && !sets.iter().any(|ds| text(ds, "/metadata/uid") == uid)
        {
            delete(pod);
        }
    }
    for ds in &sets {
        if ds.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let ns = text(ds, "/metadata/namespace");
        let uid = text(ds, "/metadata/uid");
        let spec = daemon_spec(&ds["spec"]["template"]["spec"]);
        let eligible: Vec<&str> = nodes
            .iter()
            .filter(|n| schedulable(&spec, n))
            .map(|n| text(n, "/metadata/name"))
            .collect();
        let owned: Vec<&Value> = all_pods
            .iter()
            .filter(|p| owner_uid(p) == Some(uid))
            .collect();
        let revision = revision_hash(&ds["spec"]["template"]);
        for node in &eligible {
            if !owned.iter().any(|p| node_of(p) == *node) {
                let pod = daemon_pod(ds, node, &revision);
                if let Err(e) = api.create(pods, Some(ns), pod, &Query::new()) {
                    log::warn!(
                        "daemonset {ns}/{}: {}",
                        text(ds, "/metadata/name"),
                        e.message
                    );
                }
            }
        }
        for pod in &owned {
            if !eligible.contains(&node_of(pod).as_str()) {
                delete(pod);
            }
        }
        let on_eligible: Vec<&&Value> = owned
            .iter()
            .filter(|p| eligible.contains(&node_of(p).as_str()))
            .collect();
        let scheduled = on_eligible
            .iter()
            .filter(|p| !text(p, "/spec/nodeName").is_empty())
            .count();
        let ready = on_eligible.iter().filter(|p| ready(p)).count();
        let status = json!({
            "currentNumberScheduled": scheduled,
            "desiredNumberScheduled": eligible.len(),
            "numberMisscheduled": 0,
            "numberReady": ready,
            "numberAvailable": ready,
            "numberUnavailable": eligible.len() - ready,
            "updatedNumberScheduled": scheduled,
            "observedGeneration": ds["metadata"]["generation"].as_i64().unwrap_or(1),
        });
        if ds.get("status") != Some(&status) {
            let mut updated = ds.clone();
            updated["status"] = status;
            let key = crate::store::key(&daemonsets.id(), ns, text(ds, "/metadata/name"));
            api.store
                .borrow_mut()
                .put(key, updated, crate::store::EventType::Modified);
        }
    }
}
