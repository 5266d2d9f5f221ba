//! The agent's loop: it merges the pod sources into a desired set, starts a
//! worker per pod, tells workers of pods that went away to terminate, and
//! adopts what a previous run of the agent left.

pub(crate) mod admission;
pub(crate) mod api_source;
pub(crate) mod events;
pub(crate) mod eviction;
pub(crate) mod grpc_health;
pub(crate) mod memory_pressure;
pub(crate) mod mirror;
pub(crate) mod node;
pub(crate) mod objects;
mod pod_manager;
pub(crate) mod prober;
pub(crate) mod relist;
mod setup;
pub(crate) mod sources;
pub(crate) mod status;
pub(crate) mod worker;

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::{FutureExt, StreamExt};
use jiff::Timestamp;
use smol::channel::Sender;

use self::pod_manager::{Command, PodManager};
use self::sources::ManifestSource;
use self::status::StatusManager;
use self::worker::{Control, Worker};
use crate::cgroup::Hierarchy;
use crate::config::Config;
use crate::image::ImageService;
use crate::kube::watch::Reflector;
use crate::pod::Pod;
use crate::runtime::cni::Cni;
use crate::runtime::monitor_client::MonitorSettings;
use crate::runtime::runc::Runtime;
use crate::state::records::{self, Rejected};
use crate::state::{self, Layout, StateError};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    StateFormat(#[from] crate::state::format::FormatError),
    #[error("runtime {path}: {message}")]
    Runtime { path: String, message: String },
    #[error("{0}")]
    Setup(String),
}

/// What every pod worker shares.
pub struct Context {
    pub config: Config,
    pub layout: Layout,
    pub images: ImageService,
    pub runtime: Runtime,
    pub monitor: MonitorSettings,
    pub cgroups: Hierarchy,
    pub memory_capacity: u64,
    /// The lowest oom_score_adj containers can get (`oom_score::floor`).
    pub oom_score_floor: Option<i32>,
    /// The runtime and kernel make recursively read-only mounts.
    pub recursive_read_only: bool,
    /// The node's InternalIP, for pods' hostIP (and podIP on the host
    /// network).
    pub host_ip: Option<std::net::IpAddr>,
    /// Cluster mode: where API pods' statuses go.
    pub status_manager: Option<Rc<StatusManager>>,
    /// Cluster mode: the Node's UID once registered (mirror pods' owner).
    pub node_uid: Rc<std::cell::RefCell<Option<String>>>,
    /// Cluster mode: the Node as the API server last returned it, for
    /// admission (labels and taints an administrator set).
    pub api_node: Rc<std::cell::RefCell<Option<admission::NodeView>>>,
    /// Cluster mode: events for users.
    pub events: Option<Rc<events::EventRecorder>>,
    /// Cluster mode: ConfigMaps, Secrets and tokens for pods.
    pub objects: Option<objects::ObjectSource>,
    /// The pod network's plugins and configuration.
    pub cni: Cni,
    /// The node's pressure conditions, and what to evict.
    pub eviction: eviction::EvictionManager,
    /// Device plugins' devices, and which containers hold them.
    pub devices: Rc<crate::device::DeviceManager>,
}

/// A running worker: how to tell it things, and its task.
struct WorkerLink {
    control: Sender<Control>,
    _task: smol::Task<()>,
}

/// What the kubelet API server is given of the agent.
fn server_deps(ctx: &Context) -> Rc<crate::server::Deps> {
    Rc::new(crate::server::Deps {
        config: ctx.config.clone(),
        layout: ctx.layout.clone(),
        cgroups: ctx.cgroups.clone(),
        host_ip: ctx.host_ip,
        runtime: ctx.runtime.clone(),
    })
}

/// `Pod::source` of pods from the API server (static pods carry their
/// manifest's path).
pub const API_SOURCE: &str = "api";

