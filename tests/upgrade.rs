//! Replacing the agent under running pods, as an upgrade on a board does:
//! the previous release's agent (scripts/previous-release, built by
//! scripts/build-previous.sh) runs a pod; the agent under test takes its
//! place on the same state dir, migrates the dir's format, and adopts the
//! pod without restarting it; then it stops and removes the pod the old one
//! started. scripts/test.sh builds the previous agent and runs this with
//! NANOLET_PREVIOUS_AGENT set; without it, the test is ignored.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Agent, Registry};

const T: Duration = Duration::from_secs(60);

#[test]
#[ignore = "needs the previous release's agent: NANOLET_PREVIOUS_AGENT=$(scripts/build-previous.sh)"]
fn the_agent_replaced_under_running_pods_adopts_them() {
    let previous = std::env::var_os("NANOLET_PREVIOUS_AGENT")
        .map(PathBuf::from)
        .expect("NANOLET_PREVIOUS_AGENT: the previous release's agent (scripts/build-previous.sh)");
    assert!(previous.is_file(), "{}: no such agent", previous.display());
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let mut agent = Agent::unstarted(&registry, None, &[]);
    agent.set_binary(Some(previous));
    agent.spawn();
    agent.write_manifest(
        "app.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: app}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {image}\n    command: [sh, -c, 'echo started once; exec sleep 3600']\n"
        ),
    );
    let before = agent.wait_running("app");
    let container = before["status"]["containerStatuses"][0]["containerID"].clone();
    assert!(container.is_string(), "{before}");
    // The previous release recorded no format: its dir is format 0.
    assert!(!agent.state.join("format").exists());

    // The upgrade: the old agent stops as systemd stops it (SIGTERM, its
    // pods left running), the new binary starts on the same state dir.
    let pid = agent.pid().expect("the previous agent runs");
    common::run(std::process::Command::new("kill").args(["-TERM", &pid.to_string()]));
    agent.wait_for("the previous agent to stop", T, |_| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Exited: a zombie until reaped.
        let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
        (state == Some('Z')).then_some(())
    });
    assert!(
        agent
            .log()
            .contains("pods keep running and will be adopted by the next start"),
        "{}",
        agent.log()
    );
    agent.kill9();
    agent.set_binary(None);
    agent.spawn();
    agent.wait_for("the state dir's migration", T, |a| {
        a.log()
            .contains("state dir migrated from format 0 to 1")
            .then_some(())
    });
    let adopted = agent.wait_for("the pod adopted", T, |a| {
        let r = a.record("app")?;
        let status = &r["status"]["containerStatuses"][0];
        (status["state"]["running"].is_object() && status["containerID"] == container).then_some(r)
    });
    assert_eq!(
        adopted["status"]["containerStatuses"][0]["restartCount"], 0,
        "{adopted}"
    );
    assert_eq!(
        std::fs::read_to_string(agent.state.join("format"))
            .unwrap()
            .trim(),
        "1"
    );
    // Its log, written through the old agent's monitor, reads with the new
    // agent's CLI; the container started once.
    let logs = agent.logs("default/app", None);
    assert_eq!(logs.matches("started once").count(), 1, "{logs}");

    // The new agent stops and removes what the old one started.
    std::fs::remove_file(agent.manifests.join("app.yaml")).unwrap();
    agent.wait_for("the pod removed", T, |a| {
        std::fs::read_dir(a.state.join("pods"))
            .map(|d| d.count() == 0)
            .unwrap_or(false)
            .then_some(())
    });
    agent.assert_no_containers_nor_mounts();
}
