//! The client half of gRPC's health checking protocol
//! (`grpc.health.v1.Health/Check`), as upstream's gRPC probe speaks it:
//! cleartext HTTP/2 with prior knowledge, one unary call, SERVING is
//! success. hyper does the HTTP/2; the few bytes of protobuf are written
//! and read here rather than pulling in a gRPC stack.

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncWrite};
use http_body_util::{BodyExt, Full, Limited};

use crate::http::io::HyperIo;
use crate::protobuf_wire::{self, Value};

const PATH: &str = "/grpc.health.v1.Health/Check";

/// A health answer is a few bytes; anything much larger is not one.
const MAX_RESPONSE: usize = 64 * 1024;

/// gRPC status codes the outcome depends on.
const GRPC_OK: u32 = 0;
const GRPC_UNIMPLEMENTED: u32 = 12;

/// Checks `service` ("" for the server as a whole) over a connected
/// stream; `Err` carries upstream's wording of the failure.
pub async fn check<S>(stream: S, authority: &str, service: &str) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let rpc_failed = |e: &dyn std::fmt::Display| format!("error: health rpc probe failed: {e}");
    let (mut sender, connection) =
        hyper::client::conn::http2::Builder::new(crate::rt::LoopExecutor)
            .handshake::<_, Full<Bytes>>(HyperIo(stream))
            .await
            .map_err(|e| format!("error: failed to connect service at {authority:?}: {e}"))?;
    // Ends (closing the socket) once the sender is dropped with the check's
    // end, or at once if the check is abandoned at its timeout.
    let _connection = crate::rt::spawn(connection);
    let request = http::Request::post(format!("http://{authority}{PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, super::prober::USER_AGENT)
        .body(Full::new(Bytes::from(request_message(service))))
        .map_err(|e| rpc_failed(&e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| rpc_failed(&e))?;
    if response.status() != http::StatusCode::OK {
        return Err(rpc_failed(&format!("HTTP status {}", response.status())));
    }
    let headers = response.headers().clone();
    let collected = Limited::new(response.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| rpc_failed(&e))?;
    // A call that fails at once answers in the headers ("trailers-only").
    let trailers = collected.trailers().cloned().unwrap_or(headers);
    let code = trailers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .ok_or_else(|| rpc_failed(&"no grpc-status in the response"))?;
    let message = trailers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match code {
        GRPC_OK => {}
        GRPC_UNIMPLEMENTED => {
            return Err(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {message}"
            ));
        }
        _ => {
            return Err(rpc_failed(&format!(
                "rpc error: code = {code} desc = {message}"
            )));
        }
    }
    match response_status(&collected.to_bytes()) {
        Some(1) => Ok(()),
        Some(status) => Err(format!(
            "service unhealthy (responded with {:?})",
            status_name(status)
        )),
        None => Err(rpc_failed(&"malformed HealthCheckResponse")),
    }
}

/// A length-prefixed, uncompressed gRPC message holding a
/// HealthCheckRequest: field 1, the service name (left out when empty).
fn request_message(service: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !service.is_empty() {
        protobuf_wire::put_bytes(&mut message, 1, service.as_bytes());
    }
    crate::device::grpc::frame(&message).to_vec()
}

/// The status (field 1) of the one HealthCheckResponse in a gRPC body; an
/// absent field is its default, UNKNOWN.
fn response_status(body: &[u8]) -> Option<u64> {
    let mut deframer = crate::device::grpc::Deframer::default();
    deframer.push(body).ok()?;
    let message = deframer.next_message().ok()??;
    let mut fields = protobuf_wire::fields(&message);
    let mut status = 0;
    while let Some((number, value)) = fields.next_field().ok()? {
        match (number, value) {
            (1, Value::Varint(v)) => status = v,
            (1, _) => return None,
            _ => {}
        }
    }
    Some(status)
}

fn status_name(status: u64) -> &'static str {
    match status {
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_on_the_wire() {
        assert_eq!(request_message(""), [0, 0, 0, 0, 0]);
        assert_eq!(request_message("db"), [0, 0, 0, 0, 4, 0x0a, 2, b'd', b'b']);
        assert_eq!(response_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(1));
        assert_eq!(response_status(&[0, 0, 0, 0, 0]), Some(0));
        assert_eq!(response_status(&[0, 0, 0, 0, 9, 0x08]), None);
        assert_eq!(response_status(&[1, 0, 0, 0, 2, 0x08, 1]), None);
    }
}
