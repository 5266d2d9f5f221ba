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
use super::events::{EventType, Involved};
use super::objects::Kind;
use super::prober::{self, Outcome, ProbeTracker, Verdict};
use crate::image::ImageError;
use crate::pod::backoff::Backoff;
use crate::pod::env::{self, Downward};
use crate::pod::objects::{PodObjects, references, token_key};
use crate::pod::probe::ProbeKind;
use crate::pod::status::{self, ContainerView, Terminated, WaitingReason};
use crate::pod::volumes;
use crate::pod::{Container, ContainerRole, Pod, ProjectionSource, RestartPolicy, VolumeSource};
use crate::runtime::bundle_setup::{BundleSetup, SetupFailure};
use crate::runtime::monitor_client::{self, MonitorConnection, MonitorEvent};
use crate::runtime::protocol::Exit;
use crate::runtime::spec::PodPaths;
use crate::runtime::{Bundle, sandbox};
use crate::state::records::{self, Checkpoint, ContainerRecord, PodRecord};
use k8s_openapi::api::core::v1 as core;

mod devices;
mod ending;
mod plan;
mod pod_sandbox;
mod probes;
mod recovery;
mod stage;
mod start;
mod sync;
mod terminate;
mod update;

use pod_sandbox::VOLUME_REFRESH;
use stage::{Ended, Stage, dir_evicted};
pub use terminate::remove_pod_state;
use update::ResizeRetry;

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
pub(super) async fn until_terminate(
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

pub(super) struct ContainerState {
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
    /// Where the pod is in its life.
    stage: Stage,
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
    /// When the disk emptyDirs with a sizeLimit are measured next.
    storage_check_at: Option<Instant>,
    /// A measurement runs as a task of its own (a large emptyDir takes a
    /// while to walk) and reports here: why the pod must go, if it must.
    storage_verdicts: (Sender<Option<String>>, Receiver<Option<String>>),
    storage_measuring: bool,
    /// Its start was counted (or it started under an earlier agent).
    start_observed: bool,
    /// Where its in-place resize is, for the pod's conditions.
    resize: status::ResizeState,
    /// An in-place resize that could not be written yet, tried again.
    resize_retry: Option<ResizeRetry>,
}

/// A probe run's result, for the instance it ran against.
pub(super) struct ProbeResult {
    container: usize,
    kind: ProbeKind,
    container_id: String,
    outcome: Outcome,
}

pub(super) enum Wake {
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
        let saved = records::read_containers(&dir)
            .ok()
            .flatten()
            .unwrap_or_default();
        let containers = pod
            .every_container()
            .map(|c| ContainerState::of(c, &saved))
            .collect();
        let (exits_tx, exits_rx) = smol::channel::unbounded();
        let stage = match std::fs::read_to_string(dir_evicted(&dir)) {
            Ok(text) => Stage::Ended(Ended::from_text(&text)),
            Err(_) => Stage::Syncing,
        };
        let objects = records::read_objects(&dir)
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
            stage,
            start_observed: false,
            last_status: None,
            sandbox_backoff: Backoff::default(),
            objects,
            volumes_written: None,
            objects_changed,
            probe_results: smol::channel::unbounded(),
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
        self.allocate_devices().await;
        if self.stage.ended().is_some() {
            self.kill_all_now().await;
        }
        loop {
            if self.stage.is_terminating() {
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
            if !self.stage.is_released() && self.ran_to_its_end() {
                self.release_sandbox().await;
            }
            // An init container started: the next one may start now, not
            // at the next wake.
            if progressed && !self.pod.init_containers.is_empty() {
                continue;
            }
            let wake = self.next_wake();
            match self.wait_for_work(wake).await {
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
                        && self.stage.may_end()
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
            Some(Control::Relisted(states)) => {
                self.heal(&states).await;
            }
            Some(Control::Evict { message, grace }) => {
                if self.stage.may_end() {
                    self.evict(message, grace).await;
                }
            }
            Some(Control::Terminate { grace }) => {
                let pods = self.pod.termination_grace;
                self.stage.terminate(grace.map_or(pods, |g| g.min(pods)));
            }
            // The agent is gone: nothing will tell this worker more.
            None => self.stage.terminate(self.pod.termination_grace),
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let refresh = self
            .volumes_written
            .filter(|_| self.has_api_volumes() && !self.stage.is_released())
            .map(|t| t + VOLUME_REFRESH);
        self.containers
            .iter()
            .filter_map(|c| c.retry_at)
            .chain(self.containers.iter().filter_map(|c| c.kill_at))
            .chain(self.containers.iter().filter_map(|c| c.probes.next_at()))
            .chain(refresh)
            .chain(self.storage_check_at.filter(|_| self.stage.may_end()))
            .chain(self.active_deadline().filter(|_| self.stage.may_end()))
            .chain(self.resize_retry.as_ref().map(|r| r.at))
            .min()
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

    /// Waits for what calls for a pass. The relist's message calls for one
    /// only when it flagged something: it comes once a minute to every
    /// pod, and a pass (which writes the pod's records) for nothing each
    /// time is wakeups and SD card writes for nothing.
    async fn wait_for_work(&mut self, until: Option<Instant>) -> Wake {
        loop {
            match self.wait(until).await {
                Wake::Control(Some(Control::Relisted(states))) => {
                    if self.heal(&states).await {
                        return Wake::Timer;
                    }
                }
                other => return other,
            }
        }
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
        let terminal = self.stage.ended().is_some() || self.phase_is_terminal();
        terminal
            && self.containers.iter().all(|c| {
                c.record.view.running_since.is_none() || c.record.view.terminated.is_some()
            })
    }

    fn save_containers(&self) {
        let records: Vec<ContainerRecord> =
            self.containers.iter().map(|c| c.record.clone()).collect();
        if let Err(e) = records::write_containers(&self.dir, &records) {
            log::error!("pod {}: {e}", self.pod.full_name());
        }
    }

    fn write_status(&mut self) {
        let lifecycle = self.stage.lifecycle();
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
        if let Some(ended) = self.stage.ended() {
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
            terminating: self.stage.is_terminating(),
            log_dir: self.ctx.config.pod_logs_dir.join(self.pod.log_dir_name()),
            status: status.clone(),
        };
        if let Err(e) = records::write_record(&self.dir, &record) {
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
