//! Node, pod and container usage read when asked, from `/proc` and the
//! cgroup files (no cAdvisor, no sampling loop), and the kubelet's
//! `/metrics/resource`: the Prometheus text metrics-server scrapes for
//! `kubectl top`.

use std::fmt::Write;

use jiff::Timestamp;

use crate::cgroup::Hierarchy;
use crate::cgroup::usage::{self, Usage};
use crate::pod::QosClass;
use crate::state::Layout;

pub(crate) mod cadvisor;
pub(crate) mod disk;
pub(crate) mod fs;
pub(crate) mod net;
pub(crate) mod own;
pub(crate) mod summary;

#[derive(Debug, Clone)]
pub struct ContainerStats {
    pub name: String,
    /// The runtime's container ID.
    pub id: String,
    pub image: String,
    /// Its cgroup, from the cgroup root: cAdvisor's `id`.
    pub cgroup: String,
    pub started: Option<Timestamp>,
    pub usage: Usage,
}

#[derive(Debug, Clone)]
pub struct PodStats {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub started: Option<Timestamp>,
    pub cgroup: String,
    /// The pod cgroup's usage: its containers and what the pod runs besides.
    pub usage: Option<Usage>,
    pub containers: Vec<ContainerStats>,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub at: Timestamp,
    pub node: Option<Usage>,
    pub pods: Vec<PodStats>,
}

fn qos_of(name: Option<&str>) -> QosClass {
    match name {
        Some("Guaranteed") => QosClass::Guaranteed,
        Some("Burstable") => QosClass::Burstable,
        _ => QosClass::BestEffort,
    }
}

/// Reads the usage of the node and of every running container the agent
/// recorded. Blocking file reads: run it off the loop.
pub fn collect(layout: &Layout, cgroups: &Hierarchy) -> Snapshot {
    let at = Timestamp::now();
    let mut pods = Vec::new();
    for record in crate::cli::pod_records(layout).unwrap_or_default() {
        let status = &record.status;
        let qos = qos_of(status.qos_class.as_deref());
        let mut containers = Vec::new();
        for c in status.container_statuses.iter().flatten() {
            let Some(running) = c.state.as_ref().and_then(|s| s.running.as_ref()) else {
                continue;
            };
            let Some((_, id)) = c
                .container_id
                .as_deref()
                .and_then(|id| id.split_once("://"))
            else {
                continue;
            };
            let path = cgroups.container_path(qos, &record.uid, id);
            if let Some(usage) = usage::read(cgroups.version, &path) {
                containers.push(ContainerStats {
                    name: c.name.clone(),
                    id: id.to_owned(),
                    image: c.image.clone(),
                    cgroup: path,
                    started: running.started_at.as_ref().map(|t| t.0),
                    usage,
                });
            }
        }
        if containers.is_empty() {
            continue;
        }
        let cgroup = cgroups.pod_path(qos, &record.uid);
        pods.push(PodStats {
            usage: usage::read(cgroups.version, &cgroup),
            cgroup,
            started: status.start_time.as_ref().map(|t| t.0),
            namespace: record.namespace,
            name: record.name,
            uid: record.uid,
            containers,
        });
    }
    Snapshot {
        at,
        node: usage::node(),
        pods,
    }
}

/// Label values as the text format wants them.
pub(crate) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(crate) fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// `/metrics/resource`, with the series (names, help, types, labels) of
/// the upstream kubelet's resource metrics endpoint. Each sample carries
/// the time it was read, in milliseconds, as upstream's do.
pub fn resource_metrics(s: &Snapshot) -> String {
    let ts = s.at.as_millisecond();
    let mut out = String::new();
    let mut family = |name: &str, help: &str, kind: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {ts}");
        }
    };
    let container_labels = |p: &PodStats, c: &ContainerStats| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&c.name),
            escape(&p.namespace),
            escape(&p.name)
        )
    };
    let pod_labels = |p: &PodStats| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            escape(&p.namespace),
            escape(&p.name)
        )
    };
    let per_container = |value: &dyn Fn(&ContainerStats) -> Option<f64>| {
        s.pods
            .iter()
            .flat_map(|p| {
                p.containers
                    .iter()
                    .filter_map(move |c| Some((container_labels(p, c), value(c)?)))
            })
            .collect::<Vec<_>>()
    };
    family(
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        "counter",
        per_container(&|c| Some(seconds(c.usage.cpu_ns))),
    );
    family(
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        "gauge",
        per_container(&|c| Some(c.usage.working_set_bytes as f64)),
    );
    family(
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        "gauge",
        per_container(&|c| c.started.map(|t| t.as_second() as f64)),
    );
    let node = |value: fn(&Usage) -> f64| {
        s.node
            .as_ref()
            .map(|u| vec![(String::new(), value(u))])
            .unwrap_or_default()
    };
    family(
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        "counter",
        node(|u| seconds(u.cpu_ns)),
    );
    family(
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        "gauge",
        node(|u| u.working_set_bytes as f64),
    );
    let per_pod = |value: fn(&Usage) -> f64| {
        s.pods
            .iter()
            .filter_map(|p| Some((pod_labels(p), value(p.usage.as_ref()?))))
            .collect::<Vec<_>>()
    };
    family(
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
        per_pod(|u| seconds(u.cpu_ns)),
    );
    family(
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        "gauge",
        per_pod(|u| u.working_set_bytes as f64),
    );
    let error = if s.node.is_some() { 0.0 } else { 1.0 };
    let _ = writeln!(
        out,
        "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE scrape_error gauge");
    let _ = writeln!(out, "scrape_error {error}");
    out
}

/// A snapshot of one pod with one container, every usage the same.
#[cfg(test)]
pub(crate) fn sample() -> Snapshot {
    let usage = Usage {
        cpu_ns: 1_500_000_000,
        memory_bytes: 4096,
        working_set_bytes: 2048,
        rss_bytes: 1024,
        processes: Some(1),
        cache_bytes: 512,
        throttling: Some(crate::cgroup::usage::Throttling {
            periods: 100,
            throttled_periods: 7,
            throttled_ns: 250_000_000,
        }),
    };
    Snapshot {
        at: Timestamp::from_millisecond(1_700_000_000_123).unwrap(),
        node: Some(usage),
        pods: vec![PodStats {
            namespace: "default".into(),
            name: "web".into(),
            uid: "u".into(),
            started: None,
            cgroup: "/kubepods/besteffort/podu".into(),
            usage: Some(usage),
            containers: vec![ContainerStats {
                name: "main".into(),
                id: "c".into(),
                image: "busybox:1".into(),
                cgroup: "/kubepods/besteffort/podu/c".into(),
                started: Some(Timestamp::from_second(1_699_999_000).unwrap()),
                usage,
            }],
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_metrics_text() {
        let snapshot = sample();
        let text = resource_metrics(&snapshot);
        for line in [
            "# TYPE container_cpu_usage_seconds_total counter",
            "container_cpu_usage_seconds_total{container=\"main\",namespace=\"default\",pod=\"web\"} 1.5 1700000000123",
            "container_memory_working_set_bytes{container=\"main\",namespace=\"default\",pod=\"web\"} 2048 1700000000123",
            "container_start_time_seconds{container=\"main\",namespace=\"default\",pod=\"web\"} 1699999000 1700000000123",
            "node_cpu_usage_seconds_total 1.5 1700000000123",
            "node_memory_working_set_bytes 2048 1700000000123",
            "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"} 1.5 1700000000123",
            "pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 2048 1700000000123",
            "scrape_error 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
