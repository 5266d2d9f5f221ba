//! The relist: upstream's PLEG, here a safety net under the monitors'
//! exit reports. Once a minute the runtime's containers are listed and
//! compared with what the pods' records say: each pod's worker gets the
//! states of its own containers and heals its records (a recorded instance
//! the runtime no longer runs gets an exit; one left `created` by an agent
//! killed mid-create is deleted and started again); a container whose pod
//! no worker owns (its dir removed, its cleanup failed) is removed, and so
//! are a monitor, a pause or a pod cgroup whose pod dir is gone (`sweep`).
//! A list that fails says nothing: it is "unknown, try again", never
//! "nothing runs". Cost: one `runc list` (a fork and exec, no pod touched)
//! a minute; the sweep, a read of each process's command line and of the
//! QoS cgroup dirs on a helper thread, at the first list after a start and
//! every tenth after that.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use smol::channel::Sender;

use super::Context;
use crate::runtime::Bundle;
use crate::runtime::runc::State;

/// How often the runtime is listed.
pub const PERIOD: Duration = Duration::from_secs(60);
/// The first list, after the adoptions of a start have settled.
const FIRST: Duration = Duration::from_secs(20);

/// Every how many lists the sweep runs (see `sweep`), besides the first
/// after a start, when what a crash left is found.
const SWEEP_EVERY: u32 = 10;

/// What one relist found, and whether the sweep is due with it.
pub struct Relisted {
    pub listed: Vec<State>,
    pub sweep: bool,
}

/// Lists the runtime's containers every [`PERIOD`] and sends what it finds.
pub async fn run(ctx: Rc<Context>, found: Sender<Relisted>) {
    let mut wait = FIRST;
    let mut lists: u32 = 0;
    loop {
        smol::Timer::after(wait).await;
        wait = PERIOD;
        match ctx.runtime.list().await {
            Ok(listed) => {
                let sweep = lists.is_multiple_of(SWEEP_EVERY);
                lists = lists.wrapping_add(1);
                if found.send(Relisted { listed, sweep }).await.is_err() {
                    return;
                }
            }
            Err(e) => log::warn!("relist: {e}; trying again in {}s", PERIOD.as_secs()),
        }
    }
}

/// A container no pod owns: its ID and the pod dir its bundle is under.
#[derive(Debug, PartialEq, Eq)]
pub struct Orphan {
    pub id: String,
    pub pod_dir: PathBuf,
}

/// The runtime's containers by the UID of the pod whose dir holds their
/// bundle (`<pods>/<uid>/containers/<id>`), and those of pods that no
/// worker owns. Containers with a bundle elsewhere (or none reported) are
/// not the pods' and are left alone.
pub fn assign(
    listed: Vec<State>,
    pods_dir: &Path,
    has_worker: impl Fn(&str) -> bool,
) -> (HashMap<String, Vec<State>>, Vec<Orphan>) {
    let mut by_pod: HashMap<String, Vec<State>> = HashMap::new();
    let mut orphans = Vec::new();
    for state in listed {
        let Some(uid) = owner(Path::new(&state.bundle), pods_dir, &state.id) else {
            continue;
        };
        if has_worker(&uid) {
            by_pod.entry(uid).or_default().push(state);
        } else {
            orphans.push(Orphan {
                id: state.id,
                pod_dir: pods_dir.join(uid),
            });
        }
    }
    (by_pod, orphans)
}

/// The pod UID of a bundle at `<pods>/<uid>/containers/<id>`.
fn owner(bundle: &Path, pods_dir: &Path, id: &str) -> Option<String> {
    let rest = bundle.strip_prefix(pods_dir).ok()?;
    let parts: Vec<Component> = rest.components().collect();
    match parts.as_slice() {
        [
            Component::Normal(uid),
            Component::Normal(containers),
            Component::Normal(own),
        ] if *containers == "containers" && *own == id => uid.to_str().map(str::to_owned),
        _ => None,
    }
}

/// Removes containers no pod owns: stopped, deleted, their bundles gone.
pub async fn remove_orphans(ctx: Rc<Context>, orphans: Vec<Orphan>) {
    for orphan in orphans {
        log::warn!(
            "relist: container {} belongs to no pod ({}); removing it",
            orphan.id,
            orphan.pod_dir.display()
        );
        if let Err(e) = Bundle::new(&orphan.pod_dir, &orphan.id)
            .remove(&ctx.runtime, &orphan.id)
            .await
        {
            log::warn!("relist: removing container {}: {e}", orphan.id);
        }
    }
}

/// Removes what no pod owns (see `sweep`), off the loop.
pub async fn remove_leftovers(ctx: Rc<Context>) {
    let (pods, cgroups) = (ctx.layout.pods(), ctx.cgroups.clone());
    for what in crate::helpers::unblock(move || sweep(&pods, &cgroups)).await {
        log::warn!("relist: removed {what}, which no pod owns");
    }
}

