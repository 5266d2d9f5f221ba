//! A blob on its way to the disk: written and hashed on a helper thread,
//! resumed from what an interrupted download left.

use sha2::{Digest, Sha256};

use crate::state::hex;

/// What a blob download holds on its way to the disk: batches of this
/// size, copied out of hyper's buffers (a chunk can pin a read buffer of
/// hundreds of KiB), and this many of them queued: 256 KiB at most.
pub(super) const WRITE_BATCH: usize = 64 << 10;
pub(super) const WRITE_QUEUE: usize = 3;

pub(super) enum WriteOp {
    Chunk(Vec<u8>),
    /// The registry sends the whole blob again: the file and hash restart.
    StartOver,
}

/// A blob's writes and hashing on a helper thread, fed through a bounded
/// queue: the loop neither writes nor hashes, and a slow disk holds back
/// the download rather than filling memory.
pub(super) struct BlobWriter {
    ops: Option<smol::channel::Sender<WriteOp>>,
    job: smol::Task<std::io::Result<HashingFile>>,
    batch: Vec<u8>,
}

impl BlobWriter {
    pub(super) fn start(mut file: HashingFile) -> BlobWriter {
        let (ops, queue) = smol::channel::bounded(WRITE_QUEUE);
        let job = crate::rt::spawn(crate::helpers::unblock(move || {
            while let Ok(op) = queue.recv_blocking() {
                match op {
                    WriteOp::Chunk(bytes) => std::io::Write::write_all(&mut file, &bytes)?,
                    WriteOp::StartOver => {
                        file.file.set_len(0)?;
                        file.hasher = Sha256::new();
                    }
                }
            }
            Ok(file)
        }));
        BlobWriter {
            ops: Some(ops),
            job,
            batch: Vec::with_capacity(WRITE_BATCH),
        }
    }

    pub(super) async fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.batch.extend_from_slice(chunk);
        if self.batch.len() < WRITE_BATCH {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.batch, Vec::with_capacity(WRITE_BATCH));
        self.send(WriteOp::Chunk(full)).await
    }

    /// The file and hash start over (what is still batched goes too).
    pub(super) async fn start_over(&mut self) -> std::io::Result<()> {
        self.batch.clear();
        self.send(WriteOp::StartOver).await
    }

    pub(super) async fn send(&mut self, op: WriteOp) -> std::io::Result<()> {
        let sent = match &self.ops {
            Some(ops) => ops.send(op).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The helper stopped taking writes: it failed, and says why.
        self.ops = None;
        match (&mut self.job).await {
            Err(e) => Err(e),
            Ok(_) => Err(std::io::Error::other("the blob writer stopped")),
        }
    }

    /// Everything written: the hash of what the file holds.
    pub(super) async fn finish(mut self) -> std::io::Result<Sha256> {
        if !self.batch.is_empty() {
            let last = std::mem::take(&mut self.batch);
            self.send(WriteOp::Chunk(last)).await?;
        }
        self.ops = None;
        Ok(self.job.await?.hasher)
    }
}

/// A blob's file, hashed as it is written: on the writer's thread, not
/// the loop (hashing megabytes a second is the largest work of a pull).
pub(super) struct HashingFile {
    file: std::fs::File,
    hasher: Sha256,
}

impl HashingFile {
    /// Appends to `file`, whose bytes so far `hasher` has seen.
    pub(super) fn new(file: std::fs::File, hasher: Sha256) -> HashingFile {
        HashingFile { file, hasher }
    }
}

impl std::io::Write for HashingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The hash and length of what an interrupted download of a blob of `size`
/// bytes left at `path`: nothing if there is none or it is longer.
pub(super) fn hash_partial(path: &std::path::Path, size: u64) -> (Sha256, u64) {
    let mut hasher = Sha256::new();
    let Ok(mut file) = std::fs::File::open(path) else {
        return (hasher, 0);
    };
    match file.metadata() {
        Ok(m) if m.len() <= size => {}
        _ => {
            let _ = std::fs::remove_file(path);
            return (hasher, 0);
        }
    }
    match std::io::copy(&mut file, &mut hasher) {
        Ok(len) => (hasher, len),
        Err(_) => {
            let _ = std::fs::remove_file(path);
            (Sha256::new(), 0)
        }
    }
}

pub(super) fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}
