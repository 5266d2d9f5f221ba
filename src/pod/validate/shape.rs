//! The shape of a Pod document: which fields nanolet knows, checked
//! before the document is read into the API's types, so that a field it
//! does not implement is refused by name rather than ignored.

use super::*;

/// The shape of the fields nanolet understands.
pub(super) enum Shape {
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

pub(super) const METADATA: &[(&str, Shape)] = &[
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

/// SELinux options are refused by name (`type` is checked in the
/// conversion).
pub(super) const SECCOMP: &[(&str, Shape)] = &[("type", Leaf), ("localhostProfile", Leaf)];
pub(super) const APPARMOR: &[(&str, Shape)] = &[("type", Leaf), ("localhostProfile", Leaf)];

/// Windows' options, which a Linux node ignores, as upstream's kubelet.
pub(super) const WINDOWS: &[(&str, Shape)] = &[
    ("gmsaCredentialSpecName", Leaf),
    ("gmsaCredentialSpec", Leaf),
    ("runAsUserName", Leaf),
    ("hostProcess", Leaf),
];

/// SELinux labels: accepted and not applied, as containerd leaves them
/// with its default `enable_selinux = false` (and as every host without
/// SELinux, Debian's and Raspberry Pi OS's, must).
pub(super) const SELINUX: &[(&str, Shape)] = &[
    ("user", Leaf),
    ("role", Leaf),
    ("type", Leaf),
    ("level", Leaf),
];

pub(super) const POD_SECURITY: &[(&str, Shape)] = &[
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

pub(super) const CONTAINER_SECURITY: &[(&str, Shape)] = &[
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

pub(super) const CONTAINER: &[(&str, Shape)] = &[
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

pub(super) const HTTP_GET: &[(&str, Shape)] = &[
    ("path", Leaf),
    ("port", Leaf),
    ("host", Leaf),
    ("scheme", Leaf),
    ("httpHeaders", ListOf(&[("name", Leaf), ("value", Leaf)])),
];

/// tcpSocket hooks are deprecated upstream and refused here.
pub(super) const HANDLER: &[(&str, Shape)] = &[
    ("exec", Object(&[("command", Any)])),
    ("httpGet", Object(HTTP_GET)),
    ("sleep", Object(&[("seconds", Leaf)])),
];

pub(super) const PROBE: &[(&str, Shape)] = &[
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

pub(super) const FIELD_REF: &[(&str, Shape)] = &[("apiVersion", Leaf), ("fieldPath", Leaf)];
pub(super) const RESOURCE_REF: &[(&str, Shape)] = &[
    ("containerName", Leaf),
    ("resource", Leaf),
    ("divisor", Leaf),
];
pub(super) const KEY_REF: &[(&str, Shape)] = &[("name", Leaf), ("key", Leaf), ("optional", Leaf)];
pub(super) const OBJECT_REF: &[(&str, Shape)] = &[("name", Leaf), ("optional", Leaf)];
pub(super) const KEY_TO_PATH: &[(&str, Shape)] = &[("key", Leaf), ("path", Leaf), ("mode", Leaf)];
pub(super) const DOWNWARD_ITEM: &[(&str, Shape)] = &[
    ("path", Leaf),
    ("fieldRef", Object(FIELD_REF)),
    ("resourceFieldRef", Object(RESOURCE_REF)),
    ("mode", Leaf),
];
pub(super) const PROJECTION: &[(&str, Shape)] = &[
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
pub(super) const MOUNTED_VOLUMES: &[&str] = &[
    "emptyDir",
    "hostPath",
    "configMap",
    "secret",
    "downwardAPI",
    "projected",
];

pub(super) const VOLUME: &[(&str, Shape)] = &[
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

pub(super) const SPEC: &[(&str, Shape)] = &[
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

pub(super) const POD: &[(&str, Shape)] = &[
    ("apiVersion", Leaf),
    ("kind", Leaf),
    ("metadata", Object(METADATA)),
    ("spec", Object(SPEC)),
    ("status", Any),
];

pub(super) fn check_shape(value: &Value, path: &str, shape: &Shape) -> Result<(), PodError> {
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

pub(super) fn check_object(
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
