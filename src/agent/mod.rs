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
use crate::http::Client;
use crate::image::gc::GcPolicy;
use crate::image::registry::Registry;
use crate::image::store::Store;
use crate::image::{ImageService, PullLimits, unpack};
use crate::kube::Api;
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
    let layout = Layout::new(&config.state_dir);
    state::create_dir_all(&layout.root, 0o700)?;
    state::create_dir_all(&layout.pods(), 0o700)?;
    state::create_dir_all(&config.pod_logs_dir, 0o755)?;
    state::write_atomic(
        &layout.agent_pid(),
        std::process::id().to_string().as_bytes(),
        0o644,
        state::Durability::ProcessCrash,
    )?;

    let runtime = Runtime::new(
        config.runtime,
        config.runtime_path.clone(),
        layout.runtime_root(),
    );
    let version = runtime.version().await.map_err(|e| AgentError::Runtime {
        path: config.runtime_path.display().to_string(),
        message: e.to_string(),
    })?;
    log::info!(
        "nanolet {} starting: runtime {}://{version}, cgroups {:?}, state {}",
        env!("CARGO_PKG_VERSION"),
        config.runtime.name(),
        crate::cgroup::detect(),
        layout.root.display()
    );
    for escape in crate::runtime::advisories::known_escapes(config.runtime, &version) {
        log::warn!("{escape}: upgrade the runtime");
    }
    let recursive_read_only = runtime.supports_recursive_read_only().await;
    let http = Client::new(config.ca_file.clone(), config.insecure_registries.clone());
    let registry = Registry::new(http, config.registry_mirrors.clone());
    let store = Store::open(&layout.images())?;
    let executable =
        std::env::current_exe().map_err(|e| AgentError::Setup(format!("own executable: {e}")))?;

    // Cluster mode: the API server's pods for this node, and where their
    // statuses go.
    let cluster = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = crate::kube::Kubeconfig::load(path)
                .map_err(|e| AgentError::Setup(e.to_string()))?;
            log::info!(
                "joining the cluster at {} as node {}",
                kubeconfig.server,
                config.node_name
            );
            let api = Api::new(&kubeconfig, &config.node_name);
            let (pods, changed) = Reflector::new(
                api.clone(),
                "/api/v1/pods",
                &format!("spec.nodeName={}", config.node_name),
            );
            let status = StatusManager::new(api.clone(), pods.clone());
            Some((api, pods, changed, status))
        }
        None => None,
    };

    let host_ip = config.node_ip.or_else(node::default_route_ip);
    let cni = Cni {
        conf_dir: config.cni_conf_dir.clone(),
        bin_dirs: config.cni_bin_dirs.clone(),
        parked_dir: layout.root.join("cni-parked"),
    };
    match cni.network() {
        Ok(Some((path, list))) => log::info!(
            "pod network: CNI {:?} (version {}) from {}",
            list.name,
            list.cni_version,
            path.display()
        ),
        Ok(None) => log::warn!(
            "no CNI network configuration in {}: pods off the host network get loopback only",
            cni.conf_dir.display()
        ),
        Err(e) => log::error!("{e}"),
    }
    let oom_score_floor = crate::runtime::oom_score::floor();
    if let Some(floor) = oom_score_floor {
        log::warn!(
            "no CAP_SYS_RESOURCE: containers get no oom_score_adj below the agent's own, {floor}"
        );
    }
    let ctx = Rc::new(Context {
        oom_score_floor,
        cni,
        images: ImageService::new(
            registry,
            store,
            GcPolicy {
                high_percent: config.image_gc_high_threshold_percent,
                low_percent: config.image_gc_low_threshold_percent,
                min_age: config.image_minimum_gc_age,
                max_age: config.image_maximum_gc_age,
                pinned: config
                    .pinned_images
                    .iter()
                    .filter_map(|i| ImageService::normalise(i))
                    .collect(),
            },
            PullLimits {
                layer: unpack::Limits {
                    max_bytes: config.max_layer_size,
                    max_entries: config.max_layer_entries,
                    contents: unpack::Contents {
                        fifos: config.layer_fifos,
                        refuse_devices: config.layer_refuse_devices,
                        setuid: config.layer_setuid,
                    },
                },
                image_bytes: config.max_image_size,
            },
        ),
        monitor: MonitorSettings {
            executable,
            launcher: launcher.and_then(|l| {
                crate::runtime::monitor_client::LauncherClient::new(l)
                    .map_err(|e| log::warn!("the monitor launcher: {e}"))
                    .ok()
                    .map(Rc::new)
            }),
            runtime_path: config.runtime_path.clone(),
            runtime_root: layout.runtime_root(),
            max_log_size: config.container_log_max_size,
            max_log_files: config.container_log_max_files,
        },
        cgroups: Hierarchy::new(&config.cgroup_root),
        memory_capacity: crate::cgroup::memory_capacity(),
        recursive_read_only,
        host_ip,
        status_manager: cluster.as_ref().map(|c| c.3.clone()),
        objects: cluster
            .as_ref()
            .map(|c| objects::ObjectSource::new(c.0.clone())),
        events: cluster
            .as_ref()
            .map(|c| events::EventRecorder::new(c.0.clone(), &config.node_name)),
        node_uid: Rc::default(),
        api_node: Rc::default(),
        eviction: eviction::EvictionManager::new(config.eviction.clone()),
        runtime,
        layout,
        config,
    });
    // Child processes are reaped on the loop, not by a thread of their own.
    crate::rt::spawn(async_process::driver()).detach();
    // Before any pod is admitted: admission and specs depend on it.
    crate::runtime::apparmor::prepare_host().await;
    // Networks of pods whose DEL failed before: released now if possible.
    let retry_ctx = ctx.clone();
    crate::rt::spawn(async move { retry_ctx.cni.retry_parked().await }).detach();
    crate::rt::spawn(crate::rt::measure_lag(Duration::from_secs(5))).detach();
    crate::rt::spawn(collect_images(ctx.clone())).detach();
    let candidates = eviction::Candidates::default();
    let (evict_tx, evict_rx) = smol::channel::unbounded();
    if ctx.config.healthz_port != 0 {
        let addr =
            std::net::SocketAddr::new(ctx.config.healthz_bind_address, ctx.config.healthz_port);
        // As upstream: a taken port costs the health endpoint, not the pods.
        match crate::server::bind_healthz(addr) {
            Ok(healthz) => crate::rt::spawn(healthz).detach(),
            Err(e) => log::error!("healthz: {e}"),
        }
    }
    if ctx.config.read_only_port != 0 {
        match crate::server::bind_read_only(server_deps(&ctx)) {
            Ok(serving) => crate::rt::spawn(serving).detach(),
            Err(e) => log::error!("read-only port: {e}"),
        }
    }

    let (done_tx, done_rx) = smol::channel::unbounded::<String>();
    let mut manager = PodManager::default();
    let mut workers: HashMap<String, WorkerLink> = HashMap::new();
    let carry_out = |command: Command, workers: &mut HashMap<String, WorkerLink>| match command {
        Command::Start { pod, admitted } => {
            let (control, control_rx) = smol::channel::unbounded();
            let uid = pod.uid.clone();
            let worker = Worker::new(ctx.clone(), *pod, admitted, control_rx);
            let done = done_tx.clone();
            let task_uid = uid.clone();
            let task = crate::rt::spawn(async move {
                worker.run().await;
                let _ = done.send(task_uid).await;
            });
            workers.insert(
                uid,
                WorkerLink {
                    control,
                    _task: task,
                },
            );
        }
        Command::Tell { uid, control } => {
            if let Some(worker) = workers.get(&uid) {
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
            if let Some(status) = &ctx.status_manager {
                let failed = api_source::rejected_status(&reason, &message);
                status.set(&uid, &namespace, &name, failed, false);
            }
        }
        Command::FinalDelete {
            uid,
            namespace,
            name,
        } => {
            if let Some(status) = &ctx.status_manager {
                status.delete(&uid, &namespace, &name);
            }
        }
    };

    // Adopt what the previous run admitted: its workers reattach to running
    // containers, or clean up pods that are no longer wanted. Pods from the
    // API server keep running from here until the API server says otherwise,
    // also when it cannot be reached.
    for (pod, admitted) in adopt_checkpoints(&ctx).await {
        log::info!("adopting pod {} ({})", pod.full_name(), pod.uid);
        carry_out(manager.adopt(pod, admitted), &mut workers);
    }

    let mut api_changed = None;
    let mut api_pods = None;
    let mut mirrors: Option<Rc<mirror::MirrorManager>> = None;
    if let Some((api, pods, changed, status)) = cluster {
        let api_for_mirrors = api.clone();
        let mut facts =
            node::NodeFacts::gather(&ctx, format!("{}://{version}", ctx.config.runtime.name()));
        let user_namespaces =
            crate::runtime::userns::probe(&ctx.config.state_dir, &ctx.monitor.executable).await;
        if let Err(why) = &user_namespaces {
            log::info!("pods with hostUsers: false cannot run on this node: {why}");
        }
        facts.user_namespaces = user_namespaces.is_ok();
        // The kubelet API: how the API server reaches this node for logs.
        let authority = crate::server::auth::Authority::new(
            ctx.config.api_auth.clone(),
            api.clone(),
            &ctx.config.node_name,
        );
        let server = crate::server::bind(server_deps(&ctx), Rc::new(authority))
            .map_err(|e| AgentError::Setup(format!("kubelet API: {e}")))?;
        crate::rt::spawn(server).detach();
        crate::rt::spawn(node::run(ctx.clone(), api, facts)).detach();
        crate::rt::spawn(pods.clone().run()).detach();
        crate::rt::spawn(status.run()).detach();
        if let Some(events) = &ctx.events {
            crate::rt::spawn(events.clone().run()).detach();
        }
        let manager = mirror::MirrorManager::new(
            api_for_mirrors,
            pods.clone(),
            &ctx.config.node_name,
            ctx.node_uid.clone(),
        );
        crate::rt::spawn(manager.clone().run()).detach();
        mirrors = Some(manager);
        api_changed = Some(changed);
        api_pods = Some(pods);
    }

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
    let mut reported: Option<Vec<Rejected>> = None;
    let mut unreadable_logged = false;
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
        }
    };

    if let Err(e) = ctx.cgroups.update_pods(&node::pods_cgroup_limits(&ctx)) {
        log::warn!("the kubepods cgroup: {e}");
    }
    // After kubepods exists: its memory events are watched where the
    // kernel has no PSI.
    let pressure = memory_pressure::watch(ctx.cgroups.pods_memory_events().as_deref());
    crate::rt::spawn(eviction::run(
        ctx.clone(),
        candidates.clone(),
        evict_tx,
        pressure,
    ))
    .detach();
    let mut qos_written: Option<u64> = None;
    // After the adoptions above: the relist's first list waits for them.
    let (relisted_tx, relisted_rx) = smol::channel::bounded(1);
    let _relist = crate::rt::spawn(relist::run(ctx.clone(), relisted_tx));
    loop {
        let node_view = ctx
            .api_node
            .borrow()
            .clone()
            .unwrap_or_else(|| registered_node.clone());
        let scan = match &source {
            Some(s) => s.scan(&node_view, manager.uids().cloned().collect()).await,
            None => Some(Default::default()),
        };
        match scan {
            None if !unreadable_logged => {
                log::warn!("cannot read the manifest directory; keeping the pods that run");
                unreadable_logged = true;
            }
            None => {}
            Some(scan) => {
                unreadable_logged = false;
                report_rejected(&ctx, &scan.rejected, &mut reported);
                let desired: HashMap<String, Pod> =
                    scan.pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
                if let Some(mirrors) = &mirrors {
                    mirrors.set_static(
                        desired
                            .iter()
                            .map(|(uid, p)| (uid.clone(), p.manifest.clone()))
                            .collect(),
                    );
                }
                for command in manager.static_pods(desired, Timestamp::now()) {
                    carry_out(command, &mut workers);
                }
            }
        }

        // Until its first list, the API server says nothing about which
        // pods should not run.
        capacity.extended = node_view.extended.clone();
        if let Some(reflector) = &api_pods {
            let snapshot = reflector.snapshot();
            if snapshot.synced {
                let sorted =
                    api_source::sort(&snapshot.objects, &node_view, |uid| manager.runs(uid));
                let commands = manager.api_pods(
                    sorted,
                    |uid| snapshot.objects.contains_key(uid),
                    &capacity,
                    ctx.eviction.pressure(),
                    Timestamp::now(),
                );
                for command in commands {
                    carry_out(command, &mut workers);
                }
            }
        }

        // What the eviction manager may pick from: pods not on their way out.
        *candidates.borrow_mut() = manager.candidates();

        enum Event {
            Changed,
            Done(String),
            Relisted(relist::Relisted),
            Evict(eviction::Order),
            Signal,
        }
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
        let done = async {
            match done_rx.recv().await {
                Ok(uid) => Event::Done(uid),
                Err(_) => std::future::pending().await,
            }
        };
        let signal = async {
            signals.next().await;
            Event::Signal
        };
        let relisted = async {
            match relisted_rx.recv().await {
                Ok(listed) => Event::Relisted(listed),
                Err(_) => std::future::pending().await,
            }
        };
        let evict = async {
            match evict_rx.recv().await {
                Ok(order) => Event::Evict(order),
                Err(_) => std::future::pending().await,
            }
        };
        // The Burstable class's weight follows its pods' CPU requests.
        let burstable_cpu = manager.burstable_cpu();
        if qos_written != Some(burstable_cpu) {
            match ctx.cgroups.update_qos(burstable_cpu) {
                Ok(()) => qos_written = Some(burstable_cpu),
                Err(e) => log::warn!("QoS cgroups: {e}"),
            }
        }
        match changed
            .or(api_change)
            .or(done)
            .or(evict)
            .or(relisted)
            .or(signal)
            .await
        {
            Event::Changed => {
                if let Some(mirrors) = &mirrors {
                    mirrors.poke();
                }
                if let Some(status) = &ctx.status_manager {
                    status.poke();
                }
            }
            Event::Done(uid) => {
                workers.remove(&uid);
                manager.finished(&uid);
                ctx.images.wake_gc();
                if let Some(status) = &ctx.status_manager {
                    status.finished(&uid);
                }
            }
            Event::Relisted(relist::Relisted { listed, sweep }) => {
                // Who owns what is read now, after the list: a container
                // of a pod whose worker started since is that worker's.
                let (mut by_pod, orphans) =
                    relist::assign(listed, &ctx.layout.pods(), |uid| workers.contains_key(uid));
                // Every pod: one whose containers are all gone hears it too.
                for (uid, worker) in &workers {
                    let states = by_pod.remove(uid).unwrap_or_default();
                    let _ = worker.control.try_send(Control::Relisted(states));
                }
                // Containers first: what the sweep kills in pods' cgroups
                // would leave them in the runtime's state.
                let ctx = ctx.clone();
                crate::rt::spawn(async move {
                    relist::remove_orphans(ctx.clone(), orphans).await;
                    if sweep {
                        relist::remove_leftovers(ctx).await;
                    }
                })
                .detach();
            }
            Event::Evict(order) => {
                if let Some(command) = manager.evict(order) {
                    carry_out(command, &mut workers);
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

/// Upstream's image GC period.
const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);

/// Image GC at start, every 5 minutes as upstream, after each pull (on a
/// small SD card it is a pull that fills the disk) and when a pod is gone.
async fn collect_images(ctx: Rc<Context>) {
    loop {
        let pods = ctx.layout.pods();
        let in_use = crate::helpers::unblock(move || records::images_in_use(&pods)).await;
        match ctx.images.collect_garbage(&in_use).await {
            Ok(report) => {
                crate::stats::own::image_gc_ran(report.deleted.len());
                let percent = |u: Option<crate::stats::fs::FsUsage>| u.map(|u| u.percent());
                if !report.deleted.is_empty() {
                    log::info!(
                        "image GC deleted {} ({:?}% → {:?}% of the image filesystem used)",
                        report.deleted.join(", "),
                        percent(report.before),
                        percent(report.after)
                    );
                }
                if report.short {
                    let message = format!(
                        "the image filesystem is still {:?}% used after deleting every unused image",
                        percent(report.after)
                    );
                    log::warn!("image GC: {message}");
                    if let Some(events) = &ctx.events {
                        events.record_node(events::EventType::Warning, "ImageGCFailed", message);
                    }
                }
            }
            Err(e) => log::warn!("image GC: {e}"),
        }
        let period = async {
            smol::Timer::after(IMAGE_GC_PERIOD).await;
        };
        futures_lite::future::or(ctx.images.gc_wanted(), period).await;
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
