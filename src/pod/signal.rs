//! Stop signals: the names `lifecycle.stopSignal` may take on Linux (as
//! upstream's validation lists them) and how the runtime's `kill` is told.

/// Names without `SIG` that are not realtime signals.
const CLASSIC: &[&str] = &[
    "ABRT", "ALRM", "BUS", "CHLD", "CLD", "CONT", "FPE", "HUP", "ILL", "INT", "IO", "IOT", "KILL",
    "PIPE", "POLL", "PROF", "PWR", "QUIT", "SEGV", "STKFLT", "STOP", "SYS", "TERM", "TRAP", "TSTP",
    "TTIN", "TTOU", "URG", "USR1", "USR2", "VTALRM", "WINCH", "XCPU", "XFSZ",
];

/// SIGRTMIN as glibc and Go programs see it (the kernel's 32 and 33 are
/// the C library's own), and SIGRTMAX.
const RTMIN: u32 = 34;
const RTMAX: u32 = 64;

/// The number of a realtime signal name without `SIG`: `RTMIN`,
/// `RTMIN+1`..`RTMIN+15`, `RTMAX-14`..`RTMAX-1`, `RTMAX`.
fn realtime(name: &str) -> Option<u32> {
    let offset = |rest: &str, sign: char| -> Option<u32> {
        if rest.is_empty() {
            return Some(0);
        }
        let n: u32 = rest.strip_prefix(sign)?.parse().ok()?;
        (1..=15).contains(&n).then_some(n)
    };
    if let Some(rest) = name.strip_prefix("RTMIN") {
        offset(rest, '+').map(|n| RTMIN + n)
    } else if let Some(rest) = name.strip_prefix("RTMAX") {
        offset(rest, '-').filter(|&n| n <= 14).map(|n| RTMAX - n)
    } else {
        None
    }
}

/// Whether `signal` (`SIGTERM`, as the API writes them) is one a Linux
/// pod's container may be stopped with.
pub fn is_linux_stop_signal(signal: &str) -> bool {
    signal
        .strip_prefix("SIG")
        .is_some_and(|name| CLASSIC.contains(&name) || realtime(name).is_some())
}

/// `signal` as runc's and crun's `kill` take it: the name without `SIG`,
/// a realtime signal by number (their name tables lack `RTMIN+n`). An
/// image's STOPSIGNAL may be a number, or anything its author wrote: what
/// is not a signal (`--all`, `0`, `999`) is TERM, never an argument of
/// its own on the runtime's command line.
pub fn for_runtime(signal: &str) -> String {
    // Docker reads STOPSIGNAL in any case.
    let upper = signal.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some(number) = realtime(name) {
        return number.to_string();
    }
    if CLASSIC.contains(&name) {
        return name.to_owned();
    }
    match name.parse::<u32>() {
        Ok(number) if (1..=RTMAX).contains(&number) => number.to_string(),
        _ => "TERM".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_stop_signals_are_upstreams_list() {
        for ok in [
            "SIGTERM",
            "SIGQUIT",
            "SIGUSR1",
            "SIGRTMIN",
            "SIGRTMIN+15",
            "SIGRTMAX-14",
            "SIGRTMAX",
        ] {
            assert!(is_linux_stop_signal(ok), "{ok}");
        }
        for bad in [
            "TERM",
            "SIGFOO",
            "SIGRTMIN+16",
            "SIGRTMAX-15",
            "SIGRTMIN+",
            "SIGRTMIN-1",
            "15",
            "",
        ] {
            assert!(!is_linux_stop_signal(bad), "{bad}");
        }
    }

    #[test]
    fn the_runtime_gets_names_and_realtime_numbers() {
        assert_eq!(for_runtime("SIGQUIT"), "QUIT");
        assert_eq!(for_runtime("TERM"), "TERM");
        assert_eq!(for_runtime("9"), "9");
        assert_eq!(for_runtime("sigquit"), "QUIT");
        assert_eq!(for_runtime("SIGRTMIN+3"), "37");
        assert_eq!(for_runtime("SIGRTMAX-1"), "63");
        // What an image may write that is no signal.
        for hostile in [
            "--all",
            "-9",
            "0",
            "65",
            "99999999999999999999",
            "sigterm",
            "",
            "KILL extra",
        ] {
            assert_eq!(for_runtime(hostile), "TERM", "{hostile}");
        }
    }
}
