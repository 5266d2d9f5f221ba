//! The configuration file's documents and the one pass that checks them
//! into a [`Config`]. Flags are written into the same documents first
//! (`flags.rs`), so that a rule is written once for both.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use super::eviction::{min_reclaim, thresholds};
use super::{AuthorizationMode, Config, RuntimeKind};
use crate::quantity;

/// Which of the file's two documents a field is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Kubelet,
    Nanolet,
}

/// The file's documents as they were written, before any check: flags
/// override fields of them, then [`Documents::resolve`] checks them all.
#[derive(Debug, Clone, Default)]
pub(super) struct Documents {
    kubelet: Mapping,
    nanolet: Mapping,
}

impl Documents {
    /// One or two YAML (or JSON) documents, told apart by `kind`.
    pub(super) fn read(text: &str) -> Result<Documents, String> {
        let mut documents = Documents::default();
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            let value = Value::deserialize(document).map_err(|e| e.to_string())?;
            let kind = match value.get("kind") {
                None => Kind::Kubelet,
                Some(kind) => match kind.as_str() {
                    Some("KubeletConfiguration") => Kind::Kubelet,
                    Some("NanoletConfiguration") => Kind::Nanolet,
                    named => {
                        let kind = named.map_or_else(|| format!("{kind:?}"), |k| format!("{k:?}"));
                        return Err(format!(
                            "unknown kind {kind} (expected KubeletConfiguration or NanoletConfiguration)"
                        ));
                    }
                },
            };
            let mapping = match value {
                Value::Null => continue,
                Value::Mapping(mapping) => mapping,
                other => {
                    return Err(format!(
                        "{}: a document is a mapping, not {other:?}",
                        kind.name()
                    ));
                }
            };
            *documents.of(kind) = mapping;
        }
        Ok(documents)
    }

    fn of(&mut self, kind: Kind) -> &mut Mapping {
        match kind {
            Kind::Kubelet => &mut self.kubelet,
            Kind::Nanolet => &mut self.nanolet,
        }
    }

    /// The field at `path`, made (with the mappings above it) if missing. A
    /// value that is not a mapping where one is needed is replaced: the
    /// flag overrides it. None only for an empty path.
    pub(super) fn field(&mut self, kind: Kind, path: &[&str]) -> Option<&mut Value> {
        let mut mapping = self.of(kind);
        let (last, parents) = path.split_last()?;
        for name in parents {
            let entry = mapping
                .entry(Value::from(*name))
                .or_insert_with(|| Value::Mapping(Mapping::new()));
            if !entry.is_mapping() {
                *entry = Value::Mapping(Mapping::new());
            }
            mapping = entry.as_mapping_mut()?;
        }
        Some(mapping.entry(Value::from(*last)).or_insert(Value::Null))
    }

    pub(super) fn remove(&mut self, kind: Kind, path: &[&str]) {
        let mut mapping = self.of(kind);
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        for name in parents {
            match mapping.get_mut(*name) {
                Some(Value::Mapping(inner)) => mapping = inner,
                _ => return,
            }
        }
        mapping.remove(*last);
    }

    /// The one pass that checks every field and makes the configuration.
    pub(super) fn resolve(&self) -> Result<Config, String> {
        resolve(
            typed(Kind::Kubelet, &self.kubelet)?,
            typed(Kind::Nanolet, &self.nanolet)?,
        )
    }
}

/// A document as its type, or an error naming the field that does not fit.
fn typed<T: serde::de::DeserializeOwned>(kind: Kind, mapping: &Mapping) -> Result<T, String> {
    serde_path_to_error::deserialize(Value::Mapping(mapping.clone())).map_err(|e| {
        let path = e.path().to_string();
        let error = e.into_inner();
        match path.as_str() {
            "." => format!("{}: {error}", kind.name()),
            _ => format!("{}: {path}: {error}", kind.name()),
        }
    })
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Kubelet => "KubeletConfiguration",
            Kind::Nanolet => "NanoletConfiguration",
        }
    }
}

