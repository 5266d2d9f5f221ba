//! The API objects a pod's volumes and environment read (ConfigMaps,
//! Secrets, service account tokens), as plain data: fetched by the agent,
//! checkpointed with the pod (mode 0600) so that the pod can start again
//! after a reboot without the API server, and read by `env` and `volumes`.

use std::collections::BTreeMap;

use base64::Engine;
use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{EnvValue, Pod, ProjectionSource, VolumeSource};

/// Keys to bytes; serialised as base64, as Secrets are in the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectData(pub BTreeMap<String, Vec<u8>>);

impl Serialize for ObjectData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let engine = base64::engine::general_purpose::STANDARD;
        let encoded: BTreeMap<&String, String> =
            self.0.iter().map(|(k, v)| (k, engine.encode(v))).collect();
        encoded.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ObjectData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let engine = base64::engine::general_purpose::STANDARD;
        let encoded = BTreeMap::<String, String>::deserialize(d)?;
        encoded
            .into_iter()
            .map(|(k, v)| {
                engine
                    .decode(v)
                    .map(|bytes| (k, bytes))
                    .map_err(serde::de::Error::custom)
            })
            .collect::<Result<_, _>>()
            .map(ObjectData)
    }
}

impl ObjectData {
    /// A ConfigMap's `data` and `binaryData`.
    pub fn from_config_map(value: &serde_json::Value) -> ObjectData {
        let mut map = BTreeMap::new();
        if let Some(data) = value.get("data").and_then(|d| d.as_object()) {
            for (k, v) in data {
                map.insert(k.clone(), v.as_str().unwrap_or("").as_bytes().to_vec());
            }
        }
        decode_into(value.get("binaryData"), &mut map);
        ObjectData(map)
    }

    /// A Secret's `data` (base64 in the API).
    pub fn from_secret(value: &serde_json::Value) -> ObjectData {
        let mut map = BTreeMap::new();
        decode_into(value.get("data"), &mut map);
        ObjectData(map)
    }
}

fn decode_into(data: Option<&serde_json::Value>, map: &mut BTreeMap<String, Vec<u8>>) {
    let engine = base64::engine::general_purpose::STANDARD;
    if let Some(data) = data.and_then(|d| d.as_object()) {
        for (k, v) in data {
            if let Some(bytes) = v.as_str().and_then(|s| engine.decode(s).ok()) {
                map.insert(k.clone(), bytes);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceAccountToken {
    pub token: String,
    pub issued: Timestamp,
    pub expires: Timestamp,
}

impl ServiceAccountToken {
    /// Upstream's token manager renews at 80 % of the lifetime, or after
    /// 24 hours, whichever comes first.
    pub fn needs_refresh(&self, now: Timestamp) -> bool {
        let lifetime = self.expires.as_second() - self.issued.as_second();
        let age = now.as_second() - self.issued.as_second();
        age * 10 >= lifetime * 8 || age >= 24 * 3600
    }
}

/// A Service whose variables containers get (`{NAME}_SERVICE_HOST`...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceLink {
    pub name: String,
    pub cluster_ip: String,
    pub ports: Vec<ServiceLinkPort>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceLinkPort {
    #[serde(default)]
    pub name: String,
    pub port: i32,
    pub protocol: String,
}

impl ServiceLink {
    /// A Service as the API returns it; None without a cluster IP
    /// (headless or ExternalName), which gets no variables upstream.
    pub fn from_service(service: &serde_json::Value) -> Option<ServiceLink> {
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        let cluster_ip = text(&service["spec"]["clusterIP"]);
        if cluster_ip.is_empty() || cluster_ip == "None" {
            return None;
        }
        let ports = service["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some(ServiceLinkPort {
                    name: text(&p["name"]),
                    port: i32::try_from(p["port"].as_i64()?).ok()?,
                    protocol: p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                })
            })
            .collect();
        Some(ServiceLink {
            name: text(&service["metadata"]["name"]),
            cluster_ip,
            ports,
        })
    }
}

/// Everything a pod reads from the API server, by name in its namespace.
/// `None` records an object that does not exist (fine if optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodObjects {
    pub config_maps: BTreeMap<String, Option<ObjectData>>,
    pub secrets: BTreeMap<String, Option<ObjectData>>,
    /// By [`token_key`].
    pub tokens: BTreeMap<String, ServiceAccountToken>,
    /// The Services whose variables the pod's containers get, as last read
    /// (`None`: never read).
    #[serde(default)]
    pub services: Option<Vec<ServiceLink>>,
    /// The handler of the pod's RuntimeClass, once read: a sandbox made
    /// again after a reboot needs no API server for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_handler: Option<String>,
}

