//! What a pass does to a pod's containers, decided from its spec and what
//! its containers did, as upstream's computePodActions decides it: which
//! instance is killed or stopped, which container waits (for the init
//! containers before it, or a backoff) and which one starts. Pure: the
//! executor (`sync.rs`) observes, plans, and carries the actions out, so
//! "why did this container restart" is answered here.

use std::time::{Duration, Instant};

use super::ContainerState;
use crate::pod::status::{self, ContainerView, Terminated};
use crate::pod::{ContainerRole, Pod, RestartPolicy};

/// What the plan needs to know of the pod beyond its containers.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Facts {
    /// The kubelet ended it (an eviction, its deadline): nothing starts.
    pub ended: bool,
    /// Its activeDeadlineSeconds have passed.
    pub past_deadline: bool,
    /// Its regular containers are done for good (see `Action::Complete`).
    pub completing: bool,
    /// It ran to its end and gave its sandbox back: nothing starts.
    pub released: bool,
    /// The status written last has a terminal phase.
    pub phase_terminal: bool,
    /// The sandbox is set up, or was set up (or tried) earlier in this
    /// pass: no `SetUpSandboxFirst`.
    pub sandbox_ready: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// SIGKILL: the instance's stop deadline has passed.
    Kill(usize),
    /// The pod is past its active deadline: it ends (DeadlineExceeded).
    EndPastDeadline,
    /// The regular containers are done for good (or an init container
    /// failed for good): the pod completes, and its sidecars are stopped
    /// and not restarted.
    Complete,
    /// The stop signal, SIGKILL after the grace period.
    Stop(usize),
    /// A container is to restart in a pod with init containers whose
    /// sandbox is gone (a reboot): the sandbox is set up before any start
    /// is decided, since a new one runs the init containers again. The
    /// pass plans again after it.
    SetUpSandboxFirst,
    /// Waits for the init containers before it (PodInitializing).
    Gate(usize),
    /// Its instance crashed and restarts at `until` (CrashLoopBackOff,
    /// `delay` long).
    BackOff {
        container: usize,
        until: Instant,
        delay: Duration,
    },
    /// Its image pull or create failed: tried again at `until`
    /// (ImagePullBackOff after ErrImagePull).
    SetupBackOff { container: usize, until: Instant },
    /// A new instance.
    Start(usize),
}

fn running(view: &ContainerView) -> bool {
    view.container_id.is_some() && view.terminated.is_none()
}

/// The pass's actions, in the order they are carried out. Planning again
/// after carrying them out gives none of them again: the plan is level
/// triggered.
pub(super) fn plan(
    pod: &Pod,
    containers: &[ContainerState],
    facts: &Facts,
    now: Instant,
) -> Vec<Action> {
    let mut actions = Vec::new();
    // Stop deadlines hold whatever else happens, an ended pod's too.
    for (i, c) in containers.iter().enumerate() {
        if running(&c.record.view) && c.kill_at.is_some_and(|t| t <= now) {
            actions.push(Action::Kill(i));
        }
    }
    if facts.ended {
        return actions;
    }
    if facts.past_deadline {
        actions.push(Action::EndPastDeadline);
        return actions;
    }
    let n_init = pod.init_containers.len();
    let completing = facts.completing || done_for_good(pod, containers);
    if completing && !facts.completing {
        actions.push(Action::Complete);
        // In reverse order, as upstream stops sidecars.
        for i in (0..n_init).rev() {
            if pod.container(i).role == ContainerRole::Sidecar
                && running(&containers[i].record.view)
            {
                actions.push(Action::Stop(i));
            }
        }
    }
    let n_regular_end = n_init + pod.containers.len();
    // A pod that has ended keeps no debugging container: upstream stops
    // every container of a terminal pod.
    if facts.phase_terminal {
        for (i, c) in containers.iter().enumerate().skip(n_regular_end) {
            if running(&c.record.view) && c.kill_at.is_none() {
                actions.push(Action::Stop(i));
            }
        }
    }
    if facts.released {
        return actions;
    }
    if !facts.sandbox_ready && restarts_in_new_sandbox(pod, containers, completing) {
        actions.push(Action::SetUpSandboxFirst);
        return actions;
    }
    let frontier = init_frontier(pod, containers);
    let finished = completing || facts.phase_terminal;
    for (i, c) in containers.iter().enumerate() {
        if c.retry_at.is_some_and(|t| t > now) {
            continue;
        }
        // Init containers one after the other; regular ones after all;
        // ephemeral ones whenever the pod has not finished, as upstream.
        let gated = if i < n_init {
            i > frontier
        } else if i < n_regular_end {
            frontier < n_init
        } else {
            if finished {
                continue;
            }
            false
        };
        if gated {
            actions.push(Action::Gate(i));
            continue;
        }
        let view = &c.record.view;
        if running(view) {
            continue;
        }
        if let Some(terminated) = &view.terminated {
            let updated = c.restart_for_update;
            // An init container that completed in an earlier sandbox.
            let rerun = i < n_init && c.record.from_old_sandbox;
            if !wants_restart(pod, i, terminated, completing) && !updated && !rerun {
                continue;
            }
            // A restart for a new spec is not a crash: no backoff.
            if !(updated || rerun)
                && let Some(until) = c
                    .restart_backoff
                    .wait_until(c.exited_at.unwrap_or(now), now)
            {
                let delay = c.restart_backoff.delay(now).unwrap_or_default();
                actions.push(Action::BackOff {
                    container: i,
                    until,
                    delay,
                });
                continue;
            }
        }
        if let Some(failed_at) = c.setup_failed_at
            && let Some(until) = c.setup_backoff.wait_until(failed_at, now)
        {
            actions.push(Action::SetupBackOff {
                container: i,
                until,
            });
            continue;
        }
        actions.push(Action::Start(i));
    }
    actions
}

