//! Configuration: a KubeletConfiguration document (upstream field names) and,
//! in the same file, an optional NanoletConfiguration document for what only
//! nanolet has. Command-line flags override both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::quantity;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{0}")]
    Flag(String),
}

/// The subset of the upstream KubeletConfiguration nanolet understands. Any
/// other key is an error, so that a setting is never silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KubeletConfigurationDoc {
    #[allow(dead_code)]
    api_version: Option<String>,
    #[allow(dead_code)]
    kind: Option<String>,
    static_pod_path: Option<PathBuf>,
    pod_logs_dir: Option<PathBuf>,
    container_log_max_size: Option<String>,
    container_log_max_files: Option<u32>,
    cgroup_root: Option<String>,
    file_check_frequency: Option<String>,
    max_pods: Option<u32>,
    pod_pids_limit: Option<i64>,
    oom_score_adj: Option<i32>,
    register_node: Option<bool>,
    #[serde(default)]
    register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    #[serde(default)]
    kube_reserved: BTreeMap<String, String>,
    #[serde(default)]
    system_reserved: BTreeMap<String, String>,
    enforce_node_allocatable: Option<Vec<String>>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_soft: Option<BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    eviction_max_pod_grace_period: Option<i64>,
    eviction_pressure_transition_period: Option<String>,
    node_status_update_frequency: Option<String>,
    node_status_report_frequency: Option<String>,
    node_lease_duration_seconds: Option<i32>,
    port: Option<u16>,
    address: Option<std::net::IpAddr>,
    healthz_port: Option<u16>,
    healthz_bind_address: Option<std::net::IpAddr>,
    read_only_port: Option<u16>,
    enable_system_log_handler: Option<bool>,
    tls_cert_file: Option<PathBuf>,
    tls_private_key_file: Option<PathBuf>,
    authentication: Option<AuthenticationDoc>,
    authorization: Option<AuthorizationDoc>,
    #[serde(rename = "clusterDNS", default)]
    cluster_dns: Vec<std::net::IpAddr>,
    cluster_domain: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i32>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i32>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AuthenticationDoc {
    x509: Option<X509Doc>,
    webhook: Option<AuthnWebhookDoc>,
    anonymous: Option<AnonymousDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AuthnWebhookDoc {
    enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    cache_ttl: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AnonymousDoc {
    enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AuthorizationDoc {
    mode: Option<String>,
    webhook: Option<AuthzWebhookDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AuthzWebhookDoc {
    #[serde(rename = "cacheAuthorizedTTL")]
    cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    cache_unauthorized_ttl: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct X509Doc {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NanoletConfigurationDoc {
    #[allow(dead_code)]
    api_version: Option<String>,
    #[allow(dead_code)]
    kind: Option<String>,
    state_dir: Option<PathBuf>,
    runtime: Option<RuntimeDoc>,
    #[serde(default)]
    insecure_registries: Vec<String>,
    #[serde(default)]
    registry_mirrors: BTreeMap<String, Vec<String>>,
    ca_file: Option<PathBuf>,
    #[serde(default)]
    node_labels: BTreeMap<String, String>,
    cni_conf_dir: Option<PathBuf>,
    cni_bin_dirs: Option<Vec<PathBuf>>,
    docker_config: Option<PathBuf>,
    #[serde(default)]
    pinned_images: Vec<String>,
    image_limits: Option<ImageLimitsDoc>,
    layer_contents: Option<LayerContentsDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LayerContentsDoc {
    fifos: Option<String>,
    devices: Option<String>,
    setuid: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ImageLimitsDoc {
    layer_size: Option<String>,
    image_size: Option<String>,
    layer_entries: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RuntimeDoc {
    name: Option<String>,
    path: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    Runc,
    Crun,
}

impl RuntimeKind {
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Runc => "runc",
            RuntimeKind::Crun => "crun",
        }
    }
    fn parse(name: &str) -> Option<Self> {
        match name {
            "runc" => Some(RuntimeKind::Runc),
            "crun" => Some(RuntimeKind::Crun),
            _ => None,
        }
    }
}

/// The resolved configuration the agent runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub static_pod_path: Option<PathBuf>,
    pub pod_logs_dir: PathBuf,
    pub container_log_max_size: u64,
    pub container_log_max_files: u32,
    pub cgroup_root: String,
    /// Rescan period of the manifest directory, on top of inotify.
    pub file_check_frequency: Duration,
    pub max_pods: u32,
    /// pids.max of each pod's cgroup (podPidsLimit; unlimited if none).
    pub pod_pids_limit: Option<i64>,
    /// The agent's own oom_score_adj (oomScoreAdj), which its monitors
    /// inherit.
    pub oom_score_adj: i32,
    pub state_dir: PathBuf,
    pub runtime: RuntimeKind,
    pub runtime_path: PathBuf,
    /// Registries (host[:port]) that may be reached over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Registry host → mirrors tried before it, in order.
    pub registry_mirrors: BTreeMap<String, Vec<String>>,
    pub ca_file: PathBuf,
    /// The node's registry credentials (a Docker `config.json`); unset:
    /// the first of [`Config::docker_config_paths`] that exists.
    pub docker_config: Option<PathBuf>,
    /// Image GC: start at this disk usage of the image filesystem (percent;
    /// 100 disables GC by disk usage)...
    pub image_gc_high_threshold_percent: u8,
    /// ... and delete down to this one.
    pub image_gc_low_threshold_percent: u8,
    /// Images pulled more recently are never collected.
    pub image_minimum_gc_age: Duration,
    /// Images unused for longer are collected whatever the disk usage.
    pub image_maximum_gc_age: Option<Duration>,
    /// Images never collected (nanolet's own: there is no CRI to pin them).
    pub pinned_images: Vec<String>,
    /// Against decompression bombs: unpacked bytes of one layer and of the
    /// layers one pull unpacks, and entries of one layer.
    pub max_layer_size: u64,
    pub max_image_size: u64,
    pub max_layer_entries: u64,
    /// What a layer may contain (`layerContents`): FIFOs, device nodes
    /// (refused rather than skipped), setuid/setgid bits.
    pub layer_fifos: bool,
    pub layer_refuse_devices: bool,
    pub layer_setuid: bool,
    /// Cluster mode: the API server to join (standalone without it).
    pub kubeconfig: Option<PathBuf>,
    pub node_name: String,
    /// The InternalIP reported; detected from the default route if unset.
    pub node_ip: Option<std::net::IpAddr>,
    pub node_labels: BTreeMap<String, String>,
    pub register_node: bool,
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// Resource name → bytes or millicores held back from allocatable.
    pub kube_reserved: BTreeMap<String, i64>,
    pub system_reserved: BTreeMap<String, i64>,
    /// `enforceNodeAllocatable` has `pods` (the default): the `kubepods`
    /// cgroup is capped at capacity less the reservations.
    pub enforce_pods_allocatable: bool,
    /// Eviction thresholds and their timing.
    pub eviction: Eviction,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration: Duration,
    /// The kubelet API's address and port.
    pub address: std::net::IpAddr,
    pub port: u16,
    /// Plain-HTTP `/healthz` (0: none), on `healthz_bind_address`.
    pub healthz_port: u16,
    pub healthz_bind_address: std::net::IpAddr,
    /// Upstream's unauthenticated plain-HTTP port for `/healthz`, `/pods`,
    /// `/stats/summary` and `/metrics` (and its `resource`, `probes` and
    /// `cadvisor`), on `address` (0: none, the default, as upstream's
    /// configuration file has it).
    pub read_only_port: u16,
    /// The kubelet API's `/logs/`: the node's /var/log (upstream's
    /// enableSystemLogHandler, on by default).
    pub enable_system_log_handler: bool,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    /// Who may use the kubelet API, beyond client certificates.
    pub api_auth: ApiAuth,
    /// Nameservers of pods with dnsPolicy ClusterFirst (clusterDNS).
    pub cluster_dns: Vec<std::net::IpAddr>,
    pub cluster_domain: String,
    /// CNI network configurations (the first in lexical order is used).
    pub cni_conf_dir: PathBuf,
    /// Where CNI plugins are looked up, in order.
    pub cni_bin_dirs: Vec<PathBuf>,
}

pub const DEFAULT_STATE_DIR: &str = "/var/lib/nanolet";

/// What the eviction manager watches, as upstream's eviction signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    ImagefsAvailable,
    ImagefsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::ImagefsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A threshold's quantity: absolute, or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    Quantity(u64),
    Percent(f64),
}

impl ThresholdValue {
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    /// Soft thresholds act once met for this long; hard ones (None) at once.
    pub grace: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    pub thresholds: Vec<Threshold>,
    /// The longest grace a soft eviction gives a pod (0: the pod's own).
    pub max_pod_grace: Duration,
    /// How long a pressure condition stays on after its signal clears.
    pub transition_period: Duration,
    /// evictionMinimumReclaim: once crossed, a signal must come back this
    /// far above its threshold before it counts as clear.
    pub min_reclaim: Vec<(Signal, ThresholdValue)>,
}

impl Eviction {
    /// The minimum reclaim of `signal`'s thresholds, in its unit.
    pub fn min_reclaim(&self, signal: Signal, capacity: u64) -> u64 {
        self.min_reclaim
            .iter()
            .find(|(s, _)| *s == signal)
            .map_or(0, |(_, v)| v.of(capacity))
    }
}

impl Default for Eviction {
    /// Upstream's Linux defaults.
    fn default() -> Self {
        let hard = |signal, value| Threshold {
            signal,
            value,
            grace: None,
        };
        Eviction {
            thresholds: vec![
                hard(Signal::MemoryAvailable, ThresholdValue::Quantity(100 << 20)),
                hard(Signal::NodefsAvailable, ThresholdValue::Percent(10.0)),
                hard(Signal::NodefsInodesFree, ThresholdValue::Percent(5.0)),
                hard(Signal::ImagefsAvailable, ThresholdValue::Percent(15.0)),
            ],
            max_pod_grace: Duration::ZERO,
            transition_period: Duration::from_secs(300),
            min_reclaim: Vec::new(),
        }
    }
}

impl Eviction {
    /// The hard threshold on `signal`, in units of `capacity`.
    pub fn hard(&self, signal: Signal, capacity: u64) -> Option<u64> {
        self.thresholds
            .iter()
            .find(|t| t.signal == signal && t.grace.is_none())
            .map(|t| t.value.of(capacity))
    }
}

/// evictionHard / evictionSoft (with its grace periods) as upstream
/// validates them: known signals, quantities or percentages, and a grace
/// period for every soft threshold.
fn thresholds(
    map: &BTreeMap<String, String>,
    graces: Option<&BTreeMap<String, String>>,
) -> Result<Vec<Threshold>, String> {
    let field = if graces.is_some() {
        "evictionSoft"
    } else {
        "evictionHard"
    };
    map.iter()
        .map(|(name, text)| {
            let signal = Signal::parse(name)
                .ok_or_else(|| format!("{field}: unknown eviction signal {name:?}"))?;
            let value = threshold_value(field, name, text)?;
            let grace = match graces {
                None => None,
                Some(graces) => {
                    let grace = graces.get(name).ok_or_else(|| {
                        format!("evictionSoftGracePeriod: {name} has a soft threshold but no grace period")
                    })?;
                    Some(
                        quantity::parse_duration(grace)
                            .map_err(|e| format!("evictionSoftGracePeriod.{name}: {e}"))?,
                    )
                }
            };
            Ok(Threshold {
                signal,
                value,
                grace,
            })
        })
        .collect()
}

/// A quantity, or a percentage of the capacity.
fn threshold_value(field: &str, name: &str, text: &str) -> Result<ThresholdValue, String> {
    match text.trim().strip_suffix('%') {
        Some(percent) => percent
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|p| (0.0..=100.0).contains(p))
            .map(ThresholdValue::Percent)
            .ok_or_else(|| format!("{field}.{name}: {text:?} is not a percentage")),
        None => Ok(ThresholdValue::Quantity(
            quantity::parse_bytes(text).map_err(|e| format!("{field}.{name}: {e}"))?,
        )),
    }
}

/// evictionMinimumReclaim: known signals, quantities or percentages.
fn min_reclaim(map: &BTreeMap<String, String>) -> Result<Vec<(Signal, ThresholdValue)>, String> {
    let field = "evictionMinimumReclaim";
    map.iter()
        .map(|(name, text)| {
            let signal = Signal::parse(name)
                .ok_or_else(|| format!("{field}: unknown eviction signal {name:?}"))?;
            Ok((signal, threshold_value(field, name, text)?))
        })
        .collect()
}

/// `--eviction-hard`'s form: `memory.available<100Mi,nodefs.available<10%`.
fn threshold_flag(flag: &str, value: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    value
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|pair| {
            pair.split_once('<')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| {
                    ConfigError::Flag(format!("--{flag}: {pair:?} is not signal<quantity"))
                })
        })
        .collect()
}

/// The kubelet API's authentication and authorization, as upstream's
/// KubeletConfiguration has them (its file defaults, not its flags').
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiAuth {
    /// Requests with no credentials are `system:anonymous`.
    pub anonymous: bool,
    /// Bearer tokens are checked with TokenReview.
    pub token_webhook: bool,
    pub token_cache_ttl: Duration,
    pub mode: AuthorizationMode,
    pub allowed_cache_ttl: Duration,
    pub denied_cache_ttl: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    /// SubjectAccessReview against the API server.
    Webhook,
}

impl Default for ApiAuth {
    fn default() -> Self {
        ApiAuth {
            anonymous: false,
            token_webhook: true,
            token_cache_ttl: Duration::from_secs(120),
            mode: AuthorizationMode::Webhook,
            allowed_cache_ttl: Duration::from_secs(300),
            denied_cache_ttl: Duration::from_secs(30),
        }
    }
}

impl AuthorizationMode {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "AlwaysAllow" => Some(AuthorizationMode::AlwaysAllow),
            "Webhook" => Some(AuthorizationMode::Webhook),
            _ => None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            static_pod_path: None,
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            container_log_max_size: 10 << 20,
            container_log_max_files: 5,
            cgroup_root: "/".into(),
            file_check_frequency: Duration::from_secs(20),
            max_pods: 110,
            pod_pids_limit: None,
            oom_score_adj: -999,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            runtime: RuntimeKind::Runc,
            runtime_path: PathBuf::from("runc"),
            insecure_registries: Vec::new(),
            registry_mirrors: BTreeMap::new(),
            ca_file: PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
            docker_config: None,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: Duration::from_secs(120),
            image_maximum_gc_age: None,
            pinned_images: Vec::new(),
            max_layer_size: 8 << 30,
            max_image_size: 16 << 30,
            max_layer_entries: 1_000_000,
            layer_fifos: true,
            layer_refuse_devices: false,
            layer_setuid: true,
            kubeconfig: None,
            node_name: default_node_name(),
            node_ip: None,
            node_labels: BTreeMap::new(),
            register_node: true,
            register_with_taints: Vec::new(),
            kube_reserved: BTreeMap::new(),
            enforce_pods_allocatable: true,
            system_reserved: BTreeMap::new(),
            eviction: Eviction::default(),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration: Duration::from_secs(40),
            address: std::net::IpAddr::from([0, 0, 0, 0]),
            port: 10250,
            healthz_port: 10248,
            healthz_bind_address: std::net::IpAddr::from([127, 0, 0, 1]),
            read_only_port: 0,
            enable_system_log_handler: true,
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            api_auth: ApiAuth::default(),
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
            cni_conf_dir: PathBuf::from("/etc/cni/net.d"),
            // Upstream's default, then where Debian's package puts them.
            cni_bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
        }
    }
}

