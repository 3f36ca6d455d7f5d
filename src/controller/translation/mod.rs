//! In-tree PVs of the seven CSI-migration plugins, translated to CSI as csi-translation-lib
//! v0.37.2 does (`plugins/*.go`), the version the reference external-attacher v4.13.0 is built
//! with, field by field, including its quirks (a zero GCE partition gives `partition: ""`, a
//! zero EBS partition `partition: "0"`, ...). It is checked against the library itself by
//! `tests/standalone/translation_oracle.rs`, which compares thousands of generated PVs with the output of
//! the Go tool `translation-oracle` (tools/testbins/csi).

mod azure;
mod ebs;
mod error;
mod gce;
mod go_url;
mod plugin;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolumeSpec, SecretReference,
};

pub use error::TranslationError;
pub use gce::gce_region_from_zones;
use plugin::Translation;
pub use plugin::{InTreePlugin, is_migratable_in_tree, is_migration_driver};

use crate::k8s::lean::Pv;
use crate::names::{PORTWORX_SECRET_NAME_ANNOTATION, PORTWORX_SECRET_NAMESPACE_ANNOTATION};

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
///   `gce_backward_compatible_access_modes`).
/// * AWS EBS: handle from `ebs_volume_id`; attribute `partition` always (`"0"` for 0).
/// * Azure Disk: refused unless `kind` is missing or `Managed` (any case); handle = `diskURI`
///   (not parsed); attributes `kind: Managed`, `cachingmode` when set (also empty), `fstype`
///   when set (also copied to fsType); readOnly copied.
/// * Azure File: handle `<rg>#<account>#<share>#<pv name>#<namespace>` (rg from the
///   `kubernetes.io/azure-file-resource-group` annotation, account from
///   `azure_storage_account`, namespace = `secretNamespace` if set, even empty, else the
///   claimRef's namespace; an empty namespace is refused); attribute `sharename`; node-stage
///   secret = the in-tree secret name in that namespace; readOnly copied.
/// * Cinder: handle = `volumeID`, readOnly and fsType copied, no attributes.
/// * vSphere: handle = `volumePath`, fsType copied, attribute `storagepolicyname` when
///   non-empty; never read-only.
/// * Portworx: handle = `volumeID`, fsType copied, readOnly dropped; all five secret
///   references from the `openstorage.io/auth-secret-name` / `-namespace` annotations when both
///   are present.
pub fn translate_in_tree(
    pv: &Pv,
    plugin: InTreePlugin,
) -> Result<PersistentVolumeSpec, TranslationError> {
    let mut t = Translation {
        pv,
        spec: pv.spec.to_api(),
        csi: CSIPersistentVolumeSource {
            driver: plugin.driver_name().to_owned(),
            ..CSIPersistentVolumeSource::default()
        },
        attrs: BTreeMap::new(),
    };
    match plugin {
        InTreePlugin::GcePersistentDisk => gce::translate(&mut t)?,
        InTreePlugin::AwsElasticBlockStore => ebs::translate(&mut t)?,
        InTreePlugin::AzureDisk => azure::translate_disk(&mut t)?,
        InTreePlugin::AzureFile => azure::translate_file(&mut t)?,
        InTreePlugin::Cinder => cinder(&mut t),
        InTreePlugin::VsphereVolume => vsphere(&mut t),
        InTreePlugin::PortworxVolume => portworx(&mut t),
    }
    let Translation {
        mut spec,
        mut csi,
        attrs,
        ..
    } = t;
    csi.volume_attributes = Some(attrs);
    spec.csi = Some(csi);
    Ok(spec)
}

/// Cinder: handle = `volumeID`, readOnly and fsType copied, no attributes.
fn cinder(t: &mut Translation<'_>) {
    let src = t.spec.cinder.take().unwrap_or_default();
    t.csi.volume_handle = src.volume_id;
    t.csi.read_only = src.read_only;
    t.csi.fs_type = src.fs_type;
}

/// vSphere: handle = `volumePath`, fsType copied, `storagepolicyname` when non-empty.
fn vsphere(t: &mut Translation<'_>) {
    let src = t.spec.vsphere_volume.take().unwrap_or_default();
    t.csi.volume_handle = src.volume_path;
    t.csi.fs_type = src.fs_type;
    if let Some(policy) = src.storage_policy_name.filter(|p| !p.is_empty()) {
        t.attrs.insert("storagepolicyname".to_owned(), policy);
    }
}

/// Portworx: handle = `volumeID`, fsType copied, readOnly dropped, secrets from annotations.
fn portworx(t: &mut Translation<'_>) {
    let src = t.spec.portworx_volume.take().unwrap_or_default();
    t.csi.volume_handle = src.volume_id;
    t.csi.fs_type = src.fs_type;
    // readOnly is not carried over (the library leaves it false).
    if let (Some(name), Some(namespace)) = (
        t.annotation(PORTWORX_SECRET_NAME_ANNOTATION),
        t.annotation(PORTWORX_SECRET_NAMESPACE_ANNOTATION),
    ) {
        let secret = Some(SecretReference {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
        });
        t.csi.controller_publish_secret_ref = secret.clone();
        t.csi.node_stage_secret_ref = secret.clone();
        t.csi.node_publish_secret_ref = secret.clone();
        t.csi.controller_expand_secret_ref = secret.clone();
        t.csi.node_expand_secret_ref = secret;
    }
}

