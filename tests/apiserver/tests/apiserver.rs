//! The test API server as its clients see it: the real kubectl, and raw
//! HTTP (curl) for the semantics kubectl hides: watches, 410, patches,
//! preconditions, optimistic concurrency.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../../common/apiserver.rs"]
mod fixture;
use fixture::ApiServer;

/// Now in RFC 3339 (MicroTime), from the system clock via `date`.
fn jiff_like_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.000000Z"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn rv(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sleep, '3600']\n";

fn ready_node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": null, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}], "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Debian", "kernelVersion": "6.1", "containerRuntimeVersion": "runc://1.1.5",
                   "machineID": "m", "systemUUID": "s", "bootID": "b", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}})
}

#[test]
fn kubectl_apply_get_describe_delete() {
    let s = ApiServer::start();
    assert!(
        s.kubectl_ok(&["apply", "-f", "-"], Some(POD))
            .contains("pod/web created")
    );
    let table = s.kubectl_ok(&["get", "pods", "-o", "wide"], None);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED",
            "NODE",
            "READINESS",
            "GATES"
        ]
    );
    assert!(table.lines().nth(1).unwrap().starts_with("web "), "{table}");
    assert!(
        table.contains("0/1") && table.contains("Pending"),
        "{table}"
    );
    // Defaulting as the real server does it.
    let yaml = s.kubectl_ok(&["get", "pod", "web", "-o", "json"], None);
    let pod: Value = serde_json::from_str(&yaml).unwrap();
    assert_eq!(pod["spec"]["restartPolicy"], "Always");
    assert_eq!(
        pod["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );
    assert_eq!(
        pod["spec"]["containers"][0]["terminationMessagePolicy"],
        "File"
    );
    assert_eq!(pod["spec"]["serviceAccountName"], "default");
    assert!(
        pod["spec"]["volumes"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("kube-api-access-")
    );
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    assert_eq!(pod["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(
        s.kubectl_ok(&["describe", "pod", "web"], None)
            .contains("Name:")
    );
    assert!(
        s.kubectl_ok(&["apply", "-f", "-"], Some(POD))
            .contains("unchanged")
    );
    let relabelled = POD.replace("app: web", "app: shop");
    assert!(
        s.kubectl_ok(&["apply", "-f", "-"], Some(&relabelled))
            .contains("configured")
    );
    assert!(
        s.kubectl_ok(&["get", "pods", "-l", "app=shop", "-o", "name"], None)
            .contains("pod/web")
    );
    // An unbound pod is deleted at once; kubectl waits for it to be gone.
    assert!(
        s.kubectl_ok(&["delete", "pod", "web", "--timeout=10s"], None)
            .contains("deleted")
    );
    assert!(
        s.kubectl(&["get", "pod", "web"], None)
            .2
            .contains("pods \"web\" not found")
    );
    let namespaces = s.kubectl_ok(&["get", "ns"], None);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(namespaces.contains(ns), "{namespaces}");
    }
}

#[test]
fn authentication_by_certificate_and_token() {
    let s = ApiServer::start();
    let (code, body) = s.call_as(None, "GET", "/api/v1/pods", None);
    assert_eq!(code, 401);
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    assert_eq!(s.call_as(Some("wrong"), "GET", "/api/v1/pods", None).0, 401);
    assert_eq!(s.call_as(None, "GET", "/version", None).0, 200);
    assert_eq!(s.call("GET", "/api/v1/pods", None).0, 200);
    // A node's kubeconfig authenticates as system:node:<name>.
    let config = Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .args(["node-kubeconfig", "edge-1", "--dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    assert!(config.status.success());
    let file = s.dir.join("node.kubeconfig");
    std::fs::write(&file, &config.stdout).unwrap();
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&file)
        .args(["get", "nodes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let requests: Value = serde_json::from_str(&s.admin("GET", "/requests")).unwrap();
    let users: Vec<&str> = requests
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["user"].as_str())
        .collect();
    assert!(users.contains(&"system:node:edge-1"), "{users:?}");
    assert!(users.contains(&"admin-token"));
    assert!(users.contains(&"system:anonymous"));
}

#[test]
fn token_and_subject_access_reviews_as_kubelets_ask_them() {
    let s = ApiServer::start();
    let review = |token: &str| {
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}});
        let (code, answer) = s.call(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            Some(("application/json", &request)),
        );
        assert_eq!(code, 201, "{answer}");
        answer["status"].clone()
    };
    let admin = review(&s.token);
    assert_eq!(admin["authenticated"], true, "{admin}");
    assert!(
        admin["user"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:authenticated"))
    );
    assert_eq!(review("forged")["authenticated"], false);

    let access = |user: &str, groups: &[&str], attributes: Value| {
        let request = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}});
        let (code, answer) = s.call(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            Some(("application/json", &request)),
        );
        assert_eq!(code, 201, "{answer}");
        answer["status"]["allowed"] == true
    };
    let stats = json!({"verb": "get", "group": "", "version": "v1", "resource": "nodes",
        "subresource": "stats", "name": "edge-1"});
    assert!(access("root", &["system:masters"], stats.clone()));
    assert!(!access("alice", &["readers"], stats.clone()));
    // A ClusterRole bound to a group, limited to one node by name; a Role
    // bound in one namespace only.
    s.kubectl_ok(&["create", "namespace", "shop"], None);
    s.kubectl_ok(
        &["apply", "-f", "-"],
        Some("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: edge-1-stats}\nrules:\n- {apiGroups: [''], resources: [nodes/stats], resourceNames: [edge-1], verbs: [get, list]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: readers}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edge-1-stats}\nsubjects: [{kind: Group, name: readers}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: logs, namespace: shop}\nrules:\n- {apiGroups: [''], resources: [pods/log], verbs: ['*']}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: logs, namespace: shop}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: logs}\nsubjects: [{kind: User, name: bob}]\n"),
    );
    assert!(access("alice", &["readers"], stats.clone()));
    let mut other_node = stats.clone();
    other_node["name"] = "edge-2".into();
    assert!(!access("alice", &["readers"], other_node));
    let mut proxy = stats;
    proxy["subresource"] = "proxy".into();
    assert!(!access("alice", &["readers"], proxy));
    let logs = |namespace: &str| {
        json!({"verb": "get", "group": "", "version": "v1", "resource": "pods",
            "subresource": "log", "namespace": namespace, "name": "web"})
    };
    assert!(access("bob", &[], logs("shop")));
    assert!(!access("bob", &[], logs("default")));
}

fn configmap(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": name}})
}

#[test]
fn optimistic_concurrency_preconditions_and_patches() {
    let s = ApiServer::start();
    let (code, created) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(("application/json", &configmap("c", json!({})))),
    );
    assert_eq!(code, 201);
    let (code, again) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(("application/json", &configmap("c", json!({})))),
    );
    assert_eq!(
        (code, again["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );
    // Update with the current resourceVersion succeeds and bumps it...
    let mut update = created.clone();
    update["data"]["k"] = "v2".into();
    let (code, updated) = s.call(
        "PUT",
        "/api/v1/namespaces/default/configmaps/c",
        Some(("application/json", &update)),
    );
    assert_eq!(code, 200);
    assert!(rv(&updated) > rv(&created));
    // ... and a stale one is a conflict.
    let (code, conflict) = s.call(
        "PUT",
        "/api/v1/namespaces/default/configmaps/c",
        Some(("application/json", &update)),
    );
    assert_eq!(code, 409);
    assert_eq!(conflict["reason"], "Conflict");
    assert!(
        conflict["message"]
            .as_str()
            .unwrap()
            .contains("the object has been modified"),
        "{conflict}"
    );
    // Patches: merge, JSON and strategic; a uid precondition in the patch.
    let merge = json!({"metadata": {"labels": {"a": "1"}}});
    let (code, patched) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c",
        Some(("application/merge-patch+json", &merge)),
    );
    assert_eq!(
        (code, &patched["metadata"]["labels"]["a"]),
        (200, &json!("1"))
    );
    let ops = json!([{"op": "replace", "path": "/data/k", "value": "v3"}, {"op": "add", "path": "/data/n", "value": "x"}]);
    let (code, patched) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c",
        Some(("application/json-patch+json", &ops)),
    );
    assert_eq!(code, 200);
    assert_eq!(patched["data"], json!({"k": "v3", "n": "x"}));
    let wrong_uid =
        json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000", "labels": {"b": "2"}}});
    let (code, body) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/c",
        Some(("application/strategic-merge-patch+json", &wrong_uid)),
    );
    assert_eq!(code, 409);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("Precondition failed: UID in precondition"),
        "{body}"
    );
    // Delete with a wrong uid precondition fails; with the right one, goes.
    let options =
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "nope"}});
    assert_eq!(
        s.call(
            "DELETE",
            "/api/v1/namespaces/default/configmaps/c",
            Some(("application/json", &options))
        )
        .0,
        409
    );
    let options = json!({"preconditions": {"uid": created["metadata"]["uid"]}});
    assert_eq!(
        s.call(
            "DELETE",
            "/api/v1/namespaces/default/configmaps/c",
            Some(("application/json", &options))
        )
        .0,
        200
    );
    let (code, gone) = s.call("GET", "/api/v1/namespaces/default/configmaps/c", None);
    assert_eq!(
        (code, gone["message"].as_str()),
        (404, Some("configmaps \"c\" not found"))
    );
    // Strict field validation, as kubectl asks for it.
    let mut bad = configmap("d", json!({}));
    bad["spec"] = json!({"oops": 1});
    let (code, body) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
        Some(("application/json", &bad)),
    );
    assert_eq!(code, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"spec\""),
        "{body}"
    );
    let generated =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}});
    let (code, body) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(("application/json", &generated)),
    );
    assert_eq!(code, 201);
    let name = body["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
}