/// The node is named after the host, lowercased, as upstream does.
fn default_node_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
        .to_lowercase()
}

/// Parses reservations (`cpu: 100m`, `memory: 128Mi`) to millicores for
/// cpu and plain units for the rest.
fn reservations(
    map: &BTreeMap<String, String>,
    field: &str,
) -> Result<BTreeMap<String, i64>, String> {
    map.iter()
        .map(|(name, value)| {
            let parsed = if name == "cpu" {
                quantity::parse_milli(value).map(|m| m.min(u64::MAX as u128) as u64)
            } else {
                quantity::parse_bytes(value)
            };
            parsed
                .map_err(|e| format!("{field}.{name}: {e}"))
                .and_then(|v| i64::try_from(v).map_err(|_| format!("{field}.{name}: too large")))
                .map(|v| (name.clone(), v))
        })
        .collect()
}

/// `enforceNodeAllocatable`, as upstream validates it: whether `pods` is
/// in it. nanolet makes no system- or kube-reserved cgroups to enforce the
/// others on, and says so.
fn enforce_node_allocatable(list: &[String]) -> Result<bool, String> {
    let mut pods = false;
    for value in list {
        match value.as_str() {
            "pods" => pods = true,
            "none" if list.len() == 1 => {}
            "none" => {
                return Err(
                    "enforceNodeAllocatable: \"none\" cannot be combined with other values".into(),
                );
            }
            "system-reserved"
            | "kube-reserved"
            | "system-reserved-compressible"
            | "kube-reserved-compressible" => {
                return Err(format!(
                    "enforceNodeAllocatable: {value:?} is not supported: nanolet runs no systemReservedCgroup or kubeReservedCgroup"
                ));
            }
            other => {
                return Err(format!(
                    "enforceNodeAllocatable: unknown value {other:?}: supported values are \"pods\" and \"none\""
                ));
            }
        }
    }
    Ok(pods)
}

