//! Pure helpers of the attach/detach handler, the counterpart of external-attacher's
//! `pkg/controller/util.go` plus the decisions of `csi_handler.go` (spec §3).
//!
//! Nothing here performs I/O: callers pass the objects they read from the caches and get back
//! names, node IDs, CSI capabilities, PATCH bodies and yes/no decisions. Error `Display` strings
//! are exactly the texts external-attacher writes into `status.attachError` / `detachError`.
//! None of these errors is final: the caller saves the text and retries with backoff.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, SecretReference,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment, VolumeAttachmentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};

use crate::csi::proto;
use proto::volume_capability::access_mode::Mode;

/// VA annotation holding the CSI node ID used for the attach; the last-resort node-ID source for
/// detach and reconcile (spec §3.2).
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

/// PV annotation naming the CSI driver an in-tree PV was migrated to (spec §3.2, §3.10).
pub const MIGRATED_TO_ANNOTATION: &str = "pv.kubernetes.io/migrated-to";

/// Prefix of the finalizer put on VolumeAttachments and PersistentVolumes.
pub const FINALIZER_PREFIX: &str = "external-attacher/";

/// Prefix of the leader-election Lease name, before sanitizing.
const LEASE_PREFIX: &str = "external-attacher-leader-";

/// `spec.volumeMode` value selecting a raw block capability.
const VOLUME_MODE_BLOCK: &str = "Block";

// === names ===

/// Replaces every character outside `[a-zA-Z0-9-]` by `-` and appends `X` if the result ends
/// with `-` (external-attacher's `SanitizeDriverName`). Case is kept; length is not checked.
pub fn sanitize_driver_name(driver: &str) -> String {
    let mut out: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// The finalizer this driver puts on VAs and PVs: `external-attacher/<sanitized driver>`.
pub fn finalizer_name(driver: &str) -> String {
    format!("{FINALIZER_PREFIX}{}", sanitize_driver_name(driver))
}

/// The leader-election Lease name: `external-attacher-leader-<driver>`, sanitized as a whole.
pub fn lease_name(driver: &str) -> String {
    sanitize_driver_name(&format!("{LEASE_PREFIX}{driver}"))
}

// === node ID ===

/// Why no CSI node ID could be found (spec §3.3).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdError {
    /// No CSINode object exists for the node (and the VA carries no node-ID annotation).
    #[error("csinode.storage.k8s.io \"{node}\" not found")]
    CsiNodeNotFound {
        /// The node name from `va.spec.nodeName`.
        node: String,
    },
    /// The CSINode exists but the driver is not registered on it (node plugin not running).
    #[error("CSINode {node} does not contain driver {driver}")]
    DriverNotOnNode {
        /// The node name from `va.spec.nodeName`.
        node: String,
        /// The driver looked for.
        driver: String,
    },
}

/// Resolves the CSI node ID of `driver` on `node_name` (external-attacher's `getNodeID`).
///
/// `csinode` is the CSINode named `node_name` from the cache, if any. The VA's
/// [`NODE_ID_ANNOTATION`] is used only when the CSINode cannot answer and a VA is given: detach
/// and reconcile pass it, attach passes `None` and so requires a current CSINode entry.
pub fn node_id(
    driver: &str,
    node_name: &str,
    csinode: Option<&CSINode>,
    va: Option<&VolumeAttachment>,
) -> Result<String, NodeIdError> {
    let err = match csinode {
        Some(csinode) => {
            let entry = csinode
                .spec
                .drivers
                .iter()
                .find(|d| d.name == driver)
                .map(|d| d.node_id.clone());
            if let Some(id) = entry {
                return Ok(id);
            }
            NodeIdError::DriverNotOnNode {
                node: node_name.to_owned(),
                driver: driver.to_owned(),
            }
        }
        None => NodeIdError::CsiNodeNotFound {
            node: node_name.to_owned(),
        },
    };
    // As in Go, an annotation that is present but empty still counts as found.
    va.and_then(|va| va.metadata.annotations.as_ref())
        .and_then(|a| a.get(NODE_ID_ANNOTATION))
        .cloned()
        .ok_or(err)
}

// === access modes ===

/// PV access modes CSI cannot express (spec §3.4, csi-lib-utils `accessmodes`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessModeError {
    /// ReadWriteOncePod together with any other mode.
    #[error(
        "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume"
    )]
    ReadWriteOncePodWithOthers,
    /// ReadOnlyMany together with ReadWriteOnce (and no ReadWriteMany).
    #[error("CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume")]
    ReadOnlyManyAndReadWriteOnce,
    /// No known mode (or an empty list); formatted like Go's `%v` of the PV's list.
    #[error("unsupported AccessMode combination: [{}]", .modes.join(" "))]
    Unsupported {
        /// The PV's `spec.accessModes`, as given.
        modes: Vec<String>,
    },
}

/// Maps a PV's `spec.accessModes` to the one CSI access mode sent (spec §3.4 table).
///
/// Duplicates are ignored. `supports_single_node_multi_writer` is the driver's
/// `SINGLE_NODE_MULTI_WRITER` controller capability.
pub fn access_mode(
    pv_modes: &[String],
    supports_single_node_multi_writer: bool,
) -> Result<Mode, AccessModeError> {
    let has = |m: &str| pv_modes.iter().any(|x| x == m);
    let distinct = {
        let mut v: Vec<&str> = pv_modes.iter().map(String::as_str).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    if has("ReadWriteOncePod") {
        if distinct > 1 {
            return Err(AccessModeError::ReadWriteOncePodWithOthers);
        }
        return Ok(if supports_single_node_multi_writer {
            Mode::SingleNodeSingleWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    if has("ReadWriteMany") {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    match (has("ReadOnlyMany"), has("ReadWriteOnce")) {
        (true, true) => Err(AccessModeError::ReadOnlyManyAndReadWriteOnce),
        (true, false) => Ok(Mode::MultiNodeReaderOnly),
        (false, true) if supports_single_node_multi_writer => Ok(Mode::SingleNodeMultiWriter),
        (false, true) => Ok(Mode::SingleNodeWriter),
        (false, false) => Err(AccessModeError::Unsupported {
            modes: pv_modes.to_vec(),
        }),
    }
}

// === errors ===

/// Why the volume of a VA could not be resolved into a CSI volume (spec §3.4, §3.5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The VA names a PV and carries an inline spec.
    #[error("both InlineCSIVolumeSource and PersistentVolumeName specified in VA source")]
    BothSources,
    /// The VA names neither a PV nor an inline spec.
    #[error("neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source")]
    NoSource,
    /// The VA's inline spec has no `csi` source.
    #[error("inline volume spec contains nil CSI source")]
    InlineWithoutCsi,
    /// The PV named by the VA is not in the cache.
    #[error("persistentvolume \"{name}\" not found")]
    PvNotFound {
        /// `va.spec.source.persistentVolumeName`.
        name: String,
    },
    /// Attach refused: the PV has a deletionTimestamp.
    #[error("PersistentVolume \"{name}\" is marked for deletion")]
    PvMarkedForDeletion {
        /// The PV's name.
        name: String,
    },
    /// The PV is neither CSI nor an in-tree volume that can be translated.
    #[error("pv spec contained non-csi source that was not migrated")]
    NotCsi,
    /// A capability was asked for a spec without CSI source.
    #[error("could not get volume capabilities, pvSpec.CSI is nil")]
    CapabilityWithoutCsi,
    /// The PV's access modes cannot be expressed in CSI.
    #[error(transparent)]
    AccessMode(#[from] AccessModeError),
    /// An AWS EBS volumeID that is neither `vol-…` nor `aws://<zone>/vol-…`.
    #[error(
        "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume ({id})"
    )]
    InvalidEbsVolumeId {
        /// The in-tree `volumeID`.
        id: String,
    },
    /// A GCE PD PV whose zone label lists zones of different (or no) regions.
    #[error("failed to get region from zones {zones:?}")]
    GceRegion {
        /// The zones from the PV's zone label.
        zones: Vec<String>,
    },
}

impl Error {
    /// A bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::BothSources => "both_sources",
            Self::NoSource => "no_source",
            Self::InlineWithoutCsi => "inline_without_csi",
            Self::PvNotFound { .. } => "pv_not_found",
            Self::PvMarkedForDeletion { .. } => "pv_marked_for_deletion",
            Self::NotCsi => "not_csi",
            Self::CapabilityWithoutCsi => "capability_without_csi",
            Self::AccessMode(_) => "access_mode",
            Self::InvalidEbsVolumeId { .. } | Self::GceRegion { .. } => "translation",
        }
    }
}

/// Result of this module's fallible helpers.
pub type Result<T, E = Error> = std::result::Result<T, E>;

// === volume source ===

/// Where a VA's volume comes from (`spec.source`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Source<'a> {
    /// `spec.source.persistentVolumeName`: look the PV up in the cache.
    PersistentVolume(&'a str),
    /// `spec.source.inlineVolumeSpec`, produced by kube-controller-manager for migrated inline
    /// volumes; its `csi` field is set (checked).
    Inline(&'a PersistentVolumeSpec),
}

/// Reads and checks `va.spec.source` (spec §3.4).
pub fn va_source(va: &VolumeAttachment) -> Result<Source<'_>> {
    let source = &va.spec.source;
    match (&source.persistent_volume_name, &source.inline_volume_spec) {
        (Some(_), Some(_)) => Err(Error::BothSources),
        (Some(name), None) => Ok(Source::PersistentVolume(name)),
        (None, Some(spec)) if spec.csi.is_some() => Ok(Source::Inline(spec)),
        (None, Some(_)) => Err(Error::InlineWithoutCsi),
        (None, None) => Err(Error::NoSource),
    }
}

/// Refuses to attach a PV that is being deleted (spec §3.5 step 2.1).
pub fn check_pv_attachable(pv: &PersistentVolume) -> Result<()> {
    if pv.metadata.deletion_timestamp.is_some() {
        return Err(Error::PvMarkedForDeletion {
            name: pv.metadata.name.clone().unwrap_or_default(),
        });
    }
    Ok(())
}

/// A volume ready to be published: a spec whose `csi` source is set.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// The PV's spec, translated to CSI if it was in-tree, or the VA's inline spec.
    pub spec: PersistentVolumeSpec,
    /// True for translated in-tree PVs and for inline specs (the `migrated` metric label, and
    /// the reconciler's handle repair).
    pub migrated: bool,
}

