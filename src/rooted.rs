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
    match retry_eagain(|| openat2(root.as_fd(), relative, how)) {
        Err(Errno::ENOSYS) => walk(root, relative, flags, Links::Refuse),
        other => other,
    }
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
    let how = OpenHow::new()
        .flags(how_flags())
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = match retry_eagain(|| openat2(&dir, path, how)) {
        Err(Errno::ENOSYS) => walk(&dir, path, how_flags(), Links::InRoot),
        other => other,
    }
    .map_err(|e| io_err(e.into()))?;
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

/// How a file in a root is read. O_NONBLOCK: opening a FIFO must not wait
/// for a writer.
fn how_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC
}

/// What the walk does with a symlink on the way.
#[derive(Clone, Copy, PartialEq)]
enum Links {
    /// Fail with ELOOP, as RESOLVE_NO_SYMLINKS.
    Refuse,
    /// Resolve it with the root as `/`, as RESOLVE_IN_ROOT.
    InRoot,
}

/// Linux's limit on links followed in one lookup.
const MAX_LINKS: usize = 40;

/// openat2's resolution done by hand, one element at a time with
/// O_NOFOLLOW, for kernels before 5.6 (and qemu-user) that lack it. `..`
/// never goes above the root; a link is refused or resolved inside it. A
/// file swapped for a link between the look and the open fails (ELOOP):
/// the final open does not follow either.
fn walk(root: &impl AsFd, path: &Path, flags: OFlag, links: Links) -> nix::Result<OwnedFd> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Component;

    let elements = |p: &Path| -> Vec<OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_owned()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    };
    if links == Links::Refuse && path.is_absolute() {
        return Err(Errno::EXDEV);
    }
    let path_only = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut dirs = vec![nix::fcntl::openat(
        root,
        ".",
        path_only | OFlag::O_DIRECTORY,
        Mode::empty(),
    )?];
    let mut pending: VecDeque<OsString> = elements(path).into();
    let mut followed = 0;
    while let Some(name) = pending.pop_front() {
        if name.as_bytes() == b".." {
            if links == Links::Refuse {
                return Err(Errno::EXDEV);
            }
            if dirs.len() > 1 {
                dirs.pop();
            }
            continue;
        }
        let Some(parent) = dirs.last() else {
            return Err(Errno::ENOENT);
        };
        let found = nix::fcntl::openat(parent, name.as_os_str(), path_only, Mode::empty())?;
        let stat = nix::sys::stat::fstat(&found)?;
        if stat.st_mode & libc::S_IFMT == libc::S_IFLNK {
            if links == Links::Refuse {
                return Err(Errno::ELOOP);
            }
            followed += 1;
            if followed > MAX_LINKS {
                return Err(Errno::ELOOP);
            }
            let target = PathBuf::from(nix::fcntl::readlinkat(parent, name.as_os_str())?);
            if target.is_absolute() {
                dirs.truncate(1);
            }
            for element in elements(&target).into_iter().rev() {
                pending.push_front(element);
            }
            continue;
        }
        if pending.is_empty() {
            return nix::fcntl::openat(
                parent,
                name.as_os_str(),
                flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            );
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        dirs.push(found);
    }
    // The root itself.
    nix::fcntl::openat(root, ".", flags | OFlag::O_CLOEXEC, Mode::empty())
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
        // The walk for kernels without openat2 resolves the same way.
        let dir =
            nix::fcntl::open(&root, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let walked = |p: &str| {
            let fd = walk(&dir, Path::new(p), how_flags(), Links::InRoot)?;
            let mut text = String::new();
            File::from(fd)
                .read_to_string(&mut text)
                .map_err(|_| Errno::EIO)?;
            Ok::<_, Errno>(text)
        };
        assert_eq!(walked("/etc/abs").unwrap(), "inside");
        assert_eq!(walked("etc/up").unwrap(), "inside");
        assert_eq!(
            walked("/etc/../etc/./passwd").unwrap(),
            "root:x:0:0::/:/bin/sh\n"
        );
        assert_eq!(walked("/etc/zero"), Err(Errno::ENOENT));
        std::os::unix::fs::symlink("loop2", root.join("etc/loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", root.join("etc/loop2")).unwrap();
        assert_eq!(walked("/etc/loop1"), Err(Errno::ELOOP));
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
        let by_walk = |p: &str| walk(&root, Path::new(p), flags, Links::Refuse);
        type Open<'a> = &'a dyn Fn(&str) -> nix::Result<OwnedFd>;
        let opens: [Open; 2] = [&|p| open_beneath(&root, Path::new(p), flags), &by_walk];
        for open in opens {
            assert!(open("a/b").is_ok());
            assert!(open("link/b").is_err());
            assert!(open("link").is_err());
            assert!(open("../x").is_err());
            assert!(open("/etc").is_err());
        }
    }
}
