//! The node in the API server: registration, the node status setters, the
//! status loop (recomputed every nodeStatusUpdateFrequency, PATCHed when it
//! changed or nodeStatusReportFrequency passed) and the Lease heartbeat.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use crate::config::Signal;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use serde_json::{Value, json};

use super::Context;
use super::admission::NodeView;
use crate::kube::diff::strategic_diff;
use crate::kube::{Api, KubeError, PatchType, RetryBackoff};
use crate::quantity::{format_bytes, format_millicpu};

/// What does not change while the agent runs.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
    pub runtime_version: String,
    pub architecture: String,
    pub cpus: u64,
    pub memory: u64,
    pub internal_ip: Option<IpAddr>,
    /// Whether pods with `hostUsers: false` can run (`userns::probe`).
    pub user_namespaces: bool,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

impl NodeFacts {
    /// Reads the host's identity; `runtime_version` is `runc://1.1.5`.
    pub fn gather(ctx: &Context, runtime_version: String) -> NodeFacts {
        let os_image = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_owned())
            })
            .unwrap_or_else(|| "Linux".into());
        let kernel_version = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        NodeFacts {
            machine_id: read_trimmed("/etc/machine-id"),
            system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid").to_lowercase(),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            kernel_version,
            os_image,
            runtime_version,
            architecture: ctx.images.architecture().to_owned(),
            cpus: crate::cgroup::cpu_capacity(),
            memory: ctx.memory_capacity,
            internal_ip: ctx.host_ip,
            user_namespaces: false,
        }
    }
}

/// The IPv4 address of the interface the default route leaves by, as the
/// upstream kubelet picks a node's InternalIP without --node-ip.
pub fn default_route_ip() -> Option<IpAddr> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    let interface = routes.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"00000000")).then(|| fields[0].to_owned())
    })?;
    nix::ifaddrs::getifaddrs().ok()?.find_map(|a| {
        if a.interface_name != interface {
            return None;
        }
        let ip = a.address?.as_sockaddr_in()?.ip();
        Some(IpAddr::V4(ip))
    })
}

/// The hard eviction threshold on `signal` for a `capacity`.
fn threshold(ctx: &Context, signal: Signal, capacity: u64) -> Option<u64> {
    ctx.config.eviction.hard(signal, capacity)
}

fn quantities(map: BTreeMap<&str, String>) -> BTreeMap<String, Quantity> {
    map.into_iter()
        .map(|(k, v)| (k.to_owned(), Quantity(v)))
        .collect()
}

