//! Container Device Interface specs (github.com/cncf-tags/container-device-interface):
//! JSON or YAML files in `/etc/cdi` and `/var/run/cdi` naming, for each
//! device of a kind (`vendor.com/class`), the edits a container needs for
//! it: device nodes, mounts, environment, hooks, groups. A device plugin
//! names CDI devices in its Allocate answer; nanolet, being the runtime
//! too, resolves them here as containerd and CRI-O do.
//!
//! A later directory overrides an earlier one for the same device, as the
//! CDI library orders them; two files of one directory naming the same
//! device make it unresolvable. Specs are files an administrator or a
//! plugin wrote, still read with caps on size and count.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

/// The directories of CDI's default, lowest priority first.
pub const DEFAULT_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// A spec file larger than this is not one.
const MAX_SPEC: u64 = 1 << 20;
/// Spec files read from one directory.
const MAX_FILES: usize = 256;
/// All spec files read for one container, together: they are read at each
/// start of a container that names CDI devices.
const MAX_TOTAL: u64 = 4 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CdiError {
    #[error("unresolvable CDI devices {0}")]
    Unresolvable(String),
    #[error("CDI device name {0:?} is not vendor.com/class=name")]
    Name(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerEdits {
    pub env: Vec<String>,
    pub device_nodes: Vec<DeviceNode>,
    pub mounts: Vec<Mount>,
    pub hooks: Vec<Hook>,
    pub additional_gids: Vec<u32>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceNode {
    /// In the container.
    pub path: String,
    /// On the host; `path` when absent.
    pub host_path: Option<String>,
    pub kind: Option<String>,
    pub major: Option<i64>,
    pub minor: Option<i64>,
    pub file_mode: Option<u32>,
    pub permissions: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
    pub kind: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub timeout: Option<i64>,
}

#[derive(Debug)]
struct Spec {
    kind: String,
    devices: Vec<SpecDevice>,
    container_edits: ContainerEdits,
}

#[derive(Debug)]
struct SpecDevice {
    name: String,
    container_edits: ContainerEdits,
}

/// A device found in the specs: its edits, and its spec's.
#[derive(Debug, Clone)]
struct Found {
    priority: usize,
    /// Which spec file (for its spec-level edits, applied once).
    spec: usize,
    edits: ContainerEdits,
    /// Another spec file of the same directory names it too.
    conflict: bool,
}

/// The specs of `dirs` (lowest priority first), read now.
pub struct Registry {
    devices: BTreeMap<String, Found>,
    spec_edits: Vec<ContainerEdits>,
}

impl Registry {
    pub fn read(dirs: &[PathBuf]) -> Registry {
        let mut registry = Registry {
            devices: BTreeMap::new(),
            spec_edits: Vec::new(),
        };
        let mut budget = MAX_TOTAL;
        for (priority, dir) in dirs.iter().enumerate() {
            for path in spec_files(dir) {
                match read_spec(&path, &mut budget) {
                    Ok(spec) => registry.add(priority, spec),
                    Err(e) => log::warn!("CDI spec {}: {e}", path.display()),
                }
            }
        }
        registry
    }

    fn add(&mut self, priority: usize, spec: Spec) {
        if !valid_kind(&spec.kind) {
            log::warn!("CDI spec of kind {:?}: not vendor.com/class", spec.kind);
            return;
        }
        let index = self.spec_edits.len();
        self.spec_edits.push(spec.container_edits);
        for device in spec.devices {
            if !valid_device_name(&device.name) {
                log::warn!(
                    "CDI device {:?} of {}: invalid name",
                    device.name,
                    spec.kind
                );
                continue;
            }
            let name = format!("{}={}", spec.kind, device.name);
            let found = Found {
                priority,
                spec: index,
                edits: device.container_edits,
                conflict: false,
            };
            match self.devices.get_mut(&name) {
                Some(old) if old.priority == priority => old.conflict = true,
                Some(old) if old.priority > priority => {}
                _ => {
                    self.devices.insert(name, found);
                }
            }
        }
    }

    /// The edits for `names`, in order: each spec's own edits once, before
    /// its first device's.
    pub fn resolve(&self, names: &[String]) -> Result<Vec<ContainerEdits>, CdiError> {
        let mut missing = Vec::new();
        let mut edits = Vec::new();
        let mut specs_applied = Vec::new();
        for name in names {
            if name
                .split_once('=')
                .is_none_or(|(kind, device)| !valid_kind(kind) || !valid_device_name(device))
            {
                return Err(CdiError::Name(name.clone()));
            }
            match self.devices.get(name) {
                Some(found) if !found.conflict => {
                    if !specs_applied.contains(&found.spec) {
                        specs_applied.push(found.spec);
                        edits.push(self.spec_edits[found.spec].clone());
                    }
                    edits.push(found.edits.clone());
                }
                _ => missing.push(name.as_str()),
            }
        }
        if !missing.is_empty() {
            return Err(CdiError::Unresolvable(missing.join(", ")));
        }
        Ok(edits)
    }
}

/// `.json` and `.yaml` files directly in `dir`, in name order.
fn spec_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "json" || x == "yaml" || x == "yml")
        })
        .collect();
    files.sort();
    if files.len() > MAX_FILES {
        log::warn!(
            "{}: {} CDI spec files; reading the first {MAX_FILES}",
            dir.display(),
            files.len()
        );
        files.truncate(MAX_FILES);
    }
    files
}

