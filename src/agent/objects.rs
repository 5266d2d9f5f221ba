//! ConfigMaps, Secrets and service account tokens for pods, from the API
//! server. Each referenced object is watched on its own (a field selector
//! on its name), as upstream's default change-detection strategy does, so
//! that a refresh costs no request; the first read before the watch has
//! listed is a GET. Tokens come from the TokenRequest API, bound to the pod.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use jiff::Timestamp;
use serde_json::{Value, json};
use smol::channel::Sender;

use crate::kube::watch::Reflector;
use crate::kube::{Api, KubeError};
use crate::pod::Pod;
use crate::pod::objects::{ObjectData, ServiceAccountToken, ServiceLink, TokenRequestSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmaps",
            Kind::Secret => "secrets",
        }
    }

    fn data(self, object: &Value) -> ObjectData {
        match self {
            Kind::ConfigMap => ObjectData::from_config_map(object),
            Kind::Secret => ObjectData::from_secret(object),
        }
    }
}

type Key = (Kind, String, String);

struct Watched {
    reflector: Rc<Reflector>,
    _tasks: [smol::Task<()>; 2],
    users: Rc<RefCell<HashSet<String>>>,
}

/// Pod UID → where to tell its worker that an object it reads changed.
type Subscribers = Rc<RefCell<HashMap<String, Sender<()>>>>;

pub struct ObjectSource {
    api: Api,
    watched: RefCell<HashMap<Key, Watched>>,
    subscribers: Subscribers,
}

impl ObjectSource {
    pub fn new(api: Api) -> ObjectSource {
        ObjectSource {
            api,
            watched: RefCell::default(),
            subscribers: Rc::default(),
        }
    }

    /// Pod `user` wants to hear when an object it reads changes, to update
    /// its volumes at once rather than at the next periodic refresh.
    pub fn subscribe(&self, user: &str, changed: Sender<()>) {
        self.subscribers
            .borrow_mut()
            .insert(user.to_owned(), changed);
    }

    /// The object's data, `None` if it does not exist. Pod `user` holds a
    /// watch on it until [`release`](Self::release).
    pub async fn get(
        &self,
        user: &str,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ObjectData>, KubeError> {
        let key = (kind, namespace.to_owned(), name.to_owned());
        let reflector = {
            let mut watched = self.watched.borrow_mut();
            let entry = watched.entry(key).or_insert_with(|| {
                let path = format!("/api/v1/namespaces/{namespace}/{}", kind.resource());
                let (reflector, changes) =
                    Reflector::new(self.api.clone(), &path, &format!("metadata.name={name}"));
                let users: Rc<RefCell<HashSet<String>>> = Rc::default();
                let (forward_users, subscribers) = (users.clone(), self.subscribers.clone());
                let forward = crate::rt::spawn(async move {
                    while changes.recv().await.is_ok() {
                        for user in forward_users.borrow().iter() {
                            if let Some(tx) = subscribers.borrow().get(user) {
                                let _ = tx.try_send(());
                            }
                        }
                    }
                });
                Watched {
                    _tasks: [crate::rt::spawn(reflector.clone().run()), forward],
                    reflector,
                    users,
                }
            });
            entry.users.borrow_mut().insert(user.to_owned());
            entry.reflector.clone()
        };
        {
            let snapshot = reflector.snapshot();
            if snapshot.synced {
                return Ok(snapshot.objects.values().next().map(|o| kind.data(o)));
            }
        }
        let path = format!("/api/v1/namespaces/{namespace}/{}/{name}", kind.resource());
        match self.api.get::<Value>(&path).await {
            Ok(object) => Ok(Some(kind.data(&object))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The Services whose variables a container of a pod in `namespace`
    /// gets: `kubernetes` in `default`, and with `all_in_namespace` every
    /// Service of the namespace, as upstream's kubelet picks them. Read
    /// when a container starts, not watched: upstream watches every Service
    /// of the cluster, which a board's uplink should not carry, and a
    /// container's variables are fixed when it starts. Not cached either:
    /// a Service applied together with its clients must be seen.
    pub async fn service_links(
        &self,
        namespace: &str,
        all_in_namespace: bool,
    ) -> Result<Vec<ServiceLink>, KubeError> {
        let mut links: Vec<ServiceLink> = Vec::new();
        if all_in_namespace {
            let list: Value = self
                .api
                .get(&format!("/api/v1/namespaces/{namespace}/services"))
                .await?;
            links.extend(
                list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(ServiceLink::from_service),
            );
        }
        if namespace != "default" || !all_in_namespace {
            match self
                .api
                .get::<Value>("/api/v1/namespaces/default/services/kubernetes")
                .await
            {
                Ok(master) => links.extend(ServiceLink::from_service(&master)),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        // Upstream: the namespace's own service wins over the master of
        // the same name.
        let mut seen = HashSet::new();
        links.retain(|l| seen.insert(l.name.clone()));
        Ok(links)
    }

    /// The handler of RuntimeClass `name`, `None` if there is no such
    /// class. A GET when a sandbox is made, not upstream's watch of every
    /// class: a board's uplink carries nothing for pods that name none.
    pub async fn runtime_handler(&self, name: &str) -> Result<Option<String>, KubeError> {
        let path = format!("/apis/node.k8s.io/v1/runtimeclasses/{name}");
        match self.api.get::<Value>(&path).await {
            Ok(class) => Ok(Some(class["handler"].as_str().unwrap_or("").to_owned())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Pod `user` no longer needs its objects: watches nobody uses stop.
    pub fn release(&self, user: &str) {
        self.subscribers.borrow_mut().remove(user);
        self.watched.borrow_mut().retain(|_, w| {
            w.users.borrow_mut().remove(user);
            !w.users.borrow().is_empty()
        });
    }

    /// A token for the pod's service account, bound to the pod.
    pub async fn token(
        &self,
        pod: &Pod,
        spec: &TokenRequestSpec,
    ) -> Result<ServiceAccountToken, KubeError> {
        let account = pod
            .manifest
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| "default".into());
        let path = format!(
            "/api/v1/namespaces/{}/serviceaccounts/{account}/token",
            pod.namespace
        );
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": spec.audience.iter().collect::<Vec<_>>(),
                "expirationSeconds": spec.expiration_seconds,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid},
            }
        });
        let issued = Timestamp::now();
        let response: Value = self.api.create(&path, &request).await?;
        let token = response
            .pointer("/status/token")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let expires = response
            .pointer("/status/expirationTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .unwrap_or_else(|| issued + jiff::SignedDuration::from_secs(spec.expiration_seconds));
        if token.is_empty() {
            return Err(KubeError::Decode {
                path,
                message: "TokenRequest returned no token".into(),
            });
        }
        Ok(ServiceAccountToken {
            token,
            issued,
            expires,
        })
    }
}
