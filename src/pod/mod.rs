//! The validated pod model: what nanolet will run, derived from a Kubernetes
//! Pod object. Validation refuses anything nanolet cannot run exactly as
//! written, naming the field, instead of running the pod differently.

pub(crate) mod apparmor;
pub(crate) mod backoff;
pub(crate) mod env;
pub(crate) mod manifest;
pub(crate) mod objects;
pub(crate) mod probe;
pub mod scheduling;
pub(crate) mod signal;
pub mod status;
mod validate;
pub(crate) mod volumes;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use serde::{Deserialize, Serialize};

pub use apparmor::AppArmorProfile;
pub use validate::{CAPABILITIES, PodError, default_pull_policy, is_extended_resource, validate};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsPolicy {
    ClusterFirst,
    ClusterFirstWithHostNet,
    Default,
    /// Only the pod's dnsConfig.
    None,
}

/// The pod's `dnsConfig`: merged into what its dnsPolicy gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    /// `name` or `name:value`, as resolv.conf's options line has them.
    pub options: Vec<(String, Option<String>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// A pod nanolet has admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Where the pod came from (a manifest file path).
    pub source: String,
    pub restart_policy: RestartPolicy,
    pub termination_grace: Duration,
    /// `activeDeadlineSeconds`: how long after its start the kubelet ends
    /// the pod (DeadlineExceeded).
    pub active_deadline: Option<Duration>,
    pub host_network: bool,
    pub dns_policy: DnsPolicy,
    pub dns_config: Option<DnsConfig>,
    /// `hostAliases`: IP → names, appended to the pod's /etc/hosts.
    pub host_aliases: Vec<(String, Vec<String>)>,
    /// With `subdomain`, the pod's FQDN in /etc/hosts.
    pub subdomain: Option<String>,
    /// `setHostnameAsFQDN`: with a subdomain, the FQDN is the host name.
    pub set_hostname_as_fqdn: bool,
    pub host_pid: bool,
    /// `shareProcessNamespace`: one PID namespace for all containers.
    pub share_process_namespace: bool,
    /// `enableServiceLinks` (default true): the variables of every Service
    /// of the namespace, besides the `kubernetes` one every pod gets.
    pub enable_service_links: bool,
    pub host_ipc: bool,
    /// `hostUsers`: false gives the pod a user namespace of its own.
    pub host_users: bool,
    pub hostname: String,
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: bool,
    pub supplemental_groups: Vec<u32>,
    /// `supplementalGroupsPolicy: Merge` (the default): the groups the
    /// image's /etc/group gives the process's user are added.
    pub merge_image_groups: bool,
    /// Group owner of the pod's writable volumes, and a group of every
    /// container (securityContext.fsGroup).
    pub fs_group: Option<u32>,
    /// Namespaced sysctls of the pod (the safe set upstream allows).
    pub sysctls: Vec<(String, String)>,
    pub volumes: Vec<Volume>,
    /// Run in order before `containers`; sidecars among them keep running.
    pub init_containers: Vec<Container>,
    pub containers: Vec<Container>,
    /// Added to a running pod (`kubectl debug`), never restarted or
    /// removed; after the others in [`Pod::container`]'s numbering.
    pub ephemeral_containers: Vec<Container>,
    /// `runtimeClassName`: resolved to a handler through the API server
    /// when the sandbox is made; the node's runtime must be that handler.
    pub runtime_class: Option<String>,
    /// `overhead` (CPU millicores, memory bytes): what the runtime class
    /// costs beside the containers.
    pub overhead: (u64, u64),
    /// `spec.resources`: the pod's CPU and memory as a whole, over its
    /// containers' (pod-level resources).
    pub pod_resources: Option<Resources>,
    /// Secrets (dockerconfigjson) with registry credentials for pulls.
    pub image_pull_secrets: Vec<String>,
    pub qos: QosClass,
    /// The object as admitted, for checkpoints and (later) the API server.
    pub manifest: core::Pod,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub pull_policy: PullPolicy,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub env_from: Vec<EnvFrom>,
    pub working_dir: Option<String>,
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: bool,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub security: Security,
    pub resources: Resources,
    pub mounts: Vec<VolumeMount>,
    pub probes: probe::Probes,
    pub hooks: probe::Hooks,
    /// `lifecycle.stopSignal` (`SIGQUIT`), over the image's STOPSIGNAL.
    pub stop_signal: Option<String>,
    pub role: ContainerRole,
    /// Where the container writes why it ended (terminationMessagePath).
    pub termination_message_path: String,
    /// terminationMessagePolicy FallbackToLogsOnError.
    pub termination_message_from_logs: bool,
    /// What the container's stdin is: nothing, a pipe that `attach` writes
    /// to, or (with `tty`) the container's own terminal.
    pub input: Input,
    /// An ephemeral container's `targetContainerName`: it joins that
    /// container's PID namespace.
    pub target: Option<String>,
    /// `resizePolicy`: the resources (`cpu`, `memory`) whose in-place
    /// resize restarts the container.
    pub restart_on_resize: Vec<String>,
}

