//! What a securityContext may ask for: capabilities, seccomp, sysctls,
//! procMount and AppArmor.

use super::*;

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
pub(super) const SAFE_SYSCTLS: &[&str] = &[
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
pub(super) fn seccomp_profile(
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
pub(super) fn capability_names(
    field: &str,
    names: Option<&Vec<String>>,
) -> Result<Vec<String>, PodError> {
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

/// What a container of any kind gets past its own conversion: the
/// procMount check, and its AppArmor profile (its own field, else the
/// annotation naming it, else the pod's).
pub(super) fn finish_security(
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

pub(super) fn check_proc_mount(
    container: &Container,
    host_users: bool,
    field: &str,
) -> Result<(), PodError> {
    if container.security.proc_unmasked && host_users {
        return Err(invalid(
            format!("{field}.securityContext.procMount"),
            "`hostUsers` must be false to use `Unmasked`",
        ));
    }
    Ok(())
}
