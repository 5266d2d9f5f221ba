//! The kubelet API on HTTPS (default :10250): `/healthz`, `/pods`,
//! `/containerLogs` (as the API server calls it for `kubectl logs`), `/logs/`,
//! `/metrics/resource` and `/stats/summary` (what metrics-server scrapes).
//! Every request is authenticated and authorized first (see `auth`): 401
//! or 403 with upstream's words otherwise. The read-only port (plain HTTP,
//! off unless configured) serves the reading endpoints to anyone, as
//! upstream's does.

pub(crate) mod auth;
mod client_ca;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod limits;
mod node_logs;
mod port_forward;
mod remote_command;
pub(crate) mod serving_cert;
mod spdy;
mod upgrade;
mod websocket;

use std::convert::Infallible;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::StreamExt;
use futures_rustls::TlsAcceptor;
use futures_rustls::rustls::{self, ServerConfig};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use smol::Async;

use self::auth::{Attributes, Authority, PeerCertificate, Refusal, UserInfo};
use crate::cli::CliError;
use crate::cli::logs::LogsArgs;
use crate::helpers::{Plus, percent_decode};

/// What the kubelet API server needs of the agent: its configuration, the
/// state dir's layout (pods' records and logs, images, the runtime's
/// root), the cgroups (for stats), the node's address and the runtime.
pub struct Deps {
    pub config: crate::config::Config,
    pub layout: crate::state::Layout,
    pub cgroups: crate::cgroup::Hierarchy,
    pub host_ip: Option<std::net::IpAddr>,
    /// For exec and attach.
    pub runtime: crate::runtime::runc::Runtime,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{path}: {message}")]
    Tls { path: PathBuf, message: String },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving certificate: {0}")]
    SelfSigned(String),
}

type BodyError = Box<dyn std::error::Error + Send + Sync>;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
type Body = UnsyncBoxBody<Bytes, BodyError>;

fn full(status: StatusCode, content_type: &str, bytes: impl Into<Bytes>) -> Response<Body> {
    let body = Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    full(status, "text/plain; charset=utf-8", format!("{message}\n"))
}

/// The server's TLS settings, and the client CA that certificates are
/// checked against after the handshake.
fn tls_config(
    ctx: &Deps,
    serving: Arc<serving_cert::ServingCert>,
) -> Result<(Arc<ServerConfig>, Option<Arc<client_ca::ClientCa>>), ServerError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::SelfSigned(e.to_string()))?;
    let client_ca = match &ctx.config.client_ca_file {
        Some(path) => Some(Arc::new(client_ca::ClientCa::new(path, provider)?)),
        None => None,
    };
    let builder = match &client_ca {
        Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(serving);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(config), client_ca))
}

