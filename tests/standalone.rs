//! Standalone mode end to end: manifests in a directory, images from a real
//! registry on loopback, containers under real runc on overlayfs. Needs
//! root, runc and docker-registry (scripts/test.sh installs them).

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::{Agent, Registry, pod_yaml};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn busybox(registry: &Registry) -> String {
    registry.push("test/busybox:1", &[])
}

/// The containers of a pod that sleeps: one, `c`, of `image`.
fn sleeping(image: &str) -> String {
    format!("  - name: c\n    image: {image}\n    command: [sleep, '3600']\n")
}

#[test]
fn runs_a_pod_with_image_defaults_and_overrides() {
    let registry = Registry::start();
    let image = registry.push(
        "test/app:1",
        &[
            "--env",
            "FROM_IMAGE=image",
            "--env",
            "OVERRIDDEN=image",
            "--workdir",
            "/tmp",
            "--user",
            "app",
            "--entrypoint",
            r#"["sh","-c"]"#,
            "--cmd",
            r#"["echo image-cmd"]"#,
        ],
    );
    let agent = Agent::start(&registry);
    // Two documents, YAML and JSON, in one file.
    let script = "echo env=$FROM_IMAGE,$OVERRIDDEN,$FROM_POD; echo pwd=$(pwd); echo id=$(id -u):$(id -g); echo host=$(hostname); echo ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ,); echo ns=$(readlink /proc/self/ns/ipc),$(readlink /proc/self/ns/uts),$(readlink /proc/self/ns/pid); ls /etc/hosts /etc/resolv.conf; sleep 3600";
    let side = "echo ns=$(readlink /proc/self/ns/ipc),$(readlink /proc/self/ns/uts),$(readlink /proc/self/ns/pid); sleep 3600";
    let first = pod_yaml(
        "app",
        "",
        &format!(
            "  - name: main\n    image: {image}\n    args: [{script:?}]\n    env:\n    - {{name: OVERRIDDEN, value: pod}}\n    - {{name: FROM_POD, value: yes}}\n  - name: side\n    image: {image}\n    args: [{side:?}]\n"
        ),
    );
    let second = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "host-net", "namespace": "kube-system"},
        "spec": {"hostNetwork": true, "hostPID": true, "hostIPC": true, "containers": [{
            "name": "c", "image": image, "command": ["sh", "-c"],
            "args": ["echo ifaces=$(tail -n +3 /proc/net/dev | wc -l); echo host=$(hostname); echo ns=$(readlink /proc/self/ns/ipc),$(readlink /proc/self/ns/pid); sleep 3600"],
            "workingDir": "/bin", "securityContext": {"runAsUser": 4242}
        }]}
    });
    agent.write_manifest("pods.yaml", &format!("{first}---\n{second}\n"));

    let started = Instant::now();
    agent.wait_running("app");
    agent.wait_running("host-net");
    eprintln!("both pods running after {:?}", started.elapsed());

    let logs = agent.wait_for("app output", T, |a| {
        let l = a.logs("default/app", Some("main"));
        l.contains("/etc/resolv.conf").then_some(l)
    });
    assert!(logs.contains("env=image,pod,yes"), "{logs}");
    assert!(logs.contains("pwd=/tmp"), "{logs}");
    assert!(logs.contains("id=1000:1000"), "{logs}");
    assert!(logs.contains("host=app\n"), "{logs}");
    // Its own network namespace: loopback only.
    assert!(logs.contains("ifaces=lo,\n"), "{logs}");
    assert!(logs.contains("/etc/hosts"), "{logs}");
    // IPC and UTS namespaces are the pod's, shared by its containers and not
    // the host's; each container has its own PID namespace.
    let ns = |text: &str| -> Vec<String> {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("ns="))
            .unwrap_or_else(|| panic!("{text}"));
        line.split(',').map(str::to_owned).collect()
    };
    let main_ns = ns(&logs);
    let side_ns = ns(&agent.wait_for("side output", T, |a| {
        let l = a.logs("default/app", Some("side"));
        l.contains("ns=").then_some(l)
    }));
    let host_ns = |kind: &str| {
        fs::read_link(format!("/proc/self/ns/{kind}"))
            .unwrap()
            .display()
            .to_string()
    };
    assert_eq!(main_ns[..2], side_ns[..2]);
    assert_ne!(main_ns[0], host_ns("ipc"));
    assert_ne!(main_ns[1], host_ns("uts"));
    assert_ne!(main_ns[2], side_ns[2]);
    assert_ne!(main_ns[2], host_ns("pid"));

    let host = agent.wait_for("host-net output", T, |a| {
        let l = a.logs("kube-system/host-net", Some("c"));
        l.contains("host=").then_some(l)
    });
    let host_ifaces: usize = fs::read_to_string("/proc/net/dev")
        .unwrap()
        .lines()
        .skip(2)
        .count();
    assert!(host.contains(&format!("ifaces={host_ifaces}\n")), "{host}");
    assert!(
        host.contains(&format!("ns={},{}", host_ns("ipc"), host_ns("pid"))),
        "{host}"
    );
    let host_name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        host.contains(&format!("host={}", host_name.trim())),
        "{host}"
    );

    let table = agent.cli(&["pods"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0]
            .split_whitespace()
            .eq(["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]),
        "{table}"
    );
    assert!(
        lines.iter().any(|l| l
            .split_whitespace()
            .take(5)
            .eq(["default", "app", "2/2", "Running", "0"])),
        "{table}"
    );
    assert!(
        lines.iter().any(|l| l.split_whitespace().take(5).eq([
            "kube-system",
            "host-net",
            "1/1",
            "Running",
            "0"
        ])),
        "{table}"
    );

    // The log file is where upstream puts it, in the CRI format.
    let record = agent.record("app").unwrap();
    let uid = record["uid"].as_str().unwrap();
    let file = agent.logs.join(format!("default_app_{uid}/main/0.log"));
    let text = fs::read_to_string(&file).unwrap();
    let line = text.lines().find(|l| l.contains("pwd=")).unwrap();
    let fields: Vec<&str> = line.splitn(4, ' ').collect();
    assert!(
        fields[0].ends_with('Z') && fields[0].contains('T'),
        "{line}"
    );
    assert_eq!(&fields[1..], ["stdout", "F", "pwd=/tmp"]);
    assert_eq!(record["status"]["qosClass"], "BestEffort");

    let tail = agent.cli(&["logs", "--tail", "1", "default/app", "main"]);
    assert_eq!(tail.lines().count(), 1, "{tail}");
}

fn restarts(agent: &Agent, pod: &str, container: &str) -> i64 {
    agent
        .container_status(pod, container)
        .and_then(|c| c["restartCount"].as_i64())
        .unwrap_or(0)
}

/// activeDeadlineSeconds: the kubelet ends the pod that long after its
/// start, giving its containers their grace period, and it stays ended
/// across an agent restart.
#[test]
fn a_pod_past_its_active_deadline_fails_with_deadline_exceeded() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    agent.write_manifest(
        "deadline.yaml",
        &pod_yaml(
            "deadline",
            "  activeDeadlineSeconds: 3\n  terminationGracePeriodSeconds: 1\n",
            &sleeping(&image),
        ),
    );
    agent.wait_running("deadline");
    let ended = agent.wait_for("the deadline and the container's end", T, |a| {
        let r = a.record("deadline")?;
        let terminated = r["status"]["containerStatuses"][0]["state"]["terminated"].is_object();
        (r["status"]["phase"] == "Failed" && terminated).then_some(r)
    });
    assert_eq!(ended["status"]["reason"], "DeadlineExceeded", "{ended}");
    assert_eq!(
        ended["status"]["message"],
        "Pod was active on the node longer than the specified deadline"
    );
    agent.kill9();
    agent.spawn();
    std::thread::sleep(Duration::from_secs(3));
    let again = agent.record("deadline").unwrap();
    assert_eq!(again["status"]["reason"], "DeadlineExceeded", "{again}");
    assert!(
        agent
            .runtime_containers()
            .iter()
            .all(|c| c["status"] != "running")
    );
    agent.remove_manifest("deadline.yaml");
    agent.wait_for("the pod gone", T, |a| a.records().is_empty().then_some(()));
}

#[test]
fn restart_policies_and_crash_loop_backoff() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let crasher = |name: &str, policy: &str, code: i32| {
        pod_yaml(
            name,
            &format!("  restartPolicy: {policy}\n"),
            &format!(
                "  - name: c\n    image: {image}\n    command: [sh, -c, 'echo run; exit {code}']\n"
            ),
        )
    };
    agent.write_manifest("always.yaml", &crasher("always", "Always", 1));
    agent.write_manifest(
        "onfailure-ok.yaml",
        &crasher("onfailure-ok", "OnFailure", 0),
    );
    agent.write_manifest("never.yaml", &crasher("never", "Never", 3));

    // Never: exit code 3 → Failed, no restart.
    let never = agent.wait_for("never to fail", T, |a| {
        let r = a.record("never")?;
        (r["status"]["phase"] == "Failed").then_some(r)
    });
    let state = &never["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(state["exitCode"], 3);
    assert_eq!(state["reason"], "Error");

    // OnFailure with success: Succeeded, Completed, no restart.
    let ok = agent.wait_for("onfailure-ok to succeed", T, |a| {
        let r = a.record("onfailure-ok")?;
        (r["status"]["phase"] == "Succeeded").then_some(r)
    });
    assert_eq!(
        ok["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );
    assert_eq!(ok["status"]["containerStatuses"][0]["restartCount"], 0);

    // Always: restarted at once, then CrashLoopBackOff for 10 s, then again.
    agent.wait_for("a first restart", T, |a| {
        (restarts(a, "always", "c") >= 1).then_some(())
    });
    let waiting = agent.wait_for("CrashLoopBackOff", T, |a| {
        let c = a.container_status("always", "c")?;
        (c["state"]["waiting"]["reason"] == "CrashLoopBackOff").then_some(c)
    });
    assert!(
        waiting["state"]["waiting"]["message"]
            .as_str()
            .unwrap()
            .contains("back-off 10s"),
        "{waiting}"
    );
    assert_eq!(waiting["lastState"]["terminated"]["exitCode"], 1);
    let table = agent.cli(&["pods"]);
    assert!(
        table
            .lines()
            .any(|l| l.contains("always") && l.contains("CrashLoopBackOff")),
        "{table}"
    );
    let backoff_seen = Instant::now();
    agent.wait_for(
        "the restart after the back-off",
        Duration::from_secs(20),
        |a| (restarts(a, "always", "c") >= 2).then_some(()),
    );
    let waited = backoff_seen.elapsed();
    assert!(
        waited >= Duration::from_secs(7),
        "restarted after only {waited:?}"
    );
    // The previous instance's log is kept for `logs --previous`.
    let previous = agent.cli(&["logs", "--previous", "default/always"]);
    assert_eq!(previous.trim(), "run");
}

fn pod_dir_count(agent: &Agent) -> usize {
    fs::read_dir(agent.state.join("pods"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn edit_replaces_and_delete_terminates_and_cleans_up() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    // One container exits on SIGTERM, the other ignores it and is killed at
    // the end of the grace period.
    let spec = |tag: &str| {
        pod_yaml(
            "web",
            "  terminationGracePeriodSeconds: 3\n",
            &format!(
                "  - name: polite\n    image: {image}\n    command: [sh, -c, 'trap \"exit 0\" TERM; echo {tag}; while true; do sleep 0.1; done']\n  - name: stubborn\n    image: {image}\n    command: [sh, -c, 'trap \"\" TERM; echo ignoring; while true; do sleep 0.1; done']\n"
            ),
        )
    };
    agent.write_manifest("web.yaml", &spec("v1"));
    let first = agent.wait_running("web");
    let first_uid = first["uid"].as_str().unwrap().to_owned();

    agent.write_manifest("web.yaml", &spec("v2"));
    let second = agent.wait_for("the edited pod", T, |a| {
        let r = a.record("web")?;
        let statuses = r["status"]["containerStatuses"].as_array()?;
        let all_running =
            statuses.len() == 2 && statuses.iter().all(|c| c["state"]["running"].is_object());
        (r["uid"] != first_uid.as_str() && all_running).then_some(r)
    });
    agent.wait_for("the old pod to go", T, |a| {
        (pod_dir_count(a) == 1).then_some(())
    });
    assert!(agent.logs("default/web", Some("polite")).contains("v2"));
    // Until its trap is set the stubborn container would die of SIGTERM, and
    // "running" in the status only says its process was started.
    agent.wait_for("the stubborn container to ignore SIGTERM", T, |a| {
        a.logs("default/web", Some("stubborn"))
            .contains("ignoring")
            .then_some(())
    });
    let uid = second["uid"].as_str().unwrap().to_owned();
    assert!(!agent.cgroup_dirs("kubepods/besteffort").is_empty());

    let removed = Instant::now();
    agent.remove_manifest("web.yaml");
    agent.wait_for("the pod to be removed", T, |a| {
        (pod_dir_count(a) == 0).then_some(())
    });
    let took = removed.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "SIGKILL came before the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(15), "termination took {took:?}");
    let log = agent.log();
    assert!(log.contains("container polite exited with code 0"), "{log}");
    assert!(
        log.contains("container stubborn exited with code 137"),
        "{log}"
    );

    // Nothing of the pod is left.
    agent.assert_no_containers_nor_mounts();
    assert!(
        agent
            .cgroup_dirs(&format!("kubepods/besteffort/pod{uid}"))
            .is_empty()
    );
    assert!(!agent.logs.join(format!("default_web_{uid}")).exists());
    let monitors = std::process::Command::new("pgrep")
        .args([
            "-f",
            &format!("monitor --pod-dir {}", agent.state.display()),
        ])
        .output()
        .unwrap();
    assert!(monitors.stdout.is_empty(), "monitor still running");
}

#[test]
fn kill9_of_the_agent_adopts_running_containers_and_sees_exits() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    agent.write_manifest(
        "pod.yaml",
        &pod_yaml(
            "survivor",
            "  restartPolicy: Never\n",
            &format!(
                "  - name: ticker\n    image: {image}\n    command: [sh, -c, 'i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done']\n  - name: short\n    image: {image}\n    command: [sh, -c, 'sleep 2; exit 7']\n"
            ),
        ),
    );
    agent.wait_running("survivor");
    let id = agent.container_status("survivor", "ticker").unwrap()["containerID"]
        .as_str()
        .unwrap()
        .rsplit("://")
        .next()
        .unwrap()
        .to_owned();
    let pid = agent.container_pid(&id).expect("ticker runs");

    agent.kill9();
    let before = agent
        .logs("default/survivor", Some("ticker"))
        .lines()
        .count();
    // While the agent is down: the short container exits, the ticker logs on.
    std::thread::sleep(Duration::from_secs(3));
    let during = agent
        .logs("default/survivor", Some("ticker"))
        .lines()
        .count();
    assert!(
        during > before + 5,
        "logs stopped while the agent was down: {before} → {during}"
    );

    agent.spawn();
    let short = agent.wait_for("the exit seen after restart", T, |a| {
        let c = a.container_status("survivor", "short")?;
        c["state"]["terminated"].is_object().then_some(c)
    });
    assert_eq!(short["state"]["terminated"]["exitCode"], 7);
    // Adopted, not restarted.
    let ticker = agent.container_status("survivor", "ticker").unwrap();
    assert_eq!(ticker["restartCount"], 0);
    assert!(ticker["state"]["running"].is_object(), "{ticker}");
    assert_eq!(agent.container_pid(&id), Some(pid));
    assert!(agent.log().contains("adopted running container ticker"));
}

#[test]
fn bad_manifests_are_reported_and_harm_nothing() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    agent.write_manifest("good.yaml", &pod_yaml("good", "", &sleeping(&image)));
    agent.wait_running("good");
    agent.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n",
    );
    agent.write_manifest("noimage.yaml", &pod_yaml("noimage", "", "  - name: c\n"));
    agent.write_manifest(
        "unmasked.yaml",
        &pod_yaml(
            "unmasked",
            "",
            &format!(
                "  - name: c\n    image: {image}\n    securityContext: {{procMount: Unmasked}}\n"
            ),
        ),
    );
    agent.write_manifest(
        "claims.yaml",
        &pod_yaml(
            "claims",
            "  resourceClaims: [{name: gpu, resourceClaimName: gpu}]\n",
            &format!("  - name: c\n    image: {image}\n"),
        ),
    );
    let table = agent.wait_for("rejections in nanolet pods", T, |a| {
        let t = a.cli(&["pods"]);
        (t.matches("Rejected").count() >= 4).then_some(t)
    });
    assert!(
        table.contains("broken.yaml (document 0): invalid YAML"),
        "{table}"
    );
    assert!(
        table.contains("noimage.yaml (document 0): spec.containers[0].image: required"),
        "{table}"
    );
    assert!(
        table.contains(
            "unmasked.yaml (document 0): spec.containers[0].securityContext.procMount: `hostUsers` must be false to use `Unmasked`"
        ),
        "{table}"
    );
    assert!(
        table.contains("claims.yaml (document 0): spec.resourceClaims: not supported"),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l
            .split_whitespace()
            .take(4)
            .eq(["default", "noimage", "0/0", "Rejected"])),
        "{table}"
    );
    let log = agent.log();
    assert!(log.contains("broken.yaml"), "{log}");
    assert!(agent.is_running());
    // The good pod was not touched.
    let good = agent.container_status("good", "c").unwrap();
    assert_eq!(good["restartCount"], 0);
    assert!(good["state"]["running"].is_object());
    assert_eq!(pod_dir_count(&agent), 1);
}

