//! test-apiserver: a Kubernetes API server stand-in for nanolet's tests and
//! demo. `test-apiserver --listen 127.0.0.1:PORT --dir DIR` serves HTTPS,
//! writes DIR/ca.crt and DIR/admin.kubeconfig and prints `ready`;
//! `test-apiserver node-kubeconfig NAME --dir DIR` prints a node's
//! kubeconfig.

mod admin;
mod admission;
mod api;
mod authz;
mod bootstrap;
mod controllers;
mod csr;
mod defaults;
mod managed;
mod openapi;
mod patch;
mod pki;
mod protobuf;
mod proxy;
mod resources;
mod reviews;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod tokens;

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{Context, bail};
use lexopt::prelude::*;

use crate::server::{Faults, Server, User};

const USAGE: &str =
    "usage: test-apiserver --listen 127.0.0.1:PORT --dir DIR [--admin-listen 127.0.0.1:PORT]
         [--bookmark-interval SECONDS] [--history N] [--node-grace SECONDS] [--auto-approve-csrs]
         [--cluster-signing-duration SECONDS]
       test-apiserver node-kubeconfig NAME --dir DIR [--server URL]";

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == "node-kubeconfig") {
        args.remove(0);
        return node_kubeconfig(lexopt::Parser::from_args(args));
    }
    let mut parser = lexopt::Parser::from_args(args);
    let mut listen = None;
    let mut dir = None;
    let mut bookmark_interval = Duration::from_secs(60);
    let mut history = 1000;
    let mut auto_approve = false;
    let mut signing_duration: i64 = 365 * 24 * 3600;
    let mut admin_listen = None;
    let mut node_grace = Duration::from_secs(40);
    while let Some(arg) = parser.next()? {
        match arg {
            Long("listen") => listen = Some(parser.value()?.string()?),
            Long("dir") => dir = Some(PathBuf::from(parser.value()?)),
            Long("bookmark-interval") => {
                bookmark_interval = Duration::from_secs(parser.value()?.parse()?)
            }
            Long("history") => history = parser.value()?.parse()?,
            Long("auto-approve-csrs") => auto_approve = true,
            Long("cluster-signing-duration") => signing_duration = parser.value()?.parse()?,
            Long("admin-listen") => admin_listen = Some(parser.value()?.string()?),
            Long("node-grace") => node_grace = Duration::from_secs(parser.value()?.parse()?),
            Long("help") => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(other.unexpected().into()),
        }
    }
    let (Some(listen), Some(dir)) = (listen, dir) else {
        bail!("{USAGE}");
    };
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let ca = pki::Ca::load_or_create(&dir)?;
    let listener = TcpListener::bind(&listen).with_context(|| listen.clone())?;
    let address = listener.local_addr()?;
    let ip: IpAddr = address.ip();
    let serving = ca.server(&["localhost", "kubernetes", "kubernetes.default"], &[ip])?;
    let url = format!("https://{address}");
    let admin = ca.client("kubernetes-admin", &["system:masters"])?;
    std::fs::write(
        dir.join("admin.kubeconfig"),
        pki::kubeconfig(&url, &ca.cert_pem, "kubernetes-admin", &admin),
    )?;
    std::fs::write(dir.join("server"), &url)?;
    let tls = server::tls_config(&ca.cert_pem, &serving.cert_pem, &serving.key_pem)?;
    let ca_pem = ca.cert_pem.clone();
    // A bearer token for the admin, for raw HTTP clients (curl).
    let admin_token = nanolet::state::random_hex();
    std::fs::write(dir.join("admin.token"), &admin_token)?;
    let mut tokens = HashMap::new();
    tokens.insert(
        admin_token,
        (
            User {
                name: "admin-token".into(),
                groups: vec!["system:masters".into()],
            },
            None,
        ),
    );
    let signer = tokens::Signer::load_or_create(&dir)?;
    let kubelet_client = ca.client("kube-apiserver-kubelet-client", &["system:masters"])?;
    let kubelet_tls = proxy::kubelet_client(&kubelet_client.cert_pem, &kubelet_client.key_pem)?;
    let server = Rc::new(Server {
        api: api::Api::new(history, ca_pem),
        tokens: RefCell::new(tokens),
        requests: RefCell::new(Vec::new()),
        faults: Faults::default(),
        address: address.to_string(),
        bookmark_interval,
        node_grace,
        signer,
        auto_approve,
        signing: server::Signing {
            duration: std::cell::Cell::new(signing_duration),
            not_before: std::cell::Cell::new(0),
        },
        ca,
        kubelet_tls,
    });
    let admin = match admin_listen {
        Some(addr) => {
            let l = TcpListener::bind(&addr).with_context(|| addr.clone())?;
            std::fs::write(dir.join("admin"), format!("http://{}", l.local_addr()?))?;
            Some(l)
        }
        None => None,
    };
    println!("ready");
    std::io::stdout().flush()?;
    nanolet::rt::block_on(async move {
        if let Some(l) = admin {
            nanolet::rt::spawn(admin::serve(server.clone(), l)).detach();
        }
        let lifecycle = server.clone();
        nanolet::rt::spawn(async move {
            loop {
                smol::Timer::after(Duration::from_secs(1)).await;
                lifecycle.node_lifecycle();
                lifecycle.run_controllers();
            }
        })
        .detach();
        server::serve(server, listener, tls).await
    })
}

fn node_kubeconfig(mut parser: lexopt::Parser) -> anyhow::Result<()> {
    let mut name = None;
    let mut dir = None;
    let mut server_url = None;
    while let Some(arg) = parser.next()? {
        match arg {
            Value(v) if name.is_none() => name = Some(v.string()?),
            Long("dir") => dir = Some(PathBuf::from(parser.value()?)),
            Long("server") => server_url = Some(parser.value()?.string()?),
            other => return Err(other.unexpected().into()),
        }
    }
    let (Some(name), Some(dir)) = (name, dir) else {
        bail!("{USAGE}");
    };
    let ca = pki::Ca::load_or_create(&dir)?;
    let url = match server_url {
        Some(u) => u,
        None => std::fs::read_to_string(dir.join("server"))
            .context("no server URL: start the server first or pass --server")?,
    };
    let user = format!("system:node:{name}");
    let client = ca.client(&user, &["system:nodes"])?;
    print!(
        "{}",
        pki::kubeconfig(url.trim(), &ca.cert_pem, &user, &client)
    );
    Ok(())
}
