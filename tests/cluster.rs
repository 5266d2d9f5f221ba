//! Cluster mode end to end: nanolet joins the test API server as a node and
//! runs the pods `kubectl apply` binds to it, under real runc, with images
//! from a real registry on loopback. Every check goes through the real
//! kubectl or the API server's record of requests.

mod common;

use std::time::{Duration, Instant};

use common::apiserver::ApiServer;
use common::{Agent, Registry};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// Polls `check` until it gives a value, or panics with the agent's log.
fn wait<V>(
    agent: &Agent,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<V>,
) -> V {
    let deadline = Instant::now() + timeout;
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

fn get(api: &ApiServer, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let (ok, out, _) = api.kubectl(&all, None);
    ok.then(|| serde_json::from_str(&out).ok()).flatten()
}

fn pod_manifest(name: &str, image: &str, spec: &str, command: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 3\n  automountServiceAccountToken: false\n{spec}  containers:\n  - name: main\n    image: {image}\n    command: [\"sh\", \"-c\", {command:?}]\n"
    )
}

fn phase_and_reason(api: &ApiServer, pod: &str) -> Option<(String, String)> {
    let p = get(api, &["get", "pod", pod])?;
    let phase = p["status"]["phase"].as_str()?.to_owned();
    let state = &p["status"]["containerStatuses"][0]["state"];
    let reason = state["terminated"]["reason"]
        .as_str()
        .or(state["waiting"]["reason"].as_str())
        .or(p["status"]["reason"].as_str())
        .unwrap_or("")
        .to_owned();
    Some((phase, reason))
}

#[test]
fn node_registers_runs_pods_and_deletes_them() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let api = ApiServer::start();
    let agent = Agent::join(&registry, &api, "edge-1", &["--node-labels", "site=lab"]);

    // The node: Ready, with upstream's labels, nodeInfo and resources.
    let node = wait(&agent, "node Ready", T, || {
        let n = get(&api, &["get", "node", "edge-1"])?;
        let ready = n["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then_some(n)
    });
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], "edge-1");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["site"], "lab");
    assert!(labels["kubernetes.io/arch"].is_string());
    let info = &node["status"]["nodeInfo"];
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .unwrap()
            .starts_with("runc://")
    );
    assert!(info["kubeletVersion"].as_str().unwrap().starts_with("v1."));
    assert!(!info["bootID"].as_str().unwrap().is_empty());
    assert_eq!(node["status"]["capacity"]["pods"], "110");
    assert!(node["status"]["allocatable"]["memory"].is_string());
    let conditions: Vec<&str> = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    for c in ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"] {
        assert!(conditions.contains(&c), "{conditions:?}");
    }
    let addresses = node["status"]["addresses"].to_string();
    assert!(addresses.contains("127.0.0.1"), "{addresses}");
    let wide = api.kubectl_ok(&["get", "nodes", "-o", "wide"], None);
    assert!(
        wide.contains("edge-1") && wide.contains(" Ready "),
        "{wide}"
    );
    let lease = wait(&agent, "the node's Lease", T, || {
        get(&api, &["get", "lease", "-n", "kube-node-lease", "edge-1"])
    });
    assert_eq!(lease["spec"]["holderIdentity"], "edge-1");
    assert_eq!(lease["metadata"]["ownerReferences"][0]["kind"], "Node");

    // A long-running pod, one that fails, one nanolet refuses.
    let manifests = [
        pod_manifest("web", &image, "", "echo hello; sleep 3600"),
        pod_manifest("fails", &image, "  restartPolicy: Never\n", "exit 3"),
        pod_manifest("odd", &image, "  shareProcessNamespace: true\n", "sleep 1"),
    ]
    .join("---\n");
    api.kubectl_ok(&["apply", "-f", "-"], Some(&manifests));
    wait(&agent, "web Running", T, || {
        (phase_and_reason(&api, "web")? == ("Running".into(), String::new())).then_some(())
    });
    let web = get(&api, &["get", "pod", "web"]).unwrap();
    let status = &web["status"];
    assert_eq!(status["containerStatuses"][0]["ready"], true);
    assert!(
        status["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap()
            .starts_with("runc://")
    );
    assert_eq!(status["hostIP"], "127.0.0.1");
    assert!(status["startTime"].is_string());
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    assert!(ready.get("reason").is_none(), "{ready}");
    let row = api.kubectl_ok(&["get", "pod", "web", "-o", "wide"], None);
    assert!(
        row.contains("1/1") && row.contains("Running") && row.contains("edge-1"),
        "{row}"
    );

    wait(&agent, "fails Failed", T, || {
        (phase_and_reason(&api, "fails")? == ("Failed".into(), "Error".into())).then_some(())
    });
    let fails = get(&api, &["get", "pod", "fails"]).unwrap();
    assert_eq!(
        fails["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        3
    );
    wait(&agent, "odd rejected", T, || {
        (phase_and_reason(&api, "odd")? == ("Failed".into(), "UnsupportedPodSpec".into()))
            .then_some(())
    });
    let odd = get(&api, &["get", "pod", "odd"]).unwrap();
    let message = odd["status"]["message"].as_str().unwrap();
    assert!(message.contains("spec.shareProcessNamespace"), "{message}");

    // Deletion: graceful stop, then the kubelet's own delete (grace 0, UID
    // precondition) makes the pod disappear.
    let started = Instant::now();
    api.kubectl_ok(
        &["delete", "pod", "web", "--wait=true", "--timeout=30s"],
        None,
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(get(&api, &["get", "pod", "web"]).is_none());
    wait(&agent, "web's container gone", T, || {
        agent.runtime_containers().is_empty().then_some(())
    });
    let requests: Value = serde_json::from_str(&api.admin("GET", "/requests")).unwrap();
    let deletes: Vec<&Value> = requests
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["method"] == "DELETE" && r["user"] == "system:node:edge-1")
        .collect();
    assert!(
        deletes
            .iter()
            .any(|r| r["path"] == "/api/v1/namespaces/default/pods/web"),
        "{deletes:?}"
    );
    // A rejected pod is deleted at once: nothing runs it.
    api.kubectl_ok(&["delete", "pod", "odd", "fails", "--timeout=30s"], None);
    let left = api.kubectl_ok(&["get", "pods", "-o", "name"], None);
    assert_eq!(left.trim(), "", "{left}");
}
