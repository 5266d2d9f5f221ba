//! What a container's devices add to its spec: the device plugins' Allocate
//! answers (device nodes, mounts, environment, annotations) and the CDI
//! devices they name, resolved from the CDI specs into the same edits plus
//! hooks and groups. Each device node gets its own cgroup rule; the
//! container may use no other device beyond the runtime's defaults.
//!
//! Blocking: device nodes are looked at on the host and CDI specs read.
//! Called off the loop, with the bundle.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Mount, bind};
use crate::device::api::ContainerAllocateResponse;
use crate::device::cdi::{self, CdiError};

/// The annotations' prefix naming CDI devices, which runtimes (containerd,
/// CRI-O) read; a plugin may name its CDI devices this way too.
const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// The OCI hooks a CDI spec may add to.
const HOOKS: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceEditError {
    #[error("device {path}: {reason}")]
    Node { path: String, reason: String },
    #[error("{what} {path:?}: not an absolute path")]
    Relative { what: &'static str, path: String },
    #[error("device permissions {0:?}: not r, w and m")]
    Permissions(String),
    #[error("CDI hook {0:?}: not an OCI hook")]
    Hook(String),
    #[error(transparent)]
    Cdi(#[from] CdiError),
}

/// The edits, ready for the spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceEdits {
    /// `linux.devices` entries.
    pub nodes: Vec<Value>,
    /// cgroup rules allowing each node.
    pub rules: Vec<Value>,
    pub mounts: Vec<Mount>,
    /// Before the container's own variables, which override them.
    pub env: Vec<(String, String)>,
    pub annotations: BTreeMap<String, String>,
    pub hooks: BTreeMap<&'static str, Vec<Value>>,
    pub additional_gids: Vec<u32>,
}

impl DeviceEdits {
    /// What the plugins answered for the container, and the CDI devices
    /// they name (in `cdi_devices` or in `cdi.k8s.io/` annotations) from
    /// the specs in `cdi_dirs`.
    pub fn resolve(
        plugin: &ContainerAllocateResponse,
        cdi_dirs: &[PathBuf],
    ) -> Result<DeviceEdits, DeviceEditError> {
        let mut edits = DeviceEdits::default();
        for d in &plugin.devices {
            let node = Node {
                path: &d.container_path,
                host_path: Path::new(&d.host_path),
                permissions: &d.permissions,
                kind: None,
                major: None,
                minor: None,
                file_mode: None,
                uid: None,
                gid: None,
            };
            edits.add_node(&node)?;
        }
        for m in &plugin.mounts {
            absolute("mount", &m.container_path)?;
            absolute("mount source", &m.host_path)?;
            edits.mounts.push(bind(
                &m.container_path,
                Path::new(&m.host_path),
                m.read_only,
            ));
        }
        edits.env = plugin
            .envs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        edits.annotations = plugin.annotations.clone();

        let mut names = plugin.cdi_devices.clone();
        let annotated = plugin
            .annotations
            .iter()
            .filter(|(key, _)| key.starts_with(CDI_ANNOTATION_PREFIX))
            .flat_map(|(_, value)| value.split(','))
            .map(str::trim)
            .filter(|name| !name.is_empty());
        for name in annotated {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        if !names.is_empty() {
            let registry = cdi::Registry::read(cdi_dirs);
            for cdi_edits in registry.resolve(&names)? {
                edits.add_cdi(&cdi_edits)?;
            }
        }
        Ok(edits)
    }

    fn add_cdi(&mut self, e: &cdi::ContainerEdits) -> Result<(), DeviceEditError> {
        for kv in &e.env {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            self.env.retain(|(key, _)| key != k);
            self.env.push((k.to_owned(), v.to_owned()));
        }
        for d in &e.device_nodes {
            let host_path = d.host_path.as_deref().unwrap_or(&d.path);
            let node = Node {
                path: &d.path,
                host_path: Path::new(host_path),
                permissions: d.permissions.as_deref().unwrap_or(""),
                kind: d.kind.as_deref(),
                major: d.major,
                minor: d.minor,
                file_mode: d.file_mode,
                uid: d.uid,
                gid: d.gid,
            };
            self.add_node(&node)?;
        }
        for m in &e.mounts {
            absolute("mount", &m.container_path)?;
            absolute("mount source", &m.host_path)?;
            let kind = m.kind.clone().unwrap_or_else(|| "bind".to_owned());
            let mut options = m.options.clone();
            if kind == "bind" && !options.iter().any(|o| o == "bind" || o == "rbind") {
                options.push("rbind".to_owned());
            }
            self.mounts.push(Mount {
                destination: m.container_path.clone(),
                kind,
                source: m.host_path.clone(),
                options,
            });
        }
        for h in &e.hooks {
            let name = HOOKS
                .iter()
                .find(|n| **n == h.hook_name)
                .ok_or_else(|| DeviceEditError::Hook(h.hook_name.clone()))?;
            absolute("hook", &h.path)?;
            let mut hook = json!({"path": h.path});
            if !h.args.is_empty() {
                hook["args"] = json!(h.args);
            }
            if !h.env.is_empty() {
                hook["env"] = json!(h.env);
            }
            if let Some(timeout) = h.timeout.filter(|t| *t > 0) {
                hook["timeout"] = json!(timeout);
            }
            self.hooks.entry(name).or_default().push(hook);
        }
        for &gid in &e.additional_gids {
            if gid != 0 && !self.additional_gids.contains(&gid) {
                self.additional_gids.push(gid);
            }
        }
        Ok(())
    }

    /// A device node in the container, what is not given taken from the
    /// host's node; the first for a path wins, as upstream merges them.
    fn add_node(&mut self, node: &Node) -> Result<(), DeviceEditError> {
        absolute("device", node.path)?;
        let permissions = match node.permissions {
            "" => "rwm",
            p if p.chars().all(|c| "rwm".contains(c)) => p,
            p => return Err(DeviceEditError::Permissions(p.to_owned())),
        };
        let fail = |reason: String| DeviceEditError::Node {
            path: node.host_path.display().to_string(),
            reason,
        };
        // Relative, it would be looked up from the agent's own directory.
        if !node.host_path.is_absolute() {
            return Err(fail("not an absolute path".into()));
        }
        let described = node.kind.is_some() && node.major.is_some() && node.minor.is_some();
        let host = if described {
            std::fs::metadata(node.host_path).ok()
        } else {
            // Followed: /dev/serial/by-id/... names are links to the node.
            Some(std::fs::metadata(node.host_path).map_err(|e| fail(e.to_string()))?)
        };
        let host_kind = host.as_ref().and_then(|m| {
            let t = m.file_type();
            if t.is_char_device() {
                Some("c")
            } else if t.is_block_device() {
                Some("b")
            } else {
                None
            }
        });
        let kind = match (node.kind, host_kind) {
            (Some(k @ ("c" | "b" | "u" | "p")), _) => k.to_owned(),
            (Some(k), _) => return Err(fail(format!("type {k:?} is not c, b, u or p"))),
            (None, Some(k)) => k.to_owned(),
            (None, None) => return Err(fail("not a device node".into())),
        };
        let rdev = host.as_ref().map(|m| m.rdev()).unwrap_or(0);
        let major = node
            .major
            .unwrap_or_else(|| i64::from(nix::sys::stat::major(rdev) as u32));
        let minor = node
            .minor
            .unwrap_or_else(|| i64::from(nix::sys::stat::minor(rdev) as u32));
        if self.nodes.iter().any(|n| n["path"] == node.path) {
            return Ok(());
        }
        let mode = node
            .file_mode
            .or_else(|| host.as_ref().map(|m| m.permissions().mode() & 0o777))
            .unwrap_or(0o666);
        let mut entry = json!({
            "path": node.path,
            "type": kind,
            "major": major,
            "minor": minor,
            "fileMode": mode,
        });
        if let Some(uid) = node.uid.or_else(|| host.as_ref().map(|m| m.uid())) {
            entry["uid"] = json!(uid);
        }
        if let Some(gid) = node.gid.or_else(|| host.as_ref().map(|m| m.gid())) {
            entry["gid"] = json!(gid);
        }
        self.nodes.push(entry);
        // A FIFO needs no rule; "u" is a character device unbuffered.
        if kind != "p" {
            let rule_kind = if kind == "u" { "c" } else { kind.as_str() };
            self.rules.push(json!({
                "allow": true,
                "type": rule_kind,
                "major": major,
                "minor": minor,
                "access": permissions,
            }));
        }
        Ok(())
    }
}

struct Node<'a> {
    path: &'a str,
    host_path: &'a Path,
    permissions: &'a str,
    kind: Option<&'a str>,
    major: Option<i64>,
    minor: Option<i64>,
    file_mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
}

fn absolute(what: &'static str, path: &str) -> Result<(), DeviceEditError> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(DeviceEditError::Relative {
            what,
            path: path.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::api::{DeviceSpec, Mount as PluginMount};

    fn plugin_device(host: &str, container: &str, permissions: &str) -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            devices: vec![DeviceSpec {
                container_path: container.into(),
                host_path: host.into(),
                permissions: permissions.into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_plugins_device_node_gets_its_host_numbers_and_a_rule() {
        let edits = DeviceEdits::resolve(&plugin_device("/dev/null", "/dev/serial0", "rw"), &[])
            .unwrap_or_default();
        assert_eq!(edits.nodes.len(), 1);
        assert_eq!(edits.nodes[0]["path"], "/dev/serial0");
        assert_eq!(edits.nodes[0]["type"], "c");
        assert_eq!(
            (
                edits.nodes[0]["major"].as_i64(),
                edits.nodes[0]["minor"].as_i64()
            ),
            (Some(1), Some(3))
        );
        assert_eq!(
            edits.rules,
            [json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rw"})]
        );
    }

    #[test]
    fn what_is_not_a_device_node_is_refused() {
        let not_a_device = DeviceEdits::resolve(&plugin_device("/etc/hostname", "/dev/x", ""), &[]);
        assert!(matches!(not_a_device, Err(DeviceEditError::Node { .. })));
        let missing = DeviceEdits::resolve(&plugin_device("/nonexistent/dev", "/dev/x", ""), &[]);
        assert!(matches!(missing, Err(DeviceEditError::Node { .. })));
        let relative = DeviceEdits::resolve(&plugin_device("/dev/null", "dev/x", ""), &[]);
        assert!(matches!(relative, Err(DeviceEditError::Relative { .. })));
        // From the agent's working directory, `/` under systemd, would be
        // found: refused for being relative instead.
        let relative_host = DeviceEdits::resolve(&plugin_device("dev/null", "/dev/x", ""), &[]);
        assert!(
            matches!(&relative_host, Err(DeviceEditError::Node { reason, .. }) if reason.contains("absolute")),
            "{relative_host:?}"
        );
        let odd = DeviceEdits::resolve(&plugin_device("/dev/null", "/dev/x", "rwx"), &[]);
        assert_eq!(odd, Err(DeviceEditError::Permissions("rwx".into())));
        let mount = ContainerAllocateResponse {
            mounts: vec![PluginMount {
                container_path: "etc".into(),
                host_path: "/etc".into(),
                read_only: true,
            }],
            ..Default::default()
        };
        assert!(DeviceEdits::resolve(&mount, &[]).is_err());
    }

    #[test]
    fn cdi_names_from_the_answer_and_its_annotations_are_resolved() {
        let dir = crate::state::TestDir::new("cdi-edits");
        let spec = r#"{"cdiVersion": "0.6.0", "kind": "example.com/serial",
          "devices": [
            {"name": "s0", "containerEdits": {
              "env": ["PORT=s0"],
              "deviceNodes": [{"path": "/dev/s0", "hostPath": "/dev/zero", "permissions": "r"}],
              "mounts": [{"hostPath": "/etc", "containerPath": "/host-etc", "options": ["ro"]}],
              "hooks": [{"hookName": "createContainer", "path": "/bin/true", "timeout": 5}],
              "additionalGids": [0, 20]}},
            {"name": "s1", "containerEdits": {"deviceNodes": [{"path": "/dev/s1", "type": "c", "major": 1, "minor": 7}]}}
          ]}"#;
        std::fs::write(dir.0.join("serial.json"), spec).unwrap();
        let plugin = ContainerAllocateResponse {
            cdi_devices: vec!["example.com/serial=s0".into()],
            annotations: [(
                "cdi.k8s.io/serial_s1".to_owned(),
                "example.com/serial=s1".to_owned(),
            )]
            .into(),
            envs: [("PORT".to_owned(), "plugin".to_owned())].into(),
            ..Default::default()
        };
        let edits = DeviceEdits::resolve(&plugin, std::slice::from_ref(&dir.0)).unwrap_or_default();
        assert_eq!(edits.env, [("PORT".to_owned(), "s0".to_owned())]);
        let paths: Vec<&Value> = edits.nodes.iter().map(|n| &n["path"]).collect();
        assert_eq!(paths, ["/dev/s0", "/dev/s1"]);
        assert_eq!(edits.rules[0]["access"], "r");
        assert_eq!(edits.rules[1]["minor"], 7);
        assert_eq!(edits.mounts[0].options, ["ro", "rbind"]);
        assert_eq!(edits.hooks["createContainer"][0]["timeout"], 5);
        assert_eq!(edits.additional_gids, [20]);
        // A name no spec has fails the container, naming it.
        let unknown = ContainerAllocateResponse {
            cdi_devices: vec!["example.com/serial=s9".into()],
            ..Default::default()
        };
        assert_eq!(
            DeviceEdits::resolve(&unknown, std::slice::from_ref(&dir.0)),
            Err(DeviceEditError::Cdi(CdiError::Unresolvable(
                "example.com/serial=s9".into()
            )))
        );
    }
}
