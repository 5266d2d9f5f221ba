//! HTTPS serving: TLS with optional client certificates, authentication,
//! routing to discovery, OpenAPI and the resource endpoints, watch streams,
//! and the request record tests count traffic with.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::TcpListener;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::{FutureExt, StreamExt};
use futures_rustls::TlsAcceptor;
use futures_rustls::rustls::server::WebPkiClientVerifier;
use futures_rustls::rustls::{self, RootCertStore, ServerConfig};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use smol::Async;

use crate::api::{Api, Query};
use crate::protobuf;
use crate::resources::Resource;
use crate::status::{ApiError, ApiResult, success};
use crate::store::{EventType, Watcher};
use crate::table;

pub type BodyError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = UnsyncBoxBody<Bytes, BodyError>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// What a handler needs of a request besides its path.
#[derive(Clone, Copy)]
struct Call<'a> {
    method: &'a Method,
    query: &'a Query,
    accept: &'a str,
    content_type: &'a str,
    body: &'a [u8],
    user: &'a User,
    /// The path ends with `/`, which a proxied path keeps.
    trailing_slash: bool,
}

/// One request, as the tests count API traffic.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    pub user: String,
    pub status: u16,
    pub request_bytes: usize,
    pub response_bytes: usize,
    /// When the request arrived, in milliseconds since the epoch.
    pub at_ms: i64,
}

/// Faults the tests inject through the admin endpoint.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail this many of the next API requests with this status (0 = hang
    /// until the client gives up, a timeout).
    pub fail_next: Cell<u32>,
    pub fail_status: Cell<u16>,
    /// Refuse (close) new connections while set.
    pub paused: Cell<bool>,
    /// Requests of this user hang: one node cut off, the rest served.
    pub cut_off: RefCell<Option<String>>,
}

/// How the signers sign: for how long (kube-controller-manager's
/// `--cluster-signing-duration`), and from when, as an offset from now in
/// seconds (a clock ahead of a board's: certificates not yet valid).
pub struct Signing {
    pub duration: Cell<i64>,
    pub not_before: Cell<i64>,
}

pub struct Server {
    pub api: Api,
    /// Bearer tokens: the admin's (no expiry) and issued service account
    /// tokens (until they expire).
    pub tokens: RefCell<HashMap<String, (User, Option<jiff::Timestamp>)>>,
    pub requests: RefCell<Vec<RequestRecord>>,
    pub faults: Faults,
    pub address: String,
    pub bookmark_interval: Duration,
    /// A node whose Lease is older than this is marked NotReady (Unknown).
    pub node_grace: Duration,
    pub signer: crate::tokens::Signer,
    /// Approve (and sign) every CertificateSigningRequest on creation.
    pub auto_approve: bool,
    pub signing: Signing,
    pub ca: crate::pki::Ca,
    /// TLS toward kubelets, with the API server's client certificate.
    pub kubelet_tls: Arc<rustls::ClientConfig>,
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("Content-Type", "application/json")
        .body(full(body))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

fn error_response(e: &ApiError) -> Response<Body> {
    error_response_for(e, "")
}

/// A Status, in protobuf to a client that prefers it, as the real server.
fn error_response_for(e: &ApiError, accept: &str) -> Response<Body> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    negotiated_response(code, &e.to_status(), accept)
}

/// An answer in protobuf when the client prefers it and the kind can be
/// encoded; in JSON otherwise (protobuf clients accept JSON too).
fn negotiated_response(status: StatusCode, value: &Value, accept: &str) -> Response<Body> {
    let encoded = protobuf::wanted(accept)
        .then(|| protobuf::encode(value))
        .flatten();
    match encoded {
        Some(bytes) => Response::builder()
            .status(status)
            .header("Content-Type", protobuf::PROTOBUF)
            .body(full(bytes))
            .unwrap_or_else(|_| Response::new(full(Bytes::new()))),
        None => json_response(status, value),
    }
}

fn text_response(status: StatusCode, text: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("Content-Type", "text/plain; charset=utf-8")
        .body(full(text.to_owned()))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

pub fn parse_query(raw: Option<&str>) -> Query {
    let mut out = Query::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode(k), decode(v));
    }
    out
}

