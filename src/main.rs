//! nanolet: a small Kubernetes node agent.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use lexopt::prelude::*;
use nanolet::{agent, cli, config, monitor, rt};

const USAGE: &str = "\
nanolet: a small Kubernetes node agent

Usage:
  nanolet run [--config FILE] [flags]   run the agent in the foreground
  nanolet pods [--state-dir DIR]        list pods, like `kubectl get pods -A`
  nanolet images [--state-dir DIR]      list images: size, when pulled and last used
  nanolet logs [-f|--follow] [--tail N] [--previous] [--timestamps] [--state-dir DIR] NS/POD [CONTAINER]
  nanolet check [--config FILE] [flags]  what this node offers: runtime, cgroups, overlayfs, CNI
  nanolet version
  nanolet monitor --pod-dir DIR --runtime-path PATH --runtime-root DIR
          [--max-log-size BYTES] [--max-log-files N]
                                        a pod's monitor: started by the agent, not by hand

Flags of run and check:
  --config FILE                 a KubeletConfiguration (and NanoletConfiguration)
                                file; each flag below overrides one of its fields
  -v, --verbose                 debug logging (or RUST_LOG)
";

/// Exit code for usage and configuration errors.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    // glibc gives each thread that allocates an arena of its own; the
    // agent's few helper threads (blocking file work) then hold hundreds of
    // KiB each for nothing. One arena suits a single loop. (musl has none.)
    #[cfg(target_env = "gnu")]
    // Safety: before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let mut args = std::env::args_os().skip(1);
    let Some(command) = args.next() else {
        eprint!("{USAGE}{}", config::flags_help());
        return ExitCode::from(EXIT_USAGE);
    };
    let parser = lexopt::Parser::from_args(args);
    let result = match command.to_string_lossy().as_ref() {
        "run" => cmd_run(parser),
        "check" => cmd_check(parser),
        "pods" => cmd_pods(parser),
        "images" => cmd_images(parser),
        "logs" => cmd_logs(parser),
        "monitor" => cmd_monitor(parser),
        // Internal, like monitor: PID 1 of pods with shareProcessNamespace.
        "pause" => match args_of(parser).as_slice() {
            [pid_file, user_ns @ ..] if user_ns.len() <= 1 => {
                nanolet::runtime::pause::run(Path::new(pid_file), user_ns.first().map(Path::new))
                    .map_err(Into::into)
            }
            _ => Err(anyhow::anyhow!(
                "usage: nanolet pause PID_FILE [USER_NAMESPACE]"
            )),
        },
        // Internal: makes a pod's user namespace (hostUsers: false).
        "userns" => match args_of(parser).first() {
            Some(hostname) => {
                nanolet::runtime::userns::run(&hostname.to_string_lossy()).map_err(Into::into)
            }
            None => Err(Usage("userns needs a hostname".into()).into()),
        },
        "version" | "--version" => {
            println!("nanolet {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        "help" | "--help" | "-h" => {
            print!("{USAGE}{}", config::flags_help());
            Ok(())
        }
        other => Err(Usage(format!("unknown command {other:?}")).into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Usage>() || e.is::<config::ConfigError>() || e.is::<lexopt::Error>() => {
            eprintln!("nanolet: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("nanolet: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn init_logging(verbose: bool) {
    let default = if verbose { "debug" } else { "info" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(|buf, record| {
            use std::io::Write;
            let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.3fZ");
            writeln!(buf, "{now} {:<5} {}", record.level(), record.args())
        })
        .init();
}

/// `nanolet check`: the node as `run` with the same config would find it;
/// exits 1 when pods could not run.
fn cmd_check(parser: lexopt::Parser) -> anyhow::Result<()> {
    let (config, _) = parse_run_flags(parser)?;
    if !cli::check::run(&config, &mut std::io::stdout().lock())? {
        bail!("this node cannot run pods as configured");
    }
    Ok(())
}

// Every process of the binary (a monitor per pod, the pause) starts in
// main: the agent's future lives on the heap and this frame is never
// inlined there, or its size in stack pages would be touched (stack probes)
// and kept by each of them.
#[inline(never)]
fn cmd_run(parser: lexopt::Parser) -> anyhow::Result<()> {
    let (config, verbose) = parse_run_flags(parser)?;
    // Before the launcher, which inherits it.
    let own_score = nanolet::runtime::oom_score::set_own(config.oom_score_adj);
    // Safety: no thread has been started yet.
    let launcher = unsafe { monitor::launcher::spawn() };
    init_logging(verbose);
    if let Err(e) = own_score {
        log::warn!(
            "setting the agent's oom_score_adj to {}: {e}",
            config.oom_score_adj
        );
    }
    let launcher = launcher
        .map_err(|e| log::warn!("no monitor launcher ({e}): monitors are exec'd"))
        .ok();
    raise_open_files();
    rt::block_on(Box::pin(agent::run(config, launcher))).context("agent")?;
    Ok(())
}

/// Every kubelet API connection, log reader and pod holds descriptors: the
/// soft limit (often 1024) goes up to the hard one, as Go programs do it,
/// the upstream kubelet among them. After the launcher forks, so that the
/// monitors, and the containers they start, keep the usual limit.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                log::warn!("raising the open files limit from {soft} to {hard}: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => log::warn!("reading the open files limit: {e}"),
    }
}

/// The configuration `run` uses: the file, then the flags over it.
fn parse_run_flags(mut parser: lexopt::Parser) -> anyhow::Result<(config::Config, bool)> {
    let mut config_file: Option<PathBuf> = None;
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut verbose = false;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("config") => config_file = Some(parser.value()?.into()),
            Short('v') | Long("verbose") => verbose = true,
            Long(flag) => {
                let flag = flag.to_owned();
                let value = parser.value()?.string()?;
                flags.push((flag, value));
            }
            other => return Err(other.unexpected().into()),
        }
    }
    let config = config::Config::load(config_file.as_deref(), &flags)?;
    Ok((config, verbose))
}

/// `--state-dir`, shared by the read-only commands.
fn state_dir_arg(parser: &mut lexopt::Parser, state_dir: &mut PathBuf) -> anyhow::Result<()> {
    *state_dir = parser.value()?.into();
    Ok(())
}

/// The state dir of a command that takes nothing else.
fn only_state_dir(mut parser: lexopt::Parser) -> anyhow::Result<PathBuf> {
    let mut state_dir = PathBuf::from(config::DEFAULT_STATE_DIR);
    while let Some(arg) = parser.next()? {
        match arg {
            Long("state-dir") => state_dir_arg(&mut parser, &mut state_dir)?,
            other => return Err(other.unexpected().into()),
        }
    }
    Ok(state_dir)
}

fn cmd_pods(parser: lexopt::Parser) -> anyhow::Result<()> {
    cli::print_pods(&only_state_dir(parser)?, &mut std::io::stdout().lock())?;
    Ok(())
}

fn cmd_images(parser: lexopt::Parser) -> anyhow::Result<()> {
    cli::print_images(&only_state_dir(parser)?, &mut std::io::stdout().lock())?;
    Ok(())
}

fn cmd_logs(mut parser: lexopt::Parser) -> anyhow::Result<()> {
    let mut state_dir = PathBuf::from(config::DEFAULT_STATE_DIR);
    let mut args = cli::logs::LogsArgs::default();
    let mut positional = Vec::new();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("state-dir") => state_dir_arg(&mut parser, &mut state_dir)?,
            Short('f') | Long("follow") => args.follow = true,
            Short('p') | Long("previous") => args.previous = true,
            Long("timestamps") => args.timestamps = true,
            Long("tail") => args.tail = Some(parser.value()?.parse()?),
            Value(v) => positional.push(v.string()?),
            other => return Err(other.unexpected().into()),
        }
    }
    let mut positional = positional.into_iter();
    args.target = positional
        .next()
        .ok_or_else(|| Usage("logs: which pod? NS/POD".into()))?;
    args.container = positional.next();
    if positional.next().is_some() {
        bail!(Usage("logs: too many arguments".into()));
    }
    cli::logs::run(&state_dir, &args, &mut std::io::stdout().lock())?;
    Ok(())
}

