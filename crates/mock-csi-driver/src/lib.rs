//! The project's mock CSI driver (`mock-csi-driver`): in-memory volumes and
//! attachments on any number of nodes, capability switches and fault injection.
//!
//! ```text
//!  tests / csi-sanity ──gRPC (UDS)──▶ Identity/Controller/Node ──▶ State (volumes, attachments)
//!                                         │ record + fault per call
//!  tests ──NDJSON (<endpoint>.ctl)──▶ control: faults, readiness, calls, state
//! ```
//!
//! Run it as the `mock-csi-driver` binary, or inside a test process:
//!
//! ```no_run
//! # async fn demo() -> Result<(), mock_csi_driver::Error> {
//! use mock_csi_driver::{MockDriver, fault::Fault};
//! let handle = MockDriver::new("mock.csi.example.com")
//!     .volumes(4)
//!     .serve("/tmp/mock.sock")
//!     .await?;
//! handle.set_fault("ControllerPublishVolume", Fault::code(tonic::Code::Unavailable));
//! handle.stop().await; // drop every connection, remove the socket
//! handle.restart().await?; // serve again on the same path
//! # Ok(()) }
//! ```

mod config;
pub mod control;
mod error;
pub mod fault;
pub mod record;
mod server;
mod service;
mod shared;
pub mod snapshot;
pub mod state;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use config::{Capabilities, Config, ExitMode};
pub use error::Error;
pub use record::CallRecord;
pub use snapshot::Snapshot;

use shared::{Command, Shared};

/// Builder of an in-process mock driver.
#[derive(Debug, Clone)]
pub struct MockDriver {
    config: Config,
}

impl MockDriver {
    /// A mock named `name` with default settings.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            config: Config::new(name),
        }
    }

    /// A mock with this configuration.
    pub fn from_config(config: Config) -> Self {
        Self { config }
    }

    /// Pre-creates volumes `vol-0` … `vol-<n-1>`.
    #[must_use]
    pub fn volumes(mut self, n: usize) -> Self {
        self.config.volumes = n;
        self
    }

    /// Node ID returned by NodeGetInfo.
    #[must_use]
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.config.node_id = id.into();
        self
    }

    /// Per-node volume limit.
    #[must_use]
    pub fn max_volumes_per_node(mut self, n: i64) -> Self {
        self.config.max_volumes_per_node = n;
        self
    }

    /// Advertised capabilities.
    #[must_use]
    pub fn capabilities(mut self, caps: Capabilities) -> Self {
        self.config.capabilities = caps;
        self
    }

    /// Probe says not ready for this long after start.
    #[must_use]
    pub fn not_ready_for(mut self, d: Duration) -> Self {
        self.config.not_ready_for = Some(d);
        self
    }

    /// Adds a fault in place at start.
    #[must_use]
    pub fn fault(mut self, method: impl Into<String>, fault: fault::Fault) -> Self {
        self.config.faults.push(fault::Rule {
            method: method.into(),
            fault,
        });
        self
    }

    /// The configuration so far.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Binds `path` (and `<path>.ctl`) and serves until the handle is shut
    /// down or dropped. Returns once both sockets listen.
    pub async fn serve(self, path: impl AsRef<Path>) -> Result<MockHandle, Error> {
        let path = path.as_ref().to_path_buf();
        let ctl_path = control::control_path(&path);
        let listener = server::bind(&path)?;
        let ctl_listener = server::bind(&ctl_path)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::new(self.config, tx.clone()));
        let shutdown = CancellationToken::new();
        let supervisor = tokio::spawn(server::supervise(
            shared.clone(),
            path.clone(),
            listener,
            rx,
            shutdown.clone(),
        ));
        tokio::spawn(control::serve(
            ctl_listener,
            shared.clone(),
            shutdown.clone(),
        ));
        tracing::info!(endpoint = %path.display(), control = %ctl_path.display(), "mock CSI driver listening");
        Ok(MockHandle {
            shared,
            path,
            ctl_path,
            commands: tx,
            shutdown,
            supervisor: Some(supervisor),
        })
    }
}

/// A running mock. Dropping it stops serving and removes both sockets.
#[derive(Debug)]
pub struct MockHandle {
    shared: Arc<Shared>,
    path: PathBuf,
    ctl_path: PathBuf,
    commands: mpsc::UnboundedSender<Command>,
    shutdown: CancellationToken,
    supervisor: Option<tokio::task::JoinHandle<()>>,
}

impl MockHandle {
    /// The gRPC endpoint path.
    pub fn endpoint(&self) -> &Path {
        &self.path
    }

    /// The control socket path (`<endpoint>.ctl`).
    pub fn control_path(&self) -> &Path {
        &self.ctl_path
    }

    /// Stops serving: every connection is dropped and the socket removed.
    /// The control socket and the state stay.
    pub async fn stop(&self) {
        let (ack, done) = oneshot::channel();
        if self
            .commands
            .send(Command::Stop {
                restart_after: None,
                ack: Some(ack),
            })
            .is_ok()
        {
            let _ = done.await;
        }
    }

    /// Serves again on the same path (no-op when serving, except that
    /// existing connections are dropped).
    pub async fn restart(&self) -> Result<(), Error> {
        let (ack, done) = oneshot::channel();
        self.commands
            .send(Command::Start { ack: Some(ack) })
            .map_err(|_| Error::Gone)?;
        done.await.map_err(|_| Error::Gone)?
    }

    /// Stops everything and waits for the serving task to end.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.supervisor.take() {
            let _ = task.await;
        }
        let _ = std::fs::remove_file(&self.ctl_path);
    }

    /// Sets (replaces) the fault of `method` (`*` for all).
    pub fn set_fault(&self, method: &str, fault: fault::Fault) {
        self.shared.set_fault(method, fault);
    }

    /// Clears every fault.
    pub fn clear_faults(&self) {
        self.shared.clear_faults(None);
    }

    /// Forces what Probe answers.
    pub fn set_ready(&self, ready: bool) {
        self.shared.set_ready(ready);
    }

    /// The call record, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.shared.recorder.all()
    }

    /// Empties the call record.
    pub fn reset_calls(&self) {
        self.shared.recorder.reset();
    }

    /// Volumes and attachments.
    pub fn state(&self) -> Snapshot {
        self.shared.state.lock().snapshot()
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if self.supervisor.is_some() {
            // The serving task removes the endpoint when it sees the cancel;
            // the control socket file is ours to remove.
            let _ = std::fs::remove_file(&self.ctl_path);
        }
    }
}