fn with_query(path: String, params: &[String]) -> String {
    if params.is_empty() {
        path
    } else {
        format!("{path}?{}", params.join("&"))
    }
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn tls_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    // HTTP/2 as the real server, and HTTP/1.1 for the clients that ask for
    // it (upgrades for exec, attach and port-forward; the Python client).
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The headers the real server adds to every answer, which a node pays for
/// on its uplink: the audit ID of the request, and the priority and
/// fairness flow schema and level (one pair of UIDs per server).
fn real_server_headers(headers: &mut hyper::HeaderMap) {
    static FLOW: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (schema, level) =
        FLOW.get_or_init(|| (nanolet::state::random_uuid(), nanolet::state::random_uuid()));
    for (name, value) in [
        ("audit-id", nanolet::state::random_uuid()),
        ("cache-control", "no-cache, private".to_owned()),
        ("x-kubernetes-pf-flowschema-uid", schema.clone()),
        ("x-kubernetes-pf-prioritylevel-uid", level.clone()),
    ] {
        if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
}

/// Accepts connections until the process ends.
pub async fn serve(
    server: Rc<Server>,
    listener: TcpListener,
    tls: Arc<ServerConfig>,
) -> anyhow::Result<()> {
    let listener = Async::new(listener)?;
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (stream, _) = listener.accept().await?;
        if server.faults.paused.get() {
            drop(stream);
            continue;
        }
        let acceptor = acceptor.clone();
        let server = server.clone();
        nanolet::rt::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let leaf = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first());
            let user = leaf
                .and_then(|cert| crate::pki::identity(cert.as_ref()))
                .map(|(name, groups)| User { name, groups });
            let validity = leaf.and_then(|cert| crate::pki::validity(cert.as_ref()));
            let service = hyper::service::service_fn(move |req| {
                let server = server.clone();
                // As the real server's x509 authenticator: the certificate
                // is checked at each request, so one that expired while its
                // connection stayed open no longer names anybody.
                let now = jiff::Timestamp::now().as_second();
                let user = user
                    .clone()
                    .filter(|_| validity.is_some_and(|(from, to)| from <= now && now <= to));
                async move { Ok::<_, Infallible>(server.handle(req, user).await) }
            });
            let http2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let io = nanolet::http::io::HyperIo(tls);
            let served = if http2 {
                hyper::server::conn::http2::Builder::new(nanolet::rt::LoopExecutor)
                    .serve_connection(io, service)
                    .await
            } else {
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .with_upgrades()
                    .await
            };
            if let Err(e) = served {
                log::debug!("connection: {e}");
            }
        })
        .detach();
    }
}

