//! The OCI runtime spec (config.json) for one container, from the pod, the
//! container and its image. The defaults (mounts, capabilities, masked and
//! read-only paths, rlimits) are those containerd gives Kubernetes pods.
//!
//! Only the fields nanolet sets are modelled: the oci-spec crate would bring
//! regex, getset and derive_builder into a binary whose budget is 6 MiB, to
//! write a document of a few dozen fields.

use std::path::{Path, PathBuf};

pub mod devices;
mod model;

pub use model::*;

use super::seccomp;
use super::userns::{self, PodUserNs};
use crate::cgroup;
use crate::image::manifest::RunConfig;
use crate::pod::{AppArmorProfile, Container, Pod, QosClass, SeccompProfile};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error(
        "no command specified: the container has no command and the image no entrypoint or cmd"
    )]
    NoCommand,
    #[error(
        "{0:?} goes through /proc/self or a /proc/<pid>: a container escape's way (CVE-2024-21626)"
    )]
    ThroughProcSelf(String),
    #[error("the image's user database: {0}")]
    ImageFile(String),
    #[error("user {0:?} not found in the image's /etc/passwd")]
    UnknownUser(String),
    #[error("group {0:?} not found in the image's /etc/group")]
    UnknownGroup(String),
    #[error("subPath {sub_path:?}: {reason}")]
    SubPath { sub_path: String, reason: String },
    #[error("runAsNonRoot is set but the container would run as root (uid 0)")]
    RunsAsRoot,
    #[error(
        "runAsNonRoot is set and the image user {0:?} is not numeric, so it cannot be verified"
    )]
    NonNumericUser(String),
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error(
        "volume {0:?} requested recursive read-only mode, but it is not supported by the runtime"
    )]
    RecursiveReadOnly(String),
}

/// containerd's default capability set for containers.
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The container's capabilities, as containerd computes them from the
/// defaults: `ALL` in add, then `ALL` in drop, then the named ones added and
/// dropped. Privileged containers get all the host has. Only capabilities
/// the agent itself holds can be given.
fn capabilities(security: &crate::pod::Security) -> Vec<String> {
    let host = host_capabilities();
    let full = |name: &str| format!("CAP_{name}");
    let mut caps: Vec<String> =
        if security.privileged || security.capabilities_add.iter().any(|c| c == "ALL") {
            host.clone()
        } else {
            DEFAULT_CAPS.iter().map(|c| c.to_string()).collect()
        };
    if security.privileged {
        return caps;
    }
    if security.capabilities_drop.iter().any(|c| c == "ALL") {
        caps.clear();
    }
    for name in security.capabilities_add.iter().filter(|c| *c != "ALL") {
        let cap = full(name);
        if !caps.contains(&cap) {
            caps.push(cap);
        }
    }
    caps.retain(|c| !security.capabilities_drop.iter().any(|d| full(d) == *c));
    caps
}

/// The host's device nodes under /dev (not its pts, shm or mqueue, which
/// the container has of its own), as OCI `linux.devices` entries.
fn host_devices() -> Vec<serde_json::Value> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from("/dev")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let kind = meta.file_type();
            if kind.is_dir() {
                if !matches!(path.to_str(), Some("/dev/pts" | "/dev/shm" | "/dev/mqueue")) {
                    dirs.push(path);
                }
                continue;
            }
            let type_ = if kind.is_char_device() {
                "c"
            } else if kind.is_block_device() {
                "b"
            } else {
                continue;
            };
            let rdev = meta.rdev();
            found.push(serde_json::json!({
                "path": path,
                "type": type_,
                "major": nix::sys::stat::major(rdev),
                "minor": nix::sys::stat::minor(rdev),
                "fileMode": meta.permissions().mode() & 0o777,
                "uid": meta.uid(),
                "gid": meta.gid(),
            }));
        }
    }
    found
}

/// The bounding set of this process, as capability names.
fn host_capabilities() -> Vec<String> {
    let mask = super::own_capabilities("CapBnd").unwrap_or(0);
    crate::pod::CAPABILITIES
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1 << bit) != 0)
        .map(|(_, name)| format!("CAP_{name}"))
        .collect()
}