/// csi-translation-lib's `RepairVolumeHandle` as the reconciler uses it for
/// in-tree PVs and inline volumes, with `driver` = the CSI source's driver:
/// `None` (the reconciler skips the VA) for drivers that are not migration
/// targets and where the library fails; GCE PD fills an `UNSPECIFIED` project
/// from the node ID, and an `UNSPECIFIED` zone from the node's zone (or an
/// `UNSPECIFIED` region from the region of the node's zone); every other
/// migration driver keeps the handle. Checked against the library by
/// `tests/standalone/translation_oracle.rs`.
pub fn repair_volume_handle(driver: &str, handle: &str, node_id: &str) -> Option<String> {
    if !is_migration_driver(driver) {
        return None;
    }
    if driver != InTreePlugin::GcePersistentDisk.driver_name() {
        return Some(handle.to_string());
    }
    gce::repair_volume_handle(handle, node_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::error::Error;
    use crate::controller::fixtures::*;
    use crate::controller::source::pv_volume;
    use k8s_openapi::api::core::v1::{
        CinderPersistentVolumeSource, PersistentVolume, VsphereVirtualDiskVolumeSource,
    };

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
            let vol = pv_volume(&lean_pv(&pv)).expect(name);
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
            assert!(is_migratable_in_tree(&lean_pv(&pv), driver), "{name}");
            assert!(is_migration_driver(driver), "{name}");
            assert!(!is_migratable_in_tree(&lean_pv(&pv), DRIVER), "{name}");
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
    fn translation_errors_carry_the_attacher_prefix() {
        let err =
            pv_volume(&lean_pv(&ebs_pv("aws://zone/not-a-volume", None))).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "failed to translate in tree pv to CSI: failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://zone/not-a-volume)"
        );
        assert_eq!(
            Error::from(TranslationError::AzureFileSecretNamespace).to_string(),
            "failed to translate in tree pv to CSI: could not find a secret namespace in PersistentVolumeSource or ClaimRef"
        );
    }

    #[test]
    fn gce_pd_handles_get_project_and_zone_from_the_node() {
        let node = "projects/p1/zones/us-central1-a/instances/n1";
        assert_eq!(
            repair_volume_handle(
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
                node
            )
            .as_deref(),
            Some("projects/p1/zones/us-central1-a/disks/d")
        );
        assert_eq!(
            repair_volume_handle(
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/regions/us-central1/disks/d",
                node
            )
            .as_deref(),
            Some("projects/p1/regions/us-central1/disks/d")
        );
        assert_eq!(
            repair_volume_handle("pd.csi.storage.gke.io", "projects/p2/zones/z/disks/d", node)
                .as_deref(),
            Some("projects/p2/zones/z/disks/d")
        );
    }

    #[test]
    fn gce_pd_regions_come_from_the_node_zone_and_set_projects_need_no_node() {
        const GCE: &str = "pd.csi.storage.gke.io";
        let node = "projects/p1/zones/us-central1-a/instances/n1";
        // An UNSPECIFIED region is the region of the node's zone (csi-translation-lib).
        assert_eq!(
            repair_volume_handle(
                GCE,
                "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
                node
            )
            .as_deref(),
            Some("projects/p1/regions/us-central1/disks/d")
        );
        // ... and the VA is skipped when the node's zone has no region.
        let odd_node = "projects/p1/zones/zone/instances/n1";
        assert_eq!(
            repair_volume_handle(
                GCE,
                "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
                odd_node
            ),
            None
        );
        // A handle with a project is kept whatever the node ID.
        assert_eq!(
            repair_volume_handle(GCE, "projects/p2/zones/z/disks/d", "").as_deref(),
            Some("projects/p2/zones/z/disks/d")
        );
        for bad in [
            "projects/UNSPECIFIED/other/x/disks/d",
            "projects/UNSPECIFIED/zones",
        ] {
            assert_eq!(repair_volume_handle(GCE, bad, node), None, "{bad}");
        }
        assert_eq!(
            repair_volume_handle(GCE, "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d", "n1"),
            None
        );
    }

    #[test]
    fn other_migration_drivers_keep_the_handle_and_non_migration_drivers_are_skipped() {
        assert_eq!(
            repair_volume_handle("ebs.csi.aws.com", "vol-1", "i-1").as_deref(),
            Some("vol-1")
        );
        assert_eq!(repair_volume_handle("hostpath.csi.k8s.io", "v", "n"), None);
    }
}
