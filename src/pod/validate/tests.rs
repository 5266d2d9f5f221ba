use super::*;
use serde_json::json;

fn pod(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": spec})
}

#[test]
fn minimal_pod_gets_defaults() {
    let p = validate(
        &pod(json!({"containers": [{"name": "c", "image": "busybox"}]})),
        "f",
        "u1",
    )
    .unwrap();
    assert_eq!(p.namespace, "default");
    assert_eq!(p.uid, "u1");
    assert_eq!(p.restart_policy, RestartPolicy::Always);
    assert_eq!(p.termination_grace, Duration::from_secs(30));
    assert_eq!(p.hostname, "web");
    assert_eq!(p.containers[0].pull_policy, PullPolicy::Always);
    assert_eq!(p.qos, QosClass::BestEffort);
}

#[test]
fn unsupported_field_is_named() {
    let err = validate(
        &pod(json!({"containers": [{"name": "c", "image": "b", "livenessProbe": {"grpc": {"port": 9}, "unknownField": 1}}]})),
        "f",
        "u",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.containers[0].livenessProbe.unknownField: not supported by nanolet yet"
    );
}

#[test]
fn recursive_read_only_only_on_read_only_private_mounts() {
    let with = |mount: Value| {
        validate(
            &pod(json!({
                "volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [{"name": "c", "image": "b", "volumeMounts": [mount]}]
            })),
            "f",
            "u",
        )
    };
    let p = with(
        json!({"name": "v", "mountPath": "/v", "readOnly": true, "recursiveReadOnly": "Enabled"}),
    )
    .unwrap();
    assert_eq!(
        p.containers[0].mounts[0].recursive_read_only,
        crate::pod::RecursiveReadOnly::Enabled
    );
    for bad in [
        json!({"name": "v", "mountPath": "/v", "recursiveReadOnly": "IfPossible"}),
        json!({"name": "v", "mountPath": "/v", "readOnly": true, "recursiveReadOnly": "Always"}),
        json!({"name": "v", "mountPath": "/v", "readOnly": true, "recursiveReadOnly": "Enabled",
               "mountPropagation": "HostToContainer"}),
    ] {
        let err = with(bad).unwrap_err().to_string();
        assert!(err.contains("recursiveReadOnly"), "{err}");
    }
}

#[test]
fn selinux_labels_are_accepted_as_containerd_accepts_them() {
    let spec = json!({
        "securityContext": {"seLinuxOptions": {"level": "s0:c123,c456"}, "seLinuxChangePolicy": "MountOption"},
        "containers": [{"name": "c", "image": "b", "securityContext": {"seLinuxOptions": {"type": "spc_t"}}}]
    });
    assert!(validate(&pod(spec), "f", "u").is_ok());
    let unknown = json!({"securityContext": {"seLinuxOptions": {"colour": "red"}},
        "containers": [{"name": "c", "image": "b"}]});
    let err = validate(&pod(unknown), "f", "u").unwrap_err();
    assert!(err.to_string().contains("seLinuxOptions.colour"), "{err}");
}

#[test]
fn a_runtime_class_name_is_kept_for_the_sandbox_and_must_be_a_dns_name() {
    let named = |name: &str| {
        validate(
            &pod(json!({"runtimeClassName": name, "containers": [{"name": "c", "image": "b"}]})),
            "f",
            "u",
        )
    };
    assert_eq!(
        named("gvisor").unwrap().runtime_class.as_deref(),
        Some("gvisor")
    );
    assert_eq!(named("").unwrap().runtime_class, None);
    let err = named("Kata_VM").unwrap_err();
    assert!(err.to_string().contains("spec.runtimeClassName"), "{err}");
}

#[test]
fn a_stop_signal_needs_the_pods_os_and_a_linux_signal() {
    let with = |os: Value, signal: &str| {
        let mut spec = json!({"containers": [{"name": "c", "image": "b",
            "lifecycle": {"stopSignal": signal}}]});
        if !os.is_null() {
            spec["os"] = os;
        }
        validate(&pod(spec), "f", "u")
    };
    let p = with(json!({"name": "linux"}), "SIGQUIT").unwrap();
    assert_eq!(p.containers[0].stop_signal.as_deref(), Some("SIGQUIT"));
    let err = with(Value::Null, "SIGQUIT").unwrap_err().to_string();
    assert!(err.contains("spec.os.name"), "{err}");
    let err = with(json!({"name": "linux"}), "SIGCTRL_BREAK")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.containers[0].lifecycle.stopSignal"),
        "{err}"
    );
}

