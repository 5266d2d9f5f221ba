//! Startup, liveness and readiness probes and the postStart/preStop hooks
//! as the Pod spec states them, with upstream's defaults and validation;
//! `agent::prober` runs them.

use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::PodError;
use super::validate::invalid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeKind {
    /// As upstream's events say it ("Liveness probe failed: ...").
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// A command run in the container; exit 0 is success.
    Exec(Vec<String>),
    /// A GET whose status 200–399 is success. `host` defaults to the pod IP.
    Http {
        https: bool,
        host: Option<String>,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    /// A TCP connection that opens is success.
    Tcp { host: Option<String>, port: u16 },
    /// gRPC's health check on the pod IP; SERVING is success.
    Grpc { port: u16, service: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub action: ProbeAction,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    /// The probe's own terminationGracePeriodSeconds, for kills it causes.
    pub termination_grace: Option<Duration>,
}

/// The probes of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probes {
    pub startup: Option<Probe>,
    pub liveness: Option<Probe>,
    pub readiness: Option<Probe>,
}

impl Probes {
    pub fn get(&self, kind: ProbeKind) -> Option<&Probe> {
        match kind {
            ProbeKind::Startup => self.startup.as_ref(),
            ProbeKind::Liveness => self.liveness.as_ref(),
            ProbeKind::Readiness => self.readiness.as_ref(),
        }
    }
}

/// What a lifecycle hook does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    /// An exec or httpGet action, as probes have them.
    Action(ProbeAction),
    Sleep(Duration),
}

/// A container's `lifecycle`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hooks {
    pub post_start: Option<Handler>,
    pub pre_stop: Option<Handler>,
}

pub(super) fn convert_hooks(field: &str, c: &core::Container) -> Result<Hooks, PodError> {
    let Some(lifecycle) = &c.lifecycle else {
        return Ok(Hooks::default());
    };
    let ports = c.ports.as_deref().unwrap_or_default();
    let one = |name: &str, handler: &Option<core::LifecycleHandler>| {
        handler
            .as_ref()
            .map(|h| convert_handler(&format!("{field}.lifecycle.{name}"), h, ports))
            .transpose()
    };
    Ok(Hooks {
        post_start: one("postStart", &lifecycle.post_start)?,
        pre_stop: one("preStop", &lifecycle.pre_stop)?,
    })
}

fn convert_handler(
    field: &str,
    h: &core::LifecycleHandler,
    ports: &[core::ContainerPort],
) -> Result<Handler, PodError> {
    let as_probe = core::Probe {
        exec: h.exec.clone(),
        http_get: h.http_get.clone(),
        ..Default::default()
    };
    match (&h.sleep, h.exec.is_some() || h.http_get.is_some()) {
        (Some(sleep), false) => {
            if sleep.seconds < 0 {
                return Err(invalid(
                    format!("{field}.sleep.seconds"),
                    "must be non-negative",
                ));
            }
            let seconds = sleep.seconds.min(super::validate::MAX_GRACE_SECONDS);
            Ok(Handler::Sleep(Duration::from_secs(seconds as u64)))
        }
        (None, true) => Ok(Handler::Action(
            convert(field, &as_probe, ports, ProbeKind::Readiness)?.action,
        )),
        _ => Err(invalid(field, "must specify exactly one handler type")),
    }
}

pub(super) fn convert_probes(field: &str, c: &core::Container) -> Result<Probes, PodError> {
    let ports = c.ports.as_deref().unwrap_or_default();
    let one = |name: &str, probe: &Option<core::Probe>, kind| {
        probe
            .as_ref()
            .map(|p| convert(&format!("{field}.{name}"), p, ports, kind))
            .transpose()
    };
    Ok(Probes {
        startup: one("startupProbe", &c.startup_probe, ProbeKind::Startup)?,
        liveness: one("livenessProbe", &c.liveness_probe, ProbeKind::Liveness)?,
        readiness: one("readinessProbe", &c.readiness_probe, ProbeKind::Readiness)?,
    })
}

fn seconds(field: &str, value: Option<i32>, default: i32, min: i32) -> Result<Duration, PodError> {
    let value = value.unwrap_or(default);
    if value < min {
        return Err(invalid(
            field,
            format!("must be greater than or equal to {min}"),
        ));
    }
    Ok(Duration::from_secs(value as u64))
}

