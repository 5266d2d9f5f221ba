//! From an untrusted Pod document to a [`Pod`]: every field must be one
//! nanolet implements, and every value one it can honour.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use serde_json::Value;

use super::*;
use crate::quantity;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    #[error("{field}: not supported by nanolet yet")]
    Unsupported { field: String },
    /// Refused by the host's admission, as upstream's reason AppArmor.
    #[error("Cannot enforce AppArmor: {0}")]
    AppArmor(String),
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

fn unsupported(field: impl Into<String>) -> PodError {
    PodError::Unsupported {
        field: field.into(),
    }
}

pub(super) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PodError {
    PodError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The shape of the fields nanolet understands.
enum Shape {
    /// Any scalar (its value is checked during conversion).
    Leaf,
    /// Any content: typed deserialisation checks it, or nanolet does not act
    /// on it (status, creationTimestamp).
    Any,
    /// A map of strings to strings (labels, annotations).
    StringMap,
    /// A resource list: quantities, as strings or (as the API server
    /// takes them) numbers.
    QuantityMap,
    Object(&'static [(&'static str, Shape)]),
    ListOf(&'static [(&'static str, Shape)]),
}

use Shape::*;

const METADATA: &[(&str, Shape)] = &[
    ("name", Leaf),
    ("namespace", Leaf),
    ("uid", Leaf),
    ("labels", StringMap),
    ("annotations", StringMap),
    ("creationTimestamp", Any),
    // Set by the API server; nothing for a node to act on (deletion is
    // read by the API source before validation).
    ("resourceVersion", Any),
    ("generation", Any),
    ("generateName", Any),
    ("selfLink", Any),
    ("ownerReferences", Any),
    ("managedFields", Any),
    ("finalizers", Any),
    ("deletionTimestamp", Any),
    ("deletionGracePeriodSeconds", Any),
];

/// The longest grace period honoured (about 136 years): larger values mean
/// "never" in practice and must not overflow deadline arithmetic.
pub(super) const MAX_GRACE_SECONDS: i64 = u32::MAX as i64;

/// SELinux options are refused by name (`type` is checked in the
/// conversion).
const SECCOMP: &[(&str, Shape)] = &[("type", Leaf), ("localhostProfile", Leaf)];
const APPARMOR: &[(&str, Shape)] = &[("type", Leaf), ("localhostProfile", Leaf)];

/// Windows' options, which a Linux node ignores, as upstream's kubelet.
const WINDOWS: &[(&str, Shape)] = &[
    ("gmsaCredentialSpecName", Leaf),
    ("gmsaCredentialSpec", Leaf),
    ("runAsUserName", Leaf),
    ("hostProcess", Leaf),
];

/// SELinux labels: accepted and not applied, as containerd leaves them
/// with its default `enable_selinux = false` (and as every host without
/// SELinux, Debian's and Raspberry Pi OS's, must).
const SELINUX: &[(&str, Shape)] = &[
    ("user", Leaf),
    ("role", Leaf),
    ("type", Leaf),
    ("level", Leaf),
];

const POD_SECURITY: &[(&str, Shape)] = &[
    ("seLinuxOptions", Object(SELINUX)),
    ("seLinuxChangePolicy", Leaf),
    ("runAsUser", Leaf),
    ("runAsGroup", Leaf),
    ("runAsNonRoot", Leaf),
    ("supplementalGroups", Any),
    ("supplementalGroupsPolicy", Leaf),
    ("fsGroupChangePolicy", Leaf),
    ("windowsOptions", Object(WINDOWS)),
    ("fsGroup", Leaf),
    ("sysctls", ListOf(&[("name", Leaf), ("value", Leaf)])),
    ("seccompProfile", Object(SECCOMP)),
    ("appArmorProfile", Object(APPARMOR)),
];

const CONTAINER_SECURITY: &[(&str, Shape)] = &[
    ("seLinuxOptions", Object(SELINUX)),
    ("runAsUser", Leaf),
    ("runAsGroup", Leaf),
    ("runAsNonRoot", Leaf),
    ("readOnlyRootFilesystem", Leaf),
    ("privileged", Leaf),
    ("allowPrivilegeEscalation", Leaf),
    ("capabilities", Object(&[("add", Any), ("drop", Any)])),
    ("seccompProfile", Object(SECCOMP)),
    ("appArmorProfile", Object(APPARMOR)),
    ("procMount", Leaf),
    ("windowsOptions", Object(WINDOWS)),
];

/// Capabilities by number, as the kernel knows them (6.x).
pub const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The sysctls upstream allows without allowedUnsafeSysctls: namespaced,
/// and isolated from other pods.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// The profile a securityContext names; `None` when not set.
fn seccomp_profile(
    field: &str,
    p: Option<&core::SeccompProfile>,
) -> Result<Option<SeccompProfile>, PodError> {
    let Some(p) = p else {
        return Ok(None);
    };
    let localhost = p.localhost_profile.as_deref().filter(|l| !l.is_empty());
    if localhost.is_some() && p.type_ != "Localhost" {
        return Err(invalid(
            format!("{field}.seccompProfile.localhostProfile"),
            "can only be set when seccomp type is Localhost",
        ));
    }
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(Some(SeccompProfile::RuntimeDefault)),
        "Unconfined" => Ok(Some(SeccompProfile::Unconfined)),
        "Localhost" => {
            let lfield = format!("{field}.seccompProfile.localhostProfile");
            let Some(path) = localhost else {
                return Err(invalid(
                    lfield,
                    "must be set when seccomp type is Localhost",
                ));
            };
            // Upstream's rule: a relative path that stays under the root.
            if path.starts_with('/') || path.split('/').any(|c| c == "..") {
                return Err(invalid(lfield, "must be a relative path without '..'"));
            }
            Ok(Some(SeccompProfile::Localhost(path.to_owned())))
        }
        other => Err(invalid(
            format!("{field}.seccompProfile.type"),
            format!("unknown value {other:?}"),
        )),
    }
}

/// Capability names as containerd reads them: in any case (`drop: [all]`
/// is common, CoreDNS's manifest has it), with or without `CAP_`.
fn capability_names(field: &str, names: Option<&Vec<String>>) -> Result<Vec<String>, PodError> {
    let mut out = Vec::new();
    for (i, name) in names.into_iter().flatten().enumerate() {
        let upper = name.to_ascii_uppercase();
        let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
        if bare != "ALL" && !CAPABILITIES.contains(&bare) {
            return Err(invalid(
                format!("{field}[{i}]"),
                format!("unknown capability {name:?}"),
            ));
        }
        out.push(bare.to_owned());
    }
    Ok(out)
}

const CONTAINER: &[(&str, Shape)] = &[
    ("name", Leaf),
    ("image", Leaf),
    ("imagePullPolicy", Leaf),
    ("command", Any),
    ("args", Any),
    (
        "env",
        ListOf(&[
            ("name", Leaf),
            ("value", Leaf),
            (
                "valueFrom",
                Object(&[
                    ("fieldRef", Object(FIELD_REF)),
                    ("resourceFieldRef", Object(RESOURCE_REF)),
                    ("configMapKeyRef", Object(KEY_REF)),
                    ("secretKeyRef", Object(KEY_REF)),
                ]),
            ),
        ]),
    ),
    (
        "envFrom",
        ListOf(&[
            ("prefix", Leaf),
            ("configMapRef", Object(OBJECT_REF)),
            ("secretRef", Object(OBJECT_REF)),
        ]),
    ),
    ("workingDir", Leaf),
    (
        "ports",
        ListOf(&[
            ("name", Leaf),
            ("containerPort", Leaf),
            ("protocol", Leaf),
            ("hostPort", Leaf),
            ("hostIP", Leaf),
        ]),
    ),
    (
        "resources",
        Object(&[("requests", QuantityMap), ("limits", QuantityMap)]),
    ),
    ("securityContext", Object(CONTAINER_SECURITY)),
    ("terminationMessagePath", Leaf),
    ("terminationMessagePolicy", Leaf),
    (
        "volumeMounts",
        ListOf(&[
            ("name", Leaf),
            ("mountPath", Leaf),
            ("readOnly", Leaf),
            ("subPath", Leaf),
            ("subPathExpr", Leaf),
            ("mountPropagation", Leaf),
            ("recursiveReadOnly", Leaf),
        ]),
    ),
    ("stdin", Leaf),
    ("stdinOnce", Leaf),
    ("tty", Leaf),
    // Ephemeral containers only (the typed Pod drops it elsewhere, as the
    // API server does).
    ("targetContainerName", Leaf),
    (
        "resizePolicy",
        ListOf(&[("resourceName", Leaf), ("restartPolicy", Leaf)]),
    ),
    // Init containers only: `Always` makes a sidecar.
    ("restartPolicy", Leaf),
    (
        "lifecycle",
        Object(&[
            ("postStart", Object(HANDLER)),
            ("preStop", Object(HANDLER)),
            ("stopSignal", Leaf),
        ]),
    ),
    ("startupProbe", Object(PROBE)),
    ("livenessProbe", Object(PROBE)),
    ("readinessProbe", Object(PROBE)),
];

