//! Where a pod is in its life, as one value: what the worker does next
//! (sync, stop sidecars, nothing, terminate) and the status it reports
//! follow from it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::pod::status::Lifecycle;

/// A pod's stage. Stages move down this list; a deletion (Terminating)
/// may come at any one. Why the kubelet ended a pod stays known to the
/// end: its status says so until the pod is gone.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Stage {
    /// Runs its containers by their restart policies.
    Syncing,
    /// Its regular containers are done for good: its sidecars are stopped
    /// and not restarted.
    Completing,
    /// The kubelet ended it (an eviction, its active deadline): nothing
    /// starts again. Kept in its dir (see `dir_evicted`).
    Ended(Ended),
    /// It ran to its end and gave its sandbox back; its status stays.
    Released { ended: Option<Ended> },
    /// Deleted: its containers are stopped within `grace`.
    Terminating {
        ended: Option<Ended>,
        grace: Duration,
    },
    /// Every container was stopped by the termination: the status is final.
    Stopped { ended: Option<Ended> },
}

impl Stage {
    /// Why the kubelet ended the pod, if it did.
    pub(super) fn ended(&self) -> Option<&Ended> {
        match self {
            Stage::Syncing | Stage::Completing => None,
            Stage::Ended(ended) => Some(ended),
            Stage::Released { ended }
            | Stage::Terminating { ended, .. }
            | Stage::Stopped { ended } => ended.as_ref(),
        }
    }

    /// Whether the kubelet may still end it: only a pod that runs.
    pub(super) fn may_end(&self) -> bool {
        matches!(self, Stage::Syncing | Stage::Completing)
    }

    pub(super) fn is_completing(&self) -> bool {
        matches!(self, Stage::Completing)
    }

    pub(super) fn is_released(&self) -> bool {
        matches!(self, Stage::Released { .. })
    }

    /// Deleted: being stopped, or stopped.
    pub(super) fn is_terminating(&self) -> bool {
        matches!(self, Stage::Terminating { .. } | Stage::Stopped { .. })
    }

    /// The regular containers are done for good.
    pub(super) fn complete(&mut self) {
        if matches!(self, Stage::Syncing) {
            *self = Stage::Completing;
        }
    }

    /// The kubelet ends a running pod.
    pub(super) fn end(&mut self, ended: Ended) {
        if self.may_end() {
            *self = Stage::Ended(ended);
        }
    }

    /// The pod ran to its end and its sandbox is given back.
    pub(super) fn release(&mut self) {
        if !self.is_released() && !self.is_terminating() {
            *self = Stage::Released {
                ended: self.ended().cloned(),
            };
        }
    }

    /// Deleted, to be stopped within `grace`; a second deletion may only
    /// shorten it.
    pub(super) fn terminate(&mut self, grace: Duration) {
        let grace = match self {
            Stage::Terminating { grace: current, .. } => grace.min(*current),
            Stage::Stopped { .. } => return,
            _ => grace,
        };
        *self = Stage::Terminating {
            ended: self.ended().cloned(),
            grace,
        };
    }

    /// Every container of a terminating pod has stopped.
    pub(super) fn stopped(&mut self) {
        if let Stage::Terminating { ended, .. } = self {
            *self = Stage::Stopped {
                ended: ended.take(),
            };
        }
    }

    /// The status's view of it.
    pub(super) fn lifecycle(&self) -> Lifecycle {
        match self {
            Stage::Terminating { .. } => Lifecycle::Terminating,
            Stage::Stopped { .. } => Lifecycle::Stopped,
            _ => Lifecycle::Running,
        }
    }
}

/// Where an evicted pod's reason is kept, so that no restart of the agent
/// runs it again.
pub(super) fn dir_evicted(pod_dir: &Path) -> PathBuf {
    pod_dir.join("evicted")
}

/// Why the kubelet ended a pod: upstream's reason and message.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Ended {
    pub(super) reason: String,
    pub(super) message: String,
}

impl Ended {
    /// The marker's text: the message, after a `reason:` line unless the
    /// reason is Evicted (what markers written before held).
    pub(super) fn to_text(&self) -> String {
        match self.reason.as_str() {
            "Evicted" => self.message.clone(),
            reason => format!("reason: {reason}\n{}", self.message),
        }
    }

    pub(super) fn from_text(text: &str) -> Ended {
        match text
            .strip_prefix("reason: ")
            .and_then(|rest| rest.split_once('\n'))
        {
            Some((reason, message)) => Ended {
                reason: reason.to_owned(),
                message: message.to_owned(),
            },
            None => Ended {
                reason: "Evicted".into(),
                message: text.to_owned(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evicted() -> Ended {
        Ended {
            reason: "Evicted".into(),
            message: "m".into(),
        }
    }

    #[test]
    fn why_the_kubelet_ended_a_pod_stays_to_its_deletion() {
        let mut stage = Stage::Syncing;
        stage.complete();
        assert_eq!(stage, Stage::Completing);
        stage.end(evicted());
        assert_eq!(stage.ended(), Some(&evicted()));
        assert!(!stage.may_end());
        stage.release();
        assert!(stage.is_released());
        assert_eq!(stage.ended(), Some(&evicted()));
        stage.terminate(Duration::from_secs(30));
        stage.terminate(Duration::from_secs(5));
        stage.terminate(Duration::from_secs(10));
        assert_eq!(
            stage,
            Stage::Terminating {
                ended: Some(evicted()),
                grace: Duration::from_secs(5)
            }
        );
        assert_eq!(stage.lifecycle(), Lifecycle::Terminating);
        stage.stopped();
        assert_eq!(stage.lifecycle(), Lifecycle::Stopped);
        assert_eq!(stage.ended(), Some(&evicted()));
    }

    #[test]
    fn stages_never_go_back() {
        let mut stage = Stage::Syncing;
        stage.release();
        stage.complete();
        stage.end(evicted());
        assert_eq!(stage, Stage::Released { ended: None });
        stage.terminate(Duration::ZERO);
        stage.stopped();
        stage.terminate(Duration::ZERO);
        stage.release();
        assert_eq!(stage, Stage::Stopped { ended: None });
        // Not stopped before it was terminating.
        let mut running = Stage::Syncing;
        running.stopped();
        assert_eq!(running, Stage::Syncing);
    }

    #[test]
    fn an_end_marker_reads_back_and_reads_older_markers() {
        let ended = Ended {
            reason: "DeadlineExceeded".into(),
            message: "past it".into(),
        };
        assert_eq!(Ended::from_text(&ended.to_text()), ended);
        assert_eq!(Ended::from_text(&evicted().to_text()), evicted());
        assert_eq!(Ended::from_text("low on disk").reason, "Evicted");
    }
}
