//! The on-disk state directory: its layout and crash-safe writes.
//!
//! Everything the agent must find again after `kill -9` or a reboot lives
//! here. Files are replaced atomically (temp file, fsync, rename, fsync of the
//! directory), so a reader sees either the old or the new content, never a
//! torn one.

pub mod format;
pub(crate) mod records;

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Paths inside the state directory. One place names them so that the agent,
/// the monitor and the read-only CLI commands agree.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout { root: root.into() }
    }
    pub fn pods(&self) -> PathBuf {
        self.root.join("pods")
    }
    pub fn pod(&self, uid: &str) -> PathBuf {
        self.pods().join(uid)
    }
    /// Localhost seccomp profiles, as upstream's `<root-dir>/seccomp`.
    pub fn seccomp(&self) -> PathBuf {
        self.root.join("seccomp")
    }
    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }
    pub fn runtime_root(&self) -> PathBuf {
        self.root.join("runtime")
    }
    /// Manifests that could not be admitted, for `nanolet pods`.
    pub fn rejected_manifests(&self) -> PathBuf {
        self.root.join("rejected-manifests.json")
    }
    pub fn agent_pid(&self) -> PathBuf {
        self.root.join("agent.pid")
    }
    /// Which container holds which plugin's devices, and the devices.
    pub fn devices(&self) -> PathBuf {
        self.root.join("devices.json")
    }
}

/// What a replaced file must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// A power cut: file and directory are fsynced. For what must come back
    /// after a reboot (checkpoints, the image store).
    PowerLoss,
    /// The agent killed at any instruction: the rename alone is atomic. For
    /// state rewritten often and rebuilt after a reboot anyway (status,
    /// container records); skipping fsync keeps pod starts fast on SD cards.
    ProcessCrash,
}

/// Writes `data` to `path` so that a crash leaves either the old or the new
/// file. `mode` applies to the new file.
pub fn write_atomic(
    path: &Path,
    data: &[u8],
    mode: u32,
    durability: Durability,
) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Unique per write: two threads writing one file must not share it.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp{}-{n}", std::process::id()));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        file.write_all(data).map_err(io_err(&tmp))?;
        if durability == Durability::PowerLoss {
            file.sync_all().map_err(io_err(&tmp))?;
        }
        fs::rename(&tmp, path).map_err(io_err(path))?;
        if durability == Durability::ProcessCrash {
            return Ok(());
        }
        // The rename is durable only once the directory entry is.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub fn write_json<T: Serialize>(
    path: &Path,
    value: &T,
    mode: u32,
    durability: Durability,
) -> Result<(), StateError> {
    let data = serde_json::to_vec_pretty(value).map_err(|source| StateError::Json {
        path: path.to_owned(),
        source,
    })?;
    write_atomic(path, &data, mode, durability)
}

/// Reads a JSON file; `Ok(None)` when it does not exist.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StateError> {
    match fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|source| StateError::Json {
                path: path.to_owned(),
                source,
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

pub fn create_dir_all(path: &Path, mode: u32) -> Result<(), StateError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io_err(path))
}

/// Removes a directory tree; a missing one is not an error (teardown must be
/// idempotent, it may run again after a crash).
pub fn remove_tree(path: &Path) -> Result<(), StateError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// 128 random bits as hex, for container IDs and temp names.
pub fn random_hex() -> String {
    hex(&random_bytes())
}

/// A random fraction in [0, 1), for jitter.
pub fn random_fraction() -> f64 {
    let bytes = random_bytes();
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    (u64::from_le_bytes(word) >> 11) as f64 / (1u64 << 53) as f64
}

fn random_bytes() -> [u8; 16] {
    let mut buf = [0u8; 16];
    // getrandom(2) on Linux does not fail for 16 bytes once the pool is
    // initialised; fall back to time and pid if it ever does.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ u128::from(std::process::id());
        buf = seed.to_le_bytes();
    }
    buf
}

/// 16 bytes in the UUID text form (8-4-4-4-12 hex digits), as Kubernetes
/// writes UIDs.
pub fn uuid(bytes: &[u8; 16]) -> String {
    let h = hex(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A random UUID-formatted UID.
pub fn random_uuid() -> String {
    let mut bytes = [0u8; 16];
    let text = random_hex();
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    uuid(&bytes)
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A temp dir for unit tests, removed when dropped, also when the test
/// panics.
#[cfg(test)]
pub struct TestDir(pub PathBuf);

#[cfg(test)]
impl TestDir {
    pub fn new(prefix: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!("nanolet-{prefix}-{}", random_hex()));
        fs::create_dir_all(&dir).expect("creating a test dir");
        TestDir(dir)
    }
}

#[cfg(test)]
impl Drop for TestDir {
    fn drop(&mut self) {
        for mount in crate::mount::mounts_under(&self.0) {
            let _ = crate::mount::unmount(&mount);
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let guard = TestDir::new("state");
        let dir = guard.0.clone();
        let file = dir.join("x.json");
        write_json(&file, &vec![1, 2], 0o600, Durability::PowerLoss).unwrap();
        write_json(&file, &vec![3], 0o600, Durability::ProcessCrash).unwrap();
        let back: Option<Vec<i32>> = read_json(&file).unwrap();
        assert_eq!(back, Some(vec![3]));
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        assert!(
            read_json::<Vec<i32>>(&dir.join("missing"))
                .unwrap()
                .is_none()
        );
        remove_tree(&dir).unwrap();
        remove_tree(&dir).unwrap();
    }

    #[test]
    fn random_hex_is_unique() {
        assert_ne!(random_hex(), random_hex());
        assert_eq!(random_hex().len(), 32);
    }
}
