//! Container logs in the CRI format: `<RFC3339Nano> <stream> <P|F> <text>`,
//! rotated by size like the upstream kubelet: the live file is renamed with
//! a timestamp suffix, older rotated files are gzip-compressed, and at most
//! `max_files` files are kept.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use jiff::Timestamp;

/// A line longer than this is split into partial (`P`) records, as
/// container runtimes do.
pub const MAX_LINE: usize = 16 * 1024;

/// Containers' logs are the node's and its log shippers' (root), not every
/// host user's: containerd's 0640.
const LOG_MODE: u32 = 0o640;

pub struct LogWriter {
    path: PathBuf,
    file: File,
    size: u64,
    max_size: u64,
    max_files: u32,
}

impl LogWriter {
    pub fn open(path: &Path, max_size: u64, max_files: u32) -> io::Result<LogWriter> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(LOG_MODE)
            .open(path)?;
        let size = file.metadata()?.len();
        Ok(LogWriter {
            path: path.to_owned(),
            file,
            size,
            max_size,
            max_files: max_files.max(2),
        })
    }

    /// Writes one record; `partial` marks a fragment of a longer line.
    pub fn record(&mut self, stream: &str, partial: bool, text: &[u8]) -> io::Result<()> {
        let stamp = Timestamp::now();
        let tag = if partial { 'P' } else { 'F' };
        let mut line = Vec::with_capacity(text.len() + 48);
        write!(
            line,
            "{} {stream} {tag} ",
            stamp.strftime("%Y-%m-%dT%H:%M:%S%.fZ")
        )?;
        line.extend_from_slice(text);
        line.push(b'\n');
        // Rotate before the write that would pass the limit, so that the
        // live file never exceeds it and always holds the newest record.
        if self.size > 0 && self.size + line.len() as u64 > self.max_size {
            self.rotate()?;
        }
        self.file.write_all(&line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        let stamp = Timestamp::now().strftime("%Y%m%d-%H%M%S%.f").to_string();
        let rotated = PathBuf::from(format!("{}.{stamp}", self.path.display()));
        fs::rename(&self.path, &rotated)?;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(LOG_MODE)
            .open(&self.path)?;
        self.size = 0;
        let mut older = rotated_files(&self.path)?;
        // Compress all rotated files but the newest, which a reader following
        // the log may still hold open.
        older.sort();
        if let Some((_, rest)) = older.split_last() {
            for file in rest {
                if file.extension().is_none_or(|e| e != "gz") {
                    compress(file)?;
                }
            }
        }
        let mut older = rotated_files(&self.path)?;
        older.sort();
        let keep = self.max_files as usize - 1;
        if older.len() > keep {
            for file in &older[..older.len() - keep] {
                let _ = fs::remove_file(file);
            }
        }
        Ok(())
    }
}

/// Rotated files of `path`: `<path>.<stamp>[.gz]`; their names sort by age.
pub fn rotated_files(path: &Path) -> io::Result<Vec<PathBuf>> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let prefix = format!(
        "{}.",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && !name.ends_with(".tmp") {
            out.push(entry.path());
        }
    }
    Ok(out)
}

fn compress(path: &Path) -> io::Result<()> {
    let gz = PathBuf::from(format!("{}.gz", path.display()));
    let tmp = PathBuf::from(format!("{}.gz.tmp", path.display()));
    let mut input = File::open(path)?;
    let output = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(LOG_MODE)
        .open(&tmp)?;
    let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
    io::copy(&mut input, &mut encoder)?;
    encoder.finish()?.sync_all()?;
    fs::rename(&tmp, &gz)?;
    fs::remove_file(path)
}

