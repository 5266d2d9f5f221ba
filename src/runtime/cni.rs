//! The pod network through CNI plugins, as the CNI spec (0.3.0–1.1.0) has a
//! runtime call them: the first network configuration in the configured
//! directory, its plugins chained for ADD (each given the previous result),
//! run in reverse for DEL and in order for CHECK, with the pod's identity in
//! `CNI_ARGS` and its host ports as the `portMappings` runtime config.
//!
//! What was attached is recorded in the pod's dir before and after ADD, so
//! that DEL runs with the configuration ADD used even after a crash, a
//! reboot or a changed configuration directory.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures_lite::{AsyncWriteExt, FutureExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("network config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("failed to find plugin {plugin:?} in path {dirs:?}")]
    PluginMissing { plugin: String, dirs: Vec<PathBuf> },
    #[error("plugin type={plugin:?} name={network:?} failed ({command}): {message}")]
    Plugin {
        plugin: String,
        network: String,
        command: &'static str,
        message: String,
    },
    #[error(transparent)]
    State(#[from] crate::state::StateError),
}

/// Versions of the spec nanolet speaks; 0.3.x without CHECK.
const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// A plugin that hangs must not hold the pod forever.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The pod's interface, as every Kubernetes runtime names it.
pub const IFNAME: &str = "eth0";
const RECORD: &str = "network.json";

/// Where network configurations and plugins are.
#[derive(Debug, Clone)]
pub struct Cni {
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
    /// Records of attachments whose DEL failed, retried later.
    pub parked_dir: PathBuf,
}

/// A network configuration list (a single-plugin `.conf` becomes a list of
/// one, as libcni converts it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkList {
    pub name: String,
    pub cni_version: String,
    pub disable_check: bool,
    pub plugins: Vec<Map<String, Value>>,
}

/// A host port of the pod, as the portmap plugin reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: i32,
    pub container_port: i32,
    pub protocol: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

/// One attachment of a pod to a network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    pub container_id: String,
    pub netns: PathBuf,
    /// `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, ... for `CNI_ARGS`.
    pub args: Vec<(String, String)>,
    pub port_mappings: Vec<PortMapping>,
}

/// What the pod's dir remembers of its network.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    network: NetworkList,
    attachment: Attachment,
    /// The ADD result; `None` while ADD has not finished.
    result: Option<Value>,
}

