//! Requests to the API server: JSON in and out (protobuf answers where
//! only a resourceVersion is wanted), bearer or client-cert
//! authentication, `Status` errors decoded, every request counted.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use smol::lock::{RwLock, RwLockWriteGuardArc};

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::OutageLog;
use super::kubeconfig::{Kubeconfig, Token};
use crate::http::{Client, HttpError, read_body};

/// Bodies the agent reads are small (a pod, a node, a list of a node's
/// pods); a list of pods for one node stays far below this.
const MAX_BODY: usize = 64 << 20;

/// How long a request may wait for its answer, as upstream's heartbeat
/// client (nodeStatusUpdateFrequency): a hung link must not hold up the
/// next Lease renewal.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What client-go asks for when it is set to protobuf: protobuf, or JSON
/// for kinds the server cannot encode so.
const PROTOBUF_OR_JSON: &str = "application/vnd.kubernetes.protobuf,application/json";

/// An answer read only for its resourceVersion (a Lease) is small.
const MAX_VERSION_ANSWER: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("{method} {path}: {code} {reason}: {message}")]
    Status {
        method: Method,
        path: String,
        code: u16,
        reason: String,
        message: String,
    },
    #[error("{path}: decoding the response: {message}")]
    Decode { path: String, message: String },
    #[error("{path}: token file: {source}")]
    TokenFile {
        path: String,
        source: std::io::Error,
    },
}

impl KubeError {
    /// The HTTP status of an API error, if it was one.
    pub fn code(&self) -> Option<u16> {
        match self {
            KubeError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    /// Whether the server could not be reached or failed, as opposed to it
    /// refusing the request: the kind of failure an outage produces.
    pub fn is_unavailable(&self) -> bool {
        match self {
            KubeError::Http(_) => true,
            KubeError::Status { code, .. } => *code >= 500 || *code == 429,
            _ => false,
        }
    }
}

/// Patch flavours the API server accepts.
#[derive(Debug, Clone, Copy)]
pub enum PatchType {
    Merge,
    StrategicMerge,
}

impl PatchType {
    fn content_type(self) -> &'static str {
        match self {
            PatchType::Merge => "application/merge-patch+json",
            PatchType::StrategicMerge => "application/strategic-merge-patch+json",
        }
    }
}

/// A cheap-to-clone handle on the API server.
#[derive(Clone)]
pub struct Api {
    http: Client,
    server: String,
    token: Option<Token>,
    user_agent: HeaderValue,
    requests: Rc<Cell<u64>>,
    outage: Rc<RefCell<OutageLog>>,
    gate: Rc<Gate>,
}

/// Requests wait here while the node has no credentials it can use (a
/// bootstrap under way, a certificate not valid yet): as in an outage,
/// nothing is sent, and nothing is refused for want of a certificate.
#[derive(Default)]
struct Gate {
    lock: Arc<RwLock<()>>,
    closed: RefCell<Option<RwLockWriteGuardArc<()>>>,
}

impl Api {
    pub fn new(kubeconfig: &Kubeconfig, node_name: &str) -> Api {
        let agent = format!("nanolet/{} ({node_name})", env!("CARGO_PKG_VERSION"));
        Api {
            http: Client::with_tls(kubeconfig.tls.clone(), REQUEST_TIMEOUT),
            server: kubeconfig.server.clone(),
            token: kubeconfig.token.clone(),
            user_agent: HeaderValue::from_str(&agent)
                .unwrap_or(HeaderValue::from_static("nanolet")),
            requests: Rc::new(Cell::new(0)),
            outage: Rc::default(),
            gate: Rc::default(),
        }
    }

    /// Holds every request until [`Api::release`]: what is in flight goes on.
    pub async fn hold(&self) {
        if self.gate.closed.borrow().is_some() {
            return;
        }
        let guard = self.gate.lock.write_arc().await;
        *self.gate.closed.borrow_mut() = Some(guard);
    }

    /// Lets requests go again.
    pub fn release(&self) {
        self.gate.closed.borrow_mut().take();
    }

    pub fn is_held(&self) -> bool {
        self.gate.closed.borrow().is_some()
    }

