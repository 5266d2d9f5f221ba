//! Writing resource limits into cgroup files: cgroup v2's `cpu.weight`,
//! `cpu.max`, `memory.max` and `pids.max`, or on v1 (and hybrid) hosts the
//! cpu, memory and pids controllers' equivalents. Every cgroup write of
//! nanolet is here.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{CgroupError, Version};

/// The CFS period every quota is relative to (upstream's 100 ms).
pub const CPU_PERIOD: u64 = 100_000;

/// What one cgroup may use, in upstream's units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// cpu.shares (v1); the v2 weight is derived by upstream's formula.
    pub cpu_shares: u64,
    /// CFS quota in µs per [`CPU_PERIOD`]; `None` is unlimited.
    pub cpu_quota: Option<i64>,
    pub memory_max: Option<u64>,
    pub pids_max: Option<i64>,
}

impl Default for Limits {
    /// No limits, and the weight of a default cgroup (1024 shares).
    fn default() -> Self {
        Limits {
            cpu_shares: 1024,
            cpu_quota: None,
            memory_max: None,
            pids_max: None,
        }
    }
}

/// cpu.shares from a CPU request, upstream's formula (2 without a request).
pub fn cpu_shares(milli: Option<u64>) -> u64 {
    match milli {
        None | Some(0) => 2,
        Some(m) => (m * 1024 / 1000).clamp(2, 262_144),
    }
}

/// cgroup v2 cpu.weight from cpu.shares, upstream's formula. Written
/// explicitly because the runtimes' own conversions changed across versions.
pub fn cpu_weight(shares: u64) -> u64 {
    1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142
}

/// CFS quota from a CPU limit (millicores), at least 1 ms per period.
pub fn cpu_quota(milli: u64) -> i64 {
    (milli as i64 * 100).max(1000)
}

fn err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError {
        path: path.to_owned(),
        source,
    }
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    fs::write(&path, value).map_err(err(&path))
}

/// Writes a controller's file where the controller is enabled; a host that
/// lacks one (no pids controller, say) still runs pods, without that limit.
fn write_if_present(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    if dir.join(file).exists() {
        write(dir, file, value)
    } else {
        log::debug!("{}: no {file} here; not limited", dir.display());
        Ok(())
    }
}

/// Creates the cgroup `path` (absolute within the hierarchy) with the
/// directories above it and writes `limits`.
pub fn ensure(version: Version, path: &str, limits: &Limits) -> Result<(), CgroupError> {
    let relative = path.trim_start_matches('/');
    match version {
        Version::V2 => ensure_v2(Path::new("/sys/fs/cgroup"), relative, limits),
        Version::V1 | Version::Hybrid => ensure_v1(relative, limits),
    }
}

fn ensure_v2(mount: &Path, relative: &str, limits: &Limits) -> Result<(), CgroupError> {
    // Each level hands the controllers on to the next (the "no internal
    // processes" rule allows it: pods' cgroups hold only containers).
    let mut dir = mount.to_owned();
    for part in Path::new(relative).components() {
        enable_controllers(&dir)?;
        dir.push(part);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(CgroupError { path: dir, source }),
        }
    }
    write_if_present(
        &dir,
        "cpu.weight",
        &cpu_weight(limits.cpu_shares).to_string(),
    )?;
    let quota = limits.cpu_quota.map_or("max".to_owned(), |q| q.to_string());
    write_if_present(&dir, "cpu.max", &format!("{quota} {CPU_PERIOD}"))?;
    let memory = limits
        .memory_max
        .map_or("max".to_owned(), |m| m.to_string());
    write_if_present(&dir, "memory.max", &memory)?;
    let pids = limits
        .pids_max
        .filter(|p| *p > 0)
        .map_or("max".to_owned(), |p| p.to_string());
    write_if_present(&dir, "pids.max", &pids)
}

/// The controllers nanolet limits, where the parent offers them.
const V2_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available_path = dir.join("cgroup.controllers");
    let available = fs::read_to_string(&available_path).map_err(err(&available_path))?;
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    for controller in V2_CONTROLLERS {
        let offered = available.split_whitespace().any(|c| c == controller);
        let on = enabled.split_whitespace().any(|c| c == controller);
        if offered && !on {
            write(dir, "cgroup.subtree_control", &format!("+{controller}"))?;
        }
    }
    Ok(())
}

/// Where a v1 controller is mounted (`cpu` is often co-mounted with
/// `cpuacct`), from the mount table's super options.
fn v1_mount(controller: &str) -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut fields = right.split(' ');
        if fields.next()? != "cgroup" {
            return None;
        }
        let options = fields.nth(1)?;
        let mount_point = left.split(' ').nth(4)?;
        options
            .split(',')
            .any(|o| o == controller)
            .then(|| PathBuf::from(mount_point))
    })
}

fn ensure_v1(relative: &str, limits: &Limits) -> Result<(), CgroupError> {
    let dir_in = |controller: &str| -> Result<Option<PathBuf>, CgroupError> {
        let Some(mount) = v1_mount(controller) else {
            return Ok(None);
        };
        let dir = mount.join(relative);
        fs::create_dir_all(&dir).map_err(err(&dir))?;
        Ok(Some(dir))
    };
    if let Some(dir) = dir_in("cpu")? {
        write(&dir, "cpu.shares", &limits.cpu_shares.to_string())?;
        write(&dir, "cpu.cfs_period_us", &CPU_PERIOD.to_string())?;
        write(
            &dir,
            "cpu.cfs_quota_us",
            &limits.cpu_quota.unwrap_or(-1).to_string(),
        )?;
    }
    if let Some(dir) = dir_in("memory")? {
        let memory = limits
            .memory_max
            .and_then(|m| i64::try_from(m).ok())
            .unwrap_or(-1);
        write(&dir, "memory.limit_in_bytes", &memory.to_string())?;
    }
    if let Some(dir) = dir_in("pids")? {
        let pids = limits
            .pids_max
            .filter(|p| *p > 0)
            .map_or("max".to_owned(), |p| p.to_string());
        write(&dir, "pids.max", &pids)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_formulas() {
        assert_eq!(cpu_shares(None), 2);
        assert_eq!(cpu_shares(Some(1)), 2);
        assert_eq!(cpu_shares(Some(250)), 256);
        assert_eq!(cpu_shares(Some(1000)), 1024);
        assert_eq!(cpu_shares(Some(1_000_000)), 262_144);
        assert_eq!(cpu_weight(2), 1);
        assert_eq!(cpu_weight(1024), 39);
        assert_eq!(cpu_weight(262_144), 10_000);
        assert_eq!(cpu_quota(500), 50_000);
        assert_eq!(cpu_quota(5), 1000);
    }
}