const HTTP_GET: &[(&str, Shape)] = &[
    ("path", Leaf),
    ("port", Leaf),
    ("host", Leaf),
    ("scheme", Leaf),
    ("httpHeaders", ListOf(&[("name", Leaf), ("value", Leaf)])),
];

/// tcpSocket hooks are deprecated upstream and refused here.
const HANDLER: &[(&str, Shape)] = &[
    ("exec", Object(&[("command", Any)])),
    ("httpGet", Object(HTTP_GET)),
    ("sleep", Object(&[("seconds", Leaf)])),
];

const PROBE: &[(&str, Shape)] = &[
    ("grpc", Object(&[("port", Leaf), ("service", Leaf)])),
    ("exec", Object(&[("command", Any)])),
    ("httpGet", Object(HTTP_GET)),
    ("tcpSocket", Object(&[("port", Leaf), ("host", Leaf)])),
    ("initialDelaySeconds", Leaf),
    ("timeoutSeconds", Leaf),
    ("periodSeconds", Leaf),
    ("successThreshold", Leaf),
    ("failureThreshold", Leaf),
    ("terminationGracePeriodSeconds", Leaf),
];

const FIELD_REF: &[(&str, Shape)] = &[("apiVersion", Leaf), ("fieldPath", Leaf)];
const RESOURCE_REF: &[(&str, Shape)] = &[
    ("containerName", Leaf),
    ("resource", Leaf),
    ("divisor", Leaf),
];
const KEY_REF: &[(&str, Shape)] = &[("name", Leaf), ("key", Leaf), ("optional", Leaf)];
const OBJECT_REF: &[(&str, Shape)] = &[("name", Leaf), ("optional", Leaf)];
const KEY_TO_PATH: &[(&str, Shape)] = &[("key", Leaf), ("path", Leaf), ("mode", Leaf)];
const DOWNWARD_ITEM: &[(&str, Shape)] = &[
    ("path", Leaf),
    ("fieldRef", Object(FIELD_REF)),
    ("resourceFieldRef", Object(RESOURCE_REF)),
    ("mode", Leaf),
];
const PROJECTION: &[(&str, Shape)] = &[
    (
        "configMap",
        Object(&[
            ("name", Leaf),
            ("items", ListOf(KEY_TO_PATH)),
            ("optional", Leaf),
        ]),
    ),
    (
        "secret",
        Object(&[
            ("name", Leaf),
            ("items", ListOf(KEY_TO_PATH)),
            ("optional", Leaf),
        ]),
    ),
    ("downwardAPI", Object(&[("items", ListOf(DOWNWARD_ITEM))])),
    (
        "serviceAccountToken",
        Object(&[
            ("audience", Leaf),
            ("expirationSeconds", Leaf),
            ("path", Leaf),
        ]),
    ),
];

/// The volume types nanolet mounts.
const MOUNTED_VOLUMES: &[&str] = &[
    "emptyDir",
    "hostPath",
    "configMap",
    "secret",
    "downwardAPI",
    "projected",
];

const VOLUME: &[(&str, Shape)] = &[
    ("name", Leaf),
    // Types nanolet cannot mount: their pods stay ContainerCreating with
    // FailedMount events, as upstream's kubelet leaves a pod whose volume
    // no plugin of it mounts. Their content is checked by the typed Pod.
    ("awsElasticBlockStore", Any),
    ("azureDisk", Any),
    ("azureFile", Any),
    ("cephfs", Any),
    ("cinder", Any),
    ("csi", Any),
    ("ephemeral", Any),
    ("fc", Any),
    ("flexVolume", Any),
    ("flocker", Any),
    ("gcePersistentDisk", Any),
    ("gitRepo", Any),
    ("glusterfs", Any),
    ("image", Any),
    ("iscsi", Any),
    ("nfs", Any),
    ("persistentVolumeClaim", Any),
    ("photonPersistentDisk", Any),
    ("portworxVolume", Any),
    ("quobyte", Any),
    ("rbd", Any),
    ("scaleIO", Any),
    ("storageos", Any),
    ("vsphereVolume", Any),
    ("emptyDir", Object(&[("medium", Leaf), ("sizeLimit", Leaf)])),
    ("hostPath", Object(&[("path", Leaf), ("type", Leaf)])),
    (
        "configMap",
        Object(&[
            ("name", Leaf),
            ("items", ListOf(KEY_TO_PATH)),
            ("defaultMode", Leaf),
            ("optional", Leaf),
        ]),
    ),
    (
        "secret",
        Object(&[
            ("secretName", Leaf),
            ("items", ListOf(KEY_TO_PATH)),
            ("defaultMode", Leaf),
            ("optional", Leaf),
        ]),
    ),
    (
        "downwardAPI",
        Object(&[("items", ListOf(DOWNWARD_ITEM)), ("defaultMode", Leaf)]),
    ),
    (
        "projected",
        Object(&[("sources", ListOf(PROJECTION)), ("defaultMode", Leaf)]),
    ),
];

const SPEC: &[(&str, Shape)] = &[
    ("containers", ListOf(CONTAINER)),
    ("initContainers", ListOf(CONTAINER)),
    ("ephemeralContainers", ListOf(CONTAINER)),
    ("restartPolicy", Leaf),
    ("terminationGracePeriodSeconds", Leaf),
    ("activeDeadlineSeconds", Leaf),
    ("hostNetwork", Leaf),
    ("hostPID", Leaf),
    ("hostIPC", Leaf),
    ("hostUsers", Leaf),
    ("hostname", Leaf),
    ("hostnameOverride", Leaf),
    ("nodeName", Leaf),
    ("dnsPolicy", Leaf),
    (
        "dnsConfig",
        Object(&[
            ("nameservers", Any),
            ("searches", Any),
            ("options", ListOf(&[("name", Leaf), ("value", Leaf)])),
        ]),
    ),
    ("hostAliases", ListOf(&[("ip", Leaf), ("hostnames", Any)])),
    ("subdomain", Leaf),
    ("setHostnameAsFQDN", Leaf),
    ("schedulerName", Leaf),
    ("enableServiceLinks", Leaf),
    ("automountServiceAccountToken", Leaf),
    ("shareProcessNamespace", Leaf),
    ("securityContext", Object(POD_SECURITY)),
    ("volumes", ListOf(VOLUME)),
    // The scheduler's business, already done when a pod reaches a node.
    // Admission checks the node selector, the required node affinity, the
    // OS and NoExecute taints again, as upstream's kubelet does.
    ("nodeSelector", StringMap),
    ("affinity", Any),
    ("tolerations", Any),
    ("topologySpreadConstraints", Any),
    ("readinessGates", ListOf(&[("conditionType", Leaf)])),
    ("schedulingGates", Any),
    ("schedulingGroup", Any),
    ("os", Object(&[("name", Leaf)])),
    ("priority", Leaf),
    ("priorityClassName", Leaf),
    // Resolved when the sandbox is made (cluster mode).
    ("runtimeClassName", Leaf),
    // Set by RuntimeClass admission: counted by admission and the pod's
    // cgroup, as upstream's kubelet does.
    ("overhead", QuantityMap),
    // Pod-level resources (beta and on by default since 1.34).
    (
        "resources",
        Object(&[("requests", QuantityMap), ("limits", QuantityMap)]),
    ),
    ("preemptionPolicy", Leaf),
    ("imagePullSecrets", ListOf(&[("name", Leaf)])),
    // The service account's token reaches a pod only through a volume.
    ("serviceAccountName", Leaf),
    ("serviceAccount", Leaf),
];

const POD: &[(&str, Shape)] = &[
    ("apiVersion", Leaf),
    ("kind", Leaf),
    ("metadata", Object(METADATA)),
    ("spec", Object(SPEC)),
    ("status", Any),
];

fn check_shape(value: &Value, path: &str, shape: &Shape) -> Result<(), PodError> {
    match (shape, value) {
        (Any, _) | (_, Value::Null) => Ok(()),
        (Leaf, Value::Object(_) | Value::Array(_)) => Err(invalid(path, "expected a scalar value")),
        (Leaf, _) => Ok(()),
        (StringMap, Value::Object(map)) => {
            for (key, v) in map {
                if !v.is_string() {
                    return Err(invalid(format!("{path}.{key}"), "expected a string"));
                }
            }
            Ok(())
        }
        (QuantityMap, Value::Object(map)) => {
            for (key, v) in map {
                if !v.is_string() && !v.is_number() {
                    return Err(invalid(format!("{path}.{key}"), "expected a quantity"));
                }
            }
            Ok(())
        }
        (Object(fields), Value::Object(map)) => check_object(map, path, fields),
        (ListOf(fields), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let item_path = format!("{path}[{i}]");
                match item {
                    Value::Object(map) => check_object(map, &item_path, fields)?,
                    _ => return Err(invalid(item_path, "expected an object")),
                }
            }
            Ok(())
        }
        (StringMap | QuantityMap | Object(_), _) => Err(invalid(path, "expected an object")),
        (ListOf(_), _) => Err(invalid(path, "expected a list")),
    }
}