/// Reads a spec, taking its size from `budget`.
fn read_spec(path: &Path, budget: &mut u64) -> Result<Spec, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Listed as a regular file, it may be a FIFO by now, whose open or
    // read would never return: not followed, not waited for, checked
    // again once open.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err("not a regular file".into());
    }
    let limit = MAX_SPEC.min(*budget);
    let mut text = String::new();
    file.take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    let read = text.len() as u64;
    *budget = budget.saturating_sub(read);
    if read > limit {
        return Err(if limit < MAX_SPEC {
            format!(
                "CDI specs larger than {MAX_TOTAL} bytes together; this one and those after it are not read"
            )
        } else {
            format!("larger than {MAX_SPEC} bytes")
        });
    }
    // YAML is a superset of JSON: one parser for both. Read as a YAML
    // value, which the configuration's reader has already compiled in,
    // rather than by derived code of its own: 40 KB of the binary.
    let value: Value = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    spec_of(&value)
}

type Parsed<T> = Result<T, String>;

fn spec_of(v: &Value) -> Parsed<Spec> {
    required(v, "cdiVersion")?;
    let devices = list(v, "devices", |d| {
        Ok(SpecDevice {
            name: required(d, "name")?,
            container_edits: edits_of(d)?,
        })
    })?;
    if devices.is_empty() {
        return Err("devices: none".into());
    }
    Ok(Spec {
        kind: required(v, "kind")?,
        devices,
        container_edits: edits_of(v)?,
    })
}

fn edits_of(parent: &Value) -> Parsed<ContainerEdits> {
    let Some(v) = field(parent, "containerEdits") else {
        return Ok(ContainerEdits::default());
    };
    Ok(ContainerEdits {
        env: texts(v, "env")?,
        device_nodes: list(v, "deviceNodes", |d| {
            Ok(DeviceNode {
                path: required(d, "path")?,
                host_path: text(d, "hostPath")?,
                kind: text(d, "type")?,
                major: number(d, "major")?,
                minor: number(d, "minor")?,
                file_mode: number(d, "fileMode")?,
                permissions: text(d, "permissions")?,
                uid: number(d, "uid")?,
                gid: number(d, "gid")?,
            })
        })?,
        mounts: list(v, "mounts", |m| {
            Ok(Mount {
                host_path: required(m, "hostPath")?,
                container_path: required(m, "containerPath")?,
                options: texts(m, "options")?,
                kind: text(m, "type")?,
            })
        })?,
        hooks: list(v, "hooks", |h| {
            Ok(Hook {
                hook_name: required(h, "hookName")?,
                path: required(h, "path")?,
                args: texts(h, "args")?,
                env: texts(h, "env")?,
                timeout: number(h, "timeout")?,
            })
        })?,
        additional_gids: list(v, "additionalGids", |g| {
            g.as_u64()
                .and_then(|g| u32::try_from(g).ok())
                .ok_or_else(|| "additionalGids: not a group ID".to_owned())
        })?,
    })
}

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|v| !v.is_null())
}

