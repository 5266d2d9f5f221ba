//! Unpacks one layer (tar, optionally gzip) into its own directory, in the
//! form overlayfs reads: OCI whiteouts become overlay whiteouts (0:0 character
//! devices) and opaque directories get `trusted.overlay.opaque=y`.
//!
//! A layer is untrusted. Nothing it contains may create, change or follow
//! anything outside the destination: paths are normalised and `..` refused,
//! no entry is written through a symlink (every parent is checked with
//! lstat), hardlinks must point at regular files inside the layer, device
//! nodes are skipped, and sizes and entry counts are capped. Runs off the
//! event loop (it is blocking file I/O).

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use flate2::read::GzDecoder;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use nix::unistd::{Gid, Uid, mkfifo};

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("layer entry {entry:?}: {reason}")]
    Hostile { entry: String, reason: &'static str },
    #[error("unpacks to more than {limit} bytes, the limit for this layer (imageLimits)")]
    TooLarge { limit: u64 },
    #[error("layer has more than {limit} entries (imageLimits.layerEntries)")]
    TooManyEntries { limit: u64 },
    #[error("reading the layer: {0}")]
    Tar(io::Error),
}

/// Limits against decompression bombs, and what a layer may contain.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_entries: u64,
    pub contents: Contents,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 16 << 30,
            max_entries: 1_000_000,
            contents: Contents::default(),
        }
    }
}

/// Entries beyond files, directories and links. By default a layer gets
/// what a rootless runtime could make (FIFOs; device nodes are skipped)
/// and keeps setuid/setgid bits, which a container running with
/// `allowPrivilegeEscalation: false` cannot use anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contents {
    pub fifos: bool,
    /// Fail the layer on a device node instead of skipping it.
    pub refuse_devices: bool,
    pub setuid: bool,
}

