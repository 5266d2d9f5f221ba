//! Pod status in the Kubernetes shape (`PodStatus`), computed from what the
//! pod worker knows of each container, and the one-line summary `kubectl get
//! pods` prints of it.

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use super::{Container, ContainerRole, Pod, RecursiveReadOnly, RestartPolicy};

/// How a container instance ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// Completed, Error or OOMKilled.
    pub reason: String,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    pub container_id: String,
    /// From terminationMessagePath (or the log's tail on error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Why a container has no running instance, as upstream's kubelet names
/// it (`state.waiting.reason`). Saved with the container's record by name;
/// a name this agent does not know (written by a newer one) reads as
/// ContainerCreating, which the next pass replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "&'static str")]
pub enum WaitingReason {
    ContainerCreating,
    PodInitializing,
    CrashLoopBackOff,
    ErrImagePull,
    ImagePullBackOff,
    InvalidImageName,
    ErrImageNeverPull,
    CreateContainerConfigError,
    CreateContainerError,
    CreatePodSandboxError,
}

impl WaitingReason {
    const ALL: [WaitingReason; 10] = [
        WaitingReason::ContainerCreating,
        WaitingReason::PodInitializing,
        WaitingReason::CrashLoopBackOff,
        WaitingReason::ErrImagePull,
        WaitingReason::ImagePullBackOff,
        WaitingReason::InvalidImageName,
        WaitingReason::ErrImageNeverPull,
        WaitingReason::CreateContainerConfigError,
        WaitingReason::CreateContainerError,
        WaitingReason::CreatePodSandboxError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitingReason::ContainerCreating => "ContainerCreating",
            WaitingReason::PodInitializing => "PodInitializing",
            WaitingReason::CrashLoopBackOff => "CrashLoopBackOff",
            WaitingReason::ErrImagePull => "ErrImagePull",
            WaitingReason::ImagePullBackOff => "ImagePullBackOff",
            WaitingReason::InvalidImageName => "InvalidImageName",
            WaitingReason::ErrImageNeverPull => "ErrImageNeverPull",
            WaitingReason::CreateContainerConfigError => "CreateContainerConfigError",
            WaitingReason::CreateContainerError => "CreateContainerError",
            WaitingReason::CreatePodSandboxError => "CreatePodSandboxError",
        }
    }
}

impl From<String> for WaitingReason {
    fn from(name: String) -> Self {
        WaitingReason::ALL
            .into_iter()
            .find(|r| r.as_str() == name)
            .unwrap_or(WaitingReason::ContainerCreating)
    }
}

impl From<WaitingReason> for &'static str {
    fn from(reason: WaitingReason) -> Self {
        reason.as_str()
    }
}

impl std::fmt::Display for WaitingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity a container's first process started with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessUser {
    pub uid: u32,
    pub gid: u32,
    pub supplemental_groups: Vec<u32>,
}

/// What the worker knows of one container of the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    pub image_id: String,
    pub container_id: Option<String>,
    pub restart_count: u32,
    /// Set while the current instance runs.
    pub running_since: Option<Timestamp>,
    /// Set once the current instance has exited.
    pub terminated: Option<Terminated>,
    /// The instance before the current one.
    pub last_terminated: Option<Terminated>,
    /// Why no instance runs, and the message.
    pub waiting: Option<(WaitingReason, String)>,
    /// Who its process started as (uid, gid, every group), for
    /// `containerStatuses[].user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<ProcessUser>,
    /// Its read-only mounts that asked for `recursiveReadOnly: IfPossible`
    /// got it: the node could when the instance was made.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recursive_read_only: bool,
    /// What its probes say of the running instance; `None` without probes
    /// (running means ready and started). Never saved: probes start over.
    #[serde(skip)]
    pub probed_ready: Option<bool>,
    #[serde(skip)]
    pub probed_started: Option<bool>,
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

fn terminated_state(t: &Terminated, runtime: &str) -> core::ContainerStateTerminated {
    core::ContainerStateTerminated {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(t.reason.clone()),
        started_at: t.started_at.map(time),
        finished_at: Some(time(t.finished_at)),
        container_id: Some(format!("{runtime}://{}", t.container_id)),
        message: t.message.clone(),
    }
}

