//! Turning pods into running processes: the sandbox, container bundles
//! (rootfs + OCI spec), the OCI runtime driver and the pod monitor.

pub mod monitor_client;
pub mod protocol;
pub mod runc;
pub mod sandbox;
pub mod spec;

use std::fs;
use std::path::{Path, PathBuf};

use self::runc::{Runtime, RuntimeError};
use crate::mount::{self, MountError};

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
    pub fn mount_rootfs(&self, layers: &[PathBuf]) -> Result<PathBuf, BundleError> {
        let (upper, work, rootfs) = (self.dir.join("upper"), self.dir.join("work"), self.rootfs());
        for dir in [&upper, &work, &rootfs] {
            fs::create_dir_all(dir).map_err(|source| BundleError::Io {
                path: dir.clone(),
                source,
            })?;
        }
        if !mount::is_mounted(&rootfs) {
            mount::overlay(layers, &upper, &work, &rootfs)?;
        }
        Ok(rootfs)
    }

    pub fn write_spec(&self, spec: &spec::Spec) -> Result<(), BundleError> {
        let path = self.dir.join("config.json");
        Ok(crate::state::write_json(&path, spec, 0o600, crate::state::Durability::ProcessCrash)?)
    }

    /// Removes the container from the runtime and its bundle from disk.
    /// Idempotent.
    pub async fn remove(&self, runtime: &Runtime, container_id: &str) -> Result<(), BundleError> {
        runtime.delete(container_id).await?;
        mount::unmount(&self.rootfs())?;
        let dir = self.dir.clone();
        Ok(smol::unblock(move || crate::state::remove_tree(&dir)).await?)
    }
}
