//! Images: references, the registry client, the store, layer unpacking and
//! container root filesystems. [`ImageService::ensure`] is the one entry
//! point pod workers use.

pub(crate) mod auth;
mod blob;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod gc;
mod locks;
pub(crate) mod manifest;
mod progress;
pub(crate) mod reference;
pub(crate) mod registry;
pub(crate) mod store;
pub mod unpack;
pub(crate) mod zstd;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

use jiff::Timestamp;
use sha2::Digest;
use smol::lock::{Mutex, Semaphore};

use self::auth::{Credentials, RegistryAuth};
use self::blob::{BlobWriter, HashingFile, hash_partial, sha256_digest};
use self::gc::GcPolicy;
use self::locks::{InFlight, KeyedLocks};
use self::manifest::{Descriptor, Document, ImageConfig, Platform, RunConfig};
use self::progress::{PROGRESS_FILE_EVERY, Progress};
use self::reference::{Reference, ReferenceError};
use self::registry::{Registry, RegistryError};
use self::store::{ImageRecord, Store, StoreStatus};
use crate::http::next_chunk;
use crate::pod::PullPolicy;
use crate::state::{self, StateError, hex};

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    InvalidName(#[from] ReferenceError),
    #[error("image {image} is not present and the pull policy is Never")]
    NeverPull { image: String },
    #[error("pulling {image}: {source}")]
    Registry {
        image: String,
        source: RegistryError,
    },
    #[error("pulling {image}: {message}")]
    Pull { image: String, message: String },
    #[error(transparent)]
    Store(#[from] StateError),
    #[error("image filesystem {path}: {source}")]
    Statfs {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Against decompression bombs: per layer as [`unpack::Limits`], and the
/// unpacked bytes of all the layers one pull unpacks.
#[derive(Debug, Clone, Copy)]
pub struct PullLimits {
    pub layer: unpack::Limits,
    pub image_bytes: u64,
}

/// An image ready to run.
#[derive(Debug, Clone)]
pub struct Image {
    /// The config digest, as kubelets report imageID.
    pub id: String,
    /// Unpacked layer directories, bottom first.
    pub layers: Vec<PathBuf>,
    pub config: RunConfig,
    /// Compressed size of its layers.
    pub size: u64,
}

pub struct ImageService {
    registry: Registry,
    store: Store,
    platform: Platform,
    /// One pull per reference at a time; a second asker waits and then finds
    /// the image in the store.
    pulls: KeyedLocks,
    /// One download of a layer at a time, also across images that share it.
    layer_fetches: KeyedLocks,
    /// Unpacking is CPU and disk work off the loop; bound it on small boards.
    unpack_slots: Semaphore,
    /// Taken around every change of `images.json`. Pulls write it from a
    /// blocking thread (with an fsync); waiting for this lock, rather than
    /// for the store's own, keeps the loop from ever waiting for that fsync.
    index_writes: Mutex<()>,
    /// Digests (config and layers) of pulls in flight, with how many pulls
    /// want each: GC leaves them, a pull may be about to record them.
    in_flight: RefCell<HashMap<String, usize>>,
    gc: GcPolicy,
    limits: PullLimits,
    /// Wakes GC: after each pull (a pull is what fills the disk) and when
    /// a pod went away (its images may be unused now).
    gc_tx: smol::channel::Sender<()>,
    gc_rx: smol::channel::Receiver<()>,
    /// Pinned images and pull progress, for `nanolet images`.
    status: RefCell<StoreStatus>,
    status_written: std::cell::Cell<Option<std::time::Instant>>,
}

const MAX_CONFIG: usize = 4 << 20;
/// How often the loop's lag is sampled while a pull runs: pulls are the
/// agent's heaviest work, and must not stall it.
const LAG_PROBE: std::time::Duration = std::time::Duration::from_millis(10);

/// Layers of one image downloaded at once, as containerd's default: more
/// gains little on one uplink and costs memory and flash writes at once.
const MAX_PARALLEL_DOWNLOADS: usize = 3;

/// How often one blob download is resumed after its connection broke, and
/// the first wait before that (doubling each time): a flaky uplink gets a
/// minute or so before the pull fails and the pod's backoff takes over.
const MAX_RESUMES: u32 = 5;
const RESUME_BACKOFF: std::time::Duration = std::time::Duration::from_secs(2);

fn pull_error(image: &str, message: String) -> ImageError {
    ImageError::Pull {
        image: image.to_owned(),
        message,
    }
}

/// A blob is what its descriptor says, or the pull fails.
fn verify(image: &str, desc: &Descriptor, digest: &str, size: u64) -> Result<(), ImageError> {
    if digest == desc.digest && size == desc.size {
        return Ok(());
    }
    Err(pull_error(
        image,
        format!(
            "blob {} failed verification: got {digest} ({size} of {} bytes)",
            desc.digest, desc.size
        ),
    ))
}

impl ImageService {
    pub fn new(registry: Registry, store: Store, gc: GcPolicy, limits: PullLimits) -> Self {
        let (gc_tx, gc_rx) = smol::channel::bounded(1);
        let service = ImageService {
            registry,
            store,
            platform: manifest::host_platform(),
            pulls: KeyedLocks::default(),
            layer_fetches: KeyedLocks::default(),
            unpack_slots: Semaphore::new(1),
            index_writes: Mutex::new(()),
            in_flight: RefCell::new(HashMap::new()),
            status: RefCell::new(StoreStatus {
                pinned: gc.pinned.iter().cloned().collect(),
                pulls: Default::default(),
            }),
            status_written: std::cell::Cell::new(None),
            gc,
            limits,
            gc_tx,
            gc_rx,
        };
        // What a previous run left says nothing about this one.
        service.write_status(true);
        service
    }

    /// Writes `status.json`: at once when `now`, else at most once a
    /// second. A small file without fsync: cheap enough for the loop.
    fn write_status(&self, now: bool) {
        let due = self
            .status_written
            .get()
            .is_none_or(|at| at.elapsed() >= PROGRESS_FILE_EVERY);
        if !(now || due) {
            return;
        }
        self.status_written.set(Some(std::time::Instant::now()));
        if let Err(e) = self.store.write_status(&self.status.borrow()) {
            log::warn!("{e}");
        }
    }

    /// Resolves when a GC pass is due besides the period: a pull completed
    /// or [`ImageService::wake_gc`] was called since the last call.
    pub async fn gc_wanted(&self) {
        let _ = self.gc_rx.recv().await;
    }

    pub fn wake_gc(&self) {
        let _ = self.gc_tx.try_send(());
    }

    /// The normalised form of an image name, as the store keys it.
    pub fn normalise(image: &str) -> Option<String> {
        Reference::parse(image).ok().map(|r| r.to_string())
    }

    /// Whether `image` is in the store (a bad name is not).
    pub fn is_present(&self, image: &str) -> bool {
        Self::normalise(image)
            .and_then(|key| self.store.record(&key).ok().flatten())
            .is_some()
    }

    /// The images in the store, by reference.
    pub fn records(&self) -> Result<std::collections::BTreeMap<String, ImageRecord>, StateError> {
        self.store.records()
    }

    /// The architecture as Kubernetes names it (GOARCH).
    pub fn architecture(&self) -> &str {
        &self.platform.architecture
    }

    /// Makes `image` present per `policy` and returns it.
    /// `auth` holds the pod's registry credentials (imagePullSecrets), by
    /// registry; only the image's own registry is sent them.
    pub async fn ensure(
        &self,
        image: &str,
        policy: PullPolicy,
        auth: &RegistryAuth,
    ) -> Result<Image, ImageError> {
        let reference = Reference::parse(image)?;
        let key = reference.to_string();
        let creds = auth::lookup(auth, &reference.registry);
        if policy != PullPolicy::Always
            && let Some(record) = self.store.record(&key)?
        {
            return self.image_from(record).await;
        }
        if policy == PullPolicy::Never {
            return Err(ImageError::NeverPull { image: key });
        }
        let started = std::time::Instant::now();
        let (reference, key) = (&reference, key.as_str());
        let record = self
            .pulls
            .run(key, |someone_pulling| async move {
                // The pull we waited for is as fresh as ours would be.
                match self.store.record(key)? {
                    Some(record) if someone_pulling => Ok(record),
                    _ => {
                        let (pulled, lag) =
                            crate::rt::with_lag_probe(self.pull(reference, key, creds), LAG_PROBE)
                                .await;
                        crate::stats::own::pull_finished(pulled.is_ok());
                        pulled.inspect(|record| {
                            log::info!(
                                "pulled {key} ({} bytes) in {:?}; event loop lag at most {:?}",
                                record.size,
                                started.elapsed(),
                                lag
                            );
                        })
                    }
                }
            })
            .await?;
        self.image_from(record).await
    }

    async fn image_from(&self, record: ImageRecord) -> Result<Image, ImageError> {
        let pull_err = |message: String| pull_error(&record.reference, message);
        let config_path = self
            .store
            .blob_path(&record.config_digest)
            .ok_or_else(|| pull_err("bad config digest".into()))?;
        let data = std::fs::read(&config_path)
            .map_err(|e| pull_err(format!("{}: {e}", config_path.display())))?;
        let config: ImageConfig =
            serde_json::from_slice(&data).map_err(|e| pull_err(format!("image config: {e}")))?;
        let layers = record
            .layers
            .iter()
            .map(|l| {
                self.store
                    .layer_path(l)
                    .ok_or_else(|| pull_err(format!("bad layer digest {l}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        {
            let _index = self.index_writes.lock().await;
            self.store.touch(&record.reference)?;
        }
        Ok(Image {
            id: record.config_digest.clone(),
            layers,
            config: config.config.unwrap_or_default(),
            size: record.size,
        })
    }

    async fn pull(
        &self,
        reference: &Reference,
        key: &str,
        creds: Option<&Credentials>,
    ) -> Result<ImageRecord, ImageError> {
        let registry_err = |source| ImageError::Registry {
            image: key.to_owned(),
            source,
        };
        let pull_err = |message: String| pull_error(key, message);
        let (body, content_type) = self
            .registry
            .manifest(reference, creds)
            .await
            .map_err(registry_err)?;
        let mut digest = sha256_digest(&body);
        if let Some(pinned) = &reference.digest
            && *pinned != digest
        {
            return Err(pull_err(format!(
                "manifest digest {digest} does not match {pinned}"
            )));
        }
        let mut document: Document =
            serde_json::from_slice(&body).map_err(|e| pull_err(format!("manifest: {e}")))?;
        if document.is_index(&content_type) {
            let entry = manifest::select_platform(&document.manifests, &self.platform).ok_or_else(
                || {
                    pull_err(format!(
                        "no manifest for platform {}/{}{}",
                        self.platform.os,
                        self.platform.architecture,
                        self.platform
                            .variant
                            .as_deref()
                            .map(|v| format!("/{v}"))
                            .unwrap_or_default()
                    ))
                },
            )?;
            let by_digest = Reference {
                digest: Some(entry.digest.clone()),
                tag: None,
                ..reference.clone()
            };
            let (body, _) = self
                .registry
                .manifest(&by_digest, creds)
                .await
                .map_err(registry_err)?;
            digest = sha256_digest(&body);
            if digest != entry.digest {
                return Err(pull_err(format!(
                    "manifest digest {digest} does not match {}",
                    entry.digest
                )));
            }
            document =
                serde_json::from_slice(&body).map_err(|e| pull_err(format!("manifest: {e}")))?;
        }
        if document.schema_version != 2 {
            return Err(pull_err(format!(
                "manifest schema version {} is not supported",
                document.schema_version
            )));
        }
        let config_desc = document
            .config
            .clone()
            .ok_or_else(|| pull_err("manifest has no config".into()))?;
        let config_bytes = self
            .fetch_small_blob(reference, key, creds, &config_desc)
            .await?;
        let config: ImageConfig = serde_json::from_slice(&config_bytes)
            .map_err(|e| pull_err(format!("image config: {e}")))?;
        if config.os != self.platform.os || config.architecture != self.platform.architecture {
            return Err(pull_err(format!(
                "image is for {}/{}, this node is {}/{}",
                config.os, config.architecture, self.platform.os, self.platform.architecture
            )));
        }
        let config_path = self
            .store
            .blob_path(&config_desc.digest)
            .ok_or_else(|| pull_err(format!("bad config digest {}", config_desc.digest)))?;

        let _in_flight = InFlight::new(
            &self.in_flight,
            document
                .layers
                .iter()
                .map(|l| l.digest.clone())
                .chain([config_desc.digest.clone()])
                .collect(),
        );
        let size: u64 = document.layers.iter().map(|l| l.size).sum();
        let missing: Vec<&Descriptor> = document
            .layers
            .iter()
            .filter(|l| !self.store.has_layer(&l.digest))
            .collect();
        let present: u64 = size - missing.iter().map(|l| l.size).sum::<u64>();
        let progress = Progress::start(self, key, present, size);
        let image_budget = std::cell::Cell::new(self.limits.image_bytes);
        let fetches = missing
            .into_iter()
            .map(
                |layer| -> crate::rt::LocalBoxFuture<'_, Result<(), ImageError>> {
                    Box::pin(self.fetch_layer_once(
                        reference,
                        key,
                        creds,
                        layer,
                        &progress,
                        &image_budget,
                    ))
                },
            )
            .collect();
        crate::rt::try_join_bounded(fetches, MAX_PARALLEL_DOWNLOADS).await?;
        // The config, then the record, only once every layer is in place.
        // fsync can take long on SD cards: off the loop.
        crate::helpers::unblock(move || {
            state::write_atomic(
                &config_path,
                &config_bytes,
                0o600,
                state::Durability::PowerLoss,
            )
        })
        .await?;
        let now = Timestamp::now();
        let record = ImageRecord {
            reference: key.to_owned(),
            manifest_digest: digest,
            config_digest: config_desc.digest.clone(),
            layers: document.layers.iter().map(|l| l.digest.clone()).collect(),
            size,
            pulled: now,
            last_used: now,
        };
        let store = self.store.clone();
        let saved = record.clone();
        {
            let _index = self.index_writes.lock().await;
            crate::helpers::unblock(move || store.put_record(saved)).await?;
        }
        self.wake_gc();
        Ok(record)
    }

    /// Opens a blob from byte `offset` on: from the descriptor's `urls`
    /// first (foreign layers; containerd's order), then from the registry,
    /// which may hold them as well.
    async fn open_blob(
        &self,
        reference: &Reference,
        key: &str,
        creds: Option<&Credentials>,
        desc: &Descriptor,
        offset: u64,
    ) -> Result<(http::Uri, hyper::body::Incoming, bool), ImageError> {
        for url in &desc.urls {
            match self.registry.blob_at(url, offset).await {
                Ok(opened) => return Ok(opened),
                Err(e) => log::warn!(
                    "{key}: blob {} from {url}: {e}; trying its next source",
                    desc.digest
                ),
            }
        }
        self.registry
            .blob(reference, &desc.digest, creds, offset)
            .await
            .map_err(|source| ImageError::Registry {
                image: key.to_owned(),
                source,
            })
    }

    async fn fetch_small_blob(
        &self,
        reference: &Reference,
        key: &str,
        creds: Option<&Credentials>,
        desc: &Descriptor,
    ) -> Result<Vec<u8>, ImageError> {
        let pull_err = |message: String| pull_error(key, message);
        if desc.size > MAX_CONFIG as u64 {
            return Err(pull_err(format!(
                "config blob of {} bytes is too large",
                desc.size
            )));
        }
        let (url, body, _) = self.open_blob(reference, key, creds, desc, 0).await?;
        let data = crate::http::read_body(&url, body, MAX_CONFIG)
            .await
            .map_err(|e| pull_err(e.to_string()))?;
        verify(key, desc, &sha256_digest(&data), data.len() as u64)?;
        Ok(data)
    }

    /// Fetches a layer unless another pull is fetching it: then waits for
    /// that one and fetches only if it failed.
    async fn fetch_layer_once(
        &self,
        reference: &Reference,
        key: &str,
        creds: Option<&Credentials>,
        desc: &Descriptor,
        progress: &Progress<'_>,
        image_budget: &std::cell::Cell<u64>,
    ) -> Result<(), ImageError> {
        self.layer_fetches
            .run(&desc.digest, |_| async move {
                if self.store.has_layer(&desc.digest) {
                    progress.advance(desc.size);
                    Ok(())
                } else {
                    self.fetch_layer(reference, key, creds, desc, progress, image_budget)
                        .await
                }
            })
            .await
    }

    /// Downloads a layer to `partial/` while hashing it (resuming it where
    /// a broken connection or an earlier run left it), verifies it, unpacks
    /// it off the loop and moves the result into place.
    async fn fetch_layer(
        &self,
        reference: &Reference,
        key: &str,
        creds: Option<&Credentials>,
        desc: &Descriptor,
        progress: &Progress<'_>,
        image_budget: &std::cell::Cell<u64>,
    ) -> Result<(), ImageError> {
        let pull_err = |message: String| pull_error(key, message);
        let final_path = self
            .store
            .layer_path(&desc.digest)
            .ok_or_else(|| pull_err(format!("bad layer digest {}", desc.digest)))?;
        // Kept when the download fails on the way (the next attempt, or the
        // next run of the agent, resumes it); removed once unpacked, or when
        // its content is wrong.
        let partial = self
            .store
            .partial_path(&desc.digest)
            .ok_or_else(|| pull_err(format!("bad layer digest {}", desc.digest)))?;
        self.download(reference, key, creds, desc, &partial, progress)
            .await?;
        let _slot = self.unpack_slots.acquire().await;
        // One unpack at a time: what the image's earlier layers used of its
        // budget is known here.
        let limits = unpack::Limits {
            max_bytes: self.limits.layer.max_bytes.min(image_budget.get()),
            ..self.limits.layer
        };
        let (blob_path, unpack_dir) = (partial, self.store.temp_path("layer"));
        // Unpack and move into place in one blocking task, so that an
        // abandoned pull cannot leave a half-unpacked dir behind it.
        let stats = crate::helpers::unblock(move || {
            let stats = unpack::unpack(&blob_path, &unpack_dir, limits);
            // A layer that does not unpack would not the next time either.
            let _ = std::fs::remove_file(&blob_path);
            let stats = match stats {
                Ok(stats) => stats,
                Err(e) => {
                    let _ = state::remove_tree(&unpack_dir);
                    return Err(e.to_string());
                }
            };
            if let Err(e) = std::fs::rename(&unpack_dir, &final_path) {
                // Another pull of an image sharing this layer won.
                let _ = state::remove_tree(&unpack_dir);
                if !final_path.is_dir() {
                    return Err(format!("{}: {e}", final_path.display()));
                }
            }
            Ok(stats)
        })
        .await
        .map_err(|e| pull_err(format!("layer {}: {e}", desc.digest)))?;
        if stats.skipped_devices > 0 {
            log::warn!(
                "{key}: layer {}: skipped {} device nodes",
                desc.digest,
                stats.skipped_devices
            );
        }
        image_budget.set(image_budget.get().saturating_sub(stats.bytes));
        Ok(())
    }

    async fn download(
        &self,
        reference: &Reference,
        key: &str,
        creds: Option<&Credentials>,
        desc: &Descriptor,
        path: &std::path::Path,
        progress: &Progress<'_>,
    ) -> Result<(), ImageError> {
        let pull_err = |message: String| pull_error(key, message);
        let io_err = |e: std::io::Error| pull_err(format!("{}: {e}", path.display()));
        // Where an earlier attempt, or an earlier run of the agent, stopped.
        let (hasher, mut received) = {
            let (path, size) = (path.to_owned(), desc.size);
            crate::helpers::unblock(move || hash_partial(&path, size)).await
        };
        if received > 0 {
            log::info!(
                "{key}: blob {} resumes at {received} of {} bytes",
                desc.digest,
                desc.size
            );
            progress.advance(received);
        }
        // Appending: a restart from zero truncates, and writes follow.
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err)?;
        // async-fs would buffer up to 8 MiB per file on its way to the
        // disk; a small board downloading three layers cannot spare that.
        let mut file = BlobWriter::start(HashingFile::new(opened, hasher));
        let mut resumes = 0;
        let backoff = |resumes: u32| RESUME_BACKOFF * 2u32.pow(resumes - 1);
        while received < desc.size {
            let opened = self.open_blob(reference, key, creds, desc, received).await;
            let (url, mut body, continues) = match opened {
                Ok(opened) => opened,
                // The registry unreachable or overloaded for a moment.
                Err(ImageError::Registry { source, .. })
                    if resumes < MAX_RESUMES && source.is_transient() =>
                {
                    resumes += 1;
                    log::warn!(
                        "{key}: blob {}: {source}; trying again in {:?}",
                        desc.digest,
                        backoff(resumes)
                    );
                    smol::Timer::after(backoff(resumes)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !continues {
                // The whole blob again: start over.
                progress.rewind(received);
                file.start_over().await.map_err(io_err)?;
                received = 0;
            }
            let broke = loop {
                match next_chunk(&url, &mut body).await {
                    Ok(Some(chunk)) => {
                        received += chunk.len() as u64;
                        if received > desc.size {
                            drop(file);
                            let _ = std::fs::remove_file(path);
                            return Err(pull_err(format!(
                                "blob {} is larger than its declared {} bytes",
                                desc.digest, desc.size
                            )));
                        }
                        file.write(&chunk).await.map_err(io_err)?;
                        progress.advance(chunk.len() as u64);
                    }
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            match broke {
                None => break,
                // A reset or a stall on a flaky link: the bytes so far are
                // kept and the rest asked for with a Range request.
                Some(e) if resumes < MAX_RESUMES && received < desc.size => {
                    resumes += 1;
                    let delay = backoff(resumes);
                    log::warn!(
                        "{key}: blob {} broke off at {received} of {} bytes ({e}); resuming in {delay:?}",
                        desc.digest,
                        desc.size
                    );
                    smol::Timer::after(delay).await;
                }
                Some(e) => return Err(pull_err(e.to_string())),
            }
        }
        let hasher = file.finish().await.map_err(io_err)?;
        let digest = format!("sha256:{}", hex(&hasher.finalize()));
        verify(key, desc, &digest, received).inspect_err(|_| {
            // Wrong bytes: nothing to resume from.
            let _ = std::fs::remove_file(path);
        })?;
        Ok(())
    }
}