/// `containerStatuses[].volumeMounts`: the container's mounts, with
/// whether a read-only one is recursively read-only (upstream resolves
/// `IfPossible` to what the runtime did).
fn mount_statuses(c: &Container, rro_supported: bool) -> Vec<core::VolumeMountStatus> {
    c.mounts
        .iter()
        .map(|m| {
            let recursive = match m.recursive_read_only {
                RecursiveReadOnly::Enabled => true,
                RecursiveReadOnly::IfPossible => rro_supported,
                RecursiveReadOnly::Disabled => false,
            };
            core::VolumeMountStatus {
                name: m.volume.clone(),
                mount_path: m.path.clone(),
                read_only: m.read_only.then_some(true),
                recursive_read_only: m
                    .read_only
                    .then(|| if recursive { "Enabled" } else { "Disabled" }.to_owned()),
                ..Default::default()
            }
        })
        .collect()
}

/// Where the pod is in its life, as far as its status shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Running,
    /// Being stopped: no container counts as ready.
    Terminating,
    /// Stopped for good (deleted): the phase is terminal whatever the
    /// restart policy, as upstream reports pods it has terminated.
    Stopped,
}

/// Whether an init container has done its part: an init container has
/// completed successfully, a sidecar runs and has started (its startup
/// probe, if any, passed).
pub fn init_done(role: ContainerRole, view: &ContainerView) -> bool {
    match role {
        ContainerRole::Sidecar => {
            view.running_since.is_some()
                && view.terminated.is_none()
                && view.probed_started != Some(false)
        }
        _ => view.terminated.as_ref().is_some_and(|t| t.exit_code == 0),
    }
}

/// Once a regular container has been created the pod stays initialized,
/// whatever its init containers do later (upstream's
/// isPreviouslyInitialized): a restarting sidecar, or probes that start over
/// after an agent restart, do not send the pod back to Pending.
pub fn previously_initialized(pod: &Pod, views: &[ContainerView]) -> bool {
    views
        .iter()
        .skip(pod.init_containers.len())
        .any(|v| v.container_id.is_some())
}

/// An evicted pod as upstream reports it: Failed, reason Evicted, and the
/// DisruptionTarget condition saying the kubelet ended it.
/// A pod the kubelet ended: Failed with the reason, and for an eviction
/// the DisruptionTarget condition upstream adds.
pub fn mark_ended(status: &mut core::PodStatus, reason: &str, message: &str) {
    status.phase = Some("Failed".into());
    status.reason = Some(reason.to_owned());
    status.message = Some(message.to_owned());
    if reason != "Evicted" {
        return;
    }
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if !conditions.iter().any(|c| c.type_ == "DisruptionTarget") {
        conditions.push(core::PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(message.to_owned()),
            last_transition_time: Some(time(Timestamp::now())),
            ..Default::default()
        });
    }
}

/// Where a pod's in-place resize is: waiting for room (`Infeasible` or
/// `Deferred`, and why), or failed to be actuated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResizeState {
    pub pending: Option<(String, String)>,
    pub error: Option<String>,
}

/// Upstream's resize conditions: PodResizePending while the node cannot
/// take the new resources, PodResizeInProgress (reason Error) while
/// writing them failed.
pub fn add_resize_conditions(status: &mut core::PodStatus, resize: &ResizeState) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some((reason, message)) = &resize.pending {
        conditions.push(core::PodCondition {
            type_: "PodResizePending".into(),
            status: "True".into(),
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            ..Default::default()
        });
    }
    if let Some(message) = &resize.error {
        conditions.push(core::PodCondition {
            type_: "PodResizeInProgress".into(),
            status: "True".into(),
            reason: Some("Error".into()),
            message: Some(message.clone()),
            ..Default::default()
        });
    }
}

/// A container's CPU and memory as the API writes them: requests and
/// limits, as upstream reports what is allocated and applied.
fn resource_lists(
    r: &super::Resources,
) -> (
    std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) {
    use crate::quantity::{format_bytes, format_millicpu};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let list = |cpu: Option<u64>, memory: Option<u64>| {
        let mut list = std::collections::BTreeMap::new();
        if let Some(cpu) = cpu {
            list.insert("cpu".to_owned(), Quantity(format_millicpu(cpu)));
        }
        if let Some(memory) = memory {
            list.insert("memory".to_owned(), Quantity(format_bytes(memory)));
        }
        list
    };
    (
        list(r.cpu_request_milli, r.memory_request),
        list(r.cpu_limit_milli, r.memory_limit),
    )
}