/// Runs the agent; `launcher` forks its pods' monitors, if there is one.
pub async fn run(
    config: Config,
    launcher: Option<crate::monitor::launcher::Launcher>,
) -> Result<(), AgentError> {
    let (ctx, runtime_version, cluster) = setup::context(config, launcher).await?;
    setup::spawn_services(&ctx).await;
    let (done_tx, done_rx) = smol::channel::unbounded::<String>();
    let mut agent = Agent {
        ctx: ctx.clone(),
        manager: PodManager::default(),
        workers: Workers {
            ctx: ctx.clone(),
            links: HashMap::new(),
            done: done_tx,
        },
        mirrors: None,
        reported: None,
        unreadable_logged: false,
        qos_written: None,
    };

    // Adopt what the previous run admitted: its workers reattach to running
    // containers, or clean up pods that are no longer wanted. Pods from the
    // API server keep running from here until the API server says otherwise,
    // also when it cannot be reached.
    let adopted = adopt_checkpoints(&ctx).await;
    // Devices of pods that are gone for good are free; the adopted keep
    // theirs.
    ctx.devices
        .keep_only(|uid| adopted.iter().any(|(pod, _)| pod.uid == uid));
    for (pod, admitted) in adopted {
        log::info!("adopting pod {} ({})", pod.full_name(), pod.uid);
        let command = agent.manager.adopt(pod, admitted);
        agent.workers.carry_out(command);
    }

    let (api_pods, api_changed) = match cluster {
        Some(cluster) => {
            let joined = setup::join(&ctx, cluster, &runtime_version).await?;
            agent.mirrors = Some(joined.mirrors);
            (Some(joined.pods), Some(joined.changed))
        }
        None => (None, None),
    };
    let mut source = ctx.config.static_pod_path.clone().map(|dir| {
        ManifestSource::new(
            dir,
            ctx.config.file_check_frequency,
            ctx.config.max_pods as usize,
            ctx.config
                .kubeconfig
                .as_ref()
                .map(|_| ctx.config.node_name.clone()),
        )
    });
    let mut signals =
        async_signal::Signals::new([async_signal::Signal::Term, async_signal::Signal::Int])
            .map_err(|e| AgentError::Setup(format!("signals: {e}")))?;
    let registered_node = admission::NodeView {
        name: ctx.config.node_name.clone(),
        labels: node::labels(&ctx),
        taints: ctx.config.register_with_taints.clone(),
        extended: Default::default(),
    };
    let mut capacity = {
        let (cpu_milli, memory) = node::allocatable(&ctx);
        admission::Capacity {
            cpu_milli,
            memory,
            pods: u64::from(ctx.config.max_pods),
            extended: Default::default(),
            ephemeral_storage: node::storage_allocatable(&ctx, node::storage_capacity(&ctx)),
            devices: Default::default(),
        }
    };

    if let Err(e) = ctx.cgroups.update_pods(&node::pods_cgroup_limits(&ctx)) {
        log::warn!("the kubepods cgroup: {e}");
    }
    // After kubepods exists: its memory events are watched where the
    // kernel has no PSI.
    let pressure = memory_pressure::watch(ctx.cgroups.pods_memory_events().as_deref());
    let candidates = eviction::Candidates::default();
    let (evict_tx, evict_rx) = smol::channel::unbounded();
    crate::rt::spawn(eviction::run(
        ctx.clone(),
        candidates.clone(),
        evict_tx,
        pressure,
    ))
    .detach();
    // After the adoptions above: the relist's first list waits for them.
    let (relisted_tx, relisted_rx) = smol::channel::bounded(1);
    let _relist = crate::rt::spawn(relist::run(ctx.clone(), relisted_tx));
    loop {
        let node_view = ctx
            .api_node
            .borrow()
            .clone()
            .unwrap_or_else(|| registered_node.clone());
        agent.sync_static_pods(source.as_ref(), &node_view).await;
        // Until its first list, the API server says nothing about which
        // pods should not run.
        capacity.extended = node_view.extended.clone();
        capacity.devices = ctx.devices.allocatable();
        if let Some(reflector) = &api_pods {
            agent.sync_api_pods(reflector, &node_view, &capacity);
        }
        // What the eviction manager may pick from: pods not on their way out.
        *candidates.borrow_mut() = agent.manager.candidates();
        agent.update_qos_cgroups();

        let changed = async {
            match &mut source {
                Some(s) => s.changed().await,
                None => std::future::pending().await,
            }
            Event::Changed
        };
        let api_change = async {
            match &api_changed {
                Some(rx) if rx.recv().await.is_ok() => Event::Changed,
                _ => std::future::pending().await,
            }
        };
        let signal = async {
            signals.next().await;
            Event::Signal
        };
        let event = changed
            .or(api_change)
            .or(received(&done_rx, Event::Done))
            .or(received(&evict_rx, Event::Evict))
            .or(received(&relisted_rx, Event::Relisted))
            .or(signal)
            .await;
        match event {
            Event::Changed => {
                if let Some(mirrors) = &agent.mirrors {
                    mirrors.poke();
                }
                if let Some(status) = &ctx.status_manager {
                    status.poke();
                }
            }
            Event::Done(uid) => agent.finished(&uid),
            Event::Relisted(relisted) => agent.relisted(relisted),
            Event::Evict(order) => {
                if let Some(command) = agent.manager.evict(order) {
                    agent.workers.carry_out(command);
                }
            }
            Event::Signal => {
                log::info!("stopping; pods keep running and will be adopted by the next start");
                let _ = std::fs::remove_file(ctx.layout.agent_pid());
                return Ok(());
            }
        }
    }
}

