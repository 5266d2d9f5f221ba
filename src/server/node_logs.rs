//! Upstream's `/logs/` (enableSystemLogHandler): the node's own logs under
//! /var/log, a file's bytes or a directory's listing, as the Go file server
//! behind upstream's handler answers (`kubectl get --raw
//! /api/v1/nodes/<node>/proxy/logs/`). Nothing outside the directory is
//! served: `..` stops at its top, and a symlink that leads out is not found.

use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_lite::StreamExt;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

use super::{Body, BodyError, ChannelWriter, full, text};

pub const NODE_LOG_DIR: &str = "/var/log";

/// How much of a file is sniffed for its content type, as Go does.
const SNIFF: usize = 512;

enum Found {
    /// Entries' names, a directory's with a `/`, sorted.
    Dir(Vec<String>),
    File {
        file: std::fs::File,
        size: u64,
        head: Vec<u8>,
    },
}

/// Answers `path` (the request's, percent-decoded, starting `/logs`) from
/// `root`.
pub async fn serve(root: PathBuf, path: &str) -> Response<Body> {
    let Some(rest) = path.strip_prefix("/logs") else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    if rest.is_empty() {
        return redirect("logs/");
    }
    let wants_dir = rest.ends_with('/');
    let mut parts: Vec<String> = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part.to_owned()),
        }
    }
    let name = parts.last().cloned();
    let found = crate::helpers::unblock(move || find(&root, &parts)).await;
    match (found, name) {
        (Ok(Found::Dir(_)), Some(name)) if !wants_dir => redirect(&format!("{name}/")),
        (Ok(Found::Dir(entries)), _) => full(
            StatusCode::OK,
            "text/html; charset=utf-8",
            listing(&entries),
        ),
        (Ok(Found::File { .. }), Some(name)) if wants_dir => redirect(&format!("../{name}")),
        (Ok(Found::File { file, size, head }), _) => file_response(file, size, &head),
        (Err(e), _) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            text(StatusCode::FORBIDDEN, "403 Forbidden")
        }
        (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => {
            text(StatusCode::NOT_FOUND, "404 page not found")
        }
        (Err(e), _) => {
            log::debug!("/logs{rest}: {e}");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "500 Internal Server Error",
            )
        }
    }
}

fn find(root: &Path, parts: &[String]) -> std::io::Result<Found> {
    let root = std::fs::canonicalize(root)?;
    let path = std::fs::canonicalize(parts.iter().fold(root.clone(), |p, part| p.join(part)))?;
    if !path.starts_with(&root) {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    if path.is_dir() {
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&path)? {
            let entry = entry?;
            let mut name = entry.file_name().to_string_lossy().into_owned();
            // As Go's listing: what the entry itself is, not a symlink's target.
            if entry.file_type()?.is_dir() {
                name.push('/');
            }
            entries.push(name);
        }
        entries.sort();
        return Ok(Found::Dir(entries));
    }
    let mut file = std::fs::File::open(&path)?;
    let size = file.metadata()?.len();
    let mut head = Vec::with_capacity(SNIFF);
    (&mut file).take(SNIFF as u64).read_to_end(&mut head)?;
    Ok(Found::File { file, size, head })
}

/// A relative redirect, as Go's file server makes between a directory and
/// its trailing slash.
fn redirect(location: &str) -> Response<Body> {
    let mut response = text(StatusCode::MOVED_PERMANENTLY, "");
    if let Ok(value) = location.parse() {
        response.headers_mut().insert(http::header::LOCATION, value);
    }
    response
}

/// Go's directory listing.
fn listing(entries: &[String]) -> String {
    let mut html = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for name in entries {
        let href: String = name
            .split_inclusive('/')
            .map(|part| match part.strip_suffix('/') {
                Some(dir) => format!("{}/", crate::http::percent_encode(dir)),
                None => crate::http::percent_encode(part),
            })
            .collect();
        html.push_str(&format!("<a href=\"{href}\">{}</a>\n", escape(name)));
    }
    html.push_str("</pre>\n");
    html
}

