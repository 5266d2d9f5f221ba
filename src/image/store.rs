//! The content-addressed image store.
//!
//! ```text
//! images/blobs/sha256/<hex>    manifests and configs, verified
//! images/layers/sha256/<hex>/  one unpacked layer (by compressed digest)
//! images/partial/<hex>         layer downloads not finished, resumed from
//!                              where they stopped, also after a restart
//! images/tmp/                  unpacks in progress, and what GC removes
//! images/images.json           reference → image record
//! ```
//!
//! A layer directory appears (by rename) only once completely unpacked from
//! a verified blob, and the image record is written last; a pull interrupted
//! at any point leaves only `tmp/` debris, which the next start removes, and
//! a download in `partial/` that the next pull resumes (or GC removes).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::state::{self, StateError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// The normalised reference it was pulled as.
    pub reference: String,
    /// Digest of the manifest (of the platform's manifest for an index).
    pub manifest_digest: String,
    /// Digest of the config: the image ID.
    pub config_digest: String,
    /// Compressed layer digests, bottom first.
    pub layers: Vec<String>,
    /// Compressed size of all layers.
    pub size: u64,
    pub pulled: Timestamp,
    pub last_used: Timestamp,
}

/// What the running agent tells `nanolet images` beyond the records: the
/// images its configuration pins and the pulls in progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreStatus {
    #[serde(default)]
    pub pinned: Vec<String>,
    /// Reference → progress.
    #[serde(default)]
    pub pulls: BTreeMap<String, PullProgress>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullProgress {
    /// Layer bytes downloaded (those already present count as done).
    pub done: u64,
    /// Compressed size of all layers.
    pub total: u64,
}

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// Held while `images.json` is read, changed and written back: pulls
    /// record their images from blocking threads, the loop touches and
    /// deletes, and two writers would lose one's change (or collide on the
    /// temp file).
    index: std::sync::Arc<std::sync::Mutex<()>>,
}

/// The image records of the store at `root`, for readers without a
/// [`Store`] (the CLI, stats off the loop).
pub fn read_records(root: &Path) -> Result<BTreeMap<String, ImageRecord>, StateError> {
    Ok(state::read_json(&index_file(root))?.unwrap_or_default())
}

fn index_file(root: &Path) -> PathBuf {
    root.join("images.json")
}

/// What the running agent last wrote of pins and pulls.
pub fn read_status(root: &Path) -> Result<StoreStatus, StateError> {
    Ok(state::read_json(&Store::status_path(root))?.unwrap_or_default())
}

pub fn digest_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