/// What wakes the loop.
enum Event {
    /// The manifests or the API server's pods changed.
    Changed,
    /// A worker ended.
    Done(String),
    Relisted(relist::Relisted),
    Evict(eviction::Order),
    Signal,
}

/// The next message of `channel` as an event; never, once it is closed.
async fn received<T>(channel: &smol::channel::Receiver<T>, event: fn(T) -> Event) -> Event {
    match channel.recv().await {
        Ok(message) => event(message),
        Err(_) => std::future::pending().await,
    }
}

/// The running workers, which the pod manager's commands reach.
struct Workers {
    ctx: Rc<Context>,
    links: HashMap<String, WorkerLink>,
    /// Where a worker says it ended, with its pod's UID.
    done: Sender<String>,
}

impl Workers {
    fn carry_out(&mut self, command: Command) {
        match command {
            Command::Start { pod, admitted } => {
                let (control, control_rx) = smol::channel::unbounded();
                let uid = pod.uid.clone();
                let worker = Worker::new(self.ctx.clone(), *pod, admitted, control_rx);
                let done = self.done.clone();
                let task_uid = uid.clone();
                let task = crate::rt::spawn(async move {
                    worker.run().await;
                    let _ = done.send(task_uid).await;
                });
                self.links.insert(
                    uid,
                    WorkerLink {
                        control,
                        _task: task,
                    },
                );
            }
            Command::Tell { uid, control } => {
                if let Some(worker) = self.links.get(&uid) {
                    let _ = worker.control.try_send(control);
                }
            }
            Command::Refuse {
                uid,
                namespace,
                name,
                reason,
                message,
            } => {
                if let Some(status) = &self.ctx.status_manager {
                    let failed = api_source::rejected_status(&reason, &message);
                    status.set(&uid, &namespace, &name, failed, false);
                }
            }
            Command::FinalDelete {
                uid,
                namespace,
                name,
            } => {
                if let Some(status) = &self.ctx.status_manager {
                    status.delete(&uid, &namespace, &name);
                }
            }
        }
    }
}

