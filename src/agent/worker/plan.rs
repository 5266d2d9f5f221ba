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
mod tests {
    //! Cases after upstream's TestComputePodActions and its init container
    //! and sidecar variants (kuberuntime_manager_test.go).

    use super::Action::*;
    use super::running as running_view;
    use super::*;
    use crate::agent::prober::ProbeTracker;
    use crate::pod::manifest::parse_one;
    use jiff::Timestamp;

    /// A pod from its spec's YAML lines (two-space indented under spec).
    fn pod(spec: &str) -> Pod {
        parse_one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n{spec}"
        ))
    }

    const TWO: &str = "  containers: [{name: a, image: x}, {name: b, image: x}]\n";

    fn with_policy(policy: &str, rest: &str) -> Pod {
        pod(&format!("  restartPolicy: {policy}\n{rest}"))
    }

    /// An init container, a sidecar (with a startup probe when
    /// `probed`), then two regular containers.
    fn with_sidecar(policy: &str, probed: bool) -> Pod {
        let probe = if probed {
            ", startupProbe: {exec: {command: [\"true\"]}}"
        } else {
            ""
        };
        with_policy(
            policy,
            &format!(
                "  initContainers: [{{name: i, image: x}}, {{name: s, image: x, restartPolicy: Always{probe}}}]\n{TWO}"
            ),
        )
    }

    fn fresh(pod: &Pod) -> Vec<ContainerState> {
        pod.every_container()
            .map(|c| ContainerState::of(c, &[]))
            .collect()
    }

    fn running(c: &mut ContainerState, id: &str) {
        c.record.view.container_id = Some(id.into());
        c.record.view.running_since = Some(Timestamp::now());
        c.record.view.terminated = None;
    }

    /// Its instance exited with `code` at `at`.
    fn exited(c: &mut ContainerState, id: &str, code: i32, at: Instant) {
        running(c, id);
        c.record.view.running_since = None;
        c.record.view.terminated = Some(Terminated {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            started_at: None,
            finished_at: Timestamp::now(),
            container_id: id.into(),
            message: None,
        });
        c.exited_at = Some(at);
    }

    fn syncing() -> Facts {
        Facts {
            sandbox_ready: true,
            ..Facts::default()
        }
    }

    struct Case {
        name: &'static str,
        pod: Pod,
        given: fn(&mut [ContainerState], Instant),
        facts: Facts,
        want: fn(Instant) -> Vec<Action>,
    }

    fn check(cases: Vec<Case>) {
        for case in cases {
            let now = Instant::now();
            let mut containers = fresh(&case.pod);
            (case.given)(&mut containers, now);
            // Probes start with each instance, as the executor starts them.
            for (i, c) in containers.iter_mut().enumerate() {
                if running_view(&c.record.view) {
                    c.probes = ProbeTracker::start(&case.pod.container(i).probes, now);
                }
            }
            let got = plan(&case.pod, &containers, &case.facts, now);
            assert_eq!(got, (case.want)(now), "{}", case.name);
        }
    }

    #[test]
    fn regular_containers_by_restart_policy() {
        check(vec![
            Case {
                name: "a new pod starts every container",
                pod: with_policy("Always", TWO),
                given: |_, _| {},
                facts: syncing(),
                want: |_| vec![Start(0), Start(1)],
            },
            Case {
                name: "everything runs: nothing to do",
                pod: with_policy("Always", TWO),
                given: |c, _| {
                    running(&mut c[0], "a1");
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |_| vec![],
            },
            Case {
                name: "Always restarts an exited container, at once the first time",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    exited(&mut c[0], "a1", 0, now);
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |_| vec![Start(0)],
            },
            Case {
                name: "OnFailure restarts the failed container only",
                pod: with_policy("OnFailure", TWO),
                given: |c, now| {
                    exited(&mut c[0], "a1", 0, now);
                    exited(&mut c[1], "b1", 2, now);
                },
                facts: syncing(),
                want: |_| vec![Start(1)],
            },
            Case {
                name: "Never restarts nothing",
                pod: with_policy("Never", TWO),
                given: |c, now| {
                    exited(&mut c[0], "a1", 0, now);
                    exited(&mut c[1], "b1", 1, now);
                },
                facts: syncing(),
                want: |_| vec![],
            },
            Case {
                name: "a changed spec restarts even under Never, without backoff",
                pod: with_policy("Never", TWO),
                given: |c, now| {
                    exited(&mut c[0], "a1", 137, now);
                    c[0].restart_backoff.record_attempt(now);
                    c[0].restart_for_update = true;
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |_| vec![Start(0)],
            },
        ]);
    }

    #[test]
    fn crash_loops_and_failed_setups_back_off() {
        check(vec![
            Case {
                name: "a crash right after a restart waits 10 s (CrashLoopBackOff)",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    c[0].restart_backoff.record_attempt(now);
                    exited(&mut c[0], "a2", 1, now);
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |now| {
                    vec![BackOff {
                        container: 0,
                        until: now + Duration::from_secs(10),
                        delay: Duration::from_secs(10),
                    }]
                },
            },
            Case {
                name: "the backoff doubles at the next crash",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    c[0].restart_backoff.record_attempt(now);
                    c[0].restart_backoff.record_attempt(now);
                    exited(&mut c[0], "a3", 1, now);
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |now| {
                    vec![BackOff {
                        container: 0,
                        until: now + Duration::from_secs(20),
                        delay: Duration::from_secs(20),
                    }]
                },
            },
            Case {
                name: "its backoff over, it starts",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    let then = now - Duration::from_secs(11);
                    c[0].restart_backoff.record_attempt(then);
                    exited(&mut c[0], "a2", 1, then);
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |_| vec![Start(0)],
            },
            Case {
                name: "a failed pull is tried again after its backoff",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    c[0].setup_backoff.record_attempt(now);
                    c[0].setup_failed_at = Some(now);
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |now| {
                    vec![SetupBackOff {
                        container: 0,
                        until: now + Duration::from_secs(10),
                    }]
                },
            },
            Case {
                name: "a container waiting for a retry is left alone",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    c[0].retry_at = Some(now + Duration::from_secs(1));
                },
                facts: syncing(),
                want: |_| vec![Start(1)],
            },
        ]);
    }

    #[test]
    fn init_containers_run_one_after_the_other() {
        let two_inits = |policy| {
            with_policy(
                policy,
                &format!("  initContainers: [{{name: i, image: x}}, {{name: j, image: x}}]\n{TWO}"),
            )
        };
        check(vec![
            Case {
                name: "none started: the first starts, the rest wait",
                pod: two_inits("Always"),
                given: |_, _| {},
                facts: syncing(),
                want: |_| vec![Start(0), Gate(1), Gate(2), Gate(3)],
            },
            Case {
                name: "one running: nothing starts",
                pod: two_inits("Always"),
                given: |c, _| running(&mut c[0], "i1"),
                facts: syncing(),
                want: |_| vec![Gate(1), Gate(2), Gate(3)],
            },
            Case {
                name: "the first succeeded: the second starts",
                pod: two_inits("Always"),
                given: |c, now| exited(&mut c[0], "i1", 0, now),
                facts: syncing(),
                want: |_| vec![Start(1), Gate(2), Gate(3)],
            },
            Case {
                name: "all succeeded: the regular containers start",
                pod: two_inits("Always"),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    exited(&mut c[1], "j1", 0, now);
                },
                facts: syncing(),
                want: |_| vec![Start(2), Start(3)],
            },
            Case {
                name: "a failed one restarts (Always)",
                pod: two_inits("Always"),
                given: |c, now| exited(&mut c[0], "i1", 1, now),
                facts: syncing(),
                want: |_| vec![Start(0), Gate(1), Gate(2), Gate(3)],
            },
            Case {
                name: "a failed one stays failed (Never), the rest never start",
                pod: two_inits("Never"),
                given: |c, now| exited(&mut c[0], "i1", 1, now),
                facts: syncing(),
                want: |_| vec![Gate(1), Gate(2), Gate(3)],
            },
            Case {
                name: "all done: a regular container restarts, the init containers do not",
                pod: two_inits("Always"),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    exited(&mut c[1], "j1", 0, now);
                    running(&mut c[2], "a1");
                    exited(&mut c[3], "b1", 1, now);
                },
                facts: syncing(),
                want: |_| vec![Start(3)],
            },
        ]);
    }

    #[test]
    fn sidecars_start_in_order_restart_always_and_stop_last() {
        check(vec![
            Case {
                name: "a sidecar without a startup probe lets the next ones start once running",
                pod: with_sidecar("Never", false),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    running(&mut c[1], "s1");
                },
                facts: syncing(),
                want: |_| vec![Start(2), Start(3)],
            },
            Case {
                name: "a sidecar's startup probe holds the next ones back until it passes",
                pod: with_sidecar("Never", true),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    running(&mut c[1], "s1");
                },
                facts: syncing(),
                want: |_| vec![Gate(2), Gate(3)],
            },
            Case {
                name: "once a regular container ran, a sidecar whose probes start over holds nothing back",
                pod: with_sidecar("Always", true),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    running(&mut c[1], "s1");
                    running(&mut c[2], "a1");
                    exited(&mut c[3], "b1", 1, now);
                },
                facts: syncing(),
                want: |_| vec![Start(3)],
            },
            Case {
                name: "a sidecar restarts under Never",
                pod: with_sidecar("Never", false),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    exited(&mut c[1], "s1", 0, now);
                    running(&mut c[2], "a1");
                    running(&mut c[3], "b1");
                },
                facts: syncing(),
                want: |_| vec![Start(1)],
            },
            Case {
                name: "the regular containers done: the pod completes, its sidecar stops",
                pod: with_sidecar("Never", false),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    running(&mut c[1], "s1");
                    exited(&mut c[2], "a1", 0, now);
                    exited(&mut c[3], "b1", 1, now);
                },
                facts: syncing(),
                want: |_| vec![Complete, Stop(1)],
            },
            Case {
                name: "a completing pod's exited sidecar is not restarted",
                pod: with_sidecar("Never", false),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    exited(&mut c[1], "s1", 143, now);
                    exited(&mut c[2], "a1", 0, now);
                    exited(&mut c[3], "b1", 0, now);
                },
                facts: Facts {
                    completing: true,
                    ..syncing()
                },
                want: |_| vec![],
            },
            Case {
                name: "an init container failed for good: the pod completes",
                pod: pod(
                    "  restartPolicy: Never\n  initContainers: [{name: s, image: x, restartPolicy: Always}, {name: i, image: x}]\n  containers: [{name: a, image: x}]\n",
                ),
                given: |c, now| {
                    running(&mut c[0], "s1");
                    exited(&mut c[1], "i1", 1, now);
                },
                facts: syncing(),
                want: |_| vec![Complete, Stop(0), Gate(2)],
            },
            Case {
                name: "a restarting regular container keeps its pod from completing",
                pod: with_sidecar("OnFailure", false),
                given: |c, now| {
                    exited(&mut c[0], "i1", 0, now);
                    running(&mut c[1], "s1");
                    exited(&mut c[2], "a1", 0, now);
                    exited(&mut c[3], "b1", 1, now);
                },
                facts: syncing(),
                want: |_| vec![Start(3)],
            },
        ]);
    }

    #[test]
    fn stops_deadlines_and_the_end() {
        check(vec![
            Case {
                name: "an instance past its stop deadline is killed, then restarted once exited",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    running(&mut c[0], "a1");
                    c[0].kill_at = Some(now);
                    running(&mut c[1], "b1");
                    c[1].kill_at = Some(now + Duration::from_secs(1));
                },
                facts: syncing(),
                want: |_| vec![Kill(0)],
            },
            Case {
                name: "an ended pod starts nothing; its stop deadlines hold",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    running(&mut c[0], "a1");
                    c[0].kill_at = Some(now);
                    exited(&mut c[1], "b1", 1, now);
                },
                facts: Facts {
                    ended: true,
                    ..syncing()
                },
                want: |_| vec![Kill(0)],
            },
            Case {
                name: "past its active deadline the pod ends",
                pod: with_policy("Always", TWO),
                given: |c, now| exited(&mut c[1], "b1", 1, now),
                facts: Facts {
                    past_deadline: true,
                    ..syncing()
                },
                want: |_| vec![EndPastDeadline],
            },
            Case {
                name: "a pod that gave its sandbox back starts nothing",
                pod: with_policy("Always", TWO),
                given: |c, now| {
                    exited(&mut c[0], "a1", 0, now);
                    c[0].restart_for_update = true;
                },
                facts: Facts {
                    released: true,
                    phase_terminal: true,
                    ..syncing()
                },
                want: |_| vec![],
            },
        ]);
    }

    #[test]
    fn ephemeral_containers_run_until_the_pod_ends() {
        let debugged = || {
            pod(&format!(
                "  restartPolicy: Never\n{TWO}  ephemeralContainers: [{{name: d, image: x}}]\n"
            ))
        };
        check(vec![
            Case {
                name: "added to a running pod: it starts",
                pod: debugged(),
                given: |c, _| {
                    running(&mut c[0], "a1");
                    running(&mut c[1], "b1");
                },
                facts: syncing(),
                want: |_| vec![Start(2)],
            },
            Case {
                name: "exited: never restarted",
                pod: debugged(),
                given: |c, now| {
                    running(&mut c[0], "a1");
                    running(&mut c[1], "b1");
                    exited(&mut c[2], "d1", 1, now);
                },
                facts: syncing(),
                want: |_| vec![],
            },
            Case {
                name: "the pod ended: a running one is stopped, a new one never starts",
                pod: debugged(),
                given: |c, now| {
                    exited(&mut c[0], "a1", 0, now);
                    exited(&mut c[1], "b1", 0, now);
                    running(&mut c[2], "d1");
                },
                facts: Facts {
                    phase_terminal: true,
                    ..syncing()
                },
                want: |_| vec![Stop(2)],
            },
            Case {
                name: "the pod ended before it started: it never starts",
                pod: debugged(),
                given: |c, now| {
                    exited(&mut c[0], "a1", 0, now);
                    exited(&mut c[1], "b1", 0, now);
                },
                facts: Facts {
                    phase_terminal: true,
                    ..syncing()
                },
                want: |_| vec![],
            },
        ]);
    }

    #[test]
    fn a_lost_sandbox_is_set_up_first_and_init_containers_run_again() {
        let p = with_policy(
            "Always",
            &format!("  initContainers: [{{name: i, image: x}}]\n{TWO}"),
        );
        let now = Instant::now();
        let mut c = fresh(&p);
        exited(&mut c[0], "i1", 0, now);
        exited(&mut c[1], "a1", 0, now);
        exited(&mut c[2], "b1", 0, now);
        let lost = Facts {
            sandbox_ready: false,
            ..syncing()
        };
        assert_eq!(plan(&p, &c, &lost, now), vec![SetUpSandboxFirst]);
        // The same sandbox came back: the pod stays initialized.
        assert_eq!(plan(&p, &c, &syncing(), now), vec![Start(1), Start(2)]);
        // A new one (a reboot): the init container first, at once, though
        // it crashed just before.
        for c in &mut c {
            c.record.from_old_sandbox = true;
        }
        c[0].restart_backoff.record_attempt(now);
        c[0].restart_backoff.record_attempt(now);
        assert_eq!(
            plan(&p, &c, &syncing(), now),
            vec![Start(0), Gate(1), Gate(2)]
        );
        // A pod that never restarts stays done, sandbox or not.
        let never = with_policy(
            "Never",
            &format!("  initContainers: [{{name: i, image: x}}]\n{TWO}"),
        );
        let mut c = fresh(&never);
        for (i, c) in c.iter_mut().enumerate() {
            exited(c, &format!("{i}"), 0, now);
        }
        assert_eq!(plan(&never, &c, &lost, now), vec![]);
    }

    #[test]
    fn carrying_a_plan_out_leaves_nothing_to_plan_again() {
        let p = with_sidecar("Never", false);
        let now = Instant::now();
        let mut c = fresh(&p);
        exited(&mut c[0], "i1", 0, now);
        running(&mut c[1], "s1");
        exited(&mut c[2], "a1", 0, now);
        exited(&mut c[3], "b1", 0, now);
        c[2].kill_at = Some(now);
        let mut facts = syncing();
        let first = plan(&p, &c, &facts, now);
        assert_eq!(first, vec![Complete, Stop(1)]);
        // What the executor records for them.
        facts.completing = true;
        c[1].kill_at = Some(now + p.termination_grace);
        assert_eq!(plan(&p, &c, &facts, now), vec![]);
    }
}