fn check_object(
    map: &serde_json::Map<String, Value>,
    path: &str,
    fields: &[(&str, Shape)],
) -> Result<(), PodError> {
    for (key, v) in map {
        let field = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match fields.iter().find(|(name, _)| name == key) {
            Some((_, shape)) => check_shape(v, &field, shape)?,
            None => return Err(unsupported(field)),
        }
    }
    Ok(())
}

/// Validates one Pod document from `source`. `uid` is used when the document
/// has none (static pods get theirs from a hash of file and content).
pub fn validate(document: &Value, source: &str, uid: &str) -> Result<Pod, PodError> {
    match document.get("apiVersion").and_then(Value::as_str) {
        Some("v1") => {}
        other => return Err(invalid("apiVersion", format!("{other:?} is not \"v1\""))),
    }
    match document.get("kind").and_then(Value::as_str) {
        Some("Pod") => {}
        other => return Err(invalid("kind", format!("{other:?} is not \"Pod\""))),
    }
    let Value::Object(map) = document else {
        return Err(invalid("", "a Pod must be an object"));
    };
    check_object(map, "", POD)?;
    // Quantities written as numbers are read as the API server reads them.
    let manifest: core::Pod =
        serde_json::from_value(document.clone()).map_err(|e| invalid("", e.to_string()))?;
    convert(manifest, source, uid)
}

fn dns_label(field: &str, value: &str, max: usize) -> Result<(), PodError> {
    let ok = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !value.starts_with(['-', '.'])
        && !value.ends_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "{value:?} must be lower-case alphanumerics, '-' or '.', at most {max} characters"
            ),
        ))
    }
}

/// Upstream's limits: 3 nameservers, 32 search domains.
fn dns_config(c: &core::PodDNSConfig) -> Result<DnsConfig, PodError> {
    let nameservers = c.nameservers.clone().unwrap_or_default();
    if nameservers.len() > 3 {
        return Err(invalid(
            "spec.dnsConfig.nameservers",
            "must not have more than 3 nameservers",
        ));
    }
    for (i, ns) in nameservers.iter().enumerate() {
        if ns.parse::<std::net::IpAddr>().is_err() {
            return Err(invalid(
                format!("spec.dnsConfig.nameservers[{i}]"),
                "must be a valid IP address",
            ));
        }
    }
    let searches = c.searches.clone().unwrap_or_default();
    if searches.len() > 32 {
        return Err(invalid(
            "spec.dnsConfig.searches",
            "must not have more than 32 search paths",
        ));
    }
    for (i, search) in searches.iter().enumerate() {
        dns_label(
            &format!("spec.dnsConfig.searches[{i}]"),
            search.trim_end_matches('.'),
            253,
        )?;
    }
    let mut options = Vec::new();
    for (i, option) in c.options.iter().flatten().enumerate() {
        let name = option
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                invalid(
                    format!("spec.dnsConfig.options[{i}].name"),
                    "Required value",
                )
            })?;
        options.push((name, option.value.clone()));
    }
    Ok(DnsConfig {
        nameservers,
        searches,
        options,
    })
}

fn id_from(field: &str, value: Option<i64>) -> Result<Option<u32>, PodError> {
    value
        .map(|v| u32::try_from(v).map_err(|_| invalid(field, format!("{v} is not a valid id"))))
        .transpose()
}

