//! Lets hyper drive futures-io streams (async-io sockets, futures-rustls), so
//! hyper runs on the smol loop without a second runtime.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};

pub struct HyperIo<T>(pub T);

/// The most one read asks for: what loopback TCP hands over at once, and
/// four TLS records.
const READ_WINDOW: usize = 64 << 10;

impl<T: AsyncRead + Unpin> hyper::rt::Read for HyperIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Safety: the slice is initialised before hyper learns of it: it is
        // zeroed first, and `advance` only covers bytes the reader wrote.
        // Only a window of it: hyper offers its whole spare read buffer
        // (hundreds of KiB during a pull), and zeroing all of it at every
        // poll, a Pending one too, took an eighth of the loop's CPU time in
        // a pull, in stretches long enough to show as loop lag.
        let whole = unsafe { buf.as_mut() };
        let window = whole.len().min(READ_WINDOW);
        let uninit = &mut whole[..window];
        for byte in uninit.iter_mut() {
            byte.write(0);
        }
        let slice = unsafe {
            std::slice::from_raw_parts_mut(uninit.as_mut_ptr().cast::<u8>(), uninit.len())
        };
        match Pin::new(&mut self.0).poll_read(cx, slice) {
            Poll::Ready(Ok(n)) => {
                unsafe { buf.advance(n) };
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> hyper::rt::Write for HyperIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}

/// The most a coalesced write holds back: one TLS record's plaintext.
const COALESCE_LIMIT: usize = 16 << 10;

/// Holds what is written until a flush, and lets the flush wait one turn
/// of the loop, so that what one turn produces goes out as one write: one
/// TLS record and one TCP segment. HTTP/2 writes a request's HEADERS, then
/// its DATA once the stream has been given send capacity, a task's turn
/// later; unjoined, a small request was two records in two segments, and
/// the peer acknowledged the first on its own. On a link billed by the
/// byte that was 126 of a Lease renewal's 1,512 bytes (uplink.sh).
pub struct Coalesced<T> {
    inner: T,
    pending: Vec<u8>,
    waited: bool,
}

impl<T> Coalesced<T> {
    pub fn new(inner: T) -> Self {
        Coalesced {
            inner,
            pending: Vec::new(),
            waited: false,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Hands the held bytes to the inner stream.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.pending.is_empty() {
            let written =
                std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if written == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..written);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.len() >= COALESCE_LIMIT {
            std::task::ready!(this.poll_drain(cx))?;
        }
        let room = COALESCE_LIMIT - this.pending.len().min(COALESCE_LIMIT);
        let taken = buf.len().min(room.max(1));
        this.pending.extend_from_slice(&buf[..taken]);
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.pending.is_empty() && !this.waited {
            // Once: the tasks this turn woke (a request's body) write first.
            this.waited = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        std::task::ready!(this.poll_drain(cx))?;
        this.waited = false;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each write the inner stream receives.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            // A socket that takes at most 7 bytes at a time.
            let n = buf.len().min(7);
            self.0.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn writes_before_a_flush_reach_the_stream_together_a_turn_later() {
        use futures_lite::AsyncWriteExt;
        let mut stream = Coalesced::new(Writes::default());
        let flushed = smol::block_on(async {
            stream.write_all(b"head").await?;
            // The flush waits a turn; what is written meanwhile joins it.
            let mut flush = std::pin::pin!(async {
                let mut once = true;
                std::future::poll_fn(|cx| {
                    let polled = Pin::new(&mut stream).poll_flush(cx);
                    if once {
                        once = false;
                        assert!(polled.is_pending());
                        let _ = Pin::new(&mut stream).poll_write(cx, b"+body");
                    }
                    polled
                })
                .await
            });
            flush.as_mut().await
        });
        assert!(flushed.is_ok());
        let writes = &stream.inner.0;
        assert_eq!(writes.concat(), b"head+body");
        // One write as far as the stream took it at once.
        assert_eq!(writes.first().map(Vec::len), Some(7));
        assert!(stream.pending.is_empty());
    }

    #[test]
    fn a_writer_that_never_flushes_is_capped() {
        let mut stream = Coalesced::new(Writes::default());
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let big = vec![1u8; COALESCE_LIMIT + 100];
        let mut written = 0;
        while written < big.len() {
            match Pin::new(&mut stream).poll_write(&mut cx, &big[written..]) {
                Poll::Ready(Ok(n)) => written += n,
                other => panic!("{other:?}"),
            }
            assert!(stream.pending.len() <= COALESCE_LIMIT);
        }
        assert!(!stream.inner.0.is_empty());
    }
}
