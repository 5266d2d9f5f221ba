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
            let number = version
                .split_whitespace()
                .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
                .unwrap_or_default();
            let cgroup_v2 = cgroup::detect() == Version::V2;
            let (breaking, lacking): (Vec<_>, Vec<_>) =
                crate::runtime::advisories::too_old(config.runtime, number, cgroup_v2)
                    .into_iter()
                    .partition(|s| s.breaks_pods);
            let mut text = format!("{} ({version})", runtime.display());
            for shortfall in &breaking {
                text.push_str(": ");
                text.push_str(&shortfall.text);
            }
            line(breaking.is_empty(), "runtime", text)?;
            warnings.extend(lacking.into_iter().map(|s| s.text));
            // Pods run, but the node should not stay so: not a failure.
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
    let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").ok();
    let v1_table = std::fs::read_to_string("/proc/cgroups").ok();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    match memory_controller_missing(
        version,
        controllers.as_deref(),
        v1_table.as_deref(),
        &cmdline,
    ) {
        None => line(
            true,
            "memory",
            "the memory controller is enabled".to_owned(),
        )?,
        Some(why) => line(false, "memory", why)?,
    }
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    match swap_kib(&swaps) {
        0 => line(true, "swap", "off".to_owned())?,
        kib => warnings.push(format!(
            "swap is on ({} MiB in /proc/swaps): memory limits do not bound what containers swap out, and upstream's kubelet refuses to start with swap on (failSwapOn); on Raspberry Pi OS: sudo dphys-swapfile swapoff && sudo systemctl disable dphys-swapfile",
            kib / 1024
        )),
    }

    let loaded = std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| {
        f.lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"))
    });
    // A module the kernel loads at the first overlay mount (Debian's and
    // Raspberry Pi OS's kernels) is as good as a loaded one.
    let module = !loaded && kernel_has_module("overlay");
    line(
        loaded || module,
        "overlayfs",
        if loaded {
            "available".to_owned()
        } else if module {
            "a module of this kernel, loaded at the first mount".to_owned()
        } else {
            "not in /proc/filesystems nor among this kernel's modules".to_owned()
        },
    )?;

    // Not loaded here (check changes nothing); the agent loads it at start.
    let parser = crate::runtime::apparmor::parser();
    let apparmor = if !crate::runtime::apparmor::kernel_enabled() {
        "not enabled: pods asking for a profile are refused".to_owned()
    } else if std::path::Path::new(parser).is_absolute() {
        format!(
            "enabled; the agent loads {} with {parser} at start",
            crate::runtime::apparmor::RUNTIME_DEFAULT,
        )
    } else {
        format!(
            "enabled, but {parser} is not installed (the apparmor package): containers without a profile run unconfined, and RuntimeDefault is refused"
        )
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
    let (devices, device_warnings) = device_report(config);
    line(true, "devices", devices)?;
    warnings.extend(device_warnings);
    for warning in warnings {
        writeln!(out, "{:<5} {:<12} {warning}", "warn", "advisory")?;
    }
    Ok(ok)
}

/// The device plugins' resources as the agent last recorded them, and a
/// warning for each one with devices unhealthy or its plugin gone: pods
/// asking for those are refused, but the node works.
fn device_report(config: &Config) -> (String, Vec<String>) {
    let layout = crate::state::Layout::new(&config.state_dir);
    let socket = config
        .device_plugins_dir
        .join(crate::device::KUBELET_SOCKET);
    let kept: Option<crate::device::manager::Checkpoint> =
        match crate::state::read_json(&layout.devices()) {
            Ok(kept) => kept,
            Err(e) => return (format!("{e}"), Vec::new()),
        };
    let resources = kept.map(|k| k.resources).unwrap_or_default();
    if resources.is_empty() {
        return (
            format!("no device plugin has registered on {}", socket.display()),
            Vec::new(),
        );
    }
    let mut warnings = Vec::new();
    let listed: Vec<String> = resources
        .iter()
        .map(|(name, r)| {
            let (healthy, unhealthy) = (r.healthy.len(), r.unhealthy.len());
            if !r.connected {
                warnings.push(format!(
                    "device plugin of {name} is not connected: its {unhealthy} devices are unhealthy"
                ));
            } else if unhealthy > 0 {
                warnings.push(format!("{name}: {unhealthy} devices unhealthy"));
            }
            format!("{name} {healthy}/{}", healthy + unhealthy)
        })
        .collect();
    (
        format!(
            "healthy of all, as the agent last saw them: {}",
            listed.join(", ")
        ),
        warnings,
    )
}