fn convert(manifest: core::Pod, source: &str, default_uid: &str) -> Result<Pod, PodError> {
    let meta = &manifest.metadata;
    let name = meta
        .name
        .clone()
        .ok_or_else(|| invalid("metadata.name", "required"))?;
    dns_label("metadata.name", &name, 253)?;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    dns_label("metadata.namespace", &namespace, 63)?;
    let uid = meta.uid.clone().unwrap_or_else(|| default_uid.to_owned());
    if uid.is_empty() || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(invalid(
            "metadata.uid",
            format!("{uid:?} is not a valid UID"),
        ));
    }
    let spec = manifest
        .spec
        .as_ref()
        .ok_or_else(|| invalid("spec", "required"))?;

    let restart_policy = match spec.restart_policy.as_deref() {
        None | Some("Always") => RestartPolicy::Always,
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Never") => RestartPolicy::Never,
        Some(other) => {
            return Err(invalid(
                "spec.restartPolicy",
                format!("unknown value {other:?}"),
            ));
        }
    };
    // Clamped so that deadlines computed from it cannot overflow.
    let grace = spec
        .termination_grace_period_seconds
        .unwrap_or(30)
        .min(MAX_GRACE_SECONDS);
    if grace < 0 {
        return Err(invalid(
            "spec.terminationGracePeriodSeconds",
            "must not be negative",
        ));
    }
    let share_process_namespace = spec.share_process_namespace.unwrap_or(false);
    if share_process_namespace && spec.host_pid == Some(true) {
        return Err(invalid(
            "spec.shareProcessNamespace",
            "ShareProcessNamespace and HostPID cannot both be enabled",
        ));
    }
    let host_network = spec.host_network.unwrap_or(false);
    let host_users = spec.host_users.unwrap_or(true);
    if !host_users {
        // The host's namespaces belong to the host's user namespace.
        let shared = [
            ("hostNetwork", host_network),
            ("hostPID", spec.host_pid == Some(true)),
            ("hostIPC", spec.host_ipc == Some(true)),
        ];
        if let Some((name, _)) = shared.iter().find(|(_, on)| *on) {
            return Err(invalid(
                format!("spec.{name}"),
                "Forbidden: when `hostUsers` is false",
            ));
        }
    }
    let image_pull_secrets: Vec<String> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.clone())
        .filter(|n| !n.is_empty())
        .collect();
    let dns_policy = match spec.dns_policy.as_deref() {
        None | Some("ClusterFirst") => DnsPolicy::ClusterFirst,
        Some("ClusterFirstWithHostNet") => DnsPolicy::ClusterFirstWithHostNet,
        Some("Default") => DnsPolicy::Default,
        Some("None") => DnsPolicy::None,
        Some(other) => {
            return Err(invalid(
                "spec.dnsPolicy",
                format!("unknown value {other:?}"),
            ));
        }
    };
    let dns_config = spec.dns_config.as_ref().map(dns_config).transpose()?;
    if dns_policy == DnsPolicy::None && dns_config.as_ref().is_none_or(|c| c.nameservers.is_empty())
    {
        return Err(invalid(
            "spec.dnsConfig.nameservers",
            "must have at least one nameserver when `dnsPolicy` is None",
        ));
    }
    let mut host_aliases = Vec::new();
    for (i, alias) in spec.host_aliases.iter().flatten().enumerate() {
        let field = format!("spec.hostAliases[{i}]");
        if alias.ip.parse::<std::net::IpAddr>().is_err() {
            return Err(invalid(format!("{field}.ip"), "must be a valid IP address"));
        }
        let names = alias.hostnames.clone().unwrap_or_default();
        for (j, name) in names.iter().enumerate() {
            dns_label(&format!("{field}.hostnames[{j}]"), name, 253)?;
        }
        host_aliases.push((alias.ip.clone(), names));
    }
    let mut subdomain = spec.subdomain.clone().filter(|s| !s.is_empty());
    if let Some(subdomain) = &subdomain {
        dns_label("spec.subdomain", subdomain, 63)?;
    }
    let hostname_override = spec.hostname_override.clone().filter(|s| !s.is_empty());
    if let Some(name) = &hostname_override {
        dns_label("spec.hostnameOverride", name, 64)?;
        if spec.set_hostname_as_fqdn == Some(true) {
            return Err(invalid(
                "spec.hostnameOverride",
                "Invalid value: may not be set when setHostnameAsFQDN is true",
            ));
        }
        if host_network {
            return Err(invalid(
                "spec.hostnameOverride",
                "Invalid value: may not be set when hostNetwork is true",
            ));
        }
        // It is the host name alone: no domain, whatever the subdomain.
        subdomain = None;
    }
    let runtime_class = spec.runtime_class_name.clone().filter(|s| !s.is_empty());
    if let Some(class) = &runtime_class {
        dns_label("spec.runtimeClassName", class, 253)?;
    }
    let hostname = match hostname_override {
        Some(name) => name,
        None => {
            let hostname = spec.hostname.clone().unwrap_or_else(|| name.clone());
            // Linux host names are at most 64 bytes; upstream truncates the
            // pod name to 63 characters.
            let hostname: String = hostname.chars().take(63).collect::<String>();
            let hostname = hostname.trim_end_matches(['-', '.']).to_owned();
            dns_label("spec.hostname", &hostname, 63)?;
            hostname
        }
    };

    let security = spec.security_context.as_ref();
    let run_as_user = id_from(
        "spec.securityContext.runAsUser",
        security.and_then(|s| s.run_as_user),
    )?;
    let run_as_group = id_from(
        "spec.securityContext.runAsGroup",
        security.and_then(|s| s.run_as_group),
    )?;
    let supplemental_groups = security
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|g| {
            id_from("spec.securityContext.supplementalGroups", Some(g)).map(|g| g.unwrap_or(0))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let overhead = {
        let list = spec.overhead.as_ref();
        let milli = resource(list, "spec.overhead", "cpu")?;
        let bytes = resource(list, "spec.overhead", "memory")?;
        let whole = |v: Option<u128>, div: u128| {
            v.map_or(0, |v| u64::try_from(v.div_ceil(div)).unwrap_or(u64::MAX))
        };
        (whole(milli, 1), whole(bytes, 1000))
    };
    let active_deadline = match spec.active_deadline_seconds {
        None => None,
        Some(seconds) if seconds > 0 => Some(Duration::from_secs(seconds.unsigned_abs())),
        Some(_) => {
            return Err(invalid(
                "spec.activeDeadlineSeconds",
                "must be greater than 0",
            ));
        }
    };
    let merge_image_groups = match security.and_then(|s| s.supplemental_groups_policy.as_deref()) {
        None | Some("Merge") => true,
        Some("Strict") => false,
        Some(other) => {
            return Err(invalid(
                "spec.securityContext.supplementalGroupsPolicy",
                format!("unknown value {other:?}"),
            ));
        }
    };
    // nanolet's volumes are new or its own: their ownership is set when
    // made, which either policy gives.
    match security.and_then(|s| s.fs_group_change_policy.as_deref()) {
        None | Some("OnRootMismatch" | "Always") => {}
        Some(other) => {
            return Err(invalid(
                "spec.securityContext.fsGroupChangePolicy",
                format!("unknown value {other:?}"),
            ));
        }
    }
    let run_as_non_root = security.and_then(|s| s.run_as_non_root).unwrap_or(false);
    let fs_group = id_from(
        "spec.securityContext.fsGroup",
        security.and_then(|s| s.fs_group),
    )?;
    let pod_seccomp = seccomp_profile(
        "spec.securityContext",
        security.and_then(|s| s.seccomp_profile.as_ref()),
    )?;
    let pod_apparmor = apparmor::from_field(
        "spec.securityContext",
        security.and_then(|s| s.app_armor_profile.as_ref()),
    )?;
    let mut sysctls = Vec::new();
    for (i, sysctl) in security
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = format!("spec.securityContext.sysctls[{i}]");
        if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
            // Upstream's admission refuses these unless allowedUnsafeSysctls.
            return Err(invalid(
                format!("{field}.name"),
                format!("{:?} is not a safe sysctl (SysctlForbidden)", sysctl.name),
            ));
        }
        if host_network && sysctl.name.starts_with("net.") {
            return Err(invalid(
                format!("{field}.name"),
                "net.* sysctls are not allowed with hostNetwork",
            ));
        }
        sysctls.push((sysctl.name.clone(), sysctl.value.clone()));
    }

    let volumes = convert_volumes(spec.volumes.as_deref().unwrap_or_default())?;

    if spec.containers.is_empty() {
        return Err(invalid(
            "spec.containers",
            "at least one container is required",
        ));
    }
    let mut init_containers = Vec::new();
    let mut containers = Vec::new();
    let lists = [
        (
            "spec.initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
        ("spec.containers", spec.containers.as_slice()),
    ];
    for (list, specs) in lists {
        for (i, c) in specs.iter().enumerate() {
            let field = format!("{list}[{i}]");
            let mut container =
                convert_container(c, &field, host_network, &volumes, pod_seccomp.clone())?;
            finish_security(
                &mut container,
                c.security_context.as_ref(),
                &field,
                host_users,
                meta,
                &pod_apparmor,
            )?;
            // Upstream ties the signal's meaning to the pod's OS.
            if container.stop_signal.is_some() && spec.os.is_none() {
                return Err(invalid(
                    format!("{field}.lifecycle.stopSignal"),
                    "Forbidden: may not be set for containers with empty `spec.os.name`",
                ));
            }
            let named_before = init_containers.iter().chain(&containers);
            if named_before
                .into_iter()
                .any(|other: &Container| other.name == container.name)
            {
                return Err(invalid(
                    format!("{field}.name"),
                    format!("duplicate name {:?}", container.name),
                ));
            }
            let init = list == "spec.initContainers";
            container.role = match (init, c.restart_policy.as_deref()) {
                (false, None) => ContainerRole::Regular,
                (false, Some(_)) => {
                    return Err(invalid(
                        format!("{field}.restartPolicy"),
                        "may not be set for non-init containers",
                    ));
                }
                (true, None) => ContainerRole::Init,
                (true, Some("Always")) => ContainerRole::Sidecar,
                (true, Some(_)) => {
                    return Err(invalid(
                        format!("{field}.restartPolicy"),
                        "supported values: \"Always\"",
                    ));
                }
            };
            if container.role == ContainerRole::Init
                && (container.probes != Default::default() || container.hooks != Default::default())
            {
                return Err(invalid(
                    field.clone(),
                    "probes and lifecycle hooks may only be set for sidecar (restartPolicy: Always) init containers",
                ));
            }
            if init {
                init_containers.push(container);
            } else {
                containers.push(container);
            }
        }
    }
    let pod_resources = pod_level_resources(spec.resources.as_ref())?;
    let qos = match &pod_resources {
        Some(r) => qos_of_pod_level(r),
        None => qos_class(&[init_containers.as_slice(), containers.as_slice()].concat()),
    };
    let mut ephemeral_containers = Vec::new();
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let field = format!("spec.ephemeralContainers[{i}]");
        let mut container = convert_ephemeral(c, &field, host_network, &volumes, &pod_seccomp)?;
        finish_security(
            &mut container,
            c.security_context.as_ref(),
            &field,
            host_users,
            meta,
            &pod_apparmor,
        )?;
        let named_before = init_containers
            .iter()
            .chain(&containers)
            .chain(&ephemeral_containers);
        if named_before
            .into_iter()
            .any(|other: &Container| other.name == container.name)
        {
            return Err(invalid(
                format!("{field}.name"),
                format!("duplicate name {:?}", container.name),
            ));
        }
        if let Some(target) = &container.target
            && !init_containers
                .iter()
                .chain(&containers)
                .any(|o| &o.name == target)
        {
            return Err(invalid(
                format!("{field}.targetContainerName"),
                format!("container {target:?} not found in the pod"),
            ));
        }
        ephemeral_containers.push(container);
    }
    Ok(Pod {
        init_containers,
        ephemeral_containers,
        runtime_class,
        overhead,
        pod_resources,
        uid,
        namespace,
        name,
        source: source.to_owned(),
        restart_policy,
        termination_grace: Duration::from_secs(grace as u64),
        host_network,
        dns_policy,
        dns_config,
        host_aliases,
        subdomain,
        host_pid: spec.host_pid.unwrap_or(false),
        share_process_namespace,
        host_ipc: spec.host_ipc.unwrap_or(false),
        host_users,
        hostname,
        run_as_user,
        run_as_group,
        run_as_non_root,
        supplemental_groups,
        merge_image_groups,
        active_deadline,
        set_hostname_as_fqdn: spec.set_hostname_as_fqdn.unwrap_or(false),
        enable_service_links: spec.enable_service_links.unwrap_or(true),
        fs_group,
        sysctls,
        volumes,
        containers,
        image_pull_secrets,
        qos,
        manifest,
    })
}

