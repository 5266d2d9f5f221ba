//! `pods/log` and `nodes/proxy`: forwarded to the kubelet of the pod's node
//! at its `status.addresses` and `daemonEndpoints.kubeletEndpoint.Port`,
//! over HTTPS with the API server's own client certificate, as the real
//! server does. Like the real server without --kubelet-certificate-authority,
//! the kubelet's serving certificate is not verified.

use std::net::TcpStream;
use std::sync::Arc;

use futures_rustls::TlsConnector;
use futures_rustls::rustls::{self, ClientConfig};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use smol::Async;

use crate::status::{ApiError, ApiResult};

/// The TLS client the API server uses toward kubelets.
pub fn kubelet_client(cert_pem: &str, key_pem: &str) -> anyhow::Result<Arc<ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(nanolet::http::insecure::AnyServerCert::new(
            provider,
        )))
        .with_client_auth_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `host:port` of a node's kubelet, from its status.
pub fn kubelet_address(node: &Value) -> Option<String> {
    let addresses = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)?;
    let address = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|kind| addresses.iter().find(|a| a["type"] == *kind))
        .and_then(|a| a["address"].as_str())?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .unwrap_or(10250);
    Some(if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    })
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(502, "InternalError", message)
}

/// GETs `path_and_query` from the kubelet and streams its answer back.
/// A TLS connection to the kubelet at `address`.
async fn dial(
    tls: Arc<ClientConfig>,
    address: &str,
) -> ApiResult<futures_rustls::client::TlsStream<Async<TcpStream>>> {
    let addrs = smol::net::resolve(address)
        .await
        .map_err(|e| unavailable(format!("{address}: {e}")))?;
    let addr = addrs
        .first()
        .ok_or_else(|| unavailable(format!("{address}: no address")))?;
    let tcp = Async::<TcpStream>::connect(*addr)
        .await
        .map_err(|e| unavailable(format!("error dialing backend: dial tcp {address}: {e}")))?;
    let name = ServerName::IpAddress(addr.ip().into());
    TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| unavailable(format!("error dialing backend: tls: {e}")))
}

pub async fn forward(
    tls: Arc<ClientConfig>,
    address: &str,
    (method, path_and_query): (http::Method, &str),
    body: bytes::Bytes,
) -> ApiResult<Response<crate::server::Body>> {
    let stream = dial(tls, address).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(nanolet::http::io::HyperIo(stream))
            .await
            .map_err(|e| unavailable(e.to_string()))?;
    nanolet::rt::spawn(async move {
        let _ = connection.await;
    })
    .detach();
    let request = Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(http::header::HOST, address)
        .body(Full::new(body))
        .map_err(|e| unavailable(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let (parts, body) = response.into_parts();
    let body = body
        .map_err(|e| -> crate::server::BodyError { Box::new(e) })
        .boxed_unsync();
    Ok(Response::from_parts(parts, body))
}

/// The bytes a side sent past its HTTP head, then the rest of its stream.
async fn splice<A, B>(a: A, a_pending: bytes::Bytes, b: B, b_pending: bytes::Bytes)
where
    A: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin,
    B: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin,
{
    use futures_lite::AsyncWriteExt;
    let (mut a_read, mut a_write) = futures_lite::io::split(a);
    let (mut b_read, mut b_write) = futures_lite::io::split(b);
    let a_to_b = async {
        if b_write.write_all(&a_pending).await.is_ok() {
            let _ = futures_lite::io::copy(&mut a_read, &mut b_write).await;
        }
        let _ = b_write.close().await;
    };
    let b_to_a = async {
        if a_write.write_all(&b_pending).await.is_ok() {
            let _ = futures_lite::io::copy(&mut b_read, &mut a_write).await;
        }
        let _ = a_write.close().await;
    };
    // One side's end ends the other's copy too: each half-close arrives
    // as TLS close_notify, which the peers treat as the end.
    futures_lite::future::zip(a_to_b, b_to_a).await;
}

/// Forwards an upgrade request (exec, attach, portforward) to the
/// kubelet with its headers, as the API server's UpgradeAwareHandler does:
/// a 101 from the kubelet is passed back and the two connections are
/// joined byte for byte; an error response is passed back as it is.
pub async fn forward_upgrade(
    tls: Arc<ClientConfig>,
    address: &str,
    path_and_query: &str,
    mut req: Request<hyper::body::Incoming>,
) -> ApiResult<Response<crate::server::Body>> {
    let stream = dial(tls, address).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(nanolet::http::io::HyperIo(stream))
            .await
            .map_err(|e| unavailable(e.to_string()))?;
    nanolet::rt::spawn(async move {
        let _ = connection.with_upgrades().await;
    })
    .detach();
    let mut forwarded = Request::builder()
        .method(req.method().clone())
        .uri(path_and_query)
        .header(http::header::HOST, address);
    for (name, value) in req.headers() {
        // The caller's credentials are the API server's business; the
        // kubelet sees the API server's own certificate.
        if name != http::header::HOST && name != http::header::AUTHORIZATION {
            forwarded = forwarded.header(name, value);
        }
    }
    let forwarded = forwarded
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| unavailable(e.to_string()))?;
    let mut response = sender
        .send_request(forwarded)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body = http_body_util::Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync();
        return Ok(Response::from_parts(parts, body));
    }
    let kubelet_side = hyper::upgrade::on(&mut response);
    let client_side = hyper::upgrade::on(&mut req);
    nanolet::rt::spawn(async move {
        let (Ok(kubelet), Ok(client)) = (kubelet_side.await, client_side.await) else {
            return;
        };
        type KubeletIo =
            nanolet::http::io::HyperIo<futures_rustls::client::TlsStream<Async<TcpStream>>>;
        type ClientIo =
            nanolet::http::io::HyperIo<futures_rustls::server::TlsStream<Async<TcpStream>>>;
        let (Ok(kubelet), Ok(client)) = (
            kubelet.downcast::<KubeletIo>(),
            client.downcast::<ClientIo>(),
        ) else {
            log::warn!("upgrade: unexpected connection types");
            return;
        };
        splice(client.io.0, client.read_buf, kubelet.io.0, kubelet.read_buf).await;
    })
    .detach();
    let (parts, _) = response.into_parts();
    let body = Empty::<bytes::Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(Response::from_parts(parts, body))
}
