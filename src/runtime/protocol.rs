//! What the agent and a pod monitor say to each other over the monitor's
//! Unix socket: one JSON object per line. Requests are answered in order;
//! exit events may arrive between answers.

use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Request {
    /// Run `<runtime> create` for a container, with its stdout and stderr
    /// going to the monitor, which logs them to `log_path`.
    Create {
        id: String,
        bundle: PathBuf,
        log_path: PathBuf,
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

pub const SOCKET: &str = "monitor.sock";
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
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        let m = Message::Reply {
            ok: true,
            error: String::new(),
            pid: Some(3),
        };
        let line = serde_json::to_string(&m).unwrap();
        assert_eq!(line, r#"{"reply":{"ok":true,"pid":3}}"#);
    }
}
