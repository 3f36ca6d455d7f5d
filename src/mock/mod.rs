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
//! # async fn demo() -> Result<(), attacher_hub::mock::Error> {
//! use attacher_hub::mock::{MockDriver, fault::Fault};
//! let handle = MockDriver::new("mock.csi.example.com")
//!     .volumes(4)
//!     .serve("/tmp/mock.sock")
//!     .await?;
//! handle.set_fault("ControllerPublishVolume", Fault::code(tonic::Code::Unavailable));
//! handle.stop().await; // drop every connection, remove the socket
//! handle.restart().await?; // serve again on the same path
//! # Ok(()) }
//! ```

pub mod control;
mod driver;
pub mod fault;
pub mod record;
mod service;
pub mod state;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use record::CallRecord;
pub use state::Snapshot;

use driver::{Command, Shared, lock};

/// Why the mock could not start or restart.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint or control socket could not be bound.
    #[error("binding {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The serving task is gone (the handle was shut down).
    #[error("the mock has shut down")]
    Gone,
}

/// Which capabilities the mock advertises (and honours).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Plugin capability CONTROLLER_SERVICE.
    pub controller_service: bool,
    /// PUBLISH_UNPUBLISH_VOLUME; without it ControllerPublish/Unpublish are UNIMPLEMENTED.
    pub publish_unpublish: bool,
    /// PUBLISH_READONLY; without it `readonly` is ignored.
    pub publish_readonly: bool,
    /// LIST_VOLUMES; without it ListVolumes is UNIMPLEMENTED.
    pub list_volumes: bool,
    /// LIST_VOLUMES_PUBLISHED_NODES; without it `published_node_ids` stay empty.
    pub list_volumes_published_nodes: bool,
    /// SINGLE_NODE_MULTI_WRITER (controller and node).
    pub single_node_multi_writer: bool,
    /// Node STAGE_UNSTAGE_VOLUME.
    pub stage_unstage: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            controller_service: true,
            publish_unpublish: true,
            publish_readonly: true,
            list_volumes: true,
            list_volumes_published_nodes: true,
            single_node_multi_writer: false,
            stage_unstage: true,
        }
    }
}

/// What the `exit:` fault does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExitMode {
    /// Stop serving for good but keep the process (the default in-process,
    /// where exiting would end the test run).
    #[default]
    StopServing,
    /// End the process with the fault's status (the binary).
    Process,
}

/// Everything the mock is started with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Driver name returned by GetPluginInfo.
    pub name: String,
    /// Vendor version returned by GetPluginInfo.
    pub vendor_version: String,
    /// Node ID returned by NodeGetInfo.
    pub node_id: String,
    /// Volumes `vol-0` … `vol-<n-1>` created at start.
    pub volumes: usize,
    /// Per-node volume limit (NodeGetInfo and publish); 0 means none.
    pub max_volumes_per_node: i64,
    /// GetCapacity's available capacity.
    pub capacity_bytes: i64,
    /// Advertised capabilities.
    pub capabilities: Capabilities,
    /// Probe answers `ready=false` for this long after start.
    pub not_ready_for: Option<Duration>,
    /// Faults in place at start.
    pub faults: Vec<fault::Rule>,
    /// Node IDs with this prefix do not exist (publish → NOT_FOUND).
    pub missing_node_prefix: Option<String>,
    /// What the `exit:` fault does.
    pub exit: ExitMode,
}

impl Config {
    /// A configuration with defaults for driver `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            node_id: "mock-node".to_string(),
            volumes: 0,
            max_volumes_per_node: 0,
            capacity_bytes: 1 << 40,
            capabilities: Capabilities::default(),
            not_ready_for: None,
            faults: Vec::new(),
            missing_node_prefix: None,
            exit: ExitMode::StopServing,
        }
    }

    fn limits(&self) -> state::Limits {
        state::Limits {
            max_volumes_per_node: self.max_volumes_per_node,
            missing_node_prefix: self.missing_node_prefix.clone(),
            readonly: self.capabilities.publish_readonly,
            single_node_multi_writer: self.capabilities.single_node_multi_writer,
        }
    }
}

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
        let listener = driver::bind(&path)?;
        let ctl_listener = driver::bind(&ctl_path)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::new(self.config, tx.clone()));
        let shutdown = CancellationToken::new();
        let supervisor = tokio::spawn(driver::supervise(
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
        lock(&self.shared.state).snapshot()
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
