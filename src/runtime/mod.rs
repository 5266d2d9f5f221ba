//! Turning pods into running processes: the sandbox, container bundles
//! (rootfs + OCI spec), the OCI runtime driver and the pod monitor.

pub(crate) mod advisories;
pub(crate) mod apparmor;
pub mod attached_exec;
pub(crate) mod bundle_setup;
pub(crate) mod cni;
pub(crate) mod disk_usage;
pub mod monitor_client;
pub(crate) mod netns;
pub mod oom_score;
pub mod pause;
pub(crate) mod protocol;
pub mod runc;
pub(crate) mod sandbox;
pub(crate) mod seccomp;
pub(crate) mod spec;
pub(crate) mod sub_path;
pub mod userns;

use std::fs;
use std::path::{Path, PathBuf};

use self::runc::{Runtime, RuntimeError};
use self::userns::{PodUserNs, UsernsError};
use crate::mount::{self, MountError};

/// A capability set of the agent's own (`CapBnd`, `CapEff`, ...) from
/// /proc/self/status, bit n for capability n.
fn own_capabilities(set: &str) -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(set)?.strip_prefix(':'))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Starts this binary (`executable`) as one of its helpers (`pause`,
/// `userns`) and reads the first line it prints, by which it says it is
/// ready. The error says what failed.
async fn start_helper(
    executable: &Path,
    args: &[&std::ffi::OsStr],
    stdin: std::process::Stdio,
    stderr: std::process::Stdio,
) -> Result<(async_process::Child, String), String> {
    use futures_lite::{AsyncBufReadExt, io::BufReader};
    let mut child = async_process::Command::new(executable)
        .args(args)
        .stdin(stdin)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", executable.display()))?;
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok((child, line))
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error(transparent)]
    UserNamespace(#[from] UsernsError),
}

/// A container's bundle directory: `config.json`, the overlay's `upper`
/// and `work` dirs, and `rootfs`, where the overlay is mounted.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub dir: PathBuf,
}

impl Bundle {
    pub fn new(pod_dir: &Path, container_id: &str) -> Bundle {
        Bundle {
            dir: pod_dir.join("containers").join(container_id),
        }
    }

    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// Mounts the image's layers with a fresh writable layer as the rootfs.
    /// In a pod's own user namespace, the layers are seen through ID-mapped
    /// mounts and the writable layer is its root's, so that the rootfs is
    /// as the image has it, with the pod's root as root.
    pub fn mount_rootfs(
        &self,
        layers: &[PathBuf],
        user_ns: Option<&PodUserNs>,
    ) -> Result<PathBuf, BundleError> {
        let (upper, work, rootfs) = (self.dir.join("upper"), self.dir.join("work"), self.rootfs());
        let io_at = |path: &Path| {
            let path = path.to_owned();
            move |source| BundleError::Io { path, source }
        };
        for dir in [&upper, &work, &rootfs] {
            fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        if mount::is_mounted(&rootfs) {
            return Ok(rootfs);
        }
        match user_ns {
            None => mount::overlay(layers, &upper, &work, &rootfs)?,
            Some(user_ns) => {
                let mut lowers = Vec::with_capacity(layers.len());
                for layer in layers {
                    let name = layer.file_name().unwrap_or_default().to_string_lossy();
                    lowers.push(user_ns.mapped("layers", &name, layer)?);
                }
                let root = user_ns.range.host(0);
                std::os::unix::fs::chown(&upper, Some(root), Some(root)).map_err(io_at(&upper))?;
                for dir in [self.dir.parent().unwrap_or(&self.dir), &self.dir] {
                    userns::allow_traversal(dir)?;
                }
                mount::overlay(&lowers, &upper, &work, &rootfs)?;
            }
        }
        Ok(rootfs)
    }

    /// The host file behind the container's terminationMessagePath.
    pub fn termination_log(&self) -> PathBuf {
        self.dir.join("termination-log")
    }

    /// Where the subPath of the container's `index`th mount is pinned.
    pub fn sub_path_target(&self, index: usize) -> PathBuf {
        self.dir.join("subpaths").join(index.to_string())
    }

    pub fn write_spec(&self, spec: &spec::Spec) -> Result<(), BundleError> {
        let path = self.dir.join("config.json");
        Ok(crate::state::write_json(
            &path,
            spec,
            0o600,
            crate::state::Durability::ProcessCrash,
        )?)
    }

    /// Removes the container from the runtime and its bundle from disk.
    /// Idempotent.
    pub async fn remove(&self, runtime: &Runtime, container_id: &str) -> Result<(), BundleError> {
        runtime.delete(container_id).await?;
        // The rootfs and the pinned subPaths.
        for mounted in mount::mounts_under(&self.dir) {
            mount::unmount(&mounted)?;
        }
        let dir = self.dir.clone();
        Ok(crate::helpers::unblock(move || crate::state::remove_tree(&dir)).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two real layers with an OCI whiteout and an opaque directory, mounted
    /// as overlayfs the way a container's rootfs is (needs root).
    #[test]
    fn the_agents_own_capabilities_in_kernel_order() {
        // Bit n of a set is the nth of the names the pod spec allows.
        let bounding = own_capabilities("CapBnd").unwrap();
        let chown = crate::pod::CAPABILITIES.iter().position(|c| *c == "CHOWN");
        assert_eq!(chown, Some(0));
        assert_ne!(bounding & 1, 0, "tests run as root: {bounding:x}");
        assert_eq!(own_capabilities("NoSuchSet"), None);
    }

    #[test]
    fn rootfs_applies_whiteouts_and_opaque_dirs() {
        let dir = crate::state::TestDir::new("rootfs");
        let tar = |name: &str, entries: &[(&str, &[u8])]| {
            let mut builder = tar::Builder::new(Vec::new());
            for (path, data) in entries {
                let mut header = tar::Header::new_gnu();
                header.set_size(data.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                builder.append_data(&mut header, path, *data).unwrap();
            }
            let blob = dir.0.join(name);
            std::fs::write(&blob, builder.into_inner().unwrap()).unwrap();
            let layer = dir.0.join(format!("{name}.d"));
            crate::image::unpack::unpack(&blob, &layer, Default::default()).unwrap();
            layer
        };
        let lower = tar(
            "lower",
            &[
                ("etc/keep", b"k"),
                ("etc/gone", b"g"),
                ("data/old1", b"1"),
                ("data/old2", b"2"),
            ],
        );
        let upper = tar(
            "upper",
            &[
                ("etc/.wh.gone", b""),
                ("data/.wh..wh..opq", b""),
                ("data/new", b"n"),
            ],
        );
        let bundle = Bundle::new(&dir.0, "c1");
        let rootfs = bundle.mount_rootfs(&[lower, upper], None).unwrap();
        let listed = |p: &str| {
            let mut names: Vec<String> = std::fs::read_dir(rootfs.join(p))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let etc = listed("etc");
        let data = listed("data");
        // Writes go to the bundle's own upper dir, never to a layer.
        std::fs::write(rootfs.join("etc/keep"), b"changed").unwrap();
        let layer_file = std::fs::read(dir.0.join("lower.d/etc/keep")).unwrap();
        mount::unmount(&rootfs).unwrap();
        assert_eq!(etc, vec!["keep"]);
        assert_eq!(data, vec!["new"]);
        assert_eq!(layer_file, b"k");
        assert!(!mount::is_mounted(&rootfs));
    }
}
