//! Cgroup paths of pods and containers (upstream's hierarchy: `kubepods`,
//! then `burstable`/`besteffort` by QoS, then `pod<uid>`), the pod- and
//! QoS-level limits nanolet writes itself (cgroup v2 files, or the v1
//! controllers' on v1 and hybrid hosts), and their removal. The OCI runtime
//! creates a container's own cgroup from the spec's `cgroupsPath`.

mod limits;
pub mod settings;
pub mod usage;

pub use limits::{CPU_PERIOD, Limits, cpu_quota, cpu_shares, cpu_weight, ensure as ensure_limits};

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::pod::QosClass;

#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {source}")]
pub struct CgroupError {
    pub path: PathBuf,
    pub source: io::Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    /// cgroup v1 controllers with a cgroup2 tree beside them.
    Hybrid,
    V2,
}

/// Which cgroup layout this host has.
pub fn detect() -> Version {
    let v2_root = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let unified = Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists();
    match (v2_root, unified) {
        (true, _) => Version::V2,
        (false, true) => Version::Hybrid,
        _ => Version::V1,
    }
}

#[derive(Debug, Clone)]
pub struct Hierarchy {
    /// The configured cgroupRoot, without trailing slash ("" for "/").
    root: String,
    pub version: Version,
}

impl Hierarchy {
    pub fn new(cgroup_root: &str) -> Self {
        Hierarchy {
            root: cgroup_root.trim_end_matches('/').to_owned(),
            version: detect(),
        }
    }

    /// `/<root>/kubepods[/<qos>]`: where the QoS class's pods live.
    pub fn qos_path(&self, qos: QosClass) -> String {
        match qos {
            QosClass::Guaranteed => format!("{}/kubepods", self.root),
            QosClass::Burstable => format!("{}/kubepods/burstable", self.root),
            QosClass::BestEffort => format!("{}/kubepods/besteffort", self.root),
        }
    }

    /// Creates the pod's cgroup (and those above it) with `limits`, or
    /// brings an existing one's limits up to date.
    pub fn ensure_pod(&self, qos: QosClass, uid: &str, limits: &Limits) -> Result<(), CgroupError> {
        limits::ensure(self.version, &self.pod_path(qos, uid), limits)
    }

    /// `kubepods`, which holds every pod, sized as upstream sizes it: see
    /// `agent::node::pods_cgroup_limits`.
    pub fn update_pods(&self, limits: &Limits) -> Result<(), CgroupError> {
        limits::ensure(self.version, &self.qos_path(QosClass::Guaranteed), limits)
    }

    /// `kubepods`' own memory events file (cgroup v2 only): it changes when
    /// the pods together reach the cgroup's limits.
    pub fn pods_memory_events(&self) -> Option<PathBuf> {
        (self.version == Version::V2).then(|| {
            Path::new("/sys/fs/cgroup")
                .join(self.qos_path(QosClass::Guaranteed).trim_start_matches('/'))
                .join("memory.events.local")
        })
    }

    /// The QoS-level cgroups, as upstream sizes them: BestEffort gets the
    /// least CPU weight, Burstable the sum of its pods' CPU requests.
    pub fn update_qos(&self, burstable_cpu_milli: u64) -> Result<(), CgroupError> {
        let besteffort = Limits {
            cpu_shares: cpu_shares(None),
            ..Limits::default()
        };
        limits::ensure(
            self.version,
            &self.qos_path(QosClass::BestEffort),
            &besteffort,
        )?;
        let burstable = Limits {
            cpu_shares: cpu_shares(Some(burstable_cpu_milli)),
            ..Limits::default()
        };
        limits::ensure(
            self.version,
            &self.qos_path(QosClass::Burstable),
            &burstable,
        )
    }

    /// `/<root>/kubepods[/<qos>]/pod<uid>`, as an absolute cgroup path.
    pub fn pod_path(&self, qos: QosClass, uid: &str) -> String {
        let qos_dir = match qos {
            QosClass::Guaranteed => "",
            QosClass::Burstable => "/burstable",
            QosClass::BestEffort => "/besteffort",
        };
        format!("{}/kubepods{qos_dir}/pod{uid}", self.root)
    }

    pub fn container_path(&self, qos: QosClass, uid: &str, container_id: &str) -> String {
        format!("{}/{container_id}", self.pod_path(qos, uid))
    }

