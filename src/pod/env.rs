//! A container's environment as upstream computes it: `envFrom` first, then
//! `env`, each value with `$(VAR)` references to earlier variables expanded;
//! values from ConfigMaps, Secrets, the downward API and resource fields.

use super::objects::{ObjectData, PodObjects, ServiceLink, ServiceLinkPort};
use super::{Container, EnvValue, Pod, ResourceRef};
use crate::quantity;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    KeyNotFound {
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    #[error("{0}: unsupported field path")]
    Field(String),
    #[error("{0}: no such container")]
    Container(String),
    #[error("{resource}: invalid divisor {divisor:?}")]
    Divisor { resource: String, divisor: String },
}

/// What the downward API reads beyond the pod itself.
#[derive(Debug, Clone, Default)]
pub struct Downward {
    pub node_name: String,
    pub host_ip: Option<String>,
    pub pod_ips: Vec<String>,
    /// Allocatable CPU (millicores) and memory: the value of a limit the
    /// container does not set, as upstream.
    pub node_cpu_milli: u64,
    pub node_memory: u64,
}

/// The value of a downward API field path.
pub fn field_value(pod: &Pod, path: &str, downward: &Downward) -> Result<String, EnvError> {
    let meta = &pod.manifest.metadata;
    let map_entry = |map: &Option<std::collections::BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key).cloned())
            .unwrap_or_default()
    };
    let all = |map: &Option<std::collections::BTreeMap<String, String>>| {
        // As upstream writes them: key="value" lines, sorted, quoted as Go's %q.
        map.iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let bracketed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
    };
    Ok(match path {
        "metadata.name" => pod.name.clone(),
        "metadata.namespace" => pod.namespace.clone(),
        "metadata.uid" => pod.uid.clone(),
        "metadata.labels" => all(&meta.labels),
        "metadata.annotations" => all(&meta.annotations),
        "spec.nodeName" => downward.node_name.clone(),
        "spec.serviceAccountName" => pod
            .manifest
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => downward.host_ip.clone().unwrap_or_default(),
        "status.hostIPs" => downward.host_ip.clone().unwrap_or_default(),
        "status.podIP" => downward.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => downward.pod_ips.join(","),
        _ => {
            if let Some(key) = bracketed("metadata.labels") {
                map_entry(&meta.labels, key)
            } else if let Some(key) = bracketed("metadata.annotations") {
                map_entry(&meta.annotations, key)
            } else {
                return Err(EnvError::Field(path.to_owned()));
            }
        }
    })
}

/// A container's request or limit in units of the divisor, rounded up; a
/// limit the container does not set is the node's allocatable.
pub fn resource_value(
    pod: &Pod,
    default_container: &str,
    r: &ResourceRef,
    downward: &Downward,
) -> Result<String, EnvError> {
    let name = r.container.as_deref().unwrap_or(default_container);
    let container = pod
        .containers
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| EnvError::Container(name.to_owned()))?;
    let divisor_err = || EnvError::Divisor {
        resource: r.resource.clone(),
        divisor: r.divisor.clone(),
    };
    let divisor = quantity::parse_milli(&r.divisor).map_err(|_| divisor_err())?;
    if divisor == 0 {
        return Err(divisor_err());
    }
    let res = &container.resources;
    // In thousandths of the unit, as the divisor.
    let milli: u128 = match r.resource.as_str() {
        "limits.cpu" => u128::from(res.cpu_limit_milli.unwrap_or(downward.node_cpu_milli)),
        "requests.cpu" => u128::from(res.cpu_request_milli.unwrap_or(0)),
        "limits.memory" => u128::from(res.memory_limit.unwrap_or(downward.node_memory)) * 1000,
        "requests.memory" => u128::from(res.memory_request.unwrap_or(0)) * 1000,
        other => return Err(EnvError::Field(other.to_owned())),
    };
    Ok(milli.div_ceil(divisor).to_string())
}

