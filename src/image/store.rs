//! The content-addressed image store.
//!
//! ```text
//! images/blobs/sha256/<hex>    manifests and configs, verified
//! images/layers/sha256/<hex>/  one unpacked layer (by compressed digest)
//! images/tmp/                  downloads and unpacks in progress
//! images/images.json           reference → image record
//! ```
//!
//! A layer directory appears (by rename) only once completely unpacked from
//! a verified blob, and the image record is written last; a pull interrupted
//! at any point leaves only `tmp/` debris, which the next start removes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

pub fn digest_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

impl Store {
    /// Opens (creating) the store and clears what interrupted pulls left.
    pub fn open(root: &Path) -> Result<Store, StateError> {
        for dir in ["blobs/sha256", "layers/sha256"] {
            state::create_dir_all(&root.join(dir), 0o700)?;
        }
        state::remove_tree(&root.join("tmp"))?;
        state::create_dir_all(&root.join("tmp"), 0o700)?;
        Ok(Store {
            root: root.to_owned(),
        })
    }

    pub fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.root.join("blobs/sha256").join(digest_hex(digest)?))
    }

    pub fn layer_path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.root.join("layers/sha256").join(digest_hex(digest)?))
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
        self.root.join("images.json")
    }

    pub fn records(&self) -> Result<BTreeMap<String, ImageRecord>, StateError> {
        Ok(state::read_json(&self.index_path())?.unwrap_or_default())
    }

    pub fn record(&self, reference: &str) -> Result<Option<ImageRecord>, StateError> {
        let record = self.records()?.remove(reference);
        // A record is only as good as its layers.
        Ok(record.filter(|r| r.layers.iter().all(|l| self.has_layer(l))))
    }

    pub fn put_record(&self, record: ImageRecord) -> Result<(), StateError> {
        let mut records = self.records()?;
        records.insert(record.reference.clone(), record);
        state::write_json(
            &self.index_path(),
            &records,
            0o600,
            state::Durability::PowerLoss,
        )
    }

    pub fn touch(&self, reference: &str) -> Result<(), StateError> {
        let mut records = self.records()?;
        if let Some(r) = records.get_mut(reference) {
            r.last_used = Timestamp::now();
            // Last use only orders GC candidates: not worth an fsync per start.
            state::write_json(
                &self.index_path(),
                &records,
                0o600,
                state::Durability::ProcessCrash,
            )?;
        }
        Ok(())
    }
}
