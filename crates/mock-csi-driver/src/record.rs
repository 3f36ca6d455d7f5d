//! The record of calls the mock received, so tests can check what arrived.
//!
//! This is a test tool: a record keeps the secrets exactly as received, so a
//! test can verify which secret a caller sent. Records are never logged.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use attacher_hub::csi::proto;

use crate::{fault, state::mode_name};

/// Most calls kept; older ones are dropped first. Large enough for any test
/// or benchmark run that reads the record, small enough to bound memory of a
/// long-running mock (a record is a few hundred bytes).
pub const MAX_RECORDS: usize = 100_000;

/// One RPC as received and answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// Short method name, e.g. `ControllerPublishVolume`.
    pub method: String,
    /// `volume_id` of the request, if it has one.
    pub volume_id: String,
    /// `node_id` of the request, if it has one.
    pub node_id: String,
    /// `readonly` of the request, if it has one.
    pub readonly: bool,
    /// Access mode name of the request's capability, e.g. `SINGLE_NODE_WRITER`.
    pub access_mode: String,
    /// `block`, `mount` or empty.
    pub access_type: String,
    /// File system type of a mount capability.
    pub fs_type: String,
    /// `volume_context` of the request.
    pub volume_context: BTreeMap<String, String>,
    /// Secrets exactly as received.
    pub secrets: BTreeMap<String, String>,
    /// The gRPC code answered (`Ok`, `NotFound`, …); `None` if the call was
    /// never answered (hung, connection closed, caller gave up).
    pub code: Option<String>,
    /// Milliseconds since the Unix epoch when the call arrived.
    pub time_unix_ms: u64,
}

impl CallRecord {
    /// A record of `method` with no request fields, stamped now.
    pub fn new(method: &str) -> Self {
        Self {
            method: method.to_string(),
            time_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            ..Default::default()
        }
    }

    /// Fills the capability fields.
    pub fn capability(mut self, cap: Option<&proto::VolumeCapability>) -> Self {
        use proto::volume_capability::AccessType;
        if let Some(cap) = cap {
            self.access_mode = mode_name(cap.access_mode.as_ref().map_or(0, |m| m.mode));
            match &cap.access_type {
                Some(AccessType::Block(_)) => self.access_type = "block".into(),
                Some(AccessType::Mount(m)) => {
                    self.access_type = "mount".into();
                    self.fs_type.clone_from(&m.fs_type);
                }
                None => {}
            }
        }
        self
    }

    /// Fills the volume and node IDs.
    pub fn ids(mut self, volume_id: &str, node_id: &str) -> Self {
        self.volume_id = volume_id.to_string();
        self.node_id = node_id.to_string();
        self
    }

    /// Fills secrets and volume context.
    pub fn maps(
        mut self,
        secrets: &std::collections::HashMap<String, String>,
        volume_context: &std::collections::HashMap<String, String>,
    ) -> Self {
        self.secrets = secrets
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.volume_context = volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self
    }

    /// The answered code as a [`tonic::Code`], if answered.
    pub fn grpc_code(&self) -> Option<tonic::Code> {
        self.code.as_deref().and_then(|c| fault::parse_code(c).ok())
    }
}

/// The shared, bounded list of records.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    calls: Arc<Mutex<std::collections::VecDeque<CallRecord>>>,
}

impl Recorder {
    /// Appends a record, dropping the oldest beyond [`MAX_RECORDS`].
    pub fn push(&self, rec: CallRecord) {
        let mut calls = self.calls.lock();
        if calls.len() >= MAX_RECORDS {
            calls.pop_front();
        }
        calls.push_back(rec);
    }

    /// All records, oldest first.
    pub fn all(&self) -> Vec<CallRecord> {
        self.calls.lock().iter().cloned().collect()
    }

    /// Forgets every record.
    pub fn reset(&self) {
        self.calls.lock().clear();
    }
}

/// Records a call when dropped: with the code set by [`CallGuard::finish`],
/// or with no code if the call was abandoned (hang, closed connection).
#[derive(Debug)]
pub(crate) struct CallGuard {
    rec: Option<CallRecord>,
    recorder: Recorder,
}

impl CallGuard {
    pub(crate) fn new(recorder: Recorder, rec: CallRecord) -> Self {
        Self {
            rec: Some(rec),
            recorder,
        }
    }

    pub(crate) fn record(&self) -> Option<&CallRecord> {
        self.rec.as_ref()
    }

    pub(crate) fn finish(&mut self, code: tonic::Code) {
        if let Some(rec) = self.rec.as_mut() {
            rec.code = Some(fault::code_name(code).to_string());
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(rec) = self.rec.take() {
            self.recorder.push(rec);
        }
    }
}