/// Binds the kubelet API; the returned future serves it forever.
pub fn bind(
    ctx: Rc<Deps>,
    authority: Rc<Authority>,
    serving: Arc<serving_cert::ServingCert>,
) -> Result<impl Future<Output = ()>, ServerError> {
    let addr = SocketAddr::new(ctx.config.address, ctx.config.port);
    let listener = TcpListener::bind(addr)
        .and_then(Async::new)
        .map_err(|source| ServerError::Listen { addr, source })?;
    let (tls_config, client_ca) = tls_config(&ctx, serving)?;
    let acceptor = TlsAcceptor::from(tls_config);
    let auth = &ctx.config.api_auth;
    if ctx.config.client_ca_file.is_none() && !auth.token_webhook && !auth.anonymous {
        log::warn!(
            "no clientCAFile, token webhook or anonymous access: the kubelet API on {addr} will refuse every request"
        );
    }
    log::info!("kubelet API listening on https://{addr}");
    let slots = limits::Slots::new(limits::API_CONNECTIONS);
    Ok(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: do not spin on it.
                    log::warn!("kubelet API: accepting: {e}");
                    smol::Timer::after(Duration::from_millis(200)).await;
                    continue;
                }
            };
            // Past the cap a connection is closed at once, not queued.
            let Some(slot) = slots.take() else {
                log::debug!(
                    "kubelet API: {} connections open, one refused",
                    limits::API_CONNECTIONS
                );
                continue;
            };
            let stream = limits::IdleTimeout::new(stream, limits::STREAMING_IDLE);
            let acceptor = acceptor.clone();
            let ctx = ctx.clone();
            let authority = authority.clone();
            let client_ca = client_ca.clone();
            crate::rt::spawn(async move {
                let _slot = slot;
                // A client that never finishes its handshake is dropped.
                let handshake = async { acceptor.accept(stream).await.ok() };
                let timeout = async {
                    smol::Timer::after(HANDSHAKE_TIMEOUT).await;
                    None
                };
                let Some(tls) = futures_lite::FutureExt::or(handshake, timeout).await else {
                    return;
                };
                let chain = tls.get_ref().1.peer_certificates().unwrap_or_default();
                let certificate = Rc::new(match (chain.first(), &client_ca) {
                    (Some(leaf), Some(ca)) if ca.verify(chain) => PeerCertificate::Verified(
                        crate::certificates::x509::subject(leaf)
                            .map(|(name, groups)| UserInfo::from_certificate(name, groups)),
                    ),
                    (Some(_), Some(_)) => PeerCertificate::Untrusted,
                    _ => PeerCertificate::Absent,
                });
                let service = hyper::service::service_fn(move |req| {
                    let ctx = ctx.clone();
                    let authority = authority.clone();
                    let certificate = certificate.clone();
                    async move {
                        let response = match admit(&authority, &certificate, &req).await {
                            Ok(()) => handle(&ctx, req).await,
                            Err(refusal) => refused(&refusal),
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                if let Err(e) = limits::http1()
                    .serve_connection(crate::http::io::HyperIo(tls), service)
                    .with_upgrades()
                    .await
                {
                    log::debug!("kubelet API connection: {e}");
                }
            })
            .detach();
        }
    })
}

/// The plain-HTTP `/healthz` (upstream's healthzPort, 10248 on
/// 127.0.0.1): what a local supervisor or liveness check asks, in
/// standalone mode too. An answer means the loop runs.
pub fn bind_healthz(addr: SocketAddr) -> Result<impl Future<Output = ()>, ServerError> {
    let serving = plain_http(addr, |req: Request<Incoming>| async move {
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
            (&Method::GET, _) => text(StatusCode::NOT_FOUND, "404 page not found"),
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
        }
    })?;
    log::info!("healthz listening on http://{addr}/healthz");
    Ok(serving)
}

/// Upstream's read-only port (readOnlyPort, off unless configured): the
/// kubelet API's reading endpoints over plain HTTP, with no authentication,
/// as upstream serves them; what a standalone node's Prometheus scrapes.
/// Logs, exec, attach and port-forward are not among them.
pub fn bind_read_only(ctx: Rc<Deps>) -> Result<impl Future<Output = ()>, ServerError> {
    let addr = SocketAddr::new(ctx.config.address, ctx.config.read_only_port);
    let serving = plain_http(addr, move |req: Request<Incoming>| {
        let ctx = ctx.clone();
        async move {
            let path = req.uri().path().to_owned();
            let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
            let reading = matches!(
                segments.as_slice(),
                ["healthz"]
                    | ["pods"]
                    | ["stats", "summary"]
                    | ["metrics"]
                    | ["metrics", "resource" | "probes" | "cadvisor"]
            );
            match *req.method() {
                Method::GET if reading => handle(&ctx, req).await,
                Method::GET => text(StatusCode::NOT_FOUND, "404 page not found"),
                _ => text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
            }
        }
    })?;
    log::warn!("read-only kubelet API, without authentication, on http://{addr}");
    Ok(serving)
}

/// Plain HTTP/1.1 on `addr`, every request answered by `answer`.
fn plain_http<Answer, Answered>(
    addr: SocketAddr,
    answer: Answer,
) -> Result<impl Future<Output = ()>, ServerError>
where
    Answer: Fn(Request<Incoming>) -> Answered + Clone + 'static,
    Answered: Future<Output = Response<Body>> + 'static,
{
    let listener = TcpListener::bind(addr)
        .and_then(Async::new)
        .map_err(|source| ServerError::Listen { addr, source })?;
    let slots = limits::Slots::new(limits::PLAIN_CONNECTIONS);
    Ok(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                smol::Timer::after(Duration::from_millis(200)).await;
                continue;
            };
            let Some(slot) = slots.take() else {
                continue;
            };
            // Nothing streams here: a minute of silence ends a connection.
            let stream = limits::IdleTimeout::new(stream, Duration::from_secs(60));
            let answer = answer.clone();
            crate::rt::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let answered = answer(req);
                    async move { Ok::<_, Infallible>(answered.await) }
                });
                let _ = limits::http1()
                    .serve_connection(crate::http::io::HyperIo(stream), service)
                    .await;
            })
            .detach();
        }
    })
}

