//! `/metrics/cadvisor`: the core of the series the upstream kubelet's
//! embedded cAdvisor exports, which Prometheus setups (kube-prometheus and
//! the kubernetes-mixin dashboards) scrape, from the same files as
//! `/metrics/resource`. A series per container, per pod cgroup (container
//! and image empty, as cAdvisor has them) and for the node (`id="/"`).

use std::fmt::Write;

use std::collections::HashMap;

use super::net::Interface;
use super::{ContainerStats, PodStats, Snapshot, escape, seconds};
use crate::cgroup::settings::{DeviceIo, Settings, Spec};
use crate::cgroup::usage::Usage;

/// cAdvisor's labels of a cgroup: container, id (the cgroup's path), image,
/// name (the runtime's container ID), namespace and pod.
#[derive(Clone, Copy)]
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

/// What the text is made of besides the usage: the node's CPUs and memory,
/// the interfaces of the node and of each pod (by uid), the limits, I/O and
/// OOM kills of each pod and container cgroup (by path), and the names of
/// the block devices (by `major:minor`).
pub struct Extras {
    pub cpus: u64,
    pub memory_bytes: u64,
    pub node_network: Vec<Interface>,
    pub pod_networks: HashMap<String, Vec<Interface>>,
    pub settings: HashMap<String, Settings>,
    pub device_names: HashMap<String, String>,
}

/// A spec series: cAdvisor's name, its help, and its value where it has one.
type SpecSeries = (&'static str, &'static str, fn(&Spec) -> Option<u64>);

const SPEC: [SpecSeries; 4] = [
    ("cpu_period", "CPU period of the container.", |s| {
        s.cpu_period
    }),
    ("cpu_quota", "CPU quota of the container.", |s| s.cpu_quota),
    ("cpu_shares", "CPU share of the container.", |s| {
        s.cpu_shares
    }),
    // cAdvisor reports an unlimited container's limit as 0.
    (
        "memory_limit_bytes",
        "Memory limit for the container.",
        |s| Some(s.memory_limit.unwrap_or(0)),
    ),
];

/// A block I/O series: cAdvisor's name, its help, and its value.
type IoSeries = (&'static str, &'static str, fn(&DeviceIo) -> u64);

const IO: [IoSeries; 4] = [
    (
        "container_fs_reads_bytes_total",
        "Cumulative count of bytes read",
        |d| d.read_bytes,
    ),
    (
        "container_fs_writes_bytes_total",
        "Cumulative count of bytes written",
        |d| d.write_bytes,
    ),
    (
        "container_fs_reads_total",
        "Cumulative count of reads completed",
        |d| d.reads,
    ),
    (
        "container_fs_writes_total",
        "Cumulative count of writes completed",
        |d| d.writes,
    ),
];

/// A network series: cAdvisor's name, what it counts, and its value.
type NetworkSeries = (&'static str, &'static str, fn(&Interface) -> u64);

const NETWORK: [NetworkSeries; 8] = [
    ("receive_bytes_total", "bytes received", |i| i.rx_bytes),
    ("receive_packets_total", "packets received", |i| {
        i.rx_packets
    }),
    (
        "receive_errors_total",
        "errors encountered while receiving",
        |i| i.rx_errors,
    ),
    (
        "receive_packets_dropped_total",
        "packets dropped while receiving",
        |i| i.rx_dropped,
    ),
    ("transmit_bytes_total", "bytes transmitted", |i| i.tx_bytes),
    ("transmit_packets_total", "packets transmitted", |i| {
        i.tx_packets
    }),
    (
        "transmit_errors_total",
        "errors encountered while transmitting",
        |i| i.tx_errors,
    ),
    (
        "transmit_packets_dropped_total",
        "packets dropped while transmitting",
        |i| i.tx_dropped,
    ),
];

