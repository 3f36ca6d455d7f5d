//! The cached VolumeAttachment.

use std::hash::Hasher;

use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
};

use super::{Cached, Meta, MetaFields, Pairs};
use crate::names::NODE_ID_ANNOTATION;

/// What [`Va::from`] keeps of the metadata.
const KEPT: MetaFields<'static> = MetaFields {
    identity: true,
    labels: &[],
    annotations: &[NODE_ID_ANNOTATION],
};

/// A cached VolumeAttachment: what the attacher reads of it (see the [module docs](super)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Va {
    /// Name, UID, resourceVersion, finalizers, the node-ID annotation, creation and deletion
    /// timestamps.
    pub metadata: Meta,
    /// The whole spec.
    pub spec: VaSpec,
    /// What the status says (all false and empty without a status).
    pub status: VaStatus,
    /// A hash of the object without `resourceVersion`, `managedFields`, `status.attachError`
    /// and `status.detachError`, for the update filter (`should_enqueue_va_change`).
    pub fingerprint: u64,
}

/// `spec` of a VolumeAttachment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VaSpec {
    /// `spec.attacher`: the driver that attaches it.
    pub attacher: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `spec.source`.
    pub source: VaSource,
}

/// `spec.source` of a VolumeAttachment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VaSource {
    /// `persistentVolumeName`.
    pub persistent_volume_name: Option<String>,
    /// `inlineVolumeSpec` (migrated inline volumes only): boxed, so that the VAs without one
    /// (nearly all) pay a pointer for it, not the size of a `PersistentVolumeSpec`.
    pub inline_volume_spec: Option<Box<PersistentVolumeSpec>>,
}

/// `status` of a VolumeAttachment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VaStatus {
    /// `attached`.
    pub attached: bool,
    /// `attachmentMetadata` (empty when absent: the attacher treats both alike).
    pub attachment_metadata: Pairs,
    /// Whether `attachError` is set.
    pub has_attach_error: bool,
    /// Whether `detachError` is set.
    pub has_detach_error: bool,
}

impl Va {
    /// Whether the status carries an attach or detach error.
    pub fn has_error(&self) -> bool {
        self.status.has_attach_error || self.status.has_detach_error
    }
}

impl Cached for Va {
    fn name(&self) -> &str {
        self.metadata.name_or_empty()
    }
}

impl From<VolumeAttachment> for Va {
    fn from(mut va: VolumeAttachment) -> Self {
        // What the update filter ignores comes out before the fingerprint is taken.
        let resource_version = va.metadata.resource_version.take();
        va.metadata.managed_fields = None;
        let (has_attach_error, has_detach_error) = match va.status.as_mut() {
            Some(s) => (
                s.attach_error.take().is_some(),
                s.detach_error.take().is_some(),
            ),
            None => (false, false),
        };
        // Go's status is a value, not a pointer: an absent status equals an empty one.
        if va
            .status
            .as_ref()
            .is_some_and(|s| *s == VolumeAttachmentStatus::default())
        {
            va.status = None;
        }
        let fingerprint = fingerprint(&va);

        let VolumeAttachment {
            mut metadata,
            spec:
                VolumeAttachmentSpec {
                    attacher,
                    node_name,
                    source:
                        VolumeAttachmentSource {
                            persistent_volume_name,
                            inline_volume_spec,
                        },
                },
            status,
        } = va;
        metadata.resource_version = resource_version;
        let status = status.unwrap_or_default();
        Self {
            metadata: Meta::from_api(metadata, &KEPT),
            spec: VaSpec {
                attacher,
                node_name,
                source: VaSource {
                    persistent_volume_name,
                    inline_volume_spec: inline_volume_spec.map(Box::new),
                },
            },
            status: VaStatus {
                attached: status.attached,
                attachment_metadata: status
                    .attachment_metadata
                    .map(Pairs::from)
                    .unwrap_or_default(),
                has_attach_error,
                has_detach_error,
            },
            fingerprint,
        }
    }
}

