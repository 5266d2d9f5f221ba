//! Runs one probe once, as upstream's prober does: exec through the runtime,
//! HTTP and TCP on the loop without spawning anything. The pod's IP is the
//! target; a pod without one (loopback only, no CNI network) is probed on
//! 127.0.0.1 through a socket made inside its network namespace.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt, FutureExt};
use futures_rustls::rustls;
use smol::Async;

use crate::pod::probe::{Handler, Probe, ProbeAction, ProbeKind, Probes};
use crate::runtime::runc::{EXEC_OUTPUT, Runtime};

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Why, for the Unhealthy event.
    Failure(String),
}

/// Where the container is.
pub struct Target {
    pub container_id: String,
    pub pod_ip: Option<IpAddr>,
    /// The pod's network namespace; `None` on the host network.
    pub netns: Option<PathBuf>,
    /// Where an exec probe's pid file goes.
    pub scratch: PathBuf,
}

/// Where one container's probes stand: when each runs next, its
/// consecutive results, and what they mean for the container.
#[derive(Debug, Clone, Default)]
pub struct ProbeTracker {
    /// Startup, liveness, readiness.
    states: [KindState; 3],
    started_at: Option<Instant>,
    /// The startup probe has succeeded (or there is none).
    started: bool,
    configured: bool,
}

#[derive(Debug, Clone, Default)]
struct KindState {
    next_at: Option<Instant>,
    /// A run was launched and has not reported yet: not due again.
    in_flight: bool,
    successes: u32,
    failures: u32,
    /// The last settled result (`None`: unknown).
    result: Option<bool>,
}

const KINDS: [ProbeKind; 3] = [
    ProbeKind::Startup,
    ProbeKind::Liveness,
    ProbeKind::Readiness,
];

fn index(kind: ProbeKind) -> usize {
    match kind {
        ProbeKind::Startup => 0,
        ProbeKind::Liveness => 1,
        ProbeKind::Readiness => 2,
    }
}

/// What a probe result asks of the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Liveness or startup failed past its threshold: restart the container.
    Kill,
}

impl ProbeTracker {
    /// Probes for an instance that started at `started_at`, with upstream's
    /// initial results: readiness failure, liveness success, startup
    /// unknown (liveness and readiness wait for startup).
    pub fn start(probes: &Probes, started_at: Instant) -> ProbeTracker {
        let mut tracker = ProbeTracker {
            started_at: Some(started_at),
            started: probes.startup.is_none(),
            configured: KINDS.iter().any(|k| probes.get(*k).is_some()),
            ..Default::default()
        };
        for kind in KINDS {
            if let Some(probe) = probes.get(kind) {
                let state = &mut tracker.states[index(kind)];
                state.next_at = Some(started_at + probe.initial_delay);
                state.result = match kind {
                    ProbeKind::Startup => None,
                    ProbeKind::Liveness => Some(true),
                    ProbeKind::Readiness => Some(false),
                };
            }
        }
        tracker
    }

    /// The instance ended: nothing more to probe.
    pub fn stop(&mut self) {
        for state in &mut self.states {
            state.next_at = None;
        }
    }

    fn active(&self, kind: ProbeKind) -> bool {
        (kind == ProbeKind::Startup) != self.started
    }

    pub fn next_at(&self) -> Option<Instant> {
        KINDS
            .iter()
            .filter(|k| self.active(**k))
            .map(|k| &self.states[index(*k)])
            .filter(|s| !s.in_flight)
            .filter_map(|s| s.next_at)
            .min()
    }

    pub fn due(&self, now: Instant) -> Vec<ProbeKind> {
        KINDS
            .into_iter()
            .filter(|k| self.active(*k))
            .map(|k| (k, &self.states[index(k)]))
            .filter(|(_, s)| !s.in_flight && s.next_at.is_some_and(|t| t <= now))
            .map(|(k, _)| k)
            .collect()
    }