/// The text.
pub fn metrics(s: &Snapshot, extras: &Extras) -> String {
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
        "container_memory_cache",
        "Number of bytes of page cache memory.",
        "gauge",
        "",
        &|u| Some(u.cache_bytes as f64),
    );
    family(
        "container_cpu_cfs_periods_total",
        "Number of elapsed enforcement period intervals.",
        "counter",
        "",
        &|u| u.throttling.map(|t| t.periods as f64),
    );
    family(
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled period intervals.",
        "counter",
        "",
        &|u| u.throttling.map(|t| t.throttled_periods as f64),
    );
    family(
        "container_cpu_cfs_throttled_seconds_total",
        "Total time duration the container has been throttled.",
        "counter",
        "",
        &|u| u.throttling.map(|t| seconds(t.throttled_ns)),
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
    // Interfaces belong to the pod's cgroup (its network namespace).
    let mut networks: Vec<(Labels, &Vec<Interface>)> = vec![(root, &extras.node_network)];
    for p in &s.pods {
        if let Some(interfaces) = extras.pod_networks.get(&p.uid) {
            networks.push((Labels::pod(p), interfaces));
        }
    }
    for (series, what, value) in NETWORK {
        let name = format!("container_network_{series}");
        let _ = writeln!(out, "# HELP {name} Cumulative count of {what}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, interfaces) in &networks {
            for i in interfaces.iter() {
                let labels = labels.render(&format!("interface=\"{}\",", escape(&i.name)));
                let _ = writeln!(out, "{name}{labels} {} {ts}", value(i));
            }
        }
    }
    // The limits, I/O and OOM kills of pod and container cgroups (cAdvisor
    // has the node's from elsewhere).
    let settings: Vec<(Labels, &Settings)> = cgroups
        .iter()
        .filter_map(|(labels, _)| Some((*labels, extras.settings.get(labels.id)?)))
        .collect();
    for (series, help, value) in SPEC {
        let name = format!("container_spec_{series}");
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (labels, settings) in &settings {
            if let Some(v) = value(&settings.spec) {
                let _ = writeln!(out, "{name}{} {v} {ts}", labels.render(""));
            }
        }
    }
    for (name, help, value) in IO {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, settings) in &settings {
            for device in &settings.io {
                let device_name = extras.device_names.get(&device.device);
                let extra = format!(
                    "device=\"{}\",",
                    escape(device_name.map_or("", String::as_str))
                );
                let _ = writeln!(
                    out,
                    "{name}{} {} {ts}",
                    labels.render(&extra),
                    value(device)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP container_oom_events_total Count of out of memory events observed for the container"
    );
    let _ = writeln!(out, "# TYPE container_oom_events_total counter");
    for (labels, settings) in &settings {
        if let Some(kills) = settings.oom_kills {
            let _ = writeln!(
                out,
                "container_oom_events_total{} {kills} {ts}",
                labels.render("")
            );
        }
    }
    let _ = writeln!(out, "# HELP machine_cpu_cores Number of logical CPU cores.");
    let _ = writeln!(out, "# TYPE machine_cpu_cores gauge");
    let _ = writeln!(out, "machine_cpu_cores {}", extras.cpus);
    let _ = writeln!(
        out,
        "# HELP machine_memory_bytes Amount of memory installed on the machine."
    );
    let _ = writeln!(out, "# TYPE machine_memory_bytes gauge");
    let _ = writeln!(out, "machine_memory_bytes {}", extras.memory_bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_pod_and_container_series_with_cadvisors_labels() {
        let eth0 = super::super::net::interfaces(super::super::net::NET_DEV);
        let extras = Extras {
            cpus: 4,
            memory_bytes: 1 << 30,
            node_network: eth0.clone(),
            pod_networks: HashMap::from([("u".to_owned(), eth0)]),
            settings: HashMap::from([
                (
                    "/kubepods/besteffort/podu/c".to_owned(),
                    Settings {
                        spec: Spec {
                            cpu_shares: Some(2),
                            cpu_period: Some(100_000),
                            cpu_quota: Some(50_000),
                            memory_limit: Some(1 << 28),
                        },
                        io: vec![DeviceIo {
                            device: "8:0".to_owned(),
                            read_bytes: 4096,
                            write_bytes: 512,
                            reads: 1,
                            writes: 2,
                        }],
                        oom_kills: Some(1),
                    },
                ),
                (
                    "/kubepods/besteffort/podu".to_owned(),
                    Settings {
                        spec: Spec {
                            cpu_shares: Some(2),
                            cpu_period: Some(100_000),
                            ..Spec::default()
                        },
                        ..Settings::default()
                    },
                ),
            ]),
            device_names: HashMap::from([("8:0".to_owned(), "/dev/sda".to_owned())]),
        };
        let text = metrics(&super::super::sample(), &extras);
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
            r#"container_network_receive_bytes_total{container="",interface="eth0",id="/",image="",name="",namespace="",pod=""} 5000 1700000000123"#,
            r#"container_network_transmit_packets_dropped_total{container="",interface="eth0",id="/kubepods/besteffort/podu",image="",name="",namespace="default",pod="web"} 4 1700000000123"#,
            "# HELP container_network_receive_errors_total Cumulative count of errors encountered while receiving",
            r#"container_memory_cache{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 512 1700000000123"#,
            r#"container_cpu_cfs_periods_total{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 100 1700000000123"#,
            r#"container_cpu_cfs_throttled_periods_total{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 7 1700000000123"#,
            r#"container_cpu_cfs_throttled_seconds_total{container="",id="/kubepods/besteffort/podu",image="",name="",namespace="default",pod="web"} 0.25 1700000000123"#,
            r#"container_spec_cpu_quota{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 50000 1700000000123"#,
            r#"container_spec_cpu_period{container="",id="/kubepods/besteffort/podu",image="",name="",namespace="default",pod="web"} 100000 1700000000123"#,
            r#"container_spec_cpu_shares{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 2 1700000000123"#,
            r#"container_spec_memory_limit_bytes{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 268435456 1700000000123"#,
            r#"container_spec_memory_limit_bytes{container="",id="/kubepods/besteffort/podu",image="",name="",namespace="default",pod="web"} 0 1700000000123"#,
            r#"container_fs_reads_bytes_total{container="main",device="/dev/sda",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 4096 1700000000123"#,
            r#"container_fs_writes_total{container="main",device="/dev/sda",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 2 1700000000123"#,
            r#"container_oom_events_total{container="main",id="/kubepods/besteffort/podu/c",image="busybox:1",name="c",namespace="default",pod="web"} 1 1700000000123"#,
            "machine_cpu_cores 4",
            "machine_memory_bytes 1073741824",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // No quota on the pod, and nothing of the node's.
        assert!(!text.contains(r#"container_spec_cpu_quota{container="","#));
        assert!(!text.contains(r#"container_oom_events_total{container="","#));
    }
}
