//! `nanolet check`: what this node offers the agent, as the agent would
//! find it at start — the OCI runtime, the cgroup layout, overlayfs and the
//! pod network — one line each, so a fleet operator can tell a node that
//! cannot run pods before it is asked to.

use std::io::Write;

use crate::cgroup::{self, Version};
use crate::config::{Config, RuntimeKind};
use crate::runtime::cni::Cni;

/// Prints the findings; returns whether pods can run here.
pub fn run(config: &Config, out: &mut dyn Write) -> std::io::Result<bool> {
    let mut ok = true;
    // A warning is printed but fails nothing: pods run.
    let mut warnings = Vec::new();
    let mut line = |good: bool, what: &str, text: String| -> std::io::Result<()> {
        ok &= good;
        writeln!(
            out,
            "{:<5} {what:<12} {text}",
            if good { "ok" } else { "FAIL" }
        )
    };
    let runtime = &config.runtime_path;
    match crate::runtime::runc::runtime_problem(runtime) {
        None => {
            let version = std::process::Command::new(runtime)
                .arg("--version")
                .output()
                .ok()
                .and_then(|o| String::from_utf8(o.stdout).ok())
                .and_then(|v| v.lines().next().map(str::to_owned))
                .unwrap_or_default();
            line(
                true,
                "runtime",
                format!("{} ({version})", runtime.display()),
            )?;
            // Pods run, but the node should not stay so: not a failure.
            let number = version
                .split_whitespace()
                .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
                .unwrap_or_default();
            warnings.extend(crate::runtime::advisories::known_escapes(
                config.runtime,
                number,
            ));
        }
        Some(problem) => line(false, "runtime", problem)?,
    }

    let version = cgroup::detect();
    let (good, text) = match version {
        Version::V2 => {
            let controllers =
                std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
            let missing: Vec<&str> = ["cpu", "memory", "pids"]
                .into_iter()
                .filter(|c| !controllers.split_whitespace().any(|have| have == *c))
                .collect();
            let note = if missing.is_empty() {
                String::new()
            } else {
                format!("; without {}: pods run unlimited there", missing.join(", "))
            };
            (
                true,
                format!("v2 (controllers: {}){note}", controllers.trim()),
            )
        }
        // crun refuses hybrid hosts; runc uses their v1 controllers.
        Version::Hybrid => (
            config.runtime == RuntimeKind::Runc,
            format!(
                "hybrid (v1 controllers, cgroup2 beside them){}",
                if config.runtime == RuntimeKind::Crun {
                    ": crun refuses this layout, use runc or boot with cgroup v2 only"
                } else {
                    ""
                }
            ),
        ),
        Version::V1 => (config.runtime == RuntimeKind::Runc, "v1".to_owned()),
    };
    line(good, "cgroups", text)?;

    let overlay = std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| {
        f.lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"))
    });
    line(
        overlay,
        "overlayfs",
        if overlay {
            "available".to_owned()
        } else {
            "not in /proc/filesystems (modprobe overlay)".to_owned()
        },
    )?;

    // Not loaded here (check changes nothing); the agent loads it at start.
    let apparmor = if crate::runtime::apparmor::kernel_enabled() {
        format!(
            "enabled; the agent loads {} with {} at start",
            crate::runtime::apparmor::RUNTIME_DEFAULT,
            crate::runtime::apparmor::parser()
        )
    } else {
        "not enabled: pods asking for a profile are refused".to_owned()
    };
    line(true, "apparmor", apparmor)?;

    // Only pods asking for one need it.
    let user_namespaces = std::env::current_exe()
        .map_err(|e| format!("own executable: {e}"))
        .and_then(|exe| {
            crate::rt::block_on(crate::runtime::userns::probe(&config.state_dir, &exe))
        });
    line(
        true,
        "user ns",
        match user_namespaces {
            Ok(()) => format!(
                "ID-mapped mounts work on {} and tmpfs: pods with hostUsers: false can run",
                config.state_dir.display()
            ),
            Err(why) => format!("pods with hostUsers: false are refused: {why}"),
        },
    )?;

    let cni = Cni {
        conf_dir: config.cni_conf_dir.clone(),
        bin_dirs: config.cni_bin_dirs.clone(),
        parked_dir: std::path::PathBuf::new(),
    };
    match cni.network() {
        Ok(Some((path, list))) => {
            let missing = cni.missing_plugins(&list);
            let text = format!(
                "CNI {:?} {} from {}{}",
                list.name,
                list.cni_version,
                path.display(),
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; plugins not found in {:?}: {}",
                        cni.bin_dirs,
                        missing.join(", ")
                    )
                }
            );
            line(missing.is_empty(), "pod network", text)?;
        }
        Ok(None) => line(
            true,
            "pod network",
            format!(
                "none in {}: pods off the host network get loopback only",
                cni.conf_dir.display()
            ),
        )?,
        Err(e) => line(false, "pod network", e.to_string())?,
    }
    for warning in warnings {
        writeln!(out, "{:<5} {:<12} {warning}", "warn", "advisory")?;
    }
    Ok(ok)
}