fn query_pairs(req: &Request<Incoming>) -> Vec<(String, String)> {
    parse_query(req.uri().query().unwrap_or(""))
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                percent_decode(k, Plus::Space),
                percent_decode(v, Plus::Space),
            )
        })
        .collect()
}

/// Authentication, then authorization, of one request.
async fn admit(
    authority: &Authority,
    certificate: &PeerCertificate,
    req: &Request<Incoming>,
) -> Result<(), Refusal> {
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = authority.authenticate(certificate, authorization).await?;
    let attributes = Attributes::of(req.method(), req.uri().path());
    authority.authorize(&user, attributes).await
}

fn refused(refusal: &Refusal) -> Response<Body> {
    let status = match refusal {
        Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
        Refusal::Forbidden { .. } => StatusCode::FORBIDDEN,
        Refusal::Failed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    log::debug!("kubelet API: {refusal}");
    text(status, &refusal.to_string())
}

async fn handle(ctx: &Rc<Deps>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["healthz"]) => text(StatusCode::OK, "ok"),
        (&Method::GET, ["pods"]) => pods(ctx).await,
        (&Method::GET, ["metrics", "resource"]) => resource_metrics(ctx).await,
        (&Method::GET, ["metrics", "cadvisor"]) => cadvisor_metrics(ctx).await,
        (&Method::GET, ["metrics", "probes"]) => full(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::stats::own::render_probes(),
        ),
        (&Method::GET, ["metrics"]) => full(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::stats::own::render(),
        ),
        (&Method::GET, ["stats", "summary"]) => {
            let only = query_pairs(&req)
                .iter()
                .any(|(k, v)| k == "only_cpu_and_memory" && v == "true");
            stats_summary(ctx, only).await
        }
        (&Method::GET, ["containerLogs", namespace, pod, container]) => {
            let query = query_pairs(&req);
            container_logs(ctx, namespace, pod, container, &query).await
        }
        (&Method::GET | &Method::POST, ["exec", namespace, pod, container]) => {
            remote_command::exec(ctx, req, (namespace, pod, None, container)).await
        }
        (&Method::GET | &Method::POST, ["exec", namespace, pod, uid, container]) => {
            remote_command::exec(ctx, req, (namespace, pod, Some(uid), container)).await
        }
        (&Method::GET | &Method::POST, ["attach", namespace, pod, container]) => {
            remote_command::attach(ctx, req, (namespace, pod, None, container)).await
        }
        (&Method::GET | &Method::POST, ["attach", namespace, pod, uid, container]) => {
            remote_command::attach(ctx, req, (namespace, pod, Some(uid), container)).await
        }
        (&Method::POST, ["run", namespace, pod, container]) => {
            remote_command::run_command(ctx, req, (namespace, pod, None, container)).await
        }
        (&Method::POST, ["run", namespace, pod, uid, container]) => {
            remote_command::run_command(ctx, req, (namespace, pod, Some(uid), container)).await
        }
        (&Method::GET | &Method::POST, ["portForward", namespace, pod]) => {
            port_forward::port_forward(ctx, req, (namespace, pod, None)).await
        }
        (&Method::GET | &Method::POST, ["portForward", namespace, pod, uid]) => {
            port_forward::port_forward(ctx, req, (namespace, pod, Some(uid))).await
        }
        (&Method::GET, ["logs", ..]) if ctx.config.enable_system_log_handler => {
            let path = percent_decode(&path, Plus::Plus);
            node_logs::serve(node_logs::NODE_LOG_DIR.into(), &path).await
        }
        (&Method::GET, _) => text(StatusCode::NOT_FOUND, "404 page not found"),
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
    }
}