#[test]
fn multi_arch_index_and_pull_failures() {
    let registry = Registry::start();
    // An index whose arm64 entry has a marker file the amd64 one lacks.
    let work = common::TempDir::new("nanolet-index");
    let marker = work.path().join("marker");
    fs::write(&marker, "arm64\n").unwrap();
    let (amd, arm) = (work.path().join("amd64"), work.path().join("arm64"));
    common::run(
        std::process::Command::new(common::repo().join("scripts/build-image.sh"))
            .arg(&amd)
            .args(["--arch", "amd64"]),
    );
    common::run(
        std::process::Command::new(common::repo().join("scripts/build-image.sh"))
            .arg(&arm)
            .args([
                "--arch",
                "arm64",
                "--extra-file",
                &format!("{}:/marker", marker.display()),
            ]),
    );
    common::run(
        std::process::Command::new(common::repo().join("scripts/push-image.sh"))
            .args(["--index", &registry.addr, "test/multi:1"])
            .arg(&amd)
            .arg(&arm),
    );
    let image = format!("{}/test/multi:1", registry.addr);
    let index = common::run(std::process::Command::new("skopeo").args([
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{image}"),
    ]));
    let index: Value = serde_json::from_str(&index).unwrap();
    assert_eq!(index["manifests"].as_array().unwrap().len(), 2);

    let agent = Agent::start(&registry);
    agent.write_manifest(
        "multi.yaml",
        &pod_yaml("multi", "", &format!("  - name: c\n    image: {image}\n    command: [sh, -c, 'uname -m; ls /marker; sleep 3600']\n")),
    );
    agent.wait_running("multi");
    let logs = agent.wait_for("output", T, |a| {
        let l = a.logs("default/multi", None);
        l.contains("marker").then_some(l)
    });
    assert!(logs.contains("x86_64"), "{logs}");
    assert!(
        logs.contains("No such file"),
        "the arm64 layer was used: {logs}"
    );

    // The same index as a Docker manifest list of Docker v2 manifests.
    let docker = format!("{}/test/multi-docker:1", registry.addr);
    common::run(std::process::Command::new("skopeo").args([
        "copy",
        "--all",
        "--format",
        "v2s2",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        &format!("docker://{image}"),
        &format!("docker://{docker}"),
    ]));
    let list: Value =
        serde_json::from_str(&common::run(std::process::Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{docker}"),
        ])))
        .unwrap();
    assert_eq!(
        list["mediaType"],
        "application/vnd.docker.distribution.manifest.list.v2+json"
    );
    agent.write_manifest(
        "docker.yaml",
        &pod_yaml("docker", "", &format!("  - name: c\n    image: {docker}\n    command: [sh, -c, 'ls /marker; uname -m; sleep 3600']\n")),
    );
    agent.wait_running("docker");
    let logs = agent.wait_for("output", T, |a| {
        let l = a.logs("default/docker", None);
        l.contains("x86_64").then_some(l)
    });
    assert!(
        logs.contains("No such file"),
        "the arm64 layer was used: {logs}"
    );

    // A blob whose content does not match its digest: the pull fails with a
    // clear reason and the store is unchanged.
    let bad = registry.push(
        "test/corrupt:1",
        &["--extra-file", &format!("{}:/different", marker.display())],
    );
    let manifest: Value =
        serde_json::from_str(&common::run(std::process::Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{bad}"),
        ])))
        .unwrap();
    let layer = manifest["layers"][0]["digest"].as_str().unwrap().to_owned();
    let blob = registry.blob_file(&layer);
    let mut data = fs::read(&blob).unwrap();
    let last = data.len() - 1;
    data[last] ^= 0xff;
    fs::write(&blob, data).unwrap();
    let images = agent.state.join("images");
    let before = tree(&images);
    agent.write_manifest(
        "corrupt.yaml",
        &pod_yaml(
            "corrupt",
            "",
            &format!("  - name: c\n    image: {bad}\n    command: ['true']\n"),
        ),
    );
    let waiting = agent.wait_for("ErrImagePull", T, |a| {
        let c = a.container_status("corrupt", "c")?;
        (c["state"]["waiting"]["reason"] == "ErrImagePull").then_some(c)
    });
    let message = waiting["state"]["waiting"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("blob {layer} failed verification")),
        "{message}"
    );
    assert_eq!(tree(&images), before, "the failed pull changed the store");
    agent.wait_for("ImagePullBackOff", T, |a| {
        let c = a.container_status("corrupt", "c")?;
        (c["state"]["waiting"]["reason"] == "ImagePullBackOff").then_some(())
    });

    // Never with an absent image.
    agent.write_manifest(
        "never.yaml",
        &pod_yaml(
            "never-pull",
            "",
            &format!(
                "  - name: c\n    image: {}/test/absent:1\n    imagePullPolicy: Never\n",
                registry.addr
            ),
        ),
    );
    agent.wait_for("ErrImageNeverPull", T, |a| {
        let c = a.container_status("never-pull", "c")?;
        (c["state"]["waiting"]["reason"] == "ErrImageNeverPull").then_some(())
    });
}

/// Paths (and sizes of files) under `dir`, ignoring the empty tmp dir.
fn tree(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let meta = e.metadata().unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            if meta.is_dir() {
                stack.push(e.path());
                out.push((rel, 0));
            } else {
                out.push((rel, meta.len()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn log_rotation_and_follow() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start_with(
        &registry,
        &[
            "--container-log-max-size",
            "4Ki",
            "--container-log-max-files",
            "3",
        ],
    );
    agent.write_manifest(
        "chatty.yaml",
        &pod_yaml(
            "chatty",
            "  restartPolicy: Never\n",
            &format!("  - name: c\n    image: {image}\n    command: [sh, -c, 'sleep 1; for i in $(seq 1 400); do echo line $i; done; sleep 1; echo last']\n"),
        ),
    );
    agent.wait_running("chatty");
    // Follow from the start; it must end by itself when the container does.
    let follow = std::process::Command::new(env!("CARGO_BIN_EXE_nanolet"))
        .args(["logs", "-f", "default/chatty", "--state-dir"])
        .arg(&agent.state)
        .output()
        .unwrap();
    assert!(follow.status.success());
    let followed = String::from_utf8_lossy(&follow.stdout);
    assert!(followed.ends_with("last\n"), "{followed}");
    assert!(followed.contains("line 400\n"), "{followed}");

    let record = agent.wait_for("completion", T, |a| {
        let r = a.record("chatty")?;
        (r["status"]["phase"] == "Succeeded").then_some(r)
    });
    let dir = agent.logs.join(format!(
        "default_chatty_{}/c",
        record["uid"].as_str().unwrap()
    ));
    let mut files: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files.contains(&"0.log".to_string()));
    assert_eq!(
        files.iter().filter(|f| f.ends_with(".gz")).count(),
        1,
        "{files:?}"
    );
    for f in &files {
        let size = fs::metadata(dir.join(f)).unwrap().len();
        assert!(size <= 4096, "{f} is {size} bytes");
    }
    // Only the live file is read, as upstream: it ends with the last line.
    let live = agent.logs("default/chatty", None);
    assert!(live.ends_with("line 400\nlast"), "{live}");
}

#[test]
fn config_errors_exit_2_naming_key_and_file() {
    let dir = common::TempDir::new("nanolet-config");
    let file = dir.path().join("bad.yaml");
    fs::write(
        &file,
        "kind: KubeletConfiguration\nstaticPodPath: /x\nimageGCHighThresholdPercnt: 85\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nanolet"))
        .args(["run", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("imageGCHighThresholdPercnt") && err.contains(file.to_str().unwrap()),
        "{err}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nanolet"))
        .args(["run", "--no-such-flag", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Every path under `dir` with its size and modification time.
fn tree_listing(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut all = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        let meta = fs::symlink_metadata(&path).unwrap();
        all.push((path.clone(), meta.len(), meta.modified().unwrap()));
        if meta.is_dir() {
            pending.extend(fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    all.sort();
    all
}

/// An older agent put back over the state dir of a newer one (a board
/// downgraded) refuses it, naming the format, and writes nothing there.
#[test]
fn a_state_dir_of_a_newer_format_is_refused_and_left_untouched() {
    let dir = common::TempDir::new("nanolet-format");
    let state = dir.path().join("state");
    fs::create_dir_all(state.join("pods/3f1c-uid")).unwrap();
    fs::write(state.join("pods/3f1c-uid/pod.json"), "{}").unwrap();
    fs::write(state.join("format"), "1000\n").unwrap();
    let before = tree_listing(&state);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nanolet"))
        .args(["run", "--healthz-port", "0", "--state-dir"])
        .arg(&state)
        .arg("--static-pod-path")
        .arg(dir.path().join("manifests"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // An agent that took the dir would run on: it must have exited.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > T {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the agent took a newer state dir and ran");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("format 1000") && err.contains("newer nanolet"),
        "{err}"
    );
    assert_eq!(tree_listing(&state), before);
}

/// The runtime's command line for this agent's containers.
fn runtime_cmd(agent: &Agent) -> std::process::Command {
    let mut cmd = std::process::Command::new(common::runtime());
    cmd.arg("--root").arg(agent.state.join("runtime"));
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd
}

/// An agent killed between a container's create and its start leaves it
/// `created`, with nobody to report an exit: the next agent records the
/// instance as unknown, deletes it, and starts the container again.
#[test]
fn a_container_left_created_is_deleted_and_started_again() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    agent.write_manifest("pod.yaml", &pod_yaml("half", "", &sleeping(&image)));
    let pod_dir = agent.pod_dir(&agent.wait_running("half"));
    let id = agent.container_id("half", "c");
    agent.kill9();
    let monitor = fs::read_to_string(pod_dir.join("monitor.pid")).unwrap();
    common::run(std::process::Command::new("kill").args(["-9", monitor.trim()]));
    // The instance as a killed agent leaves it: created, never started.
    assert!(
        runtime_cmd(&agent)
            .args(["delete", "--force", &id])
            .status()
            .unwrap()
            .success()
    );
    let bundle = pod_dir.join("containers").join(&id);
    assert!(
        runtime_cmd(&agent)
            .arg("create")
            .arg("--bundle")
            .arg(&bundle)
            .arg(&id)
            .status()
            .unwrap()
            .success()
    );
    agent.spawn();
    let c = agent.wait_for("the container started again", T, |a| {
        let c = a.container_status("half", "c")?;
        (c["restartCount"] == 1 && c["state"]["running"].is_object()).then_some(c)
    });
    assert_eq!(
        c["lastState"]["terminated"]["reason"],
        "ContainerStatusUnknown"
    );
    let containers = agent.runtime_containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_ne!(containers[0]["id"], id.as_str());
}

/// A pod dir whose checkpoint cannot be read is removed with everything
/// that ran from it: its containers and its monitor too, none left
/// running untracked.
#[test]
fn a_pod_dir_without_a_usable_checkpoint_is_removed_with_its_monitor() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    agent.write_manifest("pod.yaml", &pod_yaml("broken", "", &sleeping(&image)));
    let pod_dir = agent.pod_dir(&agent.wait_running("broken"));
    let monitor: u32 = fs::read_to_string(pod_dir.join("monitor.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    agent.kill9();
    agent.remove_manifest("pod.yaml");
    fs::write(pod_dir.join("pod.json"), "{ not json").unwrap();
    agent.spawn();
    agent.wait_for("the dir removed", T, |_| (!pod_dir.exists()).then_some(()));
    agent.wait_for("its monitor gone", T, |_| {
        let stat = fs::read_to_string(format!("/proc/{monitor}/stat")).unwrap_or_default();
        // Gone, or a zombie nobody has reaped yet.
        (stat.is_empty() || stat.contains(") Z ")).then_some(())
    });
    assert!(
        agent.runtime_containers().is_empty(),
        "{:?}",
        agent.runtime_containers()
    );
}

/// The relist settles what no monitor reported (an instance that died
/// while its monitor was stopped) and removes a container no pod owns.
#[test]
fn the_relist_settles_unreported_exits_and_removes_orphans() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    agent.write_manifest("pod.yaml", &pod_yaml("watched", "", &sleeping(&image)));
    let pod_dir = agent.pod_dir(&agent.wait_running("watched"));
    let id = agent.container_id("watched", "c");
    // A container of a pod nobody runs: its bundle under a pod dir of its
    // own, its cgroup beside the real one's.
    let bundle = pod_dir.join("containers").join(&id);
    let orphan_bundle = agent.state.join("pods/no-such-pod/containers/orphan-1");
    fs::create_dir_all(&orphan_bundle).unwrap();
    let mut config: Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let cgroup = format!(
        "{}-orphan",
        config["linux"]["cgroupsPath"].as_str().unwrap()
    );
    config["linux"]["cgroupsPath"] = cgroup.into();
    fs::write(orphan_bundle.join("config.json"), config.to_string()).unwrap();
    assert!(
        runtime_cmd(&agent)
            .arg("create")
            .arg("--bundle")
            .arg(&orphan_bundle)
            .arg("orphan-1")
            .status()
            .unwrap()
            .success()
    );
    // The instance dies while its monitor cannot see it.
    let monitor = fs::read_to_string(pod_dir.join("monitor.pid")).unwrap();
    let monitor = monitor.trim().to_owned();
    common::run(std::process::Command::new("kill").args(["-STOP", &monitor]));
    let pid = agent.container_pid(&id).unwrap();
    common::run(std::process::Command::new("kill").args(["-9", &pid.to_string()]));
    // The first relist is 20 s after the start.
    agent.wait_for("the relist's verdict", Duration::from_secs(60), |a| {
        let c = a.container_status("watched", "c")?;
        let ended = [&c["state"], &c["lastState"]]
            .iter()
            .any(|s| s["terminated"]["reason"] == "ContainerStatusUnknown");
        ended.then_some(())
    });
    // The next instance starts through the monitor, once it runs again.
    common::run(std::process::Command::new("kill").args(["-CONT", &monitor]));
    agent.wait_for("the orphan removed", T, |a| {
        a.runtime_containers()
            .iter()
            .all(|c| c["id"] != "orphan-1")
            .then_some(())
    });
    assert!(!orphan_bundle.exists());
    agent.wait_for("the pod running again", T, |a| {
        let c = a.container_status("watched", "c")?;
        (c["restartCount"] == 1 && c["state"]["running"].is_object()).then_some(())
    });
}

#[test]
fn a_lost_monitor_restarts_its_containers_under_a_new_one() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    agent.write_manifest(
        "pod.yaml",
        &pod_yaml("orphan", "", &format!("  - name: c\n    image: {image}\n    command: [sh, -c, 'echo started; sleep 3600']\n")),
    );
    let pod_dir = agent.pod_dir(&agent.wait_running("orphan"));
    let monitor = fs::read_to_string(pod_dir.join("monitor.pid")).unwrap();
    common::run(std::process::Command::new("kill").args(["-9", monitor.trim()]));
    let c = agent.wait_for("a restart under a new monitor", T, |a| {
        let c = a.container_status("orphan", "c")?;
        (c["restartCount"] == 1 && c["state"]["running"].is_object()).then_some(c)
    });
    assert_eq!(
        c["lastState"]["terminated"]["reason"],
        "ContainerStatusUnknown"
    );
    let new_monitor = fs::read_to_string(pod_dir.join("monitor.pid")).unwrap();
    assert_ne!(new_monitor, monitor);
    // The new instance logs through the new monitor.
    agent.wait_for("the new instance's log", T, |a| {
        a.logs("default/orphan", None)
            .contains("started")
            .then_some(())
    });
    // Only one container runs: the old one was stopped, not leaked.
    assert_eq!(
        agent.runtime_containers().len(),
        1,
        "{:?}",
        agent.runtime_containers()
    );
}

#[test]
fn an_interrupted_pull_leaves_the_store_consistent() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-big");
    // Random data does not compress: a layer of some size, so that the agent
    // can be killed while it downloads or unpacks it.
    let big = work.path().join("big");
    common::run(
        std::process::Command::new("head")
            .args(["-c", "48M", "/dev/urandom"])
            .stdout(fs::File::create(&big).unwrap()),
    );
    let image = registry.push(
        "test/big:1",
        &["--extra-file", &format!("{}:/big", big.display())],
    );
    let mut agent = Agent::start(&registry);
    let tmp = agent.state.join("images/tmp");
    let pulling = |a: &Agent| {
        fs::read_dir(a.state.join("images/tmp"))
            .is_ok_and(|mut d| d.next().is_some())
            .then_some(())
    };

    // Deleted while it pulls: the pod goes at once, the pull is abandoned.
    agent.write_manifest("early.yaml", &pod_yaml("early", "", &sleeping(&image)));
    agent.wait_for("a pull in progress", T, pulling);
    let deleted = Instant::now();
    agent.remove_manifest("early.yaml");
    agent.wait_for("the pulling pod to go", T, |a| {
        (pod_dir_count(a) == 0).then_some(())
    });
    assert!(
        deleted.elapsed() < Duration::from_secs(5),
        "{:?}",
        deleted.elapsed()
    );
    agent.wait_for("no pull debris", T, |_| {
        (fs::read_dir(&tmp).unwrap().count() == 0).then_some(())
    });
    let stale = fs::read_to_string(agent.state.join("images/images.json")).unwrap_or_default();
    assert!(!stale.contains("test/big"), "{stale}");
    // Let a partly unpacked layer of the abandoned pull finish or vanish, and
    // start the next pull from nothing.
    for layer in fs::read_dir(agent.state.join("images/layers/sha256")).unwrap() {
        fs::remove_dir_all(layer.unwrap().path()).unwrap();
    }

    agent.write_manifest(
        "big.yaml",
        &pod_yaml(
            "big",
            "",
            &format!(
                "  - name: c\n    image: {image}\n    command: [sh, -c, 'ls -l /big; sleep 3600']\n"
            ),
        ),
    );
    agent.wait_for("a pull in progress", T, pulling);
    agent.kill9();
    let layers = agent.state.join("images/layers/sha256");
    let records = fs::read_to_string(agent.state.join("images/images.json")).unwrap_or_default();
    assert!(
        !records.contains("test/big"),
        "a record for an unfinished pull: {records}"
    );

    agent.spawn();
    agent.wait_running("big");
    let logs = agent.wait_for("output", T, |a| {
        let l = a.logs("default/big", None);
        l.contains("/big").then_some(l)
    });
    assert!(logs.contains(&format!("{}", 48 << 20)), "{logs}");
    assert_eq!(
        fs::read_dir(&tmp).unwrap().count(),
        0,
        "debris left in images/tmp"
    );
    let records: Value =
        serde_json::from_str(&fs::read_to_string(agent.state.join("images/images.json")).unwrap())
            .unwrap();
    let record = &records[image.as_str()];
    assert!(record.is_object(), "{records}");
    for layer in record["layers"].as_array().unwrap() {
        let hex = layer.as_str().unwrap().trim_start_matches("sha256:");
        assert!(layers.join(hex).is_dir(), "layer {hex} missing");
    }
}

#[test]
fn an_image_with_zstd_layers_runs() {
    let registry = Registry::start();
    let image = registry.push("test/zstd:1", &["--compression", "zstd"]);
    let agent = Agent::start(&registry);
    agent.write_manifest(
        "zstd.yaml",
        &pod_yaml(
            "zstd",
            "",
            &format!("  - name: c\n    image: {image}\n    command: [sh, -c, 'echo from-zstd; sleep 3600']\n"),
        ),
    );
    agent.wait_running("zstd");
    agent.wait_for("the container's output", T, |a| {
        (a.logs("default/zstd", Some("c")) == "from-zstd").then_some(())
    });
    // `nanolet images` lists it, with its size and ages.
    let table = agent.cli(&["images"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap()
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        ["IMAGE", "ID", "SIZE", "PULLED", "LAST USED", "PINNED"],
        "{table}"
    );
    let row = lines
        .find(|l| l.starts_with(&image))
        .unwrap_or_else(|| panic!("{image} not listed: {table}"));
    assert!(row.contains("kB") || row.contains("MB"), "{row}");
}

#[test]
fn a_blob_download_that_breaks_off_resumes_where_it_stopped() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-flaky");
    let big = work.path().join("big");
    common::run(
        std::process::Command::new("head")
            .args(["-c", "8M", "/dev/urandom"])
            .stdout(fs::File::create(&big).unwrap()),
    );
    registry.push(
        "test/flaky:1",
        &["--extra-file", &format!("{}:/big", big.display())],
    );
    // The link breaks once, 3 MiB into the layer.
    let proxy = common::FlakyProxy::start(&registry.addr, 3 << 20);
    let agent = Agent::start_in(&registry, None, &["--insecure-registry", &proxy.addr]);
    agent.write_manifest(
        "flaky.yaml",
        &pod_yaml(
            "flaky",
            "",
            &format!(
                "  - name: c\n    image: {}/test/flaky:1\n    command: [sleep, '3600']\n",
                proxy.addr
            ),
        ),
    );
    agent.wait_running("flaky");
    let log = agent.log();
    assert!(log.contains("broke off at"), "{log}");
    // Resumed, not started over: about the layer came back, not the 3 MiB
    // before the break and then all 8 again.
    let answered = proxy.answered.load(std::sync::atomic::Ordering::SeqCst);
    assert!(answered < 9 << 20, "{answered} bytes for an 8 MiB layer");
}

#[test]
fn anonymous_pull_through_the_bearer_token_flow() {
    let registry = Registry::start_with_token_auth("pusher:secret");
    let image = registry.push("test/guarded:1", &[]);
    // The registry itself refuses requests without a token.
    let probe = common::run(
        std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!(
                "http://{}/v2/test/guarded/manifests/1",
                registry.addr
            )),
    );
    assert_eq!(probe, "401");
    let requests = registry.dir().join("token-requests.log");
    let before = fs::read_to_string(&requests)
        .unwrap_or_default()
        .lines()
        .count();

    let agent = Agent::start(&registry);
    agent.write_manifest("guarded.yaml", &pod_yaml("guarded", "", &sleeping(&image)));
    agent.wait_running("guarded");
    let log = fs::read_to_string(&requests).unwrap();
    let ours: Vec<&str> = log.lines().skip(before).collect();
    assert!(!ours.is_empty(), "the token server was not asked: {log}");
    for line in &ours {
        assert!(
            line.contains("authorization=no") && line.contains("status=200"),
            "{line}"
        );
        assert!(
            line.contains("access=repository:test/guarded:pull"),
            "{line}"
        );
    }
    // One token serves the manifest and every blob of the repository.
    assert_eq!(ours.len(), 1, "{ours:?}");
}

#[test]
fn the_nodes_docker_config_authenticates_pulls() {
    use base64::Engine;
    let registry = Registry::start_with_token_auth("puller:s3cret");
    // Under private/, anonymous callers get no access at all.
    let image = registry.push("private/app:1", &[]);
    let dir = common::TempDir::new("nanolet-docker-config");
    let config = dir.path().join("config.json");
    let auth = base64::engine::general_purpose::STANDARD.encode("puller:s3cret");
    fs::write(
        &config,
        format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, registry.addr),
    )
    .unwrap();
    let config_arg = config.to_string_lossy().into_owned();
    let agent = Agent::start_in(&registry, None, &["--docker-config", &config_arg]);
    agent.write_manifest("private.yaml", &pod_yaml("private", "", &sleeping(&image)));
    agent.wait_running("private");
    common::assert_authenticated_pull(&registry, &agent, "private/app:pull");
}

#[test]
fn registry_mirrors_first_then_the_registry_itself() {
    let upstream = Registry::start();
    let mirror = Registry::start();
    let only_upstream = upstream.push("test/upstream:1", &[]);
    mirror.push("test/mirrored:1", &["--env", "SERVED_BY=mirror"]);
    let config = common::TempDir::new("nanolet-mirror-config");
    let file = config.path().join("config.yaml");
    fs::write(
        &file,
        format!(
            "kind: KubeletConfiguration\n---\nkind: NanoletConfiguration\ninsecureRegistries: [{m}]\nregistryMirrors:\n  {u}: [{m}]\n",
            u = upstream.addr,
            m = mirror.addr
        ),
    )
    .unwrap();
    let agent = Agent::start_with(&upstream, &["--config", file.to_str().unwrap()]);
    // Named after the upstream registry, present only on the mirror.
    agent.write_manifest(
        "mirrored.yaml",
        &pod_yaml(
            "mirrored",
            "",
            &format!("  - name: c\n    image: {}/test/mirrored:1\n    command: [sh, -c, 'echo $SERVED_BY; sleep 3600']\n", upstream.addr),
        ),
    );
    // Present only upstream: the mirror's 404 falls back to the registry.
    agent.write_manifest(
        "upstream.yaml",
        &pod_yaml("upstream", "", &sleeping(&only_upstream)),
    );
    agent.wait_running("mirrored");
    agent.wait_running("upstream");
    let logs = agent.wait_for("output", T, |a| {
        let l = a.logs("default/mirrored", None);
        l.contains("mirror").then_some(l)
    });
    assert_eq!(logs.trim(), "mirror");
    assert!(agent.log().contains("trying the next"), "{}", agent.log());
}

/// As upstream: a container that cannot start has ended (StartError, exit
/// 128), and restartPolicy Always starts it again, with backoff.
#[test]
fn a_container_that_cannot_start_is_started_again_with_backoff() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    agent.write_manifest(
        "unstartable.yaml",
        &pod_yaml(
            "unstartable",
            "",
            &format!("  - name: c\n    image: {image}\n    command: [no-such-command]\n"),
        ),
    );
    // The first restart is at once; the next waits out the backoff (10 s).
    let status = agent.wait_for("a restart, then backoff", T, |a| {
        let s = a.container_status("unstartable", "c")?;
        (s["state"]["waiting"]["reason"] == "CrashLoopBackOff").then_some(s)
    });
    assert_eq!(status["restartCount"], 1, "{status:#}");
    let last = &status["lastState"]["terminated"];
    assert_eq!(last["reason"], "StartError", "{status:#}");
    assert_eq!(last["exitCode"], 128, "{status:#}");
    assert!(
        last["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-command")),
        "{status:#}"
    );
}

