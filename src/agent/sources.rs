//! The static pod source: a directory of manifests, watched with inotify and
//! rescanned every fileCheckFrequency as a safety net.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_lite::FutureExt;
use jiff::Timestamp;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use smol::Async;

use super::admission::{self, NodeView};
use crate::pod::Pod;
use crate::pod::manifest::{self, Document};
use crate::state::records::Rejected;

/// Everything the directory says, as of one scan.
#[derive(Debug, Default)]
pub struct Scan {
    pub pods: Vec<Pod>,
    pub rejected: Vec<Rejected>,
}

pub struct ManifestSource {
    dir: PathBuf,
    rescan: Duration,
    watch: Option<Async<Inotify>>,
    max_pods: usize,
    /// In cluster mode the node's name: static pods are named
    /// `<name>-<node>`, as upstream's file source names them, so that their
    /// mirror pods from several nodes do not collide.
    node_suffix: Option<String>,
}

/// Changes come in bursts (several files copied at once); events within
/// this time of the first share one rescan.
const SETTLE: Duration = Duration::from_millis(5);

impl ManifestSource {
    pub fn new(
        dir: PathBuf,
        rescan: Duration,
        max_pods: usize,
        node_suffix: Option<String>,
    ) -> Self {
        let mut source = ManifestSource {
            dir,
            rescan,
            watch: None,
            max_pods,
            node_suffix,
        };
        source.try_watch();
        source
    }

    fn try_watch(&mut self) {
        if self.watch.is_some() {
            return;
        }
        // Only events after which a file is complete: not IN_CREATE or
        // IN_MODIFY, which come while a writer is still writing.
        let flags = AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        let watch = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .and_then(|i| i.add_watch(&self.dir, flags).map(|_| i));
        match watch.map(Async::new) {
            Ok(Ok(w)) => self.watch = Some(w),
            Ok(Err(e)) => log::warn!("watching {}: {e}", self.dir.display()),
            Err(e) => log::debug!(
                "watching {}: {e}; rescanning every {:?}",
                self.dir.display(),
                self.rescan
            ),
        }
    }

    /// Waits until the directory may have changed.
    pub async fn changed(&mut self) {
        let rescan = self.rescan;
        let timer = async {
            smol::Timer::after(rescan).await;
        };
        match &self.watch {
            Some(watch) => {
                let event = async {
                    let _ = watch.readable().await;
                    smol::Timer::after(SETTLE).await;
                    // Drain the burst; content is re-read by the scan.
                    let mut gone = false;
                    while let Ok(events) = watch.get_ref().read_events() {
                        gone |= events.iter().any(|e| {
                            e.mask.intersects(
                                AddWatchFlags::IN_DELETE_SELF
                                    | AddWatchFlags::IN_MOVE_SELF
                                    | AddWatchFlags::IN_IGNORED,
                            )
                        });
                        if events.is_empty() {
                            break;
                        }
                    }
                    gone
                };
                if event
                    .or(async {
                        timer.await;
                        false
                    })
                    .await
                {
                    self.watch = None;
                }
            }
            None => timer.await,
        }
        self.try_watch();
    }

    /// Reads every manifest, off the loop; `None` when the directory cannot
    /// be read. A pod that does not run yet (its UID not in `running`) and
    /// does not fit `node` is refused, as upstream's admission refuses
    /// static pods (taints aside); one that runs stays
    /// (IgnoredDuringExecution).
    pub async fn scan(&self, node: &NodeView, running: HashSet<String>) -> Option<Scan> {
        let dir = self.dir.clone();
        let max_pods = self.max_pods;
        let suffix = self.node_suffix.clone();
        let admission = Admission {
            node: node.clone(),
            running,
        };
        crate::helpers::unblock(move || {
            let mut scan = scan_dir(&dir, max_pods, &admission)?;
            if let Some(node) = suffix {
                for pod in &mut scan.pods {
                    add_node_suffix(pod, &node);
                }
            }
            Some(scan)
        })
        .await
    }
}

fn add_node_suffix(pod: &mut Pod, node: &str) {
    let name = format!("{}-{node}", pod.name);
    let explicit_hostname = pod
        .manifest
        .spec
        .as_ref()
        .is_some_and(|s| s.hostname.is_some());
    if !explicit_hostname {
        let hostname: String = name.chars().take(63).collect();
        pod.hostname = hostname.trim_end_matches(['-', '.']).to_owned();
    }
    pod.manifest.metadata.name = Some(name.clone());
    pod.name = name;
}

/// `None` when the directory cannot be read: that says nothing about which
/// pods should run (a missing mount must not stop every static pod), so the
/// caller keeps what runs, as upstream's file source does.
/// What a new static pod must fit.
struct Admission {
    node: NodeView,
    /// UIDs of the pods that run: admitted before.
    running: HashSet<String>,
}

