//! The server side of RFC 6455, as much as the kubelet's channel protocols
//! need: the handshake's accept key, binary and text messages both ways (a
//! client's text message is taken as bytes), ping, and close. Client frames
//! must be masked; ours are not, as the RFC has it.

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use smol::channel::Sender;

#[derive(Debug, thiserror::Error)]
pub enum WebSocketError {
    #[error("websocket: {0}")]
    Io(#[from] std::io::Error),
    #[error("websocket: {0}")]
    Protocol(&'static str),
    #[error("websocket: a message of more than {MAX_MESSAGE} bytes")]
    TooLarge,
}

/// The largest message taken from a client: stdin arrives in small
/// pieces, and nothing else is large.
pub const MAX_MESSAGE: usize = 1 << 20;

const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    use base64::Engine;
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{}{ACCEPT_GUID}", key.trim()).as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// What a client sent, once whole.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    Message(Vec<u8>),
    Ping(Vec<u8>),
    /// The client closes (or the connection ended).
    Close,
}

/// Reads a client's frames into messages.
pub struct Reader<R> {
    io: R,
    /// Bytes read past the HTTP request, to be taken first.
    pending: Vec<u8>,
    message: Vec<u8>,
    in_message: bool,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub fn new(io: R, pending: Vec<u8>) -> Self {
        Reader {
            io,
            pending,
            message: Vec::new(),
            in_message: false,
        }
    }

