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
