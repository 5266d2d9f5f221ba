//! The object store: every object as JSON, one global resourceVersion
//! counter (as etcd's revision), a window of past events for watches to
//! resume from, and the live watchers.

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;
use smol::channel::Sender;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub resource: String,
    pub object: Value,
    /// The object before a modification: a watch with a selector turns a
    /// modification into ADDED or DELETED when the object starts or stops
    /// matching.
    pub old: Option<Value>,
}

/// (resource id, namespace, name); "" namespace for cluster-scoped ones.
pub type Key = (String, String, String);

pub struct Watcher {
    pub resource: String,
    pub namespace: Option<String>,
    pub tx: Sender<Event>,
}

pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Event>,
    /// Watches from a resourceVersion older than this get 410 Gone.
    oldest_rv: u64,
    history_limit: usize,
    watchers: Vec<Watcher>,
}

pub fn key(resource: &str, namespace: &str, name: &str) -> Key {
    (resource.to_owned(), namespace.to_owned(), name.to_owned())
}

fn object_namespace(object: &Value) -> &str {
    object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

impl Store {
    pub fn new(history_limit: usize) -> Store {
        Store {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            oldest_rv: 1,
            history_limit,
            watchers: Vec::new(),
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    pub fn oldest_rv(&self) -> u64 {
        self.oldest_rv
    }

    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of a resource, optionally in one namespace, in name order.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, ns, _), _)| r == resource && namespace.is_none_or(|want| want == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Stores `object` under a new resourceVersion (written into it) and
    /// tells the watchers. Returns the stored object.
    pub fn put(&mut self, key: Key, mut object: Value, kind: EventType) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let old = self.objects.insert(key.clone(), object.clone());
        self.record(kind, key.0, object.clone(), old);
        object
    }

    /// Removes an object; the DELETED event carries it with a new
    /// resourceVersion, as etcd's delete revision.
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.record(EventType::Deleted, key.0.clone(), object.clone(), None);
        Some(object)
    }

    fn record(&mut self, kind: EventType, resource: String, object: Value, old: Option<Value>) {
        let event = Event {
            rv: self.rv,
            kind,
            resource,
            object,
            old,
        };
        let namespace = object_namespace(&event.object).to_owned();
        self.watchers.retain(|w| {
            if w.resource != event.resource
                || w.namespace.as_deref().is_some_and(|ns| ns != namespace)
            {
                return !w.tx.is_closed();
            }
            // A watcher that cannot keep up is closed, as the real server
            // closes slow watches; the client re-lists.
            w.tx.try_send(event.clone()).is_ok()
        });
        self.history.push_back(event);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.oldest_rv = old.rv;
            }
        }
    }

    /// Events after `rv` for a resource (and namespace); `None` when `rv`
    /// is older than the window (410 Gone).
    pub fn since(&self, resource: &str, namespace: Option<&str>, rv: u64) -> Option<Vec<Event>> {
        if rv < self.oldest_rv {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|e| e.rv > rv && e.resource == resource)
                .filter(|e| namespace.is_none_or(|ns| object_namespace(&e.object) == ns))
                .cloned()
                .collect(),
        )
    }

    pub fn watch(&mut self, watcher: Watcher) {
        self.watchers.push(watcher);
    }

    /// Drops every watch (a test control: clients must re-watch).
    pub fn close_watches(&mut self) {
        self.watchers.clear();
    }

    /// Forgets the event window (a test control: older watches get 410).
    pub fn compact(&mut self) {
        self.history.clear();
        self.oldest_rv = self.rv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn versions_events_and_compaction() {
        let mut store = Store::new(2);
        let k = key("/pods", "default", "a");
        let first = store.put(
            k.clone(),
            json!({"metadata": {"name": "a", "namespace": "default"}}),
            EventType::Added,
        );
        let rv1: u64 = first["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        store.put(
            k.clone(),
            json!({"metadata": {"name": "a", "namespace": "default"}}),
            EventType::Modified,
        );
        let events = store.since("/pods", Some("default"), rv1).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventType::Modified);
        assert!(store.since("/pods", Some("other"), rv1).unwrap().is_empty());
        store.remove(&k);
        store.put(
            key("/pods", "default", "b"),
            json!({"metadata": {"name": "b", "namespace": "default"}}),
            EventType::Added,
        );
        assert!(
            store.since("/pods", None, rv1).is_none(),
            "older than the window"
        );
        store.compact();
        assert!(store.since("/pods", None, store.current_rv() - 1).is_none());
        assert!(
            store
                .since("/pods", None, store.current_rv())
                .unwrap()
                .is_empty()
        );
    }
}
