//! The kubelet API's serving certificate from the cluster
//! (`serverTLSBootstrap`): signer `kubernetes.io/kubelet-serving`, the
//! node's names and addresses as its SANs, renewed at 70–90 % of its life
//! as the client certificate is. Until one is issued (an approver or an
//! administrator must approve serving requests) the node serves its
//! self-signed certificate, and says so.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::request::{self, Wanted};
use super::store::{self, Store};
use super::{CertificateError, LONGEST_SLEEP, Standing, show_time, standing, unix_now, x509};
use crate::kube::{Api, RetryBackoff};
use crate::server::serving_cert::{SERVER_PREFIX, ServingCert};

/// Tells the cluster (an event on the node) what the node serves with.
pub type Notify = Box<dyn Fn(&str)>;

pub struct ServingCertificates {
    store: Store,
    node_name: String,
    dns_names: Vec<String>,
    ip_addresses: Vec<IpAddr>,
    serving: Arc<ServingCert>,
    leaf: Option<x509::Certificate>,
    rotate_at: Option<i64>,
    notify: Notify,
}

impl ServingCertificates {
    /// `serving` is what the kubelet API serves; the store's pair, if
    /// `ServingCert` took one, is read again here to know its validity.
    pub fn new(
        cert_dir: &std::path::Path,
        node_name: &str,
        host_ip: Option<IpAddr>,
        serving: Arc<ServingCert>,
        notify: Notify,
    ) -> ServingCertificates {
        let store = Store::new(cert_dir, SERVER_PREFIX);
        let leaf = match store.current() {
            Ok(pair) => pair.map(|p| p.leaf),
            Err(e) => {
                log::warn!("{e}: not served");
                None
            }
        };
        ServingCertificates {
            store,
            node_name: node_name.to_owned(),
            // The node's addresses as its status gives them: its Hostname
            // and its InternalIP.
            dns_names: vec![node_name.to_owned()],
            ip_addresses: host_ip.into_iter().collect(),
            serving,
            leaf,
            rotate_at: None,
            notify,
        }
    }

    pub async fn run(mut self, api: Api) {
        let mut retry = RetryBackoff::new(Duration::from_secs(2), Duration::from_secs(300));
        let mut told = false;
        loop {
            let now = unix_now();
            let due = match standing(self.leaf.as_ref(), now) {
                // One not valid yet by this clock is served all the same:
                // the API server judges it by its own.
                Standing::Valid | Standing::NotYetValid { .. } => {
                    let leaf = self.leaf.as_ref();
                    let deadline = *self.rotate_at.get_or_insert_with(|| {
                        leaf.map_or(now, |l| {
                            super::rotation_deadline(l, crate::state::random_fraction())
                        })
                    });
                    (now < deadline).then(|| Duration::from_secs((deadline - now) as u64))
                }
                Standing::Missing | Standing::Expired { .. } => {
                    if !told {
                        let message = "the kubelet API serves a self-signed certificate until the cluster issues one (a serving request waits for approval)";
                        log::warn!("{message}");
                        (self.notify)(message);
                        told = true;
                    }
                    None
                }
            };
            let wait = match due {
                Some(wait) => wait,
                None => {
                    let renewed = self.renew(&api).await;
                    match super::after_attempt(renewed, &mut retry, "the serving certificate") {
                        Some(wait) => wait,
                        None => continue,
                    }
                }
            };
            smol::Timer::after(wait.min(LONGEST_SLEEP)).await;
        }
    }

    async fn renew(&mut self, api: &Api) -> Result<(), CertificateError> {
        let key = store::new_key()?;
        let wanted = Wanted::serving(
            &self.node_name,
            self.dns_names.clone(),
            self.ip_addresses.clone(),
        );
        let issued = request::obtain(api, &wanted, &key, None).await?;
        let pair = super::keep(self.store.clone(), issued, key.serialize_pem(), None).await?;
        self.serving.replace(pair.chain, pair.key)?;
        let message = format!(
            "the kubelet API serves the certificate the cluster issued, {} (valid until {})",
            pair.path.display(),
            show_time(pair.leaf.not_after)
        );
        log::info!("{message}");
        (self.notify)(&message);
        self.leaf = Some(pair.leaf);
        self.rotate_at = None;
        Ok(())
    }
}
