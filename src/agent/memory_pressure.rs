//! The kernel's word that memory is short, so that eviction looks at once
//! rather than at its next 10 s pass:
//! - a PSI trigger on `/proc/pressure/memory` (tasks stalled on memory for
//!   200 ms within two seconds). A trigger fd reports only POLLPRI, which
//!   the event loop's reactor does not wait for: one thread sleeps in
//!   poll(2) on it and wakes only when the kernel fires.
//! - where the kernel has no PSI (Raspberry Pi kernels ship it off unless
//!   booted with `psi=1`) on a cgroup v2 host: `kubepods`' own
//!   `memory.events.local`, which the kernel changes (and inotify reports)
//!   when the pods together reach the cgroup's high or max limit, that is
//!   node allocatable, or an OOM kill comes of it. Limits hit inside a pod
//!   count in the pod's own file, not there.
//!
//! Either way one thread waits in the kernel, and the loop hears of a
//! firing at most once per [`MIN_INTERVAL`].

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use smol::channel::{Receiver, Sender};

const PRESSURE_FILE: &str = "/proc/pressure/memory";

/// "some" tasks stalled this many µs within the window: a node short of
/// memory stalls far longer; a healthy one not at all. The window is a
/// multiple of 2 s, which the kernel requires without CAP_SYS_RESOURCE.
const TRIGGER: &str = "some 200000 2000000";

/// A thrashing cgroup changes its memory.events up to every 10 ms; the
/// PSI trigger's window is 2 s.
const MIN_INTERVAL: Duration = Duration::from_secs(2);

/// Notifications, one per firing: PSI's, else changes of
/// `pods_memory_events` (`kubepods`' memory.events.local on cgroup v2).
/// `None` where there are neither, and the 10 s pass is all there is.
pub fn watch(pods_memory_events: Option<&Path>) -> Option<Receiver<()>> {
    watch_file(Path::new(PRESSURE_FILE)).or_else(|| watch_events(pods_memory_events?))
}

/// Notifications of changes of a cgroup's `memory.events` (or `.local`),
/// at most one per [`MIN_INTERVAL`]; `None` if it cannot be watched.
fn watch_events(path: &Path) -> Option<Receiver<()>> {
    let watched = Inotify::init(InitFlags::IN_CLOEXEC).and_then(|inotify| {
        inotify.add_watch(path, AddWatchFlags::IN_MODIFY)?;
        Ok(inotify)
    });
    let inotify = match watched {
        Ok(inotify) => inotify,
        Err(e) => {
            log::info!("no memory pressure notifications ({}): {e}", path.display());
            return None;
        }
    };
    notifying_thread("nanolet-memevents", path, move |tx| {
        wait_for_changes(&inotify, tx)
    })
}

/// A thread of its own that waits in the kernel for `path`'s firings and
/// sends them to the returned channel.
fn notifying_thread(
    name: &str,
    path: &Path,
    wait: impl FnOnce(&Sender<()>) + Send + 'static,
) -> Option<Receiver<()>> {
    let (tx, rx) = smol::channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .stack_size(64 * 1024)
        .spawn(move || wait(&tx));
    if let Err(e) = spawned {
        log::warn!("no memory pressure notifications: {e}");
        return None;
    }
    log::info!("memory pressure notifications from {}", path.display());
    Some(rx)
}

fn wait_for_changes(inotify: &Inotify, notify: &Sender<()>) {
    // Blocking reads: each returns once something changed.
    while let Ok(events) = inotify.read_events() {
        // IN_IGNORED: the cgroup is gone, and its watch with it.
        if events
            .iter()
            .any(|e| e.mask.contains(AddWatchFlags::IN_IGNORED))
        {
            return;
        }
        let _ = notify.try_send(());
        if notify.is_closed() {
            return;
        }
        // What changes meanwhile is the same pressure: it waits, and the
        // events it makes are read (and dropped) by the next read.
        std::thread::sleep(MIN_INTERVAL);
    }
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
    notifying_thread("nanolet-psi", path, move |tx| wait_for_firings(&file, tx))
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