    async fn fill(&mut self, buf: &mut [u8]) -> Result<bool, WebSocketError> {
        let from_pending = buf.len().min(self.pending.len());
        buf[..from_pending].copy_from_slice(&self.pending[..from_pending]);
        self.pending.drain(..from_pending);
        if from_pending == buf.len() {
            return Ok(true);
        }
        match self.io.read_exact(&mut buf[from_pending..]).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && from_pending == 0 => {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub async fn next(&mut self) -> Result<Incoming, WebSocketError> {
        loop {
            let mut head = [0u8; 2];
            if !self.fill(&mut head).await? {
                return Ok(Incoming::Close);
            }
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0F;
            if head[0] & 0x70 != 0 {
                return Err(WebSocketError::Protocol("reserved bits set"));
            }
            if head[1] & 0x80 == 0 {
                return Err(WebSocketError::Protocol("an unmasked client frame"));
            }
            let len = match head[1] & 0x7F {
                126 => {
                    let mut b = [0u8; 2];
                    self.fill(&mut b).await?;
                    u16::from_be_bytes(b) as u64
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.fill(&mut b).await?;
                    u64::from_be_bytes(b)
                }
                n => n as u64,
            };
            let control = opcode & 0x8 != 0;
            if control && (len > 125 || !fin) {
                return Err(WebSocketError::Protocol(
                    "a fragmented or long control frame",
                ));
            }
            let len = usize::try_from(len).map_err(|_| WebSocketError::TooLarge)?;
            if !control && self.message.len().saturating_add(len) > MAX_MESSAGE {
                return Err(WebSocketError::TooLarge);
            }
            let mut mask = [0u8; 4];
            self.fill(&mut mask).await?;
            let mut payload = vec![0u8; len];
            self.fill(&mut payload).await?;
            for (i, byte) in payload.iter_mut().enumerate() {
                *byte ^= mask[i % 4];
            }
            match opcode {
                OP_CLOSE => return Ok(Incoming::Close),
                OP_PING => return Ok(Incoming::Ping(payload)),
                OP_PONG => continue,
                OP_TEXT | OP_BINARY if !self.in_message => {
                    self.message = payload;
                }
                OP_CONTINUATION if self.in_message => self.message.extend_from_slice(&payload),
                OP_TEXT | OP_BINARY | OP_CONTINUATION => {
                    return Err(WebSocketError::Protocol("a frame out of its message"));
                }
                _ => return Err(WebSocketError::Protocol("an unknown opcode")),
            }
            self.in_message = !fin;
            if fin {
                return Ok(Incoming::Message(std::mem::take(&mut self.message)));
            }
        }
    }
}

impl<R: AsyncRead + Unpin> Reader<R> {
    /// The client's next message; `None` once it closes. Pings meanwhile
    /// are answered on `frames`.
    pub async fn next_message(
        &mut self,
        frames: &Sender<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, WebSocketError> {
        loop {
            match self.next().await? {
                Incoming::Message(message) => return Ok(Some(message)),
                Incoming::Ping(payload) => {
                    let _ = frames.send(pong(&payload)).await;
                }
                Incoming::Close => return Ok(None),
            }
        }
    }
}

fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 10);
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= u16::MAX as usize => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// One binary message.
pub fn binary(payload: &[u8]) -> Vec<u8> {
    frame(OP_BINARY, payload)
}

/// One text message (the caller keeps it UTF-8).
pub fn text(payload: &[u8]) -> Vec<u8> {
    frame(OP_TEXT, payload)
}

pub fn pong(payload: &[u8]) -> Vec<u8> {
    frame(OP_PONG, payload)
}

/// A close frame with status 1000 (normal closure).
pub fn close() -> Vec<u8> {
    frame(OP_CLOSE, &1000u16.to_be_bytes())
}

/// Writes already framed bytes.
pub async fn send<W: AsyncWrite + Unpin>(io: &mut W, framed: &[u8]) -> std::io::Result<()> {
    io.write_all(framed).await?;
    io.flush().await
}

/// A task of its own writes the frames sent to the returned channel, in
/// order, so that several writers share the connection; it closes the
/// connection's write side once the channel is closed or every sender is
/// gone.
pub fn writer<W: AsyncWrite + Unpin + 'static>(mut io: W) -> Sender<Vec<u8>> {
    let (frames, frames_rx) = smol::channel::bounded::<Vec<u8>>(16);
    crate::rt::spawn(async move {
        while let Ok(frame) = frames_rx.recv().await {
            if send(&mut io, &frame).await.is_err() {
                break;
            }
        }
        let _ = io.close().await;
    })
    .detach();
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_key_is_the_rfcs_example() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    fn masked(first: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut out = vec![first];
        if payload.len() < 126 {
            out.push(0x80 | payload.len() as u8);
        } else {
            out.push(0x80 | 126);
            out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn fragments_join_and_control_frames_come_between() {
        let mut wire = masked(OP_BINARY, b"\x00hel");
        wire.extend(masked(0x80 | OP_PING, b"p"));
        wire.extend(masked(0x80 | OP_CONTINUATION, b"lo"));
        let long = vec![7u8; 300];
        wire.extend(masked(0x80 | OP_BINARY, &long));
        wire.extend(masked(0x80 | OP_CLOSE, &[0x03, 0xe8]));
        let (head, rest) = wire.split_at(5);
        let mut reader = Reader::new(futures_lite::io::Cursor::new(rest.to_vec()), head.to_vec());
        smol::block_on(async {
            assert_eq!(reader.next().await.unwrap(), Incoming::Ping(b"p".to_vec()));
            assert_eq!(
                reader.next().await.unwrap(),
                Incoming::Message(b"\x00hello".to_vec())
            );
            assert_eq!(reader.next().await.unwrap(), Incoming::Message(long));
            assert_eq!(reader.next().await.unwrap(), Incoming::Close);
            assert_eq!(reader.next().await.unwrap(), Incoming::Close);
        });
    }

    #[test]
    fn unmasked_and_oversized_frames_are_refused() {
        let mut reader = Reader::new(futures_lite::io::Cursor::new(binary(b"x")), Vec::new());
        assert!(smol::block_on(reader.next()).is_err());
        let mut huge = vec![0x82, 0x80 | 127];
        huge.extend_from_slice(&(MAX_MESSAGE as u64 + 1).to_be_bytes());
        huge.extend_from_slice(&[0; 4]);
        let mut reader = Reader::new(futures_lite::io::Cursor::new(huge), Vec::new());
        assert!(matches!(
            smol::block_on(reader.next()),
            Err(WebSocketError::TooLarge)
        ));
    }

    #[test]
    fn frames_carry_their_length_in_the_shortest_form() {
        assert_eq!(binary(b"ab"), vec![0x82, 2, b'a', b'b']);
        assert_eq!(&binary(&[0; 200])[..4], &[0x82, 126, 0, 200]);
        assert_eq!(
            &binary(&[0; 70000])[..10],
            &[0x82, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]
        );
        assert_eq!(close(), vec![0x88, 2, 0x03, 0xe8]);
    }
}
