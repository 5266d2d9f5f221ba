//! `/portForward/{ns}/{pod}[/{uid}]`, as the API server forwards a port
//! forward, joining connections to localhost ports in the pod's network
//! namespace:
//! - over SPDY/3.1 (`portforward.k8s.io`, what kubectl speaks): the client
//!   opens a pair of streams per connection (error and data, with the same
//!   `port` and `requestID` headers);
//! - over WebSocket (`v4.channel.k8s.io`, `v4.base64.channel.k8s.io`, or
//!   none; what the API server passes through for other clients, such as
//!   the Python client): one connection per port in the `port` parameter,
//!   made at once, on channels 2i (data) and 2i+1 (error), each opened
//!   with the port as two little-endian bytes, as upstream's kubelet does.
//!   The WebSocket ends when all of them have.
//!
//! kubectl's SPDY-over-WebSocket tunnel is the API server's to unwrap, as
//! upstream's kubelet leaves it; offered here, it is refused and kubectl
//! falls back to plain SPDY.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt, FutureExt};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use smol::Async;
use smol::channel::{Receiver, Sender};

use super::Deps;
use super::upgrade::{self, Refused, Transport};
use super::{Body, spdy, websocket};

const SPDY_PROTOCOLS: &[&str] = &["portforward.k8s.io"];

const BINARY_CHANNELS: &str = "v4.channel.k8s.io";
const BASE64_CHANNELS: &str = "v4.base64.channel.k8s.io";
/// `""`: a client that offers no subprotocol speaks binary channels.
const WEBSOCKET_PROTOCOLS: &[&str] = &[BINARY_CHANNELS, BASE64_CHANNELS, ""];

const MAX_WEBSOCKET_PORTS: usize = 128;

/// Forwarded connections of one SPDY session waiting for their other
/// stream.
const MAX_UNMATCHED_HALVES: usize = 32;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// When one direction of a forwarded connection ends, the other gets this
/// long to finish (as containerd's port forward).
const OTHER_DIRECTION_GRACE: Duration = Duration::from_secs(1);

/// The pod a request names: its network namespace, unless it is on the
/// host's.
struct Target {
    name: String,
    uid: String,
    netns: Option<PathBuf>,
}

impl Target {
    /// A connection to `port` in the pod, or the error in upstream's words.
    async fn connect(&self, port: u16) -> Result<Async<TcpStream>, String> {
        connect(self.netns.clone(), port).await.map_err(|e| {
            format!(
                "error forwarding port {port} to pod {}, uid {}: {e}",
                self.name, self.uid
            )
        })
    }
}

async fn find_target(
    ctx: &Deps,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<Target, Refused> {
    let record = super::pod_record(ctx, namespace, pod, uid).await?;
    let pod_dir = ctx.layout.pod(&record.uid);
    // Only a hostNetwork pod is reached in the node's own namespace: a pod
    // whose sandbox is gone (completed, evicted) must not fall through to
    // the node's loopback. An unreadable checkpoint counts as a pod
    // network. mountinfo grows with the pods: read off the loop.
    let network = crate::helpers::unblock(move || {
        let host_network = crate::state::records::read_checkpoint(&pod_dir)
            .ok()
            .flatten()
            .and_then(|c| c.manifest.spec)
            .and_then(|spec| spec.host_network)
            .unwrap_or(false);
        let netns = pod_dir.join("ns").join("net");
        match host_network {
            true => Some(None),
            false => crate::mount::is_mounted(&netns).then_some(Some(netns)),
        }
    })
    .await;
    let Some(netns) = network else {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            format!("pod {pod} is not running: its network namespace is gone"),
        ));
    };
    Ok(Target {
        name: record.name,
        uid: record.uid,
        netns,
    })
}

/// The ports a WebSocket request forwards: every `port` parameter, each a
/// comma-separated list (the API server joins its `ports` so), as
/// upstream's kubelet parses them.
pub(super) fn websocket_ports(query: &[(String, String)]) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (_, list) in query.iter().filter(|(k, _)| k == "port") {
        if list.is_empty() {
            return Err("query parameter \"port\" cannot be empty".to_owned());
        }
        for text in list.split(',') {
            match text.parse::<u16>() {
                Ok(0) => return Err(format!("port {list:?} must be > 0")),
                Ok(port) => ports.push(port),
                Err(_) => return Err(format!("unable to parse {list:?} as a port")),
            }
        }
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required".to_owned());
    }
    // Two one-byte channel numbers per port.
    if ports.len() > MAX_WEBSOCKET_PORTS {
        return Err(format!("at most {MAX_WEBSOCKET_PORTS} ports"));
    }
    Ok(ports)
}

