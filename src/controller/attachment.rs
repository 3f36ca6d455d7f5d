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
use crate::names::{MIGRATED_TO_ANNOTATION, NODE_ID_ANNOTATION, finalizer_name};
use proto::volume_capability::access_mode::Mode;

/// `spec.volumeMode` value selecting a raw block capability.
const VOLUME_MODE_BLOCK: &str = "Block";

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
    /// csi-translation-lib refuses the in-tree PV. The prefix is the one external-attacher's
    /// `csiAttach` and `csiDetach` put before the library's error.
    #[error("failed to translate in tree pv to CSI: {0}")]
    Translation(#[from] TranslationError),
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
            Self::Translation(_) => "translation",
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
    /// True for translated in-tree PVs only: the `migrated` label of the CSI call metrics
    /// (external-attacher's `markAsMigrated(ctx, migratable)` in `csiAttach` / `csiDetach`,
    /// which is false for inline specs).
    pub migrated: bool,
    /// True for the VA's inline spec (`spec.source.inlineVolumeSpec`).
    pub inline: bool,
}

impl Volume {
    /// The VA's inline spec, used as it is: kube-controller-manager already translated it, and
    /// external-attacher never translates inline specs itself.
    pub fn inline(spec: PersistentVolumeSpec) -> Self {
        Self {
            spec,
            migrated: false,
            inline: true,
        }
    }

    /// The CSI source of the volume.
    pub fn csi(&self) -> Result<&CSIPersistentVolumeSource> {
        csi_source(&self.spec)
    }

