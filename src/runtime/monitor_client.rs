//! The agent's side of a pod monitor: start it if it is not running, send it
//! requests, and receive the exits it announces.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncBufReadExt, AsyncWriteExt, io::BufReader};
use smol::Async;
use smol::channel::{Receiver, Sender};
use smol::net::unix::UnixStream;

use super::protocol::{Exit, Input, Message, Request, SOCKET, receive_with_fd};
use crate::monitor::launcher::Answer;

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("starting the monitor for {pod_dir}: {message}")]
    Start { pod_dir: PathBuf, message: String },
    #[error("monitor of {pod_dir}: connection lost")]
    Disconnected { pod_dir: PathBuf },
    #[error("monitor of {pod_dir}: {message}")]
    Refused { pod_dir: PathBuf, message: String },
}

/// Settings every monitor of this agent gets.
#[derive(Debug, Clone)]
pub struct MonitorSettings {
    pub executable: PathBuf,
    pub runtime_path: PathBuf,
    pub runtime_root: PathBuf,
    pub max_log_size: u64,
    pub max_log_files: u32,
    /// What forks monitors, if the agent has one; else (or once it is
    /// gone) `executable monitor` is run.
    pub launcher: Option<Rc<LauncherClient>>,
}

/// How long the launcher may take to answer: a bind, a mkdir and two
/// forks.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent's end of the monitor launcher (`monitor::launcher`).
pub struct LauncherClient {
    pid: i32,
    /// `None` once the launcher failed: it is not asked again.
    connection: smol::lock::Mutex<Option<BufReader<Async<std::os::unix::net::UnixStream>>>>,
}

impl std::fmt::Debug for LauncherClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LauncherClient")
            .field("pid", &self.pid)
            .finish()
    }
}

/// Why the launcher did not start a monitor.
enum LaunchError {
    /// It tried: this is why the monitor could not start.
    Refused(String),
    /// It is gone or does not answer.
    Gone,
}

impl MonitorSettings {
    /// What the monitor of `pod_dir` runs with.
    fn args(&self, pod_dir: &Path) -> crate::monitor::Args {
        crate::monitor::Args {
            pod_dir: pod_dir.to_owned(),
            runtime_path: self.runtime_path.clone(),
            runtime_root: self.runtime_root.clone(),
            max_log_size: self.max_log_size,
            max_log_files: self.max_log_files,
        }
    }
}

impl LauncherClient {
    pub fn new(launcher: crate::monitor::launcher::Launcher) -> std::io::Result<Self> {
        Ok(LauncherClient {
            pid: launcher.pid,
            connection: smol::lock::Mutex::new(Some(BufReader::new(Async::new(launcher.stream)?))),
        })
    }

    async fn launch(&self, args: &crate::monitor::Args) -> Result<(), LaunchError> {
        let mut connection = self.connection.lock().await;
        let Some(stream) = connection.as_mut() else {
            return Err(LaunchError::Gone);
        };
        let asked = async {
            let mut line = serde_json::to_vec(args).ok()?;
            line.push(b'\n');
            stream.get_mut().write_all(&line).await.ok()?;
            let mut answer = String::new();
            stream
                .read_line(&mut answer)
                .await
                .ok()
                .filter(|n| *n > 0)?;
            serde_json::from_str::<Answer>(&answer).ok()
        };
        let timeout = async {
            smol::Timer::after(LAUNCH_TIMEOUT).await;
            None
        };
        match futures_lite::FutureExt::or(asked, timeout).await {
            Some(Answer { ok: true, .. }) => Ok(()),
            Some(Answer { error, .. }) => Err(LaunchError::Refused(error)),
            None => {
                log::warn!("the monitor launcher is gone: monitors are exec'd from now on");
                *connection = None;
                let pid = nix::unistd::Pid::from_raw(self.pid);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                // Reaped off the loop: it may take a moment to die.
                crate::helpers::unblock(move || nix::sys::wait::waitpid(pid, None))
                    .await
                    .ok();
                Err(LaunchError::Gone)
            }
        }
    }
}

/// What a monitor connection delivers besides replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MonitorEvent {
    Exit(Exit),
    /// The monitor went away (killed, or exited): the containers it ran
    /// have no one holding their stdio or reaping them any more.
    Lost,
}

