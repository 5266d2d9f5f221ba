//! The flags of `nanolet run` and `nanolet check`: one table, each flag a
//! field of the configuration file's documents. A flag writes its value
//! into that field and the file's checks then see it as if the file had it;
//! `nanolet help` is made from the same table.

use serde_yaml_ng::{Mapping, Value};

use super::ConfigError;
use super::document::{Documents, Kind};

/// How a flag's text becomes the field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Text,
    Bool,
    Integer,
    /// `a,b,c`: replaces the list.
    List,
    /// Repeatable: each adds to the list.
    Repeated,
    /// `k=v,k2=v2`: added to the map.
    KeyValues,
    /// `signal<quantity,...`: replaces the map.
    Thresholds,
}

struct Flag {
    name: &'static str,
    /// Upstream's older name for the same flag.
    alias: Option<&'static str>,
    document: Kind,
    field: &'static [&'static str],
    form: Form,
    /// The value's placeholder in the help.
    value: &'static str,
    help: &'static str,
    /// Fields of the file this flag makes meaningless: `--runtime crun`
    /// with a file naming runc's path means crun's path, not runc's.
    resets: &'static [&'static str],
}

const fn flag(
    name: &'static str,
    document: Kind,
    field: &'static [&'static str],
    form: Form,
    value: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        name,
        alias: None,
        document,
        field,
        form,
        value,
        help,
        resets: &[],
    }
}

use Form::*;
use Kind::{Kubelet, Nanolet};

