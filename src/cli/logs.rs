//! `nanolet logs [-f] [--tail N] [--previous] [--timestamps] <ns>/<pod>
//! [container]`: prints a container's CRI log file as plain text.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{CliError, pod_records};
use crate::monitor::log::parse_record;
use crate::state::Layout;
use crate::state::records::PodRecord;

#[derive(Debug, Default, Clone)]
pub struct LogsArgs {
    pub target: String,
    pub container: Option<String>,
    pub follow: bool,
    pub tail: Option<usize>,
    pub previous: bool,
    pub timestamps: bool,
    /// Only lines logged at or after this time.
    pub since: Option<jiff::Timestamp>,
    /// Only one stream's lines: `stdout` or `stderr`.
    pub stream: Option<&'static str>,
    /// Following ends with the instance followed, as attach does, instead
    /// of going on into the next one after a restart.
    pub instance_only: bool,
}

fn find_pod(layout: &Layout, target: &str) -> Result<PodRecord, CliError> {
    let (namespace, name) = target.split_once('/').unwrap_or(("default", target));
    pod_records(layout)?
        .into_iter()
        .filter(|r| r.namespace == namespace && r.name == name)
        .max_by_key(|r| (!r.terminating, r.admitted))
        .ok_or_else(|| CliError::NotFound(format!("pod {namespace}/{name} not found")))
}

/// The container's name and restart count.
fn find_container(record: &PodRecord, wanted: Option<&str>) -> Result<(String, u32), CliError> {
    let statuses = record
        .status
        .container_statuses
        .as_deref()
        .unwrap_or_default();
    let names: Vec<&str> = statuses.iter().map(|s| s.name.as_str()).collect();
    // Named, any container of the pod, init and ephemeral ones too.
    let mut every = crate::pod::status::every_container_status(&record.status);
    let status = match wanted {
        Some(name) => every.find(|s| s.name == name).ok_or_else(|| {
            CliError::NotFound(format!(
                "container {name} is not valid for pod {}: choose one of [{}]",
                record.name,
                names.join(" ")
            ))
        })?,
        None if statuses.len() == 1 => &statuses[0],
        None => {
            return Err(CliError::NotFound(format!(
                "a container name must be specified for pod {}, choose one of: [{}]",
                record.name,
                names.join(" ")
            )));
        }
    };
    Ok((status.name.clone(), status.restart_count.max(0) as u32))
}

fn container_running(
    layout: &Layout,
    record: &PodRecord,
    container: &str,
    restart_count: u32,
    instance_only: bool,
) -> bool {
    let Ok(Some(now)) = crate::state::records::read_record(&layout.pod(&record.uid)) else {
        return false;
    };
    if now.terminating {
        return false;
    }
    crate::pod::status::every_container_status(&now.status).any(|s| {
        let restarts = s.restart_count.max(0) as u32;
        let running = s.state.as_ref().is_none_or(|st| st.terminated.is_none());
        s.name == container
            && if instance_only {
                restarts == restart_count && running
            } else {
                restarts > restart_count || running
            }
    })
}

/// Turns CRI records into text: partial records are joined until the final
/// one of the line.
struct Printer {
    timestamps: bool,
    since: Option<jiff::Timestamp>,
    stream: Option<&'static str>,
    line: String,
    first_time: Option<String>,
}

impl Printer {
    fn record(&mut self, raw: &str, out: &mut Vec<String>) {
        let Some((time, stream, partial, text)) = parse_record(raw) else {
            return;
        };
        if self.stream.is_some_and(|wanted| wanted != stream) {
            return;
        }
        if self.first_time.is_none() {
            self.first_time = Some(time.to_owned());
        }
        self.line.push_str(text);
        if !partial {
            let first = self.first_time.take();
            let early = self.since.is_some_and(|since| {
                first
                    .as_deref()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .is_some_and(|t| t < since)
            });
            if early {
                self.line.clear();
                return;
            }
            let stamp = first.filter(|_| self.timestamps);
            out.push(match stamp {
                Some(t) => format!("{t} {}\n", self.line),
                None => format!("{}\n", self.line),
            });
            self.line.clear();
        }
    }
}

/// Checks that the pod, the container and (for `previous`) an earlier
/// instance exist, so that a server can answer 404 before streaming.
///
/// A container that has no log yet is "waiting to start", a 400 as
/// upstream answers it, also when following: a server must not hold a
/// request (and its thread) open for a container that may never start.
pub fn check(state_dir: &Path, args: &LogsArgs) -> Result<(), CliError> {
    let (record, container, _, path) = locate(&Layout::new(state_dir), args)?;
    if args.previous || path.exists() {
        return Ok(());
    }
    let reason = record
        .status
        .container_statuses
        .iter()
        .flatten()
        .find(|s| s.name == container)
        .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .unwrap_or_else(|| "ContainerCreating".to_owned());
    Err(CliError::WaitingToStart(format!(
        "container {container:?} in pod {:?} is waiting to start: {reason}",
        record.name
    )))
}

