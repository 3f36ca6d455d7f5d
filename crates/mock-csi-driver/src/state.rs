//! The mock's in-memory world: volumes, which nodes each is published to, and
//! what the node service staged and published. Pure and synchronous: every
//! operation takes plain values and returns a result or an [`Error`] that maps
//! to the gRPC code the CSI specification asks for.

use std::collections::{BTreeMap, BTreeSet};

use attacher_hub::csi::proto::{self, volume_capability::access_mode::Mode};

use crate::snapshot::{AttachmentSnapshot, Snapshot, VolumeSnapshot};

/// Size given to a volume created without a capacity range: 1 GiB.
pub const DEFAULT_CAPACITY_BYTES: i64 = 1 << 30;

/// Prefix of `ListVolumes` tokens; anything else is refused with ABORTED.
const TOKEN_PREFIX: &str = "mock-next:";

/// A CSI rule a request broke; each variant states its gRPC code.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// A required field is empty: INVALID_ARGUMENT.
    #[error("{0} is required")]
    Missing(&'static str),
    /// A field has a value the mock does not accept: INVALID_ARGUMENT.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No volume with this ID: NOT_FOUND.
    #[error("volume {0:?} not found")]
    VolumeNotFound(String),
    /// The node ID is one the mock is told does not exist: NOT_FOUND.
    #[error("node {0:?} not found")]
    NodeNotFound(String),
    /// Published to the node already with another capability or readonly
    /// flag: ALREADY_EXISTS.
    #[error(
        "volume {volume:?} is already published to node {node:?} with an incompatible capability or readonly flag"
    )]
    IncompatiblePublish {
        /// Volume ID.
        volume: String,
        /// Node ID.
        node: String,
    },
    /// A single-node access mode, but the volume is published elsewhere:
    /// FAILED_PRECONDITION.
    #[error("volume {volume:?} is published to node {other:?} with a single-node access mode")]
    PublishedElsewhere {
        /// Volume ID.
        volume: String,
        /// The node that holds it.
        other: String,
    },
    /// The node already has the maximum number of volumes: RESOURCE_EXHAUSTED.
    #[error("node {node:?} already has {max} volumes published")]
    TooManyVolumes {
        /// Node ID.
        node: String,
        /// The limit.
        max: i64,
    },
    /// CreateVolume with an existing name but an incompatible size: ALREADY_EXISTS.
    #[error("volume {0:?} exists with an incompatible capacity")]
    NameConflict(String),
    /// The capacity range cannot be met: OUT_OF_RANGE.
    #[error("capacity range {required}..{limit} cannot be satisfied")]
    Capacity {
        /// Required bytes.
        required: i64,
        /// Limit bytes.
        limit: i64,
    },
    /// DeleteVolume of a volume that is still published: FAILED_PRECONDITION.
    #[error("volume {0:?} is still published")]
    InUse(String),
    /// A `starting_token` the mock never handed out: ABORTED.
    #[error("invalid starting_token {0:?}")]
    BadToken(String),
}

impl Error {
    /// The gRPC code for this error, per the CSI specification.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::Missing(_) | Error::Invalid { .. } => Code::InvalidArgument,
            Error::VolumeNotFound(_) | Error::NodeNotFound(_) => Code::NotFound,
            Error::IncompatiblePublish { .. } | Error::NameConflict(_) => Code::AlreadyExists,
            Error::PublishedElsewhere { .. } | Error::InUse(_) => Code::FailedPrecondition,
            Error::TooManyVolumes { .. } => Code::ResourceExhausted,
            Error::Capacity { .. } => Code::OutOfRange,
            Error::BadToken(_) => Code::Aborted,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// Result of a state operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Rules of the simulated storage system that do not change at run time.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// Most volumes one node may have published; 0 means no limit.
    pub max_volumes_per_node: i64,
    /// Node IDs starting with this prefix are reported as not existing
    /// (NOT_FOUND on publish); `None` accepts every node ID.
    pub missing_node_prefix: Option<String>,
    /// Whether PUBLISH_READONLY is advertised; if not, `readonly` is ignored.
    pub readonly: bool,
    /// Whether SINGLE_NODE_MULTI_WRITER is advertised; if not, the
    /// SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER modes are refused.
    pub single_node_multi_writer: bool,
}

