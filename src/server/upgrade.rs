//! Switching a kubelet API connection to a streaming protocol: picking the
//! transport (WebSocket or SPDY/3.1) and the subprotocol both sides know,
//! answering 101, and taking the connection back from hyper.

use std::net::TcpStream;

use futures_rustls::server::TlsStream;
use http::{HeaderMap, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use smol::Async;

use super::Body;

/// A request answered with an error instead of a switch.
#[derive(Debug)]
pub struct Refused {
    pub status: StatusCode,
    pub message: String,
}

impl Refused {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Refused {
            status,
            message: message.into(),
        }
    }

    pub fn response(&self) -> Response<Body> {
        super::text(self.status, &self.message)
    }
}

/// A kubelet API connection: TLS over TCP, ended when idle.
pub type ApiStream = TlsStream<super::limits::IdleTimeout<Async<TcpStream>>>;

/// The connection after the 101, and what the client sent past its
/// request.
pub struct Upgraded {
    pub io: ApiStream,
    pub pending: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    WebSocket,
    Spdy,
}

/// What the client asked to switch to, and the subprotocol chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub transport: Transport,
    pub protocol: &'static str,
    /// `Sec-WebSocket-Key`, to answer.
    key: Option<String>,
}

fn listed(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The first protocol of the client's, in its order, that we speak. A
/// client offering none gets `""` where we list it (upstream's channel
/// protocols take such a client as binary).
fn pick(offered: &[String], ours: &[&'static str]) -> Option<&'static str> {
    if offered.is_empty() && ours.contains(&"") {
        return Some("");
    }
    offered
        .iter()
        .find_map(|o| ours.iter().find(|p| **p == o.as_str()).copied())
}

/// Chooses the transport and subprotocol, or answers why not: 400 for a
/// request that is no upgrade, 403 when no protocol is shared (as
/// upstream's handshake answers).
pub fn negotiate(
    headers: &HeaderMap,
    websocket: &[&'static str],
    spdy: &[&'static str],
) -> Result<Negotiated, Refused> {
    let upgrade = listed(headers, "upgrade");
    let wants = |name: &str| upgrade.iter().any(|u| u.eq_ignore_ascii_case(name));
    let (transport, offered, ours, header) = if wants("websocket") {
        let offered = listed(headers, "sec-websocket-protocol");
        (
            Transport::WebSocket,
            offered,
            websocket,
            "Sec-WebSocket-Protocol",
        )
    } else if wants("SPDY/3.1") {
        let offered = listed(headers, "x-stream-protocol-version");
        (Transport::Spdy, offered, spdy, "X-Stream-Protocol-Version")
    } else {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "Upgrade request required",
        ));
    };
    let Some(protocol) = pick(&offered, ours) else {
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {ours:?} ({header})"
            ),
        ));
    };
    let key = headers
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if transport == Transport::WebSocket && key.is_none() {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "missing Sec-WebSocket-Key",
        ));
    }
    Ok(Negotiated {
        transport,
        protocol,
        key,
    })
}

/// The 101 for a negotiated upgrade.
pub fn switching(negotiated: &Negotiated) -> Response<Body> {
    let mut response = super::full(StatusCode::SWITCHING_PROTOCOLS, "", "");
    let headers = response.headers_mut();
    headers.remove(http::header::CONTENT_TYPE);
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = value.parse() {
            headers.insert(name, value);
        }
    };
    set("connection", "Upgrade");
    match negotiated.transport {
        Transport::WebSocket => {
            set("upgrade", "websocket");
            set(
                "sec-websocket-accept",
                &super::websocket::accept_key(negotiated.key.as_deref().unwrap_or_default()),
            );
            if !negotiated.protocol.is_empty() {
                set("sec-websocket-protocol", negotiated.protocol);
            }
        }
        Transport::Spdy => {
            set("upgrade", "SPDY/3.1");
            set("x-stream-protocol-version", negotiated.protocol);
        }
    }
    response
}

/// The connection once hyper has sent the 101.
pub async fn take(on_upgrade: OnUpgrade) -> Option<Upgraded> {
    let upgraded = match on_upgrade.await {
        Ok(u) => u,
        Err(e) => {
            log::debug!("kubelet API: upgrade: {e}");
            return None;
        }
    };
    let parts = upgraded
        .downcast::<crate::http::io::HyperIo<ApiStream>>()
        .ok()?;
    Some(Upgraded {
        io: parts.io.0,
        pending: parts.read_buf.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, v.parse().unwrap());
        }
        map
    }

    #[test]
    fn the_clients_order_decides_among_shared_protocols() {
        let ws = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
        let spdy = ["v4.channel.k8s.io"];
        let asked = headers(&[
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            (
                "sec-websocket-protocol",
                "v5.channel.k8s.io, v4.channel.k8s.io",
            ),
        ]);
        let got = negotiate(&asked, &ws, &spdy).unwrap();
        assert_eq!(
            (got.transport, got.protocol),
            (Transport::WebSocket, "v5.channel.k8s.io")
        );
        let response = switching(&got);
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(
            response.headers()["sec-websocket-accept"],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let asked = headers(&[
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v5.channel.k8s.io"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
        ]);
        let got = negotiate(&asked, &ws, &spdy).unwrap();
        assert_eq!(
            (got.transport, got.protocol),
            (Transport::Spdy, "v4.channel.k8s.io")
        );
        // A WebSocket client offering no subprotocol gets none, where the
        // endpoint takes such clients.
        let bare = headers(&[
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        let got = negotiate(&bare, &["v4.channel.k8s.io", ""], &spdy).unwrap();
        assert_eq!(got.protocol, "");
        assert!(
            !switching(&got)
                .headers()
                .contains_key("sec-websocket-protocol")
        );
        assert_eq!(
            negotiate(&bare, &ws, &spdy).unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        let none = headers(&[("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", "v1")]);
        assert_eq!(
            negotiate(&none, &ws, &spdy).unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            negotiate(&HeaderMap::new(), &ws, &spdy).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }
}
