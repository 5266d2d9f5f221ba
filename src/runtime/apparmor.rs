//! The host's AppArmor, as the agent finds it at start, and nanolet's own
//! runtime default profile. Container runtimes confine every container that
//! names no profile (and those asking for RuntimeDefault) with a default
//! profile of their own, loaded on demand; nanolet is the runtime here, so
//! it loads `nanolet-default` through `apparmor_parser` when it starts.

use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use futures_lite::{AsyncWriteExt, FutureExt};

/// The name the runtime default profile is loaded under.
pub const RUNTIME_DEFAULT: &str = "nanolet-default";

const ENABLED_FILE: &str = "/sys/module/apparmor/parameters/enabled";

/// The parser compiles a profile in well under a second on a board;
/// longer means something is wrong with it or the kernel.
const PARSER_TIMEOUT: Duration = Duration::from_secs(30);

/// Where Debian and the others install the parser: the agent's PATH
/// (a systemd unit's, or a test's) need not hold sbin.
const PARSERS: [&str; 2] = ["/sbin/apparmor_parser", "/usr/sbin/apparmor_parser"];

#[derive(Debug, thiserror::Error)]
pub enum AppArmorError {
    #[error("cannot run {parser}: {source}")]
    Spawn {
        parser: String,
        source: std::io::Error,
    },
    #[error("{parser} refused profile {RUNTIME_DEFAULT}: {message}")]
    Refused { parser: String, message: String },
    #[error("{parser} gave no answer within {PARSER_TIMEOUT:?}")]
    Timeout { parser: String },
}

/// What the host can enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostAppArmor {
    Disabled,
    /// The kernel enforces profiles; `runtime_default` says whether
    /// [`RUNTIME_DEFAULT`] is loaded.
    Enabled {
        runtime_default: bool,
    },
}

impl HostAppArmor {
    /// The profile of containers that ask for the runtime's default, or
    /// for nothing: none where there is no default to apply.
    pub fn default_profile(self) -> Option<&'static str> {
        match self {
            HostAppArmor::Enabled {
                runtime_default: true,
            } => Some(RUNTIME_DEFAULT),
            _ => None,
        }
    }
}

static HOST: OnceLock<HostAppArmor> = OnceLock::new();

pub fn kernel_enabled() -> bool {
    std::fs::read_to_string(ENABLED_FILE).is_ok_and(|v| v.trim_start().starts_with('Y'))
}

/// The host as [`prepare_host`] found it. Before that (the CLI, unit
/// tests) the kernel is asked, and no default profile is assumed.
pub fn host() -> HostAppArmor {
    *HOST.get().unwrap_or(&if kernel_enabled() {
        HostAppArmor::Enabled {
            runtime_default: false,
        }
    } else {
        HostAppArmor::Disabled
    })
}

/// Loads (or replaces, so an upgraded agent brings its profile along) the
/// runtime default profile where the kernel has AppArmor, and remembers
/// the outcome for admission and container specs. A failure is logged:
/// containers that name no profile then run unconfined, and those that ask
/// for RuntimeDefault are refused at admission.
pub async fn prepare_host() -> HostAppArmor {
    let host = if !kernel_enabled() {
        HostAppArmor::Disabled
    } else {
        match load_runtime_default().await {
            Ok(()) => {
                log::info!(
                    "AppArmor: containers without a profile of their own run under {RUNTIME_DEFAULT}"
                );
                HostAppArmor::Enabled {
                    runtime_default: true,
                }
            }
            Err(e) => {
                log::warn!("AppArmor: {e}; containers without a profile run unconfined");
                HostAppArmor::Enabled {
                    runtime_default: false,
                }
            }
        }
    };
    let _ = HOST.set(host);
    host
}

/// The parser the agent would run: one of [`PARSERS`], else whatever PATH
/// holds under that name.
pub fn parser() -> &'static str {
    PARSERS
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .copied()
        .unwrap_or("apparmor_parser")
}

