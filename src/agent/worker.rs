//! The pod worker: one task per pod, serialising everything done to it
//! (syncing → terminating → terminated), as upstream's pod workers do. It is
//! level-triggered: each pass compares what should run with what runs and
//! takes the next steps; control messages, container exits and backoff
//! timers only wake it.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::FutureExt;
use jiff::Timestamp;
use smol::channel::{Receiver, Sender};

use super::Context;
use super::checkpoint::{self, Checkpoint, ContainerRecord, PodRecord};
use super::events::{EventType, Involved};
use super::objects::Kind;
use super::prober::{self, Outcome, ProbeTracker, Verdict};
use crate::image::ImageError;
use crate::pod::backoff::Backoff;
use crate::pod::env::{self, Downward};
use crate::pod::objects::{PodObjects, references, token_key};
use crate::pod::probe::ProbeKind;
use crate::pod::status::{self, ContainerView, Lifecycle, Terminated};
use crate::pod::volumes;
use crate::pod::{Container, ContainerRole, Pod, ProjectionSource, RestartPolicy, VolumeSource};
use crate::runtime::bundle_setup::{BundleSetup, SetupFailure};
use crate::runtime::monitor_client::{self, MonitorConnection, MonitorEvent};
use crate::runtime::protocol::Exit;
use crate::runtime::spec::PodPaths;
use crate::runtime::{Bundle, sandbox};
use k8s_openapi::api::core::v1 as core;

#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// Stop the pod's containers (grace period, then SIGKILL) and remove it.
    /// `grace` is the deletion's own grace period, if it set one.
    Terminate { grace: Option<Duration> },
    /// The pod changed in the API server (a container's image, labels,
    /// annotations): containers whose image changed are restarted with it.
    Update(Box<Pod>),
    /// The eviction manager ends the pod: stopped within `grace` (zero:
    /// killed at once), failed with reason Evicted.
    Evict { message: String, grace: Duration },
    /// An in-place resize the node cannot take now (reason `Infeasible`
    /// or `Deferred`, message), or no longer one waiting.
    ResizePending(Option<(String, String)>),
    /// The runtime's states of the pod's containers, from the relist.
    Relisted(Vec<crate::runtime::runc::State>),
}

/// Waits for a Terminate (or the agent gone: `None`), keeping every other
/// message in `deferred` for after the work it interrupts.
async fn until_terminate(
    control: &Receiver<Control>,
    deferred: &mut Vec<Control>,
) -> Option<Option<Control>> {
    loop {
        match control.recv().await {
            Ok(terminate @ Control::Terminate { .. }) => return Some(Some(terminate)),
            Ok(other) => deferred.push(other),
            Err(_) => return Some(None),
        }
    }
}

struct ContainerState {
    record: ContainerRecord,
    /// When the current instance ended (monotonic), for the restart backoff.
    exited_at: Option<Instant>,
    restart_backoff: Backoff,
    /// Pull or create failures before an instance ran.
    setup_backoff: Backoff,
    setup_failed_at: Option<Instant>,
    /// No backoff/retry before this instant.
    retry_at: Option<Instant>,
    /// Its spec changed: start it again whatever the restart policy.
    restart_for_update: bool,
    /// Stopping for an update: SIGKILL at this instant if still running.
    kill_at: Option<Instant>,
    /// The running instance's probes.
    probes: ProbeTracker,
}

/// Why a pod's sandbox could not be set up: a volume the way upstream's
/// volume manager reports it, or the sandbox itself.
enum SandboxFailure {
    Mount(String),
    Sandbox(String),
}

impl From<String> for SandboxFailure {
    fn from(message: String) -> Self {
        SandboxFailure::Sandbox(message)
    }
}

impl ContainerState {
    /// A container's state from its saved record, or a fresh one.
    fn of(c: &Container, saved: &[ContainerRecord]) -> ContainerState {
        ContainerState {
            record: saved
                .iter()
                .find(|r| r.view.name == c.name)
                .cloned()
                .unwrap_or_else(|| ContainerRecord {
                    view: ContainerView {
                        name: c.name.clone(),
                        image: c.image.clone(),
                        ..Default::default()
                    },
                    stop_signal: None,
                    from_old_sandbox: false,
                }),
            exited_at: None,
            restart_backoff: Backoff::default(),
            setup_backoff: Backoff::default(),
            setup_failed_at: None,
            retry_at: None,
            restart_for_update: false,
            kill_at: None,
            probes: ProbeTracker::default(),
        }
    }
}

pub struct Worker {
    ctx: Rc<Context>,
    pod: Pod,
    dir: PathBuf,
    admitted: Timestamp,
    containers: Vec<ContainerState>,
    paths: Option<PodPaths>,
    monitor: Option<MonitorConnection>,
    exits_tx: Sender<MonitorEvent>,
    exits_rx: Receiver<MonitorEvent>,
    control: Receiver<Control>,
    terminating: bool,
    /// Every container was stopped by termination.
    stopped: bool,
    /// The regular containers are done for good: sidecars are stopped and
    /// not restarted.
    completing: bool,
    /// A grace period shorter than the pod's, from its deletion.
    grace_override: Option<Duration>,
    /// The last status written, to skip unchanged writes.
    last_status: Option<k8s_openapi::api::core::v1::PodStatus>,
    sandbox_backoff: Backoff,
    /// The API objects its volumes and environment read.
    objects: PodObjects,
    /// When volumes were last written; they are refreshed every minute,
    /// and at once when an object they show changes.
    volumes_written: Option<Instant>,
    objects_changed: Receiver<()>,
    /// Probes run as tasks of their own (a slow one must not hold up the
    /// pod's other work) and report here.
    probe_results: (Sender<ProbeResult>, Receiver<ProbeResult>),
    /// Why the kubelet ended the pod (an eviction, its active deadline):
    /// it runs nothing more. Kept in its dir.
    evicted: Option<Ended>,
    /// When the disk emptyDirs with a sizeLimit are measured next.
    storage_check_at: Option<Instant>,
    /// A measurement runs as a task of its own (a large emptyDir takes a
    /// while to walk) and reports here: why the pod must go, if it must.
    storage_verdicts: (Sender<Option<String>>, Receiver<Option<String>>),
    storage_measuring: bool,
    /// The pod ran to its end and gave its sandbox back (see
    /// `release_sandbox`); its IPs stay in its status.
    sandbox_released: bool,
    /// Its start was counted (or it started under an earlier agent).
    start_observed: bool,
    /// Where its in-place resize is, for the pod's conditions.
    resize: status::ResizeState,
    /// An in-place resize that could not be written yet, tried again.
    resize_retry: Option<ResizeRetry>,
}

/// A resize left undone (memory in use above a lowered limit): the limits
/// the cgroups still have, which containers changed, and when to try again.
struct ResizeRetry {
    applied: Box<Pod>,
    resized: Vec<usize>,
    at: Instant,
}

/// How often a resize left undone is tried again.
const RESIZE_RETRY: Duration = Duration::from_secs(10);

/// How often emptyDir sizeLimits are checked: upstream's eviction interval.
const STORAGE_CHECK: Duration = Duration::from_secs(10);

/// Where an evicted pod's reason is kept, so that no restart of the agent
/// runs it again.
fn dir_evicted(pod_dir: &Path) -> PathBuf {
    pod_dir.join("evicted")
}

/// Why the kubelet ended a pod: upstream's reason and message.
#[derive(Debug, Clone, PartialEq)]
struct Ended {
    reason: String,
    message: String,
}

impl Ended {
    /// The marker's text: the message, after a `reason:` line unless the
    /// reason is Evicted (what markers written before held).
    fn to_text(&self) -> String {
        match self.reason.as_str() {
            "Evicted" => self.message.clone(),
            reason => format!("reason: {reason}\n{}", self.message),
        }
    }

    fn from_text(text: &str) -> Ended {
        match text
            .strip_prefix("reason: ")
            .and_then(|rest| rest.split_once('\n'))
        {
            Some((reason, message)) => Ended {
                reason: reason.to_owned(),
                message: message.to_owned(),
            },
            None => Ended {
                reason: "Evicted".into(),
                message: text.to_owned(),
            },
        }
    }
}

/// Upstream's message for a pod past its activeDeadlineSeconds.
const DEADLINE_EXCEEDED: &str = "Pod was active on the node longer than the specified deadline";

/// Makes a container instance's bundle on a helper thread. A deletion may
/// abandon the pass awaiting it; the bundle is then removed once made,
/// since no container record will ever name it.
async fn set_up_bundle(
    setup: BundleSetup,
    runtime: crate::runtime::runc::Runtime,
    id: String,
) -> Result<crate::runtime::spec::User, SetupFailure> {
    let (done, outcome) = smol::channel::bounded(1);
    let bundle = setup.bundle.clone();
    crate::rt::spawn(async move {
        let result = crate::helpers::unblock(move || setup.run()).await;
        if done.try_send(result).is_err()
            && let Err(e) = bundle.remove(&runtime, &id).await
        {
            log::warn!("abandoned container {id}: {e}");
        }
    })
    .detach();
    outcome.recv().await.unwrap_or_else(|_| {
        Err((
            "CreateContainerError",
            "the bundle's setup ended without an outcome".to_owned(),
        ))
    })
}

/// How often volumes fed by the API server are brought up to date (the
/// upstream kubelet resyncs pods every minute).
const VOLUME_REFRESH: Duration = Duration::from_secs(60);

/// A probe run's result, for the instance it ran against.
struct ProbeResult {
    container: usize,
    kind: ProbeKind,
    container_id: String,
    outcome: Outcome,
}

enum Wake {
    Control(Option<Control>),
    Exit(Exit),
    Probe(ProbeResult),
    Storage(Option<String>),
    MonitorLost,
    Timer,
    ObjectsChanged,
}

impl Worker {
    pub fn new(
        ctx: Rc<Context>,
        pod: Pod,
        admitted: Timestamp,
        control: Receiver<Control>,
    ) -> Worker {
        let dir = ctx.layout.pod(&pod.uid);
        let saved = checkpoint::read_containers(&dir)
            .ok()
            .flatten()
            .unwrap_or_default();
        let containers = pod
            .every_container()
            .map(|c| ContainerState::of(c, &saved))
            .collect();
        let (exits_tx, exits_rx) = smol::channel::unbounded();
        let evicted = std::fs::read_to_string(dir_evicted(&dir))
            .ok()
            .map(|text| Ended::from_text(&text));
        let objects = checkpoint::read_objects(&dir)
            .ok()
            .flatten()
            .unwrap_or_default();
        let (changed_tx, objects_changed) = smol::channel::bounded(1);
        if let Some(source) = &ctx.objects {
            source.subscribe(&pod.uid, changed_tx);
        }
        Worker {
            ctx,
            pod,
            dir,
            admitted,
            containers,
            paths: None,
            monitor: None,
            exits_tx,
            exits_rx,
            control,
            terminating: false,
            grace_override: None,
            stopped: false,
            sandbox_released: false,
            start_observed: false,
            completing: false,
            last_status: None,
            sandbox_backoff: Backoff::default(),
            objects,
            volumes_written: None,
            objects_changed,
            probe_results: smol::channel::unbounded(),
            evicted,
            storage_check_at: None,
            storage_verdicts: smol::channel::bounded(1),
            storage_measuring: false,
            resize: Default::default(),
            resize_retry: None,
        }
    }