/// The loop's state between events.
struct Agent {
    ctx: Rc<Context>,
    manager: PodManager,
    workers: Workers,
    mirrors: Option<Rc<mirror::MirrorManager>>,
    /// The rejected manifests last written for `nanolet pods`.
    reported: Option<Vec<Rejected>>,
    unreadable_logged: bool,
    /// The Burstable class's CPU weight last written.
    qos_written: Option<u64>,
}

impl Agent {
    /// The manifests' pods as the desired static pods.
    async fn sync_static_pods(
        &mut self,
        source: Option<&ManifestSource>,
        node_view: &admission::NodeView,
    ) {
        let scan = match source {
            Some(s) => {
                s.scan(node_view, self.manager.uids().cloned().collect())
                    .await
            }
            None => Some(Default::default()),
        };
        let Some(scan) = scan else {
            if !self.unreadable_logged {
                log::warn!("cannot read the manifest directory; keeping the pods that run");
                self.unreadable_logged = true;
            }
            return;
        };
        self.unreadable_logged = false;
        report_rejected(&self.ctx, &scan.rejected, &mut self.reported);
        let desired: HashMap<String, Pod> =
            scan.pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        if let Some(mirrors) = &self.mirrors {
            mirrors.set_static(
                desired
                    .iter()
                    .map(|(uid, p)| (uid.clone(), p.manifest.clone()))
                    .collect(),
            );
        }
        for command in self.manager.static_pods(desired, Timestamp::now()) {
            self.workers.carry_out(command);
        }
    }

    /// The API server's pods for this node as the desired API pods, once
    /// it has listed them.
    fn sync_api_pods(
        &mut self,
        reflector: &Reflector,
        node_view: &admission::NodeView,
        capacity: &admission::Capacity,
    ) {
        let snapshot = reflector.snapshot();
        if !snapshot.synced {
            return;
        }
        let manager = &mut self.manager;
        let sorted = api_source::sort(&snapshot.objects, node_view, |uid| manager.runs(uid));
        let commands = manager.api_pods(
            sorted,
            |uid| snapshot.objects.contains_key(uid),
            capacity,
            self.ctx.eviction.pressure(),
            Timestamp::now(),
        );
        for command in commands {
            self.workers.carry_out(command);
        }
    }

    /// The Burstable class's weight follows its pods' CPU requests.
    fn update_qos_cgroups(&mut self) {
        let burstable_cpu = self.manager.burstable_cpu();
        if self.qos_written != Some(burstable_cpu) {
            match self.ctx.cgroups.update_qos(burstable_cpu) {
                Ok(()) => self.qos_written = Some(burstable_cpu),
                Err(e) => log::warn!("QoS cgroups: {e}"),
            }
        }
    }

    fn finished(&mut self, uid: &str) {
        self.workers.links.remove(uid);
        self.manager.finished(uid);
        self.ctx.devices.release(uid);
        self.ctx.images.wake_gc();
        if let Some(status) = &self.ctx.status_manager {
            status.finished(uid);
        }
    }

    fn relisted(&mut self, relist::Relisted { listed, sweep }: relist::Relisted) {
        let links = &self.workers.links;
        // Who owns what is read now, after the list: a container of a pod
        // whose worker started since is that worker's.
        let (mut by_pod, orphans) = relist::assign(listed, &self.ctx.layout.pods(), |uid| {
            links.contains_key(uid)
        });
        // Every pod: one whose containers are all gone hears it too.
        for (uid, worker) in links {
            let states = by_pod.remove(uid).unwrap_or_default();
            let _ = worker.control.try_send(Control::Relisted(states));
        }
        // Containers first: what the sweep kills in pods' cgroups would
        // leave them in the runtime's state.
        let ctx = self.ctx.clone();
        crate::rt::spawn(async move {
            relist::remove_orphans(ctx.clone(), orphans).await;
            if sweep {
                relist::remove_leftovers(ctx).await;
            }
        })
        .detach();
    }
}

