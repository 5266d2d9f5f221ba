//! The fields of the OCI runtime spec nanolet writes, as serde types.

use std::path::PathBuf;

use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub oci_version: &'static str,
    pub process: Process,
    pub root: Root,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub mounts: Vec<Mount>,
    pub linux: Linux,
    /// What device plugins asked to be passed to the runtime.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// OCI hooks by name (CDI devices' only).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub hooks: std::collections::BTreeMap<&'static str, Vec<serde_json::Value>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    pub terminal: bool,
    pub user: User,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub capabilities: Capabilities,
    pub rlimits: Vec<Rlimit>,
    pub no_new_privileges: bool,
    pub oom_score_adj: i32,
    /// The AppArmor profile the runtime puts the process under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apparmor_profile: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

#[derive(Debug, Serialize)]
pub struct Capabilities {
    pub bounding: Vec<String>,
    pub effective: Vec<String>,
    pub permitted: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Rlimit {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub hard: u64,
    pub soft: u64,
}

#[derive(Debug, Serialize)]
pub struct Root {
    pub path: PathBuf,
    pub readonly: bool,
}

#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct Mount {
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Linux {
    pub namespaces: Vec<Namespace>,
    pub resources: Resources,
    pub cgroups_path: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uid_mappings: Vec<IdMapping>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gid_mappings: Vec<IdMapping>,
    pub masked_paths: Vec<&'static str>,
    pub readonly_paths: Vec<&'static str>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sysctl: std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<serde_json::Value>,
    /// Device nodes created in the container's /dev (privileged: the host's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<serde_json::Value>,
}

/// A range of a user namespace's IDs, as the OCI spec names it.
#[derive(Debug, Serialize, PartialEq, Eq, Clone, Copy)]
pub struct IdMapping {
    #[serde(rename = "containerID")]
    pub container_id: u32,
    #[serde(rename = "hostID")]
    pub host_id: u32,
    pub size: u32,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Namespace {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

#[derive(Debug, Serialize, Default)]
pub struct Resources {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// The devices the container may use: every one when privileged,
    /// else none but its device plugins' and the runtime's defaults.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<serde_json::Value>,
    /// cgroup v2 files written as given (cpu.weight by upstream's formula).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub unified: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Default, PartialEq, Eq)]
pub struct Cpu {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shares: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<u64>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Memory {
    pub limit: i64,
}
