//! The pod network through real CNI plugins (Debian's bridge, host-local and
//! portmap): addresses in the pod status and /etc/hosts, pod-to-pod traffic,
//! host ports, DEL on deletion, also after `kill -9` of the agent, CHECK on
//! adoption and a failed DEL retried by the next agent. The
//! agent runs in a network namespace of the test's own, so the bridge, the
//! veths and the iptables rules never touch the host's network.

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::{Agent, Registry, TempDir, TestNetns, pod_yaml, run};

const T: Duration = Duration::from_secs(30);

fn write_network(agent: &Agent) -> std::path::PathBuf {
    let ipam = agent.dir.path().join("ipam");
    let config = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "nltest",
        "plugins": [
            {"type": "bridge", "bridge": "nltest0", "isGateway": true, "ipMasq": true,
             "ipam": {"type": "host-local", "dataDir": ipam,
                      "ranges": [[{"subnet": "10.99.0.0/24"}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]
    });
    let dir = agent.dir.path().join("cni");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("10-test.conflist"), config.to_string()).unwrap();
    ipam.join("nltest")
}

/// Addresses host-local has handed out and not taken back.
fn leased(ipam: &Path) -> Vec<String> {
    fs::read_dir(ipam)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("10.99."))
                .collect()
        })
        .unwrap_or_default()
}

fn pod_ip(agent: &Agent, pod: &str) -> String {
    let record = agent.wait_running(pod);
    record["status"]["podIP"]
        .as_str()
        .unwrap_or_else(|| panic!("{pod} has no podIP: {record:#}"))
        .to_owned()
}

#[test]
fn pods_get_addresses_reach_each_other_publish_host_ports_and_release_them() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let netns = TestNetns::new();
    netns.forward(&registry.addr);
    let mut agent = Agent::start_in(&registry, Some(&netns), &[]);
    let ipam = write_network(&agent);

    let serve = "mkdir -p /www && echo hello-from-server > /www/index.html && exec /bin/busybox httpd -f -p 80 -h /www";
    agent.write_manifest(
        "server.yaml",
        // In a user namespace of its own: the network's plugins reach a
        // network namespace that namespace owns, and its root binds port 80.
        &pod_yaml(
            "server",
            "  terminationGracePeriodSeconds: 2\n  hostUsers: false\n",
            &format!(
                "  - name: web\n    image: {image}\n    command: [sh, -c, {serve:?}]\n    ports:\n    - {{containerPort: 80, hostPort: 8080}}\n    readinessProbe: {{tcpSocket: {{port: 80}}, periodSeconds: 1}}\n"
            ),
        ),
    );
    let server_ip = pod_ip(&agent, "server");
    // Probed at its pod IP.
    agent.wait_for("the server ready", T, |a| {
        let c = a.container_status("server", "web")?;
        (c["ready"] == true).then_some(())
    });
    assert!(server_ip.starts_with("10.99.0."), "{server_ip}");

    let fetch = format!(
        "echo hosts=$(grep client /etc/hosts | cut -f1); until wget -qO- http://{server_ip}/; do sleep 0.2; done; sleep 3600"
    );
    agent.write_manifest(
        "client.yaml",
        &pod_yaml(
            "client",
            "  terminationGracePeriodSeconds: 2\n",
            &format!("  - name: c\n    image: {image}\n    command: [sh, -c, {fetch:?}]\n"),
        ),
    );
    let client_ip = pod_ip(&agent, "client");
    assert_ne!(client_ip, server_ip);
    let logs = agent.wait_for("the client to reach the server", T, |a| {
        let logs = a.logs("default/client", None);
        logs.contains("hello-from-server").then_some(logs)
    });
    assert!(logs.contains(&format!("hosts={client_ip}")), "{logs}");
    assert_eq!(leased(&ipam).len(), 2, "{:?}", leased(&ipam));

    // A pod that ran to its end gives its address back while it is still
    // there to read, its IP kept in its status.
    agent.write_manifest(
        "job.yaml",
        &pod_yaml(
            "job",
            "  restartPolicy: Never\n",
            &format!("  - name: c\n    image: {image}\n    command: [sleep, '2']\n"),
        ),
    );
    let job_ip = pod_ip(&agent, "job");
    assert_eq!(leased(&ipam).len(), 3, "{:?}", leased(&ipam));
    let finished = agent.wait_for("the finished job's address back", T, |a| {
        let record = a.record("job")?;
        (record["status"]["phase"] == "Succeeded" && leased(&ipam).len() == 2).then_some(record)
    });
    assert_eq!(finished["status"]["podIP"], job_ip.as_str(), "{finished:#}");
    assert!(!leased(&ipam).contains(&job_ip), "{:?}", leased(&ipam));
    agent.remove_manifest("job.yaml");
    agent.wait_for("the job gone", T, |a| {
        a.record("job").is_none().then_some(())
    });

    // The host port, from the pods' host (the test's namespace).
    let mut via_host_port = String::new();
    for _ in 0..50 {
        let out = netns
            .command("curl")
            .args(["-sS", "-m", "2", "http://10.99.0.1:8080/"])
            .output()
            .unwrap();
        via_host_port = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if via_host_port.contains("hello-from-server") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        via_host_port.contains("hello-from-server"),
        "{via_host_port:?}\n{}\n{}",
        run(netns.command("iptables").args(["-t", "nat", "-S"])),
        agent.log()
    );

    // Deleted normally: its address goes back.
    agent.remove_manifest("client.yaml");
    agent.wait_for("the client gone", T, |a| {
        a.record("client").is_none().then_some(())
    });
    assert_eq!(leased(&ipam), vec![server_ip.clone()]);

    // Deleted while the agent was dead: the next agent still runs DEL.
    agent.kill9();
    agent.remove_manifest("server.yaml");
    agent.spawn();
    agent.wait_for("the server gone", T, |a| {
        a.record("server").is_none().then_some(())
    });
    assert_eq!(leased(&ipam), Vec::<String>::new());
    let links = netns.links();
    assert!(!links.contains("veth"), "{links}");
    let nat = run(netns.command("iptables").args(["-t", "nat", "-S"]));
    assert!(!nat.contains("8080"), "{nat}");
}

