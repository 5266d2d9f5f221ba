//! A process run in a container for a client (`kubectl exec`): its stdio
//! is the client's, through pipes, or through a terminal. For a terminal
//! the runtime runs in the foreground with `--tty` on a terminal of ours:
//! it makes the container's own, relays between the two, and resizes the
//! container's to ours on SIGWINCH. (`--console-socket` would hand us the
//! container's directly, but runc takes it only with `--detach`, and then
//! the exit code is lost.) The runtime copies our size over only once the
//! process runs, so a terminal's first size also goes in the process spec
//! (`--process` with `consoleSize`), which it applies before.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::rc::Rc;

use smol::Async;

use super::runc::{ExecGuard, Runtime, RuntimeError};

/// Which of the process's stdio the client takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecIo {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

type Reader = Box<dyn futures_lite::AsyncRead + Unpin>;
type Writer = Box<dyn futures_lite::AsyncWrite + Unpin>;

/// A running exec. Dropped before it ended, its process is killed.
pub struct AttachedExec {
    pub child: async_process::Child,
    pub stdin: Option<Writer>,
    pub stdout: Option<Reader>,
    pub stderr: Option<Reader>,
    /// Our terminal's master, with `tty`: output and input both go
    /// through it.
    pub terminal: Option<Rc<Async<File>>>,
    pid_file: PathBuf,
    guard: ExecGuard,
    /// The process spec written for the runtime, removed with the exec.
    _process_file: Option<RemovedOnDrop>,
}

/// A file of ours that goes when this does.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl AttachedExec {
    /// The process ended by itself: nothing to kill any more.
    pub fn ended(&mut self) {
        self.guard.disarm();
    }

    /// What resizes the terminal, with `tty`.
    pub fn resizer(&self) -> Option<Resizer> {
        Some(Resizer {
            terminal: self.terminal.clone()?,
            runtime: i32::try_from(self.child.id())
                .ok()
                .map(nix::unistd::Pid::from_raw)?,
            pid_file: self.pid_file.clone(),
        })
    }
}

pub struct Resizer {
    terminal: Rc<Async<File>>,
    runtime: nix::unistd::Pid,
    pid_file: PathBuf,
}

/// How long the runtime may take to start the process, for a resize
/// that came before it listened.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Resizer {
    /// Waits until the runtime takes SIGWINCH, then has it copy the size
    /// once more: a resize that came before would be lost. runc installs
    /// its signal handler before it starts the process, and writes the
    /// pid file after.
    pub async fn when_listening(&self) {
        let deadline = std::time::Instant::now() + START_WAIT;
        while !self.pid_file.exists() && std::time::Instant::now() < deadline {
            smol::Timer::after(std::time::Duration::from_millis(20)).await;
        }
        let _ = nix::sys::signal::kill(self.runtime, nix::sys::signal::Signal::SIGWINCH);
    }

    /// Sets the terminal's size, as a resize message asks: ours first,
    /// then the runtime copies it to the container's on SIGWINCH.
    pub fn resize(&self, width: u16, height: u16) -> std::io::Result<()> {
        set_size(self.terminal.as_raw_fd(), width, height)?;
        let _ = nix::sys::signal::kill(self.runtime, nix::sys::signal::Signal::SIGWINCH);
        Ok(())
    }
}

/// Sets a terminal's window size; the kernel signals its foreground group.
pub(crate) fn set_size(
    terminal: std::os::fd::RawFd,
    width: u16,
    height: u16,
) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // Safety: TIOCSWINSZ reads one winsize from the pointer, which lives
    // across the call.
    if unsafe { libc::ioctl(terminal, libc::TIOCSWINSZ, &size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A new terminal: its master, and its slave in raw mode (the runtime
/// would make it raw too, but input may come before it does).
fn open_terminal() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let last = std::io::Error::last_os_error;
    // Safety: plain syscalls on descriptors owned here; each result is
    // checked before use and wrapped in an OwnedFd at once.
    unsafe {
        let master = libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if master < 0 {
            return Err(last());
        }
        let master = OwnedFd::from_raw_fd(master);
        let unlock: libc::c_int = 0;
        if libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) != 0 {
            return Err(last());
        }
        let slave = libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if slave < 0 {
            return Err(last());
        }
        let slave = OwnedFd::from_raw_fd(slave);
        let mut termios: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(slave.as_raw_fd(), &mut termios) != 0 {
            return Err(last());
        }
        libc::cfmakeraw(&mut termios);
        if libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &termios) != 0 {
            return Err(last());
        }
        Ok((master, slave))
    }
}

