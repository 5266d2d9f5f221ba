//! The REST semantics of the resource endpoints: get, list, watch, create,
//! update, patch and delete, with the real server's metadata handling,
//! optimistic concurrency, preconditions, selectors, pagination, graceful
//! pod deletion and finalizers.

use std::cell::RefCell;
use std::collections::HashMap;

use base64::Engine;
use jiff::Timestamp;
use serde_json::{Value, json};

use crate::defaults;
use crate::patch;
use crate::resources::Resource;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::{ApiError, ApiResult};
use crate::store::{EventType, Store, key};

/// Query parameters, decoded.
pub type Query = HashMap<String, String>;

/// Who writes, for managedFields.
struct Write<'a> {
    manager: String,
    subresource: Option<&'a str>,
}

fn manager(query: &Query) -> String {
    query
        .get("fieldManager")
        .cloned()
        .unwrap_or_else(|| "unknown".into())
}

/// A boolean query parameter as the real server converts one: absent,
/// `0` or `false` (any case) is false; anything else, `True` and the empty
/// string included, is true.
pub fn flag(value: Option<&str>) -> bool {
    value.is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
}

pub struct Api {
    pub store: RefCell<Store>,
    /// Published in every namespace as ConfigMap kube-root-ca.crt.
    ca_pem: String,
}

pub fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn random_suffix(n: usize) -> String {
    // The real server's generateName alphabet: no vowels, no look-alikes.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let hex = nanolet::state::random_hex();
    hex.as_bytes()
        .chunks(2)
        .take(n)
        .map(|pair| {
            let byte = std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .unwrap_or(0);
            ALPHABET[byte as usize % ALPHABET.len()] as char
        })
        .collect()
}

pub fn new_uid() -> String {
    nanolet::state::random_uuid()
}

fn name_of(o: &Value) -> &str {
    o.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta_str<'a>(o: &'a Value, field: &str) -> Option<&'a str> {
    o.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Deserializes into the typed Kubernetes struct and back: type errors are
/// caught, and the keys the typed form drops are unknown fields.
fn typed_check(resource: &Resource, object: &Value, strict: bool) -> ApiResult<()> {
    use k8s_openapi::api::{
        certificates::v1 as cert, coordination::v1 as coord, core::v1 as core, events::v1 as ev,
    };
    fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(
        v: &Value,
    ) -> Result<Value, String> {
        let typed: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        serde_json::to_value(typed).map_err(|e| e.to_string())
    }
    let back = match (resource.group, resource.kind) {
        ("", "Pod") => roundtrip::<core::Pod>(object),
        ("", "Node") => roundtrip::<core::Node>(object),
        ("", "Namespace") => roundtrip::<core::Namespace>(object),
        ("", "Event") => roundtrip::<core::Event>(object),
        ("", "ConfigMap") => roundtrip::<core::ConfigMap>(object),
        ("", "Secret") => roundtrip::<core::Secret>(object),
        ("", "ServiceAccount") => roundtrip::<core::ServiceAccount>(object),
        ("", "Service") => roundtrip::<core::Service>(object),
        ("coordination.k8s.io", _) => roundtrip::<coord::Lease>(object),
        ("events.k8s.io", _) => roundtrip::<ev::Event>(object),
        ("certificates.k8s.io", _) => roundtrip::<cert::CertificateSigningRequest>(object),
        ("apps", "DaemonSet") => roundtrip::<k8s_openapi::api::apps::v1::DaemonSet>(object),
        ("node.k8s.io", "RuntimeClass") => {
            roundtrip::<k8s_openapi::api::node::v1::RuntimeClass>(object)
        }
        _ => return Ok(()),
    }
    .map_err(|e| ApiError::bad_request(format!("error decoding {}: {e}", resource.kind)))?;
    if strict {
        let mut unknown = Vec::new();
        unknown_fields(object, &back, "", &mut unknown);
        if !unknown.is_empty() {
            let list: Vec<String> = unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect();
            return Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                list.join(", ")
            )));
        }
    }
    Ok(())
}