impl Cni {
    /// The network to attach new pods to: the first `.conf`, `.conflist` or
    /// `.json` file in lexical order. `None` when the directory has none.
    pub fn network(&self) -> Result<Option<(PathBuf, NetworkList)>, CniError> {
        let entries = match std::fs::read_dir(&self.conf_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CniError::Io {
                    path: self.conf_dir.clone(),
                    source,
                });
            }
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("conf" | "conflist" | "json")
                )
            })
            .collect();
        files.sort();
        let Some(path) = files.into_iter().next() else {
            return Ok(None);
        };
        let text = std::fs::read(&path).map_err(|source| CniError::Io {
            path: path.clone(),
            source,
        })?;
        let list = parse_network(&text).map_err(|message| CniError::Config {
            path: path.clone(),
            message,
        })?;
        Ok(Some((path, list)))
    }

    /// The plugin types of `network` that are in none of the plugin dirs.
    pub fn missing_plugins(&self, network: &NetworkList) -> Vec<String> {
        network
            .plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str))
            .filter(|kind| self.plugin_path(kind).is_err())
            .map(str::to_owned)
            .collect()
    }

    fn plugin_path(&self, plugin: &str) -> Result<PathBuf, CniError> {
        if !plugin.contains('/') {
            for dir in &self.bin_dirs {
                let candidate = dir.join(plugin);
                if candidate.is_file() {
                    return Ok(candidate);
                }
            }
        }
        Err(CniError::PluginMissing {
            plugin: plugin.to_owned(),
            dirs: self.bin_dirs.clone(),
        })
    }

    /// Attaches the pod whose dir is `pod_dir` unless its record says it is
    /// attached to this very namespace already (then CHECK, where the
    /// version has it). A record of an unfinished ADD, or of a namespace that
    /// is gone (a reboot), is undone first. Returns the pod's IPs.
    pub async fn attach(
        &self,
        pod_dir: &Path,
        network: &NetworkList,
        attachment: &Attachment,
        namespace_is_new: bool,
    ) -> Result<Vec<IpAddr>, CniError> {
        if let Some(record) = read_record(pod_dir)? {
            match &record.result {
                Some(result)
                    if !namespace_is_new && record.attachment.netns == attachment.netns =>
                {
                    // A failed CHECK is reported, not fatal: the pod runs on
                    // the network it has, as upstream (which never CHECKs).
                    if let Err(e) = self
                        .check(&record.network, &record.attachment, result)
                        .await
                    {
                        log::warn!("{}: {e}", pod_dir.display());
                    }
                    return Ok(result_ips(result));
                }
                _ => {
                    if let Err(e) = self.detach(pod_dir).await {
                        // A reboot or a changed network must not keep the
                        // pod from starting: the old attachment waits.
                        log::warn!("{}: {e}; retrying its DEL later", pod_dir.display());
                        self.park(pod_dir)?;
                    }
                }
            }
        }
        let wants_ports = !attachment.port_mappings.is_empty();
        if wants_ports
            && !network
                .plugins
                .iter()
                .any(|p| has_capability(p, "portMappings"))
        {
            return Err(CniError::Config {
                path: self.conf_dir.clone(),
                message: format!(
                    "network {:?} has no plugin with the portMappings capability, so the pod's hostPort cannot be set up",
                    network.name
                ),
            });
        }
        let mut record = Record {
            network: network.clone(),
            attachment: attachment.clone(),
            result: None,
        };
        write_record(pod_dir, &record).await?;
        let mut previous: Option<Value> = None;
        for plugin in &network.plugins {
            let config = plugin_config(network, plugin, previous.take(), attachment);
            let output = self
                .invoke("ADD", network, plugin, &config, attachment)
                .await?;
            previous = Some(output);
        }
        let result = previous.unwrap_or_else(|| json!({"cniVersion": network.cni_version}));
        let ips = result_ips(&result);
        record.result = Some(result);
        write_record(pod_dir, &record).await?;
        Ok(ips)
    }

    async fn check(
        &self,
        network: &NetworkList,
        attachment: &Attachment,
        result: &Value,
    ) -> Result<(), CniError> {
        if network.disable_check || !version_at_least(&network.cni_version, (0, 4)) {
            return Ok(());
        }
        for plugin in &network.plugins {
            let config = plugin_config(network, plugin, Some(result.clone()), attachment);
            self.invoke("CHECK", network, plugin, &config, attachment)
                .await?;
        }
        Ok(())
    }

    /// Detaches what the pod's record says was attached (also a half-done
    /// ADD), in reverse plugin order, then forgets it. Without a record
    /// there is nothing to do, so it may be repeated.
    pub async fn detach(&self, pod_dir: &Path) -> Result<(), CniError> {
        let Some(record) = read_record(pod_dir)? else {
            return Ok(());
        };
        self.delete(&record).await?;
        remove_if_there(&pod_dir.join(RECORD))
    }

    /// DEL of what `record` attached, plugins in reverse order.
    async fn delete(&self, record: &Record) -> Result<(), CniError> {
        let mut attachment = record.attachment.clone();
        // Plugins treat an empty netns as "already gone" and release only
        // what lives outside it (addresses, host rules, the host veth end).
        if !crate::mount::is_mounted(&attachment.netns) {
            attachment.netns = PathBuf::new();
        }
        let previous = record
            .result
            .clone()
            .filter(|_| version_at_least(&record.network.cni_version, (0, 4)));
        for plugin in record.network.plugins.iter().rev() {
            let config = plugin_config(&record.network, plugin, previous.clone(), &attachment);
            self.invoke("DEL", &record.network, plugin, &config, &attachment)
                .await?;
        }
        Ok(())
    }

    /// Keeps the record of a pod whose DEL failed, so that its addresses
    /// and host rules are released later ([`Cni::retry_parked`]) even though
    /// the pod's dir goes.
    pub fn park(&self, pod_dir: &Path) -> Result<(), CniError> {
        let from = pod_dir.join(RECORD);
        if !from.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.parked_dir).map_err(|source| CniError::Io {
            path: self.parked_dir.clone(),
            source,
        })?;
        let name = pod_dir.file_name().unwrap_or_default().to_string_lossy();
        let to = self
            .parked_dir
            .join(format!("{name}-{}.json", crate::state::random_hex()));
        std::fs::rename(&from, &to).map_err(|source| CniError::Io { path: to, source })
    }

    /// DEL for every parked record; each that succeeds is forgotten.
    pub async fn retry_parked(&self) {
        let Ok(entries) = std::fs::read_dir(&self.parked_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let record = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
            let Some(record) = record else {
                log::warn!("{}: unreadable CNI record; removing it", path.display());
                let _ = remove_if_there(&path);
                continue;
            };
            match self.delete(&record).await {
                Ok(()) => {
                    log::info!(
                        "released the network of pod {}",
                        record.attachment.container_id
                    );
                    let _ = remove_if_there(&path);
                }
                Err(e) => log::warn!("{e} (kept for the next try)"),
            }
        }
    }

    async fn invoke(
        &self,
        command: &'static str,
        network: &NetworkList,
        plugin: &Map<String, Value>,
        config: &Value,
        attachment: &Attachment,
    ) -> Result<Value, CniError> {
        let kind = plugin.get("type").and_then(Value::as_str).unwrap_or("");
        let failed = |message: String| CniError::Plugin {
            plugin: kind.to_owned(),
            network: network.name.clone(),
            command,
            message,
        };
        let path = self.plugin_path(kind)?;
        let cni_args = attachment
            .args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .fold(String::from("IgnoreUnknown=1"), |acc, kv| acc + ";" + &kv);
        let cni_path = std::env::join_paths(&self.bin_dirs).unwrap_or_default();
        let mut child = async_process::Command::new(&path)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &attachment.container_id)
            .env("CNI_NETNS", &attachment.netns)
            .env("CNI_IFNAME", IFNAME)
            .env("CNI_ARGS", cni_args)
            .env("CNI_PATH", cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot run {}: {e}", path.display())))?;
        let input = serde_json::to_vec(config).unwrap_or_default();
        if let Some(mut stdin) = child.stdin.take() {
            // A plugin may exit without reading (an early error): its
            // output says why, not the broken pipe.
            let _ = stdin.write_all(&input).await;
        }
        let output = async { Some(child.output().await) }
            .or(async {
                smol::Timer::after(PLUGIN_TIMEOUT).await;
                None
            })
            .await
            .ok_or_else(|| failed(format!("no answer within {PLUGIN_TIMEOUT:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        let parsed: Option<Value> = serde_json::from_slice(&output.stdout).ok();
        if !output.status.success() {
            let message = parsed
                .as_ref()
                .and_then(|v| {
                    let msg = v.get("msg")?.as_str()?;
                    Some(match v.get("details").and_then(Value::as_str) {
                        Some(d) if !d.is_empty() => format!("{msg}: {d}"),
                        _ => msg.to_owned(),
                    })
                })
                .unwrap_or_else(|| {
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    format!("{}: {}", output.status, stderr.trim())
                });
            return Err(failed(message));
        }
        match command {
            "ADD" => parsed.ok_or_else(|| failed("result is not JSON".into())),
            _ => Ok(Value::Null),
        }
    }
}

fn version_at_least(version: &str, min: (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= min
}

/// Parses a `.conflist` or a single plugin's `.conf`, choosing the newest
/// version both the file (`cniVersions`, 1.1.0) and nanolet speak.
fn parse_network(text: &[u8]) -> Result<NetworkList, String> {
    let doc: Map<String, Value> =
        serde_json::from_slice(text).map_err(|e| format!("not a JSON object: {e}"))?;
    let name = doc
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("has no name")?
        .to_owned();
    let offered: Vec<&str> = match doc.get("cniVersions").and_then(Value::as_array) {
        Some(list) => list.iter().filter_map(Value::as_str).collect(),
        None => doc
            .get("cniVersion")
            .and_then(Value::as_str)
            .into_iter()
            .collect(),
    };
    let cni_version = VERSIONS
        .iter()
        .rev()
        .find(|v| offered.contains(v))
        .ok_or_else(|| format!("cniVersion {offered:?} is none of the supported {VERSIONS:?}"))?
        .to_string();
    let plugins = match doc.get("plugins") {
        Some(Value::Array(list)) => list
            .iter()
            .map(|p| p.as_object().cloned().ok_or("a plugin is not an object"))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("plugins is not a list".into()),
        // A single plugin's configuration.
        None => vec![doc.clone()],
    };
    if plugins.is_empty() {
        return Err("has no plugins".into());
    }
    for plugin in &plugins {
        if plugin
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err("a plugin has no type".into());
        }
    }
    Ok(NetworkList {
        name,
        cni_version,
        disable_check: doc.get("disableCheck").and_then(Value::as_bool) == Some(true),
        plugins,
    })
}

/// What one plugin reads on stdin: its own configuration with the list's
/// name and version, the previous result, and the runtime config for the
/// capabilities it declares.
fn plugin_config(
    network: &NetworkList,
    plugin: &Map<String, Value>,
    previous: Option<Value>,
    attachment: &Attachment,
) -> Value {
    let mut config = plugin.clone();
    config.insert("name".into(), Value::String(network.name.clone()));
    config.insert(
        "cniVersion".into(),
        Value::String(network.cni_version.clone()),
    );
    config.remove("cniVersions");
    if let Some(previous) = previous {
        config.insert("prevResult".into(), previous);
    }
    let mut runtime = Map::new();
    if has_capability(plugin, "portMappings") && !attachment.port_mappings.is_empty() {
        runtime.insert(
            "portMappings".into(),
            serde_json::to_value(&attachment.port_mappings).unwrap_or_default(),
        );
    }
    if !runtime.is_empty() {
        config.insert("runtimeConfig".into(), Value::Object(runtime));
    }
    Value::Object(config)
}

fn has_capability(plugin: &Map<String, Value>, capability: &str) -> bool {
    plugin
        .get("capabilities")
        .and_then(|c| c.get(capability))
        .and_then(Value::as_bool)
        == Some(true)
}

/// The addresses of a result (0.3.0 and later all list `ips`).
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    result
        .get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.get("address")?.as_str())
        .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
        .collect()
}

