//! How much disk a directory takes, as upstream's kubelet measures volumes
//! (`du -x -s -B 1`): allocated blocks, not apparent sizes, each hard-linked
//! file once, nothing on other filesystems, symlinks not followed. A walk of
//! the tree: callers run it off the event loop.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};

#[derive(Debug, thiserror::Error)]
#[error("measuring {path}: {source}")]
pub struct DiskUsageError {
    pub path: PathBuf,
    pub source: nix::Error,
}

/// Bytes allocated under `root` (itself included). The walk goes by file
/// descriptor and never follows a link: the tree is a container's to
/// change while it is measured.
pub fn disk_usage(root: &Path) -> Result<u64, DiskUsageError> {
    dir_usage(root).map(|u| u.bytes)
}

/// What a tree takes: allocated bytes, and inodes (each hard-linked file
/// once), as the Summary API's `usedBytes` and `inodesUsed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// [`disk_usage`] with the inodes counted too.
pub fn dir_usage(root: &Path) -> Result<DirUsage, DiskUsageError> {
    let fail = |path: &Path| {
        let path = path.to_owned();
        move |source| DiskUsageError { path, source }
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let top = nix::fcntl::open(root, flags, Mode::empty()).map_err(fail(root))?;
    let top_stat = fstat(&top).map_err(fail(root))?;
    let device = top_stat.st_dev;
    let mut seen_links = HashSet::new();
    let mut total = allocated(&top_stat);
    let mut inodes = 1;
    let mut pending: Vec<(OwnedFd, PathBuf)> = vec![(top, root.to_owned())];
    while let Some((fd, path)) = pending.pop() {
        let mut dir = Dir::from_fd(fd).map_err(fail(&path))?;
        let names: Vec<std::ffi::CString> = dir
            .iter()
            .flatten()
            .map(|entry| entry.file_name().to_owned())
            .filter(|name| name.to_bytes() != b"." && name.to_bytes() != b"..")
            .collect();
        let mut subdirs = Vec::new();
        for name in names {
            // Gone meanwhile, or unreadable: not counted.
            let Ok(stat) = fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            if stat.st_dev != device {
                continue;
            }
            let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
            if stat.st_nlink > 1 && !is_dir && !seen_links.insert(stat.st_ino) {
                continue;
            }
            total += allocated(&stat);
            inodes += 1;
            if is_dir {
                subdirs.push(name);
            }
        }
        for name in subdirs {
            let sub_path = path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            match openat(&dir, name.as_c_str(), flags, Mode::empty()) {
                Ok(sub) => pending.push((sub, sub_path)),
                // Swapped for a link, or removed, since it was listed.
                Err(
                    nix::errno::Errno::ELOOP
                    | nix::errno::Errno::ENOTDIR
                    | nix::errno::Errno::ENOENT,
                ) => {}
                Err(e) => return Err(fail(&sub_path)(e)),
            }
        }
    }
    Ok(DirUsage {
        bytes: total,
        inodes,
    })
}

fn allocated(stat: &FileStat) -> u64 {
    u64::try_from(stat.st_blocks).unwrap_or(0) * 512
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_allocated_blocks_and_hard_links_once() {
        let dir = std::env::temp_dir().join(format!("nanolet-du-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let empty = disk_usage(&dir);
        std::fs::write(dir.join("sub/data"), vec![7u8; 256 * 1024]).unwrap();
        std::fs::hard_link(dir.join("sub/data"), dir.join("again")).unwrap();
        std::os::unix::fs::symlink("/usr", dir.join("link")).unwrap();
        // A sparse file: large, nearly nothing allocated.
        std::fs::File::create(dir.join("sparse"))
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let full = disk_usage(&dir);
        let inodes = dir_usage(&dir).map(|u| u.inodes);
        std::fs::remove_dir_all(&dir).unwrap();
        // The dir, sub, the file (once for its two names), link, sparse.
        assert_eq!(inodes.unwrap(), 5);
        let (empty, full) = (empty.unwrap(), full.unwrap());
        let grown = full - empty;
        assert!(
            (256 * 1024..300 * 1024).contains(&grown),
            "{grown} bytes for one 256 KiB file linked twice"
        );
    }
}