fn unknown_fields(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match b.get(k) {
                    Some(tv) => unknown_fields(v, tv, &p, out),
                    None if !v.is_null()
                        && !(path.is_empty() && (k == "apiVersion" || k == "kind")) =>
                    {
                        out.push(p)
                    }
                    None => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                unknown_fields(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

pub fn label_and_field(
    resource: &Resource,
    query: &Query,
) -> ApiResult<(LabelSelector, FieldSelector)> {
    let labels = LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    fields
        .check_supported(resource.group, resource.plural)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((labels, fields))
}

impl Api {
    pub fn new(history: usize, ca_pem: String) -> Api {
        let api = Api {
            store: RefCell::new(Store::new(history)),
            ca_pem,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let object = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
            let _ = api.create(namespaces(), None, object, &Query::new());
        }
        // The real server's bootstrap-policy roles that a kubelet's TLS
        // bootstrap and certificate rotation need; kubeadm binds them
        // (`kubeadm:kubelet-bootstrap`, `kubeadm:node-autoapprove-*`), as
        // this server's users do themselves.
        if let Some(roles) = Resource::find("rbac.authorization.k8s.io", "v1", "clusterroles") {
            let csr_rule = |resource: &str, verbs: &[&str]| json!({"apiGroups": ["certificates.k8s.io"], "resources": [resource], "verbs": verbs});
            for (name, rule) in [
                (
                    "system:node-bootstrapper",
                    csr_rule(
                        "certificatesigningrequests",
                        &["create", "get", "list", "watch"],
                    ),
                ),
                (
                    "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                    csr_rule("certificatesigningrequests/nodeclient", &["create"]),
                ),
                (
                    "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                    csr_rule("certificatesigningrequests/selfnodeclient", &["create"]),
                ),
            ] {
                let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                                 "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
                    "rules": [rule]});
                let _ = api.create(roles, None, role, &Query::new());
            }
        }
        // The master service, as the real server keeps it.
        if let Some(services) = Resource::find("", "v1", "services") {
            let kubernetes = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": defaults::MASTER_SERVICE_IP,
                         "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}});
            let _ = api.create(services, Some("default"), kubernetes, &Query::new());
        }
        api
    }

    fn store_key(resource: &Resource, namespace: Option<&str>, name: &str) -> crate::store::Key {
        key(&resource.id(), namespace.unwrap_or(""), name)
    }

    pub fn get(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> ApiResult<Value> {
        self.store
            .borrow()
            .get(&Self::store_key(resource, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource.group, resource.plural, name))
    }

    /// Lists with selectors and `limit`/`continue` pagination.
    pub fn list(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        query: &Query,
    ) -> ApiResult<Value> {
        let (labels, fields) = label_and_field(resource, query)?;
        let store = self.store.borrow();
        let rv = store.current_rv();
        // A list at least as new as the given version: always true of the
        // store, unless the version is from the future.
        if let Some(wanted) = query
            .get("resourceVersion")
            .filter(|v| !v.is_empty() && v.as_str() != "0")
        {
            let wanted: u64 = wanted.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version: {wanted}"))
            })?;
            if wanted > rv {
                return Err(ApiError::new(
                    504,
                    "Timeout",
                    format!("Timeout: Too large resource version: {wanted}, current: {rv}"),
                ));
            }
        }
        let oldest = store.oldest_rv();
        if query.get("continue").is_some_and(|t| !t.is_empty())
            && query.get("resourceVersion").is_some_and(|v| !v.is_empty())
        {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let mut items: Vec<Value> = store
            .list(&resource.id(), namespace)
            .into_iter()
            .filter(|o| labels.matches(o) && fields.matches(o))
            .collect();
        drop(store);
        // The continue token names where the previous page ended.
        if let Some(token) = query.get("continue").filter(|t| !t.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .ok_or_else(|| {
                    ApiError::bad_request("continue key is not valid: illegal base64 data")
                })?;
            // Tokens are consistent reads at their version, which the real
            // server can serve until etcd compacts it away.
            if decoded["rv"].as_u64().is_some_and(|at| at < oldest) {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            let start = decoded["start"].as_str().unwrap_or("").to_owned();
            items.retain(|o| sort_key(o) > start);
        }
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if let Some(limit) = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0)
            && items.len() > limit
        {
            let remaining = items.len() - limit;
            items.truncate(limit);
            let start = items.last().map(sort_key).unwrap_or_default();
            let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
            metadata["continue"] = base64::engine::general_purpose::STANDARD
                .encode(token.to_string())
                .into();
            metadata["remainingItemCount"] = remaining.into();
        }
        Ok(json!({
            "kind": format!("{}List", resource.kind),
            "apiVersion": resource.api_version(),
            "metadata": metadata,
            "items": items,
        }))
    }

    pub fn create(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        mut object: Value,
        query: &Query,
    ) -> ApiResult<Value> {
        if !object.is_object() {
            return Err(ApiError::bad_request("the body must be an object"));
        }
        // The real server decodes a body into the type its URL names,
        // which fills what the body leaves out (the Python client sends
        // no apiVersion or kind).
        if object.get("apiVersion").is_none_or(Value::is_null) {
            object["apiVersion"] = resource.api_version().into();
        }
        if object.get("kind").is_none_or(Value::is_null) {
            object["kind"] = resource.kind.into();
        }
        match (
            object.get("apiVersion").and_then(Value::as_str),
            object.get("kind").and_then(Value::as_str),
        ) {
            (Some(v), Some(k)) if v == resource.api_version() && k == resource.kind => {}
            (None, _) | (_, None) => {
                return Err(ApiError::bad_request(
                    "Object 'Kind' is missing in the request body",
                ));
            }
            (Some(v), Some(k)) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({v}) and kind ({k}) do not match the expected {} {}",
                    resource.api_version(),
                    resource.kind
                )));
            }
        }
        if let Some(ns) = namespace {
            match meta_str(&object, "namespace") {
                Some(body_ns) if body_ns != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => object["metadata"]["namespace"] = ns.into(),
            }
            if self.get(namespaces(), None, ns).is_err() {
                return Err(ApiError::not_found("", "namespaces", ns));
            }
        } else if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("namespace");
        }
        typed_check(
            resource,
            &object,
            query.get("fieldValidation").map(String::as_str) == Some("Strict"),
        )?;
        if meta_str(&object, "name").is_none() {
            match meta_str(&object, "generateName") {
                Some(prefix) => {
                    let name = format!("{prefix}{}", random_suffix(5));
                    object["metadata"]["name"] = name.into();
                }
                None => {
                    return Err(ApiError::invalid(
                        resource.kind,
                        "",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    ));
                }
            }
        }
        let name = name_of(&object).to_owned();
        let k = Self::store_key(resource, namespace, &name);
        if self.store.borrow().get(&k).is_some() {
            return Err(ApiError::already_exists(
                resource.group,
                resource.plural,
                &name,
            ));
        }
        let meta = &mut object["metadata"];
        meta["uid"] = new_uid().into();
        meta["creationTimestamp"] = now().into();
        if let Some(m) = meta.as_object_mut() {
            m.remove("resourceVersion");
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("selfLink");
        }
        if (resource.group, resource.plural) == ("", "pods") {
            let volume = format!("kube-api-access-{}", random_suffix(5));
            defaults::pod(&mut object, &volume);
            let class = object
                .pointer("/spec/runtimeClassName")
                .and_then(Value::as_str)
                .and_then(|c| {
                    let k = key("node.k8s.io/runtimeclasses", "", c);
                    self.store.borrow().get(&k).cloned()
                });
            crate::admission::runtime_class(&mut object, class.as_ref()).map_err(|why| {
                ApiError::new(
                    403,
                    "Forbidden",
                    format!("pods \"{name}\" is forbidden: {why}"),
                )
            })?;
        }
        if (resource.group, resource.plural) == ("", "namespaces") {
            object["status"] = json!({"phase": "Active"});
        }
        if (resource.group, resource.plural) == ("", "secrets") {
            defaults::secret(&mut object);
        }
        if (resource.group, resource.plural) == ("", "services") {
            let taken: Vec<String> = self
                .store
                .borrow()
                .list(&resource.id(), None)
                .iter()
                .filter_map(|s| {
                    s.pointer("/spec/clusterIP")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .collect();
            defaults::service(&mut object, &taken)
                .map_err(|m| ApiError::invalid(resource.kind, &name, "spec.clusterIP", &m))?;
        }
        if query.get("dryRun").is_some_and(|d| d == "All") {
            return Ok(object);
        }
        if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        crate::managed::record(None, &mut object, &manager(query), None, &now());
        let stored = self.store.borrow_mut().put(k, object, EventType::Added);
        if (resource.group, resource.plural) == ("", "namespaces") {
            self.populate_namespace(&name);
        }
        Ok(stored)
    }

    /// What controllers add to a new namespace: its default service account
    /// and the root CA ConfigMap pods' token volumes read.
    fn populate_namespace(&self, namespace: &str) {
        let (Some(accounts), Some(configmaps)) = (
            Resource::find("", "v1", "serviceaccounts"),
            Resource::find("", "v1", "configmaps"),
        ) else {
            return;
        };
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        let root_ca = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt",
            "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
            "data": {"ca.crt": self.ca_pem}});
        for (resource, object) in [(accounts, account), (configmaps, root_ca)] {
            if let Err(e) = self.create(resource, Some(namespace), object, &Query::new()) {
                log::warn!("populating namespace {namespace}: {}", e.message);
            }
        }
    }

    /// PUT: replaces the object (or its status), checking resourceVersion
    /// when the body carries one.
    pub fn update(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        mut object: Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let current = self.get(resource, namespace, name)?;
        if name_of(&object) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                name_of(&object)
            )));
        }
        if let Some(rv) = meta_str(&object, "resourceVersion")
            && Some(rv) != meta_str(&current, "resourceVersion")
        {
            return Err(ApiError::conflict(resource.group, resource.plural, name));
        }
        if let Some(uid) = meta_str(&object, "uid")
            && Some(uid) != meta_str(&current, "uid")
        {
            return Err(uid_precondition(resource, name, uid, &current));
        }
        if object.get("apiVersion").is_none() {
            object["apiVersion"] = resource.api_version().into();
            object["kind"] = resource.kind.into();
        }
        typed_check(
            resource,
            &object,
            query.get("fieldValidation").map(String::as_str) == Some("Strict"),
        )?;
        let updated = merge_for_subresource(resource, &current, object, subresource)?;
        let write = Write {
            manager: manager(query),
            subresource,
        };
        Ok(self.commit(resource, namespace, name, current, updated, write))
    }

    /// PATCH in the three content types; preconditions in the patch's
    /// metadata (uid, resourceVersion) are honoured.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        content_type: &str,
        body: &Value,
        query: &Query,
    ) -> ApiResult<Value> {
        let current = self.get(resource, namespace, name)?;
        for field in ["uid", "resourceVersion"] {
            if let Some(wanted) = body
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_str)
                && Some(wanted) != meta_str(&current, field)
            {
                return Err(if field == "uid" {
                    uid_precondition(resource, name, wanted, &current)
                } else {
                    ApiError::conflict(resource.group, resource.plural, name)
                });
            }
        }
        let patched = match content_type {
            "application/merge-patch+json" => Ok(patch::merge_patch(&current, body)),
            "application/json-patch+json" => patch::json_patch(&current, body),
            "application/strategic-merge-patch+json" => patch::strategic_merge_patch(&current, body),
            other => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other})"),
                ));
            }
        }
        .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?;
        typed_check(
            resource,
            &patched,
            query.get("fieldValidation").map(String::as_str) == Some("Strict"),
        )?;
        let updated = merge_for_subresource(resource, &current, patched, subresource)?;
        let write = Write {
            manager: manager(query),
            subresource,
        };
        Ok(self.commit(resource, namespace, name, current, updated, write))
    }

    /// Stores an update; removes the object when a pending deletion's last
    /// finalizer went away.
    fn commit(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        current: Value,
        mut updated: Value,
        write: Write,
    ) -> Value {
        // Identity and bookkeeping fields are the server's.
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
        ] {
            match current.pointer(&format!("/metadata/{field}")) {
                Some(v) => updated["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = updated.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove(field);
                    }
                }
            }
        }
        if (resource.group, resource.plural) == ("", "secrets") {
            defaults::secret(&mut updated);
        }
        // managedFields are the server's to keep.
        match current.pointer("/metadata/managedFields") {
            Some(m) => updated["metadata"]["managedFields"] = m.clone(),
            None => {
                if let Some(m) = updated.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("managedFields");
                }
            }
        }
        if updated == current {
            // A no-op write does not bump the resourceVersion.
            return current;
        }
        crate::managed::record(
            Some(&current),
            &mut updated,
            &write.manager,
            write.subresource,
            &now(),
        );
        let k = Self::store_key(resource, namespace, name);
        let finalizers_empty = updated
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty());
        let deleting = updated.pointer("/metadata/deletionTimestamp").is_some();
        let mut store = self.store.borrow_mut();
        if deleting && finalizers_empty && !is_graceful_pod(resource, &updated) {
            store.put(k.clone(), updated, EventType::Modified);
            return store.remove(&k).unwrap_or(Value::Null);
        }
        store.put(k, updated, EventType::Modified)
    }

    /// DELETE with DeleteOptions: preconditions, grace periods for pods
    /// bound to a node, finalizers.
    pub fn delete(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        name: &str,
        options: &Value,
    ) -> ApiResult<Value> {
        let current = self.get(resource, namespace, name)?;
        if let Some(uid) = options
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            && Some(uid) != meta_str(&current, "uid")
        {
            return Err(uid_precondition(resource, name, uid, &current));
        }
        if let Some(rv) = options
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            && Some(rv) != meta_str(&current, "resourceVersion")
        {
            return Err(ApiError::precondition(
                resource.group,
                resource.plural,
                name,
                format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&current, "resourceVersion").unwrap_or("")
                ),
            ));
        }
        let k = Self::store_key(resource, namespace, name);
        let has_finalizers = current
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if (resource.group, resource.plural) == ("", "pods") {
            let bound = current
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let spec_grace = current
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30);
            let mut grace = options
                .get("gracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(spec_grace)
                .max(0);
            if let Some(pending) = current
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
            {
                // A second delete may only shorten the grace period.
                grace = grace.min(pending);
            }
            let terminal = matches!(
                current.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            );
            if bound && grace > 0 && !terminal {
                let mut updated = current.clone();
                let at = Timestamp::now() + jiff::SignedDuration::from_secs(grace);
                updated["metadata"]["deletionTimestamp"] =
                    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into();
                updated["metadata"]["deletionGracePeriodSeconds"] = grace.into();
                if updated == current {
                    return Ok(current);
                }
                return Ok(self.store.borrow_mut().put(k, updated, EventType::Modified));
            }
        }
        if has_finalizers {
            if current.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut updated = current;
            updated["metadata"]["deletionTimestamp"] = now().into();
            updated["metadata"]["deletionGracePeriodSeconds"] = 0.into();
            return Ok(self.store.borrow_mut().put(k, updated, EventType::Modified));
        }
        if (resource.group, resource.plural) == ("", "namespaces") {
            self.delete_namespace_contents(name);
        }
        if (resource.group, resource.plural) == ("", "nodes") {
            // The pod GC controller force-deletes pods of a deleted node.
            let pods = self.store.borrow().list("/pods", None);
            for pod in pods
                .iter()
                .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(name))
            {
                let k = key(
                    "/pods",
                    meta_str(pod, "namespace").unwrap_or(""),
                    name_of(pod),
                );
                self.store.borrow_mut().remove(&k);
            }
        }
        let removed = self.store.borrow_mut().remove(&k);
        removed.ok_or_else(|| ApiError::not_found(resource.group, resource.plural, name))
    }

    fn delete_namespace_contents(&self, namespace: &str) {
        for r in crate::resources::RESOURCES.iter().filter(|r| r.namespaced) {
            let objects = self.store.borrow().list(&r.id(), Some(namespace));
            for o in objects {
                self.store
                    .borrow_mut()
                    .remove(&key(&r.id(), namespace, name_of(&o)));
            }
        }
    }

    /// DELETE on a collection: each matching object as a single delete.
    pub fn delete_collection(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        query: &Query,
        options: &Value,
    ) -> ApiResult<Value> {
        let list = self.list(resource, namespace, query)?;
        let mut deleted = Vec::new();
        for item in list["items"].as_array().cloned().unwrap_or_default() {
            let ns = meta_str(&item, "namespace").map(str::to_owned);
            if let Ok(o) = self.delete(
                resource,
                ns.as_deref().or(namespace),
                name_of(&item),
                options,
            ) {
                deleted.push(o);
            }
        }
        Ok(json!({
            "kind": format!("{}List", resource.kind),
            "apiVersion": resource.api_version(),
            "metadata": {"resourceVersion": self.store.borrow().current_rv().to_string()},
            "items": deleted,
        }))
    }
}

