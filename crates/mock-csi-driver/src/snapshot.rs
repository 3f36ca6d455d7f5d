//! What the mock holds, as tests read it: every volume and where it is published.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Every volume and what is published of it, for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Volumes sorted by ID.
    pub volumes: Vec<VolumeSnapshot>,
}

impl Snapshot {
    /// The volume with this ID, if any.
    pub fn volume(&self, id: &str) -> Option<&VolumeSnapshot> {
        self.volumes.iter().find(|v| v.volume_id == id)
    }

    /// `(volume_id, node_id)` for every controller publication.
    pub fn attachments(&self) -> Vec<(String, String)> {
        self.volumes
            .iter()
            .flat_map(|v| {
                v.attachments
                    .iter()
                    .map(|a| (v.volume_id.clone(), a.node_id.clone()))
            })
            .collect()
    }
}

/// One volume in a [`Snapshot`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSnapshot {
    /// Volume ID (equal to its name).
    pub volume_id: String,
    /// Size in bytes.
    pub capacity_bytes: i64,
    /// Volume context handed out by CreateVolume.
    pub volume_context: BTreeMap<String, String>,
    /// Controller publications, sorted by node ID.
    pub attachments: Vec<AttachmentSnapshot>,
    /// Paths given to NodeStageVolume.
    pub staging_paths: Vec<String>,
    /// Paths given to NodePublishVolume.
    pub target_paths: Vec<String>,
}

/// One controller publication in a [`Snapshot`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentSnapshot {
    /// Node ID.
    pub node_id: String,
    /// Readonly flag as stored (false when PUBLISH_READONLY is off).
    pub readonly: bool,
    /// Access mode name, e.g. `SINGLE_NODE_WRITER`.
    pub access_mode: String,
}