#[test]
fn pod_status_strategic_merge_by_condition_type() {
    let s = ApiServer::start();
    s.kubectl_ok(&["apply", "-f", "-"], Some(POD));
    let status = json!({"status": {"conditions": [
        {"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}});
    let (code, _) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/pods/web/status",
        Some(("application/strategic-merge-patch+json", &status)),
    );
    assert_eq!(code, 200);
    let update = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}});
    let (code, pod) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/pods/web/status",
        Some(("application/strategic-merge-patch+json", &update)),
    );
    assert_eq!(code, 200);
    let conditions = pod["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 2, "{conditions:?}");
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    );
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "PodScheduled" && c["status"] == "True")
    );
    assert_eq!(pod["status"]["phase"], "Running");
    // The main resource ignores status; the status subresource ignores spec.
    let sneaky = json!({"spec": {"activeDeadlineSeconds": 5}, "status": {"phase": "Failed"}});
    let (_, pod) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/pods/web/status",
        Some(("application/merge-patch+json", &sneaky)),
    );
    assert_eq!(pod["status"]["phase"], "Failed");
    assert!(pod["spec"].get("activeDeadlineSeconds").is_none());
    let (_, pod) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/pods/web",
        Some((
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running"}}),
        )),
    );
    assert_eq!(pod["status"]["phase"], "Failed");
    // Pod specs are immutable but for images.
    let (code, body) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/pods/web",
        Some((
            "application/merge-patch+json",
            &json!({"spec": {"restartPolicy": "Never"}}),
        )),
    );
    assert_eq!(code, 422, "{body}");
}

#[test]
fn selectors_and_pagination() {
    let s = ApiServer::start();
    for (i, tier) in ["web", "web", "db", "db", "cache"].iter().enumerate() {
        let (code, _) = s.call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some((
                "application/json",
                &configmap(&format!("cm{i}"), json!({"tier": tier})),
            )),
        );
        assert_eq!(code, 201);
    }
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, list) = s.call(
        "GET",
        "/api/v1/namespaces/default/configmaps?labelSelector=tier%20in%20(web,cache)",
        None,
    );
    assert_eq!(names(&list), ["cm0", "cm1", "cm4"]);
    let (_, list) = s.call(
        "GET",
        "/api/v1/configmaps?labelSelector=tier!%3Ddb&fieldSelector=metadata.name%3Dcm1",
        None,
    );
    assert_eq!(names(&list), ["cm1"]);
    let (code, body) = s.call("GET", "/api/v1/configmaps?fieldSelector=data.k%3Dx", None);
    assert_eq!(code, 400, "{body}");
    let mut all = Vec::new();
    let mut path = "/api/v1/namespaces/default/configmaps?limit=2".to_owned();
    loop {
        let (code, page) = s.call("GET", &path, None);
        assert_eq!(code, 200);
        let got = names(&page);
        assert!(got.len() <= 2);
        all.extend(got);
        match page["metadata"]["continue"].as_str() {
            Some(token) => {
                path = format!("/api/v1/namespaces/default/configmaps?limit=2&continue={token}")
            }
            None => break,
        }
    }
    // Every namespace also has the root CA ConfigMap.
    assert_eq!(all, ["cm0", "cm1", "cm2", "cm3", "cm4", "kube-root-ca.crt"]);
}

#[test]
fn watches_resume_bookmark_time_out_and_expire() {
    let s = ApiServer::start();
    let (_, first) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(("application/json", &configmap("a", json!({"w": "yes"})))),
    );
    let start = rv(&first);
    s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(("application/json", &configmap("b", json!({"w": "no"})))),
    );
    s.call(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a",
        Some(("application/merge-patch+json", &json!({"data": {"k": "2"}}))),
    );
    s.call("DELETE", "/api/v1/namespaces/default/configmaps/b", None);
    // From a resourceVersion: what came after it, in order, then the
    // stream ends at timeoutSeconds.
    let began = Instant::now();
    let events = s.watch(&format!(
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={start}&timeoutSeconds=2"
    ));
    assert!(began.elapsed() >= Duration::from_secs(2) && began.elapsed() < Duration::from_secs(10));
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(kinds, [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]);
    // A label selector filters; no resourceVersion replays the state.
    let events = s.watch(
        "/api/v1/namespaces/default/configmaps?watch=1&labelSelector=w%3Dyes&timeoutSeconds=1",
    );
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ADDED");
    // Bookmarks when allowed (the server sends one a second here).
    let events = s.watch(&format!("/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds=3", rv(&first)));
    let bookmark = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert!(rv(&bookmark["object"]) >= start);
    // After compaction an old resourceVersion is 410 Gone: an ERROR event
    // on a watch, 410 on a list-from-continue.
    s.admin("POST", "/compact");
    let events = s.watch(&format!(
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}&timeoutSeconds=5"
    ));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
    assert!(
        events[0]["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version")
    );
}