fn convert_volumes(volumes: &[core::Volume]) -> Result<Vec<Volume>, PodError> {
    let mut out: Vec<Volume> = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        dns_label(&format!("{field}.name"), &v.name, 63)?;
        if out.iter().any(|o| o.name == v.name) {
            return Err(invalid(
                format!("{field}.name"),
                format!("duplicate name {:?}", v.name),
            ));
        }
        let kinds: Vec<String> = match serde_json::to_value(v) {
            Ok(Value::Object(map)) => map
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| k != "name")
                .collect(),
            _ => Vec::new(),
        };
        let [kind] = kinds.as_slice() else {
            return Err(invalid(&field, "exactly one volume type is required"));
        };
        let source = if !MOUNTED_VOLUMES.contains(&kind.as_str()) {
            VolumeSource::Unsupported { kind: kind.clone() }
        } else if let Some(empty) = &v.empty_dir {
            let memory = match empty.medium.as_deref() {
                None | Some("") => false,
                Some("Memory") => true,
                Some(other) => {
                    return Err(unsupported(format!("{field}.emptyDir.medium={other}")));
                }
            };
            let size_limit = empty
                .size_limit
                .as_ref()
                .map(|q| {
                    crate::quantity::parse_bytes(&q.0)
                        .map_err(|e| invalid(format!("{field}.emptyDir.sizeLimit"), e.to_string()))
                })
                .transpose()?;
            VolumeSource::EmptyDir { memory, size_limit }
        } else if let Some(host) = &v.host_path {
            if !host.path.starts_with('/') {
                return Err(invalid(
                    format!("{field}.hostPath.path"),
                    "must be absolute",
                ));
            }
            let kind = match host.type_.as_deref() {
                None | Some("") => HostPathKind::Unchecked,
                Some("Directory") => HostPathKind::Directory,
                Some("DirectoryOrCreate") => HostPathKind::DirectoryOrCreate,
                Some("File") => HostPathKind::File,
                Some("FileOrCreate") => HostPathKind::FileOrCreate,
                Some("Socket") => HostPathKind::Socket,
                Some("CharDevice") => HostPathKind::CharDevice,
                Some("BlockDevice") => HostPathKind::BlockDevice,
                Some(other) => {
                    return Err(unsupported(format!("{field}.hostPath.type={other}")));
                }
            };
            VolumeSource::HostPath {
                path: host.path.clone(),
                kind,
            }
        } else {
            VolumeSource::Projected(projection(v, &field)?)
        };
        out.push(Volume {
            name: v.name.clone(),
            source,
        });
    }
    Ok(out)
}

/// File modes are 0–0777, as the API server validates them.
fn mode(field: &str, mode: Option<i32>) -> Result<Option<u32>, PodError> {
    match mode {
        None => Ok(None),
        Some(m) if (0..=0o777).contains(&m) => Ok(Some(m as u32)),
        Some(_) => Err(invalid(field, "must be between 0 and 0777")),
    }
}

/// A relative path inside a volume: no `..` element, not absolute.
fn item_path(field: &str, path: &str) -> Result<String, PodError> {
    if path.is_empty() || path.starts_with('/') || path.split('/').any(|p| p == "..") {
        return Err(invalid(field, "must be a relative path without '..'"));
    }
    if path.starts_with("..") {
        return Err(invalid(field, "must not start with '..'"));
    }
    Ok(path.to_owned())
}

fn key_to_paths(
    field: &str,
    items: Option<&Vec<core::KeyToPath>>,
) -> Result<Vec<KeyToPath>, PodError> {
    items
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, item)| {
            Ok(KeyToPath {
                key: item.key.clone(),
                path: item_path(&format!("{field}.items[{i}].path"), &item.path)?,
                mode: mode(&format!("{field}.items[{i}].mode"), item.mode)?,
            })
        })
        .collect()
}

fn resource_ref(field: &str, r: &core::ResourceFieldSelector) -> Result<ResourceRef, PodError> {
    match r.resource.as_str() {
        "limits.cpu" | "requests.cpu" | "limits.memory" | "requests.memory" => {}
        other => return Err(unsupported(format!("{field}.resource={other}"))),
    }
    let divisor = r.divisor.as_ref().map_or("1".to_owned(), |d| d.0.clone());
    if quantity::parse_milli(&divisor).map_or(true, |d| d == 0) {
        return Err(invalid(
            format!("{field}.divisor"),
            format!("{divisor:?} is not a valid divisor"),
        ));
    }
    Ok(ResourceRef {
        container: r.container_name.clone().filter(|c| !c.is_empty()),
        resource: r.resource.clone(),
        divisor,
    })
}

fn downward_items(
    field: &str,
    items: Option<&Vec<core::DownwardAPIVolumeFile>>,
) -> Result<Vec<DownwardFile>, PodError> {
    let mut out = Vec::new();
    for (i, item) in items.into_iter().flatten().enumerate() {
        let ifield = format!("{field}.items[{i}]");
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), None) => {
                let path = f.field_path.as_str();
                let allowed = matches!(
                    path,
                    "metadata.name"
                        | "metadata.namespace"
                        | "metadata.uid"
                        | "metadata.labels"
                        | "metadata.annotations"
                ) || path.starts_with("metadata.labels['")
                    || path.starts_with("metadata.annotations['");
                if !allowed {
                    return Err(unsupported(format!("{ifield}.fieldRef.fieldPath={path}")));
                }
                DownwardValue::Field(path.to_owned())
            }
            (None, Some(r)) => {
                if r.container_name.as_deref().is_none_or(str::is_empty) {
                    return Err(invalid(
                        format!("{ifield}.resourceFieldRef.containerName"),
                        "required",
                    ));
                }
                DownwardValue::Resource(resource_ref(&format!("{ifield}.resourceFieldRef"), r)?)
            }
            _ => {
                return Err(invalid(
                    &ifield,
                    "exactly one of fieldRef or resourceFieldRef is required",
                ));
            }
        };
        out.push(DownwardFile {
            path: item_path(&format!("{ifield}.path"), &item.path)?,
            value,
            mode: mode(&format!("{ifield}.mode"), item.mode)?,
        });
    }
    Ok(out)
}

/// configMap, secret, downwardAPI and projected volumes, as one shape.
fn projection(v: &core::Volume, field: &str) -> Result<Projection, PodError> {
    let mut sources = Vec::new();
    let default_mode;
    if let Some(cm) = &v.config_map {
        default_mode = mode(&format!("{field}.configMap.defaultMode"), cm.default_mode)?;
        sources.push(ProjectionSource::ConfigMap {
            name: cm.name.clone(),
            items: key_to_paths(&format!("{field}.configMap"), cm.items.as_ref())?,
            optional: cm.optional.unwrap_or(false),
        });
    } else if let Some(secret) = &v.secret {
        default_mode = mode(&format!("{field}.secret.defaultMode"), secret.default_mode)?;
        let name = secret.secret_name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(invalid(format!("{field}.secret.secretName"), "required"));
        }
        sources.push(ProjectionSource::Secret {
            name,
            items: key_to_paths(&format!("{field}.secret"), secret.items.as_ref())?,
            optional: secret.optional.unwrap_or(false),
        });
    } else if let Some(downward) = &v.downward_api {
        default_mode = mode(
            &format!("{field}.downwardAPI.defaultMode"),
            downward.default_mode,
        )?;
        sources.push(ProjectionSource::DownwardApi {
            items: downward_items(&format!("{field}.downwardAPI"), downward.items.as_ref())?,
        });
    } else if let Some(projected) = &v.projected {
        default_mode = mode(
            &format!("{field}.projected.defaultMode"),
            projected.default_mode,
        )?;
        for (i, s) in projected.sources.iter().flatten().enumerate() {
            let sfield = format!("{field}.projected.sources[{i}]");
            if let Some(cm) = &s.config_map {
                sources.push(ProjectionSource::ConfigMap {
                    name: cm.name.clone(),
                    items: key_to_paths(&format!("{sfield}.configMap"), cm.items.as_ref())?,
                    optional: cm.optional.unwrap_or(false),
                });
            } else if let Some(secret) = &s.secret {
                sources.push(ProjectionSource::Secret {
                    name: secret.name.clone(),
                    items: key_to_paths(&format!("{sfield}.secret"), secret.items.as_ref())?,
                    optional: secret.optional.unwrap_or(false),
                });
            } else if let Some(downward) = &s.downward_api {
                sources.push(ProjectionSource::DownwardApi {
                    items: downward_items(
                        &format!("{sfield}.downwardAPI"),
                        downward.items.as_ref(),
                    )?,
                });
            } else if let Some(token) = &s.service_account_token {
                let expiration_seconds = token.expiration_seconds.unwrap_or(3600);
                // The API server's own bounds.
                if !(600..=1 << 32).contains(&expiration_seconds) {
                    return Err(invalid(
                        format!("{sfield}.serviceAccountToken.expirationSeconds"),
                        "must be at least 600 (10 minutes)",
                    ));
                }
                sources.push(ProjectionSource::ServiceAccountToken {
                    audience: token.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds,
                    path: item_path(&format!("{sfield}.serviceAccountToken.path"), &token.path)?,
                });
            } else {
                return Err(invalid(&sfield, "no source"));
            }
        }
    } else {
        return Err(invalid(field, "no volume source"));
    }
    Ok(Projection {
        sources,
        default_mode: default_mode.unwrap_or(0o644),
    })
}