/// The statuses of every container of a pod: regular, init, ephemeral.
pub fn every_container_status(
    status: &core::PodStatus,
) -> impl Iterator<Item = &core::ContainerStatus> {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .chain(status.ephemeral_container_statuses.iter().flatten())
}

/// An init container that failed and will not run again: the pod failed.
fn init_failed(pod: &Pod, role: ContainerRole, view: &ContainerView) -> bool {
    role == ContainerRole::Init
        && pod.restart_policy == RestartPolicy::Never
        && view.terminated.as_ref().is_some_and(|t| t.exit_code != 0)
}

/// The status of `pod` from its containers' views, in
/// [`Pod::container`]'s numbering.
pub fn pod_status(
    pod: &Pod,
    views: &[ContainerView],
    runtime: &str,
    start_time: Timestamp,
    pod_ips: &[String],
    lifecycle: Lifecycle,
) -> core::PodStatus {
    let terminating = lifecycle != Lifecycle::Running;
    let mut statuses: Vec<core::ContainerStatus> = views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let state = if let Some(since) = v.running_since.filter(|_| v.terminated.is_none()) {
                core::ContainerState {
                    running: Some(core::ContainerStateRunning {
                        started_at: Some(time(since)),
                    }),
                    ..Default::default()
                }
            } else if let Some((reason, message)) = &v.waiting {
                core::ContainerState {
                    waiting: Some(core::ContainerStateWaiting {
                        reason: Some(reason.to_string()),
                        message: (!message.is_empty()).then(|| message.clone()),
                    }),
                    ..Default::default()
                }
            } else if let Some(t) = &v.terminated {
                core::ContainerState {
                    terminated: Some(terminated_state(t, runtime)),
                    ..Default::default()
                }
            } else {
                core::ContainerState {
                    waiting: Some(core::ContainerStateWaiting {
                        reason: Some("ContainerCreating".into()),
                        message: None,
                    }),
                    ..Default::default()
                }
            };
            let running = state.running.is_some();
            let spec = pod.every_container().nth(i);
            // What is allocated to it, and applied while it runs (an
            // in-place resize changes both).
            let (requests, limits) = spec
                .map(|c| resource_lists(&c.resources))
                .unwrap_or_default();
            let allocated = (!requests.is_empty()).then(|| requests.clone());
            let applied = (running && !(requests.is_empty() && limits.is_empty())).then(|| {
                core::ResourceRequirements {
                    requests: (!requests.is_empty()).then_some(requests),
                    limits: (!limits.is_empty()).then_some(limits),
                    ..Default::default()
                }
            });
            core::ContainerStatus {
                user: v.user.as_ref().map(|u| core::ContainerUser {
                    linux: Some(core::LinuxContainerUser {
                        uid: u.uid.into(),
                        gid: u.gid.into(),
                        supplemental_groups: Some(
                            u.supplemental_groups.iter().map(|&g| g.into()).collect(),
                        ),
                    }),
                }),
                allocated_resources: allocated,
                resources: applied,
                stop_signal: spec.and_then(|c| c.stop_signal.clone()),
                volume_mounts: spec
                    .filter(|_| v.container_id.is_some())
                    .map(|c| mount_statuses(c, v.recursive_read_only)),
                name: v.name.clone(),
                image: v.image.clone(),
                image_id: v.image_id.clone(),
                container_id: v
                    .container_id
                    .as_ref()
                    .map(|id| format!("{runtime}://{id}")),
                restart_count: v.restart_count as i32,
                ready: running && !terminating && v.probed_ready.unwrap_or(true),
                started: Some(running && v.probed_started.unwrap_or(true)),
                last_state: v.last_terminated.as_ref().map(|t| core::ContainerState {
                    terminated: Some(terminated_state(t, runtime)),
                    ..Default::default()
                }),
                state: Some(state),
                ..Default::default()
            }
        })
        .collect();
    // Ephemeral containers are never ready and count in nothing else.
    let regular_end = (pod.init_containers.len() + pod.containers.len()).min(statuses.len());
    let mut ephemeral_statuses = statuses.split_off(regular_end);
    for status in &mut ephemeral_statuses {
        status.ready = false;
    }
    let n_init = pod.init_containers.len().min(statuses.len());
    let statuses_of_init: Vec<core::ContainerStatus> = statuses.drain(..n_init).collect();
    let mut init_statuses = statuses_of_init;
    let mut initialized = true;
    let previously = previously_initialized(pod, views);
    let mut failed_init = false;
    for (i, (status, view)) in init_statuses.iter_mut().zip(views).enumerate() {
        let role = pod.init_containers[i].role;
        if role == ContainerRole::Init {
            // Upstream: ready once completed successfully.
            status.ready = view.terminated.as_ref().is_some_and(|t| t.exit_code == 0);
        }
        failed_init |= init_failed(pod, role, view) && !previously;
        initialized &= init_done(role, view);
    }
    initialized |= previously;
    let sidecars_ready = init_statuses
        .iter()
        .zip(&pod.init_containers)
        .filter(|(_, c)| c.role == ContainerRole::Sidecar)
        .all(|(s, _)| s.ready);

    let stopped_for_good = lifecycle == Lifecycle::Stopped;
    let phase = if failed_init {
        "Failed"
    } else if !initialized && !stopped_for_good {
        "Pending"
    } else {
        phase(pod.restart_policy, &statuses, stopped_for_good)
    };
    let all_ready =
        !statuses.is_empty() && statuses.iter().all(|s| s.ready) && sidecars_ready && initialized;
    let condition = |type_: &str, ok: bool, reason: Option<&str>| core::PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.map(Into::into),
        ..Default::default()
    };
    let not_ready = (!all_ready).then_some(if phase == "Succeeded" || phase == "Failed" {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    });
    let gates_unmet = readiness_gates_unmet(pod);
    let ready = match (&gates_unmet, all_ready) {
        (Some(message), true) => core::PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("ReadinessGatesNotReady".into()),
            message: Some(message.clone()),
            ..Default::default()
        },
        _ => condition("Ready", all_ready, not_ready),
    };
    core::PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![
            condition("PodReadyToStartContainers", true, None),
            condition(
                "Initialized",
                initialized,
                (!initialized).then_some("ContainersNotInitialized"),
            ),
            ready,
            condition("ContainersReady", all_ready, not_ready),
            condition("PodScheduled", true, None),
        ]),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty())
            .then_some(ephemeral_statuses),
        start_time: Some(time(start_time)),
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty()).then(|| {
            pod_ips
                .iter()
                .map(|ip| core::PodIP { ip: ip.clone() })
                .collect()
        }),
        qos_class: Some(pod.qos.as_str().into()),
        ..Default::default()
    }
}

