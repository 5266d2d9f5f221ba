//! A certificate from the cluster: a CertificateSigningRequest for a key
//! made on the node, then waiting until it is approved and issued, denied,
//! or failed, as upstream's kubelet asks for its client and serving
//! certificates.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use super::x509;
use crate::kube::{Api, KubeError, RetryBackoff};

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// How long one request is waited for before it is given up (upstream's
/// bootstrap waits an hour too); the caller tries again later.
const WAIT_LIMIT: Duration = Duration::from_secs(3600);

/// A certificate's body is a few KiB; this is far more than any.
const MAX_CERTIFICATE: usize = 64 << 10;

pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("making the certificate request: {0}")]
    Build(#[from] rcgen::Error),
    #[error("certificate request: {0}")]
    Api(#[from] KubeError),
    #[error("certificate request {name} was denied: {message}")]
    Denied { name: String, message: String },
    #[error("certificate request {name} failed: {message}")]
    Failed { name: String, message: String },
    #[error("certificate request {name}: no certificate after {}s", WAIT_LIMIT.as_secs())]
    TimedOut { name: String },
    #[error("certificate request {name}: {message}")]
    Invalid { name: String, message: String },
}

/// What the node asks a certificate for.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub signer: &'static str,
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub usages: &'static [&'static str],
}

impl Wanted {
    /// The node's client certificate, as upstream asks for it with an
    /// ECDSA key (no key encipherment).
    pub fn client(node_name: &str) -> Wanted {
        Wanted {
            signer: CLIENT_SIGNER,
            common_name: format!("system:node:{node_name}"),
            organizations: vec!["system:nodes".into()],
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            usages: &["digital signature", "client auth"],
        }
    }

    /// The kubelet API's serving certificate for the node's names.
    pub fn serving(node_name: &str, dns_names: Vec<String>, ip_addresses: Vec<IpAddr>) -> Wanted {
        Wanted {
            signer: SERVING_SIGNER,
            common_name: format!("system:node:{node_name}"),
            organizations: vec!["system:nodes".into()],
            dns_names,
            ip_addresses,
            usages: &["digital signature", "server auth"],
        }
    }

    /// The PKCS#10 request, PEM.
    pub fn csr_pem(&self, key: &rcgen::KeyPair) -> Result<String, rcgen::Error> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, self.common_name.as_str());
        for (i, organization) in self.organizations.iter().enumerate() {
            // rcgen keeps one value per type: further O's under their OID.
            let kind = match i {
                0 => rcgen::DnType::OrganizationName,
                _ => rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]),
            };
            params.distinguished_name.push(kind, organization.as_str());
        }
        for name in &self.dns_names {
            params
                .subject_alt_names
                .push(rcgen::SanType::DnsName(name.as_str().try_into()?));
        }
        for ip in &self.ip_addresses {
            params
                .subject_alt_names
                .push(rcgen::SanType::IpAddress(*ip));
        }
        params.serialize_request(key)?.pem()
    }

    /// A name of the request's own for a bootstrap, as upstream's
    /// `node-csr-<digest>`: the same key and subject give the same name, so
    /// a node restarted while waiting finds its request again instead of
    /// leaving one more behind.
    pub fn digested_name(&self, key: &rcgen::KeyPair) -> String {
        use sha2::Digest;
        let mut hash = sha2::Sha256::new();
        for part in [key.public_key_raw(), self.common_name.as_bytes()] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        for part in self
            .organizations
            .iter()
            .map(String::as_str)
            .chain(self.usages.iter().copied())
        {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        let digest = hash.finalize();
        format!(
            "node-csr-{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
        )
    }
}