#[test]
fn graceful_pod_deletion_scheduling_and_node_lifecycle() {
    // Long enough for a kubectl apply on a loaded machine (the grace runs
    // from the node's creation, in whole seconds), short for the test.
    let s = ApiServer::start_with(&["--node-grace", "5"]);
    let (code, _) = s.call(
        "POST",
        "/api/v1/nodes",
        Some(("application/json", &ready_node("edge-1"))),
    );
    assert_eq!(code, 201);
    // The node has no status on create (it is a subresource); set it.
    let (code, _) = s.call(
        "PUT",
        "/api/v1/nodes/edge-1/status",
        Some(("application/json", &ready_node("edge-1"))),
    );
    assert_eq!(code, 200);
    s.kubectl_ok(&["apply", "-f", "-"], Some(POD));
    let (_, pod) = s.call("GET", "/api/v1/namespaces/default/pods/web", None);
    assert_eq!(
        pod["spec"]["nodeName"], "edge-1",
        "scheduled to the only Ready node"
    );
    assert!(
        s.kubectl_ok(&["get", "nodes", "-o", "wide"], None)
            .contains("Ready")
    );
    // Deleting a bound pod marks it and leaves it for the kubelet...
    let (code, marked) = s.call("DELETE", "/api/v1/namespaces/default/pods/web", None);
    assert_eq!(code, 200);
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    assert!(s.kubectl_ok(&["get", "pods"], None).contains("Terminating"));
    // ... which deletes it with grace 0 and a uid precondition.
    let options =
        json!({"gracePeriodSeconds": 0, "preconditions": {"uid": marked["metadata"]["uid"]}});
    let (code, _) = s.call(
        "DELETE",
        "/api/v1/namespaces/default/pods/web",
        Some(("application/json", &options)),
    );
    assert_eq!(code, 200);
    assert_eq!(
        s.call("GET", "/api/v1/namespaces/default/pods/web", None).0,
        404
    );
    // No Lease renewal within the grace period: NotReady (Unknown).
    std::thread::sleep(Duration::from_secs(6));
    s.admin("POST", "/expire-leases");
    let (_, node) = s.call("GET", "/api/v1/nodes/edge-1", None);
    let ready = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["status"], "Unknown", "{node}");
    assert!(
        node["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/unreachable")
    );
    assert!(s.kubectl_ok(&["get", "nodes"], None).contains("NotReady"));
    // Deleting a node removes the pods bound to it (pod GC).
    let (code, _) = s.call(
        "POST",
        "/api/v1/nodes",
        Some(("application/json", &ready_node("edge-2"))),
    );
    assert_eq!(code, 201);
    s.call(
        "PUT",
        "/api/v1/nodes/edge-2/status",
        Some(("application/json", &ready_node("edge-2"))),
    );
    // Its Lease is fresh, so it stays Ready while the pod is scheduled.
    let now = jiff_like_now();
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "edge-2", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "edge-2", "leaseDurationSeconds": 40, "renewTime": now}});
    s.call(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        Some(("application/json", &lease)),
    );
    s.kubectl_ok(
        &["apply", "-f", "-"],
        Some(&POD.replace("name: web", "name: other")),
    );
    let (_, pod) = s.call("GET", "/api/v1/namespaces/default/pods/other", None);
    assert_eq!(
        pod["spec"]["nodeName"], "edge-2",
        "the NotReady node is not a candidate"
    );
    assert_eq!(s.call("DELETE", "/api/v1/nodes/edge-2", None).0, 200);
    assert_eq!(
        s.call("GET", "/api/v1/namespaces/default/pods/other", None)
            .0,
        404
    );
}

#[test]
fn faults_injected_by_the_admin_endpoint() {
    let s = ApiServer::start();
    s.admin("POST", "/fail?count=2&status=500");
    assert_eq!(s.call("GET", "/api/v1/pods", None).0, 500);
    assert_eq!(s.call("GET", "/api/v1/pods", None).0, 500);
    assert_eq!(s.call("GET", "/api/v1/pods", None).0, 200);
    s.admin("POST", "/fail?count=1&status=429");
    assert_eq!(s.call("GET", "/api/v1/pods", None).0, 429);
    s.admin("POST", "/pause");
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "2",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
        ])
        .arg(s.dir.join("ca.crt"))
        .arg(format!("{}/version", s.url))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "000",
        "a paused server answers nothing"
    );
    s.admin("POST", "/resume");
    assert_eq!(s.call("GET", "/version", None).0, 200);
}

fn jwt_claims(token: &str) -> Value {
    use base64::Engine;
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn service_account_tokens() {
    let s = ApiServer::start();
    // Controllers' work: every namespace has a default account and the CA.
    let (code, ca) = s.call(
        "GET",
        "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt",
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(
        ca["data"]["ca.crt"].as_str().unwrap(),
        std::fs::read_to_string(s.dir.join("ca.crt")).unwrap()
    );
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": ["api", "vault"], "expirationSeconds": 1200,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "1234"}}});
    let (code, response) = s.call(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/default/token",
        Some(("application/json", &request)),
    );
    assert_eq!(code, 201, "{response}");
    assert_eq!(response["kind"], "TokenRequest");
    let token = response["status"]["token"].as_str().unwrap();
    let claims = jwt_claims(token);
    assert_eq!(claims["aud"], json!(["api", "vault"]));
    assert_eq!(claims["sub"], "system:serviceaccount:default:default");
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        1200
    );
    assert_eq!(claims["kubernetes.io"]["pod"]["name"], "web");
    assert!(response["status"]["expirationTimestamp"].is_string());
    // The token authenticates.
    assert_eq!(
        s.call_as(Some(token), "GET", "/api/v1/namespaces/default/pods", None)
            .0,
        200
    );
    let requests: Value = serde_json::from_str(&s.admin("GET", "/requests")).unwrap();
    assert!(
        requests
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["user"] == "system:serviceaccount:default:default")
    );
    // Too short, and unknown accounts.
    let short = json!({"spec": {"expirationSeconds": 60}});
    assert_eq!(
        s.call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/default/token",
            Some(("application/json", &short))
        )
        .0,
        422
    );
    assert_eq!(
        s.call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/nobody/token",
            Some(("application/json", &json!({})))
        )
        .0,
        404
    );
}

#[test]
fn kubectl_typed_commands_send_protobuf() {
    let s = ApiServer::start();
    s.kubectl_ok(&["create", "namespace", "edge"], None);
    s.kubectl_ok(
        &[
            "create",
            "configmap",
            "settings",
            "-n",
            "edge",
            "--from-literal=mode=fast",
            "--from-literal=level=3",
        ],
        None,
    );
    s.kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "keys",
            "-n",
            "edge",
            "--from-literal=api=s3cr3t",
        ],
        None,
    );
    s.kubectl_ok(&["create", "serviceaccount", "robot", "-n", "edge"], None);
    let (code, cm) = s.call("GET", "/api/v1/namespaces/edge/configmaps/settings", None);
    assert_eq!(code, 200, "{cm}");
    assert_eq!(cm["data"], json!({"mode": "fast", "level": "3"}));
    assert!(cm["metadata"]["uid"].is_string());
    let (code, secret) = s.call("GET", "/api/v1/namespaces/edge/secrets/keys", None);
    assert_eq!(code, 200, "{secret}");
    assert_eq!(secret["data"]["api"], "czNjcjN0");
    assert_eq!(secret["type"], "Opaque");
    let (code, _) = s.call("GET", "/api/v1/namespaces/edge/serviceaccounts/robot", None);
    assert_eq!(code, 200);
    let token = s.kubectl_ok(
        &[
            "create",
            "token",
            "robot",
            "-n",
            "edge",
            "--audience=edge-aud",
            "--duration=20m",
        ],
        None,
    );
    let claims = jwt_claims(token.trim());
    assert_eq!(claims["aud"], json!(["edge-aud"]));
    let life = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert_eq!(life, 1200, "{claims}");
    // The same name again: the real server's conflict, not a decoding error.
    let (ok, _, err) = s.kubectl(&["create", "namespace", "edge"], None);
    assert!(!ok);
    assert!(err.contains("AlreadyExists"), "{err}");
}

fn csr_object(s: &ApiServer, name: &str) -> Value {
    csr_for(
        s,
        name,
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["digital signature", "client auth"],
    )
}

fn csr_for(s: &ApiServer, name: &str, signer: &str, usages: &[&str]) -> Value {
    use base64::Engine;
    let key = s.dir.join(format!("{name}.key"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
        ])
        .arg(&key)
        .args(["-subj", "/O=system:nodes/CN=system:node:edge-1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": name},
        "spec": {"request": base64::engine::general_purpose::STANDARD.encode(&out.stdout),
                 "signerName": signer,
                 "usages": usages, "username": "someone-else"}})
}

