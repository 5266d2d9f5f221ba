//! Image garbage collection by disk thresholds, with the upstream image
//! manager's semantics: when the image filesystem is at least
//! `high_percent` full, unused images go, least recently used first (then
//! first pulled), until it is back at `low_percent`; images pulled less than
//! `min_age` ago stay; images unused for longer than `max_age` go whatever
//! the disk usage. nanolet adds pinned images, which never go.
//!
//! [`GcPolicy`] decides; [`ImageService::collect_garbage`] measures and
//! deletes.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;

use super::store::ImageRecord;
use super::{ImageError, ImageService};
use crate::state::{self, StateError};
use crate::stats::fs::FsUsage;

/// How long an unfinished layer download is kept for a later attempt.
const PARTIAL_KEEP: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
pub struct GcPolicy {
    /// 100 disables collection by disk usage.
    pub high_percent: u8,
    pub low_percent: u8,
    pub min_age: Duration,
    pub max_age: Option<Duration>,
    /// Normalised references.
    pub pinned: HashSet<String>,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: None,
            pinned: HashSet::new(),
        }
    }
}

impl GcPolicy {
    /// Whether the disk is full enough to start deleting.
    pub fn over_high(&self, usage: FsUsage) -> bool {
        self.high_percent < 100 && usage.percent() >= u64::from(self.high_percent)
    }

    /// Whether enough is free to stop: upstream frees
    /// `capacity·(100 − low)/100 − available` bytes.
    pub fn at_low(&self, usage: FsUsage) -> bool {
        usage.available as u128 * 100
            >= usage.capacity as u128 * u128::from(100 - self.low_percent.min(100))
    }

    /// The images that may be deleted, in the order they go: not used by
    /// any pod (by reference or by image ID), not pinned, pulled at least
    /// `min_age` ago; least recently used first, then first pulled.
    pub fn candidates<'a>(
        &self,
        records: &'a BTreeMap<String, ImageRecord>,
        in_use: &HashSet<String>,
        now: Timestamp,
    ) -> Vec<&'a ImageRecord> {
        let used_ids: HashSet<&str> = records
            .values()
            .filter(|r| in_use.contains(&r.reference))
            .map(|r| r.config_digest.as_str())
            .collect();
        let mut candidates: Vec<&ImageRecord> = records
            .values()
            .filter(|r| {
                !in_use.contains(&r.reference)
                    && !used_ids.contains(r.config_digest.as_str())
                    && !self.pinned.contains(&r.reference)
                    && older_than(r.pulled, self.min_age, now)
            })
            .collect();
        candidates.sort_by_key(|r| (r.last_used, r.pulled));
        candidates
    }

    /// Of `candidates`, those unused for longer than `max_age`.
    pub fn expired<'a>(
        &self,
        candidates: &[&'a ImageRecord],
        now: Timestamp,
    ) -> Vec<&'a ImageRecord> {
        let Some(max_age) = self.max_age else {
            return Vec::new();
        };
        candidates
            .iter()
            .filter(|r| older_than(r.last_used, max_age, now))
            .copied()
            .collect()
    }
}

/// What one image GC pass did.
#[derive(Debug, Default)]
pub struct GcReport {
    /// References deleted.
    pub deleted: Vec<String>,
    pub before: Option<FsUsage>,
    pub after: Option<FsUsage>,
    /// The disk was over the high threshold and deleting every candidate
    /// did not bring it down to the low one.
    pub short: bool,
}

impl ImageService {
    /// One image GC pass (see [`gc`]): images whose references are in
    /// `in_use` (every pod the node has admitted, running or not) stay, as
    /// do layers a pull in flight or a mounted container root uses.
    /// Layers no image needs any more (after a crash) go too.
    pub async fn collect_garbage(&self, in_use: &HashSet<String>) -> Result<GcReport, ImageError> {
        let root = self.store.root().to_owned();
        let statfs = |root: PathBuf| async move {
            crate::helpers::unblock(move || {
                FsUsage::of(&root).map_err(|source| ImageError::Statfs { path: root, source })
            })
            .await
        };
        let before = statfs(root.clone()).await?;
        // An unfinished download waits for its pod's next attempt (within
        // the 5 min pull backoff), unless the disk is needed.
        let partial_age = if self.gc.over_high(before) {
            Duration::ZERO
        } else {
            PARTIAL_KEEP
        };
        let mut report = GcReport {
            before: Some(before),
            ..GcReport::default()
        };
        let now = Timestamp::now();
        let records = self.store.records()?;
        let all = self.gc.candidates(&records, in_use, now);
        let expired: Vec<String> = self
            .gc
            .expired(&all, now)
            .iter()
            .map(|r| r.reference.clone())
            .collect();
        let candidates: Vec<String> = all
            .iter()
            .map(|r| r.reference.clone())
            .filter(|r| !expired.contains(r))
            .collect();
        // Unused for too long, and whatever no image needs any more.
        self.delete(&expired, partial_age).await?;
        report.deleted.extend(expired.iter().cloned());
        let mut usage = statfs(root.clone()).await?;
        if self.gc.over_high(usage) {
            let mut remaining = candidates.iter();
            while !self.gc.at_low(usage) {
                let Some(reference) = remaining.next() else {
                    report.short = true;
                    break;
                };
                self.delete(std::slice::from_ref(reference), partial_age)
                    .await?;
                report.deleted.push(reference.clone());
                usage = statfs(root.clone()).await?;
            }
        }
        report.after = Some(usage);
        Ok(report)
    }