/// How long a monitor has to answer Shutdown, which it does at once.
const SHUTDOWN_REPLY: Duration = Duration::from_secs(5);

pub struct MonitorConnection {
    pod_dir: PathBuf,
    writer: UnixStream,
    replies: Receiver<Message>,
    /// Requests written, which numbers them (their IDs), and replies read.
    /// A call abandoned while it waited (its pass interrupted) leaves its
    /// reply behind, and the next call skips it rather than taking it for
    /// its own: by the ID the reply carries, or, from a monitor started by
    /// an older agent, which answers without IDs (and in order), by
    /// counting.
    sent: u64,
    received: u64,
    /// A call was abandoned in the middle of writing its line: what the
    /// monitor reads next is garbled, and the connection is given up.
    torn: bool,
    _reader: smol::Task<()>,
}

/// Connects to the pod's monitor, starting one if none answers. Exits are
/// sent to `exits` for as long as the connection lives.
pub async fn connect_or_start(
    pod_dir: &Path,
    settings: &MonitorSettings,
    exits: Sender<MonitorEvent>,
) -> Result<MonitorConnection, MonitorError> {
    if let Ok(connection) = connect(pod_dir, exits.clone()).await {
        return Ok(connection);
    }
    let start_err = |message: String| MonitorError::Start {
        pod_dir: pod_dir.to_owned(),
        message,
    };
    let args = settings.args(pod_dir);
    if let Some(launcher) = &settings.launcher {
        match launcher.launch(&args).await {
            Ok(()) => {
                return connect(pod_dir, exits)
                    .await
                    .map_err(|e| start_err(format!("connecting: {e}")));
            }
            Err(LaunchError::Refused(message)) => return Err(start_err(message)),
            Err(LaunchError::Gone) => {}
        }
    }
    let output = async_process::Command::new(&settings.executable)
        .arg("monitor")
        .arg("--pod-dir")
        .arg(&args.pod_dir)
        .arg("--runtime-path")
        .arg(&args.runtime_path)
        .arg("--runtime-root")
        .arg(&args.runtime_root)
        .arg("--max-log-size")
        .arg(args.max_log_size.to_string())
        .arg("--max-log-files")
        .arg(args.max_log_files.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .map_err(|e| start_err(format!("{}: {e}", settings.executable.display())))?;
    if !output.status.success() {
        return Err(start_err(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ));
    }
    connect(pod_dir, exits)
        .await
        .map_err(|e| start_err(format!("connecting: {e}")))
}

/// Connects to a running monitor (after an agent restart: adoption).
pub async fn connect(
    pod_dir: &Path,
    exits: Sender<MonitorEvent>,
) -> std::io::Result<MonitorConnection> {
    let stream = UnixStream::connect(pod_dir.join(SOCKET)).await?;
    let (reply_tx, replies) = smol::channel::unbounded();
    let reader_stream = stream.clone();
    let reader = crate::rt::spawn(async move {
        let mut lines = BufReader::new(reader_stream).lines();
        while let Some(Ok(line)) = futures_lite::StreamExt::next(&mut lines).await {
            match serde_json::from_str::<Message>(&line) {
                Ok(Message::Exit(exit)) => {
                    let _ = exits.send(MonitorEvent::Exit(exit)).await;
                }
                Ok(reply) => {
                    let _ = reply_tx.send(reply).await;
                }
                Err(e) => log::warn!("monitor sent an unreadable line: {e}"),
            }
        }
        let _ = exits.send(MonitorEvent::Lost).await;
    });
    Ok(MonitorConnection {
        pod_dir: pod_dir.to_owned(),
        writer: stream,
        replies,
        sent: 0,
        received: 0,
        torn: false,
        _reader: reader,
    })
}

impl MonitorConnection {
    async fn call(&mut self, request: Request) -> Result<Option<i32>, MonitorError> {
        let disconnected = || MonitorError::Disconnected {
            pod_dir: self.pod_dir.clone(),
        };
        if self.torn {
            return Err(disconnected());
        }
        let mine = self.sent + 1;
        let mut line = serde_json::to_vec(&request.numbered(mine)).map_err(|_| disconnected())?;
        line.push(b'\n');
        self.torn = true;
        self.writer
            .write_all(&line)
            .await
            .map_err(|_| disconnected())?;
        self.torn = false;
        self.sent = mine;
        loop {
            let reply = self.replies.recv().await;
            self.received += 1;
            let answered = match &reply {
                Ok(Message::Reply {
                    request: Some(number),
                    ..
                }) => *number,
                _ => self.received,
            };
            if answered < mine {
                log::debug!(
                    "monitor of {}: skipping the reply to an abandoned request",
                    self.pod_dir.display()
                );
                continue;
            }
            if answered > mine {
                // An answer to what was never asked: the connection is not
                // to be trusted any further.
                self.torn = true;
                return Err(disconnected());
            }
            return match reply {
                Ok(Message::Reply { ok: true, pid, .. }) => Ok(pid),
                Ok(Message::Reply { error, .. }) => Err(MonitorError::Refused {
                    pod_dir: self.pod_dir.clone(),
                    message: error,
                }),
                _ => Err(disconnected()),
            };
        }
    }

    /// Has the monitor run `create` for a container; returns its init pid.
    pub async fn create(
        &mut self,
        id: &str,
        bundle: &Path,
        log_path: &Path,
        input: Input,
    ) -> Result<i32, MonitorError> {
        let pid = self
            .call(Request::Create {
                id: id.to_owned(),
                bundle: bundle.to_owned(),
                log_path: log_path.to_owned(),
                input,
                request: None,
            })
            .await?;
        pid.ok_or_else(|| MonitorError::Refused {
            pod_dir: self.pod_dir.clone(),
            message: "no pid in reply".into(),
        })
    }

    /// Tells the monitor to exit once its containers are gone. A monitor
    /// that does not answer (stopped, hung) is not waited for: removing a
    /// pod, also at the agent's start, must not hang on it.
    pub async fn shutdown(&mut self) -> Result<(), MonitorError> {
        let pod_dir = self.pod_dir.clone();
        let answered = async { Some(self.call(Request::Shutdown).await) };
        let silent = async {
            smol::Timer::after(SHUTDOWN_REPLY).await;
            None
        };
        match futures_lite::future::or(answered, silent).await {
            Some(reply) => reply.map(drop),
            None => Err(MonitorError::Disconnected { pod_dir }),
        }
    }
}

/// A container's input, handed over by its monitor for one attach.
pub struct AttachedInput {
    /// The write end of the container's stdin, or its terminal's master.
    pub fd: OwnedFd,
    pub terminal: bool,
    /// Closing it tells the monitor that this attach's input ended.
    pub connection: std::os::unix::net::UnixStream,
}

/// Asks the monitor of `pod_dir` for container `id`'s input. Blocks for a
/// moment: call it off the loop.
pub fn attach_input(pod_dir: &Path, id: &str) -> Result<AttachedInput, MonitorError> {
    let failed = |message: String| MonitorError::Refused {
        pod_dir: pod_dir.to_owned(),
        message,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(pod_dir.join(SOCKET))
        .map_err(|e| failed(format!("connecting: {e}")))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(5))))
        .map_err(|e| failed(e.to_string()))?;
    let request = Request::Attach {
        id: id.to_owned(),
        request: None,
    };
    let mut line = serde_json::to_vec(&request).map_err(|e| failed(e.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(|e| failed(e.to_string()))?;
    let mut reply = Vec::new();
    let mut fd = None;
    let mut buf = [0u8; 1024];
    while !reply.contains(&b'\n') {
        let (n, received) =
            receive_with_fd(&stream, &mut buf).map_err(|e| failed(e.to_string()))?;
        if n == 0 {
            return Err(MonitorError::Disconnected {
                pod_dir: pod_dir.to_owned(),
            });
        }
        reply.extend_from_slice(&buf[..n]);
        fd = fd.or(received);
    }
    match serde_json::from_slice::<Message>(&reply) {
        Ok(Message::Reply {
            ok: true, terminal, ..
        }) => Ok(AttachedInput {
            fd: fd.ok_or_else(|| failed("no descriptor in the answer".into()))?,
            terminal,
            connection: stream,
        }),
        Ok(Message::Reply { error, .. }) => Err(failed(error)),
        _ => Err(failed("unexpected answer".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// What `call` gives within `limit_ms`, or None.
    async fn within<T>(limit_ms: u64, call: impl std::future::Future<Output = T>) -> Option<T> {
        let give_up = async {
            smol::Timer::after(std::time::Duration::from_millis(limit_ms)).await;
            None
        };
        futures_lite::future::or(async { Some(call.await) }, give_up).await
    }

    /// A monitor that never answers (stopped) does not hold up a shutdown.
    #[test]
    fn a_silent_monitor_does_not_hold_up_its_shutdown() {
        let dir = crate::state::TestDir::new("monitor-silent");
        let listener = std::os::unix::net::UnixListener::bind(dir.0.join(SOCKET)).unwrap();
        crate::rt::block_on(async {
            let (exits, _exits_rx) = smol::channel::unbounded();
            let mut connection = connect(&dir.0, exits).await.unwrap();
            let started = std::time::Instant::now();
            assert!(connection.shutdown().await.is_err());
            assert!(started.elapsed() < SHUTDOWN_REPLY * 2);
        });
        drop(listener);
    }

    /// A monitor started by an older agent, which answers without request
    /// IDs: each request, in order, with its number as the pid, the first
    /// only once told to.
    #[test]
    fn a_reply_left_by_an_abandoned_call_is_not_taken_by_the_next() {
        let dir = crate::state::TestDir::new("monitor-replies");
        let listener = std::os::unix::net::UnixListener::bind(dir.0.join(SOCKET)).unwrap();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let monitor = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut lines = std::io::BufReader::new(stream).lines();
            for n in 1..=2 {
                lines.next().unwrap().unwrap();
                if n == 1 {
                    release_rx.recv().unwrap();
                }
                let reply = Message::Reply {
                    ok: true,
                    error: String::new(),
                    pid: Some(n),
                    terminal: false,
                    request: None,
                };
                writeln!(writer, "{}", serde_json::to_string(&reply).unwrap()).unwrap();
            }
        });
        crate::rt::block_on(async {
            let (exits, _exits_rx) = smol::channel::unbounded();
            let mut connection = connect(&dir.0, exits).await.unwrap();
            let (bundle, log) = (dir.0.join("b"), dir.0.join("l"));
            // The first call gives up before its reply comes.
            let abandoned =
                within(200, connection.create("x", &bundle, &log, Input::default())).await;
            assert!(abandoned.is_none());
            release_tx.send(()).unwrap();
            let next = connection.create("x", &bundle, &log, Input::default());
            assert_eq!(next.await.unwrap(), 2);
        });
        monitor.join().unwrap();
    }

    /// A monitor that never answers the first request (its reply lost) but
    /// answers the second with its ID: the second call takes that answer,
    /// which counting replies alone would have skipped as the first's.
    #[test]
    fn a_reply_is_matched_by_its_request_id() {
        let dir = crate::state::TestDir::new("monitor-ids");
        let listener = std::os::unix::net::UnixListener::bind(dir.0.join(SOCKET)).unwrap();
        let monitor = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut lines = std::io::BufReader::new(stream).lines();
            let mut numbers = Vec::new();
            for _ in 1..=2 {
                let line = lines.next().unwrap().unwrap();
                let number = serde_json::from_str::<Request>(&line).unwrap().number();
                numbers.push(number);
            }
            let reply = Message::Reply {
                ok: true,
                error: String::new(),
                pid: Some(42),
                terminal: false,
                request: numbers[1],
            };
            writeln!(writer, "{}", serde_json::to_string(&reply).unwrap()).unwrap();
            numbers
        });
        crate::rt::block_on(async {
            let (exits, _exits_rx) = smol::channel::unbounded();
            let mut connection = connect(&dir.0, exits).await.unwrap();
            let (bundle, log) = (dir.0.join("b"), dir.0.join("l"));
            let first = within(200, connection.create("x", &bundle, &log, Input::default())).await;
            assert!(first.is_none());
            let second = within(
                5000,
                connection.create("x", &bundle, &log, Input::default()),
            )
            .await;
            assert_eq!(second.map(|r| r.ok()), Some(Some(42)));
        });
        assert_eq!(monitor.join().unwrap(), [Some(1), Some(2)]);
    }
}
