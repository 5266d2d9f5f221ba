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

mod container;
mod resources;
mod security;
mod shape;
mod volumes;

use container::*;
use resources::*;
use security::*;
use shape::*;
use volumes::*;

pub use container::default_pull_policy;
pub use resources::is_extended_resource;
pub use security::CAPABILITIES;

/// The longest grace period honoured (about 136 years): larger values mean
/// "never" in practice and must not overflow deadline arithmetic.
pub(super) const MAX_GRACE_SECONDS: i64 = u32::MAX as i64;

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

#[cfg(test)]
mod tests;
