//! seccomp profiles for containers: RuntimeDefault (nanolet's own, like the
//! container runtimes' defaults) and Localhost profiles, files under
//! `<stateDir>/seccomp/` in the Docker/containerd profile format, which
//! containerd turns into the OCI form per container; so is done here:
//! `archMap` picks this machine's architectures, `includes`/`excludes`
//! select rules by architecture, capability and kernel version, `name` is
//! `names` of one.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Comparable (specs' errors are), so the I/O error is kept as its text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SeccompError {
    #[error("cannot load seccomp profile {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("seccomp profile {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The libseccomp name of the architecture nanolet was built for (what
/// `archMap` entries are named by).
const NATIVE_ARCH: &str = if cfg!(target_arch = "aarch64") {
    "SCMP_ARCH_AARCH64"
} else if cfg!(target_arch = "arm") {
    "SCMP_ARCH_ARM"
} else {
    "SCMP_ARCH_X86_64"
};

/// Its Go name, which rules' `includes`/`excludes` `arches` use (Docker's
/// default profile says `"arches": ["amd64", "x32"]`).
const NATIVE_GOARCH: &str = if cfg!(target_arch = "aarch64") {
    "arm64"
} else if cfg!(target_arch = "arm") {
    "arm"
} else {
    "amd64"
};

/// seccomp RuntimeDefault: everything allowed but what container runtimes'
/// default profiles refuse (kernel modules, keyrings, clocks, reboot,
/// mounts and namespaces — also through clone —, tracing other processes,
/// BPF and perf, ...), which fail with EPERM.
pub fn runtime_default() -> Value {
    const REFUSED: &[&str] = &[
        "acct",
        "add_key",
        "bpf",
        "clock_adjtime",
        "clock_settime",
        "create_module",
        "delete_module",
        "finit_module",
        "fsconfig",
        "fsmount",
        "fsopen",
        "fspick",
        "get_kernel_syms",
        "get_mempolicy",
        "init_module",
        "ioperm",
        "iopl",
        "kcmp",
        "kexec_file_load",
        "kexec_load",
        "keyctl",
        "lookup_dcookie",
        "mbind",
        "mount",
        "mount_setattr",
        "move_mount",
        "move_pages",
        "name_to_handle_at",
        "nfsservctl",
        "open_by_handle_at",
        "open_tree",
        "perf_event_open",
        "pivot_root",
        "process_vm_readv",
        "process_vm_writev",
        "ptrace",
        "query_module",
        "quotactl",
        "quotactl_fd",
        "reboot",
        "request_key",
        "set_mempolicy",
        "setns",
        "settimeofday",
        "stime",
        "swapoff",
        "swapon",
        "sysfs",
        "_sysctl",
        "umount",
        "umount2",
        "unshare",
        "uselib",
        "userfaultfd",
        "ustat",
        "vm86",
        "vm86old",
    ];
    // New namespaces through clone are refused as unshare is: one rule per
    // flag (rules for one call are alternatives). clone3 hides its flags in
    // memory seccomp cannot read, so it reports ENOSYS and libc falls back
    // to clone, as the runtimes' profiles do.
    const CLONE_NEW: [u64; 7] = [
        0x0002_0000, // CLONE_NEWNS
        0x0200_0000, // CLONE_NEWCGROUP
        0x0400_0000, // CLONE_NEWUTS
        0x0800_0000, // CLONE_NEWIPC
        0x1000_0000, // CLONE_NEWUSER
        0x2000_0000, // CLONE_NEWPID
        0x4000_0000, // CLONE_NEWNET
    ];
    let mut syscalls = vec![
        json!({"names": REFUSED, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}),
        json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}),
    ];
    for flag in CLONE_NEW {
        syscalls.push(json!({
            "names": ["clone"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
            "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
        }));
    }
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32",
                          "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
        "syscalls": syscalls,
    })
}