/// Asks for a certificate for `key` and waits for it: the issued chain, PEM,
/// checked to be for `key`. `name` names the request (a bootstrap's),
/// else the server makes one up.
pub async fn obtain(
    api: &Api,
    wanted: &Wanted,
    key: &rcgen::KeyPair,
    name: Option<&str>,
) -> Result<String, RequestError> {
    let csr_pem = wanted.csr_pem(key)?;
    let encoded = base64::engine::general_purpose::STANDARD.encode(&csr_pem);
    let metadata = match name {
        Some(name) => json!({ "name": name }),
        None => json!({ "generateName": "csr-" }),
    };
    let body = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": metadata,
        "spec": {
            "request": encoded,
            "signerName": wanted.signer,
            "usages": wanted.usages,
        },
    });
    let created: Value = match api.create(CSRS, &body).await {
        Ok(created) => created,
        // Made by this node before a restart: the same key gives the same
        // request, which is waited for again.
        Err(e) if e.is_conflict() && name.is_some() => {
            let name = name.unwrap_or_default();
            let existing: Value = api.get(&format!("{CSRS}/{name}")).await?;
            if existing.pointer("/spec/request").and_then(Value::as_str) != Some(&encoded) {
                return Err(RequestError::Invalid {
                    name: name.to_owned(),
                    message: "a request of this name exists for another key or subject".into(),
                });
            }
            existing
        }
        Err(e) => return Err(e.into()),
    };
    let name = created
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    // It goes into the path of every look at the request: an answer naming
    // it `../pods?x` must not send those somewhere else.
    if !is_object_name(&name) {
        return Err(RequestError::Invalid {
            name,
            message: "the server named the request with what is no object name".into(),
        });
    }
    log::info!(
        "certificate request {name} sent for {} (signer {})",
        wanted.common_name,
        wanted.signer
    );
    let pem = wait_for_certificate(api, &name, created).await?;
    issued_for(pem, key, name)
}

/// The issued chain, if its leaf is for `key`: a signer (or anyone able to
/// write the request's status) must not make the node use another key's
/// certificate, which it could not use anyway.
fn issued_for(pem: String, key: &rcgen::KeyPair, name: String) -> Result<String, RequestError> {
    use rustls_pki_types::pem::PemObject;
    let leaf = rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .and_then(Result::ok)
        .and_then(|der| x509::parse(&der));
    match leaf {
        Some(leaf) if leaf.public_key == key.public_key_raw() => Ok(pem),
        Some(_) => Err(RequestError::Invalid {
            name,
            message: "the issued certificate is for another key".into(),
        }),
        None => Err(RequestError::Invalid {
            name,
            message: "the issued certificate cannot be read".into(),
        }),
    }
}

/// A name that is one path segment: CertificateSigningRequest names are
/// not held to DNS rules (upstream's own `node-csr-` names carry base64's
/// capitals and underscores), so this asks for what a path needs.
fn is_object_name(name: &str) -> bool {
    !matches!(name, "" | "." | "..")
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// What a request's status says.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Pending,
    Issued(String),
    Denied(String),
    Failed(String),
}

fn verdict(csr: &Value) -> Result<Verdict, String> {
    let conditions = csr
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let holds = |kind: &str| {
        conditions
            .iter()
            .find(|c| c["type"] == kind && c["status"] != "False")
            .map(|c| {
                let reason = c["reason"].as_str().unwrap_or_default();
                let message = c["message"].as_str().unwrap_or_default();
                format!("{reason}: {message}")
            })
    };
    if let Some(why) = holds("Denied") {
        return Ok(Verdict::Denied(why));
    }
    if let Some(why) = holds("Failed") {
        return Ok(Verdict::Failed(why));
    }
    let certificate = csr
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if holds("Approved").is_none() || certificate.is_empty() {
        return Ok(Verdict::Pending);
    }
    if certificate.len() > MAX_CERTIFICATE * 4 / 3 + 4 {
        return Err("the certificate is larger than any can be".into());
    }
    let der = base64::engine::general_purpose::STANDARD
        .decode(certificate)
        .map_err(|e| format!("the certificate is not base64: {e}"))?;
    String::from_utf8(der)
        .map(Verdict::Issued)
        .map_err(|_| "the certificate is not PEM".into())
}