/// Expands `$(NAME)` with the variables defined so far; `$$` escapes a
/// `$`; an undefined reference stays as written, as upstream.
pub fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn lookup<'a>(
    objects: &'a std::collections::BTreeMap<String, Option<ObjectData>>,
    name: &str,
) -> Option<&'a ObjectData> {
    objects.get(name).and_then(Option::as_ref)
}

/// Upstream's rule for names from envFrom: C identifier-like, no '='.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The container's variables, in order, values resolved and expanded.
pub fn resolve(
    pod: &Pod,
    container: &Container,
    objects: &PodObjects,
    downward: &Downward,
) -> Result<Vec<(String, String)>, EnvError> {
    // The services' variables first: the container's own override them.
    let mut env: Vec<(String, String)> =
        service_variables(objects.services.as_deref().unwrap_or_default());
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(key, _)| *key != k);
        env.push((k, v));
    };
    for from in &container.env_from {
        let (data, missing) = if from.secret {
            (
                lookup(&objects.secrets, &from.name),
                EnvError::SecretNotFound(from.name.clone()),
            )
        } else {
            (
                lookup(&objects.config_maps, &from.name),
                EnvError::ConfigMapNotFound(from.name.clone()),
            )
        };
        match data {
            Some(data) => {
                for (k, v) in &data.0 {
                    let name = format!("{}{k}", from.prefix);
                    if valid_env_name(&name) {
                        set(&mut env, name, String::from_utf8_lossy(v).into_owned());
                    }
                }
            }
            None if from.optional => {}
            None => return Err(missing),
        }
    }
    for var in &container.env {
        let key_of = |kind: &'static str,
                      objects: &std::collections::BTreeMap<String, Option<ObjectData>>,
                      name: &str,
                      key: &str,
                      optional: bool|
         -> Result<Option<String>, EnvError> {
            match lookup(objects, name) {
                Some(data) => match data.0.get(key) {
                    Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
                    None if optional => Ok(None),
                    None => Err(EnvError::KeyNotFound {
                        kind,
                        namespace: pod.namespace.clone(),
                        name: name.to_owned(),
                        key: key.to_owned(),
                    }),
                },
                None if optional => Ok(None),
                None if kind == "Secret" => Err(EnvError::SecretNotFound(name.to_owned())),
                None => Err(EnvError::ConfigMapNotFound(name.to_owned())),
            }
        };
        let value = match &var.value {
            EnvValue::Literal(text) => Some(expand(text, &env)),
            EnvValue::ConfigMapKey {
                name,
                key,
                optional,
            } => key_of("ConfigMap", &objects.config_maps, name, key, *optional)?,
            EnvValue::SecretKey {
                name,
                key,
                optional,
            } => key_of("Secret", &objects.secrets, name, key, *optional)?,
            EnvValue::Field(path) => Some(field_value(pod, path, downward)?),
            EnvValue::Resource(r) => Some(resource_value(pod, &container.name, r, downward)?),
        };
        if let Some(value) = value {
            set(&mut env, var.name.clone(), value);
        }
    }
    Ok(env)
}