    /// A run of `kind` is under way; its result comes to [`Self::record`].
    pub fn launch(&mut self, kind: ProbeKind) {
        self.states[index(kind)].in_flight = true;
    }

    /// Counts one result of `kind` and schedules its next run.
    pub fn record(
        &mut self,
        kind: ProbeKind,
        probes: &Probes,
        success: bool,
        now: Instant,
    ) -> Verdict {
        let Some(probe) = probes.get(kind) else {
            return Verdict::Keep;
        };
        let state = &mut self.states[index(kind)];
        state.in_flight = false;
        if state.next_at.is_none() {
            // Stopped meanwhile (the instance ended or was killed).
            return Verdict::Keep;
        }
        state.next_at = Some(now + probe.period);
        if success {
            state.successes += 1;
            state.failures = 0;
            if state.successes >= probe.success_threshold {
                state.result = Some(true);
            }
        } else {
            state.failures += 1;
            state.successes = 0;
            if state.failures >= probe.failure_threshold {
                state.result = Some(false);
            }
        }
        match (kind, state.result) {
            (ProbeKind::Startup, Some(true)) => {
                self.started = true;
                state.next_at = None;
                // Their initial delays count from the container's start.
                let started_at = self.started_at.unwrap_or(now);
                for later in [ProbeKind::Liveness, ProbeKind::Readiness] {
                    if let Some(p) = probes.get(later) {
                        self.states[index(later)].next_at =
                            Some((started_at + p.initial_delay).max(now));
                    }
                }
                Verdict::Keep
            }
            (ProbeKind::Startup | ProbeKind::Liveness, Some(false)) => {
                self.stop();
                Verdict::Kill
            }
            _ => Verdict::Keep,
        }
    }

    /// `containerStatuses[].ready` as probes decide it; `None` when the
    /// container has no probes (then running means ready).
    pub fn ready(&self) -> Option<bool> {
        self.configured
            .then(|| self.started && self.states[index(ProbeKind::Readiness)].result != Some(false))
    }

    /// `containerStatuses[].started`; `None` without a startup probe.
    pub fn started(&self) -> Option<bool> {
        self.configured.then_some(self.started)
    }
}

/// Upstream's User-Agent, so servers can tell probes from users.
pub(super) const USER_AGENT: &str = "kube-probe/1.32";

pub async fn run(runtime: &Runtime, probe: &Probe, target: &Target) -> Outcome {
    match &probe.action {
        ProbeAction::Exec(command) => {
            let pid_file = target.scratch.clone();
            let limits = (probe.timeout, EXEC_OUTPUT);
            match runtime
                .exec(&target.container_id, command, &pid_file, limits)
                .await
            {
                Ok(Some(ended)) if ended.code == 0 => Outcome::Success,
                Ok(Some(ended)) => Outcome::Failure(match ended.text(EXEC_OUTPUT) {
                    output if output.trim().is_empty() => {
                        format!("command {command:?} exited with {}", ended.code)
                    }
                    output => output.trim_end().to_owned(),
                }),
                Ok(None) => Outcome::Failure(format!(
                    "command timed out: {command:?} timed out after {:?}",
                    probe.timeout
                )),
                Err(e) => Outcome::Failure(e.to_string()),
            }
        }
        ProbeAction::Tcp { host, port } => {
            let exchange = async {
                connect(target, host.as_deref(), *port).await?;
                Ok(())
            };
            within(probe.timeout, exchange).await
        }
        ProbeAction::Http {
            https,
            host,
            port,
            path,
            headers,
        } => {
            let exchange = async {
                let (stream, authority) = connect(target, host.as_deref(), *port).await?;
                let request = http_request(&authority, path, headers);
                let status = if *https {
                    let tls = futures_rustls::TlsConnector::from(insecure_tls());
                    // The host without port and IPv6 brackets.
                    let host = authority
                        .rsplit_once(':')
                        .map_or(authority.as_str(), |(h, _)| h)
                        .trim_start_matches('[')
                        .trim_end_matches(']');
                    let name = rustls_pki_types::ServerName::try_from(host)
                        .map(|n| n.to_owned())
                        .map_err(|e| e.to_string())?;
                    let stream = tls.connect(name, stream).await.map_err(|e| e.to_string())?;
                    status_of(stream, &request).await?
                } else {
                    status_of(stream, &request).await?
                };
                if (200..400).contains(&status) {
                    Ok(())
                } else {
                    Err(format!("HTTP probe failed with statuscode: {status}"))
                }
            };
            within(probe.timeout, exchange).await
        }
        ProbeAction::Grpc { port, service } => {
            let exchange = async {
                let (stream, authority) = connect(target, None, *port).await?;
                super::grpc_health::check(stream, &authority, service).await
            };
            within(probe.timeout, exchange).await
        }
    }
}

