//! Mirror pods: each static pod (from the manifest directory) appears in the
//! API server as a read-only copy, annotated `kubernetes.io/config.mirror`
//! with the static pod's UID and owned by the Node, so that kubectl sees
//! it, as upstream's mirror client does. A mirror that no longer matches a
//! static pod is deleted; one deleted by someone else is made again.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use smol::channel::{Receiver, Sender};

use crate::kube::Api;
use crate::kube::watch::Reflector;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const RETRY: Duration = Duration::from_secs(10);

/// The static pod a mirror pod stands for, if it is one.
pub fn mirror_of(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .and_then(Value::as_str)
}

pub struct MirrorManager {
    api: Api,
    pods: Rc<Reflector>,
    node: String,
    node_uid: Rc<RefCell<Option<String>>>,
    /// Static pods by UID, as admitted.
    desired: RefCell<HashMap<String, core::Pod>>,
    wake: Sender<()>,
    woken: Receiver<()>,
}

impl MirrorManager {
    pub fn new(
        api: Api,
        pods: Rc<Reflector>,
        node: &str,
        node_uid: Rc<RefCell<Option<String>>>,
    ) -> Rc<MirrorManager> {
        let (wake, woken) = smol::channel::bounded(1);
        Rc::new(MirrorManager {
            api,
            pods,
            node: node.to_owned(),
            node_uid,
            desired: RefCell::default(),
            wake,
            woken,
        })
    }

    /// The static pods that run now.
    pub fn set_static(&self, pods: HashMap<String, core::Pod>) {
        if *self.desired.borrow() != pods {
            *self.desired.borrow_mut() = pods;
            self.poke();
        }
    }

    /// Something changed in the API (a mirror deleted, the node registered).
    pub fn poke(&self) {
        let _ = self.wake.try_send(());
    }

    pub async fn run(self: Rc<Self>) {
        loop {
            let _ = self.woken.recv().await;
            while !self.reconcile().await {
                super::woken_or_after(&self.woken, RETRY).await;
            }
        }
    }

    /// One pass; false if something must be tried again.
    async fn reconcile(&self) -> bool {
        let Some(node_uid) = self.node_uid.borrow().clone() else {
            return false;
        };
        {
            let snapshot = self.pods.snapshot();
            if !snapshot.synced {
                return false;
            }
        }
        // (uid, namespace, name, mirror of, being deleted)
        let existing: Vec<(String, String, String, Option<String>, bool)> = self
            .pods
            .snapshot()
            .objects
            .iter()
            .map(|(uid, o)| {
                let text = |p: &str| {
                    o.pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                (
                    uid.clone(),
                    text("/metadata/namespace"),
                    text("/metadata/name"),
                    mirror_of(o).map(str::to_owned),
                    o.pointer("/metadata/deletionTimestamp").is_some(),
                )
            })
            .collect();
        let desired = self.desired.borrow().clone();
        let mut ok = true;
        // Mirrors of nothing that runs here, of an older version, or deleted
        // by a user (made again below, as upstream does).
        for (uid, namespace, name, of, deleting) in &existing {
            let Some(of) = of else { continue };
            if !desired.contains_key(of) || *deleting {
                ok &= self.delete(namespace, name, uid).await;
            }
        }
        for (static_uid, pod) in &desired {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let same_name = existing
                .iter()
                .find(|(_, ns, n, _, _)| ns == namespace && n == name);
            match same_name {
                Some((_, _, _, Some(of), false)) if of == static_uid => {}
                // Being replaced: deleted above, made on the next pass.
                Some((_, _, _, Some(_), _)) => ok = false,
                Some((_, _, _, None, _)) => {
                    log::warn!(
                        "static pod {namespace}/{name}: a pod of that name exists in the API server; no mirror pod"
                    );
                }
                None => ok &= self.create(static_uid, pod, &node_uid).await,
            }
        }
        ok
    }

    async fn create(&self, static_uid: &str, pod: &core::Pod, node_uid: &str) -> bool {
        let mut mirror = pod.clone();
        let meta = &mut mirror.metadata;
        meta.uid = None;
        meta.resource_version = None;
        meta.creation_timestamp = None;
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in [
            (MIRROR_ANNOTATION, static_uid.to_owned()),
            ("kubernetes.io/config.hash", static_uid.to_owned()),
            ("kubernetes.io/config.source", "file".to_owned()),
            ("kubernetes.io/config.seen", Timestamp::now().to_string()),
        ] {
            annotations.insert(k.to_owned(), v);
        }
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.node.clone(),
            uid: node_uid.to_owned(),
            controller: Some(true),
            ..Default::default()
        }]);
        if let Some(spec) = &mut mirror.spec {
            spec.node_name = Some(self.node.clone());
        }
        mirror.status = None;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let name = meta.name.clone().unwrap_or_default();
        match self
            .api
            .create::<_, Value>(&format!("/api/v1/namespaces/{namespace}/pods"), &mirror)
            .await
        {
            Ok(_) => {
                log::info!("static pod {namespace}/{name}: mirror pod created");
                true
            }
            Err(e) => {
                if !e.is_unavailable() {
                    log::warn!("static pod {namespace}/{name}: mirror pod: {e}");
                }
                false
            }
        }
    }

    async fn delete(&self, namespace: &str, name: &str, uid: &str) -> bool {
        let options = json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}});
        match self
            .api
            .delete(
                &format!("/api/v1/namespaces/{namespace}/pods/{name}"),
                &options,
            )
            .await
        {
            Ok(()) => true,
            Err(e) if e.is_not_found() || e.is_conflict() => true,
            Err(e) => {
                if !e.is_unavailable() {
                    log::warn!("mirror pod {namespace}/{name}: delete: {e}");
                }
                false
            }
        }
    }
}