#[rustfmt::skip]
const FLAGS: &[Flag] = &[
    Flag {
        alias: Some("pod-manifest-path"),
        ..flag("static-pod-path", Kubelet, &["staticPodPath"], Text, "DIR", "directory of pod manifests")
    },
    flag("pod-logs-dir", Kubelet, &["podLogsDir"], Text, "DIR", "container logs (/var/log/pods)"),
    flag("container-log-max-size", Kubelet, &["containerLogMaxSize"], Text, "Q", "a container log's size before it rotates (10Mi)"),
    flag("container-log-max-files", Kubelet, &["containerLogMaxFiles"], Integer, "N", "log files kept per container, at least 2 (5)"),
    flag("cgroup-root", Kubelet, &["cgroupRoot"], Text, "PATH", "parent cgroup of all pods (/)"),
    flag("pod-max-pids", Kubelet, &["podPidsLimit"], Integer, "N", "pids.max of every pod (-1: unlimited)"),
    flag("oom-score-adj", Kubelet, &["oomScoreAdj"], Integer, "N", "the agent's own oom_score_adj (-999)"),
    flag("address", Kubelet, &["address"], Text, "IP", "the kubelet API's address (0.0.0.0)"),
    flag("port", Kubelet, &["port"], Integer, "N", "the kubelet API's port (10250)"),
    flag("read-only-port", Kubelet, &["readOnlyPort"], Integer, "N", "unauthenticated plain HTTP for /healthz, /pods, /stats/summary, /metrics (0: none)"),
    flag("healthz-port", Kubelet, &["healthzPort"], Integer, "N", "plain HTTP /healthz (10248; 0: none)"),
    flag("healthz-bind-address", Kubelet, &["healthzBindAddress"], Text, "IP", "its address (127.0.0.1)"),
    flag("tls-cert-file", Kubelet, &["tlsCertFile"], Text, "FILE", "the kubelet API's serving certificate (else self-signed)"),
    flag("tls-private-key-file", Kubelet, &["tlsPrivateKeyFile"], Text, "FILE", "its key"),
    flag("client-ca-file", Kubelet, &["authentication", "x509", "clientCAFile"], Text, "FILE", "CA of client certificates the kubelet API accepts"),
    flag("anonymous-auth", Kubelet, &["authentication", "anonymous", "enabled"], Bool, "BOOL", "requests without credentials are system:anonymous (false)"),
    flag("authentication-token-webhook", Kubelet, &["authentication", "webhook", "enabled"], Bool, "BOOL", "bearer tokens are checked by TokenReview (true)"),
    flag("authentication-token-webhook-cache-ttl", Kubelet, &["authentication", "webhook", "cacheTTL"], Text, "D", "how long a review is reused (2m)"),
    flag("authorization-mode", Kubelet, &["authorization", "mode"], Text, "MODE", "Webhook (SubjectAccessReview, the default) or AlwaysAllow"),
    flag("authorization-webhook-cache-authorized-ttl", Kubelet, &["authorization", "webhook", "cacheAuthorizedTTL"], Text, "D", "how long an allowed review is reused (5m)"),
    flag("authorization-webhook-cache-unauthorized-ttl", Kubelet, &["authorization", "webhook", "cacheUnauthorizedTTL"], Text, "D", "how long a denied review is reused (30s)"),
    flag("eviction-hard", Kubelet, &["evictionHard"], Thresholds, "S<Q,...", "hard eviction thresholds (memory.available<100Mi, nodefs.available<10%, nodefs.inodesFree<5%, imagefs.available<15%)"),
    flag("eviction-pressure-transition-period", Kubelet, &["evictionPressureTransitionPeriod"], Text, "D", "how long a pressure condition outlasts its signal (5m)"),
    flag("cluster-dns", Kubelet, &["clusterDNS"], List, "IP,...", "nameservers of ClusterFirst pods"),
    flag("cluster-domain", Kubelet, &["clusterDomain"], Text, "D", "their search domain (cluster.local)"),
    flag("state-dir", Nanolet, &["stateDir"], Text, "DIR", "nanolet's state (/var/lib/nanolet)"),
    Flag {
        resets: &["runtime", "path"],
        ..flag("runtime", Nanolet, &["runtime", "name"], Text, "NAME", "OCI runtime: runc (the default) or crun")
    },
    flag("runtime-path", Nanolet, &["runtime", "path"], Text, "PATH", "the runtime's binary (its name, looked up in PATH)"),
    flag("insecure-registry", Nanolet, &["insecureRegistries"], Repeated, "HOST", "a registry reached over plain HTTP (repeatable)"),
    flag("docker-config", Nanolet, &["dockerConfig"], Text, "FILE", "the node's registry credentials, a Docker config.json (<state>/config.json, ~/.docker/config.json)"),
    flag("kubeconfig", Nanolet, &["kubeconfig"], Text, "FILE", "join the cluster of this kubeconfig (else standalone)"),
    flag("bootstrap-kubeconfig", Nanolet, &["bootstrapKubeconfig"], Text, "FILE", "credentials to ask for a client certificate with, writing --kubeconfig"),
    flag("cert-dir", Nanolet, &["certDir"], Text, "DIR", "the node's certificates and keys (<state-dir>/pki)"),
    flag("rotate-certificates", Kubelet, &["rotateCertificates"], Bool, "BOOL", "renew the client certificate at 70-90% of its life (false)"),
    flag("hostname-override", Nanolet, &["hostnameOverride"], Text, "NAME", "the node's name (the hostname, lowercased)"),
    flag("node-ip", Nanolet, &["nodeIP"], Text, "IP", "the node's InternalIP (the default route's)"),
    flag("node-labels", Nanolet, &["nodeLabels"], KeyValues, "K=V,...", "labels set at registration"),
    flag("cni-conf-dir", Nanolet, &["cniConfDir"], Text, "DIR", "CNI network configurations (/etc/cni/net.d)"),
    flag("cni-bin-dir", Nanolet, &["cniBinDirs"], List, "DIR,...", "CNI plugins (/opt/cni/bin,/usr/lib/cni)"),
    flag("device-plugins-dir", Nanolet, &["devicePluginsDir"], Text, "DIR", "device plugins' sockets and kubelet.sock (/var/lib/kubelet/device-plugins)"),
    flag("cdi-spec-dir", Nanolet, &["cdiSpecDirs"], List, "DIR,...", "CDI specs, later ones overriding (/etc/cdi,/var/run/cdi)"),
];

fn find(name: &str) -> Option<&'static Flag> {
    FLAGS
        .iter()
        .find(|flag| flag.name == name || flag.alias == Some(name))
}

