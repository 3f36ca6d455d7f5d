//! The in-tree volume plugins csi-translation-lib migrates to CSI, their CSI drivers, and what
//! the translation of one plugin fills in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};

use crate::k8s::lean::{InTreeSource, Pv};

/// The in-tree volume plugins csi-translation-lib migrates, and their CSI drivers
/// (`docs/design.md#volume-source`, `docs/design.md#startup`).
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

    /// The plugin of a cached PV's in-tree source.
    pub fn of_cached(source: &InTreeSource) -> Self {
        match source {
            InTreeSource::GcePersistentDisk(_) => Self::GcePersistentDisk,
            InTreeSource::AwsElasticBlockStore(_) => Self::AwsElasticBlockStore,
            InTreeSource::AzureDisk(_) => Self::AzureDisk,
            InTreeSource::AzureFile(_) => Self::AzureFile,
            InTreeSource::Cinder(_) => Self::Cinder,
            InTreeSource::VsphereVolume(_) => Self::VsphereVolume,
            InTreeSource::PortworxVolume(_) => Self::PortworxVolume,
        }
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
pub fn is_migratable_in_tree(pv: &Pv, driver: &str) -> bool {
    pv.spec
        .in_tree
        .as_ref()
        .is_some_and(|s| InTreePlugin::of_cached(s).driver_name() == driver)
}

/// The parts of the CSI spec a plugin fills in: the spec (its in-tree source taken out), the
/// CSI source and its volume attributes.
pub(crate) struct Translation<'a> {
    /// The PV being translated (for its name, labels and annotations).
    pub(crate) pv: &'a Pv,
    /// Its spec, whose in-tree source the plugin takes out.
    pub(crate) spec: PersistentVolumeSpec,
    /// The CSI source being filled in.
    pub(crate) csi: CSIPersistentVolumeSource,
    /// Its `volumeAttributes`.
    pub(crate) attrs: BTreeMap<String, String>,
}

impl<'a> Translation<'a> {
    /// The PV's annotation `key`.
    pub(crate) fn annotation(&self, key: &str) -> Option<&'a str> {
        self.pv.metadata.annotation(key)
    }
}