/// The conditions a pod's readiness gates name, as the API server last
/// showed them (others set them): Ready waits for all to be True.
pub fn readiness_gate_conditions(pod: &Pod) -> Vec<(String, Option<String>)> {
    let gates = pod
        .manifest
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default();
    let conditions = pod
        .manifest
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    gates
        .iter()
        .map(|gate| {
            let status = conditions
                .iter()
                .find(|c| c.type_ == gate.condition_type)
                .map(|c| c.status.clone());
            (gate.condition_type.clone(), status)
        })
        .collect()
}

/// Why the readiness gates keep the pod from Ready, in upstream's words.
fn readiness_gates_unmet(pod: &Pod) -> Option<String> {
    let unmet: Vec<String> = readiness_gate_conditions(pod)
        .into_iter()
        .filter_map(|(gate, status)| match status.as_deref() {
            Some("True") => None,
            Some(other) => Some(format!(
                "the status of pod readiness gate {gate:?} is not \"True\", but {other}"
            )),
            None => Some(format!(
                "corresponding condition of pod readiness gate {gate:?} does not exist."
            )),
        })
        .collect();
    (!unmet.is_empty()).then(|| unmet.join(", "))
}

/// Conditions keep their lastTransitionTime while their status stays; a
/// changed or new one gets the current time.
pub fn carry_transition_times(previous: Option<&core::PodStatus>, status: &mut core::PodStatus) {
    let now = Timestamp::now();
    let old = previous
        .and_then(|p| p.conditions.as_deref())
        .unwrap_or_default();
    for condition in status.conditions.iter_mut().flatten() {
        condition.last_transition_time = old
            .iter()
            .find(|o| o.type_ == condition.type_ && o.status == condition.status)
            .and_then(|o| o.last_transition_time.clone())
            .or(Some(time(now)));
    }
}

