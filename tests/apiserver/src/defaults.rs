//! What the real server adds to a pod on create: API defaulting (restart
//! policy, grace period, DNS policy, pull policy by tag, termination message
//! path...), the admission plugins' additions (service account and its token
//! volume, default tolerations) and the initial status.

use serde_json::{Value, json};

fn set_default(object: &mut Value, key: &str, value: Value) {
    if let Some(map) = object.as_object_mut() {
        map.entry(key.to_owned()).or_insert(value);
    }
}

pub fn default_container(container: &mut Value) {
    let image = container
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let policy = match nanolet::pod::default_pull_policy(&image) {
        nanolet::pod::PullPolicy::Always => "Always",
        nanolet::pod::PullPolicy::IfNotPresent => "IfNotPresent",
        nanolet::pod::PullPolicy::Never => "Never",
    };
    set_default(container, "imagePullPolicy", json!(policy));
    set_default(
        container,
        "terminationMessagePath",
        json!("/dev/termination-log"),
    );
    set_default(container, "terminationMessagePolicy", json!("File"));
    set_default(container, "resources", json!({}));
    if let Some(ports) = container.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports {
            set_default(port, "protocol", json!("TCP"));
        }
    }
}

/// Applies defaulting and admission to a new pod. `token_volume` names the
/// service account token volume (the real server adds a random suffix).
pub fn pod(pod: &mut Value, token_volume: &str) {
    let Some(spec) = pod.get_mut("spec") else {
        return;
    };
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "enableServiceLinks", json!(true));
    set_default(spec, "priority", json!(0));
    set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    for list in ["containers", "initContainers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            containers.iter_mut().for_each(default_container);
        }
    }
    // DefaultTolerationSeconds admission.
    let tolerations = spec
        .as_object_mut()
        .map(|s| s.entry("tolerations").or_insert_with(|| json!([])));
    if let Some(Value::Array(list)) = tolerations {
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            if !list.iter().any(|t| t["key"] == key) {
                list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    // ServiceAccount admission: the default account and its projected
    // token, unless the pod opts out. Mirror pods are left alone: they may
    // reference no account (NodeRestriction refuses those that do).
    let mirror = pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    let Some(spec) = pod.get_mut("spec") else {
        return;
    };
    if mirror {
        let mut status = json!({"phase": "Pending"});
        status["qosClass"] = json!(qos_class(spec));
        pod["status"] = status;
        return;
    }
    set_default(spec, "serviceAccountName", json!("default"));
    let account = spec["serviceAccountName"].clone();
    set_default(spec, "serviceAccount", account);
    if spec.get("automountServiceAccountToken") != Some(&Value::Bool(false)) {
        add_token_volume(spec, token_volume);
    }
    let mut status = json!({"phase": "Pending"});
    status["qosClass"] = json!(qos_class(&pod["spec"]));
    pod["status"] = status;
}

/// The `kubernetes` service's address: the first of the service range.
pub const MASTER_SERVICE_IP: &str = "10.96.0.1";

/// A Service as the real server completes it: a cluster IP from
/// 10.96.0.0/16 (unless headless or given), ports' protocol and target
/// port, and the type's and IP family's defaults.
pub fn service(service: &mut Value, taken: &[String]) -> Result<(), String> {
    let Some(spec) = service.get_mut("spec") else {
        return Err("spec is required".into());
    };
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    let given = spec.get("clusterIP").and_then(Value::as_str).unwrap_or("");
    let ip = match given {
        "" => (2..=u16::MAX)
            .map(|n| format!("10.96.{}.{}", n >> 8, n & 0xff))
            .find(|ip| !taken.contains(ip) && !ip.ends_with(".0") && !ip.ends_with(".255"))
            .ok_or("the service range is full")?,
        ip if taken.iter().any(|t| t == ip) && ip != "None" => {
            return Err(format!("provided IP is already allocated: {ip}"));
        }
        ip => ip.to_owned(),
    };
    spec["clusterIP"] = json!(ip);
    spec["clusterIPs"] = json!([ip]);
    if ip != "None" {
        set_default(spec, "ipFamilies", json!(["IPv4"]));
        set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports {
            set_default(port, "protocol", json!("TCP"));
            let number = port.get("port").cloned().unwrap_or(Value::Null);
            set_default(port, "targetPort", number);
        }
    }
    service["status"] = json!({"loadBalancer": {}});
    Ok(())
}

/// Secrets as the real server stores them: `stringData` is write-only,
/// merged into `data` (base64, taking precedence), and `type` defaults to
/// Opaque.
pub fn secret(secret: &mut Value) {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let Some(map) = secret.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(strings)) = map.remove("stringData") {
        let data = map.entry("data").or_insert_with(|| json!({}));
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            data[k.as_str()] = json!(engine.encode(text));
        }
    }
    map.entry("type").or_insert_with(|| json!("Opaque"));
}

