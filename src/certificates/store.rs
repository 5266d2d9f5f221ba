//! The node's certificates in its cert dir, laid out as upstream's file
//! store so that tools and operators find them where they look:
//! `<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem` holds a certificate chain and its
//! key, `<prefix>-current.pem` is a symlink to the one in use, and
//! `<prefix>.key.tmp` is the key of a request still pending (kept across
//! restarts, so that a restarted bootstrap finds its own request again).
//! Every file is 0600: the keys never leave the node.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::x509;

/// Certificates and keys are a few KiB; anything far larger is not one.
const MAX_FILE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

fn invalid(path: &Path, message: impl ToString) -> StoreError {
    StoreError::Invalid {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// A certificate chain, its key, and what the leaf says.
#[derive(Debug)]
pub struct Pair {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub leaf: x509::Certificate,
    /// The file it came from (the cert's, if they were apart).
    pub path: PathBuf,
}

/// Reads at most [`MAX_FILE`] bytes of a regular file.
fn read_small(path: &Path) -> Result<Vec<u8>, StoreError> {
    // Non-blocking: opening a FIFO put where the file was must not hang.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err(path))?;
    let metadata = file.metadata().map_err(io_err(path))?;
    if !metadata.is_file() {
        return Err(invalid(path, "not a regular file"));
    }
    let mut data = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut data)
        .map_err(io_err(path))?;
    if data.len() as u64 > MAX_FILE {
        return Err(invalid(path, "larger than a certificate and key can be"));
    }
    Ok(data)
}

/// A chain and key from PEM text (one file holding both, or two), checked
/// to belong together.
pub fn pair_from_pem(cert_pem: &[u8], key_pem: &[u8], path: &Path) -> Result<Pair, StoreError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(path, e))?;
    let leaf = chain
        .first()
        .ok_or_else(|| invalid(path, "no certificate"))?;
    let leaf = x509::parse(leaf).ok_or_else(|| invalid(path, "a certificate it cannot read"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| invalid(path, e))?;
    let key_pair = rcgen::KeyPair::try_from(&key).map_err(|e| invalid(path, e))?;
    if key_pair.public_key_raw() != leaf.public_key {
        return Err(invalid(path, "the certificate is not for this key"));
    }
    Ok(Pair {
        chain,
        key,
        leaf,
        path: path.to_owned(),
    })
}

/// The file name's stamp, as upstream's: the UTC time of the write.
fn stamp(unix_seconds: i64) -> String {
    let at = jiff::Timestamp::from_second(unix_seconds).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    at.strftime("%Y-%m-%d-%H-%M-%S").to_string()
}

#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    /// `kubelet-client` or `kubelet-server`.
    prefix: &'static str,
}

impl Store {
    pub fn new(dir: &Path, prefix: &'static str) -> Store {
        Store {
            dir: dir.to_owned(),
            prefix,
        }
    }

    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    fn pending_key_path(&self) -> PathBuf {
        self.dir.join(format!("{}.key.tmp", self.prefix))
    }

