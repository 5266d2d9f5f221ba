//! The test API server as a fixture, shared by its own tests and
//! nanolet's cluster tests: started on free loopback ports, driven with the
//! real kubectl and curl, killed and removed when dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The first line a child prints on its piped stdout: how the servers of
/// these tests say they listen.
pub fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim().to_owned()
}

/// The test-apiserver binary: Cargo's own path in its crate's tests; next
/// to nanolet's binary elsewhere (`cargo test --workspace` builds both).
/// A self-signed EC certificate and key for `common_name`, by openssl,
/// with `extra` arguments to `openssl req`.
pub fn self_signed(
    cert: &std::path::Path,
    key: &std::path::Path,
    common_name: &str,
    extra: &[&str],
) {
    let subject = format!("/CN={common_name}");
    let fixed = [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "1",
        "-subj",
        &subject,
    ];
    let mut args: Vec<&std::ffi::OsStr> = fixed.iter().map(std::ffi::OsStr::new).collect();
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.extend([
        std::ffi::OsStr::new("-keyout"),
        key.as_os_str(),
        std::ffi::OsStr::new("-out"),
        cert.as_os_str(),
    ]);
    openssl(&args);
}

/// Runs openssl, which must succeed.
pub fn openssl(args: &[&std::ffi::OsStr]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn binary() -> PathBuf {
    if let Some(path) = option_env!("CARGO_BIN_EXE_test-apiserver") {
        return PathBuf::from(path);
    }
    let nanolet = PathBuf::from(option_env!("CARGO_BIN_EXE_nanolet").unwrap_or("nanolet"));
    let path = nanolet.with_file_name("test-apiserver");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p test-apiserver` (scripts/test.sh does)",
        path.display()
    );
    path
}

pub struct ApiServer {
    pub dir: PathBuf,
    pub url: String,
    pub admin: String,
    pub token: String,
    child: Child,
    /// Set by a test that makes a node ask for what it may not.
    node_refusals_expected: std::cell::Cell<bool>,
    /// Dropped after the server is stopped.
    _scratch: Scratch,
}

/// The server's dir, removed when dropped: after the server is stopped, and
/// also when starting it fails. (common's `TempDir` is not there when the test
/// server's own tests include this file.)
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl ApiServer {
    pub fn start() -> ApiServer {
        Self::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> ApiServer {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let scratch = Scratch(std::env::temp_dir().join(format!(
            "test-apiserver-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        )));
        std::fs::create_dir_all(&scratch.0).unwrap();
        let child = Command::new(binary())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--bookmark-interval",
                "1",
            ])
            .args(args)
            .arg("--dir")
            .arg(&scratch.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // From here on a failed start stops the server and removes its dir.
        let mut server = ApiServer {
            dir: scratch.0.clone(),
            url: String::new(),
            admin: String::new(),
            token: String::new(),
            child,
            node_refusals_expected: std::cell::Cell::new(false),
            _scratch: scratch,
        };
        assert_eq!(first_line(&mut server.child), "ready");
        let read = |f: &str| {
            std::fs::read_to_string(server.dir.join(f))
                .unwrap()
                .trim()
                .to_owned()
        };
        (server.url, server.admin, server.token) =
            (read("server"), read("admin"), read("admin.token"));
        server
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// Runs a script of the official Python client (Debian's
    /// python3-kubernetes) with this server's admin kubeconfig and `args`;
    /// what it printed, once it has succeeded.
    pub fn python_client(&self, script: &std::path::Path, args: &[&str]) -> String {
        let output = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(self.kubeconfig())
            .args(args)
            .output()
            .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{}: {stdout}\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        self.kubectl_with(&self.kubeconfig(), args, stdin)
    }

    /// kubectl as the user of another kubeconfig (a node's, say).
    pub fn kubectl_with(
        &self,
        kubeconfig: &std::path::Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> (bool, String, String) {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.unwrap_or("").as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}{out}");
        out
    }

    /// A raw request as the admin (bearer token): (status, body).
    pub fn call(&self, method: &str, path: &str, body: Option<(&str, &Value)>) -> (u16, Value) {
        self.call_as(Some(&self.token), method, path, body)
    }

    pub fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<(&str, &Value)>,
    ) -> (u16, Value) {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-w", "\n%{http_code}", "--cacert"])
            .arg(self.dir.join("ca.crt"))
            .args(["-X", method]);
        if let Some(t) = token {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        if let Some((content_type, value)) = body {
            cmd.args([
                "-H",
                &format!("Content-Type: {content_type}"),
                "--data-binary",
                &value.to_string(),
            ]);
        }
        let out = cmd.arg(format!("{}{path}", self.url)).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (
            code.parse().unwrap(),
            serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
        )
    }

    pub fn admin(&self, method: &str, path: &str) -> String {
        let out = Command::new("curl")
            .args(["-s", "-X", method, &format!("{}{path}", self.admin)])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A watch, read to its end (it must end by itself: timeoutSeconds).
    pub fn watch(&self, path: &str) -> Vec<Value> {
        let out = Command::new("curl")
            .args(["-s", "-N", "--max-time", "20", "--cacert"])
            .arg(self.dir.join("ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {}", self.token)])
            .arg(format!("{}{path}", self.url))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl ApiServer {
    /// Requests of nodes the Node authorizer or NodeRestriction refused.
    pub fn node_refusals(&self) -> Vec<Value> {
        let all: Value = serde_json::from_str(&self.admin("GET", "/requests")).unwrap_or_default();
        all.as_array()
            .into_iter()
            .flatten()
            .filter(|r| {
                r["status"] == 403
                    && r["user"]
                        .as_str()
                        .is_some_and(|u| u.starts_with("system:node:"))
            })
            .cloned()
            .collect()
    }

    /// This test makes a node ask for what it may not: the check at the
    /// end is off.
    pub fn expect_node_refusals(&self) {
        self.node_refusals_expected.set(true);
    }
}

impl Drop for ApiServer {
    /// Every test that runs an agent against this server also proves that
    /// the agent asked for nothing the real server would refuse a node.
    fn drop(&mut self) {
        let refused = if std::thread::panicking() || self.node_refusals_expected.get() {
            Vec::new()
        } else {
            self.node_refusals()
        };
        let _ = self.child.kill();
        let _ = self.child.wait();
        assert!(
            refused.is_empty(),
            "requests of a node the real server refuses: {refused:#?}"
        );
    }
}