    /// Whether the ListVolumes reconciler repairs the volume handle (csi-translation-lib's
    /// `RepairVolumeHandle`) before looking it up: external-attacher's `isMigratable`, true for
    /// in-tree PVs and for every inline spec.
    pub fn repairs_handle(&self) -> bool {
        self.migrated || self.inline
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
            inline: false,
        });
    }
    csi_source(&spec)?;
    Ok(Volume {
        spec,
        migrated: false,
        inline: false,
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
        Source::Inline(spec) => Ok(Volume::inline(spec.clone())),
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

// The translation below follows csi-translation-lib v0.36.3 (`plugins/*.go`), the version the
// reference external-attacher v4.12.0 is built with, field by field, including its quirks (a
// zero GCE partition gives `partition: ""`, a zero EBS partition `partition: "0"`, ...). It is
// checked against the library itself by `tests/translation_oracle.rs`, which compares thousands
// of generated PVs with the output of the Go tool `translation-oracle` (tools/testbins/csi).

/// Zone label read first for GCE PD volume handles (csi-translation-lib reads the beta label
/// and falls back to the GA one only when the beta label is empty or missing).
const GCE_BETA_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";
/// Zone label read when the beta one is empty or missing.
const GCE_GA_ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Separator of several zones in one zone label (regional disks).
const MULTI_ZONE_SEPARATOR: &str = "__";
/// Placeholder for an unknown GCE project or zone in a PD volume handle.
const GCE_UNSPECIFIED: &str = "UNSPECIFIED";
/// PV annotation with the Azure resource group of an in-tree Azure File share.
const AZURE_FILE_RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";
/// Name of the Azure File secret that names a storage account: `azure-storage-account-<account>-secret`.
const AZURE_FILE_SECRET_PREFIX: &str = "azure-storage-account-";
/// See [`AZURE_FILE_SECRET_PREFIX`].
const AZURE_FILE_SECRET_SUFFIX: &str = "-secret";
/// The only Azure Disk `kind` csi-translation-lib migrates (compared case-insensitively); also
/// the value of the `kind` volume attribute it always sets.
const AZURE_MANAGED_DISK: &str = "Managed";
/// PV annotations from which a Portworx PV takes all five CSI secret references (both needed).
const PORTWORX_SECRET_NAME_ANNOTATION: &str = "openstorage.io/auth-secret-name";
/// See [`PORTWORX_SECRET_NAME_ANNOTATION`].
const PORTWORX_SECRET_NAMESPACE_ANNOTATION: &str = "openstorage.io/auth-secret-namespace";

/// Why csi-translation-lib refuses to translate an in-tree PV. The `Display` texts are the
/// library's; [`Error::Translation`] adds external-attacher's prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslationError {
    /// An AWS EBS `volumeID` starting with `aws://` that is not a URL whose path is one
    /// `vol-…` segment. The text is the reason (`Invalid format for AWS volume (<id>)`, or
    /// `Invalid disk name (<id>): <Go URL parse error>`).
    #[error("failed to translate Kubernetes ID to EBS Volume ID {0}")]
    EbsVolumeId(String),
    /// A GCE PD PV whose zone label lists several zones that do not share one region, or a
    /// zone not of the form `<locale>-<region>-<zone>`. The text is the reason.
    #[error("failed to get region from zones: {0}")]
    GceRegion(String),
    /// An Azure Disk whose `kind` is set and is not `Managed` (the API server defaults a
    /// missing kind to `Shared`, so such PVs are never migrated).
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    /// An Azure File PV with neither `secretNamespace` nor a `claimRef` namespace.
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileSecretNamespace,
}

/// Translates an in-tree PV spec to a CSI one, as csi-translation-lib's
/// `TranslateInTreePVToCSI` does.
///
/// Everything the attacher reads is produced: driver, volume handle, readOnly, fsType, volume
/// attributes, secret references and (GCE PD) access modes; the in-tree source is cleared.
/// Topology / node-affinity rewriting is not done (the attacher never reads it). Per plugin:
///
/// * GCE PD: the zone(s) come from the beta zone label, or the GA one when the beta label is
///   empty or missing; one zone gives `projects/UNSPECIFIED/zones/<zone>/disks/<pdName>`, no
///   zone `UNSPECIFIED` as zone, several zones (`a__b`, empty parts included)
///   `projects/UNSPECIFIED/regions/<region>/disks/<pdName>` when all are `<locale>-<region>-<x>`
///   of one region. Attribute `partition`: the partition, `""` for 0. readOnly and fsType
///   copied. Access modes made backward compatible (see
///   [`gce_backward_compatible_access_modes`]).
/// * AWS EBS: handle from [`ebs_volume_id`]; attribute `partition` always (`"0"` for 0).
/// * Azure Disk: refused unless `kind` is missing or `Managed` (any case); handle = `diskURI`
///   (not parsed); attributes `kind: Managed`, `cachingmode` when set (also empty), `fstype`
///   when set (also copied to fsType); readOnly copied.
/// * Azure File: handle `<rg>#<account>#<share>#<pv name>#<namespace>` (rg from the
///   `kubernetes.io/azure-file-resource-group` annotation, account from
///   [`azure_storage_account`], namespace = `secretNamespace` if set, even empty, else the
///   claimRef's namespace; an empty namespace is refused); attribute `sharename`; node-stage
///   secret = the in-tree secret name in that namespace; readOnly copied.
/// * Cinder: handle = `volumeID`, readOnly and fsType copied, no attributes.
/// * vSphere: handle = `volumePath`, fsType copied, attribute `storagepolicyname` when
///   non-empty; never read-only.
/// * Portworx: handle = `volumeID`, fsType copied, readOnly dropped; all five secret
///   references from the `openstorage.io/auth-secret-name` / `-namespace` annotations when both
///   are present.
fn translate_in_tree(
    pv: &PersistentVolume,
    plugin: InTreePlugin,
) -> Result<PersistentVolumeSpec, TranslationError> {
    let mut spec = pv.spec.clone().unwrap_or_default();
    let mut attrs = BTreeMap::new();
    let mut csi = CSIPersistentVolumeSource {
        driver: plugin.driver_name().to_owned(),
        ..CSIPersistentVolumeSource::default()
    };
    let annotation = |key: &str| {
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    match plugin {
        InTreePlugin::GcePersistentDisk => {
            let src = spec.gce_persistent_disk.take().unwrap_or_default();
            csi.volume_handle = gce_volume_handle(pv, &src.pd_name)?;
            csi.read_only = src.read_only;
            csi.fs_type = src.fs_type;
            // Go formats a non-zero partition, and leaves "" for zero.
            let partition = src.partition.filter(|p| *p != 0);
            attrs.insert(
                "partition".to_owned(),
                partition.map(|p| p.to_string()).unwrap_or_default(),
            );
            spec.access_modes = spec
                .access_modes
                .as_deref()
                .map(gce_backward_compatible_access_modes);
        }
        InTreePlugin::AwsElasticBlockStore => {
            let src = spec.aws_elastic_block_store.take().unwrap_or_default();
            csi.volume_handle = ebs_volume_id(&src.volume_id)?;
            csi.read_only = src.read_only;
            csi.fs_type = src.fs_type;
            // Unlike GCE PD, a zero partition is formatted too: "0".
            attrs.insert(
                "partition".to_owned(),
                src.partition.unwrap_or(0).to_string(),
            );
        }
        InTreePlugin::AzureDisk => {
            let src = spec.azure_disk.take().unwrap_or_default();
            // Go's strings.EqualFold; "managed" has no non-ASCII case-fold partners.
            if let Some(kind) = src
                .kind
                .filter(|k| !k.eq_ignore_ascii_case(AZURE_MANAGED_DISK))
            {
                return Err(TranslationError::AzureDiskKind(kind));
            }
            csi.volume_handle = src.disk_uri;
            csi.read_only = src.read_only;
            if let Some(mode) = src.caching_mode {
                attrs.insert("cachingmode".to_owned(), mode);
            }
            if let Some(fs) = src.fs_type {
                attrs.insert("fstype".to_owned(), fs.clone());
                csi.fs_type = Some(fs);
            }
            attrs.insert("kind".to_owned(), AZURE_MANAGED_DISK.to_owned());
        }
        InTreePlugin::AzureFile => {
            let src = spec.azure_file.take().unwrap_or_default();
            let account = azure_storage_account(&src.secret_name).unwrap_or(&src.secret_name);
            let resource_group = annotation(AZURE_FILE_RESOURCE_GROUP_ANNOTATION).unwrap_or("");
            // An explicit secretNamespace wins even when empty (and is then refused).
            let namespace = match &src.secret_namespace {
                Some(ns) => ns.clone(),
                None => spec
                    .claim_ref
                    .as_ref()
                    .and_then(|c| c.namespace.clone())
                    .unwrap_or_default(),
            };
            if namespace.is_empty() {
                return Err(TranslationError::AzureFileSecretNamespace);
            }
            let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
            csi.volume_handle = format!(
                "{resource_group}#{account}#{}#{pv_name}#{namespace}",
                src.share_name
            );
            csi.read_only = src.read_only;
            attrs.insert("sharename".to_owned(), src.share_name);
            csi.node_stage_secret_ref = Some(SecretReference {
                name: Some(src.secret_name),
                namespace: Some(namespace),
            });
        }
        InTreePlugin::Cinder => {
            let src = spec.cinder.take().unwrap_or_default();
            csi.volume_handle = src.volume_id;
            csi.read_only = src.read_only;
            csi.fs_type = src.fs_type;
        }
        InTreePlugin::VsphereVolume => {
            let src = spec.vsphere_volume.take().unwrap_or_default();
            csi.volume_handle = src.volume_path;
            csi.fs_type = src.fs_type;
            if let Some(policy) = src.storage_policy_name.filter(|p| !p.is_empty()) {
                attrs.insert("storagepolicyname".to_owned(), policy);
            }
        }
        InTreePlugin::PortworxVolume => {
            let src = spec.portworx_volume.take().unwrap_or_default();
            csi.volume_handle = src.volume_id;
            csi.fs_type = src.fs_type;
            // readOnly is not carried over (the library leaves it false).
            if let (Some(name), Some(namespace)) = (
                annotation(PORTWORX_SECRET_NAME_ANNOTATION),
                annotation(PORTWORX_SECRET_NAMESPACE_ANNOTATION),
            ) {
                let secret = Some(SecretReference {
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                });
                csi.controller_publish_secret_ref = secret.clone();
                csi.node_stage_secret_ref = secret.clone();
                csi.node_publish_secret_ref = secret.clone();
                csi.controller_expand_secret_ref = secret.clone();
                csi.node_expand_secret_ref = secret;
            }
        }
    }
    csi.volume_attributes = Some(attrs);
    spec.csi = Some(csi);
    Ok(spec)
}

/// The GCE PD CSI volume handle for `pd_name`, zonal or regional from the PV's zone label.
fn gce_volume_handle(pv: &PersistentVolume, pd_name: &str) -> Result<String, TranslationError> {
    let label = |key: &str| {
        pv.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map_or("", String::as_str)
    };
    let mut zones_label = label(GCE_BETA_ZONE_LABEL);
    if zones_label.is_empty() {
        zones_label = label(GCE_GA_ZONE_LABEL);
    }
    // Go's strings.Split: "" gives [""], "a__" gives ["a", ""]; empty parts are kept.
    let zones: Vec<&str> = zones_label.split(MULTI_ZONE_SEPARATOR).collect();
    match zones.as_slice() {
        [zone] if !zone.is_empty() => Ok(format!(
            "projects/{GCE_UNSPECIFIED}/zones/{zone}/disks/{pd_name}"
        )),
        [_] => Ok(format!(
            "projects/{GCE_UNSPECIFIED}/zones/{GCE_UNSPECIFIED}/disks/{pd_name}"
        )),
        many => {
            let region = gce_region_from_zones(many).map_err(TranslationError::GceRegion)?;
            Ok(format!(
                "projects/{GCE_UNSPECIFIED}/regions/{region}/disks/{pd_name}"
            ))
        }
    }
}

/// csi-translation-lib's `gceGetRegionFromZones`: every zone must be
/// `<locale>-<region>-<zone>` (exactly three `-`-separated parts), and all must share
/// `<locale>-<region>`. The error is the library's text.
pub fn gce_region_from_zones(zones: &[&str]) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".to_owned());
    }
    let mut regions = std::collections::BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        let [locale, region, _] = parts.as_slice() else {
            return Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ));
        };
        regions.insert(format!("{locale}-{region}"));
    }
    if regions.len() != 1 {
        // fmt's %v of a sets.String (a map to struct{}): keys sorted bytewise, as BTreeSet.
        let listed: Vec<String> = regions.iter().map(|r| format!("{r}:{{}}")).collect();
        return Err(format!(
            "multiple or no regions gotten from zones, got: map[{}]",
            listed.join(" ")
        ));
    }
    Ok(regions.into_iter().next().unwrap_or_default())
}

