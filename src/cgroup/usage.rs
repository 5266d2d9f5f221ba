//! CPU and memory usage of a cgroup, read from its files when asked (no
//! sampling): cgroup v2's `cpu.stat` and `memory.{current,stat}`, or v1's
//! `cpuacct.usage`, `cpu.stat` and `memory.{usage_in_bytes,stat}`. The
//! working set is usage minus inactive file pages, as cAdvisor and the
//! kubelet count it.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::Version;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Cumulative CPU time, nanoseconds.
    pub cpu_ns: u64,
    pub memory_bytes: u64,
    pub working_set_bytes: u64,
    /// Anonymous memory (and swap cache): the `rss` of the Summary API.
    pub rss_bytes: u64,
    /// Tasks in the cgroup, from the pids controller.
    pub processes: Option<u64>,
    /// Page cache charged to the cgroup.
    pub cache_bytes: u64,
    /// CFS bandwidth control, where the cgroup has a quota.
    pub throttling: Option<Throttling>,
}

/// How a CPU quota held a cgroup back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Throttling {
    /// Enforcement periods that have elapsed.
    pub periods: u64,
    /// Periods in which the cgroup ran out of quota.
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// Throttling from a `cpu.stat`, none where no period has elapsed (no quota).
fn throttling(cpu_stat: &HashMap<String, u64>, throttled_ns: Option<u64>) -> Option<Throttling> {
    let periods = cpu_stat.get("nr_periods").copied().filter(|n| *n > 0)?;
    Some(Throttling {
        periods,
        throttled_periods: cpu_stat.get("nr_throttled").copied().unwrap_or(0),
        throttled_ns: throttled_ns.unwrap_or(0),
    })
}

/// `key value` lines, as `cpu.stat` and `memory.stat` are.
fn read_pairs(path: &Path) -> Option<HashMap<String, u64>> {
    let text = fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect(),
    )
}

pub(super) fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub(super) fn v1_dir(controller: &str, relative: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup").join(controller).join(relative)
}

/// The usage of the cgroup at `cgroup_path` (absolute in the hierarchy),
/// or `None` when it is gone.
pub fn read(version: Version, cgroup_path: &str) -> Option<Usage> {
    let relative = cgroup_path.trim_start_matches('/');
    match version {
        Version::V2 => {
            let dir = Path::new("/sys/fs/cgroup").join(relative);
            let cpu = read_pairs(&dir.join("cpu.stat"))?;
            let memory = read_u64(&dir.join("memory.current"))?;
            let stat = read_pairs(&dir.join("memory.stat")).unwrap_or_default();
            Some(Usage {
                processes: read_u64(&dir.join("pids.current")),
                cache_bytes: stat.get("file").copied().unwrap_or(0),
                throttling: throttling(&cpu, cpu.get("throttled_usec").map(|us| us * 1000)),
                ..usage(
                    cpu.get("usage_usec").copied().unwrap_or(0) * 1000,
                    memory,
                    stat.get("inactive_file").copied().unwrap_or(0),
                    stat.get("anon").copied().unwrap_or(0),
                )
            })
        }
        Version::V1 | Version::Hybrid => {
            let cpu = read_u64(&v1_dir("cpuacct", relative).join("cpuacct.usage"))?;
            let memory_dir = v1_dir("memory", relative);
            let memory = read_u64(&memory_dir.join("memory.usage_in_bytes"))?;
            let stat = read_pairs(&memory_dir.join("memory.stat")).unwrap_or_default();
            let get = |k: &str| stat.get(k).copied().unwrap_or(0);
            let cpu_stat =
                read_pairs(&v1_dir("cpu", relative).join("cpu.stat")).unwrap_or_default();
            Some(Usage {
                processes: read_u64(&v1_dir("pids", relative).join("pids.current")),
                cache_bytes: get("total_cache"),
                throttling: throttling(&cpu_stat, cpu_stat.get("throttled_time").copied()),
                ..usage(
                    cpu,
                    memory,
                    get("total_inactive_file"),
                    get("total_rss") + get("total_swap_cached"),
                )
            })
        }
    }
}

fn usage(cpu_ns: u64, memory_bytes: u64, inactive_file: u64, rss_bytes: u64) -> Usage {
    Usage {
        cpu_ns,
        memory_bytes,
        working_set_bytes: memory_bytes.saturating_sub(inactive_file),
        rss_bytes,
        processes: None,
        cache_bytes: 0,
        throttling: None,
    }
}

/// The node's usage from `/proc`: CPU time of every state but idle and
/// iowait, and memory as the root cgroup would count it (used, and used
/// less inactive file pages), which needs no cgroup at the root (v2 has
/// none there).
pub fn node() -> Option<Usage> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    Some(node_from(&stat, &meminfo, clock_ticks()))
}

fn clock_ticks() -> u64 {
    // sysconf cannot fail for _SC_CLK_TCK on Linux; 100 is its value on
    // every architecture nanolet targets.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

fn node_from(stat: &str, meminfo: &str, ticks: u64) -> Usage {
    // cpu  user nice system idle iowait irq softirq steal guest guest_nice
    let fields: Vec<u64> = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let busy: u64 = fields
        .iter()
        .enumerate()
        // Not idle (3) or iowait (4); guest time is already in user.
        .filter(|(i, _)| matches!(i, 0 | 1 | 2 | 5 | 6 | 7))
        .map(|(_, v)| v)
        .sum();
    let kib = |key: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let used = kib("MemTotal").saturating_sub(kib("MemFree"));
    usage(
        busy * (1_000_000_000 / ticks.max(1)),
        used,
        kib("Inactive(file)"),
        kib("AnonPages"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_only_where_periods_elapsed() {
        let stat = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
            pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let v2 = stat(&[
            ("usage_usec", 9),
            ("nr_periods", 40),
            ("nr_throttled", 3),
            ("throttled_usec", 1500),
        ]);
        assert_eq!(
            throttling(&v2, v2.get("throttled_usec").map(|us| us * 1000)),
            Some(Throttling {
                periods: 40,
                throttled_periods: 3,
                throttled_ns: 1_500_000
            })
        );
        let no_quota = stat(&[("nr_periods", 0), ("nr_throttled", 0)]);
        assert_eq!(throttling(&no_quota, None), None);
    }

    #[test]
    fn node_usage_from_proc() {
        let stat = "cpu  100 20 30 5000 40 5 5 10 7 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n";
        let meminfo = "MemTotal:       1000 kB\nMemFree:         200 kB\nInactive(file):  300 kB\nAnonPages:       150 kB\n";
        let u = node_from(stat, meminfo, 100);
        // user + nice + system + irq + softirq + steal = 170 ticks = 1.7 s.
        assert_eq!(u.cpu_ns, 1_700_000_000);
        assert_eq!(u.memory_bytes, 800 * 1024);
        assert_eq!(u.working_set_bytes, 500 * 1024);
        assert_eq!(u.rss_bytes, 150 * 1024);
    }

    #[test]
    fn a_missing_cgroup_has_no_usage() {
        assert_eq!(
            read(super::super::detect(), "/nanolet-no-such-cgroup"),
            None
        );
    }
}