/// The pod's record, the container, the instance and its log file.
fn locate(layout: &Layout, args: &LogsArgs) -> Result<(PodRecord, String, u32, PathBuf), CliError> {
    let record = find_pod(layout, &args.target)?;
    let (container, restart_count) = find_container(&record, args.container.as_deref())?;
    let count = if args.previous {
        restart_count.checked_sub(1).ok_or_else(|| {
            CliError::NotFound(format!(
                "previous terminated container {container} in pod {} not found",
                record.name
            ))
        })?
    } else {
        restart_count
    };
    let path = record.log_dir.join(&container).join(format!("{count}.log"));
    Ok((record, container, count, path))
}

pub fn run(state_dir: &Path, args: &LogsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let layout = Layout::new(state_dir);
    let (record, container, count, path) = locate(&layout, args)?;
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source| CliError::Io { path, source }
    };
    let mut printer = Printer {
        timestamps: args.timestamps,
        since: args.since,
        stream: args.stream,
        line: String::new(),
        first_time: None,
    };
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !args.previous => {
            if !args.follow {
                return Ok(()); // not started yet: no output, as kubectl
            }
            wait_for(&path, out)?
        }
        Err(e) => return Err(io_err(&path)(e)),
    };
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(io_err(&path))?;
    let mut lines = Vec::new();
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    for raw in text[..complete].lines() {
        printer.record(raw, &mut lines);
    }
    let mut pending = text[complete..].to_owned();
    let skip = args.tail.map_or(0, |n| lines.len().saturating_sub(n));
    for line in &lines[skip..] {
        out.write_all(line.as_bytes())
            .map_err(io_err(Path::new("stdout")))?;
    }
    if !args.follow || args.previous {
        return Ok(());
    }
    out.flush().map_err(io_err(Path::new("stdout")))?;
    follow(
        &layout,
        (&record, &container, args.instance_only),
        count,
        path,
        file,
        &mut printer,
        &mut pending,
        out,
    )
}

/// Waits for the container's log to appear; ends when the reader is gone
/// (a flush fails), not only when the log comes.
fn wait_for(path: &Path, out: &mut dyn Write) -> Result<File, CliError> {
    loop {
        if let Ok(f) = File::open(path) {
            return Ok(f);
        }
        out.flush().map_err(|source| CliError::Io {
            path: "stdout".into(),
            source,
        })?;
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Follows the file through rotations and into the next instance's file
/// after a restart; ends when the container has ended and all is printed.
#[allow(clippy::too_many_arguments)]
fn follow(
    layout: &Layout,
    (record, container, instance_only): (&PodRecord, &str, bool),
    mut count: u32,
    mut path: PathBuf,
    mut file: File,
    printer: &mut Printer,
    pending: &mut String,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let io_err = |source| CliError::Io {
        path: "log".into(),
        source,
    };
    let mut buf = Vec::new();
    let mut ended = false;
    loop {
        buf.clear();
        file.read_to_end(&mut buf).map_err(io_err)?;
        let got_data = !buf.is_empty();
        pending.push_str(&String::from_utf8_lossy(&buf));
        if let Some(end) = pending.rfind('\n') {
            let complete: String = pending.drain(..=end).collect();
            let mut lines = Vec::new();
            for raw in complete.lines() {
                printer.record(raw, &mut lines);
            }
            for line in lines {
                out.write_all(line.as_bytes()).map_err(io_err)?;
            }
            out.flush().map_err(io_err)?;
        }
        if got_data {
            continue;
        }
        // Rotated: the path now names a new file.
        let rotated = match (std::fs::metadata(&path), file.metadata()) {
            (Ok(on_disk), Ok(open)) => on_disk.ino() != open.ino(),
            _ => false,
        };
        if rotated {
            file = File::open(&path).map_err(io_err)?;
            continue;
        }
        let next = path.with_file_name(format!("{}.log", count + 1));
        if !instance_only && next.exists() {
            count += 1;
            path = next;
            file = File::open(&path).map_err(io_err)?;
            file.seek(SeekFrom::Start(0)).map_err(io_err)?;
            continue;
        }
        if ended {
            return Ok(());
        }
        // The container's last lines may have come between the read above
        // and its end: one more read after the end sees them.
        if !container_running(layout, record, container, count, instance_only) {
            ended = true;
            continue;
        }
        // A flush between polls: a reader whose client is gone learns it
        // here even from a silent container.
        out.flush().map_err(io_err)?;
        std::thread::sleep(Duration::from_millis(200));
    }
}
