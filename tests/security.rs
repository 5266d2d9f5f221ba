//! Attacks on the node's trust boundary, made the way an attacker would
//! make them: real images in the loopback registry, real pods under runc.
//! docs/security.md names the threat each test stands for.

mod common;

use std::fs;
use std::time::Duration;

use common::apiserver::ApiServer;
use common::{Agent, Registry, TempDir, pod_yaml};

const T: Duration = Duration::from_secs(30);

fn restarted(agent: &Agent, pod: &str, container: &str) -> Option<()> {
    let status = agent.container_status(pod, container)?;
    (status["restartCount"].as_u64()? >= 1).then_some(())
}

/// A container repointed its downwardAPI volume's `..data` at a host dir:
/// at its restart the agent rewrote the volume and removed the "previous"
/// data dir, which was the host's. Now the volume is read-only to the
/// plain container, and the privileged one, which remounts it writable,
/// finds that the agent never follows what it finds there.
#[test]
fn a_container_cannot_make_the_agent_delete_through_its_volume() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let agent = Agent::start(&registry);
    let victims = TempDir::new("nanolet-victim");
    let victim = |n: &str| {
        let dir = victims.path().join(n);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("keep"), "host data").unwrap();
        dir
    };
    let (plain, privileged) = (victim("plain"), victim("privileged"));
    let mounts = "    volumeMounts: [{name: info, mountPath: /info, readOnly: false}]\n";
    agent.write_manifest(
        "attack.yaml",
        &pod_yaml(
            "attack",
            "  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: info\n    downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}\n",
            &format!(
                "  - name: plain\n    image: {image}\n    command: [sh, -c, 'touch /info/x; ln -sfn {} /info/..data || echo refused; sleep 1; exit 1']\n{mounts}  - name: privileged\n    image: {image}\n    securityContext: {{privileged: true}}\n    command: [sh, -c, 'mount -o remount,bind,rw /info && ln -sfn {} /info/..data && echo planted; sleep 1; exit 1']\n{mounts}",
                plain.display(),
                privileged.display()
            ),
        ),
    );
    agent.wait_for("both containers restarted", T, |a| {
        restarted(a, "attack", "plain")?;
        restarted(a, "attack", "privileged")
    });
    let plain_log = agent.logs("default/attack", Some("plain"));
    assert!(plain_log.contains("Read-only file system"), "{plain_log}");
    // The attack itself ran: else this test could not fail.
    let privileged_log = agent.logs("default/attack", Some("privileged"));
    assert!(privileged_log.contains("planted"), "{privileged_log}");
    for dir in [&plain, &privileged] {
        assert_eq!(
            fs::read_to_string(dir.join("keep")).ok().as_deref(),
            Some("host data"),
            "{}",
            agent.log()
        );
    }
    agent.remove_manifest("attack.yaml");
    agent.wait_for("the pod gone", T, |a| {
        a.record("attack").is_none().then_some(())
    });
}

/// The message of container `c`'s CreateContainerConfigError, once it
/// has one.
fn config_error(agent: &Agent, pod: &str) -> String {
    let waiting = agent.wait_for(&format!("{pod}: a config error"), T, |a| {
        let c = a.container_status(pod, "c")?;
        let waiting = c["state"]["waiting"].clone();
        (waiting["reason"] == "CreateContainerConfigError").then_some(waiting)
    });
    waiting["message"].as_str().unwrap_or_default().to_owned()
}

/// A layer of `entries` (path, kind, link target), written with tar's own
/// builder: these shapes are legal tar.
fn layer_with(
    dir: &std::path::Path,
    name: &str,
    entries: &[(&str, tar::EntryType, &str)],
) -> String {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind, target) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_size(0);
        h.set_mode(0o644);
        if kind.is_symlink() {
            builder.append_link(&mut h, path, target).unwrap();
        } else {
            builder.append_data(&mut h, path, &b""[..]).unwrap();
        }
    }
    let path = dir.join(format!("{name}.tar"));
    fs::write(&path, builder.into_inner().unwrap()).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The agent resolved an image's user by reading its /etc/passwd with the
