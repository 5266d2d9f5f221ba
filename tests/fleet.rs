//! A fleet joins and stays joined. A node that starts with only a bootstrap
//! token: TLS bootstrap through the test API server's bootstrap tokens,
//! csrapproving controller and signer, two rotations of the client and of
//! the serving certificate with pods undisturbed, a client certificate that
//! expires while the link is down, and a node whose certificate expired
//! while it was off coming back through the bootstrap credentials with a
//! clock behind the new certificate. And nodes coming back after an outage
//! spread over time, not in one wave.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::apiserver::ApiServer;
use common::{Agent, Registry, TempDir, wait};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

fn get(api: &ApiServer, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let (ok, out, _) = api.kubectl(&all, None);
    ok.then(|| serde_json::from_str(&out).ok()).flatten()
}

fn node_ready(api: &ApiServer, node: &str) -> bool {
    get(api, &["get", "node", node]).is_some_and(|n| {
        n["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    })
}

fn running(api: &ApiServer, pod: &str) -> Option<Value> {
    let p = get(api, &["get", "pod", pod])?;
    let status = p["status"]["containerStatuses"][0].clone();
    status["state"]["running"].is_object().then_some(status)
}

/// The cluster side of a fleet's join, as kubeadm sets it up: a bootstrap
/// token, the bootstrappers' right to ask for certificates, their requests
/// and the nodes' renewals approved. Returns the bootstrap kubeconfig.
fn bootstrap_token(api: &ApiServer, id: &str, dir: &Path) -> PathBuf {
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": id, "token-secret": "0123456789abcdef",
                       "usage-bootstrap-authentication": "true"}});
    api.kubectl_ok(&["apply", "-f", "-"], Some(&secret.to_string()));
    for (name, role, group) in [
        (
            "kubelet-bootstrap",
            "system:node-bootstrapper",
            "system:bootstrappers",
        ),
        (
            "node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers",
        ),
        (
            "node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        api.kubectl_ok(
            &[
                "create",
                "clusterrolebinding",
                name,
                &format!("--clusterrole={role}"),
                &format!("--group={group}"),
            ],
            None,
        );
    }
    let path = dir.join("bootstrap.kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{}\", certificate-authority: \"{}\"}}\nusers:\n- name: b\n  user: {{token: \"{id}.0123456789abcdef\"}}\ncontexts:\n- name: b\n  context: {{cluster: c, user: b}}\ncurrent-context: b\n",
        api.url,
        api.dir.join("ca.crt").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// An agent for `node` with a bootstrap kubeconfig and no kubeconfig yet,
/// and the port of its kubelet API.
fn bootstrapping_agent(
    registry: &Registry,
    api: &ApiServer,
    node: &str,
    work: &Path,
    extra: &[&str],
) -> (Agent, String) {
    let bootstrap = bootstrap_token(api, &node.replace("edge-", "boot"), work);
    let mut args: Vec<String> = vec![
        "--bootstrap-kubeconfig".into(),
        bootstrap.display().to_string(),
        "--kubeconfig".into(),
        work.join("kubeconfig").display().to_string(),
        "--cert-dir".into(),
        work.join("pki").display().to_string(),
        "--rotate-certificates=true".into(),
    ];
    args.extend(common::node_args(api, node));
    let port = args[args.iter().position(|a| a == "--port").unwrap() + 1].clone();
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = Agent::unstarted(registry, None, &args);
    agent.spawn();
    (agent, port)
}

/// The kubelet API's certificate, checked against the cluster's CA: its
/// subject if it verifies, else None.
fn served_by_the_cluster(api: &ApiServer, port: &str) -> Option<String> {
    served_certificate(api, port).map(|(subject, _)| subject)
}

/// The kubelet API's certificate if it verifies against the cluster's CA:
/// its subject and its PEM.
fn served_certificate(api: &ApiServer, port: &str) -> Option<(String, String)> {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-verify_return_error",
            "-CAfile",
        ])
        .arg(api.dir.join("ca.crt"))
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let subject = text.lines().find(|l| l.starts_with("subject="))?.to_owned();
    let begin = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[begin..].find("-----END CERTIFICATE-----")? + begin;
    let pem = text[begin..end].to_owned();
    (out.status.success() && text.contains("Verify return code: 0 (ok)")).then_some((subject, pem))
}

/// Approves the serving requests nobody approved yet, as an administrator
/// (or a serving-certificate approver) would.
fn approve_serving_requests(api: &ApiServer) {
    let pending: Vec<String> = get(api, &["get", "csr"])
        .and_then(|list| list["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
                && c["status"]["conditions"]
                    .as_array()
                    .is_none_or(|c| c.is_empty())
        })
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    for name in pending {
        api.kubectl_ok(&["certificate", "approve", &name], None);
    }
}