/// Waits for a wake-up on `woken`, or `retry` at the latest: how the
/// status and mirror managers pace their retries.
async fn woken_or_after(woken: &smol::channel::Receiver<()>, retry: Duration) {
    let timer = async {
        smol::Timer::after(retry).await;
    };
    let wake = async {
        let _ = woken.recv().await;
    };
    futures_lite::future::or(timer, wake).await;
}

/// Whether a container's CPU or memory changed: an in-place resize.
pub(crate) fn resized(old: &Pod, new: &Pod) -> bool {
    let amounts = |p: &Pod| -> Vec<[Option<u64>; 4]> {
        p.all_containers()
            .map(|c| {
                let r = &c.resources;
                [
                    r.cpu_request_milli,
                    r.cpu_limit_milli,
                    r.memory_request,
                    r.memory_limit,
                ]
            })
            .collect()
    };
    amounts(old) != amounts(new)
}

/// Logs newly rejected manifests once and writes the list for `nanolet
/// pods` when it changed.
fn report_rejected(ctx: &Context, rejected: &[Rejected], reported: &mut Option<Vec<Rejected>>) {
    let same =
        |a: &Rejected, b: &Rejected| a.file == b.file && a.index == b.index && a.reason == b.reason;
    let previous = reported.as_deref().unwrap_or_default();
    if reported.is_some()
        && rejected.len() == previous.len()
        && rejected.iter().zip(previous).all(|(a, b)| same(a, b))
    {
        return;
    }
    for r in rejected {
        if !previous.iter().any(|p| same(p, r)) {
            log::error!("manifest {} (document {}): {}", r.file, r.index, r.reason);
        }
    }
    // Keep the first sighting's time, so AGE counts from when it was seen.
    let kept: Vec<Rejected> = rejected
        .iter()
        .map(|r| {
            previous
                .iter()
                .find(|p| same(p, r))
                .cloned()
                .unwrap_or_else(|| r.clone())
        })
        .collect();
    let path = ctx.layout.rejected_manifests();
    if let Err(e) = state::write_json(&path, &kept, 0o644, state::Durability::ProcessCrash) {
        log::error!("{e}");
    }
    *reported = Some(kept);
}

/// Pods the previous run admitted, from their checkpoints. A checkpoint
/// that no longer validates is cleaned up here, since no worker can own it.
async fn adopt_checkpoints(ctx: &Rc<Context>) -> Vec<(Pod, Timestamp)> {
    let mut pods = Vec::new();
    let Ok(entries) = std::fs::read_dir(ctx.layout.pods()) else {
        return pods;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let uid = entry.file_name().to_string_lossy().into_owned();
        let checkpoint = records::read_checkpoint(&dir).ok().flatten();
        let pod = checkpoint.as_ref().and_then(|c| {
            let value = serde_json::to_value(&c.manifest).ok()?;
            crate::pod::validate(&value, &c.source, &c.uid)
                .ok()
                .map(|p| (p, c.admitted))
        });
        match pod {
            Some((pod, admitted)) if pod.uid == uid => pods.push((pod, admitted)),
            _ => {
                log::warn!(
                    "pod dir {} has no usable checkpoint; removing it",
                    dir.display()
                );
                let log_dir = records::read_record(&dir)
                    .ok()
                    .flatten()
                    .map(|r| r.log_dir)
                    .unwrap_or_else(|| ctx.config.pod_logs_dir.join(format!("_none_{uid}")));
                for qos in [
                    crate::pod::QosClass::Guaranteed,
                    crate::pod::QosClass::Burstable,
                    crate::pod::QosClass::BestEffort,
                ] {
                    let _ = ctx.cgroups.remove_pod(qos, &uid);
                }
                worker::remove_pod_state(
                    ctx,
                    &dir,
                    crate::pod::QosClass::BestEffort,
                    &uid,
                    &log_dir,
                )
                .await;
            }
        }
    }
    pods
}
