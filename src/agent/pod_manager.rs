//! The pod manager: desired pods in (a scan of the manifest directory, the
//! API server's pods for this node, sorted), commands out (start a worker,
//! tell one to terminate, update or resize, report a refusal). It keeps
//! what it told each worker and which refusals it reported, and does no
//! I/O: the agent's loop carries its commands out.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use jiff::Timestamp;

use super::admission::{self, Capacity};
use super::api_source::ApiPods;
use super::eviction::{self, Pressure};
use super::worker::Control;
use super::{API_SOURCE, resized};
use crate::pod::{Pod, QosClass};

/// What the loop is to do.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// Start a worker for the pod (admitted at `admitted`).
    Start { pod: Box<Pod>, admitted: Timestamp },
    /// Tell a pod's worker.
    Tell { uid: String, control: Control },
    /// The API server's pod is refused: its status says why.
    Refuse {
        uid: String,
        namespace: String,
        name: String,
        reason: String,
        message: String,
    },
    /// A pod being deleted that nothing runs any more: the kubelet's final
    /// delete.
    FinalDelete {
        uid: String,
        namespace: String,
        name: String,
    },
}

/// What the manager knows of a pod it started a worker for.
struct Known {
    /// The pod as last given to the worker, to see updates.
    pod: Pod,
    from_api: bool,
    terminating: bool,
    /// CPU (millicores) and memory requests, for admission.
    requests: (u64, u64),
    /// Why its resize waits (`Infeasible`/`Deferred` and a message).
    resize_pending: Option<(String, String)>,
}

#[derive(Default)]
pub struct PodManager {
    pods: HashMap<String, Known>,
    /// Static pods waiting for an older pod of their name to stop.
    static_waiting: HashSet<String>,
    /// API pods refused, reported once.
    refused: HashSet<String>,
    /// Running API pods whose update was ignored, logged once.
    kept_logged: HashSet<String>,
    /// Final deletes asked for.
    deleted: HashSet<String>,
}

impl PodManager {
    /// Whether a worker runs the pod.
    pub fn runs(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.pods.keys()
    }

    /// A pod the previous run admitted: its worker starts again.
    pub fn adopt(&mut self, pod: Pod, admitted: Timestamp) -> Command {
        self.start(pod, admitted)
    }

    /// Its worker has ended.
    pub fn finished(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    fn start(&mut self, pod: Pod, admitted: Timestamp) -> Command {
        let known = Known {
            from_api: pod.source == API_SOURCE,
            terminating: false,
            requests: admission::requests(&pod),
            resize_pending: None,
            pod: pod.clone(),
        };
        self.pods.insert(pod.uid.clone(), known);
        Command::Start {
            pod: Box::new(pod),
            admitted,
        }
    }

    fn terminate(&mut self, uid: &str, grace: Option<Duration>, commands: &mut Vec<Command>) {
        if let Some(known) = self.pods.get_mut(uid)
            && !known.terminating
        {
            known.terminating = true;
            commands.push(Command::Tell {
                uid: uid.to_owned(),
                control: Control::Terminate { grace },
            });
        }
    }

    /// The manifest directory's pods (by UID): those gone are terminated,
    /// new ones started, one per full name at a time as upstream's: an
    /// edited manifest's pod (a new UID) starts once the old one has
    /// stopped, whose host ports and files it may want.
    pub fn static_pods(&mut self, desired: HashMap<String, Pod>, now: Timestamp) -> Vec<Command> {
        let mut commands = Vec::new();
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, known)| !known.from_api && !desired.contains_key(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            self.terminate(&uid, None, &mut commands);
        }
        self.static_waiting.retain(|uid| desired.contains_key(uid));
        let mut desired: Vec<(String, Pod)> = desired.into_iter().collect();
        desired.sort_by(|a, b| a.0.cmp(&b.0));
        for (uid, pod) in desired {
            if self.pods.contains_key(&uid) {
                continue;
            }
            let name = pod.full_name();
            if let Some(old) = self
                .pods
                .iter()
                .find(|(_, k)| !k.from_api && k.pod.full_name() == name)
            {
                if self.static_waiting.insert(uid.clone()) {
                    log::info!(
                        "pod {name} ({uid}) waits for its previous instance ({}) to stop",
                        old.0
                    );
                }
                continue;
            }
            self.static_waiting.remove(&uid);
            commands.push(self.start(pod, now));
        }
        commands
    }