fn condition(
    kind: &str,
    on: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> core::NodeCondition {
    core::NodeCondition {
        type_: kind.to_owned(),
        status: if on { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// What kubeReserved and systemReserved hold back of a resource.
fn reserved(config: &crate::config::Config, name: &str) -> i64 {
    config.kube_reserved.get(name).copied().unwrap_or(0)
        + config.system_reserved.get(name).copied().unwrap_or(0)
}

/// Allocatable CPU (millicores) and memory: capacity less reservations
/// and the hard eviction threshold, floored at zero.
pub fn allocatable(ctx: &Context) -> (u64, u64) {
    let config = &ctx.config;
    let reserved = |name: &str| reserved(config, name);
    let memory = ctx.memory_capacity;
    let cpu = (crate::cgroup::cpu_capacity() as i64 * 1000 - reserved("cpu")).max(0) as u64;
    let memory = (memory as i64
        - reserved("memory")
        - threshold(ctx, Signal::MemoryAvailable, memory).unwrap_or(0) as i64)
        .max(0) as u64;
    (cpu, memory)
}

/// The `kubepods` cgroup's limits, as upstream's enforceNodeAllocatable
/// sets them: CPU weight from the allocatable CPU and, when `pods` is
/// enforced, memory and PIDs capped at capacity less kubeReserved and
/// systemReserved. The hard eviction threshold stays inside the cap, so
/// that eviction acts before the kernel's OOM killer does.
pub fn pods_cgroup_limits(ctx: &Context) -> crate::cgroup::Limits {
    use crate::cgroup::{Limits, cpu_shares};
    let config = &ctx.config;
    let enforce = config.enforce_pods_allocatable;
    let reserved = |name: &str| if enforce { reserved(config, name) } else { 0 };
    let cpu_milli = (crate::cgroup::cpu_capacity() as i64 * 1000 - reserved("cpu")).max(0) as u64;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok());
    Limits {
        cpu_shares: cpu_shares(Some(cpu_milli)),
        cpu_quota: None,
        memory_max: enforce
            .then(|| (ctx.memory_capacity as i64 - reserved("memory")).max(0) as u64),
        pids_max: pid_max
            .filter(|_| reserved("pid") > 0)
            .map(|max| (max - reserved("pid")).max(1)),
    }
}

/// The node's allocatable ephemeral storage: the state dir's filesystem
/// less what is reserved and the nodefs eviction threshold.
pub fn storage_allocatable(ctx: &Context, capacity: u64) -> u64 {
    let config = &ctx.config;
    let left = capacity as i64
        - reserved(config, "ephemeral-storage")
        - threshold(ctx, Signal::NodefsAvailable, capacity).unwrap_or(0) as i64;
    left.max(0) as u64
}

/// The state dir's filesystem's size.
pub fn storage_capacity(ctx: &Context) -> u64 {
    crate::stats::fs::FsUsage::of(&ctx.layout.root).map_or(0, |f| f.capacity)
}

/// The node's status now; the pressure conditions are the eviction
/// manager's.
pub fn node_status(ctx: &Context, facts: &NodeFacts, now: Timestamp) -> core::NodeStatus {
    let config = &ctx.config;
    let storage = storage_capacity(ctx);
    let mut capacity = BTreeMap::from([
        ("cpu", facts.cpus.to_string()),
        ("memory", format_bytes(facts.memory)),
        ("ephemeral-storage", format_bytes(storage)),
        ("pods", config.max_pods.to_string()),
    ]);
    // No huge pages are set up for pods; upstream reports them as 0 too.
    capacity.insert("hugepages-1Gi", "0".into());
    capacity.insert("hugepages-2Mi", "0".into());
    let (cpu_alloc, mem_alloc) = allocatable(ctx);
    let storage_alloc = storage_allocatable(ctx, storage);
    let mut allocatable = capacity.clone();
    allocatable.insert("cpu", format_millicpu(cpu_alloc));
    allocatable.insert("memory", format_bytes(mem_alloc));
    allocatable.insert("ephemeral-storage", format_bytes(storage_alloc));

    let mut capacity = quantities(capacity);
    let mut allocatable = quantities(allocatable);
    // Device plugins' resources: every device, and the healthy ones.
    for (name, (all, healthy)) in ctx.devices.capacity() {
        capacity.insert(name.clone(), Quantity(all.to_string()));
        allocatable.insert(name, Quantity(healthy.to_string()));
    }

    let pressure = ctx.eviction.pressure();
    let (memory_pressure, disk_pressure) = (pressure.memory, pressure.disk);
    let conditions = vec![
        if memory_pressure {
            condition(
                "MemoryPressure",
                true,
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
                now,
            )
        } else {
            condition(
                "MemoryPressure",
                false,
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
                now,
            )
        },
        if disk_pressure {
            condition(
                "DiskPressure",
                true,
                "KubeletHasDiskPressure",
                "kubelet has disk pressure",
                now,
            )
        } else {
            condition(
                "DiskPressure",
                false,
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
                now,
            )
        },
        if pressure.pid {
            condition(
                "PIDPressure",
                true,
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
                now,
            )
        } else {
            condition(
                "PIDPressure",
                false,
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
                now,
            )
        },
        match crate::runtime::runc::runtime_problem(&config.runtime_path) {
            None => condition(
                "Ready",
                true,
                "KubeletReady",
                "kubelet is posting ready status",
                now,
            ),
            Some(problem) => condition(
                "Ready",
                false,
                "KubeletNotReady",
                &format!("container runtime is down: {problem}"),
                now,
            ),
        },
    ];

    let mut addresses = Vec::new();
    if let Some(ip) = facts.internal_ip {
        addresses.push(core::NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        });
    }
    addresses.push(core::NodeAddress {
        type_: "Hostname".into(),
        address: config.node_name.clone(),
    });

    // Up to 50 images, largest first, each with up to 5 names, as upstream.
    let mut records: Vec<_> = ctx
        .images
        .records()
        .map(|r| r.into_values().collect())
        .unwrap_or_default();
    records.sort_by_key(|r: &crate::image::store::ImageRecord| std::cmp::Reverse(r.size));
    let mut images: Vec<core::ContainerImage> = Vec::new();
    for record in records {
        let digest_name = format!(
            "{}@{}",
            repository(&record.reference),
            record.manifest_digest
        );
        let same_image = |i: &&mut core::ContainerImage| {
            i.names.as_ref().is_some_and(|n| n.contains(&digest_name))
        };
        match images.iter_mut().find(same_image) {
            Some(image) => {
                if let Some(names) = &mut image.names
                    && names.len() < 5
                {
                    names.push(record.reference.clone());
                }
            }
            None => images.push(core::ContainerImage {
                names: Some(vec![digest_name, record.reference.clone()]),
                size_bytes: Some(record.size as i64),
            }),
        }
    }
    images.truncate(50);

    core::NodeStatus {
        // supplementalGroupsPolicy (Merge and Strict) is nanolet's own
        // doing, whatever the runtime.
        features: Some(core::NodeFeatures {
            supplemental_groups_policy: Some(true),
        }),
        addresses: Some(addresses),
        allocatable: Some(allocatable),
        capacity: Some(capacity),
        conditions: Some(conditions),
        daemon_endpoints: Some(core::NodeDaemonEndpoints {
            kubelet_endpoint: Some(core::DaemonEndpoint {
                port: i32::from(config.port),
            }),
        }),
        images: Some(images),
        node_info: Some(core::NodeSystemInfo {
            architecture: facts.architecture.clone(),
            boot_id: facts.boot_id.clone(),
            container_runtime_version: facts.runtime_version.clone(),
            kernel_version: facts.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: kubelet_version(),
            machine_id: facts.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: facts.os_image.clone(),
            system_uuid: facts.system_uuid.clone(),
            ..Default::default()
        }),
        // The configured runtime, under its name and as the default (""),
        // as containerd lists its runtimes: RuntimeClasses may name either.
        runtime_handlers: Some(
            [ctx.runtime.kind.name(), ""]
                .into_iter()
                .map(|name| core::NodeRuntimeHandler {
                    name: Some(name.to_owned()),
                    features: Some(core::NodeRuntimeHandlerFeatures {
                        recursive_read_only_mounts: Some(ctx.recursive_read_only),
                        user_namespaces: Some(facts.user_namespaces),
                    }),
                })
                .collect(),
        ),
        ..Default::default()
    }
}

/// `registry/name` of a reference, without its tag or digest.
fn repository(reference: &str) -> &str {
    if let Some((repo, _)) = reference.split_once('@') {
        return repo;
    }
    match reference.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => reference,
    }
}

/// The Kubernetes version nanolet speaks, with its own as build metadata
/// (as k3s reports `v1.28.5+k3s1`).
pub fn kubelet_version() -> String {
    format!("v1.32.0+nanolet-{}", env!("CARGO_PKG_VERSION"))
}

/// The labels the node registers with: upstream's defaults and the
/// configured ones.
pub fn labels(ctx: &Context) -> BTreeMap<String, String> {
    let config = &ctx.config;
    let arch = ctx.images.architecture().to_owned();
    let mut labels = BTreeMap::from([
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), arch.clone()),
        (
            "kubernetes.io/hostname".to_owned(),
            config.node_name.clone(),
        ),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), arch),
    ]);
    labels.extend(config.node_labels.clone());
    labels
}

