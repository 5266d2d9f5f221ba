//! `/stats/summary`: the Summary API (`stats/v1alpha1`) that metrics-server
//! and monitoring agents read: node and pod CPU, memory, network,
//! filesystems and process counts. CPU rates (`usageNanoCores`) come from
//! the previous request's sample; the first request takes a second sample
//! 100 ms after the first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::disk::{Measured, device, pod_disk};
use super::{Snapshot, collect};
use crate::cgroup::Hierarchy;
use crate::cgroup::usage::Usage;
use crate::state::Layout;

/// The previous request's sample, for rates.
static PREVIOUS: Mutex<Option<Snapshot>> = Mutex::new(None);
/// A previous sample older than this says little about now.
const PREVIOUS_MAX_AGE: Duration = Duration::from_secs(120);
const FIRST_INTERVAL: Duration = Duration::from_millis(100);

/// What the summary says of the node besides usage.
pub struct NodeInfo {
    pub name: String,
    /// The kubelet's root dir: its filesystem is `fs` (nodefs).
    pub state_dir: PathBuf,
    /// The image store: its filesystem is `runtime.imageFs`, its images'
    /// (compressed) sizes the `usedBytes`.
    pub images_dir: PathBuf,
    pub runtime_root: PathBuf,
    /// `<podLogsDir>`: pods' logs, under `<ns>_<name>_<uid>/<container>`.
    pub pod_logs_dir: PathBuf,
}

fn time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Takes the sample and its predecessor (waiting for one if there is none
/// recent). Blocking: run it off the loop.
fn samples(layout: &Layout, cgroups: &Hierarchy) -> (Snapshot, Snapshot) {
    let now = collect(layout, cgroups);
    let mut previous = PREVIOUS.lock().unwrap_or_else(|p| p.into_inner());
    let recent = previous.take().filter(|p| {
        let age = now.at.duration_since(p.at);
        age.is_positive() && age.unsigned_abs() < PREVIOUS_MAX_AGE
    });
    let (before, now) = match recent {
        Some(before) => (before, now),
        None => {
            std::thread::sleep(FIRST_INTERVAL);
            (now, collect(layout, cgroups))
        }
    };
    *previous = Some(now.clone());
    (before, now)
}

/// Nanocores between two cumulative CPU readings.
fn nano_cores(before: Option<&Usage>, after: &Usage, seconds: f64) -> Option<u64> {
    let before = before?;
    (seconds > 0.0).then(|| (after.cpu_ns.saturating_sub(before.cpu_ns) as f64 / seconds) as u64)
}

fn cpu(at: &str, usage: &Usage, rate: Option<u64>) -> Value {
    let mut v = json!({"time": at, "usageCoreNanoSeconds": usage.cpu_ns});
    if let Some(rate) = rate {
        v["usageNanoCores"] = json!(rate);
    }
    v
}

fn memory(at: &str, usage: &Usage, available: Option<u64>) -> Value {
    let mut v = json!({
        "time": at,
        "usageBytes": usage.memory_bytes,
        "workingSetBytes": usage.working_set_bytes,
        "rssBytes": usage.rss_bytes,
    });
    if let Some(available) = available {
        v["availableBytes"] = json!(available);
    }
    v
}

fn network(at: &str, interfaces: Option<Vec<super::net::Interface>>) -> Option<Value> {
    let interfaces: Vec<Value> = interfaces?
        .iter()
        .map(|i| {
            json!({"name": i.name, "rxBytes": i.rx_bytes, "rxErrors": i.rx_errors, "txBytes": i.tx_bytes, "txErrors": i.tx_errors})
        })
        .collect();
    let first = interfaces.first()?.clone();
    let mut v = json!({"time": at, "interfaces": interfaces});
    for key in ["name", "rxBytes", "rxErrors", "txBytes", "txErrors"] {
        v[key] = first[key].clone();
    }
    Some(v)
}

fn fs(at: &str, path: &Path, used: Option<u64>) -> Option<Value> {
    let f = super::fs::FsUsage::of(path).ok()?;
    Some(json!({
        "time": at,
        "availableBytes": f.available,
        "capacityBytes": f.capacity,
        "usedBytes": used.unwrap_or(f.capacity.saturating_sub(f.free)),
        "inodesFree": f.inodes_free,
        "inodes": f.inodes,
        "inodesUsed": f.inodes.saturating_sub(f.inodes_free),
    }))
}

/// A measured tree as the Summary API's FsStats: its filesystem's size
/// and room, the tree's own bytes and inodes.
fn tree(at: &str, m: &Measured) -> Option<Value> {
    let mut v = fs(at, &m.path, Some(m.used.bytes))?;
    v["inodesUsed"] = m.used.inodes.into();
    Some(v)
}

/// The init process of a container, from the runtime's state file.
fn image_bytes(images_dir: &Path) -> u64 {
    crate::image::store::read_records(images_dir)
        .map(|r| r.values().map(|i| i.size).sum())
        .unwrap_or(0)
}

fn boot_time() -> Option<Timestamp> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let btime = stat.lines().find_map(|l| l.strip_prefix("btime "))?;
    Timestamp::from_second(btime.trim().parse().ok()?).ok()
}

fn read_trimmed(path: &str) -> Option<String> {
    Some(std::fs::read_to_string(path).ok()?.trim().to_owned())
}