impl Volume {
    /// The CSI source of the volume.
    pub fn csi(&self) -> Result<&CSIPersistentVolumeSource> {
        csi_source(&self.spec)
    }
}

/// The CSI source of a spec, or [`Error::NotCsi`] (Go's `getCSISource`).
pub fn csi_source(spec: &PersistentVolumeSpec) -> Result<&CSIPersistentVolumeSource> {
    spec.csi.as_ref().ok_or(Error::NotCsi)
}

/// Turns a PV into a CSI [`Volume`], translating in-tree sources of the seven CSI-migration
/// plugins (spec §3.4, §3.10). A PV that is neither CSI nor translatable → [`Error::NotCsi`].
pub fn pv_volume(pv: &PersistentVolume) -> Result<Volume> {
    let spec = pv.spec.clone().unwrap_or_default();
    if let Some(plugin) = InTreePlugin::of(&spec) {
        return Ok(Volume {
            spec: translate_in_tree(pv, plugin)?,
            migrated: true,
        });
    }
    csi_source(&spec)?;
    Ok(Volume {
        spec,
        migrated: false,
    })
}

/// Resolves a VA's volume for detach and reconcile: `lookup` returns the cached PV by name.
///
/// Attach uses [`va_source`], [`check_pv_attachable`] and [`pv_volume`] separately, because it
/// adds the PV finalizer in between.
pub fn volume_source<P: Borrow<PersistentVolume>>(
    va: &VolumeAttachment,
    lookup: impl FnOnce(&str) -> Option<P>,
) -> Result<Volume> {
    match va_source(va)? {
        Source::PersistentVolume(name) => {
            let pv = lookup(name).ok_or_else(|| Error::PvNotFound {
                name: name.to_owned(),
            })?;
            pv_volume(pv.borrow())
        }
        Source::Inline(spec) => Ok(Volume {
            spec: spec.clone(),
            migrated: true,
        }),
    }
}

/// `readonly` of ControllerPublishVolume: the PV's `csi.readOnly`, but only for drivers with
/// the `PUBLISH_READONLY` capability; always false otherwise.
pub fn readonly(csi: &CSIPersistentVolumeSource, supports_publish_readonly: bool) -> bool {
    supports_publish_readonly && csi.read_only.unwrap_or(false)
}

/// The single volume capability sent in ControllerPublishVolume (spec §3.4).
///
/// Block if `spec.volumeMode == Block`; otherwise mount with `fs_type` = `spec.csi.fsType` or
/// `default_fstype` when that is empty, and `mount_flags` = `spec.mountOptions`.
pub fn volume_capability(
    spec: &PersistentVolumeSpec,
    default_fstype: &str,
    supports_single_node_multi_writer: bool,
) -> Result<proto::VolumeCapability> {
    use proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    let csi = spec.csi.as_ref().ok_or(Error::CapabilityWithoutCsi)?;
    let access_type = if spec.volume_mode.as_deref() == Some(VOLUME_MODE_BLOCK) {
        AccessType::Block(BlockVolume {})
    } else {
        let fs_type = csi
            .fs_type
            .as_deref()
            .filter(|f| !f.is_empty())
            .unwrap_or(default_fstype);
        AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: spec.mount_options.clone().unwrap_or_default(),
            ..MountVolume::default()
        })
    };
    let mode = access_mode(
        spec.access_modes.as_deref().unwrap_or_default(),
        supports_single_node_multi_writer,
    )?;
    Ok(proto::VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

// === CSI migration ===

/// The in-tree volume plugins csi-translation-lib migrates, and their CSI drivers (spec §2
/// step 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InTreePlugin {
    /// `gcePersistentDisk` → `pd.csi.storage.gke.io`.
    GcePersistentDisk,
    /// `awsElasticBlockStore` → `ebs.csi.aws.com`.
    AwsElasticBlockStore,
    /// `azureDisk` → `disk.csi.azure.com`.
    AzureDisk,
    /// `azureFile` → `file.csi.azure.com`.
    AzureFile,
    /// `cinder` → `cinder.csi.openstack.org`.
    Cinder,
    /// `vsphereVolume` → `csi.vsphere.vmware.com`.
    VsphereVolume,
    /// `portworxVolume` → `pxd.portworx.com`.
    PortworxVolume,
}

impl InTreePlugin {
    /// Every migratable plugin.
    pub const ALL: [Self; 7] = [
        Self::GcePersistentDisk,
        Self::AwsElasticBlockStore,
        Self::AzureDisk,
        Self::AzureFile,
        Self::Cinder,
        Self::VsphereVolume,
        Self::PortworxVolume,
    ];

    /// The CSI driver this plugin migrates to.
    pub fn driver_name(self) -> &'static str {
        match self {
            Self::GcePersistentDisk => "pd.csi.storage.gke.io",
            Self::AwsElasticBlockStore => "ebs.csi.aws.com",
            Self::AzureDisk => "disk.csi.azure.com",
            Self::AzureFile => "file.csi.azure.com",
            Self::Cinder => "cinder.csi.openstack.org",
            Self::VsphereVolume => "csi.vsphere.vmware.com",
            Self::PortworxVolume => "pxd.portworx.com",
        }
    }

    /// The migratable in-tree source a spec uses, if any (csi-translation-lib `IsPVMigratable`).
    pub fn of(spec: &PersistentVolumeSpec) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.is_used_by(spec))
    }

    fn is_used_by(self, spec: &PersistentVolumeSpec) -> bool {
        match self {
            Self::GcePersistentDisk => spec.gce_persistent_disk.is_some(),
            Self::AwsElasticBlockStore => spec.aws_elastic_block_store.is_some(),
            Self::AzureDisk => spec.azure_disk.is_some(),
            Self::AzureFile => spec.azure_file.is_some(),
            Self::Cinder => spec.cinder.is_some(),
            Self::VsphereVolume => spec.vsphere_volume.is_some(),
            Self::PortworxVolume => spec.portworx_volume.is_some(),
        }
    }
}

/// True if `driver` is a CSI-migration target (csi-translation-lib `IsMigratedCSIDriverByName`).
pub fn is_migration_driver(driver: &str) -> bool {
    InTreePlugin::ALL.iter().any(|p| p.driver_name() == driver)
}

/// True if the PV uses an in-tree source whose migration driver is `driver`.
pub fn is_migratable_in_tree(pv: &PersistentVolume, driver: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(InTreePlugin::of)
        .is_some_and(|p| p.driver_name() == driver)
}

/// Zone label values from which the GCE PD handle takes its zone(s); the GA label wins.
const ZONE_LABELS: [&str; 2] = [
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
];
/// Separator of several zones in one zone label (regional disks).
const MULTI_ZONE_SEPARATOR: &str = "__";
/// Placeholder for an unknown GCE project or zone in a PD volume handle.
const GCE_UNSPECIFIED: &str = "UNSPECIFIED";
/// PV annotation with the Azure resource group of an in-tree Azure File share.
const AZURE_FILE_RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";