/// Runs a lifecycle hook to its end, for at most `limit`.
pub async fn run_hook(
    runtime: &Runtime,
    handler: &Handler,
    target: &Target,
    limit: Duration,
) -> Result<(), String> {
    let action = match handler {
        Handler::Sleep(duration) => {
            smol::Timer::after((*duration).min(limit)).await;
            return Ok(());
        }
        Handler::Action(action) => action.clone(),
    };
    let probe = Probe {
        action,
        initial_delay: Duration::ZERO,
        period: limit,
        timeout: limit,
        success_threshold: 1,
        failure_threshold: 1,
        termination_grace: None,
    };
    match run(runtime, &probe, target).await {
        Outcome::Success => Ok(()),
        Outcome::Failure(message) => Err(message),
    }
}

async fn within(
    timeout: Duration,
    exchange: impl std::future::Future<Output = Result<(), String>>,
) -> Outcome {
    let result = exchange
        .or(async {
            smol::Timer::after(timeout).await;
            Err(format!("timeout after {timeout:?}"))
        })
        .await;
    match result {
        Ok(()) => Outcome::Success,
        Err(message) => Outcome::Failure(message),
    }
}

/// Connects to the probe's host (default: the pod's IP) and port; returns
/// the stream and the `Host` header's value.
async fn connect(
    target: &Target,
    host: Option<&str>,
    port: u16,
) -> Result<(Async<TcpStream>, String), String> {
    let ip = match host {
        Some(host) => match host.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => smol::net::resolve((host, port))
                .await
                .map_err(|e| format!("{host}: {e}"))?
                .first()
                .map(|a| a.ip()),
        },
        None => target.pod_ip,
    };
    let (stream, ip) = match (ip, target.netns.as_deref()) {
        (Some(ip), _) => (
            Async::<TcpStream>::connect(SocketAddr::new(ip, port)).await,
            ip,
        ),
        // Only loopback is reachable, and only from inside.
        (None, Some(netns)) => {
            let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
            (connect_inside(netns, SocketAddr::new(ip, port)).await, ip)
        }
        (None, None) => return Err("the pod has no IP address".into()),
    };
    let stream = stream.map_err(|e| format!("dial tcp {}: {e}", SocketAddr::new(ip, port)))?;
    let authority = match host {
        // An IPv6 literal goes in brackets, as in a URL.
        Some(h) if h.contains(':') => format!("[{h}]:{port}"),
        Some(h) => format!("{h}:{port}"),
        None => SocketAddr::new(ip, port).to_string(),
    };
    Ok((stream, authority))
}

/// A socket made by a thread that entered `netns` (sockets stay in the
/// namespace they were made in; the thread then ends), connected on the loop.
async fn connect_inside(netns: &Path, addr: SocketAddr) -> std::io::Result<Async<TcpStream>> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, socket};
    let fd = crate::runtime::netns::in_network(Some(netns), "nanolet-probe", || {
        socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(std::io::Error::from)
    })
    .await?;
    match nix::sys::socket::connect(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(addr),
    ) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let stream = Async::new(TcpStream::from(fd))?;
    stream.writable().await?;
    match stream.get_ref().take_error()? {
        Some(e) => Err(e),
        None => Ok(stream),
    }
}