impl Default for Contents {
    fn default() -> Self {
        Contents {
            fifos: true,
            refuse_devices: false,
            setuid: true,
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub entries: u64,
    pub bytes: u64,
    pub skipped_devices: u64,
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> UnpackError + '_ {
    move |source| UnpackError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Opens a layer blob and picks its decompressor by magic bytes, which is
/// more reliable than media types some registries get wrong.
fn open_layer(blob: &Path) -> Result<Box<dyn Read>, UnpackError> {
    let file = File::open(blob).map_err(io_at(blob))?;
    let mut reader = BufReader::with_capacity(64 << 10, file);
    let head = io::BufRead::fill_buf(&mut reader).map_err(io_at(blob))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(GzDecoder::new(reader)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Ok(Box::new(super::zstd::ZstdReader::new(reader)))
    } else {
        Ok(Box::new(reader))
    }
}

/// The longest GNU long name or link the reader keeps (Linux's PATH_MAX
/// is 4096), and the largest PAX header: their bodies are held in memory,
/// so a layer may not make them as large as it likes.
const MAX_LONG_NAME: u64 = 64 << 10;
const MAX_PAX_HEADER: u64 = 1 << 20;

/// Counts what the decompressor yields and fails past `limit`: headers,
/// padding and skipped entries are bytes a decompression bomb can be made
/// of, too.
struct Counted<R> {
    inner: R,
    read: Rc<Cell<u64>>,
    limit: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get().saturating_add(n as u64));
        if self.read.get() > self.limit {
            return Err(io::Error::other("layer decompresses past its limit"));
        }
        Ok(n)
    }
}

/// What GNU long-name and PAX headers say of the entry that follows them,
/// read here with caps rather than by the tar reader, which buffers their
/// bodies whole.
#[derive(Default)]
struct Extensions {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    uid: Option<u64>,
    gid: Option<u64>,
    size: Option<u64>,
}

impl Extensions {
    /// Takes an extension entry in; false if `entry` is a member itself.
    fn take<R: Read>(&mut self, entry: &mut tar::Entry<R>) -> Result<bool, UnpackError> {
        let kind = entry.header().entry_type();
        let cap = match kind {
            tar::EntryType::GNULongName | tar::EntryType::GNULongLink => MAX_LONG_NAME,
            tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => MAX_PAX_HEADER,
            _ => return Ok(false),
        };
        // Named only for extensions, not for every member of the layer.
        let display = String::from_utf8_lossy(&entry.header().path_bytes()).into_owned();
        let display = display.as_str();
        if entry.size() > cap {
            return Err(hostile(
                display,
                "a long name or PAX header past its size limit",
            ));
        }
        let mut body = Vec::new();
        entry
            .take(cap)
            .read_to_end(&mut body)
            .map_err(UnpackError::Tar)?;
        match kind {
            tar::EntryType::GNULongName => self.path = Some(trim_nul(body)),
            tar::EntryType::GNULongLink => self.link = Some(trim_nul(body)),
            // Global headers set defaults nobody relies on in layers.
            tar::EntryType::XGlobalHeader => {}
            _ => {
                for record in tar::PaxExtensions::new(&body) {
                    let record = record.map_err(|_| hostile(display, "malformed PAX header"))?;
                    let number = || {
                        record
                            .value()
                            .ok()
                            .and_then(|v| v.parse::<u64>().ok())
                            .ok_or_else(|| hostile(display, "malformed PAX number"))
                    };
                    match record.key_bytes() {
                        b"path" => self.path = Some(record.value_bytes().to_vec()),
                        b"linkpath" => self.link = Some(record.value_bytes().to_vec()),
                        b"uid" => self.uid = Some(number()?),
                        b"gid" => self.gid = Some(number()?),
                        b"size" => self.size = Some(number()?),
                        _ => {}
                    }
                }
            }
        }
        Ok(true)
    }
}

fn trim_nul(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

pub fn unpack(blob: &Path, dest: &Path, limits: Limits) -> Result<Stats, UnpackError> {
    fs::create_dir_all(dest).map_err(io_at(dest))?;
    let dest_dir = nix::fcntl::open(
        dest,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_at(dest)(e.into()))?;
    // Each entry's 512-byte header, and padding up to the next, on top of
    // the files' bytes.
    let decoded_limit = limits
        .max_bytes
        .saturating_add(limits.max_entries.saturating_mul(1024));
    let decoded = Rc::new(Cell::new(0));
    let reader = Counted {
        inner: open_layer(blob)?,
        read: decoded.clone(),
        limit: decoded_limit,
    };
    let mut archive = tar::Archive::new(reader);
    let mut stats = Stats::default();
    // Directory modes are applied last: a read-only directory must still
    // receive its entries.
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut extensions = Extensions::default();
    let read_error = |e: io::Error| {
        if decoded.get() > decoded_limit {
            UnpackError::TooLarge {
                limit: limits.max_bytes,
            }
        } else {
            UnpackError::Tar(e)
        }
    };
    for entry in archive.entries().map_err(UnpackError::Tar)?.raw(true) {
        let mut entry = entry.map_err(read_error)?;
        stats.entries += 1;
        if stats.entries > limits.max_entries {
            return Err(UnpackError::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        match extensions.take(&mut entry) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(UnpackError::Tar(e)) => return Err(read_error(e)),
            Err(e) => return Err(e),
        }
        let this = std::mem::take(&mut extensions);
        let raw_path = this
            .path
            .clone()
            .unwrap_or_else(|| entry.header().path_bytes().into_owned());
        let display = String::from_utf8_lossy(&raw_path).into_owned();
        let Some(rel) = normalise(&raw_path, &display)? else {
            continue; // the root itself
        };
        let target = dest.join(&rel);
        let parent = target.parent().unwrap_or(dest);
        ensure_parents(dest, &rel, &display)?;

        let name = rel.file_name().map(OsStr::as_bytes).unwrap_or_default();
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            // ".wh..." would white out the layer's parent, ".wh.." the
            // directory itself.
            if matches!(hidden, b"" | b"." | b"..") {
                return Err(hostile(&display, "whiteout of a parent directory"));
            }
            if hidden == b".wh..opq" {
                set_opaque(parent)?;
            } else {
                let whiteout = parent.join(OsStr::from_bytes(hidden));
                remove_existing(&whiteout)?;
                mknod(&whiteout, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)).map_err(|e| {
                    UnpackError::Io {
                        path: whiteout.clone(),
                        source: e.into(),
                    }
                })?;
            }
            continue;
        }

        let header = entry.header();
        let mut mode = header.mode().unwrap_or(0o644) & 0o7777;
        if !limits.contents.setuid && kind_is_file(header.entry_type()) {
            mode &= !0o6000;
        }
        let uid = this.uid.unwrap_or_else(|| header.uid().unwrap_or(0));
        let gid = this.gid.unwrap_or_else(|| header.gid().unwrap_or(0));
        let kind = header.entry_type();
        // What the reader framed the entry by: a PAX size it did not see
        // would make it read file data as headers.
        let size = entry.size();
        if this.size.is_some_and(|s| s != size) {
            return Err(hostile(&display, "a PAX size other than the header's"));
        }
        let link = this.link.or_else(|| {
            entry
                .header()
                .link_name_bytes()
                .map(std::borrow::Cow::into_owned)
        });
        if kind_is_file(kind) {
            stats.bytes += size;
            if stats.bytes > limits.max_bytes {
                return Err(UnpackError::TooLarge {
                    limit: limits.max_bytes,
                });
            }
            remove_existing(&target)?;
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&target)
                .map_err(io_at(&target))?;
            // Copy no more than the header promised.
            let copied = io::copy(&mut (&mut entry).take(size), &mut file);
            if decoded.get() > decoded_limit {
                return Err(UnpackError::TooLarge {
                    limit: limits.max_bytes,
                });
            }
            copied.map_err(io_at(&target))?;
            let (uid, gid) = owner(&target, uid, gid)?;
            nix::unistd::fchown(&file, Some(uid), Some(gid))
                .map_err(|e| io_at(&target)(e.into()))?;
            file.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(io_at(&target))?;
        } else if kind.is_dir() {
            match fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    remove_existing(&target)?;
                    fs::create_dir(&target).map_err(io_at(&target))?;
                }
                Err(_) => fs::create_dir(&target).map_err(io_at(&target))?,
            }
            chown(&target, uid, gid)?;
            dir_modes.push((rel, mode));
        } else if kind.is_symlink() {
            let link = link.ok_or_else(|| hostile(&display, "symlink without a target"))?;
            remove_existing(&target)?;
            // The target may point anywhere: it is resolved only inside the
            // container's root, and no later entry is written through it.
            symlink(OsStr::from_bytes(&link), &target).map_err(io_at(&target))?;
            lchown(&target, uid, gid)?;
        } else if kind.is_hard_link() {
            let link = link.ok_or_else(|| hostile(&display, "hardlink without a target"))?;
            let link_rel = normalise(&link, &display)?
                .ok_or_else(|| hostile(&display, "hardlink to the layer root"))?;
            ensure_parents(dest, &link_rel, &display)?;
            let source = dest.join(&link_rel);
            match fs::symlink_metadata(&source) {
                Ok(m) if m.is_file() => {}
                _ => {
                    return Err(hostile(
                        &display,
                        "hardlink target is not a regular file of this layer",
                    ));
                }
            }
            remove_existing(&target)?;
            fs::hard_link(&source, &target).map_err(io_at(&target))?;
        } else if kind == tar::EntryType::Fifo {
            if !limits.contents.fifos {
                return Err(hostile(&display, "a FIFO (refused by layerContents.fifos)"));
            }
            remove_existing(&target)?;
            mkfifo(&target, Mode::from_bits_truncate(mode)).map_err(|e| UnpackError::Io {
                path: target.clone(),
                source: e.into(),
            })?;
            chown(&target, uid, gid)?;
        } else if kind == tar::EntryType::Char || kind == tar::EntryType::Block {
            if limits.contents.refuse_devices {
                return Err(hostile(
                    &display,
                    "a device node (refused by layerContents.devices)",
                ));
            }
            // Runtimes provide /dev; a device node in an image is a way out
            // of the container, so it is not created.
            stats.skipped_devices += 1;
        } else {
            log::debug!("layer entry {display:?}: type {kind:?} ignored");
        }
    }
    // Deepest first, so that a parent's mode never blocks a child's chmod.
    // A later entry may have replaced a directory, or one above it, with a
    // symlink: each is opened beneath the layer without following any, and
    // one that is no longer a directory keeps no mode.
    dir_modes.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (relative, mode) in dir_modes {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        match crate::rooted::open_beneath(&dest_dir, &relative, flags) {
            Ok(dir) => nix::sys::stat::fchmod(&dir, Mode::from_bits_truncate(mode))
                .map_err(|e| io_at(&dest.join(&relative))(e.into()))?,
            Err(
                nix::Error::ELOOP | nix::Error::ENOTDIR | nix::Error::ENOENT | nix::Error::EXDEV,
            ) => {
                log::debug!("layer dir {relative:?} was replaced; its mode is not applied");
            }
            Err(e) => return Err(io_at(&dest.join(&relative))(e.into())),
        }
    }
    Ok(stats)
}

