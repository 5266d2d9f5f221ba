//! The kernel's word that memory is short, so that eviction looks at once
//! rather than at its next 10 s pass: a PSI trigger on
//! `/proc/pressure/memory` (tasks stalled on memory for 200 ms within two
//! seconds). A trigger fd reports only POLLPRI, which the event loop's
//! reactor does not wait for: one thread sleeps in poll(2) on it and wakes
//! only when the kernel fires.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

use smol::channel::{Receiver, Sender};

const PRESSURE_FILE: &str = "/proc/pressure/memory";

/// "some" tasks stalled this many µs within the window: a node short of
/// memory stalls far longer; a healthy one not at all. The window is a
/// multiple of 2 s, which the kernel requires without CAP_SYS_RESOURCE.
const TRIGGER: &str = "some 200000 2000000";

/// Notifications, one per firing; `None` where the kernel has no PSI (or
/// it is off), and the 10 s pass is all there is.
pub fn watch() -> Option<Receiver<()>> {
    watch_file(Path::new(PRESSURE_FILE))
}

fn watch_file(path: &Path) -> Option<Receiver<()>> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| log::info!("no memory pressure notifications ({}): {e}", path.display()))
        .ok()?;
    // The kernel takes the trigger with its terminating NUL.
    if let Err(e) = file.write_all(format!("{TRIGGER}\0").as_bytes()) {
        log::info!("no memory pressure notifications ({}): {e}", path.display());
        return None;
    }
    let (tx, rx) = smol::channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name("nanolet-psi".into())
        .stack_size(64 * 1024)
        .spawn(move || wait_for_firings(&file, &tx));
    if let Err(e) = spawned {
        log::warn!("no memory pressure notifications: {e}");
        return None;
    }
    log::info!("memory pressure notifications from {}", path.display());
    Some(rx)
}

fn wait_for_firings(file: &std::fs::File, notify: &Sender<()>) {
    loop {
        let mut fd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        // Safety: one pollfd, alive across the call.
        let n = unsafe { libc::poll(&mut fd, 1, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        // POLLERR: the trigger is gone; anything but POLLPRI: not a
        // trigger at all. Either way nothing more comes.
        if fd.revents & libc::POLLERR != 0 || fd.revents & libc::POLLPRI == 0 {
            return;
        }
        // A firing while one is pending adds nothing.
        let _ = notify.try_send(());
        if notify.is_closed() {
            return;
        }
    }
}
