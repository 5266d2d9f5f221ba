//! Just enough OpenAPI v3 for kubectl: each create/update/patch operation
//! with its group-version-kind and the `fieldValidation` parameter, which is
//! how kubectl learns that the server validates fields itself (and so sends
//! `fieldValidation=Strict` instead of validating client-side).

use serde_json::{Value, json};

use crate::resources::{RESOURCES, Resource};

fn prefix(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

pub fn index() -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(&str, &str)> = RESOURCES.iter().map(|r| (r.group, r.version)).collect();
    gvs.dedup();
    for (g, v) in gvs {
        let p = prefix(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=1")}),
        );
    }
    json!({"paths": paths})
}

fn operation(r: &Resource, action: &str) -> Value {
    json!({
        "operationId": format!("{action}{}", r.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
        "parameters": [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
        ],
        "responses": {"200": {"description": "OK"}}
    })
}

/// The document of one group version (`api/v1`, `apis/g/v`).
pub fn document(path: &str) -> Option<Value> {
    let resources: Vec<&Resource> = RESOURCES
        .iter()
        .filter(|r| prefix(r.group, r.version) == path)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for r in resources {
        let base = if r.namespaced {
            format!("/{path}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("/{path}/{}", r.plural)
        };
        paths.insert(
            base.clone(),
            json!({"post": operation(r, "post"), "get": operation(r, "list")}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"put": operation(r, "put"), "patch": operation(r, "patch"), "get": operation(r, "get"), "delete": operation(r, "delete")}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}