/// A container's stdin and terminal (`stdin`, `stdinOnce`, `tty`); also
/// what the agent asks of the pod's monitor for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    pub stdin: bool,
    /// The first attach that ends closes the container's stdin, as
    /// upstream: only without a terminal.
    pub stdin_once: bool,
    pub tty: bool,
}

/// A container's privileges beyond its user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    /// All of the host's capabilities and devices, no masked paths, no
    /// seccomp.
    pub privileged: bool,
    /// Capability names as the API gives them (`NET_ADMIN`, or `ALL`).
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    pub seccomp: SeccompProfile,
    /// `None`: not set anywhere (the host's default).
    pub apparmor: Option<AppArmorProfile>,
    /// `procMount: Unmasked`: no masked or read-only paths in /proc (only
    /// with `hostUsers: false`).
    pub proc_unmasked: bool,
}

/// A container's seccompProfile (its own, else the pod's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SeccompProfile {
    /// Upstream's default (`seccompDefault: false`).
    #[default]
    Unconfined,
    RuntimeDefault,
    /// A profile file relative to `<stateDir>/seccomp`.
    Localhost(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerRole {
    Regular,
    /// An init container: runs to success before the next one starts.
    Init,
    /// An init container with `restartPolicy: Always`: started in order,
    /// kept running, stopped after the regular containers.
    Sidecar,
    /// Started once in a running pod, whatever its init containers do;
    /// never restarted, counted in no readiness, phase or resources.
    Ephemeral,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub value: EnvValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// A literal value; `$(VAR)` references are expanded at start.
    Literal(String),
    ConfigMapKey {
        name: String,
        key: String,
        optional: bool,
    },
    SecretKey {
        name: String,
        key: String,
        optional: bool,
    },
    /// A downward API field path (`metadata.name`, `status.hostIP`, ...).
    Field(String),
    Resource(ResourceRef),
}

/// `resourceFieldRef`: a container's request or limit, in units of
/// `divisor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    /// The container; `None` in env, where it is the container itself.
    pub container: Option<String>,
    /// `limits.cpu`, `requests.memory`, ...
    pub resource: String,
    pub divisor: String,
}