fn text(v: &Value, key: &str) -> Parsed<Option<String>> {
    match field(v, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key}: not a string")),
    }
}

fn required(v: &Value, key: &str) -> Parsed<String> {
    text(v, key)?.ok_or_else(|| format!("{key}: missing"))
}

fn number<T: TryFrom<i64>>(v: &Value, key: &str) -> Parsed<Option<T>> {
    field(v, key)
        .map(|n| {
            n.as_i64()
                .and_then(|n| T::try_from(n).ok())
                .ok_or_else(|| format!("{key}: not a number in range"))
        })
        .transpose()
}

fn list<T>(v: &Value, key: &str, each: impl Fn(&Value) -> Parsed<T>) -> Parsed<Vec<T>> {
    match field(v, key) {
        None => Ok(Vec::new()),
        Some(Value::Sequence(items)) => items.iter().map(each).collect(),
        Some(_) => Err(format!("{key}: not a list")),
    }
}

fn texts(v: &Value, key: &str) -> Parsed<Vec<String>> {
    list(v, key, |item| match item {
        Value::String(s) => Ok(s.clone()),
        _ => Err(format!("{key}: not a list of strings")),
    })
}

/// `vendor/class`: a vendor of DNS-like labels, a class of letters, digits,
/// `_`, `-` and `.`; both starting with a letter and ending alphanumeric.
fn valid_kind(kind: &str) -> bool {
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    let part = |s: &str, extra: &[u8]| {
        let bytes = s.as_bytes();
        !bytes.is_empty()
            && bytes[0].is_ascii_alphabetic()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || extra.contains(b))
    };
    part(vendor, b"_-.") && part(class, b"_-.") && class.len() <= 63
}

/// A device name: alphanumeric at both ends, `_ - . :` inside.
fn valid_device_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(b))
}