/// The summary, read now; `with_disk` walks the pods' writable layers,
/// logs and volumes too. Blocking: run it off the loop.
pub fn summary(layout: &Layout, cgroups: &Hierarchy, node: &NodeInfo, with_disk: bool) -> Value {
    let (before, now) = samples(layout, cgroups);
    let seconds = now.at.duration_since(before.at).as_secs_f64();
    let at = time(now.at);
    let mut node_json = json!({
        "nodeName": node.name,
        "startTime": boot_time().map(time),
        "fs": fs(&at, &node.state_dir, None),
        "runtime": {"imageFs": fs(&at, &node.images_dir, Some(image_bytes(&node.images_dir)))},
        "network": network(&at, super::net::node_interfaces()),
    });
    if let Some(usage) = &now.node {
        let available = crate::cgroup::memory_capacity().saturating_sub(usage.working_set_bytes);
        node_json["cpu"] = cpu(&at, usage, nano_cores(before.node.as_ref(), usage, seconds));
        node_json["memory"] = memory(&at, usage, Some(available));
    }
    let pid_max = read_trimmed("/proc/sys/kernel/pid_max").and_then(|v| v.parse::<u64>().ok());
    // "running/total" scheduling entities: the node's process count.
    let procs = read_trimmed("/proc/loadavg").and_then(|l| {
        l.split_whitespace()
            .nth(3)?
            .split_once('/')?
            .1
            .parse::<u64>()
            .ok()
    });
    if let (Some(max), Some(cur)) = (pid_max, procs) {
        node_json["rlimit"] = json!({"time": at, "maxpid": max, "curproc": cur});
    }
    let previous_pods: HashMap<&str, &super::PodStats> =
        before.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
    let node_device = device(&node.state_dir);
    let pods: Vec<Value> = now
        .pods
        .iter()
        .map(|p| {
            let prev = previous_pods.get(p.uid.as_str());
            let disk = with_disk.then(|| pod_disk(layout, &node.pod_logs_dir, node_device, p));
            let containers: Vec<Value> = p
                .containers
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let prev_usage = prev
                        .and_then(|pp| pp.containers.iter().find(|pc| pc.id == c.id))
                        .map(|pc| &pc.usage);
                    let mut v = json!({
                        "name": c.name,
                        "startTime": c.started.map(time),
                        "cpu": cpu(&at, &c.usage, nano_cores(prev_usage, &c.usage, seconds)),
                        "memory": memory(&at, &c.usage, None),
                    });
                    if let Some(c) = disk.as_ref().and_then(|d| d.containers.get(i)) {
                        if let Some(rootfs) = c.rootfs.as_ref().and_then(|m| tree(&at, m)) {
                            v["rootfs"] = rootfs;
                        }
                        if let Some(logs) = c.logs.as_ref().and_then(|m| tree(&at, m)) {
                            v["logs"] = logs;
                        }
                    }
                    v
                })
                .collect();
            let volume_stats: Vec<Value> = disk
                .iter()
                .flat_map(|d| &d.volumes)
                .filter_map(|(name, m)| {
                    let mut v = tree(&at, m)?;
                    v["name"] = name.as_str().into();
                    Some(v)
                })
                .collect();
            let mut v = json!({
                "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
                "startTime": p.started.map(time),
                "containers": containers,
                "network": network(&at, super::net::pod_interfaces(&node.runtime_root, p)),
                "volume": volume_stats,
            });
            if let Some(disk) = &disk {
                let ephemeral = Measured {
                    path: node.state_dir.clone(),
                    used: disk.ephemeral,
                };
                if let Some(storage) = tree(&at, &ephemeral) {
                    v["ephemeral-storage"] = storage;
                }
            }
            if let Some(usage) = &p.usage {
                let prev_usage = prev.and_then(|pp| pp.usage.as_ref());
                v["cpu"] = cpu(&at, usage, nano_cores(prev_usage, usage, seconds));
                v["memory"] = memory(&at, usage, None);
                if let Some(n) = usage.processes {
                    v["process_stats"] = json!({"process_count": n});
                }
            }
            v
        })
        .collect();
    json!({"node": node_json, "pods": pods})
}

/// `only_cpu_and_memory=true`, as older metrics-servers ask: the same
/// summary with only what they read.
pub fn only_cpu_and_memory(summary: &mut Value) {
    let keep = |v: &mut Value, keys: &[&str]| {
        if let Some(map) = v.as_object_mut() {
            map.retain(|k, _| keys.contains(&k.as_str()));
        }
    };
    keep(
        &mut summary["node"],
        &["nodeName", "startTime", "cpu", "memory"],
    );
    for pod in summary["pods"].as_array_mut().into_iter().flatten() {
        keep(pod, &["podRef", "startTime", "cpu", "memory", "containers"]);
        for c in pod["containers"].as_array_mut().into_iter().flatten() {
            keep(c, &["name", "startTime", "cpu", "memory"]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_interfaces_from_net_dev() {
        let v = network(
            "t",
            Some(super::super::net::interfaces(super::super::net::NET_DEV)),
        )
        .unwrap();
        assert_eq!(v["name"], "eth0");
        assert_eq!(v["rxBytes"], 5000);
        assert_eq!(v["rxErrors"], 1);
        assert_eq!(v["txBytes"], 3000);
        assert_eq!(v["txErrors"], 2);
        assert_eq!(v["interfaces"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn rates_between_samples() {
        let at = |ns| Usage {
            cpu_ns: ns,
            ..Usage::default()
        };
        assert_eq!(
            nano_cores(Some(&at(1_000_000_000)), &at(1_500_000_000), 1.0),
            Some(500_000_000)
        );
        assert_eq!(nano_cores(None, &at(1), 1.0), None);
    }
}