fn kind_is_file(kind: tar::EntryType) -> bool {
    kind.is_file() || kind == tar::EntryType::Continuous
}

fn hostile(entry: &str, reason: &'static str) -> UnpackError {
    UnpackError::Hostile {
        entry: entry.to_owned(),
        reason,
    }
}

/// A relative, `..`-free path; `None` for the root itself. Leading `/` and
/// `./` are dropped, as tar does.
fn normalise(raw: &[u8], display: &str) -> Result<Option<PathBuf>, UnpackError> {
    if raw.contains(&0) {
        return Err(hostile(display, "NUL in path"));
    }
    let mut out = PathBuf::new();
    for component in Path::new(OsStr::from_bytes(raw)).components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(hostile(display, "path contains '..'")),
            Component::Prefix(_) => return Err(hostile(display, "path prefix")),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Makes sure every parent of `rel` inside `dest` is a real directory (never
/// a symlink), creating missing ones.
fn ensure_parents(dest: &Path, rel: &Path, display: &str) -> Result<(), UnpackError> {
    let mut current = dest.to_path_buf();
    let parents: Vec<_> = rel
        .parent()
        .map(|p| p.components().collect())
        .unwrap_or_default();
    for component in parents {
        current.push(component);
        match fs::symlink_metadata(&current) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => {
                return Err(hostile(display, "path goes through a symlink"));
            }
            Ok(_) => return Err(hostile(display, "parent is not a directory")),
            Err(_) => fs::create_dir(&current).map_err(io_at(&current))?,
        }
    }
    Ok(())
}

/// Removes what an earlier entry put at `path` (a later entry wins), without
/// following a symlink there.
fn remove_existing(path: &Path) -> Result<(), UnpackError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(io_at(path)),
        Ok(_) => fs::remove_file(path).map_err(io_at(path)),
        Err(_) => Ok(()),
    }
}

fn set_opaque(dir: &Path) -> Result<(), UnpackError> {
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| hostile(&dir.to_string_lossy(), "NUL in path"))?;
    let rc = unsafe {
        libc::lsetxattr(
            c_path.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    if rc != 0 {
        return Err(io_at(dir)(io::Error::last_os_error()));
    }
    Ok(())
}

fn chown(path: &Path, uid: u64, gid: u64) -> Result<(), UnpackError> {
    lchown(path, uid, gid)
}

fn owner(path: &Path, uid: u64, gid: u64) -> Result<(Uid, Gid), UnpackError> {
    match (u32::try_from(uid), u32::try_from(gid)) {
        (Ok(uid), Ok(gid)) => Ok((Uid::from_raw(uid), Gid::from_raw(gid))),
        _ => Err(hostile(&path.to_string_lossy(), "owner id out of range")),
    }
}

fn lchown(path: &Path, uid: u64, gid: u64) -> Result<(), UnpackError> {
    let (uid, gid) = owner(path, uid, gid)?;
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        path,
        Some(uid),
        Some(gid),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| UnpackError::Io {
        path: path.to_owned(),
        source: e.into(),
    })
}

#[cfg(test)]
mod tests;