fn initial_node(ctx: &Context, status: core::NodeStatus) -> core::Node {
    let config = &ctx.config;
    let labels = labels(ctx);
    core::Node {
        metadata: ObjectMeta {
            name: Some(config.node_name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                "true".to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(core::NodeSpec {
            taints: (!config.register_with_taints.is_empty())
                .then(|| config.register_with_taints.clone()),
            ..Default::default()
        }),
        status: Some(status),
    }
}

/// Status fields compared to decide whether a report is due: everything
/// but the heartbeat times.
fn comparable(status: &core::NodeStatus) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(conditions) = value.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if let Some(map) = c.as_object_mut() {
                map.remove("lastHeartbeatTime");
                map.remove("lastTransitionTime");
            }
        }
    }
    value
}

/// Keeps each condition's transition time while its status is unchanged.
fn carry_transitions(previous: Option<&core::NodeStatus>, status: &mut core::NodeStatus) {
    let Some(previous) = previous.and_then(|p| p.conditions.as_ref()) else {
        return;
    };
    for c in status.conditions.iter_mut().flatten() {
        if let Some(p) = previous.iter().find(|p| p.type_ == c.type_)
            && p.status == c.status
        {
            c.last_transition_time = p.last_transition_time.clone();
        }
    }
}

/// Registers the node (or adopts an existing one), then keeps its status
/// and Lease current. Runs for the agent's lifetime.
pub async fn run(ctx: Rc<Context>, api: Api, facts: NodeFacts) {
    let name = ctx.config.node_name.clone();
    let mut sent: Option<core::NodeStatus> = None;
    let node = if ctx.config.register_node {
        let (node, initial) = register(&ctx, &api, &facts).await;
        sent = initial;
        node
    } else {
        wait_for_node(&api, &name).await
    };
    let uid = node.metadata.uid.clone().unwrap_or_default();
    *ctx.api_node.borrow_mut() = Some(NodeView::from_node(&node));
    log::info!("node {name} registered (uid {uid})");
    *ctx.node_uid.borrow_mut() = Some(uid.clone());
    // When the Lease could not be renewed, the control plane may have
    // marked the node NotReady meanwhile: reports are then complete rather
    // than a diff against what we last sent, until one made after the
    // Lease is renewed again. One that lands before that renewal may be
    // marked over by the node lifecycle controller, still seeing the old
    // Lease.
    let lease = Rc::new(LeaseHealth::default());
    crate::rt::spawn(lease_loop(ctx.clone(), api.clone(), uid, lease.clone())).detach();

    let mut last_report = Instant::now();
    // A first turn at a random point, as after trouble: nodes started
    // together (a site's power back) do not report in step.
    let mut troubled = true;
    loop {
        smol::Timer::after(next_turn(ctx.config.node_status_update_frequency, troubled)).await;
        troubled = false;
        if lease.lapsed.get() || lease.renewed_after_lapse.replace(false) {
            sent = None;
            troubled = true;
        }
        let mut status = node_status(&ctx, &facts, Timestamp::now());
        carry_transitions(sent.as_ref(), &mut status);
        let changed = sent.as_ref().map(comparable) != Some(comparable(&status));
        if !changed && last_report.elapsed() < ctx.config.node_status_report_frequency {
            continue;
        }
        let old = sent
            .as_ref()
            .map(|s| serde_json::to_value(s).unwrap_or_default())
            .unwrap_or(json!({}));
        let new = serde_json::to_value(&status).unwrap_or_default();
        let Some(diff) = strategic_diff(&old, &new) else {
            continue;
        };
        let path = format!("/api/v1/nodes/{name}/status");
        let started = Instant::now();
        let patched = api
            .patch::<core::Node>(&path, PatchType::StrategicMerge, &json!({"status": diff}))
            .await;
        troubled |=
            patched.is_err() || started.elapsed() > ctx.config.node_status_update_frequency / 2;
        match patched {
            // What it answers carries the labels and taints an
            // administrator set meanwhile: admission's view of the node,
            // with no request of its own.
            Ok(node) => {
                *ctx.api_node.borrow_mut() = Some(NodeView::from_node(&node));
                sent = Some(status);
                last_report = Instant::now();
            }
            Err(e) if e.is_not_found() => {
                // Deleted behind our back: register again, as upstream
                // kubelets do on restart.
                log::warn!("node {name} is gone from the API server; registering again");
                let (node, initial) = register(&ctx, &api, &facts).await;
                *ctx.api_node.borrow_mut() = Some(NodeView::from_node(&node));
                sent = initial;
            }
            Err(e) => {
                if !e.is_unavailable() {
                    log::warn!("node status: {e}");
                }
                sent = None;
            }
        }
    }
}

