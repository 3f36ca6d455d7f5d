//! The mock's control socket and its typed client.
//!
//! The control socket sits next to the endpoint (`<endpoint>.ctl`) and speaks
//! newline-delimited JSON: one request object per line, one response object
//! per line, in order. Requests are tagged by `cmd`:
//!
//! ```text
//! {"cmd":"set_fault","method":"ControllerPublishVolume","fault":"code:Unavailable"}
//! {"cmd":"clear_faults"}                       {"cmd":"clear_faults","method":"Probe"}
//! {"cmd":"get_faults"}
//! {"cmd":"set_ready","ready":false}
//! {"cmd":"get_calls"}                          {"cmd":"reset_calls"}
//! {"cmd":"get_state"}
//! ```
//!
//! Responses are tagged by `result`: `{"result":"ok"}`,
//! `{"result":"calls","calls":[…]}`, `{"result":"state","state":{…}}`,
//! `{"result":"faults","faults":["Probe=hang"]}` or
//! `{"result":"error","message":"…"}`. The fault text uses the grammar of
//! [`fault`](crate::fault).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader},
    net::{
        UnixListener, UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
};
use tokio_util::sync::CancellationToken;

use crate::{fault::Fault, record::CallRecord, shared::Shared, snapshot::Snapshot};

/// Longest request line the control socket accepts, in bytes. Requests are
/// tiny; the bound keeps a confused peer from growing memory without end.
const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// A control request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Sets (replaces) the fault of one method (`*` for every method).
    SetFault {
        /// Short RPC method name or `*`.
        method: String,
        /// The fault.
        fault: Fault,
    },
    /// Clears the fault of `method`, or every fault when absent.
    ClearFaults {
        /// Short RPC method name or `*`; absent clears all.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
    },
    /// Lists the faults in place.
    GetFaults,
    /// Forces what Probe answers.
    SetReady {
        /// Probe's `ready`.
        ready: bool,
    },
    /// Returns the call record.
    GetCalls,
    /// Empties the call record.
    ResetCalls,
    /// Returns volumes and attachments.
    GetState,
}

/// A control response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Done.
    Ok,
    /// The call record, oldest first.
    Calls {
        /// Records.
        calls: Vec<CallRecord>,
    },
    /// Volumes and attachments.
    State {
        /// The snapshot.
        state: Snapshot,
    },
    /// Faults in place as `METHOD=FAULT`.
    Faults {
        /// Rules.
        faults: Vec<String>,
    },
    /// The request failed.
    Error {
        /// Why.
        message: String,
    },
}

/// Why a control request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting to the control socket failed; the mock may not run.
    #[error("connecting to control socket {path}")]
    Connect {
        /// Control socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the socket failed.
    #[error("control socket I/O")]
    Io(#[from] std::io::Error),
    /// A message could not be encoded or decoded.
    #[error("control message encoding")]
    Json(#[from] serde_json::Error),
    /// The mock closed the connection before answering.
    #[error("control socket closed before the answer")]
    Closed,
    /// The mock refused the request.
    #[error("mock refused the request: {0}")]
    Refused(String),
    /// The answer does not fit the request.
    #[error("unexpected answer {0:?}")]
    Unexpected(Box<Response>),
}

/// Result of a control request.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The control socket path for an endpoint path: `<endpoint>.ctl`.
pub fn control_path(endpoint: &Path) -> PathBuf {
    let mut s = endpoint.as_os_str().to_os_string();
    s.push(".ctl");
    PathBuf::from(s)
}

/// Runs one request against the mock.
pub(crate) fn execute(shared: &Shared, req: Request) -> Response {
    match req {
        Request::SetFault { method, fault } => {
            tracing::info!(%method, %fault, "control: set fault");
            shared.set_fault(&method, fault);
            Response::Ok
        }
        Request::ClearFaults { method } => {
            tracing::info!(
                method = method.as_deref().unwrap_or("all"),
                "control: clear faults"
            );
            shared.clear_faults(method.as_deref());
            Response::Ok
        }
        Request::GetFaults => Response::Faults {
            faults: shared.faults(),
        },
        Request::SetReady { ready } => {
            tracing::info!(ready, "control: set ready");
            shared.set_ready(ready);
            Response::Ok
        }
        Request::GetCalls => Response::Calls {
            calls: shared.recorder.all(),
        },
        Request::ResetCalls => {
            shared.recorder.reset();
            Response::Ok
        }
        Request::GetState => Response::State {
            state: shared.state.lock().snapshot(),
        },
    }
}

/// Serves the control socket until `shutdown` is cancelled.
pub(crate) async fn serve(
    listener: UnixListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => r,
            () = shutdown.cancelled() => return,
        };
        match stream {
            Ok((stream, _)) => {
                let shared = shared.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        r = session(stream, &shared) => {
                            if let Err(error) = r {
                                tracing::debug!(%error, "control session ended");
                            }
                        }
                        () = shutdown.cancelled() => {}
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "control socket accept failed");
                return;
            }
        }
    }
}