fn resource(
    list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
    field: &str,
    name: &str,
) -> Result<Option<u128>, PodError> {
    let Some(list) = list else { return Ok(None) };
    for key in list.keys() {
        // Huge pages: admission refuses them (the node has none).
        if !matches!(key.as_str(), "cpu" | "memory" | "ephemeral-storage")
            && !is_extended_resource(key)
            && !key.starts_with("hugepages-")
        {
            return Err(unsupported(format!("{field}.{key}")));
        }
    }
    list.get(name)
        .map(|q| {
            quantity::parse_milli(&q.0)
                .map_err(|e| invalid(format!("{field}.{name}"), e.to_string()))
        })
        .transpose()
}

/// Upstream's extended resources: a domain-qualified name outside
/// `kubernetes.io/` (a device plugin's `example.com/dongle`).
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// A container's extended resources: whole numbers, never overcommitted
/// (a request equals the limit; a limit alone is also the request, as the
/// API server defaults it).
fn extended_resources(
    requests: Option<&BTreeMap<String, Quantity>>,
    limits: Option<&BTreeMap<String, Quantity>>,
    field: &str,
) -> Result<BTreeMap<String, u64>, PodError> {
    let whole = |list: &str, name: &str, q: &Quantity| -> Result<u64, PodError> {
        let field = format!("{field}.{list}.{name}");
        let milli = quantity::parse_milli(&q.0).map_err(|e| invalid(&field, e.to_string()))?;
        if milli % 1000 != 0 {
            return Err(invalid(field, "must be an integer"));
        }
        u64::try_from(milli / 1000).map_err(|_| invalid(field, "too large"))
    };
    let mut extended = BTreeMap::new();
    for (name, limit) in limits.into_iter().flatten() {
        if is_extended_resource(name) {
            extended.insert(name.clone(), whole("limits", name, limit)?);
        }
    }
    for (name, request) in requests.into_iter().flatten() {
        if !is_extended_resource(name) {
            continue;
        }
        let request = whole("requests", name, request)?;
        if extended.get(name) != Some(&request) {
            return Err(invalid(
                format!("{field}.requests.{name}"),
                "must be equal to the limit: extended resources cannot be overcommitted",
            ));
        }
    }
    Ok(extended)
}

/// The resources whose in-place resize restarts the container
/// (`resizePolicy` RestartContainer); NotRequired is the default.
fn restart_on_resize(c: &core::Container, field: &str) -> Result<Vec<String>, PodError> {
    let mut restart = Vec::new();
    for (i, policy) in c.resize_policy.iter().flatten().enumerate() {
        let at = format!("{field}.resizePolicy[{i}]");
        if !matches!(policy.resource_name.as_str(), "cpu" | "memory") {
            return Err(invalid(
                format!("{at}.resourceName"),
                "supported values: \"cpu\", \"memory\"",
            ));
        }
        match policy.restart_policy.as_str() {
            "NotRequired" => {}
            "RestartContainer" => restart.push(policy.resource_name.clone()),
            _ => {
                return Err(invalid(
                    format!("{at}.restartPolicy"),
                    "supported values: \"NotRequired\", \"RestartContainer\"",
                ));
            }
        }
    }
    Ok(restart)
}

/// What a container of any kind gets past its own conversion: the
/// procMount check, and its AppArmor profile (its own field, else the
/// annotation naming it, else the pod's).
fn finish_security(
    container: &mut Container,
    security: Option<&core::SecurityContext>,
    field: &str,
    host_users: bool,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    pod_apparmor: &Option<AppArmorProfile>,
) -> Result<(), PodError> {
    check_proc_mount(container, host_users, field)?;
    let own = apparmor::from_field(
        &format!("{field}.securityContext"),
        security.and_then(|s| s.app_armor_profile.as_ref()),
    )?;
    container.security.apparmor = match own {
        Some(own) => Some(own),
        None => apparmor::from_annotation(meta.annotations.as_ref(), &container.name)?
            .or_else(|| pod_apparmor.clone()),
    };
    Ok(())
}

fn check_proc_mount(container: &Container, host_users: bool, field: &str) -> Result<(), PodError> {
    if container.security.proc_unmasked && host_users {
        return Err(invalid(
            format!("{field}.securityContext.procMount"),
            "`hostUsers` must be false to use `Unmasked`",
        ));
    }
    Ok(())
}

/// An ephemeral container is a container without what upstream forbids
/// it (ports, probes, hooks, resources, restart or resize policy), and
/// with an optional target for its PID namespace.
fn convert_ephemeral(
    c: &core::EphemeralContainer,
    field: &str,
    host_network: bool,
    volumes: &[Volume],
    pod_seccomp: &Option<SeccompProfile>,
) -> Result<Container, PodError> {
    let forbidden = [
        ("ports", c.ports.as_ref().is_some_and(|p| !p.is_empty())),
        ("livenessProbe", c.liveness_probe.is_some()),
        ("readinessProbe", c.readiness_probe.is_some()),
        ("startupProbe", c.startup_probe.is_some()),
        ("lifecycle", c.lifecycle.is_some()),
        (
            "resources",
            c.resources.as_ref().is_some_and(|r| {
                r.limits.as_ref().is_some_and(|l| !l.is_empty())
                    || r.requests.as_ref().is_some_and(|l| !l.is_empty())
            }),
        ),
        ("resizePolicy", c.resize_policy.is_some()),
        ("restartPolicy", c.restart_policy.is_some()),
    ];
    if let Some((name, _)) = forbidden.iter().find(|(_, set)| *set) {
        return Err(invalid(
            format!("{field}.{name}"),
            "Forbidden: cannot be set for an Ephemeral Container",
        ));
    }
    // The same fields as a container's, but one: a round trip through the
    // wire form converts it.
    let mut wire = serde_json::to_value(c).map_err(|e| invalid(field.to_owned(), e.to_string()))?;
    if let Some(fields) = wire.as_object_mut() {
        fields.remove("targetContainerName");
    }
    let as_container: core::Container =
        serde_json::from_value(wire).map_err(|e| invalid(field.to_owned(), e.to_string()))?;
    let mut container = convert_container(
        &as_container,
        field,
        host_network,
        volumes,
        pod_seccomp.clone(),
    )?;
    container.role = ContainerRole::Ephemeral;
    container.target = c.target_container_name.clone().filter(|t| !t.is_empty());
    Ok(container)
}