/// Writes flags (name without dashes, value) into the documents. Their
/// order does not matter: each sets its own field. An unknown flag is an
/// error naming it.
pub(super) fn apply(
    documents: &mut Documents,
    given: &[(String, String)],
) -> Result<(), ConfigError> {
    let flags = given
        .iter()
        .map(|(name, text)| {
            find(name)
                .map(|flag| (flag, text.as_str()))
                .ok_or_else(|| ConfigError::UnknownFlag(name.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (flag, _) in &flags {
        if !flag.resets.is_empty() {
            documents.remove(flag.document, flag.resets);
        }
    }
    for (flag, text) in flags {
        let field = documents
            .field(flag.document, flag.field)
            .ok_or_else(|| ConfigError::Flag(format!("--{}: no field", flag.name)))?;
        write(flag, text, field)?;
    }
    Ok(())
}

fn write(flag: &Flag, text: &str, field: &mut Value) -> Result<(), ConfigError> {
    let wrong = |what: &str| ConfigError::Flag(format!("--{}: {text:?} is not {what}", flag.name));
    let items = || text.split(',').map(str::trim).filter(|s| !s.is_empty());
    match flag.form {
        Text => *field = Value::from(text),
        Bool => {
            *field = Value::from(match text {
                "true" => true,
                "false" => false,
                _ => return Err(wrong("true or false")),
            })
        }
        Integer => {
            *field = Value::from(
                text.trim()
                    .parse::<i64>()
                    .map_err(|_| wrong("an integer"))?,
            )
        }
        List => *field = Value::Sequence(items().map(Value::from).collect()),
        Repeated => match field {
            Value::Sequence(list) => list.push(Value::from(text)),
            other => *other = Value::Sequence(vec![Value::from(text)]),
        },
        KeyValues | Thresholds => {
            let separator = if flag.form == KeyValues { '=' } else { '<' };
            let mut pairs = Mapping::new();
            for item in items() {
                let (key, value) = item
                    .split_once(separator)
                    .map(|(k, v)| (k.trim(), v.trim()))
                    .filter(|(k, _)| !k.is_empty())
                    .ok_or_else(|| wrong(&format!("a list of key{separator}value")))?;
                pairs.insert(Value::from(key), Value::from(value));
            }
            match field {
                Value::Mapping(map) if flag.form == KeyValues => map.extend(pairs),
                other => *other = Value::Mapping(pairs),
            }
        }
    }
    Ok(())
}

/// The flags' part of `nanolet help`.
pub fn help() -> String {
    let mut text = String::new();
    for document in [Kubelet, Nanolet] {
        text.push_str(&format!(
            "\nFields of the file's {}, as flags [the field]:\n",
            document.name()
        ));
        for flag in FLAGS.iter().filter(|f| f.document == document) {
            let mut head = format!("  --{} {}", flag.name, flag.value);
            if let Some(alias) = flag.alias {
                head.push_str(&format!(" (or --{alias})"));
            }
            let description = format!("{} [{}]", flag.help, flag.field.join("."));
            text.push_str(&wrapped(&head, &description));
        }
    }
    text
}

/// `head`, then `description` in a column of its own, wrapped at 80.
fn wrapped(head: &str, description: &str) -> String {
    const COLUMN: usize = 32;
    const WIDTH: usize = 80;
    let mut text = head.to_owned();
    let mut line_len = head.chars().count();
    if line_len + 2 > COLUMN {
        text.push('\n');
        line_len = 0;
    }
    text.push_str(&" ".repeat(COLUMN - line_len));
    line_len = COLUMN;
    let mut first = true;
    for word in description.split(' ') {
        let len = word.chars().count();
        if !first && line_len + 1 + len > WIDTH {
            text.push('\n');
            text.push_str(&" ".repeat(COLUMN));
            line_len = COLUMN;
        } else if !first {
            text.push(' ');
            line_len += 1;
        }
        text.push_str(word);
        line_len += len;
        first = false;
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn given(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect()
    }

    /// A value of each flag that differs from the default.
    fn sample(flag: &Flag) -> &'static str {
        match flag.name {
            "container-log-max-size" => "1Mi",
            "container-log-max-files" => "3",
            "pod-max-pids" => "100",
            "oom-score-adj" => "-5",
            "address" | "healthz-bind-address" | "node-ip" => "192.0.2.1",
            "port" | "read-only-port" | "healthz-port" => "1234",
            "anonymous-auth" | "rotate-certificates" => "true",
            "authentication-token-webhook" => "false",
            "authorization-mode" => "AlwaysAllow",
            "eviction-hard" => "memory.available<1Gi",
            "cluster-dns" => "10.0.0.10,10.0.0.11",
            "cluster-domain" => "edge.local",
            "runtime" => "crun",
            "node-labels" => "a=b,c=d",
            _ if flag.help.contains("(2m)")
                || flag.help.contains("(5m)")
                || flag.help.contains("(30s)") =>
            {
                "17s"
            }
            _ => "/x",
        }
    }

    /// Every flag names a field the file's documents have (an unknown one
    /// would fail their checks), and changes the configuration.
    #[test]
    fn every_flag_is_a_field_and_has_an_effect() {
        let default = format!("{:?}", Config::default());
        for flag in FLAGS {
            let value = sample(flag);
            let mut flags = vec![(flag.name, value)];
            // A bootstrap writes the kubeconfig: it needs one named.
            if flag.name == "bootstrap-kubeconfig" {
                flags.push(("kubeconfig", "/k"));
            }
            let config = Config::load(None, &given(&flags))
                .unwrap_or_else(|e| panic!("--{} {value}: {e}", flag.name));
            assert_ne!(format!("{config:?}"), default, "--{} {value}", flag.name);
            assert!(help().contains(&format!("--{} ", flag.name)));
        }
    }

    #[test]
    fn an_invalid_value_names_the_flag_and_its_field() {
        for (flag, value, field) in [
            ("oom-score-adj", "2000", "oomScoreAdj"),
            ("port", "70000", "port"),
            ("container-log-max-files", "1", "containerLogMaxFiles"),
            ("node-ip", "not-an-ip", "nodeIP"),
            ("cluster-dns", "10.0.0.1,x", "clusterDNS"),
            ("runtime", "docker", "runtime.name"),
            ("eviction-hard", "memory.free<1Gi", "evictionHard"),
            (
                "authorization-webhook-cache-authorized-ttl",
                "soon",
                "cacheAuthorizedTTL",
            ),
        ] {
            let err = Config::load(None, &given(&[("port", "1"), (flag, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(&format!("--{flag} ")), "{err}");
            assert!(err.contains(field), "{err}");
        }
        for (flag, value) in [
            ("port", "ten"),
            ("anonymous-auth", "yes"),
            ("node-labels", "a"),
            ("eviction-hard", "memory.available=1Gi"),
        ] {
            let err = Config::load(None, &given(&[(flag, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(&format!("--{flag}: ")), "{err}");
        }
    }

    #[test]
    fn flags_meet_the_file_field_by_field() {
        let dir = crate::state::TestDir::new("config-flags");
        let file = dir.0.join("c.yaml");
        std::fs::write(
            &file,
            "imageGCHighThresholdPercent: 60\nimageGCLowThresholdPercent: 50\nauthentication: {webhook: {cacheTTL: 1m}}\n---\nkind: NanoletConfiguration\nnodeLabels: {a: file, b: file}\ninsecureRegistries: [r1]\nruntime: {name: runc, path: /opt/runc}\n",
        )
        .unwrap();
        let c = Config::load(
            Some(&file),
            &given(&[
                ("node-labels", "b=flag"),
                ("insecure-registry", "r2"),
                ("anonymous-auth", "true"),
                ("runtime", "crun"),
                ("pod-manifest-path", "/m"),
            ]),
        )
        .unwrap();
        assert_eq!(c.node_labels.get("a").map(String::as_str), Some("file"));
        assert_eq!(c.node_labels.get("b").map(String::as_str), Some("flag"));
        assert_eq!(c.insecure_registries, ["r1", "r2"]);
        // A flag beside a field of the same mapping leaves it alone.
        assert_eq!(
            c.api_auth.token_cache_ttl,
            std::time::Duration::from_secs(60)
        );
        assert!(c.api_auth.anonymous);
        // --runtime crun means crun's binary, not the file's runc path.
        assert_eq!(c.runtime_path, std::path::PathBuf::from("crun"));
        assert_eq!(c.static_pod_path, Some("/m".into()));
        // A flag that breaks a rule spanning two fields is named...
        let err = Config::load(Some(&file), &given(&[("port", "1"), ("runtime", "docker")]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--runtime \"docker\": "), "{err}");
        // ... and the file's own error is the file's, whatever the flags.
        std::fs::write(
            &file,
            "imageGCHighThresholdPercent: 60\nimageGCLowThresholdPercent: 70\n",
        )
        .unwrap();
        let err = Config::load(Some(&file), &given(&[("port", "1")]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&file.display().to_string()), "{err}");
        assert!(err.contains("imageGCLowThresholdPercent"), "{err}");
    }
}
