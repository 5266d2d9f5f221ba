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

/// What the reflector does next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// List (at the start, and after 410 Gone).
    NeedsList,
    /// Watch from this resource version (after a list, or to resume).
    WatchFrom(String),
}

/// How a watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatchEnd {
    /// The server closed the stream (its timeout) or the connection went
    /// quiet or dropped: resume from the last version seen.
    Closed,
    /// An ERROR event other than 410.
    ErrorEvent,
    /// 410 Gone, as an event or a status: the version is too old.
    Gone,
    /// The request failed, or the stream carried something undecodable.
    Failed,
}

/// What the last step came to.
#[derive(Debug)]
enum Outcome {
    Listed {
        version: String,
    },
    ListFailed,
    Watched {
        /// The newest version seen: the one watched from, or later.
        version: String,
        /// Objects it delivered (bookmarks not counted).
        events: u64,
        lasted: Duration,
        end: WatchEnd,
    },
}

/// A watch that delivered no object and lasted less than this did not
/// work: what follows it is delayed, so that a server or proxy that ends
/// every watch at once (or sends only errors) sees requests spread out, not
/// a tight loop.
const HEALTHY_WATCH: Duration = Duration::from_secs(60);

/// The reflector's decision: from where it was and what happened, where to
/// go and how long to wait first. Every failure path goes through the
/// backoff; only a watch that worked resets it.
fn step(outcome: Outcome, backoff: &mut RetryBackoff) -> (State, Duration) {
    match outcome {
        Outcome::Listed { version } => (State::WatchFrom(version), Duration::ZERO),
        Outcome::ListFailed => (State::NeedsList, backoff.next_delay()),
        Outcome::Watched {
            version,
            events,
            lasted,
            end,
        } => {
            let worked = events > 0 || lasted >= HEALTHY_WATCH;
            if worked {
                backoff.reset();
            }
            let next = match end {
                WatchEnd::Gone => State::NeedsList,
                _ => State::WatchFrom(version),
            };
            let delay = match end {
                WatchEnd::Closed | WatchEnd::Gone if worked => Duration::ZERO,
                _ => backoff.next_delay(),
            };
            (next, delay)
        }
    }
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
        let mut state = State::NeedsList;
        loop {
            let outcome = match state {
                State::NeedsList => match self.list().await {
                    Ok(version) => Outcome::Listed { version },
                    Err(e) => {
                        if !e.is_unavailable() {
                            log::warn!("listing {}: {e}", self.path);
                        }
                        Outcome::ListFailed
                    }
                },
                State::WatchFrom(from) => self.watch(from).await,
            };
            if let Outcome::Watched {
                end: WatchEnd::Gone,
                ..
            } = outcome
            {
                self.stats.borrow_mut().gone += 1;
                log::info!(
                    "watch of {}: resource version too old; listing again",
                    self.path
                );
            }
            let delay;
            log::debug!("{}: {outcome:?}", self.path);
            (state, delay) = step(outcome, &mut backoff);
            if !delay.is_zero() {
                smol::Timer::after(delay).await;
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

    /// One watch from version `from`, to its end.
    async fn watch(&self, from: String) -> Outcome {
        self.stats.borrow_mut().watches += 1;
        let started = std::time::Instant::now();
        let mut version = from;
        let mut events = 0;
        let end = self.stream(&mut version, &mut events).await;
        Outcome::Watched {
            version,
            events,
            lasted: started.elapsed(),
            end,
        }
    }

    /// Reads a watch's events into the snapshot, `version` following them.
    async fn stream(&self, version: &mut String, events: &mut u64) -> WatchEnd {
        let timeout = MIN_WATCH_TIMEOUT.mul_f64(1.0 + crate::state::random_fraction());
        let mut query = format!(
            "watch=1&allowWatchBookmarks=true&timeoutSeconds={}&resourceVersion={}",
            timeout.as_secs(),
            percent_encode(version)
        );
        if !self.selector.is_empty() {
            query.push('&');
            query.push_str(&self.selector);
        }
        let path = format!("{}?{query}", self.path);
        let (url, response) = match self
            .api
            .send(Method::GET, &path, None, bytes::Bytes::new())
            .await
        {
            Ok(sent) => sent,
            Err(e) if e.code() == Some(410) => return WatchEnd::Gone,
            Err(e) => {
                if !e.is_unavailable() {
                    log::warn!("watching {}: {e}", self.path);
                }
                return WatchEnd::Failed;
            }
        };
        log::debug!("watch of {} from {version}: streaming", self.path);
        let mut body = response.into_body();
        let mut buffer = BytesMut::new();
        // Silence beyond the server's own timeout means a dead connection.
        let idle = timeout + Duration::from_secs(30);
        loop {
            let chunk = match next_chunk_within(&url, &mut body, idle).await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return WatchEnd::Closed,
                Err(e) => {
                    log::debug!("watch of {} ended: {e}", self.path);
                    return WatchEnd::Closed;
                }
            };
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line = buffer.split_to(end + 1);
                let line = &line[..end];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event: WatchEvent = match serde_json::from_slice(line) {
                    Ok(event) => event,
                    Err(e) => {
                        log::warn!("watch of {}: undecodable event: {e}", self.path);
                        return WatchEnd::Failed;
                    }
                };
                match self.apply(event, version) {
                    Applied::Object => *events += 1,
                    Applied::Bookmark => {}
                    Applied::End(end) => return end,
                }
            }
            if buffer.len() > MAX_EVENT {
                log::warn!(
                    "watch of {}: an event larger than {MAX_EVENT} bytes",
                    self.path
                );
                return WatchEnd::Failed;
            }
        }
    }

    /// Applies one event.
    fn apply(&self, event: WatchEvent, version: &mut String) -> Applied {
        match event.kind.as_str() {
            "ERROR" => {
                let code = event.object.get("code").and_then(Value::as_u64);
                if code == Some(410) {
                    return Applied::End(WatchEnd::Gone);
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
                Applied::End(WatchEnd::ErrorEvent)
            }
            "BOOKMARK" => {
                if let Some(v) = version_of(&event.object) {
                    v.clone_into(version);
                }
                Applied::Bookmark
            }
            kind @ ("ADDED" | "MODIFIED" | "DELETED") => {
                if let Some(v) = version_of(&event.object) {
                    v.clone_into(version);
                }
                let Some(uid) = uid_of(&event.object).map(str::to_owned) else {
                    return Applied::Bookmark;
                };
                {
                    let mut snapshot = self.snapshot.borrow_mut();
                    if kind == "DELETED" {
                        snapshot.objects.remove(&uid);
                    } else {
                        snapshot.objects.insert(uid, event.object);
                    }
                }
                self.notify();
                Applied::Object
            }
            other => {
                log::debug!("watch of {}: ignoring event type {other}", self.path);
                Applied::Bookmark
            }
        }
    }
}

/// What one event did.
enum Applied {
    /// An object changed.
    Object,
    /// Nothing the consumer sees (a bookmark, an unknown event type).
    Bookmark,
    End(WatchEnd),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> RetryBackoff {
        RetryBackoff::new(Duration::from_millis(800), Duration::from_secs(30))
    }

    fn watched(events: u64, lasted_secs: u64, end: WatchEnd) -> Outcome {
        Outcome::Watched {
            version: "42".into(),
            events,
            lasted: Duration::from_secs(lasted_secs),
            end,
        }
    }

    #[test]
    fn a_list_is_followed_by_a_watch_from_its_version_at_once() {
        let (state, delay) = step(
            Outcome::Listed {
                version: "7".into(),
            },
            &mut backoff(),
        );
        assert_eq!(state, State::WatchFrom("7".into()));
        assert_eq!(delay, Duration::ZERO);
    }

    #[test]
    fn a_failed_list_waits_longer_each_time() {
        let mut b = backoff();
        let (state, first) = step(Outcome::ListFailed, &mut b);
        assert_eq!(state, State::NeedsList);
        let (_, second) = step(Outcome::ListFailed, &mut b);
        let (_, third) = step(Outcome::ListFailed, &mut b);
        assert!(first >= Duration::from_millis(800), "{first:?}");
        assert!(
            third >= Duration::from_millis(3200),
            "{first:?} {second:?} {third:?}"
        );
    }

    #[test]
    fn a_watch_that_worked_resumes_from_its_last_version_at_once() {
        let mut b = backoff();
        // The server's timeout after a quiet 10 minutes.
        let (state, delay) = step(watched(0, 600, WatchEnd::Closed), &mut b);
        assert_eq!(state, State::WatchFrom("42".into()));
        assert_eq!(delay, Duration::ZERO);
        // A connection dropped after events came.
        let (_, delay) = step(watched(3, 1, WatchEnd::Closed), &mut b);
        assert_eq!(delay, Duration::ZERO);
    }

    #[test]
    fn a_stream_that_ends_at_once_is_not_reopened_at_once() {
        let mut b = backoff();
        let delays: Vec<Duration> = (0..4)
            .map(|_| {
                let (state, delay) = step(watched(0, 0, WatchEnd::Closed), &mut b);
                assert_eq!(state, State::WatchFrom("42".into()));
                delay
            })
            .collect();
        assert!(delays[0] >= Duration::from_millis(800), "{delays:?}");
        assert!(delays[3] >= Duration::from_millis(6400), "{delays:?}");
    }

    #[test]
    fn error_events_back_off_even_after_a_good_watch() {
        let mut b = backoff();
        let (state, delay) = step(watched(0, 0, WatchEnd::ErrorEvent), &mut b);
        assert_eq!(state, State::WatchFrom("42".into()));
        assert!(delay >= Duration::from_millis(800));
        let (_, delay) = step(watched(5, 30, WatchEnd::ErrorEvent), &mut b);
        assert!(
            delay >= Duration::from_millis(800) && delay < Duration::from_millis(1600),
            "reset by the events, then one step: {delay:?}"
        );
        let (_, delay) = step(watched(0, 0, WatchEnd::Failed), &mut b);
        assert!(delay >= Duration::from_millis(1600), "{delay:?}");
    }

    #[test]
    fn gone_lists_again_at_once_unless_it_loops() {
        let mut b = backoff();
        let (state, delay) = step(watched(2, 5, WatchEnd::Gone), &mut b);
        assert_eq!(state, State::NeedsList);
        assert_eq!(delay, Duration::ZERO);
        // A server answering every watch with 410: list, watch, 410, ...
        let (state, delay) = step(watched(0, 0, WatchEnd::Gone), &mut b);
        assert_eq!(state, State::NeedsList);
        assert!(delay >= Duration::from_millis(800));
    }
}
