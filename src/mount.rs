//! Every mount and unmount the agent makes: container root filesystems
//! (overlayfs), namespace bind mounts and volume bind mounts. Teardown is
//! idempotent: unmounting what is not mounted succeeds.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};

#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct MountError {
    pub what: &'static str,
    pub path: PathBuf,
    pub source: Errno,
}

/// Mounts an overlay of `lower` (bottom first) with a writable `upper` at
/// `target`.
pub fn overlay(
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), MountError> {
    // overlayfs lists lower dirs top first.
    let lowers: Vec<String> = lower
        .iter()
        .rev()
        .map(|p| p.to_string_lossy().replace(',', "\\,").replace(':', "\\:"))
        .collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowers.join(":"),
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(|source| MountError {
        what: "mounting overlay on",
        path: target.to_owned(),
        source,
    })
}

/// Mounts a fresh tmpfs on `target` (which must exist): volumes whose
/// content must never reach persistent storage (Secrets, tokens).
pub fn tmpfs(target: &Path) -> Result<(), MountError> {
    tmpfs_with(target, "mode=0755")
}

/// A tmpfs with its own options (`mode=`, `size=`).
pub fn tmpfs_with(target: &Path, options: &str) -> Result<(), MountError> {
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options),
    )
    .map_err(|e| MountError {
        what: "mounting tmpfs on",
        path: target.to_owned(),
        source: e,
    })
}

/// Bind-mounts `source` on `target` (which must exist).
pub fn bind(source: &Path, target: &Path) -> Result<(), MountError> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| MountError {
        what: "bind-mounting on",
        path: target.to_owned(),
        source: e,
    })
}

/// Bind-mounts `source` on `target` (which must exist) with the ID mapping
/// of the user namespace `user_ns` (a `/proc/<pid>/ns/user` or a bind
/// mount of one): what is owned by 0 on disk shows as owned by the
/// namespace's root. Needs kernel 5.12, and a filesystem that supports it.
pub fn bind_idmapped(source: &Path, target: &Path, user_ns: &Path) -> Result<(), MountError> {
    let ns = std::fs::File::open(user_ns).map_err(|e| MountError {
        what: "opening user namespace",
        path: user_ns.to_owned(),
        source: io_errno(&e),
    })?;
    let tree = open_tree(source)?;
    idmap(&tree, ns.as_fd(), source)?;
    let target_c = c_path(target)?;
    // Safety: a plain syscall on an owned fd and a NUL-terminated path.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target_c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if moved < 0 {
        return Err(last_error("attaching an ID-mapped mount on", target));
    }
    Ok(())
}

/// Whether the filesystem at `dir`, and tmpfs, can be ID-mapped into the
/// user namespace `user_ns`: tried on detached mounts, which vanish with
/// their fds, so nothing is left mounted.
pub fn can_idmap(dir: &Path, user_ns: BorrowedFd) -> Result<(), MountError> {
    idmap(&open_tree(dir)?, user_ns, dir)?;
    let tmpfs = Path::new("tmpfs");
    // Safety: plain syscalls on NUL-terminated strings; every fd returned
    // is owned right away.
    let context =
        unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), libc::FSOPEN_CLOEXEC) };
    if context < 0 {
        return Err(last_error("opening a new", tmpfs));
    }
    let context = unsafe { OwnedFd::from_raw_fd(context as i32) };
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if created < 0 {
        return Err(last_error("creating a new", tmpfs));
    }
    let mounted = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            0,
        )
    };
    if mounted < 0 {
        return Err(last_error("mounting a new", tmpfs));
    }
    let mounted = unsafe { OwnedFd::from_raw_fd(mounted as i32) };
    idmap(&mounted, user_ns, tmpfs)
}

/// A detached copy of the mount at `source`.
fn open_tree(source: &Path) -> Result<OwnedFd, MountError> {
    let source_c = c_path(source)?;
    // Safety: a plain syscall on a NUL-terminated path; the fd returned is
    // owned right away.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source_c.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
        )
    };
    if tree < 0 {
        return Err(last_error("cloning the mount of", source));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(tree as i32) })
}

/// Gives the detached mount `tree` (of `source`) the ID mapping of
/// `user_ns`.
fn idmap(tree: &OwnedFd, user_ns: BorrowedFd, source: &Path) -> Result<(), MountError> {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: user_ns.as_raw_fd() as u64,
    };
    // Safety: a plain syscall on owned fds and a struct of the size given.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if set < 0 {
        return Err(last_error("ID-mapping the mount of", source));
    }
    Ok(())
}

fn c_path(path: &Path) -> Result<std::ffi::CString, MountError> {
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| MountError {
        what: "a NUL byte in",
        path: path.to_owned(),
        source: Errno::EINVAL,
    })
}

fn last_error(what: &'static str, path: &Path) -> MountError {
    MountError {
        what,
        path: path.to_owned(),
        source: Errno::last(),
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Detaches whatever is mounted at `target`; nothing mounted (or no such
/// path) is success.
pub fn unmount(target: &Path) -> Result<(), MountError> {
    match umount2(target, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => Ok(()),
        Err(source) => Err(MountError {
            what: "unmounting",
            path: target.to_owned(),
            source,
        }),
    }
}

/// Whether something is mounted exactly at `path` (from mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| unescape_mountinfo(mp) == wanted)
}

/// Mount points under `dir`, deepest first (for teardown after a crash).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|mp| PathBuf::from(unescape_mountinfo(mp)))
        .filter(|mp| mp.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// The lower dirs of every overlay mounted in this mount namespace: what
/// running containers' root filesystems are made of.
pub fn overlay_lower_dirs() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines().flat_map(lower_dirs_of).collect()
}

fn lower_dirs_of(line: &str) -> Vec<PathBuf> {
    // "<fields> - <fstype> <source> <super options>"
    let Some((_, tail)) = line.split_once(" - ") else {
        return Vec::new();
    };
    let mut fields = tail.split(' ');
    if fields.next() != Some("overlay") {
        return Vec::new();
    }
    let options = fields.nth(1).unwrap_or("");
    options
        .split(',')
        .filter_map(|o| o.strip_prefix("lowerdir="))
        .flat_map(|dirs| dirs.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(unescape_mountinfo(d)))
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_lower_dirs_from_mountinfo() {
        let line = "412 30 0:77 / /s/pods/u/containers/c/rootfs rw,relatime - overlay overlay rw,lowerdir=/s/images/layers/sha256/bb:/s/images/layers/sha256/aa,upperdir=/s/u,workdir=/s/w";
        assert_eq!(
            lower_dirs_of(line),
            vec![
                PathBuf::from("/s/images/layers/sha256/bb"),
                PathBuf::from("/s/images/layers/sha256/aa")
            ]
        );
        let other = "22 1 8:1 / / rw - ext4 /dev/sda1 rw,lowerdir=/not/an/overlay";
        assert!(lower_dirs_of(other).is_empty());
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
