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

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct State {
    pub id: String,
    #[serde(default)]
    pub pid: i32,
    /// created, running, stopped or paused.
    pub status: String,
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

    fn base_args(&self) -> Vec<OsString> {
        vec!["--root".into(), self.root.clone().into_os_string()]
    }

    /// `create` as the monitor runs it (synchronously, as the parent of the
    /// container so that stdio and reaping stay with the monitor).
    pub fn create_args(root: &Path, bundle: &Path, id: &str, pid_file: &Path) -> Vec<OsString> {
        vec![
            "--root".into(),
            root.as_os_str().to_owned(),
            "create".into(),
            "--bundle".into(),
            bundle.as_os_str().to_owned(),
            "--pid-file".into(),
            pid_file.as_os_str().to_owned(),
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
