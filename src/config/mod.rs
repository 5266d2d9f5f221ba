//! Configuration: a KubeletConfiguration document (upstream field names) and,
//! in the same file, an optional NanoletConfiguration document for what only
//! nanolet has. Command-line flags override both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod document;
mod eviction;
mod flags;

pub use eviction::{Eviction, Signal, Threshold, ThresholdValue};
pub use flags::help as flags_help;

use document::Documents;

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
    #[error("unknown flag --{0}")]
    UnknownFlag(String),
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
    /// TLS bootstrap: the credentials (a bootstrap token) the node asks the
    /// cluster for its client certificate with when `kubeconfig` is missing
    /// or its certificate expired; `kubeconfig` is written then.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the node's certificates and keys live (`<stateDir>/pki`).
    pub cert_dir: Option<PathBuf>,
    /// A new client certificate at 70–90 % of the current one's life.
    pub rotate_certificates: bool,
    /// The kubelet API's serving certificate from the cluster.
    pub server_tls_bootstrap: bool,
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
    /// Device plugins' sockets and the agent's kubelet.sock (upstream's
    /// `<root-dir>/device-plugins`).
    pub device_plugins_dir: PathBuf,
    /// CDI spec directories, lowest priority first.
    pub cdi_spec_dirs: Vec<PathBuf>,
}

pub const DEFAULT_STATE_DIR: &str = "/var/lib/nanolet";

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
            bootstrap_kubeconfig: None,
            cert_dir: None,
            rotate_certificates: false,
            server_tls_bootstrap: false,
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
            device_plugins_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            cdi_spec_dirs: crate::device::cdi::DEFAULT_DIRS.map(PathBuf::from).to_vec(),
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

impl Config {
    /// The node's certificates and keys: `certDir`, else `<stateDir>/pki`
    /// (where the self-signed serving pair has always been).
    pub fn cert_dir(&self) -> PathBuf {
        self.cert_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("pki"))
    }

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

    /// The configuration of `run` and `check`: the file if any (one or two
    /// YAML or JSON documents, told apart by `kind`), the flags written
    /// over its fields, then one pass of checks over the result.
    pub fn load(file: Option<&Path>, flags: &[(String, String)]) -> Result<Config, ConfigError> {
        let file_documents = match file {
            None => Documents::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                read(&text, path)?
            }
        };
        let mut documents = file_documents.clone();
        flags::apply(&mut documents, flags)?;
        documents
            .resolve()
            .map_err(|message| blame(file, &file_documents, flags, message))
    }

    /// The file's configuration alone.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        read(text, path)?
            .resolve()
            .map_err(|message| invalid(path, message))
    }
}

fn invalid(path: &Path, message: String) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_owned(),
        message,
    }
}

fn read(text: &str, path: &Path) -> Result<Documents, ConfigError> {
    Documents::read(text).map_err(|message| invalid(path, message))
}

/// Whose the error is: the file's, if it fails without the flags; else the
/// first flag after which the checks fail (each applied over the file and
/// the flags before it). The checks run again only on this path.
fn blame(
    file: Option<&Path>,
    file_documents: &Documents,
    flags: &[(String, String)],
    message: String,
) -> ConfigError {
    if let (Some(path), Err(message)) = (file, file_documents.resolve()) {
        return invalid(path, message);
    }
    for given in 1..=flags.len() {
        let mut documents = file_documents.clone();
        let resolved = flags::apply(&mut documents, &flags[..given]).map(|()| documents.resolve());
        if let Ok(Err(message)) = resolved {
            let (flag, value) = &flags[given - 1];
            return ConfigError::Flag(format!("--{flag} {value:?}: {message}"));
        }
    }
    ConfigError::Flag(message)
}

#[cfg(test)]
mod tests;