#[test]
fn a_container_over_its_memory_limit_is_oom_killed() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    // tail keeps the whole of /dev/zero as one line: memory grows until
    // the kernel's OOM killer ends it.
    agent.write_manifest(
        "oom.yaml",
        &pod_yaml(
            "oom",
            "  restartPolicy: Never\n",
            &format!(
                "  - name: hog\n    image: {image}\n    command: [tail, /dev/zero]\n    resources: {{limits: {{memory: 16Mi}}}}\n"
            ),
        ),
    );
    let status = agent.wait_for("the OOM kill", T, |a| {
        let s = a.container_status("oom", "hog")?;
        s["state"]["terminated"].is_object().then_some(s)
    });
    let terminated = &status["state"]["terminated"];
    assert_eq!(terminated["reason"], "OOMKilled", "{status}");
    assert_eq!(terminated["exitCode"], 137);
    let record = agent.record("oom").unwrap();
    assert_eq!(record["status"]["phase"], "Failed");
}

#[test]
fn probes_gate_readiness_and_restart_unhealthy_containers() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    // No CNI network here: the HTTP and TCP probes reach the pod's loopback
    // from inside its network namespace.
    let serve =
        "mkdir -p /www; (sleep 2; echo ok > /www/ready) & exec /bin/busybox httpd -f -p 80 -h /www";
    let work = "touch /tmp/alive; sleep 3; rm /tmp/alive; exec sleep 3600";
    agent.write_manifest(
        "probed.yaml",
        &pod_yaml(
            "probed",
            "  terminationGracePeriodSeconds: 2\n  volumes: [{name: shared, emptyDir: {}}]\n",
            &format!(
                "  - name: web
    image: {image}
    command: [sh, -c, {serve:?}]
    startupProbe: {{tcpSocket: {{port: 80}}, periodSeconds: 1}}
    readinessProbe: {{httpGet: {{path: /ready, port: 80}}, periodSeconds: 1}}
  - name: worker
    image: {image}
    command: [sh, -c, {work:?}]
    livenessProbe:
      exec: {{command: [sh, -c, 'test -f /tmp/alive']}}
      periodSeconds: 1
      failureThreshold: 2
      terminationGracePeriodSeconds: 1
    lifecycle: {{preStop: {{exec: {{command: [sh, -c, 'echo stopping >> /shared/prestop']}}}}}}
    volumeMounts: [{{name: shared, mountPath: /shared}}]
"
            ),
        ),
    );
    // Running but not ready until /ready exists.
    let first = agent.wait_for("web running", T, |a| {
        let c = a.container_status("probed", "web")?;
        c["state"]["running"].is_object().then_some(c)
    });
    assert_eq!(first["ready"], false, "{first:#}");
    agent.wait_for("web ready", T, |a| {
        let c = a.container_status("probed", "web")?;
        (c["ready"] == true && c["started"] == true).then_some(())
    });
    // The worker's liveness fails after 3 s: killed and started again.
    let restarted = agent.wait_for("worker restarted", T, |a| {
        let c = a.container_status("probed", "worker")?;
        (c["restartCount"].as_u64() >= Some(1)).then_some(c)
    });
    assert!(
        restarted["lastState"]["terminated"].is_object(),
        "{restarted:#}"
    );
    assert!(
        agent
            .log()
            .contains("Container worker failed liveness probe, will be restarted")
    );
    // Its preStop hook ran before the kill, as for any stop.
    let uid = agent.record("probed").unwrap()["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let marker = agent
        .state
        .join(format!("pods/{uid}/volumes/shared/prestop"));
    assert!(
        fs::read_to_string(&marker).is_ok_and(|t| t.starts_with("stopping")),
        "no preStop before the liveness kill"
    );
    // The web container was never restarted by its probes.
    let web = agent.container_status("probed", "web").unwrap();
    assert_eq!(web["restartCount"], 0, "{web:#}");
    // Both containers ready again: the pod is Ready.
    agent.wait_for("the pod Ready", T, |a| {
        let record = a.record("probed")?;
        let conditions = record["status"]["conditions"].as_array()?.clone();
        conditions
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
            .then_some(())
    });
}

#[test]
fn a_slow_probe_does_not_hold_up_the_pod() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    // The readiness probe of one container takes 25 s to answer; the other
    // container crashes after a second and must be restarted meanwhile.
    agent.write_manifest(
        "slow.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: slow}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: probed
    image: {image}
    command: [sleep, '3600']
    readinessProbe: {{exec: {{command: [sleep, '25']}}, timeoutSeconds: 30, periodSeconds: 60}}
  - name: crasher
    image: {image}
    command: [sh, -c, 'sleep 1; exit 1']
"
        ),
    );
    // Well before the probe's 25 s (the pass used to wait for probes).
    let soon = Duration::from_secs(10) * common::time_scale();
    agent.wait_for("the crasher restarted while the probe runs", soon, |a| {
        (restarts(a, "slow", "crasher") >= 1).then_some(())
    });
    let probed = agent.container_status("slow", "probed").unwrap();
    assert_eq!(probed["ready"], false, "the probe has not answered yet");
}

#[test]
fn init_containers_run_in_order_with_a_sidecar_that_stops_after_the_main_one() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let step = |name: &str, then: &str| format!("echo {name} >> /data/order{then}");
    agent.write_manifest(
        "init.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: staged}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes: [{{name: data, emptyDir: {{}}}}]
  initContainers:
  - name: first
    image: {image}
    command: [sh, -c, {first:?}]
    volumeMounts: [{{name: data, mountPath: /data}}]
  - name: side
    image: {image}
    restartPolicy: Always
    command: [sh, -c, {side:?}]
    volumeMounts: [{{name: data, mountPath: /data}}]
  - name: second
    image: {image}
    command: [sh, -c, {second:?}]
    volumeMounts: [{{name: data, mountPath: /data}}]
  containers:
  - name: main
    image: {image}
    command: [sh, -c, 'cat /data/order; sleep 1']
    volumeMounts: [{{name: data, mountPath: /data}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: broken-init}}
spec:
  restartPolicy: Never
  initContainers:
  - {{name: fail, image: {image}, command: [sh, -c, 'exit 3']}}
  containers:
  - {{name: main, image: {image}, command: [sleep, '3600']}}
",
            first = step("first", ""),
            side = step("side", "; exec sleep 3600"),
            second = step("second", ""),
        ),
    );
    let record = agent.wait_for("staged Succeeded", T, |a| {
        let r = a.record("staged")?;
        (r["status"]["phase"] == "Succeeded").then_some(r)
    });
    assert_eq!(
        agent.logs("default/staged", Some("main")),
        "first\nside\nsecond"
    );
    // The sidecar was stopped once main had completed.
    let sidecar = agent.wait_for("the sidecar stopped", T, |a| {
        let r = a.record("staged")?;
        let side = r["status"]["initContainerStatuses"][1].clone();
        side["state"]["terminated"].is_object().then_some(side)
    });
    assert_eq!(sidecar["name"], "side");
    // sleep as PID 1 ignores SIGTERM: SIGKILL after the 1 s grace.
    assert_eq!(
        sidecar["state"]["terminated"]["exitCode"], 137,
        "{sidecar:#}"
    );
    assert_eq!(sidecar["restartCount"], 0, "{sidecar:#}");
    let init = record["status"]["initContainerStatuses"]
        .as_array()
        .unwrap();
    assert_eq!(init.len(), 3);
    assert_eq!(init[0]["state"]["terminated"]["exitCode"], 0);
    assert_eq!(init[0]["ready"], true);
    let conditions = record["status"]["conditions"].as_array().unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Initialized" && c["status"] == "True"),
        "{conditions:#?}"
    );

    // A failed init container with restartPolicy Never fails the pod; its
    // main container never starts.
    let broken = agent.wait_for("broken-init Failed", T, |a| {
        let r = a.record("broken-init")?;
        (r["status"]["phase"] == "Failed").then_some(r)
    });
    let main = &broken["status"]["containerStatuses"][0];
    assert_eq!(
        main["state"]["waiting"]["reason"], "PodInitializing",
        "{broken:#}"
    );
    assert!(main["containerID"].is_null());
    let table = agent.cli(&["pods"]);
    let row = table.lines().find(|l| l.contains("broken-init")).unwrap();
    assert!(row.contains("Init:Error"), "{table}");
}