/// The process spec of an exec on a terminal of `size` (width, height):
/// the container's own (user, environment, capabilities…, as the runtime
/// would take it without `--process`) with `argv`.
fn terminal_process(
    config: &Path,
    argv: &[String],
    (width, height): (u16, u16),
) -> std::io::Result<Vec<u8>> {
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(config)?)?;
    let mut process = config
        .get("process")
        .cloned()
        .filter(serde_json::Value::is_object)
        .ok_or_else(|| std::io::Error::other("no process in the container's config.json"))?;
    process["args"] = serde_json::json!(argv);
    process["terminal"] = serde_json::Value::Bool(true);
    process["consoleSize"] = serde_json::json!({"width": width, "height": height});
    Ok(serde_json::to_vec(&process)?)
}

impl Runtime {
    /// Starts `argv` in the running container `id` (bundle `bundle`), as
    /// its process spec says, with the stdio `io` asks for. Its pid file is
    /// `name`.pid in the private dir `scratch`. A terminal starts at `size`
    /// (width, height).
    pub async fn exec_attached(
        &self,
        (id, bundle): (&str, &Path),
        argv: &[String],
        io: ExecIo,
        size: Option<(u16, u16)>,
        (scratch, name): (&Path, &str),
    ) -> Result<AttachedExec, RuntimeError> {
        let spawn_err = |source| RuntimeError::Spawn {
            runtime: self.kind.name(),
            op: "exec",
            path: self.path.clone(),
            source,
        };
        let pid_file = scratch.join(format!("{name}.pid"));
        let mut args = self.base_args();
        args.extend(["exec".into(), "--pid-file".into(), pid_file.clone().into()]);
        let mut process_file = None;
        match size {
            Some(size) if io.tty => {
                let (config, argv, path) = (
                    bundle.join("config.json"),
                    argv.to_vec(),
                    scratch.join(format!("{name}.process.json")),
                );
                args.extend(["--process".into(), path.clone().into(), id.into()]);
                // Removed however this ends, a half-written file too.
                process_file = Some(RemovedOnDrop(path.clone()));
                crate::helpers::unblock(move || {
                    std::fs::write(&path, terminal_process(&config, &argv, size)?)
                })
                .await
                .map_err(spawn_err)?;
            }
            _ => {
                if io.tty {
                    args.push("--tty".into());
                }
                args.push(id.into());
                args.extend(argv.iter().map(Into::into));
            }
        }
        let terminal = if io.tty {
            let (master, slave) = open_terminal().map_err(spawn_err)?;
            if let Some((width, height)) = size {
                set_size(master.as_raw_fd(), width, height).map_err(spawn_err)?;
            }
            Some((master, slave))
        } else {
            None
        };
        let stdio = |wanted: bool| -> Result<Stdio, RuntimeError> {
            Ok(match &terminal {
                Some((_, slave)) => Stdio::from(slave.try_clone().map_err(spawn_err)?),
                None if wanted => Stdio::piped(),
                None => Stdio::null(),
            })
        };
        let mut child = async_process::Command::new(&self.path)
            .args(&args)
            .stdin(stdio(io.stdin)?)
            .stdout(stdio(io.stdout)?)
            .stderr(stdio(io.stderr)?)
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_err)?;
        let mut exec = AttachedExec {
            stdin: child.stdin.take().map(|w| Box::new(w) as Writer),
            stdout: child.stdout.take().map(|r| Box::new(r) as Reader),
            stderr: child.stderr.take().map(|r| Box::new(r) as Reader),
            child,
            terminal: None,
            guard: ExecGuard::new(pid_file.clone()),
            pid_file,
            _process_file: process_file,
        };
        // Our copies of the slave go, so that the master reads EIO (the
        // end) once the runtime is gone.
        if let Some((master, _slave)) = terminal {
            let terminal = Rc::new(Async::new(File::from(master)).map_err(spawn_err)?);
            exec.stdout = Some(Box::new(SharedFile(terminal.clone())));
            if io.stdin {
                exec.stdin = Some(Box::new(SharedFile(terminal.clone())));
            }
            exec.terminal = Some(terminal);
        }
        Ok(exec)
    }
}

/// One end of the terminal's master, for reading or writing; the other
/// holds a clone.
struct SharedFile(Rc<Async<File>>);

impl futures_lite::AsyncRead for SharedFile {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut file: &Async<File> = &self.0;
        match std::pin::Pin::new(&mut file).poll_read(cx, buf) {
            // EIO: every process holding the terminal is gone.
            std::task::Poll::Ready(Err(e)) if e.raw_os_error() == Some(libc::EIO) => {
                std::task::Poll::Ready(Ok(0))
            }
            other => other,
        }
    }
}

impl futures_lite::AsyncWrite for SharedFile {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut file: &Async<File> = &self.0;
        std::pin::Pin::new(&mut file).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
