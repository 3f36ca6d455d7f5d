//! Lean copies of the objects the shared caches hold: [`Va`], [`Pv`] and [`CsiNode`], each
//! keeping only what the attacher reads, made from the API object once, when the watch
//! delivers it ([`From`] the `k8s-openapi` type).
//!
//! # What is kept
//!
//! | kind | kept | read by |
//! |---|---|---|
//! | VolumeAttachment | name, UID, resourceVersion | queue keys; the echo check of our own `attached: true` write |
//! | | finalizers, the node-ID annotation | the finalizer and annotation patches; the node ID of a detach |
//! | | creation and deletion timestamps | attach or detach; the end-to-end latency histograms |
//! | | `spec` whole (the inline volume spec boxed, present only for migrated inline volumes) | routing, the node, the volume source |
//! | | `status`: `attached`, `attachmentMetadata`, whether an attach / detach error is set | the status patches, the update filter |
//! | | a fingerprint of everything else but resourceVersion, managedFields and the two errors | the update filter ([`Va::fingerprint`]) |
//! | PersistentVolume | name, finalizers, deletion timestamp | the PV finalizer patches, routing, attach refusal |
//! | | the two zone labels | GCE PD translation |
//! | | annotations `pv.kubernetes.io/migrated-to`, the Azure File resource group, the two Portworx secret ones | migration roll-back, translation |
//! | | `spec.csi` whole, the migratable in-tree source, access modes, volume mode, mount options, the claim's namespace | the CSI volume, its capability, translation (Azure File secrets) |
//! | CSINode | name, and each driver's name and node ID | the node ID |
//!
//! Everything else (other labels and annotations, `managedFields`, capacity, node affinity,
//! reclaim policy, storage class, PV status, the full claim reference, CSINode topology keys and
//! allocatable counts) is dropped on ingest. The readers are `crate::controller` (node IDs,
//! volume sources, translation, capabilities, patches, the update filter), `crate::hub`
//! (routing, queues, workers) and `crate::metrics` (end-to-end latency): anything they read
//! must be kept here, and the differential test (`tests/interop/differential.rs`, against the Go
//! attacher) and the translation oracle (`tests/standalone/translation_oracle.rs`, which goes through
//! [`Pv::from`]) fail when something they decide on is lost.
//!
//! The field paths are those of the API types (`va.spec.source.persistent_volume_name`,
//! `pv.metadata.finalizers`), so code reads a cached object as it reads the API object; the
//! containers are compact: boxed slices instead of vectors (no spare capacity), sorted pairs
//! ([`Pairs`]) instead of `BTreeMap`s (whose first node alone takes about 550 bytes), booleans
//! for error structs only tested for presence.
//!
//! # Why own types, not a transform of the API types
//!
//! A transform on ingest (clear every field not read, keep the `k8s-openapi` types) cannot go
//! below the size of the structs themselves: `PersistentVolumeSpec` holds some thirty volume
//! sources inline, and a `VolumeAttachment` carries one inline in `spec.source`, present or
//! not. Sizes with the `k8s-openapi` 0.29 types, on x86-64:
//!
//! | | `k8s-openapi` | lean |
//! |---|---|---|
//! | `VolumeAttachment` / [`Va`] | 3,600 bytes | 264 bytes |
//! | `PersistentVolume` / [`Pv`] | 3,472 bytes | 344 bytes |
//!
//! (asserted by `the_lean_types_are_a_tenth_of_the_api_types` below). Resident bytes per
//! cached object, measured by `tests/standalone/cache_memory.rs` (10,000 objects as external-provisioner
//! and kube-controller-manager write them, managed fields included, from the JSON of list
//! pages through the ingest path into a store, in a fresh process; the median of three rounds;
//! the same figures in debug and release builds, whose layouts and allocations are the same;
//! 2026-12-01):
//!
//! | bytes per cached object | API types, managedFields cleared, kube-runtime's store (before) | lean types, our store (after) | bound (`docs/design.md#targets`) |
//! |---|---|---|---|
//! | VolumeAttachment | 5,724 | 1,034 (0.18×) | 1,536 |
//! | PersistentVolume | 7,006 | 1,060 (0.15×) | 2,048 |
//!
//! Most of what remains is the strings themselves (names, UIDs, handles, node IDs) and the
//! allocator's rounding of each; interning the repeated ones (driver and node names,
//! finalizers) would save a few hundred bytes more at the price of a shared, pruned pool.
//!
//! # The update filter
//!
//! external-attacher enqueues a VA update that only changed `attachError`, `detachError`,
//! `resourceVersion` or `managedFields` only when neither copy carries an error
//! (its update handler's own rule):
//! it compares the whole objects. A lean copy no longer has the whole object, so on ingest a
//! 64-bit hash of it (JSON, with those four fields taken out and an empty status counted as
//! none, as Go's value comparison does) is kept: two copies differ elsewhere exactly when their
//! fingerprints differ, but for a collision (about one in 2^64 comparisons, which costs one
//! update of a VA with an error going unqueued until its backoff retries it).

