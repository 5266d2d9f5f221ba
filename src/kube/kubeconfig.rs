//! Loading a kubeconfig as client-go does for the fields a node agent uses:
//! the current context's cluster (server, CA file or data, TLS server name)
//! and user (client certificate and key as files or data, token, token file).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use futures_rustls::rustls::{self, ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use super::identity::ClientIdentity;
use crate::certificates::x509;

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Default, Deserialize)]
struct Document {
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<ContextDoc>>,
    #[serde(rename = "current-context", default)]
    current_context: String,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
    tls_server_name: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
struct ContextDoc {
    cluster: String,
    #[serde(default)]
    user: String,
}

/// How the agent authenticates: besides a client certificate (in the TLS
/// configuration), a bearer token, fixed or re-read from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    Fixed(String),
    File(PathBuf),
}

/// A resolved kubeconfig.
pub struct Kubeconfig {
    /// The API server's base URL, without a trailing slash.
    pub server: String,
    pub tls: Arc<ClientConfig>,
    pub token: Option<Token>,
    /// The client certificate shown, replaceable while connections live.
    pub identity: Arc<ClientIdentity>,
    /// The cluster's CA bundle as given, for a kubeconfig written from
    /// this one.
    pub ca_pem: Vec<u8>,
    roots: Arc<RootCertStore>,
    /// The client certificate's leaf, if it has one the agent can read.
    pub client_certificate: Option<x509::Certificate>,
}

impl std::fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print credentials.
        f.debug_struct("Kubeconfig")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Kubeconfig {
    pub fn load(path: &Path) -> Result<Kubeconfig, KubeconfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| KubeconfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, path, base)
    }

    /// `base` is the directory relative file names are resolved against: the
    /// kubeconfig's own, as client-go does.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Kubeconfig, KubeconfigError> {
        let invalid = |message: String| KubeconfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let doc: Document = serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let context = match doc.contexts.iter().find(|c| c.name == doc.current_context) {
            Some(c) => &c.value,
            None if doc.current_context.is_empty() && doc.contexts.len() == 1 => {
                &doc.contexts[0].value
            }
            None => {
                return Err(invalid(format!(
                    "current-context {:?} is not among the contexts",
                    doc.current_context
                )));
            }
        };
        let cluster = doc
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .map(|c| &c.value)
            .ok_or_else(|| invalid(format!("cluster {:?} is not defined", context.cluster)))?;
        let default_user = User::default();
        let user = doc
            .users
            .iter()
            .find(|u| u.name == context.user)
            .map(|u| &u.value)
            .unwrap_or(&default_user);
        if cluster.insecure_skip_tls_verify {
            return Err(invalid(
                "insecure-skip-tls-verify: nanolet always verifies the API server".into(),
            ));
        }
        let server = cluster.server.trim_end_matches('/').to_owned();
        if !server.starts_with("https://") {
            return Err(invalid(format!(
                "server {server:?}: only https:// is supported"
            )));
        }
        if cluster.tls_server_name.is_some() {
            return Err(invalid(
                "tls-server-name: not supported by nanolet yet".into(),
            ));
        }

        let material = |data: &Option<String>, file: &Option<PathBuf>, what: &str| {
            read_material(data, file, base).map_err(|e| invalid(format!("{what}: {e}")))
        };
        let ca = material(
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
            "certificate-authority",
        )?;
        let mut roots = RootCertStore::empty();
        let ca_pem = match &ca {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| invalid(format!("certificate-authority: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| invalid(format!("certificate-authority: {e}")))?;
                }
                pem
            }
            None => {
                return Err(invalid(
                    "the cluster has no certificate-authority; nanolet needs one".into(),
                ));
            }
        };
        let cert = material(
            &user.client_certificate_data,
            &user.client_certificate,
            "client-certificate",
        )?;
        let key = material(&user.client_key_data, &user.client_key, "client-key")?;
        let identity = Arc::new(ClientIdentity::default());
        let mut client_certificate = None;
        match (cert, key) {
            (Some(cert), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
                    .collect::<Result<_, _>>()
                    .map_err(|e| invalid(format!("client-certificate: {e}")))?;
                client_certificate = chain.first().and_then(|leaf| x509::parse(leaf));
                let key = PrivateKeyDer::from_pem_slice(&key)
                    .map_err(|e| invalid(format!("client-key: {e}")))?;
                identity
                    .set(chain, key, &rustls::crypto::ring::default_provider())
                    .map_err(|e| invalid(format!("client certificate: {e}")))?;
            }
            (None, None) => {}
            _ => {
                return Err(invalid(
                    "a client certificate needs both client-certificate and client-key".into(),
                ));
            }
        };
        let token = match (&user.token, &user.token_file) {
            (Some(t), _) => Some(Token::Fixed(t.trim().to_owned())),
            (None, Some(file)) => Some(Token::File(base.join(file))),
            (None, None) => None,
        };
        let roots = Arc::new(roots);
        Ok(Kubeconfig {
            tls: client_config(roots.clone(), identity.clone())
                .map_err(|e| invalid(e.to_string()))?,
            server,
            token,
            identity,
            ca_pem: ca_pem.to_vec(),
            roots,
            client_certificate,
        })
    }

    /// The same cluster with no credentials yet: the node's own, before
    /// its bootstrap has given it a certificate.
    pub fn without_user(&self) -> Result<Kubeconfig, rustls::Error> {
        let identity = Arc::new(ClientIdentity::default());
        Ok(Kubeconfig {
            server: self.server.clone(),
            tls: client_config(self.roots.clone(), identity.clone())?,
            token: None,
            identity,
            ca_pem: self.ca_pem.clone(),
            roots: self.roots.clone(),
            client_certificate: None,
        })
    }
}

