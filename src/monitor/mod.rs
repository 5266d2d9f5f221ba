//! The per-pod monitor: a small process, separate from the agent, that owns
//! the pod's containers' stdio and exit statuses so that both survive an
//! agent restart. It runs `<runtime> create` itself (the containers inherit
//! its pipes), is their child subreaper (so it reaps them and learns their
//! exit codes), writes CRI logs, records exits to files and tells connected
//! agents about them. It also holds open the stdin (or the terminal) of
//! containers that have one, so that input can be attached later, by this
//! agent or the next. No async runtime, no TLS: one poll(2) loop.

pub mod launcher;
pub(crate) mod log;

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, pipe2, setsid};

use self::log::{LineSplitter, LogWriter};
use crate::runtime::protocol::{
    EXITS_DIR, Exit, Input, Message, Request, SOCKET, receive_with_fd, send_with_fd,
};
use crate::runtime::runc::Runtime;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Args {
    pub pod_dir: PathBuf,
    pub runtime_path: PathBuf,
    pub runtime_root: PathBuf,
    pub max_log_size: u64,
    pub max_log_files: u32,
}

struct Pipe {
    fd: OwnedFd,
    container: String,
    stream: &'static str,
    splitter: LineSplitter,
}

struct Client {
    stream: UnixStream,
    buffer: Vec<u8>,
    /// The container whose input this connection was given.
    attached: Option<String>,
}

/// The monitor's end of a container's input: the write end of its stdin
/// pipe, or its terminal.
struct HeldInput {
    fd: OwnedFd,
    stdin_once: bool,
    terminal: bool,
}

/// How long a runtime has to hand over a new container's terminal.
const CONSOLE_WAIT: Duration = Duration::from_secs(30);

struct Monitor {
    args: Args,
    /// Container init pid → container id.
    containers: HashMap<i32, String>,
    logs: HashMap<String, LogWriter>,
    pipes: Vec<Pipe>,
    clients: Vec<Client>,
    inputs: HashMap<String, HeldInput>,
    shutting_down: bool,
}

/// Entry point of `nanolet monitor`. Returns once the monitor is running in
/// the background: the process the agent started exits 0 as soon as the
/// socket accepts connections.
pub fn start(args: Args) -> io::Result<()> {
    detach(prepare(args)?)
}

/// A monitor whose socket accepts connections, not yet running.
pub struct Prepared {
    args: Args,
    listener: UnixListener,
}

/// What can fail while the starter still waits: the socket and the dirs.
pub fn prepare(args: Args) -> io::Result<Prepared> {
    let socket = args.pod_dir.join(SOCKET);
    let listener = bind_private(&socket)?;
    listener.set_nonblocking(true)?;
    fs::create_dir_all(args.pod_dir.join(EXITS_DIR))?;
    Ok(Prepared { args, listener })
}

/// A socket only its owner may connect to: the umask is not trusted with
/// it (a monitor's socket starts containers), and the mode is set before
/// anyone can connect. Called while the process has one thread.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    let _ = fs::remove_file(path);
    let previous = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(previous);
    let listener = bound?;
    fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(listener)
}

/// Whether the peer of a connection runs as this process's user: what a
/// socket whose mode was widened, or a descriptor passed on, must not let
/// anyone else do.
fn peer_is_own_user(stream: &UnixStream) -> bool {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .is_ok_and(|c| c.uid() == nix::unistd::geteuid().as_raw())
}

/// A Create request names a container of this pod: an ID as the agent
/// makes them, its bundle in this pod's dir, and a log file by an
/// absolute path without `..`.
fn check_create(pod_dir: &Path, id: &str, bundle: &Path, log_path: &Path) -> io::Result<()> {
    let plain_id = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let refuse = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
    if !plain_id {
        return refuse(format!("invalid container id {id:?}"));
    }
    if bundle != pod_dir.join("containers").join(id) {
        return refuse(format!("bundle {} is not this pod's", bundle.display()));
    }
    let relative_parts = log_path.components().any(|c| {
        matches!(
            c,
            std::path::Component::ParentDir | std::path::Component::CurDir
        )
    });
    if !log_path.is_absolute() || relative_parts || log_path.extension().is_none_or(|e| e != "log")
    {
        return refuse(format!("invalid log path {}", log_path.display()));
    }
    Ok(())
}

