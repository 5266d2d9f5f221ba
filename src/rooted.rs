//! Files in trees the agent does not control: an image's layers and
//! rootfs, a container's volumes. A link or a `..` there must resolve
//! inside the tree, as it would for the container, never on the host; a
//! file read from there may be a FIFO, a device or endless, so it is read
//! only when regular, without blocking on open, and up to a cap.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

#[derive(Debug, thiserror::Error)]
pub enum RootedError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a regular file")]
    NotRegular { path: PathBuf },
    #[error("{path}: larger than {cap} bytes")]
    TooLarge { path: PathBuf, cap: u64 },
}

impl RootedError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, RootedError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Opens `relative` below the directory `root`, refusing any symlink on
/// the way and any `..` above `root`: for paths the agent itself made
/// there and expects to find unchanged.
pub fn open_beneath(root: &impl AsFd, relative: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    retry_eagain(|| openat2(root.as_fd(), relative, how))
}

/// The contents of `path` (absolute or not) as seen from inside `root`:
/// links resolve with `root` as `/`, magic links (`/proc/self/...`) are
/// refused, and only a regular file of at most `cap` bytes is read.
pub fn read_in_root(root: &Path, path: &Path, cap: u64) -> Result<Vec<u8>, RootedError> {
    let shown = || root.join(path.strip_prefix("/").unwrap_or(path));
    let io_err = |source: io::Error| RootedError::Io {
        path: shown(),
        source,
    };
    let dir = nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(e.into()))?;
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = retry_eagain(|| openat2(&dir, path, how)).map_err(|e| io_err(e.into()))?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(RootedError::NotRegular { path: shown() });
    }
    let mut data = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(io_err)?;
    if data.len() as u64 > cap {
        return Err(RootedError::TooLarge { path: shown(), cap });
    }
    Ok(data)
}

/// openat2 fails with EAGAIN when a rename raced the lookup; it is safe to
/// try again, a few times.
fn retry_eagain(mut open: impl FnMut() -> nix::Result<OwnedFd>) -> nix::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match open() {
            Err(Errno::EAGAIN) if tries < 8 => tries += 1,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn reads_resolve_inside_the_root_and_only_regular_capped_files() {
        let dir = crate::state::TestDir::new("rooted");
        let root = dir.0.join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(dir.0.join("host-secret"), "host").unwrap();
        fs::write(root.join("host-secret"), "inside").unwrap();
        fs::write(root.join("etc/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
        symlink("/host-secret", root.join("etc/abs")).unwrap();
        symlink("../../../../host-secret", root.join("etc/up")).unwrap();
        symlink("/dev/zero", root.join("etc/zero")).unwrap();
        symlink("/proc/self/root/etc/hostname", root.join("etc/magic")).unwrap();
        nix::unistd::mkfifo(&root.join("etc/fifo"), Mode::from_bits_truncate(0o644)).unwrap();

        let read = |p: &str| read_in_root(&root, Path::new(p), 64);
        assert_eq!(read("/etc/passwd").unwrap(), b"root:x:0:0::/:/bin/sh\n");
        assert_eq!(read("/etc/abs").unwrap(), b"inside");
        assert_eq!(read("etc/up").unwrap(), b"inside");
        assert!(read("/etc/zero").unwrap_err().is_not_found());
        assert!(read("/etc/magic").is_err());
        assert!(matches!(
            read("/etc/fifo"),
            Err(RootedError::NotRegular { .. })
        ));
        fs::write(root.join("etc/big"), vec![b'x'; 65]).unwrap();
        assert!(matches!(
            read("/etc/big"),
            Err(RootedError::TooLarge { cap: 64, .. })
        ));
        fs::write(root.join("etc/exact"), vec![b'x'; 64]).unwrap();
        assert_eq!(read("/etc/exact").unwrap().len(), 64);
    }

    #[test]
    fn opening_beneath_refuses_links_and_escapes() {
        let dir = crate::state::TestDir::new("rooted");
        fs::create_dir_all(dir.0.join("a/b")).unwrap();
        symlink("a", dir.0.join("link")).unwrap();
        let root =
            nix::fcntl::open(&dir.0, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        assert!(open_beneath(&root, Path::new("a/b"), flags).is_ok());
        assert!(open_beneath(&root, Path::new("link/b"), flags).is_err());
        assert!(open_beneath(&root, Path::new("link"), flags).is_err());
        assert!(open_beneath(&root, Path::new("../x"), flags).is_err());
        assert!(open_beneath(&root, Path::new("/etc"), flags).is_err());
    }
}
