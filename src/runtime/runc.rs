//! Every invocation of the OCI runtime (runc or crun; they share a CLI), with
//! `--root` under nanolet's state dir so that nanolet's containers are its
//! own. `create` runs in the pod monitor, which must be the runtime's parent;
//! the command line is built here all the same.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Deserialize;

use crate::config::RuntimeKind;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{runtime} {op} {id}: {message}")]
    Failed {
        runtime: &'static str,
        op: &'static str,
        id: String,
        message: String,
    },
    #[error("{runtime} {op}: cannot run {path}: {source}")]
    Spawn {
        runtime: &'static str,
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{runtime} {op}: unreadable output: {source}")]
    Output {
        runtime: &'static str,
        op: &'static str,
        source: serde_json::Error,
    },
}

/// How much of an exec's output is kept (upstream's probe limit).
pub const EXEC_OUTPUT: usize = 10 * 1024;

/// How a command run by [`Runtime::exec`] ended, and what it printed.
#[derive(Debug)]
pub struct ExecOutput {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    /// Its output and errors, one after the other, as a probe reports them.
    pub fn text(&self, cap: usize) -> String {
        let mut text = [self.stdout.as_slice(), &self.stderr].concat();
        text.truncate(cap);
        String::from_utf8_lossy(&text).into_owned()
    }
}

/// Reads a pipe to its end, keeping at most `cap` bytes: a probe that
/// prints without end must not grow the agent.
async fn read_capped(pipe: Option<impl futures_lite::AsyncRead + Unpin>, cap: usize) -> Vec<u8> {
    use futures_lite::AsyncReadExt;
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else {
        return kept;
    };
    let mut buf = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}

/// Kills the process an exec started, by the pid the runtime wrote, unless
/// disarmed because it ended by itself. Removes the pid file either way.
pub(super) struct ExecGuard(Option<std::path::PathBuf>);

impl ExecGuard {
    pub(super) fn new(pid_file: std::path::PathBuf) -> Self {
        ExecGuard(Some(pid_file))
    }

    pub(super) fn disarm(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        let Some(path) = self.0.take() else {
            return;
        };
        if let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .filter(|p| *p > 1)
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_file(path);
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct State {
    pub id: String,
    #[serde(default)]
    pub pid: i32,
    /// created, running, stopped or paused.
    pub status: String,
    /// The bundle's directory, as given at create.
    #[serde(default)]
    pub bundle: String,
}

#[derive(Debug, Clone)]
pub struct Runtime {
    pub kind: RuntimeKind,
    pub path: PathBuf,
    pub root: PathBuf,
}

impl Runtime {
    pub fn new(kind: RuntimeKind, path: PathBuf, root: PathBuf) -> Self {
        Runtime { kind, path, root }
    }

    pub(super) fn base_args(&self) -> Vec<OsString> {
        vec!["--root".into(), self.root.clone().into_os_string()]
    }

    /// `create` as the monitor runs it (synchronously, as the parent of the
    /// container so that stdio and reaping stay with the monitor). A
    /// container with a terminal sends its master to `console_socket`.
    pub fn create_args(
        root: &Path,
        bundle: &Path,
        id: &str,
        pid_file: &Path,
        console_socket: Option<&Path>,
    ) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--root".into(),
            root.as_os_str().to_owned(),
            "create".into(),
            "--bundle".into(),
            bundle.as_os_str().to_owned(),
            "--pid-file".into(),
            pid_file.as_os_str().to_owned(),
        ];
        if let Some(socket) = console_socket {
            args.push("--console-socket".into());
            args.push(socket.as_os_str().to_owned());
        }
        args.push(id.into());
        args
    }

    /// `delete --force` as the monitor runs it, synchronously, for a
    /// container whose creation it gives up on.
    pub fn force_delete_args(root: &Path, id: &str) -> Vec<OsString> {
        vec![
            "--root".into(),
            root.as_os_str().to_owned(),
            "delete".into(),
            "--force".into(),
            id.into(),
        ]
    }

    async fn run(
        &self,
        op: &'static str,
        id: &str,
        args: &[&str],
    ) -> Result<Vec<u8>, RuntimeError> {
        let mut all = self.base_args();
        all.extend(args.iter().map(OsString::from));
        let output = async_process::Command::new(&self.path)
            .args(&all)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| RuntimeError::Spawn {
                runtime: self.kind.name(),
                op,
                path: self.path.clone(),
                source,
            })?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(RuntimeError::Failed {
                runtime: self.kind.name(),
                op,
                id: id.to_owned(),
                message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }

    pub async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.run("start", id, &["start", id]).await.map(drop)
    }

    /// The container's state; `None` when the runtime does not know it.
    pub async fn state(&self, id: &str) -> Result<Option<State>, RuntimeError> {
        // Listing avoids telling "does not exist" from other failures by
        // parsing error messages, which differ between runc and crun.
        Ok(self.list().await?.into_iter().find(|s| s.id == id))
    }