/// One publication of a volume to a node.
#[derive(Debug, Clone, PartialEq)]
struct Attachment {
    capability: proto::VolumeCapability,
    readonly: bool,
}

/// A volume and everything published of it.
#[derive(Debug, Clone, Default)]
struct Volume {
    capacity_bytes: i64,
    volume_context: BTreeMap<String, String>,
    /// Node ID → publication.
    attachments: BTreeMap<String, Attachment>,
    /// Target paths given to NodePublishVolume.
    targets: BTreeSet<String>,
    /// Staging paths given to NodeStageVolume.
    staged: BTreeSet<String>,
}

impl Volume {
    fn to_proto(&self, id: &str) -> proto::Volume {
        proto::Volume {
            capacity_bytes: self.capacity_bytes,
            volume_id: id.to_string(),
            volume_context: self.volume_context.clone().into_iter().collect(),
            ..Default::default()
        }
    }

    fn published_node_ids(&self) -> Vec<String> {
        self.attachments.keys().cloned().collect()
    }
}

/// The whole in-memory world.
#[derive(Debug, Clone, Default)]
pub struct State {
    limits: Limits,
    /// Volume ID → volume. Volume IDs equal volume names. Sorted, so that
    /// pagination tokens survive deletions.
    volumes: BTreeMap<String, Volume>,
}

/// Is this a mode that allows one node only?
fn single_node(mode: i32) -> bool {
    matches!(
        Mode::try_from(mode),
        Ok(Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter)
    )
}

/// The access mode's name as the specification spells it, or its number.
pub fn mode_name(mode: i32) -> String {
    Mode::try_from(mode).map_or_else(|_| mode.to_string(), |m| m.as_str_name().to_string())
}

fn require(value: &str, field: &'static str) -> Result<()> {
    if value.is_empty() {
        Err(Error::Missing(field))
    } else {
        Ok(())
    }
}

