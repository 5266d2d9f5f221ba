//! The eviction manager, as upstream's: every 10 s it measures the
//! eviction signals (memory.available from the node's working set, nodefs
//! and imagefs space and inodes by statfs, pid.available), keeps the
//! MemoryPressure, DiskPressure and PIDPressure conditions (on until a
//! signal has been clear for the transition period), and when a hard
//! threshold is crossed, or a soft one has been for its grace period, it
//! reclaims what the node holds itself (unused images, for disk) and, if
//! that is not enough, evicts one pod per pass: the one upstream's ranking
//! puts first. Static and system-critical pods are never evicted.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::Context;
use crate::config::{Eviction, Signal, Threshold};
use crate::pod::QosClass;
use crate::runtime::disk_usage::DirUsage;
use crate::stats::fs::FsUsage;

/// Upstream's housekeeping interval.
pub const PERIOD: Duration = Duration::from_secs(10);

/// The node conditions eviction drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

impl Pressure {
    /// The condition types that are on, in upstream's order.
    pub fn names(self) -> Vec<&'static str> {
        [
            (self.memory, "MemoryPressure"),
            (self.disk, "DiskPressure"),
            (self.pid, "PIDPressure"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Condition {
    Memory,
    Disk,
    Pid,
}

fn condition(signal: Signal) -> Condition {
    match signal {
        Signal::MemoryAvailable => Condition::Memory,
        Signal::PidAvailable => Condition::Pid,
        _ => Condition::Disk,
    }
}

/// What a signal runs short of, as upstream names it in its messages.
pub fn resource(signal: Signal) -> &'static str {
    match signal {
        Signal::MemoryAvailable => "memory",
        Signal::NodefsInodesFree | Signal::ImagefsInodesFree => "inodes",
        Signal::PidAvailable => "pids",
        _ => "ephemeral-storage",
    }
}

/// One signal as measured: what is left, of what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

/// A threshold that calls for action now.
#[derive(Debug, Clone, PartialEq)]
pub struct Crossed {
    pub threshold: Threshold,
    pub observation: Observation,
}

impl Crossed {
    /// Upstream's words for an eviction on this threshold.
    pub fn message(&self) -> String {
        let limit = self.threshold.value.of(self.observation.capacity);
        format!(
            "The node was low on resource: {}. Threshold quantity: {}, available: {}. ",
            resource(self.threshold.signal),
            quantity(self.threshold.signal, limit),
            quantity(self.threshold.signal, self.observation.available)
        )
    }
}

/// Bytes as upstream prints them (Ki), counts as they are.
fn quantity(signal: Signal, value: u64) -> String {
    match resource(signal) {
        "inodes" | "pids" => value.to_string(),
        _ => format!("{}Ki", value / 1024),
    }
}

pub struct EvictionManager {
    settings: Eviction,
    /// When each threshold (by index) was first seen crossed, while it is.
    crossed_since: RefCell<HashMap<usize, Instant>>,
    /// When each condition's signal was last seen crossed.
    last_crossed: RefCell<HashMap<Condition, Instant>>,
    pressure: Cell<Pressure>,
}

impl EvictionManager {
    pub fn new(settings: Eviction) -> EvictionManager {
        EvictionManager {
            settings,
            crossed_since: RefCell::default(),
            last_crossed: RefCell::default(),
            pressure: Cell::default(),
        }
    }

    pub fn pressure(&self) -> Pressure {
        self.pressure.get()
    }

    /// evictionMinimumReclaim of `signal`, in its unit.
    pub fn min_reclaim(&self, signal: Signal, capacity: u64) -> u64 {
        self.settings.min_reclaim(signal, capacity)
    }

    /// Takes in one set of observations: updates the conditions and
    /// returns the thresholds to act on now, hard ones first.
    pub fn observe(
        &self,
        observations: &HashMap<Signal, Observation>,
        now: Instant,
    ) -> Vec<Crossed> {
        let mut since = self.crossed_since.borrow_mut();
        let mut last = self.last_crossed.borrow_mut();
        let mut act = Vec::new();
        for (i, threshold) in self.settings.thresholds.iter().enumerate() {
            let Some(observation) = observations.get(&threshold.signal) else {
                continue;
            };
            // Crossed last time: clear only past the minimum reclaim too.
            let mut bar = threshold.value.of(observation.capacity);
            if since.contains_key(&i) {
                bar += self
                    .settings
                    .min_reclaim(threshold.signal, observation.capacity);
            }
            let crossed = observation.available < bar;
            if !crossed {
                since.remove(&i);
                continue;
            }
            // A soft threshold sets the condition as a hard one does.
            last.insert(condition(threshold.signal), now);
            let first = *since.entry(i).or_insert(now);
            if threshold
                .grace
                .is_none_or(|grace| now.duration_since(first) >= grace)
            {
                act.push(Crossed {
                    threshold: threshold.clone(),
                    observation: *observation,
                });
            }
        }
        act.sort_by_key(|c| c.threshold.grace.is_some());
        let on = |c: Condition| {
            last.get(&c)
                .is_some_and(|t| now.duration_since(*t) < self.settings.transition_period)
        };
        self.pressure.set(Pressure {
            memory: on(Condition::Memory),
            disk: on(Condition::Disk),
            pid: on(Condition::Pid),
        });
        act
    }

    /// The grace a pod evicted for `threshold` gets: none for a hard one;
    /// for a soft one its own, capped by evictionMaxPodGracePeriod.
    pub fn grace(&self, threshold: &Threshold, pod_grace: Duration) -> Duration {
        match threshold.grace {
            None => Duration::ZERO,
            Some(_) if self.settings.max_pod_grace.is_zero() => pod_grace,
            Some(_) => pod_grace.min(self.settings.max_pod_grace),
        }
    }
}

/// Upstream's `scheduling.SystemCriticalPriority`.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Upstream's IsCriticalPod: static pods (and their mirrors) and those at
/// system-critical priority, never evicted and admitted under pressure.
pub fn is_critical(pod: &crate::pod::Pod) -> bool {
    pod.source != super::API_SOURCE || pod.priority() >= SYSTEM_CRITICAL_PRIORITY
}

/// What the manager knows of a pod it may evict.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub uid: String,
    pub name: String,
    pub priority: i32,
    pub memory_request: u64,
    pub grace: Duration,
    /// Static or system-critical: never evicted.
    pub critical: bool,
}

/// A pod's use of what a signal measures, for ranking.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodUsage {
    pub memory: u64,
    /// Its ephemeral storage.
    pub disk: DirUsage,
    pub processes: u64,
}

