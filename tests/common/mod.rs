//! Test harness: a real registry on loopback, images built offline from
//! busybox, and a nanolet agent on a temp state dir. Every fixture removes
//! what it made when dropped, also when the test failed: processes, runc
//! containers, mounts, cgroups and temp dirs.

#![allow(dead_code)]

pub mod apiserver;
pub mod devices;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The OCI runtime the agents of this run use: runc, or crun with
/// `NANOLET_TEST_RUNTIME=crun` (the cgroup v2 VM runs the suite with both).
pub fn runtime() -> String {
    std::env::var("NANOLET_TEST_RUNTIME").unwrap_or_else(|_| "runc".into())
}

/// How much longer waits may take: the cgroup v2 VM emulates its CPU.
/// Polls `check` until it gives a value, or panics with the agent's log.
pub fn wait<V>(
    agent: &Agent,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<V>,
) -> V {
    let deadline = Instant::now() + timeout * time_scale();
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}\n--- agent log ---\n{}",
                agent.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn time_scale() -> u32 {
    if std::env::var_os("NANOLET_IN_VM").is_some() {
        4
    } else {
        1
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(unique(prefix));
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        for mount in mounts_under(&self.0) {
            let _ = nix_umount(&mount);
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn nix_umount(path: &Path) -> std::io::Result<()> {
    let status = Command::new("umount")
        .arg("-l")
        .arg(path)
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("umount failed"))
    }
}

/// Mount points under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A Distribution registry on a free loopback port.
pub struct Registry {
    dir: TempDir,
    pub addr: String,
    creds: Option<String>,
}

impl Registry {
    pub fn start() -> Registry {
        let dir = TempDir::new("nanolet-registry");
        let addr = run(Command::new(repo().join("scripts/registry.sh"))
            .arg("start")
            .arg(dir.path()));
        Registry {
            dir,
            addr,
            creds: None,
        }
    }

    /// A registry behind the Bearer-token flow (Docker Hub's): anonymous
    /// pulls get a pull token from its token server; pushes need `creds`.
    pub fn start_with_token_auth(creds: &str) -> Registry {
        let dir = TempDir::new("nanolet-registry");
        let addr = run(Command::new(repo().join("scripts/registry.sh"))
            .arg("start")
            .arg(dir.path())
            .args(["--token-auth", creds]));
        Registry {
            dir,
            addr,
            creds: Some(creds.to_owned()),
        }
    }

    /// Builds a busybox image with `build-image.sh` options and pushes it as
    /// `name:tag`; returns the image reference.
    pub fn push(&self, name_tag: &str, options: &[&str]) -> String {
        let work = TempDir::new("nanolet-image");
        let oci = work.path().join("oci");
        let tag = name_tag
            .rsplit_once(':')
            .map(|(_, t)| t)
            .unwrap_or("latest");
        run(Command::new(repo().join("scripts/build-image.sh"))
            .arg(&oci)
            .args(options)
            .args(["--tag", tag]));
        let mut push = Command::new(repo().join("scripts/push-image.sh"));
        if let Some(creds) = &self.creds {
            push.args(["--creds", creds]);
        }
        run(push.arg(&oci).arg(tag).arg(&self.addr).arg(name_tag));
        format!("{}/{name_tag}", self.addr)
    }

    /// The registry's own file for a blob, to corrupt it in tests.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/registry.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

/// A nanolet agent with its own state dir, manifest dir, log dir and cgroup
/// root.
pub struct Agent {
    pub dir: TempDir,
    pub manifests: PathBuf,
    pub state: PathBuf,
    pub logs: PathBuf,
    pub cgroup_root: String,
    registry: String,
    child: Option<Child>,
    extra_args: Vec<String>,
    /// The network namespace the agent runs in (the host's if `None`).
    netns: Option<PathBuf>,
    /// Passed to the agent as [`INHERITED_FD`] by [`Agent::spawn`].
    inherited: Option<std::os::fd::OwnedFd>,
    /// The agent's binary, when not the one built for these tests.
    binary: Option<PathBuf>,
}

/// Where [`Agent::inherit`]'s descriptor is in the agent.
pub const INHERITED_FD: i32 = 200;

impl Agent {
    pub fn start(registry: &Registry) -> Agent {
        Self::start_with(registry, &[])
    }

    pub fn start_with(registry: &Registry, extra_args: &[&str]) -> Agent {
        Self::start_in(registry, None, extra_args)
    }

    /// An agent inside `netns`, where its CNI plugins make their bridge.
    pub fn start_in(registry: &Registry, netns: Option<&TestNetns>, extra_args: &[&str]) -> Agent {
        let mut agent = Self::unstarted(registry, netns, extra_args);
        agent.spawn();
        agent
    }

    /// An agent whose dirs exist but which has not started: [`Agent::spawn`]
    /// starts it.
    pub fn unstarted(registry: &Registry, netns: Option<&TestNetns>, extra_args: &[&str]) -> Agent {
        let dir = TempDir::new("nanolet-agent");
        let manifests = dir.path().join("manifests");
        fs::create_dir_all(&manifests).unwrap();
        let cgroup_root = format!("/{}", unique("nanolet-test"));
        Agent {
            state: dir.path().join("state"),
            logs: dir.path().join("logs"),
            manifests,
            dir,
            cgroup_root,
            registry: registry.addr.clone(),
            child: None,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            netns: netns.map(|n| n.path.clone()),
            inherited: None,
            binary: None,
        }
    }

    /// The binary the next [`Agent::spawn`] starts: another build of the
    /// agent (an older release), or `None` for the one under test.
    pub fn set_binary(&mut self, binary: Option<PathBuf>) {
        self.binary = binary;
    }

    /// A descriptor each later [`Agent::spawn`] leaves open in the agent
    /// as [`INHERITED_FD`], as a shell or service manager may.
    pub fn inherit(&mut self, fd: std::os::fd::OwnedFd) {
        self.inherited = Some(fd);
    }

    /// The arguments the next [`Agent::spawn`] adds to the agent's own.
    pub fn set_args(&mut self, extra_args: &[&str]) {
        self.extra_args = extra_args.iter().map(|s| s.to_string()).collect();
    }

    /// An agent that joins `api` as node `node` (kubelet API on a free
    /// loopback port), besides its manifest directory.
    pub fn join(
        registry: &Registry,
        api: &apiserver::ApiServer,
        node: &str,
        extra: &[&str],
    ) -> Agent {
        let mut agent = Self::join_unstarted(registry, api, node, extra);
        agent.spawn();
        agent
    }

    /// [`Agent::join`] but not started: [`Agent::spawn`] starts it.
    pub fn join_unstarted(
        registry: &Registry,
        api: &apiserver::ApiServer,
        node: &str,
        extra: &[&str],
    ) -> Agent {
        let kubeconfig = api.dir.join(format!("{node}.kubeconfig"));
        let text = run(Command::new(apiserver::binary())
            .args(["node-kubeconfig", node, "--dir"])
            .arg(&api.dir));
        fs::write(&kubeconfig, text + "\n").unwrap();
        let mut args = vec!["--kubeconfig".to_owned(), kubeconfig.display().to_string()];
        args.extend(node_args(api, node));
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::unstarted(registry, None, &args)
    }

    pub fn spawn(&mut self) {
        assert!(self.child.is_none());
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("agent.log"))
            .unwrap();
        let binary = self
            .binary
            .clone()
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nanolet")));
        let mut command = match &self.netns {
            // nsenter execs the agent: the child's pid is the agent's.
            Some(netns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", netns.display())).arg(&binary);
                c
            }
            None => Command::new(&binary),
        };
        if let Some(fd) = &self.inherited {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let raw = fd.as_raw_fd();
            // Safety: dup2 is async-signal-safe; the new descriptor is
            // left without close-on-exec, as an inherited one would be.
            unsafe {
                command.pre_exec(move || {
                    if libc::dup2(raw, INHERITED_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        command
            .arg("run")
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--static-pod-path")
            .arg(&self.manifests)
            .arg("--pod-logs-dir")
            .arg(&self.logs)
            .arg("--cgroup-root")
            .arg(&self.cgroup_root)
            .arg("--insecure-registry")
            .arg(&self.registry)
            .arg("--runtime")
            .arg(runtime())
            // The host's CNI configuration is never the test's.
            .arg("--cni-conf-dir")
            .arg(self.dir.path().join("cni"))
            // Not upstream's 10248: agents run side by side here.
            .args(["--healthz-port", "0"]);
        // Nor are the host's device plugins; the previous release, which
        // has none, refuses the flag.
        if self.binary.is_none() {
            command
                .arg("--device-plugins-dir")
                .arg(self.device_plugins());
        }
        let child = command
            .args(&self.extra_args)
            // rustls at debug fills a log with handshakes.
            .env("RUST_LOG", "debug,rustls=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Where the agent's kubelet.sock is, and plugins' sockets go.
    pub fn device_plugins(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    /// `kill -9` of the agent alone: monitors and containers live on.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    pub fn write_manifest(&self, file: &str, text: &str) {
        // Written beside and renamed, as editors and config tools do, so the
        // agent never reads half a file.
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, self.manifests.join(file)).unwrap();
    }

    pub fn remove_manifest(&self, file: &str) {
        fs::remove_file(self.manifests.join(file)).unwrap();
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nanolet"));
        cmd.args(args).arg("--state-dir").arg(&self.state);
        run(&mut cmd)
    }

    pub fn logs(&self, pod: &str, container: Option<&str>) -> String {
        let mut args = vec!["logs", pod];
        args.extend(container);
        self.cli(&args)
    }

    /// Every pod record (status.json) in the state dir.
    pub fn records(&self) -> Vec<Value> {
        let Ok(entries) = fs::read_dir(self.state.join("pods")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| fs::read(e.path().join("status.json")).ok())
            .filter_map(|b| serde_json::from_slice(&b).ok())
            .collect()
    }

    pub fn record(&self, name: &str) -> Option<Value> {
        self.records().into_iter().find(|r| r["name"] == name)
    }

    /// The state dir of a pod, from its record.
    pub fn pod_dir(&self, record: &Value) -> PathBuf {
        self.state
            .join("pods")
            .join(record["uid"].as_str().expect("a pod uid"))
    }

    /// The runtime's ID of a container, from its status.
    pub fn container_id(&self, pod: &str, container: &str) -> String {
        let status = self.container_status(pod, container).expect("a status");
        status["containerID"]
            .as_str()
            .and_then(|id| id.split_once("://"))
            .map(|(_, id)| id.to_owned())
            .expect("a container ID")
    }

    pub fn container_status(&self, pod: &str, container: &str) -> Option<Value> {
        let record = self.record(pod)?;
        record["status"]["containerStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == container)
            .cloned()
    }

    /// Polls until `check` holds, or panics with the agent's log.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Agent) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout * time_scale();
        loop {
            if let Some(v) = check(self) {
                return v;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}\n--- pods ---\n{:#?}\n--- agent log ---\n{}",
                    self.records(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_running(&self, pod: &str) -> Value {
        self.wait_for(
            &format!("pod {pod} running"),
            Duration::from_secs(30),
            |a| {
                let r = a.record(pod)?;
                let statuses = r["status"]["containerStatuses"].as_array()?;
                let all = !statuses.is_empty()
                    && statuses.iter().all(|c| c["state"]["running"].is_object());
                all.then_some(r)
            },
        )
    }

    /// Neither a container in the agent's runtime nor a mount under its
    /// state dir is left.
    pub fn assert_no_containers_nor_mounts(&self) {
        let containers = self.runtime_containers();
        assert!(containers.is_empty(), "{containers:?}");
        let mounts = mounts_under(&self.state);
        assert!(mounts.is_empty(), "{mounts:?}");
    }

    pub fn runtime_containers(&self) -> Vec<Value> {
        let out = Command::new(runtime())
            .arg("--root")
            .arg(self.state.join("runtime"))
            .args(["list", "--format", "json"])
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    }

    /// The pid of a running container, from the runtime.
    pub fn container_pid(&self, container_id: &str) -> Option<i64> {
        self.runtime_containers()
            .into_iter()
            .find(|c| c["id"] == container_id && c["status"] == "running")
            .and_then(|c| c["pid"].as_i64())
    }

    /// cgroup directories of this agent that still exist.
    pub fn cgroup_dirs(&self, below: &str) -> Vec<PathBuf> {
        cgroup_mounts()
            .into_iter()
            .map(|m| m.join(self.cgroup_root.trim_start_matches('/')).join(below))
            .filter(|p| p.exists())
            .collect()
    }
}

fn cgroup_mounts() -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fs = right.split(' ').next()?;
            let mount_point = left.split(' ').nth(4)?;
            (fs == "cgroup" || fs == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .collect()
}

/// Kills what still runs in a cgroup tree: containers whose runtime state
/// was lost cannot be deleted through the runtime.
fn kill_cgroup_processes(dir: &Path) {
    if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.split_whitespace() {
            let _ = Command::new("kill")
                .args(["-9", pid])
                .stderr(Stdio::null())
                .status();
        }
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                kill_cgroup_processes(&e.path());
            }
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// A TCP proxy on a free loopback port to `target` (the test registry)
/// that breaks the first connection whose answer grows past `cut_after`
/// bytes, as a flaky uplink does, and counts the bytes it passes back and
/// the most connections open at once.
pub struct FlakyProxy {
    pub addr: String,
    pub answered: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub most_open: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FlakyProxy {
    pub fn start(target: &str, cut_after: u64) -> FlakyProxy {
        Self::start_with(target, cut_after, None)
    }

    /// A proxy that never breaks but passes at most `bytes_per_sec` per
    /// connection: a slow uplink.
    pub fn slow(target: &str, bytes_per_sec: u64) -> FlakyProxy {
        Self::start_with(target, u64::MAX, Some(bytes_per_sec))
    }

    fn start_with(target: &str, cut_after: u64, rate: Option<u64>) -> FlakyProxy {
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let answered = Arc::new(AtomicU64::new(0));
        let open = Arc::new(AtomicU64::new(0));
        let most_open = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let target = target.to_owned();
        let (total, stopping) = (answered.clone(), stop.clone());
        let (open_now, most) = (open.clone(), most_open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(Shutdown::Write);
                });
                let (total, cut) = (total.clone(), cut.clone());
                let now = open_now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let open_now = open_now.clone();
                std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let (mut server, mut client) = (server, client);
                    let mut buf = [0u8; 16 * 1024];
                    let mut this_one = 0u64;
                    while let Ok(n) = server.read(&mut buf) {
                        if n == 0 || client.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        this_one += n as u64;
                        total.fetch_add(n as u64, Ordering::SeqCst);
                        if this_one > cut_after && !cut.swap(true, Ordering::SeqCst) {
                            break;
                        }
                        if let Some(rate) = rate {
                            std::thread::sleep(std::time::Duration::from_secs_f64(
                                n as f64 / rate as f64,
                            ));
                        }
                    }
                    open_now.fetch_sub(1, Ordering::SeqCst);
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                });
            }
        });
        FlakyProxy {
            addr,
            answered,
            most_open,
            stop,
        }
    }
}

impl Drop for FlakyProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = std::net::TcpStream::connect(&self.addr);
    }
}

/// The token-auth registry issued a pull token for `scope` to the test's
/// user, and the password never reached the agent's log.
pub fn assert_authenticated_pull(registry: &Registry, agent: &Agent, scope: &str) {
    let requests = fs::read_to_string(registry.dir().join("token-requests.log")).unwrap();
    assert!(
        requests
            .lines()
            .any(|l| l.contains("sub=puller") && l.contains(scope)),
        "{requests}"
    );
    assert!(
        !agent.log().contains("s3cret"),
        "credentials reached the log"
    );
}

impl Agent {
    /// What a power cut does to the node: the agent, monitors and
    /// containers die; mounts (namespaces, rootfs, tmpfs volumes) and
    /// cgroups vanish. The state dir on disk stays.
    pub fn power_cut(&mut self) {
        self.kill9();
        // Monitors, then containers, then mounts and cgroups: nothing of the
        // test may outlive it, whatever state the agent left.
        if let Ok(pods) = fs::read_dir(self.state.join("pods")) {
            for pod in pods.flatten() {
                // Monitors, and the pause of pods sharing a PID namespace
                // (it lives outside the pod's cgroup).
                for pid_file in ["monitor.pid", "ns/pid.pause"] {
                    if let Ok(pid) = fs::read_to_string(pod.path().join(pid_file)) {
                        let _ = Command::new("kill").arg("-9").arg(pid.trim()).status();
                    }
                }
            }
        }
        // A monitor the launcher was forking when the agent died writes its
        // pid file late, if at all: found by its command line (its pod dir)
        // as well, twice, the second time after it has had time to name
        // itself.
        let pods_dir = format!("--pod-dir {}/", self.state.join("pods").display());
        for round in 0..2 {
            if round > 0 {
                std::thread::sleep(Duration::from_millis(300));
            }
            for pid in processes_whose_cmdline_contains(&pods_dir) {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
        for c in self.runtime_containers() {
            if let Some(id) = c["id"].as_str() {
                let _ = Command::new(runtime())
                    .arg("--root")
                    .arg(self.state.join("runtime"))
                    .args(["delete", "--force", id])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for mount in mounts_under(self.dir.path()) {
            let _ = nix_umount(&mount);
        }
        for mount in cgroup_mounts() {
            let root = mount.join(self.cgroup_root.trim_start_matches('/'));
            kill_cgroup_processes(&root);
            remove_cgroup_tree(&root);
        }
    }
}

/// Processes whose command line (its arguments joined by spaces)
/// contains `needle`.
pub fn processes_whose_cmdline_contains(needle: &str) -> Vec<u32> {
    processes_where(|raw| {
        let line: Vec<u8> = raw.iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
        String::from_utf8_lossy(&line).contains(needle)
    })
}

/// Processes whose arguments are exactly `args`.
pub fn processes_running(args: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    processes_where(|raw| raw == wanted)
}

fn processes_where(cmdline_matches: impl Fn(&[u8]) -> bool) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| cmdline_matches(&raw))
        })
        .collect()
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.power_cut();
    }
}

/// A network namespace of the test's own, bind-mounted in a temp dir with
/// its loopback up, so that CNI bridges, veths and iptables rules never
/// touch the host's network. It goes with its last process and mount.
pub struct TestNetns {
    pub path: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    _dir: TempDir,
}

impl TestNetns {
    pub fn new() -> TestNetns {
        let dir = TempDir::new("nanolet-netns");
        let path = dir.path().join("net");
        fs::File::create(&path).unwrap();
        run(Command::new("unshare")
            .arg(format!("--net={}", path.display()))
            .args(["ip", "link", "set", "lo", "up"]));
        TestNetns {
            path,
            stop: Default::default(),
            _dir: dir,
        }
    }

    /// `program` run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path.display())).arg(program);
        c
    }

    /// Makes the host's loopback `addr` (the test registry) reachable at the
    /// same address inside the namespace: a listener made in the namespace,
    /// whose connections are carried to the host's by threads of the test.
    pub fn forward(&self, addr: &str) {
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsFd;
        let netns = fs::File::open(&self.path).unwrap();
        let inner_addr = addr.to_owned();
        // A socket belongs to the namespace its thread was in when it was
        // made; only that thread enters the namespace.
        let listener = std::thread::spawn(move || {
            nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            TcpListener::bind(inner_addr).unwrap()
        })
        .join()
        .unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stop, host_addr) = (self.stop.clone(), addr.to_owned());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok((inner, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = inner.set_nonblocking(false);
                let Ok(outer) = TcpStream::connect(&host_addr) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (inner.try_clone().unwrap(), outer.try_clone().unwrap()),
                    (outer, inner),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
    }

    /// Network interfaces in the namespace.
    pub fn links(&self) -> String {
        run(self.command("ip").args(["-o", "link"]))
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The flags of an agent that is node `node` of `api`: its name and
/// address, the kubelet API on a free loopback port, the cluster's CA for
/// the API server's client certificate.
pub fn node_args(api: &apiserver::ApiServer, node: &str) -> Vec<String> {
    let port = free_port().to_string();
    let ca = api.dir.join("ca.crt").display().to_string();
    [
        "--hostname-override",
        node,
        "--node-ip",
        "127.0.0.1",
        "--address",
        "127.0.0.1",
        "--port",
        &port,
        "--client-ca-file",
        &ca,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

pub fn pod_yaml(name: &str, extra_spec: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{extra_spec}  containers:\n{containers}"
    )
}