fn escape(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '&' => "&amp;".to_owned(),
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '"' => "&#34;".to_owned(),
            '\'' => "&#39;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// The file's first `size` bytes (a log may grow meanwhile; the length
/// said is what is sent), read on a thread of its own that ends when the
/// client goes.
fn file_response(file: std::fs::File, size: u64, head: &[u8]) -> Response<Body> {
    let (tx, rx) = smol::channel::bounded::<Bytes>(4);
    let first = Bytes::copy_from_slice(head);
    let rest = size.saturating_sub(head.len() as u64);
    let spawned = std::thread::Builder::new()
        .name("nanolet-logs".into())
        .spawn(move || {
            if tx.send_blocking(first).is_err() {
                return;
            }
            let mut writer = ChannelWriter { tx, left: None };
            let _ = std::io::copy(&mut file.take(rest), &mut writer);
        });
    if let Err(e) = spawned {
        return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
    }
    let body = StreamBody::new(rx.map(|b| Ok::<_, BodyError>(Frame::data(b))));
    let mut response = Response::new(BodyExt::boxed_unsync(body));
    for (name, value) in [
        (http::header::CONTENT_TYPE, content_type(head).to_owned()),
        (http::header::CONTENT_LENGTH, size.to_string()),
    ] {
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// What Go's sniffing says of a log directory's usual files: gzip for
/// rotated logs, text for text, else bytes.
fn content_type(head: &[u8]) -> &'static str {
    if head.starts_with(&[0x1f, 0x8b, 0x08]) {
        "application/x-gzip"
    } else if !head.contains(&0) && std::str::from_utf8(trim_partial_char(head)).is_ok() {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    }
}

/// `head` without a UTF-8 sequence cut off at its end.
fn trim_partial_char(head: &[u8]) -> &[u8] {
    match std::str::from_utf8(head) {
        Err(e) if e.error_len().is_none() => &head[..e.valid_up_to()],
        _ => head,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_escape_names_and_mark_directories() {
        let html = listing(&["a b.log".into(), "<x>".into(), "journal/".into()]);
        assert!(
            html.contains("<a href=\"a%20b.log\">a b.log</a>\n"),
            "{html}"
        );
        assert!(
            html.contains("<a href=\"%3Cx%3E\">&lt;x&gt;</a>\n"),
            "{html}"
        );
        assert!(
            html.contains("<a href=\"journal/\">journal/</a>\n"),
            "{html}"
        );
        assert!(html.starts_with("<!doctype html>") && html.ends_with("</pre>\n"));
    }

    /// What `serve` answers for `path` under `root`: status, Location, body.
    fn answer(root: &Path, path: &str) -> (u16, String, String) {
        smol::block_on(async {
            let response = serve(root.to_owned(), path).await;
            let status = response.status().as_u16();
            let location = response
                .headers()
                .get(http::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let body = response.into_body().collect().await.map(|b| b.to_bytes());
            let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
            (status, location, body)
        })
    }

    #[test]
    fn files_listings_and_redirects_inside_the_root_only() {
        let base = crate::state::TestDir::new("node-logs");
        let base = &base.0;
        let root = base.join("log");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.log"), "hello\n").unwrap();
        std::fs::write(base.join("secret"), "outside\n").unwrap();
        std::os::unix::fs::symlink(base.join("secret"), root.join("out")).unwrap();
        let answers = [
            answer(&root, "/logs/a.log"),
            answer(&root, "/logs/sub"),
            answer(&root, "/logs/a.log/"),
            answer(&root, "/logs"),
            answer(&root, "/logs/out"),
            answer(&root, "/logs/../secret"),
            answer(&root, "/logs/sub/../../secret"),
            answer(&root, "/logs/sub/../a.log"),
            answer(&root, "/logs/"),
        ];
        assert_eq!(answers[0], (200, String::new(), "hello\n".into()));
        assert_eq!((answers[1].0, answers[1].1.as_str()), (301, "sub/"));
        assert_eq!((answers[2].0, answers[2].1.as_str()), (301, "../a.log"));
        assert_eq!((answers[3].0, answers[3].1.as_str()), (301, "logs/"));
        // Out by a symlink, or by climbing, which stops at the root.
        assert_eq!(answers[4].0, 404);
        assert_eq!(answers[5].0, 404);
        assert_eq!(answers[6].0, 404);
        assert_eq!(answers[7], (200, String::new(), "hello\n".into()));
        assert!(
            answers[8].2.contains("<a href=\"sub/\">sub/</a>"),
            "{:?}",
            answers[8]
        );
    }

    #[test]
    fn content_types_as_sniffed() {
        assert_eq!(
            content_type(b"Dec  3 kernel: ok\n"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            content_type("é".as_bytes()[..1].as_ref()),
            "text/plain; charset=utf-8"
        );
        assert_eq!(content_type(&[0x1f, 0x8b, 0x08, 0]), "application/x-gzip");
        assert_eq!(content_type(&[0, 1, 2]), "application/octet-stream");
    }
}
