//! Test controls, on a plain-HTTP loopback port of their own:
//!
//! - `POST /close-watches`: ends every watch (clients must re-watch);
//! - `POST /fail?count=N&status=CODE`: the next N API requests fail with
//!   CODE (500, 429, ...), or hang like a timeout with status=0;
//! - `POST /pause`, `POST /resume`: new connections are closed and requests
//!   hang, as if the server were unreachable; `POST /pause?user=NAME` cuts
//!   off only that user (a node behind a broken link) while kubectl works;
//! - `POST /compact`: forgets the watch window (older watches get 410);
//! - `GET /requests`, `DELETE /requests`: the request record;
//! - `POST /expire-leases`: runs the node lifecycle check now;
//! - `POST /signing?duration=SECONDS&not-before=SECONDS`: certificates
//!   signed from now on last this long and are valid from this far from
//!   now (ahead: a board whose clock is behind sees them not yet valid).

use std::convert::Infallible;
use std::net::TcpListener;
use std::rc::Rc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use smol::Async;

use crate::server::{Body, Server, parse_query};

fn reply(status: StatusCode, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("Content-Type", "application/json")
        .body(crate::server::full(body))
        .unwrap_or_else(|_| Response::new(crate::server::full(Bytes::new())))
}

fn handle(server: &Server, req: &Request<Incoming>) -> Response<Body> {
    let query = parse_query(req.uri().query());
    let ok = || reply(StatusCode::OK, "{}".into());
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/close-watches") => {
            server.api.store.borrow_mut().close_watches();
            ok()
        }
        (&Method::POST, "/fail") => {
            let count = query.get("count").and_then(|c| c.parse().ok()).unwrap_or(1);
            let status = query
                .get("status")
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
            server.faults.fail_status.set(status);
            server.faults.fail_next.set(count);
            ok()
        }
        (&Method::POST, "/pause") => {
            match query.get("user") {
                Some(user) => *server.faults.cut_off.borrow_mut() = Some(user.clone()),
                None => server.faults.paused.set(true),
            }
            server.api.store.borrow_mut().close_watches();
            ok()
        }
        (&Method::POST, "/resume") => {
            server.faults.paused.set(false);
            *server.faults.cut_off.borrow_mut() = None;
            ok()
        }
        (&Method::POST, "/compact") => {
            server.api.store.borrow_mut().compact();
            ok()
        }
        (&Method::POST, "/signing") => {
            let seconds = |name: &str| query.get(name).and_then(|v| v.parse::<i64>().ok());
            if let Some(duration) = seconds("duration").filter(|d| *d > 0) {
                server.signing.duration.set(duration);
            }
            if let Some(offset) = seconds("not-before") {
                server.signing.not_before.set(offset);
            }
            ok()
        }
        (&Method::POST, "/expire-leases") => {
            server.node_lifecycle();
            ok()
        }
        (&Method::GET, "/requests") => reply(
            StatusCode::OK,
            serde_json::to_string(&*server.requests.borrow()).unwrap_or_default(),
        ),
        (&Method::DELETE, "/requests") => {
            server.requests.borrow_mut().clear();
            ok()
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "{\"error\": \"no such control\"}".into(),
        ),
    }
}

pub async fn serve(server: Rc<Server>, listener: TcpListener) -> anyhow::Result<()> {
    let listener = Async::new(listener)?;
    loop {
        let (stream, _) = listener.accept().await?;
        let server = server.clone();
        nanolet::rt::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(handle(&server, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(nanolet::http::io::HyperIo(stream), service)
                .await;
        })
        .detach();
    }
}