/// Translates an in-tree PV spec to a CSI one, following csi-translation-lib's facts.
///
/// Only what the attacher reads is produced: driver, volume handle, readOnly, fsType, volume
/// attributes and secrets; the in-tree source is cleared. Topology / node-affinity rewriting is
/// not done (the attacher never reads it). Per plugin:
///
/// * GCE PD: handle `projects/UNSPECIFIED/zones/<zone>/disks/<pdName>` from the PV's zone label
///   (`UNSPECIFIED` zone without label); several zones (`a__b`) give
///   `projects/UNSPECIFIED/regions/<region>/disks/<pdName>`, region = zone minus its last `-…`.
///   Attribute `partition` if non-zero. Access modes are made backward compatible: RWX is
///   treated as RWO and RWO+ROX becomes RWO (the in-tree plugin never enforced them).
/// * AWS EBS: handle = `volumeID` with an `aws://<zone>/` prefix removed, must be `vol-…`;
///   attribute `partition` if non-zero.
/// * Azure Disk: handle = `diskURI`; attributes `cachingMode`, `fsType`, `kind` when set.
/// * Azure File: handle `<rg>#<account>#<share>##<secretNamespace>` (rg from the
///   `kubernetes.io/azure-file-resource-group` annotation, account from a secret name of the form
///   `azure-storage-account-<account>-secret`, else the secret name itself); attribute
///   `sharename`; node-stage secret `azure-storage-account-<account>-secret` in the secret's
///   namespace or `default`.
/// * Cinder, Portworx: handle = `volumeID`. vSphere: handle = `volumePath`, attribute
///   `storagepolicyname` when set.
fn translate_in_tree(pv: &PersistentVolume, plugin: InTreePlugin) -> Result<PersistentVolumeSpec> {
    let mut spec = pv.spec.clone().unwrap_or_default();
    let mut attrs = BTreeMap::new();
    let mut csi = CSIPersistentVolumeSource {
        driver: plugin.driver_name().to_owned(),
        ..CSIPersistentVolumeSource::default()
    };
    match plugin {
        InTreePlugin::GcePersistentDisk => {
            let Some(src) = spec.gce_persistent_disk.take() else {
                return Err(Error::NotCsi);
            };
            csi.volume_handle = gce_volume_handle(pv, &src.pd_name)?;
            csi.read_only = src.read_only;
            csi.fs_type = src.fs_type;
            if let Some(p) = src.partition.filter(|p| *p != 0) {
                attrs.insert("partition".to_owned(), p.to_string());
            }
            spec.access_modes = spec
                .access_modes
                .as_deref()
                .map(gce_backward_compatible_access_modes);
        }
        InTreePlugin::AwsElasticBlockStore => {
            let Some(src) = spec.aws_elastic_block_store.take() else {
                return Err(Error::NotCsi);
            };
            csi.volume_handle = ebs_volume_id(&src.volume_id)?;
            csi.read_only = src.read_only;
            csi.fs_type = src.fs_type;
            if let Some(p) = src.partition.filter(|p| *p != 0) {
                attrs.insert("partition".to_owned(), p.to_string());
            }
        }
        InTreePlugin::AzureDisk => {
            let Some(src) = spec.azure_disk.take() else {
                return Err(Error::NotCsi);
            };
            csi.volume_handle = src.disk_uri;
            csi.read_only = src.read_only;
            if let Some(mode) = src.caching_mode {
                attrs.insert("cachingMode".to_owned(), mode);
            }
            if let Some(fs) = src.fs_type {
                attrs.insert("fsType".to_owned(), fs.clone());
                csi.fs_type = Some(fs);
            }
            if let Some(kind) = src.kind {
                attrs.insert("kind".to_owned(), kind);
            }
        }
        InTreePlugin::AzureFile => {
            let Some(src) = spec.azure_file.take() else {
                return Err(Error::NotCsi);
            };
            let account = azure_storage_account(&src.secret_name);
            let namespace = src
                .secret_namespace
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| "default".to_owned());
            let resource_group = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(AZURE_FILE_RESOURCE_GROUP_ANNOTATION))
                .map_or("", String::as_str);
            csi.volume_handle =
                format!("{resource_group}#{account}#{}##{namespace}", src.share_name);
            csi.read_only = src.read_only;
            attrs.insert("sharename".to_owned(), src.share_name);
            csi.node_stage_secret_ref = Some(SecretReference {
                name: Some(format!("azure-storage-account-{account}-secret")),
                namespace: Some(namespace),
            });
        }
        InTreePlugin::Cinder => {
            let Some(src) = spec.cinder.take() else {
                return Err(Error::NotCsi);
            };
            csi.volume_handle = src.volume_id;
            csi.read_only = src.read_only;
            csi.fs_type = src.fs_type;
        }
        InTreePlugin::VsphereVolume => {
            let Some(src) = spec.vsphere_volume.take() else {
                return Err(Error::NotCsi);
            };
            csi.volume_handle = src.volume_path;
            csi.fs_type = src.fs_type;
            if let Some(policy) = src.storage_policy_name.filter(|p| !p.is_empty()) {
                attrs.insert("storagepolicyname".to_owned(), policy);
            }
        }
        InTreePlugin::PortworxVolume => {
            let Some(src) = spec.portworx_volume.take() else {
                return Err(Error::NotCsi);
            };
            csi.volume_handle = src.volume_id;
            csi.read_only = src.read_only;
            csi.fs_type = src.fs_type;
        }
    }
    csi.volume_attributes = Some(attrs);
    spec.csi = Some(csi);
    Ok(spec)
}

/// The GCE PD CSI volume handle for `pd_name`, zonal or regional from the PV's zone label.
fn gce_volume_handle(pv: &PersistentVolume, pd_name: &str) -> Result<String> {
    let labels = pv.metadata.labels.as_ref();
    let zones_label = ZONE_LABELS
        .iter()
        .filter_map(|l| labels.and_then(|m| m.get(*l)))
        .find(|v| !v.is_empty())
        .map_or("", String::as_str);
    let zones: Vec<&str> = zones_label
        .split(MULTI_ZONE_SEPARATOR)
        .filter(|z| !z.is_empty())
        .collect();
    match zones.as_slice() {
        [] => Ok(format!(
            "projects/{GCE_UNSPECIFIED}/zones/{GCE_UNSPECIFIED}/disks/{pd_name}"
        )),
        [zone] => Ok(format!(
            "projects/{GCE_UNSPECIFIED}/zones/{zone}/disks/{pd_name}"
        )),
        many => {
            let region_err = || Error::GceRegion {
                zones: many.iter().map(|z| (*z).to_owned()).collect(),
            };
            let mut regions = many.iter().map(|z| z.rsplit_once('-').map(|(r, _)| r));
            let first = regions.next().flatten().ok_or_else(region_err)?;
            if regions.any(|r| r != Some(first)) {
                return Err(region_err());
            }
            Ok(format!(
                "projects/{GCE_UNSPECIFIED}/regions/{first}/disks/{pd_name}"
            ))
        }
    }
}

/// GCE PD's backward-compatible access modes: RWX counts as RWO; RWO (alone or with ROX)
/// becomes `[RWO]`, ROX alone stays `[ROX]`, anything else becomes `[RWO]`.
fn gce_backward_compatible_access_modes(modes: &[String]) -> Vec<String> {
    let has = |m: &str| modes.iter().any(|x| x == m);
    let rwo = has("ReadWriteOnce") || has("ReadWriteMany");
    if !rwo && has("ReadOnlyMany") {
        vec!["ReadOnlyMany".to_owned()]
    } else {
        vec!["ReadWriteOnce".to_owned()]
    }
}

/// The EBS volume ID of an in-tree `volumeID`: `vol-…` as is, `aws://<zone>/vol-…` stripped.
fn ebs_volume_id(id: &str) -> Result<String> {
    let Some(rest) = id.strip_prefix("aws://") else {
        return Ok(id.to_owned());
    };
    // `rest` is `<zone>/<volume>`; the zone may be empty (`aws:///vol-…`).
    let volume = rest
        .split_once('/')
        .map_or("", |(_, v)| v)
        .trim_matches('/');
    if volume.starts_with("vol-") && !volume.contains('/') {
        Ok(volume.to_owned())
    } else {
        Err(Error::InvalidEbsVolumeId { id: id.to_owned() })
    }
}

/// The storage account named by an Azure File secret `azure-storage-account-<account>-secret`,
/// or the secret name itself when it does not have that form.
fn azure_storage_account(secret_name: &str) -> &str {
    secret_name
        .strip_prefix("azure-storage-account-")
        .and_then(|s| s.strip_suffix("-secret"))
        .filter(|a| !a.is_empty())
        .unwrap_or(secret_name)
}