/// POSTs the node until it exists: 100 ms doubling to 7 s, as upstream.
/// Returns it and the status it was created with (None when it existed
/// before, so the first report sends everything).
async fn register(
    ctx: &Context,
    api: &Api,
    facts: &NodeFacts,
) -> (core::Node, Option<core::NodeStatus>) {
    let name = &ctx.config.node_name;
    let mut backoff = RetryBackoff::new(Duration::from_millis(100), Duration::from_millis(3500));
    loop {
        let status = node_status(ctx, facts, Timestamp::now());
        let node = initial_node(ctx, status.clone());
        match api.create::<_, core::Node>("/api/v1/nodes", &node).await {
            Ok(created) => {
                if created.metadata.uid.is_some() {
                    return (created, Some(status));
                }
            }
            Err(e) if e.is_conflict() => match reconcile_existing(api, &node).await {
                Ok(existing) => return (existing, None),
                Err(e) if e.is_unavailable() => {}
                Err(e) => log::warn!("registering node {name}: {e}"),
            },
            Err(e) if e.is_unavailable() => {}
            Err(e) => log::warn!("registering node {name}: {e}"),
        }
        smol::Timer::after(backoff.next_delay()).await;
    }
}

/// A node of this name exists (a restart): make its labels ours again.
async fn reconcile_existing(api: &Api, node: &core::Node) -> Result<core::Node, KubeError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let path = format!("/api/v1/nodes/{name}");
    let existing: core::Node = api.get(&path).await?;
    let want = node.metadata.labels.clone().unwrap_or_default();
    let have = existing.metadata.labels.clone().unwrap_or_default();
    let missing: BTreeMap<&String, &String> = want
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .collect();
    if missing.is_empty() {
        return Ok(existing);
    }
    api.patch::<core::Node>(
        &path,
        PatchType::Merge,
        &json!({"metadata": {"labels": missing}}),
    )
    .await
}

