//! The cached PersistentVolume.

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource,
    ObjectReference, PersistentVolume, PersistentVolumeSpec, PortworxVolumeSource, SecretReference,
    VsphereVirtualDiskVolumeSource,
};

use super::{Cached, Meta, MetaFields, Pairs};
use crate::names::{
    AZURE_FILE_RESOURCE_GROUP_ANNOTATION, BETA_ZONE_LABEL, GA_ZONE_LABEL, MIGRATED_TO_ANNOTATION,
    PORTWORX_SECRET_NAME_ANNOTATION, PORTWORX_SECRET_NAMESPACE_ANNOTATION,
};

/// What [`Pv::from`] keeps of the metadata: the labels and annotations that translation and the
/// migration roll-back check read.
const KEPT: MetaFields<'static> = MetaFields {
    identity: false,
    labels: &[BETA_ZONE_LABEL, GA_ZONE_LABEL],
    annotations: &[
        MIGRATED_TO_ANNOTATION,
        AZURE_FILE_RESOURCE_GROUP_ANNOTATION,
        PORTWORX_SECRET_NAME_ANNOTATION,
        PORTWORX_SECRET_NAMESPACE_ANNOTATION,
    ],
};

/// A cached PersistentVolume: what the attacher reads of it (see the [module docs](super)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pv {
    /// Name, finalizers, deletion timestamp, the zone labels and the annotations translation
    /// reads.
    pub metadata: Meta,
    /// The volume sources and what the capability is made of.
    pub spec: PvSpec,
}

/// The part of a PV's `spec` the attacher reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PvSpec {
    /// `csi`, whole.
    pub csi: Option<CsiSource>,
    /// The migratable in-tree source, if the PV has one.
    pub in_tree: Option<InTreeSource>,
    /// `accessModes` (`None` and empty differ in what translation gives back).
    pub access_modes: Option<Box<[String]>>,
    /// `volumeMode`.
    pub volume_mode: Option<Box<str>>,
    /// `mountOptions`.
    pub mount_options: Option<Box<[String]>>,
    /// `claimRef.namespace`: where an in-tree Azure File PV's secret is when its source names
    /// no namespace.
    pub claim_namespace: Option<Box<str>>,
}

/// `spec.csi` of a PV: every field of `CSIPersistentVolumeSource`, in compact containers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CsiSource {
    /// `driver`.
    pub driver: Box<str>,
    /// `volumeHandle`.
    pub volume_handle: Box<str>,
    /// `fsType`.
    pub fs_type: Option<Box<str>>,
    /// `readOnly`.
    pub read_only: Option<bool>,
    /// `volumeAttributes` (`None` when absent).
    pub volume_attributes: Option<Pairs>,
    /// `controllerPublishSecretRef`.
    pub controller_publish_secret_ref: Option<Box<SecretReference>>,
    /// `nodeStageSecretRef`.
    pub node_stage_secret_ref: Option<Box<SecretReference>>,
    /// `nodePublishSecretRef`.
    pub node_publish_secret_ref: Option<Box<SecretReference>>,
    /// `controllerExpandSecretRef`.
    pub controller_expand_secret_ref: Option<Box<SecretReference>>,
    /// `nodeExpandSecretRef`.
    pub node_expand_secret_ref: Option<Box<SecretReference>>,
}

/// The in-tree source of a PV that CSI migration can translate (the seven plugins of
/// csi-translation-lib), boxed: they are rare, and the PVs without one pay a pointer.
#[derive(Clone, Debug, PartialEq)]
pub enum InTreeSource {
    /// `gcePersistentDisk`.
    GcePersistentDisk(Box<GCEPersistentDiskVolumeSource>),
    /// `awsElasticBlockStore`.
    AwsElasticBlockStore(Box<AWSElasticBlockStoreVolumeSource>),
    /// `azureDisk`.
    AzureDisk(Box<AzureDiskVolumeSource>),
    /// `azureFile`.
    AzureFile(Box<AzureFilePersistentVolumeSource>),
    /// `cinder`.
    Cinder(Box<CinderPersistentVolumeSource>),
    /// `vsphereVolume`.
    VsphereVolume(Box<VsphereVirtualDiskVolumeSource>),
    /// `portworxVolume`.
    PortworxVolume(Box<PortworxVolumeSource>),
}