fn add_token_volume(spec: &mut Value, name: &str) {
    let volume = json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]
        }
    });
    if let Some(map) = spec.as_object_mut() {
        let volumes = map.entry("volumes").or_insert_with(|| json!([]));
        if let Some(list) = volumes.as_array_mut() {
            list.push(volume);
        }
    }
    for list in ["containers", "initContainers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in containers {
                let mount = json!({"name": name, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
                if let Some(map) = c.as_object_mut() {
                    let mounts = map.entry("volumeMounts").or_insert_with(|| json!([]));
                    if let Some(m) = mounts.as_array_mut() {
                        m.push(mount);
                    }
                }
            }
        }
    }
}

/// The QoS class by the upstream rules, from requests and limits.
pub fn qos_class(spec: &Value) -> &'static str {
    // Pod-level resources, where set, decide alone; they sit at the same
    // place in the spec as in a container.
    let pod_level = ["requests", "limits"].iter().any(|k| {
        spec.pointer(&format!("/resources/{k}"))
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
    });
    let containers: Vec<&Value> = if pod_level {
        vec![spec]
    } else {
        ["containers", "initContainers"]
            .iter()
            .filter_map(|k| spec.get(*k).and_then(Value::as_array))
            .flatten()
            .collect()
    };
    let resource = |c: &Value, kind: &str, name: &str| {
        c.pointer(&format!("/resources/{kind}/{name}")).cloned()
    };
    let any = containers.iter().any(|c| {
        ["requests", "limits"].iter().any(|k| {
            c.pointer(&format!("/resources/{k}"))
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
        })
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let limit = resource(c, "limits", r);
            let request = resource(c, "requests", r).or_else(|| limit.clone());
            limit.is_some() && request == limit
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_merge_string_data() {
        let mut s = json!({"data": {"a": "eA=="}, "stringData": {"a": "y", "b": "z"}});
        secret(&mut s);
        assert_eq!(
            s,
            json!({"data": {"a": "eQ==", "b": "eg=="}, "type": "Opaque"})
        );
    }

    #[test]
    fn defaults_like_the_real_server() {
        let mut p = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80}]}]}});
        pod(&mut p, "kube-api-access-abcde");
        let s = &p["spec"];
        assert_eq!(s["restartPolicy"], "Always");
        assert_eq!(s["terminationGracePeriodSeconds"], 30);
        assert_eq!(s["dnsPolicy"], "ClusterFirst");
        assert_eq!(s["schedulerName"], "default-scheduler");
        assert_eq!(s["serviceAccountName"], "default");
        let c = &s["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(
            c["volumeMounts"][0]["mountPath"],
            "/var/run/secrets/kubernetes.io/serviceaccount"
        );
        assert_eq!(s["volumes"][0]["name"], "kube-api-access-abcde");
        assert_eq!(s["tolerations"].as_array().unwrap().len(), 2);
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(p["status"]["qosClass"], "BestEffort");
    }

    #[test]
    fn opting_out_and_qos() {
        let mut p = json!({"spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "x:1",
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        pod(&mut p, "v");
        assert!(p["spec"].get("volumes").is_none());
        assert_eq!(
            p["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(p["status"]["qosClass"], "Guaranteed");
    }
}
