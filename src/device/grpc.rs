//! The little of gRPC the device plugin API needs, on hyper's HTTP/2 and
//! the loop: cleartext HTTP/2 with prior knowledge over unix sockets,
//! length-prefixed messages, status in trailers (or in the headers of a
//! call that fails at once). A client (unary and server-streaming calls,
//! the agent to each plugin) and a server (unary calls, the plugins to the
//! agent's Registration service). No compression: nanolet advertises none,
//! so a peer must not send any.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::FutureExt;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};

use crate::helpers::{Plus, percent_decode};
use crate::http::io::HyperIo;

/// gRPC's default cap on a message received, which upstream keeps.
pub const MAX_MESSAGE: usize = 4 << 20;

/// What a request to the agent's server may carry: a registration is a
/// few hundred bytes.
const MAX_REQUEST: usize = 64 << 10;

/// Headers a peer may send us, in all.
const MAX_HEADERS: u32 = 16 << 10;

/// The codes nanolet sends or looks at.
pub const CODE_OK: u32 = 0;
pub const CODE_UNKNOWN: u32 = 2;
pub const CODE_INVALID_ARGUMENT: u32 = 3;
pub const CODE_UNIMPLEMENTED: u32 = 12;
pub const CODE_INTERNAL: u32 = 13;

#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("failed to dial device plugin {path}: {source}")]
    Dial {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: HTTP/2 handshake: {message}")]
    Handshake { path: PathBuf, message: String },
    /// As grpc-go words a status, which users and plugin authors know.
    #[error("rpc error: code = {} desc = {message}", code_name(*code))]
    Status { code: u32, message: String },
    #[error("rpc error: code = Unavailable desc = {0}")]
    Transport(String),
    #[error("rpc error: code = DeadlineExceeded desc = no answer within {0:?}")]
    Timeout(Duration),
    #[error("malformed gRPC response: {0}")]
    Malformed(String),
}

/// grpc-go's names of the codes, for messages.
fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("Unknown")
}