/// Polls the request, soon at first (an approver answers in a moment) and
/// less often after, up to [`WAIT_LIMIT`]: a rare event on a slow link, so
/// a GET now and then costs less than a watch held open.
async fn wait_for_certificate(
    api: &Api,
    name: &str,
    mut csr: Value,
) -> Result<String, RequestError> {
    let started = Instant::now();
    let mut backoff = RetryBackoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        match verdict(&csr) {
            Ok(Verdict::Issued(pem)) => return Ok(pem),
            Ok(Verdict::Denied(message)) => {
                return Err(RequestError::Denied {
                    name: name.to_owned(),
                    message,
                });
            }
            Ok(Verdict::Failed(message)) => {
                return Err(RequestError::Failed {
                    name: name.to_owned(),
                    message,
                });
            }
            Ok(Verdict::Pending) => {}
            Err(message) => {
                return Err(RequestError::Invalid {
                    name: name.to_owned(),
                    message,
                });
            }
        }
        if started.elapsed() >= WAIT_LIMIT {
            return Err(RequestError::TimedOut {
                name: name.to_owned(),
            });
        }
        smol::Timer::after(backoff.next_delay()).await;
        csr = match api.get(&format!("{CSRS}/{name}")).await {
            Ok(csr) => csr,
            // An outage: the request is still there to wait for.
            Err(e) if e.is_unavailable() => continue,
            Err(e) => return Err(e.into()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_pending_issued_denied_or_failed() {
        let pem = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        let encoded = base64::engine::general_purpose::STANDARD.encode(pem);
        let approved = json!({"type": "Approved", "status": "True"});
        assert_eq!(verdict(&json!({})), Ok(Verdict::Pending));
        // Approved but not signed yet, or signed without approval.
        assert_eq!(
            verdict(&json!({"status": {"conditions": [approved]}})),
            Ok(Verdict::Pending)
        );
        assert_eq!(
            verdict(&json!({"status": {"certificate": encoded}})),
            Ok(Verdict::Pending)
        );
        assert_eq!(
            verdict(&json!({"status": {"conditions": [approved], "certificate": encoded}})),
            Ok(Verdict::Issued(pem.into()))
        );
        let denied = json!({"type": "Denied", "status": "True", "reason": "R", "message": "no"});
        assert_eq!(
            verdict(&json!({"status": {"conditions": [approved, denied]}})),
            Ok(Verdict::Denied("R: no".into()))
        );
        let failed =
            json!({"type": "Failed", "status": "True", "reason": "SignerValidationFailure"});
        assert_eq!(
            verdict(&json!({"status": {"conditions": [failed], "certificate": encoded}})),
            Ok(Verdict::Failed("SignerValidationFailure: ".into()))
        );
        assert!(
            verdict(&json!({"status": {"conditions": [approved], "certificate": "%%"}})).is_err()
        );
        let huge = "A".repeat(MAX_CERTIFICATE * 2);
        assert!(
            verdict(&json!({"status": {"conditions": [approved], "certificate": huge}})).is_err()
        );
    }

    #[test]
    fn a_certificate_for_another_key_or_none_at_all_is_refused() {
        let key = crate::certificates::store::new_key().unwrap();
        let other = crate::certificates::store::new_key().unwrap();
        let issued = |key: &rcgen::KeyPair| {
            let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "system:node:edge-1");
            params.self_signed(key).unwrap().pem()
        };
        let mine = issued(&key);
        assert_eq!(
            issued_for(mine.clone(), &key, "csr-1".into()).unwrap(),
            mine
        );
        let err = issued_for(issued(&other), &key, "csr-1".into()).unwrap_err();
        assert!(err.to_string().contains("for another key"), "{err}");
        let err = issued_for("not PEM".into(), &key, "csr-1".into()).unwrap_err();
        assert!(err.to_string().contains("cannot be read"), "{err}");
        let garbled = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
        assert!(issued_for(garbled.into(), &key, "csr-1".into()).is_err());
    }

    #[test]
    fn a_request_named_with_a_path_is_refused() {
        assert!(is_object_name("csr-x7k2p"));
        let key = crate::certificates::store::new_key().unwrap();
        assert!(is_object_name(
            &Wanted::client("edge-1").digested_name(&key)
        ));
        for bad in [
            "",
            "..",
            "../pods",
            "csr?watch=1",
            "a/b",
            "a%2fb",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_bootstrap_name_follows_key_and_subject() {
        let key = crate::certificates::store::new_key().unwrap();
        let other = crate::certificates::store::new_key().unwrap();
        let one = Wanted::client("edge-1");
        let name = one.digested_name(&key);
        assert!(
            name.starts_with("node-csr-") && name.len() == 9 + 43,
            "{name}"
        );
        assert_eq!(one.digested_name(&key), name);
        assert_ne!(one.digested_name(&other), name);
        assert_ne!(Wanted::client("edge-2").digested_name(&key), name);
    }
}
