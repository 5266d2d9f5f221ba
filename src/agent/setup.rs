//! The agent's start: its state dir, runtime, image service and pod network
//! made into the [`Context`] every worker shares; the services that run
//! beside the pods; and, in cluster mode, the node joining the cluster.

use std::rc::Rc;
use std::time::Duration;

use smol::channel::Receiver;

use super::status::StatusManager;
use super::{AgentError, Context, events, eviction, mirror, node, objects};
use crate::cgroup::Hierarchy;
use crate::config::Config;
use crate::http::Client;
use crate::image::gc::GcPolicy;
use crate::image::registry::Registry;
use crate::image::store::Store;
use crate::image::{ImageService, PullLimits, unpack};
use crate::kube::Api;
use crate::kube::watch::Reflector;
use crate::runtime::cni::Cni;
use crate::runtime::monitor_client::MonitorSettings;
use crate::runtime::runc::Runtime;
use crate::state::{self, Layout, records};

/// Cluster mode: the API server's client, its pods for this node, and
/// where their statuses go.
pub(super) struct Cluster {
    api: Api,
    pods: Rc<Reflector>,
    changed: Receiver<()>,
    status: Rc<StatusManager>,
}

/// What the loop watches once the node has joined its cluster.
pub(super) struct Joined {
    /// The API server's pods for this node, and their changes.
    pub pods: Rc<Reflector>,
    pub changed: Receiver<()>,
    pub mirrors: Rc<mirror::MirrorManager>,
}

/// The state dir, the runtime (and its version, for the Node), the
/// context, and the cluster to join if there is one.
pub(super) async fn context(
    config: Config,
    launcher: Option<crate::monitor::launcher::Launcher>,
) -> Result<(Rc<Context>, String, Option<Cluster>), AgentError> {
    let layout = Layout::new(&config.state_dir);
    state::create_dir_all(&layout.root, 0o700)?;
    // Before anything is written there: a newer agent's state dir is left
    // as it is.
    match state::format::prepare(&layout)? {
        state::format::Prepared::Migrated { from } => log::info!(
            "{}: state dir migrated from format {from} to {}",
            layout.root.display(),
            state::format::CURRENT
        ),
        state::format::Prepared::New | state::format::Prepared::Current => {}
    }
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
    let cgroup_v2 = crate::cgroup::detect() == crate::cgroup::Version::V2;
    for shortfall in crate::runtime::advisories::too_old(config.runtime, &version, cgroup_v2) {
        log::warn!("{}", shortfall.text);
    }
    let recursive_read_only = runtime.supports_recursive_read_only().await;
    let http = Client::new(config.ca_file.clone(), config.insecure_registries.clone());
    let registry = Registry::new(http, config.registry_mirrors.clone());
    let store = Store::open(&layout.images())?;
    let executable =
        std::env::current_exe().map_err(|e| AgentError::Setup(format!("own executable: {e}")))?;

    let credentials =
        crate::certificates::prepare(&config).map_err(|e| AgentError::Setup(e.to_string()))?;
    let cluster = match credentials {
        Some(credentials) => {
            let kubeconfig = credentials.kubeconfig;
            log::info!(
                "joining the cluster at {} as node {}",
                kubeconfig.server,
                config.node_name
            );
            let api = Api::new(&kubeconfig, &config.node_name);
            if let Some(manager) = credentials.manager {
                // Before anything else can send: nothing goes out with
                // credentials the node cannot use.
                if !manager.usable_now() {
                    api.hold().await;
                }
                crate::rt::spawn(manager.run(api.clone())).detach();
            }
            let (pods, changed) = Reflector::new(
                api.clone(),
                "/api/v1/pods",
                &format!("spec.nodeName={}", config.node_name),
            );
            let status = StatusManager::new(api.clone(), pods.clone());
            Some(Cluster {
                api,
                pods,
                changed,
                status,
            })
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
        images: ImageService::new(registry, store, gc_policy(&config), pull_limits(&config)),
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
        status_manager: cluster.as_ref().map(|c| c.status.clone()),
        objects: cluster
            .as_ref()
            .map(|c| objects::ObjectSource::new(c.api.clone())),
        events: cluster
            .as_ref()
            .map(|c| events::EventRecorder::new(c.api.clone(), &config.node_name)),
        node_uid: Rc::default(),
        api_node: Rc::default(),
        eviction: eviction::EvictionManager::new(config.eviction.clone()),
        devices: crate::device::DeviceManager::new(
            config.device_plugins_dir.clone(),
            layout.devices(),
        ),
        runtime,
        layout,
        config,
    });
    Ok((ctx, version, cluster))
}

