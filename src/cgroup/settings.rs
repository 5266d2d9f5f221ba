//! What cAdvisor reports of a cgroup besides its usage: the limits set on
//! it (its "spec"), its block I/O per device and its OOM kills. Read only
//! for `/metrics/cadvisor`, so that the scrapes metrics-server and eviction
//! depend on read no more files than they need.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use super::Version;
use super::usage::{read_u64, v1_dir};

/// The limits in force on a cgroup, in cAdvisor's units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spec {
    /// cpu.shares, or on cgroup v2 the shares its cpu.weight stands for.
    pub cpu_shares: Option<u64>,
    /// CFS period and quota in µs; no quota where unlimited.
    pub cpu_period: Option<u64>,
    pub cpu_quota: Option<u64>,
    /// None where unlimited.
    pub memory_limit: Option<u64>,
}

/// Block I/O of a cgroup on one device, since the cgroup was made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIo {
    /// `major:minor`.
    pub device: String,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub spec: Spec,
    pub io: Vec<DeviceIo>,
    /// Processes the kernel's OOM killer killed in it (and below it).
    pub oom_kills: Option<u64>,
}

/// What the files of the cgroup at `cgroup_path` say, or `None` when it is
/// gone.
pub fn read(version: Version, cgroup_path: &str) -> Option<Settings> {
    let relative = cgroup_path.trim_start_matches('/');
    let file = |controller: &str, name: &str| -> PathBuf {
        match version {
            Version::V2 => Path::new("/sys/fs/cgroup").join(relative).join(name),
            Version::V1 | Version::Hybrid => v1_dir(controller, relative).join(name),
        }
    };
    let text = |controller: &str, name: &str| fs::read_to_string(file(controller, name)).ok();
    let number = |controller: &str, name: &str| read_u64(&file(controller, name));
    let (spec, io) = match version {
        Version::V2 => {
            if !file("", "cgroup.procs").exists() {
                return None;
            }
            let (cpu_quota, cpu_period) = text("", "cpu.max")
                .as_deref()
                .map(v2_cpu_max)
                .unwrap_or_default();
            let spec = Spec {
                cpu_shares: number("", "cpu.weight").map(shares_of_weight),
                cpu_period,
                cpu_quota,
                memory_limit: text("", "memory.max").as_deref().and_then(limit),
            };
            let io = text("", "io.stat").as_deref().map(v2_io);
            (spec, io.unwrap_or_default())
        }
        Version::V1 | Version::Hybrid => {
            let memory_limit = text("memory", "memory.limit_in_bytes")?;
            // The recursive counts cover a pod's containers, as v2's do.
            let io_file = |name: &str| {
                text("blkio", &format!("{name}_recursive")).or_else(|| text("blkio", name))
            };
            let spec = Spec {
                cpu_shares: number("cpu", "cpu.shares"),
                cpu_period: number("cpu", "cpu.cfs_period_us"),
                // -1, unlimited, is no u64.
                cpu_quota: number("cpu", "cpu.cfs_quota_us"),
                memory_limit: limit(&memory_limit),
            };
            let io = v1_io(
                io_file("blkio.throttle.io_service_bytes").as_deref(),
                io_file("blkio.throttle.io_serviced").as_deref(),
            );
            (spec, io)
        }
    };
    Some(Settings {
        spec,
        io,
        oom_kills: super::oom_kills(cgroup_path),
    })
}

/// A memory limit, none where it is "max" (v2) or v1's page-rounded
/// largest value: anything past 2^62, as cAdvisor draws the line.
fn limit(text: &str) -> Option<u64> {
    text.trim().parse().ok().filter(|v| *v < 1 << 62)
}

/// cpu.max: "max 100000" or "50000 100000" (quota, period).
fn v2_cpu_max(text: &str) -> (Option<u64>, Option<u64>) {
    let mut fields = text.split_whitespace();
    let quota = fields.next().and_then(|q| q.parse().ok());
    let period = fields.next().and_then(|p| p.parse().ok());
    (quota, period)
}

/// The shares a cgroup v2 weight stands for: the inverse of upstream's
/// shares-to-weight formula, as cAdvisor converts it.
fn shares_of_weight(weight: u64) -> u64 {
    2 + (weight.clamp(1, 10_000) - 1) * 262_142 / 9999
}

