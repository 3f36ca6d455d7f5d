//! Builders of test objects for the controller's unit tests (and the hub's): PVs, VAs and
//! CSINodes with just the fields a test cares about, and the in-tree PVs of every migration
//! plugin. They build API objects; `lean_*` gives their cached copies (through the watch's own
//! conversion), which is what the controller reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume,
    PersistentVolumeSpec, PortworxVolumeSource,
};
use k8s_openapi::api::storage::v1::{
    CSINode, CSINodeDriver, VolumeAttachment, VolumeAttachmentStatus, VolumeError,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::controller::source::pv_volume;
use crate::k8s::lean::{CsiNode, Pv, Va};
use crate::names::NODE_ID_ANNOTATION;

/// The driver of the fixtures.
pub(crate) const DRIVER: &str = "hostpath.csi.k8s.io";

pub(crate) const FIN: &str = "external-attacher/hostpath-csi-k8s-io";

pub(crate) fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The cached copy of `va`, as the watch makes it.
pub(crate) fn lean_va(va: &VolumeAttachment) -> Va {
    Va::from(va.clone())
}

/// The cached copy of `pv`, as the watch makes it.
pub(crate) fn lean_pv(pv: &PersistentVolume) -> Pv {
    Pv::from(pv.clone())
}

/// The cached copy of `csinode`, as the watch makes it.
pub(crate) fn lean_csinode(csinode: &CSINode) -> CsiNode {
    CsiNode::from(csinode.clone())
}

pub(crate) fn now() -> Time {
    Time(Timestamp::from_second(1_700_000_000).expect("valid timestamp"))
}

pub(crate) fn csi_spec(modes: &[&str]) -> PersistentVolumeSpec {
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

pub(crate) fn pv(name: &str, spec: PersistentVolumeSpec) -> PersistentVolume {
    let mut pv = PersistentVolume::default();
    pv.metadata.name = Some(name.into());
    pv.spec = Some(spec);
    pv
}

pub(crate) fn deleting(mut pv: PersistentVolume) -> PersistentVolume {
    pv.metadata.deletion_timestamp = Some(now());
    pv
}

pub(crate) fn pv_finalizers(mut pv: PersistentVolume, f: Option<&[&str]>) -> PersistentVolume {
    pv.metadata.finalizers = f.map(strings);
    pv
}

pub(crate) fn annotated_pv(mut pv: PersistentVolume, k: &str, v: &str) -> PersistentVolume {
    pv.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(k.into(), v.into());
    pv
}

pub(crate) fn va(pv_name: Option<&str>) -> VolumeAttachment {
    let mut va = VolumeAttachment::default();
    va.metadata.name = Some("va".into());
    va.spec.attacher = DRIVER.into();
    va.spec.node_name = "node".into();
    va.spec.source.persistent_volume_name = pv_name.map(Into::into);
    va
}

pub(crate) fn va_finalizers(mut va: VolumeAttachment, f: &[&str]) -> VolumeAttachment {
    va.metadata.finalizers = Some(strings(f));
    va
}

pub(crate) fn va_annotated(mut va: VolumeAttachment, id: &str) -> VolumeAttachment {
    va.metadata.annotations = Some(map(&[(NODE_ID_ANNOTATION, id)]));
    va
}

pub(crate) fn with_status(
    mut va: VolumeAttachment,
    status: VolumeAttachmentStatus,
) -> VolumeAttachment {
    va.status = Some(status);
    va
}

pub(crate) fn csinode(drivers: &[(&str, &str)]) -> CSINode {
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

pub(crate) fn verr(msg: &str) -> Option<VolumeError> {
    Some(VolumeError {
        message: Some(msg.into()),
        ..VolumeError::default()
    })
}

pub(crate) fn in_tree(spec: PersistentVolumeSpec) -> PersistentVolume {
    pv(
        "in-tree",
        PersistentVolumeSpec {
            access_modes: Some(strings(&["ReadWriteOnce"])),
            ..spec
        },
    )
}

pub(crate) fn with_labels(mut pv: PersistentVolume, labels: &[(&str, &str)]) -> PersistentVolume {
    pv.metadata.labels = Some(map(labels));
    pv
}

pub(crate) fn with_claim_namespace(mut pv: PersistentVolume, ns: &str) -> PersistentVolume {
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
pub(crate) fn translated(pv: &PersistentVolume) -> Result<CSIPersistentVolumeSource, String> {
    let volume = pv_volume(&lean_pv(pv)).map_err(|e| e.to_string())?;
    assert!(volume.migrated && !volume.inline && volume.repairs_handle());
    volume.csi().cloned().map_err(|e| e.to_string())
}

pub(crate) fn attrs(pv: &PersistentVolume) -> BTreeMap<String, String> {
    translated(pv)
        .expect("translates")
        .volume_attributes
        .unwrap_or_default()
}

pub(crate) fn gce_pv(partition: Option<i32>, labels: &[(&str, &str)]) -> PersistentVolume {
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

pub(crate) fn ebs_pv(id: &str, partition: Option<i32>) -> PersistentVolume {
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

pub(crate) fn azure_disk_pv(kind: Option<&str>, caching: Option<&str>) -> PersistentVolume {
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

pub(crate) fn azure_file_pv(secret: &str, ns: Option<&str>) -> PersistentVolume {
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

pub(crate) fn portworx_pv() -> PersistentVolume {
    in_tree(PersistentVolumeSpec {
        portworx_volume: Some(PortworxVolumeSource {
            volume_id: "px-1".into(),
            fs_type: Some("ext4".into()),
            read_only: Some(true),
        }),
        ..PersistentVolumeSpec::default()
    })
}

/// The GA zone label.
pub(crate) const GA_ZONE: &str = "topology.kubernetes.io/zone";

/// The beta zone label, read first.
pub(crate) const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";

/// external-attacher's prefix of translation errors.
pub(crate) const TRANSLATE: &str = "failed to translate in tree pv to CSI: ";