impl Cached for Pv {
    fn name(&self) -> &str {
        self.metadata.name_or_empty()
    }
}

impl From<PersistentVolume> for Pv {
    fn from(pv: PersistentVolume) -> Self {
        let PersistentVolume { metadata, spec, .. } = pv;
        Self {
            metadata: Meta::from_api(metadata, &KEPT),
            spec: spec.map(PvSpec::from).unwrap_or_default(),
        }
    }
}

impl From<PersistentVolumeSpec> for PvSpec {
    fn from(spec: PersistentVolumeSpec) -> Self {
        let PersistentVolumeSpec {
            csi,
            gce_persistent_disk,
            aws_elastic_block_store,
            azure_disk,
            azure_file,
            cinder,
            vsphere_volume,
            portworx_volume,
            access_modes,
            volume_mode,
            mount_options,
            claim_ref,
            ..
        } = spec;
        // The order of csi-translation-lib's plugin list (the first one used wins; the API
        // server admits one volume source per PV anyway).
        let in_tree = None
            .or(gce_persistent_disk.map(|s| InTreeSource::GcePersistentDisk(Box::new(s))))
            .or(aws_elastic_block_store.map(|s| InTreeSource::AwsElasticBlockStore(Box::new(s))))
            .or(azure_disk.map(|s| InTreeSource::AzureDisk(Box::new(s))))
            .or(azure_file.map(|s| InTreeSource::AzureFile(Box::new(s))))
            .or(cinder.map(|s| InTreeSource::Cinder(Box::new(s))))
            .or(vsphere_volume.map(|s| InTreeSource::VsphereVolume(Box::new(s))))
            .or(portworx_volume.map(|s| InTreeSource::PortworxVolume(Box::new(s))));
        Self {
            csi: csi.map(CsiSource::from),
            in_tree,
            access_modes: access_modes.map(Vec::into_boxed_slice),
            volume_mode: volume_mode.map(String::into_boxed_str),
            mount_options: mount_options.map(Vec::into_boxed_slice),
            claim_namespace: claim_ref
                .and_then(|c| c.namespace)
                .map(String::into_boxed_str),
        }
    }
}

