//! The device manager, as upstream's (`pkg/kubelet/cm/devicemanager`):
//! the devices each registered plugin lists, the node's capacity and
//! allocatable from them, and which container holds which device. Its
//! allocations are kept in a checkpoint, so that after a restart or a
//! power cut the same containers get the same devices and no device is
//! given twice.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::api::{self, ContainerAllocateResponse, DevicePluginOptions, RegisterRequest};
use super::grpc::{self, Channel, GrpcError};
use crate::pod::{ContainerRole, Pod};
use crate::state;

/// How long a resource whose plugin went away stays in the node's
/// capacity (at its devices' count, none allocatable) before it is
/// reported as 0: upstream's endpointStopGracePeriod.
const STOP_GRACE: Duration = Duration::from_secs(5 * 60);

/// Upstream's timeouts: dialling a plugin (and asking its options), and
/// PreStartContainer.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Upstream gives Allocate and GetPreferredAllocation no deadline; a plugin
/// that never answers must not hold a pod's start forever.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

const SERVICE: &str = "/v1beta1.DevicePlugin";

/// Resources plugins may register, and resources gone that are still
/// reported as 0. Upstream has no cap; each costs a watch, a node status
/// entry and a checkpoint entry.
const MAX_RESOURCES: usize = 64;

/// One container's devices of one resource, and what the plugin said the
/// container needs for them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    pub pod_uid: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
    /// `None` while its Allocate call is under way: the devices are
    /// taken, so that no other pod is given them meanwhile.
    pub response: Option<ContainerAllocateResponse>,
}

/// What the checkpoint keeps.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub allocations: Vec<Allocation>,
    /// Each resource's devices, by health, as last listed; for `nanolet
    /// check`, and so that a restarted agent knows which resources are
    /// device plugins' before they register again.
    pub resources: BTreeMap<String, ResourceDevices>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDevices {
    pub healthy: BTreeSet<String>,
    pub unhealthy: BTreeSet<String>,
    /// Its plugin is connected (its ListAndWatch stream open).
    #[serde(default)]
    pub connected: bool,
}

struct Plugin {
    channel: Channel,
    generation: u64,
    watch: smol::Task<()>,
}

struct Resource {
    devices: ResourceDevices,
    plugin: Option<Plugin>,
    /// Its plugin's options, kept after the plugin went away: a container
    /// whose plugin wants PreStartContainer does not start without it.
    /// Unknown after an agent restart until the plugin registers, as
    /// upstream.
    options: Option<DevicePluginOptions>,
    /// When its plugin went away (or the agent started without it).
    stopped_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    /// Resources removed after their grace period: reported as 0.
    removed: BTreeSet<String>,
    allocations: Vec<Allocation>,
    generation: u64,
}

impl State {
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            allocations: self
                .allocations
                .iter()
                .filter(|a| a.response.is_some())
                .cloned()
                .collect(),
            resources: self
                .resources
                .iter()
                .map(|(name, r)| (name.clone(), r.devices.clone()))
                .collect(),
        }
    }

    fn taken(&self, resource: &str) -> BTreeSet<&str> {
        self.allocations
            .iter()
            .filter(|a| a.resource == resource)
            .flat_map(|a| a.device_ids.iter().map(String::as_str))
            .collect()
    }

    fn held(&self, pod_uid: &str, container: &str, resource: &str) -> Option<&Allocation> {
        self.allocations
            .iter()
            .find(|a| a.pod_uid == pod_uid && a.container == container && a.resource == resource)
    }
}

pub struct DeviceManager {
    /// The plugins' sockets, and the agent's kubelet.sock.
    pub dir: PathBuf,
    checkpoint: PathBuf,
    state: RefCell<State>,
    /// Checkpoint writes, one at a time, each of the state at its turn.
    writing: smol::lock::Mutex<()>,
    /// Changes to the state so far, and how many of them the checkpoint
    /// holds: a write covers all changes made before it, so a plugin
    /// changing its list on every message costs one write at a time, not
    /// one queued per message.
    changes: Cell<u64>,
    saved: Cell<u64>,
    /// A background write is waiting for its turn.
    queued: Cell<bool>,
    /// Checkpoint files written, for the test that bursts coalesce.
    #[cfg(test)]
    writes: Cell<u64>,
    me: Weak<DeviceManager>,
}