    /// Moves the pod's pause (PID 1 of a shared PID namespace) into a
    /// cgroup of its own under the pod's, as upstream's pause container
    /// is: its memory and PIDs count against the pod, and cgroup v2 allows
    /// no process in the pod's cgroup itself. In every hierarchy the pod
    /// has a cgroup in; writing the pid again is harmless.
    pub fn adopt_pause(&self, qos: QosClass, uid: &str, pid: i32) -> Result<(), CgroupError> {
        let pod = self.pod_path(qos, uid);
        for mount in cgroup_mounts() {
            let pod_dir = mount.join(pod.trim_start_matches('/'));
            if !pod_dir.is_dir() {
                continue;
            }
            let dir = pod_dir.join("pause");
            let failed = |path: &Path| {
                let path = path.to_owned();
                move |source| CgroupError { path, source }
            };
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(failed(&dir)(e)),
            }
            inherit_cpuset(&mount, &dir)?;
            let procs = dir.join("cgroup.procs");
            fs::write(&procs, pid.to_string()).map_err(failed(&procs))?;
        }
        Ok(())
    }

    /// Removes a pod's cgroup directories in every mounted hierarchy. The
    /// runtime removed the containers' own; what remains must be empty. A
    /// pod cgroup that is already gone is fine.
    pub fn remove_pod(&self, qos: QosClass, uid: &str) -> Result<(), CgroupError> {
        let path = self.pod_path(qos, uid);
        for mount in cgroup_mounts() {
            let dir = mount.join(path.trim_start_matches('/'));
            remove_tree(&dir)?;
        }
        Ok(())
    }
}

impl Hierarchy {
    /// The pods with a cgroup, in any QoS class and mounted hierarchy.
    pub fn pod_cgroups(&self) -> Vec<(QosClass, String)> {
        let mut found = Vec::new();
        for mount in cgroup_mounts() {
            for qos in [
                QosClass::Guaranteed,
                QosClass::Burstable,
                QosClass::BestEffort,
            ] {
                let class = mount.join(self.qos_path(qos).trim_start_matches('/'));
                let Ok(entries) = fs::read_dir(&class) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if let Some(uid) = name.strip_prefix("pod")
                        && entry.file_type().is_ok_and(|t| t.is_dir())
                        && !found.iter().any(|(q, u)| *q == qos && u == uid)
                    {
                        found.push((qos, uid.to_owned()));
                    }
                }
            }
        }
        found
    }

    /// Kills what is left in a pod's cgroups (a pause nothing names any
    /// more, a process a container left behind), then removes them. For
    /// pods nothing owns; it waits for the killed to exit, off the loop.
    pub fn kill_and_remove_pod(&self, qos: QosClass, uid: &str) -> Result<(), CgroupError> {
        let path = self.pod_path(qos, uid);
        for mount in cgroup_mounts() {
            kill_tree(&mount.join(path.trim_start_matches('/')));
        }
        let mut tries = 0;
        loop {
            match self.remove_pod(qos, uid) {
                Ok(()) => return Ok(()),
                Err(e) if tries == 30 => return Err(e),
                Err(_) => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
    }
}

/// SIGKILL to every process in a cgroup tree.
fn kill_tree(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            kill_tree(&entry.path());
        }
    }
}

/// The pod cgroup's limits, as upstream's ResourceConfigForPod: weight
/// from the CPU requests, quota and memory only if every container has a
/// limit, and the node's podPidsLimit.
pub fn pod_limits(pod: &crate::pod::Pod, pids_max: Option<i64>) -> Limits {
    // The runtime class's overhead is added to the pod's requests and to
    // its limits where it has them, as upstream's kubelet sizes pods.
    // Pod-level resources, where set, stand for the containers' together.
    let (overhead_cpu, _) = pod.overhead;
    let (cpu_request, _) = crate::agent::admission::requests(pod);
    let pod_level = pod.pod_resources.as_ref();
    let cpu_limit = pod_level
        .and_then(|r| r.cpu_limit_milli)
        .or_else(|| pod.pod_limit(|c| c.resources.cpu_limit_milli));
    let memory_limit = pod_level
        .and_then(|r| r.memory_limit)
        .or_else(|| pod.pod_limit(|c| c.resources.memory_limit));
    Limits {
        cpu_shares: cpu_shares(Some(cpu_request)),
        cpu_quota: cpu_limit.map(|l| cpu_quota(l.saturating_add(overhead_cpu))),
        memory_max: memory_limit.map(|l| l.saturating_add(pod.overhead.1)),
        pids_max,
    }
}

/// Whether the kernel's OOM killer killed a process of the container whose
/// cgroup is `cgroup_path`. Read at the exit, before the runtime removes the
/// cgroup.
pub fn oom_killed(cgroup_path: &str) -> bool {
    oom_kills(cgroup_path).is_some_and(|n| n > 0)
}

/// How many processes the kernel's OOM killer killed in the cgroup at
/// `cgroup_path` (and below it): `oom_kill` in `memory.events` (v2) or in
/// `memory.oom_control` (v1, kernel 4.13 and later).
pub fn oom_kills(cgroup_path: &str) -> Option<u64> {
    let relative = cgroup_path.trim_start_matches('/');
    let candidates = [
        Path::new("/sys/fs/cgroup")
            .join(relative)
            .join("memory.events"),
        Path::new("/sys/fs/cgroup/memory")
            .join(relative)
            .join("memory.oom_control"),
    ];
    candidates
        .iter()
        .find_map(|file| oom_kill_count(&fs::read_to_string(file).ok()?))
}

