//! Server-side printing: the `meta.k8s.io/v1` Table kubectl asks for with
//! `Accept: application/json;as=Table;...`, with the columns the real
//! server's printers give each resource (priority 1 = only with -o wide).

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::resources::Resource;

fn column(name: &str, kind: &str, priority: u8) -> Value {
    json!({
        "name": name,
        "type": kind,
        "format": if name == "Name" { "name" } else { "" },
        "description": "",
        "priority": priority,
    })
}

fn text(v: &Value, pointer: &str) -> String {
    match v.pointer(pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn age(object: &Value) -> String {
    let created = text(object, "/metadata/creationTimestamp");
    match created.parse::<Timestamp>() {
        Ok(t) => nanolet::cli::age(t, Timestamp::now()),
        Err(_) => "<unknown>".into(),
    }
}

fn or_none(s: String) -> String {
    if s.is_empty() { "<none>".into() } else { s }
}

/// Column definitions and the cells of one object.
fn columns(resource: &Resource) -> Vec<Value> {
    match (resource.group, resource.plural) {
        ("", "pods") => vec![
            column("Name", "string", 0),
            column("Ready", "string", 0),
            column("Status", "string", 0),
            column("Restarts", "string", 0),
            column("Age", "string", 0),
            column("IP", "string", 1),
            column("Node", "string", 1),
            column("Nominated Node", "string", 1),
            column("Readiness Gates", "string", 1),
        ],
        ("", "nodes") => vec![
            column("Name", "string", 0),
            column("Status", "string", 0),
            column("Roles", "string", 0),
            column("Age", "string", 0),
            column("Version", "string", 0),
            column("Internal-IP", "string", 1),
            column("External-IP", "string", 1),
            column("OS-Image", "string", 1),
            column("Kernel-Version", "string", 1),
            column("Container-Runtime", "string", 1),
        ],
        ("", "namespaces") => vec![
            column("Name", "string", 0),
            column("Status", "string", 0),
            column("Age", "string", 0),
        ],
        ("", "events") | ("events.k8s.io", "events") => vec![
            column("Last Seen", "string", 0),
            column("Type", "string", 0),
            column("Reason", "string", 0),
            column("Object", "string", 0),
            column("Message", "string", 0),
        ],
        ("coordination.k8s.io", "leases") => {
            vec![
                column("Name", "string", 0),
                column("Holder", "string", 0),
                column("Age", "string", 0),
            ]
        }
        ("", "configmaps") => vec![
            column("Name", "string", 0),
            column("Data", "integer", 0),
            column("Age", "string", 0),
        ],
        ("", "secrets") => vec![
            column("Name", "string", 0),
            column("Type", "string", 0),
            column("Data", "integer", 0),
            column("Age", "string", 0),
        ],
        ("certificates.k8s.io", "certificatesigningrequests") => vec![
            column("Name", "string", 0),
            column("Age", "string", 0),
            column("SignerName", "string", 0),
            column("Requestor", "string", 0),
            column("Condition", "string", 0),
        ],
        ("", "services") => vec![
            column("Name", "string", 0),
            column("Type", "string", 0),
            column("Cluster-IP", "string", 0),
            column("External-IP", "string", 0),
            column("Port(s)", "string", 0),
            column("Age", "string", 0),
            column("Selector", "string", 1),
        ],
        ("apps", "daemonsets") => vec![
            column("Name", "string", 0),
            column("Desired", "integer", 0),
            column("Current", "integer", 0),
            column("Ready", "integer", 0),
            column("Up-to-date", "integer", 0),
            column("Available", "integer", 0),
            column("Node Selector", "string", 0),
            column("Age", "string", 0),
        ],
        _ => vec![column("Name", "string", 0), column("Age", "string", 0)],
    }
}

fn cells(resource: &Resource, o: &Value) -> Vec<Value> {
    let name = text(o, "/metadata/name");
    match (resource.group, resource.plural) {
        ("", "pods") => {
            let status: k8s_openapi::api::core::v1::PodStatus =
                serde_json::from_value(o.get("status").cloned().unwrap_or(Value::Null))
                    .unwrap_or_default();
            let terminating = o
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|t| !t.is_null());
            let containers = o
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let (ready, state, restarts) =
                nanolet::pod::status::summary(&status, terminating, containers);
            vec![
                name.into(),
                ready.into(),
                state.into(),
                restarts.into(),
                age(o).into(),
                or_none(text(o, "/status/podIP")).into(),
                or_none(text(o, "/spec/nodeName")).into(),
                or_none(text(o, "/status/nominatedNodeName")).into(),
                "<none>".into(),
            ]
        }
        ("", "nodes") => {
            let ready = o
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| {
                    if c["status"] == "True" {
                        "Ready"
                    } else {
                        "NotReady"
                    }
                })
                .unwrap_or("Unknown");
            let mut status = ready.to_owned();
            if o.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
                status.push_str(",SchedulingDisabled");
            }
            let roles: Vec<&str> = o
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            let address = |kind: &str| {
                o.pointer("/status/addresses")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().find(|a| a["type"] == kind))
                    .and_then(|a| a["address"].as_str())
                    .unwrap_or("<none>")
                    .to_owned()
            };
            vec![
                name.into(),
                status.into(),
                (if roles.is_empty() {
                    "<none>".to_owned()
                } else {
                    roles.join(",")
                })
                .into(),
                age(o).into(),
                text(o, "/status/nodeInfo/kubeletVersion").into(),
                address("InternalIP").into(),
                address("ExternalIP").into(),
                or_none(text(o, "/status/nodeInfo/osImage")).into(),
                or_none(text(o, "/status/nodeInfo/kernelVersion")).into(),
                or_none(text(o, "/status/nodeInfo/containerRuntimeVersion")).into(),
            ]
        }
        ("", "namespaces") => vec![name.into(), text(o, "/status/phase").into(), age(o).into()],
        ("", "events") | ("events.k8s.io", "events") => {
            let regarding = if resource.group.is_empty() {
                "involvedObject"
            } else {
                "regarding"
            };
            let object = format!(
                "{}/{}",
                text(o, &format!("/{regarding}/kind")).to_lowercase(),
                text(o, &format!("/{regarding}/name"))
            );
            let message = if resource.group.is_empty() {
                text(o, "/message")
            } else {
                text(o, "/note")
            };
            vec![
                age(o).into(),
                text(o, "/type").into(),
                text(o, "/reason").into(),
                object.into(),
                message.into(),
            ]
        }
        ("coordination.k8s.io", "leases") => {
            vec![
                name.into(),
                text(o, "/spec/holderIdentity").into(),
                age(o).into(),
            ]
        }
        ("", "services") => {
            let ports: Vec<String> = o
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p["port"].as_i64().unwrap_or(0),
                        p["protocol"].as_str().unwrap_or("TCP")
                    )
                })
                .collect();
            let selector = o
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .map(|s| {
                    s.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            vec![
                name.into(),
                text(o, "/spec/type").into(),
                text(o, "/spec/clusterIP").into(),
                "<none>".into(),
                or_none(ports.join(",")).into(),
                age(o).into(),
                selector.into(),
            ]
        }
        ("apps", "daemonsets") => {
            let count = |field: &str| o["status"][field].as_i64().unwrap_or(0);
            let selector = o
                .pointer("/spec/template/spec/nodeSelector")
                .and_then(Value::as_object)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_else(|| "<none>".into());
            vec![
                name.into(),
                count("desiredNumberScheduled").into(),
                count("currentNumberScheduled").into(),
                count("numberReady").into(),
                count("updatedNumberScheduled").into(),
                count("numberAvailable").into(),
                selector.into(),
                age(o).into(),
            ]
        }
        ("", "configmaps") => {
            let n = o
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |d| d.len())
                + o.get("binaryData")
                    .and_then(Value::as_object)
                    .map_or(0, |d| d.len());
            vec![name.into(), n.into(), age(o).into()]
        }
        ("", "secrets") => {
            let n = o
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |d| d.len());
            vec![
                name.into(),
                text(o, "/type").into(),
                n.into(),
                age(o).into(),
            ]
        }
        ("certificates.k8s.io", "certificatesigningrequests") => {
            let conditions: Vec<String> = o
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .map(|c| {
                    c.iter()
                        .filter_map(|c| c["type"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let condition = if conditions.is_empty() {
                "Pending".to_owned()
            } else {
                conditions.join(",")
            };
            vec![
                name.into(),
                age(o).into(),
                text(o, "/spec/signerName").into(),
                text(o, "/spec/username").into(),
                condition.into(),
            ]
        }
        _ => vec![name.into(), age(o).into()],
    }
}

fn partial_metadata(o: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": o.get("metadata").cloned().unwrap_or(Value::Null),
    })
}

/// A Table of `objects`; `include_object` is the `includeObject` query
/// parameter (None, Metadata, Object).
pub fn table(
    resource: &Resource,
    objects: &[Value],
    resource_version: &str,
    include_object: &str,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(resource, o)});
            match include_object {
                "None" => {}
                "Object" => row["object"] = o.clone(),
                _ => row["object"] = partial_metadata(o),
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns(resource),
        "rows": rows,
    })
}

/// Whether an Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}
