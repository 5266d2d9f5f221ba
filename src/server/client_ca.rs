//! Client certificates checked against `clientCAFile`, read again when
//! the file changes (as upstream's dynamic client CA: a rotated CA bundle
//! is trusted at the next handshake, without a restart). A bundle that
//! does not parse is not taken: the current one stays. The handshake takes
//! any certificate whose key the client holds, as upstream's (Go's
//! RequestClientCert); the chain is checked after it, so that an untrusted
//! one is answered 401, as upstream answers it, not with a failed
//! handshake.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_rustls::rustls::client::danger::HandshakeSignatureValid;
use futures_rustls::rustls::crypto::CryptoProvider;
use futures_rustls::rustls::server::WebPkiClientVerifier;
use futures_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use futures_rustls::rustls::{
    self, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::ServerError;
use super::serving_cert::tls_err;

/// How often a handshake looks at the file's modification time.
const RECHECK: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct ClientCa {
    path: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    verifier: Arc<dyn ClientCertVerifier>,
    modified: Option<SystemTime>,
    checked: Instant,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// A verifier for the bundle at `path`. Clients without a certificate get
/// through the handshake and then a 401 (or a token's user), as upstream
/// answers them.
fn verifier(
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, ServerError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| tls_err(path, e))? {
        let cert = cert.map_err(|e| tls_err(path, e))?;
        roots.add(cert).map_err(|e| tls_err(path, e))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| tls_err(path, e))
}

impl ClientCa {
    pub fn new(path: &Path, provider: Arc<CryptoProvider>) -> Result<Self, ServerError> {
        Ok(ClientCa {
            loaded: Mutex::new(Loaded {
                verifier: verifier(path, &provider)?,
                modified: modified(path),
                checked: Instant::now(),
            }),
            path: path.to_owned(),
            provider,
        })
    }

    /// Whether the client CA signed this chain (leaf first), for client
    /// authentication, and it is valid now.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        let verified = self
            .current()
            .and_then(|v| v.verify_client_cert(leaf, intermediates, UnixTime::now()));
        if let Err(e) = &verified {
            log::debug!("kubelet API: client certificate refused: {e}");
        }
        verified.is_ok()
    }

    /// The verifier of the bundle as it is now, read again if it changed.
    fn current(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        let mut loaded = self
            .loaded
            .lock()
            .map_err(|_| rustls::Error::General("client CA lock poisoned".into()))?;
        if loaded.checked.elapsed() >= RECHECK {
            loaded.checked = Instant::now();
            let now = modified(&self.path);
            if now != loaded.modified {
                match verifier(&self.path, &self.provider) {
                    Ok(verifier) => {
                        log::info!("kubelet API: trusting the new {}", self.path.display());
                        loaded.verifier = verifier;
                        loaded.modified = now;
                    }
                    // Tried again at the next check: a writer may be half
                    // way through it.
                    Err(e) => log::warn!("kubelet API: keeping the current client CA: {e}"),
                }
            }
        }
        Ok(loaded.verifier.clone())
    }
}

impl ClientCertVerifier for ClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: they would have to outlive a reload. Clients with one
    /// certificate (the API server, metrics-server) send it regardless.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    /// Checked after the handshake, by `verify`.
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
