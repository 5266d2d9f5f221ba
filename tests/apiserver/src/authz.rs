//! What a node may do, as the real server's Node authorizer and
//! NodeRestriction admission plugin (with the `system:node` role's rules)
//! decide it: a kubelet reads the Secrets, ConfigMaps and service accounts
//! only of pods bound to it, writes only its own Node, Lease and pods'
//! status, deletes only its pods, and creates only mirror pods of its own.
//! Users other than nodes are not restricted here.

use serde_json::Value;

use crate::api::Api;
use crate::server::User;
use crate::status::ApiError;

/// A request as authorization sees it.
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub plural: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    /// `metadata.name=X` of a list or watch's field selector.
    pub selected_name: Option<&'a str>,
}

/// The node a user is, from its name and group.
pub fn node_of(user: &User) -> Option<&str> {
    let node = user.name.strip_prefix("system:node:")?;
    user.groups
        .iter()
        .any(|g| g == "system:nodes")
        .then_some(node)
}

fn text<'a>(o: &'a Value, pointer: &str) -> &'a str {
    o.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn forbidden(node: &str, a: &Attributes, why: &str) -> ApiError {
    let resource = match a.subresource {
        Some(sub) => format!("{}/{sub}", a.plural),
        None => a.plural.to_owned(),
    };
    let object = match a.name.or(a.selected_name) {
        Some(name) => format!("{} \"{name}\"", a.plural),
        None => a.plural.to_owned(),
    };
    let place = a
        .namespace
        .map(|ns| format!(" in the namespace \"{ns}\""))
        .unwrap_or_else(|| " at the cluster scope".into());
    ApiError::new(
        403,
        "Forbidden",
        format!(
            "{object} is forbidden: User \"system:node:{node}\" cannot {} resource \"{resource}\" in API group \"{}\"{place}: {why}",
            a.verb, a.group
        ),
    )
}

/// What pods bound to `node` in `namespace` reference, of `plural`.
fn referenced(api: &Api, node: &str, namespace: &str, plural: &str, name: &str) -> bool {
    let pods = api.store.borrow().list("/pods", Some(namespace));
    pods.iter()
        .filter(|p| text(p, "/spec/nodeName") == node)
        .any(|p| references(p, plural).iter().any(|r| r == name))
}

/// Names of the objects of kind `plural` a pod references.
fn references(pod: &Value, plural: &str) -> Vec<String> {
    let spec = &pod["spec"];
    let mut names = Vec::new();
    let mut push = |v: &Value| {
        if let Some(name) = v.as_str().filter(|n| !n.is_empty()) {
            names.push(name.to_owned());
        }
    };
    let containers = ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| spec[*list].as_array().cloned().unwrap_or_default());
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    match plural {
        "secrets" => {
            for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
                push(&s["name"]);
            }
            for v in &volumes {
                push(&v["secret"]["secretName"]);
                for source in v["projected"]["sources"].as_array().into_iter().flatten() {
                    push(&source["secret"]["name"]);
                }
            }
            for c in containers {
                for e in c["env"].as_array().into_iter().flatten() {
                    push(&e["valueFrom"]["secretKeyRef"]["name"]);
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    push(&e["secretRef"]["name"]);
                }
            }
        }
        "configmaps" => {
            for v in &volumes {
                push(&v["configMap"]["name"]);
                for source in v["projected"]["sources"].as_array().into_iter().flatten() {
                    push(&source["configMap"]["name"]);
                }
            }
            for c in containers {
                for e in c["env"].as_array().into_iter().flatten() {
                    push(&e["valueFrom"]["configMapKeyRef"]["name"]);
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    push(&e["configMapRef"]["name"]);
                }
            }
        }
        "persistentvolumeclaims" => {
            for v in &volumes {
                push(&v["persistentVolumeClaim"]["claimName"]);
            }
        }
        "serviceaccounts" => push(&spec["serviceAccountName"]),
        _ => {}
    }
    names
}