fn convert(
    field: &str,
    p: &core::Probe,
    ports: &[core::ContainerPort],
    kind: ProbeKind,
) -> Result<Probe, PodError> {
    let mut actions = Vec::new();
    if let Some(exec) = &p.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err(invalid(format!("{field}.exec.command"), "Required value"));
        }
        actions.push(ProbeAction::Exec(command));
    }
    if let Some(http) = &p.http_get {
        let https = match http.scheme.as_deref() {
            None | Some("HTTP") => false,
            Some("HTTPS") => true,
            Some(_) => {
                return Err(invalid(
                    format!("{field}.httpGet.scheme"),
                    "supported values: \"HTTP\", \"HTTPS\"",
                ));
            }
        };
        let path = http.path.clone().unwrap_or_default();
        actions.push(ProbeAction::Http {
            https,
            host: http.host.clone().filter(|h| !h.is_empty()),
            port: port(&format!("{field}.httpGet.port"), &http.port, ports)?,
            path: if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            },
            headers: http
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        });
    }
    if let Some(tcp) = &p.tcp_socket {
        actions.push(ProbeAction::Tcp {
            host: tcp.host.clone().filter(|h| !h.is_empty()),
            port: port(&format!("{field}.tcpSocket.port"), &tcp.port, ports)?,
        });
    }
    if let Some(grpc) = &p.grpc {
        let port = u16::try_from(grpc.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                invalid(
                    format!("{field}.grpc.port"),
                    "must be between 1 and 65535, inclusive",
                )
            })?;
        actions.push(ProbeAction::Grpc {
            port,
            service: grpc.service.clone().unwrap_or_default(),
        });
    }
    if actions.len() != 1 {
        return Err(invalid(field, "must specify exactly one handler type"));
    }
    let success_threshold = p.success_threshold.unwrap_or(1);
    if success_threshold < 1 || (kind != ProbeKind::Readiness && success_threshold != 1) {
        return Err(invalid(
            format!("{field}.successThreshold"),
            "must be 1 (and at least 1 for readiness)",
        ));
    }
    let failure_threshold = p.failure_threshold.unwrap_or(3);
    if failure_threshold < 1 {
        return Err(invalid(
            format!("{field}.failureThreshold"),
            "must be greater than or equal to 1",
        ));
    }
    let termination_grace = match p.termination_grace_period_seconds {
        None => None,
        Some(_) if kind == ProbeKind::Readiness => {
            return Err(invalid(
                format!("{field}.terminationGracePeriodSeconds"),
                "must not be set for readinessProbes",
            ));
        }
        Some(s) if s < 1 => {
            return Err(invalid(
                format!("{field}.terminationGracePeriodSeconds"),
                "must be greater than 0",
            ));
        }
        Some(s) => Some(Duration::from_secs(
            s.min(super::validate::MAX_GRACE_SECONDS) as u64,
        )),
    };
    Ok(Probe {
        action: actions.remove(0),
        initial_delay: seconds(
            &format!("{field}.initialDelaySeconds"),
            p.initial_delay_seconds,
            0,
            0,
        )?,
        period: seconds(&format!("{field}.periodSeconds"), p.period_seconds, 10, 1)?,
        timeout: seconds(&format!("{field}.timeoutSeconds"), p.timeout_seconds, 1, 1)?,
        success_threshold: success_threshold as u32,
        failure_threshold: failure_threshold as u32,
        termination_grace,
    })
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port(field: &str, value: &IntOrString, ports: &[core::ContainerPort]) -> Result<u16, PodError> {
    let number = match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| invalid(field, format!("no container port named {name:?}")))?,
        },
    };
    u16::try_from(number)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| invalid(field, "must be between 1 and 65535, inclusive"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(extra: serde_json::Value) -> core::Container {
        let mut c = serde_json::json!({"name": "c", "image": "i", "ports": [{"name": "web", "containerPort": 8080}]});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(c).unwrap()
    }

    #[test]
    fn defaults_and_named_ports() {
        let probes = convert_probes(
            "c",
            &container(serde_json::json!({
                "readinessProbe": {"httpGet": {"path": "healthz", "port": "web"}},
                "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 3},
            })),
        )
        .unwrap();
        let readiness = probes.readiness.unwrap();
        assert_eq!(
            readiness.action,
            ProbeAction::Http {
                https: false,
                host: None,
                port: 8080,
                path: "/healthz".into(),
                headers: vec![]
            }
        );
        assert_eq!(
            (readiness.period, readiness.timeout, readiness.initial_delay),
            (
                Duration::from_secs(10),
                Duration::from_secs(1),
                Duration::ZERO
            )
        );
        assert_eq!(
            (readiness.success_threshold, readiness.failure_threshold),
            (1, 3)
        );
        assert_eq!(probes.liveness.unwrap().period, Duration::from_secs(3));
        assert!(probes.startup.is_none());
    }

    #[test]
    fn upstream_validation() {
        let bad = [
            serde_json::json!({"livenessProbe": {"tcpSocket": {"port": 80}, "successThreshold": 2}}),
            serde_json::json!({"readinessProbe": {"tcpSocket": {"port": "nope"}}}),
            serde_json::json!({"readinessProbe": {}}),
            serde_json::json!({"readinessProbe": {"tcpSocket": {"port": 80}, "exec": {"command": ["x"]}}}),
            serde_json::json!({"readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 0}}),
            serde_json::json!({"readinessProbe": {"tcpSocket": {"port": 80}, "terminationGracePeriodSeconds": 5}}),
            serde_json::json!({"startupProbe": {"httpGet": {"port": 80, "scheme": "FTP"}}}),
        ];
        for extra in bad {
            assert!(
                convert_probes("c", &container(extra.clone())).is_err(),
                "{extra}"
            );
        }
        let ok = serde_json::json!({"readinessProbe": {"tcpSocket": {"port": 80}, "successThreshold": 2}});
        assert!(convert_probes("c", &container(ok)).is_ok());
    }
}