    /// The API server's pods, sorted (`api_source::sort`, with `runs`):
    /// those deleted or gone are terminated, changes reach running pods
    /// (an in-place resize if it fits), new pods are admitted in creation
    /// order if they fit what the others leave, and refusals are reported
    /// once. `in_api` tells whether the API server still has a UID.
    pub fn api_pods(
        &mut self,
        sorted: ApiPods,
        in_api: impl Fn(&str) -> bool,
        capacity: &Capacity,
        pressure: Pressure,
        now: Timestamp,
    ) -> Vec<Command> {
        let mut commands = Vec::new();
        let api_uids: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, k)| k.from_api)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &api_uids {
            if let Some((_, grace)) = sorted.deleting.get(uid) {
                self.terminate(uid, *grace, &mut commands);
            } else if let Some(why) = sorted.kept.get(uid) {
                if self.kept_logged.insert(uid.clone())
                    && let Some(known) = self.pods.get(uid)
                {
                    log::warn!(
                        "pod {}: its update is ignored: {why}",
                        known.pod.full_name()
                    );
                }
            } else if !sorted.run.contains_key(uid) {
                self.terminate(uid, None, &mut commands);
            }
        }
        self.update_running(&sorted, capacity, &mut commands);
        self.admit_new(&sorted, capacity, pressure, now, &mut commands);
        self.deleted.retain(|uid| sorted.deleting.contains_key(uid));
        self.refused.retain(|uid| in_api(uid));
        self.kept_logged.retain(|uid| in_api(uid));
        let mut deleting: Vec<_> = sorted.deleting.iter().collect();
        deleting.sort_by(|a, b| a.0.cmp(b.0));
        for (uid, (pod, _)) in deleting {
            if !self.pods.contains_key(uid) && self.deleted.insert(uid.clone()) {
                commands.push(Command::FinalDelete {
                    uid: uid.clone(),
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                });
            }
        }
        for (pod, reason, message) in &sorted.rejected {
            if self.refused.insert(pod.uid.clone()) {
                log::warn!("pod {}/{} rejected: {message}", pod.namespace, pod.name);
                commands.push(Command::Refuse {
                    uid: pod.uid.clone(),
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    reason: reason.clone(),
                    message: message.clone(),
                });
            }
        }
        commands
    }

    /// Changes to pods that run: new images, labels, annotations,
    /// resources (an in-place resize, if the node has room for it; one
    /// that waits is tried again at each pass, the worker keeping the old
    /// pod meanwhile).
    fn update_running(
        &mut self,
        sorted: &ApiPods,
        capacity: &Capacity,
        commands: &mut Vec<Command>,
    ) {
        let mut changed: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, k)| {
                k.from_api
                    && !k.terminating
                    && sorted.run.get(*uid).is_some_and(|p| pod_changed(&k.pod, p))
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        changed.sort();
        for uid in changed {
            let (Some(pod), Some(known)) = (sorted.run.get(&uid), self.pods.get(&uid)) else {
                continue;
            };
            let verdict = resized(&known.pod, pod)
                .then(|| {
                    let mut others = admission::Used::default();
                    for (_, k) in self
                        .pods
                        .iter()
                        .filter(|(u, k)| **u != uid && !k.terminating)
                    {
                        others.add(&k.pod);
                    }
                    admission::resize_verdict(pod, capacity, &others)
                })
                .flatten();
            let Some(known) = self.pods.get_mut(&uid) else {
                continue;
            };
            if verdict != known.resize_pending {
                known.resize_pending = verdict.clone();
                commands.push(Command::Tell {
                    uid: uid.clone(),
                    control: Control::ResizePending(verdict.clone()),
                });
            }
            if verdict.is_none() {
                known.requests = admission::requests(pod);
                known.pod = pod.clone();
                commands.push(Command::Tell {
                    uid,
                    control: Control::Update(Box::new(pod.clone())),
                });
            }
        }
    }

    /// New pods in creation order, each admitted if it fits in what the
    /// running ones leave and the node's pressure lets it in.
    fn admit_new(
        &mut self,
        sorted: &ApiPods,
        capacity: &Capacity,
        pressure: Pressure,
        now: Timestamp,
        commands: &mut Vec<Command>,
    ) {
        let mut used = admission::Used::default();
        for known in self.pods.values().filter(|k| !k.terminating) {
            used.add(&known.pod);
        }
        let mut new: Vec<&Pod> = sorted
            .run
            .values()
            .filter(|p| !self.pods.contains_key(&p.uid) && !self.refused.contains(&p.uid))
            .collect();
        new.sort_by_key(|p| {
            (
                p.manifest.metadata.creation_timestamp.clone().map(|t| t.0),
                p.uid.clone(),
            )
        });
        for pod in new {
            let under_pressure = eviction::admit(
                pressure,
                pod.qos,
                eviction::is_critical(pod),
                tolerates_memory_pressure(pod),
            )
            .map_err(|message| ("Evicted".to_owned(), message));
            match under_pressure.and_then(|()| admission::admit(pod, capacity, &mut used)) {
                Ok(()) => commands.push(self.start(pod.clone(), now)),
                Err((reason, message)) => {
                    if self.refused.insert(pod.uid.clone()) {
                        log::warn!("pod {} rejected: {message}", pod.full_name());
                        commands.push(Command::Refuse {
                            uid: pod.uid.clone(),
                            namespace: pod.namespace.clone(),
                            name: pod.name.clone(),
                            reason,
                            message,
                        });
                    }
                }
            }
        }
    }

    /// The eviction manager's order for a pod.
    pub fn evict(&self, order: eviction::Order) -> Option<Command> {
        if !self.pods.contains_key(&order.uid) {
            return None;
        }
        Some(Command::Tell {
            uid: order.uid,
            control: Control::Evict {
                message: order.message,
                grace: order.grace,
            },
        })
    }

    /// What the eviction manager may pick from: pods not on their way out.
    pub fn candidates(&self) -> Vec<eviction::Candidate> {
        self.pods
            .iter()
            .filter(|(_, k)| !k.terminating)
            .map(|(uid, k)| eviction::Candidate {
                uid: uid.clone(),
                name: k.pod.full_name(),
                priority: k.pod.priority(),
                memory_request: k.requests.1,
                grace: k.pod.termination_grace,
                critical: eviction::is_critical(&k.pod),
            })
            .collect()
    }

    /// The Burstable pods' CPU requests, which the class's weight follows.
    pub fn burstable_cpu(&self) -> u64 {
        self.pods
            .values()
            .filter(|k| k.pod.qos == QosClass::Burstable)
            .map(|k| k.requests.0)
            .sum()
    }
}