#[test]
fn a_host_port_without_a_network_is_a_sandbox_error_not_a_silent_drop() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let agent = Agent::start(&registry);
    agent.write_manifest(
        "p.yaml",
        &pod_yaml(
            "p",
            "",
            &format!(
                "  - name: c\n    image: {image}\n    command: [sleep, '3600']\n    ports:\n    - {{containerPort: 80, hostPort: 8080}}\n"
            ),
        ),
    );
    let waiting = agent.wait_for("the sandbox error", T, |a| {
        let c = a.container_status("p", "c")?;
        (c["state"]["waiting"]["reason"] == "CreatePodSandboxError").then_some(c)
    });
    let message = waiting["state"]["waiting"]["message"].as_str().unwrap();
    assert!(message.contains("hostPort"), "{message}");
}

#[test]
fn a_broken_attachment_is_checked_on_adoption_and_a_failed_del_retried() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let netns = TestNetns::new();
    netns.forward(&registry.addr);
    // Plugins through a dir of the test's own, so they can go missing.
    let scratch = TempDir::new("nanolet-cni-bin");
    let bin = scratch.path().join("bin");
    let link_plugins = || {
        fs::create_dir_all(&bin).unwrap();
        for plugin in ["bridge", "host-local", "portmap"] {
            let _ = std::os::unix::fs::symlink(format!("/usr/lib/cni/{plugin}"), bin.join(plugin));
        }
    };
    link_plugins();
    let bin_arg = bin.to_string_lossy().into_owned();
    let mut agent = Agent::start_in(&registry, Some(&netns), &["--cni-bin-dir", &bin_arg]);
    let ipam = write_network(&agent);
    agent.write_manifest(
        "p.yaml",
        &pod_yaml(
            "p",
            "  terminationGracePeriodSeconds: 1\n",
            &format!("  - name: c\n    image: {image}\n    command: [sleep, '3600']\n"),
        ),
    );
    let ip = pod_ip(&agent, "p");
    assert_eq!(leased(&ipam), vec![ip.clone()]);

    // The pod's veth vanishes while the agent is down: the next agent's
    // CHECK says so, and the pod keeps running.
    agent.kill9();
    let links = netns.links();
    let veth = links
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .find(|name| name.starts_with("veth"))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .unwrap_or_else(|| panic!("no veth: {links}"));
    run(netns.command("ip").args(["link", "del", &veth]));
    agent.spawn();
    agent.wait_for("the failed CHECK reported", T, |a| {
        a.log().contains("failed (CHECK)").then_some(())
    });
    let c = agent.container_status("p", "c").unwrap();
    assert_eq!(c["restartCount"], 0, "{c:#}");

    // DEL fails (the plugins are gone): the pod goes, its attachment is
    // parked, and the address stays leased...
    fs::remove_dir_all(&bin).unwrap();
    agent.remove_manifest("p.yaml");
    agent.wait_for("the pod gone", T, |a| a.record("p").is_none().then_some(()));
    let parked = agent.state.join("cni-parked");
    assert_eq!(fs::read_dir(&parked).unwrap().count(), 1);
    assert_eq!(leased(&ipam), vec![ip]);
    // ... until an agent starts with the plugins back.
    link_plugins();
    agent.kill9();
    agent.spawn();
    agent.wait_for("the parked DEL done", T, |_| {
        leased(&ipam).is_empty().then_some(())
    });
    assert_eq!(fs::read_dir(&parked).unwrap().count(), 0);
}