/// Runs the monitor in a child of its own session; this process exits 0,
/// which tells the starter the socket is there.
pub fn detach(prepared: Prepared) -> io::Result<()> {
    let Prepared { args, listener } = prepared;
    let socket = args.pod_dir.join(SOCKET);
    // Safety: the monitor is single-threaded at this point.
    match unsafe { fork() }.map_err(io::Error::from)? {
        ForkResult::Parent { .. } => std::process::exit(0),
        ForkResult::Child => {}
    }
    setsid().map_err(io::Error::from)?;
    close_inherited(listener.as_raw_fd())?;
    launcher::name_process("nanolet-monitor", &launcher::monitor_title(&args.pod_dir));
    // Orphaned container processes are reparented to us, not to init.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    redirect_stdio(&args.pod_dir.join("monitor.log"))?;
    fs::write(
        args.pod_dir.join("monitor.pid"),
        std::process::id().to_string(),
    )?;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block().map_err(io::Error::from)?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut monitor = Monitor {
        args,
        containers: HashMap::new(),
        logs: HashMap::new(),
        pipes: Vec::new(),
        clients: Vec::new(),
        inputs: HashMap::new(),
        shutting_down: false,
    };
    let result = monitor.run(&listener, &signals);
    let _ = fs::remove_file(&socket);
    let _ = fs::remove_file(monitor.args.pod_dir.join("monitor.pid"));
    if let Err(e) = &result {
        eprintln!("monitor: {e}");
    }
    std::process::exit(if result.is_ok() { 0 } else { 1 });
}