    /// The eviction manager's node-level reclaim under disk pressure, as
    /// upstream's DeleteUnusedImages: every image no pod uses (past the
    /// minimum age, not pinned) goes, whatever the thresholds say.
    pub async fn delete_unused(&self, in_use: &HashSet<String>) -> Result<Vec<String>, ImageError> {
        let records = self.store.records()?;
        let unused: Vec<String> = self
            .gc
            .candidates(&records, in_use, Timestamp::now())
            .iter()
            .map(|r| r.reference.clone())
            .collect();
        self.delete(&unused, Duration::ZERO).await?;
        Ok(unused)
    }

    /// Deletes images (and anything unreferenced): the records and renames
    /// in one synchronous step on the loop, so that no pull can check for a
    /// layer between the two; the removal itself off it.
    async fn delete(&self, references: &[String], partial_age: Duration) -> Result<(), ImageError> {
        // Awaited before what it protects is read: from here to the
        // renames there is no await.
        let index = self.index_writes.lock().await;
        let layers_root = self.store.root().join("layers/sha256");
        let mut protected: HashSet<String> = self.in_flight.borrow().keys().cloned().collect();
        protected.extend(
            crate::mount::overlay_lower_dirs()
                .iter()
                .filter_map(|d| layer_of_lower_dir(d, &layers_root)),
        );
        let moved =
            self.store
                .delete_images(references, &protected, self.gc.min_age, partial_age)?;
        drop(index);
        crate::helpers::unblock(move || {
            for dir in moved {
                let removed = if dir.is_dir() {
                    state::remove_tree(&dir)
                } else {
                    std::fs::remove_file(&dir).map_err(|source| StateError::Io {
                        path: dir.clone(),
                        source,
                    })
                };
                if let Err(e) = removed {
                    log::warn!("image GC: {e}");
                }
            }
        })
        .await;
        Ok(())
    }
}

fn older_than(at: Timestamp, age: Duration, now: Timestamp) -> bool {
    now.duration_since(at).unsigned_abs() >= age && at <= now
}

/// The layer an overlay's lower dir is: the store's own dir, or a pod's
/// ID-mapped mount of it (named as the layer, see `userns::MAPPED_LAYERS`).
fn layer_of_lower_dir(dir: &Path, layers_root: &Path) -> Option<String> {
    let parent = dir.parent()?;
    let ours = parent == layers_root || parent.ends_with(crate::runtime::userns::MAPPED_LAYERS);
    let hex = dir.file_name()?.to_string_lossy();
    ours.then(|| format!("sha256:{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(reference: &str, id: &str, pulled: i64, used: i64) -> ImageRecord {
        ImageRecord {
            reference: reference.into(),
            manifest_digest: String::new(),
            config_digest: id.into(),
            layers: Vec::new(),
            size: 0,
            pulled: Timestamp::from_second(pulled).unwrap(),
            last_used: Timestamp::from_second(used).unwrap(),
        }
    }

    fn refs(v: &[&ImageRecord]) -> Vec<String> {
        v.iter().map(|r| r.reference.clone()).collect()
    }

    #[test]
    fn lower_dirs_name_their_layers_also_through_a_pods_id_mapped_mounts() {
        let root = Path::new("/s/images/layers/sha256");
        let of = |dir: &str| layer_of_lower_dir(Path::new(dir), root);
        assert_eq!(
            of("/s/images/layers/sha256/ab").as_deref(),
            Some("sha256:ab")
        );
        assert_eq!(
            of("/s/pods/u/idmapped/layers/cd").as_deref(),
            Some("sha256:cd")
        );
        assert_eq!(of("/s/pods/u/idmapped/volumes/cd"), None);
        assert_eq!(of("/elsewhere/ef"), None);
    }

    #[test]
    fn usage_and_thresholds_as_upstream_counts_them() {
        let usage = |available| FsUsage {
            capacity: 1000,
            available,
            ..FsUsage::default()
        };
        let policy = GcPolicy::default();
        assert_eq!(usage(151).percent(), 85);
        assert!(policy.over_high(usage(150)));
        assert!(!policy.over_high(usage(160)));
        assert!(policy.at_low(usage(200)));
        assert!(!policy.at_low(usage(199)));
        let disabled = GcPolicy {
            high_percent: 100,
            ..GcPolicy::default()
        };
        assert!(!disabled.over_high(usage(0)));
        assert_eq!(FsUsage::default().percent(), 0);
    }

    #[test]
    fn candidates_skip_used_pinned_and_young_images_oldest_use_first() {
        let now = Timestamp::from_second(10_000).unwrap();
        let records: BTreeMap<String, ImageRecord> = [
            record("used", "sha256:1", 0, 100),
            record("same-id-as-used", "sha256:1", 0, 50),
            record("pinned", "sha256:2", 0, 10),
            record("young", "sha256:3", 9_990, 9_990),
            record("b", "sha256:4", 200, 300),
            record("a", "sha256:5", 100, 300),
            record("c", "sha256:6", 0, 200),
        ]
        .into_iter()
        .map(|r| (r.reference.clone(), r))
        .collect();
        let policy = GcPolicy {
            pinned: HashSet::from(["pinned".to_string()]),
            max_age: Some(Duration::from_secs(9_750)),
            ..GcPolicy::default()
        };
        let in_use = HashSet::from(["used".to_string()]);
        let candidates = policy.candidates(&records, &in_use, now);
        assert_eq!(refs(&candidates), ["c", "a", "b"]);
        assert_eq!(refs(&policy.expired(&candidates, now)), ["c"]);
        assert!(GcPolicy::default().expired(&candidates, now).is_empty());
    }
}
