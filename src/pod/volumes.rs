//! Volumes nanolet writes itself (configMap, secret, downwardAPI,
//! projected): what files they hold, and writing them the way upstream's
//! atomic writer does, so that applications watching `..data` see an
//! update as one change: the files live in a timestamped directory,
//! `..data` links to it and each visible entry links through `..data`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use super::env::{Downward, field_value, resource_value};
use super::objects::{PodObjects, TokenRequestSpec, token_key};
use super::{DownwardValue, KeyToPath, Pod, Projection, ProjectionSource};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("{kind} {name:?} has no key {key:?}")]
    KeyNotFound {
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("no service account token yet")]
    NoToken,
    #[error(transparent)]
    Env(#[from] super::env::EnvError),
    #[error("invalid file name {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectedFile {
    pub data: Vec<u8>,
    pub mode: u32,
}

fn keyed(
    kind: &'static str,
    name: &str,
    data: Option<&super::objects::ObjectData>,
    items: &[KeyToPath],
    optional: bool,
    default_mode: u32,
    files: &mut BTreeMap<String, ProjectedFile>,
) -> Result<(), VolumeError> {
    let Some(data) = data else {
        if optional {
            return Ok(());
        }
        return Err(if kind == "secret" {
            VolumeError::SecretNotFound(name.to_owned())
        } else {
            VolumeError::ConfigMapNotFound(name.to_owned())
        });
    };
    if items.is_empty() {
        for (key, value) in &data.0 {
            files.insert(
                key.clone(),
                ProjectedFile {
                    data: value.clone(),
                    mode: default_mode,
                },
            );
        }
        return Ok(());
    }
    for item in items {
        match data.0.get(&item.key) {
            Some(value) => {
                files.insert(
                    item.path.clone(),
                    ProjectedFile {
                        data: value.clone(),
                        mode: item.mode.unwrap_or(default_mode),
                    },
                );
            }
            None if optional => {}
            None => {
                return Err(VolumeError::KeyNotFound {
                    kind,
                    name: name.to_owned(),
                    key: item.key.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The files of a volume, by relative path.
pub fn project(
    pod: &Pod,
    projection: &Projection,
    objects: &PodObjects,
    downward: &Downward,
) -> Result<BTreeMap<String, ProjectedFile>, VolumeError> {
    let mut files = BTreeMap::new();
    let default_mode = projection.default_mode;
    for source in &projection.sources {
        match source {
            ProjectionSource::ConfigMap {
                name,
                items,
                optional,
            } => keyed(
                "configmap",
                name,
                objects.config_maps.get(name).and_then(Option::as_ref),
                items,
                *optional,
                default_mode,
                &mut files,
            )?,
            ProjectionSource::Secret {
                name,
                items,
                optional,
            } => keyed(
                "secret",
                name,
                objects.secrets.get(name).and_then(Option::as_ref),
                items,
                *optional,
                default_mode,
                &mut files,
            )?,
            ProjectionSource::DownwardApi { items } => {
                for item in items {
                    let value = match &item.value {
                        DownwardValue::Field(path) => field_value(pod, path, downward)?,
                        DownwardValue::Resource(r) => {
                            let first = pod.containers.first().map_or("", |c| c.name.as_str());
                            resource_value(pod, first, r, downward)?
                        }
                    };
                    files.insert(
                        item.path.clone(),
                        ProjectedFile {
                            data: value.into_bytes(),
                            mode: item.mode.unwrap_or(default_mode),
                        },
                    );
                }
            }
            ProjectionSource::ServiceAccountToken {
                audience,
                expiration_seconds,
                path,
            } => {
                let key = token_key(&TokenRequestSpec {
                    audience: audience.clone(),
                    expiration_seconds: *expiration_seconds,
                });
                let token = objects.tokens.get(&key).ok_or(VolumeError::NoToken)?;
                files.insert(
                    path.clone(),
                    ProjectedFile {
                        data: token.token.clone().into_bytes(),
                        mode: default_mode,
                    },
                );
            }
        }
    }
    Ok(files)
}

const DATA_LINK: &str = "..data";
const DATA_LINK_TEMP: &str = "..data_tmp";

/// Upstream's atomic writer's limits on a payload path.
const MAX_PATH: usize = 4096;
const MAX_NAME: usize = 255;

fn io_at(path: &Path) -> impl Fn(io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_owned(),
        source,
    }
}

fn errno_at(path: &Path) -> impl Fn(nix::Error) -> VolumeError + '_ {
    move |errno| VolumeError::Io {
        path: path.to_owned(),
        source: errno.into(),
    }
}

/// A file name inside the volume, checked as upstream's atomic writer
/// checks its payload: the keys of a ConfigMap or Secret come from the API
/// server, and a key like `../x` or `/etc/x` must not become a path.
fn check_payload_path(path: &str) -> Result<(), VolumeError> {
    let reason = if path.is_empty() {
        "must not be empty"
    } else if path.len() > MAX_PATH {
        "is longer than 4096 bytes"
    } else if path.starts_with('/') {
        "must be relative"
    } else if path.starts_with("..") {
        "must not start with '..'"
    } else if path
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
    {
        "must not hold '.', '..' or empty elements"
    } else if path.split('/').any(|p| p.len() > MAX_NAME) {
        "has an element longer than 255 bytes"
    } else if path.contains('\0') {
        "must not hold a NUL byte"
    } else {
        return Ok(());
    };
    Err(VolumeError::BadPath {
        path: path.to_owned(),
        reason,
    })
}

/// What the agent wrote into a volume: a digest of the files and the data
/// dir they are in. Kept beside the volume, out of the pods' reach: the
/// volume itself is never read back (a container may have rewritten it).
fn record_path(dir: &Path) -> PathBuf {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!(".{}.written", name.unwrap_or_default()))
}

fn digest(files: &BTreeMap<String, ProjectedFile>, group: Option<u32>) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(format!("{group:?}\n"));
    for (path, file) in files {
        hash.update(format!("{path}\0{:o}\0{}\0", file.mode, file.data.len()));
        hash.update(&file.data);
    }
    format!("{:x}", hash.finalize())
}

fn open_dir_at(at: &impl AsFd, name: &Path) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        at,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// `..data`'s target as the link says it, without following it.
fn data_link_target(volume: &OwnedFd) -> Option<std::ffi::OsString> {
    nix::fcntl::readlinkat(volume, DATA_LINK).ok()
}

/// Makes `dir` hold `files`; returns whether anything changed.
/// With `group` (the pod's fsGroup) the files belong to that group and are
/// readable by it, as upstream's volume ownership gives them.
///
/// Containers see the volume read-only, but a privileged one may remount
/// it: every operation here works on descriptors, never follows a link
/// found in the volume, and never takes a path from what it reads there.
pub fn write_atomically(
    dir: &Path,
    files: &BTreeMap<String, ProjectedFile>,
    group: Option<u32>,
) -> Result<bool, VolumeError> {
    for path in files.keys() {
        check_payload_path(path)?;
    }
    let record = record_path(dir);
    let wanted = digest(files, group);
    fs::create_dir_all(dir).map_err(io_at(dir))?;
    let volume = open_dir_at(&nix::fcntl::AT_FDCWD, dir).map_err(errno_at(dir))?;
    // Unchanged when the record is ours and the link still names its dir
    // (after a reboot the tmpfs is empty and the record stale).
    if let Ok(text) = fs::read_to_string(&record)
        && let Some((digest, stamp)) = text.trim_end().split_once(' ')
        && digest == wanted
        && data_link_target(&volume).is_some_and(|t| t == stamp)
    {
        return Ok(false);
    }

    let stamp = jiff::Timestamp::now()
        .strftime("..%Y_%m_%d_%H_%M_%S.%f")
        .to_string();
    let data_path = dir.join(&stamp);
    nix::sys::stat::mkdirat(&volume, stamp.as_str(), Mode::from_bits_truncate(0o755))
        .map_err(errno_at(&data_path))?;
    let data = open_dir_at(&volume, Path::new(&stamp)).map_err(errno_at(&data_path))?;
    let own = |fd: &OwnedFd, path: &Path| match group {
        Some(gid) => nix::unistd::fchown(fd, None, Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(errno_at(path)),
        None => Ok(()),
    };
    own(&volume, dir)?;
    own(&data, &data_path)?;
    for (relative, file) in files {
        let path = data_path.join(relative);
        let (parents, name) = match relative.rsplit_once('/') {
            Some((parents, name)) => (Some(parents), name),
            None => (None, relative.as_str()),
        };
        let mut parent = data.try_clone().map_err(io_at(&path))?;
        for part in parents.into_iter().flat_map(|p| p.split('/')) {
            match nix::sys::stat::mkdirat(&parent, part, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(nix::Error::EEXIST) => {}
                Err(e) => return Err(errno_at(&path)(e)),
            }
            parent = open_dir_at(&parent, Path::new(part)).map_err(errno_at(&path))?;
            own(&parent, &path)?;
        }
        let out = nix::fcntl::openat(
            &parent,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(file.mode),
        )
        .map_err(errno_at(&path))?;
        let mut out = fs::File::from(out);
        io::Write::write_all(&mut out, &file.data).map_err(io_at(&path))?;
        // The umask must not narrow the mode the pod asked for.
        let mode = if group.is_some() {
            file.mode | 0o440
        } else {
            file.mode
        };
        out.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_at(&path))?;
        own(&OwnedFd::from(out), &path)?;
    }

    let _ = nix::unistd::unlinkat(&volume, DATA_LINK_TEMP, UnlinkatFlags::NoRemoveDir);
    nix::unistd::symlinkat(stamp.as_str(), &volume, DATA_LINK_TEMP)
        .map_err(errno_at(&dir.join(DATA_LINK_TEMP)))?;
    nix::fcntl::renameat(&volume, DATA_LINK_TEMP, &volume, DATA_LINK).map_err(errno_at(dir))?;

    let top_level: Vec<&str> = files.keys().filter_map(|p| p.split('/').next()).collect();
    for name in &top_level {
        let target = Path::new(DATA_LINK).join(name);
        if nix::fcntl::readlinkat(&volume, *name).is_ok_and(|t| Path::new(&t) == target) {
            continue;
        }
        // Whatever else holds the name goes: a file or link, never a
        // directory's contents.
        let _ = nix::unistd::unlinkat(&volume, *name, UnlinkatFlags::NoRemoveDir);
        nix::unistd::symlinkat(&target, &volume, *name).map_err(errno_at(&dir.join(name)))?;
    }
    // The previous data dirs and anything else, by the names listed here
    // (one element each, inside the volume): the link's target is never
    // taken as a path.
    for entry in fs::read_dir(dir).map_err(io_at(dir))?.flatten() {
        let name = entry.file_name();
        let name_text = name.to_string_lossy();
        if name_text == DATA_LINK || name_text == stamp || top_level.contains(&&*name_text) {
            continue;
        }
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && name_text.starts_with("..") {
            // std's removal opens each level without following links.
            let _ = fs::remove_dir_all(dir.join(&name));
        } else if !is_dir {
            let _ = nix::unistd::unlinkat(&volume, name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
    fs::write(&record, format!("{wanted} {stamp}\n")).map_err(io_at(&record))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str, mode: u32) -> ProjectedFile {
        ProjectedFile {
            data: text.as_bytes().to_vec(),
            mode,
        }
    }

    #[test]
    fn atomic_writer_layout_and_updates() {
        let dir = crate::state::TestDir::new("volume");
        let vol = dir.0.join("v");
        let mut files = BTreeMap::from([
            ("a".to_owned(), file("1", 0o644)),
            ("sub/b".to_owned(), file("2", 0o600)),
        ]);
        assert!(write_atomically(&vol, &files, None).unwrap());
        assert_eq!(fs::read_to_string(vol.join("a")).unwrap(), "1");
        assert_eq!(fs::read_to_string(vol.join("sub/b")).unwrap(), "2");
        assert_eq!(fs::read_link(vol.join("a")).unwrap(), Path::new("..data/a"));
        let mode = fs::metadata(vol.join("sub/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!write_atomically(&vol, &files, None).unwrap());

        files.remove("a");
        files.insert("c".into(), file("3", 0o644));
        assert!(write_atomically(&vol, &files, None).unwrap());
        assert!(fs::symlink_metadata(vol.join("a")).is_err());
        assert_eq!(fs::read_to_string(vol.join("c")).unwrap(), "3");
        // One data dir only: the old one is gone.
        let stamped = fs::read_dir(&vol)
            .unwrap()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("..") && n != DATA_LINK
            })
            .count();
        assert_eq!(stamped, 1);

        // fsGroup: group-owned and group-readable, whatever the mode asked.
        use std::os::unix::fs::MetadataExt;
        let shared = dir.0.join("shared");
        let files = BTreeMap::from([("sub/key".to_owned(), file("k", 0o600))]);
        assert!(write_atomically(&shared, &files, Some(4242)).unwrap());
        let meta = fs::metadata(shared.join("sub/key")).unwrap();
        assert_eq!(
            (meta.gid(), meta.permissions().mode() & 0o777),
            (4242, 0o640)
        );
        assert_eq!(fs::metadata(shared.join("..data/sub")).unwrap().gid(), 4242);
    }

    /// A container that got write access to its volume (a privileged one
    /// remounting it) and pointed `..data` or a data dir's name outside.
    #[test]
    fn links_a_container_planted_in_the_volume_are_never_followed() {
        let dir = crate::state::TestDir::new("volume");
        let victim = dir.0.join("victim");
        fs::create_dir(&victim).unwrap();
        fs::write(victim.join("keep"), "host data").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
        let vol = dir.0.join("v");
        let files = BTreeMap::from([("name".to_owned(), file("pod", 0o644))]);
        assert!(write_atomically(&vol, &files, Some(4242)).unwrap());

        for planted in [victim.clone(), PathBuf::from("../victim")] {
            let _ = fs::remove_file(vol.join(DATA_LINK));
            std::os::unix::fs::symlink(&planted, vol.join(DATA_LINK)).unwrap();
            let _ = fs::remove_file(vol.join("..2020_01_01"));
            std::os::unix::fs::symlink(&victim, vol.join("..2020_01_01")).unwrap();
            let _ = fs::remove_file(vol.join("name"));
            std::os::unix::fs::symlink(victim.join("keep"), vol.join("name")).unwrap();
            // The link no longer names the agent's dir: written again.
            assert!(write_atomically(&vol, &files, Some(4242)).unwrap());
            assert_eq!(
                fs::read_to_string(victim.join("keep")).unwrap(),
                "host data"
            );
            assert_eq!(fs::read_to_string(vol.join("name")).unwrap(), "pod");
            use std::os::unix::fs::MetadataExt;
            let meta = fs::metadata(&victim).unwrap();
            assert_eq!((meta.gid(), meta.mode() & 0o7777), (0, 0o700));
        }
    }

    #[test]
    fn keys_that_are_not_plain_relative_paths_are_refused() {
        let dir = crate::state::TestDir::new("volume");
        let vol = dir.0.join("v");
        let long = "x".repeat(256);
        for key in [
            "../escape",
            "/etc/escape",
            "..data",
            "a/../../escape",
            "a//b",
            "./a",
            "",
            long.as_str(),
        ] {
            let files = BTreeMap::from([(key.to_owned(), file("x", 0o644))]);
            let e = write_atomically(&vol, &files, None).unwrap_err();
            assert!(matches!(e, VolumeError::BadPath { .. }), "{key}: {e}");
        }
        assert!(!dir.0.join("escape").exists());
        assert!(!Path::new("/etc/escape").exists());
        let nested = BTreeMap::from([("a/b/c".to_owned(), file("x", 0o644))]);
        assert!(write_atomically(&vol, &nested, None).unwrap());
        assert_eq!(fs::read_to_string(vol.join("a/b/c")).unwrap(), "x");
    }
}
