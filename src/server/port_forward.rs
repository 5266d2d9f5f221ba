//! `/portForward/{ns}/{pod}[/{uid}]` over SPDY/3.1 (`portforward.k8s.io`),
//! as the API server forwards `kubectl port-forward`: the client opens a
//! pair of streams per connection (error and data, with the same `port`
//! and `requestID` headers); the data stream is joined to a connection to
//! that port on localhost in the pod's network namespace. kubectl's
//! SPDY-over-WebSocket tunnel is the API server's to unwrap, as upstream's
//! kubelet leaves it; offered here, it is refused and kubectl falls back to
//! plain SPDY.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt, FutureExt};
use http::{Request, Response};
use hyper::body::Incoming;
use smol::Async;

use super::upgrade::{self, Refused};
use super::{Body, spdy};
use crate::agent::Context;

const PROTOCOLS: &[&str] = &["portforward.k8s.io"];

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

async fn find_target(
    ctx: &Context,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<Target, Refused> {
    let record = super::pod_record(ctx, namespace, pod, uid).await?;
    let netns = ctx.layout.pod(&record.uid).join("ns").join("net");
    // mountinfo grows with the pods: read off the loop.
    let netns =
        crate::helpers::unblock(move || crate::mount::is_mounted(&netns).then_some(netns)).await;
    Ok(Target {
        name: record.name,
        uid: record.uid,
        netns,
    })
}

pub async fn port_forward(
    ctx: &Rc<Context>,
    mut req: Request<Incoming>,
    (namespace, pod, uid): (&str, &str, Option<&str>),
) -> Response<Body> {
    let target = match find_target(ctx, namespace, pod, uid).await {
        Ok(t) => t,
        Err(refused) => return refused.response(),
    };
    let negotiated = match upgrade::negotiate(req.headers(), &[], PROTOCOLS) {
        Ok(n) => n,
        Err(refused) => return refused.response(),
    };
    let response = upgrade::switching(&negotiated);
    let on_upgrade = hyper::upgrade::on(&mut req);
    crate::rt::spawn(async move {
        if let Some(upgraded) = upgrade::take(on_upgrade).await {
            serve(upgraded, Rc::new(target)).await;
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

async fn serve(upgraded: upgrade::Upgraded, target: Rc<Target>) {
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
            crate::rt::spawn(forward(error, data, target.clone(), writer.clone())).detach();
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

async fn forward(
    error: spdy::Stream,
    data: spdy::Stream,
    target: Rc<Target>,
    writer: spdy::Writer,
) {
    let connected = match parse_port(&data) {
        Ok(port) => connect(target.netns.clone(), port)
            .await
            .map(|tcp| (port, tcp))
            .map_err(|e| {
                format!(
                    "error forwarding port {port} to pod {}, uid {}: {e}",
                    target.name, target.uid
                )
            }),
        Err(e) => Err(e),
    };
    let tcp = match connected {
        Ok((_, tcp)) => Rc::new(tcp),
        Err(message) => {
            log::debug!("port forward: {message}");
            let _ = writer.data(error.id, message.as_bytes(), true).await;
            let _ = writer.data(data.id, &[], true).await;
            return;
        }
    };
    let to_pod = {
        let tcp = tcp.clone();
        let from_client = data.data;
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
        let writer = writer.clone();
        let tcp = tcp.clone();
        crate::rt::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match (&*tcp).read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if writer.data(data.id, &buf[..n], false).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = writer.data(data.id, &[], true).await;
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
    // Whatever is left is cancelled with the tasks. Both streams end; the
    // client waits for the error stream's end (a second FIN on the data
    // stream is ignored).
    let _ = writer.data(data.id, &[], true).await;
    let _ = writer.data(error.id, &[], true).await;
}

/// Connects to `port` on localhost in the network namespace `netns` (the
/// host's without one). setns(2) moves the calling thread: a thread of its
/// own, which ends after; the socket stays in the namespace it was made in.
async fn connect(netns: Option<PathBuf>, port: u16) -> std::io::Result<Async<TcpStream>> {
    let (tx, rx) = smol::channel::bounded(1);
    std::thread::Builder::new()
        .name("nanolet-portfwd".into())
        .spawn(move || {
            let connected = (|| {
                if let Some(netns) = &netns {
                    let file = std::fs::File::open(netns)?;
                    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)?;
                }
                let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT).or_else(|e| {
                    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
                    TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| e)
                })
            })();
            let _ = tx.send_blocking(connected);
        })?;
    let tcp = rx
        .recv()
        .await
        .map_err(|_| std::io::Error::other("the connecting thread died"))??;
    Async::new(tcp)
}
