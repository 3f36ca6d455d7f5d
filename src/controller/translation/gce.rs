//! GCE PD (`gcePersistentDisk` -> `pd.csi.storage.gke.io`): volume handles from the zone
//! labels, regions from zones, backward-compatible access modes, and the reconciler's repair of
//! `UNSPECIFIED` handles.

use super::{error::TranslationError, plugin::Translation};
use crate::k8s::lean::Pv;
use crate::names::{BETA_ZONE_LABEL, GA_ZONE_LABEL};

/// GCE PD: the handle from the zone labels ([`gce_volume_handle`]); attribute `partition`, `""`
/// for 0; readOnly and fsType copied; access modes made backward compatible.
pub(crate) fn translate(t: &mut Translation<'_>) -> Result<(), TranslationError> {
    let src = t.spec.gce_persistent_disk.take().unwrap_or_default();
    t.csi.volume_handle = gce_volume_handle(t.pv, &src.pd_name)?;
    t.csi.read_only = src.read_only;
    t.csi.fs_type = src.fs_type;
    // Go formats a non-zero partition, and leaves "" for zero.
    let partition = src.partition.filter(|p| *p != 0);
    t.attrs.insert(
        "partition".to_owned(),
        partition.map(|p| p.to_string()).unwrap_or_default(),
    );
    t.spec.access_modes = t
        .spec
        .access_modes
        .as_deref()
        .map(gce_backward_compatible_access_modes);
    Ok(())
}

/// Separator of several zones in one zone label (regional disks).
const MULTI_ZONE_SEPARATOR: &str = "__";

/// Placeholder for an unknown GCE project or zone in a PD volume handle.
const GCE_UNSPECIFIED: &str = "UNSPECIFIED";

/// The GCE PD CSI volume handle for `pd_name`, zonal or regional from the PV's zone label.
///
/// The zone label: the beta one, or the GA one when the beta label is empty or missing
/// (csi-translation-lib reads them so).
fn gce_volume_handle(pv: &Pv, pd_name: &str) -> Result<String, TranslationError> {
    let label = |key: &str| pv.metadata.label(key).unwrap_or("");
    let mut zones_label = label(BETA_ZONE_LABEL);
    if zones_label.is_empty() {
        zones_label = label(GA_ZONE_LABEL);
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

/// The GCE PD part of [`repair_volume_handle`](super::repair_volume_handle): an `UNSPECIFIED`
/// project from the node ID, an `UNSPECIFIED` zone from the node's zone, an `UNSPECIFIED` region
/// from the region of the node's zone; `None` where csi-translation-lib fails.
pub(crate) fn repair_volume_handle(handle: &str, node_id: &str) -> Option<String> {
    // projects/<project>/{zones|regions}/<location>/disks/<name>
    let tok: Vec<&str> = handle.split('/').collect();
    if tok.len() < 6 {
        return None;
    }
    if tok[1] != GCE_UNSPECIFIED {
        return Some(handle.to_string());
    }
    // projects/<project>/zones/<zone>/instances/<name>
    let node: Vec<&str> = node_id.split('/').collect();
    if node.len() < 6 {
        return None;
    }
    let location = match tok[2] {
        "zones" if tok[3] == GCE_UNSPECIFIED => node[3].to_owned(),
        "regions" if tok[3] == GCE_UNSPECIFIED => gce_region_from_zones(&[node[3]]).ok()?,
        "zones" | "regions" => tok[3].to_owned(),
        _ => return None,
    };
    Some(format!(
        "projects/{}/{}/{location}/disks/{}",
        node[1], tok[2], tok[5]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::*;
    use crate::controller::source::pv_volume;

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
        assert_eq!(
            pv_volume(&lean_pv(&pv)).expect("gce").spec.access_modes,
            None
        );
    }
}