#[test]
fn after_a_reboot_init_containers_run_again_first() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    agent.write_manifest(
        "rerun.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: rerun}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{{name: data, emptyDir: {{}}}}]
  initContainers:
  - {{name: prepare, image: {image}, command: [sh, -c, 'echo prepared >> /data/runs'], volumeMounts: [{{name: data, mountPath: /data}}]}}
  containers:
  - {{name: main, image: {image}, command: [sh, -c, 'cat /data/runs; sleep 3600'], volumeMounts: [{{name: data, mountPath: /data}}]}}
"
        ),
    );
    agent.wait_running("rerun");
    agent.wait_for("main's first run", T, |a| {
        (a.logs("default/rerun", Some("main")) == "prepared").then_some(())
    });
    // The disk emptyDir survives; the sandbox and every process do not.
    agent.power_cut();
    agent.spawn();
    agent.wait_for("main after the init container ran again", T, |a| {
        (a.logs("default/rerun", Some("main")) == "prepared\nprepared").then_some(())
    });
    let record = agent.record("rerun").unwrap();
    let init = &record["status"]["initContainerStatuses"][0];
    assert_eq!(init["restartCount"], 1, "{init:#}");
    assert_eq!(init["state"]["terminated"]["exitCode"], 0, "{init:#}");
}

#[test]
fn hooks_termination_messages_dns_config_and_host_aliases() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let out = agent.dir.path().join("out");
    let main = "cat /etc/hosts /etc/resolv.conf; echo host=$(hostname); until [ -f /tmp/started ]; do sleep 0.1; done; echo post-start-ran; trap 'exit 0' TERM; while true; do sleep 0.1; done";
    agent.write_manifest(
        "hooked.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: hooked}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 10
  subdomain: sub
  setHostnameAsFQDN: true
  hostAliases: [{{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}}]
  dnsPolicy: None
  dnsConfig:
    nameservers: [192.0.2.53]
    searches: [example.test]
    options: [{{name: ndots, value: '2'}}]
  volumes: [{{name: out, hostPath: {{path: {out}, type: DirectoryOrCreate}}}}]
  containers:
  - name: c
    image: {image}
    command: [sh, -c, {main:?}]
    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle:
      postStart: {{exec: {{command: [sh, -c, 'echo yes > /tmp/started']}}}}
      preStop: {{exec: {{command: [sh, -c, 'echo pre-stop-ran > /out/prestop']}}}}
  - name: msg
    image: {image}
    command: [sh, -c, 'echo custom-reason > /dev/termination-log; exit 3']
  - name: fallback
    image: {image}
    terminationMessagePolicy: FallbackToLogsOnError
    command: [sh, -c, 'echo boom-from-logs; exit 1']
",
            out = out.display()
        ),
    );
    agent.wait_for("c running", T, |a| {
        let c = a.container_status("hooked", "c")?;
        c["state"]["running"].is_object().then_some(())
    });
    let logs = agent.wait_for("postStart to run", T, |a| {
        let logs = a.logs("default/hooked", Some("c"));
        logs.contains("post-start-ran").then_some(logs)
    });
    assert!(logs.contains("10.1.2.3\tfoo.local\tbar.local"), "{logs}");
    assert!(
        logs.contains("host=hooked.sub.default.svc.cluster.local\n"),
        "{logs}"
    );
    assert!(logs.contains("# Entries added by HostAliases."), "{logs}");
    assert!(
        logs.contains("nameserver 192.0.2.53\nsearch example.test\noptions ndots:2"),
        "{logs}"
    );
    let message = |name: &str| {
        agent.wait_for(&format!("{name} terminated"), T, |a| {
            let c = a.container_status("hooked", name)?;
            let t = c["state"]["terminated"].clone();
            t.is_object().then_some(t)
        })
    };
    assert_eq!(message("msg")["message"], "custom-reason\n");
    assert_eq!(message("fallback")["message"], "boom-from-logs");

    agent.remove_manifest("hooked.yaml");
    agent.wait_for("the pod gone", T, |a| {
        a.record("hooked").is_none().then_some(())
    });
    assert_eq!(
        fs::read_to_string(out.join("prestop")).unwrap_or_default(),
        "pre-stop-ran\n"
    );
}

/// An edited static pod is a new pod (a new UID); as upstream, it starts
/// only once the old one has stopped: never two of one name at a time.
#[test]
fn an_edited_static_pod_starts_after_the_old_one_stopped() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let out = common::TempDir::new("nanolet-static-edit");
    let out = out.path();
    // Each instance notes its start, and takes 3 s to stop.
    let main = "echo start $V >> /out/log; trap 'sleep 3; echo stop $V >> /out/log; exit 0' TERM; while true; do sleep 1; done";
    let manifest = |version: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: edited}}
spec:
  terminationGracePeriodSeconds: 30
  volumes: [{{name: out, hostPath: {{path: {out}}}}}]
  containers:
  - name: c
    image: {image}
    command: [sh, -c, {main:?}]
    env: [{{name: V, value: {version}}}]
    volumeMounts: [{{name: out, mountPath: /out}}]
",
            out = out.display(),
        )
    };
    let log = || fs::read_to_string(out.join("log")).unwrap_or_default();
    agent.write_manifest("edited.yaml", &manifest("v1"));
    agent.wait_for("v1 started", T, |_| (log() == "start v1\n").then_some(()));
    agent.write_manifest("edited.yaml", &manifest("v2"));
    agent.wait_for("v2 started", T, |_| {
        log().contains("start v2").then_some(())
    });
    assert_eq!(log(), "start v1\nstop v1\nstart v2\n");
    let running: Vec<Value> = agent
        .records()
        .into_iter()
        .filter(|r| r["name"] == "edited")
        .collect();
    assert_eq!(running.len(), 1, "{running:#?}");
}

/// `lifecycle.stopSignal` replaces the image's signal when the pod stops
/// (a realtime one too, which the runtime gets by number), and status
/// reports it and the container's volume mounts.
#[test]
fn a_containers_stop_signal_is_what_stops_it() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let out = common::TempDir::new("nanolet-stop-signal");
    let out = out.path();
    // A shell as PID 1 ignores SIGTERM it has no trap for: only the named
    // signal ends these before the grace period.
    let trapping = |signal: &str, file: &str| {
        format!("trap 'echo {signal} > /out/{file}; exit 0' {signal}; while true; do sleep 1; done")
    };
    agent.write_manifest(
        "signals.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: signals}}
spec:
  os: {{name: linux}}
  terminationGracePeriodSeconds: 60
  volumes: [{{name: out, hostPath: {{path: {out}}}}}]
  containers:
  - name: quit
    image: {image}
    command: [sh, -c, {quit:?}]
    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle: {{stopSignal: SIGQUIT}}
  - name: realtime
    image: {image}
    command: [sh, -c, {realtime:?}]
    volumeMounts: [{{name: out, mountPath: /out, readOnly: false}}]
    lifecycle: {{stopSignal: SIGRTMIN+3}}
",
            out = out.display(),
            quit = trapping("QUIT", "quit"),
            realtime = trapping("37", "realtime"),
        ),
    );
    let status = agent.wait_for("both running", T, |a| {
        let c = a.container_status("signals", "realtime")?;
        let other = a.container_status("signals", "quit")?;
        (c["state"]["running"].is_object() && other["state"]["running"].is_object())
            .then_some(other)
    });
    assert_eq!(status["stopSignal"], "SIGQUIT", "{status:#}");
    assert_eq!(
        status["volumeMounts"],
        serde_json::json!([{"name": "out", "mountPath": "/out"}]),
        "{status:#}"
    );
    let started = std::time::Instant::now();
    agent.remove_manifest("signals.yaml");
    agent.wait_for("the pod gone", T, |a| {
        a.record("signals").is_none().then_some(())
    });
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "waited out the grace period"
    );
    assert_eq!(
        fs::read_to_string(out.join("quit")).unwrap_or_default(),
        "QUIT\n"
    );
    assert_eq!(
        fs::read_to_string(out.join("realtime")).unwrap_or_default(),
        "37\n"
    );
}

#[test]
fn security_contexts_and_volume_options() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let status = "grep -E '^(CapEff|Seccomp):' /proc/self/status";
    let main = format!(
        "{status}; cat /proc/sys/net/ipv4/ip_local_port_range; grep ' /cache ' /proc/mounts; ls -ldn /data; id -G; echo hi > /sub/file; echo by-name > /named/file; sleep 3600"
    );
    // A Localhost profile (Docker's format) that refuses mkdir.
    let profiles = agent.state.join("seccomp/profiles");
    fs::create_dir_all(&profiles).unwrap();
    fs::write(
        profiles.join("no-mkdir.json"),
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}"#,
    )
    .unwrap();
    agent.write_manifest(
        "secure.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: secure}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    fsGroup: 2000
    sysctls: [{{name: net.ipv4.ip_local_port_range, value: '20000 30000'}}]
  volumes:
  - {{name: data, emptyDir: {{}}}}
  - {{name: cache, emptyDir: {{medium: Memory, sizeLimit: 1Mi}}}}
  containers:
  - name: dropped
    image: {image}
    command: [sh, -c, {main:?}]
    securityContext:
      capabilities: {{drop: [ALL], add: [NET_BIND_SERVICE]}}
      seccompProfile: {{type: RuntimeDefault}}
    volumeMounts:
    - {{name: data, mountPath: /data}}
    - {{name: data, mountPath: /sub, subPath: nested/dir}}
    - {{name: data, mountPath: /named, subPathExpr: 'logs/$(POD_NAME)'}}
    - {{name: cache, mountPath: /cache}}
    env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
  - name: privileged
    image: {image}
    command: [sh, -c, \"{status}; ls /dev | wc -l; sleep 3600\"]
    securityContext: {{privileged: true}}
  - name: profiled
    image: {image}
    command: [sh, -c, \"mkdir /tmp/d || echo mkdir-refused; touch /tmp/f && echo touch-ok; sleep 3600\"]
    securityContext:
      seccompProfile: {{type: Localhost, localhostProfile: profiles/no-mkdir.json}}
"
        ),
    );
    agent.wait_running("secure");
    let logs = agent.wait_for("the dropped container's report", T, |a| {
        let logs = a.logs("default/secure", Some("dropped"));
        logs.contains("2000").then_some(logs)
    });
    // Only NET_BIND_SERVICE (bit 10); seccomp in filter mode.
    assert!(logs.contains("CapEff:\t0000000000000400"), "{logs}");
    assert!(logs.contains("Seccomp:\t2"), "{logs}");
    assert!(logs.contains("20000\t30000"), "{logs}");
    assert!(logs.contains("size=1024k"), "{logs}");
    // fsGroup: the emptyDir belongs to the group, new files inherit it, and
    // the container has the group.
    let data = logs
        .lines()
        .find(|l| l.ends_with("/data"))
        .unwrap_or_default();
    assert!(
        data.starts_with("drwxrwsrwx") && data.contains(" 2000 "),
        "{logs}"
    );
    assert!(
        logs.lines().any(|l| l.split(' ').any(|g| g == "2000")),
        "{logs}"
    );
    let uid = agent.record("secure").unwrap()["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let written = agent
        .state
        .join(format!("pods/{uid}/volumes/data/nested/dir/file"));
    agent.wait_for("the subPath file", T, |_| written.exists().then_some(()));
    // subPathExpr: expanded with the container's variables.
    let named = agent
        .state
        .join(format!("pods/{uid}/volumes/data/logs/secure/file"));
    agent.wait_for("the subPathExpr file", T, |_| named.exists().then_some(()));

    let privileged = agent.wait_for("the privileged container's report", T, |a| {
        let logs = a.logs("default/secure", Some("privileged"));
        logs.contains("Seccomp").then_some(logs)
    });
    let host_caps = fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:").map(|c| c.trim().to_owned()))
        .unwrap();
    assert!(
        privileged.contains(&format!("CapEff:\t{host_caps}")),
        "{privileged}"
    );
    assert!(privileged.contains("Seccomp:\t0"), "{privileged}");
    let profiled = agent.wait_for("the profiled container's report", T, |a| {
        let logs = a.logs("default/secure", Some("profiled"));
        logs.contains("touch-ok").then_some(logs)
    });
    assert!(profiled.contains("mkdir-refused"), "{profiled}");
    // The host's devices are created in the container's own /dev: nothing
    // (like the termination log's mount point) lands in the host's.
    assert!(!std::path::Path::new("/dev/termination-log").exists());

    // Unsafe sysctls are refused by admission, naming the sysctl.
    agent.write_manifest(
        "unsafe.yaml",
        &pod_yaml(
            "unsafe",
            "  securityContext:\n    sysctls: [{name: kernel.msgmax, value: '1'}]\n",
            &format!("  - name: c\n    image: {image}\n"),
        ),
    );
    let table = agent.wait_for("the unsafe sysctl refused", T, |a| {
        let t = a.cli(&["pods"]);
        t.contains("kernel.msgmax").then_some(t)
    });
    assert!(table.contains("SysctlForbidden"), "{table}");

    // AppArmor confinement where the kernel has none is refused at
    // admission, as upstream's kubelet does; where it has AppArmor, a
    // profile it has not loaded fails in the runtime.
    agent.write_manifest(
        "armored.yaml",
        &pod_yaml(
            "armored",
            "  securityContext:\n    appArmorProfile: {type: Localhost, localhostProfile: nanolet-test-absent}\n",
            &format!("  - name: c\n    image: {image}\n"),
        ),
    );
    let apparmor = fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|v| v.starts_with('Y'));
    if apparmor {
        let failed = agent.wait_for("the unloaded profile failing", T, |a| {
            let c = a.container_status("armored", "c")?;
            let reason = |state: &str| c[state]["terminated"]["reason"] == "StartError";
            (reason("state") || reason("lastState")).then_some(c)
        });
        // The runtime's words differ (runc names AppArmor, crun the
        // attr file it could not write); that it refused is what counts.
        assert_eq!(failed["ready"], false, "{failed:#}");

        // Containers naming no profile, or RuntimeDefault, run under the
        // agent's own; with CAP_SYS_ADMIN it still refuses a mount, which
        // an Unconfined sibling makes. Privileged ones run unconfined.
        // mount's complaint goes nowhere: stderr is a pipe of its own, and
        // in the log it may come before the attr line written to stdout.
        let report = "cat /proc/self/attr/current; mkdir -p /m; mount -t tmpfs t /m 2>/dev/null && echo mount-made || echo mount-refused; sleep 3600";
        let container = |name: &str, security: &str| {
            format!(
                "  - name: {name}\n    image: {image}\n    command: [sh, -c, {report:?}]\n    securityContext: {security}\n"
            )
        };
        let admin = "{capabilities: {add: [SYS_ADMIN]}";
        agent.write_manifest(
            "defaulted.yaml",
            &pod_yaml(
                "defaulted",
                "",
                &[
                    container("plain", &format!("{admin}}}")),
                    container(
                        "default",
                        &format!("{admin}, appArmorProfile: {{type: RuntimeDefault}}}}"),
                    ),
                    container(
                        "unconfined",
                        &format!("{admin}, appArmorProfile: {{type: Unconfined}}}}"),
                    ),
                    container(
                        "privileged",
                        "{privileged: true, appArmorProfile: {type: RuntimeDefault}}",
                    ),
                ]
                .concat(),
            ),
        );
        agent.wait_running("defaulted");
        for (name, attr, mount) in [
            ("plain", "nanolet-default (enforce)", "mount-refused"),
            ("default", "nanolet-default (enforce)", "mount-refused"),
            ("unconfined", "unconfined", "mount-made"),
            ("privileged", "unconfined", "mount-made"),
        ] {
            let logs = agent.wait_for(&format!("{name}'s report"), T, |a| {
                let logs = a.logs("default/defaulted", Some(name));
                logs.contains("mount-").then_some(logs)
            });
            assert_eq!(logs.lines().next(), Some(attr), "{name}: {logs}");
            assert!(logs.contains(mount), "{name}: {logs}");
        }
    } else {
        let table = agent.wait_for("the AppArmor pod refused", T, |a| {
            let t = a.cli(&["pods"]);
            t.contains("Cannot enforce AppArmor").then_some(t)
        });
        assert!(
            table.contains("AppArmor is not enabled on the host"),
            "{table}"
        );
    }

    // A Localhost profile that is not there: the container cannot be made.
    agent.write_manifest(
        "unprofiled.yaml",
        &pod_yaml(
            "unprofiled",
            "  securityContext:\n    seccompProfile: {type: Localhost, localhostProfile: missing.json}\n",
            &format!("  - name: c\n    image: {image}\n"),
        ),
    );
    let waiting = agent.wait_for("the missing profile reported", T, |a| {
        let status = a.container_status("unprofiled", "c")?;
        let waiting = status["state"]["waiting"].clone();
        (waiting["reason"] == "CreateContainerConfigError").then_some(waiting)
    });
    assert!(
        waiting["message"]
            .as_str()
            .unwrap()
            .contains("seccomp/missing.json"),
        "{waiting}"
    );
}

