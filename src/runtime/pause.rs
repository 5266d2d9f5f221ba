//! The one process a pod with `shareProcessNamespace` needs beyond its
//! containers. Net, UTS and IPC namespaces outlive their processes as bind
//! mounts, but a PID namespace dies with its init: every container of such a
//! pod joins the namespace of `nanolet pause`, which is its PID 1, reaps
//! what gets reparented to it and otherwise sleeps, as upstream's pause
//! container does. Its namespace is bind-mounted at `ns/pid` (the path the
//! OCI specs name) and its host pid kept in `ns/pid.pause`.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{ForkResult, Pid, fork, setsid};

use crate::mount::{self, MountError};

#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("pause: {0}")]
    Start(String),
}

const NAMESPACE: &str = "pid";
const PID_FILE: &str = "pid.pause";

/// Entry point of `nanolet pause PID_FILE [user namespace]`: writes the
/// host pid of the namespace's init to `PID_FILE`, prints it, and leaves
/// the init running. The pause records itself, so that an agent killed
/// before it read the pid leaves no pause that nothing names. With a user
/// namespace (a pod with `hostUsers: false`), the PID namespace is that
/// namespace's, which the pod's containers, inside it, can only then join.
/// Must run before any thread is started.
pub fn run(pid_file: &Path, user_ns: Option<&Path>) -> io::Result<()> {
    if let Some(path) = user_ns {
        let file = fs::File::open(path)?;
        nix::sched::setns(file, CloneFlags::CLONE_NEWUSER).map_err(io::Error::from)?;
    }
    unshare(CloneFlags::CLONE_NEWPID).map_err(io::Error::from)?;
    // Safety: `nanolet pause` is single-threaded.
    let child = match unsafe { fork() }.map_err(io::Error::from)? {
        ForkResult::Parent { child } => child,
        ForkResult::Child => init(),
    };
    if let Err(e) = fs::write(pid_file, child.to_string()) {
        let _ = kill(child, Signal::SIGKILL);
        return Err(io::Error::new(
            e.kind(),
            format!("{}: {e}", pid_file.display()),
        ));
    }
    println!("{child}");
    Ok(())
}

/// PID 1 of the pod. SIGTERM and SIGINT end it (they are blocked and
/// waited for, and a blocked signal reaches a namespace's init from inside
/// too): as with upstream's pause, a container that kills PID 1 ends the
/// pod's processes, which then restart in a new namespace.
fn init() -> ! {
    let _ = setsid();
    let _ = std::env::set_current_dir("/");
    if let Ok(null) = fs::File::options().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT] {
        signals.add(signal);
    }
    let _ = signals.thread_block();
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {
                while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    if status == nix::sys::wait::WaitStatus::StillAlive {
                        break;
                    }
                }
            }
            Ok(Signal::SIGTERM | Signal::SIGINT) => std::process::exit(0),
            _ => {}
        }
    }
}

/// Makes sure the pod's PID namespace is held by a live `nanolet pause`,
/// starting one when there is none (a new pod, a reboot, or a pause that
/// was killed, which took the pod's processes with it); true if it did.
pub async fn ensure(
    ns_dir: &Path,
    executable: &Path,
    user_ns: Option<&Path>,
) -> Result<bool, PauseError> {
    if alive(ns_dir) {
        return Ok(false);
    }
    // One recorded but not holding the mount (a crash between starting it
    // and binding its namespace) must not live on unseen.
    if let Some(pid) = recorded_pause(ns_dir) {
        let _ = kill(pid, Signal::SIGKILL);
    }
    let target = ns_dir.join(NAMESPACE);
    mount::unmount(&target)?;
    let fail = PauseError::Start;
    // Recorded by the pause itself, so that whatever fails next (the
    // agent killed, too), it can be found.
    let file = ns_dir.join(PID_FILE);
    let mut args = vec!["pause".as_ref(), file.as_os_str()];
    args.extend(user_ns.map(Path::as_os_str));
    let (mut child, line) = super::start_helper(executable, &args, Stdio::null(), Stdio::null())
        .await
        .map_err(fail)?;
    let status = child
        .status()
        .await
        .map_err(|e| PauseError::Start(e.to_string()))?;
    let pid: i32 = line
        .trim()
        .parse()
        .map_err(|_| PauseError::Start(format!("exited with {status} and no pid")))?;
    let io_at = |path: &Path| {
        let path = path.to_owned();
        move |source| PauseError::Io { path, source }
    };
    let held = fs::File::create(&target)
        .map_err(io_at(&target))
        .and_then(|_| {
            mount::bind(Path::new(&format!("/proc/{pid}/ns/pid")), &target)
                .map_err(PauseError::from)
        });
    if held.is_err() {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        let _ = mount::unmount(&target);
        let _ = fs::remove_file(&file);
    }
    held.map(|()| true)
}

/// The pid of the pod's pause, while it runs.
pub fn pid(ns_dir: &Path) -> Option<i32> {
    recorded_pause(ns_dir).map(Pid::as_raw)
}

fn recorded_pid(ns_dir: &Path) -> Option<i32> {
    fs::read_to_string(ns_dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The pause the pid file names, if that process is still one (its pid
/// could have been reused).
fn recorded_pause(ns_dir: &Path) -> Option<Pid> {
    let pid = recorded_pid(ns_dir)?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    args.next();
    (args.next() == Some(b"pause".as_slice())).then(|| Pid::from_raw(pid))
}

/// Whether the recorded pause still holds the mounted namespace: the pid
/// alone could have been reused (after a reboot, say).
pub fn alive(ns_dir: &Path) -> bool {
    holder(ns_dir).is_some()
}

fn holder(ns_dir: &Path) -> Option<Pid> {
    let pid = recorded_pid(ns_dir)?;
    let mounted = fs::metadata(ns_dir.join(NAMESPACE)).ok()?;
    let held = fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    (mounted.dev() == held.dev() && mounted.ino() == held.ino()).then(|| Pid::from_raw(pid))
}

/// Ends the pod's PID namespace: the kernel kills whatever is left in it
/// with its init. Safe to repeat.
pub fn stop(ns_dir: &Path) -> Result<(), PauseError> {
    if let Some(pid) = holder(ns_dir).or_else(|| recorded_pause(ns_dir)) {
        let _ = kill(pid, Signal::SIGKILL);
    }
    let target = ns_dir.join(NAMESPACE);
    mount::unmount(&target)?;
    let _ = fs::remove_file(&target);
    let _ = fs::remove_file(ns_dir.join(PID_FILE));
    Ok(())
}