impl State {
    /// An empty world with these limits.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            volumes: BTreeMap::new(),
        }
    }

    /// Adds volumes `vol-0` … `vol-<n-1>` of the default size.
    pub fn precreate(&mut self, n: usize) {
        for i in 0..n {
            self.volumes.insert(
                format!("vol-{i}"),
                Volume {
                    capacity_bytes: DEFAULT_CAPACITY_BYTES,
                    ..Default::default()
                },
            );
        }
    }

    fn check_capability(&self, cap: &proto::VolumeCapability) -> Result<()> {
        let mode = cap.access_mode.as_ref().map_or(0, |m| m.mode);
        let known = Mode::try_from(mode).map_err(|_| Error::Invalid {
            field: "volume_capability.access_mode",
            reason: format!("unknown mode {mode}"),
        })?;
        let ok = match known {
            Mode::Unknown => false,
            Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter => {
                self.limits.single_node_multi_writer
            }
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::Invalid {
                field: "volume_capability.access_mode",
                reason: format!("{} is not supported", known.as_str_name()),
            })
        }
    }

    /// CreateVolume: idempotent by name; the volume ID is the name.
    pub fn create_volume(&mut self, req: &proto::CreateVolumeRequest) -> Result<proto::Volume> {
        require(&req.name, "name")?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::Missing("volume_capabilities"));
        }
        for cap in &req.volume_capabilities {
            self.check_capability(cap)?;
        }
        let (required, limit) = req
            .capacity_range
            .as_ref()
            .map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 || (limit > 0 && limit < required) {
            return Err(Error::Capacity { required, limit });
        }
        if let Some(v) = self.volumes.get(&req.name) {
            let fits = v.capacity_bytes >= required && (limit == 0 || v.capacity_bytes <= limit);
            return if fits {
                Ok(v.to_proto(&req.name))
            } else {
                Err(Error::NameConflict(req.name.clone()))
            };
        }
        let capacity_bytes = if required > 0 {
            required
        } else if limit > 0 {
            limit.min(DEFAULT_CAPACITY_BYTES)
        } else {
            DEFAULT_CAPACITY_BYTES
        };
        let volume = Volume {
            capacity_bytes,
            volume_context: req
                .parameters
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            ..Default::default()
        };
        let out = volume.to_proto(&req.name);
        self.volumes.insert(req.name.clone(), volume);
        Ok(out)
    }

    /// DeleteVolume: OK for an unknown volume; refused while published.
    pub fn delete_volume(&mut self, volume_id: &str) -> Result<()> {
        require(volume_id, "volume_id")?;
        match self.volumes.get(volume_id) {
            None => Ok(()),
            Some(v) if !v.attachments.is_empty() => Err(Error::InUse(volume_id.to_string())),
            Some(_) => {
                self.volumes.remove(volume_id);
                Ok(())
            }
        }
    }

    /// ControllerPublishVolume: idempotent; returns the publish context.
    pub fn publish(
        &mut self,
        req: &proto::ControllerPublishVolumeRequest,
    ) -> Result<BTreeMap<String, String>> {
        require(&req.volume_id, "volume_id")?;
        require(&req.node_id, "node_id")?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or(Error::Missing("volume_capability"))?;
        self.check_capability(cap)?;
        let limits = self.limits.clone();
        let volume_id = req.volume_id.as_str();
        let node = req.node_id.as_str();
        if !self.volumes.contains_key(volume_id) {
            return Err(Error::VolumeNotFound(volume_id.to_string()));
        }
        if let Some(prefix) = &limits.missing_node_prefix
            && node.starts_with(prefix.as_str())
        {
            return Err(Error::NodeNotFound(node.to_string()));
        }
        let wanted = Attachment {
            capability: cap.clone(),
            readonly: req.readonly && limits.readonly,
        };
        let node_load = self
            .volumes
            .values()
            .filter(|v| v.attachments.contains_key(node))
            .count();
        let volume = self
            .volumes
            .get_mut(volume_id)
            .ok_or_else(|| Error::VolumeNotFound(volume_id.to_string()))?;
        let context =
            BTreeMap::from([("devicePath".to_string(), format!("/dev/mock/{volume_id}"))]);
        if let Some(existing) = volume.attachments.get(node) {
            return if *existing == wanted {
                Ok(context)
            } else {
                Err(Error::IncompatiblePublish {
                    volume: volume_id.to_string(),
                    node: node.to_string(),
                })
            };
        }
        let wanted_mode = cap.access_mode.as_ref().map_or(0, |m| m.mode);
        if let Some((other, _)) = volume.attachments.iter().find(|(_, a)| {
            single_node(wanted_mode)
                || single_node(a.capability.access_mode.as_ref().map_or(0, |m| m.mode))
        }) {
            return Err(Error::PublishedElsewhere {
                volume: volume_id.to_string(),
                other: other.clone(),
            });
        }
        let max = limits.max_volumes_per_node;
        if max > 0 && i64::try_from(node_load).unwrap_or(i64::MAX) >= max {
            return Err(Error::TooManyVolumes {
                node: node.to_string(),
                max,
            });
        }
        volume.attachments.insert(node.to_string(), wanted);
        Ok(context)
    }

    /// ControllerUnpublishVolume: OK when the volume or the publication is
    /// already gone (the external-attacher needs that to finish a detach);
    /// an empty node ID unpublishes from every node.
    pub fn unpublish(&mut self, volume_id: &str, node_id: &str) -> Result<()> {
        require(volume_id, "volume_id")?;
        if let Some(v) = self.volumes.get_mut(volume_id) {
            if node_id.is_empty() {
                v.attachments.clear();
            } else {
                v.attachments.remove(node_id);
            }
        }
        Ok(())
    }

    /// ValidateVolumeCapabilities: confirms what the mock supports.
    pub fn validate(
        &self,
        req: &proto::ValidateVolumeCapabilitiesRequest,
    ) -> Result<proto::ValidateVolumeCapabilitiesResponse> {
        require(&req.volume_id, "volume_id")?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::Missing("volume_capabilities"));
        }
        if !self.volumes.contains_key(&req.volume_id) {
            return Err(Error::VolumeNotFound(req.volume_id.clone()));
        }
        if let Some(err) = req
            .volume_capabilities
            .iter()
            .find_map(|c| self.check_capability(c).err())
        {
            return Ok(proto::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: err.to_string(),
            });
        }
        Ok(proto::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(proto::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context.clone(),
                volume_capabilities: req.volume_capabilities.clone(),
                parameters: req.parameters.clone(),
                ..Default::default()
            }),
            message: String::new(),
        })
    }

    /// ListVolumes, one page. The token names the first volume ID of the next
    /// page, so a deleted volume does not break paging.
    pub fn list(
        &self,
        max_entries: i32,
        starting_token: &str,
        with_nodes: bool,
    ) -> Result<proto::ListVolumesResponse> {
        if max_entries < 0 {
            return Err(Error::Invalid {
                field: "max_entries",
                reason: "must not be negative".to_string(),
            });
        }
        let start = if starting_token.is_empty() {
            ""
        } else {
            starting_token
                .strip_prefix(TOKEN_PREFIX)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| Error::BadToken(starting_token.to_string()))?
        };
        let page = if max_entries == 0 {
            usize::MAX
        } else {
            usize::try_from(max_entries).unwrap_or(usize::MAX)
        };
        let mut rest = self
            .volumes
            .range::<str, _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded));
        let entries = rest
            .by_ref()
            .take(page)
            .map(|(id, v)| proto::list_volumes_response::Entry {
                volume: Some(v.to_proto(id)),
                status: Some(proto::list_volumes_response::VolumeStatus {
                    published_node_ids: if with_nodes {
                        v.published_node_ids()
                    } else {
                        Vec::new()
                    },
                }),
            })
            .collect();
        let next_token = rest
            .next()
            .map(|(id, _)| format!("{TOKEN_PREFIX}{id}"))
            .unwrap_or_default();
        Ok(proto::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    /// ControllerGetVolume.
    pub fn get(&self, volume_id: &str) -> Result<proto::ControllerGetVolumeResponse> {
        require(volume_id, "volume_id")?;
        let v = self
            .volumes
            .get(volume_id)
            .ok_or_else(|| Error::VolumeNotFound(volume_id.to_string()))?;
        Ok(proto::ControllerGetVolumeResponse {
            volume: Some(v.to_proto(volume_id)),
            status: Some(proto::controller_get_volume_response::VolumeStatus {
                published_node_ids: v.published_node_ids(),
            }),
        })
    }

    /// The checks NodeStageVolume and NodePublishVolume share: volume ID,
    /// path and capability present and valid; the volume, if it exists.
    fn node_volume(
        &mut self,
        volume_id: &str,
        (path_field, path): (&'static str, &str),
        capability: Option<&proto::VolumeCapability>,
    ) -> Result<&mut Volume> {
        require(volume_id, "volume_id")?;
        require(path, path_field)?;
        let cap = capability.ok_or(Error::Missing("volume_capability"))?;
        self.check_capability(cap)?;
        self.volumes
            .get_mut(volume_id)
            .ok_or_else(|| Error::VolumeNotFound(volume_id.to_string()))
    }

    /// NodeStageVolume: records the staging path.
    pub fn stage(&mut self, req: &proto::NodeStageVolumeRequest) -> Result<()> {
        let v = self.node_volume(
            &req.volume_id,
            ("staging_target_path", &req.staging_target_path),
            req.volume_capability.as_ref(),
        )?;
        v.staged.insert(req.staging_target_path.clone());
        Ok(())
    }

    /// NodeUnstageVolume: forgets the staging path; OK if unknown.
    pub fn unstage(&mut self, volume_id: &str, staging_target_path: &str) -> Result<()> {
        require(volume_id, "volume_id")?;
        require(staging_target_path, "staging_target_path")?;
        if let Some(v) = self.volumes.get_mut(volume_id) {
            v.staged.remove(staging_target_path);
        }
        Ok(())
    }

    /// NodePublishVolume: checks the request and records the target path.
    pub fn node_publish(&mut self, req: &proto::NodePublishVolumeRequest) -> Result<()> {
        let v = self.node_volume(
            &req.volume_id,
            ("target_path", &req.target_path),
            req.volume_capability.as_ref(),
        )?;
        v.targets.insert(req.target_path.clone());
        Ok(())
    }

    /// NodeUnpublishVolume: forgets the target path; OK if unknown.
    pub fn node_unpublish(&mut self, volume_id: &str, target_path: &str) -> Result<()> {
        require(volume_id, "volume_id")?;
        require(target_path, "target_path")?;
        if let Some(v) = self.volumes.get_mut(volume_id) {
            v.targets.remove(target_path);
        }
        Ok(())
    }

    /// A serialisable picture of every volume and publication.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            volumes: self
                .volumes
                .iter()
                .map(|(id, v)| VolumeSnapshot {
                    volume_id: id.clone(),
                    capacity_bytes: v.capacity_bytes,
                    volume_context: v.volume_context.clone(),
                    attachments: v
                        .attachments
                        .iter()
                        .map(|(node, a)| AttachmentSnapshot {
                            node_id: node.clone(),
                            readonly: a.readonly,
                            access_mode: mode_name(
                                a.capability.access_mode.as_ref().map_or(0, |m| m.mode),
                            ),
                        })
                        .collect(),
                    staging_paths: v.staged.iter().cloned().collect(),
                    target_paths: v.targets.iter().cloned().collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::volume_capability::{AccessMode, AccessType, MountVolume};

    fn cap(mode: Mode) -> proto::VolumeCapability {
        proto::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    fn publish_req(
        vol: &str,
        node: &str,
        mode: Mode,
        ro: bool,
    ) -> proto::ControllerPublishVolumeRequest {
        proto::ControllerPublishVolumeRequest {
            volume_id: vol.into(),
            node_id: node.into(),
            volume_capability: Some(cap(mode)),
            readonly: ro,
            ..Default::default()
        }
    }

    fn world(limits: Limits, n: usize) -> State {
        let mut s = State::new(limits);
        s.precreate(n);
        s
    }

    fn readonly_limits() -> Limits {
        Limits {
            readonly: true,
            ..Default::default()
        }
    }

    #[test]
    fn publish_is_idempotent_and_incompatible_repeat_is_already_exists() {
        let mut s = world(readonly_limits(), 1);
        let r = publish_req("vol-0", "n1", Mode::SingleNodeWriter, false);
        let ctx = s.publish(&r).unwrap();
        assert_eq!(ctx["devicePath"], "/dev/mock/vol-0");
        assert_eq!(s.publish(&r).unwrap(), ctx);
        let ro = publish_req("vol-0", "n1", Mode::SingleNodeWriter, true);
        assert_eq!(
            s.publish(&ro).unwrap_err().code(),
            tonic::Code::AlreadyExists
        );
    }

    #[test]
    fn single_node_mode_on_a_second_node_is_failed_precondition() {
        let mut s = world(Limits::default(), 1);
        s.publish(&publish_req("vol-0", "n1", Mode::SingleNodeWriter, false))
            .unwrap();
        let e = s
            .publish(&publish_req("vol-0", "n2", Mode::SingleNodeWriter, false))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    }

    #[test]
    fn multi_node_mode_publishes_to_many_nodes_and_lists_them() {
        let mut s = world(Limits::default(), 2);
        for n in ["n2", "n1", "n3"] {
            s.publish(&publish_req("vol-1", n, Mode::MultiNodeMultiWriter, false))
                .unwrap();
        }
        s.unpublish("vol-1", "n3").unwrap();
        let page = s.list(0, "", true).unwrap();
        let nodes: Vec<_> = page
            .entries
            .iter()
            .map(|e| e.status.clone().unwrap_or_default().published_node_ids)
            .collect();
        assert_eq!(
            nodes,
            vec![vec![], vec!["n1".to_string(), "n2".to_string()]]
        );
        assert_eq!(
            s.get("vol-1")
                .unwrap()
                .status
                .unwrap_or_default()
                .published_node_ids,
            vec!["n1", "n2"]
        );
    }

    #[test]
    fn publish_errors_have_spec_codes() {
        let mut s = world(
            Limits {
                max_volumes_per_node: 1,
                missing_node_prefix: Some("gone-".into()),
                ..Default::default()
            },
            2,
        );
        let mut r = publish_req("vol-0", "n1", Mode::SingleNodeWriter, false);
        r.volume_id.clear();
        assert_eq!(
            s.publish(&r).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let mut r = publish_req("vol-0", "", Mode::SingleNodeWriter, false);
        assert_eq!(
            s.publish(&r).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        r.node_id = "n1".into();
        r.volume_capability = None;
        assert_eq!(
            s.publish(&r).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let r = publish_req("nope", "n1", Mode::SingleNodeWriter, false);
        assert_eq!(s.publish(&r).unwrap_err().code(), tonic::Code::NotFound);
        let r = publish_req("vol-0", "gone-1", Mode::SingleNodeWriter, false);
        assert_eq!(s.publish(&r).unwrap_err().code(), tonic::Code::NotFound);
        s.publish(&publish_req("vol-0", "n1", Mode::SingleNodeWriter, false))
            .unwrap();
        let r = publish_req("vol-1", "n1", Mode::SingleNodeWriter, false);
        assert_eq!(
            s.publish(&r).unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
    }

    #[test]
    fn unpublish_of_unknown_volume_or_node_is_ok() {
        let mut s = world(Limits::default(), 1);
        s.unpublish("nope", "n1").unwrap();
        s.unpublish("vol-0", "n1").unwrap();
        assert_eq!(
            s.unpublish("", "n1").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn list_pages_and_refuses_foreign_tokens() {
        let s = world(Limits::default(), 5);
        let mut token = String::new();
        let mut seen = Vec::new();
        loop {
            let page = s.list(2, &token, true).unwrap();
            seen.extend(
                page.entries
                    .into_iter()
                    .filter_map(|e| e.volume.map(|v| v.volume_id)),
            );
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        assert_eq!(seen, vec!["vol-0", "vol-1", "vol-2", "vol-3", "vol-4"]);
        assert_eq!(
            s.list(0, "invalid-token", true).unwrap_err().code(),
            tonic::Code::Aborted
        );
    }

    #[test]
    fn create_is_idempotent_by_name_and_checks_capacity() {
        let mut s = State::new(Limits::default());
        let mut r = proto::CreateVolumeRequest {
            name: "a".into(),
            volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
            capacity_range: Some(proto::CapacityRange {
                required_bytes: 10,
                limit_bytes: 10,
            }),
            ..Default::default()
        };
        let v = s.create_volume(&r).unwrap();
        assert_eq!(v.capacity_bytes, 10);
        assert_eq!(s.create_volume(&r).unwrap(), v);
        r.capacity_range = Some(proto::CapacityRange {
            required_bytes: 20,
            limit_bytes: 20,
        });
        assert_eq!(
            s.create_volume(&r).unwrap_err().code(),
            tonic::Code::AlreadyExists
        );
    }
}