// === VolumeAttachment patches ===

/// The JSON merge patch on the VA's main resource that adds our finalizer and sets the node-ID
/// annotation (spec §3.5 step 2.5), or `None` if both are already in place.
///
/// Only the missing parts are in the patch; `finalizers` carries the full new list because merge
/// patches replace arrays wholesale.
pub fn va_metadata_patch(va: &VolumeAttachment, driver: &str, node_id: &str) -> Option<Value> {
    let finalizer = finalizer_name(driver);
    let mut metadata = Map::new();
    let current = va.metadata.finalizers.as_deref().unwrap_or_default();
    if !current.contains(&finalizer) {
        let mut list = current.to_vec();
        list.push(finalizer);
        metadata.insert("finalizers".to_owned(), json!(list));
    }
    let annotated = va
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_ID_ANNOTATION))
        .is_some_and(|v| v == node_id);
    if !annotated {
        metadata.insert(
            "annotations".to_owned(),
            json!({ NODE_ID_ANNOTATION: node_id }),
        );
    }
    (!metadata.is_empty()).then(|| json!({ "metadata": metadata }))
}

/// The JSON merge patch on the VA's main resource that removes our finalizer (spec §3.6 step
/// 5.1): the remaining list, or `null` when none remains. `None` if our finalizer is absent.
pub fn va_finalizer_removal_patch(va: &VolumeAttachment, driver: &str) -> Option<Value> {
    let finalizer = finalizer_name(driver);
    let current = va.metadata.finalizers.as_deref().unwrap_or_default();
    if !current.contains(&finalizer) {
        return None;
    }
    let rest: Vec<&String> = current.iter().filter(|f| **f != finalizer).collect();
    let value = if rest.is_empty() {
        Value::Null
    } else {
        json!(rest)
    };
    Some(json!({ "metadata": { "finalizers": value } }))
}

/// Whether the API server deleted a VA when it answered our finalizer removal: the answer
/// carries a deletion timestamp and no finalizer is left, so the object is gone (a VA has no
/// grace period) and no further write to it can succeed.
pub fn deleted_by_finalizer_removal(written: &VolumeAttachment) -> bool {
    written.metadata.deletion_timestamp.is_some()
        && written
            .metadata
            .finalizers
            .as_deref()
            .is_none_or(<[String]>::is_empty)
}

/// The status merge patch of `markAsAttached` (spec §3.5 step 4): `attached: true`,
/// `attachmentMetadata` = the publish context, `attachError: null`, each only if it changes.
///
/// Like Go's `createMergePatch`, an empty map counts as absent and map changes are sent per key
/// (removed keys as `null`). Returns `{}` if nothing changes.
pub fn attached_status_patch(
    va: &VolumeAttachment,
    attachment_metadata: &BTreeMap<String, String>,
) -> Value {
    let old = va.status.clone().unwrap_or_default();
    let mut status = Map::new();
    if !old.attached {
        status.insert("attached".to_owned(), Value::Bool(true));
    }
    if let Some(diff) = map_diff(old.attachment_metadata.as_ref(), attachment_metadata) {
        status.insert("attachmentMetadata".to_owned(), diff);
    }
    if old.attach_error.is_some() {
        status.insert("attachError".to_owned(), Value::Null);
    }
    wrap_status(status)
}

/// The status merge patch of `markAsDetached` (spec §3.6 step 5.2): `attached: false`,
/// `detachError: null`, `attachmentMetadata: null`, each only if it changes; `None` if the
/// status already says detached with no error or metadata.
pub fn detached_status_patch(va: &VolumeAttachment) -> Option<Value> {
    let old: VolumeAttachmentStatus = va.status.clone().unwrap_or_default();
    let mut status = Map::new();
    if old.attached {
        status.insert("attached".to_owned(), Value::Bool(false));
    }
    if old.detach_error.is_some() {
        status.insert("detachError".to_owned(), Value::Null);
    }
    if old.attachment_metadata.is_some_and(|m| !m.is_empty()) {
        status.insert("attachmentMetadata".to_owned(), Value::Null);
    }
    (!status.is_empty()).then(|| wrap_status(status))
}

/// The status merge patch saving an attach error (spec §3.5 step 3).
///
/// `error_code` is the gRPC code of a failed CSI call, `None` for other errors; it is written
/// as `null` then, so a code left from an earlier attempt does not survive the merge.
pub fn attach_error_patch(message: &str, time: &Time, error_code: Option<i32>) -> Value {
    json!({
        "status": {
            "attachError": {
                "message": message,
                "time": time,
                "errorCode": error_code,
            }
        }
    })
}

/// The status merge patch saving a detach error (spec §3.6 step 4): message and time only.
pub fn detach_error_patch(message: &str, time: &Time) -> Value {
    json!({
        "status": {
            "detachError": {
                "message": message,
                "time": time,
            }
        }
    })
}

fn wrap_status(status: Map<String, Value>) -> Value {
    let mut patch = Map::new();
    if !status.is_empty() {
        patch.insert("status".to_owned(), Value::Object(status));
    }
    Value::Object(patch)
}

/// The merge-patch value turning map `old` into `new`, or `None` if equal (empty ≡ absent).
fn map_diff(
    old: Option<&BTreeMap<String, String>>,
    new: &BTreeMap<String, String>,
) -> Option<Value> {
    let old = old.filter(|m| !m.is_empty());
    match old {
        None if new.is_empty() => None,
        None => Some(json!(new)),
        Some(_) if new.is_empty() => Some(Value::Null),
        Some(old) => {
            let mut diff = Map::new();
            for (k, v) in new {
                if old.get(k) != Some(v) {
                    diff.insert(k.clone(), json!(v));
                }
            }
            for k in old.keys().filter(|k| !new.contains_key(*k)) {
                diff.insert(k.clone(), Value::Null);
            }
            (!diff.is_empty()).then_some(Value::Object(diff))
        }
    }
}

// === PersistentVolume finalizer ===

/// The JSON Patch (RFC 6902) adding our finalizer to a PV (spec §3.8), built from the cached
/// copy so a concurrent change fails the `test` op; `None` if the finalizer is present.
pub fn pv_finalizer_add_patch(pv: &PersistentVolume, driver: &str) -> Option<Value> {
    let finalizer = finalizer_name(driver);
    match pv.metadata.finalizers.as_deref() {
        None => Some(json!([
            { "op": "test", "path": "/metadata/finalizers", "value": null },
            { "op": "add", "path": "/metadata/finalizers", "value": [finalizer] },
        ])),
        Some([]) => Some(json!([
            { "op": "test", "path": "/metadata/finalizers", "value": [] },
            { "op": "replace", "path": "/metadata/finalizers", "value": [finalizer] },
        ])),
        Some(list) if list.contains(&finalizer) => None,
        Some(_) => Some(json!([
            { "op": "add", "path": "/metadata/finalizers/-", "value": finalizer },
        ])),
    }
}

/// The JSON Patch removing our finalizer found at `index` of the cached PV (spec §3.8).
pub fn pv_finalizer_removal_patch(index: usize, driver: &str) -> Value {
    let path = format!("/metadata/finalizers/{index}");
    json!([
        { "op": "test", "path": path, "value": finalizer_name(driver) },
        { "op": "remove", "path": path },
    ])
}

/// True if the PV is in-tree, migratable to `driver`, and not (or no longer) marked as migrated
/// to it: CSI migration was turned off or rolled back.
fn migration_rolled_back(pv: &PersistentVolume, driver: &str) -> bool {
    let migrated_to = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIGRATED_TO_ANNOTATION));
    is_migratable_in_tree(pv, driver) && migrated_to.is_none_or(|d| d != driver)
}

fn finalizer_index(pv: &PersistentVolume, driver: &str) -> Option<usize> {
    let finalizer = finalizer_name(driver);
    pv.metadata
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .position(|f| *f == finalizer)
}

/// The PV add/update event filter (spec §6): enqueue only a PV that carries our finalizer and
/// is being deleted or has had its CSI migration to this driver rolled back.
pub fn should_enqueue_pv(pv: &PersistentVolume, driver: &str) -> bool {
    finalizer_index(pv, driver).is_some()
        && (pv.metadata.deletion_timestamp.is_some() || migration_rolled_back(pv, driver))
}