#[test]
fn a_hostname_override_is_the_whole_host_name() {
    let with = |extra: Value| {
        let mut spec = json!({"hostname": "h", "subdomain": "s",
            "hostnameOverride": "board-7.plant.example", "containers": [{"name": "c", "image": "b"}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        validate(&pod(spec), "f", "u")
    };
    let p = with(json!({})).unwrap();
    assert_eq!(p.hostname, "board-7.plant.example");
    assert_eq!(p.subdomain, None);
    for conflict in [
        json!({"setHostnameAsFQDN": true}),
        json!({"hostNetwork": true}),
        json!({"hostnameOverride": "Not_A_Name"}),
        json!({"hostnameOverride": "a".repeat(65)}),
    ] {
        let err = with(conflict.clone()).unwrap_err().to_string();
        assert!(err.contains("spec.hostnameOverride"), "{conflict}: {err}");
    }
}

#[test]
fn capabilities_are_read_in_any_case_as_containerd_reads_them() {
    let p = validate(
        &pod(
            json!({"containers": [{"name": "c", "image": "b", "securityContext": {
            "capabilities": {"drop": ["all"], "add": ["net_bind_service", "CAP_CHOWN"]}}}]}),
        ),
        "f",
        "u",
    )
    .unwrap();
    let security = &p.containers[0].security;
    assert_eq!(security.capabilities_drop, ["ALL"]);
    assert_eq!(security.capabilities_add, ["NET_BIND_SERVICE", "CHOWN"]);
    let err = validate(
        &pod(
            json!({"containers": [{"name": "c", "image": "b", "securityContext": {
            "capabilities": {"add": ["sys_nonsense"]}}}]}),
        ),
        "f",
        "u",
    )
    .unwrap_err();
    assert!(err.to_string().contains("unknown capability"), "{err}");
}

#[test]
fn ephemeral_containers_come_last_without_what_upstream_forbids_them() {
    let with = |ephemeral: Value| {
        validate(
            &pod(json!({
                "initContainers": [{"name": "i", "image": "b"}],
                "containers": [{"name": "c", "image": "b"}],
                "ephemeralContainers": ephemeral,
            })),
            "f",
            "u",
        )
    };
    let p = with(json!([{"name": "d", "image": "b", "stdin": true, "targetContainerName": "c"}]))
        .unwrap();
    let d = p.container(2);
    assert_eq!((d.name.as_str(), d.role), ("d", ContainerRole::Ephemeral));
    assert_eq!(d.target.as_deref(), Some("c"));
    assert!(d.input.stdin);
    assert_eq!(p.all_containers().count(), 2);
    assert_eq!(p.every_container().count(), 3);
    for (field, value) in [
        ("ports", json!([{"containerPort": 80}])),
        ("readinessProbe", json!({"exec": {"command": ["true"]}})),
        ("lifecycle", json!({"preStop": {"sleep": {"seconds": 1}}})),
        ("resources", json!({"limits": {"cpu": "1"}})),
    ] {
        let mut c = json!({"name": "d", "image": "b"});
        c[field] = value;
        let err = with(json!([c])).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("spec.ephemeralContainers[0].{field}")),
            "{err}"
        );
    }
    let err = with(json!([{"name": "c", "image": "b"}])).unwrap_err();
    assert!(err.to_string().contains("duplicate name"), "{err}");
    let err = with(json!([{"name": "d", "image": "b", "targetContainerName": "x"}]));
    assert!(err.unwrap_err().to_string().contains("targetContainerName"));
}

#[test]
fn huge_grace_periods_are_clamped_not_overflowed() {
    let spec = json!({"terminationGracePeriodSeconds": i64::MAX, "containers": [{
        "name": "c", "image": "b:1",
        "livenessProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": i64::MAX},
        "lifecycle": {"preStop": {"sleep": {"seconds": i64::MAX}}}}]});
    let p = validate(&pod(spec), "f", "u").unwrap();
    let max = Duration::from_secs(MAX_GRACE_SECONDS as u64);
    assert_eq!(p.termination_grace, max);
    let probe = p.containers[0].probes.liveness.as_ref().unwrap();
    assert_eq!(probe.termination_grace, Some(max));
    // Deadlines from them stay computable.
    let _ = std::time::Instant::now() + max;
}

#[test]
fn missing_required_fields() {
    let err = validate(&pod(json!({"containers": [{"name": "c"}]})), "f", "u").unwrap_err();
    assert_eq!(err.to_string(), "spec.containers[0].image: required");
    let err = validate(
        &json!({"apiVersion": "v1", "kind": "Pod", "spec": {}}),
        "f",
        "u",
    )
    .unwrap_err();
    assert!(err.to_string().contains("metadata.name"), "{err}");
    let err = validate(&json!({"apiVersion": "v1", "kind": "Service"}), "f", "u").unwrap_err();
    assert!(err.to_string().contains("kind"), "{err}");
}

