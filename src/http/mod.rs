//! HTTP/1.1 client on the smol loop: hyper over async-io sockets, TLS by
//! rustls (ring), a small keep-alive pool, redirects that never carry
//! credentials to another host, and timeouts by progress.

pub mod insecure;
pub mod io;
pub(crate) mod proxy;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::TcpStream;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncWrite, FutureExt};
use futures_rustls::TlsConnector;
use futures_rustls::rustls::{self, ClientConfig, RootCertStore};
use http::header::{AUTHORIZATION, HOST, LOCATION};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use smol::Async;

use self::io::{Coalesced, HyperIo};

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{url}: invalid URL")]
    InvalidUrl { url: String },
    #[error("{url}: connecting: {source}")]
    Connect { url: String, source: std::io::Error },
    #[error("{url}: TLS: {message}")]
    Tls { url: String, message: String },
    #[error("{url}: no progress for {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("{url}: {source}")]
    Protocol { url: String, source: hyper::Error },
    #[error("{url}: more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects { url: String },
    #[error("{url}: response larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("{url}: plain HTTP is not allowed for this host")]
    PlainHttpRefused { url: String },
}

impl HttpError {
    /// A failure of the link rather than of the request.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            HttpError::Connect { .. } | HttpError::Timeout { .. } | HttpError::Protocol { .. }
        )
    }
}

const MAX_REDIRECTS: usize = 5;
const IDLE_PER_HOST: usize = 4;

/// How long a connection attempt or a silent peer may take before we give
/// up: slow links still finish as long as bytes keep coming.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);

enum Stream {
    Plain(Async<TcpStream>),
    Tls(Box<futures_rustls::client::TlsStream<Async<TcpStream>>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_close(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

/// A connection's request side: HTTP/1.1 carries one request at a time;
/// HTTP/2, where the server's ALPN answer allows it, every request and
/// watch of an origin at once over one TLS connection, with its headers
/// compressed: what an idle node's uplink pays for, as client-go does it.
enum Sender {
    Http1(SendRequest<Full<Bytes>>),
    Http2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::Http1(s) => s.is_closed(),
            Sender::Http2(s) => s.is_closed(),
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            Sender::Http1(s) => s.is_ready(),
            Sender::Http2(s) => s.is_ready(),
        }
    }

    fn is_shared(&self) -> bool {
        matches!(self, Sender::Http2(_))
    }

    async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, hyper::Error> {
        match self {
            Sender::Http1(s) => s.send_request(request).await,
            Sender::Http2(s) => s.send_request(request).await,
        }
    }
}

/// A pooled connection: the generation it was made in (see
/// [`Client::forget_idle`]) and its own number.
struct Pooled {
    generation: u64,
    id: u64,
    sender: Sender,
}

impl Pooled {
    /// Another handle on an HTTP/2 connection, which many requests share.
    fn share(&self) -> Option<Pooled> {
        match &self.sender {
            Sender::Http2(s) => Some(Pooled {
                generation: self.generation,
                id: self.id,
                sender: Sender::Http2(s.clone()),
            }),
            Sender::Http1(_) => None,
        }
    }
}

/// A cheap-to-clone client; all clones share one pool.
#[derive(Clone)]
pub struct Client {
    inner: Rc<Inner>,
}

struct Inner {
    /// Where the trusted roots come from when no TLS configuration was given.
    ca_file: PathBuf,
    tls: RefCell<Option<Arc<ClientConfig>>>,
    /// Hosts (host[:port]) that may be reached over plain HTTP.
    plain_http: Vec<String>,
    /// Connections between requests (and HTTP/2 ones also while in use),
    /// each with the generation it was made in: one made before
    /// [`Client::forget_idle`] is not used again.
    idle: RefCell<HashMap<String, Vec<Pooled>>>,
    generation: Cell<u64>,
    connections: Cell<u64>,
    /// Longest wait for a connection or a response's head.
    timeout: Duration,
    proxy: proxy::ProxyConfig,
}

/// Why a handshake failed; a certificate outside its validity names this
/// node's clock, which is the likelier culprit on a board without a
/// real-time clock that has not heard from NTP yet.
fn handshake_failure(error: &std::io::Error) -> String {
    use rustls::{CertificateError, Error};
    let message = error.to_string();
    let clock = matches!(
        error.get_ref().and_then(|e| e.downcast_ref::<Error>()),
        Some(Error::InvalidCertificate(
            CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. }
                | CertificateError::Expired
                | CertificateError::ExpiredContext { .. },
        ))
    );
    if !clock {
        return message;
    }
    format!(
        "{message} (this node's clock reads {}: is it right? A board without a real-time clock keeps an old time until NTP sets it)",
        jiff::Timestamp::now()
    )
}

