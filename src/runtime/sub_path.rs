//! subPath volume mounts without the check-then-mount race: the path is
//! opened beneath the volume one component at a time, never through a
//! symlink (volumes are the container's to write, and a link it planted must
//! lead neither the agent nor the runtime out of them), missing directories
//! are created on the way, and what was opened is bind-mounted through its
//! file descriptor into the container's bundle. The runtime mounts that bind
//! mount: a link swapped in afterwards changes nothing, as with upstream's
//! kubelet, which binds through an fd too.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, mkdirat};

use crate::mount;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("subPath {sub_path:?}: {reason}")]
pub struct SubPathError {
    pub sub_path: String,
    pub reason: String,
}

/// Resolves `sub` beneath `root` and bind-mounts it at `target` (made a
/// directory or an empty file to match). `target` is under the bundle,
/// whose removal unmounts it.
pub fn pin(root: &Path, sub: &str, target: &Path) -> Result<(), SubPathError> {
    let fail = |reason: String| SubPathError {
        sub_path: sub.to_owned(),
        reason,
    };
    let found = open_beneath(root, sub).map_err(&fail)?;
    let stat = fstat(&found).map_err(|e| fail(e.to_string()))?;
    let made = if is(&stat, SFlag::S_IFDIR) {
        fs::create_dir_all(target)
    } else {
        target
            .parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| fs::File::create(target).map(drop))
    };
    made.map_err(|e| fail(format!("{}: {e}", target.display())))?;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", found.as_raw_fd()));
    mount::bind(&by_fd, target).map_err(|e| fail(e.to_string()))
}

fn is(stat: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == kind
}

fn open_beneath(root: &Path, sub: &str) -> Result<OwnedFd, String> {
    let path_only = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut current = nix::fcntl::open(root, path_only | OFlag::O_DIRECTORY, Mode::empty())
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let mut walked = root.to_owned();
    for part in Path::new(sub).components() {
        let Component::Normal(part) = part else {
            return Err("must be a relative path without '..'".into());
        };
        walked.push(part);
        let at = |fd: &OwnedFd| openat(fd, part, path_only, Mode::empty());
        let next = match at(&current) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => {
                match mkdirat(&current, part, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(format!("{}: {e}", walked.display())),
                }
                at(&current).map_err(|e| format!("{}: {e}", walked.display()))?
            }
            Err(e) => return Err(format!("{}: {e}", walked.display())),
        };
        let stat = fstat(&next).map_err(|e| format!("{}: {e}", walked.display()))?;
        if is(&stat, SFlag::S_IFLNK) {
            return Err(format!("{} is a symlink", walked.display()));
        }
        current = next;
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_where_it_was_found_and_never_through_links() {
        let dir = std::env::temp_dir().join(format!("nanolet-subpath-{}", std::process::id()));
        let volume = dir.join("volume");
        fs::create_dir_all(&volume).unwrap();
        fs::write(dir.join("outside"), "host secret").unwrap();
        let made = pin(&volume, "a/b", &dir.join("bundle/0"));
        let is_dir = volume.join("a/b").is_dir();
        // Mounted: a file written through the target lands in the volume.
        let through =
            fs::write(dir.join("bundle/0/x"), "in").map(|()| volume.join("a/b/x").exists());
        // Swapping the directory for a link now changes nothing mounted.
        let _ = fs::rename(volume.join("a"), volume.join("moved"));
        let _ = std::os::unix::fs::symlink(&dir, volume.join("a"));
        let still = fs::read_to_string(dir.join("bundle/0/x")).ok();
        // A link the container planted, to the host.
        std::os::unix::fs::symlink(&dir, volume.join("escape")).unwrap();
        let through_link = pin(&volume, "escape/outside", &dir.join("bundle/1"));
        let up = pin(&volume, "../outside", &dir.join("bundle/2"));
        // A file: the target is a file too.
        fs::write(volume.join("moved/conf"), "c").unwrap();
        let file = pin(&volume, "moved/conf", &dir.join("bundle/3"));
        let file_read = fs::read_to_string(dir.join("bundle/3")).ok();
        // Unmounted and removed before asserting: nothing may be left.
        for target in ["bundle/0", "bundle/3"] {
            let _ = mount::unmount(&dir.join(target));
        }
        fs::remove_dir_all(&dir).unwrap();
        made.unwrap();
        assert!(is_dir);
        assert!(through.unwrap());
        assert_eq!(still.as_deref(), Some("in"));
        let err = through_link.unwrap_err();
        assert!(err.reason.contains("is a symlink"), "{err}");
        assert!(up.is_err());
        file.unwrap();
        assert_eq!(file_read.as_deref(), Some("c"));
    }
}