/// The image GC fields, checked as upstream's validation does.
fn image_gc_settings(doc: &KubeletConfigurationDoc, config: &mut Config) -> Result<(), String> {
    let percent = |field: &str, value: Option<i32>, default: u8| match value {
        None => Ok(default),
        Some(v @ 0..=100) => Ok(v as u8),
        Some(v) => Err(format!("{field}: {v} is not between 0 and 100")),
    };
    let high = percent(
        "imageGCHighThresholdPercent",
        doc.image_gc_high_threshold_percent,
        config.image_gc_high_threshold_percent,
    )?;
    let low = percent(
        "imageGCLowThresholdPercent",
        doc.image_gc_low_threshold_percent,
        config.image_gc_low_threshold_percent,
    )?;
    if low >= high {
        return Err(format!(
            "imageGCLowThresholdPercent ({low}) must be less than imageGCHighThresholdPercent ({high})"
        ));
    }
    config.image_gc_high_threshold_percent = high;
    config.image_gc_low_threshold_percent = low;
    if let Some(age) = &doc.image_minimum_gc_age {
        config.image_minimum_gc_age =
            quantity::parse_duration(age).map_err(|e| format!("imageMinimumGCAge: {e}"))?;
    }
    if let Some(age) = &doc.image_maximum_gc_age {
        let max = quantity::parse_duration(age).map_err(|e| format!("imageMaximumGCAge: {e}"))?;
        // Zero is upstream's "disabled".
        config.image_maximum_gc_age = (!max.is_zero()).then_some(max);
        if max > Duration::ZERO && max < config.image_minimum_gc_age {
            return Err(format!(
                "imageMaximumGCAge ({age}) must not be less than imageMinimumGCAge"
            ));
        }
    }
    Ok(())
}