async fn load_runtime_default() -> Result<(), AppArmorError> {
    let parser = parser();
    let spawn_failed = |source| AppArmorError::Spawn {
        parser: parser.to_owned(),
        source,
    };
    // -K: no cache (a read-only or shared /etc must not matter), -r:
    // replace what an older agent loaded; the profile comes on stdin.
    let mut child = async_process::Command::new(parser)
        .args(["--replace", "--skip-cache", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_failed)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A parser that exits early says why on stderr, not by the pipe.
        let _ = stdin.write_all(profile().as_bytes()).await;
    }
    let output = async { Some(child.output().await) }
        .or(async {
            smol::Timer::after(PARSER_TIMEOUT).await;
            None
        })
        .await
        .ok_or_else(|| AppArmorError::Timeout {
            parser: parser.to_owned(),
        })?
        .map_err(spawn_failed)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(AppArmorError::Refused {
            parser: parser.to_owned(),
            message: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

/// The runtime default: what DAC, capabilities and seccomp allow, except
/// mounting and the kernel-wide knobs under /proc and /sys, which the spec
/// already mounts read-only or masks; the profile holds if a container
/// gets past those (CAP_SYS_ADMIN added, a remount).
fn profile() -> String {
    let mut rules = vec![
        "file,".to_owned(),
        "network,".into(),
        "capability,".into(),
        "umount,".into(),
        // The runtime and the agent (unconfined) stop containers; processes
        // of the same profile signal and trace each other as before.
        "signal (receive) peer=unconfined,".into(),
        format!("signal (send, receive) peer={RUNTIME_DEFAULT},"),
        format!("ptrace (trace, read, tracedby, readby) peer={RUNTIME_DEFAULT},"),
        "deny mount,".into(),
        "deny pivot_root,".into(),
        // Files directly in /proc (sysrq-trigger, kcore, …) and the kernel's
        // own trees below it; a process's /proc/<pid>/ stays writable.
        "deny /proc/* wl,".into(),
        "deny /proc/sysrq-trigger rwklx,".into(),
        "deny /proc/kcore rwklx,".into(),
    ];
    for tree in [
        "acpi", "asound", "bus", "driver", "fs", "irq", "scsi", "sys", "sysvipc", "tty",
    ] {
        rules.push(format!("deny /proc/{tree}/** wl,"));
    }
    // sysfs is the host's; only the container's cgroup tree is its own.
    rules.push("deny /sys/firmware/** rwklx,".into());
    rules.push("deny /sys/kernel/security/** rwklx,".into());
    rules.push("deny /sys/kernel/debug/** rwklx,".into());
    rules.push("deny /sys/fs/[^c]*/** wl,".into());
    for tree in [
        "block",
        "bus",
        "class",
        "dev",
        "devices",
        "firmware",
        "hypervisor",
        "kernel",
        "module",
        "power",
    ] {
        rules.push(format!("deny /sys/{tree}/** wl,"));
    }
    let body: String = rules.iter().map(|r| format!("  {r}\n")).collect();
    format!("profile {RUNTIME_DEFAULT} flags=(attach_disconnected, mediate_deleted) {{\n{body}}}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_is_one_block_named_for_the_runtime_default() {
        let text = profile();
        assert!(
            text.starts_with("profile nanolet-default flags=("),
            "{text}"
        );
        assert!(text.trim_end().ends_with('}'), "{text}");
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert!(text.contains("  deny mount,\n"), "{text}");
        assert!(
            text.lines()
                .skip(1)
                .filter(|l| l.trim() != "}")
                .all(|l| l.trim_end().ends_with(',')),
            "every rule ends with a comma: {text}"
        );
    }

    /// The parser compiles it without loading it, so this runs on hosts
    /// without AppArmor too (scripts/install-deps.sh installs the parser).
    #[test]
    fn apparmor_parser_compiles_the_profile() {
        let mut child = std::process::Command::new(parser())
            .args(["--skip-kernel-load", "--skip-cache", "--quiet"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/install-deps.sh)", parser()));
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(profile().as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&output.stderr),
            profile()
        );
    }

    #[test]
    fn only_a_loaded_default_confines_containers_that_name_none() {
        assert_eq!(HostAppArmor::Disabled.default_profile(), None);
        let failed = HostAppArmor::Enabled {
            runtime_default: false,
        };
        assert_eq!(failed.default_profile(), None);
        let loaded = HostAppArmor::Enabled {
            runtime_default: true,
        };
        assert_eq!(loaded.default_profile(), Some(RUNTIME_DEFAULT));
    }
}