/// The pod phase by upstream's rules (`getPhase`): a container that waits
/// after having run counts as stopped, not pending.
fn phase(
    policy: RestartPolicy,
    statuses: &[core::ContainerStatus],
    stopped_for_good: bool,
) -> &'static str {
    let (mut pending, mut running, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in statuses {
        let state = s.state.as_ref();
        if state.and_then(|s| s.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if let Some(last) = s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
            stopped += 1;
            if last.exit_code == 0 {
                succeeded += 1;
            }
        } else {
            pending += 1;
        }
    }
    if stopped_for_good {
        // Containers that never ran count as failed: the pod is over.
        return if succeeded == statuses.len() {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if pending > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped == statuses.len() {
        return match policy {
            RestartPolicy::Always => "Running",
            RestartPolicy::OnFailure if succeeded == stopped => "Succeeded",
            RestartPolicy::OnFailure => "Running",
            RestartPolicy::Never if succeeded == stopped => "Succeeded",
            RestartPolicy::Never => "Failed",
        };
    }
    "Pending"
}

/// READY, STATUS and RESTARTS as `kubectl get pods` prints them, for a pod
/// of `containers` containers (its spec's count: statuses may be missing).
pub fn summary(
    status: &core::PodStatus,
    terminating: bool,
    containers: usize,
) -> (String, String, u32) {
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let mut reason = status
        .reason
        .clone()
        .or_else(|| status.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let mut ready = 0;
    let mut restarts = 0;
    let mut has_running = false;
    // As upstream's printer: the first init container that is not done
    // names the status.
    let init = status
        .init_container_statuses
        .as_deref()
        .unwrap_or_default();
    let mut initializing = false;
    for (i, s) in init.iter().enumerate() {
        restarts += s.restart_count.max(0) as u32;
        if initializing {
            continue;
        }
        let state = s.state.as_ref();
        let terminated = state.and_then(|st| st.terminated.as_ref());
        let waiting = state
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.reason.clone())
            .filter(|r| !r.is_empty() && r != "PodInitializing");
        // A running init container behind which others have started is a
        // sidecar (a plain one holds back all that follow it).
        let later_started = init[i + 1..]
            .iter()
            .chain(statuses)
            .any(|l| l.container_id.is_some());
        let running = state.and_then(|st| st.running.as_ref()).is_some();
        if terminated.is_some_and(|t| t.exit_code == 0) || (running && later_started) {
            continue;
        }
        initializing = true;
        reason = match (terminated, waiting) {
            (Some(t), _) => match (&t.reason, t.signal) {
                (Some(r), _) if !r.is_empty() => format!("Init:{r}"),
                (_, Some(sig)) if sig != 0 => format!("Init:Signal:{sig}"),
                _ => format!("Init:ExitCode:{}", t.exit_code),
            },
            (None, Some(w)) => format!("Init:{w}"),
            (None, None) => format!("Init:{i}/{}", init.len()),
        };
    }
    for s in statuses.iter().rev().filter(|_| !initializing) {
        restarts += s.restart_count.max(0) as u32;
        let state = s.state.as_ref();
        if let Some(w) = state
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.reason.clone())
        {
            reason = w;
        } else if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
            reason = match (&t.reason, t.signal) {
                (Some(r), _) if !r.is_empty() => r.clone(),
                (_, Some(sig)) if sig != 0 => format!("Signal:{sig}"),
                _ => format!("ExitCode:{}", t.exit_code),
            };
        } else if state.and_then(|st| st.running.as_ref()).is_some() {
            has_running = true;
            if s.ready {
                ready += 1;
            }
        }
    }
    if initializing {
        restarts += statuses
            .iter()
            .map(|s| s.restart_count.max(0) as u32)
            .sum::<u32>();
    }
    if reason == "Completed" && has_running {
        reason = "Running".into();
    }
    if terminating {
        reason = "Terminating".into();
    }
    (format!("{ready}/{containers}"), reason, restarts)
}

#[cfg(test)]
mod tests;