/// A 64-bit hash of `va`'s JSON form. std's `DefaultHasher::new()` has fixed keys, so equal
/// objects hash equal in every process and run.
fn fingerprint(va: &VolumeAttachment) -> u64 {
    struct HashWriter(std::hash::DefaultHasher);
    impl std::io::Write for HashWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.write(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = HashWriter(std::hash::DefaultHasher::new());
    // Serializing API types into a writer that never fails cannot fail (string-keyed maps
    // only); were it to, the part written still feeds the hash.
    let _ = serde_json::to_writer(&mut w, va);
    w.0.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::storage::v1::VolumeError;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    use super::*;

    fn api_va() -> VolumeAttachment {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some("csi-123".into());
        va.metadata.uid = Some("uid-1".into());
        va.metadata.resource_version = Some("42".into());
        va.metadata.finalizers = Some(vec!["external-attacher/d".into()]);
        va.metadata.labels = Some(BTreeMap::from([("l".into(), "v".into())]));
        va.metadata.annotations = Some(BTreeMap::from([
            (NODE_ID_ANNOTATION.into(), "node-1-id".into()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".into(),
                "{...}".into(),
            ),
        ]));
        va.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        va.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        va.spec.attacher = "d".into();
        va.spec.node_name = "node-1".into();
        va.spec.source.persistent_volume_name = Some("pv-1".into());
        va.status = Some(VolumeAttachmentStatus {
            attached: true,
            attachment_metadata: Some(BTreeMap::from([("k".into(), "v".into())])),
            attach_error: Some(VolumeError::default()),
            detach_error: None,
        });
        va
    }

    #[test]
    fn a_cached_va_keeps_what_the_attacher_reads() {
        let va = Va::from(api_va());
        assert_eq!(va.metadata.name.as_deref(), Some("csi-123"));
        assert_eq!(va.metadata.uid.as_deref(), Some("uid-1"));
        assert_eq!(va.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            va.metadata.finalizers.as_deref(),
            Some(&["external-attacher/d".to_owned()][..])
        );
        assert_eq!(
            va.metadata.annotation(NODE_ID_ANNOTATION),
            Some("node-1-id")
        );
        assert_eq!(
            va.metadata
                .annotation("kubectl.kubernetes.io/last-applied-configuration"),
            None
        );
        assert!(va.metadata.labels.is_empty());
        assert!(va.metadata.creation_timestamp.is_some());
        assert_eq!(va.spec.attacher, "d");
        assert_eq!(va.spec.node_name, "node-1");
        assert_eq!(
            va.spec.source.persistent_volume_name.as_deref(),
            Some("pv-1")
        );
        assert!(va.status.attached);
        assert_eq!(va.status.attachment_metadata.get("k"), Some("v"));
        assert!(va.status.has_attach_error && !va.status.has_detach_error);
        assert!(va.has_error());
    }

    #[test]
    fn fingerprints_ignore_exactly_what_the_update_filter_ignores() {
        let base = Va::from(api_va()).fingerprint;
        let changed = |f: &dyn Fn(&mut VolumeAttachment)| {
            let mut va = api_va();
            f(&mut va);
            Va::from(va).fingerprint != base
        };
        // Ignored: resourceVersion, managedFields, the errors.
        assert!(!changed(
            &|va| va.metadata.resource_version = Some("43".into())
        ));
        assert!(!changed(&|va| va.metadata.managed_fields = None));
        assert!(!changed(&|va| {
            let s = va.status.as_mut().expect("status");
            s.attach_error = Some(VolumeError {
                message: Some("other".into()),
                ..VolumeError::default()
            });
            s.detach_error = Some(VolumeError::default());
        }));
        // Compared: everything else, kept or not.
        assert!(changed(&|va| va.metadata.labels = None));
        assert!(changed(&|va| va.metadata.annotations = None));
        assert!(changed(&|va| va.metadata.finalizers = None));
        assert!(changed(&|va| va
            .status
            .as_mut()
            .expect("status")
            .attached = false));
        assert!(changed(&|va| va.spec.node_name = "node-2".into()));
        // An empty status counts as none (Go compares values).
        let mut bare = api_va();
        bare.status = None;
        let mut empty = api_va();
        empty.status = Some(VolumeAttachmentStatus {
            attach_error: Some(VolumeError::default()),
            ..VolumeAttachmentStatus::default()
        });
        assert_eq!(Va::from(bare).fingerprint, Va::from(empty).fingerprint);
    }
}