mod csinode;
mod pv;
mod va;

pub use csinode::CsiNode;
pub use pv::{CsiSource, InTreeSource, Pv, PvSpec};
pub use va::{Va, VaSource, VaSpec, VaStatus};

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// An object the shared caches hold, found by its name (every cached kind is cluster-scoped).
pub trait Cached: Send + Sync + 'static {
    /// The object's name.
    fn name(&self) -> &str;
}

/// String pairs in key order, for the few labels, annotations and attributes kept: a boxed
/// slice, searched linearly (they hold a handful of entries at most), no allocation when empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs(Box<[(Box<str>, Box<str>)]>);

impl Pairs {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| &**k == key).map(|(_, v)| &**v)
    }

    /// Whether no pair is kept.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// The pairs of `map` whose key is one of `keys` (every pair when `keys` is `None`).
    fn keep(map: Option<BTreeMap<String, String>>, keys: Option<&[&str]>) -> Self {
        let Some(map) = map else {
            return Self::default();
        };
        Self(
            map.into_iter()
                .filter(|(k, _)| keys.is_none_or(|keys| keys.contains(&k.as_str())))
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                .collect(),
        )
    }

    /// The pairs as the API types hold them (`None` when empty).
    pub fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.is_empty()).then(|| {
            self.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
    }
}

impl From<BTreeMap<String, String>> for Pairs {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self::keep(Some(map), None)
    }
}

/// The metadata the attacher reads. Which fields are filled depends on the kind (see the table
/// in the module docs); the others stay empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta {
    /// `metadata.name`; always set for objects from the API server.
    pub name: Option<String>,
    /// `metadata.uid` (VolumeAttachments).
    pub uid: Option<Box<str>>,
    /// `metadata.resourceVersion` (VolumeAttachments).
    pub resource_version: Option<Box<str>>,
    /// `metadata.finalizers`; `None` and empty differ (the PV finalizer patch tests which).
    pub finalizers: Option<Box<[String]>>,
    /// The labels kept for this kind.
    pub labels: Pairs,
    /// The annotations kept for this kind.
    pub annotations: Pairs,
    /// `metadata.creationTimestamp` (VolumeAttachments).
    pub creation_timestamp: Option<Time>,
    /// `metadata.deletionTimestamp`.
    pub deletion_timestamp: Option<Time>,
}

impl Meta {
    /// The annotation `key`, if kept and set.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key)
    }

    /// The label `key`, if kept and set.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }

    /// The name, `""` if unset.
    pub fn name_or_empty(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

/// What [`Meta::from_api`] keeps of an object's metadata.
struct MetaFields<'a> {
    /// UID, resourceVersion and creation timestamp.
    identity: bool,
    /// Label keys kept.
    labels: &'a [&'a str],
    /// Annotation keys kept.
    annotations: &'a [&'a str],
}

impl Meta {
    /// The kept part of `meta`, moved out of it.
    fn from_api(meta: ObjectMeta, keep: &MetaFields<'_>) -> Self {
        let ObjectMeta {
            name,
            uid,
            resource_version,
            finalizers,
            labels,
            annotations,
            creation_timestamp,
            deletion_timestamp,
            ..
        } = meta;
        Self {
            name,
            uid: uid.filter(|_| keep.identity).map(String::into_boxed_str),
            resource_version: resource_version
                .filter(|_| keep.identity)
                .map(String::into_boxed_str),
            finalizers: finalizers.map(Vec::into_boxed_slice),
            labels: Pairs::keep(labels, Some(keep.labels)),
            annotations: Pairs::keep(annotations, Some(keep.annotations)),
            creation_timestamp: creation_timestamp.filter(|_| keep.identity),
            deletion_timestamp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lean_types_are_a_tenth_of_the_api_types() {
        use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::VolumeAttachment};
        use std::mem::size_of;
        // The figures of the module docs; a change of either side shows here.
        assert_eq!(size_of::<VolumeAttachment>(), 3600);
        assert_eq!(size_of::<PersistentVolume>(), 3472);
        assert_eq!(size_of::<Va>(), 264);
        assert_eq!(size_of::<Pv>(), 344);
    }

    #[test]
    fn pairs_keep_the_listed_keys_in_order_and_cost_nothing_when_empty() {
        let map: BTreeMap<String, String> = [("b", "2"), ("a", "1"), ("c", "3")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let kept = Pairs::keep(Some(map.clone()), Some(&["c", "a"]));
        assert_eq!(kept.iter().collect::<Vec<_>>(), [("a", "1"), ("c", "3")]);
        assert_eq!(kept.get("c"), Some("3"));
        assert_eq!(kept.get("b"), None);
        let all = Pairs::from(map.clone());
        assert_eq!(all.to_map(), Some(map));
        assert!(Pairs::keep(None, None).is_empty());
        assert_eq!(Pairs::default().to_map(), None);
    }
}