/// Whether an API pod changed in a way its worker must act on: its spec
/// (images, resources, ephemeral containers) or the labels and
/// annotations the downward API shows.
fn pod_changed(old: &Pod, new: &Pod) -> bool {
    old.manifest.spec != new.manifest.spec
        || old.manifest.metadata.labels != new.manifest.metadata.labels
        || old.manifest.metadata.annotations != new.manifest.metadata.annotations
        || crate::pod::status::readiness_gate_conditions(old)
            != crate::pod::status::readiness_gate_conditions(new)
}

/// Whether a pod tolerates the memory-pressure taint (NoSchedule), which
/// lets a BestEffort pod in under memory pressure, as upstream.
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    let tolerations = pod
        .manifest
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref());
    tolerations.into_iter().flatten().any(|t| {
        let key_matches = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(key) => key == "node.kubernetes.io/memory-pressure",
        };
        let effect_matches = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == "NoSchedule");
        let value_matches =
            t.operator.as_deref() == Some("Exists") || t.value.as_deref().unwrap_or("").is_empty();
        key_matches && effect_matches && value_matches
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::api_source::PodRef;
    use crate::pod::manifest::parse_one;

    fn now() -> Timestamp {
        "2026-12-05T12:00:00Z".parse().unwrap()
    }

    /// A static pod from manifest `file`, its UID as the manifest made it.
    fn static_pod(name: &str, image: &str) -> Pod {
        parse_one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, image: {image}}}]\n"
        ))
    }

    fn desired(pods: &[&Pod]) -> HashMap<String, Pod> {
        pods.iter().map(|p| (p.uid.clone(), (*p).clone())).collect()
    }

    /// An API pod with `uid`, created at second `created`, requesting `cpu`.
    fn api_pod(uid: &str, created: u32, cpu: &str) -> Pod {
        let mut pod = parse_one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, creationTimestamp: '2026-12-05T10:00:{created:02}Z'}}\nspec:\n  containers: [{{name: c, image: i, resources: {{requests: {{cpu: {cpu}}}}}}}]\n"
        ));
        pod.uid = uid.into();
        pod.source = API_SOURCE.into();
        pod
    }

    fn running(pods: &[&Pod]) -> ApiPods {
        ApiPods {
            run: pods.iter().map(|p| (p.uid.clone(), (*p).clone())).collect(),
            ..Default::default()
        }
    }

    fn capacity(cpu_milli: u64) -> Capacity {
        Capacity {
            cpu_milli,
            memory: 1 << 30,
            pods: 110,
            ..Default::default()
        }
    }

    fn started(commands: &[Command]) -> Vec<String> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Start { pod, .. } => Some(pod.uid.clone()),
                _ => None,
            })
            .collect()
    }

    fn told(commands: &[Command]) -> Vec<(String, Control)> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Tell { uid, control } => Some((uid.clone(), control.clone())),
                _ => None,
            })
            .collect()
    }

    fn terminate(uid: &str, grace: Option<Duration>) -> (String, Control) {
        (uid.to_owned(), Control::Terminate { grace })
    }

    /// One pass over the API server's pods on a node with 1000m of CPU and
    /// no pressure; `in_api` tells which the API server still has.
    fn sync_listing(
        manager: &mut PodManager,
        pods: ApiPods,
        in_api: impl Fn(&str) -> bool,
    ) -> Vec<Command> {
        manager.api_pods(pods, in_api, &capacity(1000), Pressure::default(), now())
    }

    fn sync(manager: &mut PodManager, pods: ApiPods) -> Vec<Command> {
        sync_listing(manager, pods, |_| true)
    }

    #[test]
    fn static_pods_start_and_stop_with_their_manifests_once() {
        let mut manager = PodManager::default();
        let a = static_pod("a", "x:1");
        let b = static_pod("b", "x:1");
        let commands = manager.static_pods(desired(&[&a, &b]), now());
        let mut uids = started(&commands);
        uids.sort();
        let mut want = vec![a.uid.clone(), b.uid.clone()];
        want.sort();
        assert_eq!(uids, want);
        // Scanned again: nothing new.
        assert_eq!(manager.static_pods(desired(&[&a, &b]), now()), vec![]);
        // b's manifest gone: terminated once, whatever the scans.
        let commands = manager.static_pods(desired(&[&a]), now());
        assert_eq!(told(&commands), vec![terminate(&b.uid, None)]);
        assert_eq!(manager.static_pods(desired(&[&a]), now()), vec![]);
        manager.finished(&b.uid);
        assert!(!manager.runs(&b.uid));
    }

    #[test]
    fn an_edited_static_pod_starts_once_its_previous_instance_has_stopped() {
        let mut manager = PodManager::default();
        let old = static_pod("web", "x:1");
        let new = static_pod("web", "x:2");
        assert_ne!(old.uid, new.uid);
        manager.static_pods(desired(&[&old]), now());
        let commands = manager.static_pods(desired(&[&new]), now());
        assert_eq!(told(&commands), vec![terminate(&old.uid, None)]);
        assert_eq!(started(&commands), Vec::<String>::new());
        // Still stopping: the new one waits.
        assert_eq!(manager.static_pods(desired(&[&new]), now()), vec![]);
        manager.finished(&old.uid);
        let commands = manager.static_pods(desired(&[&new]), now());
        assert_eq!(started(&commands), vec![new.uid.clone()]);
    }

    #[test]
    fn api_pods_are_admitted_in_creation_order_while_they_fit_and_refused_once() {
        let mut manager = PodManager::default();
        let first = api_pod("first", 1, "600m");
        let second = api_pod("second", 2, "600m");
        let third = api_pod("third", 3, "300m");
        let all = running(&[&third, &second, &first]);
        let commands = sync(&mut manager, all);
        assert_eq!(
            started(&commands),
            vec!["first".to_owned(), "third".to_owned()]
        );
        let refused: Vec<_> = commands
            .iter()
            .filter_map(|c| match c {
                Command::Refuse { uid, reason, .. } => Some((uid.as_str(), reason.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(refused, vec![("second", "OutOfcpu")]);
        // Refused once, not again at each pass, nor started later; and so
        // is a pod the sorting refused.
        let mut again = running(&[&third, &second, &first]);
        let unsupported = || {
            (
                PodRef {
                    uid: "odd".into(),
                    namespace: "default".into(),
                    name: "odd".into(),
                },
                "UnexpectedAdmissionError".to_owned(),
                "m".to_owned(),
            )
        };
        again.rejected.push(unsupported());
        let commands = sync(&mut manager, again);
        assert!(
            matches!(&commands[..], [Command::Refuse { uid, .. }] if uid == "odd"),
            "{commands:?}"
        );
        let mut again = running(&[&third, &second, &first]);
        again.rejected.push(unsupported());
        assert_eq!(sync(&mut manager, again), vec![]);
    }

    #[test]
    fn under_memory_pressure_besteffort_pods_are_refused_as_evicted() {
        let mut manager = PodManager::default();
        let mut besteffort = api_pod("be", 1, "0");
        besteffort.qos = QosClass::BestEffort;
        let pressure = Pressure {
            memory: true,
            ..Default::default()
        };
        let commands = manager.api_pods(
            running(&[&besteffort]),
            |_| true,
            &capacity(1000),
            pressure,
            now(),
        );
        assert!(
            matches!(&commands[..], [Command::Refuse { reason, .. }] if reason == "Evicted"),
            "{commands:?}"
        );
    }

    #[test]
    fn deleted_and_vanished_api_pods_are_terminated_and_finally_deleted_once() {
        let mut manager = PodManager::default();
        let a = api_pod("a", 1, "100m");
        let b = api_pod("b", 2, "100m");
        sync(&mut manager, running(&[&a, &b]));
        let grace = Some(Duration::from_secs(5));
        let reference = |uid: &str| PodRef {
            uid: uid.into(),
            namespace: "default".into(),
            name: uid.into(),
        };
        let deleting = || ApiPods {
            deleting: HashMap::from([("a".to_owned(), (reference("a"), grace))]),
            ..Default::default()
        };
        // a is being deleted, b is gone from the API server.
        let commands = sync_listing(&mut manager, deleting(), |uid| uid == "a");
        let mut got = told(&commands);
        got.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(got, vec![terminate("a", grace), terminate("b", None)]);
        // While a's worker stops, nothing more; once it has, its final
        // delete, once.
        assert_eq!(
            sync_listing(&mut manager, deleting(), |uid| uid == "a"),
            vec![]
        );
        manager.finished("a");
        let commands = sync_listing(&mut manager, deleting(), |uid| uid == "a");
        assert_eq!(
            commands,
            vec![Command::FinalDelete {
                uid: "a".into(),
                namespace: "default".into(),
                name: "a".into()
            }]
        );
        assert_eq!(
            sync_listing(&mut manager, deleting(), |uid| uid == "a"),
            vec![]
        );
    }

    #[test]
    fn a_resize_waits_for_room_then_reaches_the_worker() {
        let mut manager = PodManager::default();
        let small = api_pod("r", 1, "200m");
        let other = api_pod("o", 2, "500m");
        sync(&mut manager, running(&[&small, &other]));
        let big = {
            let mut pod = api_pod("r", 1, "700m");
            pod.qos = small.qos;
            pod
        };
        let commands = sync(&mut manager, running(&[&big, &other]));
        let got = told(&commands);
        assert!(
            matches!(&got[..], [(uid, Control::ResizePending(Some((reason, _))))] if uid == "r" && (reason == "Infeasible" || reason == "Deferred")),
            "{got:?}"
        );
        // The other pod gone: room for it now.
        let commands = sync(&mut manager, running(&[&big]));
        let got = told(&commands);
        assert!(got.contains(&terminate("o", None)), "{got:?}");
        assert!(
            got.contains(&("r".to_owned(), Control::ResizePending(None))),
            "{got:?}"
        );
        assert!(
            got.contains(&("r".to_owned(), Control::Update(Box::new(big.clone())))),
            "{got:?}"
        );
        // The worker has it: nothing more.
        assert_eq!(told(&sync(&mut manager, running(&[&big]))), vec![]);
    }

    #[test]
    fn eviction_sees_the_pods_not_on_their_way_out() {
        let mut manager = PodManager::default();
        let a = api_pod("a", 1, "100m");
        let b = api_pod("b", 2, "100m");
        sync(&mut manager, running(&[&a, &b]));
        sync(&mut manager, running(&[&a]));
        let uids: Vec<String> = manager.candidates().into_iter().map(|c| c.uid).collect();
        assert_eq!(uids, vec!["a".to_owned()]);
        assert_eq!(manager.burstable_cpu(), 200);
        let order = eviction::Order {
            uid: "a".into(),
            message: "m".into(),
            grace: Duration::ZERO,
        };
        assert!(manager.evict(order).is_some());
    }
}