/// The pod `namespace/pod` this node runs (its newest record, not
/// terminating), read off the loop. 404 as upstream words it: "pod does
/// not exist", or "pod not found" when `uid` names another.
async fn pod_record(
    ctx: &Deps,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<crate::state::records::PodRecord, upgrade::Refused> {
    let layout = ctx.layout.clone();
    let records = crate::helpers::unblock(move || crate::cli::pod_records(&layout)).await;
    let record = records
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.namespace == namespace && r.name == pod && !r.terminating)
        .max_by_key(|r| r.admitted)
        .ok_or_else(|| upgrade::Refused::new(StatusCode::NOT_FOUND, "pod does not exist"))?;
    if uid.is_some_and(|uid| uid != record.uid) {
        return Err(upgrade::Refused::new(
            StatusCode::NOT_FOUND,
            "pod not found",
        ));
    }
    Ok(record)
}

/// The pods this node runs, with their statuses, as a PodList.
async fn pods(ctx: &Deps) -> Response<Body> {
    let layout = ctx.layout.clone();
    let list = crate::helpers::unblock(move || {
        let mut items = Vec::new();
        for record in crate::cli::pod_records(&layout).unwrap_or_default() {
            let dir = layout.pod(&record.uid);
            if let Ok(Some(checkpoint)) = crate::state::records::read_checkpoint(&dir) {
                let mut pod = checkpoint.manifest;
                pod.status = Some(record.status);
                items.push(pod);
            }
        }
        serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
    })
    .await;
    full(StatusCode::OK, "application/json", list.to_string())
}

/// `/metrics/resource`: read from the files now, off the loop.
async fn resource_metrics(ctx: &Deps) -> Response<Body> {
    let (layout, cgroups) = (ctx.layout.clone(), ctx.cgroups.clone());
    let text = crate::helpers::unblock(move || {
        crate::stats::resource_metrics(&crate::stats::collect(&layout, &cgroups))
    })
    .await;
    full(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        text,
    )
}

/// `/metrics/cadvisor`: read from the files now, off the loop.
async fn cadvisor_metrics(ctx: &Deps) -> Response<Body> {
    let (layout, cgroups) = (ctx.layout.clone(), ctx.cgroups.clone());
    let text = crate::helpers::unblock(move || {
        use crate::cgroup::settings::{self, Settings};
        use crate::stats::{cadvisor, net};
        use std::collections::HashMap;
        let snapshot = crate::stats::collect(&layout, &cgroups);
        let runtime_root = layout.runtime_root();
        let settings: HashMap<String, Settings> = snapshot
            .pods
            .iter()
            .flat_map(|p| std::iter::once(&p.cgroup).chain(p.containers.iter().map(|c| &c.cgroup)))
            .filter_map(|path| Some((path.clone(), settings::read(cgroups.version, path)?)))
            .collect();
        let devices: std::collections::BTreeSet<&String> = settings
            .values()
            .flat_map(|s| &s.io)
            .map(|io| &io.device)
            .collect();
        let device_names = devices
            .into_iter()
            .map(|device| (device.clone(), settings::device_name(device)))
            .collect();
        let extras = cadvisor::Extras {
            cpus: crate::cgroup::cpu_capacity(),
            memory_bytes: crate::cgroup::memory_capacity(),
            node_network: net::node_interfaces().unwrap_or_default(),
            pod_networks: snapshot
                .pods
                .iter()
                .filter_map(|p| Some((p.uid.clone(), net::pod_interfaces(&runtime_root, p)?)))
                .collect(),
            settings,
            device_names,
        };
        cadvisor::metrics(&snapshot, &extras)
    })
    .await;
    full(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        text,
    )
}

/// `/stats/summary`: read from the files now, off the loop.
async fn stats_summary(ctx: &Deps, only_cpu_and_memory: bool) -> Response<Body> {
    let node = crate::stats::summary::NodeInfo {
        name: ctx.config.node_name.clone(),
        state_dir: ctx.layout.root.clone(),
        images_dir: ctx.layout.images(),
        runtime_root: ctx.layout.runtime_root(),
        pod_logs_dir: ctx.config.pod_logs_dir.clone(),
    };
    let (layout, cgroups) = (ctx.layout.clone(), ctx.cgroups.clone());
    let summary = crate::helpers::unblock(move || {
        let mut summary =
            crate::stats::summary::summary(&layout, &cgroups, &node, !only_cpu_and_memory);
        if only_cpu_and_memory {
            crate::stats::summary::only_cpu_and_memory(&mut summary);
        }
        summary
    })
    .await;
    full(StatusCode::OK, "application/json", summary.to_string())
}