    pub async fn list(&self) -> Result<Vec<State>, RuntimeError> {
        if !self.root.exists() {
            return Ok(Vec::new());
        }
        let out = self.run("list", "", &["list", "--format", "json"]).await?;
        let text = String::from_utf8_lossy(&out);
        if text.trim().is_empty() || text.trim() == "null" {
            return Ok(Vec::new());
        }
        serde_json::from_str(&text).map_err(|source| RuntimeError::Output {
            runtime: self.kind.name(),
            op: "list",
            source,
        })
    }

    /// Sends `signal` (a name like "TERM" or a number) to the container's
    /// init; a container that is already gone is not an error.
    pub async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        match self.run("kill", id, &["kill", id, signal]).await {
            Ok(_) => Ok(()),
            Err(e) => match self.state(id).await? {
                Some(s) if s.status != "stopped" => Err(e),
                _ => Ok(()),
            },
        }
    }

    /// Deletes the container (forcibly, killing what still runs); one that
    /// does not exist is not an error.
    pub async fn delete(&self, id: &str) -> Result<(), RuntimeError> {
        match self.run("delete", id, &["delete", "--force", id]).await {
            Ok(_) => Ok(()),
            Err(e) => match self.state(id).await? {
                Some(_) => Err(e),
                None => Ok(()),
            },
        }
    }

    /// Runs `argv` in the running container `id` as its own process spec
    /// says (user, environment, capabilities), for exec probes, hooks and
    /// the kubelet API's `/run`. Returns its exit code and what it printed
    /// (at most `cap` bytes of each stream); after `timeout` the process is
    /// killed and `None` returned.
    pub async fn exec(
        &self,
        id: &str,
        argv: &[String],
        pid_file: &Path,
        (timeout, cap): (std::time::Duration, usize),
    ) -> Result<Option<ExecOutput>, RuntimeError> {
        use futures_lite::FutureExt;
        let mut all = self.base_args();
        all.extend(["exec".into(), "--pid-file".into(), pid_file.into()]);
        all.push(id.into());
        all.extend(argv.iter().map(OsString::from));
        let spawn_err = |source| RuntimeError::Spawn {
            runtime: self.kind.name(),
            op: "exec",
            path: self.path.clone(),
            source,
        };
        let mut child = async_process::Command::new(&self.path)
            .args(&all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_err)?;
        // Killed by its pid when this future ends early (timeout, or the
        // caller gave up): the runtime's own process dies with kill_on_drop,
        // what it started in the container would not.
        let mut guard = ExecGuard::new(pid_file.to_owned());
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let run = async {
            let out = read_capped(stdout, cap);
            let err = read_capped(stderr, cap);
            futures_lite::future::zip(futures_lite::future::zip(out, err), child.status()).await
        };
        let finished = async { Some(run.await) }
            .or(async {
                smol::Timer::after(timeout).await;
                None
            })
            .await;
        let Some(((stdout, stderr), status)) = finished else {
            return Ok(None);
        };
        guard.disarm();
        let status = status.map_err(spawn_err)?;
        let code = match status.code() {
            Some(code) => code,
            None => 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0),
        };
        Ok(Some(ExecOutput {
            code,
            stdout,
            stderr,
        }))
    }

    /// Whether the runtime makes recursively read-only mounts: it lists
    /// `rro` among the mount options of its `features` (runc 1.1 on, as
    /// containerd asks it), and the kernel has mount_setattr(2) (5.12).
    pub async fn supports_recursive_read_only(&self) -> bool {
        let Ok(out) = self.run("features", "", &["features"]).await else {
            return false;
        };
        let listed = serde_json::from_slice::<serde_json::Value>(&out)
            .ok()
            .and_then(|f| {
                f["mountOptions"]
                    .as_array()
                    .map(|o| o.iter().any(|o| o == "rro"))
            })
            .unwrap_or(false);
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u32>().ok());
        let kernel = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        listed && kernel >= (5, 12)
    }

    /// `runc --version`'s first version number, for nodeInfo.
    pub async fn version(&self) -> Result<String, RuntimeError> {
        let out = self.run("--version", "", &["--version"]).await?;
        let text = String::from_utf8_lossy(&out);
        Ok(text
            .lines()
            .next()
            .and_then(|l| {
                l.split_whitespace()
                    .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))
            })
            .unwrap_or("unknown")
            .to_owned())
    }
}

/// Why the OCI runtime cannot run containers, if it cannot: its binary is
/// gone or not executable (removed by an upgrade, a full disk, ...). A cheap
/// check, run with every status update rather than spawning the runtime.
pub fn runtime_problem(runtime: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let found = if runtime.components().count() > 1 {
        Some(runtime.to_owned())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(runtime))
                .find(|p| p.is_file())
        })
    };
    let Some(path) = found else {
        return Some(format!("{} not found in PATH", runtime.display()));
    };
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => None,
        Ok(_) => Some(format!("{} is not an executable file", path.display())),
        Err(e) => Some(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_runtime_is_a_problem() {
        assert_eq!(runtime_problem(std::path::Path::new("sh")), None);
        assert!(runtime_problem(std::path::Path::new("/nonexistent/runc")).is_some());
        let missing = runtime_problem(std::path::Path::new("no-such-runtime-xyz")).unwrap();
        assert!(missing.contains("not found in PATH"), "{missing}");
    }
}