impl DeviceManager {
    /// The manager with what the checkpoint at `checkpoint` kept: its
    /// allocations, and its resources with no devices until their plugins
    /// register again (as upstream: the capacity is 0 meanwhile).
    pub fn new(dir: PathBuf, checkpoint: PathBuf) -> Rc<DeviceManager> {
        let kept: Checkpoint = match state::read_json(&checkpoint) {
            Ok(kept) => kept.unwrap_or_default(),
            Err(e) => {
                log::error!("device checkpoint: {e}; starting without it");
                Checkpoint::default()
            }
        };
        let now = Instant::now();
        let resources = kept
            .resources
            .into_keys()
            .map(|name| {
                let resource = Resource {
                    devices: ResourceDevices::default(),
                    plugin: None,
                    options: None,
                    stopped_at: Some(now),
                };
                (name, resource)
            })
            .collect();
        let state = State {
            resources,
            allocations: kept.allocations,
            ..State::default()
        };
        Rc::new_cyclic(|me| DeviceManager {
            dir,
            checkpoint,
            state: RefCell::new(state),
            writing: smol::lock::Mutex::new(()),
            changes: Cell::new(0),
            saved: Cell::new(0),
            queued: Cell::new(false),
            #[cfg(test)]
            writes: Cell::new(0),
            me: me.clone(),
        })
    }