pub async fn port_forward(
    ctx: &Rc<Deps>,
    mut req: Request<Incoming>,
    (namespace, pod, uid): (&str, &str, Option<&str>),
) -> Response<Body> {
    let negotiated = match upgrade::negotiate(req.headers(), WEBSOCKET_PROTOCOLS, SPDY_PROTOCOLS) {
        Ok(n) => n,
        Err(refused) => return refused.response(),
    };
    // As upstream, the parameters are checked before the pod is looked up.
    let ports = match negotiated.transport {
        Transport::WebSocket => match websocket_ports(&super::query_pairs(&req)) {
            Ok(ports) => ports,
            Err(message) => return super::text(StatusCode::BAD_REQUEST, &message),
        },
        Transport::Spdy => Vec::new(),
    };
    let target = match find_target(ctx, namespace, pod, uid).await {
        Ok(t) => t,
        Err(refused) => return refused.response(),
    };
    let response = upgrade::switching(&negotiated);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let base64 = negotiated.protocol == BASE64_CHANNELS;
    crate::rt::spawn(async move {
        let Some(upgraded) = upgrade::take(on_upgrade).await else {
            return;
        };
        let target = Rc::new(target);
        match negotiated.transport {
            Transport::Spdy => serve_spdy(upgraded, target).await,
            Transport::WebSocket => serve_websocket(upgraded, target, ports, base64).await,
        }
    })
    .detach();
    response
}

/// The streams of one forwarded connection, as they come.
#[derive(Default)]
struct Pair {
    error: Option<spdy::Stream>,
    data: Option<spdy::Stream>,
}

async fn serve_spdy(upgraded: upgrade::Upgraded, target: Rc<Target>) {
    let (streams, writer) = spdy::serve(upgraded.io, upgraded.pending);
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    while let Ok(stream) = streams.recv().await {
        // Without a requestID (older clients), a data stream follows its
        // error stream, two ids on.
        let key = match (stream.header("requestid"), stream.header("streamtype")) {
            (Some(id), _) => id.to_owned(),
            (None, Some("data")) => stream.id.saturating_sub(2).to_string(),
            (None, _) => stream.id.to_string(),
        };
        let is_error = match stream.header("streamtype") {
            Some("error") => true,
            Some("data") => false,
            other => {
                log::debug!("port forward: invalid stream type {other:?}");
                let _ = writer.reset(stream.id).await;
                continue;
            }
        };
        // Halves whose other half never comes are held until the session
        // ends: at most so many at a time.
        if !pairs.contains_key(&key) && pairs.len() >= MAX_UNMATCHED_HALVES {
            let _ = writer.reset(stream.id).await;
            continue;
        }
        let pair = pairs.entry(key.clone()).or_default();
        let slot = if is_error {
            &mut pair.error
        } else {
            &mut pair.data
        };
        if slot.is_some() {
            let _ = writer.reset(stream.id).await;
            continue;
        }
        *slot = Some(stream);
        if pair.error.is_some() && pair.data.is_some() {
            let Some(Pair {
                error: Some(error),
                data: Some(data),
            }) = pairs.remove(&key)
            else {
                continue;
            };
            crate::rt::spawn(forward_spdy(error, data, target.clone(), writer.clone())).detach();
        }
    }
}

fn parse_port(stream: &spdy::Stream) -> Result<u16, String> {
    let text = stream
        .header("port")
        .ok_or_else(|| "\"port\" header is required".to_owned())?;
    match text.parse::<u16>() {
        Ok(0) => Err(format!("port {text:?} must be > 0")),
        Ok(port) => Ok(port),
        Err(_) => Err(format!("unable to parse {text:?} as a port")),
    }
}