/// Why pods would get no memory limits here, in words a Raspberry Pi user
/// can act on, or `None` when the memory controller is there. Raspberry Pi
/// kernels boot with it disabled unless the command line enables it.
fn memory_controller_missing(
    version: Version,
    v2_controllers: Option<&str>,
    v1_table: Option<&str>,
    cmdline: &str,
) -> Option<String> {
    let enabled = match version {
        Version::V2 => v2_controllers.is_some_and(|c| c.split_whitespace().any(|c| c == "memory")),
        // /proc/cgroups: name, hierarchy, cgroups, enabled.
        Version::Hybrid | Version::V1 => v1_table.is_some_and(|table| {
            table.lines().any(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                fields.first() == Some(&"memory") && fields.get(3) == Some(&"1")
            })
        }),
    };
    if enabled {
        return None;
    }
    let disabled_by = cmdline
        .split_whitespace()
        .find(|arg| *arg == "cgroup_disable=memory")
        .map(|arg| format!(" (the kernel command line has {arg})"))
        .unwrap_or_default();
    Some(format!(
        "the memory controller is disabled{disabled_by}: pods get no memory limits and eviction cannot see their use; add cgroup_enable=memory cgroup_memory=1 to the kernel command line (/boot/firmware/cmdline.txt on Raspberry Pi OS, /boot/cmdline.txt before Bookworm) and reboot"
    ))
}

/// Whether the running kernel has `name` as a module (built in or
/// loadable), by its modules.builtin and modules.dep.
fn kernel_has_module(name: &str) -> bool {
    let Ok(release) =
        nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned())
    else {
        return false;
    };
    let dir = std::path::Path::new("/lib/modules").join(release);
    ["modules.builtin", "modules.dep"].iter().any(|file| {
        std::fs::read_to_string(dir.join(file)).is_ok_and(|text| lists_module(&text, name))
    })
}

/// Whether a modules.builtin or modules.dep text names module `name`
/// (`kernel/fs/overlayfs/overlay.ko`, compressed or not, before any `:`).
fn lists_module(text: &str, name: &str) -> bool {
    text.lines().any(|line| {
        let path = line.split(':').next().unwrap_or("");
        let file = path.rsplit('/').next().unwrap_or("");
        file.split(".ko").next() == Some(name) && file.contains(".ko")
    })
}

/// The swap in use or available, in KiB, from /proc/swaps.
fn swap_kib(swaps: &str) -> u64 {
    swaps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pi_kernel_without_the_memory_controller_is_told_what_to_add() {
        let why = memory_controller_missing(
            Version::V2,
            Some("cpuset cpu io pids\n"),
            None,
            "console=serial0,115200 cgroup_disable=memory root=PARTUUID=1",
        )
        .unwrap();
        assert!(why.contains("cgroup_disable=memory"), "{why}");
        assert!(
            why.contains("cgroup_enable=memory cgroup_memory=1"),
            "{why}"
        );
        assert!(why.contains("/boot/firmware/cmdline.txt"), "{why}");
        assert_eq!(
            memory_controller_missing(Version::V2, Some("cpu memory pids"), None, ""),
            None
        );
    }

    #[test]
    fn v1_reads_the_enabled_column_of_proc_cgroups() {
        let table =
            "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t2\t1\t1\nmemory\t0\t1\t0\n";
        assert!(memory_controller_missing(Version::Hybrid, None, Some(table), "").is_some());
        let table = table.replace("memory\t0\t1\t0", "memory\t4\t80\t1");
        assert_eq!(
            memory_controller_missing(Version::V1, None, Some(&table), ""),
            None
        );
        // Unreadable: not there, as far as pods go.
        assert!(memory_controller_missing(Version::V1, None, None, "").is_some());
    }

    #[test]
    fn a_module_is_found_in_modules_dep_compressed_or_not() {
        let dep = "kernel/fs/overlayfs/overlay.ko: \nkernel/net/9p/9pnet.ko.xz: kernel/fs/netfs/netfs.ko.xz\n";
        assert!(lists_module(dep, "overlay"));
        assert!(lists_module(dep, "9pnet"));
        // A dependency is not the module, nor a prefix of a name.
        assert!(!lists_module(dep, "netfs"));
        assert!(!lists_module(dep, "overlayfs"));
        assert!(!lists_module(dep, "9p"));
        assert!(lists_module("kernel/fs/overlayfs/overlay.ko\n", "overlay"));
    }

    #[test]
    fn swap_is_summed_from_proc_swaps() {
        let swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/var/swap file 102396 0 -2\n/dev/zram0 partition 204800 12 100\n";
        assert_eq!(swap_kib(swaps), 307196);
        assert_eq!(swap_kib("Filename Type Size Used Priority\n"), 0);
        assert_eq!(swap_kib(""), 0);
    }
}