fn resolve(
    kubelet: KubeletConfigurationDoc,
    nanolet: NanoletConfigurationDoc,
) -> Result<Config, String> {
    let mut config = Config::default();
    image_gc_settings(&kubelet, &mut config)?;
    if let Some(p) = kubelet.static_pod_path {
        config.static_pod_path = Some(p);
    }
    if let Some(p) = kubelet.pod_logs_dir {
        config.pod_logs_dir = p;
    }
    if let Some(size) = kubelet.container_log_max_size {
        config.container_log_max_size =
            quantity::parse_bytes(&size).map_err(|e| format!("containerLogMaxSize: {e}"))?;
    }
    if let Some(files) = kubelet.container_log_max_files {
        if files < 2 {
            return Err("containerLogMaxFiles: must be at least 2".into());
        }
        config.container_log_max_files = files;
    }
    if let Some(root) = kubelet.cgroup_root {
        config.cgroup_root = root;
    }
    if let Some(freq) = kubelet.file_check_frequency {
        config.file_check_frequency =
            quantity::parse_duration(&freq).map_err(|e| format!("fileCheckFrequency: {e}"))?;
    }
    config.pod_pids_limit = kubelet.pod_pids_limit.filter(|p| *p > 0);
    if let Some(adj) = kubelet.oom_score_adj {
        if !(-1000..=1000).contains(&adj) {
            return Err(format!("oomScoreAdj: {adj} is not within -1000..1000"));
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
    config.kube_reserved = reservations(&kubelet.kube_reserved, "kubeReserved")?;
    config.system_reserved = reservations(&kubelet.system_reserved, "systemReserved")?;
    if let Some(list) = &kubelet.enforce_node_allocatable {
        config.enforce_pods_allocatable = enforce_node_allocatable(list)?;
    }
    if let Some(hard) = &kubelet.eviction_hard {
        config.eviction.thresholds = thresholds(hard, None)?;
    }
    if let Some(soft) = &kubelet.eviction_soft {
        let graces = kubelet
            .eviction_soft_grace_period
            .clone()
            .unwrap_or_default();
        config
            .eviction
            .thresholds
            .extend(thresholds(soft, Some(&graces))?);
    }
    if let Some(map) = &kubelet.eviction_minimum_reclaim {
        config.eviction.min_reclaim = min_reclaim(map)?;
    }
    if let Some(seconds) = kubelet.eviction_max_pod_grace_period {
        config.eviction.max_pod_grace = Duration::from_secs(seconds.max(0) as u64);
    }
    if let Some(period) = &kubelet.eviction_pressure_transition_period {
        config.eviction.transition_period = quantity::parse_duration(period)
            .map_err(|e| format!("evictionPressureTransitionPeriod: {e}"))?;
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
            *target = quantity::parse_duration(&v).map_err(|e| format!("{field}: {e}"))?;
        }
    }
    if let Some(seconds) = kubelet.node_lease_duration_seconds {
        if seconds <= 0 {
            return Err("nodeLeaseDurationSeconds: must be positive".into());
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
                .map_err(|e| format!("authentication.webhook.cacheTTL: {e}"))?;
        }
    }
    if let Some(authorization) = kubelet.authorization {
        if let Some(mode) = &authorization.mode {
            auth.mode = AuthorizationMode::parse(mode).ok_or_else(|| {
                format!("authorization.mode: {mode:?} is not AlwaysAllow or Webhook")
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
                    .map_err(|e| format!("authorization.webhook.{field}: {e}"))?;
            }
        }
    }
    config.node_labels = nanolet.node_labels;
    config.cluster_dns = kubelet.cluster_dns;
    if let Some(domain) = kubelet.cluster_domain {
        config.cluster_domain = domain.trim_end_matches('.').to_owned();
    }
    config.kubeconfig = nanolet.kubeconfig;
    config.bootstrap_kubeconfig = nanolet.bootstrap_kubeconfig;
    if config.bootstrap_kubeconfig.is_some() && config.kubeconfig.is_none() {
        return Err(
            "bootstrapKubeconfig: needs kubeconfig, where the node's own is written".into(),
        );
    }
    config.cert_dir = nanolet.cert_dir;
    config.rotate_certificates = kubelet.rotate_certificates.unwrap_or(false);
    config.server_tls_bootstrap = kubelet.server_tls_bootstrap.unwrap_or(false);
    // Upstream's: a name given is lowercased, an empty one is none.
    if let Some(name) = nanolet.hostname_override.filter(|n| !n.is_empty()) {
        config.node_name = name.to_lowercase();
    }
    config.node_ip = nanolet.node_ip;
    if let Some(dir) = nanolet.state_dir {
        config.state_dir = dir;
    }
    if let Some(runtime) = nanolet.runtime {
        if let Some(name) = runtime.name {
            config.runtime = RuntimeKind::parse(&name)
                .ok_or_else(|| format!("runtime.name: {name:?} is not runc or crun"))?;
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
    if let Some(dir) = nanolet.device_plugins_dir {
        config.device_plugins_dir = dir;
    }
    if let Some(dirs) = nanolet.cdi_spec_dirs {
        config.cdi_spec_dirs = dirs;
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
                *target =
                    quantity::parse_bytes(&v).map_err(|e| format!("imageLimits.{field}: {e}"))?;
            }
        }
        if let Some(n) = limits.layer_entries {
            config.max_layer_entries = n;
        }
    }
    if let Some(contents) = nanolet.layer_contents {
        let choice =
            |field: &str, value: Option<String>, yes: &str, no: &str, default: bool| match value
                .as_deref()
            {
                None => Ok(default),
                Some(v) if v == yes => Ok(true),
                Some(v) if v == no => Ok(false),
                Some(v) => Err(format!("layerContents.{field}: {v:?} is not {yes} or {no}")),
            };
        config.layer_fifos = choice("fifos", contents.fifos, "allow", "refuse", true)?;
        config.layer_refuse_devices = choice("devices", contents.devices, "refuse", "skip", false)?;
        config.layer_setuid = choice("setuid", contents.setuid, "keep", "strip", true)?;
    }
    Ok(config)
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
    rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    server_tls_bootstrap: Option<bool>,
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
    /// Flag-only upstream (`--kubeconfig`, `--hostname-override`,
    /// `--node-ip`): here so that every flag has a field.
    kubeconfig: Option<PathBuf>,
    bootstrap_kubeconfig: Option<PathBuf>,
    cert_dir: Option<PathBuf>,
    hostname_override: Option<String>,
    #[serde(rename = "nodeIP")]
    node_ip: Option<std::net::IpAddr>,
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
    device_plugins_dir: Option<PathBuf>,
    #[serde(rename = "cdiSpecDirs")]
    cdi_spec_dirs: Option<Vec<PathBuf>>,
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