/// Verifies the API server against `roots` and shows what `identity` holds.
fn client_config(
    roots: Arc<RootCertStore>,
    identity: Arc<ClientIdentity>,
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_cert_resolver(identity.clone());
    config.resumption = rustls::client::Resumption::store(identity);
    // HTTP/2 where the server offers it, as client-go: one connection for
    // every request and watch, headers compressed.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Inline base64 data wins over a file, as in client-go.
fn read_material(
    data: &Option<String>,
    file: &Option<PathBuf>,
    base: &Path,
) -> Result<Option<Vec<u8>>, String> {
    if let Some(data) = data {
        let cleaned: String = data.split_whitespace().collect();
        return base64::engine::general_purpose::STANDARD
            .decode(cleaned)
            .map(Some)
            .map_err(|e| format!("invalid base64: {e}"));
    }
    match file {
        Some(file) => {
            let path = base.join(file);
            std::fs::read(&path)
                .map(Some)
                .map_err(|e| format!("{}: {e}", path.display()))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A throwaway self-signed certificate and key, generated for this test.
    const CERT: &str = include_str!("testdata/cert.pem");
    const KEY: &str = include_str!("testdata/key.pem");

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn config(user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443/\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            b64(CERT)
        )
    }

    #[test]
    fn embedded_client_certificate() {
        let text = config(&format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(CERT),
            b64(KEY)
        ));
        let k = Kubeconfig::parse(&text, Path::new("k"), Path::new("/")).unwrap();
        assert_eq!(k.server, "https://127.0.0.1:6443");
        assert!(k.tls.client_auth_cert_resolver.has_certs());
        assert_eq!(k.token, None);
    }

    #[test]
    fn files_resolve_against_the_kubeconfig_dir() {
        let dir = crate::state::TestDir::new("kubeconfig");
        std::fs::write(dir.0.join("ca.pem"), CERT).unwrap();
        let text = "clusters:\n- name: c\n  cluster: {server: \"https://h:1\", certificate-authority: ca.pem}\nusers:\n- name: u\n  user: {tokenFile: tok}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
        let k = Kubeconfig::parse(text, Path::new("k"), &dir.0).unwrap();
        assert_eq!(k.token, Some(Token::File(dir.0.join("tok"))));
        assert!(!k.tls.client_auth_cert_resolver.has_certs());
    }

    #[test]
    fn refusals_name_the_problem() {
        let err = |text: &str| {
            Kubeconfig::parse(text, Path::new("/k"), Path::new("/"))
                .unwrap_err()
                .to_string()
        };
        assert!(err(&config("    client-key-data: eA==\n")).contains("both"));
        assert!(
            err(&config("    token: t\n").replace("current-context: x", "current-context: y"))
                .contains("\"y\"")
        );
        assert!(err(&config("    token: t\n").replace("https://", "http://")).contains("https"));
        assert!(err("clusters: [\n").starts_with("/k:"));
    }
}