    /// Each resource's capacity and allocatable: all its devices, and the
    /// healthy ones. A resource whose plugin has been gone for the grace
    /// period is dropped and reported as 0 from then on.
    pub fn capacity(&self) -> BTreeMap<String, (u64, u64)> {
        let mut state = self.state.borrow_mut();
        let now = Instant::now();
        let expired: Vec<String> = state
            .resources
            .iter()
            .filter(|(_, r)| {
                r.plugin.is_none()
                    && r.stopped_at
                        .is_some_and(|at| now.duration_since(at) >= STOP_GRACE)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &expired {
            log::info!("device plugin resource {name}: gone for {STOP_GRACE:?}; removed");
            state.resources.remove(name);
            state.removed.insert(name.clone());
        }
        // Reported as 0 until then: the Node object has it at 0 by now.
        while state.removed.len() > MAX_RESOURCES {
            state.removed.pop_first();
        }
        let mut capacity: BTreeMap<String, (u64, u64)> =
            state.removed.iter().map(|n| (n.clone(), (0, 0))).collect();
        for (name, r) in &state.resources {
            let healthy = r.devices.healthy.len() as u64;
            let all = healthy + r.devices.unhealthy.len() as u64;
            capacity.insert(name.clone(), (all, healthy));
        }
        drop(state);
        if !expired.is_empty() {
            self.save_later();
        }
        capacity
    }

    /// Healthy devices of each resource a plugin manages (or managed, when
    /// the agent started), for admission.
    pub fn allocatable(&self) -> BTreeMap<String, u64> {
        self.state
            .borrow()
            .resources
            .iter()
            .map(|(name, r)| (name.clone(), r.devices.healthy.len() as u64))
            .collect()
    }

    /// Registers a plugin, as upstream's Register: the request checked, the
    /// plugin dialled and asked for its options; then its ListAndWatch
    /// stream is read. A plugin registering a resource again replaces the
    /// one before.
    pub async fn register(&self, request: RegisterRequest) -> Result<(), String> {
        if request.version != api::VERSION {
            return Err(format!(
                "requested API version {:?} is not supported by kubelet. Supported version is [\"{}\"]",
                request.version,
                api::VERSION
            ));
        }
        let name = request.resource_name;
        if !valid_resource_name(&name) {
            return Err(format!("the ResourceName {name:?} is invalid"));
        }
        let socket = socket_path(&self.dir, &request.endpoint)
            .ok_or_else(|| format!("the endpoint {:?} is invalid", request.endpoint))?;
        let channel = Channel::connect(&socket, DIAL_TIMEOUT)
            .await
            .map_err(|e| format!("failed to dial device plugin: {e}"))?;
        let options = channel
            .unary(
                &format!("{SERVICE}/GetDevicePluginOptions"),
                &[],
                DIAL_TIMEOUT,
            )
            .await
            .map_err(|e| e.to_string())
            .and_then(|m| api::decode_options(&m).map_err(|e| e.to_string()))
            .map_err(|e| format!("failed to get device plugin options: {e}"))?;
        let mut state = self.state.borrow_mut();
        let known = state.resources.contains_key(&name);
        if !known && state.resources.len() >= MAX_RESOURCES {
            return Err(format!(
                "the node has device plugins for {MAX_RESOURCES} resources already"
            ));
        }
        state.generation += 1;
        let generation = state.generation;
        let watch = crate::rt::spawn(watch(
            self.me.clone(),
            channel.clone(),
            name.clone(),
            generation,
        ));
        let resource = state.resources.entry(name.clone()).or_insert(Resource {
            devices: ResourceDevices::default(),
            plugin: None,
            options: None,
            stopped_at: None,
        });
        // The plugin before, if any: its stream is cancelled with its task.
        resource.plugin = Some(Plugin {
            channel,
            generation,
            watch,
        });
        resource.options = Some(options);
        resource.stopped_at = None;
        resource.devices.connected = true;
        state.removed.remove(&name);
        log::info!(
            "device plugin for {name} registered at {} ({options:?})",
            socket.display()
        );
        Ok(())
    }

    /// A ListAndWatch message: the resource's whole device list.
    fn listed(&self, name: &str, generation: u64, devices: Vec<api::Device>) {
        let mut state = self.state.borrow_mut();
        let Some(resource) = current(&mut state, name, generation) else {
            return;
        };
        let listed = by_health(devices);
        if resource.devices == listed {
            return;
        }
        log::info!(
            "device plugin resource {name}: {} healthy, {} unhealthy",
            listed.healthy.len(),
            listed.unhealthy.len()
        );
        resource.devices = listed;
        drop(state);
        self.save_later();
    }

    /// The plugin's stream ended: its devices are unhealthy until it
    /// registers again.
    fn disconnected(&self, name: &str, generation: u64, why: &str) {
        let mut state = self.state.borrow_mut();
        let Some(resource) = current(&mut state, name, generation) else {
            return;
        };
        log::warn!("device plugin for {name} went away ({why}); its devices are unhealthy");
        let devices = &mut resource.devices;
        let healthy = std::mem::take(&mut devices.healthy);
        devices.unhealthy.extend(healthy);
        devices.connected = false;
        resource.stopped_at = Some(Instant::now());
        // Called from the plugin's own task, which ends right after.
        if let Some(plugin) = resource.plugin.take() {
            plugin.watch.detach();
        }
        drop(state);
        self.save_later();
    }

    /// Gives each of the pod's containers the devices it asks for, as
    /// upstream's admission does (`Allocate failed due to <this>`): devices
    /// a container holds already are kept (a restart, an adopted pod);
    /// those of the pod's init containers are given to its later
    /// containers first; the plugin's preference is asked where it has one.
    /// A container running already (adopted) that holds none is left
    /// without, as upstream after a restart: failing would kill it.
    pub async fn allocate(&self, pod: &Pod, running: &dyn Fn(&str) -> bool) -> Result<(), String> {
        let mut reusable: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut changed = false;
        let containers = pod.init_containers.iter().chain(&pod.containers);
        for container in containers {
            for (resource, &need) in &container.resources.extended {
                if need == 0 || !self.state.borrow().resources.contains_key(resource) {
                    continue;
                }
                let pool = reusable.entry(resource.clone()).or_default();
                let held = self
                    .state
                    .borrow()
                    .held(&pod.uid, &container.name, resource)
                    .map(|a| a.device_ids.clone());
                let ids = match held {
                    Some(ids) => ids,
                    None if running(&container.name) => {
                        log::warn!(
                            "pod {}: container {} runs without a record of its {resource} devices; left as it is",
                            pod.full_name(),
                            container.name
                        );
                        continue;
                    }
                    None => {
                        changed = true;
                        self.allocate_one(pod, &container.name, resource, need, pool)
                            .await?
                    }
                };
                if container.role == ContainerRole::Init {
                    for id in ids {
                        if !pool.contains(&id) {
                            pool.push(id);
                        }
                    }
                } else {
                    let given: HashSet<&String> = ids.iter().collect();
                    pool.retain(|id| !given.contains(id));
                }
            }
        }
        if changed {
            // Not kept, a restart could give these devices to another pod.
            self.save()
                .await
                .map_err(|e| format!("the device checkpoint was not written: {e}"))?;
        }
        Ok(())
    }

    async fn allocate_one(
        &self,
        pod: &Pod,
        container: &str,
        resource: &str,
        need: u64,
        reusable: &[String],
    ) -> Result<Vec<String>, String> {
        let need = usize::try_from(need).unwrap_or(usize::MAX);
        let (plugin, free) = {
            let state = self.state.borrow();
            let Some(r) = state.resources.get(resource) else {
                return Err(format!("cannot allocate unregistered device {resource}"));
            };
            if r.devices.healthy.is_empty() {
                return Err(format!(
                    "no healthy devices present; cannot allocate unhealthy devices {resource}"
                ));
            }
            let Some(plugin) = &r.plugin else {
                return Err(format!("cannot allocate unregistered device {resource}"));
            };
            let taken = state.taken(resource);
            let free: Vec<String> = r
                .devices
                .healthy
                .iter()
                .filter(|id| !taken.contains(id.as_str()))
                .cloned()
                .collect();
            (
                (
                    plugin.channel.clone(),
                    r.options.unwrap_or_default(),
                    plugin.generation,
                ),
                free,
            )
        };
        let (channel, options, generation) = plugin;
        let from_pool: Vec<String> = reusable.iter().take(need).cloned().collect();
        let wanted = need - from_pool.len();
        if free.len() < wanted {
            return Err(format!(
                "requested number of devices unavailable for {resource}. Requested: {need}, Available: {}",
                free.len() + from_pool.len()
            ));
        }
        let mut preferred = Vec::new();
        if wanted > 0 && options.get_preferred_allocation_available {
            let mut available = free.clone();
            available.extend(from_pool.iter().cloned());
            let request = api::preferred_allocation_request(&available, &from_pool, need);
            preferred = channel
                .unary(
                    &format!("{SERVICE}/GetPreferredAllocation"),
                    &request,
                    CALL_TIMEOUT,
                )
                .await
                .map_err(|e| e.to_string())
                .and_then(|m| api::decode_preferred_allocation(&m).map_err(|e| e.to_string()))
                .map_err(|e| {
                    format!("device plugin GetPreferredAllocation rpc failed with err: {e}")
                })?;
        }
        // Chosen now, on what is free after the call: another pod may have
        // been given devices meanwhile.
        let ids = {
            let mut state = self.state.borrow_mut();
            let r = state
                .resources
                .get(resource)
                .filter(|r| {
                    r.plugin
                        .as_ref()
                        .is_some_and(|p| p.generation == generation)
                })
                .ok_or_else(|| format!("endpoint for {resource} has been stopped"))?;
            let taken = state.taken(resource);
            let free: Vec<&String> = r
                .devices
                .healthy
                .iter()
                .filter(|id| !taken.contains(id.as_str()))
                .collect();
            let ids = choose(wanted, &free, &preferred).ok_or_else(|| {
                format!(
                    "requested number of devices unavailable for {resource}. Requested: {need}, Available: {}",
                    free.len() + from_pool.len()
                )
            })?;
            let mut ids: Vec<String> = from_pool.iter().cloned().chain(ids).collect();
            ids.truncate(need);
            state.allocations.push(Allocation {
                pod_uid: pod.uid.clone(),
                container: container.to_owned(),
                resource: resource.to_owned(),
                device_ids: ids.clone(),
                response: None,
            });
            ids
        };
        let answered = channel
            .unary(
                &format!("{SERVICE}/Allocate"),
                &api::allocate_request(&ids),
                CALL_TIMEOUT,
            )
            .await
            .map_err(|e| e.to_string())
            .and_then(|m| api::decode_allocate_response(&m).map_err(|e| e.to_string()));
        let mut state = self.state.borrow_mut();
        let pending = state.allocations.iter().position(|a| {
            a.response.is_none()
                && a.pod_uid == pod.uid
                && a.container == container
                && a.resource == resource
        });
        let Some(pending) = pending else {
            // Released meanwhile: the pod is gone.
            return Err(format!("pod {} was removed", pod.full_name()));
        };
        match answered {
            Ok(response) => {
                log::info!(
                    "pod {}: container {container}: {resource} devices {ids:?}",
                    pod.full_name()
                );
                state.allocations[pending].response = Some(response);
                Ok(ids)
            }
            Err(e) => {
                state.allocations.remove(pending);
                Err(e)
            }
        }
    }

    /// What the plugins said a container needs for its devices, merged
    /// as upstream does: for each key or path the first resource's wins.
    pub fn container_edits(&self, pod_uid: &str, container: &str) -> ContainerAllocateResponse {
        let state = self.state.borrow();
        let mut merged = ContainerAllocateResponse::default();
        let responses = state
            .allocations
            .iter()
            .filter(|a| a.pod_uid == pod_uid && a.container == container)
            .filter_map(|a| a.response.as_ref());
        for response in responses {
            for (k, v) in &response.envs {
                merged.envs.entry(k.clone()).or_insert_with(|| v.clone());
            }
            for (k, v) in &response.annotations {
                merged
                    .annotations
                    .entry(k.clone())
                    .or_insert_with(|| v.clone());
            }
            for d in &response.devices {
                if !merged
                    .devices
                    .iter()
                    .any(|m| m.container_path == d.container_path)
                {
                    merged.devices.push(d.clone());
                }
            }
            for m in &response.mounts {
                if !merged
                    .mounts
                    .iter()
                    .any(|o| o.container_path == m.container_path)
                {
                    merged.mounts.push(m.clone());
                }
            }
            for name in &response.cdi_devices {
                if !merged.cdi_devices.contains(name) {
                    merged.cdi_devices.push(name.clone());
                }
            }
        }
        merged
    }

    /// PreStartContainer, before every start of a container holding
    /// devices of a plugin that asks for it.
    pub async fn pre_start(&self, pod_uid: &str, container: &str) -> Result<(), String> {
        let calls: Vec<(Channel, Vec<String>)> = {
            let state = self.state.borrow();
            let mut calls = Vec::new();
            let held = state
                .allocations
                .iter()
                .filter(|a| a.pod_uid == pod_uid && a.container == container);
            for a in held {
                let Some(resource) = state.resources.get(&a.resource) else {
                    continue;
                };
                if !resource.options.is_some_and(|o| o.pre_start_required) {
                    continue;
                }
                let Some(plugin) = &resource.plugin else {
                    return Err(format!(
                        "device plugin PreStartContainer rpc failed with err: the plugin for {} is not connected",
                        a.resource
                    ));
                };
                calls.push((plugin.channel.clone(), a.device_ids.clone()));
            }
            calls
        };
        for (channel, ids) in calls {
            channel
                .unary(
                    &format!("{SERVICE}/PreStartContainer"),
                    &api::pre_start_request(&ids),
                    PRE_START_TIMEOUT,
                )
                .await
                .map_err(|e| format!("device plugin PreStartContainer rpc failed with err: {e}"))?;
        }
        Ok(())
    }

    /// A pod is gone: its devices are free.
    pub fn release(&self, pod_uid: &str) {
        let mut state = self.state.borrow_mut();
        let before = state.allocations.len();
        state.allocations.retain(|a| a.pod_uid != pod_uid);
        if state.allocations.len() != before {
            drop(state);
            log::info!("pod {pod_uid}: devices released");
            self.save_later();
        }
    }

    /// Frees the devices of pods that no longer exist (not adopted at the
    /// agent's start).
    pub fn keep_only(&self, exists: impl Fn(&str) -> bool) {
        let mut state = self.state.borrow_mut();
        let before = state.allocations.len();
        state.allocations.retain(|a| exists(&a.pod_uid));
        if state.allocations.len() != before {
            drop(state);
            self.save_later();
        }
    }

    /// Whether the pod asks for a resource a plugin manages.
    pub fn wanted_by(&self, pod: &Pod) -> bool {
        let state = self.state.borrow();
        pod.all_containers()
            .flat_map(|c| c.resources.extended.keys())
            .any(|name| state.resources.contains_key(name))
    }

    /// Writes the checkpoint with every change made so far.
    async fn save(&self) -> Result<(), state::StateError> {
        self.changes.set(self.changes.get() + 1);
        self.write(false).await
    }

    /// Writes the checkpoint soon, with this change and any made until then.
    fn save_later(&self) {
        self.changes.set(self.changes.get() + 1);
        if self.queued.replace(true) {
            return;
        }
        if let Some(me) = self.me.upgrade() {
            crate::rt::spawn(async move {
                if let Err(e) = me.write(true).await {
                    log::error!("device checkpoint: {e}");
                }
            })
            .detach();
        }
    }

    async fn write(&self, queued: bool) -> Result<(), state::StateError> {
        let _turn = self.writing.lock().await;
        if queued {
            // From here, a change needs a write after this one.
            self.queued.set(false);
        }
        let covered = self.changes.get();
        if self.saved.get() >= covered {
            return Ok(());
        }
        let checkpoint = self.state.borrow().checkpoint();
        let path = self.checkpoint.clone();
        crate::helpers::unblock(move || {
            state::write_json(&path, &checkpoint, 0o600, state::Durability::PowerLoss)
        })
        .await?;
        self.saved.set(covered);
        #[cfg(test)]
        self.writes.set(self.writes.get() + 1);
        Ok(())
    }
}

/// A ListAndWatch list, connected. An ID listed twice counts once, as its
/// last entry says (upstream keeps a map).
fn by_health(devices: Vec<api::Device>) -> ResourceDevices {
    let mut health = BTreeMap::new();
    for device in devices {
        let healthy = device.healthy();
        health.insert(device.id, healthy);
    }
    let mut listed = ResourceDevices {
        connected: true,
        ..ResourceDevices::default()
    };
    for (id, healthy) in health {
        if healthy {
            listed.healthy.insert(id);
        } else {
            listed.unhealthy.insert(id);
        }
    }
    listed
}

/// The resource's entry, if `generation` is still its plugin's.
fn current<'a>(state: &'a mut State, name: &str, generation: u64) -> Option<&'a mut Resource> {
    state.resources.get_mut(name).filter(|r| {
        r.plugin
            .as_ref()
            .is_some_and(|p| p.generation == generation)
    })
}

