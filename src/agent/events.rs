//! The event recorder: what a user must see of a pod's life (`kubectl
//! describe pod`: Pulling, Pulled, Created, Started, Killing, BackOff,
//! Failed, FailedMount) as core/v1 Events. As upstream's correlator, a
//! repeat of the same event within 10 minutes updates the existing one
//! (count, lastTimestamp) instead of creating another, and each object gets
//! a token bucket (burst 25, one more every 5 minutes) so a crash loop
//! cannot flood the uplink. Events wait in a bounded queue while the API
//! server is unreachable; the oldest go first when it is full.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde_json::{Value, json};
use smol::channel::{Receiver, Sender};

use crate::kube::{Api, PatchType};

const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);
const BURST: f64 = 25.0;
const REFILL_EVERY: Duration = Duration::from_secs(300);
const MAX_QUEUED: usize = 100;
const RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// The object an event is about: a pod, one of its containers, or the
/// node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Involved {
    /// `Pod` or `Node`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.containers{name}` for a container's events.
    pub field_path: Option<String>,
}

struct Pending {
    involved: Involved,
    kind: EventType,
    reason: String,
    message: String,
    at: Timestamp,
}

/// A sent event, for aggregation.
struct Sent {
    name: String,
    count: u32,
    last_seen: Instant,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

pub struct EventRecorder {
    api: Api,
    node: String,
    queue: RefCell<VecDeque<Pending>>,
    sent: RefCell<HashMap<(Involved, String, String), Sent>>,
    buckets: RefCell<HashMap<String, Bucket>>,
    wake: Sender<()>,
    woken: Receiver<()>,
}

impl EventRecorder {
    pub fn new(api: Api, node: &str) -> Rc<EventRecorder> {
        let (wake, woken) = smol::channel::bounded(1);
        Rc::new(EventRecorder {
            api,
            node: node.to_owned(),
            queue: RefCell::default(),
            sent: RefCell::default(),
            buckets: RefCell::default(),
            wake,
            woken,
        })
    }

    pub fn record(&self, involved: Involved, kind: EventType, reason: &str, message: String) {
        if !self.allow(&involved.uid) {
            log::debug!(
                "event {reason} for {} dropped by the rate limit",
                involved.name
            );
            return;
        }
        let mut queue = self.queue.borrow_mut();
        if queue.len() >= MAX_QUEUED {
            queue.pop_front();
        }
        queue.push_back(Pending {
            involved,
            kind,
            reason: reason.to_owned(),
            message,
            at: Timestamp::now(),
        });
        drop(queue);
        let _ = self.wake.try_send(());
    }

    /// The per-object token bucket.
    fn allow(&self, uid: &str) -> bool {
        let now = Instant::now();
        let mut buckets = self.buckets.borrow_mut();
        let bucket = buckets.entry(uid.to_owned()).or_insert(Bucket {
            tokens: BURST,
            updated: now,
        });
        let refill = now.duration_since(bucket.updated).as_secs_f64() / REFILL_EVERY.as_secs_f64();
        bucket.tokens = (bucket.tokens + refill).min(BURST);
        bucket.updated = now;
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }

    /// An event about the node itself, referred to as upstream does (its
    /// name as UID, kept in the default namespace).
    pub fn record_node(&self, kind: EventType, reason: &str, message: String) {
        let involved = Involved {
            kind: "Node",
            namespace: String::new(),
            name: self.node.clone(),
            uid: self.node.clone(),
            field_path: None,
        };
        self.record(involved, kind, reason, message);
    }

    /// Forgets a pod's aggregation and rate-limit state once it is gone.
    pub fn forget(&self, uid: &str) {
        self.buckets.borrow_mut().remove(uid);
        self.sent.borrow_mut().retain(|(i, _, _), _| i.uid != uid);
    }

    pub async fn run(self: Rc<Self>) {
        loop {
            let _ = self.woken.recv().await;
            loop {
                let Some(event) = self.queue.borrow_mut().pop_front() else {
                    break;
                };
                if let Err(e) = self.send(&event).await {
                    if !e.is_unavailable() {
                        log::warn!(
                            "event {} for pod {}: {e}",
                            event.reason,
                            event.involved.name
                        );
                        continue;
                    }
                    // Unreachable: keep it and try again later.
                    self.queue.borrow_mut().push_front(event);
                    smol::Timer::after(RETRY).await;
                }
            }
        }
    }

    async fn send(&self, event: &Pending) -> Result<(), crate::kube::KubeError> {
        let ns = match event.involved.kind {
            "Node" => "default",
            _ => event.involved.namespace.as_str(),
        };
        let key = (
            event.involved.clone(),
            event.reason.clone(),
            event.message.clone(),
        );
        let now = Instant::now();
        let repeat = self.sent.borrow().get(&key).and_then(|s| {
            (now.duration_since(s.last_seen) < AGGREGATION_WINDOW)
                .then(|| (s.name.clone(), s.count + 1))
        });
        if let Some((name, count)) = repeat {
            let patch = json!({"count": count, "lastTimestamp": time(event.at)});
            let path = format!("/api/v1/namespaces/{ns}/events/{name}");
            match self
                .api
                .patch::<Value>(&path, PatchType::Merge, &patch)
                .await
            {
                Ok(_) => {
                    self.sent.borrow_mut().insert(
                        key,
                        Sent {
                            name,
                            count,
                            last_seen: now,
                        },
                    );
                    return Ok(());
                }
                // Expired (events live an hour): create it anew.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!(
            "{}.{:x}",
            event.involved.name,
            event.at.as_nanosecond().max(0)
        );
        let mut involved = json!({
            "kind": event.involved.kind,
            "name": event.involved.name,
            "uid": event.involved.uid,
            "apiVersion": "v1",
        });
        if !event.involved.namespace.is_empty() {
            involved["namespace"] = json!(event.involved.namespace);
        }
        if let Some(path) = &event.involved.field_path {
            involved["fieldPath"] = json!(path);
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": involved,
            "reason": event.reason,
            "message": event.message,
            "source": {"component": "kubelet", "host": self.node},
            "firstTimestamp": time(event.at),
            "lastTimestamp": time(event.at),
            "count": 1,
            "type": match event.kind {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            "reportingComponent": "kubelet",
            "reportingInstance": self.node,
        });
        self.api
            .create::<_, Value>(&format!("/api/v1/namespaces/{ns}/events"), &body)
            .await?;
        self.sent.borrow_mut().insert(
            key,
            Sent {
                name,
                count: 1,
                last_seen: now,
            },
        );
        Ok(())
    }
}

fn time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
