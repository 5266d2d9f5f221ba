//! The API server's certificates: a CA it generates once per directory,
//! its serving certificate, and client certificates for users and nodes
//! (CN = user, O = groups, as the real server maps them), with kubeconfigs.

use std::fs;
use std::net::IpAddr;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("validity period: {0}")]
    Validity(String),
}

fn read(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn write(path: &Path, text: &str) -> Result<(), PkiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| PkiError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(io)
}

pub struct Ca {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, PEM-encoded.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    /// Loads `dir/ca.crt` and `dir/ca.key`, creating them the first time.
    pub fn load_or_create(dir: &Path) -> Result<Ca, PkiError> {
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        if crt.exists() && key.exists() {
            let cert_pem = read(&crt)?;
            let key_pair = KeyPair::from_pem(&read(&key)?)?;
            let issuer = Issuer::from_ca_cert_pem(&cert_pem, key_pair)?;
            return Ok(Ca { cert_pem, issuer });
        }
        let key_pair = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "test-apiserver-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key_pair)?;
        let cert_pem = cert.pem();
        write(&key, &key_pair.serialize_pem())?;
        write(&crt, &cert_pem)?;
        Ok(Ca {
            cert_pem,
            issuer: Issuer::new(params, key_pair),
        })
    }

    /// A serving certificate for the given names and addresses.
    pub fn server(&self, names: &[&str], ips: &[IpAddr]) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A client certificate: CN = user, one O per group.
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A kubeconfig with embedded credentials, in YAML as kubectl writes it.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, client: &Issued) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {user}\ncurrent-context: test\n",
        ca = b64(ca_pem),
        cert = b64(&client.cert_pem),
        key = b64(&client.key_pem),
    )
}

/// A certificate's notBefore and notAfter, in seconds since the epoch.
pub fn validity(cert_der: &[u8]) -> Option<(i64, i64)> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let validity = cert.validity();
    Some((
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    ))
}

/// The user and groups of a verified client certificate (CN and O's).
pub fn identity(cert_der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let subject = cert.subject();
    let user = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some((user, groups))
}

impl Ca {
    /// Signs a PKCS#10 request (PEM) for `seconds`, for client or server
    /// use as the CSR's usages say, valid from `not_before` seconds from
    /// now (a minute back if that is not ahead).
    pub fn sign_request(
        &self,
        csr_pem: &str,
        usages: &[String],
        not_before: i64,
        seconds: i64,
    ) -> Result<String, PkiError> {
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)?;
        let now = jiff::Timestamp::now().as_second();
        let at = |t: i64| {
            time::OffsetDateTime::from_unix_timestamp(t)
                .map_err(|e| PkiError::Validity(e.to_string()))
        };
        // A minute back, for clocks a little behind the server's.
        let from = now + not_before - if not_before > 0 { 0 } else { 60 };
        csr.params.not_before = at(from)?;
        csr.params.not_after = at(from.max(now) + seconds)?;
        csr.params.extended_key_usages = usages
            .iter()
            .filter_map(|u| match u.as_str() {
                "client auth" => Some(ExtendedKeyUsagePurpose::ClientAuth),
                "server auth" => Some(ExtendedKeyUsagePurpose::ServerAuth),
                _ => None,
            })
            .collect();
        csr.params.is_ca = IsCa::NoCa;
        Ok(csr.signed_by(&self.issuer)?.pem())
    }
}