async fn forward_spdy(
    error: spdy::Stream,
    data: spdy::Stream,
    target: Rc<Target>,
    writer: spdy::Writer,
) {
    let connected = match parse_port(&data) {
        Ok(port) => target.connect(port).await,
        Err(e) => Err(e),
    };
    // Both streams end, each once but for the data stream (a second FIN
    // there is ignored); the client waits for the error stream's end.
    match connected {
        Ok(tcp) => {
            let to_client = ToClient::Spdy {
                writer: writer.clone(),
                id: data.id,
            };
            join(tcp, data.data, to_client).await;
            let _ = writer.data(data.id, &[], true).await;
            let _ = writer.data(error.id, &[], true).await;
        }
        Err(message) => {
            log::debug!("port forward: {message}");
            let _ = writer.data(error.id, message.as_bytes(), true).await;
            let _ = writer.data(data.id, &[], true).await;
        }
    }
}

/// A WebSocket channel message: the channel's number as a byte, or as a
/// digit before base64 text.
fn channel_message(channel: u8, data: &[u8], base64: bool) -> Vec<u8> {
    if base64 {
        // Upstream's arithmetic: a byte, wrapping past 255.
        let mut text = vec![b'0'.wrapping_add(channel)];
        text.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(data)
                .as_bytes(),
        );
        websocket::text(&text)
    } else {
        let mut message = Vec::with_capacity(data.len() + 1);
        message.push(channel);
        message.extend_from_slice(data);
        websocket::binary(&message)
    }
}

/// A client's channel message: its channel and bytes (a binary message's
/// without a copy).
fn parse_channel_message(message: Vec<u8>, base64: bool) -> Option<(u8, Bytes)> {
    let (&first, rest) = message.split_first()?;
    if base64 {
        let data = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()?;
        Some((first.wrapping_sub(b'0'), Bytes::from(data)))
    } else {
        Some((first, Bytes::from(message).slice(1..)))
    }
}

async fn serve_websocket(
    upgraded: upgrade::Upgraded,
    target: Rc<Target>,
    ports: Vec<u16>,
    base64: bool,
) {
    let (read_half, write_half) = futures_lite::io::split(upgraded.io);
    let frames = websocket::writer(write_half);
    let mut from_client: Vec<Sender<Bytes>> = Vec::with_capacity(ports.len());
    let mut forwards = Vec::with_capacity(ports.len());
    for (index, &port) in ports.iter().enumerate() {
        let Ok(data_channel) = u8::try_from(index * 2) else {
            break;
        };
        let error_channel = data_channel + 1;
        for channel in [data_channel, error_channel] {
            let _ = frames
                .send(channel_message(channel, &port.to_le_bytes(), base64))
                .await;
        }
        let (tx, rx) = smol::channel::bounded::<Bytes>(8);
        from_client.push(tx);
        let target = target.clone();
        let frames = frames.clone();
        forwards.push(crate::rt::spawn(async move {
            match target.connect(port).await {
                Ok(tcp) => {
                    let to_client = ToClient::WebSocket {
                        frames,
                        channel: data_channel,
                        base64,
                    };
                    join(tcp, rx, to_client).await;
                }
                Err(message) => {
                    log::debug!("port forward: {message}");
                    let _ = frames
                        .send(channel_message(error_channel, message.as_bytes(), base64))
                        .await;
                }
            }
        }));
    }
    let pongs = frames.clone();
    let mut reader = websocket::Reader::new(read_half, upgraded.pending);
    // Dropped (cancelled) once the forwards are done; its end drops the
    // senders, which ends what goes to the pod.
    let _reader = crate::rt::spawn(async move {
        loop {
            let message = match reader.next_message(&pongs).await {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(e) => {
                    log::debug!("port forward: {e}");
                    break;
                }
            };
            let Some((channel, data)) = parse_channel_message(message, base64) else {
                continue;
            };
            // Data on an error channel, or on none, goes nowhere.
            if channel % 2 == 0
                && let Some(tx) = from_client.get(usize::from(channel / 2))
            {
                let _ = tx.send(data).await;
            }
        }
    });
    for forward in forwards {
        forward.await;
    }
    let _ = frames.send(websocket::close()).await;
    frames.close();
}

/// Where the pod's bytes of a forwarded connection go.
enum ToClient {
    Spdy {
        writer: spdy::Writer,
        id: u32,
    },
    WebSocket {
        frames: Sender<Vec<u8>>,
        channel: u8,
        base64: bool,
    },
}