/// For the fuzz target: a spec's text read, any error, no panic.
pub mod fuzzing {
    pub fn spec(data: &[u8]) {
        if let Ok(text) = std::str::from_utf8(data)
            && let Ok(value) = serde_yaml_ng::from_str::<super::Value>(text)
        {
            let _ = super::spec_of(&value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    const SERIAL: &str = r#"{"cdiVersion": "0.6.0", "kind": "example.com/serial",
      "containerEdits": {"env": ["SERIAL_SPEC=1"]},
      "devices": [
        {"name": "s0", "containerEdits": {"deviceNodes": [{"path": "/dev/ttyX0", "hostPath": "/tmp/x0"}],
          "mounts": [{"hostPath": "/tmp/conf", "containerPath": "/etc/serial", "options": ["ro", "bind"]}],
          "hooks": [{"hookName": "createContainer", "path": "/bin/true", "args": ["true", "s0"]}]}},
        {"name": "s1", "containerEdits": {"env": ["WHICH=s1"]}}
      ]}"#;

    #[test]
    fn names_resolve_to_their_spec_and_device_edits() {
        let dir = state::TestDir::new("cdi");
        write(&dir.0, "serial.json", SERIAL);
        let registry = Registry::read(&[dir.0.to_owned()]);
        let edits = registry
            .resolve(&[
                "example.com/serial=s0".into(),
                "example.com/serial=s1".into(),
            ])
            .unwrap_or_default();
        // The spec's edits once, then each device's.
        assert_eq!(edits.len(), 3);
        assert_eq!(edits[0].env, ["SERIAL_SPEC=1"]);
        assert_eq!(
            edits[1].device_nodes[0].host_path.as_deref(),
            Some("/tmp/x0")
        );
        assert_eq!(edits[1].mounts[0].options, ["ro", "bind"]);
        assert_eq!(edits[1].hooks[0].hook_name, "createContainer");
        assert_eq!(edits[2].env, ["WHICH=s1"]);
        assert_eq!(
            registry.resolve(&["example.com/serial=s9".into()]),
            Err(CdiError::Unresolvable("example.com/serial=s9".into()))
        );
        assert!(matches!(
            registry.resolve(&["no-kind".into()]),
            Err(CdiError::Name(_))
        ));
    }

    use crate::state;

    #[test]
    fn a_later_directory_overrides_and_a_clash_in_one_is_unresolvable() {
        let dir = state::TestDir::new("cdi-prio");
        let (etc, run) = (dir.0.join("etc"), dir.0.join("run"));
        let one = |env: &str| {
            format!(
                r#"{{"cdiVersion": "0.6.0", "kind": "example.com/serial", "devices": [{{"name": "s0", "containerEdits": {{"env": ["{env}"]}}}}]}}"#
            )
        };
        write(&etc, "a.json", &one("FROM=etc"));
        write(&run, "a.yaml", &one("FROM=run"));
        let registry = Registry::read(&[etc.clone(), run.clone()]);
        let edits = registry
            .resolve(&["example.com/serial=s0".into()])
            .unwrap_or_default();
        assert_eq!(
            edits.last().map(|e| e.env.clone()),
            Some(vec!["FROM=run".to_owned()])
        );
        write(&run, "b.json", &one("FROM=run-too"));
        let registry = Registry::read(&[etc, run]);
        assert!(registry.resolve(&["example.com/serial=s0".into()]).is_err());
    }

    #[test]
    fn hostile_specs_are_skipped() {
        let dir = state::TestDir::new("cdi-bad");
        write(&dir.0, "big.json", &" ".repeat(MAX_SPEC as usize + 1));
        write(
            &dir.0,
            "kind.json",
            r#"{"cdiVersion": "0.6.0", "kind": "nokind", "devices": [{"name": "a"}]}"#,
        );
        write(
            &dir.0,
            "name.json",
            r#"{"cdiVersion": "0.6.0", "kind": "x.com/y", "devices": [{"name": "-a"}]}"#,
        );
        write(&dir.0, "junk.json", "{{{{");
        // Fields of the wrong type, a number out of range, no devices.
        for (i, edits) in [
            r#"{"env": "A=1"}"#,
            r#"{"deviceNodes": [{"path": "/dev/x", "major": "one"}]}"#,
            r#"{"deviceNodes": [{"path": "/dev/x", "uid": -1}]}"#,
            r#"{"additionalGids": [4294967296]}"#,
            r#"{"mounts": [{"containerPath": "/x"}]}"#,
            r#"{"hooks": [{"hookName": "poststop", "path": "/bin/true", "args": [1]}]}"#,
        ]
        .iter()
        .enumerate()
        {
            let spec = format!(
                r#"{{"cdiVersion": "0.6.0", "kind": "x.com/y", "devices": [{{"name": "d{i}", "containerEdits": {edits}}}]}}"#
            );
            write(&dir.0, &format!("typed-{i}.json"), &spec);
        }
        write(
            &dir.0,
            "empty.yaml",
            "cdiVersion: 0.6.0\nkind: x.com/y\ndevices: []\n",
        );
        write(&dir.0, "ok.txt", SERIAL);
        std::fs::create_dir_all(dir.0.join("sub.json")).unwrap();
        let registry = Registry::read(&[dir.0.to_owned()]);
        assert!(registry.devices.is_empty());
    }

    #[test]
    fn a_spec_swapped_for_a_fifo_or_a_link_is_not_waited_on() {
        let dir = state::TestDir::new("cdi-fifo");
        let fifo = dir.0.join("fifo.json");
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // Safety: a plain mkfifo of a path we own.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let link = dir.0.join("link.json");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        // As if listed as regular files before the swap: read directly.
        for swapped in [&fifo, &link] {
            let mut budget = MAX_TOTAL;
            assert!(read_spec(swapped, &mut budget).is_err(), "{swapped:?}");
        }
    }

    #[test]
    fn specs_together_have_a_budget() {
        let dir = state::TestDir::new("cdi-budget");
        write(&dir.0, "a.json", SERIAL);
        let mut budget = SERIAL.len() as u64;
        assert!(read_spec(&dir.0.join("a.json"), &mut budget).is_ok());
        assert_eq!(budget, 0);
        let error = read_spec(&dir.0.join("a.json"), &mut budget).unwrap_err();
        assert!(error.contains("together"), "{error}");
    }
}