/// The path split into segments, for routing.
/// The container a pod subresource names, or the pod's only one.
fn container_of(pod: &Value, name: &str, requested: Option<&String>) -> ApiResult<String> {
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    match requested {
        Some(c) => Ok(c.clone()),
        None if containers.len() == 1 => Ok(containers[0].to_owned()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

/// Namespace, pod and action of a streaming pod subresource's path.
fn pod_stream(path: &str) -> Option<(&str, &str, &str)> {
    match segments(path).as_slice() {
        ["api", "v1", "namespaces", namespace, "pods", pod, action]
            if matches!(*action, "exec" | "attach" | "portforward") =>
        {
            Some((namespace, pod, action))
        }
        _ => None,
    }
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

impl Server {
    /// The user of a request, with `system:authenticated` among its groups
    /// as the real server's authenticators add it.
    fn authenticate(&self, req: &Request<Incoming>, cert_user: Option<User>) -> Option<User> {
        let mut user = self.authenticate_by_token_or(req, cert_user)?;
        if !user.groups.iter().any(|g| g == "system:authenticated") {
            user.groups.push("system:authenticated".into());
        }
        Some(user)
    }

    fn authenticate_by_token_or(
        &self,
        req: &Request<Incoming>,
        cert_user: Option<User>,
    ) -> Option<User> {
        if let Some(token) = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        {
            let token = token.trim();
            return self
                .token_user(token)
                .or_else(|| crate::bootstrap::user(&self.api.store.borrow(), token));
        }
        cert_user
    }

    /// Whose `token` is, while it is valid.
    fn token_user(&self, token: &str) -> Option<User> {
        self.tokens
            .borrow()
            .get(token)
            .filter(|(_, expiry)| expiry.is_none_or(|e| e > jiff::Timestamp::now()))
            .map(|(user, _)| user.clone())
    }

    pub async fn handle(
        self: Rc<Self>,
        req: Request<Incoming>,
        cert_user: Option<User>,
    ) -> Response<Body> {
        let at_ms = jiff::Timestamp::now().as_millisecond();
        // Paused: requests on open connections hang, as to an unreachable host.
        while self.faults.paused.get() {
            smol::Timer::after(Duration::from_millis(100)).await;
        }
        let user = self.authenticate(&req, cert_user);
        while user
            .as_ref()
            .is_some_and(|u| self.faults.cut_off.borrow().as_deref() == Some(u.name.as_str()))
        {
            smol::Timer::after(Duration::from_millis(100)).await;
        }
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let raw_query = req.uri().query().unwrap_or("").to_owned();
        let public = matches!(
            path.as_str(),
            "/version" | "/healthz" | "/livez" | "/readyz"
        );
        let (response, request_bytes) = if user.is_none() && !public {
            let e = ApiError::new(401, "Unauthorized", "Unauthorized");
            (error_response(&e), 0)
        } else if self.faults.fail_next.get() > 0 && !public {
            self.faults.fail_next.set(self.faults.fail_next.get() - 1);
            match self.faults.fail_status.get() {
                0 => {
                    // A timeout: the request hangs until the client gives up.
                    std::future::pending::<()>().await;
                    unreachable!("pending never completes")
                }
                code => {
                    let e =
                        ApiError::new(code, "InternalError", format!("injected failure {code}"));
                    (error_response(&e), 0)
                }
            }
        } else if let Some((namespace, pod, action)) = pod_stream(&path) {
            let response = match self
                .stream_to_kubelet(req, namespace, pod, action, &raw_query)
                .await
            {
                Ok(r) => r,
                Err(e) => error_response(&e),
            };
            (response, 0)
        } else {
            let user_agent = req
                .headers()
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let accept = req
                .headers()
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let content_type = req
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/json")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_owned();
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => Bytes::new(),
            };
            let n = body.len();
            let mut query = parse_query(Some(&raw_query));
            if matches!(method, Method::POST | Method::PUT | Method::PATCH) {
                query
                    .entry("fieldManager".into())
                    .or_insert_with(|| crate::managed::manager_from_user_agent(&user_agent));
            }
            let requester = user.clone().unwrap_or(User {
                name: "system:anonymous".into(),
                groups: vec!["system:unauthenticated".into()],
            });
            let call = Call {
                method: &method,
                query: &query,
                accept: &accept,
                content_type: &content_type,
                body: &body,
                user: &requester,
                trailing_slash: path.ends_with('/'),
            };
            let response = match self.route(&path, &call).await {
                Ok(r) => r,
                Err(e) => error_response_for(&e, &accept),
            };
            (response, n)
        };
        self.finish(
            (method, path, raw_query, at_ms),
            user,
            response,
            request_bytes,
        )
    }

    /// Records the request (for traffic counts) and returns its response.
    fn finish(
        &self,
        (method, path, query, at_ms): (Method, String, String, i64),
        user: Option<User>,
        response: Response<Body>,
        request_bytes: usize,
    ) -> Response<Body> {
        let mut response = response;
        real_server_headers(response.headers_mut());
        let response_bytes = hyper::body::Body::size_hint(response.body())
            .exact()
            .unwrap_or(0) as usize;
        self.requests.borrow_mut().push(RequestRecord {
            method: method.to_string(),
            path,
            query,
            user: user
                .map(|u| u.name)
                .unwrap_or_else(|| "system:anonymous".into()),
            status: response.status().as_u16(),
            request_bytes,
            response_bytes,
            at_ms,
        });
        response
    }

    async fn route(self: &Rc<Self>, path: &str, call: &Call<'_>) -> ApiResult<Response<Body>> {
        let segs = segments(path);
        let ok = |v: Value| Ok(json_response(StatusCode::OK, &v));
        match segs.as_slice() {
            ["healthz"] | ["livez"] | ["readyz"] => Ok(text_response(StatusCode::OK, "ok")),
            ["version"] => ok(json!({
                "major": "1", "minor": "32", "gitVersion": "v1.32.0-nanolet-test",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23.0", "compiler": "gc",
                "platform": "linux/amd64"
            })),
            ["api"] => ok(json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.address}]
            })),
            ["api", "v1"] => ok(json!({
                "kind": "APIResourceList", "groupVersion": "v1", "resources": Resource::discovery("", "v1")
            })),
            ["apis"] => {
                let groups: Vec<Value> = Resource::groups()
                    .iter()
                    .map(|(g, v)| group_json(g, v))
                    .collect();
                ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
            }
            ["apis", g] => match Resource::groups().iter().find(|(name, _)| name == g) {
                Some((g, v)) => {
                    let mut group = group_json(g, v);
                    group["kind"] = "APIGroup".into();
                    group["apiVersion"] = "v1".into();
                    ok(group)
                }
                None => Err(not_found_path()),
            },
            ["apis", g, v]
                if Resource::groups()
                    .iter()
                    .any(|(name, ver)| name == g && ver == v) =>
            {
                ok(json!({
                    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{g}/{v}"),
                    "resources": Resource::discovery(g, v)
                }))
            }
            ["openapi", "v3"] => ok(crate::openapi::index()),
            ["openapi", "v3", rest @ ..] => crate::openapi::document(&rest.join("/"))
                .map(|d| json_response(StatusCode::OK, &d))
                .ok_or_else(not_found_path),
            // Reviews are answered, not stored.
            ["apis", "authentication.k8s.io", "v1", "tokenreviews"]
                if call.method == Method::POST =>
            {
                let request: Value = serde_json::from_slice(call.body)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                let token = request.pointer("/spec/token").and_then(Value::as_str);
                let user = token.and_then(|t| self.token_user(t));
                Ok(json_response(
                    StatusCode::CREATED,
                    &crate::reviews::token_review(&request, user.as_ref()),
                ))
            }
            ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"]
                if call.method == Method::POST =>
            {
                let request: Value = serde_json::from_slice(call.body)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                let store = self.api.store.borrow();
                Ok(json_response(
                    StatusCode::CREATED,
                    &crate::reviews::subject_access_review(&store, &request),
                ))
            }
            ["api", "v1", rest @ ..] => self.resource("", "v1", rest, call).await,
            ["apis", g, v, rest @ ..] => self.resource(g, v, rest, call).await,
            _ => Err(not_found_path()),
        }
    }

    async fn resource(
        self: &Rc<Self>,
        group: &str,
        version: &str,
        rest: &[&str],
        call: &Call<'_>,
    ) -> ApiResult<Response<Body>> {
        let Call {
            method,
            query,
            accept,
            content_type,
            body,
            user,
            trailing_slash,
        } = *call;
        let namespaced_path = rest.len() >= 3
            && rest[0] == "namespaces"
            && Resource::find(group, version, rest[2]).is_some_and(|r| r.namespaced);
        let (namespace, rest) = if namespaced_path {
            (Some(rest[1]), &rest[2..])
        } else {
            (None, rest)
        };
        let Some(resource) = rest
            .first()
            .and_then(|plural| Resource::find(group, version, plural))
        else {
            return Err(not_found_path());
        };
        let name = rest.get(1).copied();
        let subresource = rest.get(2).copied();
        if rest.len() > 3 && subresource != Some("proxy") {
            return Err(not_found_path());
        }
        if resource.namespaced && namespace.is_none() && name.is_some() {
            return Err(not_found_path());
        }
        if let Some(sub) = subresource
            && !resource.subresources.contains(&sub)
        {
            return Err(not_found_path());
        }
        let api = &self.api;
        let verb = match (method, name) {
            (&Method::GET, Some(_)) => "get",
            (&Method::GET, None) if crate::api::flag(query.get("watch").map(String::as_str)) => {
                "watch"
            }
            (&Method::GET, None) => "list",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, Some(_)) => "delete",
            (&Method::DELETE, None) => "deletecollection",
            _ => "unknown",
        };
        if user.groups.iter().any(|g| g == crate::bootstrap::GROUP) {
            // What RBAC grants, as the real server's authorizer chain
            // decides for anyone who is not a node (the test server checks
            // only nodes and bootstrappers).
            let review = json!({"user": user.name, "groups": user.groups,
                "resourceAttributes": {"verb": verb, "group": group, "resource": resource.plural,
                    "subresource": subresource.unwrap_or(""), "namespace": namespace.unwrap_or(""),
                    "name": name.unwrap_or("")}});
            if !crate::reviews::allows(&api.store.borrow(), &review) {
                let what = match subresource {
                    Some(sub) => format!("{}/{sub}", resource.plural),
                    None => resource.plural.to_owned(),
                };
                let place = namespace
                    .map(|ns| format!("in the namespace \"{ns}\""))
                    .unwrap_or_else(|| "at the cluster scope".into());
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{what} is forbidden: User \"{}\" cannot {verb} resource \"{what}\" in API group \"{group}\" {place}",
                        user.name
                    ),
                ));
            }
        }
        if let Some(node) = crate::authz::node_of(user) {
            let selected_name = query
                .get("fieldSelector")
                .and_then(|s| s.strip_prefix("metadata.name="))
                .filter(|n| !n.contains(','));
            let attributes = crate::authz::Attributes {
                verb,
                group,
                plural: resource.plural,
                subresource,
                namespace,
                name,
                selected_name,
            };
            let sent: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            crate::authz::authorize(api, node, &attributes, &sent)?;
        }
        let parse_body = || -> ApiResult<Value> {
            if body.is_empty() {
                return Ok(json!({}));
            }
            if content_type == protobuf::PROTOBUF {
                return protobuf::decode(body).map_err(|e| match e {
                    protobuf::ProtobufError::UnknownKind { .. } => ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!("{e}; send application/json"),
                    ),
                    _ => ApiError::bad_request(format!("error decoding the body: {e}")),
                });
            }
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding the body: {e}")))
        };
        let respond = |status: StatusCode, value: Value| -> ApiResult<Response<Body>> {
            if table::wants_table(accept) && method == Method::GET {
                let rv = value
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let include = query
                    .get("includeObject")
                    .map(String::as_str)
                    .unwrap_or("Metadata");
                let items = match value.get("items").and_then(Value::as_array) {
                    Some(items) => items.clone(),
                    None => vec![value.clone()],
                };
                let mut t = table::table(resource, &items, &rv, include);
                if let Some(c) = value.pointer("/metadata/continue") {
                    t["metadata"]["continue"] = c.clone();
                }
                return Ok(json_response(status, &t));
            }
            Ok(negotiated_response(status, &value, accept))
        };
        match (method, name, subresource) {
            (&Method::GET, None, _) => {
                if crate::api::flag(query.get("watch").map(String::as_str)) {
                    return self.watch(resource, namespace, query, table::wants_table(accept));
                }
                respond(StatusCode::OK, api.list(resource, namespace, query)?)
            }
            (&Method::GET, Some(name), Some("log")) => {
                let pod = api.get(resource, namespace, name)?;
                let container = container_of(&pod, name, query.get("container"))?;
                let node_name = pod
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let path = format!(
                    "/containerLogs/{}/{name}/{container}",
                    namespace.unwrap_or("")
                );
                let response = self
                    .to_kubelet((node_name, method, path), query, &["container"], &[])
                    .await?;
                kubelet_log_error(response).await
            }
            // Every method, as upstream's node proxy.
            (_, Some(name), Some("proxy")) => {
                let slash = if trailing_slash && rest.len() > 3 {
                    "/"
                } else {
                    ""
                };
                let path = format!("/{}{slash}", rest[3..].join("/"));
                self.to_kubelet((name, method, path), query, &[], body)
                    .await
            }
            (
                &Method::GET,
                Some(name),
                None | Some("status") | Some("ephemeralcontainers") | Some("resize"),
            ) => respond(StatusCode::OK, api.get(resource, namespace, name)?),
            (&Method::POST, None, None) => {
                let mut object = parse_body()?;
                let csr = (resource.group, resource.plural)
                    == ("certificates.k8s.io", "certificatesigningrequests");
                if csr && object.get("spec").is_some_and(Value::is_object) {
                    // The requester is whoever sent it, not what it claims;
                    // and a request starts with no status (no approval, no
                    // certificate), as the real server's strategy resets it.
                    object["spec"]["username"] = user.name.clone().into();
                    object["spec"]["groups"] = json!(user.groups);
                    object["status"] = json!({});
                }
                let created = api.create(resource, namespace, object, query)?;
                if csr {
                    // As kube-controller-manager would, a moment later: the
                    // answer is the request as created, still pending.
                    self.approve_csr(resource, &created)?;
                }
                if matches!(
                    (resource.group, resource.plural),
                    ("", "pods") | ("apps", "daemonsets")
                ) {
                    self.run_controllers();
                }
                respond(StatusCode::CREATED, created)
            }
            (&Method::POST, Some(name), Some("binding")) => {
                let binding = parse_body()?;
                let node = binding
                    .pointer("/target/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                self.bind(namespace.unwrap_or(""), name, &node)?;
                Ok(json_response(
                    StatusCode::CREATED,
                    &success(json!({"name": name, "kind": "pods"})),
                ))
            }
            (&Method::POST, Some(name), Some("token")) => {
                let request = parse_body()?;
                let account = api.get(resource, namespace, name)?;
                let ns = namespace.unwrap_or("");
                let (token, expires) = self
                    .signer
                    .issue(ns, &account, &request)
                    .map_err(|m| ApiError::invalid("TokenRequest", name, "spec", &m))?;
                let account_user = User {
                    name: format!("system:serviceaccount:{ns}:{name}"),
                    groups: vec![
                        "system:serviceaccounts".into(),
                        format!("system:serviceaccounts:{ns}"),
                    ],
                };
                self.tokens
                    .borrow_mut()
                    .insert(token.clone(), (account_user, Some(expires)));
                let mut spec = request.get("spec").cloned().unwrap_or(json!({}));
                if spec
                    .get("audiences")
                    .is_none_or(|a| a.as_array().is_none_or(Vec::is_empty))
                {
                    spec["audiences"] = json!(["https://kubernetes.default.svc.cluster.local"]);
                }
                if spec.get("expirationSeconds").is_none() {
                    spec["expirationSeconds"] = 3600.into();
                }
                let response = json!({
                    "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                    "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
                    "spec": spec,
                    "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}
                });
                Ok(json_response(StatusCode::CREATED, &response))
            }
            (&Method::PUT, Some(name), sub) => {
                let mut updated =
                    api.update(resource, namespace, name, sub, parse_body()?, query)?;
                if sub == Some("approval") {
                    updated = self.sign_if_approved(resource, name, updated)?;
                }
                if resource.plural == "nodes" {
                    self.schedule_pending();
                }
                respond(StatusCode::OK, updated)
            }
            (&Method::PATCH, Some(name), sub) => {
                let patched = api.patch(
                    resource,
                    namespace,
                    name,
                    sub,
                    content_type,
                    &parse_body()?,
                    query,
                )?;
                if resource.plural == "nodes" {
                    self.schedule_pending();
                }
                respond(StatusCode::OK, patched)
            }
            (&Method::DELETE, Some(name), None) => {
                let deleted = api.delete(resource, namespace, name, &parse_body()?)?;
                respond(StatusCode::OK, deleted)
            }
            (&Method::DELETE, None, None) => respond(
                StatusCode::OK,
                api.delete_collection(resource, namespace, query, &parse_body()?)?,
            ),
            _ => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )),
        }
    }

    /// A watch: replays the window after `resourceVersion` (or sends every
    /// object as ADDED without one), then streams live events; bookmarks
    /// when asked; ends after `timeoutSeconds`.
    fn watch(
        self: &Rc<Self>,
        resource: &'static Resource,
        namespace: Option<&str>,
        query: &Query,
        as_table: bool,
    ) -> ApiResult<Response<Body>> {
        let (labels, fields) = crate::api::label_and_field(resource, query)?;
        let matches = move |o: &Value| labels.matches(o) && fields.matches(o);
        let (events_tx, events_rx) = smol::channel::bounded(1000);
        let mut initial: Vec<(&'static str, Value)> = Vec::new();
        let mut expired = None;
        {
            let mut store = self.api.store.borrow_mut();
            let rv = query
                .get("resourceVersion")
                .filter(|v| !v.is_empty() && *v != "0");
            match rv.map(|v| v.parse::<u64>()) {
                None => {
                    for o in store.list(&resource.id(), namespace) {
                        if matches(&o) {
                            initial.push(("ADDED", o));
                        }
                    }
                }
                Some(Ok(rv)) => match store.since(&resource.id(), namespace, rv) {
                    Some(events) => {
                        for e in events {
                            if let Some(t) = translate(&e, &matches) {
                                initial.push((t, e.object.clone()));
                            }
                        }
                    }
                    None => {
                        expired = Some(format!(
                            "too old resource version: {rv} ({})",
                            store.oldest_rv()
                        ))
                    }
                },
                Some(Err(_)) => return Err(ApiError::bad_request("invalid resourceVersion")),
            }
            store.watch(Watcher {
                resource: resource.id(),
                namespace: namespace.map(str::to_owned),
                tx: events_tx,
            });
        }
        let (body_tx, body_rx) = smol::channel::bounded::<Bytes>(64);
        let frame = move |kind: &str, object: Value| -> Bytes {
            let object = if as_table && kind != "ERROR" && kind != "BOOKMARK" {
                let rv = object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                table::table(resource, &[object], &rv, "Object")
            } else {
                object
            };
            let mut line =
                serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
            line.push(b'\n');
            Bytes::from(line)
        };
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(1800));
        let bookmarks = crate::api::flag(query.get("allowWatchBookmarks").map(String::as_str));
        let bookmark_interval = self.bookmark_interval;
        let server = self.clone();
        nanolet::rt::spawn(async move {
            if let Some(message) = expired {
                let status = ApiError::gone(message).to_status();
                let _ = body_tx.send(frame("ERROR", status)).await;
                return;
            }
            for (kind, object) in initial {
                if body_tx.send(frame(kind, object)).await.is_err() {
                    return;
                }
            }
            let deadline = smol::Timer::after(timeout);
            let stream = async {
                let mut next_bookmark = smol::Timer::interval(bookmark_interval);
                loop {
                    let event = async { Some(events_rx.recv().await) };
                    let bookmark = async {
                        if bookmarks {
                            next_bookmark.next().await;
                            None
                        } else {
                            std::future::pending().await
                        }
                    };
                    match event.or(bookmark).await {
                        Some(Ok(e)) => {
                            if let Some(kind) = translate(&e, &matches)
                                && body_tx.send(frame(kind, e.object.clone())).await.is_err()
                            {
                                return;
                            }
                        }
                        // The store dropped this watch (closed by a test, or too slow).
                        Some(Err(_)) => return,
                        None => {
                            let rv = server.api.store.borrow().current_rv().to_string();
                            let mark = json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": {"resourceVersion": rv}});
                            if body_tx.send(frame("BOOKMARK", mark)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            };
            stream.or(async { deadline.await; }).await;
        })
        .detach();
        let body = StreamBody::new(body_rx.map(|b| Ok::<_, BodyError>(Frame::data(b))));
        Response::builder()
            .status(StatusCode::OK)
            .header("Content-Type", "application/json")
            .header("Transfer-Encoding", "chunked")
            .body(BodyExt::boxed_unsync(body))
            .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))
    }

    /// `pods/exec`, `pods/attach` and `pods/portforward`: the kubelet's
    /// path and parameters for them, as upstream's pod strategy builds
    /// them, then the upgrade passed through.
    async fn stream_to_kubelet(
        &self,
        req: Request<Incoming>,
        namespace: &str,
        name: &str,
        action: &str,
        raw_query: &str,
    ) -> ApiResult<Response<Body>> {
        let pods = Resource::find("", "v1", "pods").expect("pods are always served");
        let pod = self.api.get(pods, Some(namespace), name)?;
        let query: Vec<(String, String)> = raw_query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        let get = |key: &str| {
            query
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let yes = |key: &str| crate::api::flag(get(key));
        let mut params: Vec<String> = Vec::new();
        let path = if action == "portforward" {
            // Every `ports` parameter, each perhaps a list, as one `port`
            // list (upstream's streamParams).
            let ports: Vec<&str> = query
                .iter()
                .filter(|(k, _)| k == "ports")
                .map(|(_, v)| v.as_str())
                .collect();
            if !ports.is_empty() {
                params.push(format!(
                    "port={}",
                    nanolet::http::percent_encode(&ports.join(","))
                ));
            }
            format!("/portForward/{namespace}/{name}")
        } else {
            let requested = get("container").map(str::to_owned);
            let container = container_of(&pod, name, requested.as_ref())?;
            if action == "exec" {
                for (_, command) in query.iter().filter(|(k, _)| k == "command") {
                    params.push(format!(
                        "command={}",
                        nanolet::http::percent_encode(command)
                    ));
                }
            }
            for (theirs, kubelets) in [
                ("stderr", "error"),
                ("stdin", "input"),
                ("stdout", "output"),
                ("tty", "tty"),
            ] {
                if yes(theirs) {
                    params.push(format!("{kubelets}=1"));
                }
            }
            format!("/{action}/{namespace}/{name}/{container}")
        };
        let node_name = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        let nodes = Resource::find("", "v1", "nodes").expect("nodes are always served");
        let node = self.api.get(nodes, None, node_name)?;
        let address = crate::proxy::kubelet_address(&node)
            .ok_or_else(|| ApiError::bad_request(format!("node {node_name} has no address")))?;
        crate::proxy::forward_upgrade(
            self.kubelet_tls.clone(),
            &address,
            &with_query(path, &params),
            req,
        )
        .await
    }

    /// Forwards a request to a node's kubelet, passing on the query but for
    /// the parameters the API server itself consumed.
    async fn to_kubelet(
        &self,
        (node_name, method, path): (&str, &Method, String),
        query: &Query,
        consumed: &[&str],
        body: &[u8],
    ) -> ApiResult<Response<Body>> {
        let nodes = Resource::find("", "v1", "nodes").expect("nodes are always served");
        let node = self.api.get(nodes, None, node_name)?;
        let address = crate::proxy::kubelet_address(&node)
            .ok_or_else(|| ApiError::bad_request(format!("node {node_name} has no address")))?;
        let params: Vec<String> = query
            .iter()
            .filter(|(k, _)| !consumed.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={}", nanolet::http::percent_encode(v)))
            .collect();
        crate::proxy::forward(
            self.kubelet_tls.clone(),
            &address,
            (method.clone(), &with_query(path, &params)),
            bytes::Bytes::copy_from_slice(body),
        )
        .await
    }

    /// The csrapproving controller (or, with `--auto-approve-csrs`, an
    /// approval of everything), then the signer.
    fn approve_csr(&self, resource: &Resource, created: &Value) -> ApiResult<()> {
        let message = if self.auto_approve {
            Some("approved by test-apiserver --auto-approve-csrs")
        } else {
            crate::csr::auto_approval(&self.api.store.borrow(), created)
        };
        let Some(message) = message else {
            return Ok(());
        };
        let name = created["metadata"]["name"].as_str().unwrap_or("");
        let mut approved = created.clone();
        approved["status"] = json!({"conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved",
            "message": message, "lastUpdateTime": crate::api::now()}]});
        let approved = self.api.update(
            resource,
            None,
            name,
            Some("approval"),
            approved,
            &Query::new(),
        )?;
        self.sign_if_approved(resource, name, approved)?;
        Ok(())
    }

    /// The signer: an approved request without a certificate gets one from
    /// the server's CA, unless its signer refuses it (a `Failed`
    /// condition); a denied one never does.
    fn sign_if_approved(&self, resource: &Resource, name: &str, csr: Value) -> ApiResult<Value> {
        let conditions = csr
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let approved = conditions
            .iter()
            .any(|c| c["type"] == "Approved" && c["status"] == "True");
        let denied = conditions
            .iter()
            .any(|c| c["type"] == "Denied" && c["status"] == "True");
        let signed = csr
            .pointer("/status/certificate")
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty());
        let failed = conditions.iter().any(|c| c["type"] == "Failed");
        if !approved || denied || signed || failed {
            return Ok(csr);
        }
        if let Some(why) = crate::csr::signer_refusal(&csr) {
            let mut refused = csr;
            let mut conditions = conditions;
            conditions.push(
                json!({"type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                "message": why, "lastUpdateTime": crate::api::now()}),
            );
            refused["status"]["conditions"] = conditions.into();
            return self
                .api
                .update(resource, None, name, Some("status"), refused, &Query::new());
        }
        use base64::Engine;
        let engine = base64::engine::general_purpose::STANDARD;
        let request = csr
            .pointer("/spec/request")
            .and_then(Value::as_str)
            .unwrap_or("");
        let pem = engine
            .decode(request)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    "CertificateSigningRequest",
                    name,
                    "spec.request",
                    "not a base64 PEM request",
                )
            })?;
        let usages: Vec<String> = csr
            .pointer("/spec/usages")
            .and_then(Value::as_array)
            .map(|u| {
                u.iter()
                    .filter_map(|u| u.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        // As kube-controller-manager: the signing duration, or less if the
        // request asks for less.
        let duration = self.signing.duration.get();
        let seconds = csr
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
            .map_or(duration, |asked| asked.min(duration));
        let not_before = self.signing.not_before.get();
        let certificate = self
            .ca
            .sign_request(&pem, &usages, not_before, seconds)
            .map_err(|e| {
                ApiError::invalid(
                    "CertificateSigningRequest",
                    name,
                    "spec.request",
                    &e.to_string(),
                )
            })?;
        let mut with_cert = csr;
        with_cert["status"]["certificate"] = engine.encode(certificate).into();
        self.api.update(
            resource,
            None,
            name,
            Some("status"),
            with_cert,
            &Query::new(),
        )
    }

    /// Binds a pod to a node (the Binding subresource).
    fn bind(&self, namespace: &str, name: &str, node: &str) -> ApiResult<()> {
        let pods = Resource::find("", "v1", "pods").expect("pods are always served");
        let pod = self.api.get(pods, Some(namespace), name)?;
        if pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "pod {name} is already assigned to node {}",
                    pod["spec"]["nodeName"]
                ),
            ));
        }
        let mut bound = pod.clone();
        bound["spec"]["nodeName"] = node.into();
        let condition = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": crate::api::now()});
        bound["status"]["conditions"] = json!([condition]);
        let k = crate::store::key(&pods.id(), namespace, name);
        self.api
            .store
            .borrow_mut()
            .put(k, bound, EventType::Modified);
        Ok(())
    }

    /// The controllers' pass: DaemonSets' pods made or removed, then
    /// pending pods scheduled.
    pub fn run_controllers(&self) {
        crate::controllers::daemonsets(&self.api);
        self.schedule_pending();
    }

    /// The scheduler stand-in: binds unscheduled pods to the Ready node
    /// their node selector, required node affinity and taints allow, when
    /// there is exactly one candidate or the first by name among several.
    pub fn schedule_pending(&self) {
        let pods = self.api.store.borrow().list("/pods", None);
        let nodes = self.api.store.borrow().list("/nodes", None);
        let ready: Vec<&Value> = nodes
            .iter()
            .filter(|n| {
                n.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                    && n.pointer("/spec/unschedulable") != Some(&Value::Bool(true))
            })
            .collect();
        for pod in pods {
            if pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty())
                || pod.pointer("/metadata/deletionTimestamp").is_some()
            {
                continue;
            }
            let candidate = ready
                .iter()
                .find(|n| crate::controllers::schedulable(&pod["spec"], n));
            if let Some(node) = candidate {
                let ns = pod
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let name = pod
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let node = node
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if let Err(e) = self.bind(ns, name, node) {
                    log::warn!("scheduling {ns}/{name}: {}", e.message);
                }
            }
        }
    }
}