    /// Closes the idle connections: the next request handshakes again, with
    /// the client certificate shown now. Streams in use (watches) go on.
    pub fn reconnect(&self) {
        self.http.forget_idle();
    }

    /// Requests sent so far, for the agent's own metrics.
    pub fn request_count(&self) -> u64 {
        self.requests.get()
    }

    fn headers(&self, path: &str, accept: &'static str) -> Result<HeaderMap, KubeError> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(accept));
        headers.insert(USER_AGENT, self.user_agent.clone());
        let token = match &self.token {
            None => None,
            Some(Token::Fixed(t)) => Some(t.clone()),
            // Re-read per request, as rotated tokens must take effect; the
            // file is small and in memory (tmpfs or page cache).
            Some(Token::File(file)) => Some(
                std::fs::read_to_string(file)
                    .map_err(|source| KubeError::TokenFile {
                        path: path.to_owned(),
                        source,
                    })?
                    .trim()
                    .to_owned(),
            ),
        };
        if let Some(token) = token
            && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {token}"))
        {
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        Ok(headers)
    }

    fn url(&self, path: &str) -> Result<Uri, KubeError> {
        format!("{}{path}", self.server)
            .parse()
            .map_err(|_| HttpError::InvalidUrl {
                url: path.to_owned(),
            })
            .map_err(KubeError::from)
    }

    /// Sends a request and returns the response if it succeeded (2xx); any
    /// other status becomes [`KubeError::Status`] with the server's reason.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&'static str>,
        body: Bytes,
    ) -> Result<(Uri, hyper::Response<Incoming>), KubeError> {
        self.send_accepting(method, path, content_type, "application/json", body)
            .await
    }