/// Whether `node` may make the request; the body is what a create,
/// update or patch sends (patches are judged by their result elsewhere).
pub fn authorize(api: &Api, node: &str, a: &Attributes, body: &Value) -> Result<(), ApiError> {
    let reading = matches!(a.verb, "get" | "list" | "watch");
    let pod_node = |name: &str| {
        let ns = a.namespace.unwrap_or("");
        let key = crate::store::key("/pods", ns, name);
        api.store
            .borrow()
            .get(&key)
            .map(|p| text(p, "/spec/nodeName").to_owned())
    };
    let own_pod = |name: &str| pod_node(name).is_some_and(|n| n == node);
    // A pod that is gone is the handler's 404, not a refusal: the real
    // server looks an object up before NodeRestriction sees it.
    let not_elsewhere = |name: &str| pod_node(name).is_none_or(|n| n == node);
    let deny = |why: &str| Err(forbidden(node, a, why));
    match (a.group, a.plural, a.subresource) {
        // The graph: objects of pods bound to this node, by name.
        ("", "secrets" | "configmaps" | "persistentvolumeclaims", None) => {
            let name = match a.verb {
                "get" => a.name,
                "list" | "watch" => a.selected_name,
                _ => None,
            };
            match name {
                Some(name) if referenced(api, node, a.namespace.unwrap_or(""), a.plural, name) => {
                    Ok(())
                }
                _ => deny(&format!(
                    "no relationship found between node '{node}' and this object"
                )),
            }
        }
        ("", "serviceaccounts", None) if a.verb == "get" => match a.name {
            Some(name) if referenced(api, node, a.namespace.unwrap_or(""), a.plural, name) => {
                Ok(())
            }
            _ => deny(&format!(
                "no relationship found between node '{node}' and this object"
            )),
        },
        ("", "serviceaccounts", Some("token")) if a.verb == "create" => {
            let ns = a.namespace.unwrap_or("");
            let account = a.name.unwrap_or("");
            if !referenced(api, node, ns, a.plural, account) {
                return deny(&format!(
                    "no relationship found between node '{node}' and this object"
                ));
            }
            let bound = body.pointer("/spec/boundObjectRef");
            match bound {
                Some(r) if r["kind"] == "Pod" && own_pod(text(r, "/name")) => Ok(()),
                _ => deny("node requested token not bound to a pod scheduled on this node"),
            }
        }
        ("", "pods", None) if reading => Ok(()),
        ("", "pods", None) if a.verb == "create" => {
            mirror_pod(node, body).or_else(|why| deny(&why))
        }
        ("", "pods", None) if a.verb == "delete" => match a.name {
            Some(name) if not_elsewhere(name) => Ok(()),
            _ => deny("can only delete pods bound to the node"),
        },
        ("", "pods", Some("status")) if matches!(a.verb, "update" | "patch") || reading => {
            match a.name {
                Some(name) if reading || not_elsewhere(name) => Ok(()),
                _ => deny(&format!(
                    "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
                )),
            }
        }
        ("", "pods", Some("eviction")) if a.verb == "create" => match a.name {
            Some(name) if not_elsewhere(name) => Ok(()),
            _ => deny("can only evict pods bound to the node"),
        },
        ("", "nodes", None) if reading => Ok(()),
        ("", "nodes", None | Some("status")) => {
            let name = match a.verb {
                "create" => text(body, "/metadata/name"),
                _ => a.name.unwrap_or(""),
            };
            if name != node {
                return deny("a node may only modify its own Node object");
            }
            if a.verb == "update" && a.subresource.is_none() {
                let current = api
                    .store
                    .borrow()
                    .get(&crate::store::key("/nodes", "", node))
                    .cloned();
                if let Some(current) = current
                    && body.pointer("/spec/taints") != current.pointer("/spec/taints")
                {
                    return deny(&format!("node \"{node}\" is not allowed to modify taints"));
                }
            }
            Ok(())
        }
        ("coordination.k8s.io", "leases", None) => {
            let ns = a.namespace.unwrap_or("");
            let name = match a.verb {
                "create" => text(body, "/metadata/name"),
                _ => a.name.or(a.selected_name).unwrap_or(""),
            };
            if ns == "kube-node-lease" && name == node {
                Ok(())
            } else {
                deny("can only access node lease with the same name as the requesting node")
            }
        }
        ("" | "events.k8s.io", "events", None)
            if matches!(a.verb, "create" | "update" | "patch") =>
        {
            Ok(())
        }
        ("", "services" | "endpoints", None) if reading => Ok(()),
        ("node.k8s.io", "runtimeclasses", None) if reading => Ok(()),
        ("certificates.k8s.io", "certificatesigningrequests", None)
            if matches!(a.verb, "create" | "get" | "list" | "watch") =>
        {
            Ok(())
        }
        ("", "namespaces", None) if a.verb == "get" => Ok(()),
        _ => deny("not allowed by the system:node role"),
    }
}

/// NodeRestriction's rules for the pods a node creates: mirror pods bound
/// to itself that reference no Secret, ConfigMap, claim or service account.
fn mirror_pod(node: &str, pod: &Value) -> Result<(), String> {
    if pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_none()
    {
        return Err("pod does not have \"kubernetes.io/config.mirror\" annotation, node can only create mirror pods".into());
    }
    if text(pod, "/spec/nodeName") != node {
        return Err(format!(
            "node \"{node}\" can only create pods with spec.nodeName set to itself"
        ));
    }
    for (plural, what) in [
        ("secrets", "secrets"),
        ("configmaps", "configmaps"),
        ("persistentvolumeclaims", "persistentvolumeclaims"),
        ("serviceaccounts", "service accounts"),
    ] {
        if !references(pod, plural).is_empty() {
            return Err(format!(
                "node \"{node}\" can not create pods that reference {what}"
            ));
        }
    }
    Ok(())
}
