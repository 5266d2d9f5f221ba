//! `/exec/{ns}/{pod}[/{uid}]/{container}` and `/attach/...`, over
//! WebSocket (`v5`/`v4.channel.k8s.io`) or SPDY/3.1 (`v4.channel.k8s.io`),
//! as the API server forwards `kubectl exec` and `kubectl attach`: a
//! command run in a container with the client's stdio, or the container's
//! own output. The end goes back on the error channel as a metav1.Status,
//! which is where kubectl reads an exit code from.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt, FutureExt};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use smol::channel::{Receiver, Sender};

use super::Deps;
use super::upgrade::{self, Negotiated, Refused, Transport};
use super::{Body, spdy, text, websocket};
use crate::runtime::attached_exec::ExecIo;

/// Subprotocols per transport, preferred first. v5 adds the close signal,
/// which only WebSocket needs (SPDY closes a stream by itself).
const WEBSOCKET_PROTOCOLS: &[&str] = &["v5.channel.k8s.io", "v4.channel.k8s.io"];
const SPDY_PROTOCOLS: &[&str] = &["v4.channel.k8s.io"];

/// How long the client has to open its SPDY streams.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// How long output may still come after the process ended (a child of
/// it may hold the pipe open).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

const EXEC_FAILED: &str = "error executing command in container";
const ATTACH_FAILED: &str = "error attaching to container";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5: `[255, channel]` closes that channel.
const CLOSE: u8 = 255;

/// The running container a request names.
struct Target {
    uid: String,
    container_id: String,
}

fn flag(query: &[(String, String)], name: &str) -> bool {
    query
        .iter()
        .any(|(k, v)| k == name && (v == "1" || v == "true"))
}

/// The API server's names for the streams, with kubectl's as a fallback
/// for clients that call the kubelet directly.
fn exec_io(query: &[(String, String)]) -> ExecIo {
    let tty = flag(query, "tty");
    ExecIo {
        stdin: flag(query, "input") || flag(query, "stdin"),
        stdout: flag(query, "output") || flag(query, "stdout"),
        // A terminal has no stderr of its own.
        stderr: (flag(query, "error") || flag(query, "stderr")) && !tty,
        tty,
    }
}

/// Finds the running container `container` of pod `namespace/pod`.
async fn find_target(
    ctx: &Deps,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
    container: &str,
) -> Result<Target, Refused> {
    let record = super::pod_record(ctx, namespace, pod, uid).await?;
    // Upstream looks among running containers only, so one that does not
    // run is not found either, and answers 500.
    let container_id = crate::pod::status::every_container_status(&record.status)
        .filter(|s| s.name == container)
        .filter(|s| s.state.as_ref().is_some_and(|s| s.running.is_some()))
        .find_map(|s| s.container_id.as_deref()?.split_once("://"))
        .map(|(_, id)| id.to_owned())
        .ok_or_else(|| {
            Refused::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("container not found ({container:?})"),
            )
        })?;
    Ok(Target {
        uid: record.uid,
        container_id,
    })
}

/// Answers an exec request: checks it, switches protocols, and runs the
/// command once the client's streams are there.
pub async fn exec(
    ctx: &Rc<Deps>,
    mut req: Request<Incoming>,
    (namespace, pod, uid, container): (&str, &str, Option<&str>, &str),
) -> Response<Body> {
    let query = super::query_pairs(&req);
    let command: Vec<String> = query
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    let io = exec_io(&query);
    if command.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least one command",
        );
    }
    if !io.stdin && !io.stdout && !io.stderr {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr",
        );
    }
    let target = match find_target(ctx, namespace, pod, uid, container).await {
        Ok(t) => t,
        Err(refused) => return refused.response(),
    };
    let negotiated = match upgrade::negotiate(req.headers(), WEBSOCKET_PROTOCOLS, SPDY_PROTOCOLS) {
        Ok(n) => n,
        Err(refused) => return refused.response(),
    };
    let response = upgrade::switching(&negotiated);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let ctx = ctx.clone();
    crate::rt::spawn(async move {
        let Some(upgraded) = upgrade::take(on_upgrade).await else {
            return;
        };
        let Some(client) = Client::connect(upgraded, &negotiated, io).await else {
            return;
        };
        run(&ctx, target, command, io, client).await;
    })
    .detach();
    response
}

