//! `/metrics/cadvisor`: the core of the series the upstream kubelet's
//! embedded cAdvisor exports, which Prometheus setups (kube-prometheus and
//! the kubernetes-mixin dashboards) scrape, from the same files as
//! `/metrics/resource`. A series per container, per pod cgroup (container
//! and image empty, as cAdvisor has them) and for the node (`id="/"`).

use std::fmt::Write;

use super::{ContainerStats, PodStats, Snapshot, escape, seconds};
use crate::cgroup::usage::Usage;

/// cAdvisor's labels of a cgroup: container, id (the cgroup's path), image,
/// name (the runtime's container ID), namespace and pod.
struct Labels<'a> {
    container: &'a str,
    id: &'a str,
    image: &'a str,
    name: &'a str,
    namespace: &'a str,
    pod: &'a str,
}

impl<'a> Labels<'a> {
    fn pod(p: &'a PodStats) -> Self {
        Labels {
            container: "",
            id: &p.cgroup,
            image: "",
            name: "",
            namespace: &p.namespace,
            pod: &p.name,
        }
    }

    fn container(p: &'a PodStats, c: &'a ContainerStats) -> Self {
        Labels {
            container: &c.name,
            id: &c.cgroup,
            image: &c.image,
            name: &c.id,
            namespace: &p.namespace,
            pod: &p.name,
        }
    }

    fn render(&self, extra: &str) -> String {
        format!(
            "{{container=\"{}\",{extra}id=\"{}\",image=\"{}\",name=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(self.container),
            escape(self.id),
            escape(self.image),
            escape(self.name),
            escape(self.namespace),
            escape(self.pod)
        )
    }
}

/// The text, given the node's CPUs and memory.
pub fn metrics(s: &Snapshot, (cpus, memory_bytes): (u64, u64)) -> String {
    let ts = s.at.as_millisecond();
    let root = Labels {
        container: "",
        id: "/",
        image: "",
        name: "",
        namespace: "",
        pod: "",
    };
    // Every cgroup with its usage: the node's, then each pod's and its
    // containers'.
    let mut cgroups: Vec<(Labels, &Usage)> = Vec::new();
    if let Some(node) = &s.node {
        cgroups.push((root, node));
    }
    for p in &s.pods {
        if let Some(usage) = &p.usage {
            cgroups.push((Labels::pod(p), usage));
        }
        for c in &p.containers {
            cgroups.push((Labels::container(p, c), &c.usage));
        }
    }

    let mut out = String::new();
    let mut family =
        |name: &str, help: &str, kind: &str, extra: &str, value: &dyn Fn(&Usage) -> Option<f64>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, usage) in &cgroups {
                if let Some(v) = value(usage) {
                    let _ = writeln!(out, "{name}{} {v} {ts}", labels.render(extra));
                }
            }
        };
    family(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        "counter",
        "cpu=\"total\",",
        &|u| Some(seconds(u.cpu_ns)),
    );
    family(
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        "gauge",
        "",
        &|u| Some(u.memory_bytes as f64),
    );
    family(
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        "gauge",
        "",
        &|u| Some(u.working_set_bytes as f64),
    );
    family(
        "container_memory_rss",
        "Size of RSS in bytes.",
        "gauge",
        "",
        &|u| Some(u.rss_bytes as f64),
    );
    family(
        "container_processes",
        "Number of processes running inside the container.",
        "gauge",
        "",
        &|u| u.processes.map(|n| n as f64),
    );
    let _ = writeln!(
        out,
        "# HELP container_start_time_seconds Start time of the container since unix epoch in seconds."
    );
    let _ = writeln!(out, "# TYPE container_start_time_seconds gauge");
    for p in &s.pods {
        for c in &p.containers {
            if let Some(started) = c.started {
                let labels = Labels::container(p, c).render("");
                let _ = writeln!(
                    out,
                    "container_start_time_seconds{labels} {} {ts}",
                    started.as_second()
                );
            }
        }
    }
    let _ = writeln!(out, "# HELP machine_cpu_cores Number of logical CPU cores.");
    let _ = writeln!(out, "# TYPE machine_cpu_cores gauge");
    let _ = writeln!(out, "machine_cpu_cores {cpus}");
    let _ = writeln!(
        out,
        "# HELP machine_memory_bytes Amount of memory installed on the machine."
    );
    let _ = writeln!(out, "# TYPE machine_memory_bytes gauge");
    let _ = writeln!(out, "machine_memory_bytes {memory_bytes}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_pod_and_container_series_with_cadvisors_labels() {
        let text = metrics(&super::super::sample(), (4, 1 << 30));
        for line in [
            "# TYPE container_cpu_usage_seconds_total counter",
            r#"container_cpu_usage_seconds_total{container="",cpu="total",id="/",image="",name="",namespace="",pod=""} 1.5 1700000000123"#,
            r#"container_cpu_usage_seconds_total{container="",cpu="total",id="/kubepods/besteffort/podu",image="",name="",namespace="default",pod="web"} 1.5 1700000000123"#,
            r#"container_cpu_usage_seconds_total{container="main",cpu="total",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 1.5 1700000000123"#,
            r#"container_memory_working_set_bytes{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 2048 1700000000123"#,
            r#"container_memory_usage_bytes{container="",id="/",image="",name="",namespace="",pod=""} 4096 1700000000123"#,
            r#"container_memory_rss{container="",id="/kubepods/besteffort/podu",image="",name="",namespace="default",pod="web"} 1024 1700000000123"#,
            r#"container_processes{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 1 1700000000123"#,
            r#"container_start_time_seconds{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 1699999000 1700000000123"#,
            "machine_cpu_cores 4",
            "machine_memory_bytes 1073741824",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
