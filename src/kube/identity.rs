//! The client certificate the agent shows the API server, asked for by
//! rustls at each handshake: replacing it (a rotation, a bootstrap) makes
//! new connections use the new one while open watches go on. The TLS
//! sessions kept for resumption go with the certificate they were made
//! with: a server resuming a session takes the client for whoever its
//! first handshake showed, which after a rotation is the old certificate.

use std::sync::{Arc, RwLock};

use futures_rustls::rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, ResolvesClientCert, Tls12ClientSessionValue,
    Tls13ClientSessionValue,
};
use futures_rustls::rustls::crypto::CryptoProvider;
use futures_rustls::rustls::sign::CertifiedKey;
use futures_rustls::rustls::{self, NamedGroup, SignatureScheme};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Sessions kept per identity: one API server, a few connections.
const SESSIONS: usize = 8;

#[derive(Debug)]
pub struct ClientIdentity {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    sessions: RwLock<Arc<ClientSessionMemoryCache>>,
}

impl Default for ClientIdentity {
    fn default() -> Self {
        ClientIdentity {
            current: RwLock::new(None),
            sessions: RwLock::new(Arc::new(ClientSessionMemoryCache::new(SESSIONS))),
        }
    }
}

impl ClientIdentity {
    /// Shows `chain` with `key` from the next handshake on, which is a full
    /// one: the sessions of the previous certificate are forgotten.
    pub fn set(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        provider: &CryptoProvider,
    ) -> Result<(), rustls::Error> {
        let certified = Arc::new(CertifiedKey::from_der(chain, key, provider)?);
        if let Ok(mut current) = self.current.write() {
            *current = Some(certified);
        }
        if let Ok(mut sessions) = self.sessions.write() {
            *sessions = Arc::new(ClientSessionMemoryCache::new(SESSIONS));
        }
        Ok(())
    }

    fn sessions(&self) -> Option<Arc<ClientSessionMemoryCache>> {
        self.sessions.read().ok().map(|s| s.clone())
    }
}

impl ResolvesClientCert for ClientIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok()?.clone()
    }

    fn has_certs(&self) -> bool {
        self.current.read().is_ok_and(|c| c.is_some())
    }
}

impl ClientSessionStore for ClientIdentity {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        if let Some(s) = self.sessions() {
            s.set_kx_hint(server_name, group);
        }
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.sessions()?.kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        if let Some(s) = self.sessions() {
            s.set_tls12_session(server_name, value);
        }
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.sessions()?.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        if let Some(s) = self.sessions() {
            s.remove_tls12_session(server_name);
        }
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        if let Some(s) = self.sessions() {
            s.insert_tls13_ticket(server_name, value);
        }
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        self.sessions()?.take_tls13_ticket(server_name)
    }
}