/// GCE PD's backward-compatible access modes (csi-translation-lib
/// `backwardCompatibleAccessModes`): RWX counts as RWO (the in-tree plugin never enforced
/// it); any RWO gives `[RWO]`, else ROX gives `[ROX]`, anything else (also an empty list)
/// `[RWO]`. A missing list stays missing (the caller maps `None` to `None`).
fn gce_backward_compatible_access_modes(modes: &[String]) -> Vec<String> {
    let has = |m: &str| modes.iter().any(|x| x == m);
    let rwo = has("ReadWriteOnce") || has("ReadWriteMany");
    if !rwo && has("ReadOnlyMany") {
        vec!["ReadOnlyMany".to_owned()]
    } else {
        vec!["ReadWriteOnce".to_owned()]
    }
}

/// The EBS volume ID of an in-tree `volumeID` (csi-translation-lib
/// `KubernetesVolumeIDToEBSVolumeID`): an ID not starting with `aws://` is kept as it is
/// (even empty or malformed); otherwise it is parsed as a URL the way Go's `net/url.Parse`
/// does, and the path, `/` trimmed on both sides, must be `vol-` followed by anything but `/`.
fn ebs_volume_id(id: &str) -> Result<String, TranslationError> {
    if !id.starts_with("aws://") {
        return Ok(id.to_owned());
    }
    let path = go_url::parse_path(id)
        .map_err(|e| TranslationError::EbsVolumeId(format!("Invalid disk name ({id}): {e}")))?;
    let volume = path.trim_matches('/');
    if volume.starts_with("vol-") && !volume.contains('/') {
        Ok(volume.to_owned())
    } else {
        Err(TranslationError::EbsVolumeId(format!(
            "Invalid format for AWS volume ({id})"
        )))
    }
}

/// The storage account named by an Azure File secret, as csi-translation-lib's unanchored
/// regular expression `azure-storage-account-(.+)-secret` finds it: the leftmost
/// `azure-storage-account-` that a match starts at, and the longest account after it (up to
/// the last `-secret` before a newline, at least one character). `None` when nothing matches;
/// the library then uses the whole secret name.
fn azure_storage_account(secret_name: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(found) = secret_name[from..].find(AZURE_FILE_SECRET_PREFIX) {
        let start = from + found + AZURE_FILE_SECRET_PREFIX.len();
        let rest = &secret_name[start..];
        // `.` does not match a newline, so the account ends before the first one.
        let line_end = rest.find('\n').unwrap_or(rest.len());
        let last_suffix = rest[..(line_end + AZURE_FILE_SECRET_SUFFIX.len()).min(rest.len())]
            .rfind(AZURE_FILE_SECRET_SUFFIX);
        if let Some(end) = last_suffix.filter(|e| *e >= 1 && *e <= line_end) {
            return Some(&rest[..end]);
        }
        from = from + found + 1;
    }
    None
}

/// What Go's `net/url.Parse` does with the `aws://…` EBS volume IDs, to get the same path and
/// the same error texts as csi-translation-lib (which wraps them as `Invalid disk name`).
/// Go 1.26 `net/url` and `net/netip` are the reference; only the parts an `aws://` URL reaches
/// are here (scheme `aws`, so the `http(s)`-only colon rule does not apply).
mod go_url {
    /// The decoded path of `raw` (which starts with `aws://`), or the text of Go's `*url.Error`.
    pub(super) fn parse_path(raw: &str) -> Result<String, String> {
        // Parse cuts the fragment off first and checks it only after the rest parsed.
        let (url, fragment) = raw
            .split_once('#')
            .map_or((raw, None), |(u, f)| (u, Some(f)));
        let path = parse(url).map_err(|e| url_error(url, &e))?;
        if let Some(fragment) = fragment.filter(|f| !f.is_empty()) {
            unescape(fragment.as_bytes(), Mode::Other).map_err(|e| url_error(raw, &e))?;
        }
        Ok(path)
    }

    /// `*url.Error`'s text: `parse "<url>": <err>`.
    fn url_error(url: &str, err: &str) -> String {
        format!("parse {}: {err}", quote(url.as_bytes()))
    }

    fn parse(url: &str) -> Result<String, String> {
        if url.bytes().any(|b| b < b' ' || b == 0x7f) {
            return Err("net/url: invalid control character in URL".to_owned());
        }
        // The scheme is `aws`; what follows the `:` starts with `//`.
        let rest = &url["aws:".len()..];
        let rest = if rest.ends_with('?') && rest.matches('?').count() == 1 {
            &rest[..rest.len() - 1]
        } else {
            rest.split_once('?').map_or(rest, |(r, _)| r)
        };
        let after = &rest[2..];
        let (authority, path) = after
            .find('/')
            .map_or((after, ""), |i| (&after[..i], &after[i..]));
        parse_authority(authority)?;
        let path = unescape(path.as_bytes(), Mode::Other)?;
        Ok(go_string(&path))
    }