/// host's path resolution, on its loop: a link to /dev/zero grew it to
/// 24 GB, a FIFO stopped it. Now both are the pod's error, and the agent
/// runs the next pod.
#[test]
fn an_image_user_database_cannot_exhaust_or_stop_the_agent() {
    let registry = Registry::start();
    let work = TempDir::new("nanolet-userdb");
    let zero = layer_with(
        work.path(),
        "zero",
        &[("etc/passwd", tar::EntryType::Symlink, "/dev/zero")],
    );
    let fifo = layer_with(
        work.path(),
        "fifo",
        &[("etc/passwd", tar::EntryType::Fifo, "")],
    );
    let images = [
        (
            "zero",
            registry.push("test/zero-passwd:1", &["--layer", &zero, "--user", "app"]),
        ),
        (
            "fifo",
            registry.push("test/fifo-passwd:1", &["--layer", &fifo, "--user", "app"]),
        ),
    ];
    let agent = Agent::start(&registry);
    for (name, image) in &images {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &pod_yaml(
                name,
                "",
                &format!("  - name: c\n    image: {image}\n    command: ['true']\n"),
            ),
        );
    }
    for (name, expected) in [
        ("zero", "\"app\" not found"),
        ("fifo", "not a regular file"),
    ] {
        let message = config_error(&agent, name);
        assert!(message.contains(expected), "{name}: {message}");
    }
    let image = registry.push("test/busybox:1", &[]);
    agent.write_manifest(
        "next.yaml",
        &pod_yaml(
            "next",
            "  terminationGracePeriodSeconds: 1\n",
            &format!("  - name: c\n    image: {image}\n    command: [sleep, '3600']\n"),
        ),
    );
    agent.wait_running("next");
    // The agent's own memory stayed small (it was 24 GB).
    let pid = agent.pid().expect("the agent runs");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap();
    assert!(rss_kib < 100 << 10, "agent RSS {rss_kib} KiB");
    for name in ["zero", "fifo", "next"] {
        agent.remove_manifest(&format!("{name}.yaml"));
    }
    agent.wait_for("the pods gone", T, |a| a.records().is_empty().then_some(()));
}

/// A port-forward to a pod whose sandbox was released (it completed) fell
/// back to the node's own network namespace, and so reached anything
/// listening on the node's loopback. The Python client does not check the
/// phase as kubectl does.
#[test]
fn port_forward_never_reaches_the_nodes_loopback() {
    use std::io::Write;
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let api = ApiServer::start();
    let agent = Agent::join(&registry, &api, "sec-portforward", &[]);
    // What the forward must not reach: a server on the host's 127.0.0.1,
    // which answers and counts who came.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reached.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = conn.write_all(b"host-secret\n");
        }
    });
    api.kubectl_ok(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: done}}\nspec:\n  restartPolicy: Never\n  automountServiceAccountToken: false\n  containers:\n  - {{name: c, image: {image}, command: ['true']}}\n"
        )),
    );
    agent.wait_for("the pod completed and released", T, |a| {
        let record = a.record("done")?;
        (record["status"]["phase"] == "Succeeded"
            && a.log()
                .contains("done: finished; its sandbox and volumes are released"))
        .then_some(())
    });
    let stdout = api.python_client(
        &common::repo().join("tests/fixtures/python_port_forward_once.py"),
        &["default", "done", &port.to_string()],
    );
    let result: serde_json::Value = serde_json::from_str(&stdout).expect("its JSON");
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the forward reached the host's loopback: {result}"
    );
    let data = result["data"].as_str().unwrap_or_default();
    assert!(!data.contains("host-secret"), "{result}");
    // Refused before the upgrade: the client sees the handshake's status.
    let refused = result["refused"].as_str().unwrap_or_default();
    assert!(refused.contains("400 Bad Request"), "{result}");
}

/// CVE-2024-21626's trigger, from a pod or an image: a workingDir (or a
/// mount target) through /proc/self/fd reached the host's filesystem with
/// runc before 1.1.12. Refused whatever the runtime, as the pod's error.
#[test]
fn paths_through_proc_self_are_refused_from_pods_and_images() {
    let registry = Registry::start();
    let plain = registry.push("test/busybox:1", &[]);
    let from_image = registry.push("test/procfd-workdir:1", &["--workdir", "/proc/self/fd/7"]);
    let agent = Agent::start(&registry);
    let pods = [
        (
            "by-pod",
            plain.as_str(),
            "    workingDir: /proc/self/fd/8\n",
        ),
        ("by-image", from_image.as_str(), ""),
        (
            "by-mount",
            plain.as_str(),
            "    volumeMounts: [{name: v, mountPath: /proc/1/cwd}]\n",
        ),
    ];
    for (name, image, extra) in pods {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &pod_yaml(
                name,
                "  volumes: [{name: v, emptyDir: {}}]\n",
                &format!("  - name: c\n    image: {image}\n    command: [sleep, '3600']\n{extra}"),
            ),
        );
    }
    for (name, _, _) in pods {
        let message = config_error(&agent, name);
        assert!(message.contains("CVE-2024-21626"), "{name}: {message}");
    }
    for (name, _, _) in pods {
        agent.remove_manifest(&format!("{name}.yaml"));
    }
    agent.wait_for("the pods gone", T, |a| a.records().is_empty().then_some(()));
}

