//! What the agent keeps on disk per pod, under `pods/<uid>/`:
//!
//! - `pod.json`: the checkpoint: the pod as admitted and where it came from,
//!   so that it can be adopted (or cleaned up) after a restart or a reboot;
//! - `containers.json`: each container's current instance, restart count and
//!   last termination, so that restarts count on and exits are not lost;
//! - `status.json`: the pod's status, for `nanolet pods` and `nanolet logs`;
//! - `objects.json`: the ConfigMaps, Secrets and tokens the pod reads, so it
//!   can start after a reboot without the API server (mode 0600: the only
//!   place Secrets are kept on persistent storage).

use std::path::{Path, PathBuf};

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use serde::{Deserialize, Serialize};

use crate::pod::objects::PodObjects;
use crate::pod::status::ContainerView;
use crate::state::{self, Durability, StateError};

pub const POD_FILE: &str = "pod.json";
pub const CONTAINERS_FILE: &str = "containers.json";
pub const STATUS_FILE: &str = "status.json";
pub const OBJECTS_FILE: &str = "objects.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub uid: String,
    pub source: String,
    pub admitted: Timestamp,
    pub manifest: core::Pod,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    pub view: ContainerView,
    /// The stop signal of the current instance: the container's
    /// stopSignal, else the image's STOPSIGNAL.
    #[serde(default)]
    pub stop_signal: Option<String>,
    /// Its last instance ran in a sandbox since recreated (a reboot): the
    /// pod starts over from its first init container, as upstream's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_old_sandbox: bool,
}

impl ContainerRecord {
    /// The signal that stops the instance, as the runtime's `kill` takes
    /// it: the container's stopSignal or the image's STOPSIGNAL, else TERM.
    pub fn stop_signal(&self) -> String {
        crate::pod::signal::for_runtime(self.stop_signal.as_deref().unwrap_or("TERM"))
    }
}

/// The pod as `nanolet pods` and `nanolet logs` see it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub source: String,
    pub admitted: Timestamp,
    pub terminating: bool,
    /// `<podLogsDir>/<ns>_<name>_<uid>`.
    pub log_dir: PathBuf,
    pub status: core::PodStatus,
}

/// The images (normalised references) of every pod with a checkpoint under
/// `pods_dir`: what image GC must keep, also for pods that do not run now
/// and may have to start again without a registry.
pub fn images_in_use(pods_dir: &Path) -> std::collections::HashSet<String> {
    let mut images = std::collections::HashSet::new();
    let Ok(entries) = std::fs::read_dir(pods_dir) else {
        return images;
    };
    for entry in entries.flatten() {
        let Ok(Some(checkpoint)) = read_checkpoint(&entry.path()) else {
            continue;
        };
        let Some(spec) = checkpoint.manifest.spec else {
            continue;
        };
        let names = spec
            .containers
            .iter()
            .map(|c| c.image.as_deref())
            .chain(
                spec.init_containers
                    .iter()
                    .flatten()
                    .map(|c| c.image.as_deref()),
            )
            .chain(
                spec.ephemeral_containers
                    .iter()
                    .flatten()
                    .map(|c| c.image.as_deref()),
            );
        images.extend(
            names
                .flatten()
                .filter_map(crate::image::ImageService::normalise),
        );
    }
    images
}

pub fn read_checkpoint(pod_dir: &Path) -> Result<Option<Checkpoint>, StateError> {
    state::read_json(&pod_dir.join(POD_FILE))
}

pub fn write_checkpoint(pod_dir: &Path, checkpoint: &Checkpoint) -> Result<(), StateError> {
    state::write_json(
        &pod_dir.join(POD_FILE),
        checkpoint,
        0o600,
        Durability::PowerLoss,
    )
}

pub fn read_containers(pod_dir: &Path) -> Result<Option<Vec<ContainerRecord>>, StateError> {
    state::read_json(&pod_dir.join(CONTAINERS_FILE))
}

pub fn write_containers(pod_dir: &Path, records: &[ContainerRecord]) -> Result<(), StateError> {
    state::write_json(
        &pod_dir.join(CONTAINERS_FILE),
        &records,
        0o600,
        Durability::ProcessCrash,
    )
}

pub fn read_objects(pod_dir: &Path) -> Result<Option<PodObjects>, StateError> {
    state::read_json(&pod_dir.join(OBJECTS_FILE))
}

pub fn write_objects(pod_dir: &Path, objects: &PodObjects) -> Result<(), StateError> {
    state::write_json(
        &pod_dir.join(OBJECTS_FILE),
        objects,
        0o600,
        Durability::PowerLoss,
    )
}

pub fn read_record(pod_dir: &Path) -> Result<Option<PodRecord>, StateError> {
    state::read_json(&pod_dir.join(STATUS_FILE))
}

pub fn write_record(pod_dir: &Path, record: &PodRecord) -> Result<(), StateError> {
    state::write_json(
        &pod_dir.join(STATUS_FILE),
        record,
        0o644,
        Durability::ProcessCrash,
    )
}

/// A manifest document that was not admitted, for `nanolet pods`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejected {
    pub file: String,
    pub index: usize,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub reason: String,
    pub since: Timestamp,
}