/// `openssl verify` of the certificate a CSR was issued, against the
/// server's CA: whether it passed, and what openssl said.
fn openssl_verify(s: &ApiServer, csr: &Value, file: &std::path::Path) -> (bool, String) {
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(
            csr["status"]["certificate"]
                .as_str()
                .expect("a certificate"),
        )
        .unwrap();
    std::fs::write(file, &pem).unwrap();
    let out = Command::new("openssl")
        .arg("verify")
        .arg("-CAfile")
        .arg(s.dir.join("ca.crt"))
        .arg(file)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

fn verify_certificate(s: &ApiServer, csr: &Value) -> String {
    let file = s.dir.join("issued.crt");
    let (ok, said) = openssl_verify(s, csr, &file);
    assert!(ok, "{said}");
    let subject = Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(&file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&subject.stdout).into_owned()
}

#[test]
fn certificate_signing_requests_approved_then_signed() {
    let s = ApiServer::start();
    // Not a kubelet's signer: no controller approves it (a node client
    // request from the admin, system:masters, it would). Its status, an
    // approval and a certificate of its own making, is not kept.
    let mut request = csr_for(
        &s,
        "node-csr",
        "kubernetes.io/kube-apiserver-client",
        &["digital signature", "client auth"],
    );
    request["status"] = json!({"certificate": "Zm9v",
        "conditions": [{"type": "Approved", "status": "True", "reason": "Mine"}]});
    let (code, created) = s.call(
        "POST",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        Some(("application/json", &request)),
    );
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["status"], json!({}));
    // The requester is the authenticated user, whatever the body says.
    assert_eq!(created["spec"]["username"], "admin-token");
    assert!(created["status"].get("certificate").is_none());
    assert!(s.kubectl_ok(&["get", "csr"], None).contains("Pending"));
    // kubectl sends the approval as protobuf.
    s.kubectl_ok(&["certificate", "approve", "node-csr"], None);
    let (code, approved) = s.call(
        "GET",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/node-csr",
        None,
    );
    assert_eq!(code, 200, "{approved}");
    assert_eq!(
        approved["status"]["conditions"][0]["reason"],
        "KubectlApprove"
    );
    let subject = verify_certificate(&s, &approved);
    assert!(subject.contains("system:node:edge-1"), "{subject}");
    assert!(s.kubectl_ok(&["get", "csr"], None).contains("Approved"));

    // With the switch on, every request is approved and signed (after
    // the answer to its creation, as by a controller).
    let auto = ApiServer::start_with(&["--auto-approve-csrs"]);
    let (code, created) = auto.call(
        "POST",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        Some(("application/json", &csr_object(&auto, "auto"))),
    );
    assert_eq!(code, 201);
    assert!(created["status"].get("certificate").is_none(), "{created}");
    verify_certificate(&auto, &csr_named(&auto, "auto"));
}

fn csr_named(s: &ApiServer, name: &str) -> Value {
    let (code, csr) = s.call(
        "GET",
        &format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}"),
        None,
    );
    assert_eq!(code, 200, "{csr}");
    csr
}

fn condition(csr: &Value) -> (String, String) {
    let last = csr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.last())
        .cloned()
        .unwrap_or_default();
    (
        last["type"].as_str().unwrap_or("Pending").to_owned(),
        last["reason"].as_str().unwrap_or("").to_owned(),
    )
}