/// Runs a connection's I/O as a task of the loop until it closes.
fn drive(connection: impl std::future::Future<Output = Result<(), hyper::Error>> + 'static) {
    crate::rt::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("connection closed: {e}");
        }
    })
    .detach();
}

/// Scheme, host and port of a URL, as the pool keys connections.
fn origin(uri: &Uri) -> Option<(bool, String, u16)> {
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return None,
    };
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    Some((tls, host, port))
}

async fn with_timeout<T>(
    url: &Uri,
    after: Duration,
    fut: impl std::future::Future<Output = Result<T, HttpError>>,
) -> Result<T, HttpError> {
    fut.or(async {
        smol::Timer::after(after).await;
        Err(HttpError::Timeout {
            url: url.to_string(),
            after,
        })
    })
    .await
}

impl Client {
    pub fn new(ca_file: PathBuf, plain_http: Vec<String>) -> Client {
        Client {
            inner: Rc::new(Inner {
                ca_file,
                tls: RefCell::new(None),
                plain_http,
                idle: RefCell::new(HashMap::new()),
                generation: Cell::new(0),
                connections: Cell::new(0),
                timeout: STALL_TIMEOUT,
                proxy: proxy::ProxyConfig::from_env(),
            }),
        }
    }

    /// A client with a TLS configuration of the caller's (the API server's
    /// own CA and a client certificate) and its own `timeout` for
    /// connecting and for a response's head.
    pub fn with_tls(config: Arc<ClientConfig>, timeout: Duration) -> Client {
        Client {
            inner: Rc::new(Inner {
                ca_file: PathBuf::new(),
                tls: RefCell::new(Some(config)),
                plain_http: Vec::new(),
                idle: RefCell::new(HashMap::new()),
                generation: Cell::new(0),
                connections: Cell::new(0),
                timeout,
                proxy: proxy::ProxyConfig::from_env(),
            }),
        }
    }

    /// Whether `authority` (host[:port]) may be used over plain HTTP.
    pub fn allows_plain_http(&self, authority: &str) -> bool {
        self.inner.plain_http.iter().any(|h| h == authority)
    }

    /// The TLS configuration, built on first use: most pulls on a test or a
    /// local network never need the CA bundle in memory.
    fn tls_config(&self, url: &Uri) -> Result<Arc<ClientConfig>, HttpError> {
        if let Some(config) = self.inner.tls.borrow().as_ref() {
            return Ok(config.clone());
        }
        let tls_err = |message: String| HttpError::Tls {
            url: url.to_string(),
            message,
        };
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&self.inner.ca_file)
            .map_err(|e| tls_err(format!("{}: {e}", self.inner.ca_file.display())))?;
        for cert in certs.flatten() {
            // Bundles carry certificates rustls cannot parse; skip those.
            let _ = roots.add(cert);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let config = Arc::new(config);
        *self.inner.tls.borrow_mut() = Some(config.clone());
        Ok(config)
    }