/// `SyncNewOrUpdatedPersistentVolume` (spec §3.8): the index of our finalizer if it is to be
/// removed now, `None` if the PV is to be left alone (the caller then forgets the key).
///
/// `vas` is every VA in the cache, of any driver: while one of them still names the PV, the
/// finalizer stays (the VA's deletion re-enqueues the PV).
pub fn pv_needs_finalizer_removal<'a>(
    pv: &PersistentVolume,
    driver: &str,
    vas: impl IntoIterator<Item = &'a VolumeAttachment>,
) -> Option<usize> {
    if pv.metadata.deletion_timestamp.is_none() && !migration_rolled_back(pv, driver) {
        return None;
    }
    let index = finalizer_index(pv, driver)?;
    let name = pv.metadata.name.as_deref()?;
    let in_use = vas
        .into_iter()
        .any(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name));
    (!in_use).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
        CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource, NFSVolumeSource,
        PortworxVolumeSource, VsphereVirtualDiskVolumeSource,
    };
    use k8s_openapi::api::storage::v1::{CSINodeDriver, VolumeError};
    use k8s_openapi::jiff::Timestamp;
    use proto::volume_capability::{AccessType, BlockVolume, MountVolume};

    const DRIVER: &str = "hostpath.csi.k8s.io";
    const FIN: &str = "external-attacher/hostpath-csi-k8s-io";

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_700_000_000).expect("valid timestamp"))
    }

    fn csi_spec(modes: &[&str]) -> PersistentVolumeSpec {
        PersistentVolumeSpec {
            access_modes: Some(strings(modes)),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "handle".into(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }
    }

    fn pv(name: &str, spec: PersistentVolumeSpec) -> PersistentVolume {
        let mut pv = PersistentVolume::default();
        pv.metadata.name = Some(name.into());
        pv.spec = Some(spec);
        pv
    }

    fn deleting(mut pv: PersistentVolume) -> PersistentVolume {
        pv.metadata.deletion_timestamp = Some(now());
        pv
    }

    fn pv_finalizers(mut pv: PersistentVolume, f: Option<&[&str]>) -> PersistentVolume {
        pv.metadata.finalizers = f.map(strings);
        pv
    }

    fn annotated_pv(mut pv: PersistentVolume, k: &str, v: &str) -> PersistentVolume {
        pv.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(k.into(), v.into());
        pv
    }

    fn va(pv_name: Option<&str>) -> VolumeAttachment {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some("va".into());
        va.spec.attacher = DRIVER.into();
        va.spec.node_name = "node".into();
        va.spec.source.persistent_volume_name = pv_name.map(Into::into);
        va
    }

    fn va_finalizers(mut va: VolumeAttachment, f: &[&str]) -> VolumeAttachment {
        va.metadata.finalizers = Some(strings(f));
        va
    }

    fn va_annotated(mut va: VolumeAttachment, id: &str) -> VolumeAttachment {
        va.metadata.annotations = Some(map(&[(NODE_ID_ANNOTATION, id)]));
        va
    }

    fn with_status(mut va: VolumeAttachment, status: VolumeAttachmentStatus) -> VolumeAttachment {
        va.status = Some(status);
        va
    }

    fn csinode(drivers: &[(&str, &str)]) -> CSINode {
        let mut n = CSINode::default();
        n.metadata.name = Some("node".into());
        n.spec.drivers = drivers
            .iter()
            .map(|(name, id)| CSINodeDriver {
                name: (*name).into(),
                node_id: (*id).into(),
                ..CSINodeDriver::default()
            })
            .collect();
        n
    }

    fn verr(msg: &str) -> Option<VolumeError> {
        Some(VolumeError {
            message: Some(msg.into()),
            ..VolumeError::default()
        })
    }

    #[test]
    fn driver_names_are_sanitized_into_finalizers_and_lease_names() {
        let cases = [
            ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
            ("csi-driver.", "csi-driver-X"),
            ("csi-driver-", "csi-driver-X"),
            ("Foo_Bar/baz", "Foo-Bar-baz"),
            ("plain-123", "plain-123"),
            ("", ""),
            ("é.x", "--x"),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize_driver_name(input), want, "{input}");
        }
        assert_eq!(
            finalizer_name("ebs.csi.aws.com"),
            "external-attacher/ebs-csi-aws-com"
        );
        assert_eq!(
            finalizer_name("csi-driver."),
            "external-attacher/csi-driver-X"
        );
        assert_eq!(
            lease_name("hostpath.csi.k8s.io"),
            "external-attacher-leader-hostpath-csi-k8s-io"
        );
        assert_eq!(
            lease_name("csi.vsphere.vmware.com"),
            "external-attacher-leader-csi-vsphere-vmware-com"
        );
        assert_eq!(lease_name("d."), "external-attacher-leader-d-X");
    }

    #[test]
    fn node_ids_come_from_csinode_then_from_the_va_annotation() {
        let with_driver = csinode(&[("other", "o"), (DRIVER, "id-1")]);
        let without_driver = csinode(&[("other", "o")]);
        let annotated = va_annotated(va(Some("pv")), "id-anno");
        let empty_annotation = va_annotated(va(Some("pv")), "");
        let plain = va(Some("pv"));
        let not_found = Err(NodeIdError::CsiNodeNotFound {
            node: "node".into(),
        });
        let no_driver = Err(NodeIdError::DriverNotOnNode {
            node: "node".into(),
            driver: DRIVER.into(),
        });
        type Case<'a> = (
            &'a str,
            Option<&'a CSINode>,
            Option<&'a VolumeAttachment>,
            Result<String, NodeIdError>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "csinode with the driver wins",
                Some(&with_driver),
                Some(&annotated),
                Ok("id-1".into()),
            ),
            (
                "csinode with the driver, no va",
                Some(&with_driver),
                None,
                Ok("id-1".into()),
            ),
            (
                "missing csinode falls back to the annotation",
                None,
                Some(&annotated),
                Ok("id-anno".into()),
            ),
            (
                "csinode without the driver falls back to the annotation",
                Some(&without_driver),
                Some(&annotated),
                Ok("id-anno".into()),
            ),
            (
                "an empty annotation still counts",
                None,
                Some(&empty_annotation),
                Ok(String::new()),
            ),
            (
                "attach passes no va: missing csinode is an error",
                None,
                None,
                not_found.clone(),
            ),
            (
                "va without annotation keeps the csinode error",
                None,
                Some(&plain),
                not_found,
            ),
            (
                "csinode without the driver and no annotation",
                Some(&without_driver),
                Some(&plain),
                no_driver.clone(),
            ),
            (
                "csinode without the driver and no va",
                Some(&without_driver),
                None,
                no_driver,
            ),
        ];
        for (name, node, va, want) in cases {
            assert_eq!(node_id(DRIVER, "node", node, va), want, "{name}");
        }
    }

    #[test]
    fn node_id_errors_read_exactly_like_external_attacher() {
        assert_eq!(
            NodeIdError::CsiNodeNotFound { node: "n1".into() }.to_string(),
            "csinode.storage.k8s.io \"n1\" not found"
        );
        assert_eq!(
            NodeIdError::DriverNotOnNode {
                node: "n1".into(),
                driver: "d".into()
            }
            .to_string(),
            "CSINode n1 does not contain driver d"
        );
    }

    #[test]
    fn access_modes_map_to_one_csi_mode_with_and_without_single_node_multi_writer() {
        use AccessModeError as E;
        let rwop_err = "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume";
        let rox_rwo_err =
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume";
        // (modes, without SNMW, with SNMW)
        type Want = std::result::Result<Mode, &'static str>;
        let cases: Vec<(&[&str], Want, Want)> = vec![
            (
                &["ReadWriteOncePod"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOncePod"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOnce"],
                Err(rwop_err),
                Err(rwop_err),
            ),
            (
                &["ReadWriteMany", "ReadWriteOncePod"],
                Err(rwop_err),
                Err(rwop_err),
            ),
            (
                &["ReadWriteMany"],
                Ok(Mode::MultiNodeMultiWriter),
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (
                &["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
                Ok(Mode::MultiNodeMultiWriter),
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                Err(rox_rwo_err),
                Err(rox_rwo_err),
            ),
            (
                &["ReadOnlyMany"],
                Ok(Mode::MultiNodeReaderOnly),
                Ok(Mode::MultiNodeReaderOnly),
            ),
            (
                &["ReadWriteOnce"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeMultiWriter),
            ),
            (
                &["ReadWriteOnce", "ReadWriteOnce"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeMultiWriter),
            ),
            (
                &[],
                Err("unsupported AccessMode combination: []"),
                Err("unsupported AccessMode combination: []"),
            ),
            (
                &["Foo", "Bar"],
                Err("unsupported AccessMode combination: [Foo Bar]"),
                Err("unsupported AccessMode combination: [Foo Bar]"),
            ),
        ];
        for (modes, without, with) in cases {
            let modes = strings(modes);
            for (snmw, want) in [(false, without), (true, with)] {
                let got = access_mode(&modes, snmw).map_err(|e: E| e.to_string());
                assert_eq!(got, want.map_err(str::to_owned), "{modes:?} snmw={snmw}");
            }
        }
    }

    #[test]
    fn volume_capabilities_are_block_or_mount_with_fstype_fallback() {
        let mount = |fs: &str, flags: &[&str]| {
            Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                mount_flags: strings(flags),
                ..MountVolume::default()
            }))
        };
        let spec = |mode: Option<&str>, fs: Option<&str>, opts: Option<&[&str]>| {
            let mut s = csi_spec(&["ReadWriteOnce"]);
            s.volume_mode = mode.map(Into::into);
            s.mount_options = opts.map(strings);
            if let Some(csi) = s.csi.as_mut() {
                csi.fs_type = fs.map(Into::into);
            }
            s
        };
        let cases = [
            (
                "block",
                spec(Some("Block"), Some("ext4"), None),
                "xfs",
                Some(AccessType::Block(BlockVolume {})),
            ),
            (
                "filesystem mode with fstype",
                spec(Some("Filesystem"), Some("ext4"), None),
                "xfs",
                mount("ext4", &[]),
            ),
            (
                "no mode, default fstype",
                spec(None, None, None),
                "xfs",
                mount("xfs", &[]),
            ),
            (
                "empty fstype uses the default",
                spec(None, Some(""), None),
                "xfs",
                mount("xfs", &[]),
            ),
            (
                "no fstype, no default",
                spec(None, None, None),
                "",
                mount("", &[]),
            ),
            (
                "mount options become flags",
                spec(None, Some("ext4"), Some(&["ro", "noatime"])),
                "",
                mount("ext4", &["ro", "noatime"]),
            ),
        ];
        for (name, spec, default_fs, want) in cases {
            let cap = volume_capability(&spec, default_fs, false).expect(name);
            assert_eq!(cap.access_type, want, "{name}");
            assert_eq!(
                cap.access_mode.map(|m| m.mode),
                Some(Mode::SingleNodeWriter as i32),
                "{name}"
            );
        }
        let cap = volume_capability(&csi_spec(&["ReadWriteOnce"]), "", true).expect("snmw");
        assert_eq!(
            cap.access_mode.map(|m| m.mode),
            Some(Mode::SingleNodeMultiWriter as i32)
        );
    }

    #[test]
    fn volume_capability_errors_are_the_spec_texts() {
        let mut no_csi = csi_spec(&["ReadWriteOnce"]);
        no_csi.csi = None;
        let cases = [
            (
                no_csi,
                "could not get volume capabilities, pvSpec.CSI is nil",
            ),
            (
                csi_spec(&["ReadOnlyMany", "ReadWriteOnce"]),
                "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume",
            ),
            (csi_spec(&[]), "unsupported AccessMode combination: []"),
        ];
        for (spec, want) in cases {
            let err = volume_capability(&spec, "", false).expect_err(want);
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn readonly_is_forwarded_only_with_publish_readonly() {
        let ro = |v: Option<bool>| CSIPersistentVolumeSource {
            read_only: v,
            ..CSIPersistentVolumeSource::default()
        };
        let cases = [
            (Some(true), true, true),
            (Some(true), false, false),
            (Some(false), true, false),
            (None, true, false),
        ];
        for (pv_ro, cap, want) in cases {
            assert_eq!(readonly(&ro(pv_ro), cap), want, "{pv_ro:?} {cap}");
        }
    }

    #[test]
    fn volume_sources_resolve_or_fail_with_the_spec_texts() {
        let csi_pv = pv("pv", csi_spec(&["ReadWriteOnce"]));
        let nfs_pv = pv(
            "nfs",
            PersistentVolumeSpec {
                nfs: Some(NFSVolumeSource::default()),
                ..PersistentVolumeSpec::default()
            },
        );
        let lookup = |name: &str| match name {
            "pv" => Some(&csi_pv),
            "nfs" => Some(&nfs_pv),
            _ => None,
        };
        let inline = |csi: bool| {
            let mut va = va(None);
            let mut spec = csi_spec(&["ReadWriteOnce"]);
            if !csi {
                spec.csi = None;
            }
            va.spec.source.inline_volume_spec = Some(spec);
            va
        };
        let mut both = inline(true);
        both.spec.source.persistent_volume_name = Some("pv".into());

        let ok = volume_source(&va(Some("pv")), lookup).expect("csi pv");
        assert_eq!(
            ok,
            Volume {
                spec: csi_spec(&["ReadWriteOnce"]),
                migrated: false
            }
        );
        let ok = volume_source(&inline(true), lookup).expect("inline");
        assert!(ok.migrated);
        assert_eq!(ok.csi().map(|c| c.volume_handle.as_str()), Ok("handle"));

        let cases = [
            (
                va(Some("missing")),
                "persistentvolume \"missing\" not found",
            ),
            (
                va(Some("nfs")),
                "pv spec contained non-csi source that was not migrated",
            ),
            (
                va(None),
                "neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source",
            ),
            (
                both,
                "both InlineCSIVolumeSource and PersistentVolumeName specified in VA source",
            ),
            (inline(false), "inline volume spec contains nil CSI source"),
        ];
        for (va, want) in cases {
            let err = volume_source(&va, lookup).expect_err(want);
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn attach_is_refused_for_a_pv_marked_for_deletion() {
        let p = pv("pv-1", csi_spec(&["ReadWriteOnce"]));
        assert_eq!(check_pv_attachable(&p), Ok(()));
        assert_eq!(
            check_pv_attachable(&deleting(p)).map_err(|e| e.to_string()),
            Err("PersistentVolume \"pv-1\" is marked for deletion".to_owned())
        );
    }

    fn in_tree(spec: PersistentVolumeSpec) -> PersistentVolume {
        pv(
            "in-tree",
            PersistentVolumeSpec {
                access_modes: Some(strings(&["ReadWriteOnce"])),
                ..spec
            },
        )
    }

    fn with_labels(mut pv: PersistentVolume, labels: &[(&str, &str)]) -> PersistentVolume {
        pv.metadata.labels = Some(map(labels));
        pv
    }

    #[test]
    fn in_tree_volumes_translate_to_their_migration_driver() {
        let gce = |partition| PersistentVolumeSpec {
            gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                pd_name: "disk-1".into(),
                fs_type: Some("ext4".into()),
                partition,
                read_only: Some(true),
            }),
            ..PersistentVolumeSpec::default()
        };
        let ebs = |id: &str| PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: id.into(),
                fs_type: Some("xfs".into()),
                partition: Some(2),
                read_only: None,
            }),
            ..PersistentVolumeSpec::default()
        };
        let azure_disk = PersistentVolumeSpec {
            azure_disk: Some(AzureDiskVolumeSource {
                disk_name: "d".into(),
                disk_uri: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d"
                    .into(),
                caching_mode: Some("ReadOnly".into()),
                fs_type: Some("ext4".into()),
                kind: Some("Managed".into()),
                read_only: Some(false),
            }),
            ..PersistentVolumeSpec::default()
        };
        let azure_file = |secret: &str, ns: Option<&str>| PersistentVolumeSpec {
            azure_file: Some(AzureFilePersistentVolumeSource {
                secret_name: secret.into(),
                secret_namespace: ns.map(Into::into),
                share_name: "share".into(),
                read_only: None,
            }),
            ..PersistentVolumeSpec::default()
        };
        let cinder = PersistentVolumeSpec {
            cinder: Some(CinderPersistentVolumeSource {
                volume_id: "c-1".into(),
                fs_type: Some("ext4".into()),
                ..CinderPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        };
        let vsphere = PersistentVolumeSpec {
            vsphere_volume: Some(VsphereVirtualDiskVolumeSource {
                volume_path: "[ds] kubevols/v.vmdk".into(),
                storage_policy_name: Some("gold".into()),
                fs_type: Some("ext4".into()),
                ..VsphereVirtualDiskVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        };
        let portworx = PersistentVolumeSpec {
            portworx_volume: Some(PortworxVolumeSource {
                volume_id: "px-1".into(),
                fs_type: None,
                read_only: Some(true),
            }),
            ..PersistentVolumeSpec::default()
        };
        let zone = "topology.kubernetes.io/zone";
        let beta = "failure-domain.beta.kubernetes.io/zone";
        // (case, pv, driver, handle, attributes, fsType)
        type Case<'a> = (
            &'a str,
            PersistentVolume,
            &'a str,
            &'a str,
            BTreeMap<String, String>,
            Option<&'a str>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "gce zonal",
                with_labels(in_tree(gce(None)), &[(zone, "us-central1-a")]),
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1",
                map(&[]),
                Some("ext4"),
            ),
            (
                "gce beta label",
                with_labels(in_tree(gce(Some(0))), &[(beta, "europe-west1-b")]),
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/zones/europe-west1-b/disks/disk-1",
                map(&[]),
                Some("ext4"),
            ),
            (
                "gce regional",
                with_labels(
                    in_tree(gce(Some(3))),
                    &[(zone, "us-central1-a__us-central1-c")],
                ),
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/regions/us-central1/disks/disk-1",
                map(&[("partition", "3")]),
                Some("ext4"),
            ),
            (
                "gce without zone",
                in_tree(gce(None)),
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1",
                map(&[]),
                Some("ext4"),
            ),
            (
                "ebs with zone url",
                in_tree(ebs("aws://us-east-1a/vol-0123")),
                "ebs.csi.aws.com",
                "vol-0123",
                map(&[("partition", "2")]),
                Some("xfs"),
            ),
            (
                "ebs with empty zone",
                in_tree(ebs("aws:///vol-0123")),
                "ebs.csi.aws.com",
                "vol-0123",
                map(&[("partition", "2")]),
                Some("xfs"),
            ),
            (
                "ebs bare id",
                in_tree(ebs("vol-0123")),
                "ebs.csi.aws.com",
                "vol-0123",
                map(&[("partition", "2")]),
                Some("xfs"),
            ),
            (
                "azure disk",
                in_tree(azure_disk),
                "disk.csi.azure.com",
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d",
                map(&[
                    ("cachingMode", "ReadOnly"),
                    ("fsType", "ext4"),
                    ("kind", "Managed"),
                ]),
                Some("ext4"),
            ),
            (
                "azure file",
                in_tree(azure_file("azure-storage-account-acct-secret", Some("ns"))),
                "file.csi.azure.com",
                "#acct#share##ns",
                map(&[("sharename", "share")]),
                None,
            ),
            (
                "azure file, other secret, rg annotation",
                annotated_pv(
                    in_tree(azure_file("mysecret", None)),
                    "kubernetes.io/azure-file-resource-group",
                    "rg",
                ),
                "file.csi.azure.com",
                "rg#mysecret#share##default",
                map(&[("sharename", "share")]),
                None,
            ),
            (
                "cinder",
                in_tree(cinder),
                "cinder.csi.openstack.org",
                "c-1",
                map(&[]),
                Some("ext4"),
            ),
            (
                "vsphere",
                in_tree(vsphere),
                "csi.vsphere.vmware.com",
                "[ds] kubevols/v.vmdk",
                map(&[("storagepolicyname", "gold")]),
                Some("ext4"),
            ),
            (
                "portworx",
                in_tree(portworx),
                "pxd.portworx.com",
                "px-1",
                map(&[]),
                None,
            ),
        ];
        for (name, pv, driver, handle, attrs, fs) in cases {
            let vol = pv_volume(&pv).expect(name);
            assert!(vol.migrated, "{name}");
            assert!(
                InTreePlugin::of(&vol.spec).is_none(),
                "{name}: in-tree source cleared"
            );
            let csi = vol.csi().expect(name);
            assert_eq!(csi.driver, driver, "{name}");
            assert_eq!(csi.volume_handle, handle, "{name}");
            assert_eq!(csi.volume_attributes.as_ref(), Some(&attrs), "{name}");
            assert_eq!(csi.fs_type.as_deref(), fs, "{name}");
            assert!(is_migratable_in_tree(&pv, driver), "{name}");
            assert!(is_migration_driver(driver), "{name}");
            assert!(!is_migratable_in_tree(&pv, DRIVER), "{name}");
        }
    }

    #[test]
    fn translated_volumes_keep_read_only_and_secrets() {
        let gce = in_tree(PersistentVolumeSpec {
            gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                pd_name: "d".into(),
                read_only: Some(true),
                ..GCEPersistentDiskVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        });
        let vol = pv_volume(&gce).expect("gce");
        assert_eq!(vol.csi().map(|c| c.read_only), Ok(Some(true)));
        let file = in_tree(PersistentVolumeSpec {
            azure_file: Some(AzureFilePersistentVolumeSource {
                secret_name: "azure-storage-account-acct-secret".into(),
                share_name: "s".into(),
                ..AzureFilePersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        });
        let vol = pv_volume(&file).expect("azure file");
        assert_eq!(
            vol.csi().map(|c| c.node_stage_secret_ref.clone()),
            Ok(Some(SecretReference {
                name: Some("azure-storage-account-acct-secret".into()),
                namespace: Some("default".into()),
            }))
        );
    }

    #[test]
    fn gce_access_modes_are_made_backward_compatible() {
        let cases: [(&[&str], &[&str]); 5] = [
            (&["ReadWriteMany"], &["ReadWriteOnce"]),
            (&["ReadWriteOnce", "ReadOnlyMany"], &["ReadWriteOnce"]),
            (&["ReadOnlyMany"], &["ReadOnlyMany"]),
            (&["ReadWriteOnce"], &["ReadWriteOnce"]),
            (&["ReadWriteMany", "ReadOnlyMany"], &["ReadWriteOnce"]),
        ];
        for (input, want) in cases {
            assert_eq!(
                gce_backward_compatible_access_modes(&strings(input)),
                strings(want),
                "{input:?}"
            );
        }
    }

    #[test]
    fn untranslatable_in_tree_volumes_fail_with_a_translation_error() {
        let ebs = in_tree(PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: "aws://zone/not-a-volume".into(),
                ..AWSElasticBlockStoreVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        });
        assert_eq!(
            pv_volume(&ebs).map_err(|e| e.to_string()),
            Err("failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://zone/not-a-volume)".to_owned())
        );
        let gce = with_labels(
            in_tree(PersistentVolumeSpec {
                gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                    pd_name: "d".into(),
                    ..GCEPersistentDiskVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            &[("topology.kubernetes.io/zone", "us-east1-b__europe-west1-b")],
        );
        assert!(matches!(pv_volume(&gce), Err(Error::GceRegion { .. })));
    }

    #[test]
    fn va_metadata_patches_add_only_what_is_missing() {
        let cases = [
            (
                "bare va gets finalizer and annotation",
                va(Some("pv")),
                Some(
                    json!({"metadata": {"finalizers": [FIN], "annotations": {NODE_ID_ANNOTATION: "id"}}}),
                ),
            ),
            (
                "other finalizers are kept in the full list",
                va_finalizers(va(Some("pv")), &["other"]),
                Some(
                    json!({"metadata": {"finalizers": ["other", FIN], "annotations": {NODE_ID_ANNOTATION: "id"}}}),
                ),
            ),
            (
                "finalizer present, annotation missing",
                va_finalizers(va(Some("pv")), &[FIN]),
                Some(json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: "id"}}})),
            ),
            (
                "finalizer present, annotation differs",
                va_annotated(va_finalizers(va(Some("pv")), &[FIN]), "old"),
                Some(json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: "id"}}})),
            ),
            (
                "annotation present, finalizer missing",
                va_annotated(va(Some("pv")), "id"),
                Some(json!({"metadata": {"finalizers": [FIN]}})),
            ),
            (
                "both present: no patch",
                va_annotated(va_finalizers(va(Some("pv")), &[FIN]), "id"),
                None,
            ),
        ];
        for (name, va, want) in cases {
            assert_eq!(va_metadata_patch(&va, DRIVER, "id"), want, "{name}");
        }
    }

    #[test]
    fn va_finalizer_removal_patches_replace_the_list_or_null_it() {
        let cases = [
            (
                "only ours becomes null",
                va_finalizers(va(None), &[FIN]),
                Some(json!({"metadata": {"finalizers": null}})),
            ),
            (
                "others stay",
                va_finalizers(va(None), &["a", FIN, "b"]),
                Some(json!({"metadata": {"finalizers": ["a", "b"]}})),
            ),
            ("absent: no patch", va_finalizers(va(None), &["a"]), None),
            ("no finalizers: no patch", va(None), None),
        ];
        for (name, va, want) in cases {
            assert_eq!(va_finalizer_removal_patch(&va, DRIVER), want, "{name}");
        }
    }

    #[test]
    fn a_va_answered_deleting_without_finalizers_is_gone() {
        let deleting = |mut va: VolumeAttachment| {
            va.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            va
        };
        assert!(deleted_by_finalizer_removal(&deleting(va(None))));
        assert!(deleted_by_finalizer_removal(&deleting(va_finalizers(
            va(None),
            &[]
        ))));
        // Another controller's finalizer keeps it; so does a VA that is not being deleted.
        assert!(!deleted_by_finalizer_removal(&deleting(va_finalizers(
            va(None),
            &["other/f"]
        ))));
        assert!(!deleted_by_finalizer_removal(&va(None)));
    }

    #[test]
    fn attached_status_patches_carry_only_changed_fields() {
        let st = |attached: bool, meta: Option<&[(&str, &str)]>, err: Option<&str>| {
            VolumeAttachmentStatus {
                attached,
                attachment_metadata: meta.map(map),
                attach_error: err.and_then(verr),
                detach_error: None,
            }
        };
        let cases = [
            (
                "fresh va, no metadata",
                va(None),
                map(&[]),
                json!({"status": {"attached": true}}),
            ),
            (
                "fresh va with metadata",
                va(None),
                map(&[("k", "v")]),
                json!({"status": {"attached": true, "attachmentMetadata": {"k": "v"}}}),
            ),
            (
                "error is cleared",
                with_status(va(None), st(false, None, Some("boom"))),
                map(&[]),
                json!({"status": {"attached": true, "attachError": null}}),
            ),
            (
                "already attached, same metadata: empty patch",
                with_status(va(None), st(true, Some(&[("k", "v")]), None)),
                map(&[("k", "v")]),
                json!({}),
            ),
            (
                "metadata changes per key",
                with_status(va(None), st(true, Some(&[("a", "1"), ("b", "2")]), None)),
                map(&[("a", "1"), ("c", "3")]),
                json!({"status": {"attachmentMetadata": {"b": null, "c": "3"}}}),
            ),
            (
                "metadata dropped becomes null",
                with_status(va(None), st(true, Some(&[("a", "1")]), None)),
                map(&[]),
                json!({"status": {"attachmentMetadata": null}}),
            ),
            (
                "empty old metadata counts as absent",
                with_status(va(None), st(false, Some(&[]), None)),
                map(&[]),
                json!({"status": {"attached": true}}),
            ),
        ];
        for (name, va, meta, want) in cases {
            assert_eq!(attached_status_patch(&va, &meta), want, "{name}");
        }
    }

    #[test]
    fn detached_status_patches_clear_attached_error_and_metadata() {
        let full = VolumeAttachmentStatus {
            attached: true,
            attachment_metadata: Some(map(&[("k", "v")])),
            attach_error: None,
            detach_error: verr("e"),
        };
        let cases = [
            (
                "attached with metadata and error",
                with_status(va(None), full),
                Some(
                    json!({"status": {"attached": false, "detachError": null, "attachmentMetadata": null}}),
                ),
            ),
            (
                "attached only",
                with_status(
                    va(None),
                    VolumeAttachmentStatus {
                        attached: true,
                        ..Default::default()
                    },
                ),
                Some(json!({"status": {"attached": false}})),
            ),
            (
                "already detached: no patch",
                with_status(va(None), VolumeAttachmentStatus::default()),
                None,
            ),
            ("no status: no patch", va(None), None),
        ];
        for (name, va, want) in cases {
            assert_eq!(detached_status_patch(&va), want, "{name}");
        }
    }

    #[test]
    fn error_patches_carry_message_rfc3339_time_and_code() {
        let cases = [
            (
                Some(8),
                json!({"status": {"attachError": {"message": "rpc error: code = ResourceExhausted desc = full", "time": "2023-11-14T22:13:20Z", "errorCode": 8}}}),
            ),
            (
                None,
                json!({"status": {"attachError": {"message": "rpc error: code = ResourceExhausted desc = full", "time": "2023-11-14T22:13:20Z", "errorCode": null}}}),
            ),
        ];
        for (code, want) in cases {
            assert_eq!(
                attach_error_patch(
                    "rpc error: code = ResourceExhausted desc = full",
                    &now(),
                    code
                ),
                want
            );
        }
        assert_eq!(
            detach_error_patch("boom", &now()),
            json!({"status": {"detachError": {"message": "boom", "time": "2023-11-14T22:13:20Z"}}})
        );
    }

    #[test]
    fn pv_finalizer_json_patches_follow_the_three_cases() {
        let base = pv("pv", csi_spec(&["ReadWriteOnce"]));
        let cases = [
            (
                "absent list",
                pv_finalizers(base.clone(), None),
                Some(json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FIN]},
                ])),
            ),
            (
                "empty list",
                pv_finalizers(base.clone(), Some(&[])),
                Some(json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": []},
                    {"op": "replace", "path": "/metadata/finalizers", "value": [FIN]},
                ])),
            ),
            (
                "non-empty list",
                pv_finalizers(base.clone(), Some(&["kubernetes.io/pv-protection"])),
                Some(json!([
                    {"op": "add", "path": "/metadata/finalizers/-", "value": FIN},
                ])),
            ),
            (
                "already present",
                pv_finalizers(base, Some(&["x", FIN])),
                None,
            ),
        ];
        for (name, pv, want) in cases {
            assert_eq!(pv_finalizer_add_patch(&pv, DRIVER), want, "{name}");
        }
        assert_eq!(
            pv_finalizer_removal_patch(1, DRIVER),
            json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": FIN},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
    }

    #[test]
    fn pv_finalizers_are_removed_only_from_unused_deleted_or_rolled_back_pvs() {
        const GCE: &str = "pd.csi.storage.gke.io";
        let gce_fin = finalizer_name(GCE);
        let csi = |f: &[&str]| pv_finalizers(pv("pv", csi_spec(&["ReadWriteOnce"])), Some(f));
        let gce_pv = |f: &[&str]| {
            pv_finalizers(
                pv(
                    "pv",
                    PersistentVolumeSpec {
                        gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                            pd_name: "d".into(),
                            ..GCEPersistentDiskVolumeSource::default()
                        }),
                        ..PersistentVolumeSpec::default()
                    },
                ),
                Some(f),
            )
        };
        let other_va = va(Some("other-pv"));
        let using_va = va(Some("pv"));
        let mut inline_va = va(None);
        inline_va.spec.source.inline_volume_spec = Some(csi_spec(&["ReadWriteOnce"]));
        let none: &[&VolumeAttachment] = &[];
        let unrelated = [&other_va, &inline_va];
        let in_use = [&other_va, &using_va];
        let only_using = [&using_va];
        // (case, pv, driver, vas, removal index, should enqueue)
        type Case<'a> = (
            &'a str,
            PersistentVolume,
            &'a str,
            &'a [&'a VolumeAttachment],
            Option<usize>,
            bool,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "live csi pv is left alone",
                csi(&[FIN]),
                DRIVER,
                none,
                None,
                false,
            ),
            (
                "deleted pv without our finalizer",
                deleting(csi(&["x"])),
                DRIVER,
                none,
                None,
                false,
            ),
            (
                "deleted pv with our finalizer and no va",
                deleting(csi(&["x", FIN])),
                DRIVER,
                none,
                Some(1),
                true,
            ),
            (
                "deleted pv with unrelated vas",
                deleting(csi(&[FIN])),
                DRIVER,
                &unrelated,
                Some(0),
                true,
            ),
            (
                "deleted pv still used by a va",
                deleting(csi(&[FIN])),
                DRIVER,
                &in_use,
                None,
                true,
            ),
            (
                "in-tree pv without migrated-to",
                gce_pv(&[&gce_fin]),
                GCE,
                none,
                Some(0),
                true,
            ),
            (
                "in-tree pv migrated to another driver",
                annotated_pv(gce_pv(&[&gce_fin]), MIGRATED_TO_ANNOTATION, "x"),
                GCE,
                none,
                Some(0),
                true,
            ),
            (
                "in-tree pv migrated to us",
                annotated_pv(gce_pv(&[&gce_fin]), MIGRATED_TO_ANNOTATION, GCE),
                GCE,
                none,
                None,
                false,
            ),
            (
                "rolled back in-tree pv still used",
                gce_pv(&[&gce_fin]),
                GCE,
                &only_using,
                None,
                true,
            ),
            (
                "in-tree pv of another migration driver",
                gce_pv(&[FIN]),
                DRIVER,
                none,
                None,
                false,
            ),
        ];
        for (name, pv, driver, vas, want, enqueue) in cases {
            assert_eq!(
                pv_needs_finalizer_removal(&pv, driver, vas.iter().copied()),
                want,
                "{name}"
            );
            assert_eq!(should_enqueue_pv(&pv, driver), enqueue, "{name}");
        }
    }

    #[test]
    fn error_metric_labels_are_bounded() {
        assert_eq!(Error::NotCsi.metric_label(), "not_csi");
        assert_eq!(
            Error::from(AccessModeError::ReadOnlyManyAndReadWriteOnce).metric_label(),
            "access_mode"
        );
    }
}
