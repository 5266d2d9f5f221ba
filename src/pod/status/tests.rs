use super::*;
use crate::pod::manifest::parse_one;

fn pod(policy: &str) -> Pod {
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  restartPolicy: {policy}\n  containers: [{{name: a, image: x:1}}, {{name: b, image: x:1}}]\n"
    );
    parse_one(&text)
}

fn exited(code: i32) -> ContainerView {
    ContainerView {
        name: "a".into(),
        container_id: Some("1".into()),
        terminated: Some(Terminated {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            started_at: None,
            finished_at: Timestamp::now(),
            container_id: "1".into(),
            message: None,
        }),
        ..Default::default()
    }
}

fn running(name: &str) -> ContainerView {
    ContainerView {
        name: name.into(),
        container_id: Some("2".into()),
        running_since: Some(Timestamp::now()),
        ..Default::default()
    }
}

fn row(p: &Pod, views: &[ContainerView]) -> (String, String, u32) {
    let s = pod_status(p, views, "runc", Timestamp::now(), &[], Lifecycle::Running);
    summary(&s, false, 2)
}

#[test]
fn waiting_reasons_are_saved_by_name_and_unknown_names_read_as_creating() {
    let view = ContainerView {
        waiting: Some((WaitingReason::ImagePullBackOff, "Back-off".into())),
        ..Default::default()
    };
    let saved = serde_json::to_value(&view).unwrap();
    // The record's format from before the enum: a name and a message.
    assert_eq!(
        saved["waiting"],
        serde_json::json!(["ImagePullBackOff", "Back-off"])
    );
    assert_eq!(
        serde_json::from_value::<ContainerView>(saved).unwrap(),
        view
    );
    for reason in WaitingReason::ALL {
        assert_eq!(WaitingReason::from(reason.as_str().to_owned()), reason);
    }
    let mut newer = serde_json::to_value(&view).unwrap();
    newer["waiting"][0] = "SomethingNew".into();
    let read: ContainerView = serde_json::from_value(newer).unwrap();
    assert_eq!(read.waiting.unwrap().0, WaitingReason::ContainerCreating);
}

#[test]
fn phases_and_rows() {
    let p = pod("Always");
    assert_eq!(
        row(&p, &[running("a"), running("b")]),
        ("2/2".into(), "Running".into(), 0)
    );
    let creating = ContainerView {
        name: "b".into(),
        ..Default::default()
    };
    assert_eq!(
        row(&p, &[running("a"), creating.clone()]).1,
        "ContainerCreating"
    );
    let mut crash = exited(1);
    crash.restart_count = 3;
    crash.last_terminated = crash.terminated.take();
    crash.waiting = Some((WaitingReason::CrashLoopBackOff, "back-off 40s".into()));
    let s = pod_status(
        &p,
        &[crash.clone(), running("b")],
        "runc",
        Timestamp::now(),
        &[],
        Lifecycle::Running,
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(
        summary(&s, false, 2),
        ("1/2".into(), "CrashLoopBackOff".into(), 3)
    );

    let never = pod("Never");
    let s = pod_status(
        &never,
        &[exited(0), exited(0)],
        "runc",
        Timestamp::now(),
        &[],
        Lifecycle::Running,
    );
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    assert_eq!(summary(&s, false, 2).1, "Completed");
    let s = pod_status(
        &never,
        &[exited(2), exited(0)],
        "runc",
        Timestamp::now(),
        &[],
        Lifecycle::Running,
    );
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(summary(&s, false, 2).1, "Error");
    let on_failure = pod("OnFailure");
    let s = pod_status(
        &on_failure,
        &[exited(0), running("b")],
        "runc",
        Timestamp::now(),
        &[],
        Lifecycle::Running,
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(summary(&s, true, 2).1, "Terminating");

    // Deleted and stopped: terminal even under restartPolicy Always.
    let stopped = |views: &[ContainerView]| {
        pod_status(&p, views, "runc", Timestamp::now(), &[], Lifecycle::Stopped).phase
    };
    assert_eq!(
        stopped(&[exited(0), exited(0)]).as_deref(),
        Some("Succeeded")
    );
    assert_eq!(
        stopped(&[exited(0), exited(137)]).as_deref(),
        Some("Failed")
    );
}
