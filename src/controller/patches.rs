//! Every PATCH body the attacher writes (`docs/design.md#attach`, `docs/design.md#detach`,
//! `docs/design.md#pv-finalizer`) and the PV decisions around them: VA metadata and status merge
//! patches, PV finalizer JSON patches, which PV events to queue and when a PV loses our
//! finalizer.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};

use super::translation::is_migratable_in_tree;
use crate::k8s::lean::{Pairs, Pv, Va};
use crate::names::{MIGRATED_TO_ANNOTATION, NODE_ID_ANNOTATION, finalizer_name};

/// The JSON merge patch on the VA's main resource that adds our finalizer and sets the node-ID
/// annotation (`docs/design.md#attach`, step 3), or `None` if both are already in place.
///
/// Only the missing parts are in the patch; `finalizers` carries the full new list because merge
/// patches replace arrays wholesale.
pub fn va_metadata_patch(va: &Va, driver: &str, node_id: &str) -> Option<Value> {
    let finalizer = finalizer_name(driver);
    let mut metadata = Map::new();
    let current = va.metadata.finalizers.as_deref().unwrap_or_default();
    if !current.contains(&finalizer) {
        let mut list = current.to_vec();
        list.push(finalizer);
        metadata.insert("finalizers".to_owned(), json!(list));
    }
    let annotated = va.metadata.annotation(NODE_ID_ANNOTATION) == Some(node_id);
    if !annotated {
        metadata.insert(
            "annotations".to_owned(),
            json!({ NODE_ID_ANNOTATION: node_id }),
        );
    }
    (!metadata.is_empty()).then(|| json!({ "metadata": metadata }))
}