fn remove_if_there(path: &Path) -> Result<(), CniError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CniError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

fn read_record(pod_dir: &Path) -> Result<Option<Record>, CniError> {
    let path = pod_dir.join(RECORD);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| CniError::Config {
                path,
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CniError::Io { path, source }),
    }
}

/// Durable (fsynced, which is slow on SD cards): off the loop.
async fn write_record(pod_dir: &Path, record: &Record) -> Result<(), CniError> {
    let bytes = serde_json::to_vec_pretty(record).unwrap_or_default();
    let path = pod_dir.join(RECORD);
    crate::helpers::unblock(move || {
        crate::state::write_atomic(&path, &bytes, 0o600, crate::state::Durability::PowerLoss)
    })
    .await?;
    Ok(())
}

/// The pod's host ports, for the portmap plugin.
pub fn port_mappings(pod: &crate::pod::Pod) -> Vec<PortMapping> {
    let containers = pod
        .manifest
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let mut mappings = Vec::new();
    for port in containers.iter().flat_map(|c| c.ports.iter().flatten()) {
        if let Some(host_port) = port.host_port.filter(|p| *p > 0) {
            mappings.push(PortMapping {
                host_port,
                container_port: port.container_port,
                protocol: port.protocol.as_deref().unwrap_or("TCP").to_lowercase(),
                host_ip: port.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    mappings
}

/// The pod's identity in `CNI_ARGS`, as the upstream runtimes pass it.
pub fn pod_args(pod: &crate::pod::Pod) -> Vec<(String, String)> {
    let pairs = BTreeMap::from([
        ("K8S_POD_NAMESPACE", pod.namespace.as_str()),
        ("K8S_POD_NAME", pod.name.as_str()),
        ("K8S_POD_INFRA_CONTAINER_ID", pod.uid.as_str()),
        ("K8S_POD_UID", pod.uid.as_str()),
    ]);
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_single_plugins() {
        let list = parse_network(
            br#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        )
        .unwrap();
        assert_eq!(list.name, "pods");
        assert_eq!(list.plugins.len(), 2);
        let single =
            parse_network(br#"{"cniVersion":"0.4.0","name":"n","type":"bridge","bridge":"b0"}"#)
                .unwrap();
        assert_eq!(single.plugins[0]["bridge"], "b0");
        // 1.1.0 lists the versions it may be read as; the newest shared wins.
        let offered = parse_network(
            br#"{"cniVersions":["0.4.0","1.0.0","9.0.0"],"name":"n","plugins":[{"type":"x"}]}"#,
        )
        .unwrap();
        assert_eq!(offered.cni_version, "1.0.0");
        assert!(parse_network(br#"{"cniVersion":"0.2.0","name":"n","type":"x"}"#).is_err());
        assert!(parse_network(br#"{"cniVersion":"1.0.0","name":"n","plugins":[{}]}"#).is_err());
        assert!(parse_network(br#"{"cniVersion":"1.0.0","plugins":[{"type":"x"}]}"#).is_err());
    }

    #[test]
    fn plugin_config_carries_previous_result_and_requested_capabilities() {
        let list = parse_network(
            br#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        )
        .unwrap();
        let attachment = Attachment {
            container_id: "u1".into(),
            netns: "/x".into(),
            args: vec![],
            port_mappings: vec![PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: String::new(),
            }],
        };
        let bridge = plugin_config(&list, &list.plugins[0], None, &attachment);
        assert_eq!(bridge["name"], "pods");
        assert_eq!(bridge["cniVersion"], "1.0.0");
        assert!(bridge.get("runtimeConfig").is_none());
        assert!(bridge.get("prevResult").is_none());
        let previous = json!({"ips": [{"address": "10.22.0.5/16"}]});
        let portmap = plugin_config(&list, &list.plugins[1], Some(previous), &attachment);
        assert_eq!(
            portmap["runtimeConfig"]["portMappings"][0],
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp"})
        );
        assert_eq!(
            result_ips(&portmap["prevResult"]),
            vec!["10.22.0.5".parse::<IpAddr>().unwrap()]
        );
    }
}