/// A node's TLS bootstrap as kubeadm sets it up: a bootstrap token Secret,
/// and bindings of the bootstrap-policy roles to system:bootstrappers (and
/// to system:nodes for renewals). The token's user may then create a CSR,
/// which the csrapproving controller approves for a node client
/// certificate, and nothing else; a serving certificate waits for an
/// administrator, and the signer refuses one without addresses.
#[test]
fn bootstrap_tokens_and_the_kubelet_csr_approver() {
    let s = ApiServer::start_with(&["--cluster-signing-duration", "3600"]);
    let token = |id: &str| {
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {"token-id": id, "token-secret": "0123456789abcdef",
                           "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
                           "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token"}})
    };
    s.kubectl_ok(&["apply", "-f", "-"], Some(&token("abcdef").to_string()));
    let mut expired = token("expird");
    expired["stringData"]["expiration"] = "2020-01-01T00:00:00Z".into();
    s.kubectl_ok(&["apply", "-f", "-"], Some(&expired.to_string()));
    let bootstrap = |token: &str| {
        let path = s.dir.join(format!("bootstrap-{token}.kubeconfig"));
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{}\", certificate-authority: \"{}\"}}\nusers:\n- name: b\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: b\n  context: {{cluster: c, user: b}}\ncurrent-context: b\n",
            s.url,
            s.dir.join("ca.crt").display()
        );
        std::fs::write(&path, config).unwrap();
        path
    };
    let valid = bootstrap("abcdef.0123456789abcdef");
    let create = |kubeconfig: &std::path::Path, csr: &Value| {
        s.kubectl_with(kubeconfig, &["create", "-f", "-"], Some(&csr.to_string()))
    };
    // A wrong secret, an unknown ID or an expired token: not a user at all.
    for wrong in [
        "abcdef.0123456789abcdee",
        "fedcba.0123456789abcdef",
        "expird.0123456789abcdef",
    ] {
        let (ok, _, err) = create(&bootstrap(wrong), &csr_object(&s, "nobody"));
        // kubectl's words for a 401.
        assert!(!ok && err.contains("provide credentials"), "{wrong}: {err}");
    }
    // Known, but nothing bound to its groups yet.
    let (ok, _, err) = create(&valid, &csr_object(&s, "too-early"));
    assert!(!ok && err.contains("forbidden"), "{err}");
    assert!(err.contains("system:bootstrap:abcdef"), "{err}");

    s.kubectl_ok(
        &[
            "create",
            "clusterrolebinding",
            "kubelet-bootstrap",
            "--clusterrole=system:node-bootstrapper",
            "--group=system:bootstrappers",
        ],
        None,
    );
    s.kubectl_ok(
        &[
            "create",
            "clusterrolebinding",
            "node-autoapprove-bootstrap",
            "--clusterrole=system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "--group=system:bootstrappers:kubeadm:default-node-token",
        ],
        None,
    );
    let (ok, _, err) = create(&valid, &csr_object(&s, "node-client"));
    assert!(ok, "{err}");
    let csr = csr_named(&s, "node-client");
    assert_eq!(csr["spec"]["username"], "system:bootstrap:abcdef");
    assert_eq!(condition(&csr), ("Approved".into(), "AutoApproved".into()));
    let subject = verify_certificate(&s, &csr);
    assert!(subject.contains("system:node:edge-1"), "{subject}");
    // Signed for the signing duration: an hour (and the minute back).
    let dates = Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-startdate",
            "-enddate",
            "-dateopt",
            "iso_8601",
            "-in",
        ])
        .arg(s.dir.join("issued.crt"))
        .output()
        .unwrap();
    let dates = String::from_utf8_lossy(&dates.stdout).into_owned();
    let at = |field: &str| -> jiff::Timestamp {
        let line = dates.lines().find(|l| l.starts_with(field)).unwrap();
        line[field.len()..]
            .trim()
            .replace(' ', "T")
            .parse()
            .unwrap()
    };
    let life = at("notAfter=").as_second() - at("notBefore=").as_second();
    assert_eq!(life, 3660, "{dates}");
    // The token is for bootstrapping only.
    let (ok, _, err) = s.kubectl_with(&valid, &["get", "pods"], None);
    assert!(!ok && err.contains("forbidden"), "{err}");

    // The same with the official Python client.
    let request = csr_for(
        &s,
        "python",
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["digital signature", "client auth"],
    );
    let python = Command::new("/usr/bin/python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/python_bootstrap_csr.py"
        ))
        .arg(&s.url)
        .arg(s.dir.join("ca.crt"))
        .arg("abcdef.0123456789abcdef")
        .arg(request["spec"]["request"].as_str().unwrap())
        .output()
        .unwrap();
    let seen: Value = serde_json::from_slice(&python.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&python.stderr)));
    assert_eq!(seen["pending_at_creation"], true, "{seen}");
    assert_eq!(seen["reasons"], json!(["AutoApproved"]), "{seen}");
    assert_eq!(
        seen["certificate"], "LS0tLS1CRUdJTiBDRVJUSUZJQ0FU",
        "{seen}"
    );
    assert_eq!(seen["pods"], 403, "{seen}");

    // A serving certificate is not the controller's to approve; approved by
    // hand, the signer refuses one that names no address.
    let serving = csr_for(
        &s,
        "serving",
        "kubernetes.io/kubelet-serving",
        &["digital signature", "server auth"],
    );
    let (ok, _, err) = create(&valid, &serving);
    assert!(ok, "{err}");
    assert_eq!(condition(&csr_named(&s, "serving")).0, "Pending");
    s.kubectl_ok(&["certificate", "approve", "serving"], None);
    let refused = csr_named(&s, "serving");
    assert_eq!(
        condition(&refused),
        ("Failed".into(), "SignerValidationFailure".into())
    );
    assert!(refused["status"].get("certificate").is_none(), "{refused}");

    // A node renewing its own client certificate: approved once
    // system:nodes may ask for its own.
    let config = Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .args(["node-kubeconfig", "edge-1", "--dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    let node = s.dir.join("node.kubeconfig");
    std::fs::write(&node, &config.stdout).unwrap();
    let (ok, _, err) = create(&node, &csr_object(&s, "renewal-early"));
    assert!(ok, "{err}");
    assert_eq!(condition(&csr_named(&s, "renewal-early")).0, "Pending");
    s.kubectl_ok(
        &[
            "create",
            "clusterrolebinding",
            "node-autoapprove-certificate-rotation",
            "--clusterrole=system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "--group=system:nodes",
        ],
        None,
    );
    let (ok, _, err) = create(&node, &csr_object(&s, "renewal"));
    assert!(ok, "{err}");
    let renewal = csr_named(&s, "renewal");
    assert_eq!(
        renewal.pointer("/status/conditions/0/message"),
        Some(&json!(
            "Auto approving self kubelet client certificate after SubjectAccessReview."
        ))
    );
    verify_certificate(&s, &renewal);

    // A clock ahead of the board's: what is signed now is not valid yet.
    s.admin("POST", "/signing?not-before=86400");
    let (ok, _, err) = create(&node, &csr_object(&s, "from-the-future"));
    assert!(ok, "{err}");
    let future = csr_named(&s, "from-the-future");
    verify_certificate_fails(&s, &future, "not yet valid");
}

fn verify_certificate_fails(s: &ApiServer, csr: &Value, why: &str) {
    let (ok, said) = openssl_verify(s, csr, &s.dir.join("future.crt"));
    assert!(!ok && said.contains(why), "{said}");
}

/// A stand-in kubelet: HTTPS that requires a client certificate from the
/// API server's CA and answers with what it was asked and by whom.
struct FakeKubelet {
    child: Child,
    port: u16,
}

impl FakeKubelet {
    fn start(s: &ApiServer) -> FakeKubelet {
        let (cert, key) = (s.dir.join("kubelet.crt"), s.dir.join("kubelet.key"));
        fixture::self_signed(
            &cert,
            &key,
            "edge-1",
            &["-addext", "subjectAltName=IP:127.0.0.1"],
        );
        let script = r#"
import http.server, json, ssl, sys
cert, key, ca = sys.argv[1:4]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        subject = dict(x[0] for x in self.connection.getpeercert()["subject"])
        body = json.dumps({"path": self.path, "client": subject.get("commonName")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
context.verify_mode = ssl.CERT_REQUIRED
context.load_verify_locations(ca)
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(&cert)
            .arg(&key)
            .arg(s.dir.join("ca.crt"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let port = fixture::first_line(&mut child).parse().unwrap();
        FakeKubelet { child, port }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn logs_and_node_proxy_reach_the_kubelet_with_the_servers_certificate() {
    let s = ApiServer::start();
    let kubelet = FakeKubelet::start(&s);
    let mut node = ready_node("edge-1");
    node["status"]["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": kubelet.port}});
    s.call("POST", "/api/v1/nodes", Some(("application/json", &node)));
    assert_eq!(
        s.call(
            "PUT",
            "/api/v1/nodes/edge-1/status",
            Some(("application/json", &node))
        )
        .0,
        200
    );
    s.kubectl_ok(&["apply", "-f", "-"], Some(POD));
    let logs = s.kubectl_ok(&["logs", "web", "--tail=5", "--timestamps"], None);
    let answer: Value = serde_json::from_str(logs.trim()).unwrap();
    assert_eq!(answer["client"], "kube-apiserver-kubelet-client");
    let path = answer["path"].as_str().unwrap();
    assert!(path.starts_with("/containerLogs/default/web/c?"), "{path}");
    assert!(
        path.contains("tailLines=5") && path.contains("timestamps=true"),
        "{path}"
    );
    let raw = s.kubectl_ok(
        &["get", "--raw", "/api/v1/nodes/edge-1/proxy/healthz"],
        None,
    );
    let answer: Value = serde_json::from_str(raw.trim()).unwrap();
    assert_eq!(answer["path"], "/healthz");
}

#[test]
fn kubectl_watch_events_leases_and_describe() {
    let s = ApiServer::start();
    // kubectl get -w: a Table watch; it prints the pod and then its change.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .args(["get", "pods", "-w", "--request-timeout=8s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    s.kubectl_ok(&["apply", "-f", "-"], Some(POD));
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{"name": "c", "image": "busybox:1.36", "imageID": "", "ready": true, "restartCount": 2, "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}});
    assert_eq!(
        s.call(
            "PATCH",
            "/api/v1/namespaces/default/pods/web/status",
            Some(("application/merge-patch+json", &status))
        )
        .0,
        200
    );
    std::thread::sleep(Duration::from_millis(800));
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Pending"), "{text}");
    assert!(
        text.lines().any(|l| l
            .split_whitespace()
            .take(4)
            .eq(["web", "1/1", "Running", "2"])),
        "{text}"
    );
    // Events of both APIs, and describe showing the pod's events.
    let (_, pod) = s.call("GET", "/api/v1/namespaces/default/pods/web", None);
    let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web", "uid": pod["metadata"]["uid"], "apiVersion": "v1"},
        "reason": "Pulled", "message": "Container image already present", "type": "Normal", "source": {"component": "kubelet", "host": "edge-1"},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1});
    assert_eq!(
        s.call(
            "POST",
            "/api/v1/namespaces/default/events",
            Some(("application/json", &event))
        )
        .0,
        201
    );
    let new_event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "web.2", "namespace": "default"},
        "eventTime": "2026-01-01T00:00:01.000000Z", "reportingController": "nanolet", "reportingInstance": "edge-1",
        "action": "Started", "reason": "Started", "regarding": {"kind": "Pod", "namespace": "default", "name": "web"}, "note": "Started container c", "type": "Normal"});
    let (code, body) = s.call(
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        Some(("application/json", &new_event)),
    );
    assert_eq!(code, 201, "{body}");
    let described = s.kubectl_ok(&["describe", "pod", "web"], None);
    assert!(
        described.contains("Container image already present"),
        "{described}"
    );
    assert!(s.kubectl_ok(&["get", "events"], None).contains("pod/web"));
    // A node Lease, as kubelets renew it.
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "edge-1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "edge-1", "leaseDurationSeconds": 40, "renewTime": "2026-01-01T00:00:00.000000Z"}});
    assert_eq!(
        s.call(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            Some(("application/json", &lease))
        )
        .0,
        201
    );
    let renew = json!({"spec": {"renewTime": "2026-01-01T00:00:10.000000Z"}});
    let (code, renewed) = s.call(
        "PATCH",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1",
        Some(("application/strategic-merge-patch+json", &renew)),
    );
    assert_eq!(code, 200);
    assert_eq!(renewed["spec"]["holderIdentity"], "edge-1");
    assert!(
        s.kubectl_ok(&["get", "leases", "-n", "kube-node-lease"], None)
            .contains("edge-1")
    );
}

/// Same keys, same fixed values; strings that vary per cluster (names,
/// versions, tokens, messages naming them) only need the same type.
fn same_shape(ours: &Value, theirs: &Value, path: &str, varying: &[&str]) {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            let (mut ka, mut kb): (Vec<_>, Vec<_>) = (a.keys().collect(), b.keys().collect());
            ka.sort();
            kb.sort();
            assert_eq!(ka, kb, "keys at {path}");
            for (k, v) in b {
                same_shape(&a[k], v, &format!("{path}.{k}"), varying);
            }
        }
        (Value::Array(_), Value::Array(_)) => {}
        (Value::String(_), Value::String(_)) if varying.iter().any(|v| path.ends_with(v)) => {}
        (a, b) => assert_eq!(a, b, "value at {path}"),
    }
}

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn responses_match_the_documented_ones() {
    let s = ApiServer::start();
    let (code, body) = s.call("GET", "/api/v1/namespaces/default/pods/grafana", None);
    assert_eq!(code, 404);
    same_shape(&body, &fixture("not-found.json"), "", &[]);
    for i in 0..2 {
        s.call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some(("application/json", &configmap(&format!("p{i}"), json!({})))),
        );
    }
    // Two config maps and the root CA one: a page of 2 leaves 1.
    let (_, mut page) = s.call("GET", "/api/v1/namespaces/default/configmaps?limit=2", None);
    page["kind"] = "PodList".into();
    page["items"] = json!([]);
    same_shape(
        &page,
        &fixture("list-chunk.json"),
        "",
        &["resourceVersion", "continue"],
    );
    let events = s
        .watch("/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=2");
    let bookmark = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    same_shape(
        bookmark,
        &fixture("watch-bookmark.json"),
        "",
        &["resourceVersion"],
    );
    s.admin("POST", "/compact");
    let events =
        s.watch("/api/v1/namespaces/default/pods?watch=1&resourceVersion=2&timeoutSeconds=2");
    same_shape(&events[0], &fixture("watch-expired.json"), "", &["message"]);
}

