//! The monitor launcher: a fork of the agent, made first thing in `main`
//! while the agent is still one thread, that forks each pod's monitor on
//! request. A monitor forked from it keeps sharing, copy-on-write, the
//! pages the dynamic loader and libc wrote at start (the binary's relocated
//! data above all, which nothing writes again) with the launcher and every
//! other monitor; an exec'd `nanolet monitor` writes its own copy of them,
//! about 124 KiB per pod. The launcher ends when the agent's end of its
//! socket closes. Should it be gone, the agent execs `nanolet monitor` as
//! before.
//!
//! One JSON line per request (the monitor's `Args`), one per answer.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork, pipe2};
use serde::{Deserialize, Serialize};

use super::Args;

/// The agent's end of a launcher.
pub struct Launcher {
    pub stream: UnixStream,
    pub pid: i32,
}

/// The launcher's answer to one request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Answer {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// Forks the launcher.
///
/// # Safety
/// The calling process must have one thread: the launcher is a copy of it
/// that allocates, which is sound only if no other thread held a lock
/// (malloc's, say) at the fork.
pub unsafe fn spawn() -> io::Result<Launcher> {
    let (agent_end, launcher_end) = UnixStream::pair()?;
    // Safety: single-threaded, as the caller promises.
    match unsafe { fork() }.map_err(io::Error::from)? {
        ForkResult::Parent { child } => Ok(Launcher {
            stream: agent_end,
            pid: child.as_raw(),
        }),
        ForkResult::Child => {
            drop(agent_end);
            name_process("nanolet-launch", "nanolet monitor launcher");
            serve(&launcher_end)
        }
    }
}

fn serve(stream: &UnixStream) -> ! {
    let mut requests = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if !matches!(requests.read_line(&mut line), Ok(1..)) {
            // The agent is gone; the monitors are not ours to end.
            exit(0);
        }
        let launched = serde_json::from_str::<Args>(&line)
            .map_err(|e| format!("bad request: {e}"))
            .and_then(launch);
        let answer = match launched {
            Ok(()) => Answer {
                ok: true,
                error: String::new(),
            },
            Err(error) => Answer { ok: false, error },
        };
        let Ok(mut text) = serde_json::to_vec(&answer) else {
            exit(1);
        };
        text.push(b'\n');
        let mut out = stream;
        if out.write_all(&text).is_err() {
            exit(0);
        }
    }
}

/// Ends a forked process without running anything its parent registered.
fn exit(code: i32) -> ! {
    // Safety: _exit ends the process at once; nothing runs after it.
    unsafe { libc::_exit(code) }
}

/// Forks a child that prepares the monitor and then detaches it, as
/// `nanolet monitor` does; the child's exit is the answer. What went wrong
/// comes back on a pipe that the monitor itself does not hold.
fn launch(args: Args) -> Result<(), String> {
    let (errors_r, errors_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // Safety: the launcher is single-threaded.
    match unsafe { fork() } {
        Err(e) => Err(format!("fork: {e}")),
        Ok(ForkResult::Child) => {
            drop(errors_r);
            match super::prepare(args) {
                Ok(prepared) => {
                    drop(errors_w);
                    // Returns only on failure, in the parent or the monitor.
                    if let Err(e) = super::detach(prepared) {
                        eprintln!("monitor: {e}");
                    }
                    exit(1)
                }
                Err(e) => {
                    let _ = nix::unistd::write(&errors_w, e.to_string().as_bytes());
                    exit(1)
                }
            }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(errors_w);
            let status = waitpid(child, None);
            let mut message = String::new();
            let _ = File::from(errors_r).read_to_string(&mut message);
            match status {
                Ok(WaitStatus::Exited(_, 0)) => Ok(()),
                Ok(_) if !message.is_empty() => Err(message),
                Ok(other) => Err(format!("the monitor's starter ended: {other:?}")),
                Err(e) => Err(format!("waitpid: {e}")),
            }
        }
    }
}

/// Names this process as `ps` shows it, by its comm (15 bytes at most)
/// and its command line, which a fork shares with the agent otherwise.
/// The command line is rewritten in place, in the argument area the
/// kernel set up (as setproctitle does): cut to fit, NUL-padded.
pub fn name_process(comm: &str, title: &str) {
    let mut name = [0u8; 16];
    let len = comm.len().min(15);
    name[..len].copy_from_slice(&comm.as_bytes()[..len]);
    // Safety: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes from the pointer, which lives across the call.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
    let Some((start, end)) = argument_area() else {
        return;
    };
    // Safety: [start, end) is this process's argument area on its initial
    // stack: mapped and writable. std copied what it needs of it at start,
    // and a forked launcher or monitor never reads its arguments again.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    area.fill(0);
    let keep = title.len().min(area.len().saturating_sub(1));
    area[..keep].copy_from_slice(&title.as_bytes()[..keep]);
}

/// arg_start and arg_end, fields 48 and 49 of /proc/self/stat.
fn argument_area() -> Option<(usize, usize)> {
    argument_area_in(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn argument_area_in(stat: &str) -> Option<(usize, usize)> {
    // Fields after the comm, which may hold spaces, start with field 3.
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut fields = rest.split_whitespace().skip(48 - 3);
    let start: usize = fields.next()?.parse().ok()?;
    let end: usize = fields.next()?.parse().ok()?;
    (start > 0 && end > start).then_some((start, end))
}

/// The title of a pod's monitor.
pub fn monitor_title(pod_dir: &Path) -> String {
    format!("nanolet monitor --pod-dir {}", pod_dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_area_is_read_after_the_comm() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[48 - 3] = "1000".into();
        fields[49 - 3] = "1064".into();
        let stat = format!("7 (a) b (c) {}", fields.join(" "));
        assert_eq!(argument_area_in(&stat), Some((1000, 1064)));
        fields[48 - 3] = "0".into();
        let stat = format!("7 (x) {}", fields.join(" "));
        assert_eq!(argument_area_in(&stat), None);
    }

    #[test]
    fn the_argument_area_holds_the_arguments() {
        match argument_area() {
            Some((start, end)) => {
                let args: usize = std::env::args_os().map(|a| a.len() + 1).sum();
                assert_eq!(end - start, args);
            }
            // The aarch64 build's tests run under qemu-user, whose
            // /proc/self/stat has zeros there.
            None if cfg!(target_arch = "aarch64") => {}
            None => panic!("no argument area"),
        }
    }
}