/// The 409 of a uid precondition that does not hold.
fn uid_precondition(resource: &Resource, name: &str, wanted: &str, current: &Value) -> ApiError {
    ApiError::precondition(
        resource.group,
        resource.plural,
        name,
        format!(
            "Precondition failed: UID in precondition: {wanted}, UID in object meta: {}",
            meta_str(current, "uid").unwrap_or("")
        ),
    )
}

/// A bound pod's deletion waits for the kubelet (grace period > 0).
fn is_graceful_pod(resource: &Resource, object: &Value) -> bool {
    (resource.group, resource.plural) == ("", "pods")
        && object
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            > 0
}

fn sort_key(o: &Value) -> String {
    format!(
        "{}\u{0}{}",
        meta_str(o, "namespace").unwrap_or(""),
        name_of(o)
    )
}

pub fn namespaces() -> &'static Resource {
    Resource::find("", "v1", "namespaces").expect("namespaces are always served")
}

/// Writes through the main resource leave status alone; writes through
/// `status` change only status (and, as upstream, nothing else).
fn merge_for_subresource(
    resource: &Resource,
    current: &Value,
    mut updated: Value,
    subresource: Option<&str>,
) -> ApiResult<Value> {
    match subresource {
        // Approval conditions live in status, as do signed certificates.
        Some("status") | Some("approval") => {
            let mut result = current.clone();
            result["status"] = updated.get("status").cloned().unwrap_or(Value::Null);
            Ok(result)
        }
        Some("ephemeralcontainers") => {
            let mut result = current.clone();
            let wanted = updated
                .pointer("/spec/ephemeralContainers")
                .cloned()
                .unwrap_or(Value::Null);
            result["spec"]["ephemeralContainers"] =
                ephemeral_containers(current, wanted).map_err(|(field, message)| {
                    ApiError::invalid("Pod", name_of(current), &field, &message)
                })?;
            Ok(result)
        }
        Some("resize") => {
            let result = resize(current, &updated).map_err(|(field, message)| {
                ApiError::invalid("Pod", name_of(current), &field, &message)
            })?;
            Ok(result)
        }
        Some(other) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({other})"),
        )),
        None => {
            if resource.has_status {
                match current.get("status") {
                    Some(s) => updated["status"] = s.clone(),
                    None => {
                        if let Some(m) = updated.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            if (resource.group, resource.plural) == ("", "pods") {
                check_pod_update(current, &updated)?;
            }
            Ok(updated)
        }
    }
}

/// The ephemeral containers after an update of that subresource, as
/// upstream validates it: the existing ones unchanged and kept, new ones
/// named uniquely, with an image, without what an ephemeral container may
/// not have, targeting a container of the pod; new ones defaulted.
fn ephemeral_containers(current: &Value, wanted: Value) -> Result<Value, (String, String)> {
    let field = "spec.ephemeralContainers";
    let existing: Vec<Value> = current
        .pointer("/spec/ephemeralContainers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut wanted: Vec<Value> = match wanted {
        Value::Null => Vec::new(),
        Value::Array(list) => list,
        _ => return Err((field.into(), "Invalid value: must be a list".into())),
    };
    // By name, as upstream: a strategic merge patch without an element
    // order puts new items first.
    for old in &existing {
        let name = old["name"].as_str().unwrap_or("");
        match wanted.iter().position(|w| w["name"] == old["name"]) {
            None => {
                return Err((
                    field.into(),
                    format!(
                        "Forbidden: existing ephemeral containers \"{name}\" may not be removed"
                    ),
                ));
            }
            Some(at) => {
                let mut defaulted = wanted[at].clone();
                crate::defaults::default_container(&mut defaulted);
                if defaulted != *old {
                    return Err((
                        format!("{field}[{at}]"),
                        format!(
                            "Forbidden: existing ephemeral containers \"{name}\" may not be changed"
                        ),
                    ));
                }
                wanted[at] = defaulted;
            }
        }
    }
    let spec = &current["spec"];
    let regular: Vec<&str> = ["containers", "initContainers"]
        .iter()
        .filter_map(|list| spec.get(*list).and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let forbidden = [
        "ports",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "lifecycle",
        "resizePolicy",
        "restartPolicy",
    ];
    let mut names: Vec<String> = regular.iter().map(|n| (*n).to_owned()).collect();
    for (i, c) in wanted.iter_mut().enumerate() {
        let at = format!("{field}[{i}]");
        let name = c["name"].as_str().unwrap_or("").to_owned();
        if existing.iter().any(|old| old["name"] == c["name"]) {
            names.push(name);
            continue;
        }
        if name.is_empty() {
            return Err((format!("{at}.name"), "Required value".into()));
        }
        if names.contains(&name) {
            return Err((format!("{at}.name"), format!("Duplicate value: \"{name}\"")));
        }
        if c["image"].as_str().is_none_or(str::is_empty) {
            return Err((format!("{at}.image"), "Required value".into()));
        }
        if let Some(set) = forbidden.iter().find(|f| !c[**f].is_null()) {
            return Err((
                format!("{at}.{set}"),
                "Forbidden: cannot be set for an Ephemeral Container".into(),
            ));
        }
        let resources = &c["resources"];
        if ["limits", "requests"]
            .iter()
            .any(|k| resources[*k].as_object().is_some_and(|m| !m.is_empty()))
        {
            return Err((
                format!("{at}.resources"),
                "Forbidden: cannot be set for an Ephemeral Container".into(),
            ));
        }
        if let Some(target) = c["targetContainerName"].as_str()
            && !target.is_empty()
            && !regular.contains(&target)
        {
            return Err((
                format!("{at}.targetContainerName"),
                format!("Not found: \"{target}\""),
            ));
        }
        crate::defaults::default_container(c);
        names.push(name);
    }
    Ok(Value::Array(wanted))
}

/// The pod after an update of its `resize` subresource, as upstream
/// validates one: only the CPU and memory of containers and sidecars (and
/// their resizePolicy) change, requests stay within limits, and the QoS
/// class stays what it was.
fn resize(current: &Value, updated: &Value) -> Result<Value, (String, String)> {
    let mut result = current.clone();
    for list in ["containers", "initContainers"] {
        let old = current["spec"][list]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let new = updated["spec"][list]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if old.len() != new.len() {
            return Err((
                format!("spec.{list}"),
                "Forbidden: containers may not be added or removed".into(),
            ));
        }
        for (i, (o, n)) in old.iter().zip(&new).enumerate() {
            let at = format!("spec.{list}[{i}]");
            if o["name"] != n["name"] {
                return Err((
                    format!("{at}.name"),
                    "Forbidden: containers may not be renamed".into(),
                ));
            }
            let sidecar = o["restartPolicy"] == "Always";
            let (old_r, new_r) = (&o["resources"], &n["resources"]);
            if list == "initContainers" && !sidecar && old_r != new_r {
                return Err((
                    format!("{at}.resources"),
                    "Forbidden: resources for non-sidecar init containers are immutable".into(),
                ));
            }
            for kind in ["requests", "limits"] {
                let others = |r: &Value| -> Value {
                    let mut m = r[kind].clone();
                    if let Some(m) = m.as_object_mut() {
                        m.remove("cpu");
                        m.remove("memory");
                    }
                    m
                };
                if others(old_r) != others(new_r) {
                    return Err((
                        format!("{at}.resources.{kind}"),
                        "Forbidden: only cpu and memory resources are mutable".into(),
                    ));
                }
            }
            for (resource, parse) in [
                ("cpu", nanolet::quantity::parse_milli as fn(&str) -> _),
                ("memory", |t: &str| {
                    nanolet::quantity::parse_bytes(t).map(u128::from)
                }),
            ] {
                let amount = |kind: &str| {
                    let q = &new_r[kind][resource];
                    q.as_str()
                        .map(str::to_owned)
                        .or_else(|| q.as_f64().map(|f| f.to_string()))
                        .and_then(|t| parse(&t).ok())
                };
                if let (Some(request), Some(limit)) = (amount("requests"), amount("limits"))
                    && request > limit
                {
                    return Err((
                        format!("{at}.resources.requests"),
                        format!("Invalid value: must be less than or equal to {resource} limit"),
                    ));
                }
            }
            result["spec"][list][i]["resources"] = new_r.clone();
            match n.get("resizePolicy") {
                Some(policy) => result["spec"][list][i]["resizePolicy"] = policy.clone(),
                None => {
                    if let Some(c) = result["spec"][list][i].as_object_mut() {
                        c.remove("resizePolicy");
                    }
                }
            }
        }
    }
    let (before, after) = (
        crate::defaults::qos_class(&current["spec"]),
        crate::defaults::qos_class(&result["spec"]),
    );
    if before != after {
        return Err((
            "spec".into(),
            "Invalid value: Pod QOS Class may not change as a result of resizing".into(),
        ));
    }
    Ok(result)
}

/// Pod specs are immutable but for container images and a few fields.
fn check_pod_update(current: &Value, updated: &Value) -> ApiResult<()> {
    let strip = |spec: &Value| {
        let mut s = spec.clone();
        for list in ["containers", "initContainers"] {
            if let Some(cs) = s.get_mut(list).and_then(Value::as_array_mut) {
                for c in cs {
                    c["image"] = Value::Null;
                }
            }
        }
        if let Some(m) = s.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
            m.remove("terminationGracePeriodSeconds");
        }
        s
    };
    let (old, new) = (
        current.get("spec").cloned().unwrap_or_default(),
        updated.get("spec").cloned().unwrap_or_default(),
    );
    let nodeless = old.get("nodeName").is_none_or(Value::is_null);
    let mut old_cmp = strip(&old);
    let mut new_cmp = strip(&new);
    if nodeless {
        // Binding sets nodeName once.
        old_cmp["nodeName"] = Value::Null;
        new_cmp["nodeName"] = Value::Null;
    }
    if old_cmp != new_cmp {
        return Err(ApiError::invalid(
            "Pod",
            name_of(current),
            "spec",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        ));
    }
    Ok(())
}