/// Connections a listener holds are capped (here the healthz port's 32):
/// past the cap a connection is closed at once, and once the holder lets
/// go, the port answers again. Without the cap every connection was
/// served, with no timeout, until descriptors ran out.
#[test]
fn a_listener_holds_a_capped_number_of_connections() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let registry = Registry::start();
    let port = common::free_port();
    let agent = Agent::start_with(&registry, &["--healthz-port", &port.to_string()]);
    let healthz = || -> Option<String> {
        let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer).ok()?;
        answer.starts_with("HTTP/1.1 200").then_some(answer)
    };
    agent.wait_for("healthz", T, |_| healthz());
    let held: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let closed = || {
        held.iter()
            .filter(|c| {
                c.set_nonblocking(true).unwrap();
                matches!((&**c).read(&mut [0u8; 1]), Ok(0))
            })
            .count()
    };
    agent.wait_for("the connections past the cap closed", T, |_| {
        (closed() >= 8).then_some(())
    });
    assert_eq!(closed(), 8);
    assert!(healthz().is_none(), "served past the cap");
    drop(held);
    agent.wait_for("healthz again", T, |_| healthz());
}

/// A client that sends its headers a byte a second and never ends them is
/// never idle, so only a header read timeout ends it: upstream's 30 s
/// (Go's ReadHeaderTimeout in the kubelet's server), on the kubelet API's
/// TLS port and on the plain ports alike. Without hyper's timer such
/// clients were served for ever, each holding one of the listener's slots.
#[test]
fn headers_that_never_end_are_cut_off() {
    let registry = Registry::start();
    let api = ApiServer::start();
    let healthz = common::free_port().to_string();
    let agent = Agent::join(
        &registry,
        &api,
        "sec-slowloris",
        &["--healthz-port", &healthz],
    );
    let kubelet = agent.wait_for("the node's kubelet port", T, |_| {
        let (ok, port, _) = api.kubectl(
            &[
                "get",
                "node",
                "sec-slowloris",
                "-o",
                "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
            ],
            None,
        );
        (ok && !port.trim().is_empty()).then(|| port.trim().to_owned())
    });
    let slow = |port: String, tls: bool| {
        std::thread::spawn(move || {
            let mut command = std::process::Command::new("/usr/bin/python3");
            command
                .arg(common::repo().join("tests/fixtures/slow_headers.py"))
                .arg(&port);
            if tls {
                command.arg("tls");
            }
            let output = command.output().expect("python3 runs");
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            let result: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|_| {
                panic!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr))
            });
            result
        })
    };
    let clients = [slow(kubelet, true), slow(healthz, false)];
    for client in clients {
        let result = client.join().unwrap();
        let seconds = result["seconds"].as_f64().unwrap();
        // A byte a second: the connection was never idle for long, and
        // its headers were cut off at the timeout, not at the end of the
        // client's patience (180 s).
        assert!((25.0..90.0).contains(&seconds), "{result}");
        assert!(result["sent"].as_u64().unwrap() >= 20, "{result}");
        let answer = result["answer"].as_str().unwrap();
        assert!(!answer.contains("200 OK"), "{result}");
    }
}

/// The socket of a pod's monitor starts containers: it is 0600 and the
/// monitor serves only its own user. A process of another user that gets
/// past the mode (here nobody holding CAP_DAC_OVERRIDE, as a widened mode
/// or a leaked descriptor would let it) is not answered, while root, with
/// the same request, is.
#[test]
fn a_pods_monitor_serves_no_other_user() {
    use std::os::unix::fs::PermissionsExt;
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let agent = Agent::start(&registry);
    agent.write_manifest(
        "m.yaml",
        &pod_yaml(
            "monitored",
            "  terminationGracePeriodSeconds: 1\n",
            &format!("  - {{name: c, image: {image}, command: ['sleep', '3600']}}\n"),
        ),
    );
    agent.wait_running("monitored");
    let record = agent.record("monitored").unwrap();
    let socket = agent.pod_dir(&record).join("monitor.sock");
    let mode = fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // A request the monitor answers without side effects: a Create it
    // refuses (its bundle is nowhere in the pod's dir).
    let ask = |user: &[&str]| -> String {
        let script = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"create":{"id":"x1","bundle":"/tmp/evil","log_path":"/tmp/evil.log"}}\n')
    print(s.recv(4096).decode(), end="")
except TimeoutError:
    print("timeout", end="")
except (ConnectionResetError, BrokenPipeError):
    pass
"#;
        let output = std::process::Command::new("setpriv")
            .args(user)
            .args(["/usr/bin/python3", "-c", script])
            .arg(&socket)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let root = ask(&["--reuid=0"]);
    assert!(
        root.contains("bundle /tmp/evil is not this pod's"),
        "{root}"
    );
    let nobody = ask(&[
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=+dac_override",
        "--ambient-caps=+dac_override",
    ]);
    assert_eq!(nobody, "", "another user was answered");
    // Refusing it cost the monitor nothing: it serves its user still.
    let again = ask(&["--reuid=0"]);
    assert_eq!(again, root);
    agent.remove_manifest("m.yaml");
    agent.wait_for("the pod gone", T, |a| a.records().is_empty().then_some(()));
}