impl Server {
    /// The node lifecycle controller's core: a node that has neither
    /// renewed its Lease nor posted a Ready heartbeat within the grace
    /// period gets Ready=Unknown and the unreachable taints (the real
    /// controller takes either as a sign of life).
    pub fn node_lifecycle(&self) {
        let nodes = self.api.store.borrow().list("/nodes", None);
        let now = jiff::Timestamp::now();
        for node in nodes {
            let name = node
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let lease_key =
                crate::store::key("coordination.k8s.io/leases", "kube-node-lease", &name);
            let renewed = self
                .api
                .store
                .borrow()
                .get(&lease_key)
                .and_then(|l| {
                    l.pointer("/spec/renewTime")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                // A node that never had a Lease gets the grace period from
                // its registration, as the real controller gives new nodes.
                .or_else(|| {
                    node.pointer("/metadata/creationTimestamp")
                        .and_then(Value::as_str)
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                });
            let heartbeat = node
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .and_then(|c| c["lastHeartbeatTime"].as_str())
                .and_then(|t| t.parse::<jiff::Timestamp>().ok());
            let fresh = [renewed, heartbeat]
                .into_iter()
                .flatten()
                .any(|t| now.duration_since(t).unsigned_abs() <= self.node_grace);
            if fresh {
                self.mark_reachable(&name, node);
                continue;
            }
            let Some(conditions) = node.pointer("/status/conditions").and_then(Value::as_array)
            else {
                continue;
            };
            if conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "Unknown")
            {
                continue;
            }
            let mut updated = node.clone();
            let stamp = crate::api::now();
            if let Some(list) = updated
                .pointer_mut("/status/conditions")
                .and_then(Value::as_array_mut)
            {
                for c in list.iter_mut() {
                    if ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"]
                        .contains(&c["type"].as_str().unwrap_or(""))
                    {
                        c["status"] = "Unknown".into();
                        c["reason"] = "NodeStatusUnknown".into();
                        c["message"] = "Kubelet stopped posting node status.".into();
                        c["lastTransitionTime"] = stamp.clone().into();
                    }
                }
            }
            if !updated["spec"].is_object() {
                updated["spec"] = json!({});
            }
            let taints = updated["spec"]
                .as_object_mut()
                .map(|s| s.entry("taints").or_insert_with(|| json!([])));
            if let Some(Value::Array(list)) = taints {
                for effect in ["NoSchedule", "NoExecute"] {
                    if !list.iter().any(|t| {
                        t["key"] == "node.kubernetes.io/unreachable" && t["effect"] == effect
                    }) {
                        list.push(json!({"key": "node.kubernetes.io/unreachable", "effect": effect, "timeAdded": stamp}));
                    }
                }
            }
            let k = crate::store::key("/nodes", "", &name);
            self.api
                .store
                .borrow_mut()
                .put(k, updated, EventType::Modified);
            log::info!("node {name}: lease expired; marked NotReady");
        }
    }

    /// A node that posts Ready again loses the taints the controller gave
    /// it (upstream's NoSchedule tainting pass and `markNodeAsReachable`),
    /// so that pods are scheduled to it again.
    fn mark_reachable(&self, name: &str, mut node: Value) {
        const CONTROLLER_TAINTS: [&str; 2] = [
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/not-ready",
        ];
        let ready = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        let Some(taints) = node
            .pointer_mut("/spec/taints")
            .and_then(Value::as_array_mut)
        else {
            return;
        };
        let before = taints.len();
        taints.retain(|t| !CONTROLLER_TAINTS.contains(&t["key"].as_str().unwrap_or("")));
        if !ready || taints.len() == before {
            return;
        }
        let k = crate::store::key("/nodes", "", name);
        self.api
            .store
            .borrow_mut()
            .put(k, node, EventType::Modified);
        log::info!("node {name}: Ready again; controller taints removed");
    }
}

/// How an event shows in a watch with selectors: a modification that makes
/// an object match is ADDED, one that makes it stop matching is DELETED.
fn translate(
    event: &crate::store::Event,
    matches: &dyn Fn(&Value) -> bool,
) -> Option<&'static str> {
    let now = matches(&event.object);
    match event.kind {
        EventType::Added => now.then_some("ADDED"),
        EventType::Deleted => now.then_some("DELETED"),
        EventType::Modified => {
            let before = event.old.as_ref().is_some_and(matches);
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }
}

fn group_json(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// What upstream's GenericHttpResponseChecker makes of a kubelet's failed
/// log answer: a 400's or 500's text becomes the Status's message (kubectl
/// prints it); other answers pass as they came.
async fn kubelet_log_error(response: Response<Body>) -> ApiResult<Response<Body>> {
    let code = response.status();
    if code != StatusCode::BAD_REQUEST && code != StatusCode::INTERNAL_SERVER_ERROR {
        return Ok(response);
    }
    let body = http_body_util::Limited::new(response.into_body(), 50_000);
    let text = match body.collect().await {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
        Err(e) => e.to_string(),
    };
    Err(if code == StatusCode::BAD_REQUEST {
        ApiError::bad_request(text)
    } else {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {text}"),
        )
    })
}
