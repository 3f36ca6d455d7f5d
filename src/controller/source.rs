//! Where a VA's volume comes from (`docs/design.md#volume-source`): a PV from the cache
//! (in-tree ones translated to CSI) or the VA's inline spec, checked and turned into the
//! [`Volume`] to publish.

use std::borrow::Borrow;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};

use super::error::{Error, Result};
use super::translation::{InTreePlugin, translate_in_tree};
use crate::k8s::lean::{Pv, Va};

/// Where a VA's volume comes from (`spec.source`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Source<'a> {
    /// `spec.source.persistentVolumeName`: look the PV up in the cache.
    PersistentVolume(&'a str),
    /// `spec.source.inlineVolumeSpec`, produced by kube-controller-manager for migrated inline
    /// volumes; its `csi` field is set (checked).
    Inline(&'a PersistentVolumeSpec),
}

/// Reads and checks `va.spec.source`: exactly one of a PV name and an inline spec with a CSI
/// source (`docs/design.md#volume-source`).
pub fn va_source(va: &Va) -> Result<Source<'_>> {
    let source = &va.spec.source;
    match (&source.persistent_volume_name, &source.inline_volume_spec) {
        (Some(_), Some(_)) => Err(Error::BothSources),
        (Some(name), None) => Ok(Source::PersistentVolume(name)),
        (None, Some(spec)) if spec.csi.is_some() => Ok(Source::Inline(spec)),
        (None, Some(_)) => Err(Error::InlineWithoutCsi),
        (None, None) => Err(Error::NoSource),
    }
}

/// Refuses to attach a PV that is being deleted: our PV finalizer is removed only from such a
/// PV, so attach and removal never race (`docs/design.md#pv-finalizer`).
pub fn check_pv_attachable(pv: &Pv) -> Result<()> {
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
/// plugins (`docs/design.md#volume-source`). A PV that is neither CSI nor translatable →
/// [`Error::NotCsi`].
pub fn pv_volume(pv: &Pv) -> Result<Volume> {
    let spec = pv.spec.to_api();
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
pub fn volume_source<P: Borrow<Pv>>(
    va: &Va,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::*;
    use k8s_openapi::api::core::v1::NFSVolumeSource;

    #[test]
    fn volume_sources_resolve_or_fail_with_the_spec_texts() {
        let csi_pv = lean_pv(&pv("pv", csi_spec(&["ReadWriteOnce"])));
        let nfs_pv = lean_pv(&pv(
            "nfs",
            PersistentVolumeSpec {
                nfs: Some(NFSVolumeSource::default()),
                ..PersistentVolumeSpec::default()
            },
        ));
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

        let ok = volume_source(&lean_va(&va(Some("pv"))), lookup).expect("csi pv");
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
        let ok = volume_source(&lean_va(&inline(true)), lookup).expect("inline");
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
            let err = volume_source(&lean_va(&va), lookup).expect_err(want);
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn attach_is_refused_for_a_pv_marked_for_deletion() {
        let p = pv("pv-1", csi_spec(&["ReadWriteOnce"]));
        assert_eq!(check_pv_attachable(&lean_pv(&p)), Ok(()));
        assert_eq!(
            check_pv_attachable(&lean_pv(&deleting(p))).map_err(|e| e.to_string()),
            Err("PersistentVolume \"pv-1\" is marked for deletion".to_owned())
        );
    }
}
