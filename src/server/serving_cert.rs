//! The kubelet API's serving certificate: from `tlsCertFile` and
//! `tlsPrivateKeyFile`, taken up again when they change (as upstream's
//! dynamic serving certificate: a certificate renewed by cert-manager or a
//! script serves the next handshake, without a restart), else a
//! self-signed one for the node's names, made once and kept under the
//! state dir (as upstream keeps its own in --cert-dir).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_rustls::rustls::crypto::CryptoProvider;
use futures_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use futures_rustls::rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::Deps;
use super::ServerError;

/// The cert dir's files of the serving pairs the cluster issued.
pub const SERVER_PREFIX: &str = "kubelet-server";

/// How often a handshake looks at the files' modification times: two stat
/// calls, at most this often.
const RECHECK: Duration = Duration::from_secs(10);

/// The files' modification times, to see a change.
type Stamp = (Option<SystemTime>, Option<SystemTime>);

#[derive(Debug)]
pub struct ServingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    /// Self-signed ones never change: not looked at again.
    reloads: bool,
    loaded: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (modified(cert), modified(key))
}

pub(super) fn tls_err(path: &Path, message: impl ToString) -> ServerError {
    ServerError::Tls {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// The chain and key of the files, checked to belong together (a renewal
/// caught between its two writes is not taken).
fn read(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, ServerError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls_err(cert, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(cert, e))?;
    if chain.is_empty() {
        return Err(tls_err(cert, "no certificate"));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| tls_err(key, e))?;
    CertifiedKey::from_der(chain, private, provider).map_err(|e| tls_err(key, e))
}

impl ServingCert {
    pub fn for_node(ctx: &Deps) -> Result<Self, ServerError> {
        let provider = Arc::new(futures_rustls::rustls::crypto::ring::default_provider());
        let config = &ctx.config;
        // With serverTLSBootstrap, the cluster's certificate wins over the
        // files, as upstream's; until there is one, the self-signed pair.
        let issued = config.server_tls_bootstrap.then(|| {
            let current = crate::certificates::store::Store::new(&config.cert_dir(), SERVER_PREFIX)
                .current_path();
            let key = read(&current, &current, &provider);
            (current, key)
        });
        let (cert_path, key_path, reloads, key) = match issued {
            Some((current, Ok(key))) => (current.clone(), current, false, key),
            _ => match (&config.tls_cert_file, &config.tls_private_key_file) {
                (Some(c), Some(k)) if !config.server_tls_bootstrap => {
                    let key = read(c, k, &provider)?;
                    (c.clone(), k.clone(), true, key)
                }
                _ => {
                    let (cert, key) = self_signed(ctx)?;
                    let pair = read(&cert, &key, &provider)?;
                    if config.server_tls_bootstrap {
                        log::warn!(
                            "kubelet API: serving the self-signed certificate {} until the cluster issues one",
                            cert.display()
                        );
                    }
                    (cert, key, false, pair)
                }
            },
        };
        Ok(ServingCert {
            loaded: Mutex::new(Loaded {
                key: Arc::new(key),
                stamp: stamp(&cert_path, &key_path),
                checked: Instant::now(),
            }),
            cert_path,
            key_path,
            provider,
            reloads,
        })
    }

    /// Serves `chain` with `key` from the next handshake on: a certificate
    /// the cluster issued.
    pub fn replace(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), futures_rustls::rustls::Error> {
        let certified = CertifiedKey::from_der(chain, key, &self.provider)?;
        if let Ok(mut loaded) = self.loaded.lock() {
            loaded.key = Arc::new(certified);
        }
        Ok(())
    }

    /// The certificate to serve, read again first if the files changed.
    fn current(&self) -> Option<Arc<CertifiedKey>> {
        let mut loaded = self.loaded.lock().ok()?;
        if self.reloads && loaded.checked.elapsed() >= RECHECK {
            loaded.checked = Instant::now();
            let now = stamp(&self.cert_path, &self.key_path);
            if now != loaded.stamp {
                match read(&self.cert_path, &self.key_path, &self.provider) {
                    Ok(key) => {
                        log::info!(
                            "kubelet API: serving the new certificate {}",
                            self.cert_path.display()
                        );
                        loaded.key = Arc::new(key);
                        loaded.stamp = now;
                    }
                    // Tried again at the next check: the other file may be
                    // on its way.
                    Err(e) => log::warn!("kubelet API: keeping the current certificate: {e}"),
                }
            }
        }
        Some(loaded.key.clone())
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// The self-signed pair under `<stateDir>/pki`, made the first time.
fn self_signed(ctx: &Deps) -> Result<(PathBuf, PathBuf), ServerError> {
    let dir = ctx.config.cert_dir();
    let cert = dir.join("kubelet.crt");
    let key = dir.join("kubelet.key");
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let mut names = vec![ctx.config.node_name.clone(), "localhost".to_owned()];
    if let Some(ip) = ctx.host_ip {
        names.push(ip.to_string());
    }
    let failed = |e: &dyn std::fmt::Display| ServerError::SelfSigned(e.to_string());
    let made = rcgen::generate_simple_self_signed(names).map_err(|e| failed(&e))?;
    crate::state::create_dir_all(&dir, 0o700).map_err(|e| failed(&e))?;
    for (path, text, mode) in [
        (&key, made.signing_key.serialize_pem(), 0o600),
        (&cert, made.cert.pem(), 0o644),
    ] {
        crate::state::write_atomic(
            path,
            text.as_bytes(),
            mode,
            crate::state::Durability::PowerLoss,
        )
        .map_err(|e| failed(&e))?;
    }
    log::info!("made a self-signed serving certificate {}", cert.display());
    Ok((cert, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    #[test]
    fn changed_files_are_served_once_they_match_again() {
        let dir = crate::state::TestDir::new("serving-cert");
        let provider = Arc::new(futures_rustls::rustls::crypto::ring::default_provider());
        let (cert, key) = write_pair(dir.0.as_path(), "first.example");
        let serving = ServingCert {
            loaded: Mutex::new(Loaded {
                key: Arc::new(read(&cert, &key, &provider).unwrap()),
                stamp: stamp(&cert, &key),
                checked: Instant::now(),
            }),
            cert_path: cert.clone(),
            key_path: key.clone(),
            provider: provider.clone(),
            reloads: true,
        };
        let first = serving.current().unwrap().cert[0].clone();
        // A renewal caught half way: the new certificate, the old key.
        let old_key = std::fs::read(&key).unwrap();
        write_pair(dir.0.as_path(), "second.example");
        let new_key = std::fs::read(&key).unwrap();
        std::fs::write(&key, &old_key).unwrap();
        let backdate = |l: &mut Loaded| l.checked -= RECHECK;
        backdate(&mut serving.loaded.lock().unwrap());
        assert_eq!(serving.current().unwrap().cert[0], first);
        // Both written: the next check takes them.
        std::fs::write(&key, &new_key).unwrap();
        let future = SystemTime::now() + Duration::from_secs(5);
        let file = std::fs::File::options().write(true).open(&key).unwrap();
        file.set_modified(future).unwrap();
        backdate(&mut serving.loaded.lock().unwrap());
        let second = serving.current().unwrap().cert[0].clone();
        assert_ne!(second, first);
        let on_disk = CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(second, on_disk);
    }
}