#[test]
fn shared_process_namespace_has_pause_as_pid_1_and_outlives_its_loss() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let looker = "sleep 1; echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); ps -o pid,args; sleep 3600";
    agent.write_manifest(
        "shared.yaml",
        &pod_yaml(
            "shared",
            "  shareProcessNamespace: true\n  terminationGracePeriodSeconds: 1\n",
            &format!(
                "  - name: worker\n    image: {image}\n    command: [sleep, '4242']\n  - name: looker\n    image: {image}\n    command: [sh, -c, {looker:?}]\n"
            ),
        ),
    );
    agent.wait_running("shared");
    let sees_both = |a: &Agent| {
        let logs = a.logs("default/shared", Some("looker"));
        (logs.contains("pid1=") && logs.contains("sleep 4242")).then_some(logs)
    };
    let logs = agent.wait_for("the looker's view of the pod", T, sees_both);
    // PID 1 is the pod's pause, and the other container's process is seen.
    assert!(logs.contains("pause"), "{logs}");
    let uid = agent.record("shared").unwrap()["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let ns = agent.state.join(format!("pods/{uid}/ns"));
    let pause_pid = || -> i32 {
        fs::read_to_string(ns.join("pid.pause"))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let first = pause_pid();
    assert!(first > 0);
    // In a cgroup of its own under the pod's, as upstream's pause is.
    let cgroups = fs::read_to_string(format!("/proc/{first}/cgroup")).unwrap();
    assert!(
        cgroups
            .lines()
            .any(|l| l.ends_with(&format!("/pod{uid}/pause"))),
        "{cgroups}"
    );

    // Killing the pause kills the pod's processes with it; the pod comes
    // back in a new namespace under a new pause.
    unsafe { libc::kill(first, libc::SIGKILL) };
    agent.wait_for("the containers restarted under a new pause", T, |a| {
        let second = pause_pid();
        (second != 0 && second != first && restarts(a, "shared", "worker") >= 1).then_some(())
    });
    agent.wait_running("shared");

    let second = pause_pid();
    agent.remove_manifest("shared.yaml");
    agent.wait_for("the pod gone", T, |a| {
        a.record("shared").is_none().then_some(())
    });
    // Gone, or a zombie left for whoever reaps orphans here.
    agent.wait_for("the pause gone with its pod", T, |_| {
        let stat = fs::read_to_string(format!("/proc/{second}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        (stat.is_empty() || state.starts_with('Z')).then_some(())
    });
}

/// The host uid of a process, from /proc.
fn host_uid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn host_users_false_runs_the_pod_in_a_user_namespace_of_its_own() {
    use std::os::unix::fs::MetadataExt;
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    // What a container sees of its IDs, the image's files, the files the
    // agent writes, and the masking of /proc.
    let looker = "cat /proc/self/uid_map /proc/self/gid_map; \
        echo id=$(id -u):$(id -g); \
        echo passwd=$(stat -c %u:%g /etc/passwd) hosts=$(stat -c %u /etc/hosts); \
        touch /etc/written && echo wrote-etc; \
        echo hi > /data/by-root && echo wrote-volume; \
        echo hi > /sub/file && echo wrote-sub-path=$(stat -c %u /sub); \
        echo proc-mounts=$(awk '$5 ~ \"^/proc/\"' /proc/self/mountinfo | wc -l); \
        echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); \
        exec sleep 4243";
    let unmasked = "echo proc-mounts=$(awk '$5 ~ \"^/proc/\"' /proc/self/mountinfo | wc -l); \
        echo hostname=$(hostname); ls /sys/class/net; exec sleep 4244";
    let spec = "  hostUsers: false\n  shareProcessNamespace: true\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: data\n    emptyDir: {}\n";
    agent.write_manifest(
        "userns.yaml",
        &pod_yaml(
            "userns",
            spec,
            &format!(
                "  - name: looker\n    image: {image}\n    command: [sh, -c, {looker:?}]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n    - name: data\n      mountPath: /sub\n      subPath: made/here\n  - name: unmasked\n    image: {image}\n    command: [sh, -c, {unmasked:?}]\n    securityContext:\n      procMount: Unmasked\n"
            ),
        ),
    );
    // A Guaranteed pod (its oom_score_adj lowered) of a user other than
    // root, with a memory volume, a downwardAPI volume and an exec probe.
    let reader = "echo id=$(id -u):$(id -g) name=$(cat /info/name) tmp=$(stat -c %u /mem); \
        echo bye > /dev/termination-log; exec sleep 4245";
    agent.write_manifest(
        "userns2.yaml",
        &pod_yaml(
            "userns2",
            "  hostUsers: false\n  terminationGracePeriodSeconds: 1\n  securityContext: {runAsUser: 1000, runAsGroup: 3000}\n  volumes:\n  - {name: mem, emptyDir: {medium: Memory}}\n  - name: info\n    downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}\n",
            &format!(
                "  - name: c\n    image: {image}\n    command: [sh, -c, {reader:?}]\n    resources: {{limits: {{cpu: 100m, memory: 64Mi}}}}\n    readinessProbe: {{exec: {{command: [cat, /etc/hostname]}}, periodSeconds: 1}}\n    volumeMounts:\n    - {{name: mem, mountPath: /mem}}\n    - {{name: info, mountPath: /info}}\n"
            ),
        ),
    );
    agent.wait_running("userns");
    agent.wait_running("userns2");
    agent.wait_for("the probed container ready", T, |a| {
        (a.container_status("userns2", "c")?["ready"] == true).then_some(())
    });
    let reader_logs = agent.logs("default/userns2", Some("c"));
    assert!(
        reader_logs.contains("id=1000:3000 name=userns2 tmp=0"),
        "{reader_logs}"
    );
    // Found once the shell has exec'd it.
    let running = |args: &'static [&'static str]| {
        agent.wait_for("the container's sleep", T, |_| {
            let pids = common::processes_running(args);
            match pids[..] {
                [pid] => Some(pid),
                _ => None,
            }
        })
    };
    let sleeper = running(&["sleep", "4245"]);
    // Guaranteed's -997, set by runc from inside the namespace: possible
    // as the agent gave itself -999 first. An agent without
    // CAP_SYS_RESOURCE (as on these machines) has its own score instead,
    // and gives none lower.
    let score = |pid: u32| -> i32 {
        fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let own = score(agent.pid().unwrap());
    assert_eq!(score(sleeper), (-997).max(own), "agent's own: {own}");
    let logs = agent.wait_for("the looker's report", T, |a| {
        let logs = a.logs("default/userns", Some("looker"));
        logs.contains("pid1=").then_some(logs)
    });
    let uid_of = |name: &str| {
        agent.record(name).unwrap()["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let pod_dir = agent.state.join(format!("pods/{}", uid_of("userns")));
    let mappings: serde_json::Value =
        serde_json::from_slice(&fs::read(pod_dir.join("userns")).unwrap()).unwrap();
    let first = mappings["uidMappings"][0]["hostId"].as_u64().unwrap() as u32;
    assert!(first >= 65536 && first.is_multiple_of(65536), "{mappings}");
    assert_eq!(mappings["gidMappings"], mappings["uidMappings"]);
    let other: serde_json::Value = serde_json::from_slice(
        &fs::read(
            agent
                .state
                .join(format!("pods/{}/userns", uid_of("userns2"))),
        )
        .unwrap(),
    )
    .unwrap();
    let other_first = other["uidMappings"][0]["hostId"].as_u64().unwrap() as u32;
    assert_ne!(other_first, first);
    // A host user other than the pod's cannot reach into the pod's dir:
    // its volumes (where Secrets are) and their ID-mapped mounts, whose
    // paths anyone can read in /proc/*/mountinfo.
    let pod2_dir = agent.state.join(format!("pods/{}", uid_of("userns2")));
    for file in [
        pod2_dir.join("volumes/info/name"),
        pod2_dir.join("idmapped/volumes/info/name"),
    ] {
        assert_eq!(fs::read_to_string(&file).unwrap(), "userns2");
        let as_nobody = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            !as_nobody.status.success(),
            "{} readable by nobody",
            file.display()
        );
    }
    // Logs are 0640, as containerd makes them.
    let log_dir = fs::read_dir(&agent.logs)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().contains("_userns2_"))
        .unwrap()
        .path();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(log_dir.join("c/0.log"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
    }
    assert_eq!(host_uid(sleeper), Some(other_first + 1000));

    // Root inside is the range's first ID outside, for users and groups.
    let map_line = format!("0 {first} 65536");
    let squeezed: Vec<String> = logs
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        squeezed.iter().filter(|l| **l == map_line).count(),
        2,
        "{logs}"
    );
    assert!(logs.contains("id=0:0"), "{logs}");
    // The image's files and the agent's are root's inside, and root
    // writes to both the rootfs and a volume.
    assert!(logs.contains("passwd=0:0 hosts=0"), "{logs}");
    assert!(
        logs.contains("wrote-etc") && logs.contains("wrote-volume"),
        "{logs}"
    );
    // A subPath the agent made is root's inside too.
    assert!(logs.contains("wrote-sub-path=0"), "{logs}");
    // /proc is masked by default, and not with procMount Unmasked.
    assert!(!logs.contains("proc-mounts=0"), "{logs}");
    assert!(logs.contains("pause"), "{logs}");
    let unmasked_logs = agent.wait_for("the unmasked container's report", T, |a| {
        let logs = a.logs("default/userns", Some("unmasked"));
        logs.contains("hostname=").then_some(logs)
    });
    assert!(unmasked_logs.contains("proc-mounts=0"), "{unmasked_logs}");
    // Its own network namespace, sysfs included.
    assert!(unmasked_logs.contains("hostname=userns"), "{unmasked_logs}");
    assert!(
        unmasked_logs.lines().any(|l| l.trim() == "lo"),
        "{unmasked_logs}"
    );

    // On the host: the processes run as the range's root, what root wrote
    // to the rootfs is the range's, and what it wrote to the volume is
    // root's on disk (the volume is ID-mapped, as upstream's are).
    assert_eq!(host_uid(running(&["sleep", "4243"])), Some(first));
    let written: Vec<_> = fs::read_dir(pod_dir.join("containers"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("upper/etc/written"))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(written.len(), 1);
    assert_eq!(fs::metadata(&written[0]).unwrap().uid(), first);
    assert_eq!(
        fs::metadata(pod_dir.join("volumes/data/by-root"))
            .unwrap()
            .uid(),
        0
    );

    // After a power cut, the pod is back in namespaces made anew with the
    // IDs it had, and its disk volume's files are still root's.
    agent.power_cut();
    agent.spawn();
    let logs = agent.wait_for("the looker's second report", T, |a| {
        let logs = a.logs("default/userns", Some("looker"));
        (restarts(a, "userns", "looker") >= 1 && logs.contains("pid1=")).then_some(logs)
    });
    let map_lines = logs
        .lines()
        .filter(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == map_line)
        .count();
    assert_eq!(map_lines, 2, "{logs}");
    assert!(
        logs.contains("wrote-etc") && logs.contains("wrote-volume"),
        "{logs}"
    );
    assert_eq!(
        fs::metadata(pod_dir.join("volumes/data/by-root"))
            .unwrap()
            .uid(),
        0
    );

    agent.remove_manifest("userns.yaml");
    agent.remove_manifest("userns2.yaml");
    agent.wait_for("the pods gone", T, |a| {
        (a.record("userns").is_none() && a.record("userns2").is_none()).then_some(())
    });
    assert!(!pod_dir.exists());
}

#[test]
fn host_mounts_reach_host_to_container_volumes_only() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    // A shared mount of the test's own (under the agent's dir, which its
    // cleanup unmounts whatever happens).
    let host = agent.dir.path().join("media");
    fs::create_dir_all(host.join("usb")).unwrap();
    let run = |args: &[&str]| {
        let status = std::process::Command::new(args[0])
            .args(&args[1..])
            .status()
            .unwrap();
        assert!(status.success(), "{args:?}");
    };
    let host_str = host.to_str().unwrap();
    run(&["mount", "--bind", host_str, host_str]);
    run(&["mount", "--make-shared", host_str]);
    let look =
        "until [ -f /media/usb/label ]; do sleep 0.2; done; cat /media/usb/label; sleep 3600";
    let containers: String = [("follower", "HostToContainer"), ("isolated", "None")]
        .iter()
        .map(|(name, propagation)| {
            format!(
                "  - name: {name}\n    image: {image}\n    command: [sh, -c, {look:?}]\n    volumeMounts: [{{name: media, mountPath: /media, mountPropagation: {propagation}}}]\n"
            )
        })
        .collect();
    agent.write_manifest(
        "media.yaml",
        &pod_yaml(
            "media",
            &format!(
                "  terminationGracePeriodSeconds: 1\n  volumes: [{{name: media, hostPath: {{path: {host_str}}}}}]\n"
            ),
            &containers,
        ),
    );
    agent.wait_running("media");
    // A stick plugged in after the containers started.
    let usb = host.join("usb");
    run(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=1m",
        "usb",
        usb.to_str().unwrap(),
    ]);
    fs::write(usb.join("label"), "backup-stick\n").unwrap();
    agent.wait_for("the follower sees the new mount", T, |a| {
        a.logs("default/media", Some("follower"))
            .contains("backup-stick")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(agent.logs("default/media", Some("isolated")), "");
    agent.remove_manifest("media.yaml");
    agent.wait_for("the pod gone", T, |a| {
        a.record("media").is_none().then_some(())
    });
    run(&["umount", usb.to_str().unwrap()]);
    run(&["umount", host_str]);
}

#[test]
fn check_reports_what_the_node_offers() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::TempDir::new("nanolet-check");
    let cni = dir.path().join("cni");
    fs::create_dir_all(&cni).unwrap();
    let check = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_nanolet"))
            .arg("check")
            .arg("--cni-conf-dir")
            .arg(&cni)
            .args(extra)
            .output()
            .unwrap()
    };
    let fine = check(&[]);
    let text = String::from_utf8_lossy(&fine.stdout).into_owned();
    assert!(fine.status.success(), "{text}");
    assert!(text.contains("ok    runtime"), "{text}");
    // The memory controller these tests need; swap as /proc/swaps has it.
    assert!(text.contains("ok    memory"), "{text}");
    let swap_on = fs::read_to_string("/proc/swaps").unwrap().lines().count() > 1;
    let swap_line = if swap_on {
        "swap is on ("
    } else {
        "ok    swap         off"
    };
    assert!(text.contains(swap_line), "{text}");
    assert!(
        text.contains("pods off the host network get loopback only"),
        "{text}"
    );
    // User namespaces, tried for real: ID-mapped mounts work on this
    // machine's disk, and not on procfs.
    let state = dir.path().join("state");
    let on_disk = check(&["--state-dir", state.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&on_disk.stdout).into_owned();
    assert!(
        text.contains("ok    user ns") && text.contains("hostUsers: false can run"),
        "{text}"
    );
    let closed = dir.path().join("closed");
    fs::create_dir_all(&closed).unwrap();
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).unwrap();
    let behind_closed = check(&["--state-dir", closed.join("state").to_str().unwrap()]);
    let text = String::from_utf8_lossy(&behind_closed.stdout).into_owned();
    assert!(
        text.contains(&format!("refused: {} is not searchable", closed.display())),
        "{text}"
    );
    let on_proc = check(&["--state-dir", "/proc/no-such-dir"]);
    let text = String::from_utf8_lossy(&on_proc.stdout).into_owned();
    assert!(on_proc.status.success(), "{text}");
    assert!(
        text.contains("hostUsers: false are refused: ID-mapping the mount of /proc"),
        "{text}"
    );
    // A network whose plugin is nowhere, and a runtime that is not there.
    fs::write(
        cni.join("10-x.conflist"),
        r#"{"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "no-such-plugin"}]}"#,
    )
    .unwrap();
    // A runc from before `features` (1.1): pods run, with a warning.
    let old_runc = dir.path().join("runc");
    fs::write(&old_runc, "#!/bin/sh\necho 'runc version 1.0.3'\n").unwrap();
    fs::set_permissions(&old_runc, fs::Permissions::from_mode(0o755)).unwrap();
    let old = check(&["--runtime-path", old_runc.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&old.stdout).into_owned();
    assert!(
        text.contains("ok    runtime") && text.contains("runc 1.0.3 has no `features` command"),
        "{text}"
    );
    let broken = check(&["--runtime-path", "/nonexistent/runc"]);
    let text = String::from_utf8_lossy(&broken.stdout).into_owned();
    assert_eq!(broken.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL  runtime"), "{text}");
    assert!(
        text.contains("FAIL  pod network") && text.contains("no-such-plugin"),
        "{text}"
    );
}

#[test]
fn a_container_writing_fast_stays_within_its_log_limits() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start_with(
        &registry,
        &[
            "--container-log-max-size",
            "64Ki",
            "--container-log-max-files",
            "3",
        ],
    );
    // About 20 MB of output as fast as the shell can write it.
    agent.write_manifest(
        "flood.yaml",
        &pod_yaml(
            "flood",
            "  restartPolicy: Never\n",
            &format!(
                "  - name: c\n    image: {image}\n    command: [sh, -c, 'yes 0123456789012345678901234567890123456789 | head -c 20000000; echo done']\n"
            ),
        ),
    );
    agent.wait_for("the flood to end", Duration::from_secs(120), |a| {
        let c = a.container_status("flood", "c")?;
        (c["state"]["terminated"]["exitCode"] == 0).then_some(())
    });
    let dir = agent.logs.join(
        fs::read_dir(&agent.logs)
            .unwrap()
            .flatten()
            .next()
            .unwrap()
            .file_name(),
    );
    let mut total = 0;
    let mut files = 0;
    for entry in fs::read_dir(dir.join("c")).unwrap().flatten() {
        total += entry.metadata().unwrap().len();
        files += 1;
    }
    // Three files of at most 64 KiB each (a rotated one may be gzipped);
    // one line of slack for the record that crossed the limit.
    assert!(files <= 3, "{files} files");
    assert!(
        total <= 3 * 64 * 1024 + 4096,
        "{total} bytes in {files} files"
    );
    assert!(agent.logs("default/flood", None).ends_with("done"));
}

/// Used percent of the filesystem at `path`, as statfs counts it.
fn disk_used_percent(path: &std::path::Path) -> f64 {
    let out = common::run(
        std::process::Command::new("stat")
            .args(["-f", "-c", "%b %a"])
            .arg(path),
    );
    let mut fields = out.split(' ').map(|f| f.parse::<f64>().unwrap());
    let (blocks, available) = (fields.next().unwrap(), fields.next().unwrap());
    100.0 * (blocks - available) / blocks
}

#[test]
fn image_gc_frees_the_disk_least_recently_used_first_keeping_used_and_pinned_images() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-gc");
    // Every image is busybox plus 6 MiB that does not compress, so each
    // takes about an eighth of the 64 MiB image filesystem.
    let push = |name: &str, extra: &[&str]| {
        let data = work.path().join(name.replace(['/', ':'], "_"));
        common::run(
            std::process::Command::new("head")
                .args(["-c", "6M", "/dev/urandom"])
                .stdout(fs::File::create(&data).unwrap()),
        );
        let file = format!("{}:/data", data.display());
        let mut options = vec!["--extra-file", &file];
        options.extend_from_slice(extra);
        registry.push(name, &options)
    };
    let used = push("test/used:1", &[]);
    let pinned = push("test/pinned:1", &[]);
    let old = push("test/old:1", &[]);
    let newer = push("test/newer:1", &[]);
    let last = push("test/last:1", &[]);
    // The used image's layer under another config: a different image that
    // shares its only layer.
    let data = work.path().join("test_used_1");
    let file = format!("{}:/data", data.display());
    let sharing = registry.push("test/sharing:1", &["--extra-file", &file, "--env", "X=1"]);

    let mut agent = Agent::unstarted(&registry, None, &[]);
    let images = agent.state.join("images");
    fs::create_dir_all(&images).unwrap();
    common::run(
        std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
            .arg(&images),
    );
    let config = agent.dir.path().join("config.yaml");
    let write_config = |gc: &str| {
        fs::write(
            &config,
            // Disk eviction's reclaim (every unused image at 85 % used,
            // as GC's high threshold) is not what this test looks at.
            format!("kind: KubeletConfiguration\nimageMinimumGCAge: 0s\nevictionHard: {{memory.available: 100Mi}}\n{gc}---\nkind: NanoletConfiguration\npinnedImages: [{pinned}]\n"),
        )
        .unwrap()
    };
    write_config("");
    agent.set_args(&["--config", config.to_str().unwrap()]);
    agent.spawn();

    let run_once = |agent: &Agent, name: &str, image: &str| {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &pod_yaml(
                name,
                "  restartPolicy: Never\n",
                &format!("  - name: c\n    image: {image}\n    command: ['true']\n"),
            ),
        );
        agent.wait_for(&format!("{name} to succeed"), T, |a| {
            (a.record(name)?["status"]["phase"] == "Succeeded").then_some(())
        });
        agent.remove_manifest(&format!("{name}.yaml"));
        agent.wait_for(&format!("{name} to go"), T, |a| {
            a.record(name).is_none().then_some(())
        });
    };
    agent.write_manifest("keep.yaml", &pod_yaml("keep", "", &sleeping(&used)));
    agent.wait_running("keep");
    // Used in this order: pinned first, so it would go first if pinning
    // did not hold.
    run_once(&agent, "pinned", &pinned);
    run_once(&agent, "sharing", &sharing);
    run_once(&agent, "old", &old);
    let before_newer = disk_used_percent(&images);
    run_once(&agent, "newer", &newer);
    let with_five = disk_used_percent(&images);
    let step = with_five - before_newer;
    assert!(step > 8.0, "an image takes {step}% of the disk");
    // Under the default thresholds nothing went.
    let records = |a: &Agent| -> Value {
        serde_json::from_slice(&fs::read(a.state.join("images/images.json")).unwrap()).unwrap()
    };
    assert_eq!(records(&agent).as_object().unwrap().len(), 5);

    // Thresholds such that the next image crosses the high one, and only
    // deleting a whole unused image besides the one sharing a layer gets
    // back to the low one.
    agent.kill9();
    let high = (with_five + step / 2.0).ceil();
    let low = (with_five + step / 5.0).ceil();
    write_config(&format!(
        "imageGCHighThresholdPercent: {high}\nimageGCLowThresholdPercent: {low}\n"
    ));
    agent.spawn();
    agent.wait_running("keep");
    agent.write_manifest("last.yaml", &pod_yaml("last", "", &sleeping(&last)));
    agent.wait_running("last");
    agent.wait_for("image GC", T, |a| {
        a.log().contains("image GC deleted").then_some(())
    });
    let kept: Vec<String> = records(&agent)
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        kept,
        [&last, &newer, &pinned, &used].map(String::clone),
        "{}",
        agent.log()
    );
    let usage = disk_used_percent(&images);
    assert!(usage <= low, "{usage}% used, low threshold {low}%");
    // The layer the deleted image shared stays with the image that runs,
    // and nothing of the deleted ones is left anywhere.
    let layers: Vec<String> = fs::read_dir(images.join("layers/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(layers.len(), 4, "{layers:?}");
    assert_eq!(fs::read_dir(images.join("tmp")).unwrap().count(), 0);
    agent.write_manifest("again.yaml", &pod_yaml("again", "", &sleeping(&used)));
    agent.wait_running("again");
    // `nanolet images` says which are pinned.
    let table = agent.cli(&["images"]);
    let row = table.lines().find(|l| l.starts_with(&pinned)).unwrap();
    assert!(row.contains("yes"), "{table}");
    assert!(!table.contains(&old), "{table}");
}

/// One entry of a crafted layer.
enum Entry<'a> {
    File(&'a str, &'a [u8]),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    Char(&'a str),
    Dir(&'a str, u32),
    /// A GNU long-name header that claims `size` bytes, with `body`.
    LongName(u64, &'a [u8]),
}

/// A tar written by hand, so that hostile names reach the registry (and
/// the agent) as they are: tar libraries refuse to write some of them.
fn crafted_tar(path: &std::path::Path, entries: &[Entry]) {
    let mut data = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_old();
        let (name, kind, body, link): (&str, tar::EntryType, &[u8], &str) = match e {
            Entry::File(n, b) => (n, tar::EntryType::Regular, b, ""),
            Entry::Symlink(n, t) => (n, tar::EntryType::Symlink, b"", t),
            Entry::Hardlink(n, t) => (n, tar::EntryType::Link, b"", t),
            Entry::Char(n) => (n, tar::EntryType::Char, b"", ""),
            Entry::Dir(n, _) => (n, tar::EntryType::Directory, b"", ""),
            Entry::LongName(_, b) => ("././@LongLink", tar::EntryType::GNULongName, b, ""),
        };
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_size(match e {
            Entry::LongName(claimed, _) => *claimed,
            _ => body.len() as u64,
        });
        h.set_mode(match e {
            Entry::Dir(_, mode) => *mode,
            _ => 0o644,
        });
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        data.extend_from_slice(h.as_bytes());
        data.extend_from_slice(body);
        data.resize(data.len().div_ceil(512) * 512, 0);
    }
    data.extend_from_slice(&[0; 1024]);
    fs::write(path, data).unwrap();
}

#[test]
fn hostile_layers_from_a_registry_write_nothing_outside_their_layer() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-hostile");
    // What a layer must not reach: a dir of the host's, with a file in it.
    let host = common::TempDir::new("nanolet-host-target");
    fs::write(host.path().join("secret"), b"host").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(
            host.path().join("secret"),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
    }
    let target = host.path().to_str().unwrap().trim_start_matches('/');
    let up = "../".repeat(8);
    let pwned = format!("{target}/pwned");
    let dotdot = format!("{up}{pwned}");
    let absolute = format!("/{pwned}");
    let host_secret = format!("/{target}/secret");
    let zeros = vec![0u8; 48 << 20];
    let many: Vec<String> = (0..1500).map(|i| format!("f{i}")).collect();

    let push_layers = |name: &str, layers: &[&[Entry]]| {
        let mut options = Vec::new();
        for (i, entries) in layers.iter().enumerate() {
            let tar = work.path().join(format!("{name}-{i}.tar"));
            crafted_tar(&tar, entries);
            options.push(tar.to_str().unwrap().to_owned());
        }
        let options: Vec<&str> = options.iter().flat_map(|t| ["--layer", t]).collect();
        registry.push(&format!("test/{name}:1"), &options)
    };
    let refused: Vec<(&str, Vec<Entry>, &str)> = vec![
        (
            "dotdot",
            vec![Entry::File(&dotdot, b"x")],
            "path contains '..'",
        ),
        (
            "through-symlink",
            vec![
                Entry::Symlink("evil", &host_secret),
                Entry::Symlink("dir", host.path().to_str().unwrap()),
                Entry::File("dir/pwned", b"x"),
            ],
            "path goes through a symlink",
        ),
        (
            "hardlink-out",
            vec![Entry::Hardlink("h", &host_secret)],
            "hardlink target is not a regular file of this layer",
        ),
        (
            "whiteout-parent",
            vec![Entry::File(".wh...", b"")],
            "whiteout of a parent directory",
        ),
        (
            "bomb",
            vec![Entry::File("zeros", &zeros)],
            "the limit for this layer",
        ),
        (
            "entries",
            many.iter().map(|n| Entry::File(n, b"")).collect(),
            "more than 1000 entries",
        ),
        // Claims 1 GiB, which the tar reader buffered whole (a 1 MB gzip
        // layer of such a name took the agent to 9.5 GB).
        (
            "long-name",
            vec![
                Entry::LongName(1 << 30, &[b'a'; 8192]),
                Entry::File("x", b""),
            ],
            "a long name or PAX header past its size limit",
        ),
    ];

    let config = work.path().join("config.yaml");
    fs::write(
        &config,
        "kind: NanoletConfiguration\nimageLimits: {layerSize: 32Mi, imageSize: 40Mi, layerEntries: 1000}\n",
    )
    .unwrap();
    let agent = Agent::start_with(&registry, &["--config", config.to_str().unwrap()]);
    let base = busybox(&registry);
    agent.write_manifest("base.yaml", &pod_yaml("base", "", &sleeping(&base)));
    agent.wait_running("base");
    let images = agent.state.join("images");
    let store_before = tree(&images.join("layers"));
    for (name, entries, reason) in &refused {
        let image = push_layers(name, &[entries]);
        agent.write_manifest(
            &format!("{name}.yaml"),
            &pod_yaml(
                name,
                "",
                &format!("  - name: c\n    image: {image}\n    command: ['true']\n"),
            ),
        );
        let waiting = agent.wait_for(&format!("{name}: ErrImagePull"), T, |a| {
            let c = a.container_status(name, "c")?;
            (c["state"]["waiting"]["reason"] == "ErrImagePull").then_some(c)
        });
        let message = waiting["state"]["waiting"]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{name}: {message}");
        agent.remove_manifest(&format!("{name}.yaml"));
        agent.wait_for(&format!("{name} to go"), T, |a| {
            a.record(name).is_none().then_some(())
        });
        // Nothing of the refused layer is kept: the store is as it was.
        assert_eq!(
            tree(&images.join("layers")),
            store_before,
            "{name} left something"
        );
        assert_eq!(fs::read_dir(images.join("tmp")).unwrap().count(), 0);
    }

    // Two layers each within the layer limit, together past the image's.
    let half = &zeros[..24 << 20];
    let image = push_layers(
        "two-halves",
        &[
            &[Entry::File("first", half)],
            &[Entry::File("second", half)],
        ],
    );
    agent.write_manifest(
        "two-halves.yaml",
        &pod_yaml(
            "two-halves",
            "",
            &format!("  - name: c\n    image: {image}\n    command: ['true']\n"),
        ),
    );
    let waiting = agent.wait_for("two-halves: ErrImagePull", T, |a| {
        let c = a.container_status("two-halves", "c")?;
        (c["state"]["waiting"]["reason"] == "ErrImagePull").then_some(c)
    });
    let message = waiting["state"]["waiting"]["message"].as_str().unwrap();
    assert!(message.contains("the limit for this layer"), "{message}");
    agent.remove_manifest("two-halves.yaml");
    agent.wait_for("two-halves to go", T, |a| {
        a.record("two-halves").is_none().then_some(())
    });
    // The half unpacked first stays as a layer of its own (it was within
    // every limit); nothing of the other.
    let layers_now = tree(&images.join("layers"));
    let halves = layers_now
        .iter()
        .filter(|(p, _)| p.ends_with("/first") || p.ends_with("/second"))
        .count();
    assert_eq!(halves, 1, "{layers_now:?}");

    // What stays inside by construction runs: an absolute path lands in the
    // layer (tar's rule), a device node is not made, and a symlink of a
    // lower layer cannot carry a later layer's entry out of the container.
    let accepted = push_layers(
        "contained",
        &[
            &[
                Entry::File(&absolute, b"in-layer"),
                Entry::Char("dev-null"),
                Entry::Symlink("escape", host.path().to_str().unwrap()),
                // Its mode was applied at the end, through the link that
                // replaced it (containerd's CVE-2021-32760 class).
                Entry::Dir("moded/", 0o4777),
                Entry::Symlink("moded", &host_secret),
            ],
            &[Entry::File("escape/pwned", b"upper")],
        ],
    );
    agent.write_manifest(
        "contained.yaml",
        &pod_yaml(
            "contained",
            "",
            &format!(
                "  - name: c\n    image: {accepted}\n    command: [sh, -c, 'cat /{pwned} /escape/pwned; ls /dev-null 2>&1; sleep 3600']\n"
            ),
        ),
    );
    agent.wait_running("contained");
    let logs = agent.wait_for("the contained pod's output", T, |a| {
        let l = a.logs("default/contained", None);
        l.contains("No such file").then_some(l)
    });
    assert!(logs.starts_with("in-layerupper"), "{logs}");
    assert!(agent.log().contains("skipped 1 device nodes"));

    // The host's dir is as it was.
    let names: Vec<String> = fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["secret"]);
    assert_eq!(fs::read(host.path().join("secret")).unwrap(), b"host");
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(host.path().join("secret"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
}

fn random_bytes(n: u64) -> Vec<u8> {
    use std::io::Read;
    let mut data = Vec::new();
    fs::File::open("/dev/urandom")
        .unwrap()
        .take(n)
        .read_to_end(&mut data)
        .unwrap();
    data
}

#[test]
fn layers_download_in_parallel_once_for_images_sharing_them_with_progress_shown() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-layers");
    let mut options = Vec::new();
    for i in 0..3 {
        let tar = work.path().join(format!("layer-{i}.tar"));
        let data = random_bytes(3 << 20);
        crafted_tar(&tar, &[Entry::File(&format!("data-{i}"), &data)]);
        options.push(tar.to_str().unwrap().to_owned());
    }
    let mut layers: Vec<&str> = options.iter().flat_map(|t| ["--layer", t]).collect();
    registry.push("test/layers:1", &layers);
    // The same layers under another config: another image.
    layers.extend(["--env", "OTHER=1"]);
    registry.push("test/layers-too:1", &layers);
    // A slow uplink, so that the two pulls overlap.
    let proxy = common::FlakyProxy::slow(&registry.addr, 4 << 20);
    let agent = Agent::start_with(&registry, &["--insecure-registry", &proxy.addr]);
    let pod = |name: &str, image: &str| {
        pod_yaml(
            name,
            "",
            &format!(
                "  - name: c\n    image: {}/test/{image}:1\n    command: [sh, -c, 'cat /data-* | wc -c; sleep 3600']\n",
                proxy.addr
            ),
        )
    };
    // Both in one scan of the manifest dir.
    fs::write(agent.manifests.join(".a.tmp"), pod("a", "layers")).unwrap();
    fs::write(agent.manifests.join(".b.tmp"), pod("b", "layers-too")).unwrap();
    fs::rename(
        agent.manifests.join(".a.tmp"),
        agent.manifests.join("a.yaml"),
    )
    .unwrap();
    fs::rename(
        agent.manifests.join(".b.tmp"),
        agent.manifests.join("b.yaml"),
    )
    .unwrap();
    let progress = agent.wait_for("a pull in progress in `nanolet images`", T, |a| {
        let table = a.cli(&["images"]);
        table
            .lines()
            .find(|l| l.contains("<pulling>"))
            .map(str::to_owned)
    });
    assert!(
        progress.contains("/9.") || progress.contains("/10."),
        "{progress}"
    );
    agent.wait_running("a");
    agent.wait_running("b");
    for pod in ["a", "b"] {
        agent.wait_for("the data", T, |a| {
            (a.logs(&format!("default/{pod}"), None) == (9 << 20).to_string()).then_some(())
        });
    }
    let most_open = proxy.most_open.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most_open >= 3, "at most {most_open} connections at once");
    // Each layer came down once, not once per image.
    let answered = proxy.answered.load(std::sync::atomic::Ordering::SeqCst);
    assert!(answered < 12 << 20, "{answered} bytes for 10 MiB of layers");
    assert!(!agent.cli(&["images"]).contains("<pulling>"));
}

/// The layer digests of an image in the registry, bottom first.
fn layer_digests(image: &str) -> Vec<String> {
    let manifest: Value =
        serde_json::from_str(&common::run(std::process::Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{image}"),
        ])))
        .unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_owned())
        .collect()
}