/// Reads the Localhost profile `name` (relative to `root`, checked by
/// validation) for a container with `capabilities` (`CAP_*` names).
pub fn localhost(root: &Path, name: &str, capabilities: &[String]) -> Result<Value, SeccompError> {
    let path = root.join(name);
    let text = std::fs::read(&path).map_err(|e| SeccompError::Read {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let profile: Value = serde_json::from_slice(&text).map_err(|e| SeccompError::Invalid {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    to_oci(&profile, capabilities, &kernel)
        .map_err(|message| SeccompError::Invalid { path, message })
}

fn to_oci(profile: &Value, capabilities: &[String], kernel: &str) -> Result<Value, String> {
    let Some(default_action) = profile.get("defaultAction").and_then(Value::as_str) else {
        return Err("defaultAction is required".into());
    };
    let mut oci = json!({"defaultAction": default_action});
    for key in [
        "defaultErrnoRet",
        "flags",
        "listenerPath",
        "listenerMetadata",
    ] {
        if let Some(value) = profile.get(key) {
            oci[key] = value.clone();
        }
    }
    let architectures = profile.get("architectures").and_then(Value::as_array);
    let arch_map = profile.get("archMap").and_then(Value::as_array);
    match (architectures, arch_map) {
        (Some(a), Some(m)) if !a.is_empty() && !m.is_empty() => {
            return Err("'architectures' and 'archMap' were specified together".into());
        }
        (Some(a), _) if !a.is_empty() => oci["architectures"] = Value::Array(a.clone()),
        (_, Some(map)) => {
            if let Some(native) = map.iter().find(|m| m["architecture"] == NATIVE_ARCH) {
                let mut arches = vec![Value::from(NATIVE_ARCH)];
                arches.extend(
                    native["subArchitectures"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                oci["architectures"] = Value::Array(arches);
            }
        }
        _ => {}
    }
    let mut syscalls = Vec::new();
    for rule in profile
        .get("syscalls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = rule
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let names = rule
            .get("names")
            .and_then(Value::as_array)
            .filter(|n| !n.is_empty());
        let names = match (name, names) {
            (Some(_), Some(_)) => {
                return Err("a syscall rule has both 'name' and 'names'".into());
            }
            (Some(name), None) => vec![Value::from(name)],
            (None, Some(names)) => names.clone(),
            (None, None) => continue,
        };
        if !applies(rule, capabilities, kernel) {
            continue;
        }
        let Some(action) = rule.get("action").and_then(Value::as_str) else {
            return Err(format!("the rule for {names:?} has no action"));
        };
        let mut converted = json!({"names": names, "action": action});
        for key in ["errnoRet", "args"] {
            if let Some(value) = rule.get(key).filter(|v| !v.is_null()) {
                converted[key] = value.clone();
            }
        }
        syscalls.push(converted);
    }
    if !syscalls.is_empty() {
        oci["syscalls"] = Value::Array(syscalls);
    }
    Ok(oci)
}

/// Whether a rule's `includes` all hold and none of its `excludes` do.
fn applies(rule: &Value, capabilities: &[String], kernel: &str) -> bool {
    let listed = |filter: &Value, key: &str| -> Vec<String> {
        filter[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let has_cap = |cap: &String| capabilities.contains(cap);
    let includes = &rule["includes"];
    let arches = listed(includes, "arches");
    if !arches.is_empty() && !arches.iter().any(|a| a == NATIVE_GOARCH) {
        return false;
    }
    if !listed(includes, "caps").iter().all(has_cap) {
        return false;
    }
    if let Some(min) = includes["minKernel"].as_str()
        && !kernel_at_least(kernel, min)
    {
        return false;
    }
    let excludes = &rule["excludes"];
    if listed(excludes, "arches")
        .iter()
        .any(|a| a == NATIVE_GOARCH)
        || listed(excludes, "caps").iter().any(has_cap)
    {
        return false;
    }
    if let Some(min) = excludes["minKernel"].as_str()
        && kernel_at_least(kernel, min)
    {
        return false;
    }
    true
}

/// `release` (uname's "6.1.0-18-amd64") against "major.minor"; an
/// unreadable version counts as new enough.
fn kernel_at_least(release: &str, min: &str) -> bool {
    let version = |s: &str| -> Option<(u32, u32)> {
        let mut parts = s.split(|c: char| !c.is_ascii_digit());
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    match (version(release), version(min)) {
        (Some(have), Some(want)) => have >= want,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_format_profiles_become_oci_for_this_container() {
        let profile = json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "defaultErrnoRet": 1,
            "archMap": [
                {"architecture": NATIVE_ARCH, "subArchitectures": ["SCMP_ARCH_X86"]},
                {"architecture": "SCMP_ARCH_MIPS64", "subArchitectures": []}
            ],
            "syscalls": [
                {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                {"name": "mkdir", "action": "SCMP_ACT_ERRNO", "errnoRet": 13},
                {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
                {"names": ["ptrace"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "4.8"}},
                {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "99.0"}},
                {"names": ["chown"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_CHOWN"]}},
                {"names": ["vm86"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["mips64"]}},
                {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": [NATIVE_GOARCH, "x32"]}},
                {"names": ["modify_ldt"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": [NATIVE_GOARCH]}}
            ]
        });
        let oci = to_oci(&profile, &["CAP_CHOWN".into()], "6.1.0-18-amd64").unwrap();
        assert_eq!(oci["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(oci["defaultErrnoRet"], 1);
        assert_eq!(oci["architectures"], json!([NATIVE_ARCH, "SCMP_ARCH_X86"]));
        let names: Vec<&Value> = oci["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["names"])
            .collect();
        assert_eq!(
            names,
            [
                &json!(["read", "write"]),
                &json!(["mkdir"]),
                &json!(["ptrace"]),
                &json!(["arch_prctl"])
            ]
        );
        assert_eq!(oci["syscalls"][1]["errnoRet"], 13);
        // With CAP_SYS_ADMIN and without CAP_CHOWN, the other two rules hold.
        let admin = to_oci(&profile, &["CAP_SYS_ADMIN".into()], "6.1").unwrap();
        assert_eq!(admin["syscalls"].as_array().unwrap().len(), 6);

        let both = json!({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
            "archMap": [{"architecture": "SCMP_ARCH_X86_64"}]});
        assert!(to_oci(&both, &[], "6.1").is_err());
        assert!(to_oci(&json!({"syscalls": []}), &[], "6.1").is_err());
        let named_twice = json!({"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"name": "a", "names": ["b"], "action": "SCMP_ACT_ERRNO"}]});
        assert!(to_oci(&named_twice, &[], "6.1").is_err());
    }

    #[test]
    fn a_missing_profile_names_its_path() {
        let err = localhost(Path::new("/nonexistent/seccomp"), "p.json", &[]).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/seccomp/p.json"),
            "{err}"
        );
    }
}
