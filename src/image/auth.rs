//! Registry credentials: from `kubernetes.io/dockerconfigjson` (and the
//! older `kubernetes.io/dockercfg`) Secrets and from the node's Docker
//! `config.json`, keyed by registry as references name them.

use std::collections::BTreeMap;

use base64::Engine;
use serde::Deserialize;

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        write!(f, "Credentials({})", self.username)
    }
}

impl Credentials {
    /// The `Authorization: Basic` value.
    pub fn basic(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// Registry (`docker.io`, `127.0.0.1:5000`) → credentials.
pub type RegistryAuth = BTreeMap<String, Credentials>;

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    auth: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// `https://index.docker.io/v1/`, `registry.example:5000/v2`, ... → the
/// registry as a reference names it.
fn registry_key(key: &str) -> String {
    let host = key
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_owned()
        }
        _ => host,
    }
}

/// Parses a `.dockerconfigjson` (`{"auths": {...}}`) or a `.dockercfg`
/// (the map alone) into `into`; entries already there win, as the first
/// secret listed wins upstream.
pub fn parse_docker_config(data: &[u8], into: &mut RegistryAuth) -> Result<(), String> {
    let auths = match serde_json::from_slice::<DockerConfig>(data) {
        Ok(config) if !config.auths.is_empty() => config.auths,
        _ => serde_json::from_slice::<BTreeMap<String, Entry>>(data)
            .map_err(|e| format!("not a Docker config: {e}"))?,
    };
    for (key, entry) in auths {
        let creds = if !entry.auth.is_empty() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(entry.auth.trim())
                .map_err(|_| format!("{key}: auth is not base64"))?;
            let text =
                String::from_utf8(decoded).map_err(|_| format!("{key}: auth is not text"))?;
            let (user, pass) = text
                .split_once(':')
                .ok_or_else(|| format!("{key}: auth is not user:password"))?;
            Credentials {
                username: user.to_owned(),
                password: pass.to_owned(),
            }
        } else {
            Credentials {
                username: entry.username,
                password: entry.password,
            }
        };
        into.entry(registry_key(&key)).or_insert(creds);
    }
    Ok(())
}

pub fn lookup<'a>(auth: &'a RegistryAuth, registry: &str) -> Option<&'a Credentials> {
    auth.get(registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_configs() {
        let mut auth = RegistryAuth::new();
        let json = br#"{"auths": {"https://index.docker.io/v1/": {"auth": "dTpw"}, "127.0.0.1:5000": {"username": "a", "password": "b"}}}"#;
        parse_docker_config(json, &mut auth).unwrap();
        assert_eq!(auth["docker.io"].username, "u");
        assert_eq!(auth["docker.io"].password, "p");
        assert_eq!(auth["127.0.0.1:5000"].basic(), "Basic YTpi");
        // The older format, and the first entry wins.
        parse_docker_config(br#"{"docker.io": {"auth": "eDp5"}}"#, &mut auth).unwrap();
        assert_eq!(auth["docker.io"].username, "u");
        assert!(parse_docker_config(b"[]", &mut auth).is_err());
        assert_eq!(format!("{:?}", auth["docker.io"]), "Credentials(u)");
    }
}