/// The variables upstream gives a container for each Service (its
/// `envvars.FromServices`): `{NAME}_SERVICE_HOST` and `_SERVICE_PORT`, a
/// `_SERVICE_PORT_{PORT}` per named port, and Docker's link variables.
pub fn service_variables(services: &[ServiceLink]) -> Vec<(String, String)> {
    let upper = |name: &str| name.to_uppercase().replace('-', "_");
    let mut env = Vec::new();
    for service in services {
        let name = upper(&service.name);
        let ip = &service.cluster_ip;
        env.push((format!("{name}_SERVICE_HOST"), ip.clone()));
        let Some(first) = service.ports.first() else {
            continue;
        };
        env.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        for port in service.ports.iter().filter(|p| !p.name.is_empty()) {
            env.push((
                format!("{name}_SERVICE_PORT_{}", upper(&port.name)),
                port.port.to_string(),
            ));
        }
        let url = |p: &ServiceLinkPort| format!("{}://{ip}:{}", p.protocol.to_lowercase(), p.port);
        env.push((format!("{name}_PORT"), url(first)));
        for port in &service.ports {
            let prefix = format!("{name}_PORT_{}_{}", port.port, port.protocol.to_uppercase());
            env.push((prefix.clone(), url(port)));
            env.push((format!("{prefix}_PROTO"), port.protocol.to_lowercase()));
            env.push((format!("{prefix}_PORT"), port.port.to_string()));
            env.push((format!("{prefix}_ADDR"), ip.clone()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_as_upstream() {
        let env = vec![
            ("A".to_owned(), "x".to_owned()),
            ("B".to_owned(), "y".to_owned()),
        ];
        assert_eq!(expand("$(A)-$(B)", &env), "x-y");
        assert_eq!(expand("$$(A)", &env), "$(A)");
        assert_eq!(expand("$(C) $A $", &env), "$(C) $A $");
        assert_eq!(expand("$(A", &env), "$(A");
    }

    #[test]
    fn resolves_every_kind_of_value() {
        let doc = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "i:1",
                "resources": {"limits": {"memory": "64Mi", "cpu": "250m"}},
                "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"},
                            {"secretRef": {"name": "absent", "optional": true}}],
                "env": [
                    {"name": "LIT", "value": "$(CM_a)+$(NAME)"},
                    {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "LATE", "value": "$(NAME)"},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                    {"name": "CPUM", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}}
                ]}]}
        });
        let pod = crate::pod::validate(&doc, "api", "u1").unwrap();
        let mut objects = PodObjects::default();
        let data = |pairs: &[(&str, &str)]| {
            Some(ObjectData(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                    .collect(),
            ))
        };
        objects
            .config_maps
            .insert("cm".into(), data(&[("a", "1"), ("bad=", "x")]));
        objects
            .secrets
            .insert("s".into(), data(&[("pw", "hunter2")]));
        objects.secrets.insert("absent".into(), None);
        let downward = Downward {
            host_ip: Some("10.0.0.1".into()),
            ..Default::default()
        };
        let env = resolve(&pod, &pod.containers[0], &objects, &downward).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CM_a"), Some("1"));
        assert_eq!(get("CM_bad="), None);
        assert_eq!(get("LIT"), Some("1+$(NAME)"));
        assert_eq!(get("LATE"), Some("p"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("HOST"), Some("10.0.0.1"));
        assert_eq!(get("PASS"), Some("hunter2"));
        assert_eq!(get("MEM"), Some("64"));
        assert_eq!(get("CPU"), Some("1"));
        assert_eq!(get("CPUM"), Some("250"));

        objects.secrets.remove("s");
        assert_eq!(
            resolve(&pod, &pod.containers[0], &objects, &downward),
            Err(EnvError::SecretNotFound("s".into()))
        );
        objects.secrets.insert("s".into(), data(&[]));
        assert_eq!(
            resolve(&pod, &pod.containers[0], &objects, &downward)
                .unwrap_err()
                .to_string(),
            "couldn't find key pw in Secret ns/s"
        );
    }

    /// What a pod next to `kubernetes` and a two-port `web-cache` gets.
    #[test]
    fn service_variables_as_upstream() {
        let port = |name: &str, port: i32, protocol: &str| ServiceLinkPort {
            name: name.into(),
            port,
            protocol: protocol.into(),
        };
        let services = [
            ServiceLink {
                name: "kubernetes".into(),
                cluster_ip: "10.96.0.1".into(),
                ports: vec![port("https", 443, "TCP")],
            },
            ServiceLink {
                name: "web-cache".into(),
                cluster_ip: "10.96.0.20".into(),
                ports: vec![port("", 80, "TCP"), port("dns", 53, "UDP")],
            },
        ];
        let env = service_variables(&services);
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get("WEB_CACHE_SERVICE_PORT"), Some("80"));
        assert_eq!(get("WEB_CACHE_SERVICE_PORT_DNS"), Some("53"));
        assert_eq!(get("WEB_CACHE_PORT_53_UDP"), Some("udp://10.96.0.20:53"));
        assert_eq!(get("WEB_CACHE_PORT_53_UDP_PROTO"), Some("udp"));
        assert_eq!(env.len(), 8 + 12);
    }
}