/// Answers an attach request: the container's output from now on, until
/// it ends, and the client's input into its stdin or terminal, which its
/// monitor holds. Input for a container that takes none is dropped.
pub async fn attach(
    ctx: &Rc<Deps>,
    mut req: Request<Incoming>,
    (namespace, pod, uid, container): (&str, &str, Option<&str>, &str),
) -> Response<Body> {
    let io = exec_io(&super::query_pairs(&req));
    if !io.stdin && !io.stdout && !io.stderr {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr",
        );
    }
    let target = match find_target(ctx, namespace, pod, uid, container).await {
        Ok(t) => t,
        Err(refused) => return refused.response(),
    };
    let negotiated = match upgrade::negotiate(req.headers(), WEBSOCKET_PROTOCOLS, SPDY_PROTOCOLS) {
        Ok(n) => n,
        Err(refused) => return refused.response(),
    };
    let response = upgrade::switching(&negotiated);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let state_dir = ctx.layout.root.clone();
    let pod_dir = ctx.layout.pod(&target.uid);
    let (target, container) = (
        (format!("{namespace}/{pod}"), target.container_id),
        container.to_owned(),
    );
    crate::rt::spawn(async move {
        let Some(upgraded) = upgrade::take(on_upgrade).await else {
            return;
        };
        let Some(client) = Client::connect(upgraded, &negotiated, io).await else {
            return;
        };
        run_attach((state_dir, pod_dir), target, container, io, client).await;
    })
    .detach();
    response
}

/// What `/run` keeps of each of the command's streams: the answer is held
/// whole, as upstream's ExecSync holds it (there up to 16 MiB).
const RUN_OUTPUT: usize = 1 << 20;