#[test]
fn host_users_false_excludes_the_hosts_namespaces_and_allows_unmasked_proc() {
    let with = |spec: Value| validate(&pod(spec), "f", "u");
    let unmasked =
        json!([{"name": "c", "image": "b", "securityContext": {"procMount": "Unmasked"}}]);
    let err = with(json!({"containers": unmasked})).unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.containers[0].securityContext.procMount"),
        "{err}"
    );
    let p = with(json!({"hostUsers": false, "containers": unmasked})).unwrap();
    assert!(!p.host_users && p.containers[0].security.proc_unmasked);
    let plain = json!([{"name": "c", "image": "b"}]);
    assert!(with(json!({"containers": plain})).unwrap().host_users);
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        let err = with(json!({"hostUsers": false, host: true, "containers": plain})).unwrap_err();
        assert!(err.to_string().contains(&format!("spec.{host}")), "{err}");
        assert!(with(json!({"hostUsers": true, host: true, "containers": plain})).is_ok());
    }
    let err = with(json!({"containers": [{"name": "c", "image": "b", "securityContext": {"procMount": "Masked"}}]})).unwrap_err();
    assert!(err.to_string().contains("unknown value"), "{err}");
}

#[test]
fn values_nanolet_cannot_honour_are_refused() {
    let c = |extra: Value| {
        let mut c = json!({"name": "c", "image": "b:1"});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        validate(&pod(json!({"containers": [c]})), "f", "u")
    };
    assert!(c(json!({"securityContext": {"procMount": "Unmasked"}})).is_err());
    assert!(
        c(json!({"securityContext": {"privileged": true, "allowPrivilegeEscalation": false}}))
            .is_err()
    );
    assert!(c(json!({"securityContext": {"capabilities": {"add": ["NOT_A_CAP"]}}})).is_err());
    assert!(c(json!({"securityContext": {"seccompProfile": {"type": "Localhost"}}})).is_err());
    let localhost = |path: &str| {
        c(
            json!({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": path}}}),
        )
    };
    assert_eq!(
        localhost("profiles/audit.json").unwrap().containers[0]
            .security
            .seccomp,
        SeccompProfile::Localhost("profiles/audit.json".into())
    );
    assert!(localhost("../escape.json").is_err());
    assert!(localhost("/etc/profile.json").is_err());
    assert!(c(json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "x"}}})).is_err());
    let with_volume = |mount: Value| {
        let spec = json!({"volumes": [{"name": "x", "emptyDir": {}}],
            "containers": [{"name": "c", "image": "b:1", "volumeMounts": [mount]}]});
        validate(&pod(spec), "f", "u")
    };
    assert!(with_volume(json!({"name": "x", "mountPath": "/x", "subPath": "a/b"})).is_ok());
    let err = with_volume(json!({"name": "x", "mountPath": "/x", "subPath": "../up"})).unwrap_err();
    assert!(err.to_string().contains("subPath"), "{err}");
    assert_eq!(
        c(json!({"stdin": true, "stdinOnce": true, "tty": true}))
            .unwrap()
            .containers[0]
            .input,
        Input {
            stdin: true,
            stdin_once: true,
            tty: true
        }
    );
    assert_eq!(c(json!({})).unwrap().containers[0].input, Input::default());
    assert!(c(json!({"ports": [{"containerPort": 80, "hostPort": 8080}]})).is_ok());
    assert!(c(json!({"ports": [{"containerPort": 80, "hostPort": 70000}]})).is_err());
    assert!(c(json!({"resources": {"limits": {"hugepages-2Mi": "2Mi"}}})).is_ok());
    assert!(c(json!({"resources": {"limits": {"nvidia.com/gpu": "0.5"}}})).is_err());
    assert!(c(json!({"resources": {"limits": {"ephemeral-storage": "1Gi"}}})).is_ok());
    assert!(c(json!({"ports": [{"containerPort": 80, "hostPort": 80, "hostIP": "::1"}]})).is_ok());
    assert!(
        c(json!({"ports": [{"containerPort": 80, "hostPort": 80, "hostIP": "here"}]})).is_err()
    );
    assert!(c(json!({"resources": {"limits": {"memory": "lots"}}})).is_err());
    assert!(c(json!({"volumeMounts": [{"name": "x", "mountPath": "/x"}]})).is_err());
    assert!(validate(&pod(json!({"containers": [{"name": "c", "image": "b"}], "shareProcessNamespace": true, "hostPID": true})), "f", "u").is_err());
    assert!(
        validate(
            &pod(
                json!({"containers": [{"name": "c", "image": "b"}], "shareProcessNamespace": true})
            ),
            "f",
            "u"
        )
        .unwrap()
        .share_process_namespace
    );
}

