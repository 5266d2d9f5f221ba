//! The agent killed (`kill -9`) at random moments, now and then with its
//! monitor launcher or a pod's monitor, while static pods come, change and
//! go. Afterwards every pod its manifests ask for runs exactly once, at its
//! latest version, and once the manifests are gone nothing of any pod is
//! left.
//!
//! The seed is printed; `CHAOS_SEED=N` replays a run's choices (the
//! moments they land on still vary with the machine's speed).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::time::Duration;

use common::{Agent, Registry};

const ROUNDS: u32 = 32;
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const T: Duration = Duration::from_secs(60);

/// xorshift64*: choices a seed replays, with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    match std::env::var("CHAOS_SEED") {
        Ok(text) => text.parse().expect("CHAOS_SEED is a number"),
        Err(_) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (now.as_nanos() as u64) | 1
        }
    }
}

/// Pod `name` at `version`: it says its version in its log, stops at once
/// on SIGTERM, and `c` and `d` share a PID namespace (a pause process).
fn manifest(image: &str, name: &str, version: u32) -> String {
    let shared = if name == "c" || name == "d" {
        "  shareProcessNamespace: true\n"
    } else {
        ""
    };
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 2
{shared}  containers:
  - name: c
    image: {image}
    command: [sh, -c, \"echo v{version}; trap 'exit 0' TERM; while true; do sleep 1; done\"]
"
    )
}

fn read_pid(path: &std::path::Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The agent's monitor launcher: its child with its own command line.
fn launcher_of(agent_pid: u32) -> Option<u32> {
    let cmdline = |pid: u32| fs::read(format!("/proc/{pid}/cmdline")).ok();
    let own = cmdline(agent_pid)?;
    let children =
        fs::read_to_string(format!("/proc/{agent_pid}/task/{agent_pid}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|&pid| cmdline(pid).as_ref() == Some(&own))
}

fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

/// Running instances of the agent's containers under `pod_dir`.
fn running_under(agent: &Agent, pod_dir: &std::path::Path) -> usize {
    agent
        .runtime_containers()
        .iter()
        .filter(|c| c["status"] == "running")
        .filter(|c| {
            c["bundle"]
                .as_str()
                .is_some_and(|b| std::path::Path::new(b).starts_with(pod_dir))
        })
        .count()
}

#[test]
fn killed_at_random_the_agent_runs_every_pod_once_and_leaves_nothing() {
    let seed = seed();
    eprintln!("chaos: seed {seed} (CHAOS_SEED={seed} replays its choices)");
    let mut rng = Rng(seed);
    let registry = Registry::start();
    let image = registry.push("test/busybox:1", &[]);
    let mut agent = Agent::start(&registry);
    // What the manifests ask for: name → version.
    let mut desired: BTreeMap<&str, u32> = BTreeMap::new();
    let mut version = 0;
    for round in 0..ROUNDS {
        for _ in 0..=rng.below(2) {
            let name = NAMES[rng.below(NAMES.len() as u64) as usize];
            let file = format!("{name}.yaml");
            if desired.contains_key(name) && rng.below(3) == 0 {
                agent.remove_manifest(&file);
                desired.remove(name);
            } else {
                version += 1;
                agent.write_manifest(&file, &manifest(&image, name, version));
                desired.insert(name, version);
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(1500)));
        let mut victims = Vec::new();
        match rng.below(8) {
            0 => victims.extend(agent.pid().and_then(launcher_of)),
            1 => {
                let pods: Vec<_> = fs::read_dir(agent.state.join("pods"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .collect();
                if !pods.is_empty() {
                    let pod = &pods[rng.below(pods.len() as u64) as usize];
                    victims.extend(read_pid(&pod.path().join("monitor.pid")));
                }
            }
            _ => {}
        }
        eprintln!("chaos: round {round}: {desired:?}, also killing {victims:?}");
        agent.kill9();
        victims.into_iter().for_each(kill9);
        agent.spawn();
    }
    if desired.is_empty() {
        version += 1;
        agent.write_manifest("a.yaml", &manifest(&image, "a", version));
        desired.insert("a", version);
    }

    agent.wait_for("every desired pod running once, at its version", T, |a| {
        let records = a.records();
        if records.len() != desired.len() {
            return None;
        }
        for (name, version) in &desired {
            let record = a.record(name)?;
            if record["status"]["phase"] != "Running" {
                return None;
            }
            if running_under(a, &a.pod_dir(&record)) != 1 {
                return None;
            }
            if a.logs(name, None).trim() != format!("v{version}") {
                return None;
            }
        }
        let running = a
            .runtime_containers()
            .iter()
            .filter(|c| c["status"] == "running")
            .count();
        (running == desired.len()).then_some(())
    });

    for name in desired.keys() {
        agent.remove_manifest(&format!("{name}.yaml"));
    }
    agent.wait_for("every pod gone", T, |a| {
        (a.records().is_empty() && a.runtime_containers().is_empty()).then_some(())
    });
    let deadline = std::time::Instant::now() + T * common::time_scale();
    loop {
        let left = leftovers(&agent);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: left behind: {left:#?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What of the agent's pods is still on the node: monitors, pause
/// processes, mounts, pod cgroups, pod dirs.
fn leftovers(agent: &Agent) -> Vec<String> {
    let mut left = Vec::new();
    let state = agent.state.display().to_string();
    for pid in common::processes_whose_cmdline_contains(&format!("--pod-dir {state}/")) {
        left.push(format!("monitor {pid}"));
    }
    // A pause is named after its pid file, in its pod's dir.
    for pid in common::processes_whose_cmdline_contains(&format!(" pause {state}/")) {
        left.push(format!("pause {pid}"));
    }
    for mount in common::mounts_under(&agent.state) {
        left.push(format!("mount {}", mount.display()));
    }
    // The QoS classes' own dirs stay; pods' go.
    for dir in agent.cgroup_dirs("kubepods") {
        let children = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
            fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        };
        for child in children(&dir) {
            let qos = ["besteffort", "burstable"]
                .iter()
                .any(|q| child.ends_with(q));
            let pods = if qos { children(&child) } else { vec![child] };
            for pod in pods {
                left.push(format!("cgroup {}", pod.display()));
            }
        }
    }
    for entry in fs::read_dir(agent.state.join("pods"))
        .into_iter()
        .flatten()
        .flatten()
    {
        left.push(format!("pod dir {}", entry.path().display()));
    }
    left
}