#[test]
fn https_only_groups_from_certificates_and_discovery() {
    let s = ApiServer::start();
    // Plain HTTP on the HTTPS port gets nothing served.
    let plain = s.url.replacen("https://", "http://", 1);
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-w", "\n%{http_code}"])
        .arg(format!("{plain}/version"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("gitVersion") && !text.ends_with("200"),
        "{text}"
    );

    // A client certificate's O entries are the user's groups: a node's
    // CSR records them as its requester's.
    let config = Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .args(["node-kubeconfig", "edge-1", "--dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    let node_config = s.dir.join("node.kubeconfig");
    std::fs::write(&node_config, &config.stdout).unwrap();
    let csr = csr_object(&s, "from-node").to_string();
    let (ok, _, err) = s.kubectl_with(&node_config, &["create", "-f", "-"], Some(&csr));
    assert!(ok, "{err}");
    let (_, csr) = s.call(
        "GET",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/from-node",
        None,
    );
    assert_eq!(csr["spec"]["username"], "system:node:edge-1");
    let groups = csr["spec"]["groups"].as_array().unwrap();
    assert!(groups.contains(&json!("system:nodes")), "{csr}");
    assert!(groups.contains(&json!("system:authenticated")), "{csr}");

    // Discovery as kubectl reads it.
    let (code, version) = s.call_as(None, "GET", "/version", None);
    assert_eq!(code, 200);
    assert_eq!(version["major"], "1");
    assert!(
        version["gitVersion"].as_str().unwrap().starts_with("v1."),
        "{version}"
    );
    let (_, api) = s.call("GET", "/api", None);
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!(["v1"]));
    let resources = |path: &str| -> Vec<Value> {
        let (code, list) = s.call("GET", path, None);
        assert_eq!(code, 200, "{path}: {list}");
        assert_eq!(list["kind"], "APIResourceList");
        list["resources"].as_array().unwrap().clone()
    };
    let core = resources("/api/v1");
    let find = |list: &[Value], name: &str| -> Value {
        list.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in discovery"))
            .clone()
    };
    let pods = find(&core, "pods");
    assert_eq!(pods["kind"], "Pod");
    assert_eq!(pods["namespaced"], true);
    assert!(pods["verbs"].as_array().unwrap().contains(&json!("watch")));
    for sub in [
        "pods/status",
        "pods/log",
        "nodes/status",
        "nodes/proxy",
        "serviceaccounts/token",
    ] {
        find(&core, sub);
    }
    assert_eq!(find(&core, "nodes")["namespaced"], false);
    let (_, groups) = s.call("GET", "/apis", None);
    assert_eq!(groups["kind"], "APIGroupList");
    for group in [
        "coordination.k8s.io",
        "certificates.k8s.io",
        "events.k8s.io",
    ] {
        let entry = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == group)
            .unwrap_or_else(|| panic!("{group} not in /apis"))
            .clone();
        assert_eq!(entry["preferredVersion"]["version"], "v1");
    }
    find(&resources("/apis/coordination.k8s.io/v1"), "leases");
    find(
        &resources("/apis/certificates.k8s.io/v1"),
        "certificatesigningrequests/approval",
    );
    let (code, openapi) = s.call("GET", "/openapi/v3", None);
    assert_eq!(code, 200);
    assert!(openapi["paths"]["api/v1"].is_object(), "{openapi}");

    // -o yaml, the other output kubectl users reach for.
    s.kubectl_ok(&["apply", "-f", "-"], Some(POD));
    let yaml = s.kubectl_ok(&["get", "pod", "web", "-o", "yaml"], None);
    assert!(yaml.contains("kind: Pod\n"), "{yaml}");
    assert!(yaml.contains("  name: web\n"), "{yaml}");
    assert!(yaml.contains("restartPolicy: Always"), "{yaml}");
}

#[test]
fn one_resource_version_counter_timestamps_and_list_versions() {
    let s = ApiServer::start();
    let before = jiff_like_now();
    let (_, cm) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(("application/json", &configmap("first", json!({})))),
    );
    let (_, ns) = s.call(
        "POST",
        "/api/v1/namespaces",
        Some((
            "application/json",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "second"}}),
        )),
    );
    // One counter across kinds: the namespace's write (and the writes its
    // creation causes) come after the ConfigMap's.
    assert!(rv(&ns) > rv(&cm), "{cm} {ns}");
    let (_, list) = s.call("GET", "/api/v1/configmaps", None);
    assert!(rv(&list) >= rv(&ns), "a list is as new as the last write");
    let (_, namespaces) = s.call("GET", "/api/v1/namespaces", None);
    assert_eq!(rv(&namespaces), rv(&list), "lists of any kind: one version");
    // creationTimestamp: RFC 3339 in seconds, set by the server, now.
    let created = cm["metadata"]["creationTimestamp"].as_str().unwrap();
    assert_eq!(created.len(), "2026-01-01T00:00:00Z".len(), "{created}");
    assert!(created.ends_with('Z'));
    assert!(created[..19] >= before[..19], "{created} before {before}");

    // A list at a version: as new as that or newer; from the future: 504.
    let at = rv(&list);
    let (code, _) = s.call(
        "GET",
        &format!("/api/v1/configmaps?resourceVersion={at}"),
        None,
    );
    assert_eq!(code, 200);
    let (code, _) = s.call("GET", "/api/v1/configmaps?resourceVersion=0", None);
    assert_eq!(code, 200);
    let (code, status) = s.call(
        "GET",
        &format!("/api/v1/configmaps?resourceVersion={}", at + 1000),
        None,
    );
    assert_eq!(code, 504, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("Too large resource version"),
        "{status}"
    );
    // A continue token outlives writes, not a compaction after them.
    let (_, page) = s.call("GET", "/api/v1/configmaps?limit=1", None);
    let token = page["metadata"]["continue"].as_str().unwrap().to_owned();
    let next = format!("/api/v1/configmaps?limit=1&continue={token}");
    assert_eq!(s.call("GET", &next, None).0, 200);
    // A token carries its version: naming another is an error.
    let both = format!("{next}&resourceVersion={at}");
    assert_eq!(s.call("GET", &both, None).0, 400);
    s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(("application/json", &configmap("third", json!({})))),
    );
    s.admin("POST", "/compact");
    let (code, status) = s.call("GET", &next, None);
    assert_eq!(code, 410, "{status}");
    assert_eq!(status["reason"], "Expired");
}

#[test]
fn pod_field_selectors_over_http() {
    let s = ApiServer::start();
    let pod = |name: &str, ns: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1.36"}]}})
    };
    for (name, ns, node) in [
        ("a", "default", "edge-1"),
        ("b", "default", "edge-2"),
        ("c", "kube-system", "edge-1"),
    ] {
        let (code, body) = s.call(
            "POST",
            &format!("/api/v1/namespaces/{ns}/pods"),
            Some(("application/json", &pod(name, ns, node))),
        );
        assert_eq!(code, 201, "{body}");
    }
    let (code, body) = s.call(
        "PATCH",
        "/api/v1/namespaces/default/pods/a/status",
        Some((
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running"}}),
        )),
    );
    assert_eq!(code, 200, "{body}");
    let names = |query: &str| -> Vec<String> {
        let (code, list) = s.call("GET", &format!("/api/v1/pods?fieldSelector={query}"), None);
        assert_eq!(code, 200, "{query}: {list}");
        let mut names: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names("spec.nodeName%3Dedge-1"), ["a", "c"]);
    assert_eq!(names("metadata.namespace%3Dkube-system"), ["c"]);
    assert_eq!(names("status.phase%3DRunning"), ["a"]);
    assert_eq!(
        names("status.phase!%3DRunning,spec.nodeName%3Dedge-1"),
        ["c"]
    );
    assert_eq!(names("metadata.name%3Db"), ["b"]);
}