/// `k=v,k2=v2` as `--node-labels` takes them.
fn parse_labels(value: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    value
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| {
                    ConfigError::Flag(format!("--node-labels: {pair:?} is not key=value"))
                })
        })
        .collect()
}

impl Config {
    /// Where the node's registry credentials are looked for, as upstream's
    /// kubelet does (its root dir, then the Docker client's places): the
    /// configured file alone, else these in order.
    pub fn docker_config_paths(&self) -> Vec<PathBuf> {
        if let Some(path) = &self.docker_config {
            return vec![path.clone()];
        }
        let mut paths = vec![self.state_dir.join("config.json")];
        if let Some(home) = std::env::var_os("HOME") {
            paths.push(PathBuf::from(home).join(".docker/config.json"));
        }
        paths.push(PathBuf::from("/.docker/config.json"));
        paths
    }

    /// Loads a config file: one or two YAML (or JSON) documents, told apart by
    /// `kind`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let mut kubelet = KubeletConfigurationDoc::default();
        let mut nanolet = NanoletConfigurationDoc::default();
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            let value =
                serde_yaml_ng::Value::deserialize(document).map_err(|e| invalid(e.to_string()))?;
            if value.is_null() {
                continue;
            }
            let kind = value
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or("KubeletConfiguration")
                .to_owned();
            match kind.as_str() {
                "KubeletConfiguration" => {
                    kubelet = serde_yaml_ng::from_value(value)
                        .map_err(|e| invalid(format!("KubeletConfiguration: {e}")))?
                }
                "NanoletConfiguration" => {
                    nanolet = serde_yaml_ng::from_value(value)
                        .map_err(|e| invalid(format!("NanoletConfiguration: {e}")))?
                }
                other => {
                    return Err(invalid(format!(
                        "unknown kind {other:?} (expected KubeletConfiguration or NanoletConfiguration)"
                    )));
                }
            }
        }
        let mut config = Config::default();
        image_gc_settings(&kubelet, &mut config).map_err(invalid)?;
        if let Some(p) = kubelet.static_pod_path {
            config.static_pod_path = Some(p);
        }
        if let Some(p) = kubelet.pod_logs_dir {
            config.pod_logs_dir = p;
        }
        if let Some(size) = kubelet.container_log_max_size {
            config.container_log_max_size = quantity::parse_bytes(&size)
                .map_err(|e| invalid(format!("containerLogMaxSize: {e}")))?;
        }
        if let Some(files) = kubelet.container_log_max_files {
            if files < 2 {
                return Err(invalid("containerLogMaxFiles: must be at least 2".into()));
            }
            config.container_log_max_files = files;
        }
        if let Some(root) = kubelet.cgroup_root {
            config.cgroup_root = root;
        }
        if let Some(freq) = kubelet.file_check_frequency {
            config.file_check_frequency = quantity::parse_duration(&freq)
                .map_err(|e| invalid(format!("fileCheckFrequency: {e}")))?;
        }
        config.pod_pids_limit = kubelet.pod_pids_limit.filter(|p| *p > 0);
        if let Some(adj) = kubelet.oom_score_adj {
            if !(-1000..=1000).contains(&adj) {
                return Err(invalid(format!(
                    "oomScoreAdj: {adj} is not within -1000..1000"
                )));
            }
            config.oom_score_adj = adj;
        }
        if let Some(max) = kubelet.max_pods {
            config.max_pods = max;
        }
        if let Some(register) = kubelet.register_node {
            config.register_node = register;
        }
        config.register_with_taints = kubelet.register_with_taints;
        config.kube_reserved =
            reservations(&kubelet.kube_reserved, "kubeReserved").map_err(invalid)?;
        config.system_reserved =
            reservations(&kubelet.system_reserved, "systemReserved").map_err(invalid)?;
        if let Some(list) = &kubelet.enforce_node_allocatable {
            config.enforce_pods_allocatable = enforce_node_allocatable(list).map_err(invalid)?;
        }
        if let Some(hard) = &kubelet.eviction_hard {
            config.eviction.thresholds = thresholds(hard, None).map_err(invalid)?;
        }
        if let Some(soft) = &kubelet.eviction_soft {
            let graces = kubelet
                .eviction_soft_grace_period
                .clone()
                .unwrap_or_default();
            config
                .eviction
                .thresholds
                .extend(thresholds(soft, Some(&graces)).map_err(invalid)?);
        }
        if let Some(map) = &kubelet.eviction_minimum_reclaim {
            config.eviction.min_reclaim = min_reclaim(map).map_err(invalid)?;
        }
        if let Some(seconds) = kubelet.eviction_max_pod_grace_period {
            config.eviction.max_pod_grace = Duration::from_secs(seconds.max(0) as u64);
        }
        if let Some(period) = &kubelet.eviction_pressure_transition_period {
            config.eviction.transition_period = quantity::parse_duration(period)
                .map_err(|e| invalid(format!("evictionPressureTransitionPeriod: {e}")))?;
        }
        for (field, value, target) in [
            (
                "nodeStatusUpdateFrequency",
                kubelet.node_status_update_frequency,
                &mut config.node_status_update_frequency,
            ),
            (
                "nodeStatusReportFrequency",
                kubelet.node_status_report_frequency,
                &mut config.node_status_report_frequency,
            ),
        ] {
            if let Some(v) = value {
                *target =
                    quantity::parse_duration(&v).map_err(|e| invalid(format!("{field}: {e}")))?;
            }
        }
        if let Some(seconds) = kubelet.node_lease_duration_seconds {
            if seconds <= 0 {
                return Err(invalid("nodeLeaseDurationSeconds: must be positive".into()));
            }
            config.node_lease_duration = Duration::from_secs(seconds as u64);
        }
        if let Some(port) = kubelet.port {
            config.port = port;
        }
        if let Some(address) = kubelet.address {
            config.address = address;
        }
        if let Some(port) = kubelet.healthz_port {
            config.healthz_port = port;
        }
        if let Some(address) = kubelet.healthz_bind_address {
            config.healthz_bind_address = address;
        }
        if let Some(port) = kubelet.read_only_port {
            config.read_only_port = port;
        }
        if let Some(enabled) = kubelet.enable_system_log_handler {
            config.enable_system_log_handler = enabled;
        }
        config.tls_cert_file = kubelet.tls_cert_file;
        config.tls_private_key_file = kubelet.tls_private_key_file;
        let authentication = kubelet.authentication.unwrap_or_default();
        config.client_ca_file = authentication.x509.and_then(|x| x.client_ca_file);
        let auth = &mut config.api_auth;
        if let Some(enabled) = authentication.anonymous.and_then(|a| a.enabled) {
            auth.anonymous = enabled;
        }
        if let Some(webhook) = authentication.webhook {
            auth.token_webhook = webhook.enabled.unwrap_or(auth.token_webhook);
            if let Some(ttl) = &webhook.cache_ttl {
                auth.token_cache_ttl = quantity::parse_duration(ttl)
                    .map_err(|e| invalid(format!("authentication.webhook.cacheTTL: {e}")))?;
            }
        }
        if let Some(authorization) = kubelet.authorization {
            if let Some(mode) = &authorization.mode {
                auth.mode = AuthorizationMode::parse(mode).ok_or_else(|| {
                    invalid(format!(
                        "authorization.mode: {mode:?} is not AlwaysAllow or Webhook"
                    ))
                })?;
            }
            let webhook = authorization.webhook.unwrap_or_default();
            for (field, text, ttl) in [
                (
                    "cacheAuthorizedTTL",
                    webhook.cache_authorized_ttl,
                    &mut auth.allowed_cache_ttl,
                ),
                (
                    "cacheUnauthorizedTTL",
                    webhook.cache_unauthorized_ttl,
                    &mut auth.denied_cache_ttl,
                ),
            ] {
                if let Some(text) = text {
                    *ttl = quantity::parse_duration(&text)
                        .map_err(|e| invalid(format!("authorization.webhook.{field}: {e}")))?;
                }
            }
        }
        config.node_labels = nanolet.node_labels;
        config.cluster_dns = kubelet.cluster_dns;
        if let Some(domain) = kubelet.cluster_domain {
            config.cluster_domain = domain.trim_end_matches('.').to_owned();
        }
        if let Some(dir) = nanolet.state_dir {
            config.state_dir = dir;
        }
        if let Some(runtime) = nanolet.runtime {
            if let Some(name) = runtime.name {
                config.runtime = RuntimeKind::parse(&name).ok_or_else(|| {
                    invalid(format!("runtime.name: {name:?} is not runc or crun"))
                })?;
                config.runtime_path = PathBuf::from(config.runtime.name());
            }
            if let Some(path) = runtime.path {
                config.runtime_path = path;
            }
        }
        config.insecure_registries = nanolet.insecure_registries;
        if let Some(dir) = nanolet.cni_conf_dir {
            config.cni_conf_dir = dir;
        }
        if let Some(dirs) = nanolet.cni_bin_dirs {
            config.cni_bin_dirs = dirs;
        }
        config.registry_mirrors = nanolet.registry_mirrors;
        if let Some(ca) = nanolet.ca_file {
            config.ca_file = ca;
        }
        if nanolet.docker_config.is_some() {
            config.docker_config = nanolet.docker_config;
        }
        config.pinned_images = nanolet.pinned_images;
        if let Some(limits) = nanolet.image_limits {
            for (field, value, target) in [
                ("layerSize", limits.layer_size, &mut config.max_layer_size),
                ("imageSize", limits.image_size, &mut config.max_image_size),
            ] {
                if let Some(v) = value {
                    *target = quantity::parse_bytes(&v)
                        .map_err(|e| invalid(format!("imageLimits.{field}: {e}")))?;
                }
            }
            if let Some(n) = limits.layer_entries {
                config.max_layer_entries = n;
            }
        }
        if let Some(contents) = nanolet.layer_contents {
            let choice = |field: &str,
                          value: Option<String>,
                          yes: &str,
                          no: &str,
                          default: bool| {
                match value.as_deref() {
                    None => Ok(default),
                    Some(v) if v == yes => Ok(true),
                    Some(v) if v == no => Ok(false),
                    Some(v) => Err(invalid(format!(
                        "layerContents.{field}: {v:?} is not {yes} or {no}"
                    ))),
                }
            };
            config.layer_fifos = choice("fifos", contents.fifos, "allow", "refuse", true)?;
            config.layer_refuse_devices =
                choice("devices", contents.devices, "refuse", "skip", false)?;
            config.layer_setuid = choice("setuid", contents.setuid, "keep", "strip", true)?;
        }
        Ok(config)
    }

    /// Applies command-line flags in their order, but `--runtime-path`
    /// after `--runtime` (which sets the path to the runtime's name): in
    /// either order the two mean the same. Returns the first flag that is
    /// not a config flag, if any.
    pub fn apply_flags(
        &mut self,
        flags: &[(String, String)],
    ) -> Result<Option<String>, ConfigError> {
        let mut ordered: Vec<&(String, String)> = flags.iter().collect();
        ordered.sort_by_key(|(flag, _)| flag == "runtime-path");
        for (flag, value) in ordered {
            if !self.apply_flag(flag, value)? {
                return Ok(Some(flag.clone()));
            }
        }
        Ok(None)
    }

    /// Applies one command-line flag that overrides a config setting.
    /// Returns false when the flag is not a config flag.
    pub fn apply_flag(&mut self, flag: &str, value: &str) -> Result<bool, ConfigError> {
        match flag {
            "state-dir" => self.state_dir = value.into(),
            "static-pod-path" | "pod-manifest-path" => self.static_pod_path = Some(value.into()),
            "pod-logs-dir" => self.pod_logs_dir = value.into(),
            "cgroup-root" => self.cgroup_root = value.into(),
            "runtime" => {
                self.runtime = RuntimeKind::parse(value).ok_or_else(|| {
                    ConfigError::Flag(format!("--runtime: {value:?} is not runc or crun"))
                })?;
                self.runtime_path = PathBuf::from(self.runtime.name());
            }
            "runtime-path" => self.runtime_path = value.into(),
            "kubeconfig" => self.kubeconfig = Some(value.into()),
            "hostname-override" => self.node_name = value.to_lowercase(),
            "node-ip" => {
                self.node_ip = Some(value.parse().map_err(|_| {
                    ConfigError::Flag(format!("--node-ip: {value:?} is not an IP address"))
                })?)
            }
            "node-labels" => self.node_labels.extend(parse_labels(value)?),
            "port" => {
                self.port = value
                    .parse()
                    .map_err(|_| ConfigError::Flag(format!("--port: {value:?} is not a port")))?
            }
            "address" => {
                self.address = value.parse().map_err(|_| {
                    ConfigError::Flag(format!("--address: {value:?} is not an IP address"))
                })?
            }
            "healthz-port" => {
                self.healthz_port = value.parse().map_err(|_| {
                    ConfigError::Flag(format!("--healthz-port: {value:?} is not a port"))
                })?
            }
            "read-only-port" => {
                self.read_only_port = value.parse().map_err(|_| {
                    ConfigError::Flag(format!("--read-only-port: {value:?} is not a port"))
                })?
            }
            "healthz-bind-address" => {
                self.healthz_bind_address = value.parse().map_err(|_| {
                    ConfigError::Flag(format!(
                        "--healthz-bind-address: {value:?} is not an IP address"
                    ))
                })?
            }
            "client-ca-file" => self.client_ca_file = Some(value.into()),
            "eviction-hard" => {
                let hard = threshold_flag(flag, value)?;
                let soft = self
                    .eviction
                    .thresholds
                    .iter()
                    .filter(|t| t.grace.is_some());
                self.eviction.thresholds = thresholds(&hard, None)
                    .map_err(|e| ConfigError::Flag(format!("--{flag}: {e}")))?
                    .into_iter()
                    .chain(soft.cloned())
                    .collect();
            }
            "eviction-pressure-transition-period" => {
                self.eviction.transition_period = flag_duration(flag, value)?
            }
            "anonymous-auth" => self.api_auth.anonymous = flag_bool(flag, value)?,
            "authentication-token-webhook" => self.api_auth.token_webhook = flag_bool(flag, value)?,
            "authentication-token-webhook-cache-ttl" => {
                self.api_auth.token_cache_ttl = flag_duration(flag, value)?
            }
            "authorization-mode" => {
                self.api_auth.mode = AuthorizationMode::parse(value).ok_or_else(|| {
                    ConfigError::Flag(format!(
                        "--authorization-mode: {value:?} is not AlwaysAllow or Webhook"
                    ))
                })?
            }
            "authorization-webhook-cache-authorized-ttl" => {
                self.api_auth.allowed_cache_ttl = flag_duration(flag, value)?
            }
            "authorization-webhook-cache-unauthorized-ttl" => {
                self.api_auth.denied_cache_ttl = flag_duration(flag, value)?
            }
            "cluster-dns" => {
                self.cluster_dns = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|_| {
                        ConfigError::Flag(format!("--cluster-dns: {value:?} is not a list of IPs"))
                    })?
            }
            "cluster-domain" => self.cluster_domain = value.trim_end_matches('.').to_owned(),
            "tls-cert-file" => self.tls_cert_file = Some(value.into()),
            "tls-private-key-file" => self.tls_private_key_file = Some(value.into()),
            "insecure-registry" => self.insecure_registries.push(value.into()),
            "docker-config" => self.docker_config = Some(value.into()),
            "cni-conf-dir" => self.cni_conf_dir = value.into(),
            "oom-score-adj" => {
                self.oom_score_adj = value
                    .parse()
                    .ok()
                    .filter(|adj| (-1000..=1000).contains(adj))
                    .ok_or_else(|| {
                        ConfigError::Flag(format!(
                            "--oom-score-adj: {value:?} is not an integer within -1000..1000"
                        ))
                    })?;
            }
            "pod-max-pids" => {
                let limit: i64 = value.parse().map_err(|_| {
                    ConfigError::Flag(format!("--pod-max-pids: {value:?} is not an integer"))
                })?;
                self.pod_pids_limit = (limit > 0).then_some(limit);
            }
            "cni-bin-dir" => {
                self.cni_bin_dirs = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            }
            "container-log-max-size" => {
                self.container_log_max_size = quantity::parse_bytes(value)
                    .map_err(|e| ConfigError::Flag(format!("--container-log-max-size: {e}")))?
            }
            "container-log-max-files" => {
                self.container_log_max_files =
                    value.parse().ok().filter(|n| *n >= 2).ok_or_else(|| {
                        ConfigError::Flag("--container-log-max-files: need an integer ≥ 2".into())
                    })?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

fn flag_bool(flag: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ConfigError::Flag(format!(
            "--{flag}: {value:?} is not true or false"
        ))),
    }
}