#[test]
fn resources_and_qos() {
    let p = validate(
        &pod(json!({"containers": [{"name": "c", "image": "b:1",
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]})),
        "f",
        "u",
    )
    .unwrap();
    let r = &p.containers[0].resources;
    assert_eq!(r.cpu_limit_milli, Some(500));
    assert_eq!(r.cpu_request_milli, Some(500));
    assert_eq!(r.memory_limit, Some(64 << 20));
    assert_eq!(p.qos, QosClass::Guaranteed);
    assert_eq!(p.containers[0].pull_policy, PullPolicy::IfNotPresent);
}

/// `cpu: 1` in YAML is a number; the API server takes it as a
/// quantity, and so does a static manifest here.
#[test]
fn quantities_may_be_numbers_and_extended_resources_whole() {
    let p = validate(
        &pod(json!({"containers": [{"name": "c", "image": "b:1",
            "resources": {"limits": {"cpu": 1, "memory": 1073741824, "example.com/dongle": 3},
                          "requests": {"cpu": 0.5}},
            "env": [{"name": "M", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": 1}}}]}],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": 1000000}}]})),
        "f",
        "u",
    )
    .unwrap();
    let r = &p.containers[0].resources;
    assert_eq!(r.cpu_limit_milli, Some(1000));
    assert_eq!(r.cpu_request_milli, Some(500));
    assert_eq!(r.memory_limit, Some(1 << 30));
    assert_eq!(r.extended["example.com/dongle"], 3);
    let refused = |resources: serde_json::Value| {
        validate(
            &pod(json!({"containers": [{"name": "c", "image": "b:1", "resources": resources}]})),
            "f",
            "u",
        )
        .unwrap_err()
        .to_string()
    };
    assert!(
        refused(json!({"limits": {"example.com/dongle": "1500m"}})).contains("must be an integer")
    );
    assert!(
        refused(
            json!({"limits": {"example.com/dongle": 2}, "requests": {"example.com/dongle": 1}})
        )
        .contains("cannot be overcommitted")
    );
    assert!(
        refused(json!({"requests": {"example.com/dongle": 1}})).contains("cannot be overcommitted")
    );
    assert!(refused(json!({"limits": {"cpu": true}})).contains("expected a quantity"));
    assert!(refused(json!({"limits": {"nonsense": "2Mi"}})).contains("not supported"));
}

/// subPathExpr expands with the container's variables when it starts;
/// a value that climbs out of the volume is refused then.
#[test]
fn sub_path_expressions() {
    let with_mount = |mount: serde_json::Value| {
        validate(
            &pod(
                json!({"containers": [{"name": "c", "image": "b:1", "volumeMounts": [mount]}],
                "volumes": [{"name": "v", "emptyDir": {}}]}),
            ),
            "f",
            "u",
        )
    };
    let p =
        with_mount(json!({"name": "v", "mountPath": "/x", "subPathExpr": "logs/$(NAME)"})).unwrap();
    let c = &p.containers[0];
    let env = |v: &str| vec![("NAME".to_owned(), v.to_owned())];
    let expanded = c.expand_sub_paths(&env("web-0")).unwrap();
    assert_eq!(expanded.mounts[0].sub_path.as_deref(), Some("logs/web-0"));
    assert!(c.expand_sub_paths(&env("../../etc")).is_err());
    assert!(with_mount(json!({"name": "v", "mountPath": "/x", "subPathExpr": "/abs"})).is_err());
    assert!(
        with_mount(json!({"name": "v", "mountPath": "/x", "subPath": "a", "subPathExpr": "b"}))
            .unwrap_err()
            .to_string()
            .contains("mutually exclusive")
    );
}

#[test]
fn pull_policy_defaults() {
    assert_eq!(default_pull_policy("busybox"), PullPolicy::Always);
    assert_eq!(default_pull_policy("busybox:latest"), PullPolicy::Always);
    assert_eq!(
        default_pull_policy("localhost:5000/busybox"),
        PullPolicy::Always
    );
    assert_eq!(
        default_pull_policy("localhost:5000/busybox:1"),
        PullPolicy::IfNotPresent
    );
    assert_eq!(
        default_pull_policy("busybox@sha256:abc"),
        PullPolicy::IfNotPresent
    );
}
