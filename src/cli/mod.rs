//! Commands that read the agent's state directory: `nanolet pods`,
//! `nanolet images` and `nanolet logs`. They need no connection to the agent: the agent writes
//! everything they show atomically under the state dir. `nanolet check`
//! looks at the node instead.

pub mod check;
pub mod logs;

use std::io::Write;
use std::path::Path;

use jiff::Timestamp;

use crate::pod::status::summary;
use crate::state::records::{self, PodRecord, Rejected};
use crate::state::{self, Layout};

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    WaitingToStart(String),
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Every pod record in the state dir, sorted by namespace and name.
pub fn pod_records(layout: &Layout) -> Result<Vec<PodRecord>, CliError> {
    let mut records = Vec::new();
    let pods = layout.pods();
    let entries = match std::fs::read_dir(&pods) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CliError::NotFound(format!(
                "no nanolet state in {} (is the agent running? use --state-dir)",
                layout.root.display()
            )));
        }
        Err(source) => return Err(CliError::Io { path: pods, source }),
    };
    for entry in entries.flatten() {
        if let Some(record) = records::read_record(&entry.path())? {
            records.push(record);
        }
    }
    records.sort_by(|a, b| {
        (&a.namespace, &a.name, a.admitted).cmp(&(&b.namespace, &b.name, b.admitted))
    });
    Ok(records)
}

/// kubectl's age format: 45s, 3m12s, 5h, 2d.
pub fn age(since: Timestamp, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(since.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `nanolet pods`: the table `kubectl get pods -A` would print, plus rows
/// for manifests that were not admitted, with their reasons below.
pub fn print_pods(state_dir: &Path, out: &mut dyn Write) -> Result<(), CliError> {
    let layout = Layout::new(state_dir);
    let records = pod_records(&layout)?;
    let rejected: Vec<Rejected> =
        state::read_json(&layout.rejected_manifests())?.unwrap_or_default();
    let now = Timestamp::now();
    let mut rows: Vec<Vec<String>> = vec![
        ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
            .map(String::from)
            .to_vec(),
    ];
    for r in &records {
        let containers = r.status.container_statuses.as_ref().map_or(0, Vec::len);
        let (ready, status, restarts) = summary(&r.status, r.terminating, containers);
        rows.push(vec![
            r.namespace.clone(),
            r.name.clone(),
            ready,
            status,
            restarts.to_string(),
            age(r.admitted, now),
        ]);
    }
    for r in &rejected {
        let file = Path::new(&r.file)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = match &r.name {
            Some(n) => n.clone(),
            None if r.index == 0 => file,
            None => format!("{file}#{}", r.index),
        };
        rows.push(vec![
            r.namespace.clone().unwrap_or_else(|| "-".into()),
            name,
            "0/0".into(),
            "Rejected".into(),
            "0".into(),
            age(r.since, now),
        ]);
    }
    print_table(&rows, out)?;
    let io_err = |source| CliError::Io {
        path: "stdout".into(),
        source,
    };
    if !rejected.is_empty() {
        writeln!(out).map_err(io_err)?;
        for r in &rejected {
            writeln!(out, "{} (document {}): {}", r.file, r.index, r.reason).map_err(io_err)?;
        }
    }
    Ok(())
}

/// Columns padded to their widest cell, as kubectl prints them.
fn print_table(rows: &[Vec<String>], out: &mut dyn Write) -> Result<(), CliError> {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}   ", w = widths[i]));
            }
        }
        writeln!(out, "{}", line.trim_end()).map_err(|source| CliError::Io {
            path: "stdout".into(),
            source,
        })?;
    }
    Ok(())
}

/// `nanolet images`: the images in the store, with their size (compressed
/// layers, as registries count it), when they were pulled and last used,
/// whether the agent's configuration pins them; then pulls in progress.
pub fn print_images(state_dir: &Path, out: &mut dyn Write) -> Result<(), CliError> {
    let root = Layout::new(state_dir).images();
    let records = crate::image::store::read_records(&root)?;
    let status = crate::image::store::read_status(&root)?;
    let now = Timestamp::now();
    let mut rows = vec![
        ["IMAGE", "ID", "SIZE", "PULLED", "LAST USED", "PINNED"]
            .map(String::from)
            .to_vec(),
    ];
    for r in records.values() {
        let id = r.config_digest.trim_start_matches("sha256:");
        let pinned = status.pinned.contains(&r.reference);
        rows.push(vec![
            r.reference.clone(),
            id.chars().take(12).collect(),
            human_size(r.size),
            age(r.pulled, now),
            age(r.last_used, now),
            if pinned { "yes" } else { "" }.to_owned(),
        ]);
    }
    for (reference, p) in &status.pulls {
        rows.push(vec![
            reference.clone(),
            "<pulling>".into(),
            format!("{}/{}", human_size(p.done), human_size(p.total)),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    print_table(&rows, out)
}

/// Sizes as `crictl images` prints them: 4.4MB, 812kB.
fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000_000 => format!("{:.1}GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.1}MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.0}kB", b as f64 / 1e3),
        b => format!("{b}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_like_crictl() {
        assert_eq!(human_size(812), "812B");
        assert_eq!(human_size(812_400), "812kB");
        assert_eq!(human_size(4_422_928), "4.4MB");
        assert_eq!(human_size(2_500_000_000), "2.5GB");
    }

    #[test]
    fn ages_like_kubectl() {
        let t0 = Timestamp::from_second(1_000_000).unwrap();
        let at = |s: i64| Timestamp::from_second(1_000_000 + s).unwrap();
        assert_eq!(age(t0, at(5)), "5s");
        assert_eq!(age(t0, at(200)), "3m20s");
        assert_eq!(age(t0, at(3000)), "50m");
        assert_eq!(age(t0, at(4 * 3600)), "4h");
        assert_eq!(age(t0, at(3 * 86400)), "3d");
    }
}