async fn session(stream: UnixStream, shared: &Shared) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut read)
            .take(MAX_REQUEST_BYTES)
            .read_line(&mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        let resp = match serde_json::from_str::<Request>(&line) {
            Ok(req) => execute(shared, req),
            Err(e) => Response::Error {
                message: format!("bad request: {e}"),
            },
        };
        let mut out = serde_json::to_vec(&resp).map_err(std::io::Error::other)?;
        out.push(b'\n');
        write.write_all(&out).await?;
    }
}

/// A typed client of the control socket.
///
/// ```no_run
/// # async fn demo() -> Result<(), mock_csi_driver::control::Error> {
/// use mock_csi_driver::{control::Client, fault::Fault};
/// let mut ctl = Client::connect("/tmp/mock.sock.ctl").await?;
/// ctl.set_fault("ControllerPublishVolume", Fault::code(tonic::Code::Unavailable)).await?;
/// let calls = ctl.calls().await?;
/// ctl.clear_faults().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Client {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl Client {
    /// Connects to a control socket (see [`control_path`]).
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| Error::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let (read, write) = stream.into_split();
        Ok(Self {
            read: BufReader::new(read),
            write,
        })
    }

    /// Connects to the control socket of the mock serving `endpoint`.
    pub async fn for_endpoint(endpoint: impl AsRef<Path>) -> Result<Self> {
        Self::connect(control_path(endpoint.as_ref())).await
    }

    /// Sends one request and reads its response.
    pub async fn request(&mut self, req: &Request) -> Result<Response> {
        let mut out = serde_json::to_vec(req)?;
        out.push(b'\n');
        self.write.write_all(&out).await?;
        let mut line = String::new();
        if self.read.read_line(&mut line).await? == 0 {
            return Err(Error::Closed);
        }
        match serde_json::from_str(&line)? {
            Response::Error { message } => Err(Error::Refused(message)),
            other => Ok(other),
        }
    }

    async fn expect_ok(&mut self, req: &Request) -> Result<()> {
        match self.request(req).await? {
            Response::Ok => Ok(()),
            other => Err(Error::Unexpected(Box::new(other))),
        }
    }

    /// Sets the fault of `method` (`*` for all).
    pub async fn set_fault(&mut self, method: &str, fault: Fault) -> Result<()> {
        self.expect_ok(&Request::SetFault {
            method: method.to_string(),
            fault,
        })
        .await
    }

    /// Clears every fault.
    pub async fn clear_faults(&mut self) -> Result<()> {
        self.expect_ok(&Request::ClearFaults { method: None }).await
    }

    /// Clears the fault of one method.
    pub async fn clear_fault(&mut self, method: &str) -> Result<()> {
        self.expect_ok(&Request::ClearFaults {
            method: Some(method.to_string()),
        })
        .await
    }

    /// The faults in place as `METHOD=FAULT`.
    pub async fn faults(&mut self) -> Result<Vec<String>> {
        match self.request(&Request::GetFaults).await? {
            Response::Faults { faults } => Ok(faults),
            other => Err(Error::Unexpected(Box::new(other))),
        }
    }

    /// Forces Probe's `ready`.
    pub async fn set_ready(&mut self, ready: bool) -> Result<()> {
        self.expect_ok(&Request::SetReady { ready }).await
    }

    /// The call record, oldest first.
    pub async fn calls(&mut self) -> Result<Vec<CallRecord>> {
        match self.request(&Request::GetCalls).await? {
            Response::Calls { calls } => Ok(calls),
            other => Err(Error::Unexpected(Box::new(other))),
        }
    }

    /// Empties the call record.
    pub async fn reset_calls(&mut self) -> Result<()> {
        self.expect_ok(&Request::ResetCalls).await
    }

    /// Volumes and attachments.
    pub async fn state(&mut self) -> Result<Snapshot> {
        match self.request(&Request::GetState).await? {
            Response::State { state } => Ok(state),
            other => Err(Error::Unexpected(Box::new(other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_json_shape() {
        let r: Request = serde_json::from_str(
            r#"{"cmd":"set_fault","method":"ControllerPublishVolume","fault":"every:3:Unavailable"}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Request::SetFault {
                method: "ControllerPublishVolume".into(),
                fault: Fault::every(3, tonic::Code::Unavailable),
            }
        );
        let r: Request = serde_json::from_str(r#"{"cmd":"clear_faults"}"#).unwrap();
        assert_eq!(r, Request::ClearFaults { method: None });
        assert_eq!(
            serde_json::to_string(&Response::Ok).unwrap(),
            r#"{"result":"ok"}"#
        );
        assert!(
            serde_json::from_str::<Request>(r#"{"cmd":"set_fault","method":"X","fault":"bogus"}"#)
                .is_err()
        );
    }

    #[test]
    fn control_path_appends_ctl() {
        assert_eq!(
            control_path(Path::new("/tmp/a.sock")),
            PathBuf::from("/tmp/a.sock.ctl")
        );
    }
}