/// Without registration (registerNode: false) the node must be created by
/// someone else: wait for it.
async fn wait_for_node(api: &Api, name: &str) -> core::Node {
    let mut backoff = RetryBackoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        match api
            .get::<core::Node>(&format!("/api/v1/nodes/{name}"))
            .await
        {
            Ok(node) => return node,
            Err(e) if e.is_unavailable() => {}
            Err(e) => log::warn!("waiting for node {name}: {e}"),
        }
        smol::Timer::after(backoff.next_delay()).await;
    }
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Renews `kube-node-lease/<node>` every quarter of its duration: one
/// request per renewal while healthy. Upstream sends the whole cached
/// object (an UPDATE); this sends only the new renewTime, as a merge patch
/// with the cached resourceVersion as its precondition, which conflicts
/// exactly where the UPDATE would. 8,640 renewals a day make its size the
/// largest part of an idle node's uplink.
async fn lease_loop(ctx: Rc<Context>, api: Api, node_uid: String, health: Rc<LeaseHealth>) {
    let name = ctx.config.node_name.clone();
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}");
    let duration = ctx.config.node_lease_duration;
    let interval = duration / 4;
    // Of the Lease last written, only its version is kept: a renewal is a
    // patch of renewTime on that version, answered in protobuf.
    let mut cached_version: Option<String> = None;
    // The first renewal at a random point, so that nodes started together
    // do not renew in step.
    let mut first = true;
    loop {
        let started = Instant::now();
        let result = match cached_version.take() {
            Some(version) => {
                let renewal = json!({
                    "metadata": {"resourceVersion": version},
                    "spec": {"renewTime": micro_now()},
                });
                api.patch_for_version(&path, PatchType::Merge, &renewal)
                    .await
            }
            None => ensure_lease(&api, &name, &node_uid, duration)
                .await
                .and_then(|lease| {
                    lease
                        .metadata
                        .resource_version
                        .ok_or_else(|| KubeError::Decode {
                            path: path.clone(),
                            message: "the Lease has no resourceVersion".into(),
                        })
                }),
        };
        let troubled = first || result.is_err() || started.elapsed() > interval / 2;
        first = false;
        match result {
            Ok(version) => {
                cached_version = Some(version);
                if health.lapsed.replace(false) {
                    health.renewed_after_lapse.set(true);
                }
            }
            // A conflict or an outage: fetch the lease afresh next time.
            Err(e) => {
                if !e.is_unavailable() && !e.is_conflict() {
                    log::warn!("lease: {e}");
                }
                health.lapsed.set(true);
            }
        }
        smol::Timer::after(next_turn(interval, troubled)).await;
    }
}

