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