/// The pod to evict for `signal`, by upstream's ranking: for memory, pods
/// using more than they requested first, then lower priority, then the
/// largest use over the request; for disk, lower priority then the
/// largest use (of inodes for an inode signal, else of bytes); for PIDs,
/// lower priority then the most processes. Pods not
/// running (no usage) hold nothing and are not picked.
pub fn pick<'a>(
    signal: Signal,
    candidates: &'a [Candidate],
    usage: &HashMap<String, PodUsage>,
) -> Option<(&'a Candidate, PodUsage)> {
    let mut ranked: Vec<(&Candidate, PodUsage)> = candidates
        .iter()
        .filter(|c| !c.critical)
        .filter_map(|c| Some((c, *usage.get(&c.uid)?)))
        .collect();
    match condition(signal) {
        Condition::Memory => ranked.sort_by_key(|(c, u)| {
            let over = u.memory.saturating_sub(c.memory_request);
            (
                std::cmp::Reverse(u.memory > c.memory_request),
                c.priority,
                std::cmp::Reverse(over),
            )
        }),
        Condition::Disk => {
            let inodes = matches!(signal, Signal::NodefsInodesFree | Signal::ImagefsInodesFree);
            ranked.sort_by_key(|(c, u)| {
                let used = if inodes { u.disk.inodes } else { u.disk.bytes };
                (c.priority, std::cmp::Reverse(used))
            })
        }
        Condition::Pid => ranked.sort_by_key(|(c, u)| (c.priority, std::cmp::Reverse(u.processes))),
    }
    ranked.into_iter().next()
}