/// Upstream's `/run` (POST): the command in `cmd`, split on spaces as
/// upstream splits it, run in the container to its end. The answer is its
/// output then its errors, with upstream's (JSON) content type whatever
/// they hold; a command that fails or exits non-zero answers 500, in the
/// words of upstream's ExecSync.
pub async fn run_command(
    ctx: &Rc<Deps>,
    req: Request<Incoming>,
    (namespace, pod, uid, container): (&str, &str, Option<&str>, &str),
) -> Response<Body> {
    let command: Vec<String> = super::query_pairs(&req)
        .into_iter()
        .find(|(k, _)| k == "cmd")
        .map(|(_, v)| v.split(' ').map(str::to_owned).collect())
        .unwrap_or_default();
    if command.iter().all(|word| word.is_empty()) {
        return text(StatusCode::BAD_REQUEST, "you must specify a command (cmd)");
    }
    let target = match find_target(ctx, namespace, pod, uid, container).await {
        Ok(t) => t,
        Err(refused) => return refused.response(),
    };
    let pid_file = ctx
        .layout
        .pod(&target.uid)
        .join(format!("run-{}.pid", &crate::state::random_hex()[..12]));
    // No time limit, as upstream: a client that gives up drops this
    // future, which kills the command.
    let limits = (Duration::MAX, RUN_OUTPUT);
    match ctx
        .runtime
        .exec(&target.container_id, &command, &pid_file, limits)
        .await
    {
        Ok(Some(ended)) if ended.code == 0 => super::full(
            StatusCode::OK,
            "application/json",
            [ended.stdout, ended.stderr].concat(),
        ),
        Ok(Some(ended)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "command '{}' exited with {}: {}",
                command.join(" "),
                ended.code,
                String::from_utf8_lossy(&ended.stderr)
            ),
        ),
        Ok(None) => text(StatusCode::INTERNAL_SERVER_ERROR, "command timed out"),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Joins the client's stdin and resize channels to the container's input,
/// which its monitor hands over. Without one, what the client sends is
/// read and dropped. The returned guard is this attach's hold on the input:
/// dropped, it ends it (and closes a `stdinOnce` container's stdin).
async fn attach_input(
    pod_dir: std::path::PathBuf,
    container_id: String,
    io: ExecIo,
    client: &mut Client,
) -> Option<std::os::unix::net::UnixStream> {
    let stdin = client.stdin.take();
    let resize = client.resize.take();
    let input = if io.stdin || io.tty {
        crate::helpers::unblock(move || {
            crate::runtime::monitor_client::attach_input(&pod_dir, &container_id)
        })
        .await
        .map_err(|e| log::debug!("attach: no input: {e}"))
        .ok()
    } else {
        None
    };
    let Some(input) = input else {
        for channel in [stdin, resize].into_iter().flatten() {
            crate::rt::spawn(async move { while channel.recv().await.is_ok() {} }).detach();
        }
        return None;
    };
    // Sizes for a container without a terminal are read and dropped.
    let terminal = input.terminal.then(|| input.fd.try_clone().ok()).flatten();
    if let Some(resize) = resize {
        // kubectl sends the size and the first keys at once, on streams
        // that may come in either order: keys the shell ran before the
        // size would see the terminal at 0x0.
        if let Some(terminal) = &terminal
            && let Some((width, height)) = first_size(&resize).await
            && let Err(e) = crate::runtime::attached_exec::set_size(
                std::os::fd::AsRawFd::as_raw_fd(terminal),
                width,
                height,
            )
        {
            log::debug!("attach: sizing the terminal: {e}");
        }
        crate::rt::spawn(async move {
            while let Ok(data) = resize.recv().await {
                let Some(terminal) = &terminal else { continue };
                let fd = std::os::fd::AsRawFd::as_raw_fd(terminal);
                for (width, height) in sizes(&data) {
                    if let Err(e) = crate::runtime::attached_exec::set_size(fd, width, height) {
                        log::debug!("attach: resizing the terminal: {e}");
                    }
                }
            }
        })
        .detach();
    }
    let connection = input.connection;
    let Some(stdin) = stdin else {
        return Some(connection);
    };
    let to = smol::Async::new(std::fs::File::from(input.fd));
    crate::rt::spawn(async move {
        // Held until the client's input ends, which is the end of this
        // attach's input.
        let _connection = connection;
        let Ok(mut to) = to else { return };
        while let Ok(data) = stdin.recv().await {
            if to.write_all(&data).await.is_err() || to.flush().await.is_err() {
                break;
            }
        }
    })
    .detach();
    None
}

async fn run_attach(
    (state_dir, pod_dir): (std::path::PathBuf, std::path::PathBuf),
    (target, container_id): (String, String),
    container: String,
    io: ExecIo,
    mut client: Client,
) {
    // What the container writes from now on: logged lines carry their
    // time, so none is lost to the readers starting after the input.
    let since = jiff::Timestamp::now();
    let _input = attach_input(pod_dir, container_id, io, &mut client).await;
    let mut readers = Vec::new();
    for (wanted, stream, channel) in [(io.stdout, "stdout", STDOUT), (io.stderr, "stderr", STDERR)]
    {
        if !wanted {
            continue;
        }
        let args = crate::cli::logs::LogsArgs {
            target: target.clone(),
            container: Some(container.clone()),
            follow: true,
            since: Some(since),
            stream: Some(stream),
            instance_only: true,
            ..Default::default()
        };
        match super::read_log(state_dir.clone(), args, None).await {
            Ok(lines) => {
                let output = client.output.clone();
                readers.push(crate::rt::spawn(async move {
                    while let Ok(bytes) = lines.recv().await {
                        if !output.write(channel, &bytes).await {
                            return;
                        }
                    }
                }));
            }
            Err(e) => {
                client
                    .output
                    .finish(&failure(ATTACH_FAILED, e.to_string()))
                    .await;
                return;
            }
        }
    }
    // The readers end with the container; dropped, they end their
    // threads too.
    let ended = async {
        for reader in readers {
            reader.await;
        }
        true
    }
    .or(async {
        while client.gone.recv().await.is_ok() {}
        false
    })
    .await;
    if ended {
        client.output.finish(&success()).await;
    }
}

/// The client's side of a session, whatever the transport.
struct Client {
    stdin: Option<Receiver<Bytes>>,
    resize: Option<Receiver<Bytes>>,
    output: Rc<Output>,
    /// Nothing comes on it; it ends when the client is gone.
    gone: Receiver<Bytes>,
}

enum Output {
    WebSocket {
        frames: Sender<Vec<u8>>,
    },
    Spdy {
        writer: spdy::Writer,
        stdout: Option<u32>,
        stderr: Option<u32>,
        error: u32,
    },
}

impl Output {
    /// False once the client is gone.
    async fn write(&self, channel: u8, data: &[u8]) -> bool {
        match self {
            Output::WebSocket { frames } => {
                let mut message = Vec::with_capacity(data.len() + 1);
                message.push(channel);
                message.extend_from_slice(data);
                frames.send(websocket::binary(&message)).await.is_ok()
            }
            Output::Spdy {
                writer,
                stdout,
                stderr,
                ..
            } => {
                let id = if channel == STDOUT { stdout } else { stderr };
                match id {
                    Some(id) => writer.data(*id, data, false).await.is_ok(),
                    None => true,
                }
            }
        }
    }

    /// The status on the error channel, then the end of the session.
    async fn finish(&self, status: &serde_json::Value) {
        let status = status.to_string();
        match self {
            Output::WebSocket { frames } => {
                let mut message = vec![ERROR];
                message.extend_from_slice(status.as_bytes());
                let _ = frames.send(websocket::binary(&message)).await;
                let _ = frames.send(websocket::close()).await;
                frames.close();
            }
            Output::Spdy {
                writer,
                stdout,
                stderr,
                error,
            } => {
                let _ = writer.data(*error, status.as_bytes(), true).await;
                for id in [stdout, stderr].into_iter().flatten() {
                    let _ = writer.data(*id, &[], true).await;
                }
                writer.go_away().await;
            }
        }
    }
}

impl Client {
    async fn connect(
        upgraded: upgrade::Upgraded,
        negotiated: &Negotiated,
        io: ExecIo,
    ) -> Option<Client> {
        match negotiated.transport {
            Transport::WebSocket => Some(Self::websocket(upgraded, negotiated.protocol, io)),
            Transport::Spdy => Self::spdy(upgraded, io).await,
        }
    }

    fn websocket(upgraded: upgrade::Upgraded, protocol: &str, io: ExecIo) -> Client {
        let (read_half, write_half) = futures_lite::io::split(upgraded.io);
        let frames = websocket::writer(write_half);
        // An empty message on the lowest channel we write, as upstream
        // opens the session.
        let first = if io.stdout {
            STDOUT
        } else if io.stderr && !io.tty {
            STDERR
        } else {
            ERROR
        };
        let _ = frames.try_send(websocket::binary(&[first]));
        let (stdin_tx, stdin_rx) = smol::channel::bounded::<Bytes>(8);
        let (resize_tx, resize_rx) = smol::channel::bounded::<Bytes>(4);
        let (gone_tx, gone) = smol::channel::bounded::<Bytes>(1);
        let closes_streams = protocol == "v5.channel.k8s.io";
        let pongs = frames.clone();
        let mut reader = websocket::Reader::new(read_half, upgraded.pending);
        crate::rt::spawn(async move {
            let _gone = gone_tx;
            let mut stdin = Some(stdin_tx);
            loop {
                let message = match reader.next_message(&pongs).await {
                    Ok(Some(message)) => message,
                    Ok(None) => break,
                    Err(e) => {
                        log::debug!("exec: {e}");
                        break;
                    }
                };
                let Some((&channel, data)) = message.split_first() else {
                    continue;
                };
                match channel {
                    STDIN => {
                        if let Some(tx) = &stdin
                            && tx.send(Bytes::copy_from_slice(data)).await.is_err()
                        {
                            stdin = None;
                        }
                    }
                    RESIZE => {
                        let _ = resize_tx.send(Bytes::copy_from_slice(data)).await;
                    }
                    CLOSE if closes_streams && data.first() == Some(&STDIN) => {
                        stdin = None;
                    }
                    _ => {}
                }
            }
        })
        .detach();
        Client {
            stdin: io.stdin.then_some(stdin_rx),
            resize: io.tty.then_some(resize_rx),
            output: Rc::new(Output::WebSocket { frames }),
            gone,
        }
    }

    /// Waits for the streams the client must open: error, and one per
    /// stdio it asked for (stderr only without a terminal, resize only
    /// with one).
    async fn spdy(upgraded: upgrade::Upgraded, io: ExecIo) -> Option<Client> {
        let (streams, writer) = spdy::serve(upgraded.io, upgraded.pending);
        let expected = 1
            + usize::from(io.stdin)
            + usize::from(io.stdout)
            + usize::from(io.stderr && !io.tty)
            + usize::from(io.tty);
        let mut by_type: Vec<spdy::Stream> = Vec::new();
        let collect = async {
            while by_type.len() < expected {
                let stream = streams.recv().await.ok()?;
                by_type.push(stream);
            }
            Some(())
        };
        let timeout = async {
            smol::Timer::after(STREAM_CREATION_TIMEOUT).await;
            None
        };
        if collect.or(timeout).await.is_none() {
            log::debug!(
                "exec: the client opened {} of {expected} streams",
                by_type.len()
            );
            writer.go_away().await;
            return None;
        }
        let mut take = |kind: &str| {
            let index = by_type
                .iter()
                .position(|s| s.header("streamtype") == Some(kind))?;
            Some(by_type.swap_remove(index))
        };
        let error = take("error")?;
        let stdin = take("stdin");
        let stdout = take("stdout");
        let stderr = take("stderr");
        let resize = take("resize");
        // The error stream's data never comes; it ends with the session,
        // which is how a gone client shows.
        let gone = error.data.clone();
        Some(Client {
            stdin: stdin.map(|s| s.data),
            resize: resize.map(|s| s.data),
            output: Rc::new(Output::Spdy {
                writer,
                stdout: stdout.map(|s| s.id),
                stderr: stderr.map(|s| s.id),
                error: error.id,
            }),
            gone,
        })
    }
}

/// Copies one of the process's outputs to its channel.
async fn pump(mut from: Box<dyn futures_lite::AsyncRead + Unpin>, output: Rc<Output>, channel: u8) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if !output.write(channel, &buf[..n]).await {
                    return;
                }
            }
        }
    }
}

