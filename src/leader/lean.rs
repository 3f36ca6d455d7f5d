//! [`LeanLease`]: a Lease read without `metadata.managedFields`.
//!
//! A hub renews one Lease per driver every retry period (20 a second for 100 drivers at the
//! default 5 s) and sees each renewal again through its Lease watch. Every copy the API server
//! sends carries the writer's `managedFields`, whose `fieldsV1` is free-form JSON: read into
//! `k8s-openapi`'s `Lease`, it becomes a tree of maps that is allocated and dropped twice per
//! renewal, and was the largest single allocation in an idle hub's profile. Nothing in leader
//! election reads it, and a Lease written back without it keeps the stored one (the API server
//! takes the live object's managed fields when an update carries none; only an explicit empty
//! list resets them), so the elector, the cross-namespace guard and the replica's Lease watch
//! read Leases through this type, which skips the field while parsing.
//!
//! It serializes exactly as a `Lease` does, so whatever else a Lease carries (labels,
//! annotations, owner references, finalizers...) is written back unchanged.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer, Serialize};

/// A Lease as leader election keeps it: `metadata.managedFields` is never read (see the module
/// documentation). Written, it is the Lease it wraps.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct LeanLease(pub Lease);

impl LeanLease {
    /// The Lease.
    pub fn into_inner(self) -> Lease {
        self.0
    }
}

impl From<Lease> for LeanLease {
    fn from(mut lease: Lease) -> Self {
        lease.metadata.managed_fields = None;
        LeanLease(lease)
    }
}

impl k8s_openapi::Resource for LeanLease {
    const API_VERSION: &'static str = <Lease as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Lease as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Lease as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Lease as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Lease as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Lease as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for LeanLease {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// The wire form read: `apiVersion` and `kind` are not checked (the request's path decides
/// what comes back), unknown fields are skipped without being kept.
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: Meta,
    spec: Option<LeaseSpec>,
}

/// `ObjectMeta` without `managedFields` (skipped as an unknown field).
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl<'de> Deserialize<'de> for LeanLease {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Wire { metadata: m, spec } = Wire::deserialize(deserializer)?;
        // No `..` here: a field added to `ObjectMeta` fails to compile until it is carried
        // over, so a Lease written back never loses one.
        let metadata = ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        };
        Ok(LeanLease(Lease { metadata, spec }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    /// Everything of a Lease but its managed fields survives a read, and the Lease it gives
    /// serializes as the API type (apiVersion and kind included).
    #[test]
    fn a_read_keeps_everything_but_the_managed_fields() {
        let full = Lease {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([("a".into(), "1".into())])),
                creation_timestamp: Some(Time("2026-12-02T01:00:00Z".parse().expect("time"))),
                deletion_grace_period_seconds: Some(30),
                deletion_timestamp: Some(Time("2026-12-02T01:00:01Z".parse().expect("time"))),
                finalizers: Some(vec!["example.com/keep".into()]),
                generate_name: Some("lease-".into()),
                generation: Some(2),
                labels: Some(BTreeMap::from([("l".into(), "2".into())])),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("attacher-hub".into()),
                    operation: Some("Update".into()),
                    fields_v1: Some(FieldsV1(serde_json::json!({
                        "f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}
                    }))),
                    ..ManagedFieldsEntry::default()
                }]),
                name: Some("external-attacher-leader-x".into()),
                namespace: Some("default".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: "p".into(),
                    uid: "u-1".into(),
                    ..OwnerReference::default()
                }]),
                resource_version: Some("42".into()),
                self_link: Some("/self".into()),
                uid: Some("u-2".into()),
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("me".into()),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
        };
        let json = serde_json::to_string(&full).expect("serialize");
        let lean: LeanLease = serde_json::from_str(&json).expect("deserialize");
        let mut expected = full.clone();
        expected.metadata.managed_fields = None;
        assert_eq!(lean.0, expected);
        assert_eq!(LeanLease::from(full), lean);
        let written: serde_json::Value = serde_json::to_value(&lean).expect("serialize");
        assert_eq!(written["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(written["kind"], "Lease");
        assert_eq!(written["metadata"]["finalizers"][0], "example.com/keep");
        assert!(written["metadata"].get("managedFields").is_none());
    }

    /// A watch event and a list page parse, and a Lease with no metadata or spec is read as
    /// empty rather than refused.
    #[test]
    fn events_lists_and_sparse_leases_parse() {
        let event: kube::core::WatchEvent<LeanLease> = serde_json::from_str(
            r#"{"type":"MODIFIED","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
                "metadata":{"name":"l","resourceVersion":"7","managedFields":[{"manager":"m",
                "fieldsV1":{"f:spec":{}}}]},"spec":{"holderIdentity":"h"}}}"#,
        )
        .expect("event");
        let kube::core::WatchEvent::Modified(lease) = event else {
            panic!("a modification");
        };
        assert_eq!(lease.0.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(lease.0.metadata.managed_fields, None);
        let list: kube::core::ObjectList<LeanLease> = serde_json::from_str(
            r#"{"apiVersion":"coordination.k8s.io/v1","kind":"LeaseList","metadata":{},
                "items":[{"metadata":{"namespace":"kube-system"}},{}]}"#,
        )
        .expect("list");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[1], LeanLease::default());
    }
}