/// Upstream's admission under pressure: critical pods always; under
/// memory pressure alone, all but BestEffort (or those tolerating the
/// memory-pressure taint); under any other pressure, none. `Err` is the
/// rejection's message (reason Evicted).
pub fn admit(
    pressure: Pressure,
    qos: QosClass,
    critical: bool,
    tolerates_memory_pressure: bool,
) -> Result<(), String> {
    let names = pressure.names();
    if names.is_empty() || critical {
        return Ok(());
    }
    if names == ["MemoryPressure"] && (qos != QosClass::BestEffort || tolerates_memory_pressure) {
        return Ok(());
    }
    Err(format!("The node had condition: [{}]. ", names.join(" ")))
}

/// A shared list of what may be evicted, kept by the agent's loop.
pub type Candidates = Rc<RefCell<Vec<Candidate>>>;

/// An eviction the manager asks of a pod's worker.
#[derive(Debug, Clone)]
pub struct Order {
    pub uid: String,
    pub message: String,
    pub grace: Duration,
}

/// What one measurement gives: the signals and each running pod's use.
struct Measured {
    signals: HashMap<Signal, Observation>,
    pods: HashMap<String, PodUsage>,
}

/// How much of the pods a measurement reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PodDetail {
    /// The signals alone: what every pass needs, and all an idle node pays.
    None,
    /// Each pod's memory and processes, from its cgroup.
    Usage,
    /// And its disk use: a walk of its dir and logs.
    Disk,
}

/// Reads the signals, and as much of the pods as `detail` asks, off the
/// loop.
async fn measure(ctx: &Context, detail: PodDetail) -> Measured {
    let layout = ctx.layout.clone();
    let cgroups = ctx.cgroups.clone();
    let logs = ctx.config.pod_logs_dir.clone();
    let capacity = ctx.memory_capacity;
    crate::helpers::unblock(move || {
        let snapshot = match detail {
            PodDetail::None => crate::stats::Snapshot {
                at: jiff::Timestamp::now(),
                node: crate::cgroup::usage::node(),
                pods: Vec::new(),
            },
            _ => crate::stats::collect(&layout, &cgroups),
        };
        let mut signals = HashMap::new();
        if let Some(node) = snapshot.node {
            signals.insert(
                Signal::MemoryAvailable,
                Observation {
                    available: capacity.saturating_sub(node.working_set_bytes),
                    capacity,
                },
            );
        }
        for (path, space, inodes) in [
            (
                layout.root.clone(),
                Signal::NodefsAvailable,
                Signal::NodefsInodesFree,
            ),
            (
                layout.images(),
                Signal::ImagefsAvailable,
                Signal::ImagefsInodesFree,
            ),
        ] {
            if let Ok(fs) = FsUsage::of(&path) {
                signals.insert(
                    space,
                    Observation {
                        available: fs.available,
                        capacity: fs.capacity,
                    },
                );
                signals.insert(
                    inodes,
                    Observation {
                        available: fs.inodes_free,
                        capacity: fs.inodes,
                    },
                );
            }
        }
        if let Some(pids) = pid_observation() {
            signals.insert(Signal::PidAvailable, pids);
        }
        let mut pods = HashMap::new();
        let node_device = crate::stats::disk::device(&layout.root);
        for pod in &snapshot.pods {
            let containers = |f: fn(&crate::cgroup::usage::Usage) -> u64| {
                pod.containers.iter().map(|c| f(&c.usage)).sum::<u64>()
            };
            let usage = pod.usage;
            // Its ephemeral storage, as the Summary API reports it.
            let disk = if detail == PodDetail::Disk {
                crate::stats::disk::pod_disk(&layout, &logs, node_device, pod).ephemeral
            } else {
                Default::default()
            };
            pods.insert(
                pod.uid.clone(),
                PodUsage {
                    memory: usage
                        .map(|u| u.working_set_bytes)
                        .unwrap_or_else(|| containers(|u| u.working_set_bytes)),
                    disk,
                    processes: usage
                        .and_then(|u| u.processes)
                        .unwrap_or_else(|| containers(|u| u.processes.unwrap_or(0))),
                },
            );
        }
        Measured { signals, pods }
    })
    .await
}

