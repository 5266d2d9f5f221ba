//! What a pod takes on disk, measured as upstream's `du`: each container's
//! writable layer (the overlay's upper dir) and log dir, each volume dir,
//! and the sum of those on the node's disk, which is the pod's ephemeral
//! storage. The Summary API reports it; eviction ranks pods by it. Walks
//! the trees: off the event loop, on request.

use std::path::{Path, PathBuf};

use super::PodStats;
use crate::runtime::disk_usage::{DirUsage, dir_usage};
use crate::state::Layout;

/// One measured tree.
#[derive(Debug, Clone)]
pub struct Measured {
    pub path: PathBuf,
    pub used: DirUsage,
}

/// In the order of the pod's containers.
#[derive(Debug, Clone, Default)]
pub struct ContainerDisk {
    pub rootfs: Option<Measured>,
    pub logs: Option<Measured>,
}

#[derive(Debug, Clone, Default)]
pub struct PodDisk {
    pub containers: Vec<ContainerDisk>,
    /// By name, sorted.
    pub volumes: Vec<(String, Measured)>,
    pub ephemeral: DirUsage,
}

/// The device `path` is on.
pub fn device(path: &Path) -> Option<u64> {
    std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(path).ok()?).into()
}

fn measure(path: PathBuf) -> Option<Measured> {
    let used = dir_usage(&path).ok()?;
    Some(Measured { path, used })
}

fn add(total: &mut DirUsage, more: DirUsage) {
    total.bytes += more.bytes;
    total.inodes += more.inodes;
}

/// `pod`'s disk; its logs are under `<pod_logs_dir>/<ns>_<name>_<uid>`,
/// and `node_device` is the node's disk (the state dir's), which a memory
/// emptyDir, a tmpfs of its own, is not on.
pub fn pod_disk(
    layout: &Layout,
    pod_logs_dir: &Path,
    node_device: Option<u64>,
    pod: &PodStats,
) -> PodDisk {
    let pod_dir = layout.pod(&pod.uid);
    let log_dir = pod_logs_dir.join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid));
    let mut disk = PodDisk::default();
    for c in &pod.containers {
        let upper = crate::runtime::Bundle::new(&pod_dir, &c.id)
            .dir
            .join("upper");
        let container = ContainerDisk {
            rootfs: measure(upper),
            logs: measure(log_dir.join(&c.name)),
        };
        for m in [&container.rootfs, &container.logs].into_iter().flatten() {
            add(&mut disk.ephemeral, m.used);
        }
        disk.containers.push(container);
    }
    if let Ok(entries) = std::fs::read_dir(pod_dir.join("volumes")) {
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            // The agent's records of what it wrote into its volumes
            // (`.<name>.written`): volume names never start with a dot.
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Some(m) = measure(entry.path()) else {
                continue;
            };
            if node_device.is_some() && device(&m.path) == node_device {
                add(&mut disk.ephemeral, m.used);
            }
            disk.volumes
                .push((entry.file_name().to_string_lossy().into_owned(), m));
        }
    }
    disk
}