    async fn connect(&self, url: &Uri) -> Result<Sender, HttpError> {
        let (tls, host, port) = origin(url).ok_or_else(|| HttpError::InvalidUrl {
            url: url.to_string(),
        })?;
        let connect_err = |source| HttpError::Connect {
            url: url.to_string(),
            source,
        };
        // Through a proxy: dial it, then ask for a tunnel to the target.
        let via = self.inner.proxy.for_target(tls, &host, port).cloned();
        let (dial_host, dial_port) = match &via {
            Some(p) => (p.host.clone(), p.port),
            None => (host.clone(), port),
        };
        let addrs = smol::net::resolve((dial_host.as_str(), dial_port))
            .await
            .map_err(connect_err)?;
        let mut last_err = std::io::Error::other("no address");
        let mut tcp = None;
        for addr in addrs {
            match with_timeout(url, self.inner.timeout, async {
                Async::<TcpStream>::connect(addr).await.map_err(connect_err)
            })
            .await
            {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(HttpError::Connect { source, .. }) => last_err = source,
                Err(e) => return Err(e),
            }
        }
        let mut tcp = tcp.ok_or_else(|| connect_err(last_err))?;
        let _ = tcp.get_ref().set_nodelay(true);
        if let Some(via) = &via {
            with_timeout(url, self.inner.timeout, async {
                proxy::connect_tunnel(&mut tcp, via, &host, port)
                    .await
                    .map_err(connect_err)
            })
            .await?;
        }
        let mut http2 = false;
        let stream = if tls {
            let config = self.tls_config(url)?;
            let name = ServerName::try_from(host.clone()).map_err(|e| HttpError::Tls {
                url: url.to_string(),
                message: e.to_string(),
            })?;
            let tls_stream = with_timeout(url, self.inner.timeout, async {
                TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| HttpError::Tls {
                        url: url.to_string(),
                        message: handshake_failure(&e),
                    })
            })
            .await?;
            http2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2");
            Stream::Tls(Box::new(tls_stream))
        } else {
            Stream::Plain(tcp)
        };
        let protocol_err = |source| HttpError::Protocol {
            url: url.to_string(),
            source,
        };
        if http2 {
            // No keep-alive pings: an idle link stays quiet, and a dead one
            // shows in a request's timeout, which drops the connection.
            let (sender, connection) =
                hyper::client::conn::http2::Builder::new(crate::rt::LoopExecutor)
                    .handshake(HyperIo(Coalesced::new(stream)))
                    .await
                    .map_err(protocol_err)?;
            drive(connection);
            return Ok(Sender::Http2(sender));
        }
        let (sender, connection) = hyper::client::conn::http1::handshake(HyperIo(stream))
            .await
            .map_err(protocol_err)?;
        drive(connection);
        Ok(Sender::Http1(sender))
    }

    /// Drops every idle connection, and those in use once their request
    /// is done: the next request makes a new one (with a new client
    /// certificate, after a rotation).
    pub fn forget_idle(&self) {
        self.inner.generation.set(self.inner.generation.get() + 1);
        self.inner.idle.borrow_mut().clear();
    }

    /// A connection to send on: an HTTP/2 one stays in the pool for the
    /// requests beside this one, an HTTP/1.1 one leaves it until its
    /// response is in.
    fn checkout(&self, key: &str) -> Option<Pooled> {
        let generation = self.inner.generation.get();
        let mut idle = self.inner.idle.borrow_mut();
        let senders = idle.get_mut(key)?;
        senders.retain(|p| p.generation == generation && !p.sender.is_closed());
        let pos = senders.iter().position(|p| p.sender.is_ready())?;
        if let Some(shared) = senders[pos].share() {
            return Some(shared);
        }
        Some(senders.swap_remove(pos))
    }

    /// Drops the connection `id` from the pool: a request on it failed.
    fn discard(&self, key: &str, id: u64) {
        if let Some(senders) = self.inner.idle.borrow_mut().get_mut(key) {
            senders.retain(|p| p.id != id);
        }
    }

    /// Sends one request and returns the response with its body unread.
    /// Refuses plain HTTP unless the host is allowed it or the caller says
    /// so (`plain_ok`).
    pub async fn request(
        &self,
        method: Method,
        url: &Uri,
        headers: &HeaderMap,
        body: Bytes,
        plain_ok: bool,
    ) -> Result<Response<Incoming>, HttpError> {
        let (tls, host, port) = origin(url).ok_or_else(|| HttpError::InvalidUrl {
            url: url.to_string(),
        })?;
        let authority = url
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        if !tls && !plain_ok && !self.allows_plain_http(&authority) {
            return Err(HttpError::PlainHttpRefused {
                url: url.to_string(),
            });
        }
        let key = format!("{tls}/{host}/{port}");
        let (mut pooled, fresh) = match self.checkout(&key) {
            Some(pooled) => (pooled, false),
            None => {
                let generation = self.inner.generation.get();
                let sender = self.connect(url).await?;
                let id = self.inner.connections.get() + 1;
                self.inner.connections.set(id);
                let pooled = Pooled {
                    generation,
                    id,
                    sender,
                };
                (pooled, true)
            }
        };
        let shared = pooled.sender.is_shared();
        if fresh
            && pooled.generation == self.inner.generation.get()
            && let Some(shared) = pooled.share()
        {
            self.inner
                .idle
                .borrow_mut()
                .entry(key.clone())
                .or_default()
                .push(shared);
        }
        // HTTP/2 takes the whole URL (its :scheme and :authority), HTTP/1.1
        // the path and a Host header.
        let target = if shared {
            url.to_string()
        } else {
            url.path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/")
                .to_owned()
        };
        let mut request = Request::builder()
            .method(method)
            .uri(target)
            .body(Full::new(body))
            .map_err(|_| HttpError::InvalidUrl {
                url: url.to_string(),
            })?;
        *request.headers_mut() = headers.clone();
        if !shared && let Ok(value) = authority.parse() {
            request.headers_mut().insert(HOST, value);
        }
        let sent = with_timeout(url, self.inner.timeout, async {
            pooled
                .sender
                .send(request)
                .await
                .map_err(|source| HttpError::Protocol {
                    url: url.to_string(),
                    source,
                })
        })
        .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => {
                // A connection that timed out or broke is not used again.
                if shared {
                    self.discard(&key, pooled.id);
                }
                return Err(e);
            }
        };
        if shared {
            return Ok(response);
        }
        // The connection is ready again once this body has been read; until
        // then `checkout` passes it over.
        let mut idle = self.inner.idle.borrow_mut();
        let senders = idle.entry(key).or_default();
        if senders.len() < IDLE_PER_HOST && pooled.generation == self.inner.generation.get() {
            senders.push(pooled);
        }
        Ok(response)
    }

    /// GET (or HEAD) following redirects. Credentials go only to the origin
    /// they were meant for: a redirect to another host drops Authorization.
    /// `plain_ok` lets every hop use plain HTTP: for a request that an
    /// exchange already running over plain HTTP asked for (a token realm of
    /// an insecure registry); an HTTPS exchange never passes it.
    pub async fn get(
        &self,
        method: Method,
        url: &Uri,
        headers: &HeaderMap,
        plain_ok: bool,
    ) -> Result<(Uri, Response<Incoming>), HttpError> {
        let mut url = url.clone();
        let mut headers = headers.clone();
        for _ in 0..=MAX_REDIRECTS {
            let response = self
                .request(method.clone(), &url, &headers, Bytes::new(), plain_ok)
                .await?;
            let redirect = matches!(
                response.status(),
                StatusCode::MOVED_PERMANENTLY
                    | StatusCode::FOUND
                    | StatusCode::SEE_OTHER
                    | StatusCode::TEMPORARY_REDIRECT
                    | StatusCode::PERMANENT_REDIRECT
            );
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_owned);
            match (redirect, location) {
                (true, Some(location)) => {
                    let next = resolve(&url, &location).ok_or_else(|| HttpError::InvalidUrl {
                        url: location.clone(),
                    })?;
                    if origin(&next) != origin(&url) {
                        headers.remove(AUTHORIZATION);
                    }
                    url = next;
                }
                _ => return Ok((url, response)),
            }
        }
        Err(HttpError::TooManyRedirects {
            url: url.to_string(),
        })
    }
}