/// `envFrom`: every key of a ConfigMap or Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFrom {
    pub secret: bool,
    pub name: String,
    pub prefix: String,
    pub optional: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request_milli: Option<u64>,
    pub cpu_limit_milli: Option<u64>,
    pub memory_request: Option<u64>,
    pub memory_limit: Option<u64>,
    /// Extended resources (a device plugin's `example.com/dongle`): the
    /// request, which is also the limit.
    pub extended: BTreeMap<String, u64>,
    /// Local ephemeral storage (writable layer, logs, disk emptyDirs), bytes.
    pub ephemeral_request: Option<u64>,
    pub ephemeral_limit: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A directory under the pod's state dir, removed with the pod; with
    /// `memory`, a tmpfs of at most `size_limit` bytes.
    EmptyDir {
        memory: bool,
        size_limit: Option<u64>,
    },
    HostPath {
        path: String,
        kind: HostPathKind,
    },
    /// Files nanolet writes from ConfigMaps, Secrets, the downward API
    /// and service account tokens (the configMap, secret, downwardAPI and
    /// projected volume types), on tmpfs.
    Projected(Projection),
    /// A type nanolet cannot mount (`persistentVolumeClaim`, `nfs`...):
    /// the pod waits in ContainerCreating, as upstream's does for a volume
    /// no plugin mounts.
    Unsupported {
        kind: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    pub sources: Vec<ProjectionSource>,
    /// File mode where an item sets none (defaultMode, 0644 by default).
    pub default_mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectionSource {
    ConfigMap {
        name: String,
        /// Empty: every key, as a file named after it.
        items: Vec<KeyToPath>,
        optional: bool,
    },
    Secret {
        name: String,
        items: Vec<KeyToPath>,
        optional: bool,
    },
    DownwardApi {
        items: Vec<DownwardFile>,
    },
    ServiceAccountToken {
        audience: Option<String>,
        expiration_seconds: i64,
        path: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownwardFile {
    pub path: String,
    pub value: DownwardValue,
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownwardValue {
    Field(String),
    Resource(ResourceRef),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathKind {
    Unchecked,
    Directory,
    DirectoryOrCreate,
    File,
    FileOrCreate,
    Socket,
    CharDevice,
    BlockDevice,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub source: VolumeSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub volume: String,
    pub path: String,
    pub read_only: bool,
    /// A path inside the volume to mount instead of its root.
    pub sub_path: Option<String>,
    /// `sub_path` is a `subPathExpr`: `$(VAR)` expands with the container's
    /// variables when it starts.
    pub sub_path_expr: bool,
    /// rprivate (None), rslave (HostToContainer) or rshared (Bidirectional).
    pub propagation: &'static str,
    /// `recursiveReadOnly`: submounts of a read-only volume read-only too.
    pub recursive_read_only: RecursiveReadOnly,
}

/// A volume mount's `recursiveReadOnly` (GA in 1.33).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RecursiveReadOnly {
    #[default]
    Disabled,
    /// Where the runtime and kernel can.
    IfPossible,
    /// Or the container does not start.
    Enabled,
}

/// A path that stays below where it starts: relative, without `..`.
pub fn is_local_path(path: &str) -> bool {
    !path.starts_with('/') && !path.split('/').any(|p| p == "..")
}

impl Container {
    /// The container's mounts with each `subPathExpr` expanded with its
    /// variables, as upstream does when it starts the container.
    pub fn expand_sub_paths(&self, env: &[(String, String)]) -> Result<Container, String> {
        let mut container = self.clone();
        for m in container.mounts.iter_mut().filter(|m| m.sub_path_expr) {
            let Some(expr) = &m.sub_path else { continue };
            let expanded = env::expand(expr, env);
            if !is_local_path(&expanded) {
                return Err(format!(
                    "failed to prepare subPath for volumeMount {:?} of container {:?}: the expanded subPathExpr {expanded:?} must be a relative path without '..'",
                    m.volume, self.name
                ));
            }
            m.sub_path = Some(expanded).filter(|s| !s.is_empty());
            m.sub_path_expr = false;
        }
        Ok(container)
    }
}

impl Pod {
    /// The priority the API server resolved from its class (0 without).
    pub fn priority(&self) -> i32 {
        self.manifest
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .unwrap_or(0)
    }

    /// `namespace/name`, as users name pods.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The log directory of this pod under podLogsDir.
    pub fn log_dir_name(&self) -> String {
        format!("{}_{}_{}", self.namespace, self.name, self.uid)
    }

    /// Init containers, then regular ones: what the pod is made of (its
    /// resources, QoS, readiness), without ephemeral containers.
    pub fn all_containers(&self) -> impl Iterator<Item = &Container> {
        self.init_containers.iter().chain(&self.containers)
    }

    /// A pod-level amount as upstream computes it with init containers:
    /// the larger of the steady state (regular containers and sidecars) and
    /// the peak while an init container runs (it and the sidecars started
    /// before it).
    pub fn pod_total(&self, amount: impl Fn(&Container) -> u64) -> u64 {
        let mut sidecars = 0;
        let mut peak = 0;
        for c in &self.init_containers {
            if c.role == ContainerRole::Sidecar {
                sidecars = u64::saturating_add(sidecars, amount(c));
            } else {
                peak = peak.max(u64::saturating_add(sidecars, amount(c)));
            }
        }
        // Saturating: quantities come from the pod's spec, and a wrapped
        // sum would pass admission.
        let steady = self
            .containers
            .iter()
            .map(&amount)
            .fold(sidecars, u64::saturating_add);
        peak.max(steady)
    }

    /// A pod-level limit: [`Pod::pod_total`] when every container has one,
    /// else none.
    pub fn pod_limit(&self, limit: impl Fn(&Container) -> Option<u64>) -> Option<u64> {
        self.all_containers()
            .all(|c| limit(c).is_some())
            .then(|| self.pod_total(|c| limit(c).unwrap_or(0)))
    }

    /// Init, regular and ephemeral containers, numbered in that order.
    pub fn container(&self, i: usize) -> &Container {
        let regular_end = self.init_containers.len() + self.containers.len();
        if let Some(ephemeral) = i.checked_sub(regular_end) {
            return &self.ephemeral_containers[ephemeral];
        }
        match i.checked_sub(self.init_containers.len()) {
            Some(regular) => &self.containers[regular],
            None => &self.init_containers[i],
        }
    }

    /// Every container the pod runs, ephemeral ones last, in
    /// [`Pod::container`]'s numbering.
    pub fn every_container(&self) -> impl Iterator<Item = &Container> {
        self.all_containers().chain(&self.ephemeral_containers)
    }
}
