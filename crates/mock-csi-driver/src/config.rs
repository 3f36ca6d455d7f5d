//! What the mock is started with: its name, volumes, limits, capabilities,
//! faults and what an `exit:` fault does.

use std::time::Duration;

use crate::{fault, state};

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

    pub(crate) fn limits(&self) -> state::Limits {
        state::Limits {
            max_volumes_per_node: self.max_volumes_per_node,
            missing_node_prefix: self.missing_node_prefix.clone(),
            readonly: self.capabilities.publish_readonly,
            single_node_multi_writer: self.capabilities.single_node_multi_writer,
        }
    }
}