fn dir_names(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn killed_at_random_points_of_pulls_and_gc_the_store_stays_consistent() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-crashes");
    let mut big_layers = Vec::new();
    for i in 0..3 {
        let tar = work.path().join(format!("data-{i}.tar"));
        crafted_tar(
            &tar,
            &[Entry::File(&format!("data-{i}"), &random_bytes(4 << 20))],
        );
        big_layers.push(tar.to_str().unwrap().to_owned());
    }
    let options: Vec<&str> = big_layers.iter().flat_map(|t| ["--layer", t]).collect();
    let big = registry.push("test/big:1", &options);
    let small_tar = work.path().join("small.tar");
    crafted_tar(&small_tar, &[Entry::File("small", &random_bytes(1 << 20))]);
    let small = registry.push("test/small:1", &["--layer", small_tar.to_str().unwrap()]);
    // What every complete layer dir holds: the busybox layer both images
    // share, then one data file each.
    let busybox_size = fs::metadata("/bin/busybox").unwrap().len();
    let mut complete: std::collections::HashMap<String, (String, u64)> = Default::default();
    let big_digests = layer_digests(&big);
    for (i, digest) in big_digests.iter().enumerate() {
        let expected = match i {
            0 => ("bin/busybox".to_owned(), busybox_size),
            i => (format!("data-{}", i - 1), 4 << 20),
        };
        complete.insert(digest.trim_start_matches("sha256:").to_owned(), expected);
    }
    let small_digests = layer_digests(&small);
    assert_eq!(
        small_digests[0], big_digests[0],
        "the busybox layer is shared"
    );
    complete.insert(
        small_digests[1].trim_start_matches("sha256:").to_owned(),
        ("small".to_owned(), 1 << 20),
    );

    // A slow link makes pulls long enough to be interrupted; images unused
    // for a second go at the next GC pass.
    let proxy = common::FlakyProxy::slow(&registry.addr, 8 << 20);
    let config = work.path().join("config.yaml");
    fs::write(&config, "imageMinimumGCAge: 0s\nimageMaximumGCAge: 1s\n").unwrap();
    let mut agent = Agent::unstarted(&registry, None, &[]);
    agent.set_args(&[
        "--config",
        config.to_str().unwrap(),
        "--insecure-registry",
        &proxy.addr,
    ]);
    let images = agent.state.join("images");
    let pod = |name: &str, image: &str| {
        let image = image.replacen(&registry.addr, &proxy.addr, 1);
        pod_yaml(
            name,
            "  terminationGracePeriodSeconds: 1\n",
            &sleeping(&image),
        )
    };
    agent.write_manifest("big.yaml", &pod("big", &big));

    let check_store = |when: &str| {
        let records: Value = fs::read(images.join("images.json"))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
            .unwrap_or(Value::Null);
        let layers = images.join("layers/sha256");
        for (reference, record) in records.as_object().into_iter().flatten() {
            for layer in record["layers"].as_array().unwrap() {
                let hex = layer.as_str().unwrap().trim_start_matches("sha256:");
                // A record may outlive its layers only as an absent image
                // (GC removes the record first); never the other way round.
                let config = record["configDigest"].as_str().unwrap();
                let blob = images
                    .join("blobs/sha256")
                    .join(config.trim_start_matches("sha256:"));
                if layers.join(hex).is_dir() {
                    assert!(blob.is_file(), "{when}: {reference} lacks its config");
                }
            }
        }
        for hex in dir_names(&layers) {
            let (file, size) = complete
                .get(&hex)
                .unwrap_or_else(|| panic!("{when}: unknown layer {hex}"));
            let got = fs::metadata(layers.join(&hex).join(file)).map(|m| m.len());
            assert_eq!(got.ok(), Some(*size), "{when}: layer {hex} is incomplete");
        }
    };

    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("random seed {seed}");
    for round in 0..10 {
        // The small image wanted every other round, unwanted (and so
        // collected) in between.
        if round % 2 == 1 {
            agent.write_manifest("small.yaml", &pod("small", &small));
        } else if agent.manifests.join("small.yaml").exists() {
            agent.remove_manifest("small.yaml");
        }
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis((seed >> 33) % 2500);
        agent.spawn();
        std::thread::sleep(delay);
        agent.kill9();
        check_store(&format!("round {round}, killed after {delay:?}"));
    }

    // Left to finish: the big image complete, the small one collected, and
    // nothing else on the disk.
    if agent.manifests.join("small.yaml").exists() {
        agent.remove_manifest("small.yaml");
    }
    agent.spawn();
    agent.wait_running("big");
    // Collected means removed too: GC moves what it collects into tmp/
    // and removes it from there after.
    agent.wait_for("the small image collected", T, |a| {
        let records = fs::read_to_string(a.state.join("images/images.json")).ok()?;
        let layers = dir_names(&images.join("layers/sha256"));
        let removing = dir_names(&images.join("tmp"));
        (!records.contains("test/small") && layers.len() == 4 && removing.is_empty()).then_some(())
    });
    check_store("at the end");
    let wanted: std::collections::BTreeSet<String> = big_digests
        .iter()
        .map(|d| d.trim_start_matches("sha256:").to_owned())
        .collect();
    assert_eq!(dir_names(&images.join("layers/sha256")), wanted);
    assert_eq!(dir_names(&images.join("blobs/sha256")).len(), 1);
    assert!(dir_names(&images.join("tmp")).is_empty());
    // Unfinished downloads of the big image were resumed and are gone;
    // one of the small image may wait for its next pull (an hour).
    let partials = dir_names(&images.join("partial"));
    assert!(partials.iter().all(|p| !wanted.contains(p)), "{partials:?}");
}