/// Splits a stream's bytes into CRI records: a full line per newline, and
/// partial records for lines longer than [`MAX_LINE`].
#[derive(Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; calls `emit(partial, text)` per record.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        emit: &mut dyn FnMut(bool, &[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        while let Some(pos) = data.iter().position(|b| *b == b'\n') {
            self.pending.extend_from_slice(&data[..pos]);
            emit(false, &self.pending)?;
            self.pending.clear();
            data = &data[pos + 1..];
        }
        self.pending.extend_from_slice(data);
        while self.pending.len() >= MAX_LINE {
            let rest = self.pending.split_off(MAX_LINE);
            emit(true, &self.pending)?;
            self.pending = rest;
        }
        Ok(())
    }

    /// At end of stream: what is left is the last (unterminated) line.
    pub fn finish(
        &mut self,
        emit: &mut dyn FnMut(bool, &[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        if !self.pending.is_empty() {
            emit(false, &self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }
}

/// Parses one CRI record: (timestamp, stream, partial, text).
pub fn parse_record(line: &str) -> Option<(&str, &str, bool, &str)> {
    let mut parts = line.splitn(4, ' ');
    let time = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let text = parts.next().unwrap_or("");
    Some((time, stream, tag == "P", text))
}

/// The last `lines` lines of a CRI log's messages (partial records joined),
/// at most `max_bytes` of them from the end: what FallbackToLogsOnError
/// reports. Reads only the log's last part.
pub fn tail_messages(path: &Path, lines: usize, max_bytes: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    // CRI prefixes roughly triple short lines; read generously.
    let window = (max_bytes * 8).max(64 * 1024) as u64;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(window)));
    let mut raw = Vec::new();
    let _ = file.take(window).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let mut records = text.lines();
    if len > window {
        // The first line is probably cut.
        records.next();
    }
    let mut messages: Vec<String> = Vec::new();
    let mut joining = false;
    for line in records {
        let Some((_, _, partial, message)) = parse_record(line) else {
            continue;
        };
        match (joining, messages.last_mut()) {
            (true, Some(last)) => last.push_str(message),
            _ => messages.push(message.to_owned()),
        }
        joining = partial;
    }
    let start = messages.len().saturating_sub(lines);
    let mut tail = messages[start..].join("\n");
    if tail.len() > max_bytes {
        let mut cut = tail.len() - max_bytes;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = tail[cut..].to_owned();
    }
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_of_messages() {
        let dir = std::env::temp_dir().join(format!("nanolet-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        let mut text = String::new();
        for i in 0..100 {
            text.push_str(&format!("2024-01-01T00:00:00Z stderr F line {i}\n"));
        }
        text.push_str("2024-01-01T00:00:00Z stdout P par\n2024-01-01T00:00:00Z stdout F tial\n");
        std::fs::write(&path, text).unwrap();
        let (tail, short) = (tail_messages(&path, 3, 2048), tail_messages(&path, 80, 10));
        // Removed before asserting: a failure must not leave it behind.
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(tail, "line 98\nline 99\npartial");
        assert_eq!(short, "99\npartial");
    }

    #[test]
    fn splits_lines_and_partials() {
        let mut s = LineSplitter::default();
        let mut out = Vec::new();
        let mut emit = |p: bool, t: &[u8]| {
            out.push((p, t.len(), t.first().copied()));
            Ok(())
        };
        s.feed(b"ab", &mut emit).unwrap();
        s.feed(b"c\nd\n", &mut emit).unwrap();
        s.feed(&vec![b'x'; MAX_LINE + 5], &mut emit).unwrap();
        s.feed(b"\ntail", &mut emit).unwrap();
        s.finish(&mut emit).unwrap();
        assert_eq!(
            out,
            vec![
                (false, 3, Some(b'a')),
                (false, 1, Some(b'd')),
                (true, MAX_LINE, Some(b'x')),
                (false, 5, Some(b'x')),
                (false, 4, Some(b't')),
            ]
        );
    }

    #[test]
    fn rotates_compresses_and_caps_files() {
        let guard = crate::state::TestDir::new("log");
        let dir = guard.0.clone();
        let path = dir.join("c/0.log");
        let mut w = LogWriter::open(&path, 200, 3).unwrap();
        for i in 0..40 {
            w.record("stdout", false, format!("line number {i}").as_bytes())
                .unwrap();
        }
        let rotated = rotated_files(&path).unwrap();
        assert_eq!(rotated.len(), 2, "{rotated:?}");
        assert_eq!(
            rotated
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "gz"))
                .count(),
            1
        );
        let live = fs::read_to_string(&path).unwrap();
        let last = live.lines().last().unwrap();
        let (time, stream, partial, text) = parse_record(last).unwrap();
        assert!(time.ends_with('Z') && time.contains('T'), "{time}");
        assert_eq!((stream, partial, text), ("stdout", false, "line number 39"));
    }
}