    pub async fn run(mut self) {
        let name = self.pod.full_name();
        if let Err(e) = self.admit().await {
            log::error!("pod {name}: {e}");
        }
        self.adopt().await;
        if self.evicted.is_some() {
            self.kill_all_now().await;
        }
        loop {
            if self.terminating {
                self.terminate().await;
                if let Some(objects) = &self.ctx.objects {
                    objects.release(&self.pod.uid);
                }
                if let Some(events) = &self.ctx.events {
                    events.forget(&self.pod.uid);
                }
                crate::stats::own::forget_probes(&self.pod.uid);
                return;
            }
            // A pod deleted while it pulls a large image over a slow link
            // must not wait for the pull: the pass is abandoned. Nothing
            // else interrupts it: other messages wait for its end.
            let control = self.control.clone();
            let mut deferred = Vec::new();
            let terminate = until_terminate(&control, &mut deferred);
            let mut progressed = false;
            let interrupted = async {
                self.check_local_storage().await;
                progressed = self.sync().await;
                self.launch_probes();
                None
            }
            .or(terminate)
            .await;
            for control in deferred {
                self.on_control(Some(control)).await;
            }
            if let Some(control) = interrupted {
                self.on_control(control).await;
                continue;
            }
            self.write_status();
            if !self.sandbox_released && self.ran_to_its_end() {
                self.release_sandbox().await;
            }
            // An init container started: the next one may start now, not
            // at the next wake.
            if progressed && !self.pod.init_containers.is_empty() {
                continue;
            }
            let wake = self.next_wake();
            match self.wait(wake).await {
                Wake::Control(control) => self.on_control(control).await,
                Wake::Exit(exit) => self.on_exit(exit).await,
                // Then the pass: a sidecar's passed startup probe may let
                // the next container start. A liveness kill runs preStop
                // hooks: a deletion meanwhile takes over, as in the pass.
                Wake::Probe(result) => {
                    let control = self.control.clone();
                    let mut deferred = Vec::new();
                    let terminate = until_terminate(&control, &mut deferred);
                    let interrupted = async {
                        self.on_probe_result(result).await;
                        None
                    }
                    .or(terminate)
                    .await;
                    for control in deferred {
                        self.on_control(Some(control)).await;
                    }
                    if let Some(control) = interrupted {
                        self.on_control(control).await;
                    }
                }
                Wake::MonitorLost => self.on_monitor_lost().await,
                Wake::Storage(verdict) => {
                    self.storage_measuring = false;
                    if let Some(message) = verdict
                        && self.evicted.is_none()
                    {
                        self.evict(message, Duration::ZERO).await;
                    }
                }
                Wake::Timer => {}
                // The next pass rewrites the volumes.
                Wake::ObjectsChanged => self.volumes_written = None,
            }
        }
    }

    async fn on_control(&mut self, control: Option<Control>) {
        match control {
            Some(Control::Update(pod)) => self.on_update(*pod).await,
            Some(Control::ResizePending(verdict)) => self.resize.pending = verdict,
            Some(Control::Relisted(states)) => self.heal(&states).await,
            Some(Control::Evict { message, grace }) => {
                if self.evicted.is_none() {
                    self.evict(message, grace).await;
                }
            }
            Some(Control::Terminate { grace }) => {
                self.terminating = true;
                if let Some(grace) = grace {
                    self.grace_override = Some(grace.min(self.pod.termination_grace));
                }
            }
            // The agent is gone: nothing will tell this worker more.
            None => self.terminating = true,
        }
    }