/// The JSON merge patch on the VA's main resource that removes our finalizer
/// (`docs/design.md#detach`, step 5, first write): the remaining list, or `null` when none
/// remains. `None` if our finalizer is absent.
pub fn va_finalizer_removal_patch(va: &Va, driver: &str) -> Option<Value> {
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

/// The status merge patch of `markAsAttached` (`docs/design.md#attach`, step 6):
/// `attached: true`, `attachmentMetadata` = the publish context, `attachError: null`, each only
/// if it changes.
///
/// Like Go's `createMergePatch`, an empty map counts as absent and map changes are sent per key
/// (removed keys as `null`). Returns `{}` if nothing changes.
pub fn attached_status_patch(va: &Va, attachment_metadata: &BTreeMap<String, String>) -> Value {
    let old = &va.status;
    let mut status = Map::new();
    if !old.attached {
        status.insert("attached".to_owned(), Value::Bool(true));
    }
    if let Some(diff) = map_diff(&old.attachment_metadata, attachment_metadata) {
        status.insert("attachmentMetadata".to_owned(), diff);
    }
    if old.has_attach_error {
        status.insert("attachError".to_owned(), Value::Null);
    }
    wrap_status(status)
}

/// The status merge patch of `markAsDetached` (`docs/design.md#detach`, step 5, second write):
/// `attached: false`, `detachError: null`, `attachmentMetadata: null`, each only if it changes;
/// `None` if the status already says detached with no error or metadata.
pub fn detached_status_patch(va: &Va) -> Option<Value> {
    let old = &va.status;
    let mut status = Map::new();
    if old.attached {
        status.insert("attached".to_owned(), Value::Bool(false));
    }
    if old.has_detach_error {
        status.insert("detachError".to_owned(), Value::Null);
    }
    if !old.attachment_metadata.is_empty() {
        status.insert("attachmentMetadata".to_owned(), Value::Null);
    }
    (!status.is_empty()).then(|| wrap_status(status))
}

/// The status merge patch saving an attach error (`docs/design.md#attach`, step 5).
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

/// The status merge patch saving a detach error (`docs/design.md#detach`, step 4): message and
/// time only.
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
fn map_diff(old: &Pairs, new: &BTreeMap<String, String>) -> Option<Value> {
    match (old.is_empty(), new.is_empty()) {
        (true, true) => None,
        (true, false) => Some(json!(new)),
        (false, true) => Some(Value::Null),
        (false, false) => {
            let mut diff = Map::new();
            for (k, v) in new {
                if old.get(k) != Some(v.as_str()) {
                    diff.insert(k.clone(), json!(v));
                }
            }
            for (k, _) in old.iter().filter(|(k, _)| !new.contains_key(*k)) {
                diff.insert(k.to_owned(), Value::Null);
            }
            (!diff.is_empty()).then_some(Value::Object(diff))
        }
    }
}

/// The JSON Patch (RFC 6902) adding our finalizer to a PV (`docs/design.md#pv-finalizer`),
/// built from the cached copy so a concurrent change fails the `test` op; `None` if the
/// finalizer is present.
pub fn pv_finalizer_add_patch(pv: &Pv, driver: &str) -> Option<Value> {
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

/// The JSON Patch removing our finalizer found at `index` of the cached PV
/// (`docs/design.md#pv-finalizer`).
pub fn pv_finalizer_removal_patch(index: usize, driver: &str) -> Value {
    let path = format!("/metadata/finalizers/{index}");
    json!([
        { "op": "test", "path": path, "value": finalizer_name(driver) },
        { "op": "remove", "path": path },
    ])
}

/// True if the PV is in-tree, migratable to `driver`, and not (or no longer) marked as migrated
/// to it: CSI migration was turned off or rolled back.
fn migration_rolled_back(pv: &Pv, driver: &str) -> bool {
    let migrated_to = pv.metadata.annotation(MIGRATED_TO_ANNOTATION);
    is_migratable_in_tree(pv, driver) && migrated_to.is_none_or(|d| d != driver)
}

fn finalizer_index(pv: &Pv, driver: &str) -> Option<usize> {
    let finalizer = finalizer_name(driver);
    pv.metadata
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .position(|f| *f == finalizer)
}

/// The PV add/update event filter (`docs/design.md#pv-finalizer`): enqueue only a PV that
/// carries our finalizer and is being deleted or has had its CSI migration to this driver
/// rolled back.
pub fn should_enqueue_pv(pv: &Pv, driver: &str) -> bool {
    finalizer_index(pv, driver).is_some()
        && (pv.metadata.deletion_timestamp.is_some() || migration_rolled_back(pv, driver))
}

/// `SyncNewOrUpdatedPersistentVolume` (`docs/design.md#pv-finalizer`): the index of our
/// finalizer if it is to be removed now, `None` if the PV is to be left alone (the caller then
/// forgets the key).
///
/// `in_use` tells whether any VA in the cache, of any driver, names the PV (see
/// [`va_uses_pv`]): while one does, the finalizer stays (the VA's deletion re-enqueues the PV).
pub fn pv_needs_finalizer_removal(
    pv: &Pv,
    driver: &str,
    in_use: impl FnOnce(&str) -> bool,
) -> Option<usize> {
    if pv.metadata.deletion_timestamp.is_none() && !migration_rolled_back(pv, driver) {
        return None;
    }
    let index = finalizer_index(pv, driver)?;
    let name = pv.metadata.name.as_deref()?;
    (!in_use(name)).then_some(index)
}

/// Whether `va` names the PV `pv_name` (what keeps [`pv_needs_finalizer_removal`] from removing
/// the PV's finalizer).
pub fn va_uses_pv(va: &Va, pv_name: &str) -> bool {
    va.spec.source.persistent_volume_name.as_deref() == Some(pv_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::*;
    use k8s_openapi::api::core::v1::{
        GCEPersistentDiskVolumeSource, PersistentVolume, PersistentVolumeSpec,
    };
    use k8s_openapi::api::storage::v1::VolumeAttachmentStatus;

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
            assert_eq!(
                va_metadata_patch(&lean_va(&va), DRIVER, "id"),
                want,
                "{name}"
            );
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
            assert_eq!(
                va_finalizer_removal_patch(&lean_va(&va), DRIVER),
                want,
                "{name}"
            );
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
            assert_eq!(attached_status_patch(&lean_va(&va), &meta), want, "{name}");
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
            assert_eq!(detached_status_patch(&lean_va(&va)), want, "{name}");
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
            assert_eq!(
                pv_finalizer_add_patch(&lean_pv(&pv), DRIVER),
                want,
                "{name}"
            );
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
        let other_va = lean_va(&va(Some("other-pv")));
        let using_va = lean_va(&va(Some("pv")));
        let mut inline_va = va(None);
        inline_va.spec.source.inline_volume_spec = Some(csi_spec(&["ReadWriteOnce"]));
        let inline_va = lean_va(&inline_va);
        let none: &[&Va] = &[];
        let unrelated = [&other_va, &inline_va];
        let in_use = [&other_va, &using_va];
        let only_using = [&using_va];
        // (case, pv, driver, vas, removal index, should enqueue)
        type Case<'a> = (
            &'a str,
            PersistentVolume,
            &'a str,
            &'a [&'a Va],
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
            let pv = lean_pv(&pv);
            let in_use = |pv: &str| vas.iter().any(|va| va_uses_pv(va, pv));
            assert_eq!(
                pv_needs_finalizer_removal(&pv, driver, in_use),
                want,
                "{name}"
            );
            assert_eq!(should_enqueue_pv(&pv, driver), enqueue, "{name}");
        }
    }
}