fn convert_container(
    c: &core::Container,
    field: &str,
    host_network: bool,
    volumes: &[Volume],
    pod_seccomp: Option<SeccompProfile>,
) -> Result<Container, PodError> {
    dns_label(&format!("{field}.name"), &c.name, 63)?;
    let image = c
        .image
        .clone()
        .filter(|i| !i.trim().is_empty())
        .ok_or_else(|| invalid(format!("{field}.image"), "required"))?;
    let pull_policy = match c.image_pull_policy.as_deref() {
        Some("Always") => PullPolicy::Always,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        Some("Never") => PullPolicy::Never,
        None => default_pull_policy(&image),
        Some(other) => {
            return Err(invalid(
                format!("{field}.imagePullPolicy"),
                format!("unknown value {other:?}"),
            ));
        }
    };
    let input = Input {
        stdin: c.stdin == Some(true),
        stdin_once: c.stdin_once == Some(true),
        tty: c.tty == Some(true),
    };
    let termination_message_from_logs = match c.termination_message_policy.as_deref() {
        None | Some("File") => false,
        Some("FallbackToLogsOnError") => true,
        Some(other) => {
            return Err(invalid(
                format!("{field}.terminationMessagePolicy"),
                format!("unknown value {other:?}"),
            ));
        }
    };
    let termination_message_path = c
        .termination_message_path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/dev/termination-log".into());
    if !termination_message_path.starts_with('/')
        || termination_message_path.split('/').any(|p| p == "..")
    {
        return Err(invalid(
            format!("{field}.terminationMessagePath"),
            "must be an absolute path without '..'",
        ));
    }
    for (i, port) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.container_port) {
            return Err(invalid(
                format!("{field}.ports[{i}].containerPort"),
                "must be 1-65535",
            ));
        }
        match port.host_port {
            Some(host_port) if !(0..=65535).contains(&host_port) => {
                return Err(invalid(
                    format!("{field}.ports[{i}].hostPort"),
                    "must be 0-65535",
                ));
            }
            // As upstream: on the host network there is nothing to map.
            Some(host_port) if host_network && host_port != port.container_port => {
                return Err(invalid(
                    format!("{field}.ports[{i}].hostPort"),
                    "must match `containerPort` when `hostNetwork` is true",
                ));
            }
            _ => {}
        }
        if let Some(ip) = port.host_ip.as_deref().filter(|ip| !ip.is_empty())
            && ip.parse::<std::net::IpAddr>().is_err()
        {
            return Err(invalid(
                format!("{field}.ports[{i}].hostIP"),
                "must be a valid IP address",
            ));
        }
    }
    let mut env = Vec::new();
    for (i, e) in c.env.iter().flatten().enumerate() {
        let efield = format!("{field}.env[{i}]");
        if e.name.is_empty() || e.name.contains('=') {
            return Err(invalid(
                format!("{efield}.name"),
                format!("{:?} is not a valid name", e.name),
            ));
        }
        let value = match (&e.value, &e.value_from) {
            (_, None) => EnvValue::Literal(e.value.clone().unwrap_or_default()),
            (Some(v), Some(_)) if !v.is_empty() => {
                return Err(invalid(
                    format!("{efield}.valueFrom"),
                    "may not be set when value is not empty",
                ));
            }
            (_, Some(from)) => env_value_from(&format!("{efield}.valueFrom"), from)?,
        };
        env.push(EnvVar {
            name: e.name.clone(),
            value,
        });
    }
    let mut env_from = Vec::new();
    for (i, e) in c.env_from.iter().flatten().enumerate() {
        let efield = format!("{field}.envFrom[{i}]");
        let (secret, name, optional) = match (&e.config_map_ref, &e.secret_ref) {
            (Some(cm), None) => (false, cm.name.clone(), cm.optional),
            (None, Some(s)) => (true, s.name.clone(), s.optional),
            _ => {
                return Err(invalid(
                    efield,
                    "exactly one of configMapRef or secretRef is required",
                ));
            }
        };
        env_from.push(EnvFrom {
            secret,
            name,
            prefix: e.prefix.clone().unwrap_or_default(),
            optional: optional.unwrap_or(false),
        });
    }
    let security = c.security_context.as_ref();
    let sfield = format!("{field}.securityContext");
    let privileged = security.and_then(|s| s.privileged) == Some(true);
    if privileged && security.and_then(|s| s.allow_privilege_escalation) == Some(false) {
        return Err(invalid(
            sfield.clone(),
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
        ));
    }
    let proc_unmasked = match security.and_then(|s| s.proc_mount.as_deref()) {
        None | Some("Default") => false,
        Some("Unmasked") => true,
        Some(other) => {
            return Err(invalid(
                format!("{sfield}.procMount"),
                format!("unknown value {other:?}"),
            ));
        }
    };
    let capabilities = security.and_then(|s| s.capabilities.as_ref());
    let container_security = Security {
        privileged,
        capabilities_add: capability_names(
            &format!("{sfield}.capabilities.add"),
            capabilities.and_then(|c| c.add.as_ref()),
        )?,
        capabilities_drop: capability_names(
            &format!("{sfield}.capabilities.drop"),
            capabilities.and_then(|c| c.drop.as_ref()),
        )?,
        seccomp: seccomp_profile(&sfield, security.and_then(|s| s.seccomp_profile.as_ref()))?
            .or(pod_seccomp)
            .unwrap_or_default(),
        // Set by the caller, which knows the pod's annotations and profile.
        apparmor: None,
        proc_unmasked,
    };
    let resources = c.resources.as_ref();
    let rfield = format!("{field}.resources");
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let to_u64 =
        |v: Option<u128>, div: u128| v.map(|v| u64::try_from(v.div_ceil(div)).unwrap_or(u64::MAX));
    let extended = extended_resources(requests, limits, &rfield)?;
    let cpu_limit = to_u64(resource(limits, &format!("{rfield}.limits"), "cpu")?, 1);
    let memory_limit = to_u64(
        resource(limits, &format!("{rfield}.limits"), "memory")?,
        1000,
    );
    // As the API server defaults them: a limit without a request is also the request.
    let cpu_request =
        to_u64(resource(requests, &format!("{rfield}.requests"), "cpu")?, 1).or(cpu_limit);
    let memory_request = to_u64(
        resource(requests, &format!("{rfield}.requests"), "memory")?,
        1000,
    )
    .or(memory_limit);
    let ephemeral_limit = to_u64(
        resource(limits, &format!("{rfield}.limits"), "ephemeral-storage")?,
        1000,
    );
    let ephemeral_request = to_u64(
        resource(requests, &format!("{rfield}.requests"), "ephemeral-storage")?,
        1000,
    )
    .or(ephemeral_limit);
    if let (Some(r), Some(l)) = (ephemeral_request, ephemeral_limit)
        && r > l
    {
        return Err(invalid(
            format!("{rfield}.requests.ephemeral-storage"),
            "must not exceed the limit",
        ));
    }
    if let (Some(r), Some(l)) = (memory_request, memory_limit)
        && r > l
    {
        return Err(invalid(
            format!("{rfield}.requests.memory"),
            "must not exceed the limit",
        ));
    }
    if let (Some(r), Some(l)) = (cpu_request, cpu_limit)
        && r > l
    {
        return Err(invalid(
            format!("{rfield}.requests.cpu"),
            "must not exceed the limit",
        ));
    }
    let mut mounts = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mfield = format!("{field}.volumeMounts[{i}]");
        let Some(volume) = volumes.iter().find(|v| v.name == m.name) else {
            return Err(invalid(
                format!("{mfield}.name"),
                format!("no volume named {:?}", m.name),
            ));
        };
        if !m.mount_path.starts_with('/') || m.mount_path.split('/').any(|p| p == "..") {
            return Err(invalid(
                format!("{mfield}.mountPath"),
                "must be absolute and without '..'",
            ));
        }
        let sub_path = m.sub_path.clone().filter(|p| !p.is_empty());
        let sub_path_expr = m.sub_path_expr.clone().filter(|p| !p.is_empty());
        if sub_path.is_some() && sub_path_expr.is_some() {
            return Err(invalid(
                format!("{mfield}.subPathExpr"),
                "subPathExpr and subPath are mutually exclusive",
            ));
        }
        for (name, sub) in [("subPath", &sub_path), ("subPathExpr", &sub_path_expr)] {
            if let Some(sub) = sub
                && !super::is_local_path(sub)
            {
                return Err(invalid(
                    format!("{mfield}.{name}"),
                    "must be a relative path without '..'",
                ));
            }
        }
        let expanded_later = sub_path_expr.is_some();
        let sub_path = sub_path.or(sub_path_expr);
        let propagation = match m.mount_propagation.as_deref() {
            None | Some("None") => "rprivate",
            Some("HostToContainer") => "rslave",
            Some("Bidirectional") if privileged => "rshared",
            Some("Bidirectional") => {
                return Err(invalid(
                    format!("{mfield}.mountPropagation"),
                    "Bidirectional mount propagation is available only to privileged containers",
                ));
            }
            Some(other) => {
                return Err(invalid(
                    format!("{mfield}.mountPropagation"),
                    format!("unknown value {other:?}"),
                ));
            }
        };
        let recursive_read_only = match m.recursive_read_only.as_deref() {
            None | Some("Disabled") => super::RecursiveReadOnly::Disabled,
            Some(value @ ("IfPossible" | "Enabled")) => {
                // Upstream's validation.
                if m.read_only != Some(true) {
                    return Err(invalid(
                        format!("{mfield}.recursiveReadOnly"),
                        "may only be specified when readOnly is true",
                    ));
                }
                if propagation != "rprivate" {
                    return Err(invalid(
                        format!("{mfield}.recursiveReadOnly"),
                        "may only be specified when mountPropagation is None or not specified",
                    ));
                }
                if value == "Enabled" {
                    super::RecursiveReadOnly::Enabled
                } else {
                    super::RecursiveReadOnly::IfPossible
                }
            }
            Some(other) => {
                return Err(invalid(
                    format!("{mfield}.recursiveReadOnly"),
                    format!("unknown value {other:?}"),
                ));
            }
        };
        mounts.push(VolumeMount {
            recursive_read_only,
            volume: m.name.clone(),
            path: m.mount_path.clone(),
            // The files the agent writes are read-only to containers
            // whatever the pod says, as upstream's since CVE-2017-1002102.
            read_only: m.read_only.unwrap_or(false)
                || matches!(volume.source, VolumeSource::Projected(_)),
            sub_path,
            sub_path_expr: expanded_later,
            propagation,
        });
    }
    let probes = super::probe::convert_probes(field, c)?;
    let hooks = super::probe::convert_hooks(field, c)?;
    let stop_signal = c.lifecycle.as_ref().and_then(|l| l.stop_signal.clone());
    if let Some(signal) = &stop_signal
        && !super::signal::is_linux_stop_signal(signal)
    {
        return Err(invalid(
            format!("{field}.lifecycle.stopSignal"),
            format!(
                "Unsupported value: {signal:?}: not a Linux signal name (SIGTERM, SIGQUIT, SIGRTMIN+1, ...)"
            ),
        ));
    }
    Ok(Container {
        probes,
        hooks,
        stop_signal,
        termination_message_path,
        termination_message_from_logs,
        input,
        role: ContainerRole::Regular,
        target: None,
        restart_on_resize: restart_on_resize(c, field)?,
        name: c.name.clone(),
        image,
        pull_policy,
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        env,
        env_from,
        working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
        run_as_user: id_from(
            &format!("{field}.securityContext.runAsUser"),
            security.and_then(|s| s.run_as_user),
        )?,
        run_as_group: id_from(
            &format!("{field}.securityContext.runAsGroup"),
            security.and_then(|s| s.run_as_group),
        )?,
        run_as_non_root: security.and_then(|s| s.run_as_non_root).unwrap_or(false),
        read_only_root: security
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        no_new_privileges: security.and_then(|s| s.allow_privilege_escalation) == Some(false),
        security: container_security,
        resources: Resources {
            cpu_request_milli: cpu_request,
            cpu_limit_milli: cpu_limit,
            memory_request,
            memory_limit,
            extended,
            ephemeral_request,
            ephemeral_limit,
        },
        mounts,
    })
}

