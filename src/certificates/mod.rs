//! The node's client certificate, as upstream's kubelet manages it: TLS
//! bootstrap (a key made here, a CertificateSigningRequest sent with the
//! bootstrap token, the issued certificate and a kubeconfig written), and
//! rotation at 70–90 % of the certificate's life. A certificate not valid
//! yet by this node's clock (a board without a real-time clock before NTP
//! answers) holds the API requests back and says so; it is never deleted,
//! and the pods keep running from their checkpoints meanwhile.

pub mod request;
pub mod serving;
pub mod store;
pub mod x509;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;

use crate::config::Config;
use crate::kube::identity::ClientIdentity;
use crate::kube::{Api, Kubeconfig, RetryBackoff};
use request::Wanted;
use store::{Pair, Store};

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Request(#[from] request::RequestError),
    #[error(transparent)]
    Kubeconfig(#[from] crate::kube::kubeconfig::KubeconfigError),
    #[error("{path}: {message}")]
    Write { path: PathBuf, message: String },
    #[error("the client certificate: {0}")]
    Tls(#[from] futures_rustls::rustls::Error),
    #[error("making a key: {0}")]
    Key(#[from] rcgen::Error),
    #[error("{why} and there is no bootstrap kubeconfig to ask for another")]
    NoBootstrap { why: String },
}

/// The longest sleep between looks at the certificate: the wall clock may
/// jump (NTP setting a board's clock), which a timer does not see.
const LONGEST_SLEEP: Duration = Duration::from_secs(3600);

/// Seconds since the epoch by this node's clock.
fn unix_now() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn show_time(unix_seconds: i64) -> String {
    jiff::Timestamp::from_second(unix_seconds)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix_seconds.to_string())
}

/// Where a certificate stands at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Missing,
    NotYetValid { not_before: i64 },
    Valid,
    Expired { not_after: i64 },
}

fn standing(leaf: Option<&x509::Certificate>, now: i64) -> Standing {
    match leaf {
        None => Standing::Missing,
        Some(c) if now < c.not_before => Standing::NotYetValid {
            not_before: c.not_before,
        },
        Some(c) if now >= c.not_after => Standing::Expired {
            not_after: c.not_after,
        },
        Some(_) => Standing::Valid,
    }
}

/// Upstream's jittered deadline: somewhere in 70–90 % of the certificate's
/// life (`fraction` in [0, 1) picks where), so that a fleet whose
/// certificates were issued together does not renew together.
fn rotation_deadline(leaf: &x509::Certificate, fraction: f64) -> i64 {
    let life = (leaf.not_after - leaf.not_before).max(0) as f64;
    leaf.not_before + (life * (0.7 + 0.2 * fraction.clamp(0.0, 1.0))).round() as i64
}

/// After an attempt at a certificate: no wait if it worked (the backoff
/// starts over), else the backoff's next delay, logged with what failed.
fn after_attempt(
    result: Result<(), CertificateError>,
    retry: &mut RetryBackoff,
    what: &str,
) -> Option<Duration> {
    match result {
        Ok(()) => {
            retry.reset();
            None
        }
        Err(e) => {
            let wait = retry.next_delay();
            log::warn!("{what}: {e}; trying again in {}s", wait.as_secs());
            Some(wait)
        }
    }
}

/// The agent's credentials towards the API server, decided at its start.
pub struct Credentials {
    /// The node's kubeconfig, or the bootstrap one's cluster without its
    /// user until the bootstrap has given the node a certificate.
    pub kubeconfig: Kubeconfig,
    /// Bootstrap and rotation, when the node does them.
    pub manager: Option<ClientCertificates>,
}

/// Cluster mode's credentials, or `None` in standalone mode.
pub fn prepare(config: &Config) -> Result<Option<Credentials>, CertificateError> {
    let Some(path) = &config.kubeconfig else {
        return Ok(None);
    };
    let bootstrap = config.bootstrap_kubeconfig.clone();
    let kubeconfig = match (Kubeconfig::load(path), &bootstrap) {
        (Ok(kubeconfig), _) => kubeconfig,
        (Err(e), Some(bootstrap)) => {
            log::info!("{e}: the node bootstraps its credentials");
            Kubeconfig::load(bootstrap)?.without_user()?
        }
        (Err(e), None) => return Err(e.into()),
    };
    let store = Store::new(&config.cert_dir(), "kubelet-client");
    let mut leaf = kubeconfig.client_certificate.clone();
    let manages = bootstrap.is_some() || (config.rotate_certificates && leaf.is_some());
    if !manages {
        return Ok(Some(Credentials {
            kubeconfig,
            manager: None,
        }));
    }
    // The store's pair in use comes first, as in upstream's file store: a
    // rotation since the kubeconfig was written is in it.
    match store.current() {
        Ok(Some(pair)) => {
            leaf = Some(pair.leaf);
            kubeconfig.identity.set(
                pair.chain,
                pair.key,
                &futures_rustls::rustls::crypto::ring::default_provider(),
            )?;
        }
        Ok(None) => {}
        Err(e) => log::warn!("{e}: not used"),
    }
    let manager = ClientCertificates {
        identity: kubeconfig.identity.clone(),
        store,
        node_name: config.node_name.clone(),
        rotate: config.rotate_certificates,
        bootstrap,
        kubeconfig_path: path.clone(),
        server: kubeconfig.server.clone(),
        ca_pem: kubeconfig.ca_pem.clone(),
        leaf,
        rotate_at: None,
    };
    Ok(Some(Credentials {
        kubeconfig,
        manager: Some(manager),
    }))
}

/// Keeps the node's client certificate valid: bootstrap when there is none
/// (or it expired), rotation when it nears its end.
pub struct ClientCertificates {
    identity: Arc<ClientIdentity>,
    store: Store,
    node_name: String,
    rotate: bool,
    bootstrap: Option<PathBuf>,
    kubeconfig_path: PathBuf,
    server: String,
    ca_pem: Vec<u8>,
    leaf: Option<x509::Certificate>,
    /// When the current certificate is renewed, picked once per certificate.
    rotate_at: Option<i64>,
}

impl ClientCertificates {
    /// Whether requests can go out with what the node has now.
    pub fn usable_now(&self) -> bool {
        standing(self.leaf.as_ref(), unix_now()) == Standing::Valid
    }

    /// Runs for the agent's life, holding `api`'s requests back while there
    /// is no certificate to show.
    pub async fn run(mut self, api: Api) {
        let mut retry = RetryBackoff::new(Duration::from_secs(2), Duration::from_secs(300));
        // A clock message once per certificate, not at every look.
        let mut told_clock = None;
        loop {
            let now = unix_now();
            let wait = match standing(self.leaf.as_ref(), now) {
                Standing::Valid => {
                    if api.is_held() {
                        log::info!("the client certificate is valid now: API requests go out");
                        api.release();
                    }
                    told_clock = None;
                    match self.renewal(now) {
                        Some(wait) => wait,
                        None => {
                            let rotated = self.rotate_client(&api).await;
                            match after_attempt(
                                rotated,
                                &mut retry,
                                "rotating the client certificate",
                            ) {
                                Some(wait) => wait,
                                None => continue,
                            }
                        }
                    }
                }
                Standing::NotYetValid { not_before } => {
                    api.hold().await;
                    let wait = retry
                        .next_delay()
                        .min(Duration::from_secs((not_before - now).max(1) as u64));
                    let message = format!(
                        "the client certificate is valid from {} on, and this node's clock reads {}: if the clock is behind (a board without a real-time clock, before NTP has set it), API requests wait until it is right; the pods keep running. Looking again in {}s",
                        show_time(not_before),
                        show_time(now),
                        wait.as_secs()
                    );
                    if told_clock != Some(not_before) {
                        log::warn!("{message}");
                        told_clock = Some(not_before);
                    } else {
                        log::debug!("{message}");
                    }
                    wait
                }
                lost @ (Standing::Missing | Standing::Expired { .. }) => {
                    api.hold().await;
                    let why = match lost {
                        Standing::Expired { not_after } => {
                            format!("the client certificate expired at {}", show_time(not_after))
                        }
                        _ => "the node has no client certificate".to_owned(),
                    };
                    let result = match self.bootstrap.clone() {
                        Some(bootstrap) => self.bootstrap_client(&bootstrap, &why, &api).await,
                        None => Err(CertificateError::NoBootstrap { why }),
                    };
                    match after_attempt(result, &mut retry, "TLS bootstrap") {
                        Some(wait) => wait,
                        None => continue,
                    }
                }
            };
            smol::Timer::after(wait.min(LONGEST_SLEEP)).await;
        }
    }

    /// How long until the certificate is renewed, `None` if it is due. A
    /// node that does not rotate looks again at its expiry.
    fn renewal(&mut self, now: i64) -> Option<Duration> {
        let leaf = self.leaf.as_ref()?;
        let due = if self.rotate {
            *self
                .rotate_at
                .get_or_insert_with(|| rotation_deadline(leaf, crate::state::random_fraction()))
        } else {
            leaf.not_after
        };
        if self.rotate && now >= due {
            return None;
        }
        Some(Duration::from_secs((due - now).max(1) as u64))
    }

    async fn bootstrap_client(
        &mut self,
        bootstrap: &Path,
        why: &str,
        api: &Api,
    ) -> Result<(), CertificateError> {
        let path = bootstrap.to_owned();
        let credentials = crate::helpers::unblock(move || Kubeconfig::load(&path)).await?;
        let bootstrap_api = Api::new(&credentials, &self.node_name);
        log::info!(
            "{why}: asking {} for one with the bootstrap credentials of {}",
            credentials.server,
            bootstrap.display()
        );
        let store = self.store.clone();
        let key = crate::helpers::unblock(move || store.pending_key()).await?;
        let wanted = Wanted::client(&self.node_name);
        let name = wanted.digested_name(&key);
        let issued = request::obtain(&bootstrap_api, &wanted, &key, Some(&name)).await?;
        let kubeconfig = node_kubeconfig(&self.server, &self.ca_pem, &self.store.current_path());
        let written = Some((self.kubeconfig_path.clone(), kubeconfig));
        let pair = keep(self.store.clone(), issued, key.serialize_pem(), written).await?;
        log::info!(
            "TLS bootstrap done: {} (valid until {}), {} written",
            pair.path.display(),
            show_time(pair.leaf.not_after),
            self.kubeconfig_path.display()
        );
        self.install(pair, api)
    }

    async fn rotate_client(&mut self, api: &Api) -> Result<(), CertificateError> {
        let key = store::new_key()?;
        let wanted = Wanted::client(&self.node_name);
        let issued = request::obtain(api, &wanted, &key, None).await?;
        let pair = keep(self.store.clone(), issued, key.serialize_pem(), None).await?;
        log::info!(
            "client certificate rotated: {} (valid until {})",
            pair.path.display(),
            show_time(pair.leaf.not_after)
        );
        self.install(pair, api)
    }

    /// Shows the new certificate from the next connection on.
    fn install(&mut self, pair: Pair, api: &Api) -> Result<(), CertificateError> {
        self.identity.set(
            pair.chain,
            pair.key,
            &futures_rustls::rustls::crypto::ring::default_provider(),
        )?;
        self.leaf = Some(pair.leaf);
        self.rotate_at = None;
        api.reconnect();
        Ok(())
    }
}

/// Writes an issued pair (and after a bootstrap the node's kubeconfig)
/// before it is used: a crash after this finds it at the next start.
async fn keep(
    store: Store,
    cert_pem: String,
    key_pem: String,
    kubeconfig: Option<(PathBuf, String)>,
) -> Result<Pair, CertificateError> {
    crate::helpers::unblock(move || {
        let path = store.update(&cert_pem, &key_pem, unix_now())?;
        if let Some((kubeconfig_path, text)) = kubeconfig {
            crate::state::write_atomic(
                &kubeconfig_path,
                text.as_bytes(),
                0o600,
                crate::state::Durability::PowerLoss,
            )
            .map_err(|e| CertificateError::Write {
                path: kubeconfig_path.clone(),
                message: e.to_string(),
            })?;
            store.forget_pending_key();
        }
        Ok(store::pair_from_pem(
            cert_pem.as_bytes(),
            key_pem.as_bytes(),
            &path,
        )?)
    })
    .await
}

/// The kubeconfig upstream's bootstrap writes: the bootstrap's cluster, and
/// the store's current pair as both certificate and key, so that a rotation
/// needs no rewrite of it.
fn node_kubeconfig(server: &str, ca_pem: &[u8], current: &Path) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let current = current.display();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\nusers:\n- name: default-auth\n  user:\n    client-certificate: {current}\n    client-key: {current}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(not_before: i64, not_after: i64) -> x509::Certificate {
        x509::Certificate {
            not_before,
            not_after,
            common_name: None,
            organizations: Vec::new(),
            public_key: Vec::new(),
        }
    }

    #[test]
    fn a_certificate_stands_by_the_clock() {
        let c = leaf(1_000, 2_000);
        assert_eq!(standing(None, 0), Standing::Missing);
        assert_eq!(
            standing(Some(&c), 999),
            Standing::NotYetValid { not_before: 1_000 }
        );
        assert_eq!(standing(Some(&c), 1_000), Standing::Valid);
        assert_eq!(standing(Some(&c), 1_999), Standing::Valid);
        assert_eq!(
            standing(Some(&c), 2_000),
            Standing::Expired { not_after: 2_000 }
        );
        // A board that booted in 1970: not yet valid, never expired.
        assert_eq!(
            standing(Some(&leaf(1_765_000_000, 1_796_000_000)), 5),
            Standing::NotYetValid {
                not_before: 1_765_000_000
            }
        );
    }

    #[test]
    fn renewal_falls_in_seventy_to_ninety_percent_of_the_life() {
        let c = leaf(1_000, 2_000);
        assert_eq!(rotation_deadline(&c, 0.0), 1_700);
        assert_eq!(rotation_deadline(&c, 0.5), 1_800);
        assert_eq!(rotation_deadline(&c, 0.25), 1_750);
        assert_eq!(rotation_deadline(&c, 7.0), 1_900);
        // Backwards validity: renewed at once rather than never.
        assert_eq!(rotation_deadline(&leaf(2_000, 1_000), 0.5), 2_000);
    }

    #[test]
    fn the_written_kubeconfig_loads_with_the_stores_pair() {
        let dir = crate::state::TestDir::new("node-kubeconfig");
        let store = Store::new(&dir.0.join("pki"), "kubelet-client");
        let key = store::new_key().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:edge-1");
        let cert = params.self_signed(&key).unwrap().pem();
        store.update(&cert, &key.serialize_pem(), 0).unwrap();
        let path = dir.0.join("kubeconfig");
        std::fs::write(
            &path,
            node_kubeconfig(
                "https://127.0.0.1:6443",
                cert.as_bytes(),
                &store.current_path(),
            ),
        )
        .unwrap();
        let loaded = Kubeconfig::load(&path).unwrap();
        assert_eq!(loaded.server, "https://127.0.0.1:6443");
        assert_eq!(
            loaded.client_certificate.unwrap().common_name.as_deref(),
            Some("system:node:edge-1")
        );
        assert_eq!(loaded.ca_pem, cert.as_bytes());
    }
}