/// Chunks for a streamed body, from a log reader on a blocking thread. A
/// gone client closes the channel, which ends the reader at its next write.
struct ChannelWriter {
    tx: smol::channel::Sender<Bytes>,
    left: Option<u64>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let take = match self.left {
            Some(0) => return Err(std::io::Error::other("limitBytes reached")),
            Some(left) => usize::try_from(left).map_or(buf.len(), |left| buf.len().min(left)),
            None => buf.len(),
        };
        self.tx
            .send_blocking(Bytes::copy_from_slice(&buf[..take]))
            .map_err(|_| std::io::Error::other("client gone"))?;
        if let Some(left) = &mut self.left {
            *left -= take as u64;
        }
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.tx.is_closed() {
            return Err(std::io::Error::other("client gone"));
        }
        Ok(())
    }
}

/// A containerLogs query as upstream validates PodLogOptions: numbers that
/// do not parse or are out of range are a 400, never a wrapped value or an
/// overflow in the time arithmetic.
fn log_options(
    namespace: &str,
    pod: &str,
    container: &str,
    query: &[(String, String)],
) -> Result<(LogsArgs, Option<u64>), String> {
    let get = |k: &str| {
        query
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let flag = |k: &str| get(k).is_some_and(|v| v == "true" || v == "1");
    let number = |k: &str, min: i64| -> Result<Option<i64>, String> {
        let Some(v) = get(k) else { return Ok(None) };
        match v.parse::<i64>() {
            Ok(n) if n >= min => Ok(Some(n)),
            Ok(_) => Err(format!("{k}: must be at least {min}")),
            Err(_) => Err(format!("{k}: {v:?} is not an integer")),
        }
    };
    let since = match (number("sinceSeconds", 1)?, get("sinceTime")) {
        (Some(_), Some(_)) => {
            return Err("at most one of `sinceTime` or `sinceSeconds` may be specified".into());
        }
        // Further back than time goes: everything.
        (Some(seconds), None) => Some(
            jiff::Timestamp::now()
                .checked_sub(jiff::SignedDuration::from_secs(seconds))
                .unwrap_or(jiff::Timestamp::MIN),
        ),
        (None, Some(t)) => match t.parse::<jiff::Timestamp>() {
            Ok(t) => Some(t),
            Err(_) => return Err("sinceTime: not an RFC 3339 time".into()),
        },
        (None, None) => None,
    };
    let stream = match get("stream") {
        None | Some("All") => None,
        Some("Stdout") => Some("stdout"),
        Some("Stderr") => Some("stderr"),
        Some(other) => {
            return Err(format!(
                "stream: Unsupported value: {other:?}: supported values: \"All\", \"Stderr\", \"Stdout\""
            ));
        }
    };
    let tail = number("tailLines", 0)?.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let limit_bytes = number("limitBytes", 1)?.map(|n| n.unsigned_abs());
    let args = LogsArgs {
        target: format!("{namespace}/{pod}"),
        container: Some(container.to_owned()),
        follow: flag("follow"),
        tail,
        previous: flag("previous"),
        timestamps: flag("timestamps"),
        since,
        stream,
        // Unlike upstream's, which ends with the container instance,
        // nanolet's `logs -f` goes on into the next one after a restart.
        instance_only: false,
    };
    Ok((args, limit_bytes))
}

async fn container_logs(
    ctx: &Deps,
    namespace: &str,
    pod: &str,
    container: &str,
    query: &[(String, String)],
) -> Response<Body> {
    let (args, limit_bytes) = match log_options(namespace, pod, container, query) {
        Ok(parsed) => parsed,
        Err(message) => return text(StatusCode::BAD_REQUEST, &message),
    };
    match read_log(ctx.layout.root.clone(), args, limit_bytes).await {
        Ok(rx) => {
            let body = StreamBody::new(rx.map(|b| Ok::<_, BodyError>(Frame::data(b))));
            let mut response = Response::new(BodyExt::boxed_unsync(body));
            if let Ok(v) = "text/plain".parse() {
                response.headers_mut().insert(http::header::CONTENT_TYPE, v);
            }
            response
        }
        Err(CliError::NotFound(message)) => text(StatusCode::NOT_FOUND, &message),
        Err(CliError::WaitingToStart(message)) => text(StatusCode::BAD_REQUEST, &message),
        Err(CliError::Busy(message)) => text(StatusCode::SERVICE_UNAVAILABLE, &message),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Log readers at a time: each holds a thread while it follows.
const MAX_LOG_READERS: usize = 32;

static LOG_READERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of the [`MAX_LOG_READERS`], given back when its thread ends.
struct LogReader;

impl LogReader {
    fn take() -> Option<LogReader> {
        use std::sync::atomic::Ordering;
        LOG_READERS
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_LOG_READERS).then_some(n + 1)
            })
            .ok()
            .map(|_| LogReader)
    }
}