fn gc_policy(config: &Config) -> GcPolicy {
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
    }
}

fn pull_limits(config: &Config) -> PullLimits {
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
    }
}

/// What runs beside the pods in either mode: child reaping, the host's
/// AppArmor profile, parked CNI networks, loop lag, image GC and the plain
/// HTTP endpoints.
pub(super) async fn spawn_services(ctx: &Rc<Context>) {
    // Child processes are reaped on the loop, not by a thread of their own.
    crate::rt::spawn(async_process::driver()).detach();
    // Before any pod is admitted: admission and specs depend on it.
    crate::runtime::apparmor::prepare_host().await;
    // Networks of pods whose DEL failed before: released now if possible.
    let retry_ctx = ctx.clone();
    crate::rt::spawn(async move { retry_ctx.cni.retry_parked().await }).detach();
    crate::rt::spawn(crate::rt::measure_lag(Duration::from_secs(5))).detach();
    crate::rt::spawn(collect_images(ctx.clone())).detach();
    // Pods are admitted without device plugins if their socket cannot be
    // served: only pods asking for plugins' devices fail.
    if let Err(e) = crate::device::serve(ctx.devices.clone()) {
        log::error!("device plugins: {e}");
    }
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
        match crate::server::bind_read_only(super::server_deps(ctx)) {
            Ok(serving) => crate::rt::spawn(serving).detach(),
            Err(e) => log::error!("read-only port: {e}"),
        }
    }
}

/// Cluster mode: the kubelet API, the Node and its Lease, the pods' watch,
/// their statuses, events and mirror pods.
pub(super) async fn join(
    ctx: &Rc<Context>,
    cluster: Cluster,
    runtime_version: &str,
) -> Result<Joined, AgentError> {
    let Cluster {
        api,
        pods,
        changed,
        status,
    } = cluster;
    let mut facts = node::NodeFacts::gather(
        ctx,
        format!("{}://{runtime_version}", ctx.config.runtime.name()),
    );
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
    let deps = super::server_deps(ctx);
    let serving = crate::server::serving_cert::ServingCert::for_node(&deps)
        .map(std::sync::Arc::new)
        .map_err(|e| AgentError::Setup(format!("kubelet API: {e}")))?;
    if ctx.config.server_tls_bootstrap {
        let events = ctx.events.clone();
        let notify = Box::new(move |message: &str| {
            if let Some(events) = &events {
                events.record_node(
                    events::EventType::Normal,
                    "ServingCertificate",
                    message.to_owned(),
                );
            }
        });
        let manager = crate::certificates::serving::ServingCertificates::new(
            &ctx.config.cert_dir(),
            &ctx.config.node_name,
            ctx.host_ip,
            serving.clone(),
            notify,
        );
        crate::rt::spawn(manager.run(api.clone())).detach();
    }
    let server = crate::server::bind(deps, Rc::new(authority), serving)
        .map_err(|e| AgentError::Setup(format!("kubelet API: {e}")))?;
    crate::rt::spawn(server).detach();
    let mirrors = mirror::MirrorManager::new(
        api.clone(),
        pods.clone(),
        &ctx.config.node_name,
        ctx.node_uid.clone(),
    );
    crate::rt::spawn(node::run(ctx.clone(), api, facts)).detach();
    crate::rt::spawn(pods.clone().run()).detach();
    crate::rt::spawn(status.run()).detach();
    if let Some(events) = &ctx.events {
        crate::rt::spawn(events.clone().run()).detach();
    }
    crate::rt::spawn(mirrors.clone().run()).detach();
    Ok(Joined {
        pods,
        changed,
        mirrors,
    })
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
