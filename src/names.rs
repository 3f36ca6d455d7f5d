//! The names attacher-hub shares with external-attacher and among its own replicas: finalizers,
//! annotations and labels, Lease names and work-queue names.
//!
//! A leaf: it uses nothing of the crate, so that leader election, metrics, balancing, the
//! controller, the hub and the configuration name things alike without reaching into each
//! other.

/// VA annotation holding the CSI node ID used for the attach; the last-resort node-ID source for
/// detach and reconcile (`docs/design.md#node-id`).
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

/// PV annotation naming the CSI driver an in-tree PV was migrated to; a migratable PV whose
/// annotation names another driver loses our finalizer (`docs/design.md#pv-finalizer`).
pub const MIGRATED_TO_ANNOTATION: &str = "pv.kubernetes.io/migrated-to";

/// PV annotation with the Azure resource group of an in-tree Azure File share (its CSI volume
/// handle starts with it).
pub const AZURE_FILE_RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";

/// PV annotation from which a migrated Portworx PV takes the name of its CSI secrets (with
/// [`PORTWORX_SECRET_NAMESPACE_ANNOTATION`]).
pub const PORTWORX_SECRET_NAME_ANNOTATION: &str = "openstorage.io/auth-secret-name";

/// PV annotation from which a migrated Portworx PV takes the namespace of its CSI secrets.
pub const PORTWORX_SECRET_NAMESPACE_ANNOTATION: &str = "openstorage.io/auth-secret-namespace";

/// Zone label of a GCE PD PV, read first when translating it (csi-translation-lib).
pub const BETA_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";

/// Zone label of a GCE PD PV, read when [`BETA_ZONE_LABEL`] is empty or missing.
pub const GA_ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Prefix of the finalizer put on VolumeAttachments and PersistentVolumes.
pub const FINALIZER_PREFIX: &str = "external-attacher/";

/// Prefix of the leader-election Lease name, before sanitizing.
pub const LEASE_PREFIX: &str = "external-attacher-leader-";

/// Name of the VolumeAttachment queues (the `name` label of `workqueue_*`).
pub const VA_QUEUE_NAME: &str = "csi-attacher-va";

/// Name of the PersistentVolume queue.
pub const PV_QUEUE_NAME: &str = "csi-attacher-pv";

/// Label on the presence Leases of hub replicas (leadership balancing).
pub const REPLICA_LABEL: &str = "attacher-hub.kubernetes.io/replica";

/// Label on presence Leases naming the replica group: replicas that serve the same driver
/// sockets share their drivers; replicas of another group (a DaemonSet next to a Deployment,
/// nodes with other sockets) are not counted, so no group leaves one of its drivers unled
/// waiting for a replica that cannot serve it.
pub const REPLICA_GROUP_LABEL: &str = "attacher-hub.kubernetes.io/replica-group";

/// Name prefix of presence Leases.
pub const REPLICA_LEASE_PREFIX: &str = "attacher-hub-replica-";

/// Replaces every character outside `[a-zA-Z0-9-]` by `-` and appends `X` if the result ends
/// with `-` (external-attacher's `SanitizeDriverName`). Case is kept; length is not checked.
pub fn sanitize_driver_name(driver: &str) -> String {
    let mut out: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// The finalizer this driver puts on VAs and PVs: `external-attacher/<sanitized driver>`.
pub fn finalizer_name(driver: &str) -> String {
    format!("{FINALIZER_PREFIX}{}", sanitize_driver_name(driver))
}

/// The leader-election Lease name: `external-attacher-leader-<driver>`, sanitized as a whole.
pub fn lease_name(driver: &str) -> String {
    sanitize_driver_name(&format!("{LEASE_PREFIX}{driver}"))
}

/// Name of a replica's presence Lease (lower-cased: Lease names are DNS subdomains).
pub fn replica_lease_name(identity: &str) -> String {
    format!("{REPLICA_LEASE_PREFIX}{}", identity.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_are_sanitized_into_finalizers_and_lease_names() {
        let cases = [
            ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
            ("csi-driver.", "csi-driver-X"),
            ("csi-driver-", "csi-driver-X"),
            ("Foo_Bar/baz", "Foo-Bar-baz"),
            ("plain-123", "plain-123"),
            ("", ""),
            ("é.x", "--x"),
            ("node_1.", "node-1-X"),
            ("Pod-7", "Pod-7"),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize_driver_name(input), want, "{input}");
        }
        assert_eq!(
            finalizer_name("ebs.csi.aws.com"),
            "external-attacher/ebs-csi-aws-com"
        );
        assert_eq!(
            finalizer_name("csi-driver."),
            "external-attacher/csi-driver-X"
        );
        assert_eq!(
            lease_name("hostpath.csi.k8s.io"),
            "external-attacher-leader-hostpath-csi-k8s-io"
        );
        assert_eq!(
            lease_name("csi.vsphere.vmware.com"),
            "external-attacher-leader-csi-vsphere-vmware-com"
        );
        assert_eq!(lease_name("d."), "external-attacher-leader-d-X");
    }

    #[test]
    fn presence_lease_names_are_lower_case() {
        assert_eq!(replica_lease_name("Node-A"), "attacher-hub-replica-node-a");
    }
}
