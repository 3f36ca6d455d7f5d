//! Event filters: which VolumeAttachment updates are worth a trip through the queue.

use crate::k8s::lean::Va;

/// Decides whether a VolumeAttachment update (`old` → `new`) is enqueued
/// (`docs/design.md#va-update-filter`).
///
/// * Same `resourceVersion` (a periodic resync): enqueue.
/// * Neither object carries `status.attachError` / `status.detachError`: enqueue.
/// * Otherwise enqueue only if the objects differ in something other than `resourceVersion`,
///   `metadata.managedFields`, `status.attachError` and `status.detachError`, so that the
///   attacher's own error writes do not re-enqueue the object and defeat its backoff. The
///   cached copies keep a fingerprint of exactly that part of the object ([`Va::fingerprint`]).
pub fn should_enqueue_va_change(old: &Va, new: &Va) -> bool {
    if old.metadata.resource_version == new.metadata.resource_version {
        return true;
    }
    if !old.has_error() && !new.has_error() {
        return true;
    }
    old.fingerprint != new.fingerprint
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentStatus, VolumeError};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn va(rv: &str) -> VolumeAttachment {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some("va".into());
        va.metadata.resource_version = Some(rv.into());
        va.spec.attacher = "d".into();
        va.spec.node_name = "n".into();
        va.spec.source.persistent_volume_name = Some("pv".into());
        va
    }

    fn error(msg: &str) -> Option<VolumeError> {
        Some(VolumeError {
            message: Some(msg.into()),
            ..VolumeError::default()
        })
    }

    fn with_attach_error(mut va: VolumeAttachment, msg: &str) -> VolumeAttachment {
        va.status.get_or_insert_with(Default::default).attach_error = error(msg);
        va
    }

    fn with_detach_error(mut va: VolumeAttachment, msg: &str) -> VolumeAttachment {
        va.status.get_or_insert_with(Default::default).detach_error = error(msg);
        va
    }

    fn with_managed_fields(mut va: VolumeAttachment, manager: &str) -> VolumeAttachment {
        va.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(manager.into()),
            ..ManagedFieldsEntry::default()
        }]);
        va
    }

    fn attached(mut va: VolumeAttachment) -> VolumeAttachment {
        va.status = Some(VolumeAttachmentStatus {
            attached: true,
            ..va.status.unwrap_or_default()
        });
        va
    }

    fn with_finalizer(mut va: VolumeAttachment) -> VolumeAttachment {
        va.metadata.finalizers = Some(vec!["f".into()]);
        va
    }

    fn labelled(mut va: VolumeAttachment) -> VolumeAttachment {
        va.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
        va
    }

    #[test]
    fn va_changes_are_enqueued_only_when_they_matter() {
        let cases: Vec<(&str, VolumeAttachment, VolumeAttachment, bool)> = vec![
            (
                "a resync with no change is enqueued",
                va("1"),
                va("1"),
                true,
            ),
            (
                "a resync of a VA with an error is enqueued",
                with_attach_error(va("1"), "e"),
                with_attach_error(va("1"), "e"),
                true,
            ),
            (
                "an update without errors is enqueued",
                va("1"),
                va("2"),
                true,
            ),
            (
                "an update that only adds an attach error is not enqueued",
                va("1"),
                with_attach_error(va("2"), "e"),
                false,
            ),
            (
                "an update that only changes the attach error is not enqueued",
                with_attach_error(va("1"), "e1"),
                with_attach_error(va("2"), "e2"),
                false,
            ),
            (
                "an update that only removes the attach error is not enqueued",
                with_attach_error(va("1"), "e"),
                va("2"),
                false,
            ),
            (
                "an update that only adds a detach error is not enqueued",
                va("1"),
                with_detach_error(va("2"), "e"),
                false,
            ),
            (
                "an update of managed fields next to an error is not enqueued",
                with_attach_error(with_managed_fields(va("1"), "a"), "e"),
                with_attach_error(with_managed_fields(va("2"), "b"), "e"),
                false,
            ),
            (
                "an update of managed fields without any error is enqueued",
                with_managed_fields(va("1"), "a"),
                with_managed_fields(va("2"), "b"),
                true,
            ),
            (
                "an update that marks the VA attached next to an error is enqueued",
                with_attach_error(va("1"), "e"),
                attached(with_attach_error(va("2"), "e")),
                true,
            ),
            (
                "an update that adds a finalizer next to an error is enqueued",
                with_attach_error(va("1"), "e"),
                with_finalizer(with_attach_error(va("2"), "e")),
                true,
            ),
            (
                // The cache drops labels; the fingerprint still sees them, as Go compares
                // whole objects.
                "an update that only adds a label next to an error is enqueued",
                with_attach_error(va("1"), "e"),
                labelled(with_attach_error(va("2"), "e")),
                true,
            ),
        ];
        for (name, old, new, want) in cases {
            let (old, new) = (Va::from(old), Va::from(new));
            assert_eq!(should_enqueue_va_change(&old, &new), want, "{name}");
        }
    }
}