impl PvSpec {
    /// The spec as the API types hold it, with only the kept fields set: what translation and
    /// the capability are computed from.
    pub fn to_api(&self) -> PersistentVolumeSpec {
        let mut spec = PersistentVolumeSpec {
            csi: self.csi.as_ref().map(CsiSource::to_api),
            access_modes: self.access_modes.as_ref().map(|m| m.to_vec()),
            volume_mode: self.volume_mode.as_deref().map(str::to_owned),
            mount_options: self.mount_options.as_ref().map(|m| m.to_vec()),
            claim_ref: self.claim_namespace.as_deref().map(|ns| ObjectReference {
                namespace: Some(ns.to_owned()),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        };
        match self.in_tree.clone() {
            None => {}
            Some(InTreeSource::GcePersistentDisk(s)) => spec.gce_persistent_disk = Some(*s),
            Some(InTreeSource::AwsElasticBlockStore(s)) => spec.aws_elastic_block_store = Some(*s),
            Some(InTreeSource::AzureDisk(s)) => spec.azure_disk = Some(*s),
            Some(InTreeSource::AzureFile(s)) => spec.azure_file = Some(*s),
            Some(InTreeSource::Cinder(s)) => spec.cinder = Some(*s),
            Some(InTreeSource::VsphereVolume(s)) => spec.vsphere_volume = Some(*s),
            Some(InTreeSource::PortworxVolume(s)) => spec.portworx_volume = Some(*s),
        }
        spec
    }
}

impl From<CSIPersistentVolumeSource> for CsiSource {
    fn from(csi: CSIPersistentVolumeSource) -> Self {
        let CSIPersistentVolumeSource {
            driver,
            volume_handle,
            fs_type,
            read_only,
            volume_attributes,
            controller_publish_secret_ref,
            node_stage_secret_ref,
            node_publish_secret_ref,
            controller_expand_secret_ref,
            node_expand_secret_ref,
        } = csi;
        Self {
            driver: driver.into_boxed_str(),
            volume_handle: volume_handle.into_boxed_str(),
            fs_type: fs_type.map(String::into_boxed_str),
            read_only,
            volume_attributes: volume_attributes.map(Pairs::from),
            controller_publish_secret_ref: controller_publish_secret_ref.map(Box::new),
            node_stage_secret_ref: node_stage_secret_ref.map(Box::new),
            node_publish_secret_ref: node_publish_secret_ref.map(Box::new),
            controller_expand_secret_ref: controller_expand_secret_ref.map(Box::new),
            node_expand_secret_ref: node_expand_secret_ref.map(Box::new),
        }
    }
}

impl CsiSource {
    /// The source as the API types hold it.
    pub fn to_api(&self) -> CSIPersistentVolumeSource {
        let secret = |r: &Option<Box<SecretReference>>| r.as_deref().cloned();
        CSIPersistentVolumeSource {
            driver: self.driver.to_string(),
            volume_handle: self.volume_handle.to_string(),
            fs_type: self.fs_type.as_deref().map(str::to_owned),
            read_only: self.read_only,
            volume_attributes: self.volume_attributes.as_ref().map(|a| {
                a.iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect()
            }),
            controller_publish_secret_ref: secret(&self.controller_publish_secret_ref),
            node_stage_secret_ref: secret(&self.node_stage_secret_ref),
            node_publish_secret_ref: secret(&self.node_publish_secret_ref),
            controller_expand_secret_ref: secret(&self.controller_expand_secret_ref),
            node_expand_secret_ref: secret(&self.node_expand_secret_ref),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{NFSVolumeSource, VolumeNodeAffinity};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn secret(name: &str) -> Option<SecretReference> {
        Some(SecretReference {
            name: Some(name.into()),
            namespace: Some("ns".into()),
        })
    }

    /// Every field the attacher reads set, and some it does not.
    fn full_spec() -> PersistentVolumeSpec {
        PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "d".into(),
                volume_handle: "h".into(),
                fs_type: Some("xfs".into()),
                read_only: Some(true),
                volume_attributes: Some(map(&[("a", "1"), ("b", "2")])),
                controller_publish_secret_ref: secret("cp"),
                node_stage_secret_ref: secret("ns"),
                node_publish_secret_ref: secret("np"),
                controller_expand_secret_ref: secret("ce"),
                node_expand_secret_ref: secret("ne"),
            }),
            access_modes: Some(strings(&["ReadWriteOnce", "ReadOnlyMany"])),
            volume_mode: Some("Block".into()),
            mount_options: Some(strings(&["ro", "noatime"])),
            claim_ref: Some(ObjectReference {
                name: Some("claim".into()),
                namespace: Some("claims".into()),
                uid: Some("u".into()),
                ..ObjectReference::default()
            }),
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
            node_affinity: Some(VolumeNodeAffinity::default()),
            storage_class_name: Some("fast".into()),
            ..PersistentVolumeSpec::default()
        }
    }

    #[test]
    fn a_cached_pv_gives_back_every_field_the_attacher_reads() {
        let mut api = PersistentVolume::default();
        api.metadata.name = Some("pv-1".into());
        api.metadata.uid = Some("uid".into());
        api.metadata.resource_version = Some("7".into());
        api.metadata.finalizers = Some(strings(&["kubernetes.io/pv-protection"]));
        api.metadata.labels = Some(map(&[
            (BETA_ZONE_LABEL, "z1"),
            (GA_ZONE_LABEL, "z2"),
            ("team", "x"),
        ]));
        api.metadata.annotations = Some(map(&[
            (MIGRATED_TO_ANNOTATION, "pd.csi.storage.gke.io"),
            (AZURE_FILE_RESOURCE_GROUP_ANNOTATION, "rg"),
            (PORTWORX_SECRET_NAME_ANNOTATION, "s"),
            (PORTWORX_SECRET_NAMESPACE_ANNOTATION, "sn"),
            ("pv.kubernetes.io/provisioned-by", "d"),
        ]));
        api.spec = Some(full_spec());
        let pv = Pv::from(api);

        assert_eq!(pv.metadata.name.as_deref(), Some("pv-1"));
        assert_eq!(
            (pv.metadata.uid, pv.metadata.resource_version),
            (None, None)
        );
        assert_eq!(
            pv.metadata.finalizers.as_deref(),
            Some(&strings(&["kubernetes.io/pv-protection"])[..])
        );
        assert_eq!(
            pv.metadata.labels.to_map(),
            Some(map(&[(BETA_ZONE_LABEL, "z1"), (GA_ZONE_LABEL, "z2")]))
        );
        assert_eq!(
            pv.metadata.annotations.to_map(),
            Some(map(&[
                (MIGRATED_TO_ANNOTATION, "pd.csi.storage.gke.io"),
                (AZURE_FILE_RESOURCE_GROUP_ANNOTATION, "rg"),
                (PORTWORX_SECRET_NAME_ANNOTATION, "s"),
                (PORTWORX_SECRET_NAMESPACE_ANNOTATION, "sn"),
            ]))
        );
        let full = full_spec();
        let back = pv.spec.to_api();
        assert_eq!(back.csi, full.csi, "the CSI source, whole");
        assert_eq!(back.access_modes, full.access_modes);
        assert_eq!(back.volume_mode, full.volume_mode);
        assert_eq!(back.mount_options, full.mount_options);
        assert_eq!(
            back.claim_ref.and_then(|c| c.namespace).as_deref(),
            Some("claims")
        );
        assert_eq!((back.capacity, back.node_affinity), (None, None));
    }

    #[test]
    fn absent_and_empty_lists_stay_apart() {
        let pv = |modes: Option<Vec<String>>| {
            Pv::from(PersistentVolume {
                spec: Some(PersistentVolumeSpec {
                    access_modes: modes,
                    ..PersistentVolumeSpec::default()
                }),
                ..PersistentVolume::default()
            })
        };
        assert_eq!(pv(None).spec.to_api().access_modes, None);
        assert_eq!(pv(Some(vec![])).spec.to_api().access_modes, Some(vec![]));
        let mut api = PersistentVolume::default();
        api.metadata.finalizers = Some(vec![]);
        assert_eq!(Pv::from(api).metadata.finalizers.as_deref(), Some(&[][..]));
        assert_eq!(
            Pv::from(PersistentVolume::default()).metadata.finalizers,
            None
        );
    }

    #[test]
    fn the_in_tree_source_is_kept_and_other_sources_are_not() {
        let gce = GCEPersistentDiskVolumeSource {
            pd_name: "disk".into(),
            ..GCEPersistentDiskVolumeSource::default()
        };
        let spec = PvSpec::from(PersistentVolumeSpec {
            gce_persistent_disk: Some(gce.clone()),
            ..PersistentVolumeSpec::default()
        });
        assert_eq!(spec.to_api().gce_persistent_disk, Some(gce));
        let nfs = PvSpec::from(PersistentVolumeSpec {
            nfs: Some(NFSVolumeSource::default()),
            ..PersistentVolumeSpec::default()
        });
        assert_eq!(nfs, PvSpec::default());
    }
}
