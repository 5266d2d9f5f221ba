//! The list+watch state machine (client-go's reflector): list, then watch
//! from the list's resourceVersion with bookmarks, resume from the last
//! seen version after a dropped watch, re-list on 410 Gone, back off with
//! jitter on errors. It keeps the current objects by UID and tells its
//! consumer when they changed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use http::Method;
use serde::Deserialize;
use serde_json::Value;
use smol::channel::{Receiver, Sender};

use super::{Api, KubeError, RetryBackoff};
use crate::http::{next_chunk_within, percent_encode};

/// Watches last 10–20 minutes, randomised so that a fleet's watches do not
/// all expire together. client-go's reflector uses 5–10 minutes; twice that
/// halves the idle re-watch requests, which the uplink budget (≤ 400
/// requests an hour, 360 of them Lease renewals) needs. Bookmarks keep the
/// resume point fresh either way.
const MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(600);
/// A watch line (one object) larger than this is refused.
const MAX_EVENT: usize = 16 << 20;
const PAGE_SIZE: u32 = 500;

#[derive(Debug, Default)]
pub struct Snapshot {
    /// Objects by metadata.uid.
    pub objects: HashMap<String, Value>,
    /// Whether a list has succeeded since the start: until then the objects
    /// say nothing about what should not exist.
    pub synced: bool,
}

/// Counters tests and metrics read.
#[derive(Debug, Default, Clone, Copy)]
pub struct WatchStats {
    pub lists: u64,
    pub watches: u64,
    pub gone: u64,
}

pub struct Reflector {
    api: Api,
    /// Collection path, e.g. `/api/v1/pods`.
    path: String,
    /// Selector query parameters, already encoded (`fieldSelector=...`).
    selector: String,
    snapshot: RefCell<Snapshot>,
    stats: RefCell<WatchStats>,
    changed: Sender<()>,
}

#[derive(Deserialize)]
struct ListMeta {
    #[serde(rename = "resourceVersion", default)]
    resource_version: String,
    #[serde(rename = "continue", default)]
    continue_token: String,
}

#[derive(Deserialize)]
struct List {
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<Value>,
}

#[derive(Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    object: Value,
}

enum WatchEnd {
    /// The server ended the watch (timeout) or the connection dropped:
    /// resume from the last version seen.
    Resume,
    /// 410 Gone: the version is too old; list again.
    Relist,
}

fn uid_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/uid").and_then(Value::as_str)
}

fn version_of(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
}

impl Reflector {
    /// `field_selector` is the raw selector (`spec.nodeName=n1`). Returns
    /// the reflector and a receiver woken (coalesced) on every change.
    pub fn new(api: Api, path: &str, field_selector: &str) -> (Rc<Reflector>, Receiver<()>) {
        let (changed, rx) = smol::channel::bounded(1);
        let selector = if field_selector.is_empty() {
            String::new()
        } else {
            format!("fieldSelector={}", percent_encode(field_selector))
        };
        let reflector = Rc::new(Reflector {
            api,
            path: path.to_owned(),
            selector,
            snapshot: RefCell::default(),
            stats: RefCell::default(),
            changed,
        });
        (reflector, rx)
    }