fn flag_duration(flag: &str, value: &str) -> Result<Duration, ConfigError> {
    quantity::parse_duration(value).map_err(|e| ConfigError::Flag(format!("--{flag}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_documents() {
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: /m\ncontainerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\nclusterDNS: [10.96.0.10]\nclusterDomain: edge.local.\nhealthzPort: 0\nreadOnlyPort: 10255\nenableSystemLogHandler: false\n---\nkind: NanoletConfiguration\nstateDir: /s\nruntime: {name: crun}\ninsecureRegistries: [\"127.0.0.1:5000\"]\n";
        let c = Config::parse(text, Path::new("c.yaml")).unwrap();
        assert_eq!(c.static_pod_path, Some(PathBuf::from("/m")));
        assert_eq!(c.container_log_max_size, 1 << 20);
        assert_eq!(c.container_log_max_files, 3);
        assert_eq!(c.state_dir, PathBuf::from("/s"));
        assert_eq!(c.runtime, RuntimeKind::Crun);
        assert_eq!(c.runtime_path, PathBuf::from("crun"));
        assert_eq!(c.insecure_registries, vec!["127.0.0.1:5000".to_string()]);
        assert_eq!(
            c.cluster_dns,
            vec!["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(c.cluster_domain, "edge.local");
        assert_eq!(c.healthz_port, 0);
        assert_eq!(c.read_only_port, 10255);
        assert_eq!(Config::default().read_only_port, 0);
        assert!(!c.enable_system_log_handler);
        assert!(Config::default().enable_system_log_handler);
        assert_eq!(Config::default().healthz_port, 10248);
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let err = Config::parse(
            "kind: KubeletConfiguration\nstaticPodPth: /m\n",
            Path::new("/etc/n.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/etc/n.yaml"), "{err}");
        assert!(err.contains("staticPodPth"), "{err}");
    }

    #[test]
    fn invalid_values() {
        assert!(Config::parse("containerLogMaxSize: ten\n", Path::new("c")).is_err());
        assert!(
            Config::parse(
                "kind: NanoletConfiguration\nruntime: {name: docker}\n",
                Path::new("c")
            )
            .is_err()
        );
        assert!(Config::parse("kind: Other\n", Path::new("c")).is_err());
        assert!(Config::parse("a: [\n", Path::new("c")).is_err());
        assert_eq!(Config::default().oom_score_adj, -999);
        let c = Config::parse("oomScoreAdj: -500\n", Path::new("c")).unwrap();
        assert_eq!(c.oom_score_adj, -500);
        let err = Config::parse("oomScoreAdj: -1001\n", Path::new("c")).unwrap_err();
        assert!(err.to_string().contains("oomScoreAdj"), "{err}");
    }

    #[test]
    fn eviction_thresholds_as_upstream_validates_them() {
        let defaults = Config::default().eviction;
        assert_eq!(defaults.hard(Signal::MemoryAvailable, 0), Some(100 << 20));
        assert_eq!(defaults.hard(Signal::ImagefsAvailable, 1000), Some(150));
        let c = Config::parse(
            "evictionHard: {memory.available: 1Gi, pid.available: 10%}\nevictionSoft: {memory.available: 2Gi}\nevictionSoftGracePeriod: {memory.available: 90s}\nevictionMaxPodGracePeriod: 20\nevictionPressureTransitionPeriod: 1m\nevictionMinimumReclaim: {memory.available: 0Mi, nodefs.available: 5%}\n",
            Path::new("c"),
        )
        .unwrap();
        let e = &c.eviction;
        assert_eq!(e.hard(Signal::MemoryAvailable, 0), Some(1 << 30));
        assert_eq!(e.hard(Signal::PidAvailable, 1000), Some(100));
        // Given, the map replaces the defaults.
        assert_eq!(e.hard(Signal::NodefsAvailable, 1000), None);
        let soft = e.thresholds.iter().find(|t| t.grace.is_some()).unwrap();
        assert_eq!(soft.value, ThresholdValue::Quantity(2 << 30));
        assert_eq!(soft.grace, Some(Duration::from_secs(90)));
        assert_eq!(e.max_pod_grace, Duration::from_secs(20));
        assert_eq!(e.transition_period, Duration::from_secs(60));
        assert_eq!(e.min_reclaim(Signal::NodefsAvailable, 1000), 50);
        assert_eq!(e.min_reclaim(Signal::MemoryAvailable, 1000), 0);
        assert_eq!(e.min_reclaim(Signal::PidAvailable, 1000), 0);
        for bad in [
            "evictionMinimumReclaim: {memory.free: 1Gi}\n",
            "evictionMinimumReclaim: {nodefs.available: 200%}\n",
            "evictionHard: {memory.free: 1Gi}\n",
            "evictionHard: {nodefs.available: 120%}\n",
            "evictionSoft: {memory.available: 1Gi}\n",
        ] {
            assert!(Config::parse(bad, Path::new("c")).is_err(), "{bad}");
        }
        let mut flags = Config::default();
        assert!(
            flags
                .apply_flag(
                    "eviction-hard",
                    "memory.available<500Mi,nodefs.available<5%"
                )
                .unwrap()
        );
        assert_eq!(flags.eviction.thresholds.len(), 2);
        assert_eq!(flags.eviction.hard(Signal::NodefsAvailable, 100), Some(5));
        assert!(
            flags
                .apply_flag("eviction-hard", "memory.available=1Gi")
                .is_err()
        );
    }

    #[test]
    fn kubelet_api_authentication_and_authorization_as_upstream_names_them() {
        assert_eq!(Config::default().api_auth, ApiAuth::default());
        let c = Config::parse(
            "authentication:\n  x509: {clientCAFile: /ca.crt}\n  webhook: {enabled: false, cacheTTL: 10s}\n  anonymous: {enabled: true}\nauthorization:\n  mode: AlwaysAllow\n  webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 5s}\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.client_ca_file, Some(PathBuf::from("/ca.crt")));
        assert_eq!(
            c.api_auth,
            ApiAuth {
                anonymous: true,
                token_webhook: false,
                token_cache_ttl: Duration::from_secs(10),
                mode: AuthorizationMode::AlwaysAllow,
                allowed_cache_ttl: Duration::from_secs(60),
                denied_cache_ttl: Duration::from_secs(5),
            }
        );
        assert!(Config::parse("authorization: {mode: RBAC}\n", Path::new("c")).is_err());
        let mut flags = Config::default();
        assert!(flags.apply_flag("anonymous-auth", "true").unwrap());
        assert!(
            flags
                .apply_flag("authorization-mode", "AlwaysAllow")
                .unwrap()
        );
        assert!(
            flags
                .apply_flag("authorization-webhook-cache-unauthorized-ttl", "1s")
                .unwrap()
        );
        assert!(flags.apply_flag("anonymous-auth", "yes").is_err());
        assert!(flags.api_auth.anonymous);
        assert_eq!(flags.api_auth.mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(flags.api_auth.denied_cache_ttl, Duration::from_secs(1));
    }

    #[test]
    fn runtime_and_its_path_mean_the_same_in_either_order() {
        let flags = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect()
        };
        for order in [
            flags(&[("runtime-path", "/opt/crun"), ("runtime", "crun")]),
            flags(&[("runtime", "crun"), ("runtime-path", "/opt/crun")]),
        ] {
            let mut c = Config::default();
            assert_eq!(c.apply_flags(&order).unwrap(), None);
            assert_eq!(
                (c.runtime, c.runtime_path),
                (RuntimeKind::Crun, PathBuf::from("/opt/crun"))
            );
        }
        let mut c = Config::default();
        let unknown = flags(&[("runtime", "crun"), ("no-such-flag", "1")]);
        assert_eq!(
            c.apply_flags(&unknown).unwrap().as_deref(),
            Some("no-such-flag")
        );
    }

    #[test]
    fn image_gc_fields_as_upstream_validates_them() {
        let c = Config::parse(
            "imageGCHighThresholdPercent: 70\nimageGCLowThresholdPercent: 40\nimageMinimumGCAge: 0s\nimageMaximumGCAge: 24h\n---\nkind: NanoletConfiguration\npinnedImages: [busybox]\nimageLimits: {layerSize: 1Gi, layerEntries: 10}\nlayerContents: {fifos: refuse, devices: refuse, setuid: strip}\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(
            (
                c.image_gc_high_threshold_percent,
                c.image_gc_low_threshold_percent
            ),
            (70, 40)
        );
        assert_eq!(c.image_minimum_gc_age, Duration::ZERO);
        assert_eq!(c.image_maximum_gc_age, Some(Duration::from_secs(86400)));
        assert_eq!(c.pinned_images, vec!["busybox".to_string()]);
        assert_eq!(
            (c.max_layer_size, c.max_image_size, c.max_layer_entries),
            (1 << 30, 16 << 30, 10)
        );
        assert_eq!(
            (c.layer_fifos, c.layer_refuse_devices, c.layer_setuid),
            (false, true, false)
        );
        assert!(
            Config::parse(
                "kind: NanoletConfiguration\nlayerContents: {devices: create}\n",
                Path::new("c")
            )
            .is_err()
        );
        let d = Config::default();
        assert_eq!(
            (
                d.image_gc_high_threshold_percent,
                d.image_gc_low_threshold_percent,
                d.image_minimum_gc_age,
                d.image_maximum_gc_age
            ),
            (85, 80, Duration::from_secs(120), None)
        );
        for bad in [
            "imageGCHighThresholdPercent: 101\n",
            "imageGCLowThresholdPercent: -1\n",
            "imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 50\n",
            "imageMaximumGCAge: 1m\n",
        ] {
            let err = Config::parse(bad, Path::new("c")).unwrap_err().to_string();
            assert!(err.contains("image"), "{bad}: {err}");
        }
    }
}