/// Closes every descriptor but stdio and `keep`. A monitor outlives the
/// agent, and must not hold what the agent inherited (a pipe of the shell
/// or service manager that started it would never see its end), nor, when
/// forked by the launcher, the launcher's socket (the agent would never
/// see the launcher go).
fn close_inherited(keep: RawFd) -> io::Result<()> {
    let open: Vec<RawFd> = fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open.into_iter().filter(|&fd| fd > 2 && fd != keep) {
        // Safety: nothing alive in this process owns these descriptors
        // (the monitor's own state is the listener and its arguments, and
        // its callers end the process when detach returns); the
        // directory's own, listed too, is closed already and gets EBADF.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

fn redirect_stdio(log: &Path) -> io::Result<()> {
    let null = fs::File::open("/dev/null")?;
    let err = fs::OpenOptions::new().create(true).append(true).open(log)?;
    nix::unistd::dup2_stdin(&null).map_err(io::Error::from)?;
    nix::unistd::dup2_stdout(&err).map_err(io::Error::from)?;
    nix::unistd::dup2_stderr(&err).map_err(io::Error::from)?;
    Ok(())
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(io::Error::from)?;
    fcntl(
        fd,
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )
    .map_err(io::Error::from)?;
    Ok(())
}

/// Reads what is available without blocking; `Ok(None)` at end of file.
fn read_available(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    match nix::unistd::read(fd, buf) {
        // A terminal's master reads EIO once no one holds its other side.
        Ok(0) | Err(nix::errno::Errno::EIO) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => Ok(Some(0)),
        Err(e) => Err(e.into()),
    }
}

impl Monitor {
    fn run(&mut self, listener: &UnixListener, signals: &SignalFd) -> io::Result<()> {
        // One CRI line's worth per read: each monitor touches (and keeps)
        // every page of this buffer, and there is one monitor per pod.
        let mut buf = vec![0u8; log::MAX_LINE];
        loop {
            if self.shutting_down && self.containers.is_empty() {
                return Ok(());
            }
            let revents: Vec<PollFlags> = {
                let mut fds = vec![
                    PollFd::new(signals.as_fd(), PollFlags::POLLIN),
                    PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                ];
                fds.extend(
                    self.clients
                        .iter()
                        .map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)),
                );
                fds.extend(
                    self.pipes
                        .iter()
                        .map(|p| PollFd::new(p.fd.as_fd(), PollFlags::POLLIN)),
                );
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                }
                fds.iter()
                    .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                    .collect()
            };
            let ready = |f: &PollFlags| !f.is_empty();
            let client_count = self.clients.len();
            // Pipes first, so that a container's last output is logged
            // before its exit is announced.
            for i in (0..self.pipes.len()).rev() {
                if ready(&revents[2 + client_count + i]) {
                    self.drain_pipe(i, &mut buf)?;
                }
            }
            for i in (0..client_count).rev() {
                if ready(&revents[2 + i]) {
                    self.serve_client(i, &mut buf);
                }
            }
            if ready(&revents[1]) {
                while let Ok((stream, _)) = listener.accept() {
                    if !peer_is_own_user(&stream) {
                        continue;
                    }
                    if stream.set_nonblocking(true).is_ok() {
                        self.clients.push(Client {
                            stream,
                            buffer: Vec::new(),
                            attached: None,
                        });
                    }
                }
            }
            if ready(&revents[0]) {
                while let Ok(Some(_)) = signals.read_signal() {}
                self.reap(&mut buf)?;
            }
        }
    }

    /// Logs what a pipe holds; closes it at end of file.
    fn drain_pipe(&mut self, index: usize, buf: &mut [u8]) -> io::Result<()> {
        loop {
            let pipe = &mut self.pipes[index];
            let read = read_available(&pipe.fd, buf)?;
            let mut writer = self.logs.get_mut(&pipe.container);
            let stream = pipe.stream;
            let mut emit = |partial: bool, text: &[u8]| match writer {
                Some(ref mut w) => w.record(stream, partial, text),
                None => Ok(()),
            };
            match read {
                Some(0) => return Ok(()),
                Some(n) => {
                    if let Err(e) = pipe.splitter.feed(&buf[..n], &mut emit) {
                        eprintln!("monitor: writing log of {}: {e}", pipe.container);
                    }
                }
                None => {
                    let _ = pipe.splitter.finish(&mut emit);
                    let container = pipe.container.clone();
                    self.pipes.swap_remove(index);
                    if !self.pipes.iter().any(|p| p.container == container) {
                        self.logs.remove(&container);
                    }
                    return Ok(());
                }
            }
        }
    }

    fn serve_client(&mut self, index: usize, buf: &mut [u8]) {
        let mut closed = false;
        loop {
            match self.clients[index].stream.read(buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => self.clients[index].buffer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        while let Some(pos) = self.clients[index].buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.clients[index].buffer.drain(..=pos).collect();
            let sent = match serde_json::from_slice::<Request>(&line) {
                Ok(Request::Attach { id, request }) => self.attach(index, id, request),
                Ok(request) => {
                    let reply = self.handle(request);
                    send(&mut self.clients[index].stream, &reply)
                }
                Err(e) => {
                    let reply = refusal(format!("bad request: {e}"), None);
                    send(&mut self.clients[index].stream, &reply)
                }
            };
            if sent.is_err() {
                closed = true;
                break;
            }
        }
        if closed || self.clients[index].buffer.len() > 1 << 20 {
            let client = self.clients.swap_remove(index);
            self.end_attach(client.attached);
        }
    }

    /// Answers `Attach` with the container's input attached to the reply.
    fn attach(&mut self, index: usize, id: String, request: Option<u64>) -> io::Result<()> {
        let client = &mut self.clients[index];
        let Some(input) = self.inputs.get(&id) else {
            return send(
                &mut client.stream,
                &refusal(format!("container {id} takes no input"), request),
            );
        };
        let reply = Message::Reply {
            ok: true,
            error: String::new(),
            pid: None,
            terminal: input.terminal,
            request,
        };
        let mut line = serde_json::to_vec(&reply).map_err(io::Error::other)?;
        line.push(b'\n');
        client.stream.set_nonblocking(false)?;
        client
            .stream
            .set_write_timeout(Some(Duration::from_secs(1)))?;
        let result = send_with_fd(&client.stream, &line, input.fd.as_fd());
        client.stream.set_nonblocking(true)?;
        if result.is_ok() {
            client.attached = Some(id);
        }
        result
    }

    /// An attach's input ended: as upstream, that closes the stdin of a
    /// `stdinOnce` container without a terminal (the container reads its
    /// end of file once the attach's own copy is closed too).
    fn end_attach(&mut self, attached: Option<String>) {
        let Some(id) = attached else { return };
        if self
            .inputs
            .get(&id)
            .is_some_and(|input| input.stdin_once && !input.terminal)
        {
            self.inputs.remove(&id);
        }
    }

    fn handle(&mut self, request: Request) -> Message {
        let number = request.number();
        let reply = |result: io::Result<Option<i32>>| match result {
            Ok(pid) => Message::Reply {
                ok: true,
                error: String::new(),
                pid,
                terminal: false,
                request: number,
            },
            Err(e) => refusal(e.to_string(), number),
        };
        match request {
            Request::Shutdown => {
                self.shutting_down = true;
                reply(Ok(None))
            }
            Request::Create {
                id,
                bundle,
                log_path,
                input,
                ..
            } => reply(self.create(&id, &bundle, &log_path, input).map(Some)),
            // Answered with a descriptor, in `attach`.
            Request::Attach { .. } => refusal("attach needs its own answer".into(), number),
        }
    }

    /// Runs `<runtime> create` with fresh pipes as the container's stdout
    /// and stderr (or with a terminal of its own), and starts logging them.
    fn create(
        &mut self,
        id: &str,
        bundle: &Path,
        log_path: &Path,
        input: Input,
    ) -> io::Result<i32> {
        check_create(&self.args.pod_dir, id, bundle, log_path)?;
        let writer = LogWriter::open(log_path, self.args.max_log_size, self.args.max_log_files)?;
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let (stdin, stdin_w) = if input.stdin && !input.tty {
            let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
            (Stdio::from(r), Some(w))
        } else {
            (Stdio::null(), None)
        };
        let console = if input.tty {
            let path = self.args.pod_dir.join("console.sock");
            let listener = bind_private(&path)?;
            listener.set_nonblocking(true)?;
            Some((path, listener))
        } else {
            None
        };
        let pid_file = bundle.join("init.pid");
        let _ = fs::remove_file(&pid_file);
        let (status, terminal) = {
            let mut command = Command::new(&self.args.runtime_path);
            command
                .args(Runtime::create_args(
                    &self.args.runtime_root,
                    bundle,
                    id,
                    &pid_file,
                    console.as_ref().map(|(path, _)| path.as_path()),
                ))
                .stdin(stdin)
                .stdout(Stdio::from(out_w))
                .stderr(Stdio::from(err_w));
            let mut child = command.spawn()?;
            // Our copies of the child's ends must close, or end of file
            // never comes: dropping the command closes them.
            drop(command);
            let received = match &console {
                Some((_, listener)) => receive_terminal(listener, &mut child),
                None => Ok(None),
            };
            let status = child.wait()?;
            if let Some((path, _)) = &console {
                let _ = fs::remove_file(path);
            }
            (status, received)
        };
        set_nonblocking(&out_r)?;
        set_nonblocking(&err_r)?;
        if !status.success() {
            // Before the container runs, its stderr is the runtime's.
            let mut message = Vec::new();
            let mut chunk = [0u8; 4096];
            for fd in [&err_r, &out_r] {
                while let Ok(Some(n)) = read_available(fd, &mut chunk) {
                    if n == 0 || message.len() > 8192 {
                        break;
                    }
                    message.extend_from_slice(&chunk[..n]);
                }
            }
            let text = String::from_utf8_lossy(&message).trim().to_owned();
            return Err(io::Error::other(if text.is_empty() {
                format!("create failed: {status}")
            } else {
                text
            }));
        }
        let pid: i32 = fs::read_to_string(&pid_file)?
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("{}: not a pid", pid_file.display())))?;
        let mut outputs = vec![(out_r, "stdout"), (err_r, "stderr")];
        let held = if input.tty {
            // A container that did not get its terminal cannot be attached
            // to, nor logged: it must not run.
            let master = terminal.and_then(|t| t.ok_or_else(|| io::Error::other("no terminal")));
            let master = match master {
                Ok(master) => master,
                Err(e) => {
                    let _ = Command::new(&self.args.runtime_path)
                        .args(Runtime::force_delete_args(&self.args.runtime_root, id))
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                    return Err(io::Error::other(format!(
                        "receiving the container's terminal: {e}"
                    )));
                }
            };
            set_nonblocking(&master)?;
            let held = master.try_clone()?;
            // A terminal has one output, which CRI logs as stdout.
            outputs.push((master, "stdout"));
            Some(held)
        } else {
            stdin_w
        };
        if let Some(fd) = held {
            self.inputs.insert(
                id.to_owned(),
                HeldInput {
                    fd,
                    stdin_once: input.stdin_once,
                    terminal: input.tty,
                },
            );
        }
        self.containers.insert(pid, id.to_owned());
        self.logs.insert(id.to_owned(), writer);
        for (fd, stream) in outputs {
            self.pipes.push(Pipe {
                fd,
                container: id.to_owned(),
                stream,
                splitter: LineSplitter::default(),
            });
        }
        Ok(pid)
    }

    /// Reaps every exited child; a container's exit is logged, recorded to
    /// a file and announced.
    fn reap(&mut self, buf: &mut [u8]) -> io::Result<()> {
        loop {
            let (pid, exit_code, signal) =
                match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) => (pid, code, None),
                    Ok(WaitStatus::Signaled(pid, sig, _)) => {
                        (pid, 128 + sig as i32, Some(sig as i32))
                    }
                    Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => return Ok(()),
                    Ok(_) => continue,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                };
            let Some(id) = self.containers.remove(&pid.as_raw()) else {
                continue;
            };
            self.inputs.remove(&id);
            for i in (0..self.pipes.len()).rev() {
                if self.pipes[i].container == id {
                    self.drain_pipe(i, buf)?;
                }
            }
            let exit = Exit {
                id: id.clone(),
                pid: pid.as_raw(),
                exit_code,
                signal,
                finished_at: Timestamp::now(),
            };
            let path = self.args.pod_dir.join(EXITS_DIR).join(format!("{id}.json"));
            if let Err(e) = crate::state::write_json(
                &path,
                &exit,
                0o600,
                crate::state::Durability::ProcessCrash,
            ) {
                eprintln!("monitor: {e}");
            }
            let message = Message::Exit(exit);
            // An attach's connection carries no messages after its answer.
            self.clients
                .retain_mut(|c| c.attached.is_some() || send(&mut c.stream, &message).is_ok());
        }
    }
}

