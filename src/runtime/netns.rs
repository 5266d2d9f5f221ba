//! Work that moves the calling thread into other namespaces (setns(2),
//! unshare(2)) runs on a thread of its own, which ends after: neither the
//! loop nor a pool thread may be left in a pod's namespace. A socket made
//! there stays in the namespace it was made in.

use std::io;
use std::path::Path;

/// Runs `work` on a new thread named `name` and waits for its result.
pub async fn on_own_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let (tx, rx) = smol::channel::bounded(1);
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = tx.send_blocking(work());
        })?;
    rx.recv()
        .await
        .map_err(|_| io::Error::other(format!("the {name} thread ended without a result")))
}

/// Runs `work` on a thread of its own inside the network namespace at
/// `netns` (the host's without one).
pub async fn in_network<T: Send + 'static>(
    netns: Option<&Path>,
    name: &str,
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let namespace = netns.map(std::fs::File::open).transpose()?;
    on_own_thread(name, move || {
        if let Some(file) = namespace {
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)?;
        }
        work()
    })
    .await?
}

/// `ip link set lo up` in the current network namespace.
pub(super) fn loopback_up() -> io::Result<()> {
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    let result = unsafe {
        if libc::ioctl(sock, libc::SIOCGIFFLAGS as _, &mut req) < 0 {
            Err(io::Error::last_os_error())
        } else {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(sock, libc::SIOCSIFFLAGS as _, &req) < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    };
    unsafe { libc::close(sock) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_a_thread_of_its_own_and_its_result_comes_back() {
        let here = std::thread::current().id();
        let there = smol::block_on(on_own_thread("nanolet-test", move || {
            std::thread::current().id() != here
        }))
        .unwrap();
        assert!(there);
        // The host's namespace without a path; a missing one is an error.
        let name = smol::block_on(in_network(None, "nanolet-test", || {
            Ok(std::thread::current().name().map(str::to_owned))
        }))
        .unwrap();
        assert_eq!(name.as_deref(), Some("nanolet-test"));
        assert!(
            smol::block_on(in_network(Some(Path::new("/nonexistent/ns")), "x", || Ok(
                ()
            )))
            .is_err()
        );
    }
}
