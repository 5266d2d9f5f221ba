//! Volumes nanolet writes itself (configMap, secret, downwardAPI,
//! projected): what files they hold, and writing them the way upstream's
//! atomic writer does, so that applications watching `..data` see an
//! update as one change: the files live in a timestamped directory,
//! `..data` links to it and each visible entry links through `..data`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

fn io_at(path: &Path) -> impl Fn(io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The files under the current `..data`, to tell whether anything changed.
fn current_files(dir: &Path) -> Option<BTreeMap<String, ProjectedFile>> {
    let data_dir = dir.join(fs::read_link(dir.join(DATA_LINK)).ok()?);
    let mut files = BTreeMap::new();
    let mut stack = vec![data_dir.clone()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                stack.push(path);
            } else {
                let relative = path
                    .strip_prefix(&data_dir)
                    .ok()?
                    .to_string_lossy()
                    .into_owned();
                files.insert(
                    relative,
                    ProjectedFile {
                        data: fs::read(&path).ok()?,
                        mode: meta.permissions().mode() & 0o7777,
                    },
                );
            }
        }
    }
    Some(files)
}

/// Makes `dir` hold `files`; returns whether anything changed.
/// With `group` (the pod's fsGroup) the files belong to that group and are
/// readable by it, as upstream's volume ownership gives them.
pub fn write_atomically(
    dir: &Path,
    files: &BTreeMap<String, ProjectedFile>,
    group: Option<u32>,
) -> Result<bool, VolumeError> {
    if current_files(dir).as_ref() == Some(files) {
        return Ok(false);
    }
    fs::create_dir_all(dir).map_err(io_at(dir))?;
    let previous = fs::read_link(dir.join(DATA_LINK)).ok();
    let stamp = jiff::Timestamp::now()
        .strftime("..%Y_%m_%d_%H_%M_%S.%f")
        .to_string();
    let data_dir = dir.join(&stamp);
    fs::create_dir(&data_dir).map_err(io_at(&data_dir))?;
    let own = |path: &Path| match group {
        Some(gid) => std::os::unix::fs::lchown(path, None, Some(gid)).map_err(io_at(path)),
        None => Ok(()),
    };
    own(dir)?;
    own(&data_dir)?;
    for (relative, file) in files {
        let path = data_dir.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_at(parent))?;
        }
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true).mode(file.mode);
        let mut out = options.open(&path).map_err(io_at(&path))?;
        io::Write::write_all(&mut out, &file.data).map_err(io_at(&path))?;
        // The umask must not narrow the mode the pod asked for.
        let mode = if group.is_some() {
            file.mode | 0o440
        } else {
            file.mode
        };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io_at(&path))?;
        own(&path)?;
        let mut parent = path.parent();
        while let Some(p) = parent.filter(|p| *p != data_dir) {
            own(p)?;
            parent = p.parent();
        }
    }
    let temp_link = dir.join("..data_tmp");
    let _ = fs::remove_file(&temp_link);
    std::os::unix::fs::symlink(&stamp, &temp_link).map_err(io_at(&temp_link))?;
    fs::rename(&temp_link, dir.join(DATA_LINK)).map_err(io_at(dir))?;

    let top_level: Vec<String> = files
        .keys()
        .filter_map(|p| p.split('/').next().map(str::to_owned))
        .collect();
    for name in &top_level {
        let link = dir.join(name);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA_LINK).join(name), &link)
                .map_err(io_at(&link))?;
        }
    }
    for entry in fs::read_dir(dir).map_err(io_at(dir))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !top_level.contains(&name) {
            let _ = fs::remove_file(entry.path());
        }
    }
    if let Some(previous) = previous
        && previous != Path::new(&stamp)
    {
        let _ = fs::remove_dir_all(dir.join(previous));
    }
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
}