fn success() -> serde_json::Value {
    serde_json::json!({"metadata": {}, "status": "Success"})
}

/// Upstream's status for an exit code; kubectl takes the code from the
/// cause.
fn exit_status(command: &[String], code: i32) -> serde_json::Value {
    if code == 0 {
        return success();
    }
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
            command.join(" ")
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// What could not run at all, as upstream's InternalError; `what` is
/// "error executing command in container" or "error attaching to
/// container".
fn failure(what: &str, message: String) -> serde_json::Value {
    let message = format!("{what}: {message}");
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("Internal error occurred: {message}"),
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    })
}

#[derive(serde::Deserialize)]
struct TerminalSize {
    #[serde(rename = "Width")]
    width: u16,
    #[serde(rename = "Height")]
    height: u16,
}

/// How long a terminal's first size may take to come: kubectl sends it
/// first thing, but on a loaded node 1 s was seen not to be enough.
const FIRST_SIZE_WAIT: Duration = Duration::from_secs(5);

/// Resize messages: JSON objects, several in one SPDY frame maybe.
fn sizes(data: &[u8]) -> impl Iterator<Item = (u16, u16)> + '_ {
    serde_json::Deserializer::from_slice(data)
        .into_iter::<TerminalSize>()
        .flatten()
        .map(|s| (s.width, s.height))
}