/// The per-pod monitor (started by the agent, not by users).
fn cmd_monitor(mut parser: lexopt::Parser) -> anyhow::Result<()> {
    let mut pod_dir = None;
    let mut runtime_path = None;
    let mut runtime_root = None;
    let mut max_log_size = 10 << 20;
    let mut max_log_files = 5;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("pod-dir") => pod_dir = Some(PathBuf::from(parser.value()?)),
            Long("runtime-path") => runtime_path = Some(PathBuf::from(parser.value()?)),
            Long("runtime-root") => runtime_root = Some(PathBuf::from(parser.value()?)),
            Long("max-log-size") => max_log_size = parser.value()?.parse()?,
            Long("max-log-files") => max_log_files = parser.value()?.parse()?,
            other => return Err(other.unexpected().into()),
        }
    }
    let (Some(pod_dir), Some(runtime_path), Some(runtime_root)) =
        (pod_dir, runtime_path, runtime_root)
    else {
        bail!(Usage(
            "monitor: --pod-dir, --runtime-path and --runtime-root are required".into()
        ));
    };
    monitor::start(monitor::Args {
        pod_dir,
        runtime_path,
        runtime_root,
        max_log_size,
        max_log_files,
    })?;
    Ok(())
}

/// The arguments of an internal command, taken as they are.
fn args_of(mut parser: lexopt::Parser) -> Vec<OsString> {
    parser
        .raw_args()
        .map(|args| args.collect())
        .unwrap_or_default()
}