    /// As upstream: a container whose image changed is stopped (stop
    /// signal, SIGKILL after the grace period) and started with the new
    /// image; labels and annotations reach the downward API volumes.
    async fn on_update(&mut self, pod: Pod) {
        let name = self.pod.full_name();
        let names = |p: &Pod| {
            p.all_containers()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
        };
        let same_containers = names(&pod) == names(&self.pod)
            && pod.init_containers.len() == self.pod.init_containers.len();
        // Ephemeral containers are only ever added, as the API server
        // allows, but a patch may list them in another order: the worker
        // keeps its own, the new ones last.
        let mut pod = pod;
        let mut ordered = Vec::with_capacity(pod.ephemeral_containers.len());
        for known in &self.pod.ephemeral_containers {
            match pod.ephemeral_containers.iter().position(|c| c == known) {
                Some(at) => ordered.push(pod.ephemeral_containers.remove(at)),
                None => break,
            }
        }
        if !same_containers || ordered.len() != self.pod.ephemeral_containers.len() {
            log::warn!("pod {name}: its containers changed in the API server; ignoring");
            return;
        }
        let added = std::mem::replace(&mut pod.ephemeral_containers, ordered);
        pod.ephemeral_containers.extend(added.iter().cloned());
        let old = std::mem::replace(&mut self.pod, pod);
        self.volumes_written = None;
        let now = Instant::now();
        let known = self.containers.len();
        for c in &added {
            log::info!("pod {name}: ephemeral container {} added", c.name);
            self.containers.push(ContainerState::of(c, &[]));
        }
        let mut resized = Vec::new();
        for i in 0..known {
            let image = self.pod.container(i).image.clone();
            if old.container(i).image == image {
                let (before, after) = (
                    &old.container(i).resources,
                    &self.pod.container(i).resources,
                );
                let changed = [
                    (
                        "cpu",
                        (before.cpu_request_milli, before.cpu_limit_milli)
                            != (after.cpu_request_milli, after.cpu_limit_milli),
                    ),
                    (
                        "memory",
                        (before.memory_request, before.memory_limit)
                            != (after.memory_request, after.memory_limit),
                    ),
                ];
                let restart = changed.iter().any(|(resource, changed)| {
                    *changed
                        && self
                            .pod
                            .container(i)
                            .restart_on_resize
                            .iter()
                            .any(|r| r == resource)
                });
                if changed.iter().any(|(_, changed)| *changed) && !restart {
                    resized.push(i);
                    continue;
                }
                if !restart {
                    continue;
                }
            }
            let c = &mut self.containers[i];
            c.record.view.image = image;
            c.restart_for_update = true;
            c.retry_at = None;
            c.setup_failed_at = None;
            let running = c.record.view.terminated.is_none();
            let Some(id) = c.record.view.container_id.clone().filter(|_| running) else {
                continue;
            };
            let signal = c.record.stop_signal();
            c.kill_at = Some(now + self.pod.termination_grace);
            let container = c.record.view.name.clone();
            let message = format!("Container {container} definition changed, will be restarted");
            self.event(Some(&container), EventType::Normal, "Killing", message);
            if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
                log::warn!("pod {name}: {e}");
            }
        }
        // A resize still undone: the cgroups hold its older limits.
        let undone = self.resize_retry.is_some();
        let (applied, resized) = match self.resize_retry.take() {
            Some(retry) => {
                let mut all = retry.resized;
                all.extend(resized);
                all.sort_unstable();
                all.dedup();
                (*retry.applied, all)
            }
            None => (old, resized),
        };
        if crate::agent::resized(&applied, &self.pod) {
            self.resize_in_place(&applied, &resized).await;
        } else if undone {
            // Resized back to what the cgroups hold: nothing is undone.
            self.resize.error = None;
        }
        let checkpoint = Checkpoint {
            uid: self.pod.uid.clone(),
            source: self.pod.source.clone(),
            admitted: self.admitted,
            manifest: self.pod.manifest.clone(),
        };
        let dir = self.dir.clone();
        if let Err(e) =
            crate::helpers::unblock(move || checkpoint::write_checkpoint(&dir, &checkpoint)).await
        {
            log::error!("pod {name}: {e}");
        }
        self.save_containers();
    }

    /// Actuates an in-place resize in the cgroup files: the pod's cgroup
    /// first at the larger of its old and new limits, then the running
    /// containers `resized`, then the pod's at its new limits, so that no
    /// step has a container above its pod. Off the loop: lowering
    /// memory.max makes the kernel reclaim before the write returns.
    async fn resize_in_place(&mut self, old: &Pod, resized: &[usize]) {
        self.resize.pending = None;
        let pids = self.ctx.config.pod_pids_limit;
        let (before, after) = (
            crate::cgroup::pod_limits(old, pids),
            crate::cgroup::pod_limits(&self.pod, pids),
        );
        let larger = crate::cgroup::Limits {
            cpu_shares: before.cpu_shares.max(after.cpu_shares),
            cpu_quota: before.cpu_quota.zip(after.cpu_quota).map(|(a, b)| a.max(b)),
            memory_max: before
                .memory_max
                .zip(after.memory_max)
                .map(|(a, b)| a.max(b)),
            pids_max: after.pids_max,
        };
        // The running ones: (index, cgroup path, new limits).
        let containers: Vec<(usize, String, crate::cgroup::Limits)> = resized
            .iter()
            .filter_map(|&i| {
                let view = &self.containers[i].record.view;
                let id = view
                    .container_id
                    .as_ref()
                    .filter(|_| view.terminated.is_none())?;
                let r = &self.pod.container(i).resources;
                let limits = crate::cgroup::Limits {
                    cpu_shares: crate::cgroup::cpu_shares(r.cpu_request_milli),
                    cpu_quota: r.cpu_limit_milli.map(crate::cgroup::cpu_quota),
                    memory_max: r.memory_limit,
                    pids_max: None,
                };
                Some((
                    i,
                    self.ctx
                        .cgroups
                        .container_path(self.pod.qos, &self.pod.uid, id),
                    limits,
                ))
            })
            .collect();
        // A limit lowered below what is in use would have the kernel
        // reclaim or OOM-kill at once: upstream leaves such a resize
        // undone and tries again.
        let lowered =
            |old: Option<u64>, new: Option<u64>| new.filter(|n| old.is_none_or(|o| *n < o));
        let pod_check = lowered(before.memory_max, after.memory_max);
        let container_checks: Vec<(String, String, u64)> = containers
            .iter()
            .filter_map(|(i, path, limits)| {
                let i = *i;
                let limit = lowered(old.container(i).resources.memory_limit, limits.memory_max)?;
                Some((self.pod.container(i).name.clone(), path.clone(), limit))
            })
            .collect();
        let cgroups = self.ctx.cgroups.clone();
        let (qos, uid, pod_name) = (self.pod.qos, self.pod.uid.clone(), self.pod.name.clone());
        let applied = crate::helpers::unblock(move || {
            let version = cgroups.version;
            let in_use = |path: &str, limit: u64| {
                crate::cgroup::usage::read(version, path).is_some_and(|u| u.memory_bytes >= limit)
            };
            if let Some(limit) = pod_check
                && in_use(&cgroups.pod_path(qos, &uid), limit)
            {
                return Err(format!(
                    "aborting attempt to set pod memory limit less than current memory usage for pod {pod_name}"
                ));
            }
            for (container, path, limit) in &container_checks {
                if in_use(path, *limit) {
                    return Err(format!(
                        "aborting attempt to set container memory limit less than current memory usage for container {container}"
                    ));
                }
            }
            let write = || -> Result<(), crate::cgroup::CgroupError> {
                cgroups.ensure_pod(qos, &uid, &larger)?;
                for (_, path, limits) in &containers {
                    crate::cgroup::ensure_limits(version, path, limits)?;
                }
                cgroups.ensure_pod(qos, &uid, &after)
            };
            write().map_err(|e| e.to_string())
        })
        .await;
        let name = self.pod.full_name();
        match applied {
            Ok(()) => {
                log::info!("pod {name}: resized in place");
                self.resize.error = None;
                self.resize_retry = None;
            }
            Err(e) => {
                log::warn!("pod {name}: resizing: {e}");
                self.resize.error = Some(e);
                self.resize_retry = Some(ResizeRetry {
                    applied: Box::new(old.clone()),
                    resized: resized.to_vec(),
                    at: Instant::now() + RESIZE_RETRY,
                });
            }
        }
    }

    /// Tries a resize left undone again, when it is time.
    async fn retry_resize(&mut self, now: Instant) {
        if self.resize_retry.as_ref().is_none_or(|r| r.at > now) {
            return;
        }
        if let Some(retry) = self.resize_retry.take() {
            self.resize_in_place(&retry.applied, &retry.resized).await;
        }
    }

    /// Writes the checkpoint: what must bring the pod back after a reboot.
    async fn admit(&mut self) -> Result<(), crate::state::StateError> {
        crate::state::create_dir_all(&self.dir, 0o700)?;
        if checkpoint::read_checkpoint(&self.dir)?.is_none() {
            let dir = self.dir.clone();
            let checkpoint = Checkpoint {
                uid: self.pod.uid.clone(),
                source: self.pod.source.clone(),
                admitted: self.admitted,
                manifest: self.pod.manifest.clone(),
            };
            // It is fsynced, which can take long on SD cards: off the loop.
            crate::helpers::unblock(move || checkpoint::write_checkpoint(&dir, &checkpoint))
                .await?;
            log::info!(
                "pod {} admitted from {}",
                self.pod.full_name(),
                self.pod.source
            );
        }
        Ok(())
    }

    /// Settles records the relist found the runtime disagreeing with. The
    /// list may be old by now (a container created then has started since):
    /// what it flags is asked again before anything is done. Never during a
    /// pass, so never between a container's create and its start.
    async fn heal(&mut self, listed: &[crate::runtime::runc::State]) {
        use super::relist::{Verdict, verdict};
        let unfinished = |c: &ContainerState| {
            c.record
                .view
                .container_id
                .clone()
                .filter(|_| c.record.view.terminated.is_none())
        };
        let flagged: Vec<usize> = (0..self.containers.len())
            .filter(|&i| {
                unfinished(&self.containers[i])
                    .is_some_and(|id| verdict(listed.iter().find(|s| s.id == id)) != Verdict::Fine)
            })
            .collect();
        let named = |containers: &[ContainerState], id: &str| {
            containers
                .iter()
                .any(|c| unfinished(c).is_some_and(|own| own == id))
        };
        let stray = listed.iter().any(|s| !named(&self.containers, &s.id));
        if flagged.is_empty() && !stray {
            return;
        }
        let Ok(fresh) = self.ctx.runtime.list().await else {
            return;
        };
        // Instances of this pod no record runs (an exit handled, a
        // removal that failed): gone with their bundles.
        let bundles = self.dir.join("containers");
        for state in &fresh {
            if listed.iter().any(|s| s.id == state.id)
                && !named(&self.containers, &state.id)
                && Path::new(&state.bundle) == bundles.join(&state.id)
            {
                log::warn!(
                    "pod {}: removing container {}, which no record runs",
                    self.pod.full_name(),
                    state.id
                );
                self.remove_instance(&state.id).await;
            }
        }
        let exits = crate::monitor::recorded_exits(&self.dir);
        let name = self.pod.full_name();
        let mut healed = false;
        for i in flagged {
            let Some(id) = unfinished(&self.containers[i]) else {
                continue;
            };
            let container = self.containers[i].record.view.name.clone();
            match verdict(fresh.iter().find(|s| s.id == id)) {
                Verdict::Fine => continue,
                Verdict::Gone => {
                    log::warn!("pod {name}: container {container} is gone with no exit reported");
                    match exits.iter().find(|e| e.id == id) {
                        Some(exit) => self.record_exit(i, exit.clone(), "found by the relist"),
                        None => self.record_unknown_exit(i, &id, "found by the relist"),
                    }
                }
                Verdict::NeverStarted => {
                    log::warn!("pod {name}: container {container} was created and never started");
                    self.record_unknown_exit(i, &id, "never started");
                }
            }
            healed = true;
            self.remove_instance(&id).await;
        }
        if healed {
            self.save_containers();
            self.write_status();
        }
    }

    /// The runtime's containers, `None` when it could not list them in a
    /// few tries: unknown, which is not "none".
    async fn list_runtime(&self) -> Option<Vec<crate::runtime::runc::State>> {
        let mut delay = Duration::from_millis(500);
        for attempt in 1..=3 {
            match self.ctx.runtime.list().await {
                Ok(listed) => return Some(listed),
                Err(e) if attempt == 3 => {
                    log::warn!(
                        "pod {}: listing containers: {e}; keeping what the records say",
                        self.pod.full_name()
                    );
                }
                Err(_) => {
                    smol::Timer::after(delay).await;
                    delay *= 2;
                }
            }
        }
        None
    }

    /// After an agent restart: reattach to the monitor and settle what
    /// happened to each container while nobody listened.
    async fn adopt(&mut self) {
        self.remove_orphan_bundles().await;
        let has_instances = self
            .containers
            .iter()
            .any(|c| c.record.view.container_id.is_some());
        self.start_observed = has_instances;
        if !has_instances {
            return;
        }
        if let Ok(connection) = monitor_client::connect(&self.dir, self.exits_tx.clone()).await {
            self.monitor = Some(connection);
        }
        let exits = crate::monitor::recorded_exits(&self.dir);
        let listed = self.list_runtime().await;
        let mut adopted_running = false;
        for i in 0..self.containers.len() {
            let view = &self.containers[i].record.view;
            let Some(id) = view.container_id.clone() else {
                continue;
            };
            if view.terminated.is_some() {
                continue;
            }
            if let Some(exit) = exits.iter().find(|e| e.id == id) {
                self.record_exit(i, exit.clone(), "exited while the agent was down");
                continue;
            }
            // A runtime that cannot list says nothing: what the records
            // say stands (the monitor reports the exits it sees).
            let Some(listed) = &listed else {
                adopted_running |= view.running_since.is_some();
                continue;
            };
            match listed
                .iter()
                .find(|s| s.id == id)
                .map(|s| s.status.as_str())
            {
                Some("running") => {
                    log::info!(
                        "pod {}: adopted running container {}",
                        self.pod.full_name(),
                        view.name
                    );
                    // Probes start over, as after an upstream kubelet
                    // restart; their initial delays are long past.
                    self.containers[i].probes =
                        ProbeTracker::start(&self.pod.container(i).probes, Instant::now());
                    // Killed between `runc start` and recording it: the
                    // container runs, its record still says it is being
                    // created.
                    let view = &mut self.containers[i].record.view;
                    if view.running_since.is_none() {
                        view.running_since = Some(Timestamp::now());
                        view.waiting = None;
                    }
                    adopted_running = true;
                }
                other => {
                    // Created but never started, or gone without a recorded
                    // exit (its monitor died): upstream calls this unknown.
                    log::warn!(
                        "pod {}: container {} is {:?} with no recorded exit",
                        self.pod.full_name(),
                        view.name,
                        other.unwrap_or("gone")
                    );
                    self.record_unknown_exit(i, &id, "");
                    // One left created would hold its ID and rootfs for good.
                    self.remove_instance(&id).await;
                }
            }
        }
        self.save_containers();
        // The sandbox is there; reading it back gives the pod its IPs (and
        // CHECKs its network) for status and probes.
        if adopted_running {
            match self.create_sandbox().await {
                Ok(paths) => self.paths = Some(paths),
                Err(e) => log::warn!("pod {}: sandbox: {e}", self.pod.full_name()),
            }
        }
    }

    /// Makes (or finds again) the pod's sandbox: see `sandbox::create`.
    async fn create_sandbox(&self) -> Result<PodPaths, sandbox::SandboxError> {
        sandbox::create(
            &self.pod,
            &self.dir,
            &self.cluster_dns(),
            &self.ctx.cni,
            &self.ctx.monitor.executable,
        )
        .await
    }

    /// Bundles no container record names: left by a crash while an
    /// instance was being prepared.
    async fn remove_orphan_bundles(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("containers")) else {
            return;
        };
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            let named = self.containers.iter().any(|c| {
                c.record.view.container_id.as_deref() == Some(id.as_str())
                    && c.record.view.terminated.is_none()
            });
            if !named {
                log::info!(
                    "pod {}: removing leftover container {id}",
                    self.pod.full_name()
                );
                self.remove_instance(&id).await;
            }
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let refresh = self
            .volumes_written
            .filter(|_| self.has_api_volumes() && !self.sandbox_released)
            .map(|t| t + VOLUME_REFRESH);
        self.containers
            .iter()
            .filter_map(|c| c.retry_at)
            .chain(self.containers.iter().filter_map(|c| c.kill_at))
            .chain(self.containers.iter().filter_map(|c| c.probes.next_at()))
            .chain(refresh)
            .chain(self.storage_check_at.filter(|_| self.evicted.is_none()))
            .chain(self.active_deadline().filter(|_| self.evicted.is_none()))
            .chain(self.resize_retry.as_ref().map(|r| r.at))
            .min()
    }

    fn cluster_dns(&self) -> sandbox::ClusterDns {
        let config = &self.ctx.config;
        let wants_cluster = match self.pod.dns_policy {
            crate::pod::DnsPolicy::ClusterFirst => !self.pod.host_network,
            crate::pod::DnsPolicy::ClusterFirstWithHostNet => true,
            crate::pod::DnsPolicy::Default | crate::pod::DnsPolicy::None => false,
        };
        if wants_cluster && config.cluster_dns.is_empty() && config.kubeconfig.is_some() {
            self.event(
                None,
                EventType::Warning,
                "MissingClusterDNS",
                "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.".into(),
            );
        }
        sandbox::ClusterDns {
            servers: config.cluster_dns.clone(),
            domain: config.cluster_domain.clone(),
        }
    }

    /// Records an event about the pod, or one of its containers.
    fn event(&self, container: Option<&str>, kind: EventType, reason: &str, message: String) {
        let Some(events) = &self.ctx.events else {
            log::debug!("pod {}: {reason}: {message}", self.pod.full_name());
            return;
        };
        events.record(
            Involved {
                kind: "Pod",
                namespace: self.pod.namespace.clone(),
                name: self.pod.name.clone(),
                uid: self.pod.uid.clone(),
                field_path: container.map(|c| format!("spec.containers{{{c}}}")),
            },
            kind,
            reason,
            message,
        );
    }

    /// Registry credentials from the pod's imagePullSecrets; a missing or
    /// unreadable one is reported and skipped, as upstream does.
    fn registry_auth(&self) -> crate::image::auth::RegistryAuth {
        let mut auth = crate::image::auth::RegistryAuth::new();
        for name in &self.pod.image_pull_secrets {
            let data = self.objects.secrets.get(name).and_then(Option::as_ref);
            let config = data.and_then(|d| d.0.get(".dockerconfigjson").or(d.0.get(".dockercfg")));
            let problem = match config {
                Some(bytes) => crate::image::auth::parse_docker_config(bytes, &mut auth).err(),
                None => Some("not found or not a Docker config secret".to_owned()),
            };
            if let Some(problem) = problem {
                let message = format!(
                    "Unable to retrieve some image pull secrets ({name}); attempting to pull the image may not succeed: {problem}"
                );
                self.event(
                    None,
                    EventType::Warning,
                    "FailedToRetrieveImagePullSecret",
                    message,
                );
            }
        }
        // Then the node's own, for registries no secret names (a small
        // file, read at each pull so that changes apply without a restart).
        let node_config = self
            .ctx
            .config
            .docker_config_paths()
            .into_iter()
            .find_map(|path| std::fs::read(&path).ok().map(|bytes| (path, bytes)));
        if let Some((path, bytes)) = node_config
            && let Err(problem) = crate::image::auth::parse_docker_config(&bytes, &mut auth)
        {
            log::warn!("{}: {problem}", path.display());
        }
        auth
    }

    /// The node's address on the host network, else the pod network's.
    fn pod_ips(&self) -> Vec<String> {
        if self.pod.host_network {
            return self.ctx.host_ip.iter().map(|ip| ip.to_string()).collect();
        }
        self.paths
            .iter()
            .flat_map(|p| &p.pod_ips)
            .map(|ip| ip.to_string())
            .collect()
    }

    fn has_api_volumes(&self) -> bool {
        self.pod.volumes.iter().any(|v| {
            matches!(&v.source, VolumeSource::Projected(p)
                if p.sources.iter().any(|s| !matches!(s, ProjectionSource::DownwardApi { .. })))
        })
    }

    fn downward(&self) -> Downward {
        let (node_cpu_milli, node_memory) = super::node::allocatable(&self.ctx);
        let host_ip = self.ctx.host_ip.map(|ip| ip.to_string());
        Downward {
            node_name: self.ctx.config.node_name.clone(),
            pod_ips: self.pod_ips(),
            host_ip,
            node_cpu_milli,
            node_memory,
        }
    }

    /// Brings the ConfigMaps, Secrets and tokens the pod reads up to date.
    /// Without the API server the checkpointed copies stay in use.
    async fn refresh_objects(&mut self) -> Result<(), String> {
        let refs = references(&self.pod);
        if refs.is_empty() {
            return Ok(());
        }
        let Some(source) = &self.ctx.objects else {
            return Err(
                "ConfigMaps, Secrets and service account tokens need the API server".into(),
            );
        };
        let (uid, namespace) = (self.pod.uid.clone(), self.pod.namespace.clone());
        let mut objects = self.objects.clone();
        let mut failure = None;
        for (kind, names) in [
            (Kind::ConfigMap, &refs.config_maps),
            (Kind::Secret, &refs.secrets),
        ] {
            for name in names {
                match source.get(&uid, kind, &namespace, name).await {
                    Ok(data) => {
                        let map = match kind {
                            Kind::ConfigMap => &mut objects.config_maps,
                            Kind::Secret => &mut objects.secrets,
                        };
                        map.insert(name.clone(), data);
                    }
                    Err(e) => failure = Some(e),
                }
            }
        }
        let now = Timestamp::now();
        for spec in &refs.tokens {
            let key = token_key(spec);
            if objects
                .tokens
                .get(&key)
                .is_none_or(|t| t.needs_refresh(now))
            {
                match source.token(&self.pod, spec).await {
                    Ok(token) => {
                        objects.tokens.insert(key, token);
                    }
                    Err(e) => failure = Some(e),
                }
            }
        }
        if let Some(e) = failure
            && !e.is_unavailable()
        {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
        if objects != self.objects {
            self.objects = objects;
            self.save_objects().await;
        }
        Ok(())
    }

    /// Checkpoints the pod's objects, off the loop.
    async fn save_objects(&self) {
        let (dir, saved) = (self.dir.clone(), self.objects.clone());
        if let Err(e) =
            crate::helpers::unblock(move || checkpoint::write_objects(&dir, &saved)).await
        {
            log::error!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// Checks that the pod's RuntimeClass names the node's runtime, as
    /// upstream resolves it before making a sandbox: through the API
    /// server once, then from the checkpoint. Without an API server
    /// (standalone) the class is not looked up, as upstream's kubelet
    /// without a client has no RuntimeClass manager.
    async fn check_runtime_class(&mut self) -> Result<(), String> {
        let (Some(class), Some(source)) = (&self.pod.runtime_class, &self.ctx.objects) else {
            return Ok(());
        };
        let handler = match &self.objects.runtime_handler {
            Some(handler) => handler.clone(),
            None => match source.runtime_handler(class).await {
                Ok(Some(handler)) => {
                    self.objects.runtime_handler = Some(handler.clone());
                    self.save_objects().await;
                    handler
                }
                Ok(None) => {
                    return Err(format!("runtimeclasses.node.k8s.io {class:?} not found"));
                }
                Err(e) => return Err(format!("failed to lookup RuntimeClass {class}: {e}")),
            },
        };
        if handler.is_empty() || handler == self.ctx.runtime.kind.name() {
            Ok(())
        } else {
            Err(format!(
                "failed to get sandbox runtime: no runtime for {handler:?} is configured"
            ))
        }
    }

    /// The Services whose variables a starting container gets. Without the
    /// API server the last ones read stay (they are checkpointed with the
    /// pod's objects); a pod that never read them starts without them,
    /// where upstream's kubelet would wait: a board must start its static
    /// pods offline.
    async fn refresh_service_links(&mut self) {
        let Some(source) = &self.ctx.objects else {
            return;
        };
        match source
            .service_links(&self.pod.namespace, self.pod.enable_service_links)
            .await
        {
            Ok(links) if self.objects.services.as_ref() != Some(&links) => {
                self.objects.services = Some(links);
                self.save_objects().await;
            }
            Ok(_) => {}
            Err(e) => {
                if !e.is_unavailable() {
                    log::warn!("pod {}: services: {e}", self.pod.full_name());
                }
            }
        }
    }

    /// Writes the volumes nanolet fills itself, off the loop.
    async fn prepare_volumes(&mut self) -> Result<(), String> {
        for volume in &self.pod.volumes {
            if let VolumeSource::Unsupported { kind } = &volume.source {
                return Err(format!(
                    "MountVolume.SetUp failed for volume {:?}: no volume plugin matched: nanolet does not mount {kind} volumes",
                    volume.name
                ));
            }
        }
        self.refresh_objects().await?;
        let downward = self.downward();
        let Some(paths) = &self.paths else {
            return Err("no sandbox".into());
        };
        for volume in &self.pod.volumes {
            let VolumeSource::Projected(projection) = &volume.source else {
                continue;
            };
            let Some((_, dir)) = paths.volumes.iter().find(|(n, _)| *n == volume.name) else {
                continue;
            };
            let files =
                volumes::project(&self.pod, projection, &self.objects, &downward).map_err(|e| {
                    format!("MountVolume.SetUp failed for volume {:?}: {e}", volume.name)
                })?;
            let (dir, group) = (dir.clone(), self.pod.fs_group);
            crate::helpers::unblock(move || volumes::write_atomically(&dir, &files, group))
                .await
                .map_err(|e| {
                    format!("MountVolume.SetUp failed for volume {:?}: {e}", volume.name)
                })?;
        }
        self.volumes_written = Some(Instant::now());
        Ok(())
    }

    async fn wait(&self, until: Option<Instant>) -> Wake {
        let control = async { Wake::Control(self.control.recv().await.ok()) };
        let exit = async {
            match self.exits_rx.recv().await {
                Ok(MonitorEvent::Exit(e)) => Wake::Exit(e),
                Ok(MonitorEvent::Lost) => Wake::MonitorLost,
                // Never closed: the worker holds a sender.
                Err(_) => std::future::pending().await,
            }
        };
        let timer = async {
            match until {
                Some(at) => {
                    smol::Timer::at(at).await;
                    Wake::Timer
                }
                None => std::future::pending().await,
            }
        };
        let changed = async {
            match self.objects_changed.recv().await {
                Ok(()) => Wake::ObjectsChanged,
                Err(_) => std::future::pending().await,
            }
        };
        let probed = async {
            match self.probe_results.1.recv().await {
                Ok(result) => Wake::Probe(result),
                // Never closed: the worker holds a sender.
                Err(_) => std::future::pending().await,
            }
        };
        let measured = async {
            match self.storage_verdicts.1.recv().await {
                Ok(verdict) => Wake::Storage(verdict),
                // Never closed: the worker holds a sender.
                Err(_) => std::future::pending().await,
            }
        };
        control
            .or(exit)
            .or(probed)
            .or(measured)
            .or(changed)
            .or(timer)
            .await
    }

    /// Whether container `i` should get a new instance now that its current
    /// one ended: sidecars always (until the pod completes), init
    /// containers until they succeed unless the policy is Never, regular
    /// containers by the pod's restart policy.
    fn wants_restart(&self, i: usize, terminated: &Terminated) -> bool {
        match self.pod.container(i).role {
            ContainerRole::Sidecar => !self.completing,
            ContainerRole::Ephemeral => false,
            ContainerRole::Init => {
                terminated.exit_code != 0 && self.pod.restart_policy != RestartPolicy::Never
            }
            ContainerRole::Regular => match self.pod.restart_policy {
                RestartPolicy::Always => true,
                RestartPolicy::OnFailure => terminated.exit_code != 0,
                RestartPolicy::Never => false,
            },
        }
    }

    /// A new sandbox for a pod that ran before (after a reboot): its init
    /// containers run again before anything else restarts, as upstream
    /// does when it recreates a sandbox. Pods that never restart stay done.
    fn start_over_in_new_sandbox(&mut self) {
        if self.pod.init_containers.is_empty() || self.pod.restart_policy == RestartPolicy::Never {
            return;
        }
        let mut any = false;
        for c in &mut self.containers {
            if c.record.view.container_id.is_some() {
                c.record.from_old_sandbox = true;
                any = true;
            }
        }
        if any {
            log::info!(
                "pod {}: new sandbox; init containers run again",
                self.pod.full_name()
            );
        }
    }

    /// The first init container that has not done its part yet; the number
    /// of init containers once all have (then regular containers may run).
    fn init_frontier(&self) -> usize {
        let n = self.pod.init_containers.len();
        // What ran in an earlier sandbox does not count.
        let views: Vec<ContainerView> = self
            .containers
            .iter()
            .map(|c| {
                let mut view = c.record.view.clone();
                if c.record.from_old_sandbox {
                    view.container_id = None;
                    view.terminated = None;
                }
                view
            })
            .collect();
        if status::previously_initialized(&self.pod, &views) {
            return n;
        }
        (0..n)
            .find(|&i| {
                let c = &self.containers[i];
                if c.record.from_old_sandbox {
                    return true;
                }
                let view = ContainerView {
                    probed_started: c.probes.started(),
                    ..c.record.view.clone()
                };
                !status::init_done(self.pod.container(i).role, &view)
            })
            .unwrap_or(n)
    }

    /// Once every regular container has ended for good (or an init
    /// container failed for good), the sidecars are stopped, as upstream
    /// does for completing pods.
    async fn stop_sidecars_when_done(&mut self) {
        let n_init = self.pod.init_containers.len();
        let has_sidecars = self
            .pod
            .init_containers
            .iter()
            .any(|c| c.role == ContainerRole::Sidecar);
        if self.completing || !has_sidecars {
            return;
        }
        let over = |i: usize| {
            self.containers[i]
                .record
                .view
                .terminated
                .as_ref()
                .is_some_and(|t| !self.wants_restart(i, t))
        };
        let init_failed = (0..n_init).any(|i| {
            let failed = self.containers[i]
                .record
                .view
                .terminated
                .as_ref()
                .is_some_and(|t| t.exit_code != 0);
            self.pod.container(i).role == ContainerRole::Init && failed && over(i)
        });
        let regular_done = (n_init..n_init + self.pod.containers.len()).all(over);
        if !(init_failed || regular_done) {
            return;
        }
        self.completing = true;
        let now = Instant::now();
        for i in (0..n_init).rev() {
            if self.pod.container(i).role == ContainerRole::Sidecar {
                self.stop_container(i, now).await;
            }
        }
    }

    /// Sends a running container its stop signal, SIGKILL to follow after
    /// the pod's grace period.
    async fn stop_container(&mut self, i: usize, now: Instant) {
        let c = &mut self.containers[i];
        let Some(id) = c.record.view.container_id.clone() else {
            return;
        };
        if c.record.view.terminated.is_some() {
            return;
        }
        c.kill_at = Some(now + self.pod.termination_grace);
        let signal = c.record.stop_signal();
        let name = c.record.view.name.clone();
        self.event(
            Some(&name),
            EventType::Normal,
            "Killing",
            format!("Stopping container {name}"),
        );
        if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// A pod that has ended keeps no debugging container: upstream stops
    /// every container of a terminal pod, and its sandbox goes after them.
    async fn stop_ephemeral_when_done(&mut self) {
        if !self.phase_is_terminal() {
            return;
        }
        let now = Instant::now();
        let first = self.pod.init_containers.len() + self.pod.containers.len();
        for i in first..self.containers.len() {
            if self.containers[i].kill_at.is_none() {
                self.stop_container(i, now).await;
            }
        }
    }

    async fn ensure_sandbox(&mut self) -> bool {
        if self.paths.is_some() && self.monitor.is_some() {
            return true;
        }
        let result = async {
            // Before any container: runtimes create only the containers' own.
            let limits = crate::cgroup::pod_limits(&self.pod, self.ctx.config.pod_pids_limit);
            self.ctx
                .cgroups
                .ensure_pod(self.pod.qos, &self.pod.uid, &limits)
                .map_err(|e| e.to_string())?;
            if self.paths.is_none() {
                self.check_runtime_class()
                    .await
                    .map_err(SandboxFailure::Sandbox)?;
                let paths = self.create_sandbox().await.map_err(|e| match e {
                    // Upstream's volume manager reports these, not the
                    // sandbox: FailedMount, and the pod stays
                    // ContainerCreating.
                    sandbox::SandboxError::HostPath {
                        volume,
                        path,
                        reason,
                    } => SandboxFailure::Mount(format!(
                        "MountVolume.SetUp failed for volume {volume:?} : hostPath type check failed: {path} {reason}"
                    )),
                    other => SandboxFailure::Sandbox(other.to_string()),
                })?;
                if paths.recreated {
                    self.start_over_in_new_sandbox();
                    self.save_containers();
                    sandbox::recreation_handled(&self.dir).map_err(|e| e.to_string())?;
                }
                if let Some(pid) = paths
                    .pid_ns
                    .as_ref()
                    .and_then(|_| crate::runtime::pause::pid(&self.dir.join("ns")))
                {
                    self.ctx
                        .cgroups
                        .adopt_pause(self.pod.qos, &self.pod.uid, pid)
                        .map_err(|e| e.to_string())?;
                }
                self.paths = Some(paths);
            }
            if self.monitor.is_none() {
                self.monitor = Some(
                    monitor_client::connect_or_start(
                        &self.dir,
                        &self.ctx.monitor,
                        self.exits_tx.clone(),
                    )
                    .await
                    .map_err(|e| e.to_string())?,
                );
            }
            Ok::<(), SandboxFailure>(())
        }
        .await;
        match result {
            Ok(()) => true,
            Err(failure) => {
                let (reason, message) = match failure {
                    SandboxFailure::Mount(message) => {
                        log::warn!("pod {}: {message}", self.pod.full_name());
                        self.event(None, EventType::Warning, "FailedMount", message.clone());
                        ("ContainerCreating", message)
                    }
                    SandboxFailure::Sandbox(message) => {
                        log::error!("pod {}: sandbox: {message}", self.pod.full_name());
                        self.event(
                            None,
                            EventType::Warning,
                            "FailedCreatePodSandBox",
                            format!("Failed to create pod sandbox: {message}"),
                        );
                        ("CreatePodSandboxError", message)
                    }
                };
                let now = Instant::now();
                self.sandbox_backoff.record_attempt(now);
                let retry = now
                    + self
                        .sandbox_backoff
                        .delay(now)
                        .unwrap_or(Duration::from_secs(10));
                for c in &mut self.containers {
                    if c.record.view.running_since.is_none() {
                        c.record.view.waiting = Some((reason.into(), message.clone()));
                        c.retry_at = Some(retry);
                    }
                }
                false
            }
        }
    }

    /// The pod's disk emptyDirs with a sizeLimit: (name, dir, limit bytes,
    /// limit as written).
    fn limited_volumes(&self) -> Vec<(String, PathBuf, u64, String)> {
        let written = |name: &str| -> String {
            self.pod
                .manifest
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .and_then(|v| v.iter().find(|v| v.name == name))
                .and_then(|v| v.empty_dir.as_ref())
                .and_then(|e| e.size_limit.as_ref())
                .map(|q| q.0.clone())
                .unwrap_or_default()
        };
        self.pod
            .volumes
            .iter()
            .filter_map(|v| match v.source {
                VolumeSource::EmptyDir {
                    memory: false,
                    size_limit: Some(limit),
                } => Some((
                    v.name.clone(),
                    self.dir.join("volumes").join(&v.name),
                    limit,
                    written(&v.name),
                )),
                _ => None,
            })
            .collect()
    }

    /// Upstream's local storage eviction for emptyDir sizeLimits: a pod
    /// whose disk emptyDir holds more than its limit is evicted. As
    /// upstream, only active pods, and never critical ones (static pods and
    /// system priorities), which would not be admitted again.
    async fn check_local_storage(&mut self) {
        let now = Instant::now();
        if self.evicted.is_some()
            || self.storage_measuring
            || self.storage_check_at.is_some_and(|t| t > now)
        {
            return;
        }
        let critical = super::eviction::is_critical(&self.pod);
        if critical || self.phase_is_terminal() {
            return;
        }
        let volumes = self.limited_volumes();
        let any_container_limit = self
            .pod
            .all_containers()
            .any(|c| c.resources.ephemeral_limit.is_some());
        // Checked on a timer from admission on: the containers with a
        // limit may not have started yet.
        if volumes.is_empty() && !any_container_limit {
            return;
        }
        // The pod's own limit: its containers' together, as upstream's
        // PodLimits counts them (init containers at their peak).
        let pod_limit = any_container_limit.then(|| {
            self.pod
                .pod_total(|c| c.resources.ephemeral_limit.unwrap_or(0))
        });
        // Without a container limit there is nothing else to add up.
        let (containers, disk_volumes) = if any_container_limit {
            let disk_volumes: Vec<PathBuf> = self
                .pod
                .volumes
                .iter()
                .filter(|v| matches!(v.source, VolumeSource::EmptyDir { memory: false, .. }))
                .map(|v| self.dir.join("volumes").join(&v.name))
                .collect();
            (self.limited_containers(), disk_volumes)
        } else {
            (Vec::new(), Vec::new())
        };
        self.storage_check_at = Some(now + STORAGE_CHECK);
        self.storage_measuring = true;
        let verdicts = self.storage_verdicts.0.clone();
        let pod = self.pod.full_name();
        crate::rt::spawn(async move {
            let measure = |dir: PathBuf| {
                let pod = pod.clone();
                async move {
                let shown = dir.display().to_string();
                match crate::helpers::unblock(move || crate::runtime::disk_usage::disk_usage(&dir))
                    .await
                {
                    Ok(used) => Some(used),
                    // Not made yet (the sandbox comes with the first start).
                    Err(e) if e.source == nix::errno::Errno::ENOENT => None,
                    Err(e) => {
                        log::warn!("pod {pod}: measuring {shown}: {e}");
                        None
                    }
                }
                }
            };
            let mut verdict = None;
            // In upstream's order: emptyDir limits, the pod's, each
            // container's.
            for (name, dir, limit, written) in volumes {
                if measure(dir).await.is_some_and(|used| used > limit) {
                    verdict = Some(format!(
                        "Usage of EmptyDir volume {name:?} exceeds the limit {written:?}. "
                    ));
                    break;
                }
            }
            if verdict.is_none() {
                let mut pod_used = 0;
                for dir in disk_volumes {
                    pod_used += measure(dir).await.unwrap_or(0);
                }
                let mut over = None;
                for (name, limit, written, dirs) in containers {
                    let mut used = 0;
                    for dir in dirs {
                        used += measure(dir).await.unwrap_or(0);
                    }
                    pod_used += used;
                    if over.is_none() && limit.is_some_and(|l| used > l) {
                        over = Some(format!(
                            "Container {name} exceeded its local ephemeral storage limit {written:?}. "
                        ));
                    }
                }
                verdict = match pod_limit {
                    Some(limit) if pod_used > limit => Some(format!(
                        "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                        crate::quantity::format_bytes(limit)
                    )),
                    _ => over,
                };
            }
            let _ = verdicts.send(verdict).await;
        })
        .detach();
    }

    /// The started instances of a pod's containers: (name, its
    /// ephemeral-storage limit, as written, its writable layer and log
    /// dir).
    fn limited_containers(&self) -> Vec<(String, Option<u64>, String, Vec<PathBuf>)> {
        let written = |name: &str| -> String {
            let spec = self.pod.manifest.spec.as_ref();
            spec.into_iter()
                .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
                .find(|c| c.name == name)
                .and_then(|c| {
                    c.resources
                        .as_ref()?
                        .limits
                        .as_ref()?
                        .get("ephemeral-storage")
                })
                .map(|q| q.0.clone())
                .unwrap_or_default()
        };
        let logs = self.ctx.config.pod_logs_dir.join(self.pod.log_dir_name());
        self.containers
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let id = c.record.view.container_id.as_ref()?;
                let spec = self.pod.container(i);
                let upper = Bundle::new(&self.dir, id).dir.join("upper");
                Some((
                    spec.name.clone(),
                    spec.resources.ephemeral_limit,
                    written(&spec.name),
                    vec![upper, logs.join(&spec.name)],
                ))
            })
            .collect()
    }

    /// Ends the pod for good, as upstream's eviction manager does: its
    /// containers are stopped within `grace` (killed at once for a hard
    /// threshold) and it fails with reason Evicted.
    async fn evict(&mut self, message: String, grace: Duration) {
        self.event(None, EventType::Warning, "Evicted", message.clone());
        let ended = Ended {
            reason: "Evicted".into(),
            message,
        };
        self.end(ended, grace).await;
    }

    /// When the pod's activeDeadlineSeconds have passed since it was
    /// admitted (its startTime).
    fn active_deadline(&self) -> Option<Instant> {
        let deadline = self.pod.active_deadline?;
        let active = Timestamp::now()
            .duration_since(self.admitted)
            .unsigned_abs();
        Some(Instant::now() + deadline.saturating_sub(active))
    }

    /// Past its active deadline, a pod is ended as upstream's kubelet ends
    /// it: its containers get their grace period, and it fails with reason
    /// DeadlineExceeded.
    async fn enforce_active_deadline(&mut self) {
        if self.evicted.is_some() || self.active_deadline().is_none_or(|d| d > Instant::now()) {
            return;
        }
        let message = DEADLINE_EXCEEDED.to_owned();
        self.event(None, EventType::Normal, "DeadlineExceeded", message.clone());
        let ended = Ended {
            reason: "DeadlineExceeded".into(),
            message,
        };
        let grace = self.pod.termination_grace;
        self.end(ended, grace).await;
    }

    /// Ends the pod for good, recorded in its dir so that no restart of
    /// the agent runs it again.
    async fn end(&mut self, ended: Ended, grace: Duration) {
        let name = self.pod.full_name();
        log::warn!("pod {name}: {}: {}", ended.reason, ended.message);
        let marker = dir_evicted(&self.dir);
        let text = ended.to_text();
        if let Err(e) = crate::helpers::unblock(move || std::fs::write(&marker, text)).await {
            log::error!("pod {name}: recording its end: {e}");
        }
        self.evicted = Some(ended);
        if grace.is_zero() {
            self.kill_all_now().await;
        } else {
            self.stop_all_within(grace).await;
        }
        self.write_status();
    }

    /// The stop signal to every running instance, SIGKILL after `grace`
    /// (the pass enforces it), nothing started again.
    async fn stop_all_within(&mut self, grace: Duration) {
        let kill_at = Instant::now() + grace;
        for i in 0..self.containers.len() {
            let c = &mut self.containers[i];
            c.probes.stop();
            c.retry_at = None;
            let Some(id) = c.record.view.container_id.clone() else {
                continue;
            };
            if c.record.view.terminated.is_some() {
                continue;
            }
            c.kill_at = Some(kill_at);
            let signal = c.record.stop_signal();
            if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
                log::warn!("pod {}: {e}", self.pod.full_name());
            }
        }
    }

    /// Whether nothing of the pod runs or will run again: it succeeded, it
    /// failed for good, or it was evicted and its containers are gone.
    /// The status written last says the pod has ended.
    fn phase_is_terminal(&self) -> bool {
        self.last_status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
    }

    fn ran_to_its_end(&self) -> bool {
        let terminal = self.evicted.is_some() || self.phase_is_terminal();
        terminal
            && self.containers.iter().all(|c| {
                c.record.view.running_since.is_none() || c.record.view.terminated.is_some()
            })
    }

    /// As upstream stops the sandbox of a pod that has finished: its
    /// network gives the address (and any hostPort) back, its namespaces,
    /// pause and volumes go, and so does its monitor. Its status, logs and
    /// dir stay until the pod is deleted.
    async fn release_sandbox(&mut self) {
        self.sandbox_released = true;
        let name = self.pod.full_name();
        if let Some(mut monitor) = self.monitor.take()
            && let Err(e) = monitor.shutdown().await
        {
            log::warn!("pod {name}: {e}");
        }
        if let Err(e) = sandbox::teardown(&self.dir, &self.ctx.cni).await {
            log::warn!("pod {name}: releasing its sandbox: {e}");
            return;
        }
        // Its volumes are torn down as upstream's are for a terminated
        // pod: an evicted pod's emptyDir must give its disk back.
        let volumes = self.dir.join("volumes");
        match crate::helpers::unblock(move || crate::state::remove_tree(&volumes)).await {
            Ok(()) => log::info!("pod {name}: finished; its sandbox and volumes are released"),
            Err(e) => log::warn!("pod {name}: removing its volumes: {e}"),
        }
    }

    /// SIGKILL to every running instance, nothing started again: what an
    /// eviction does (also when an agent crashed halfway through one).
    async fn kill_all_now(&mut self) {
        let name = self.pod.full_name();
        for c in &mut self.containers {
            c.probes.stop();
            c.retry_at = None;
            let running = c.record.view.terminated.is_none();
            if let Some(id) = c.record.view.container_id.clone().filter(|_| running)
                && let Err(e) = self.ctx.runtime.kill(&id, "KILL").await
            {
                log::warn!("pod {name}: {e}");
            }
        }
    }

    /// One level-triggered pass; true if it started a container.
    async fn sync(&mut self) -> bool {
        let now = Instant::now();
        for c in &mut self.containers {
            if c.retry_at.is_some_and(|t| t <= now) {
                c.retry_at = None;
            }
        }
        for i in 0..self.containers.len() {
            let c = &mut self.containers[i];
            if c.kill_at.is_some_and(|t| t <= now) {
                c.kill_at = None;
                if let Some(id) = c.record.view.container_id.clone()
                    && c.record.view.terminated.is_none()
                    && let Err(e) = self.ctx.runtime.kill(&id, "KILL").await
                {
                    log::warn!("pod {}: {e}", self.pod.full_name());
                }
            }
        }
        self.enforce_active_deadline().await;
        self.retry_resize(now).await;
        // An evicted pod's stop deadlines still hold; nothing starts.
        if self.evicted.is_some() {
            return false;
        }
        self.stop_sidecars_when_done().await;
        self.stop_ephemeral_when_done().await;
        let n_init = self.pod.init_containers.len();
        // A killed pause took the pod's processes and its PID namespace.
        if self.pod.share_process_namespace
            && self.paths.is_some()
            && !self.sandbox_released
            && !crate::runtime::pause::alive(&self.dir.join("ns"))
        {
            self.paths = None;
        }
        // A pod with init containers that ran before and has a container to
        // restart sets up its sandbox first: if that is a new one, the
        // init containers go first again (see start_over_in_new_sandbox).
        if self.paths.is_none() && n_init > 0 && self.pod.restart_policy != RestartPolicy::Never {
            let restart_pending = (0..self.containers.len()).any(|i| {
                let view = &self.containers[i].record.view;
                view.container_id.is_some()
                    && view
                        .terminated
                        .as_ref()
                        .is_some_and(|t| self.wants_restart(i, t))
            });
            if restart_pending {
                self.ensure_sandbox().await;
            }
        }
        let frontier = self.init_frontier();
        let n_regular_end = n_init + self.pod.containers.len();
        let finished = self.sandbox_released || self.completing || self.phase_is_terminal();
        let mut to_start = Vec::new();
        for i in 0..self.containers.len() {
            if self.containers[i].retry_at.is_some() {
                continue;
            }
            // Init containers one after the other; regular ones after all;
            // ephemeral ones whenever the pod has not finished, as upstream.
            let gated = if i < n_init {
                i > frontier
            } else if i < n_regular_end {
                frontier < n_init
            } else {
                if finished {
                    continue;
                }
                false
            };
            if gated {
                let view = &mut self.containers[i].record.view;
                if view.container_id.is_none() && view.waiting.is_none() {
                    view.waiting = Some(("PodInitializing".into(), String::new()));
                }
                continue;
            }
            let view = &self.containers[i].record.view;
            let running = view.container_id.is_some() && view.terminated.is_none();
            if running {
                continue;
            }
            if let Some(terminated) = view.terminated.clone() {
                let updated = self.containers[i].restart_for_update;
                // An init container that completed in an earlier sandbox.
                let rerun = i < n_init && self.containers[i].record.from_old_sandbox;
                if !self.wants_restart(i, &terminated) && !updated && !rerun {
                    continue;
                }
                let c = &mut self.containers[i];
                let last_end = c.exited_at.unwrap_or(now);
                // A restart for a new spec is not a crash: no backoff.
                let backoff = if updated || rerun {
                    None
                } else {
                    c.restart_backoff.wait_until(last_end, now)
                };
                if let Some(until) = backoff {
                    let delay = c.restart_backoff.delay(now).unwrap_or_default();
                    let name = c.record.view.name.clone();
                    let message = format!(
                        "Back-off restarting failed container {name} in pod {}_{}({})",
                        self.pod.name, self.pod.namespace, self.pod.uid
                    );
                    self.event(Some(&name), EventType::Warning, "BackOff", message);
                    let c = &mut self.containers[i];
                    c.record.view.waiting = Some((
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off {}s restarting failed container={} pod={}_{}({})",
                            delay.as_secs(),
                            c.record.view.name,
                            self.pod.name,
                            self.pod.namespace,
                            self.pod.uid
                        ),
                    ));
                    c.retry_at = Some(until);
                    continue;
                }
            }
            to_start.push(i);
        }
        let starting = !to_start.is_empty();
        // A pod with nothing (more) to run needs no sandbox or monitor, for
        // instance a completed one adopted after a restart.
        if !to_start.is_empty() && self.ensure_sandbox().await {
            match self.prepare_volumes().await {
                Ok(()) => {
                    for i in to_start {
                        self.start_container(i).await;
                    }
                }
                Err(message) => {
                    log::warn!("pod {}: {message}", self.pod.full_name());
                    self.event(None, EventType::Warning, "FailedMount", message.clone());
                    // A volume type nanolet lacks will not appear: retried
                    // as upstream's volume manager backs off, at its longest.
                    let unsupported = self
                        .pod
                        .volumes
                        .iter()
                        .any(|v| matches!(v.source, VolumeSource::Unsupported { .. }));
                    let retry = if unsupported { 122 } else { 5 };
                    for i in to_start {
                        let c = &mut self.containers[i];
                        if c.record.view.terminated.is_none() {
                            c.record.view.waiting =
                                Some(("ContainerCreating".into(), message.clone()));
                        }
                        c.retry_at = Some(now + Duration::from_secs(retry));
                    }
                }
            }
        } else if self.paths.is_some()
            && !self.sandbox_released
            && self.has_api_volumes()
            && self
                .volumes_written
                .is_none_or(|t| t + VOLUME_REFRESH <= now)
            && let Err(message) = self.prepare_volumes().await
        {
            log::warn!("pod {}: {message}", self.pod.full_name());
        }
        self.save_containers();
        starting
    }

    /// Why container `i`'s instance `id` ended, as it wrote it to its
    /// terminationMessagePath (at most 4 KiB), or with
    /// FallbackToLogsOnError and a failure, its log's last 80 lines (at most
    /// 2 KiB), as upstream.
    fn termination_message(&self, i: usize, id: &str) -> Option<String> {
        let spec = self.pod.container(i);
        let file = Bundle::new(&self.dir, id).termination_log();
        let mut written = Vec::new();
        if let Ok(f) = std::fs::File::open(&file) {
            use std::io::Read;
            let _ = f.take(4096).read_to_end(&mut written);
        }
        if !written.is_empty() {
            return Some(String::from_utf8_lossy(&written).into_owned());
        }
        let view = &self.containers[i].record.view;
        let failed = view.terminated.as_ref().is_some_and(|t| t.exit_code != 0);
        if !(spec.termination_message_from_logs && failed) {
            return None;
        }
        let log = self.log_path(&spec.name, view.restart_count);
        let tail = crate::monitor::log::tail_messages(&log, 80, 2048);
        (!tail.is_empty()).then_some(tail)
    }

    /// Runs postStart; when it fails the container is stopped, as upstream
    /// does (FailedPostStartHook), and its restart policy applies.
    async fn post_start(&mut self, i: usize, id: &str, hook: &crate::pod::probe::Handler) {
        let target = self.probe_target(id.to_owned(), ProbeKind::Liveness);
        let grace = self.pod.termination_grace.max(Duration::from_secs(1));
        let Err(message) = prober::run_hook(&self.ctx.runtime, hook, &target, grace).await else {
            return;
        };
        let name = self.pod.container(i).name.clone();
        log::warn!(
            "pod {}: {name}: postStart hook failed: {message}",
            self.pod.full_name()
        );
        self.event(
            Some(&name),
            EventType::Warning,
            "FailedPostStartHook",
            format!("PostStartHook failed: {message}"),
        );
        let c = &mut self.containers[i];
        c.kill_at = Some(Instant::now() + self.pod.termination_grace);
        let signal = c.record.stop_signal();
        if let Err(e) = self.ctx.runtime.kill(id, &signal).await {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// Runs the preStop hooks of `containers` together, each bounded by
    /// `deadline`; a failure is an event, and stopping goes on.
    async fn pre_stop(&self, containers: &[(usize, String)], deadline: Instant) {
        let mut running = Vec::new();
        for (i, id) in containers {
            let Some(hook) = self.pod.container(*i).hooks.pre_stop.clone() else {
                continue;
            };
            let target = self.probe_target(id.clone(), ProbeKind::Liveness);
            let runtime = self.ctx.runtime.clone();
            let limit = deadline.saturating_duration_since(Instant::now());
            let task =
                crate::rt::spawn(
                    async move { prober::run_hook(&runtime, &hook, &target, limit).await },
                );
            running.push((*i, task));
        }
        for (i, task) in running {
            if let Err(message) = task.await {
                let name = self.pod.container(i).name.clone();
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "FailedPreStopHook",
                    format!("PreStopHook failed: {message}"),
                );
            }
        }
    }

    /// Starts the probes that are due, each as a task of the loop that
    /// reports to `probe_results`.
    fn launch_probes(&mut self) {
        let now = Instant::now();
        for i in 0..self.containers.len() {
            let c = &self.containers[i];
            let Some(id) = c.record.view.container_id.clone() else {
                continue;
            };
            if c.record.view.terminated.is_some() {
                continue;
            }
            for kind in c.probes.due(now) {
                let Some(probe) = self.pod.container(i).probes.get(kind).cloned() else {
                    continue;
                };
                self.containers[i].probes.launch(kind);
                let target = self.probe_target(id.clone(), kind);
                let runtime = self.ctx.runtime.clone();
                let results = self.probe_results.0.clone();
                let container_id = id.clone();
                crate::rt::spawn(async move {
                    let outcome = prober::run(&runtime, &probe, &target).await;
                    let _ = results
                        .send(ProbeResult {
                            container: i,
                            kind,
                            container_id,
                            outcome,
                        })
                        .await;
                })
                .detach();
            }
        }
    }

    /// A result counts for the instance it probed, if that still runs.
    async fn on_probe_result(&mut self, result: ProbeResult) {
        let Some(c) = self.containers.get(result.container) else {
            return;
        };
        let view = &c.record.view;
        if view.container_id.as_deref() != Some(result.container_id.as_str())
            || view.terminated.is_some()
        {
            return;
        }
        self.on_probe(result.container, result.kind, result.outcome)
            .await;
    }

    fn probe_target(&self, container_id: String, kind: ProbeKind) -> prober::Target {
        let pod_ip = if self.pod.host_network {
            Some(
                self.ctx
                    .host_ip
                    .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
            )
        } else {
            self.paths.as_ref().and_then(|p| p.pod_ips.first().copied())
        };
        let scratch = self
            .dir
            .join(format!("probe-{container_id}-{}.pid", kind.name()));
        prober::Target {
            container_id,
            pod_ip,
            netns: (!self.pod.host_network).then(|| self.dir.join("ns").join("net")),
            scratch,
        }
    }

    async fn on_probe(&mut self, i: usize, kind: ProbeKind, outcome: Outcome) {
        let name = self.pod.container(i).name.clone();
        crate::stats::own::probe_ran(
            [&self.pod.namespace, &self.pod.name, &self.pod.uid],
            &name,
            kind.name(),
            outcome == Outcome::Success,
        );
        if let Outcome::Failure(message) = &outcome {
            log::debug!(
                "pod {}: {name}: {} probe failed: {message}",
                self.pod.full_name(),
                kind.name()
            );
            let message = format!("{} probe failed: {message}", kind.name());
            self.event(Some(&name), EventType::Warning, "Unhealthy", message);
        }
        let probes = self.pod.container(i).probes.clone();
        let now = Instant::now();
        let verdict =
            self.containers[i]
                .probes
                .record(kind, &probes, outcome == Outcome::Success, now);
        if verdict != Verdict::Kill {
            return;
        }
        let c = &mut self.containers[i];
        let Some(id) = c.record.view.container_id.clone() else {
            return;
        };
        let grace = probes
            .get(kind)
            .and_then(|p| p.termination_grace)
            .unwrap_or(self.pod.termination_grace);
        c.kill_at = Some(now + grace);
        let signal = c.record.stop_signal();
        let message = format!(
            "Container {name} failed {} probe, will be restarted",
            kind.name().to_lowercase()
        );
        log::info!("pod {}: {message}", self.pod.full_name());
        self.event(Some(&name), EventType::Normal, "Killing", message);
        self.pre_stop(&[(i, id.clone())], now + grace).await;
        if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// Pulls the image, creates and starts a new instance of container `i`.
    async fn start_container(&mut self, i: usize) {
        let spec_container: Container = self.pod.container(i).clone();
        let now = Instant::now();
        {
            let c = &mut self.containers[i];
            if let Some(failed_at) = c.setup_failed_at
                && let Some(until) = c.setup_backoff.wait_until(failed_at, now)
            {
                let entering = if let Some((reason, message)) = &mut c.record.view.waiting
                    && reason == "ErrImagePull"
                {
                    *reason = "ImagePullBackOff".into();
                    *message = format!("Back-off pulling image {:?}", spec_container.image);
                    true
                } else {
                    false
                };
                c.retry_at = Some(until);
                if entering {
                    let name = Some(spec_container.name.as_str());
                    let image = &spec_container.image;
                    self.event(
                        name,
                        EventType::Normal,
                        "BackOff",
                        format!("Back-off pulling image {image:?}"),
                    );
                    self.event(
                        name,
                        EventType::Warning,
                        "Failed",
                        "Error: ImagePullBackOff".into(),
                    );
                }
                return;
            }
            let initializing = c
                .record
                .view
                .waiting
                .as_ref()
                .is_some_and(|(reason, _)| reason == "PodInitializing");
            if c.record.view.terminated.is_none()
                && (c.record.view.waiting.is_none() || initializing)
            {
                c.record.view.waiting = Some(("ContainerCreating".into(), String::new()));
            }
        }
        self.write_status();

        let cname = Some(spec_container.name.as_str());
        let present = spec_container.pull_policy != crate::pod::PullPolicy::Always
            && self.ctx.images.is_present(&spec_container.image);
        let image_name = spec_container.image.clone();
        if present {
            let message = format!("Container image {image_name:?} already present on machine");
            self.event(cname, EventType::Normal, "Pulled", message);
        } else if spec_container.pull_policy != crate::pod::PullPolicy::Never {
            self.event(
                cname,
                EventType::Normal,
                "Pulling",
                format!("Pulling image {image_name:?}"),
            );
        }
        let pull_started = Instant::now();
        let auth = self.registry_auth();
        let image = match self
            .ctx
            .images
            .ensure(&spec_container.image, spec_container.pull_policy, &auth)
            .await
        {
            Ok(image) => {
                if !present {
                    let message = format!(
                        "Successfully pulled image {image_name:?} in {:.3}s. Image size: {} bytes.",
                        pull_started.elapsed().as_secs_f64(),
                        image.size
                    );
                    self.event(cname, EventType::Normal, "Pulled", message);
                }
                image
            }
            Err(e) => {
                let reason = match &e {
                    ImageError::InvalidName(_) => "InvalidImageName",
                    ImageError::NeverPull { .. } => "ErrImageNeverPull",
                    _ => "ErrImagePull",
                };
                log::warn!(
                    "pod {}: container {}: {e}",
                    self.pod.full_name(),
                    spec_container.name
                );
                if reason == "ErrImagePull" {
                    let message = format!("Failed to pull image {image_name:?}: {e}");
                    self.event(cname, EventType::Warning, "Failed", message);
                }
                self.event(
                    cname,
                    EventType::Warning,
                    "Failed",
                    format!("Error: {reason}"),
                );
                self.setup_failed(i, reason, e.to_string());
                return;
            }
        };

        self.refresh_service_links().await;
        let env = match env::resolve(&self.pod, &spec_container, &self.objects, &self.downward()) {
            Ok(env) => env,
            Err(e) => {
                log::warn!(
                    "pod {}: container {}: {e}",
                    self.pod.full_name(),
                    spec_container.name
                );
                self.event(cname, EventType::Warning, "Failed", format!("Error: {e}"));
                self.setup_failed(i, "CreateContainerConfigError", e.to_string());
                return;
            }
        };
        let spec_container = match spec_container.expand_sub_paths(&env) {
            Ok(container) => container,
            Err(message) => {
                self.create_failed(i, "CreateContainerConfigError", message);
                return;
            }
        };
        let paths = match self.paths_for(&spec_container).await {
            Ok(paths) => paths,
            Err(message) => {
                self.create_failed(i, "CreateContainerError", message);
                return;
            }
        };
        let id = crate::state::random_hex();
        let bundle = Bundle::new(&self.dir, &id);
        let qos = self.pod.qos;
        // A crash between here and save_containers leaves a bundle no record
        // names; adoption removes such bundles.
        let setup = BundleSetup {
            bundle: bundle.clone(),
            pod: self.pod.clone(),
            container: spec_container.clone(),
            env,
            image: image.config.clone(),
            layers: image.layers.clone(),
            paths,
            cgroups_path: self.ctx.cgroups.container_path(qos, &self.pod.uid, &id),
            cgroup_version: self.ctx.cgroups.version,
            memory_capacity: self.ctx.memory_capacity,
            oom_score_floor: self.ctx.oom_score_floor,
            seccomp_root: self.ctx.layout.seccomp(),
            apparmor_default: crate::runtime::apparmor::host().default_profile(),
            recursive_read_only: self.ctx.recursive_read_only,
        };
        let user = match set_up_bundle(setup, self.ctx.runtime.clone(), id.clone()).await {
            Ok(user) => user,
            Err((reason, message)) => {
                log::warn!(
                    "pod {}: container {}: {message}",
                    self.pod.full_name(),
                    spec_container.name
                );
                let _ = bundle.remove(&self.ctx.runtime, &id).await;
                self.setup_failed(i, reason, message);
                return;
            }
        };

        let restart_count = {
            let c = &mut self.containers[i];
            c.restart_for_update = false;
            c.record.from_old_sandbox = false;
            c.kill_at = None;
            if let Some(previous) = c.record.view.terminated.take() {
                c.record.view.last_terminated = Some(previous);
                c.record.view.restart_count += 1;
            }
            c.record.view.image_id = image.id.clone();
            // Its groups as containerd reports them: the primary one too.
            let mut groups = vec![user.gid];
            groups.extend(user.additional_gids.iter().filter(|g| **g != user.gid));
            c.record.view.user = Some(status::ProcessUser {
                uid: user.uid,
                gid: user.gid,
                supplemental_groups: groups,
            });
            c.record.view.recursive_read_only = self.ctx.recursive_read_only;
            c.record.view.container_id = Some(id.clone());
            c.record.view.running_since = None;
            c.record.stop_signal = spec_container
                .stop_signal
                .clone()
                .or_else(|| image.config.stop_signal.clone());
            c.record.view.restart_count
        };
        self.save_containers();
        let log_path = self.log_path(&spec_container.name, restart_count);

        let created = async {
            let monitor = self.monitor.as_mut().ok_or("no monitor".to_owned())?;
            monitor
                .create(&id, &bundle.dir, &log_path, spec_container.input)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let started = match created {
            Ok(_) => {
                let name = &spec_container.name;
                self.event(
                    cname,
                    EventType::Normal,
                    "Created",
                    format!("Created container: {name}"),
                );
                self.ctx.runtime.start(&id).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        };
        match &started {
            Ok(()) => {
                let name = &spec_container.name;
                self.event(
                    cname,
                    EventType::Normal,
                    "Started",
                    format!("Started container {name}"),
                );
            }
            Err(message) => {
                self.event(
                    cname,
                    EventType::Warning,
                    "Failed",
                    format!("Error: {message}"),
                );
            }
        }
        let c = &mut self.containers[i];
        c.setup_failed_at = None;
        c.record.view.waiting = None;
        let started_at = Timestamp::now();
        match started {
            Ok(()) => {
                c.record.view.running_since = Some(started_at);
                c.probes = ProbeTracker::start(&spec_container.probes, Instant::now());
                // Upstream's backoff counts restarts: a first start, or the
                // first restart after a quiet period, is immediate.
                if restart_count > 0 {
                    c.restart_backoff.record_attempt(Instant::now());
                }
                log::info!(
                    "pod {}: started container {} ({id}, restart {restart_count})",
                    self.pod.full_name(),
                    spec_container.name
                );
                if let Some(hook) = &spec_container.hooks.post_start {
                    self.post_start(i, &id, hook).await;
                }
            }
            Err(message) => {
                // As upstream: a container that fails to start has ended,
                // with exit code 128, and the restart policy applies.
                log::warn!(
                    "pod {}: container {} failed to start: {message}",
                    self.pod.full_name(),
                    spec_container.name
                );
                c.record.view.terminated = Some(Terminated {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    started_at: None,
                    finished_at: started_at,
                    container_id: id.clone(),
                    message: Some(message.clone()),
                });
                c.exited_at = Some(Instant::now());
                if restart_count > 0 {
                    c.restart_backoff.record_attempt(Instant::now());
                }
                // No exit will be reported for it: the next pass, at once,
                // applies the restart policy (and its backoff).
                c.retry_at = Some(Instant::now());
                let _ = bundle.remove(&self.ctx.runtime, &id).await;
            }
        }
        self.prune_logs(i);
    }

    /// The sandbox's paths as `container` joins them: an ephemeral
    /// container with a target joins the target's PID namespace, which
    /// must run (upstream's runtimes refuse otherwise).
    async fn paths_for(&self, container: &Container) -> Result<Option<PodPaths>, String> {
        let Some(target) = &container.target else {
            return Ok(self.paths.clone());
        };
        let not_running = || format!("target container {target:?} is not running");
        let id = self
            .containers
            .iter()
            .find(|c| &c.record.view.name == target)
            .filter(|c| c.record.view.terminated.is_none())
            .and_then(|c| c.record.view.container_id.clone())
            .ok_or_else(not_running)?;
        let state = self
            .ctx
            .runtime
            .state(&id)
            .await
            .map_err(|e| e.to_string())?
            .filter(|s| s.pid > 0 && s.status == "running")
            .ok_or_else(not_running)?;
        Ok(self.paths.clone().map(|mut paths| {
            if !self.pod.host_pid {
                paths.pid_ns = Some(PathBuf::from(format!("/proc/{}/ns/pid", state.pid)));
            }
            paths
        }))
    }

    /// Deletes an instance from the runtime and removes its bundle (rootfs
    /// mount and all); a failure is logged, and the relist tries again.
    async fn remove_instance(&self, id: &str) {
        if let Err(e) = Bundle::new(&self.dir, id)
            .remove(&self.ctx.runtime, id)
            .await
        {
            log::warn!("pod {}: removing container {id}: {e}", self.pod.full_name());
        }
    }

    /// Container `i` could not be created: logged, a Failed event, and
    /// the setup backoff.
    fn create_failed(&mut self, i: usize, reason: &str, message: String) {
        log::warn!("pod {}: {message}", self.pod.full_name());
        let name = self.pod.container(i).name.clone();
        self.event(
            Some(&name),
            EventType::Warning,
            "Failed",
            format!("Error: {message}"),
        );
        self.setup_failed(i, reason, message);
    }

    fn setup_failed(&mut self, i: usize, reason: &str, message: String) {
        let now = Instant::now();
        let c = &mut self.containers[i];
        c.setup_backoff.record_attempt(now);
        c.setup_failed_at = Some(now);
        c.record.view.waiting = Some((reason.to_owned(), message));
        // ErrImagePull shows until the next sync, which then reports
        // ImagePullBackOff for the rest of the delay, as upstream.
        c.retry_at = if reason == "ErrImagePull" {
            Some(now + Duration::from_secs(1))
        } else {
            c.setup_backoff.wait_until(now, now)
        };
    }

    fn log_path(&self, container: &str, restart_count: u32) -> PathBuf {
        self.ctx
            .config
            .pod_logs_dir
            .join(self.pod.log_dir_name())
            .join(container)
            .join(format!("{restart_count}.log"))
    }

    /// Keeps the current and the previous instance's logs (what `logs
    /// --previous` needs), as upstream's container GC does.
    fn prune_logs(&self, i: usize) {
        let view = &self.containers[i].record.view;
        let dir = self
            .ctx
            .config
            .pod_logs_dir
            .join(self.pod.log_dir_name())
            .join(&view.name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let count: Option<u32> = name.split('.').next().and_then(|n| n.parse().ok());
            if count.is_some_and(|n| n + 1 < view.restart_count) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    fn record_exit(&mut self, i: usize, exit: Exit, note: &str) {
        let c = &mut self.containers[i];
        let reason = if exit.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        c.record.view.terminated = Some(Terminated {
            exit_code: exit.exit_code,
            signal: exit.signal,
            reason: reason.into(),
            started_at: c.record.view.running_since,
            finished_at: exit.finished_at,
            container_id: exit.id.clone(),
            message: None,
        });
        c.record.view.running_since = None;
        c.exited_at = Some(Instant::now());
        c.probes.stop();
        // Read while the bundle (and the file) is still there.
        let id = exit.id.clone();
        let message = self.termination_message(i, &id);
        let c = &mut self.containers[i];
        if let Some(t) = &mut c.record.view.terminated {
            t.message = message;
        }
        log::info!(
            "pod {}: container {} exited with code {}{}",
            self.pod.full_name(),
            c.record.view.name,
            exit.exit_code,
            if note.is_empty() {
                String::new()
            } else {
                format!(" ({note})")
            }
        );
    }

    /// An instance ended without a recorded exit: upstream reports such a
    /// container as ContainerStatusUnknown with exit code 137.
    fn record_unknown_exit(&mut self, i: usize, id: &str, note: &str) {
        let exit = Exit {
            id: id.to_owned(),
            pid: 0,
            exit_code: 137,
            signal: None,
            finished_at: Timestamp::now(),
        };
        self.record_exit(i, exit, note);
        if let Some(t) = &mut self.containers[i].record.view.terminated {
            t.reason = "ContainerStatusUnknown".into();
        }
    }

    async fn on_exit(&mut self, exit: Exit) {
        let Some(i) = self.containers.iter().position(|c| {
            c.record.view.container_id.as_deref() == Some(exit.id.as_str())
                && c.record.view.terminated.is_none()
        }) else {
            return;
        };
        let id = exit.id.clone();
        let cgroup = self
            .ctx
            .cgroups
            .container_path(self.pod.qos, &self.pod.uid, &id);
        let oom = exit.exit_code == 137 && crate::cgroup::oom_killed(&cgroup);
        self.record_exit(i, exit, if oom { "OOM-killed" } else { "" });
        if oom && let Some(t) = &mut self.containers[i].record.view.terminated {
            t.reason = "OOMKilled".into();
        }
        self.save_containers();
        self.write_status();
        // The instance is over; its logs stay, its runtime state and rootfs go.
        self.remove_instance(&id).await;
        let _ = std::fs::remove_file(
            self.dir
                .join(crate::runtime::protocol::EXITS_DIR)
                .join(format!("{id}.json")),
        );
    }

    /// The monitor died: nobody holds the containers' stdio or will see their
    /// exits. Rather than run containers without logs or exit codes, they
    /// are stopped and the restart policy decides, with a new monitor.
    async fn on_monitor_lost(&mut self) {
        if self.monitor.take().is_none() {
            return;
        }
        log::warn!(
            "pod {}: its monitor is gone; stopping its containers",
            self.pod.full_name()
        );
        for i in 0..self.containers.len() {
            let view = &self.containers[i].record.view;
            let Some(id) = view
                .container_id
                .clone()
                .filter(|_| view.terminated.is_none())
            else {
                continue;
            };
            if let Err(e) = self.ctx.runtime.kill(&id, "KILL").await {
                log::warn!("pod {}: {e}", self.pod.full_name());
            }
            self.record_unknown_exit(i, &id, "monitor lost");
            self.remove_instance(&id).await;
        }
        self.save_containers();
    }

    fn save_containers(&self) {
        let records: Vec<ContainerRecord> =
            self.containers.iter().map(|c| c.record.clone()).collect();
        if let Err(e) = checkpoint::write_containers(&self.dir, &records) {
            log::error!("pod {}: {e}", self.pod.full_name());
        }
    }

    fn write_status(&mut self) {
        let lifecycle = match (self.terminating, self.stopped) {
            (_, true) => Lifecycle::Stopped,
            (true, false) => Lifecycle::Terminating,
            (false, false) => Lifecycle::Running,
        };
        let pod_ips = self.pod_ips();
        let views: Vec<ContainerView> = self
            .containers
            .iter()
            .map(|c| ContainerView {
                probed_ready: c.probes.ready(),
                probed_started: c.probes.started(),
                ..c.record.view.clone()
            })
            .collect();
        let mut status = status::pod_status(
            &self.pod,
            &views,
            self.ctx.runtime.kind.name(),
            self.admitted,
            &pod_ips,
            lifecycle,
        );
        if let Some(ended) = &self.evicted {
            status::mark_ended(&mut status, &ended.reason, &ended.message);
        }
        status::add_resize_conditions(&mut status, &self.resize);
        status.host_ip = self.ctx.host_ip.map(|ip| ip.to_string());
        status.host_ips = self
            .ctx
            .host_ip
            .map(|ip| vec![core::HostIP { ip: ip.to_string() }]);
        status::carry_transition_times(self.last_status.as_ref(), &mut status);
        if self.last_status.as_ref() == Some(&status) {
            return;
        }
        if !self.start_observed && status.phase.as_deref() == Some("Running") {
            self.start_observed = true;
            let since = Timestamp::now().duration_since(self.admitted);
            crate::stats::own::pod_started(since.try_into().unwrap_or_default());
        }
        let record = PodRecord {
            uid: self.pod.uid.clone(),
            namespace: self.pod.namespace.clone(),
            name: self.pod.name.clone(),
            source: self.pod.source.clone(),
            admitted: self.admitted,
            terminating: self.terminating,
            log_dir: self.ctx.config.pod_logs_dir.join(self.pod.log_dir_name()),
            status: status.clone(),
        };
        if let Err(e) = checkpoint::write_record(&self.dir, &record) {
            log::error!("pod {}: {e}", self.pod.full_name());
        }
        if let Some(manager) = &self.ctx.status_manager {
            // Static pods' statuses go to their mirror pods.
            let mirrored = self.pod.source != super::API_SOURCE;
            manager.set(
                &self.pod.uid,
                &self.pod.namespace,
                &self.pod.name,
                status.clone(),
                mirrored,
            );
        }
        self.last_status = Some(status);
    }

    /// Stops every container (stop signal, grace period, SIGKILL), then
    /// removes everything of the pod.
    async fn terminate(&mut self) {
        let name = self.pod.full_name();
        let grace = self.grace_override.unwrap_or(self.pod.termination_grace);
        log::info!("pod {name}: terminating (grace period {grace:?})");
        self.write_status();
        let running: Vec<(usize, String)> = self
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| c.record.view.terminated.is_none())
            .filter_map(|(i, c)| c.record.view.container_id.clone().map(|id| (i, id)))
            .collect();
        let deadline = Instant::now() + grace;
        // Regular containers first, then sidecars in reverse order, all
        // within the one grace period.
        let is_sidecar = |i: usize| self.pod.container(i).role == ContainerRole::Sidecar;
        let (sidecars, others): (Vec<_>, Vec<_>) =
            running.iter().cloned().partition(|(i, _)| is_sidecar(*i));
        for (group, sidecars_too) in [(others, false), (sidecars, true)] {
            self.pre_stop(&group, deadline).await;
            for (i, id) in group.iter().rev() {
                let name = self.containers[*i].record.view.name.clone();
                self.event(
                    Some(&name),
                    EventType::Normal,
                    "Killing",
                    format!("Stopping container {name}"),
                );
                let signal = self.containers[*i].record.stop_signal();
                if let Err(e) = self.ctx.runtime.kill(id, &signal).await {
                    log::warn!("pod {name}: {e}");
                }
            }
            if !sidecars_too {
                self.wait_for_exits(deadline, false).await;
            }
        }
        if !self.wait_for_exits(deadline, true).await {
            for (_, id) in &running {
                if let Err(e) = self.ctx.runtime.kill(id, "KILL").await {
                    log::warn!("pod {name}: {e}");
                }
            }
            self.wait_for_exits(Instant::now() + Duration::from_secs(10), true)
                .await;
        }
        // The final status: the phase is terminal once nothing can run.
        self.stopped = self
            .containers
            .iter()
            .all(|c| c.record.view.terminated.is_some() || c.record.view.container_id.is_none());
        self.write_status();
        for (_, id) in &running {
            self.remove_instance(id).await;
        }
        self.cleanup().await;
        log::info!("pod {name}: terminated and removed");
    }

    /// Waits for every instance (but sidecars', unless `sidecars_too`) to
    /// have exited; false at the deadline.
    async fn wait_for_exits(&mut self, deadline: Instant, sidecars_too: bool) -> bool {
        loop {
            let still_running: Vec<String> = self
                .containers
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    sidecars_too || self.pod.container(*i).role != ContainerRole::Sidecar
                })
                .map(|(_, c)| c)
                .filter(|c| c.record.view.terminated.is_none())
                .filter_map(|c| c.record.view.container_id.clone())
                .collect();
            if still_running.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // Exits come from the monitor; the runtime is asked too, once a
            // second, in case the monitor is gone.
            let next = deadline.min(Instant::now() + Duration::from_secs(1));
            let exit = async {
                loop {
                    match self.exits_rx.recv().await {
                        Ok(MonitorEvent::Exit(exit)) => return Some(exit),
                        // The runtime is asked below instead.
                        Ok(MonitorEvent::Lost) => continue,
                        Err(_) => return None,
                    }
                }
            };
            let timer = async {
                smol::Timer::at(next).await;
                None
            };
            match exit.or(timer).await {
                Some(exit) => {
                    if let Some(i) = self.containers.iter().position(|c| {
                        c.record.view.container_id.as_deref() == Some(exit.id.as_str())
                    }) {
                        self.record_exit(i, exit, "");
                    }
                }
                None => {
                    // Unknown is not gone: asked again at the next check.
                    let Ok(listed) = self.ctx.runtime.list().await else {
                        continue;
                    };
                    for id in still_running {
                        let alive = listed.iter().any(|s| s.id == id && s.status != "stopped");
                        if !alive
                            && let Some(i) = self.containers.iter().position(|c| {
                                c.record.view.container_id.as_deref() == Some(id.as_str())
                            })
                        {
                            self.record_unknown_exit(i, &id, "seen stopped by the runtime");
                        }
                    }
                }
            }
        }
    }

    /// Removes the pod's sandbox, monitor, cgroups, logs and state.
    async fn cleanup(&mut self) {
        let name = self.pod.full_name();
        if let Some(mut monitor) = self.monitor.take()
            && let Err(e) = monitor.shutdown().await
        {
            log::warn!("pod {name}: {e}");
        }
        remove_pod_state(
            &self.ctx,
            &self.dir,
            self.pod.qos,
            &self.pod.uid,
            &self.ctx.config.pod_logs_dir.join(self.pod.log_dir_name()),
        )
        .await;
    }
}

/// Removes what a pod left on the host. Also used for pods whose checkpoint
/// cannot be read any more. Idempotent.
pub async fn remove_pod_state(
    ctx: &Context,
    dir: &Path,
    qos: crate::pod::QosClass,
    uid: &str,
    log_dir: &Path,
) {
    // Containers the runtime still knows under this pod's bundles.
    if let Ok(listed) = ctx.runtime.list().await {
        let containers_dir = dir.join("containers");
        for state in listed {
            if containers_dir.join(&state.id).is_dir() {
                let _ = Bundle::new(dir, &state.id)
                    .remove(&ctx.runtime, &state.id)
                    .await;
            }
        }
    }
    // Its monitor, if one still runs (a pod dir found without a usable
    // checkpoint): it would hold the dir's socket and run on, untracked.
    // A worker's own cleanup has shut it down already: nothing listens.
    let (unheard, _) = smol::channel::bounded(1);
    if let Ok(mut monitor) = monitor_client::connect(dir, unheard).await
        && let Err(e) = monitor.shutdown().await
    {
        log::warn!("pod {uid}: stopping its monitor: {e}");
    }
    if let Err(e) = sandbox::teardown(dir, &ctx.cni).await {
        log::warn!("pod {uid}: {e}");
    }
    if let Err(e) = ctx.cgroups.remove_pod(qos, uid) {
        log::warn!("pod {uid}: {e}");
    }
    let (dir, log_dir) = (dir.to_owned(), log_dir.to_owned());
    let removed = crate::helpers::unblock(move || {
        crate::state::remove_tree(&log_dir)?;
        crate::state::remove_tree(&dir)
    })
    .await;
    if let Err(e) = removed {
        log::warn!("pod {uid}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_terminate_interrupts_and_other_messages_wait_in_order() {
        smol::block_on(async {
            let (tx, rx) = smol::channel::unbounded();
            tx.try_send(Control::ResizePending(None)).unwrap();
            tx.try_send(Control::Evict {
                message: "m".into(),
                grace: Duration::ZERO,
            })
            .unwrap();
            tx.try_send(Control::Terminate { grace: None }).unwrap();
            let mut deferred = Vec::new();
            let got = until_terminate(&rx, &mut deferred).await;
            assert!(matches!(
                got,
                Some(Some(Control::Terminate { grace: None }))
            ));
            assert!(matches!(
                deferred.as_slice(),
                [Control::ResizePending(None), Control::Evict { .. }]
            ));
            // The agent gone is the end too.
            drop(tx);
            let mut none = Vec::new();
            assert!(matches!(until_terminate(&rx, &mut none).await, Some(None)));
        });
    }
}