/// Percent-encodes a query component (RFC 3986 unreserved characters stay).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Resolves a Location header against the URL it came from.
fn resolve(base: &Uri, location: &str) -> Option<Uri> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.parse().ok();
    }
    let scheme = base.scheme_str()?;
    let authority = base.authority()?.as_str();
    if let Some(rest) = location.strip_prefix("//") {
        return format!("{scheme}://{rest}").parse().ok();
    }
    let path = if location.starts_with('/') {
        location.to_owned()
    } else {
        let dir = base.path().rsplit_once('/').map_or("", |(d, _)| d);
        format!("{dir}/{location}")
    };
    format!("{scheme}://{authority}{path}").parse().ok()
}

/// Reads a whole (small) body, refusing more than `limit` bytes.
pub async fn read_body(url: &Uri, body: Incoming, limit: usize) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    let mut body = body;
    while let Some(frame) = next_chunk(url, &mut body).await? {
        if out.len() + frame.len() > limit {
            return Err(HttpError::TooLarge {
                url: url.to_string(),
                limit,
            });
        }
        out.extend_from_slice(&frame);
    }
    Ok(out)
}

/// The next chunk of a body, or `None` at its end; fails when the peer sends
/// nothing for [`STALL_TIMEOUT`].
pub async fn next_chunk(url: &Uri, body: &mut Incoming) -> Result<Option<Bytes>, HttpError> {
    next_chunk_within(url, body, STALL_TIMEOUT).await
}