fn refusal(error: String, request: Option<u64>) -> Message {
    Message::Reply {
        ok: false,
        error,
        pid: None,
        terminal: false,
        request,
    }
}

/// Waits for the runtime to send the container's terminal master to the
/// console socket, for as long as the runtime runs (and a little after, as
/// its connection may still be queued when it exits).
fn receive_terminal(
    listener: &UnixListener,
    child: &mut std::process::Child,
) -> io::Result<Option<OwnedFd>> {
    let deadline = Instant::now() + CONSOLE_WAIT;
    let mut exited = false;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                // runc sends the terminal's name along with it.
                let mut name = [0u8; 256];
                let (_, fd) = receive_with_fd(&stream, &mut name)?;
                return Ok(fd);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if exited || Instant::now() > deadline {
            return Ok(None);
        }
        exited = child.try_wait()?.is_some();
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(50u8));
    }
}

fn send(stream: &mut UnixStream, message: &Message) -> io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
    line.push(b'\n');
    // Messages are small; a client that cannot take one in a second is gone.
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(std::time::Duration::from_secs(1)))?;
    let result = stream.write_all(&line);
    stream.set_nonblocking(true)?;
    result
}

/// Reads the exits a monitor recorded, for an agent that was not listening.
pub fn recorded_exits(pod_dir: &Path) -> Vec<Exit> {
    let Ok(entries) = fs::read_dir(pod_dir.join(EXITS_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| crate::state::read_json::<Exit>(&e.path()).ok().flatten())
        .collect()
}

#[cfg(test)]
mod security_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_socket_is_its_owners_and_other_users_are_not_served() {
        let dir = crate::state::TestDir::new("monitor-socket");
        let path = dir.0.join("monitor.sock");
        // Not what the umask (022 here) would give.
        let listener = bind_private(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let own = UnixStream::connect(&path).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(peer_is_own_user(&accepted));
        drop(own);
        // Widened by someone: another user gets in, and is not served.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
        let mut nobody = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["/usr/bin/python3", "-c"])
            .arg("import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(2)")
            .arg(&path)
            .spawn()
            .unwrap();
        // Polled: a child that failed to connect must not hang the test.
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let accepted = loop {
            match listener.accept() {
                Ok((accepted, _)) => break accepted,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => panic!("nobody never connected: {e}"),
            }
        };
        assert!(!peer_is_own_user(&accepted));
        let _ = nobody.kill();
        let _ = nobody.wait();
    }

    #[test]
    fn create_requests_name_this_pods_containers_only() {
        let pod = Path::new("/var/lib/nanolet/pods/u1");
        let bundle = pod.join("containers/abc123");
        let log = Path::new("/var/log/pods/ns_p_u1/c/0.log");
        assert!(check_create(pod, "abc123", &bundle, log).is_ok());
        for (id, bundle, log) in [
            ("../x", pod.join("containers/../x"), log.to_owned()),
            ("abc123", PathBuf::from("/tmp/evil"), log.to_owned()),
            (
                "abc123",
                pod.join("../u2/containers/abc123"),
                log.to_owned(),
            ),
            ("other", bundle.clone(), log.to_owned()),
            ("abc123", bundle.clone(), PathBuf::from("relative/0.log")),
            (
                "abc123",
                bundle.clone(),
                PathBuf::from("/var/log/../../etc/shadow.log"),
            ),
            ("abc123", bundle.clone(), PathBuf::from("/etc/shadow")),
        ] {
            assert!(
                check_create(pod, id, &bundle, &log).is_err(),
                "{id} {bundle:?} {log:?}"
            );
        }
    }
}
