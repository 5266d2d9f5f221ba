//! Attacks on the node's trust boundary, made the way an attacker would
//! make them: real images in the loopback registry, real pods under runc.
//! docs/security.md names the threat each test stands for.

mod common;

use std::fs;
use std::time::Duration;

use common::{Agent, Registry, TempDir, pod_yaml};

const T: Duration = Duration::from_secs(30);

fn restarted(agent: &Agent, pod: &str, container: &str) -> Option<()> {
    let status = agent.container_status(pod, container)?;
    (status["restartCount"].as_u64()? >= 1).then_some(())
}

/// A container repointed its downwardAPI volume's `..data` at a host dir:
/// at its restart the agent rewrote the volume and removed the "previous"
/// data dir, which was the host's. Now the volume is read-only to the
/// plain container, and the privileged one, which remounts it writable,
/// finds that the agent never follows what it finds there.
#[test]
fn a_container_cannot_make_the_agent_delete_through_its_volume() {
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let agent = Agent::start(&registry);
    let victims = TempDir::new("nanolet-victim");
    let victim = |n: &str| {
        let dir = victims.path().join(n);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("keep"), "host data").unwrap();
        dir
    };
    let (plain, privileged) = (victim("plain"), victim("privileged"));
    let mounts = "    volumeMounts: [{name: info, mountPath: /info, readOnly: false}]\n";
    agent.write_manifest(
        "attack.yaml",
        &pod_yaml(
            "attack",
            "  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: info\n    downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}\n",
            &format!(
                "  - name: plain\n    image: {image}\n    command: [sh, -c, 'touch /info/x; ln -sfn {} /info/..data || echo refused; sleep 1; exit 1']\n{mounts}  - name: privileged\n    image: {image}\n    securityContext: {{privileged: true}}\n    command: [sh, -c, 'mount -o remount,bind,rw /info && ln -sfn {} /info/..data && echo planted; sleep 1; exit 1']\n{mounts}",
                plain.display(),
                privileged.display()
            ),
        ),
    );
    agent.wait_for("both containers restarted", T, |a| {
        restarted(a, "attack", "plain")?;
        restarted(a, "attack", "privileged")
    });
    let plain_log = agent.logs("default/attack", Some("plain"));
    assert!(plain_log.contains("Read-only file system"), "{plain_log}");
    // The attack itself ran: else this test could not fail.
    let privileged_log = agent.logs("default/attack", Some("privileged"));
    assert!(privileged_log.contains("planted"), "{privileged_log}");
    for dir in [&plain, &privileged] {
        assert_eq!(
            fs::read_to_string(dir.join("keep")).ok().as_deref(),
            Some("host data"),
            "{}",
            agent.log()
        );
    }
    agent.remove_manifest("attack.yaml");
    agent.wait_for("the pod gone", T, |a| {
        a.record("attack").is_none().then_some(())
    });
}