/// What the Lease loop tells the node status loop.
#[derive(Default)]
struct LeaseHealth {
    /// The last renewal failed.
    lapsed: Cell<bool>,
    /// A renewal succeeded after a failed one, and no report was made
    /// since.
    renewed_after_lapse: Cell<bool>,
}

/// The wait before a periodic request's next turn: its interval with 4 %
/// jitter, as upstream. After a turn that failed or waited long on the API
/// server, anywhere in half to one and a half intervals instead: in an
/// outage every node's request hangs until the server is back, and they
/// would all go on from that same moment, a wave every interval.
fn next_turn(interval: Duration, troubled: bool) -> Duration {
    let fraction = crate::state::random_fraction();
    if troubled {
        interval.mul_f64(0.5 + fraction)
    } else {
        interval + interval.mul_f64(0.04 * fraction)
    }
}

async fn ensure_lease(
    api: &Api,
    name: &str,
    node_uid: &str,
    duration: Duration,
) -> Result<Lease, KubeError> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}");
    match api.get::<Lease>(&path).await {
        Ok(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(name.to_owned());
            spec.lease_duration_seconds = Some(duration.as_secs() as i32);
            spec.renew_time = Some(micro_now());
            api.replace(&path, &lease).await
        }
        Err(e) if e.is_not_found() => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some("kube-node-lease".into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: name.to_owned(),
                        uid: node_uid.to_owned(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(name.to_owned()),
                    lease_duration_seconds: Some(duration.as_secs() as i32),
                    renew_time: Some(micro_now()),
                    ..Default::default()
                }),
            };
            api.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                &lease,
            )
            .await
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_trouble_the_next_turn_is_anywhere_in_half_to_one_and_a_half_intervals() {
        let interval = Duration::from_secs(10);
        let calm: Vec<Duration> = (0..200).map(|_| next_turn(interval, false)).collect();
        assert!(
            calm.iter()
                .all(|d| *d >= interval && *d < Duration::from_millis(10_400))
        );
        let troubled: Vec<Duration> = (0..200).map(|_| next_turn(interval, true)).collect();
        assert!(
            troubled
                .iter()
                .all(|d| *d >= interval / 2 && *d < interval * 3 / 2)
        );
        // Spread over the whole range, not clustered: both ends are used.
        assert!(troubled.iter().any(|d| *d < Duration::from_secs(6)));
        assert!(troubled.iter().any(|d| *d > Duration::from_secs(14)));
    }

    #[test]
    fn repositories_lose_tag_and_digest() {
        assert_eq!(
            repository("127.0.0.1:5000/busybox:1"),
            "127.0.0.1:5000/busybox"
        );
        assert_eq!(
            repository("127.0.0.1:5000/busybox"),
            "127.0.0.1:5000/busybox"
        );
        assert_eq!(
            repository("docker.io/library/a@sha256:00"),
            "docker.io/library/a"
        );
    }

    #[test]
    fn transition_times_survive_unchanged_conditions() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let old = core::NodeStatus {
            conditions: Some(vec![condition("Ready", true, "KubeletReady", "", t0)]),
            ..Default::default()
        };
        let mut new = core::NodeStatus {
            conditions: Some(vec![condition("Ready", true, "KubeletReady", "", t1)]),
            ..Default::default()
        };
        assert_eq!(comparable(&old), comparable(&new));
        carry_transitions(Some(&old), &mut new);
        let c = &new.conditions.unwrap()[0];
        assert_eq!(c.last_transition_time, Some(Time(t0)));
        assert_eq!(c.last_heartbeat_time, Some(Time(t1)));
    }
}