/// One message, length-prefixed and uncompressed.
pub fn frame(message: &[u8]) -> Bytes {
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

/// Messages cut out of a body's bytes, which arrive in frames of any size.
#[derive(Default)]
pub struct Deframer {
    buffer: Vec<u8>,
}

impl Deframer {
    /// Adds bytes; a message announced larger than the cap is refused
    /// before its bytes are kept.
    pub fn push(&mut self, data: &[u8]) -> Result<(), GrpcError> {
        self.buffer.extend_from_slice(data);
        if let Some(len) = self.announced()
            && len > MAX_MESSAGE
        {
            return Err(too_large(len));
        }
        if self.buffer.first().is_some_and(|&flag| flag != 0) {
            return Err(GrpcError::Malformed(
                "a compressed message, though none was asked for".into(),
            ));
        }
        Ok(())
    }

    fn announced(&self) -> Option<usize> {
        let prefix: [u8; 4] = self.buffer.get(1..5)?.try_into().ok()?;
        usize::try_from(u32::from_be_bytes(prefix)).ok()
    }

    /// The next whole message, if its bytes are all here.
    pub fn next_message(&mut self) -> Result<Option<Vec<u8>>, GrpcError> {
        let Some(len) = self.announced() else {
            return Ok(None);
        };
        // Refused by push already; checked again so that `5 + len` stays
        // within a 32-bit board's usize whatever the caller did.
        if len > MAX_MESSAGE {
            return Err(too_large(len));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        let message = self.buffer[5..5 + len].to_vec();
        self.buffer.drain(..5 + len);
        // The next message's prefix is checked as soon as it is here.
        self.push(&[])?;
        Ok(Some(message))
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

fn too_large(len: usize) -> GrpcError {
    GrpcError::Malformed(format!(
        "a message of {len} bytes, over the limit of {MAX_MESSAGE}"
    ))
}

/// The status a response (its trailers, or its headers when it has no
/// body) carries; `None` if there is none there.
fn status_in(headers: &HeaderMap) -> Option<Result<(), GrpcError>> {
    let code = headers
        .get("grpc-status")?
        .to_str()
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(CODE_UNKNOWN);
    if code == CODE_OK {
        return Some(Ok(()));
    }
    let message = headers
        .get("grpc-message")
        .map(|v| percent_decode(&String::from_utf8_lossy(v.as_bytes()), Plus::Plus))
        .unwrap_or_default();
    Some(Err(GrpcError::Status { code, message }))
}

/// gRPC's percent-encoding of grpc-message: printable ASCII but `%` as it
/// is, every other byte as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

// ---- client ----

/// An HTTP/2 connection to a plugin's socket, shared by every call to it
/// (as grpc-go's ClientConn). The connection ends with the last clone.
#[derive(Clone)]
pub struct Channel {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    _connection: Rc<smol::Task<()>>,
}

impl Channel {
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Channel, GrpcError> {
        let dial = async {
            let stream = smol::net::unix::UnixStream::connect(path)
                .await
                .map_err(|source| GrpcError::Dial {
                    path: path.to_owned(),
                    source,
                })?;
            let mut builder = hyper::client::conn::http2::Builder::new(crate::rt::LoopExecutor);
            builder.max_header_list_size(MAX_HEADERS);
            builder
                .handshake::<_, Full<Bytes>>(HyperIo(stream))
                .await
                .map_err(|e| GrpcError::Handshake {
                    path: path.to_owned(),
                    message: e.to_string(),
                })
        };
        let (sender, connection) = within(timeout, dial).await?;
        let connection = crate::rt::spawn(async move {
            let _ = connection.await;
        });
        Ok(Channel {
            sender,
            _connection: Rc::new(connection),
        })
    }

    /// Sends a call; its response once its headers are here (a status in
    /// them is the call's end, and an error here if not OK).
    async fn call(
        &self,
        method: &str,
        message: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Response<Incoming>, GrpcError> {
        // As upstream's kubelet dials plugins: the authority is "localhost".
        let mut request = Request::post(format!("http://localhost{method}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(http::header::USER_AGENT, "nanolet-grpc");
        if let Some(timeout) = timeout {
            request = request.header("grpc-timeout", format!("{}m", timeout.as_millis()));
        }
        let request = request
            .body(Full::new(frame(message)))
            .map_err(|e| GrpcError::Transport(e.to_string()))?;
        let mut sender = self.sender.clone();
        sender
            .ready()
            .await
            .map_err(|e| GrpcError::Transport(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| GrpcError::Transport(e.to_string()))?;
        if response.status() != StatusCode::OK {
            return Err(GrpcError::Transport(format!(
                "HTTP status {}",
                response.status()
            )));
        }
        let grpc = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !grpc {
            return Err(GrpcError::Malformed(
                "the response's content-type is not application/grpc".into(),
            ));
        }
        if let Some(Err(e)) = status_in(response.headers()) {
            return Err(e);
        }
        Ok(response)
    }

    /// A unary call: its one response message.
    pub async fn unary(
        &self,
        method: &str,
        message: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, GrpcError> {
        let answered = async {
            let response = self.call(method, message, Some(timeout)).await?;
            let mut messages = Messages::new(response);
            let first = messages
                .next_message()
                .await?
                .ok_or_else(|| GrpcError::Malformed("no message in the response".into()))?;
            match messages.next_message().await? {
                None => Ok(first),
                Some(_) => Err(GrpcError::Malformed(
                    "more than one message in a unary response".into(),
                )),
            }
        };
        within(timeout, answered).await
    }

    /// A server-streaming call: its messages as they come. Dropping them
    /// cancels the call.
    pub async fn server_streaming(
        &self,
        method: &str,
        message: &[u8],
        timeout: Duration,
    ) -> Result<Messages, GrpcError> {
        let response = within(timeout, self.call(method, message, None)).await?;
        Ok(Messages::new(response))
    }
}

/// A response's messages, up to its status.
pub struct Messages {
    body: Incoming,
    deframer: Deframer,
    /// Its headers held a status: the call ended with them.
    ended: bool,
}

impl Messages {
    fn new(response: Response<Incoming>) -> Messages {
        let ended = status_in(response.headers()).is_some();
        Messages {
            body: response.into_body(),
            deframer: Deframer::default(),
            ended,
        }
    }

    /// The next message; `None` once the call ended with status OK.
    pub async fn next_message(&mut self) -> Result<Option<Vec<u8>>, GrpcError> {
        loop {
            if let Some(message) = self.deframer.next_message()? {
                return Ok(Some(message));
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.deframer.push(&data)?,
                    Err(frame) => {
                        let trailers = frame.into_trailers().unwrap_or_default();
                        if !self.deframer.is_empty() {
                            return Err(GrpcError::Malformed("a message cut short".into()));
                        }
                        self.ended = true;
                        match status_in(&trailers) {
                            Some(Ok(())) => return Ok(None),
                            Some(Err(e)) => return Err(e),
                            None => {
                                return Err(GrpcError::Malformed(
                                    "no grpc-status in the trailers".into(),
                                ));
                            }
                        }
                    }
                },
                Some(Err(e)) => return Err(GrpcError::Transport(e.to_string())),
                None => {
                    return Err(GrpcError::Transport(
                        "the stream ended without a status".into(),
                    ));
                }
            }
        }
    }
}

/// `work`, or a timeout error after `timeout`.
async fn within<T>(
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, GrpcError>>,
) -> Result<T, GrpcError> {
    work.or(async {
        smol::Timer::after(timeout).await;
        Err(GrpcError::Timeout(timeout))
    })
    .await
}

// ---- server ----

/// A gRPC status a handler answers with.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub code: u32,
    pub message: String,
}

/// Answers a unary call: the method's path and the request message.
pub type Handler =
    Rc<dyn Fn(String, Vec<u8>) -> crate::rt::LocalBoxFuture<'static, Result<Vec<u8>, Status>>>;

type Body = Either<
    Full<Bytes>,
    StreamBody<futures_lite::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>,
>;

/// Serves unary gRPC calls on one accepted connection until it ends.
pub async fn serve_connection<S>(stream: S, handler: Handler)
where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(answer(request, handler).await) }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(crate::rt::LoopExecutor);
    builder
        .timer(crate::server::limits::LoopTimer)
        .max_concurrent_streams(8)
        .max_header_list_size(MAX_HEADERS);
    let _ = builder.serve_connection(HyperIo(stream), service).await;
}

async fn answer(request: Request<Incoming>, handler: Handler) -> Response<Body> {
    let grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        let response = Response::builder()
            .status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            .body(Either::Left(Full::new(Bytes::new())));
        return built(response);
    }
    if request.method() != http::Method::POST {
        return status_only(CODE_UNIMPLEMENTED, "gRPC calls are POSTs");
    }
    let method = request.uri().path().to_owned();
    let read = async {
        Limited::new(request.into_body(), MAX_REQUEST)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| e.to_string())
    }
    .or(async {
        smol::Timer::after(Duration::from_secs(10)).await;
        Err("the request's body did not come within 10s".to_owned())
    });
    let body = match read.await {
        Ok(body) => body,
        Err(e) => return status_only(CODE_INTERNAL, &e),
    };
    let mut deframer = Deframer::default();
    let message = match deframer.push(&body).and_then(|()| deframer.next_message()) {
        Ok(Some(message)) if deframer.is_empty() => message,
        Ok(_) => return status_only(CODE_INTERNAL, "not one whole request message"),
        Err(e) => return status_only(CODE_INTERNAL, &e.to_string()),
    };
    match handler(method, message).await {
        Ok(reply) => {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let frames = vec![
                Ok(Frame::data(frame(&reply))),
                Ok(Frame::trailers(trailers)),
            ];
            built(
                Response::builder()
                    .header(http::header::CONTENT_TYPE, "application/grpc")
                    .body(Either::Right(StreamBody::new(futures_lite::stream::iter(
                        frames,
                    )))),
            )
        }
        Err(status) => status_only(status.code, &status.message),
    }
}

/// A call ended in its headers ("trailers-only"), as gRPC answers errors.
fn status_only(code: u32, message: &str) -> Response<Body> {
    built(
        Response::builder()
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("grpc-status", code.to_string())
            .header("grpc-message", percent_encode(message))
            .body(Either::Left(Full::new(Bytes::new()))),
    )
}

/// Every header above is valid by construction; an empty answer if not.
fn built(response: http::Result<Response<Body>>) -> Response<Body> {
    response.unwrap_or_else(|_| Response::new(Either::Left(Full::new(Bytes::new()))))
}

/// For the fuzz target: bytes as a plugin's response body, cut into
/// frames of every size the bytes themselves pick, each message read as
/// every device plugin message; any may fail, none may panic.
pub mod fuzzing {
    pub fn body(data: &[u8]) {
        let step = usize::from(data.first().copied().unwrap_or(1)).max(1);
        let mut deframer = super::Deframer::default();
        for chunk in data.chunks(step) {
            if deframer.push(chunk).is_err() {
                return;
            }
            while let Ok(Some(message)) = deframer.next_message() {
                crate::device::api::fuzzing::message(&message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_out_of_frames_of_any_size() {
        let mut wire = frame(b"one").to_vec();
        wire.extend_from_slice(&frame(b""));
        wire.extend_from_slice(&frame(b"three"));
        for split in 1..wire.len() {
            let mut deframer = Deframer::default();
            let mut got = Vec::new();
            for chunk in wire.chunks(split) {
                assert!(deframer.push(chunk).is_ok());
                while let Ok(Some(m)) = deframer.next_message() {
                    got.push(m);
                }
            }
            assert_eq!(got, [b"one".to_vec(), vec![], b"three".to_vec()]);
            assert!(deframer.is_empty());
        }
    }

    #[test]
    fn hostile_prefixes_are_refused_before_their_bytes() {
        let mut deframer = Deframer::default();
        assert!(deframer.push(&[0, 0xff, 0xff, 0xff, 0xff]).is_err());
        let mut deframer = Deframer::default();
        assert!(deframer.push(&[1, 0, 0, 0, 1, 7]).is_err());
        // A second message's prefix, after a first one that was fine.
        let mut deframer = Deframer::default();
        let mut wire = frame(b"ok").to_vec();
        wire.extend_from_slice(&[0, 0x7f, 0xff, 0xff, 0xff]);
        assert!(deframer.push(&wire).is_ok());
        assert!(deframer.next_message().is_err());
    }

    #[test]
    fn status_messages_are_percent_encoded() {
        let text = "the ResourceName \"x\" is invalid: 100% ünicode\n";
        let encoded = percent_encode(text);
        assert!(encoded.is_ascii() && !encoded.contains('\n'));
        assert!(encoded.contains("100%25"));
        assert_eq!(percent_decode(&encoded, Plus::Plus), text);
        // A stray % is kept as it is.
        assert_eq!(percent_decode("50% off%", Plus::Plus), "50% off%");
        assert_eq!(
            GrpcError::Status {
                code: 2,
                message: "no".into()
            }
            .to_string(),
            "rpc error: code = Unknown desc = no"
        );
    }
}