    async fn send_accepting(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&'static str>,
        accept: &'static str,
        body: Bytes,
    ) -> Result<(Uri, hyper::Response<Incoming>), KubeError> {
        drop(self.gate.lock.read().await);
        let url = self.url(path)?;
        let mut headers = self.headers(path, accept)?;
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        self.requests.set(self.requests.get() + 1);
        let verb = method.clone();
        let result = async {
            let response = self
                .http
                .request(method.clone(), &url, &headers, body, false)
                .await?;
            let code = response.status();
            if code.is_success() {
                return Ok((url.clone(), response));
            }
            let protobuf = is_protobuf(&response);
            let text = read_body(&url, response.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            Err(status_error(method, path, code, &text, protobuf))
        }
        .await;
        match &result {
            Err(e) if e.is_unavailable() => self.outage.borrow_mut().failed(e),
            _ => self.outage.borrow_mut().succeeded(),
        }
        let code = match &result {
            Ok((_, response)) => Some(response.status().as_u16()),
            Err(e) => e.code(),
        };
        crate::stats::own::api_request(verb.as_str(), code);
        result
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&'static str>,
        body: Bytes,
    ) -> Result<T, KubeError> {
        let (url, response) = self.send(method, path, content_type, body).await?;
        let bytes = read_body(&url, response.into_body(), MAX_BODY).await?;
        serde_json::from_slice(&bytes).map_err(|e| KubeError::Decode {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    fn encode<B: Serialize>(body: &B) -> Bytes {
        // Serialising our own typed values cannot fail.
        Bytes::from(serde_json::to_vec(body).unwrap_or_default())
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, KubeError> {
        self.json(Method::GET, path, None, Bytes::new()).await
    }

    pub async fn create<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, KubeError> {
        let body = Self::encode(body);
        self.json(Method::POST, path, Some("application/json"), body)
            .await
    }

    pub async fn replace<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, KubeError> {
        let body = Self::encode(body);
        self.json(Method::PUT, path, Some("application/json"), body)
            .await
    }

    pub async fn patch<T: DeserializeOwned>(
        &self,
        path: &str,
        kind: PatchType,
        patch: &serde_json::Value,
    ) -> Result<T, KubeError> {
        let body = Self::encode(patch);
        self.json(Method::PATCH, path, Some(kind.content_type()), body)
            .await
    }

    /// A patch whose answer is wanted only for the object's new
    /// resourceVersion (a Lease renewal, every 10 s): asked for in protobuf,
    /// a third smaller than JSON for a Lease, and read without decoding
    /// the rest; JSON when the server answers so.
    pub async fn patch_for_version(
        &self,
        path: &str,
        kind: PatchType,
        patch: &serde_json::Value,
    ) -> Result<String, KubeError> {
        let body = Self::encode(patch);
        let (url, response) = self
            .send_accepting(
                Method::PATCH,
                path,
                Some(kind.content_type()),
                PROTOBUF_OR_JSON,
                body,
            )
            .await?;
        let protobuf = is_protobuf(&response);
        let bytes = read_body(&url, response.into_body(), MAX_VERSION_ANSWER).await?;
        let decode_error = |message: String| KubeError::Decode {
            path: path.to_owned(),
            message,
        };
        if protobuf {
            return super::protobuf::resource_version(&bytes)
                .map_err(|e| decode_error(e.to_string()));
        }
        #[derive(serde::Deserialize)]
        struct Versioned {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        }
        let answer: Versioned =
            serde_json::from_slice(&bytes).map_err(|e| decode_error(e.to_string()))?;
        answer
            .metadata
            .resource_version
            .ok_or_else(|| decode_error("the answer has no resourceVersion".into()))
    }

    /// DELETE with DeleteOptions (grace period, preconditions).
    pub async fn delete(&self, path: &str, options: &serde_json::Value) -> Result<(), KubeError> {
        let body = Self::encode(options);
        let (url, response) = self
            .send(Method::DELETE, path, Some("application/json"), body)
            .await?;
        read_body(&url, response.into_body(), MAX_BODY).await?;
        Ok(())
    }
}

fn is_protobuf(response: &hyper::Response<Incoming>) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next() == Some(super::protobuf::MEDIA_TYPE))
}

fn status_error(
    method: Method,
    path: &str,
    code: StatusCode,
    body: &[u8],
    protobuf: bool,
) -> KubeError {
    let (reason, message) = if protobuf {
        super::protobuf::status_reason_and_message(body).unwrap_or_default()
    } else {
        let status: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let field = |name: &str| {
            status
                .as_ref()
                .and_then(|s| s.get(name))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        (field("reason"), field("message"))
    };
    KubeError::Status {
        method,
        path: path.to_owned(),
        code: code.as_u16(),
        reason: reason
            .or_else(|| code.canonical_reason().map(str::to_owned))
            .unwrap_or_default(),
        // An undecodable protobuf body is bytes, not text for a log line.
        message: message.unwrap_or_else(|| match protobuf {
            true => format!("{} bytes of protobuf that are not a Status", body.len()),
            false => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_bodies_become_errors() {
        let body = br#"{"kind":"Status","status":"Failure","message":"pods \"x\" not found","reason":"NotFound","code":404}"#;
        let e = status_error(Method::GET, "/api/v1/x", StatusCode::NOT_FOUND, body, false);
        assert!(e.is_not_found());
        assert!(!e.is_unavailable());
        assert_eq!(
            e.to_string(),
            "GET /api/v1/x: 404 NotFound: pods \"x\" not found"
        );
        let e = status_error(Method::PUT, "/p", StatusCode::BAD_GATEWAY, b"oops", false);
        assert!(e.is_unavailable());
        assert!(e.to_string().contains("Bad Gateway: oops"));
    }

    /// A protobuf Status (the test API server's answer to a renewal on a
    /// stale version): its reason and message, not its bytes, in the error.
    #[test]
    fn protobuf_status_bodies_become_errors() {
        let body = super::super::protobuf::conflict_status();
        let e = status_error(Method::PATCH, "/l", StatusCode::CONFLICT, &body, true);
        assert!(e.is_conflict());
        let text = e.to_string();
        assert!(
            text.starts_with("PATCH /l: 409 Conflict: Operation cannot be fulfilled"),
            "{text}"
        );
        assert!(!text.contains("k8s\0"), "{text}");
        let e = status_error(Method::PATCH, "/l", StatusCode::CONFLICT, &body[..40], true);
        assert!(
            e.to_string()
                .ends_with("40 bytes of protobuf that are not a Status"),
            "{e}"
        );
    }
}