/// A child process killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn blob_redirects_to_another_host_carry_no_registry_credentials() {
    use std::io::BufRead;
    let registry = Registry::start_with_token_auth("pusher:push-secret");
    registry.push("test/redirected:1", &[]);
    let auth_log = registry.dir().join("storage-auth.log");
    let mut proxy = KillOnDrop(
        std::process::Command::new("python3")
            .arg(common::repo().join("tests/fixtures/redirecting_proxy.py"))
            .arg(&registry.addr)
            .arg(registry.dir().join("data"))
            .arg(&auth_log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut ports = String::new();
    std::io::BufReader::new(proxy.0.stdout.take().unwrap())
        .read_line(&mut ports)
        .unwrap();
    let (front, storage) = ports.trim().split_once(' ').unwrap();
    let (front, storage) = (format!("127.0.0.1:{front}"), format!("127.0.0.1:{storage}"));
    let agent = Agent::start_with(
        &registry,
        &[
            "--insecure-registry",
            &front,
            "--insecure-registry",
            &storage,
        ],
    );
    agent.write_manifest(
        "redirected.yaml",
        &pod_yaml(
            "redirected",
            "",
            &format!(
                "  - name: c\n    image: {front}/test/redirected:1\n    command: [sleep, '3600']\n"
            ),
        ),
    );
    agent.wait_running("redirected");
    // The manifest request carried the registry's token, through the
    // front; the config and the layer came from the storage host, without.
    let tokens = fs::read_to_string(registry.dir().join("token-requests.log")).unwrap();
    assert!(
        tokens.lines().any(|l| l.contains("authorization=no")
            && l.contains("status=200 access=repository:test/redirected:pull")),
        "{tokens}"
    );
    let seen = fs::read_to_string(&auth_log).unwrap();
    let lines: Vec<&str> = seen.lines().collect();
    assert!(lines.len() >= 2, "the storage host saw {lines:?}");
    assert!(
        lines.iter().all(|l| *l == "-"),
        "credentials leaked: {seen}"
    );
}

#[test]
fn a_foreign_layer_comes_from_its_urls() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-foreign");
    let tar = work.path().join("foreign.tar");
    crafted_tar(&tar, &[Entry::File("foreign", b"from-its-url")]);
    let layout = work.path().join("oci");
    common::run(
        std::process::Command::new(common::repo().join("scripts/build-image.sh"))
            .arg(&layout)
            .args(["--tag", "1", "--layer", tar.to_str().unwrap()]),
    );
    // The top layer becomes non-distributable, served from a URL of its own.
    let port = common::free_port();
    let blobs = layout.join("blobs/sha256");
    let mut index: Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest_hex = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_owned();
    let mut manifest: Value =
        serde_json::from_slice(&fs::read(blobs.join(&manifest_hex)).unwrap()).unwrap();
    let layer = manifest["layers"][1]["digest"].as_str().unwrap().to_owned();
    let layer_hex = layer.trim_start_matches("sha256:").to_owned();
    manifest["layers"][1]["mediaType"] =
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip".into();
    manifest["layers"][1]["urls"] =
        serde_json::json!([format!("http://127.0.0.1:{port}/sha256/{layer_hex}")]);
    let bytes = serde_json::to_vec(&manifest).unwrap();
    let digest = common::run(std::process::Command::new("sh").arg("-c").arg(format!(
        "printf %s '{}' | sha256sum | cut -d' ' -f1",
        String::from_utf8(bytes.clone()).unwrap()
    )));
    fs::write(blobs.join(&digest), &bytes).unwrap();
    index["manifests"][0]["digest"] = format!("sha256:{digest}").into();
    index["manifests"][0]["size"] = bytes.len().into();
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    common::run(
        std::process::Command::new(common::repo().join("scripts/push-image.sh"))
            .arg(&layout)
            .args(["1", &registry.addr, "test/foreign:1"]),
    );
    assert!(
        !registry.blob_file(&layer).exists(),
        "the registry holds the foreign layer"
    );
    let log = work.path().join("server.log");
    let _server = KillOnDrop(
        std::process::Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .arg("--directory")
            .arg(layout.join("blobs"))
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + T;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the URL's server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let agent = Agent::start_with(
        &registry,
        &["--insecure-registry", &format!("127.0.0.1:{port}")],
    );
    agent.write_manifest(
        "foreign.yaml",
        &pod_yaml(
            "foreign",
            "",
            &format!(
                "  - name: c\n    image: {}/test/foreign:1\n    command: [sh, -c, 'cat /foreign; echo; sleep 3600']\n",
                registry.addr
            ),
        ),
    );
    agent.wait_running("foreign");
    let logs = agent.wait_for("the container's output", T, |a| {
        let logs = a.logs("default/foreign", None);
        (!logs.is_empty()).then_some(logs)
    });
    assert_eq!(logs, "from-its-url");
    let served = fs::read_to_string(&log).unwrap();
    assert!(
        served.contains(&format!("GET /sha256/{layer_hex} HTTP/1.1\" 200")),
        "{served}"
    );
}

#[test]
fn a_download_cut_by_an_agent_restart_resumes_where_it_stopped() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-restart-resume");
    let tar = work.path().join("big.tar");
    crafted_tar(&tar, &[Entry::File("big", &random_bytes(16 << 20))]);
    registry.push("test/resumed:1", &["--layer", tar.to_str().unwrap()]);
    // 4 MiB/s: the agent is killed about half way through the big layer.
    let proxy = common::FlakyProxy::slow(&registry.addr, 4 << 20);
    let mut agent = Agent::start_with(&registry, &["--insecure-registry", &proxy.addr]);
    agent.write_manifest(
        "resumed.yaml",
        &pod_yaml(
            "resumed",
            "",
            &format!(
                "  - name: c\n    image: {}/test/resumed:1\n    command: [sh, -c, 'wc -c < /big; sleep 3600']\n",
                proxy.addr
            ),
        ),
    );
    let partial = agent.state.join("images/partial");
    agent.wait_for("half the layer", T, |_| {
        let size = fs::read_dir(&partial)
            .ok()?
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .max()?;
        (size > 6 << 20).then_some(())
    });
    agent.kill9();
    agent.spawn();
    agent.wait_running("resumed");
    agent.wait_for("the data", T, |a| {
        (a.logs("default/resumed", None) == (16 << 20).to_string()).then_some(())
    });
    assert!(agent.log().contains("resumes at"), "{}", agent.log());
    let answered = proxy.answered.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        answered < 20 << 20,
        "{answered} bytes for a 17 MiB image cut half way"
    );
    assert!(dir_names(&partial).is_empty(), "{:?}", dir_names(&partial));
}