/// A service account token source of a pod: the token's audience and
/// lifetime identify it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequestSpec {
    pub audience: Option<String>,
    pub expiration_seconds: i64,
}

pub fn token_key(spec: &TokenRequestSpec) -> String {
    format!(
        "{}|{}",
        spec.audience.as_deref().unwrap_or(""),
        spec.expiration_seconds
    )
}

/// What a pod needs from the API server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    pub config_maps: Vec<String>,
    pub secrets: Vec<String>,
    pub tokens: Vec<TokenRequestSpec>,
}

impl References {
    pub fn is_empty(&self) -> bool {
        self.config_maps.is_empty() && self.secrets.is_empty() && self.tokens.is_empty()
    }
}

fn add(list: &mut Vec<String>, name: &str) {
    if !list.iter().any(|n| n == name) {
        list.push(name.to_owned());
    }
}

pub fn references(pod: &Pod) -> References {
    let mut refs = References::default();
    for volume in &pod.volumes {
        if let VolumeSource::Projected(projection) = &volume.source {
            for source in &projection.sources {
                match source {
                    ProjectionSource::ConfigMap { name, .. } => add(&mut refs.config_maps, name),
                    ProjectionSource::Secret { name, .. } => add(&mut refs.secrets, name),
                    ProjectionSource::ServiceAccountToken {
                        audience,
                        expiration_seconds,
                        ..
                    } => {
                        let spec = TokenRequestSpec {
                            audience: audience.clone(),
                            expiration_seconds: *expiration_seconds,
                        };
                        if !refs.tokens.contains(&spec) {
                            refs.tokens.push(spec);
                        }
                    }
                    ProjectionSource::DownwardApi { .. } => {}
                }
            }
        }
    }
    for name in &pod.image_pull_secrets {
        add(&mut refs.secrets, name);
    }
    for container in pod.every_container() {
        for var in &container.env {
            match &var.value {
                EnvValue::ConfigMapKey { name, .. } => add(&mut refs.config_maps, name),
                EnvValue::SecretKey { name, .. } => add(&mut refs.secrets, name),
                _ => {}
            }
        }
        for from in &container.env_from {
            if from.secret {
                add(&mut refs.secrets, &from.name);
            } else {
                add(&mut refs.config_maps, &from.name);
            }
        }
    }
    refs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_round_trips_through_base64() {
        let cm = serde_json::json!({"data": {"a": "x"}, "binaryData": {"b": "AAE="}});
        let data = ObjectData::from_config_map(&cm);
        assert_eq!(data.0["a"], b"x");
        assert_eq!(data.0["b"], vec![0, 1]);
        let text = serde_json::to_string(&data).unwrap();
        assert_eq!(text, r#"{"a":"eA==","b":"AAE="}"#);
        assert_eq!(serde_json::from_str::<ObjectData>(&text).unwrap(), data);
    }

    #[test]
    fn tokens_refresh_at_eighty_percent() {
        let t = |s| Timestamp::from_second(s).unwrap();
        let token = ServiceAccountToken {
            token: "t".into(),
            issued: t(1000),
            expires: t(1000 + 3600),
        };
        assert!(!token.needs_refresh(t(1000 + 2879)));
        assert!(token.needs_refresh(t(1000 + 2880)));
    }
}
