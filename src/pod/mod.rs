//! The validated pod model: what nanolet will run, derived from a Kubernetes
//! Pod object. Validation refuses anything nanolet cannot run exactly as
//! written, naming the field, instead of running the pod differently.

pub mod backoff;
pub mod manifest;
pub mod status;
mod validate;

use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use serde::{Deserialize, Serialize};

pub use validate::{PodError, default_pull_policy, validate};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// A pod nanolet has admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Where the pod came from (a manifest file path).
    pub source: String,
    pub restart_policy: RestartPolicy,
    pub termination_grace: Duration,
    pub host_network: bool,
    pub host_pid: bool,
    pub host_ipc: bool,
    pub hostname: String,
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: bool,
    pub supplemental_groups: Vec<u32>,
    pub volumes: Vec<Volume>,
    pub containers: Vec<Container>,
    pub qos: QosClass,
    /// The object as admitted, for checkpoints and (later) the API server.
    pub manifest: core::Pod,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub pull_policy: PullPolicy,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: bool,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub resources: Resources,
    pub mounts: Vec<VolumeMount>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request_milli: Option<u64>,
    pub cpu_limit_milli: Option<u64>,
    pub memory_request: Option<u64>,
    pub memory_limit: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A directory under the pod's state dir, removed with the pod.
    EmptyDir,
    HostPath {
        path: String,
        kind: HostPathKind,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathKind {
    Unchecked,
    Directory,
    DirectoryOrCreate,
    File,
    FileOrCreate,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub source: VolumeSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub volume: String,
    pub path: String,
    pub read_only: bool,
}

impl Pod {
    /// `namespace/name`, as users name pods.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The log directory of this pod under podLogsDir.
    pub fn log_dir_name(&self) -> String {
        format!("{}_{}_{}", self.namespace, self.name, self.uid)
    }
}