/// The client certificate requests `username` made that were issued.
fn issued_to(api: &ApiServer, username: &str) -> Vec<Value> {
    get(api, &["get", "csr"])
        .and_then(|list| list["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|csr| {
            csr["spec"]["username"] == username
                && csr["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
                && csr["status"]["certificate"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
        })
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o777
}

/// The pod's one container: busybox printing a line, then sleeping.
fn pod(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  automountServiceAccountToken: false\n  containers:\n  - name: main\n    image: {image}\n    command: [sh, -c, 'echo hello from {name}; exec sleep 3600']\n"
    )
}

#[test]
fn a_node_with_only_a_bootstrap_token_joins_and_rotates_its_certificate() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    // Certificates for 40 s: two rotations (at 70-90 % of it) in a minute
    // and a half.
    let api = ApiServer::start_with(&["--cluster-signing-duration", "40"]);
    let work = TempDir::new("nanolet-bootstrap");
    let config = work.path().join("config.yaml");
    std::fs::write(
        &config,
        "kind: KubeletConfiguration\nserverTLSBootstrap: true\n",
    )
    .unwrap();
    let (agent, port) = bootstrapping_agent(
        &registry,
        &api,
        "edge-32",
        work.path(),
        &["--config", config.to_str().unwrap()],
    );
    wait(&agent, "node Ready", T, || {
        node_ready(&api, "edge-32").then_some(())
    });

    // Asked for by the bootstrap token, approved, written with the key.
    let bootstrapped = issued_to(&api, "system:bootstrap:boot32");
    assert_eq!(bootstrapped.len(), 1, "{bootstrapped:?}");
    let name = bootstrapped[0]["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("node-csr-"), "{name}");
    assert_eq!(
        bootstrapped[0]["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    let kubeconfig = work.path().join("kubeconfig");
    assert_eq!(mode(&kubeconfig), 0o600);
    let current = work.path().join("pki/kubelet-client-current.pem");
    assert!(std::fs::read_link(&current).is_ok());
    assert_eq!(mode(&current), 0o600);
    assert!(!work.path().join("pki/kubelet-client.key.tmp").exists());
    // The written kubeconfig is one kubectl can use: it is the node's.
    let (ok, out, err) =
        api.kubectl_with(&kubeconfig, &["get", "node", "edge-32", "-o", "name"], None);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "node/edge-32");

    // The serving certificate: self-signed until an administrator approves
    // the node's request (the approver never approves serving requests).
    assert_eq!(served_by_the_cluster(&api, &port), None);
    let serving = wait(&agent, "the serving request", T, || {
        get(&api, &["get", "csr"])?["items"]
            .as_array()?
            .iter()
            .find(|c| c["spec"]["signerName"] == "kubernetes.io/kubelet-serving")
            .cloned()
    });
    assert_eq!(serving["spec"]["username"], "system:node:edge-32");
    assert!(
        agent
            .log()
            .contains("serves a self-signed certificate until")
    );
    let name = serving["metadata"]["name"].as_str().unwrap();
    api.kubectl_ok(&["certificate", "approve", name], None);
    let (subject, first_serving) = wait(&agent, "the cluster's serving certificate", T, || {
        served_certificate(&api, &port)
    });
    assert!(subject.contains("system:node:edge-32"), "{subject}");
    let events = api.kubectl_ok(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=Node,reason=ServingCertificate",
        ],
        None,
    );
    assert!(
        events.contains("the certificate the cluster issued"),
        "{events}"
    );

    // A pod, its logs and exec: the API server reaches the kubelet API.
    api.kubectl_ok(&["apply", "-f", "-"], Some(&pod("app", &image)));
    let before = wait(&agent, "app running", T, || running(&api, "app"));
    let logs = wait(&agent, "app's logs", T, || {
        let (ok, out, _) = api.kubectl(&["logs", "app"], None);
        (ok && out.contains("hello from app")).then_some(out)
    });
    assert_eq!(logs.trim(), "hello from app");
    let (ok, out, err) = api.kubectl(&["exec", "app", "--", "echo", "exec works"], None);
    assert!(ok && out.trim() == "exec works", "{out} {err}");

    // Two rotations of each certificate, asked for by the node itself with
    // its client certificate; the serving requests approved as they come.
    let mut served = std::collections::BTreeSet::from([first_serving]);
    wait(
        &agent,
        "two rotations of each",
        Duration::from_secs(150),
        || {
            approve_serving_requests(&api);
            served.extend(served_certificate(&api, &port).map(|(_, pem)| pem));
            (agent.log().matches("client certificate rotated").count() >= 2 && served.len() >= 3)
                .then_some(())
        },
    );
    // The API server reaches the kubelet API through the newest one.
    let (ok, out, err) = api.kubectl(&["exec", "app", "--", "echo", "still works"], None);
    assert!(ok && out.trim() == "still works", "{out} {err}");
    let renewed = issued_to(&api, "system:node:edge-32");
    assert!(renewed.len() >= 2, "{renewed:?}");
    assert!(
        renewed.iter().all(|csr| csr["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("csr-"))),
        "{renewed:?}"
    );
    // Every certificate before the last has expired by now: what the node
    // sends goes out with the new one, the watch of its pods included.
    api.kubectl_ok(&["apply", "-f", "-"], Some(&pod("later", &image)));
    wait(&agent, "later running", T, || running(&api, "later"));
    assert!(node_ready(&api, "edge-32"));
    // The first pod went on as it was: same container, never restarted.
    let after = running(&api, "app").unwrap();
    assert_eq!(after["containerID"], before["containerID"]);
    assert_eq!(after["restartCount"], 0);
    let pairs = std::fs::read_dir(work.path().join("pki"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name().into_string().unwrap();
            name.starts_with("kubelet-client-2")
        })
        .count();
    assert!(pairs >= 3, "{pairs} pairs");
    // No request went out with a certificate the server no longer takes
    // (a resumed TLS session keeps the identity it was made with).
    let log = agent.log();
    assert!(!log.contains("401 Unauthorized"), "{log}");
}

/// The node is off past its certificate's end; when it starts again its
/// certificate has expired and the bootstrap token gets it a new one,
/// which this node's clock says is not valid yet (as on a board without a
/// real-time clock before NTP): it says so, keeps its pods running and its
/// credentials, and goes on once the certificate is valid.
#[test]
fn a_node_off_past_its_certificates_end_rejoins_through_the_bootstrap_token() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let api = ApiServer::start_with(&["--cluster-signing-duration", "30"]);
    let work = TempDir::new("nanolet-rejoin");
    let (mut agent, _) = bootstrapping_agent(&registry, &api, "edge-33", work.path(), &[]);
    api.kubectl_ok(&["apply", "-f", "-"], Some(&pod("app", &image)));
    let before = wait(&agent, "app running", T, || running(&api, "app"));

    agent.kill9();
    // Off until the node's last certificate has expired.
    let current = work.path().join("pki/kubelet-client-current.pem");
    let last = std::fs::read_link(&current).unwrap();
    let unexpired = || {
        Command::new("openssl")
            .args(["x509", "-noout", "-checkend", "0", "-in"])
            .arg(&current)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(unexpired(), "valid when the node stopped");
    wait(&agent, "the certificate to expire", T, || {
        (!unexpired()).then_some(())
    });
    // Issued from now on valid only 20 s ahead: to this node, its clock is
    // behind.
    api.admin("POST", "/signing?not-before=20&duration=3600");
    const VALID_NOW: &str = "the client certificate is valid now";
    let valid_before = agent.log().matches(VALID_NOW).count();
    let restarted = Instant::now();
    agent.spawn();
    wait(&agent, "the clock named in the log", T, || {
        agent
            .log()
            .contains("this node's clock reads")
            .then_some(())
    });
    assert_eq!(issued_to(&api, "system:bootstrap:boot33").len(), 2);
    // Kept, not deleted: the new pair, and the one that expired.
    assert_ne!(std::fs::read_link(&current).unwrap(), last);
    assert!(work.path().join("pki").join(&last).exists());
    // While the node waits for its clock, its pod runs on (adopted, not
    // started again).
    let record = agent.wait_running("app");
    assert_eq!(record["status"]["containerStatuses"][0]["restartCount"], 0);
    assert!(
        agent.log().matches(VALID_NOW).count() == valid_before,
        "the wait was not seen: {}s after the start",
        restarted.elapsed().as_secs()
    );

    // Valid now: the node is back, and new pods come.
    api.kubectl_ok(&["apply", "-f", "-"], Some(&pod("later", &image)));
    wait(&agent, "later running", T, || running(&api, "later"));
    assert!(agent.log().matches(VALID_NOW).count() > valid_before);
    let after = running(&api, "app").unwrap();
    assert_eq!(after["containerID"], before["containerID"]);
    assert_eq!(after["restartCount"], 0);
}

/// The node's link is down from before its certificate's rotation until
/// after the certificate's end, with the agent running all along: as
/// upstream's certificate manager with an expired certificate, it asks for
/// a new one with its bootstrap credentials, and its pod runs on.
#[test]
fn a_certificate_that_expires_while_the_link_is_down_is_replaced_through_the_bootstrap_token() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let api = ApiServer::start_with(&["--cluster-signing-duration", "30"]);
    let work = TempDir::new("nanolet-expiry");
    let (agent, _) = bootstrapping_agent(&registry, &api, "edge-40", work.path(), &[]);
    api.kubectl_ok(&["apply", "-f", "-"], Some(&pod("app", &image)));
    let before = wait(&agent, "app running", T, || running(&api, "app"));
    assert_eq!(issued_to(&api, "system:bootstrap:boot40").len(), 1);

    // The node's requests hang from now on (its bootstrap token's do not:
    // the cut is by user).
    api.admin("POST", "/pause?user=system:node:edge-40");
    let current = work.path().join("pki/kubelet-client-current.pem");
    wait(&agent, "the certificate to expire", T, || {
        let expired = !Command::new("openssl")
            .args(["x509", "-noout", "-checkend", "0", "-in"])
            .arg(&current)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        expired.then_some(())
    });
    wait(&agent, "a bootstrap with the token", T, || {
        (issued_to(&api, "system:bootstrap:boot40").len() == 2).then_some(())
    });
    let log = agent.log();
    assert!(log.contains("the client certificate expired at"), "{log}");
    assert!(
        issued_to(&api, "system:node:edge-40").is_empty(),
        "a renewal went through the cut"
    );

    api.admin("POST", "/resume");
    api.kubectl_ok(&["apply", "-f", "-"], Some(&pod("later", &image)));
    wait(&agent, "later running", T, || running(&api, "later"));
    // The lifecycle controller marked the node NotReady during the cut: its
    // next Lease renewal and status report make it Ready again.
    wait(&agent, "node Ready", T, || {
        node_ready(&api, "edge-40").then_some(())
    });
    let after = running(&api, "app").unwrap();
    assert_eq!(after["containerID"], before["containerID"]);
    assert_eq!(after["restartCount"], 0);
}

/// After an outage, the nodes of a fleet come back spread over time: six
/// nodes, the API server unreachable for 20 s (new connections dropped,
/// open ones hung, as behind a broken link), then every request that
/// arrives in the minute after it returns, counted per second.
#[test]
fn after_an_outage_the_nodes_come_back_spread_over_time() {
    let registry = Registry::start();
    let api = ApiServer::start();
    let nodes: Vec<String> = (34..40).map(|i| format!("edge-{i}")).collect();
    let agents: Vec<Agent> = nodes
        .iter()
        .map(|node| Agent::join(&registry, &api, node, &[]))
        .collect();
    for (agent, node) in agents.iter().zip(&nodes) {
        wait(agent, "node Ready", T, || {
            node_ready(&api, node).then_some(())
        });
    }
    api.admin("POST", "/pause");
    std::thread::sleep(Duration::from_secs(20));
    let back = jiff::Timestamp::now().as_millisecond();
    api.admin("POST", "/resume");
    std::thread::sleep(Duration::from_secs(61));
    let users: Vec<String> = nodes.iter().map(|n| format!("system:node:{n}")).collect();
    let all: Vec<Value> = serde_json::from_str(&api.admin("GET", "/requests")).unwrap();
    let arrived: Vec<(i64, &str)> = all
        .iter()
        .filter_map(|r| {
            let at = r["at_ms"].as_i64()? - back;
            let user = r["user"].as_str()?;
            ((0..60_000).contains(&at) && users.iter().any(|u| u == user)).then_some((at, user))
        })
        .collect();
    let mut per_second = [0usize; 60];
    for (at, _) in &arrived {
        per_second[(*at / 1000) as usize] += 1;
    }
    let per_ten: Vec<usize> = per_second.chunks(10).map(|c| c.iter().sum()).collect();
    let busiest = per_second.iter().max().copied().unwrap_or(0);
    let total = arrived.len();
    println!(
        "the minute after the outage: {total} requests from {} nodes; per 10 s {per_ten:?}; busiest second {busiest}",
        nodes.len()
    );
    // Every node came back within the minute...
    for user in &users {
        assert!(
            arrived.iter().any(|(_, u)| u == user),
            "{user} did not come back"
        );
    }
    // ...and not in one wave: no second carries a fifth of the minute's
    // requests (six nodes retrying together would put at least their
    // lease, status and pod list in one second: a third or more). Each
    // node renews its Lease at least five times in the minute: its first
    // try after trouble within 1.5 intervals (15 s), then every 10-10.4 s.
    assert!(
        total >= 30,
        "{total} requests: the leases alone are 30 or more"
    );
    assert!(busiest * 5 <= total, "{per_second:?}");
}