/// Reads a plugin's ListAndWatch stream for as long as it lasts.
async fn watch(manager: Weak<DeviceManager>, channel: Channel, name: String, generation: u64) {
    let path = format!("{SERVICE}/ListAndWatch");
    let ended = async {
        let mut messages = channel.server_streaming(&path, &[], DIAL_TIMEOUT).await?;
        while let Some(message) = messages.next_message().await? {
            let devices = api::decode_list_and_watch(&message)
                .map_err(|e| GrpcError::Malformed(e.to_string()))?;
            let Some(manager) = manager.upgrade() else {
                return Ok(());
            };
            manager.listed(&name, generation, devices);
        }
        Ok::<(), GrpcError>(())
    }
    .await;
    let why = match ended {
        Ok(()) => "its stream ended".to_owned(),
        Err(e) => e.to_string(),
    };
    if let Some(manager) = manager.upgrade() {
        manager.disconnected(&name, generation, &why);
    }
}

/// `wanted` devices out of `free`: the plugin's preferred ones first (those
/// that are free), then the others in order.
fn choose(wanted: usize, free: &[&String], preferred: &[String]) -> Option<Vec<String>> {
    if free.len() < wanted {
        return None;
    }
    let free_set: HashSet<&String> = free.iter().copied().collect();
    let mut chosen: Vec<String> = Vec::with_capacity(wanted);
    let mut seen = HashSet::new();
    let candidates = preferred
        .iter()
        .filter(|p| free_set.contains(p))
        .chain(free.iter().copied());
    for id in candidates {
        if chosen.len() == wanted {
            break;
        }
        if seen.insert(id) {
            chosen.push(id.clone());
        }
    }
    Some(chosen)
}

