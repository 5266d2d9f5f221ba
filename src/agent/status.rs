//! The status manager: pod statuses go to the API server as strategic
//! merge patches of `pods/<name>/status` carrying only what changed, with
//! the pod's UID as a precondition and no resourceVersion (so no 409s), as
//! upstream's status manager sends them. Writers only record the latest
//! status; one task sends, coalescing bursts and retrying after failures.
//! Once a terminated pod's final status is out, it deletes the pod with
//! grace period 0 and a UID precondition.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use serde_json::{Value, json};
use smol::channel::{Receiver, Sender};

use super::mirror::mirror_of;
use crate::kube::diff::strategic_diff;
use crate::kube::watch::Reflector;
use crate::kube::{Api, PatchType};

/// Failed patches are retried on this period, as upstream's full status
/// sync does.
const RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Entry {
    namespace: String,
    name: String,
    /// The latest status the agent computed, not yet sent.
    pending: Option<core::PodStatus>,
    /// What the API server has from us, as JSON.
    sent: Option<Value>,
    /// The pod's containers are stopped: delete it once its status is out.
    delete: bool,
    /// A static pod: its status goes to its mirror pod.
    mirrored: bool,
    /// Its worker has ended: remove the entry once nothing is pending.
    finished: bool,
}

pub struct StatusManager {
    api: Api,
    pods: Rc<Reflector>,
    entries: RefCell<HashMap<String, Entry>>,
    wake: Sender<()>,
    woken: Receiver<()>,
}

impl StatusManager {
    pub fn new(api: Api, pods: Rc<Reflector>) -> Rc<StatusManager> {
        let (wake, woken) = smol::channel::bounded(1);
        Rc::new(StatusManager {
            api,
            pods,
            entries: RefCell::default(),
            wake,
            woken,
        })
    }

    /// Records the status of pod `uid` to be sent; `mirrored` for a static
    /// pod, whose status goes to its mirror pod once there is one.
    pub fn set(
        &self,
        uid: &str,
        namespace: &str,
        name: &str,
        status: core::PodStatus,
        mirrored: bool,
    ) {
        let mut entries = self.entries.borrow_mut();
        let entry = entries.entry(uid.to_owned()).or_default();
        entry.namespace = namespace.to_owned();
        entry.name = name.to_owned();
        entry.pending = Some(status);
        entry.mirrored = mirrored;
        drop(entries);
        let _ = self.wake.try_send(());
    }

    /// The pod's containers are gone: after its last status, delete it.
    pub fn delete(&self, uid: &str, namespace: &str, name: &str) {
        let mut entries = self.entries.borrow_mut();
        let entry = entries.entry(uid.to_owned()).or_default();
        entry.namespace = namespace.to_owned();
        entry.name = name.to_owned();
        entry.delete = true;
        drop(entries);
        let _ = self.wake.try_send(());
    }

    /// The API changed (a mirror pod may have appeared): try again.
    pub fn poke(&self) {
        let _ = self.wake.try_send(());
    }

    pub async fn run(self: Rc<Self>) {
        loop {
            let _ = self.woken.recv().await;
            while !self.sync_all().await {
                // Some request failed: try again later, keeping what is
                // pending (newer statuses replace it meanwhile).
                super::woken_or_after(&self.woken, RETRY).await;
            }
        }
    }

    /// Sends everything pending; false if something must be retried.
    async fn sync_all(&self) -> bool {
        let uids: Vec<String> = self.entries.borrow().keys().cloned().collect();
        let mut ok = true;
        for uid in uids {
            ok &= self.sync(&uid).await;
        }
        ok
    }

    async fn sync(&self, uid: &str) -> bool {
        let (namespace, name, pending, sent, delete, mirrored) = {
            let entries = self.entries.borrow();
            let Some(e) = entries.get(uid) else {
                return true;
            };
            (
                e.namespace.clone(),
                e.name.clone(),
                e.pending.clone(),
                e.sent.clone(),
                e.delete,
                e.mirrored,
            )
        };
        // The API object: the pod itself, or a static pod's mirror.
        let (api_uid, in_api) = {
            let snapshot = self.pods.snapshot();
            match snapshot.objects.get(uid) {
                Some(o) => (uid.to_owned(), Some(o.clone())),
                None => snapshot
                    .objects
                    .iter()
                    .find(|(_, o)| mirrored && mirror_of(o) == Some(uid))
                    .map(|(u, o)| (u.clone(), Some(o.clone())))
                    .unwrap_or((uid.to_owned(), None)),
            }
        };
        if mirrored && in_api.is_none() {
            // No mirror pod yet: the status waits for it.
            return true;
        }
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        if let Some(status) = pending {
            let new = serde_json::to_value(&status).unwrap_or_default();
            // Against what we sent, or else what the API server shows.
            let old = sent
                .or_else(|| in_api.as_ref().and_then(|p| p.get("status").cloned()))
                .unwrap_or(json!({}));
            if let Some(diff) = strategic_diff(&old, &new) {
                let patch = json!({"metadata": {"uid": api_uid}, "status": diff});
                match self
                    .api
                    .patch::<Value>(&format!("{path}/status"), PatchType::StrategicMerge, &patch)
                    .await
                {
                    Ok(_) => {}
                    // A mirror being replaced: send all to the next one.
                    Err(e) if mirrored && (e.is_not_found() || e.is_conflict()) => {
                        if let Some(e) = self.entries.borrow_mut().get_mut(uid) {
                            e.sent = None;
                        }
                        return true;
                    }
                    // Gone, or replaced by a pod of the same name: nothing
                    // of ours to update any more.
                    Err(e) if e.is_not_found() || e.is_conflict() => {
                        log::debug!("pod {namespace}/{name}: status not sent: {e}");
                        self.entries.borrow_mut().remove(uid);
                        return true;
                    }
                    Err(e) => {
                        if !e.is_unavailable() {
                            log::warn!("pod {namespace}/{name}: status: {e}");
                        }
                        return false;
                    }
                }
            }
            if let Some(e) = self.entries.borrow_mut().get_mut(uid) {
                // A newer status may have arrived while this one was sent.
                if e.pending.as_ref() == Some(&status) {
                    e.pending = None;
                }
                e.sent = Some(new);
            }
        }
        if !delete {
            // A delete asked for while this pass ran keeps the entry: the
            // wake it sent brings the next pass.
            let mut entries = self.entries.borrow_mut();
            if entries
                .get(uid)
                .is_some_and(|e| e.finished && e.pending.is_none() && !e.delete)
            {
                entries.remove(uid);
            }
            return true;
        }
        let options = json!({
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        });
        match self.api.delete(&path, &options).await {
            Ok(()) => {
                log::info!("pod {namespace}/{name}: deleted from the API server");
            }
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => {
                if !e.is_unavailable() {
                    log::warn!("pod {namespace}/{name}: delete: {e}");
                }
                return false;
            }
        }
        let mut entries = self.entries.borrow_mut();
        if entries.get(uid).is_some_and(|e| e.pending.is_none()) {
            entries.remove(uid);
        }
        true
    }

    /// The pod's worker has ended: once its last status is out (and its
    /// delete, if asked for), the entry goes.
    pub fn finished(&self, uid: &str) {
        let mut entries = self.entries.borrow_mut();
        match entries.get_mut(uid) {
            Some(e) if e.pending.is_none() && !e.delete => {
                entries.remove(uid);
            }
            Some(e) => e.finished = true,
            None => {}
        }
    }
}