async fn first_size(resize: &Receiver<Bytes>) -> Option<(u16, u16)> {
    let first = async { resize.recv().await.ok() }
        .or(async {
            smol::Timer::after(FIRST_SIZE_WAIT).await;
            None
        })
        .await?;
    sizes(&first).last()
}

async fn run(ctx: &Deps, target: Target, command: Vec<String>, io: ExecIo, client: Client) {
    let scratch = ctx.layout.pod(&target.uid);
    let name = format!("exec-{}", &crate::state::random_hex()[..12]);
    // kubectl sends its terminal's size first thing; the terminal starts
    // at it.
    let size = match &client.resize {
        Some(resize) if io.tty => first_size(resize).await,
        _ => None,
    };
    let bundle = crate::runtime::Bundle::new(&scratch, &target.container_id);
    let exec = ctx
        .runtime
        .exec_attached(
            (&target.container_id, &bundle.dir),
            &command,
            io,
            size,
            (&scratch, &name),
        )
        .await;
    let mut exec = match exec {
        Ok(exec) => exec,
        Err(e) => {
            client
                .output
                .finish(&failure(EXEC_FAILED, e.to_string()))
                .await;
            return;
        }
    };
    if let (Some(rx), Some(mut to)) = (client.stdin, exec.stdin.take()) {
        crate::rt::spawn(async move {
            while let Ok(data) = rx.recv().await {
                if to.write_all(&data).await.is_err() || to.flush().await.is_err() {
                    break;
                }
            }
            // Dropped: the process reads its end of input.
            let _ = to.close().await;
        })
        .detach();
    }
    if let (Some(rx), Some(resizer)) = (client.resize, exec.resizer()) {
        crate::rt::spawn(async move {
            resizer.when_listening().await;
            while let Ok(data) = rx.recv().await {
                for (width, height) in sizes(&data) {
                    if let Err(e) = resizer.resize(width, height) {
                        log::debug!("exec: resizing the terminal: {e}");
                    }
                }
            }
        })
        .detach();
    }
    let outputs: Vec<_> = [(exec.stdout.take(), STDOUT), (exec.stderr.take(), STDERR)]
        .into_iter()
        .filter_map(|(from, channel)| {
            from.map(|from| crate::rt::spawn(pump(from, client.output.clone(), channel)))
        })
        .collect();
    let ended = async { Some(exec.child.status().await) }
        .or(async {
            while client.gone.recv().await.is_ok() {}
            None
        })
        .await;
    let Some(status) = ended else {
        // The client went: the process is killed with `exec`.
        log::debug!("exec in {}: the client is gone", target.container_id);
        return;
    };
    exec.ended();
    let drained = async {
        for output in outputs {
            output.await;
        }
    };
    drained
        .or(async {
            smol::Timer::after(OUTPUT_DRAIN).await;
        })
        .await;
    let status = match status {
        Ok(status) => exit_status(
            &command,
            status.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
            }),
        ),
        Err(e) => failure(EXEC_FAILED, format!("waiting for the command: {e}")),
    };
    client.output.finish(&status).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_where_kubectl_reads_it() {
        let command = vec!["sh".to_owned(), "-c".to_owned(), "exit 3".to_owned()];
        let status = exit_status(&command, 3);
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "3");
        assert_eq!(exit_status(&command, 0)["status"], "Success");
    }

    #[test]
    fn streams_are_read_from_the_api_servers_parameters() {
        let query: Vec<(String, String)> = [("input", "1"), ("output", "1"), ("tty", "1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            exec_io(&query),
            ExecIo {
                stdin: true,
                stdout: true,
                stderr: false,
                tty: true
            }
        );
    }
}