/// A node back from an outage posts Ready again: the lifecycle controller
/// takes its unreachable taints off, and the scheduler binds pods to it,
/// as upstream (the taints would keep every pod without tolerations away).
#[test]
fn a_node_ready_again_loses_its_unreachable_taints_and_gets_pods() {
    let s = ApiServer::start_with(&["--node-grace", "2"]);
    let node = ready_node("edge-1");
    s.call("POST", "/api/v1/nodes", Some(("application/json", &node)));
    s.call(
        "PUT",
        "/api/v1/nodes/edge-1/status",
        Some(("application/json", &node)),
    );
    std::thread::sleep(Duration::from_secs(3));
    s.admin("POST", "/expire-leases");
    let taints = |s: &ApiServer| -> Vec<String> {
        let (_, node) = s.call("GET", "/api/v1/nodes/edge-1", None);
        node["spec"]["taints"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|t| {
                        format!(
                            "{}:{}",
                            t["key"].as_str().unwrap(),
                            t["effect"].as_str().unwrap()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        taints(&s),
        [
            "node.kubernetes.io/unreachable:NoSchedule",
            "node.kubernetes.io/unreachable:NoExecute"
        ]
    );
    s.kubectl_ok(&["apply", "-f", "-"], Some(POD));
    let mut back = ready_node("edge-1");
    back["status"]["conditions"][0]["lastHeartbeatTime"] = jiff_like_now().into();
    let (code, _) = s.call(
        "PUT",
        "/api/v1/nodes/edge-1/status",
        Some(("application/json", &back)),
    );
    assert_eq!(code, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, pod) = s.call("GET", "/api/v1/namespaces/default/pods/web", None);
        if pod["spec"]["nodeName"] == "edge-1" {
            break;
        }
        assert!(Instant::now() < deadline, "not scheduled: {:?}", taints(&s));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(taints(&s).is_empty(), "{:?}", taints(&s));
}

#[test]
fn scheduling_by_node_selector_and_a_lease_that_goes_stale() {
    let s = ApiServer::start_with(&["--node-grace", "2"]);
    let now = jiff_like_now();
    for (name, zone) in [("edge-a", "north"), ("edge-b", "south")] {
        let mut node = ready_node(name);
        node["metadata"]["labels"]["zone"] = zone.into();
        s.call("POST", "/api/v1/nodes", Some(("application/json", &node)));
        let (code, _) = s.call(
            "PUT",
            &format!("/api/v1/nodes/{name}/status"),
            Some(("application/json", &node)),
        );
        assert_eq!(code, 200);
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 2, "renewTime": now}});
        let (code, _) = s.call(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            Some(("application/json", &lease)),
        );
        assert_eq!(code, 201);
    }
    // Two Ready nodes: the selector decides.
    s.kubectl_ok(
        &["apply", "-f", "-"],
        Some(&POD.replace("spec:\n", "spec:\n  nodeSelector: {zone: south}\n")),
    );
    let (_, pod) = s.call("GET", "/api/v1/namespaces/default/pods/web", None);
    assert_eq!(pod["spec"]["nodeName"], "edge-b");
    // edge-a keeps renewing; edge-b's Lease goes stale. The lifecycle runs
    // on its own timer here, without the admin trigger.
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready_of = |name: &str| -> String {
        let (_, node) = s.call("GET", &format!("/api/v1/nodes/{name}"), None);
        node["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    loop {
        let renewed = json!({"spec": {"renewTime": jiff_like_now()}});
        let (code, _) = s.call(
            "PATCH",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-a",
            Some(("application/merge-patch+json", &renewed)),
        );
        assert_eq!(code, 200);
        if ready_of("edge-b") == "Unknown" {
            break;
        }
        assert!(Instant::now() < deadline, "edge-b never went NotReady");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(ready_of("edge-a"), "True");
}

#[test]
fn admin_closes_watches_hangs_requests_and_records_bytes() {
    let s = ApiServer::start();
    // A watch that would last a minute ends when the admin closes watches.
    let mut watch = Command::new("curl")
        .args(["-s", "-N", "--max-time", "60", "--cacert"])
        .arg(s.dir.join("ca.crt"))
        .args(["-H", &format!("Authorization: Bearer {}", s.token)])
        .arg(format!(
            "{}/api/v1/pods?watch=true&timeoutSeconds=60",
            s.url
        ))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    s.admin("POST", "/close-watches");
    let ended = loop {
        if let Some(status) = watch.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(ended.is_some(), "the watch outlived close-watches");

    // status=0: the next request hangs until the client gives up.
    s.admin("POST", "/fail?count=1&status=0");
    let out = Command::new("curl")
        .args(["-s", "--max-time", "2", "-o", "/dev/null", "--cacert"])
        .arg(s.dir.join("ca.crt"))
        .args(["-H", &format!("Authorization: Bearer {}", s.token)])
        .arg(format!("{}/api/v1/pods", s.url))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(28), "curl's timeout exit code");
    assert_eq!(s.call("GET", "/api/v1/pods", None).0, 200);

    // The record: method, path, query, user, status and bytes both ways.
    s.admin("DELETE", "/requests");
    let body = configmap("counted", json!({}));
    let (code, created) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldManager=test",
        Some(("application/json", &body)),
    );
    assert_eq!(code, 201);
    let requests: Value = serde_json::from_str(&s.admin("GET", "/requests")).unwrap();
    let record = requests
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["method"] == "POST")
        .unwrap()
        .clone();
    assert_eq!(record["path"], "/api/v1/namespaces/default/configmaps");
    assert_eq!(record["query"], "fieldManager=test");
    assert_eq!(record["user"], "admin-token");
    assert_eq!(record["status"], 201);
    assert_eq!(record["request_bytes"], body.to_string().len());
    assert_eq!(record["response_bytes"], created.to_string().len());
}

#[test]
fn events_k8s_io_events_read_back() {
    let s = ApiServer::start();
    let now = jiff_like_now();
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web.1", "namespace": "default"},
        "eventTime": now, "reportingController": "nanolet", "reportingInstance": "edge-1",
        "action": "Started", "reason": "Started", "type": "Normal", "note": "Started container c",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "web"}});
    let (code, created) = s.call(
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        Some(("application/json", &event)),
    );
    assert_eq!(code, 201, "{created}");
    let (code, read) = s.call(
        "GET",
        "/apis/events.k8s.io/v1/namespaces/default/events/web.1",
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(read["note"], "Started container c");
    assert_eq!(read["regarding"]["name"], "web");
    let (code, list) = s.call(
        "GET",
        "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3Dweb",
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "EventList");
    assert_eq!(list["items"][0]["metadata"]["name"], "web.1", "{list}");
}

/// Lenient where the real server is: the official Python client sends
/// typed bodies without apiVersion or kind (the server fills them from
/// the URL), and boolean parameters are true unless absent, `0` or
/// `false` in any case (`watch=True` is a watch).
#[test]
fn bodies_without_kind_and_booleans_as_the_real_server_reads_them() {
    let s = ApiServer::start();
    let script = r#"
import sys
from kubernetes import client, config
config.load_kube_config(sys.argv[1])
pod = client.V1Pod(metadata=client.V1ObjectMeta(name="py"),
                   spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox:1.36")]))
assert pod.api_version is None and pod.kind is None
created = client.CoreV1Api().create_namespaced_pod("default", pod)
print(created.metadata.name)
"#;
    let output = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(s.kubeconfig())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "py");
    let (code, pod) = s.call("GET", "/api/v1/namespaces/default/pods/py", None);
    assert_eq!(code, 200);
    assert_eq!(
        (pod["apiVersion"].as_str(), pod["kind"].as_str()),
        (Some("v1"), Some("Pod"))
    );
    // Present but wrong is still refused.
    let (code, _) = s.call(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some((
            "application/json",
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}),
        )),
    );
    assert_eq!(code, 400);

    for (value, watches) in [
        ("True", true),
        ("", true),
        ("yes", true),
        ("1", true),
        ("FALSE", false),
        ("0", false),
    ] {
        let events = s.watch(&format!(
            "/api/v1/namespaces/default/pods?watch={value}&timeoutSeconds=1"
        ));
        let first = &events[0];
        if watches {
            assert_eq!(first["type"], "ADDED", "watch={value}: {events:?}");
        } else {
            assert_eq!(first["kind"], "PodList", "watch={value}: {events:?}");
        }
    }
}