/// io.stat: `8:0 rbytes=… wbytes=… rios=… wios=… dbytes=… dios=…`.
fn v2_io(text: &str) -> Vec<DeviceIo> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let device = fields.next()?;
            let values: HashMap<&str, u64> = fields
                .filter_map(|f| {
                    let (k, v) = f.split_once('=')?;
                    Some((k, v.parse().ok()?))
                })
                .collect();
            let get = |k: &str| values.get(k).copied().unwrap_or(0);
            Some(DeviceIo {
                device: device.to_owned(),
                read_bytes: get("rbytes"),
                write_bytes: get("wbytes"),
                reads: get("rios"),
                writes: get("wios"),
            })
        })
        .collect()
}

/// blkio's `8:0 Read 4096` lines (and `Total` lines), in bytes and in
/// operations, merged by device.
fn v1_io(bytes: Option<&str>, operations: Option<&str>) -> Vec<DeviceIo> {
    let mut devices: BTreeMap<&str, DeviceIo> = BTreeMap::new();
    for (text, in_bytes) in [(bytes, true), (operations, false)] {
        for line in text.unwrap_or_default().lines() {
            let mut fields = line.split_whitespace();
            let (Some(device), Some(op), Some(Ok(value))) = (
                fields.next(),
                fields.next(),
                fields.next().map(str::parse::<u64>),
            ) else {
                continue;
            };
            let counter: fn(&mut DeviceIo) -> &mut u64 = match (op, in_bytes) {
                ("Read", true) => |d| &mut d.read_bytes,
                ("Write", true) => |d| &mut d.write_bytes,
                ("Read", false) => |d| &mut d.reads,
                ("Write", false) => |d| &mut d.writes,
                _ => continue,
            };
            let entry = devices.entry(device).or_insert_with(|| DeviceIo {
                device: device.to_owned(),
                ..DeviceIo::default()
            });
            *counter(entry) += value;
        }
    }
    devices.into_values().collect()
}

/// The name cAdvisor gives the block device `major:minor`: `/dev/` and
/// the kernel's name for it; empty when the kernel has none.
pub fn device_name(device: &str) -> String {
    let uevent = fs::read_to_string(Path::new("/sys/dev/block").join(device).join("uevent"));
    uevent
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("DEVNAME="))
                .map(|name| format!("/dev/{name}"))
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v2_files() {
        assert_eq!(v2_cpu_max("max 100000\n"), (None, Some(100_000)));
        assert_eq!(v2_cpu_max("50000 100000\n"), (Some(50_000), Some(100_000)));
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("268435456\n"), Some(268_435_456));
        // Upstream's weights for 2 and 262144 shares come back; weights are
        // coarser than shares, so 1024 becomes weight 39 and 998 shares.
        assert_eq!(shares_of_weight(1), 2);
        assert_eq!(shares_of_weight(super::super::cpu_weight(1024)), 998);
        assert_eq!(shares_of_weight(10_000), 262_144);
        let io =
            v2_io("8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n259:0 rbytes=1\n");
        assert_eq!(
            io,
            vec![
                DeviceIo {
                    device: "8:0".into(),
                    read_bytes: 4096,
                    write_bytes: 8192,
                    reads: 1,
                    writes: 2
                },
                DeviceIo {
                    device: "259:0".into(),
                    read_bytes: 1,
                    ..DeviceIo::default()
                }
            ]
        );
    }

    #[test]
    fn cgroup_v1_files() {
        // v1's "unlimited" is the largest page-aligned signed value.
        assert_eq!(limit("9223372036854771712\n"), None);
        let bytes =
            "8:0 Read 4096\n8:0 Write 512\n8:0 Sync 0\n8:0 Total 4608\n8:16 Write 7\nTotal 4615\n";
        let ops = "8:0 Read 1\n8:0 Write 2\n8:0 Total 3\nTotal 3\n";
        assert_eq!(
            v1_io(Some(bytes), Some(ops)),
            vec![
                DeviceIo {
                    device: "8:0".into(),
                    read_bytes: 4096,
                    write_bytes: 512,
                    reads: 1,
                    writes: 2
                },
                DeviceIo {
                    device: "8:16".into(),
                    write_bytes: 7,
                    ..DeviceIo::default()
                }
            ]
        );
        assert_eq!(v1_io(None, None), vec![]);
    }

    #[test]
    fn a_missing_cgroup_has_no_settings() {
        assert_eq!(
            read(super::super::detect(), "/nanolet-no-such-cgroup"),
            None
        );
    }
}