/// [`next_chunk`] for bodies that may rightly stay silent longer, such as
/// a watch between events.
pub async fn next_chunk_within(
    url: &Uri,
    body: &mut Incoming,
    idle: Duration,
) -> Result<Option<Bytes>, HttpError> {
    loop {
        let frame = with_timeout(url, idle, async {
            body.frame()
                .await
                .transpose()
                .map_err(|source| HttpError::Protocol {
                    url: url.to_string(),
                    source,
                })
        })
        .await?;
        match frame {
            None => return Ok(None),
            Some(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
                // Trailers: nothing we use.
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_out_of_its_validity_names_the_clock() {
        use rustls::{CertificateError, Error};
        // As futures-rustls hands a failed handshake over.
        let failed = |e: Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        for cause in [CertificateError::NotValidYet, CertificateError::Expired] {
            let message = handshake_failure(&failed(Error::InvalidCertificate(cause)));
            assert!(message.contains("this node's clock reads"), "{message}");
        }
        let message = handshake_failure(&failed(Error::InvalidCertificate(
            CertificateError::BadSignature,
        )));
        assert!(!message.contains("clock"), "{message}");
    }

    #[test]
    fn resolves_locations() {
        let base: Uri = "http://127.0.0.1:5000/v2/a/blobs/sha256:1".parse().unwrap();
        assert_eq!(
            resolve(&base, "/x?y=1").unwrap().to_string(),
            "http://127.0.0.1:5000/x?y=1"
        );
        assert_eq!(
            resolve(&base, "https://cdn.example/b").unwrap().to_string(),
            "https://cdn.example/b"
        );
        assert_eq!(
            resolve(&base, "c").unwrap().to_string(),
            "http://127.0.0.1:5000/v2/a/blobs/c"
        );
        assert!(origin(&"ftp://x/".parse().unwrap()).is_none());
    }
}