/// pid.available as upstream counts it: the kernel's pid_max less the
/// tasks that exist (loadavg's total).
fn pid_observation() -> Option<Observation> {
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let tasks: u64 = loadavg
        .split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()?;
    Some(Observation {
        available: max.saturating_sub(tasks),
        capacity: max,
    })
}

/// The manager's loop: a pass every 10 s (see the module's comment).
/// Passes every [`PERIOD`], and at once when the kernel says memory is
/// short (`pressure`, where it can).
pub async fn run(
    ctx: Rc<Context>,
    candidates: Candidates,
    orders: smol::channel::Sender<Order>,
    pressure: Option<smol::channel::Receiver<()>>,
) {
    use futures_lite::FutureExt;
    let mut ordered: HashSet<String> = HashSet::new();
    loop {
        let mut ordered_now = false;
        let measured = measure(&ctx, PodDetail::None).await;
        let act = ctx.eviction.observe(&measured.signals, Instant::now());
        if let Some(crossed) = act.first() {
            let signal = crossed.threshold.signal;
            let open: Vec<Candidate> = candidates
                .borrow()
                .iter()
                .filter(|c| !ordered.contains(&c.uid))
                .cloned()
                .collect();
            if let Some(order) = act_on(&ctx, crossed, &open).await {
                log::warn!(
                    "eviction: {} ({}): {}",
                    order.uid,
                    signal.name(),
                    order.message
                );
                crate::stats::own::evicted(signal);
                ordered.insert(order.uid.clone());
                ordered_now = true;
                let _ = orders.send(order).await;
            }
        }
        // Pods that are gone cannot be evicted again.
        ordered.retain(|uid| candidates.borrow().iter().any(|c| &c.uid == uid));
        // After an eviction the next pass waits its period, whatever the
        // kernel says: the evicted pod's memory takes a moment to come
        // back, and a pass before would pick a second pod.
        let notified = async {
            match &pressure {
                Some(rx) if !ordered_now && rx.recv().await.is_ok() => {
                    log::debug!("eviction: the kernel reports memory pressure");
                }
                // No notifications (or no more): only the timer.
                _ => std::future::pending::<()>().await,
            }
        };
        async {
            smol::Timer::after(PERIOD).await;
        }
        .or(notified)
        .await;
    }
}