impl Drop for LogReader {
    fn drop(&mut self) {
        LOG_READERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A container's log as text, read (and followed) on a thread of its own,
/// which ends when the log does or the receiver is dropped (at its next
/// write). Fails if the pod or container is unknown.
async fn read_log(
    state_dir: PathBuf,
    args: LogsArgs,
    limit_bytes: Option<u64>,
) -> Result<smol::channel::Receiver<Bytes>, CliError> {
    let reader = LogReader::take().ok_or_else(|| {
        CliError::Busy(format!(
            "{MAX_LOG_READERS} log streams are open on this node: try again later"
        ))
    })?;
    let (tx, rx) = smol::channel::bounded::<Bytes>(16);
    let (found_tx, found_rx) = smol::channel::bounded::<Result<(), CliError>>(1);
    std::thread::Builder::new()
        .name("nanolet-logs".into())
        .spawn(move || {
            let _reader = reader;
            let found = crate::cli::logs::check(&state_dir, &args);
            let ok = found.is_ok();
            let _ = found_tx.send_blocking(found);
            if ok {
                let mut out = ChannelWriter {
                    tx,
                    left: limit_bytes,
                };
                if let Err(e) = crate::cli::logs::run(&state_dir, &args, &mut out) {
                    log::debug!("log stream ended: {e}");
                }
            }
        })
        .map_err(|e| CliError::Io {
            path: "log reader thread".into(),
            source: e,
        })?;
    found_rx.recv().await.map_err(|_| CliError::Io {
        path: "log reader thread".into(),
        source: std::io::Error::other("it ended early"),
    })??;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(query: &str) -> Result<(LogsArgs, Option<u64>), String> {
        let pairs: Vec<(String, String)> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        log_options("ns", "p", "c", &pairs)
    }

    #[test]
    fn log_parameters_at_their_limits_are_answered_not_overflowed() {
        // Further back than jiff's range: every line, no panic.
        for seconds in ["999999999999", &i64::MAX.to_string()] {
            let (args, _) = parse(&format!("sinceSeconds={seconds}")).unwrap();
            assert_eq!(args.since, Some(jiff::Timestamp::MIN));
        }
        let (args, limit) = parse("tailLines=9223372036854775807&limitBytes=4294967296").unwrap();
        assert_eq!(
            args.tail,
            Some(usize::try_from(i64::MAX).unwrap_or(usize::MAX))
        );
        assert_eq!(limit, Some(1 << 32));
        for bad in [
            "sinceSeconds=0",
            "sinceSeconds=-5",
            "sinceSeconds=18446744073709551615",
            "tailLines=-1",
            "limitBytes=0",
            "limitBytes=x",
            "sinceSeconds=5&sinceTime=2025-01-01T00:00:00Z",
            "sinceTime=yesterday",
            "stream=Both",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_byte_limit_past_usize_still_passes_bytes_through() {
        let (tx, rx) = smol::channel::bounded(1);
        let mut out = ChannelWriter {
            tx,
            left: Some(u64::MAX),
        };
        assert_eq!(out.write(b"abc").unwrap(), 3);
        assert_eq!(&rx.try_recv().unwrap()[..], b"abc");
    }
}
