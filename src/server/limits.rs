//! What one client of the kubelet API may hold: connections at a time, a
//! connection that says nothing, headers that never end. Every listener
//! (the kubelet API, healthz, the read-only port) counts its connections
//! and drops those past its cap at once; every connection ends after
//! `idle` without a byte either way (upstream's
//! streamingConnectionIdleTimeout, 4 h, for exec, attach, port-forward and
//! followed logs), and hyper's header read timeout, driven by the loop's
//! timers, ends a request whose headers do not arrive.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_lite::{AsyncRead, AsyncWrite};

/// Upstream's streamingConnectionIdleTimeout default.
pub const STREAMING_IDLE: Duration = Duration::from_secs(4 * 3600);

/// Headers of a request, also the next one on a kept-alive connection,
/// must arrive within this.
pub const HEADER_READ: Duration = Duration::from_secs(30);

/// Connections at a time: a board's agent serves the API server, a
/// metrics scraper and a few kubectl streams, not thousands.
pub const API_CONNECTIONS: usize = 128;
pub const PLAIN_CONNECTIONS: usize = 32;

/// Connections one listener has open; a taken slot is given back when the
/// connection's task drops it.
#[derive(Clone)]
pub struct Slots {
    used: Rc<Cell<usize>>,
    max: usize,
}

pub struct Slot(Rc<Cell<usize>>);

impl Slots {
    pub fn new(max: usize) -> Slots {
        Slots {
            used: Rc::new(Cell::new(0)),
            max,
        }
    }

    pub fn take(&self) -> Option<Slot> {
        if self.used.get() >= self.max {
            return None;
        }
        self.used.set(self.used.get() + 1);
        Some(Slot(self.used.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// A stream that fails with `TimedOut` once neither direction has moved a
/// byte for `idle`. Each direction has its own timer: after an upgrade the
/// two halves are polled by different tasks.
pub struct IdleTimeout<T> {
    inner: T,
    idle: Duration,
    last: Instant,
    read_timer: Armed,
    write_timer: Armed,
}

impl<T> IdleTimeout<T> {
    pub fn new(inner: T, idle: Duration) -> Self {
        IdleTimeout {
            inner,
            idle,
            last: Instant::now(),
            read_timer: Armed::new(),
            write_timer: Armed::new(),
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "idle connection")
}

/// One direction's timer, and when it is set to fire. It is set again only
/// once it has fired: activity moves the deadline on every byte, and
/// re-registering with the reactor at every poll would cost each read.
struct Armed {
    timer: smol::Timer,
    at: Option<Instant>,
}

impl Armed {
    fn new() -> Armed {
        Armed {
            timer: smol::Timer::never(),
            at: None,
        }
    }

    /// Ready with an error once `deadline` has passed.
    fn poll_deadline(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Poll::Ready(timed_out());
            }
            // Fired at an earlier deadline (or never set): set it anew.
            if self.at.is_none_or(|at| at <= now) {
                self.timer.set_at(deadline);
                self.at = Some(deadline);
            }
            match Pin::new(&mut self.timer).poll(cx) {
                Poll::Ready(_) => self.at = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                this.last = Instant::now();
                Poll::Ready(result)
            }
            Poll::Pending => {
                let deadline = this.last + this.idle;
                this.read_timer.poll_deadline(deadline, cx).map(Err)
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(result) => {
                this.last = Instant::now();
                Poll::Ready(result)
            }
            Poll::Pending => {
                let deadline = this.last + this.idle;
                this.write_timer.poll_deadline(deadline, cx).map(Err)
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// hyper's timers on the loop's reactor.
#[derive(Clone, Debug, Default)]
pub struct LoopTimer;

struct LoopSleep(smol::Timer);

impl Future for LoopSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(drop)
    }
}

impl hyper::rt::Sleep for LoopSleep {}

impl hyper::rt::Timer for LoopTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(LoopSleep(smol::Timer::after(duration)))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(LoopSleep(smol::Timer::at(deadline)))
    }
}

/// An HTTP/1.1 server connection builder with the header read timeout.
pub fn http1() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(LoopTimer).header_read_timeout(HEADER_READ);
    builder
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::AsyncReadExt;

    #[test]
    fn slots_are_given_back() {
        let slots = Slots::new(2);
        let a = slots.take().unwrap();
        let _b = slots.take().unwrap();
        assert!(slots.take().is_none());
        drop(a);
        assert!(slots.take().is_some());
    }

    #[test]
    fn a_silent_peer_times_out_and_a_talking_one_does_not() {
        crate::rt::block_on(async {
            let (mut client, server) = smol::net::unix::UnixStream::pair().unwrap();
            let mut server = IdleTimeout::new(server, Duration::from_millis(300));
            let mut buf = [0u8; 8];
            for _ in 0..3 {
                smol::Timer::after(Duration::from_millis(150)).await;
                futures_lite::AsyncWriteExt::write_all(&mut client, b"x")
                    .await
                    .unwrap();
                assert_eq!(server.read(&mut buf).await.unwrap(), 1);
            }
            let started = Instant::now();
            let e = server.read(&mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(started.elapsed() >= Duration::from_millis(250));
        });
    }
}