/// What a pod's cleanup left when it could not finish (an agent killed in
/// it, a pause that outlived a failed teardown): processes of the pod
/// (its monitor, its pause) and its cgroups, once its dir is gone. A
/// pod's cleanup removes them before its dir, so then nothing owns them.
/// Found before the dirs are looked at: a pod with the same UID started
/// since (a static pod's manifest written back) made its dir first.
/// Blocking (it reads /proc and the cgroup trees): run off the loop.
pub fn sweep(pods_dir: &Path, cgroups: &crate::cgroup::Hierarchy) -> Vec<String> {
    let processes = pod_processes(pods_dir);
    let pod_cgroups = cgroups.pod_cgroups();
    let mut removed = Vec::new();
    for (pid, uid) in processes {
        if !pods_dir.join(&uid).exists() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            removed.push(format!("process {pid} of pod {uid}"));
        }
    }
    for (qos, uid) in pod_cgroups {
        if !pods_dir.join(&uid).exists() {
            match cgroups.kill_and_remove_pod(qos, &uid) {
                Ok(()) => removed.push(format!("the cgroup of pod {uid}")),
                Err(e) => log::warn!("relist: the cgroup of pod {uid}: {e}"),
            }
        }
    }
    removed
}

/// The running processes that belong to a pod under `pods_dir`, with its
/// UID, from their command lines.
fn pod_processes(pods_dir: &Path) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pods = pods_dir.to_string_lossy();
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let raw = std::fs::read(entry.path().join("cmdline")).ok()?;
            let line: String = String::from_utf8_lossy(&raw).replace('\0', " ");
            Some((pid, pod_of_process(&line, &pods)?))
        })
        .collect()
}

/// The pod a process serves, from its command line (arguments joined by
/// spaces): a monitor's title names its pod dir, a pause its pid file in
/// it. A title cut short (it is written over the agent's own, shorter,
/// arguments) names no whole UID and so no pod.
fn pod_of_process(line: &str, pods_dir: &str) -> Option<String> {
    let rest = [
        format!("nanolet monitor --pod-dir {pods_dir}/"),
        format!(" pause {pods_dir}/"),
    ]
    .iter()
    .find_map(|prefix| {
        line.find(prefix.as_str())
            .map(|at| &line[at + prefix.len()..])
    })?;
    let uid = rest.split(['/', ' ']).next()?;
    let whole = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    whole.then(|| uid.to_owned())
}

/// What a recorded, unfinished instance needs, by the runtime's word on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Running (or paused), as recorded.
    Fine,
    /// The runtime has it stopped, or has it no more: it exited unseen.
    Gone,
    /// Created and never started: an agent killed between create and
    /// start left it. It is deleted and started again.
    NeverStarted,
}

pub fn verdict(state: Option<&State>) -> Verdict {
    match state.map(|s| s.status.as_str()) {
        None | Some("stopped") => Verdict::Gone,
        Some("created") => Verdict::NeverStarted,
        Some(_) => Verdict::Fine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_names_its_pod_only_by_a_whole_uid() {
        let uid = "5ecb0649-706a-00c1-4367-578de1a28353";
        let pods = "/var/lib/nanolet/pods";
        assert_eq!(
            pod_of_process(&format!("nanolet monitor --pod-dir {pods}/{uid}"), pods).as_deref(),
            Some(uid)
        );
        assert_eq!(
            pod_of_process(
                &format!("/usr/bin/nanolet pause {pods}/{uid}/ns/pid.pause "),
                pods
            )
            .as_deref(),
            Some(uid)
        );
        // Cut short, another agent's, or not a pod's at all.
        for line in [
            format!("nanolet monitor --pod-dir {pods}/{}", &uid[..20]),
            format!("nanolet monitor --pod-dir /elsewhere/pods/{uid}"),
            format!("nanolet run --state-dir {pods}/{uid}"),
            format!("sleep 3600 {pods}/{uid}"),
            format!("nanolet pause {pods}/../{uid}/ns/pid.pause"),
        ] {
            assert_eq!(pod_of_process(&line, pods), None, "{line}");
        }
    }

    fn state(id: &str, status: &str, bundle: &str) -> State {
        State {
            id: id.into(),
            pid: 0,
            status: status.into(),
            bundle: bundle.into(),
        }
    }

    #[test]
    fn containers_go_to_the_pod_whose_dir_holds_their_bundle() {
        let pods = Path::new("/var/lib/nanolet/pods");
        let listed = vec![
            state("a", "running", "/var/lib/nanolet/pods/u1/containers/a"),
            state("b", "created", "/var/lib/nanolet/pods/u1/containers/b"),
            state("c", "running", "/var/lib/nanolet/pods/gone/containers/c"),
            // Not a pod's: a probe's, or a bundle named for another ID.
            state("d", "running", "/var/lib/nanolet/userns-probe/d"),
            state("e", "running", "/var/lib/nanolet/pods/u1/containers/x"),
            state("f", "running", ""),
        ];
        let (by_pod, orphans) = assign(listed, pods, |uid| uid == "u1");
        let ids: Vec<&str> = by_pod["u1"].iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(by_pod.len(), 1);
        assert_eq!(
            orphans,
            [Orphan {
                id: "c".into(),
                pod_dir: pods.join("gone")
            }]
        );
    }

    #[test]
    fn an_instance_the_runtime_does_not_run_is_settled() {
        let s = |status: &str| state("a", status, "");
        assert_eq!(verdict(Some(&s("running"))), Verdict::Fine);
        assert_eq!(verdict(Some(&s("paused"))), Verdict::Fine);
        assert_eq!(verdict(Some(&s("stopped"))), Verdict::Gone);
        assert_eq!(verdict(None), Verdict::Gone);
        assert_eq!(verdict(Some(&s("created"))), Verdict::NeverStarted);
    }
}