fn scan_dir(dir: &Path, max_pods: usize, admission: &Admission) -> Option<Scan> {
    let mut scan = Scan::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            log::debug!("reading {}: {e}", dir.display());
            return None;
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| manifest::is_manifest_name(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    files.sort();
    let now = Timestamp::now();
    let mut names: HashMap<(String, String), String> = HashMap::new();
    for file in files {
        let source = file.to_string_lossy().into_owned();
        let reject = |index, namespace, name, reason: String| Rejected {
            file: source.clone(),
            index,
            namespace,
            name,
            reason,
            since: now,
        };
        let text = match std::fs::read(&file) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(_) => {
                    scan.rejected
                        .push(reject(0, None, None, "not UTF-8 text".into()));
                    continue;
                }
            },
            Err(e) => {
                scan.rejected.push(reject(0, None, None, e.to_string()));
                continue;
            }
        };
        for (index, document) in manifest::parse(&text, &source).into_iter().enumerate() {
            match document {
                Document::Pod(pod) => {
                    let key = (pod.namespace.clone(), pod.name.clone());
                    if let Some(first) = names.get(&key) {
                        let reason =
                            format!("pod {} is already defined in {first}", pod.full_name());
                        scan.rejected
                            .push(reject(index, Some(key.0), Some(key.1), reason));
                    } else if let Some((reason, message)) = (!admission.running.contains(&pod.uid))
                        .then(|| admission::fits_node(&pod.manifest, &admission.node, false))
                        .and_then(Result::err)
                    {
                        scan.rejected.push(reject(
                            index,
                            Some(key.0),
                            Some(key.1),
                            format!("{reason}: {message}"),
                        ));
                    } else if scan.pods.len() >= max_pods {
                        let reason =
                            format!("OutOfpods: the node runs at most {max_pods} pods (maxPods)");
                        scan.rejected
                            .push(reject(index, Some(key.0), Some(key.1), reason));
                    } else {
                        names.insert(key, source.clone());
                        scan.pods.push(*pod);
                    }
                }
                Document::Rejected {
                    index,
                    namespace,
                    name,
                    reason,
                } => scan.rejected.push(reject(index, namespace, name, reason)),
            }
        }
    }
    Some(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_reports_bad_files_and_duplicates() {
        let guard = crate::state::TestDir::new("src");
        let dir = guard.0.clone();
        let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x:1}]}\n";
        std::fs::write(dir.join("1.yaml"), pod).unwrap();
        std::fs::write(dir.join("2.yaml"), pod).unwrap();
        std::fs::write(dir.join("3.yaml"), "kind: [").unwrap();
        std::fs::write(dir.join(".hidden.yaml"), "kind: [").unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let node = NodeView {
            name: "edge-1".into(),
            labels: [("disk".to_owned(), "ssd".to_owned())].into(),
            ..Default::default()
        };
        let elsewhere = "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec: {nodeSelector: {disk: hdd}, containers: [{name: c, image: x:1}]}\n";
        std::fs::write(dir.join("4.yaml"), elsewhere).unwrap();
        let admission = Admission {
            node,
            running: HashSet::new(),
        };
        let scan = scan_dir(&dir, 110, &admission).unwrap();
        assert_eq!(scan.pods.len(), 1);
        assert!(
            scan.rejected
                .iter()
                .any(|r| r.file.ends_with("4.yaml") && r.reason.starts_with("NodeAffinity: ")),
            "{:?}",
            scan.rejected
        );
        // Once it runs, a changed label does not stop it.
        let hdd = NodeView {
            labels: [("disk".to_owned(), "hdd".to_owned())].into(),
            ..Default::default()
        };
        let uid = scan_dir(
            &dir,
            110,
            &Admission {
                node: hdd,
                running: HashSet::new(),
            },
        )
        .unwrap()
        .pods
        .iter()
        .find(|p| p.name == "b")
        .map(|p| p.uid.clone())
        .unwrap();
        let running = Admission {
            node: admission.node.clone(),
            running: [uid].into(),
        };
        assert!(
            scan_dir(&dir, 110, &running)
                .unwrap()
                .pods
                .iter()
                .any(|p| p.name == "b")
        );
        std::fs::remove_file(dir.join("4.yaml")).unwrap();
        let scan = scan_dir(&dir, 110, &admission).unwrap();
        assert_eq!(scan.rejected.len(), 2, "{:?}", scan.rejected);
        assert!(scan.rejected[0].reason.contains("already defined"));
        assert!(scan.rejected[1].file.ends_with("3.yaml"));
        let capped = scan_dir(&dir, 0, &admission).unwrap();
        assert!(scan_dir(&dir.join("missing"), 110, &admission).is_none());
        assert!(
            capped
                .rejected
                .iter()
                .any(|r| r.reason.starts_with("OutOfpods"))
        );
    }
}
