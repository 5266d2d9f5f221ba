//! The server side of SPDY/3.1 as Kubernetes speaks it (moby/spdystream):
//! the client opens every stream; we answer each with a SYN_REPLY, echo
//! its pings, and send data on its streams. Like spdystream, no flow
//! control: WINDOW_UPDATE and SETTINGS are read and ignored.

mod dictionary;
pub(crate) mod headers;

use std::collections::HashMap;

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use smol::channel::{Receiver, Sender};

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("spdy: {0}")]
    Io(#[from] std::io::Error),
    #[error("spdy: {0}")]
    Protocol(&'static str),
    #[error("spdy headers: {0}")]
    Headers(&'static str),
    #[error("spdy: the session is closed")]
    Closed,
}

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;

/// Frames larger than this end the session: a client writes stdin and
/// forwarded bytes in pieces of at most 32 KiB.
const MAX_FRAME: usize = 1 << 20;

/// Data a stream's reader has not taken yet, in frames.
const STREAM_QUEUE: usize = 8;

/// Streams a client may hold open in one session (kubectl port-forward
/// opens two per forwarded connection); more are reset.
const MAX_OPEN_STREAMS: usize = 128;

/// New streams not taken by the session's user yet: past this, the session
/// stops reading until they are.
const NEW_STREAMS_QUEUE: usize = 16;

/// A stream the client opened.
pub struct Stream {
    pub id: u32,
    /// Lowercase names.
    pub headers: Vec<(String, String)>,
    /// Its data; ends when the client half-closes or resets it.
    pub data: Receiver<Bytes>,
}

impl Stream {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends on the session; clones share its one writer.
#[derive(Clone)]
pub struct Writer {
    frames: Sender<Vec<u8>>,
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(payload);
    out
}

impl Writer {
    async fn frame(&self, frame: Vec<u8>) -> Result<(), SpdyError> {
        self.frames.send(frame).await.map_err(|_| SpdyError::Closed)
    }

    /// `bytes` on stream `id`, in frames of at most 32 KiB; `fin`
    /// half-closes it after them.
    pub async fn data(&self, id: u32, bytes: &[u8], fin: bool) -> Result<(), SpdyError> {
        let mut chunks: Vec<&[u8]> = bytes.chunks(32 * 1024).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let mut out = Vec::with_capacity(8 + chunk.len());
            out.extend_from_slice(&(id & 0x7FFF_FFFF).to_be_bytes());
            out.push(if fin && i == last { FLAG_FIN } else { 0 });
            out.extend_from_slice(&(chunk.len() as u32).to_be_bytes()[1..]);
            out.extend_from_slice(chunk);
            self.frame(out).await?;
        }
        Ok(())
    }

    /// Refuses stream `id` (status 5: CANCEL, as upstream resets one).
    pub async fn reset(&self, id: u32) -> Result<(), SpdyError> {
        let mut payload = id.to_be_bytes().to_vec();
        payload.extend_from_slice(&5u32.to_be_bytes());
        self.frame(control(RST_STREAM, 0, &payload)).await
    }

    /// Tells the client no more streams will be served, and ends the
    /// session once what was queued before is written.
    pub async fn go_away(&self) {
        let _ = self.frame(control(GOAWAY, 0, &[0; 8])).await;
        self.frames.close();
    }
}

/// Serves a session on an upgraded connection: returns the streams as the
/// client opens them, and the writer. `pending` are bytes already read
/// past the upgrade request. The session ends when the client goes, sends
/// GOAWAY, or every writer is dropped.
pub fn serve<IO>(io: IO, pending: Vec<u8>) -> (Receiver<Stream>, Writer)
where
    IO: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (reader, mut write_half) = futures_lite::io::split(io);
    let (frames_tx, frames_rx) = smol::channel::bounded::<Vec<u8>>(16);
    let (streams_tx, streams_rx) = smol::channel::bounded(NEW_STREAMS_QUEUE);
    let writer = Writer { frames: frames_tx };
    crate::rt::spawn(async move {
        while let Ok(frame) = frames_rx.recv().await {
            if write_half.write_all(&frame).await.is_err() {
                break;
            }
            if frames_rx.is_empty() && write_half.flush().await.is_err() {
                break;
            }
        }
        let _ = write_half.close().await;
    })
    .detach();
    let session_writer = writer.clone();
    crate::rt::spawn(async move {
        let mut session = Session {
            reader: Prefixed {
                pending,
                io: reader,
            },
            writer: session_writer,
            inflater: headers::Inflater::default(),
            deflater: headers::Deflater::default(),
            streams: HashMap::new(),
            new_streams: streams_tx,
        };
        if let Err(e) = session.run().await {
            log::debug!("spdy session: {e}");
        }
        // Dropping the session's senders ends every stream's data.
    })
    .detach();
    (streams_rx, writer)
}

struct Prefixed<R> {
    pending: Vec<u8>,
    io: R,
}

impl<R: AsyncRead + Unpin> Prefixed<R> {
    /// Fills `buf`; false on a clean end before its first byte.
    async fn fill(&mut self, buf: &mut [u8]) -> Result<bool, SpdyError> {
        let from_pending = buf.len().min(self.pending.len());
        buf[..from_pending].copy_from_slice(&self.pending[..from_pending]);
        self.pending.drain(..from_pending);
        match self.io.read_exact(&mut buf[from_pending..]).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && from_pending == 0 => {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}

struct Session<R> {
    reader: Prefixed<R>,
    writer: Writer,
    inflater: headers::Inflater,
    deflater: headers::Deflater,
    streams: HashMap<u32, Sender<Bytes>>,
    new_streams: Sender<Stream>,
}

fn word(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl<R: AsyncRead + Unpin> Session<R> {
    async fn run(&mut self) -> Result<(), SpdyError> {
        loop {
            let mut head = [0u8; 8];
            if !self.reader.fill(&mut head).await? {
                return Ok(());
            }
            let flags = head[4];
            let len = word(&[0, head[5], head[6], head[7]]) as usize;
            if len > MAX_FRAME {
                return Err(SpdyError::Protocol("a frame too large"));
            }
            let mut payload = vec![0u8; len];
            self.reader.fill(&mut payload).await?;
            if head[0] & 0x80 == 0 {
                self.data(word(&head) & 0x7FFF_FFFF, flags, payload).await;
                continue;
            }
            if u16::from_be_bytes([head[0], head[1]]) & 0x7FFF != VERSION {
                return Err(SpdyError::Protocol("not SPDY/3"));
            }
            match u16::from_be_bytes([head[2], head[3]]) {
                SYN_STREAM => self.syn_stream(flags, &payload).await?,
                RST_STREAM if payload.len() >= 4 => {
                    self.streams.remove(&(word(&payload) & 0x7FFF_FFFF));
                }
                PING if payload.len() == 4 => {
                    self.writer.frame(control(PING, 0, &payload)).await?;
                }
                GOAWAY => return Ok(()),
                // SETTINGS, WINDOW_UPDATE, HEADERS: nothing we act on.
                _ => {}
            }
        }
    }

    async fn syn_stream(&mut self, flags: u8, payload: &[u8]) -> Result<(), SpdyError> {
        if payload.len() < 10 {
            return Err(SpdyError::Protocol("a short SYN_STREAM"));
        }
        let id = word(payload) & 0x7FFF_FFFF;
        // Inflated even when refused: the header stream is one zlib stream.
        let headers = headers::decode(&self.inflater.inflate(&payload[10..])?)?;
        if self.streams.len() >= MAX_OPEN_STREAMS || self.streams.contains_key(&id) {
            log::debug!("spdy: stream {id} refused: too many open, or open already");
            return self.writer.reset(id).await;
        }
        log::debug!("spdy: stream {id} opened with {headers:?}");
        let mut reply = id.to_be_bytes().to_vec();
        reply.extend(self.deflater.deflate(&headers::encode(&[])));
        self.writer.frame(control(SYN_REPLY, 0, &reply)).await?;
        let (tx, rx) = smol::channel::bounded(STREAM_QUEUE);
        if flags & FLAG_FIN == 0 {
            self.streams.insert(id, tx);
        }
        let stream = Stream {
            id,
            headers,
            data: rx,
        };
        // Nobody takes new streams any more: the rest of the session is
        // only its open streams'.
        let _ = self.new_streams.send(stream).await;
        Ok(())
    }

    async fn data(&mut self, id: u32, flags: u8, payload: Vec<u8>) {
        let Some(stream) = self.streams.get(&id) else {
            return;
        };
        if !payload.is_empty() && stream.send(Bytes::from(payload)).await.is_err() {
            // Its reader is gone: the rest of its data is dropped.
            self.streams.remove(&id);
            return;
        }
        if flags & FLAG_FIN != 0 {
            self.streams.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syn_stream(deflater: &mut headers::Deflater, id: u32, pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut payload = id.to_be_bytes().to_vec();
        payload.extend_from_slice(&[0; 6]);
        payload.extend(deflater.deflate(&headers::encode(pairs)));
        control(SYN_STREAM, 0, &payload)
    }

    fn data(id: u32, fin: bool, bytes: &[u8]) -> Vec<u8> {
        let mut out = id.to_be_bytes().to_vec();
        out.push(if fin { FLAG_FIN } else { 0 });
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn streams_get_replies_their_data_and_their_end() {
        crate::rt::block_on(async {
            let (client, server) = std::os::unix::net::UnixStream::pair().unwrap();
            let server = smol::Async::new(server).unwrap();
            let mut client = smol::Async::new(client).unwrap();
            let mut deflater = headers::Deflater::default();
            let mut wire = syn_stream(&mut deflater, 1, &[("streamType", "stdin")]);
            wire.extend(data(1, false, b"hello"));
            wire.extend(control(PING, 0, &7u32.to_be_bytes()));
            wire.extend(data(1, true, b""));
            // The first bytes as if read with the upgrade request.
            let (pending, rest) = wire.split_at(3);
            client.write_all(rest).await.unwrap();
            let (streams, writer) = serve(server, pending.to_vec());
            let stream = streams.recv().await.unwrap();
            assert_eq!((stream.id, stream.header("streamtype")), (1, Some("stdin")));
            assert_eq!(stream.data.recv().await.unwrap(), &b"hello"[..]);
            assert!(stream.data.recv().await.is_err(), "FIN ends the data");
            writer.data(1, b"out", true).await.unwrap();
            writer.go_away().await;
            drop(writer);
            // As a Go client does on GOAWAY: the session ends with it.
            client
                .get_ref()
                .shutdown(std::net::Shutdown::Write)
                .unwrap();
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.unwrap();
            // SYN_REPLY for stream 1, the ping echoed, our data, GOAWAY.
            assert_eq!(&back[..4], &[0x80, 3, 0, 2]);
            let reply_len = word(&[0, back[5], back[6], back[7]]) as usize;
            let rest = &back[8 + reply_len..];
            assert_eq!(&rest[..12], &control(PING, 0, &7u32.to_be_bytes())[..]);
            assert_eq!(&rest[12..23], &data(1, true, b"out")[..]);
            assert_eq!(&rest[23..27], &[0x80, 3, 0, 7]);
            let mut inflater = headers::Inflater::default();
            let block = inflater.inflate(&back[12..8 + reply_len]).unwrap();
            assert!(headers::decode(&block).unwrap().is_empty());
        });
    }

    /// A client opening streams without end: past the cap each is reset,
    /// and none is held.
    #[test]
    fn open_streams_are_capped_per_session() {
        crate::rt::block_on(async {
            let (client, server) = std::os::unix::net::UnixStream::pair().unwrap();
            let server = smol::Async::new(server).unwrap();
            let mut client = smol::Async::new(client).unwrap();
            let mut deflater = headers::Deflater::default();
            let total = MAX_OPEN_STREAMS + 3;
            let mut wire = Vec::new();
            for id in 0..total as u32 {
                wire.extend(syn_stream(
                    &mut deflater,
                    2 * id + 1,
                    &[("streamType", "data")],
                ));
            }
            wire.extend(control(GOAWAY, 0, &[0; 8]));
            let (streams, writer) = serve(server, Vec::new());
            let taker = crate::rt::spawn(async move {
                let mut held = Vec::new();
                while let Ok(stream) = streams.recv().await {
                    held.push(stream);
                }
                held.len()
            });
            client.write_all(&wire).await.unwrap();
            client
                .get_ref()
                .shutdown(std::net::Shutdown::Write)
                .unwrap();
            assert_eq!(taker.await, MAX_OPEN_STREAMS);
            drop(writer);
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.unwrap();
            let (mut replies, mut resets) = (0, 0);
            let mut rest = &back[..];
            while rest.len() >= 8 {
                let len = word(&[0, rest[5], rest[6], rest[7]]) as usize;
                match u16::from_be_bytes([rest[2], rest[3]]) {
                    SYN_REPLY => replies += 1,
                    RST_STREAM => resets += 1,
                    _ => {}
                }
                rest = &rest[8 + len..];
            }
            assert_eq!((replies, resets), (MAX_OPEN_STREAMS, 3));
        });
    }
}