    fn parse_authority(authority: &str) -> Result<(), String> {
        let at = authority.rfind('@');
        parse_host(at.map_or(authority, |i| &authority[i + 1..]))?;
        let Some(i) = at else { return Ok(()) };
        let userinfo = &authority[..i];
        let valid = userinfo.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    '-' | '.'
                        | '_'
                        | ':'
                        | '~'
                        | '!'
                        | '$'
                        | '&'
                        | '\''
                        | '('
                        | ')'
                        | '*'
                        | '+'
                        | ','
                        | ';'
                        | '='
                        | '%'
                        | '@'
                )
        });
        if !valid {
            return Err("net/url: invalid userinfo".to_owned());
        }
        let (user, password) = userinfo
            .split_once(':')
            .map_or((userinfo, None), |(u, p)| (u, Some(p)));
        unescape(user.as_bytes(), Mode::Other)?;
        if let Some(password) = password {
            unescape(password.as_bytes(), Mode::Other)?;
        }
        Ok(())
    }

    fn parse_host(host: &str) -> Result<(), String> {
        match host.rfind('[') {
            Some(i) if i > 0 => Err("invalid IP-literal".to_owned()),
            Some(_) => {
                let close = host.rfind(']').ok_or("missing ']' in host")?;
                let colon_port = &host[close + 1..];
                if !valid_optional_port(colon_port) {
                    return Err(format!(
                        "invalid port {} after host",
                        quote(colon_port.as_bytes())
                    ));
                }
                // Before the `]`: an IPv6 address, maybe with a `%25`-introduced zone.
                let name = &host[1..close];
                let unescaped = match name.find("%25") {
                    Some(z) => {
                        let mut all = unescape(&name.as_bytes()[..z], Mode::Host)?;
                        all.extend(unescape(&name.as_bytes()[z..], Mode::Zone)?);
                        all
                    }
                    None => unescape(name.as_bytes(), Mode::Host)?,
                };
                match netip_parse(&unescaped) {
                    Err(e) => Err(format!("invalid host: {e}")),
                    Ok(IpKind::V4) => Err("invalid IP-literal".to_owned()),
                    Ok(IpKind::V6) => Ok(()),
                }
            }
            None => {
                // Not http(s): the port starts at the last colon.
                if let Some(i) = host.rfind(':')
                    && !valid_optional_port(&host[i..])
                {
                    return Err(format!(
                        "invalid port {} after host",
                        quote(&host.as_bytes()[i..])
                    ));
                }
                unescape(host.as_bytes(), Mode::Host).map(drop)
            }
        }
    }

    fn valid_optional_port(port: &str) -> bool {
        port.is_empty()
            || port
                .strip_prefix(':')
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Host,
        Zone,
        /// Path, userinfo and fragment: only `%` escapes are checked.
        Other,
    }

    /// Bytes Go leaves unescaped in a host (`shouldEscape(c, encodeHost)` is false).
    fn host_byte_ok(c: u8) -> bool {
        c.is_ascii_alphanumeric() || b"!$&'()*+,;=:[]<>\"-_.~".contains(&c)
    }

    /// Go's `unescape`: checks every `%XY`, and in a host every plain ASCII byte; then decodes.
    fn unescape(s: &[u8], mode: Mode) -> Result<Vec<u8>, String> {
        let escape_error = |e: &[u8]| format!("invalid URL escape {}", quote(e));
        let mut i = 0;
        while i < s.len() {
            match s[i] {
                b'%' => {
                    if i + 2 >= s.len()
                        || !s[i + 1].is_ascii_hexdigit()
                        || !s[i + 2].is_ascii_hexdigit()
                    {
                        return Err(escape_error(&s[i..(i + 3).min(s.len())]));
                    }
                    let seq = &s[i..i + 3];
                    if mode == Mode::Host && unhex(s[i + 1]) < 8 && seq != b"%25" {
                        return Err(escape_error(seq));
                    }
                    if mode == Mode::Zone {
                        let v = unhex(s[i + 1]) << 4 | unhex(s[i + 2]);
                        if seq != b"%25" && v != b' ' && !host_byte_ok(v) {
                            return Err(escape_error(seq));
                        }
                    }
                    i += 3;
                }
                c => {
                    if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && !host_byte_ok(c) {
                        return Err(format!(
                            "invalid character {} in host name",
                            quote(&s[i..=i])
                        ));
                    }
                    i += 1;
                }
            }
        }
        let mut out = Vec::with_capacity(s.len());
        let mut i = 0;
        while i < s.len() {
            if s[i] == b'%' {
                out.push(unhex(s[i + 1]) << 4 | unhex(s[i + 2]));
                i += 3;
            } else {
                out.push(s[i]);
                i += 1;
            }
        }
        Ok(out)
    }

    fn unhex(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => c - b'A' + 10,
        }
    }

    /// Bytes as Go shows a string in JSON: invalid UTF-8 bytes each become U+FFFD (a `%`-decoded
    /// path may hold any byte).
    fn go_string(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len());
        let mut rest = bytes;
        while !rest.is_empty() {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    out.push(char::REPLACEMENT_CHARACTER);
                    rest = &after[1..];
                }
            }
        }
        out
    }

    /// Go's `strconv.Quote` (and `%q`). Non-ASCII runes count as printable unless they are
    /// control, space-like or format characters; exact for ASCII, which is what IDs hold.
    pub(super) fn quote(bytes: &[u8]) -> String {
        let mut out = String::from("\"");
        let mut rest = bytes;
        while let Some(&first) = rest.first() {
            let (c, len) = match std::str::from_utf8(&rest[..utf8_len(first).min(rest.len())]) {
                Ok(s) if first >= 0x80 => (s.chars().next(), s.len()),
                _ => (None, 1),
            };
            match c {
                None if first < 0x80 => match first {
                    b'"' => out.push_str("\\\""),
                    b'\\' => out.push_str("\\\\"),
                    0x07 => out.push_str("\\a"),
                    0x08 => out.push_str("\\b"),
                    0x0c => out.push_str("\\f"),
                    b'\n' => out.push_str("\\n"),
                    b'\r' => out.push_str("\\r"),
                    b'\t' => out.push_str("\\t"),
                    0x0b => out.push_str("\\v"),
                    b' '..=b'~' => out.push(first as char),
                    _ => out.push_str(&format!("\\x{first:02x}")),
                },
                None => out.push_str(&format!("\\x{first:02x}")),
                Some(c) if printable(c) => out.push(c),
                Some(c) if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
                Some(c) => out.push_str(&format!("\\U{:08x}", c as u32)),
            }
            rest = &rest[len..];
        }
        out.push('"');
        out
    }

    fn utf8_len(first: u8) -> usize {
        match first {
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 1,
        }
    }

    /// Go's `unicode.IsPrint` for non-ASCII runes, without the tables: false for control
    /// (Cc), space (Z*), the common format (Cf) and the private-use characters.
    fn printable(c: char) -> bool {
        let u = c as u32;
        !(c.is_control()
            || c.is_whitespace()
            || matches!(u, 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e)
            || matches!(u, 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x206f)
            || matches!(u, 0xfeff | 0xfff9..=0xfffb | 0xe000..=0xf8ff | 0xf0000..)
            || u == 0xa0)
    }

    enum IpKind {
        V4,
        V6,
    }

    /// Go's `netip.ParseAddr`: which kind of address `s` is, or the error text.
    fn netip_parse(s: &[u8]) -> Result<IpKind, String> {
        let error = |msg: &str, at: Option<&[u8]>| match at.filter(|a| !a.is_empty()) {
            Some(at) => format!("ParseAddr({}): {msg} (at {})", quote(s), quote(at)),
            None => format!("ParseAddr({}): {msg}", quote(s)),
        };
        for &c in s {
            match c {
                b'.' => {
                    return ipv4_fields(s, s, &mut [0; 4])
                        .map(|()| IpKind::V4)
                        .map_err(|(m, at)| error(m, at));
                }
                b':' => {
                    return parse_ipv6(s)
                        .map(|()| IpKind::V6)
                        .map_err(|(m, at)| error(m, at));
                }
                b'%' => return Err(error("missing IPv6 address", None)),
                _ => {}
            }
        }
        Err(error("unable to parse IP", None))
    }

    type AddrError<'a> = (&'static str, Option<&'a [u8]>);

    /// `parseIPv4Fields` over `s` (a part of the whole input).
    fn ipv4_fields<'a>(_whole: &[u8], s: &'a [u8], fields: &mut [u8]) -> Result<(), AddrError<'a>> {
        let (mut val, mut pos, mut digits) = (0u32, 0usize, 0usize);
        for i in 0..s.len() {
            let c = s[i];
            if c.is_ascii_digit() {
                if digits == 1 && val == 0 {
                    return Err(("IPv4 field has octet with leading zero", None));
                }
                val = val * 10 + u32::from(c - b'0');
                digits += 1;
                if val > 255 {
                    return Err(("IPv4 field has value >255", None));
                }
            } else if c == b'.' {
                if i == 0 || i == s.len() - 1 || s[i - 1] == b'.' {
                    return Err(("IPv4 field must have at least one digit", Some(&s[i..])));
                }
                if pos == 3 {
                    return Err(("IPv4 address too long", None));
                }
                fields[pos] = val as u8;
                pos += 1;
                val = 0;
                digits = 0;
            } else {
                return Err(("unexpected character", Some(&s[i..])));
            }
        }
        if pos < 3 {
            return Err(("IPv4 address too short", None));
        }
        fields[3] = val as u8;
        Ok(())
    }

    /// `parseIPv6`: only whether it parses (the address itself is not needed).
    fn parse_ipv6(input: &[u8]) -> Result<(), AddrError<'_>> {
        let mut s = input;
        let mut zone: &[u8] = &[];
        if let Some(i) = s.iter().position(|&c| c == b'%') {
            zone = &input[i + 1..];
            s = &input[..i];
            if zone.is_empty() {
                return Err(("zone must be a non-empty string", None));
            }
        }
        let mut ellipsis: Option<usize> = None;
        if s.len() >= 2 && s[0] == b':' && s[1] == b':' {
            ellipsis = Some(0);
            s = &s[2..];
            if s.is_empty() {
                return Ok(());
            }
        }
        let mut i = 0;
        while i < 16 {
            let mut off = 0;
            let mut acc = 0u32;
            while off < s.len() {
                let c = s[off];
                let Some(d) = (c as char).to_digit(16) else {
                    break;
                };
                acc = (acc << 4) + d;
                if off > 3 {
                    return Err(("each group must have 4 or less digits", Some(s)));
                }
                if acc > 0xffff {
                    return Err(("IPv6 field has value >=2^16", Some(s)));
                }
                off += 1;
            }
            if off == 0 {
                return Err((
                    "each colon-separated field must have at least one digit",
                    Some(s),
                ));
            }
            if off < s.len() && s[off] == b'.' {
                if ellipsis.is_none() && i != 12 {
                    return Err((
                        "embedded IPv4 address must replace the final 2 fields of the address",
                        Some(s),
                    ));
                }
                if i + 4 > 16 {
                    return Err((
                        "too many hex fields to fit an embedded IPv4 at the end of the address",
                        Some(s),
                    ));
                }
                let end = if zone.is_empty() {
                    input.len()
                } else {
                    input.len() - zone.len() - 1
                };
                ipv4_fields(input, &input[end - s.len()..end], &mut [0; 4])?;
                s = &[];
                i += 4;
                break;
            }
            i += 2;
            s = &s[off..];
            if s.is_empty() {
                break;
            }
            if s[0] != b':' {
                return Err(("unexpected character, want colon", Some(s)));
            } else if s.len() == 1 {
                return Err(("colon must be followed by more characters", Some(s)));
            }
            s = &s[1..];
            if s[0] == b':' {
                if ellipsis.is_some() {
                    return Err(("multiple :: in address", Some(s)));
                }
                ellipsis = Some(i);
                s = &s[1..];
                if s.is_empty() {
                    break;
                }
            }
        }
        if !s.is_empty() {
            return Err(("trailing garbage after address", Some(s)));
        }
        match (i < 16, ellipsis) {
            (true, None) => Err(("address string too short", None)),
            (false, Some(_)) => Err(("the :: must expand to at least one field of zeros", None)),
            _ => Ok(()),
        }
    }
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
                migrated: false,
                inline: false,
            }
        );
        assert!(!ok.repairs_handle());
        // An inline spec is used as it is: not counted as migrated (external-attacher's
        // markAsMigrated(ctx, false)), but its handle is repaired by the reconciler.
        let ok = volume_source(&inline(true), lookup).expect("inline");
        assert!(!ok.migrated && ok.inline && ok.repairs_handle());
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

    fn with_claim_namespace(mut pv: PersistentVolume, ns: &str) -> PersistentVolume {
        if let Some(spec) = pv.spec.as_mut() {
            spec.claim_ref = Some(k8s_openapi::api::core::v1::ObjectReference {
                name: Some("claim".into()),
                namespace: Some(ns.into()),
                ..Default::default()
            });
        }
        pv
    }

    /// The translated CSI source, or the error text.
    fn translated(pv: &PersistentVolume) -> Result<CSIPersistentVolumeSource, String> {
        let volume = pv_volume(pv).map_err(|e| e.to_string())?;
        assert!(volume.migrated && !volume.inline && volume.repairs_handle());
        volume.csi().cloned().map_err(|e| e.to_string())
    }

    fn attrs(pv: &PersistentVolume) -> BTreeMap<String, String> {
        translated(pv)
            .expect("translates")
            .volume_attributes
            .unwrap_or_default()
    }

    fn gce_pv(partition: Option<i32>, labels: &[(&str, &str)]) -> PersistentVolume {
        with_labels(
            in_tree(PersistentVolumeSpec {
                gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                    pd_name: "disk-1".into(),
                    fs_type: Some("ext4".into()),
                    partition,
                    read_only: Some(true),
                }),
                ..PersistentVolumeSpec::default()
            }),
            labels,
        )
    }

    fn ebs_pv(id: &str, partition: Option<i32>) -> PersistentVolume {
        in_tree(PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: id.into(),
                fs_type: Some("xfs".into()),
                partition,
                read_only: None,
            }),
            ..PersistentVolumeSpec::default()
        })
    }

    fn azure_disk_pv(kind: Option<&str>, caching: Option<&str>) -> PersistentVolume {
        in_tree(PersistentVolumeSpec {
            azure_disk: Some(AzureDiskVolumeSource {
                disk_name: "d".into(),
                disk_uri: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d"
                    .into(),
                caching_mode: caching.map(Into::into),
                fs_type: Some("ext4".into()),
                kind: kind.map(Into::into),
                read_only: Some(true),
            }),
            ..PersistentVolumeSpec::default()
        })
    }

    fn azure_file_pv(secret: &str, ns: Option<&str>) -> PersistentVolume {
        in_tree(PersistentVolumeSpec {
            azure_file: Some(AzureFilePersistentVolumeSource {
                secret_name: secret.into(),
                secret_namespace: ns.map(Into::into),
                share_name: "share".into(),
                read_only: Some(true),
            }),
            ..PersistentVolumeSpec::default()
        })
    }

    fn portworx_pv() -> PersistentVolume {
        in_tree(PersistentVolumeSpec {
            portworx_volume: Some(PortworxVolumeSource {
                volume_id: "px-1".into(),
                fs_type: Some("ext4".into()),
                read_only: Some(true),
            }),
            ..PersistentVolumeSpec::default()
        })
    }

    const GA_ZONE: &str = "topology.kubernetes.io/zone";
    const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
    const TRANSLATE: &str = "failed to translate in tree pv to CSI: ";

    #[test]
    fn in_tree_volumes_translate_to_their_migration_driver() {
        let cinder = in_tree(PersistentVolumeSpec {
            cinder: Some(CinderPersistentVolumeSource {
                volume_id: "c-1".into(),
                fs_type: Some("ext4".into()),
                read_only: Some(true),
                ..CinderPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        });
        let vsphere = |policy: &str| {
            in_tree(PersistentVolumeSpec {
                vsphere_volume: Some(VsphereVirtualDiskVolumeSource {
                    volume_path: "[ds] kubevols/v.vmdk".into(),
                    storage_policy_name: Some(policy.into()),
                    fs_type: Some("ext4".into()),
                    ..VsphereVirtualDiskVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            })
        };
        // (case, pv, driver, handle, attributes, fsType, readOnly)
        type Case<'a> = (
            &'a str,
            PersistentVolume,
            &'a str,
            &'a str,
            BTreeMap<String, String>,
            Option<&'a str>,
            Option<bool>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "gce zonal",
                gce_pv(Some(3), &[(GA_ZONE, "us-central1-a")]),
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1",
                map(&[("partition", "3")]),
                Some("ext4"),
                Some(true),
            ),
            (
                "gce regional",
                gce_pv(None, &[(GA_ZONE, "us-central1-a__us-central1-c")]),
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/regions/us-central1/disks/disk-1",
                map(&[("partition", "")]),
                Some("ext4"),
                Some(true),
            ),
            (
                "ebs with zone url",
                ebs_pv("aws://us-east-1a/vol-0123", Some(2)),
                "ebs.csi.aws.com",
                "vol-0123",
                map(&[("partition", "2")]),
                Some("xfs"),
                None,
            ),
            (
                "azure disk",
                azure_disk_pv(Some("Managed"), Some("ReadOnly")),
                "disk.csi.azure.com",
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d",
                map(&[
                    ("cachingmode", "ReadOnly"),
                    ("fstype", "ext4"),
                    ("kind", "Managed"),
                ]),
                Some("ext4"),
                Some(true),
            ),
            (
                "azure file",
                azure_file_pv("azure-storage-account-acct-secret", Some("ns")),
                "file.csi.azure.com",
                "#acct#share#in-tree#ns",
                map(&[("sharename", "share")]),
                None,
                Some(true),
            ),
            (
                "cinder",
                cinder,
                "cinder.csi.openstack.org",
                "c-1",
                map(&[]),
                Some("ext4"),
                Some(true),
            ),
            (
                "vsphere",
                vsphere("gold"),
                "csi.vsphere.vmware.com",
                "[ds] kubevols/v.vmdk",
                map(&[("storagepolicyname", "gold")]),
                Some("ext4"),
                None,
            ),
            (
                "vsphere with empty policy",
                vsphere(""),
                "csi.vsphere.vmware.com",
                "[ds] kubevols/v.vmdk",
                map(&[]),
                Some("ext4"),
                None,
            ),
            (
                "portworx",
                portworx_pv(),
                "pxd.portworx.com",
                "px-1",
                map(&[]),
                Some("ext4"),
                None,
            ),
        ];
        for (name, pv, driver, handle, attributes, fs, ro) in cases {
            let vol = pv_volume(&pv).expect(name);
            assert!(vol.migrated && !vol.inline, "{name}");
            assert!(
                InTreePlugin::of(&vol.spec).is_none(),
                "{name}: in-tree source cleared"
            );
            let csi = vol.csi().expect(name);
            assert_eq!(csi.driver, driver, "{name}");
            assert_eq!(csi.volume_handle, handle, "{name}");
            assert_eq!(csi.volume_attributes.as_ref(), Some(&attributes), "{name}");
            assert_eq!(csi.fs_type.as_deref(), fs, "{name}");
            assert_eq!(csi.read_only, ro, "{name}");
            assert!(is_migratable_in_tree(&pv, driver), "{name}");
            assert!(is_migration_driver(driver), "{name}");
            assert!(!is_migratable_in_tree(&pv, DRIVER), "{name}");
        }
    }

    #[test]
    fn gce_partition_zero_gives_an_empty_attribute_and_ebs_partition_zero_gives_0() {
        // csi-translation-lib: GCE formats only a non-zero partition, EBS always formats it.
        for partition in [None, Some(0)] {
            assert_eq!(
                attrs(&gce_pv(partition, &[])),
                map(&[("partition", "")]),
                "{partition:?}"
            );
            assert_eq!(
                attrs(&ebs_pv("vol-1", partition)),
                map(&[("partition", "0")]),
                "{partition:?}"
            );
        }
        assert_eq!(attrs(&gce_pv(Some(-1), &[])), map(&[("partition", "-1")]));
        assert_eq!(
            attrs(&ebs_pv("vol-1", Some(15))),
            map(&[("partition", "15")])
        );
    }

    #[test]
    fn gce_zone_comes_from_the_beta_label_first() {
        let handle =
            |labels: &[(&str, &str)]| translated(&gce_pv(None, labels)).map(|c| c.volume_handle);
        let zonal = |z: &str| Ok(format!("projects/UNSPECIFIED/zones/{z}/disks/disk-1"));
        // Both labels, disagreeing: the beta one wins.
        assert_eq!(
            handle(&[(BETA_ZONE, "europe-west1-b"), (GA_ZONE, "us-central1-a")]),
            zonal("europe-west1-b")
        );
        assert_eq!(
            handle(&[
                (BETA_ZONE, "us-central1-a__us-central1-b"),
                (GA_ZONE, "x__y")
            ]),
            Ok("projects/UNSPECIFIED/regions/us-central1/disks/disk-1".to_owned())
        );
        // An empty beta label falls back to the GA one; no usable label gives UNSPECIFIED.
        assert_eq!(
            handle(&[(BETA_ZONE, ""), (GA_ZONE, "us-central1-a")]),
            zonal("us-central1-a")
        );
        assert_eq!(handle(&[(GA_ZONE, "")]), zonal("UNSPECIFIED"));
        assert_eq!(handle(&[]), zonal("UNSPECIFIED"));
        // One zone is taken as it is, however it looks.
        assert_eq!(handle(&[(GA_ZONE, "zone")]), zonal("zone"));
    }

    #[test]
    fn gce_regional_labels_need_zones_of_one_region() {
        let handle =
            |zones: &str| translated(&gce_pv(None, &[(GA_ZONE, zones)])).map(|c| c.volume_handle);
        let region_error = |reason: &str| {
            Err(format!(
                "{TRANSLATE}failed to get region from zones: {reason}"
            ))
        };
        let format_error = |zone: &str| {
            region_error(&format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ))
        };
        assert_eq!(
            handle("us-central1-a__us-central1-a"),
            Ok("projects/UNSPECIFIED/regions/us-central1/disks/disk-1".to_owned())
        );
        // Empty parts are zones too (and malformed ones).
        assert_eq!(handle("us-central1-a__"), format_error(""));
        assert_eq!(handle("__"), format_error(""));
        assert_eq!(handle("a-b-c__a-b"), format_error("a-b"));
        assert_eq!(
            handle("us-central1-a___us-central1-b"),
            region_error(
                "multiple or no regions gotten from zones, got: map[_us-central1:{} us-central1:{}]"
            )
        );
        assert_eq!(
            handle("us-east1-b__europe-west1-b__asia-x-y"),
            region_error(
                "multiple or no regions gotten from zones, got: map[asia-x:{} europe-west1:{} us-east1:{}]"
            )
        );
    }

    #[test]
    fn gce_access_modes_are_made_backward_compatible() {
        let cases: [(&[&str], &[&str]); 7] = [
            (&["ReadWriteMany"], &["ReadWriteOnce"]),
            (&["ReadWriteOnce", "ReadOnlyMany"], &["ReadWriteOnce"]),
            (&["ReadOnlyMany"], &["ReadOnlyMany"]),
            (&["ReadWriteOnce"], &["ReadWriteOnce"]),
            (&["ReadWriteMany", "ReadOnlyMany"], &["ReadWriteOnce"]),
            (&["ReadWriteOncePod"], &["ReadWriteOnce"]),
            (&[], &["ReadWriteOnce"]),
        ];
        for (input, want) in cases {
            assert_eq!(
                gce_backward_compatible_access_modes(&strings(input)),
                strings(want),
                "{input:?}"
            );
        }
        // A missing list stays missing.
        let mut pv = gce_pv(None, &[]);
        pv.spec.as_mut().expect("spec").access_modes = None;
        assert_eq!(pv_volume(&pv).expect("gce").spec.access_modes, None);
    }

    #[test]
    fn ebs_volume_ids_are_parsed_as_go_parses_urls() {
        let handle = |id: &str| translated(&ebs_pv(id, None)).map(|c| c.volume_handle);
        let ok = |h: &str| Ok(h.to_owned());
        let invalid = |id: &str| {
            Err(format!(
                "{TRANSLATE}failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume ({id})"
            ))
        };
        let bad_url = |id: &str, url: &str, reason: &str| {
            Err(format!(
                "{TRANSLATE}failed to translate Kubernetes ID to EBS Volume ID Invalid disk name ({id}): parse \"{url}\": {reason}"
            ))
        };
        // Without the (case-sensitive) `aws://` prefix the ID is kept, even when malformed.
        assert_eq!(handle("vol-0123"), ok("vol-0123"));
        assert_eq!(handle(""), ok(""));
        assert_eq!(handle("AWS://z/vol-1"), ok("AWS://z/vol-1"));
        assert_eq!(handle("aws:/z/vol-1"), ok("aws:/z/vol-1"));
        // The path is decoded and trimmed of `/`; query and fragment are dropped.
        assert_eq!(handle("aws://us-east-1a/vol-0123"), ok("vol-0123"));
        assert_eq!(handle("aws:///vol-0123"), ok("vol-0123"));
        assert_eq!(handle("aws://z//vol-1//"), ok("vol-1"));
        assert_eq!(handle("aws://z/vol-%41b"), ok("vol-Ab"));
        assert_eq!(handle("aws://z/vol-%E6%97%A5"), ok("vol-日"));
        assert_eq!(handle("aws://z/vol-1?x=1#f"), ok("vol-1"));
        assert_eq!(handle("aws://user:pw@z:80/vol-1"), ok("vol-1"));
        assert_eq!(handle("aws://[fe80::1%25eth0]:80/vol-1"), ok("vol-1"));
        // The path must be one `vol-` segment.
        assert_eq!(handle("aws://vol-0123"), invalid("aws://vol-0123"));
        assert_eq!(handle("aws://z/x/vol-1"), invalid("aws://z/x/vol-1"));
        assert_eq!(handle("aws://z/vol-a%2Fb"), invalid("aws://z/vol-a%2Fb"));
        // URL errors carry Go's texts.
        let id = "aws://us east/vol-1";
        assert_eq!(
            handle(id),
            bad_url(id, id, "invalid character \" \" in host name")
        );
        let id = "aws://z/vol-%zz";
        assert_eq!(handle(id), bad_url(id, id, "invalid URL escape \"%zz\""));
        let id = "aws://z/vol-1\t";
        assert_eq!(
            handle(id),
            bad_url(
                id,
                "aws://z/vol-1\\t",
                "net/url: invalid control character in URL"
            )
        );
        // The fragment is checked last, and the error then names the whole ID.
        let id = "aws://z/vol-1#%zz";
        assert_eq!(handle(id), bad_url(id, id, "invalid URL escape \"%zz\""));
        let id = "aws://%41/vol-1";
        assert_eq!(handle(id), bad_url(id, id, "invalid URL escape \"%41\""));
        let id = "aws://z:x/vol-1";
        assert_eq!(
            handle(id),
            bad_url(id, id, "invalid port \":x\" after host")
        );
        let id = "aws://u|s@z/vol-1";
        assert_eq!(handle(id), bad_url(id, id, "net/url: invalid userinfo"));
        let id = "aws://[10.0.0.1]/vol-1";
        assert_eq!(handle(id), bad_url(id, id, "invalid IP-literal"));
        let id = "aws://[::1/vol-1";
        assert_eq!(handle(id), bad_url(id, id, "missing ']' in host"));
        let id = "aws://[1::2::3]/vol-1";
        assert_eq!(
            handle(id),
            bad_url(
                id,
                id,
                "invalid host: ParseAddr(\"1::2::3\"): multiple :: in address (at \":3\")"
            )
        );
    }

    #[test]
    fn go_quote_escapes_like_strconv_quote() {
        use super::go_url::quote;
        assert_eq!(quote(b"a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(quote(b"\t\n\x07\x7f\x01"), r#""\t\n\a\x7f\x01""#);
        assert_eq!(quote("é日".as_bytes()), "\"é日\"");
        assert_eq!(quote("\u{a0}\u{85}".as_bytes()), r#""\u00a0\u0085""#);
        assert_eq!(quote(b"%\xe6"), r#""%\xe6""#);
    }

    #[test]
    fn azure_disks_migrate_only_when_managed() {
        // The API server defaults a missing kind to Shared, which is refused.
        for kind in ["Shared", "Dedicated", "", "bogus"] {
            assert_eq!(
                translated(&azure_disk_pv(Some(kind), None)).map(|_| ()),
                Err(format!(
                    "{TRANSLATE}kind({kind}) is not supported in csi migration"
                )),
                "{kind}"
            );
        }
        for kind in [None, Some("Managed"), Some("managed"), Some("MANAGED")] {
            assert_eq!(
                attrs(&azure_disk_pv(kind, None)),
                map(&[("fstype", "ext4"), ("kind", "Managed")]),
                "{kind:?}"
            );
        }
        // Every caching mode is passed on, also an empty one.
        for caching in ["None", "ReadOnly", "ReadWrite", ""] {
            assert_eq!(
                attrs(&azure_disk_pv(None, Some(caching)))
                    .get("cachingmode")
                    .map(String::as_str),
                Some(caching)
            );
        }
    }

    #[test]
    fn azure_file_handles_name_the_pv_and_the_secret_namespace() {
        let file = |secret: &str, ns: Option<&str>| translated(&azure_file_pv(secret, ns));
        let csi = file("azure-storage-account-acct-secret", Some("ns")).expect("translates");
        assert_eq!(csi.volume_handle, "#acct#share#in-tree#ns");
        // The node-stage secret is the in-tree one, in the secret namespace.
        assert_eq!(
            csi.node_stage_secret_ref,
            Some(SecretReference {
                name: Some("azure-storage-account-acct-secret".into()),
                namespace: Some("ns".into()),
            })
        );
        // Without secretNamespace, the claim's namespace; an empty secretNamespace is refused.
        let claimed = with_claim_namespace(azure_file_pv("mysecret", None), "claim-ns");
        let csi = translated(&annotated_pv(
            claimed,
            "kubernetes.io/azure-file-resource-group",
            "rg",
        ))
        .expect("translates");
        assert_eq!(csi.volume_handle, "rg#mysecret#share#in-tree#claim-ns");
        assert_eq!(
            csi.node_stage_secret_ref.and_then(|s| s.name).as_deref(),
            Some("mysecret")
        );
        let refused = Err(format!(
            "{TRANSLATE}could not find a secret namespace in PersistentVolumeSource or ClaimRef"
        ));
        assert_eq!(file("mysecret", None).map(|_| ()), refused);
        let explicit_empty = with_claim_namespace(azure_file_pv("mysecret", Some("")), "claim-ns");
        assert_eq!(translated(&explicit_empty).map(|_| ()), refused);
    }

    #[test]
    fn azure_file_accounts_follow_the_library_regular_expression() {
        let cases = [
            ("azure-storage-account-acct-secret", Some("acct")),
            ("xazure-storage-account-acct-secretx", Some("acct")),
            (
                "azure-storage-account-a-secret-b-secret",
                Some("a-secret-b"),
            ),
            ("azure-storage-account---secret", Some("-")),
            ("azure-storage-account--secret", None),
            ("azure-storage-account-acct", None),
            (
                "azure-storage-account-azure-storage-account-x-secret",
                Some("azure-storage-account-x"),
            ),
            // `.` does not match a newline.
            ("azure-storage-account-a\nb-secret", None),
            ("azure-storage-account-a-secret\n-secret", Some("a")),
            (
                "azure-storage-account-\nazure-storage-account-b-secret",
                Some("b"),
            ),
            ("mysecret", None),
        ];
        for (secret, want) in cases {
            assert_eq!(azure_storage_account(secret), want, "{secret:?}");
        }
    }

    #[test]
    fn portworx_drops_read_only_and_takes_secrets_from_annotations() {
        let csi = translated(&portworx_pv()).expect("translates");
        assert_eq!(csi.read_only, None);
        assert_eq!(csi.controller_publish_secret_ref, None);
        // Only with both annotations (empty values count) are all five references set.
        let name_only = annotated_pv(portworx_pv(), "openstorage.io/auth-secret-name", "s");
        assert_eq!(
            translated(&name_only)
                .expect("translates")
                .controller_publish_secret_ref,
            None
        );
        let both = annotated_pv(name_only, "openstorage.io/auth-secret-namespace", "");
        let csi = translated(&both).expect("translates");
        let secret = Some(SecretReference {
            name: Some("s".into()),
            namespace: Some(String::new()),
        });
        for r in [
            &csi.controller_publish_secret_ref,
            &csi.node_stage_secret_ref,
            &csi.node_publish_secret_ref,
            &csi.controller_expand_secret_ref,
            &csi.node_expand_secret_ref,
        ] {
            assert_eq!(r, &secret);
        }
    }

    #[test]
    fn translation_errors_carry_the_attacher_prefix_and_one_metric_label() {
        let err = pv_volume(&ebs_pv("aws://zone/not-a-volume", None)).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "failed to translate in tree pv to CSI: failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://zone/not-a-volume)"
        );
        assert_eq!(err.metric_label(), "translation");
        assert_eq!(
            Error::from(TranslationError::AzureFileSecretNamespace).metric_label(),
            "translation"
        );
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