fn http_request(authority: &str, path: &str, headers: &[(String, String)]) -> Vec<u8> {
    let mut request = format!("GET {path} HTTP/1.1\r\n");
    let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    if !has("host") {
        request.push_str(&format!("Host: {authority}\r\n"));
    }
    if !has("user-agent") {
        request.push_str(&format!("User-Agent: {USER_AGENT}\r\n"));
    }
    if !has("accept") {
        request.push_str("Accept: */*\r\n");
    }
    for (name, value) in headers {
        // Header injection through the spec would only hurt the pod itself,
        // but a broken request must not be sent either.
        if name.contains(['\r', '\n', ':']) || value.contains(['\r', '\n']) {
            continue;
        }
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    request.into_bytes()
}

/// Sends the request and reads the status code of the response; the body
/// is never read (upstream only reports the code).
async fn status_of<S>(mut stream: S, request: &[u8]) -> Result<u16, String>
where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin,
{
    stream.write_all(request).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 || head.len() > 4096 {
            return Err("malformed HTTP response".into());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    match (words.next(), words.next().and_then(|c| c.parse().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") => Ok(code),
        _ => Err(format!(
            "malformed HTTP status line {:?}",
            line.lines().next().unwrap_or("")
        )),
    }
}

/// HTTPS probes do not verify the server's certificate, as upstream's.
fn insecure_tls() -> Arc<rustls::ClientConfig> {
    thread_local! {
        static CONFIG: Arc<rustls::ClientConfig> = {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let verifier = Arc::new(crate::http::insecure::AnyServerCert::new(provider.clone()));
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.dangerous()
                        .with_custom_certificate_verifier(verifier)
                        .with_no_client_auth()
                });
            match config {
                Ok(c) => Arc::new(c),
                // The ring provider has the default versions.
                Err(_) => unreachable!("ring supports TLS 1.2 and 1.3"),
            }
        };
    }
    CONFIG.with(Arc::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HTTP and TCP probes need no runtime; the pod is at `ip`.
    fn http_target(ip: IpAddr) -> (Runtime, Target) {
        let runtime = Runtime::new(
            crate::config::RuntimeKind::Runc,
            "runc".into(),
            "/nonexistent".into(),
        );
        let target = Target {
            container_id: "x".into(),
            pod_ip: Some(ip),
            netns: None,
            scratch: PathBuf::new(),
        };
        (runtime, target)
    }

    fn probe(action: ProbeAction) -> Probe {
        Probe {
            action,
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 3,
            termination_grace: None,
        }
    }

    #[test]
    fn startup_gates_liveness_and_readiness_and_thresholds_count() {
        let tcp = ProbeAction::Tcp {
            host: None,
            port: 1,
        };
        let probes = Probes {
            startup: Some(Probe {
                failure_threshold: 2,
                ..probe(tcp.clone())
            }),
            liveness: Some(probe(tcp.clone())),
            readiness: Some(Probe {
                success_threshold: 2,
                ..probe(tcp)
            }),
        };
        let t0 = Instant::now();
        let mut tracker = ProbeTracker::start(&probes, t0);
        assert_eq!(tracker.due(t0), vec![ProbeKind::Startup]);
        // Launched: not due again, and no timer for it, until it reports.
        tracker.launch(ProbeKind::Startup);
        assert!(tracker.due(t0).is_empty());
        assert_eq!(tracker.next_at(), None);
        assert_eq!(
            (tracker.ready(), tracker.started()),
            (Some(false), Some(false))
        );
        assert_eq!(
            tracker.record(ProbeKind::Startup, &probes, false, t0),
            Verdict::Keep
        );
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(tracker.next_at(), Some(t1));
        assert_eq!(
            tracker.record(ProbeKind::Startup, &probes, true, t1),
            Verdict::Keep
        );
        assert_eq!(tracker.started(), Some(true));
        // Started, but readiness needs two successes.
        assert_eq!(
            tracker.due(t1),
            vec![ProbeKind::Liveness, ProbeKind::Readiness]
        );
        assert_eq!(tracker.ready(), Some(false));
        tracker.record(ProbeKind::Readiness, &probes, true, t1);
        assert_eq!(tracker.ready(), Some(false));
        tracker.record(
            ProbeKind::Readiness,
            &probes,
            true,
            t1 + Duration::from_secs(10),
        );
        assert_eq!(tracker.ready(), Some(true));
        // Liveness: three failures in a row kill, a success in between resets.
        let mut t = t1;
        for success in [false, false, true, false, false] {
            assert_eq!(
                tracker.record(ProbeKind::Liveness, &probes, success, t),
                Verdict::Keep
            );
            t += Duration::from_secs(10);
        }
        assert_eq!(
            tracker.record(ProbeKind::Liveness, &probes, false, t),
            Verdict::Kill
        );
        assert_eq!(tracker.next_at(), None);
    }

    #[test]
    fn startup_failures_kill_and_no_probes_means_no_opinion() {
        let probes = Probes {
            startup: Some(Probe {
                failure_threshold: 1,
                ..probe(ProbeAction::Exec(vec!["false".into()]))
            }),
            ..Default::default()
        };
        let t0 = Instant::now();
        let mut tracker = ProbeTracker::start(&probes, t0);
        assert_eq!(
            tracker.record(ProbeKind::Startup, &probes, false, t0),
            Verdict::Kill
        );
        let none = ProbeTracker::start(&Probes::default(), t0);
        assert_eq!(
            (none.ready(), none.started(), none.next_at()),
            (None, None, None)
        );
    }

    #[test]
    fn https_probe_to_an_ipv6_pod_skips_verification() {
        use rustls_pki_types::pem::PemObject;
        crate::rt::block_on(async {
            let made = rcgen::generate_simple_self_signed(vec!["elsewhere".into()]).unwrap();
            let certs = vec![made.cert.der().clone()];
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(
                made.signing_key.serialize_pem().as_bytes(),
            )
            .unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap();
            let acceptor = futures_rustls::TlsAcceptor::from(Arc::new(config));
            let listener =
                Async::<std::net::TcpListener>::bind((std::net::Ipv6Addr::LOCALHOST, 0)).unwrap();
            let addr = listener.get_ref().local_addr().unwrap();
            let server = crate::rt::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut tls = acceptor.accept(tcp).await.unwrap();
                let mut buf = [0u8; 1024];
                let n = tls.read(&mut buf).await.unwrap();
                let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await
                    .unwrap();
                tls.flush().await.unwrap();
                request
            });
            let probe = Probe {
                action: ProbeAction::Http {
                    https: true,
                    host: None,
                    port: addr.port(),
                    path: "/".into(),
                    headers: vec![],
                },
                ..probe(ProbeAction::Exec(vec![]))
            };
            let (runtime, target) = http_target(addr.ip());
            assert_eq!(run(&runtime, &probe, &target).await, Outcome::Success);
            let request = server.await;
            assert!(
                request.contains(&format!("Host: [::1]:{}\r\n", addr.port())),
                "{request}"
            );
        });
    }

    #[test]
    fn http_probe_reads_the_status_code() {
        crate::rt::block_on(async {
            let listener = Async::<std::net::TcpListener>::bind(([127, 0, 0, 1], 0)).unwrap();
            let addr = listener.get_ref().local_addr().unwrap();
            let server = crate::rt::spawn(async move {
                for code in [204, 500] {
                    let (mut s, _) = listener.accept().await.unwrap();
                    let mut buf = [0u8; 1024];
                    let n = s.read(&mut buf).await.unwrap();
                    let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                    assert!(
                        request.starts_with("GET /healthz HTTP/1.1\r\n"),
                        "{request}"
                    );
                    assert!(request.contains("User-Agent: kube-probe/1.32\r\n"));
                    assert!(request.contains("X-Probe: yes\r\n"));
                    let answer = format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n");
                    s.write_all(answer.as_bytes()).await.unwrap();
                }
            });
            let probe = Probe {
                action: ProbeAction::Http {
                    https: false,
                    host: None,
                    port: addr.port(),
                    path: "/healthz".into(),
                    headers: vec![("X-Probe".into(), "yes".into())],
                },
                timeout: Duration::from_secs(2),
                ..probe(ProbeAction::Exec(vec![]))
            };
            let (runtime, target) = http_target(addr.ip());
            assert_eq!(run(&runtime, &probe, &target).await, Outcome::Success);
            assert_eq!(
                run(&runtime, &probe, &target).await,
                Outcome::Failure("HTTP probe failed with statuscode: 500".into())
            );
            server.await;
            // A port held by a socket that does not listen: refused (a
            // port merely closed could be taken by a test running alongside).
            use nix::sys::socket::{
                AddressFamily, SockFlag, SockType, SockaddrIn, bind, getsockname, socket,
            };
            use std::os::fd::AsRawFd;
            let held = socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            bind(held.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
            let port = getsockname::<SockaddrIn>(held.as_raw_fd()).unwrap().port();
            let closed = Probe {
                action: ProbeAction::Tcp { host: None, port },
                ..probe.clone()
            };
            let refused = run(&runtime, &closed, &target).await;
            assert!(matches!(refused, Outcome::Failure(m) if m.contains("dial tcp")));
        });
    }

    /// A gRPC server of gRPC's own (Python) implementation, killed on drop.
    struct GrpcServer {
        child: std::process::Child,
        port: u16,
    }

    impl GrpcServer {
        fn start(mode: &str) -> GrpcServer {
            use std::io::BufRead;
            let script = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/grpc_health_server.py"
            );
            let mut child = std::process::Command::new("/usr/bin/python3")
                .args([script, mode])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("python3 (scripts/install-deps.sh installs python3-grpcio)");
            let mut line = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let port = line.trim().parse().expect("the server's port");
            GrpcServer { child, port }
        }
    }

    impl Drop for GrpcServer {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    #[test]
    fn grpc_probe_speaks_the_health_protocol() {
        let health = GrpcServer::start("health");
        let bare = GrpcServer::start("bare");
        crate::rt::block_on(async {
            let (runtime, target) = http_target(IpAddr::V4(Ipv4Addr::LOCALHOST));
            let grpc = |port: u16, service: &str| Probe {
                timeout: Duration::from_secs(5),
                ..probe(ProbeAction::Grpc {
                    port,
                    service: service.into(),
                })
            };
            for service in ["", "ok"] {
                assert_eq!(
                    run(&runtime, &grpc(health.port, service), &target).await,
                    Outcome::Success,
                    "service {service:?}"
                );
            }
            assert_eq!(
                run(&runtime, &grpc(health.port, "down"), &target).await,
                Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
            );
            let unknown = run(&runtime, &grpc(health.port, "other"), &target).await;
            assert!(
                matches!(&unknown, Outcome::Failure(m) if m.contains("code = 5")),
                "{unknown:?}"
            );
            let unimplemented = run(&runtime, &grpc(bare.port, ""), &target).await;
            assert!(
                matches!(&unimplemented, Outcome::Failure(m) if m.contains("does not implement the grpc health protocol")),
                "{unimplemented:?}"
            );
            // Not a gRPC server at all: an HTTP/1 one that closes at once.
            let listener = Async::<std::net::TcpListener>::bind(([127, 0, 0, 1], 0)).unwrap();
            let port = listener.get_ref().local_addr().unwrap().port();
            let server = crate::rt::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            });
            let garbage = run(&runtime, &grpc(port, ""), &target).await;
            assert!(matches!(garbage, Outcome::Failure(_)), "{garbage:?}");
            server.await;
        });
    }
}