/// Reclaim first (disk: unused images), then, if the threshold is still
/// crossed, the pod to evict.
async fn act_on(ctx: &Context, crossed: &Crossed, candidates: &[Candidate]) -> Option<Order> {
    let signal = crossed.threshold.signal;
    if let Some(events) = &ctx.events {
        events.record_node(
            super::events::EventType::Warning,
            "EvictionThresholdMet",
            format!("Attempting to reclaim {}", resource(signal)),
        );
    }
    let mut crossed = crossed.clone();
    let measured = if condition(signal) == Condition::Disk {
        let pods = ctx.layout.pods();
        let in_use =
            crate::helpers::unblock(move || crate::state::records::images_in_use(&pods)).await;
        match ctx.images.delete_unused(&in_use).await {
            Ok(deleted) if !deleted.is_empty() => {
                log::info!(
                    "eviction: {} short; deleted unused images {}",
                    signal.name(),
                    deleted.join(", ")
                );
            }
            Ok(_) => {}
            Err(e) => log::warn!("eviction: reclaiming images: {e}"),
        }
        let measured = measure(ctx, PodDetail::Disk).await;
        let observation = *measured.signals.get(&signal)?;
        let enough = crossed.threshold.value.of(observation.capacity)
            + ctx.eviction.min_reclaim(signal, observation.capacity);
        if observation.available >= enough {
            log::info!(
                "eviction: {} back above its threshold after reclaim",
                signal.name()
            );
            return None;
        }
        crossed.observation = observation;
        measured
    } else {
        measure(ctx, PodDetail::Usage).await
    };
    let Some((pod, usage)) = pick(signal, candidates, &measured.pods) else {
        log::warn!("eviction: {} short and no pod to evict", signal.name());
        return None;
    };
    let mut message = crossed.message();
    if condition(signal) == Condition::Memory {
        message += &format!(
            "Pod {} was using {}Ki, request is {}Ki, has larger consumption of memory. ",
            pod.name,
            usage.memory / 1024,
            pod.memory_request / 1024
        );
    }
    Some(Order {
        uid: pod.uid.clone(),
        message,
        grace: ctx.eviction.grace(&crossed.threshold, pod.grace),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ThresholdValue;

    fn manager(thresholds: Vec<Threshold>) -> EvictionManager {
        EvictionManager::new(Eviction {
            thresholds,
            max_pod_grace: Duration::from_secs(10),
            transition_period: Duration::from_secs(300),
            min_reclaim: Vec::new(),
        })
    }

    fn memory(available: u64) -> HashMap<Signal, Observation> {
        HashMap::from([(
            Signal::MemoryAvailable,
            Observation {
                available,
                capacity: 1000,
            },
        )])
    }

    #[test]
    fn hard_thresholds_act_at_once_soft_ones_after_their_grace() {
        let m = manager(vec![
            Threshold {
                signal: Signal::MemoryAvailable,
                value: ThresholdValue::Quantity(100),
                grace: None,
            },
            Threshold {
                signal: Signal::MemoryAvailable,
                value: ThresholdValue::Percent(30.0),
                grace: Some(Duration::from_secs(60)),
            },
        ]);
        let t0 = Instant::now();
        assert!(m.observe(&memory(500), t0).is_empty());
        assert_eq!(m.pressure(), Pressure::default());
        // Soft crossed: the condition is on, no action before the grace.
        assert!(m.observe(&memory(250), t0).is_empty());
        assert!(m.pressure().memory);
        let act = m.observe(&memory(250), t0 + Duration::from_secs(61));
        assert_eq!(act.len(), 1);
        assert_eq!(act[0].threshold.grace, Some(Duration::from_secs(60)));
        assert_eq!(
            m.grace(&act[0].threshold, Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        // Hard crossed: at once, and before the soft one.
        let act = m.observe(&memory(50), t0 + Duration::from_secs(62));
        assert_eq!(act.len(), 2);
        assert_eq!(act[0].threshold.grace, None);
        assert_eq!(
            m.grace(&act[0].threshold, Duration::from_secs(30)),
            Duration::ZERO
        );
        assert_eq!(
            act[0].message(),
            "The node was low on resource: memory. Threshold quantity: 0Ki, available: 0Ki. "
        );
        // Clear again: the condition stays for the transition period
        // after the signal was last seen crossed (at 62 s).
        let last = t0 + Duration::from_secs(62);
        assert!(
            m.observe(&memory(900), last + Duration::from_secs(30))
                .is_empty()
        );
        assert!(m.pressure().memory);
        m.observe(&memory(900), last + Duration::from_secs(299));
        assert!(m.pressure().memory);
        m.observe(&memory(900), last + Duration::from_secs(301));
        assert!(!m.pressure().memory);
        // A soft threshold that clears in between starts its grace over.
        m.observe(&memory(250), last + Duration::from_secs(400));
        assert!(
            m.observe(&memory(250), last + Duration::from_secs(430))
                .is_empty()
        );
    }

    #[test]
    fn a_crossed_threshold_clears_only_past_its_minimum_reclaim() {
        let m = EvictionManager::new(Eviction {
            thresholds: vec![Threshold {
                signal: Signal::MemoryAvailable,
                value: ThresholdValue::Quantity(100),
                grace: None,
            }],
            max_pod_grace: Duration::ZERO,
            transition_period: Duration::ZERO,
            min_reclaim: vec![(Signal::MemoryAvailable, ThresholdValue::Percent(5.0))],
        });
        let t0 = Instant::now();
        // Not crossed before: the threshold alone decides.
        assert!(m.observe(&memory(120), t0).is_empty());
        assert_eq!(m.observe(&memory(90), t0).len(), 1);
        // Crossed: 100 + 5 % of 1000 must be available to clear.
        assert_eq!(m.observe(&memory(120), t0).len(), 1);
        assert_eq!(m.observe(&memory(149), t0).len(), 1);
        assert!(m.observe(&memory(150), t0).is_empty());
        assert!(m.observe(&memory(120), t0).is_empty());
    }

    fn candidate(uid: &str, priority: i32, request: u64) -> Candidate {
        Candidate {
            uid: uid.into(),
            name: uid.into(),
            priority,
            memory_request: request,
            grace: Duration::from_secs(30),
            critical: false,
        }
    }

    #[test]
    fn memory_ranking_puts_use_over_request_then_priority_then_excess_first() {
        let pods = vec![
            candidate("guaranteed-big", 0, 500),
            candidate("burstable-over", 0, 100),
            candidate("besteffort-small", 0, 0),
            candidate("besteffort-important", 1000, 0),
            Candidate {
                critical: true,
                ..candidate("critical-hog", 0, 0)
            },
        ];
        let use_of = |pairs: &[(&str, u64)]| {
            pairs
                .iter()
                .map(|(uid, memory)| {
                    (
                        uid.to_string(),
                        PodUsage {
                            memory: *memory,
                            ..Default::default()
                        },
                    )
                })
                .collect::<HashMap<_, _>>()
        };
        let usage = use_of(&[
            ("guaranteed-big", 450),
            ("burstable-over", 300),
            ("besteffort-small", 50),
            ("besteffort-important", 900),
            ("critical-hog", 5000),
        ]);
        let picked = pick(Signal::MemoryAvailable, &pods, &usage).unwrap();
        // Over its request by 200, against the BestEffort one's 50.
        assert_eq!(picked.0.uid, "burstable-over");
        // Without it, the lower priority goes before the larger user.
        let rest: Vec<Candidate> = pods[2..].to_vec();
        assert_eq!(
            pick(Signal::MemoryAvailable, &rest, &usage).unwrap().0.uid,
            "besteffort-small"
        );
        // Within requests and not running: nothing to evict.
        let quiet = use_of(&[("guaranteed-big", 10)]);
        assert_eq!(
            pick(Signal::MemoryAvailable, &pods[..1], &quiet)
                .unwrap()
                .0
                .uid,
            "guaranteed-big"
        );
        assert!(pick(Signal::MemoryAvailable, &pods[1..2], &quiet).is_none());
    }

    #[test]
    fn disk_ranking_counts_inodes_for_an_inode_signal() {
        let pods = vec![candidate("big-file", 0, 0), candidate("many-files", 0, 0)];
        let usage: HashMap<String, PodUsage> =
            [("big-file", 100 << 20, 3), ("many-files", 4 << 20, 1000)]
                .into_iter()
                .map(|(uid, bytes, inodes)| {
                    let usage = PodUsage {
                        disk: DirUsage { bytes, inodes },
                        ..Default::default()
                    };
                    (uid.to_string(), usage)
                })
                .collect();
        let picked = |signal| pick(signal, &pods, &usage).unwrap().0.uid.clone();
        assert_eq!(picked(Signal::NodefsAvailable), "big-file");
        assert_eq!(picked(Signal::ImagefsAvailable), "big-file");
        assert_eq!(picked(Signal::NodefsInodesFree), "many-files");
        assert_eq!(picked(Signal::ImagefsInodesFree), "many-files");
    }

    #[test]
    fn admission_under_pressure_as_upstream() {
        let memory = Pressure {
            memory: true,
            ..Default::default()
        };
        assert!(admit(Pressure::default(), QosClass::BestEffort, false, false).is_ok());
        assert!(admit(memory, QosClass::Burstable, false, false).is_ok());
        assert!(admit(memory, QosClass::BestEffort, false, true).is_ok());
        assert!(admit(memory, QosClass::BestEffort, true, false).is_ok());
        assert_eq!(
            admit(memory, QosClass::BestEffort, false, false),
            Err("The node had condition: [MemoryPressure]. ".into())
        );
        let disk = Pressure {
            disk: true,
            ..memory
        };
        assert_eq!(
            admit(disk, QosClass::Guaranteed, false, false),
            Err("The node had condition: [MemoryPressure DiskPressure]. ".into())
        );
    }
}