const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// containerd's default open-files limit; well under any host's hard limit.
const NOFILE: u64 = 1024;

/// Where the pod's shared pieces live on the host.
#[derive(Debug, Clone)]
pub struct PodPaths {
    /// Bind-mounted namespaces; `None` where the pod uses the host's.
    pub net_ns: Option<PathBuf>,
    pub uts_ns: Option<PathBuf>,
    pub ipc_ns: Option<PathBuf>,
    /// The PID namespace of `nanolet pause`, with shareProcessNamespace.
    pub pid_ns: Option<PathBuf>,
    /// The pod's own user namespace (`hostUsers: false`).
    pub user_ns: Option<PodUserNs>,
    /// The sandbox is new (first start, reboot, lost namespaces): whatever
    /// ran before ran in another one.
    pub recreated: bool,
    pub hosts: PathBuf,
    pub resolv_conf: PathBuf,
    pub hostname: PathBuf,
    /// The pod's host name in its UTS namespace (its FQDN with
    /// setHostnameAsFQDN).
    pub own_hostname: String,
    /// Volume name → host directory or file, where the agent fills it.
    pub volumes: Vec<(String, PathBuf)>,
    /// Volume name → what containers mount: the volume, or in a pod's own
    /// user namespace its ID-mapped mount (which the agent, whose root
    /// the mapping does not cover, cannot write through).
    pub volume_sources: Vec<(String, PathBuf)>,
    /// The pod's addresses on its network (none on the host network or
    /// without a CNI network).
    pub pod_ips: Vec<std::net::IpAddr>,
}

fn mount(destination: &str, kind: &str, source: &str, options: &[&str]) -> Mount {
    Mount {
        destination: destination.into(),
        kind: kind.into(),
        source: source.into(),
        options: options.iter().map(|s| s.to_string()).collect(),
    }
}

/// Names in a bind mount's options the flags of the mount its source is on
/// that a user namespace may not clear (nosuid, nodev, noexec, the atime
/// mode, read-only): runc 1.1 remounts a bind mount with exactly the
/// options given (to make it read-only, say), which from inside a pod's
/// user namespace fails with EPERM if it would clear one.
fn keep_locked_flags(m: &mut Mount) {
    use nix::sys::statvfs::FsFlags;
    let Ok(stat) = nix::sys::statvfs::statvfs(Path::new(&m.source)) else {
        return;
    };
    let flags = stat.flags();
    let locked = [
        (FsFlags::ST_NOSUID, "nosuid"),
        (FsFlags::ST_NODEV, "nodev"),
        (FsFlags::ST_NOEXEC, "noexec"),
        (FsFlags::ST_NOATIME, "noatime"),
        (FsFlags::ST_NODIRATIME, "nodiratime"),
    ];
    // Linux's ST_RELATIME, which nix names only on glibc.
    let relatime = flags.bits() & 0x1000 != 0;
    let present = locked
        .into_iter()
        .filter(|(flag, _)| flags.contains(*flag))
        .map(|(_, option)| option)
        .chain(relatime.then_some("relatime"));
    for option in present {
        if !m.options.iter().any(|o| o == option) {
            m.options.push(option.to_owned());
        }
    }
    if flags.contains(FsFlags::ST_RDONLY) {
        m.options.retain(|o| o != "rw");
        if !m.options.iter().any(|o| o == "ro") {
            m.options.push("ro".to_owned());
        }
    }
}

fn bind(destination: &str, source: &Path, read_only: bool) -> Mount {
    let mut options = vec!["rbind", "rprivate"];
    options.push(if read_only { "ro" } else { "rw" });
    mount(destination, "bind", &source.to_string_lossy(), &options)
}

/// oom_score_adj by QoS class, as the upstream kubelet sets it.
pub fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity: u64) -> i32 {
    match pod.qos {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let request = container.resources.memory_request.unwrap_or(0);
            if memory_capacity == 0 {
                return 999;
            }
            let adj = 1000i64 - (1000i64 * request as i64) / memory_capacity as i64;
            adj.clamp(3, 999) as i32
        }
    }
}