    pub fn snapshot(&self) -> std::cell::Ref<'_, Snapshot> {
        self.snapshot.borrow()
    }

    pub fn stats(&self) -> WatchStats {
        *self.stats.borrow()
    }

    fn notify(&self) {
        let _ = self.changed.try_send(());
    }

    /// Runs forever: the task owning it is dropped to stop it.
    pub async fn run(self: Rc<Self>) {
        let mut backoff = RetryBackoff::new(Duration::from_millis(800), Duration::from_secs(30));
        let mut version: Option<String> = None;
        loop {
            let from = match version.clone() {
                Some(v) => v,
                None => match self.list().await {
                    Ok(v) => {
                        version = Some(v.clone());
                        v
                    }
                    Err(e) => {
                        if !e.is_unavailable() {
                            log::warn!("listing {}: {e}", self.path);
                        }
                        smol::Timer::after(backoff.next_delay()).await;
                        continue;
                    }
                },
            };
            match self.watch(&from, &mut version, &mut backoff).await {
                Ok(WatchEnd::Resume) => {}
                Ok(WatchEnd::Relist) => {
                    self.stats.borrow_mut().gone += 1;
                    log::info!(
                        "watch of {}: resource version too old; listing again",
                        self.path
                    );
                    version = None;
                }
                Err(e) => {
                    if !e.is_unavailable() {
                        log::warn!("watching {}: {e}", self.path);
                    }
                    if e.code() == Some(410) {
                        version = None;
                    }
                    smol::Timer::after(backoff.next_delay()).await;
                }
            }
        }
    }

    /// Lists every page and replaces the objects; returns the list's version.
    async fn list(&self) -> Result<String, KubeError> {
        self.stats.borrow_mut().lists += 1;
        let mut objects = HashMap::new();
        let mut continue_token = String::new();
        let version = loop {
            let mut query = format!("limit={PAGE_SIZE}");
            if !self.selector.is_empty() {
                query.push('&');
                query.push_str(&self.selector);
            }
            if !continue_token.is_empty() {
                query.push_str("&continue=");
                query.push_str(&percent_encode(&continue_token));
            }
            let list: List = self.api.get(&format!("{}?{query}", self.path)).await?;
            for item in list.items {
                if let Some(uid) = uid_of(&item) {
                    objects.insert(uid.to_owned(), item);
                }
            }
            if list.metadata.continue_token.is_empty() {
                break list.metadata.resource_version;
            }
            continue_token = list.metadata.continue_token;
        };
        {
            let mut snapshot = self.snapshot.borrow_mut();
            snapshot.objects = objects;
            snapshot.synced = true;
        }
        self.notify();
        Ok(version)
    }

    async fn watch(
        &self,
        from: &str,
        version: &mut Option<String>,
        backoff: &mut RetryBackoff,
    ) -> Result<WatchEnd, KubeError> {
        self.stats.borrow_mut().watches += 1;
        let timeout = MIN_WATCH_TIMEOUT.mul_f64(1.0 + crate::state::random_fraction());
        let mut query = format!(
            "watch=1&allowWatchBookmarks=true&timeoutSeconds={}&resourceVersion={}",
            timeout.as_secs(),
            percent_encode(from)
        );
        if !self.selector.is_empty() {
            query.push('&');
            query.push_str(&self.selector);
        }
        let path = format!("{}?{query}", self.path);
        let (url, response) = self
            .api
            .send(Method::GET, &path, None, bytes::Bytes::new())
            .await?;
        let mut body = response.into_body();
        let mut buffer = BytesMut::new();
        // Silence beyond the server's own timeout means a dead connection.
        let idle = timeout + Duration::from_secs(30);
        loop {
            let chunk = match next_chunk_within(&url, &mut body, idle).await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Ok(WatchEnd::Resume),
                Err(e) => {
                    log::debug!("watch of {} ended: {e}", self.path);
                    return Ok(WatchEnd::Resume);
                }
            };
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line = buffer.split_to(end + 1);
                let line = &line[..end];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event: WatchEvent =
                    serde_json::from_slice(line).map_err(|e| KubeError::Decode {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                if let Some(end) = self.apply(event, version) {
                    return Ok(end);
                }
                backoff.reset();
            }
            if buffer.len() > MAX_EVENT {
                return Err(KubeError::Decode {
                    path,
                    message: format!("a watch event larger than {MAX_EVENT} bytes"),
                });
            }
        }
    }

    /// Applies one event; `Some` ends the watch.
    fn apply(&self, event: WatchEvent, version: &mut Option<String>) -> Option<WatchEnd> {
        match event.kind.as_str() {
            "ERROR" => {
                let code = event.object.get("code").and_then(Value::as_u64);
                if code == Some(410) {
                    return Some(WatchEnd::Relist);
                }
                log::warn!(
                    "watch of {}: {}",
                    self.path,
                    event
                        .object
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("error event")
                );
                Some(WatchEnd::Resume)
            }
            "BOOKMARK" => {
                if let Some(v) = version_of(&event.object) {
                    *version = Some(v.to_owned());
                }
                None
            }
            kind @ ("ADDED" | "MODIFIED" | "DELETED") => {
                if let Some(v) = version_of(&event.object) {
                    *version = Some(v.to_owned());
                }
                let uid = uid_of(&event.object).map(str::to_owned)?;
                {
                    let mut snapshot = self.snapshot.borrow_mut();
                    if kind == "DELETED" {
                        snapshot.objects.remove(&uid);
                    } else {
                        snapshot.objects.insert(uid, event.object);
                    }
                }
                self.notify();
                None
            }
            other => {
                log::debug!("watch of {}: ignoring event type {other}", self.path);
                None
            }
        }
    }
}
