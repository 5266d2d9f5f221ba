//! What the agent and a pod monitor say to each other over the monitor's
//! Unix socket: one JSON object per line. Requests are answered in order,
//! and a request that carries an ID gets it back in its answer (see
//! `MonitorConnection`); exit events may arrive between answers. The answer
//! to `Attach` carries a file descriptor (SCM_RIGHTS).
//!
//! IDs ride inside the requests that have fields (a monitor started by an
//! older agent ignores them there and answers without one); `Shutdown`, a
//! connection's last request, has none.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// A container's stdin as its spec asks: a pipe the monitor holds open
/// for attach to write to, or (`tty`) a terminal of its own, made with
/// `--console-socket`, whose output the monitor logs as stdout.
pub use crate::pod::Input;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Request {
    /// Run `<runtime> create` for a container, with its stdout and stderr
    /// going to the monitor, which logs them to `log_path`.
    Create {
        id: String,
        bundle: PathBuf,
        log_path: PathBuf,
        #[serde(default)]
        input: Input,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<u64>,
    },
    /// Hand over the container's input: the write end of its stdin pipe,
    /// or its terminal. The connection stands for that attach's input from
    /// then on: once it closes, a `stdin_once` container's stdin closes.
    Attach {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<u64>,
    },
    /// Exit once no container of the pod runs.
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Message {
    /// The answer to a request.
    Reply {
        ok: bool,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        /// In answer to `Attach`: the descriptor is a terminal.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        terminal: bool,
        /// The ID of the request answered, if it had one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<u64>,
    },
    Exit(Exit),
}

/// A container's end, as the monitor saw it; also the content of
/// `exits/<id>.json`, so that exits survive an agent restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Exit {
    pub id: String,
    pub pid: i32,
    /// The shell convention: 128 + signal when killed by a signal.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub finished_at: Timestamp,
}

impl Request {
    /// The request with ID `number`, where it can carry one.
    pub fn numbered(mut self, number: u64) -> Request {
        match &mut self {
            Request::Create { request, .. } | Request::Attach { request, .. } => {
                *request = Some(number)
            }
            Request::Shutdown => {}
        }
        self
    }

    pub fn number(&self) -> Option<u64> {
        match self {
            Request::Create { request, .. } | Request::Attach { request, .. } => *request,
            Request::Shutdown => None,
        }
    }
}

pub const SOCKET: &str = "monitor.sock";

/// Writes `bytes` with `fd` attached, in one message.
pub fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds = [fd.as_raw_fd()];
    let sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[io::IoSlice::new(bytes)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if sent != bytes.len() {
        // The descriptor went with the first byte; what is left is plain.
        io::Write::write_all(&mut &*stream, &bytes[sent..])?;
    }
    Ok(())
}

/// Reads what one message brings, and the descriptor attached to it, if
/// any (further descriptors are closed).
pub fn receive_with_fd(
    stream: &UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let message = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut received = None;
    for control in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = control {
            for fd in fds {
                // Safety: the kernel just gave us this descriptor; no one
                // else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if received.is_none() {
                    received = Some(owned);
                }
            }
        }
    }
    Ok((message.bytes, received))
}
pub const EXITS_DIR: &str = "exits";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = Request::Create {
            id: "x".into(),
            bundle: "/b".into(),
            log_path: "/l".into(),
            input: Input::default(),
            request: None,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        let m = Message::Reply {
            ok: true,
            error: String::new(),
            pid: Some(3),
            terminal: false,
            request: None,
        };
        let line = serde_json::to_string(&m).unwrap();
        assert_eq!(line, r#"{"reply":{"ok":true,"pid":3}}"#);
        // What an agent from before `input` existed sends.
        let old = r#"{"create":{"id":"x","bundle":"/b","log_path":"/l"}}"#;
        assert_eq!(serde_json::from_str::<Request>(old).unwrap(), r);
    }

    /// The requests as a monitor started by an agent from before request
    /// IDs reads them: it must still understand every numbered one.
    #[test]
    fn a_monitor_without_request_ids_reads_numbered_requests() {
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(rename_all = "camelCase")]
        enum OldRequest {
            Create {
                id: String,
                bundle: PathBuf,
                log_path: PathBuf,
                #[serde(default)]
                input: Input,
            },
            Attach {
                id: String,
            },
            Shutdown,
        }
        let create = Request::Create {
            id: "x".into(),
            bundle: "/b".into(),
            log_path: "/l".into(),
            input: Input::default(),
            request: None,
        };
        let attach = Request::Attach {
            id: "x".into(),
            request: None,
        };
        let read = |request: Request| -> OldRequest {
            let numbered = request.numbered(7);
            assert!(numbered.number() == Some(7) || numbered == Request::Shutdown);
            serde_json::from_str(&serde_json::to_string(&numbered).unwrap()).unwrap()
        };
        assert!(matches!(read(create), OldRequest::Create { id, .. } if id == "x"));
        assert_eq!(read(attach), OldRequest::Attach { id: "x".into() });
        assert_eq!(read(Request::Shutdown), OldRequest::Shutdown);
        // And its answers, without an ID, are still answers.
        let old_reply = r#"{"reply":{"ok":true,"pid":3}}"#;
        assert!(matches!(
            serde_json::from_str::<Message>(old_reply).unwrap(),
            Message::Reply {
                request: None,
                pid: Some(3),
                ..
            }
        ));
    }

    #[test]
    fn a_descriptor_goes_with_its_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let (read, write) = nix::unistd::pipe().unwrap();
        send_with_fd(&a, b"hello\n", std::os::fd::AsFd::as_fd(&write)).unwrap();
        drop(write);
        let mut buf = [0u8; 64];
        let (n, fd) = receive_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello\n");
        // The received descriptor is the pipe's write end.
        nix::unistd::write(fd.unwrap(), b"x").unwrap();
        let mut got = [0u8; 1];
        assert_eq!(nix::unistd::read(&read, &mut got).unwrap(), 1);
        assert_eq!(&got, b"x");
    }
}