/// The largest /etc/passwd or /etc/group read from an image.
const MAX_USER_DATABASE: u64 = 1 << 20;

/// An image's /etc/passwd or /etc/group, resolved inside its rootfs as the
/// container would (a link to /dev/zero or a host file stays inside), and
/// read only when a regular file within the cap: a FIFO or an endless file
/// must not stop or swell the agent (`build` runs on a helper thread, see
/// `bundle_setup`, but the pool's threads are few). Missing is empty.
fn image_database(rootfs: &Path, path: &str) -> Result<String, SpecError> {
    match crate::rooted::read_in_root(rootfs, Path::new(path), MAX_USER_DATABASE) {
        Ok(data) => Ok(String::from_utf8_lossy(&data).into_owned()),
        Err(e) if e.is_not_found() => Ok(String::new()),
        Err(e) => Err(SpecError::ImageFile(e.to_string())),
    }
}

/// Resolves the process user: the container's securityContext, then the
/// pod's, then the image's `User` (looked up in the rootfs when a name).
pub fn resolve_user(
    pod: &Pod,
    container: &Container,
    image: &RunConfig,
    rootfs: &Path,
) -> Result<User, SpecError> {
    let image_user = image.user.clone().unwrap_or_default();
    let (image_uid, image_gid) = match image_user.split_once(':') {
        Some((u, g)) => (u.to_owned(), Some(g.to_owned())),
        None => (image_user.clone(), None),
    };
    let passwd = image_database(rootfs, "/etc/passwd")?;
    let group = image_database(rootfs, "/etc/group")?;
    let lookup = |db: &str, key: &str, by_name: bool| -> Option<(u32, Option<u32>)> {
        db.lines().find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            let id: u32 = f.get(2)?.parse().ok()?;
            let matches = if by_name {
                f[0] == key
            } else {
                key.parse::<u32>().ok() == Some(id)
            };
            matches.then(|| (id, f.get(3).and_then(|g| g.parse().ok())))
        })
    };
    let explicit_uid = container.run_as_user.or(pod.run_as_user);
    let (uid, passwd_gid) = match explicit_uid {
        Some(uid) => (
            uid,
            lookup(&passwd, &uid.to_string(), false).and_then(|(_, g)| g),
        ),
        None if image_uid.is_empty() => (0, Some(0)),
        None => match image_uid.parse::<u32>() {
            Ok(uid) => (uid, lookup(&passwd, &image_uid, false).and_then(|(_, g)| g)),
            Err(_) => {
                if container.run_as_non_root || pod.run_as_non_root {
                    return Err(SpecError::NonNumericUser(image_uid));
                }
                lookup(&passwd, &image_uid, true)
                    .ok_or_else(|| SpecError::UnknownUser(image_uid.clone()))?
            }
        },
    };
    if uid == 0 && (container.run_as_non_root || pod.run_as_non_root) {
        return Err(SpecError::RunsAsRoot);
    }
    let gid = match container.run_as_group.or(pod.run_as_group) {
        Some(g) => g,
        None => match &image_gid {
            Some(g) if explicit_uid.is_none() => match g.parse::<u32>() {
                Ok(g) => g,
                Err(_) => lookup(&group, g, true)
                    .map(|(g, _)| g)
                    .ok_or_else(|| SpecError::UnknownGroup(g.clone()))?,
            },
            _ => passwd_gid.unwrap_or(0),
        },
    };
    let mut additional_gids = pod.supplemental_groups.clone();
    additional_gids.extend(pod.fs_group);
    if pod.merge_image_groups {
        let user_name = passwd.lines().find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.get(2)?.parse::<u32>().ok()? == uid).then(|| f[0].to_owned())
        });
        if let Some(user_name) = user_name {
            additional_gids.extend(member_groups(&group, &user_name));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    additional_gids.retain(|g| seen.insert(*g));
    Ok(User {
        uid,
        gid,
        additional_gids,
    })
}