/// The `oom_kill` line of a `memory.events` or `memory.oom_control`.
fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
}

/// Mount points of cgroup hierarchies (v1 controllers and cgroup2).
fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let mount_point = left.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .collect()
}

/// A v1 cpuset cgroup starts with no CPUs and no memory nodes and takes no
/// process so: each level from the hierarchy's root down to `dir` gets its
/// parent's where it has none, as runc fills the ones it creates.
fn inherit_cpuset(mount: &Path, dir: &Path) -> Result<(), CgroupError> {
    let Ok(relative) = dir.strip_prefix(mount) else {
        return Ok(());
    };
    let mut parent = mount.to_owned();
    for part in relative.components() {
        let child = parent.join(part);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let Ok(own) = fs::read_to_string(child.join(file)) else {
                continue;
            };
            if !own.trim().is_empty() {
                continue;
            }
            let inherited = fs::read_to_string(parent.join(file)).unwrap_or_default();
            let path = child.join(file);
            fs::write(&path, inherited.trim()).map_err(|source| CgroupError { path, source })?;
        }
        parent = child;
    }
    Ok(())
}

/// rmdir of a cgroup tree, deepest first (cgroup dirs hold only virtual
/// files, which rmdir removes with the directory).
fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError {
                path: dir.to_owned(),
                source,
            });
        }
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CgroupError {
            path: dir.to_owned(),
            source,
        }),
    }
}

/// The node's online CPUs.
pub fn cpu_capacity() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u64
}

/// Total memory of the node, for Burstable oom_score_adj.
pub fn memory_capacity() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_upstream_hierarchy() {
        let h = Hierarchy::new("/");
        assert_eq!(h.qos_path(QosClass::Burstable), "/kubepods/burstable");
        assert_eq!(h.pod_path(QosClass::Guaranteed, "u"), "/kubepods/podu");
        assert_eq!(
            h.pod_path(QosClass::BestEffort, "u"),
            "/kubepods/besteffort/podu"
        );
        let h = Hierarchy::new("/nanolet-test/");
        assert_eq!(
            h.container_path(QosClass::Burstable, "u", "c"),
            "/nanolet-test/kubepods/burstable/podu/c"
        );
    }

    #[test]
    fn a_runtime_class_overhead_sizes_the_pod_cgroup() {
        let pod = |limits: &str| {
            crate::pod::manifest::parse_one(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  overhead: {{cpu: 250m, memory: 120Mi}}\n  containers:\n  - name: c\n    image: i:1\n    resources: {{requests: {{cpu: 500m, memory: 64Mi}}{limits}}}\n"
            ))
        };
        let limited = pod_limits(&pod(", limits: {cpu: '1', memory: 128Mi}"), None);
        assert_eq!(limited.cpu_shares, cpu_shares(Some(750)));
        assert_eq!(limited.cpu_quota, Some(cpu_quota(1250)));
        assert_eq!(limited.memory_max, Some(248 << 20));
        let unlimited = pod_limits(&pod(""), None);
        assert_eq!(unlimited.cpu_shares, cpu_shares(Some(750)));
        assert_eq!((unlimited.cpu_quota, unlimited.memory_max), (None, None));
        assert_eq!(
            crate::agent::admission::requests(&pod("")),
            (750, (64 + 120) << 20)
        );
    }

    #[test]
    fn pod_level_resources_stand_for_the_containers() {
        let pod = crate::pod::manifest::parse_one(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  resources: {limits: {cpu: '2', memory: 1Gi}}\n  containers:\n  - {name: a, image: 'i:1', resources: {requests: {cpu: 100m}}}\n  - {name: b, image: 'i:1'}\n",
        );
        assert_eq!(pod.qos, QosClass::Guaranteed);
        let limits = pod_limits(&pod, None);
        assert_eq!(limits.cpu_shares, cpu_shares(Some(2000)));
        assert_eq!(limits.cpu_quota, Some(cpu_quota(2000)));
        assert_eq!(limits.memory_max, Some(1 << 30));
        assert_eq!(crate::agent::admission::requests(&pod), (2000, 1 << 30));
        let burstable = crate::pod::manifest::parse_one(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  resources: {requests: {memory: 64Mi}}\n  containers:\n  - {name: a, image: 'i:1', resources: {limits: {cpu: 100m, memory: 64Mi}}}\n",
        );
        assert_eq!(burstable.qos, QosClass::Burstable);
        // No pod-level limit: the containers' still bound the pod.
        assert_eq!(pod_limits(&burstable, None).memory_max, Some(64 << 20));
    }

    #[test]
    fn oom_kills_from_either_version() {
        let events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(events), Some(1));
        let oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(oom_kill_count(oom_control), Some(2));
        assert_eq!(oom_kill_count("oom_group_kill 4\n"), None);
        assert_eq!(oom_kills("/nanolet-no-such-cgroup"), None);
    }
}