/// The Node authorizer and NodeRestriction, as the real server applies
/// them to a kubelet: it reads only what pods bound to it reference,
/// writes only its own Node, Lease and pods' status, and creates only
/// mirror pods of its own that reference nothing secret.
#[test]
fn a_node_reaches_only_what_its_own_pods_reference() {
    let s = ApiServer::start();
    s.expect_node_refusals();
    for node in ["edge-a", "edge-b"] {
        assert_eq!(
            s.call(
                "POST",
                "/api/v1/nodes",
                Some(("application/json", &ready_node(node)))
            )
            .0,
            201
        );
    }
    let objects = |node: &str, secret: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {secret}}}\nstringData: {{k: v}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: on-{node}}}\nspec:\n  nodeName: {node}\n  containers:\n  - {{name: c, image: busybox:1.36, envFrom: [{{secretRef: {{name: {secret}}}}}]}}\n"
        )
    };
    s.kubectl_ok(&["apply", "-f", "-"], Some(&objects("edge-a", "a-secret")));
    s.kubectl_ok(&["apply", "-f", "-"], Some(&objects("edge-b", "b-secret")));
    let config = Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .args(["node-kubeconfig", "edge-a", "--dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    let file = s.dir.join("edge-a.kubeconfig");
    std::fs::write(&file, &config.stdout).unwrap();
    let as_node = |args: &[&str], stdin: Option<&str>| s.kubectl_with(&file, args, stdin);

    assert!(as_node(&["get", "secret", "a-secret"], None).0);
    // As the kubelet watches one object: a list selecting it by name.
    assert!(
        as_node(
            &[
                "get",
                "secrets",
                "--field-selector",
                "metadata.name=a-secret"
            ],
            None
        )
        .0
    );
    let (ok, _, err) = as_node(&["get", "secret", "b-secret"], None);
    assert!(!ok);
    assert!(
        err.contains("forbidden")
            && err.contains("no relationship found between node 'edge-a' and this object"),
        "{err}"
    );
    assert!(!as_node(&["get", "secrets"], None).0);
    assert!(as_node(&["get", "pods", "-A"], None).0);
    assert!(as_node(&["get", "nodes"], None).0);
    // Its own Node's status, not another's.
    let status = r#"{"status":{"conditions":[{"type":"Ready","status":"False","reason":"x","lastHeartbeatTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;
    assert!(
        as_node(
            &[
                "patch",
                "node",
                "edge-a",
                "--subresource",
                "status",
                "-p",
                status
            ],
            None
        )
        .0
    );
    let (ok, _, err) = as_node(
        &[
            "patch",
            "node",
            "edge-b",
            "--subresource",
            "status",
            "-p",
            status,
        ],
        None,
    );
    assert!(!ok && err.contains("forbidden"), "{err}");
    // Pods: mirror pods of its own only; the status of its pods only.
    let mirror = |node: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-{node}\n  annotations: {{kubernetes.io/config.mirror: abc}}\nspec:\n  nodeName: {node}\n  containers:\n  - {{name: c, image: busybox:1.36{extra}}}\n"
        )
    };
    assert!(as_node(&["create", "-f", "-"], Some(&mirror("edge-a", ""))).0);
    let (ok, _, err) = as_node(&["create", "-f", "-"], Some(&mirror("edge-b", "")));
    assert!(!ok && err.contains("spec.nodeName set to itself"), "{err}");
    let secretive = mirror("edge-a", ", envFrom: [{secretRef: {name: a-secret}}]")
        .replace("static-edge-a", "static-secretive");
    let (ok, _, err) = as_node(&["create", "-f", "-"], Some(&secretive));
    assert!(
        !ok && err.contains("can not create pods that reference secrets"),
        "{err}"
    );
    let plain = "apiVersion: v1\nkind: Pod\nmetadata: {name: plain}\nspec:\n  nodeName: edge-a\n  containers: [{name: c, image: busybox:1.36}]\n";
    let (ok, _, err) = as_node(&["create", "-f", "-"], Some(plain));
    assert!(!ok && err.contains("can only create mirror pods"), "{err}");
    let phase = r#"{"status":{"phase":"Running"}}"#;
    assert!(
        as_node(
            &[
                "patch",
                "pod",
                "on-edge-a",
                "--subresource",
                "status",
                "-p",
                phase
            ],
            None
        )
        .0
    );
    assert!(
        !as_node(
            &[
                "patch",
                "pod",
                "on-edge-b",
                "--subresource",
                "status",
                "-p",
                phase
            ],
            None
        )
        .0
    );
    assert!(!as_node(&["delete", "pod", "on-edge-b", "--wait=false"], None).0);
    // Leases: its own only.
    let lease = |node: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: {node}, namespace: kube-node-lease}}\nspec: {{holderIdentity: {node}}}\n"
        )
    };
    assert!(as_node(&["create", "-f", "-"], Some(&lease("edge-a"))).0);
    assert!(!as_node(&["create", "-f", "-"], Some(&lease("edge-b"))).0);
    assert!(!s.node_refusals().is_empty());
}

/// The `ephemeralcontainers` subresource as upstream validates it, driven by
/// the official Python client: containers added, defaulted, never changed
/// or removed; the pod itself cannot change them.
#[test]
fn ephemeral_containers_are_only_added_through_their_subresource() {
    let s = ApiServer::start();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]}});
    let (code, _) = s.call(
        "POST",
        "/api/v1/namespaces/default/pods",
        Some(("application/json", &pod)),
    );
    assert_eq!(code, 201);
    let script = r#"
import sys
from kubernetes import client, config
config.load_kube_config(sys.argv[1])
api = client.CoreV1Api()
body = {"spec": {"ephemeralContainers": [{"name": "dbg", "image": "busybox:1.36", "targetContainerName": "app", "stdin": True}]}}
pod = api.patch_namespaced_pod_ephemeralcontainers("p", "default", body)
print(pod.spec.ephemeral_containers[0].termination_message_path)
"#;
    let output = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(s.kubeconfig())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "/dev/termination-log"
    );
    let path = "/api/v1/namespaces/default/pods/p/ephemeralcontainers";
    let smp = "application/strategic-merge-patch+json";
    let refused = |body: Value, content_type: &str, at: &str| {
        let (code, status) = s.call("PATCH", at, Some((content_type, &body)));
        assert_eq!(code, 422, "{status}");
        status["message"].as_str().unwrap_or("").to_owned()
    };
    let changed = json!({"spec": {"ephemeralContainers": [{"name": "dbg", "image": "other:1"}]}});
    assert!(refused(changed, smp, path).contains("may not be changed"));
    let removed = json!([{"op": "replace", "path": "/spec/ephemeralContainers", "value": []}]);
    assert!(refused(removed, "application/json-patch+json", path).contains("may not be removed"));
    let with_ports = json!({"spec": {"ephemeralContainers": [{"name": "x", "image": "b:1", "ports": [{"containerPort": 80}]}]}});
    let m = refused(with_ports, smp, path);
    assert!(m.contains("ports"), "{m}");
    let clash = json!({"spec": {"ephemeralContainers": [{"name": "app", "image": "b:1"}]}});
    assert!(refused(clash, smp, path).contains("Duplicate value"));
    // Through the pod itself, as any other spec field.
    let direct = json!({"spec": {"ephemeralContainers": [{"name": "y", "image": "b:1"}]}});
    let message = refused(direct, smp, "/api/v1/namespaces/default/pods/p");
    assert!(message.contains("Forbidden: pod updates"), "{message}");
    let (_, pod) = s.call("GET", path, None);
    assert_eq!(pod["spec"]["ephemeralContainers"][0]["name"], "dbg");
    assert_eq!(
        pod["spec"]["ephemeralContainers"].as_array().unwrap().len(),
        1
    );
}
