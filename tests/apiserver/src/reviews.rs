//! TokenReview and SubjectAccessReview, as kubelets (and other delegating
//! servers) call them: a token is reviewed against the tokens this server
//! accepts, and access against RBAC over the Roles, ClusterRoles and their
//! bindings it stores, with `system:masters` a superuser as in the real
//! server. What is not modelled: aggregated ClusterRoles, the Node
//! authorizer, webhook authorizers.

use serde_json::{Value, json};

use crate::server::User;
use crate::store::Store;

/// The status of a TokenReview for `user` (None: the token is unknown or
/// expired), as the real server answers it.
pub fn token_review(request: &Value, user: Option<&User>) -> Value {
    let status = match user {
        Some(user) => {
            let mut groups = user.groups.clone();
            if !groups.iter().any(|g| g == "system:authenticated") {
                groups.push("system:authenticated".into());
            }
            json!({"authenticated": true, "user": {"username": user.name, "groups": groups},
                   "audiences": ["https://kubernetes.default.svc.cluster.local"]})
        }
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    json!({
        "kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": request.get("spec").cloned().unwrap_or(json!({})),
        "status": status,
    })
}

/// A SubjectAccessReview's answer under RBAC.
pub fn subject_access_review(store: &Store, request: &Value) -> Value {
    let spec = request.get("spec").cloned().unwrap_or(json!({}));
    let (allowed, reason) = decide(store, &spec);
    let mut status = json!({"allowed": allowed});
    if !reason.is_empty() {
        status["reason"] = reason.into();
    }
    json!({
        "kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    })
}

/// Whether RBAC allows what a SubjectAccessReview's `spec` asks.
pub fn allows(store: &Store, spec: &Value) -> bool {
    decide(store, spec).0
}

fn strings(value: Option<&Value>) -> Vec<&str> {
    value
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn text<'a>(value: &'a Value, field: &str) -> &'a str {
    value.get(field).and_then(Value::as_str).unwrap_or("")
}

const RBAC: &str = "rbac.authorization.k8s.io";

fn decide(store: &Store, spec: &Value) -> (bool, String) {
    let user = text(spec, "user");
    let groups = strings(spec.get("groups"));
    if groups.contains(&"system:masters") {
        return (true, "system:masters is a superuser".into());
    }
    let resource = spec.get("resourceAttributes");
    let namespace = resource.map_or("", |r| text(r, "namespace"));
    let subject_matches = |binding: &Value, binding_ns: &str| {
        binding
            .get("subjects")
            .and_then(Value::as_array)
            .is_some_and(|subjects| {
                subjects.iter().any(|s| match text(s, "kind") {
                    "User" => text(s, "name") == user,
                    "Group" => groups.contains(&text(s, "name")),
                    "ServiceAccount" => {
                        let ns = Some(text(s, "namespace"))
                            .filter(|n| !n.is_empty())
                            .unwrap_or(binding_ns);
                        user == format!("system:serviceaccount:{ns}:{}", text(s, "name"))
                    }
                    _ => false,
                })
            })
    };
    let role = |kind: &str, namespace: &str, name: &str| -> Option<Value> {
        let (plural, ns) = match kind {
            "ClusterRole" => ("clusterroles", ""),
            "Role" => ("roles", namespace),
            _ => return None,
        };
        store
            .get(&crate::store::key(&format!("{RBAC}/{plural}"), ns, name))
            .cloned()
    };
    let mut roles: Vec<(String, Value)> = Vec::new();
    for binding in store.list(&format!("{RBAC}/clusterrolebindings"), None) {
        if subject_matches(&binding, "") {
            let role_ref = binding.get("roleRef").cloned().unwrap_or_default();
            if let Some(r) = role(text(&role_ref, "kind"), "", text(&role_ref, "name")) {
                roles.push((format!("ClusterRoleBinding {}", name_of(&binding)), r));
            }
        }
    }
    if !namespace.is_empty() {
        for binding in store.list(&format!("{RBAC}/rolebindings"), Some(namespace)) {
            if subject_matches(&binding, namespace) {
                let role_ref = binding.get("roleRef").cloned().unwrap_or_default();
                if let Some(r) = role(text(&role_ref, "kind"), namespace, text(&role_ref, "name")) {
                    roles.push((format!("RoleBinding {namespace}/{}", name_of(&binding)), r));
                }
            }
        }
    }
    for (via, role) in roles {
        let rules = role.get("rules").and_then(Value::as_array).cloned();
        if rules
            .unwrap_or_default()
            .iter()
            .any(|rule| rule_allows(rule, spec))
        {
            return (true, format!("RBAC: allowed by {via}"));
        }
    }
    (false, String::new())
}

fn name_of(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn covers(list: &[&str], want: &str) -> bool {
    list.iter().any(|item| *item == "*" || *item == want)
}

fn rule_allows(rule: &Value, spec: &Value) -> bool {
    if let Some(attributes) = spec.get("resourceAttributes") {
        let resource = text(attributes, "resource");
        let subresource = text(attributes, "subresource");
        let wanted = if subresource.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}/{subresource}")
        };
        let resources = strings(rule.get("resources"));
        let names = strings(rule.get("resourceNames"));
        let name = text(attributes, "name");
        covers(&strings(rule.get("verbs")), text(attributes, "verb"))
            && covers(&strings(rule.get("apiGroups")), text(attributes, "group"))
            && (covers(&resources, &wanted)
                || (!subresource.is_empty()
                    && resources.contains(&format!("*/{subresource}").as_str())))
            && (names.is_empty() || names.contains(&name))
    } else if let Some(attributes) = spec.get("nonResourceAttributes") {
        let path = text(attributes, "path");
        covers(&strings(rule.get("verbs")), text(attributes, "verb"))
            && strings(rule.get("nonResourceURLs")).iter().any(|url| {
                *url == path || url.strip_suffix('*').is_some_and(|p| path.starts_with(p))
            })
    } else {
        false
    }
}