/// A plugin's socket: a path under the directory, with no way out of it.
fn socket_path(dir: &Path, endpoint: &str) -> Option<PathBuf> {
    let relative = Path::new(endpoint);
    let plain = !endpoint.is_empty()
        && relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    plain.then(|| dir.join(relative))
}

/// Upstream's IsExtendedResourceName: an extended resource whose
/// `requests.` form is a qualified name (a DNS subdomain prefix, a name
/// of at most 63 characters).
pub fn valid_resource_name(name: &str) -> bool {
    if !crate::pod::is_extended_resource(name) {
        return false;
    }
    let Some((prefix, short)) = name.split_once('/') else {
        return false;
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let subdomain = "requests.".len() + prefix.len() <= 253 && prefix.split('.').all(label);
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    let short_ok = !short.is_empty()
        && short.len() <= 63
        && short
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && edge(short.bytes().next())
        && edge(short.bytes().last());
    subdomain && short_ok
}

/// The gRPC service the agent serves on kubelet.sock.
pub fn registration_handler(manager: Rc<DeviceManager>) -> grpc::Handler {
    Rc::new(move |method: String, message: Vec<u8>| {
        let manager = manager.clone();
        Box::pin(async move {
            if method != "/v1beta1.Registration/Register" {
                return Err(grpc::Status {
                    code: grpc::CODE_UNIMPLEMENTED,
                    message: format!("unknown method {method}"),
                });
            }
            let request = api::decode_register_request(&message).map_err(|e| grpc::Status {
                code: grpc::CODE_INVALID_ARGUMENT,
                message: e.to_string(),
            })?;
            log::info!(
                "device plugin registration: {:?} at {:?}",
                request.resource_name,
                request.endpoint
            );
            manager.register(request).await.map_err(|message| {
                log::warn!("device plugin registration refused: {message}");
                grpc::Status {
                    code: grpc::CODE_UNKNOWN,
                    message,
                }
            })?;
            Ok(Vec::new())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_as_upstream_checks_them() {
        for good in ["example.com/serial", "a.b-c.io/x_y.z", "vendor/gpu"] {
            assert!(valid_resource_name(good), "{good}");
        }
        for bad in [
            "serial",
            "kubernetes.io/foo",
            "requests.example.com/x",
            "Example.COM/foo",
            "a/b/c",
            "example.com/",
            "example.com/-x",
            "-a.com/x",
            "",
        ] {
            assert!(!valid_resource_name(bad), "{bad}");
        }
        let long = format!("example.com/{}", "x".repeat(64));
        assert!(!valid_resource_name(&long));
    }

    #[test]
    fn sockets_stay_in_the_directory() {
        let dir = Path::new("/run/plugins");
        assert_eq!(
            socket_path(dir, "serial.sock"),
            Some(PathBuf::from("/run/plugins/serial.sock"))
        );
        assert_eq!(
            socket_path(dir, "vendor/gpu.sock"),
            Some(PathBuf::from("/run/plugins/vendor/gpu.sock"))
        );
        for bad in ["", "/etc/passwd", "../kubelet.sock", "a/../../b", "."] {
            assert_eq!(socket_path(dir, bad), None, "{bad}");
        }
    }

    #[test]
    fn a_burst_of_changes_costs_a_write_at_a_time_not_one_each() {
        let dir = state::TestDir::new("device-checkpoint");
        let checkpoint = dir.0.join("devices.json");
        let allocations = (0..200)
            .map(|i| Allocation {
                pod_uid: format!("pod-{i}"),
                container: "c".into(),
                resource: "example.com/serial".into(),
                device_ids: vec![format!("s{i}")],
                response: Some(ContainerAllocateResponse::default()),
            })
            .collect();
        let kept = Checkpoint {
            allocations,
            resources: BTreeMap::new(),
        };
        state::write_json(&checkpoint, &kept, 0o600, state::Durability::ProcessCrash).unwrap();
        let manager = DeviceManager::new(dir.0.clone(), checkpoint.clone());
        crate::rt::block_on(async {
            for i in 0..200 {
                manager.release(&format!("pod-{i}"));
                // Now and then the loop runs: a write is under way while
                // more changes come.
                if i % 50 == 0 {
                    smol::future::yield_now().await;
                }
            }
            manager.save().await.unwrap();
        });
        let written: Checkpoint = state::read_json(&checkpoint).unwrap().unwrap();
        assert!(written.allocations.is_empty());
        let writes = manager.writes.get();
        assert!(
            (1..=10).contains(&writes),
            "{writes} writes for 200 changes"
        );
    }

    #[test]
    fn an_id_listed_twice_counts_once_as_its_last_entry_says() {
        let device = |id: &str, health: &str| api::Device {
            id: id.into(),
            health: health.into(),
        };
        let listed = by_health(vec![
            device("a", api::HEALTHY),
            device("a", "Unhealthy"),
            device("b", "Unhealthy"),
            device("b", api::HEALTHY),
        ]);
        assert_eq!(listed.healthy, BTreeSet::from(["b".to_owned()]));
        assert_eq!(listed.unhealthy, BTreeSet::from(["a".to_owned()]));
    }

    #[test]
    fn the_plugins_preference_first_then_the_rest() {
        let free: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let free: Vec<&String> = free.iter().collect();
        assert_eq!(choose(2, &free, &[]), Some(vec!["a".into(), "b".into()]));
        assert_eq!(
            choose(2, &free, &["c".into(), "z".into(), "c".into()]),
            Some(vec!["c".into(), "a".into()])
        );
        assert_eq!(choose(0, &free, &["c".into()]), Some(vec![]));
        assert_eq!(choose(4, &free, &[]), None);
    }
}
