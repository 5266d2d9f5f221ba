//! subPath volume mounts without the check-then-mount race, as upstream's
//! kubelet does them: the path is resolved (links that stay inside the
//! volume are fine: ConfigMap keys are links into `..data`), checked to be
//! inside the volume, missing directories are created, and then it is
//! opened again one component at a time without following any link and
//! bind-mounted through that file descriptor into the container's bundle.
//! The runtime mounts that bind mount: a link the container swaps in
//! afterwards changes nothing, and one swapped in between resolving and
//! opening makes the open fail.

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
    let found = resolve_beneath(root, sub).map_err(&fail)?;
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

/// Creates what is missing of `sub` beneath `root`, as [`pin`] would: for a
/// volume the container sees through an ID-mapped mount, which the agent,
/// whose root the mapping does not cover, cannot create files through.
pub fn create_missing(root: &Path, sub: &str) -> Result<(), SubPathError> {
    resolve_beneath(root, sub)
        .map(drop)
        .map_err(|reason| SubPathError {
            sub_path: sub.to_owned(),
            reason,
        })
}

fn is(stat: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == kind
}

/// An `O_PATH` descriptor of `sub` inside `root`, creating what is missing.
fn resolve_beneath(root: &Path, sub: &str) -> Result<OwnedFd, String> {
    let mut parts = Vec::new();
    for part in Path::new(sub).components() {
        let Component::Normal(part) = part else {
            return Err("must be a relative path without '..'".into());
        };
        parts.push(part);
    }
    // The volume's own path is the admin's or the agent's: its links count.
    let base = fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    // What exists of the path, resolved, must stay inside the volume.
    let existing = (0..=parts.len())
        .rev()
        .find(|&n| fs::symlink_metadata(base.join(parts[..n].iter().collect::<PathBuf>())).is_ok())
        .unwrap_or(0);
    let prefix = base.join(parts[..existing].iter().collect::<PathBuf>());
    let resolved = fs::canonicalize(&prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
    let inside = resolved.strip_prefix(&base).map_err(|_| {
        format!(
            "{} is not within the volume {}",
            prefix.display(),
            base.display()
        )
    })?;
    let path_only = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut current = nix::fcntl::open(&base, path_only | OFlag::O_DIRECTORY, Mode::empty())
        .map_err(|e| format!("{}: {e}", base.display()))?;
    let mut walked = base.clone();
    let resolved_parts = inside.components().map(|c| c.as_os_str().to_owned());
    let missing = parts[existing..].iter().map(|p| p.to_os_string());
    for (i, part) in resolved_parts.chain(missing).enumerate() {
        walked.push(&part);
        let at = |fd: &OwnedFd| openat(fd, part.as_os_str(), path_only, Mode::empty());
        let next = match at(&current) {
            Err(nix::errno::Errno::ENOENT) if i >= inside.components().count() => {
                match mkdirat(&current, part.as_os_str(), Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(format!("{}: {e}", walked.display())),
                }
                at(&current)
            }
            other => other,
        }
        .map_err(|e| format!("{}: {e}", walked.display()))?;
        let stat = fstat(&next).map_err(|e| format!("{}: {e}", walked.display()))?;
        // Resolved just before: a link here was swapped in since.
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
    use std::os::unix::fs::symlink;

    #[test]
    fn pinned_where_it_was_found_and_never_outside_the_volume() {
        // Unmounts and removes everything, also when an assertion fails.
        let dir = crate::state::TestDir::new("subpath");
        let dir = &dir.0;
        let volume = dir.join("volume");
        fs::create_dir_all(&volume).unwrap();
        fs::write(dir.join("outside"), "host secret").unwrap();
        let bundle = dir.join("bundle");

        pin(&volume, "a/b", &bundle.join("0")).unwrap();
        assert!(volume.join("a/b").is_dir());
        // Mounted: a file written through the target lands in the volume.
        fs::write(bundle.join("0/x"), "in").unwrap();
        assert!(volume.join("a/b/x").exists());
        // Swapping the directory for a link now changes nothing mounted.
        fs::rename(volume.join("a"), volume.join("moved")).unwrap();
        symlink(dir, volume.join("a")).unwrap();
        assert_eq!(fs::read_to_string(bundle.join("0/x")).unwrap(), "in");

        // Links the container planted, out of the volume: refused.
        symlink(dir, volume.join("escape")).unwrap();
        let err = pin(&volume, "escape/outside", &bundle.join("1")).unwrap_err();
        assert!(err.reason.contains("is not within the volume"), "{err}");
        symlink("../outside", volume.join("up")).unwrap();
        assert!(pin(&volume, "up", &bundle.join("2")).is_err());
        assert!(pin(&volume, "../outside", &bundle.join("2")).is_err());
        assert!(!bundle.join("1").exists() && !bundle.join("2").exists());

        // A ConfigMap's layout: keys are links into ..data, inside.
        fs::create_dir_all(volume.join("..data")).unwrap();
        fs::write(volume.join("..data/greeting"), "hello").unwrap();
        symlink("..data/greeting", volume.join("greeting")).unwrap();
        pin(&volume, "greeting", &bundle.join("3")).unwrap();
        assert_eq!(fs::read_to_string(bundle.join("3")).unwrap(), "hello");

        // The volume's own path may be a link (a hostPath like /var/run).
        symlink(&volume, dir.join("volume-link")).unwrap();
        pin(&dir.join("volume-link"), "moved/b", &bundle.join("4")).unwrap();
        assert_eq!(fs::read_to_string(bundle.join("4/x")).unwrap(), "in");
    }
}