/// Whether container `i` should get a new instance now that its current
/// one ended: sidecars always (until the pod completes), init containers
/// until they succeed unless the policy is Never, regular containers by
/// the pod's restart policy.
pub(super) fn wants_restart(
    pod: &Pod,
    i: usize,
    terminated: &Terminated,
    completing: bool,
) -> bool {
    match pod.container(i).role {
        ContainerRole::Sidecar => !completing,
        ContainerRole::Ephemeral => false,
        ContainerRole::Init => {
            terminated.exit_code != 0 && pod.restart_policy != RestartPolicy::Never
        }
        ContainerRole::Regular => match pod.restart_policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => terminated.exit_code != 0,
            RestartPolicy::Never => false,
        },
    }
}

/// Once every regular container has ended for good (or an init container
/// failed for good), a pod with sidecars completes, as upstream's does.
fn done_for_good(pod: &Pod, containers: &[ContainerState]) -> bool {
    let n_init = pod.init_containers.len();
    if !pod
        .init_containers
        .iter()
        .any(|c| c.role == ContainerRole::Sidecar)
    {
        return false;
    }
    let over = |i: usize| {
        containers[i]
            .record
            .view
            .terminated
            .as_ref()
            .is_some_and(|t| !wants_restart(pod, i, t, false))
    };
    let init_failed = (0..n_init).any(|i| {
        let failed = containers[i]
            .record
            .view
            .terminated
            .as_ref()
            .is_some_and(|t| t.exit_code != 0);
        pod.container(i).role == ContainerRole::Init && failed && over(i)
    });
    init_failed || (n_init..n_init + pod.containers.len()).all(over)
}

/// A pod with init containers that ran before and has a container to
/// restart, which may need a new sandbox (then its init containers run
/// again first). Pods that never restart stay done.
fn restarts_in_new_sandbox(pod: &Pod, containers: &[ContainerState], completing: bool) -> bool {
    if pod.init_containers.is_empty() || pod.restart_policy == RestartPolicy::Never {
        return false;
    }
    containers.iter().enumerate().any(|(i, c)| {
        let view = &c.record.view;
        view.container_id.is_some()
            && view
                .terminated
                .as_ref()
                .is_some_and(|t| wants_restart(pod, i, t, completing))
    })
}

/// The first init container that has not done its part yet; the number
/// of init containers once all have (then regular containers may run).
pub(super) fn init_frontier(pod: &Pod, containers: &[ContainerState]) -> usize {
    let n = pod.init_containers.len();
    // What ran in an earlier sandbox does not count.
    let views: Vec<ContainerView> = containers
        .iter()
        .map(|c| {
            let mut view = c.record.view.clone();
            if c.record.from_old_sandbox {
                view.container_id = None;
                view.terminated = None;
            }
            view
        })
        .collect();
    if status::previously_initialized(pod, &views) {
        return n;
    }
    (0..n)
        .find(|&i| {
            let c = &containers[i];
            if c.record.from_old_sandbox {
                return true;
            }
            let view = ContainerView {
                probed_started: c.probes.started(),
                ..c.record.view.clone()
            };
            !status::init_done(pod.container(i).role, &view)
        })
        .unwrap_or(n)
}

#[cfg(test)]
mod tests;