fn env_value_from(field: &str, from: &core::EnvVarSource) -> Result<EnvValue, PodError> {
    let key_ref = |r: &core::ConfigMapKeySelector| (r.name.clone(), r.key.clone(), r.optional);
    let value = match (
        &from.field_ref,
        &from.resource_field_ref,
        &from.config_map_key_ref,
        &from.secret_key_ref,
    ) {
        (Some(f), None, None, None) => {
            let path = f.field_path.as_str();
            let known = matches!(
                path,
                "metadata.name"
                    | "metadata.namespace"
                    | "metadata.uid"
                    | "spec.nodeName"
                    | "spec.serviceAccountName"
                    | "status.hostIP"
                    | "status.hostIPs"
                    | "status.podIP"
                    | "status.podIPs"
            ) || path.starts_with("metadata.labels['")
                || path.starts_with("metadata.annotations['");
            if !known {
                return Err(unsupported(format!("{field}.fieldRef.fieldPath={path}")));
            }
            EnvValue::Field(path.to_owned())
        }
        (None, Some(r), None, None) => {
            EnvValue::Resource(resource_ref(&format!("{field}.resourceFieldRef"), r)?)
        }
        (None, None, Some(r), None) => {
            let (name, key, optional) = key_ref(r);
            EnvValue::ConfigMapKey {
                name,
                key,
                optional: optional.unwrap_or(false),
            }
        }
        (None, None, None, Some(r)) => EnvValue::SecretKey {
            name: r.name.clone(),
            key: r.key.clone(),
            optional: r.optional.unwrap_or(false),
        },
        _ => {
            return Err(invalid(
                field,
                "exactly one of fieldRef, resourceFieldRef, configMapKeyRef or secretKeyRef is required",
            ));
        }
    };
    Ok(value)
}

/// Upstream's default: Always for `:latest` or no tag, else IfNotPresent.
pub fn default_pull_policy(image: &str) -> PullPolicy {
    if image.contains('@') {
        return PullPolicy::IfNotPresent;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => PullPolicy::Always,
        Some(_) => PullPolicy::IfNotPresent,
    }
}

/// The pod's QoS class by the upstream rules.
/// `spec.resources`: CPU and memory for the pod as a whole. Requests
/// default to limits, as the API server defaults them; only CPU and
/// memory are supported there, as upstream.
fn pod_level_resources(
    r: Option<&core::ResourceRequirements>,
) -> Result<Option<Resources>, PodError> {
    let Some(r) = r else { return Ok(None) };
    let field = "spec.resources";
    for (kind, list) in [("requests", &r.requests), ("limits", &r.limits)] {
        if let Some(key) = list
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .find(|k| !matches!(k.as_str(), "cpu" | "memory"))
        {
            return Err(unsupported(format!("{field}.{kind}.{key}")));
        }
    }
    let amount = |list: &Option<BTreeMap<String, Quantity>>, kind: &str, name: &str, div: u128| {
        resource(list.as_ref(), &format!("{field}.{kind}"), name)
            .map(|v| v.map(|v| u64::try_from(v.div_ceil(div)).unwrap_or(u64::MAX)))
    };
    let cpu_limit = amount(&r.limits, "limits", "cpu", 1)?;
    let memory_limit = amount(&r.limits, "limits", "memory", 1000)?;
    let resources = Resources {
        cpu_request_milli: amount(&r.requests, "requests", "cpu", 1)?.or(cpu_limit),
        cpu_limit_milli: cpu_limit,
        memory_request: amount(&r.requests, "requests", "memory", 1000)?.or(memory_limit),
        memory_limit,
        ..Default::default()
    };
    let over =
        |request: Option<u64>, limit: Option<u64>| request.zip(limit).is_some_and(|(r, l)| r > l);
    if over(resources.cpu_request_milli, cpu_limit) || over(resources.memory_request, memory_limit)
    {
        return Err(invalid(
            format!("{field}.requests"),
            "must be less than or equal to the limit",
        ));
    }
    let empty = resources == Resources::default();
    Ok((!empty).then_some(resources))
}

/// Upstream's QoS class when the pod sets pod-level resources: from them
/// alone.
fn qos_of_pod_level(r: &Resources) -> QosClass {
    let set = |v: Option<u64>| v.filter(|v| *v > 0);
    let (requests, limits) = (
        [set(r.cpu_request_milli), set(r.memory_request)],
        [set(r.cpu_limit_milli), set(r.memory_limit)],
    );
    if requests.iter().chain(&limits).all(Option::is_none) {
        QosClass::BestEffort
    } else if limits.iter().all(Option::is_some) && requests == limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

fn qos_class(containers: &[Container]) -> QosClass {
    let r = |c: &Container| c.resources.clone();
    let any_set = containers.iter().any(|c| {
        let r = r(c);
        r.cpu_request_milli.is_some()
            || r.memory_request.is_some()
            || r.cpu_limit_milli.is_some()
            || r.memory_limit.is_some()
    });
    if !any_set {
        return QosClass::BestEffort;
    }
    let guaranteed = containers.iter().all(|c| {
        let r = r(c);
        r.cpu_limit_milli.is_some()
            && r.memory_limit.is_some()
            && r.cpu_request_milli == r.cpu_limit_milli
            && r.memory_request == r.memory_limit
    });
    if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

#[cfg(test)]
mod tests {
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
        let p = with(json!({"name": "v", "mountPath": "/v", "readOnly": true, "recursiveReadOnly": "Enabled"}))
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
                &pod(
                    json!({"runtimeClassName": name, "containers": [{"name": "c", "image": "b"}]}),
                ),
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
        let p =
            with(json!([{"name": "d", "image": "b", "stdin": true, "targetContainerName": "c"}]))
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
            let err =
                with(json!({"hostUsers": false, host: true, "containers": plain})).unwrap_err();
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
        let err =
            with_volume(json!({"name": "x", "mountPath": "/x", "subPath": "../up"})).unwrap_err();
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
        assert!(
            c(json!({"ports": [{"containerPort": 80, "hostPort": 80, "hostIP": "::1"}]})).is_ok()
        );
        assert!(
            c(json!({"ports": [{"containerPort": 80, "hostPort": 80, "hostIP": "here"}]})).is_err()
        );
        assert!(c(json!({"resources": {"limits": {"memory": "lots"}}})).is_err());
        assert!(c(json!({"volumeMounts": [{"name": "x", "mountPath": "/x"}]})).is_err());
        assert!(validate(&pod(json!({"containers": [{"name": "c", "image": "b"}], "shareProcessNamespace": true, "hostPID": true})), "f", "u").is_err());
        assert!(validate(&pod(json!({"containers": [{"name": "c", "image": "b"}], "shareProcessNamespace": true})), "f", "u").unwrap().share_process_namespace);
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
                &pod(
                    json!({"containers": [{"name": "c", "image": "b:1", "resources": resources}]}),
                ),
                "f",
                "u",
            )
            .unwrap_err()
            .to_string()
        };
        assert!(
            refused(json!({"limits": {"example.com/dongle": "1500m"}}))
                .contains("must be an integer")
        );
        assert!(
            refused(
                json!({"limits": {"example.com/dongle": 2}, "requests": {"example.com/dongle": 1}})
            )
            .contains("cannot be overcommitted")
        );
        assert!(
            refused(json!({"requests": {"example.com/dongle": 1}}))
                .contains("cannot be overcommitted")
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
        let p = with_mount(json!({"name": "v", "mountPath": "/x", "subPathExpr": "logs/$(NAME)"}))
            .unwrap();
        let c = &p.containers[0];
        let env = |v: &str| vec![("NAME".to_owned(), v.to_owned())];
        let expanded = c.expand_sub_paths(&env("web-0")).unwrap();
        assert_eq!(expanded.mounts[0].sub_path.as_deref(), Some("logs/web-0"));
        assert!(c.expand_sub_paths(&env("../../etc")).is_err());
        assert!(
            with_mount(json!({"name": "v", "mountPath": "/x", "subPathExpr": "/abs"})).is_err()
        );
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
}