    /// The pair in use, if there is one. A broken one is an error, never
    /// removed: it is the operator's to look at.
    pub fn current(&self) -> Result<Option<Pair>, StoreError> {
        let path = self.current_path();
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path)(e)),
            Ok(_) => {}
        }
        let data = read_small(&path)?;
        pair_from_pem(&data, &data, &path).map(Some)
    }

    /// Keeps `cert_pem` and `key_pem` as the pair in use: a new stamped
    /// file, then the link swapped to it, each step atomic and durable.
    pub fn update(&self, cert_pem: &str, key_pem: &str, now: i64) -> Result<PathBuf, StoreError> {
        crate::state::create_dir_all(&self.dir, 0o700).map_err(|e| invalid(&self.dir, e))?;
        let name = format!("{}-{}.pem", self.prefix, stamp(now));
        let path = self.dir.join(&name);
        let mut text = cert_pem.trim_end().to_owned();
        text.push('\n');
        text.push_str(key_pem.trim_end());
        text.push('\n');
        crate::state::write_atomic(
            &path,
            text.as_bytes(),
            0o600,
            crate::state::Durability::PowerLoss,
        )
        .map_err(|e| invalid(&path, e))?;
        let link = self.current_path();
        let tmp = self.dir.join(format!(".{}-current.pem.tmp", self.prefix));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp).map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, &link).map_err(io_err(&link))?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))?;
        Ok(path)
    }

    /// The key of the pending request: the one a previous run made, else a
    /// new ECDSA P-256 key, written before it is used.
    pub fn pending_key(&self) -> Result<rcgen::KeyPair, StoreError> {
        let path = self.pending_key_path();
        match read_small(&path) {
            Ok(pem) => {
                let text = String::from_utf8_lossy(&pem);
                match rcgen::KeyPair::from_pem(&text) {
                    Ok(key) => return Ok(key),
                    Err(e) => log::warn!("{}: {e}; making a new key", path.display()),
                }
            }
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            }
            Err(e) => log::warn!("{e}; making a new key"),
        }
        let key = new_key().map_err(|e| invalid(&path, e))?;
        crate::state::create_dir_all(&self.dir, 0o700).map_err(|e| invalid(&self.dir, e))?;
        crate::state::write_atomic(
            &path,
            key.serialize_pem().as_bytes(),
            0o600,
            crate::state::Durability::PowerLoss,
        )
        .map_err(|e| invalid(&path, e))?;
        Ok(key)
    }

    /// The pending request is done with: its key is in a pair now.
    pub fn forget_pending_key(&self) {
        let path = self.pending_key_path();
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            log::warn!("{}: {e}", path.display());
        }
    }
}

/// An ECDSA P-256 key, as upstream's kubelet makes for its requests.
pub fn new_key() -> Result<rcgen::KeyPair, rcgen::Error> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(key: &rcgen::KeyPair, name: &str) -> String {
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.self_signed(key).unwrap().pem()
    }

    #[test]
    fn a_pair_is_kept_and_the_link_follows_the_newest() {
        let dir = crate::state::TestDir::new("cert-store");
        let store = Store::new(&dir.0.join("pki"), "kubelet-client");
        assert!(store.current().unwrap().is_none());
        let key = store.pending_key().unwrap();
        // The same key again until the request is done.
        assert_eq!(
            store.pending_key().unwrap().public_key_raw(),
            key.public_key_raw()
        );
        let first = store
            .update(&issued(&key, "one"), &key.serialize_pem(), 1_700_000_000)
            .unwrap();
        store.forget_pending_key();
        assert_eq!(
            first.file_name().unwrap(),
            "kubelet-client-2023-11-14-22-13-20.pem"
        );
        let current = store.current().unwrap().unwrap();
        assert_eq!(current.leaf.common_name.as_deref(), Some("one"));
        let mode = std::fs::metadata(&first).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );

        let next = store.pending_key().unwrap();
        assert_ne!(next.public_key_raw(), key.public_key_raw());
        store
            .update(&issued(&next, "two"), &next.serialize_pem(), 1_700_000_100)
            .unwrap();
        let current = store.current().unwrap().unwrap();
        assert_eq!(current.leaf.common_name.as_deref(), Some("two"));
        assert_eq!(
            std::fs::read_link(store.current_path()).unwrap(),
            Path::new("kubelet-client-2023-11-14-22-15-00.pem")
        );
        // The older pair stays, as upstream leaves it.
        assert!(first.exists());
    }

    #[test]
    fn a_certificate_for_another_key_or_not_a_file_is_refused() {
        let dir = crate::state::TestDir::new("cert-store-bad");
        let store = Store::new(&dir.0, "kubelet-client");
        let key = new_key().unwrap();
        let other = new_key().unwrap();
        let err = pair_from_pem(
            issued(&other, "x").as_bytes(),
            key.serialize_pem().as_bytes(),
            Path::new("p"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("not for this key"), "{err}");
        // A directory, a FIFO or a huge file where the pair should be.
        std::fs::create_dir(store.current_path()).unwrap();
        assert!(store.current().is_err());
        std::fs::remove_dir(store.current_path()).unwrap();
        nix::unistd::mkfifo(&store.current_path(), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = store.current().unwrap_err();
        assert!(err.to_string().contains("regular"), "{err}");
        std::fs::remove_file(store.current_path()).unwrap();
        std::fs::write(store.current_path(), vec![b'A'; 2 << 20]).unwrap();
        let err = store.current().unwrap_err();
        assert!(err.to_string().contains("larger"), "{err}");
    }
}