impl Store {
    /// Opens (creating) the store and clears what interrupted pulls left.
    pub fn open(root: &Path) -> Result<Store, StateError> {
        for dir in ["blobs/sha256", "layers/sha256", "partial"] {
            state::create_dir_all(&root.join(dir), 0o700)?;
        }
        state::remove_tree(&root.join("tmp"))?;
        state::create_dir_all(&root.join("tmp"), 0o700)?;
        Ok(Store {
            root: root.to_owned(),
            index: Default::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.root.join("blobs/sha256").join(digest_hex(digest)?))
    }

    pub fn layer_path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.root.join("layers/sha256").join(digest_hex(digest)?))
    }

    /// Where a layer's download goes until it is complete and unpacked.
    pub fn partial_path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.root.join("partial").join(digest_hex(digest)?))
    }

    pub fn has_layer(&self, digest: &str) -> bool {
        self.layer_path(digest).is_some_and(|p| p.is_dir())
    }

    /// A fresh path under `tmp/` for one download or unpack.
    pub fn temp_path(&self, what: &str) -> PathBuf {
        self.root
            .join("tmp")
            .join(format!("{what}-{}", state::random_hex()))
    }

    fn index_path(&self) -> PathBuf {
        index_file(&self.root)
    }

    pub fn status_path(root: &Path) -> PathBuf {
        root.join("status.json")
    }

    /// Rewritten while pulls run: no fsync, it is gone at the next start.
    pub fn write_status(&self, status: &StoreStatus) -> Result<(), StateError> {
        state::write_json(
            &Self::status_path(&self.root),
            status,
            0o644,
            state::Durability::ProcessCrash,
        )
    }

    pub fn records(&self) -> Result<BTreeMap<String, ImageRecord>, StateError> {
        read_records(&self.root)
    }

    pub fn record(&self, reference: &str) -> Result<Option<ImageRecord>, StateError> {
        let record = self.records()?.remove(reference);
        // A record is only as good as its layers.
        Ok(record.filter(|r| r.layers.iter().all(|l| self.has_layer(l))))
    }

    /// The index lock. A writer that panicked left the file whole (written
    /// aside, then renamed), so a poisoned lock is still good.
    fn lock_index(&self) -> std::sync::MutexGuard<'_, ()> {
        self.index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn put_record(&self, record: ImageRecord) -> Result<(), StateError> {
        let _index = self.lock_index();
        let mut records = self.records()?;
        records.insert(record.reference.clone(), record);
        state::write_json(
            &self.index_path(),
            &records,
            0o600,
            state::Durability::PowerLoss,
        )
    }

    /// Deletes the records of `references`, then moves every layer and
    /// config no remaining record needs into `tmp/` (the caller removes
    /// them there, off the loop; the next start does if it cannot). Layers
    /// and configs in `protected` stay: pulls in flight and running
    /// containers use them. So do unreferenced ones younger than `min_age`
    /// unless a deleted record named them: a pull may be about to record
    /// them. Unfinished downloads go once older than `partial_age`.
    /// Returns what was moved.
    pub fn delete_images(
        &self,
        references: &[String],
        protected: &HashSet<String>,
        min_age: Duration,
        partial_age: Duration,
    ) -> Result<Vec<PathBuf>, StateError> {
        let _index = self.lock_index();
        let mut records = self.records()?;
        let mut released: HashSet<String> = HashSet::new();
        for reference in references {
            if let Some(r) = records.remove(reference) {
                released.extend(r.layers);
                released.insert(r.config_digest);
            }
        }
        if !references.is_empty() {
            // Should the removal be lost to a power cut, the record names
            // layers that are gone and counts as absent.
            self.write_index_unsynced(&records)?;
        }
        let needed: HashSet<&String> = records
            .values()
            .flat_map(|r| r.layers.iter().chain([&r.config_digest]))
            .collect();
        let mut moved = Vec::new();
        for (dir, keep_for) in [
            ("layers/sha256", min_age),
            ("blobs/sha256", min_age),
            ("partial", partial_age),
        ] {
            let entries =
                std::fs::read_dir(self.root.join(dir)).map_err(|source| StateError::Io {
                    path: self.root.join(dir),
                    source,
                })?;
            for entry in entries.flatten() {
                let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
                if needed.contains(&digest) || protected.contains(&digest) {
                    continue;
                }
                let young = entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| age < keep_for);
                if young && !released.contains(&digest) {
                    continue;
                }
                let doomed = self.temp_path("gc");
                match std::fs::rename(entry.path(), &doomed) {
                    Ok(()) => moved.push(doomed),
                    Err(e) => log::warn!("image GC: {}: {e}", entry.path().display()),
                }
            }
        }
        Ok(moved)
    }

    pub fn touch(&self, reference: &str) -> Result<(), StateError> {
        let _index = self.lock_index();
        let mut records = self.records()?;
        if let Some(r) = records.get_mut(reference) {
            r.last_used = Timestamp::now();
            // Last use only orders GC candidates: not worth an fsync per start.
            self.write_index_unsynced(&records)?;
        }
        Ok(())
    }

    /// The index without an fsync, for changes a power cut may undo.
    fn write_index_unsynced(
        &self,
        records: &BTreeMap<String, ImageRecord>,
    ) -> Result<(), StateError> {
        state::write_json(
            &self.index_path(),
            records,
            0o600,
            state::Durability::ProcessCrash,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_written_from_many_threads_at_once_are_all_kept() {
        let dir = crate::state::TestDir::new("store");
        let store = Store::open(&dir.0).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for j in 0..5 {
                        let now = Timestamp::now();
                        store
                            .put_record(ImageRecord {
                                reference: format!("r{i}-{j}"),
                                manifest_digest: String::new(),
                                config_digest: String::new(),
                                layers: Vec::new(),
                                size: 0,
                                pulled: now,
                                last_used: now,
                            })
                            .unwrap();
                        store.touch(&format!("r{i}-{j}")).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.records().unwrap().len(), 40);
    }
}