impl ToClient {
    /// False once the client is gone.
    async fn send(&self, bytes: &[u8]) -> bool {
        match self {
            ToClient::Spdy { writer, id } => writer.data(*id, bytes, false).await.is_ok(),
            ToClient::WebSocket {
                frames,
                channel,
                base64,
            } => frames
                .send(channel_message(*channel, bytes, *base64))
                .await
                .is_ok(),
        }
    }

    /// The pod closed its side. A SPDY stream half-closes; a v4 channel
    /// cannot, and ends with the WebSocket.
    async fn end(&self) {
        if let ToClient::Spdy { writer, id } = self {
            let _ = writer.data(*id, &[], true).await;
        }
    }
}

/// Copies both ways between a connection in the pod and the client until
/// one direction ends and the other has had its grace.
async fn join(tcp: Async<TcpStream>, from_client: Receiver<Bytes>, to_client: ToClient) {
    let tcp = Rc::new(tcp);
    let to_pod = {
        let tcp = tcp.clone();
        crate::rt::spawn(async move {
            while let Ok(bytes) = from_client.recv().await {
                if (&*tcp).write_all(&bytes).await.is_err() {
                    return;
                }
            }
            // The client's half-close (or reset) reaches the pod.
            let _ = tcp.get_ref().shutdown(std::net::Shutdown::Write);
        })
    };
    let to_client = {
        let tcp = tcp.clone();
        crate::rt::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match (&*tcp).read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if !to_client.send(&buf[..n]).await {
                            return;
                        }
                    }
                }
            }
            to_client.end().await;
        })
    };
    let (mut to_pod, mut to_client) = (Some(to_pod), Some(to_client));
    let first_done = async {
        if let Some(task) = &mut to_pod {
            task.await;
        }
        true
    }
    .or(async {
        if let Some(task) = &mut to_client {
            task.await;
        }
        false
    })
    .await;
    let other = if first_done {
        to_client.take()
    } else {
        to_pod.take()
    };
    if let Some(other) = other {
        async {
            other.await;
        }
        .or(async {
            smol::Timer::after(OTHER_DIRECTION_GRACE).await;
        })
        .await;
    }
    // Whatever is left is cancelled with the tasks.
}

/// Connects to `port` on localhost in the network namespace `netns` (the
/// host's without one). setns(2) moves the calling thread: a thread of its
/// own, which ends after; the socket stays in the namespace it was made in.
async fn connect(netns: Option<PathBuf>, port: u16) -> std::io::Result<Async<TcpStream>> {
    let tcp = crate::runtime::netns::in_network(netns.as_deref(), "nanolet-portfwd", move || {
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT).or_else(|e| {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| e)
        })
    })
    .await?;
    Async::new(tcp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn websocket_ports_come_from_every_port_parameter_and_its_list() {
        assert_eq!(
            websocket_ports(&query(&[("port", "80,8080"), ("x", "1"), ("port", "9")])),
            Ok(vec![80, 8080, 9])
        );
        for (bad, why) in [
            (&[][..], "is required"),
            (&[("port", "")][..], "cannot be empty"),
            (&[("port", "0")][..], "must be > 0"),
            (&[("port", "80,http")][..], "unable to parse"),
            (&[("port", "65536")][..], "unable to parse"),
        ] {
            let err = websocket_ports(&query(bad)).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let many = vec!["1"; MAX_WEBSOCKET_PORTS + 1].join(",");
        assert!(websocket_ports(&query(&[("port", &many)])).is_err());
    }

    #[test]
    fn channel_messages_are_a_byte_or_a_digit_and_base64() {
        // Unmasked server frames: a two-byte header, then the payload.
        assert_eq!(
            channel_message(2, &8080u16.to_le_bytes(), false)[2..],
            [2, 0x90, 0x1f]
        );
        let text = channel_message(1, b"hi", true);
        assert_eq!(text[0], 0x81);
        assert_eq!(&text[2..], b"1aGk=");
        let parse = |message: &[u8], base64| parse_channel_message(message.to_vec(), base64);
        assert_eq!(parse(b"0aGk=", true), Some((0, Bytes::from_static(b"hi"))));
        assert_eq!(
            parse(b"\x02hi", false),
            Some((2, Bytes::from_static(b"hi")))
        );
        assert_eq!(parse(b"0!!", true), None);
        assert_eq!(parse(b"", false), None);
    }
}
