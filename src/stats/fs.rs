//! Size, free space and inodes of a filesystem (statfs): for node
//! capacity and pressure, image GC and the Summary API alike.

use std::path::Path;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    /// Free to an unprivileged user (what the upstream kubelet counts).
    pub available: u64,
    /// Free, the blocks reserved for root included.
    pub free: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

impl FsUsage {
    /// The filesystem holding `path`.
    pub fn of(path: &Path) -> std::io::Result<FsUsage> {
        let s = nix::sys::statvfs::statvfs(path)?;
        let unit = s.fragment_size() as u64;
        Ok(FsUsage {
            capacity: s.blocks() as u64 * unit,
            available: s.blocks_available() as u64 * unit,
            free: s.blocks_free() as u64 * unit,
            inodes: s.files() as u64,
            inodes_free: s.files_available() as u64,
        })
    }

    /// Upstream's usage: 100 − available·100/capacity, in whole percent.
    pub fn percent(&self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        100 - (self.available.saturating_mul(100) / self.capacity).min(100)
    }
}