/// The groups /etc/group lists `user` as a member of.
fn member_groups(group: &str, user: &str) -> Vec<u32> {
    group
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            let members = f.get(3)?;
            members
                .split(',')
                .any(|m| m.trim() == user)
                .then(|| f.get(2)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The process arguments: Kubernetes `command` replaces the image's
/// Entrypoint (and drops its Cmd), `args` replaces Cmd.
/// The process's argv. `$(VAR)` in the pod's command and args expands
/// with the container's variables, as upstream; the image's are left as
/// they are.
pub fn process_args(
    container: &Container,
    image: &RunConfig,
    env: &[(String, String)],
) -> Result<Vec<String>, SpecError> {
    let entrypoint = image.entrypoint.clone().unwrap_or_default();
    let cmd = image.cmd.clone().unwrap_or_default();
    let expand = |list: &Vec<String>| -> Vec<String> {
        list.iter()
            .map(|a| crate::pod::env::expand(a, env))
            .collect()
    };
    let args = match (container.command.is_empty(), container.args.is_empty()) {
        (false, _) => expand(&container.command)
            .into_iter()
            .chain(expand(&container.args))
            .collect(),
        (true, false) => entrypoint
            .into_iter()
            .chain(expand(&container.args))
            .collect(),
        (true, true) => entrypoint.into_iter().chain(cmd).collect::<Vec<_>>(),
    };
    if args.is_empty() {
        return Err(SpecError::NoCommand);
    }
    Ok(args)
}

/// The environment: the image's, overridden by the container's (resolved:
/// see `pod::env`), plus PATH and HOSTNAME as container runtimes add them.
pub fn environment(
    hostname: &str,
    container_env: &[(String, String)],
    image: &RunConfig,
    tty: bool,
) -> Vec<String> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| match env.iter_mut().find(|(key, _)| key == k) {
        Some(entry) => entry.1 = v.to_owned(),
        None => env.push((k.to_owned(), v.to_owned())),
    };
    let (k, v) = DEFAULT_PATH.split_once('=').unwrap_or_default();
    set(k, v);
    set("HOSTNAME", hostname);
    for kv in image.env.iter().flatten() {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        set(k, v);
    }
    // As containerd gives a container its terminal.
    if tty {
        set("TERM", "xterm");
    }
    for (k, v) in container_env {
        set(k, v);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

pub struct SpecInput<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    /// The container's variables, resolved.
    pub env: &'a [(String, String)],
    pub image: &'a RunConfig,
    pub rootfs: &'a Path,
    pub paths: &'a PodPaths,
    pub cgroups_path: String,
    pub cgroup_version: cgroup::Version,
    /// The host file behind the container's terminationMessagePath.
    pub termination_log: Option<&'a Path>,
    pub memory_capacity: u64,
    /// The lowest oom_score_adj the container can get, if there is one.
    pub oom_score_floor: Option<i32>,
    /// Where Localhost seccomp profiles are.
    pub seccomp_root: &'a Path,
    /// For each of the container's mounts, where its subPath is pinned
    /// (see `sub_path::pin`).
    pub pinned_sub_paths: &'a [Option<PathBuf>],
    /// The host's runtime default AppArmor profile, where it has one.
    pub apparmor_default: Option<&'a str>,
    /// The runtime and kernel make recursively read-only mounts (`rro`).
    pub recursive_read_only: bool,
    /// What the container's devices add.
    pub devices: &'a devices::DeviceEdits,
}

pub fn build(input: &SpecInput) -> Result<Spec, SpecError> {
    let SpecInput {
        pod,
        container,
        image,
        rootfs,
        paths,
        ..
    } = *input;
    let mut user = resolve_user(pod, container, image, rootfs)?;
    for gid in &input.devices.additional_gids {
        if *gid != user.gid && !user.additional_gids.contains(gid) {
            user.additional_gids.push(*gid);
        }
    }
    let args = process_args(container, image, input.env)?;
    let cwd = container
        .working_dir
        .clone()
        .or_else(|| image.working_dir.clone().filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".into());
    // CVE-2024-21626's trigger, from the pod or the image: refused here
    // whatever the runtime's version.
    let through_proc = container
        .mounts
        .iter()
        .map(|m| m.path.as_str())
        .chain([cwd.as_str()])
        .find(|p| super::advisories::through_proc_self(p));
    if let Some(path) = through_proc {
        return Err(SpecError::ThroughProcSelf(path.to_owned()));
    }

    let privileged = container.security.privileged;
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        ),
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        ),
        bind("/etc/hosts", &paths.hosts, false),
        bind("/etc/resolv.conf", &paths.resolv_conf, false),
        bind("/etc/hostname", &paths.hostname, false),
    ];
    if privileged {
        // /sys and cgroups writable, as containerd gives privileged
        // containers; the host's devices come as `linux.devices` in the
        // container's own /dev (binding the host's /dev would let the
        // runtime create mount points, like the termination log's, there).
        mounts.retain(|m| !matches!(m.destination.as_str(), "/sys" | "/sys/fs/cgroup"));
        mounts.push(mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "rw"],
        ));
        mounts.push(mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "rw"],
        ));
    }
    // Before the volumes, as upstream orders them.
    mounts.extend(input.devices.mounts.iter().cloned());
    for (i, m) in container.mounts.iter().enumerate() {
        if let Some((_, root)) = paths
            .volume_sources
            .iter()
            .find(|(name, _)| *name == m.volume)
        {
            let source = match (&m.sub_path, input.pinned_sub_paths.get(i)) {
                (Some(_), Some(Some(pinned))) => pinned.clone(),
                (Some(sub), _) => {
                    return Err(SpecError::SubPath {
                        sub_path: sub.clone(),
                        reason: "not pinned".into(),
                    });
                }
                (None, _) => root.clone(),
            };
            let mut volume = bind(&m.path, &source, m.read_only);
            volume.options.retain(|o| o != "rprivate");
            volume.options.push(m.propagation.to_owned());
            match (m.recursive_read_only, input.recursive_read_only) {
                (crate::pod::RecursiveReadOnly::Disabled, _) => {}
                (_, true) => volume.options.push("rro".into()),
                (crate::pod::RecursiveReadOnly::IfPossible, false) => {}
                (crate::pod::RecursiveReadOnly::Enabled, false) => {
                    return Err(SpecError::RecursiveReadOnly(m.volume.clone()));
                }
            }
            mounts.push(volume);
        }
    }
    if let Some(log) = input.termination_log {
        mounts.push(bind(&container.termination_message_path, log, false));
    }
    if paths.user_ns.is_some() {
        for m in mounts.iter_mut().filter(|m| m.kind == "bind") {
            keep_locked_flags(m);
        }
    }

    let mut namespaces = vec![Namespace {
        kind: "mount",
        path: None,
    }];
    // Joined first by the runtime: the namespaces below are its.
    let id_mappings: Vec<IdMapping> = match &paths.user_ns {
        Some(user_ns) => {
            namespaces.push(Namespace {
                kind: "user",
                path: Some(user_ns.path()),
            });
            vec![IdMapping {
                container_id: 0,
                host_id: user_ns.range.host_id,
                size: userns::IDS_PER_POD,
            }]
        }
        None => Vec::new(),
    };
    if !pod.host_pid {
        namespaces.push(Namespace {
            kind: "pid",
            path: paths.pid_ns.clone(),
        });
    }
    let shared = [
        ("network", &paths.net_ns),
        ("uts", &paths.uts_ns),
        ("ipc", &paths.ipc_ns),
    ];
    for (kind, path) in shared {
        if let Some(path) = path {
            namespaces.push(Namespace {
                kind,
                path: Some(path.clone()),
            });
        }
    }

    let r = &container.resources;
    let shares = cgroup::cpu_shares(r.cpu_request_milli);
    let v2 = input.cgroup_version == cgroup::Version::V2;
    let cpu = Cpu {
        shares: (!v2).then_some(shares),
        quota: r.cpu_limit_milli.map(cgroup::cpu_quota),
        period: r.cpu_limit_milli.map(|_| cgroup::CPU_PERIOD),
    };
    let mut unified = std::collections::BTreeMap::new();
    if v2 {
        unified.insert(
            "cpu.weight".to_owned(),
            cgroup::cpu_weight(shares).to_string(),
        );
    }
    let resources = Resources {
        cpu: Some(cpu),
        memory: r.memory_limit.map(|l| Memory {
            limit: i64::try_from(l).unwrap_or(i64::MAX),
        }),
        unified,
        devices: if container.security.privileged {
            vec![serde_json::json!({"allow": true, "access": "rwm"})]
        } else {
            // As containerd writes it: every device denied, then the
            // container's own allowed (the runtime adds its defaults).
            // runc and crun deny by default as well (measured on cgroup
            // v1 and v2): the first rule only says so.
            std::iter::once(serde_json::json!({"allow": false, "access": "rwm"}))
                .chain(input.devices.rules.iter().cloned())
                .collect()
        },
    };
    let caps = capabilities(&container.security);
    let privileged = container.security.privileged;
    // The devices' variables first: the container's own override them.
    let env: Vec<(String, String)> = input.devices.env.iter().chain(input.env).cloned().collect();
    // procMount Unmasked: /proc as the kernel has it, as containerd does.
    let unmasked = privileged || container.security.proc_unmasked;
    // Privileged containers run without seccomp, whatever they name.
    let seccomp = match &container.security.seccomp {
        _ if privileged => None,
        SeccompProfile::Unconfined => None,
        SeccompProfile::RuntimeDefault => Some(seccomp::runtime_default()),
        SeccompProfile::Localhost(name) => {
            Some(seccomp::localhost(input.seccomp_root, name, &caps)?)
        }
    };

    Ok(Spec {
        oci_version: "1.0.2",
        process: Process {
            terminal: container.input.tty,
            user,
            args,
            env: environment(&paths.own_hostname, &env, image, container.input.tty),
            cwd,
            capabilities: Capabilities {
                bounding: caps.clone(),
                effective: caps.clone(),
                permitted: caps,
            },
            rlimits: vec![Rlimit {
                kind: "RLIMIT_NOFILE",
                hard: NOFILE,
                soft: NOFILE,
            }],
            no_new_privileges: container.no_new_privileges,
            oom_score_adj: oom_score_adj(pod, container, input.memory_capacity)
                .max(input.oom_score_floor.unwrap_or(i32::MIN)),
            // As containerd: no profile named means the runtime's
            // default, which privileged containers run without.
            apparmor_profile: match &container.security.apparmor {
                Some(AppArmorProfile::Localhost(name)) => Some(name.clone()),
                Some(AppArmorProfile::Unconfined) => None,
                Some(AppArmorProfile::RuntimeDefault) | None if !privileged => {
                    input.apparmor_default.map(str::to_owned)
                }
                Some(AppArmorProfile::RuntimeDefault) | None => None,
            },
        },
        root: Root {
            path: rootfs.to_owned(),
            readonly: container.read_only_root,
        },
        hostname: paths.uts_ns.as_ref().map(|_| paths.own_hostname.clone()),
        mounts,
        linux: Linux {
            namespaces,
            resources,
            cgroups_path: input.cgroups_path.clone(),
            uid_mappings: id_mappings.clone(),
            gid_mappings: id_mappings,
            masked_paths: if unmasked {
                Vec::new()
            } else {
                MASKED_PATHS.to_vec()
            },
            readonly_paths: if unmasked {
                Vec::new()
            } else {
                READONLY_PATHS.to_vec()
            },
            sysctl: pod.sysctls.iter().cloned().collect(),
            seccomp,
            devices: {
                let mut nodes = if privileged {
                    host_devices()
                } else {
                    Vec::new()
                };
                for node in &input.devices.nodes {
                    nodes.retain(|n| n["path"] != node["path"]);
                    nodes.push(node.clone());
                }
                nodes
            },
        },
        annotations: input.devices.annotations.clone(),
        hooks: input.devices.hooks.clone(),
    })
}

#[cfg(test)]
mod tests;