#[test]
fn healthz_and_the_read_only_port_answer_on_plain_http() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let port = common::free_port().to_string();
    let read_only = common::free_port().to_string();
    let agent = Agent::start_with(
        &registry,
        &[
            "--healthz-port",
            &port,
            "--address",
            "127.0.0.1",
            "--read-only-port",
            &read_only,
        ],
    );
    let request = |method: &str, port: &str, path: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-X", method, "-w", " %{http_code}"])
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let get = |path: &str| request("GET", &port, path);
    let answer = agent.wait_for("healthz", T, |_| {
        let a = get("/healthz");
        a.ends_with("200").then_some(a)
    });
    assert_eq!(answer, "ok\n 200");
    assert!(get("/pods").ends_with("404"), "{}", get("/pods"));

    // The read-only port: the reading endpoints, with no credentials.
    agent.write_manifest(
        "web.yaml",
        &pod_yaml(
            "web",
            "",
            &format!(
                "  - name: c\n    image: {image}\n    command: [sleep, '3600']\n    readinessProbe: {{exec: {{command: ['true']}}, periodSeconds: 1}}\n"
            ),
        ),
    );
    agent.wait_running("web");
    let get = |path: &str| request("GET", &read_only, path);
    let pods = get("/pods");
    assert!(
        pods.ends_with(" 200") && pods.contains(r#""name":"web""#),
        "{pods}"
    );
    let summary = agent.wait_for("the pod in the summary", T, |_| {
        let s = get("/stats/summary");
        s.contains(r#""name":"web""#).then_some(s)
    });
    assert!(summary.contains("usageCoreNanoSeconds"), "{summary}");
    let metrics = get("/metrics");
    assert!(
        metrics.ends_with(" 200") && metrics.contains("nanolet_event_loop_lag_seconds_bucket"),
        "{metrics}"
    );
    let resource = get("/metrics/resource");
    assert!(
        resource.contains(
            r#"container_cpu_usage_seconds_total{container="c",namespace="default",pod="web"}"#
        ),
        "{resource}"
    );
    // cAdvisor's series: the node, the pod's cgroup and its container's.
    let cadvisor = get("/metrics/cadvisor");
    let id = agent.container_id("web", "c");
    for series in [
        r#"container_cpu_usage_seconds_total{container="",cpu="total",id="/",image="",name="",namespace="",pod=""} "#.to_owned(),
        format!(r#"container_memory_working_set_bytes{{container="c",id="{}/"#, agent.cgroup_root.trim_end_matches('/')),
        format!(r#"/{id}",image="{image}",name="{id}",namespace="default",pod="web"}} "#),
        r#"container_memory_rss{container="",id=""#.to_owned(),
        "machine_cpu_cores ".to_owned(),
        "# TYPE container_network_receive_bytes_total counter".to_owned(),
    ] {
        assert!(cadvisor.contains(&series), "{series} in {cadvisor}");
    }
    let probes = agent.wait_for("the readiness probe counted", T, |_| {
        let p = get("/metrics/probes");
        p.contains(r#"prober_probe_total{container="c",namespace="default",pod="web",pod_uid=""#)
            .then_some(p)
    });
    assert!(
        probes.contains(r#"probe_type="Readiness",result="successful"}"#),
        "{probes}"
    );
    // Logs and exec are for authenticated users only, and nothing is written.
    assert!(get("/containerLogs/default/web/c").ends_with(" 404"));
    assert!(request("POST", &read_only, "/exec/default/web/c?command=id").ends_with(" 405"));
    assert_eq!(get("/healthz"), "ok\n 200");
}

#[test]
fn the_kubepods_cgroup_is_capped_at_node_allocatable() {
    let registry = Registry::start();
    let work = common::TempDir::new("nanolet-allocatable");
    let config = work.path().join("config.yaml");
    fs::write(
        &config,
        "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nsystemReserved: {cpu: 500m, memory: 256Mi, pid: '1000'}\nkubeReserved: {memory: 64Mi}\n",
    )
    .unwrap();
    let agent = Agent::start_with(&registry, &["--config", config.to_str().unwrap()]);
    let page = |bytes: u64| bytes / 4096 * 4096;
    let mem_total = nanolet::cgroup::memory_capacity();
    let memory = page(mem_total - (320 << 20)).to_string();
    // SAFETY: sysconf has no memory-safety preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } as u64;
    let shares = (cpus * 1000 - 500) * 1024 / 1000;
    let pid_max: u64 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pids = (pid_max - 1000).to_string();
    let read = |dir: &std::path::Path, file: &str| {
        fs::read_to_string(dir.join(file))
            .map(|t| t.trim().to_owned())
            .ok()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dirs = agent.cgroup_dirs("kubepods");
        // cgroup v2 has one dir with every file; v1 one per controller.
        let mut seen = Vec::new();
        for dir in &dirs {
            for (file, want) in [
                ("memory.max", memory.clone()),
                ("memory.limit_in_bytes", memory.clone()),
                (
                    "cpu.weight",
                    (1 + (shares - 2) * 9999 / 262_142).to_string(),
                ),
                ("cpu.shares", shares.to_string()),
                ("pids.max", pids.clone()),
            ] {
                if let Some(got) = read(dir, file) {
                    seen.push((file, got == want, got, want));
                }
            }
        }
        let found = |names: &[&str]| names.iter().any(|n| seen.iter().any(|s| s.0 == *n));
        let all_set = found(&["memory.max", "memory.limit_in_bytes"])
            && found(&["cpu.weight", "cpu.shares"])
            && found(&["pids.max"])
            && seen.iter().all(|s| s.1);
        if all_set {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kubepods not capped: {seen:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What `kubectl exec` stands on, with either runtime (the cgroup v2 VM
/// runs this with crun): a command with the client's pipes, and one on a
/// terminal of nanolet's, started at the client's size.
#[test]
fn the_runtime_execs_with_pipes_and_on_a_terminal() {
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    use nanolet::config::RuntimeKind;
    use nanolet::runtime::attached_exec::ExecIo;
    use nanolet::runtime::runc::Runtime;
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    agent.write_manifest("shell.yaml", &pod_yaml("shell", "", &sleeping(&image)));
    let record = agent.wait_running("shell");
    let id = agent.container_id("shell", "c");
    let kind = match common::runtime().as_str() {
        "crun" => RuntimeKind::Crun,
        _ => RuntimeKind::Runc,
    };
    let runtime = Runtime::new(kind, common::runtime().into(), agent.state.join("runtime"));
    let bundle = agent.pod_dir(&record).join("containers").join(&id);
    let scratch = agent.dir.path().to_owned();
    let argv = |text: &str| vec!["sh".to_owned(), "-c".to_owned(), text.to_owned()];
    nanolet::rt::block_on(async {
        let pipes = ExecIo {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        };
        let mut exec = runtime
            .exec_attached(
                (&id, &bundle),
                &argv("cat; echo err >&2; exit 4"),
                pipes,
                None,
                (&scratch, "pipes"),
            )
            .await
            .expect("exec starts");
        let mut stdin = exec.stdin.take().expect("stdin");
        stdin.write_all(b"hello\n").await.unwrap();
        stdin.close().await.unwrap();
        drop(stdin);
        let (mut out, mut err) = (String::new(), String::new());
        exec.stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await
            .unwrap();
        exec.stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .await
            .unwrap();
        let status = exec.child.status().await.unwrap();
        exec.ended();
        assert_eq!(
            (out.as_str(), err.as_str(), status.code()),
            ("hello\n", "err\n", Some(4))
        );

        let terminal = ExecIo {
            stdin: false,
            stdout: true,
            stderr: false,
            tty: true,
        };
        let mut exec = runtime
            .exec_attached(
                (&id, &bundle),
                &argv("tty; stty size; exit 5"),
                terminal,
                Some((100, 40)),
                (&scratch, "tty"),
            )
            .await
            .expect("exec starts");
        let mut out = Vec::new();
        exec.stdout
            .take()
            .unwrap()
            .read_to_end(&mut out)
            .await
            .unwrap();
        let status = exec.child.status().await.unwrap();
        exec.ended();
        let out = String::from_utf8_lossy(&out);
        assert!(out.contains("/dev/pts/"), "{out}");
        assert!(out.contains("40 100"), "{out}");
        assert_eq!(status.code(), Some(5), "{out}");
    });
}

#[test]
fn a_containers_stdin_and_terminal_are_held_by_its_monitor_for_attach() {
    use nanolet::runtime::monitor_client::attach_input;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let registry = Registry::start();
    let image = busybox(&registry);
    let agent = Agent::start(&registry);
    let container = |name: &str, fields: &str, script: &str| {
        format!("  - name: {name}\n    image: {image}\n{fields}    command: [sh, -c, {script:?}]\n")
    };
    let containers = [
        container(
            "piped",
            "    stdin: true\n    stdinOnce: true\n",
            "while read l; do echo \"got $l\"; done; echo eof; exec sleep 3600",
        ),
        container(
            "term",
            "    stdin: true\n    tty: true\n",
            "tty; echo $TERM; read l; stty size; exec sleep 3600",
        ),
        container(
            "none",
            "",
            "read l; echo \"read returned $?\"; exec sleep 3600",
        ),
    ]
    .concat();
    agent.write_manifest("input.yaml", &pod_yaml("input", "", &containers));
    let pod_dir = agent.pod_dir(&agent.wait_running("input"));
    let id = |name: &str| agent.container_id("input", name);
    let logged = |name: &str, what: &str| {
        agent.wait_for(&format!("{what:?} in {name}'s log"), T, |a| {
            a.logs("default/input", Some(name))
                .contains(what)
                .then_some(())
        });
    };
    // Without `stdin`, stdin is empty: the read ends at once.
    logged("none", "read returned 1");
    assert!(attach_input(&pod_dir, &id("none")).is_err());

    // With it, the container reads what an attach writes; the attach's end
    // is its end of file, as the container is stdinOnce.
    let input = attach_input(&pod_dir, &id("piped")).expect("piped input");
    assert!(!input.terminal);
    std::fs::File::from(input.fd).write_all(b"a\n").unwrap();
    logged("piped", "got a");
    assert!(!agent.logs("default/input", Some("piped")).contains("eof"));
    drop(input.connection);
    logged("piped", "eof");

    // With a terminal, the input is the terminal's master: it takes a size
    // and keys, and what the container writes is logged as stdout.
    logged("term", "xterm");
    let input = attach_input(&pod_dir, &id("term")).expect("terminal");
    assert!(input.terminal);
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 100,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // Safety: TIOCSWINSZ reads the winsize, which lives across the call.
    let set = unsafe { libc::ioctl(input.fd.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(set, 0);
    std::fs::File::from(input.fd).write_all(b"go\r").unwrap();
    logged("term", "40 100");
    let log = agent.logs("default/input", Some("term"));
    assert!(log.contains("/dev/pts/0"), "{log}");
}

/// The children of `parent` named `comm`.
fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 2..].split_whitespace().nth(1);
        if &stat[open + 1..close] == comm && ppid == Some(&parent.to_string()) {
            found.push(pid);
        }
    }
    found
}

/// Dirty pages a process shares with others, in KiB.
/// Dirty pages a process shares copy-on-write (with the process it was
/// forked from), per mapping no more than the mapping's anonymous pages:
/// a binary built moments ago is dirty in the page cache, and its file
/// pages would count too, in any process that maps it. (Relocated data is
/// anonymous, though its mapping names the binary and is read-only by
/// now.)
fn shared_dirty_kib(pid: &str) -> u64 {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let field = |block: &str, name: &str| -> u64 {
        block
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    // Each mapping's block starts with its "start-end perms ..." line.
    let mut blocks: Vec<String> = Vec::new();
    for line in smaps.lines() {
        let header = line
            .split_whitespace()
            .next()
            .is_some_and(|first| first.contains('-') && !first.ends_with(':'));
        if header || blocks.is_empty() {
            blocks.push(String::new());
        }
        if let Some(block) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
        .iter()
        .map(|b| field(b, "Shared_Dirty:").min(field(b, "Anonymous:")))
        .sum()
}

#[test]
fn monitors_are_forked_by_the_launcher_and_execd_once_it_is_gone() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::unstarted(&registry, None, &[]);
    // A pipe the agent inherits, as from the shell that started it:
    // monitors, which outlive the agent, must not hold it.
    let (_pipe_read, pipe_write) = nix::unistd::pipe().unwrap();
    agent.inherit(pipe_write);
    agent.spawn();
    let agent_pid = agent.pid().unwrap();
    let holds_inherited = |pid: &str| {
        std::path::Path::new(&format!("/proc/{pid}/fd/{}", common::INHERITED_FD)).exists()
    };
    assert!(holds_inherited(&agent_pid.to_string()));
    let launcher = agent.wait_for("the monitor launcher", T, |_| {
        children_named(agent_pid, "nanolet-launch").first().copied()
    });
    let cmdline = |pid: &str| {
        let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        String::from_utf8_lossy(&raw)
            .trim_end_matches('\0')
            .to_owned()
    };
    assert_eq!(cmdline(&launcher.to_string()), "nanolet monitor launcher");
    let pod = |name: &str| pod_yaml(name, "", &sleeping(&image));
    let monitor_of = |name: &str| {
        let pod_dir = agent.pod_dir(&agent.wait_running(name));
        let pid = fs::read_to_string(pod_dir.join("monitor.pid")).unwrap();
        let pid = pid.trim().to_owned();
        assert_eq!(
            fs::read_to_string(format!("/proc/{pid}/comm")).unwrap(),
            "nanolet-monitor\n"
        );
        assert_eq!(
            cmdline(&pid),
            format!("nanolet monitor --pod-dir {}", pod_dir.display())
        );
        assert!(
            !holds_inherited(&pid),
            "monitor {pid} holds the agent's inherited pipe"
        );
        pid
    };
    // Forked: it shares the pages written at start (relocations above all)
    // with the launcher, copy-on-write.
    agent.write_manifest("forked.yaml", &pod("forked"));
    let forked = shared_dirty_kib(&monitor_of("forked"));
    assert!(forked >= 64, "shared dirty: {forked} KiB");
    // With the launcher gone, monitors are exec'd and share none of that.
    common::run(std::process::Command::new("kill").args(["-9", &launcher.to_string()]));
    agent.write_manifest("execd.yaml", &pod("execd"));
    let execd = shared_dirty_kib(&monitor_of("execd"));
    eprintln!("monitors' shared dirty pages: forked {forked} KiB, exec'd {execd} KiB");
    assert!(
        execd < forked / 2,
        "shared dirty: exec'd {execd} KiB, forked {forked} KiB"
    );
    assert!(
        agent.log().contains("monitor launcher is gone"),
        "{}",
        agent.log()
    );
    assert!(children_named(agent_pid, "nanolet-launch").is_empty());
    // A launcher ends with its agent.
    agent.kill9();
    agent.spawn();
    let new_pid = agent.pid().unwrap();
    let launcher = agent.wait_for("the new launcher", T, |_| {
        children_named(new_pid, "nanolet-launch").first().copied()
    });
    agent.kill9();
    // Gone, or a zombie its new parent has yet to reap.
    agent.wait_for("the launcher gone with its agent", T, |_| {
        let stat = fs::read_to_string(format!("/proc/{launcher}/stat")).unwrap_or_default();
        let state = stat.rfind(')').and_then(|at| stat[at + 2..].chars().next());
        matches!(state, None | Some('Z')).then_some(())
    });
}

/// A pod deleted while its container is created but not yet started (the
/// runtime's `start` held here by a wrapper) is removed at once: its
/// instance never ran and is deleted, where its stop signal (SIGWINCH,
/// httpd's, which the runtime's init process ignores) would have held the
/// pod for its grace period.
#[test]
fn a_container_deleted_between_create_and_start_is_undone_at_once() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let dir = common::TempDir::new("nanolet-held-start");
    let held = dir.path().join("held");
    let wrapper = dir.path().join("runtime");
    fs::write(
        &wrapper,
        format!(
            // Once released, it goes on only if the agent's runtime root
            // is still there: a test that failed has removed it, and
            // the runtime would make it again.
            "#!/bin/sh
root=
previous=
for arg in \"$@\"; do
  [ \"$previous\" = --root ] && root=$arg
  previous=$arg
  if [ \"$arg\" = start ]; then
    touch {held}
    n=0
    while [ -e {held} ] && [ $n -lt 300 ]; do sleep 0.2; n=$((n + 1)); done
    [ -d \"$root\" ] || exit 1
  fi
done
exec {runtime} \"$@\"
",
            held = held.display(),
            runtime = common::runtime(),
        ),
    )
    .unwrap();
    fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let agent = Agent::start_with(&registry, &["--runtime-path", wrapper.to_str().unwrap()]);
    agent.write_manifest(
        "held.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: held}}
spec:
  os: {{name: linux}}
  terminationGracePeriodSeconds: 120
  containers:
  - name: c
    image: {image}
    command: [sleep, '3600']
    lifecycle: {{stopSignal: SIGWINCH}}
"
        ),
    );
    agent.wait_for("the container created and its start held", T, |_| {
        held.exists().then_some(())
    });
    agent.remove_manifest("held.yaml");
    agent.wait_for("the pod gone", T, |a| {
        a.record("held").is_none().then_some(())
    });
    assert!(
        agent
            .runtime_containers()
            .iter()
            .all(|c| !c["bundle"].as_str().unwrap_or("").contains("held")),
    );
    // The held `start` goes on, finds nothing to start, and ends.
    fs::remove_file(&held).unwrap();
    // The shell running it, not the agent named after it.
    let wrapper_path = format!("/bin/sh {}", wrapper.display());
    agent.wait_for("the held start to end", T, |_| {
        common::processes_whose_cmdline_contains(&wrapper_path)
            .is_empty()
            .then_some(())
    });
    assert!(
        agent.runtime_containers().is_empty(),
        "{:?}",
        agent.runtime_containers()
    );
}

/// A pod whose cleanup could not finish (here its containers, monitor,
/// mounts and dir removed by hand while the agent was down) leaves its
/// pause process and its cgroups: nothing names them but their pod's UID.
/// The relist removes them once it finds the pod's dir gone.
#[test]
fn the_relist_removes_a_pause_and_cgroups_whose_pod_is_gone() {
    let registry = Registry::start();
    let image = busybox(&registry);
    let mut agent = Agent::start(&registry);
    agent.write_manifest(
        "shared.yaml",
        &pod_yaml(
            "shared",
            "  shareProcessNamespace: true\n  terminationGracePeriodSeconds: 1\n",
            &sleeping(&image),
        ),
    );
    let record = agent.wait_running("shared");
    let uid = record["uid"].as_str().unwrap().to_owned();
    let pod_dir = agent.pod_dir(&record);
    let read_pid = |file: &str| -> u32 {
        fs::read_to_string(pod_dir.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (pause, monitor) = (read_pid("ns/pid.pause"), read_pid("monitor.pid"));
    agent.kill9();
    agent.remove_manifest("shared.yaml");
    for c in agent.runtime_containers() {
        common::run(
            std::process::Command::new(common::runtime())
                .arg("--root")
                .arg(agent.state.join("runtime"))
                .args(["delete", "--force", c["id"].as_str().unwrap()]),
        );
    }
    common::run(std::process::Command::new("kill").args(["-9", &monitor.to_string()]));
    for mount in common::mounts_under(&pod_dir) {
        common::run(std::process::Command::new("umount").arg("-l").arg(&mount));
    }
    fs::remove_dir_all(&pod_dir).unwrap();
    let alive = |pid: u32| {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        !stat.is_empty() && !stat.contains(") Z ")
    };
    let cgroups = format!("kubepods/besteffort/pod{uid}");
    assert!(alive(pause));
    assert!(!agent.cgroup_dirs(&cgroups).is_empty());
    agent.spawn();
    // The relist's first pass comes 20 s after the start.
    let after_relist = Duration::from_secs(60);
    agent.wait_for("the pause gone", after_relist, |_| {
        (!alive(pause)).then_some(())
    });
    agent.wait_for("the pod's cgroups gone", after_relist, |a| {
        a.cgroup_dirs(&cgroups).is_empty().then_some(())
    });
    assert!(agent.log().contains("which no pod owns"), "{}", agent.log());
}
