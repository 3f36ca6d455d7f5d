//! What a user creates, for tests in which kube-controller-manager makes the
//! VolumeAttachments: Nodes its attach-detach controller manages, CSINodes,
//! PersistentVolumes with their claims, and Pods scheduled by hand (no
//! scheduler, no kubelet); and what it shows: `node.status.volumesAttached`
//! and the VolumeAttachments it created.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Container, GCEPersistentDiskVolumeSource, Node, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, Volume,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use super::wait::wait_deleted;

/// Namespace of every claim and Pod these helpers create.
pub(crate) const NAMESPACE: &str = "default";

/// The annotation that puts a Node under the attach-detach controller (the
/// kubelet sets it with `--enable-controller-attach-detach`, the default).
pub(crate) const CONTROLLER_MANAGED: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The topology label of the GCE PD driver (its node plugin reports it).
pub(crate) const PD_TOPOLOGY_KEY: &str = "topology.gke.io/zone";

/// A Node the attach-detach controller manages, with `labels`.
pub(crate) async fn create_managed_node(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
) -> Node {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(BTreeMap::from([(
                CONTROLLER_MANAGED.to_string(),
                "true".to_string(),
            )])),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("creating Node {name}: {e}"))
}

/// One driver entry of a CSINode: name, node ID and topology keys.
#[derive(Clone, Debug)]
pub(crate) struct NodeDriver {
    pub(crate) driver: String,
    pub(crate) node_id: String,
    pub(crate) topology_keys: Vec<String>,
}

impl NodeDriver {
    /// An entry without topology keys.
    pub(crate) fn new(driver: &str, node_id: &str) -> NodeDriver {
        NodeDriver {
            driver: driver.to_string(),
            node_id: node_id.to_string(),
            topology_keys: Vec::new(),
        }
    }

    /// Adds a topology key.
    pub(crate) fn topology_key(mut self, key: &str) -> NodeDriver {
        self.topology_keys.push(key.to_string());
        self
    }
}

/// The CSINode of `node` listing `drivers`, as the kubelet writes it when
/// their node plugins register.
pub(crate) async fn create_csinode_with(
    client: &Client,
    node: &str,
    drivers: &[NodeDriver],
) -> CSINode {
    let csinode = CSINode {
        status: None,
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|d| CSINodeDriver {
                    name: d.driver.clone(),
                    node_id: d.node_id.clone(),
                    topology_keys: (!d.topology_keys.is_empty()).then(|| d.topology_keys.clone()),
                    ..CSINodeDriver::default()
                })
                .collect(),
        },
    };
    Api::<CSINode>::all(client.clone())
        .create(&PostParams::default(), &csinode)
        .await
        .unwrap_or_else(|e| panic!("creating CSINode {node}: {e}"))
}

/// The source of a statically provisioned volume.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// A CSI volume of `driver` with `volume_handle`.
    Csi {
        driver: String,
        volume_handle: String,
        read_only: bool,
        volume_attributes: BTreeMap<String, String>,
    },
    /// An in-tree `gcePersistentDisk` (migrated to `pd.csi.storage.gke.io`).
    GcePd { pd_name: String },
}

impl Source {
    /// A CSI volume, read-write, without attributes.
    pub(crate) fn csi(driver: &str, volume_handle: &str) -> Source {
        Source::Csi {
            driver: driver.to_string(),
            volume_handle: volume_handle.to_string(),
            read_only: false,
            volume_attributes: BTreeMap::new(),
        }
    }
}

/// A PersistentVolume and the claim it is pre-bound to (both named `name`);
/// the PV controller binds them.
#[derive(Clone, Debug)]
pub(crate) struct StaticVolume {
    pub(crate) name: String,
    pub(crate) source: Source,
    pub(crate) access_modes: Vec<String>,
    pub(crate) volume_mode: Option<String>,
    /// PV labels (zone labels of in-tree PD volumes).
    pub(crate) labels: BTreeMap<String, String>,
}

impl StaticVolume {
    /// A `ReadWriteOnce` volume named `name`.
    pub(crate) fn new(name: &str, source: Source) -> StaticVolume {
        StaticVolume {
            name: name.to_string(),
            source,
            access_modes: vec!["ReadWriteOnce".to_string()],
            volume_mode: None,
            labels: BTreeMap::new(),
        }
    }

    /// Replaces the access modes.
    pub(crate) fn access_modes(mut self, modes: &[&str]) -> StaticVolume {
        self.access_modes = modes.iter().map(|m| m.to_string()).collect();
        self
    }

    /// Sets `spec.volumeMode` of both objects.
    pub(crate) fn volume_mode(mut self, mode: &str) -> StaticVolume {
        self.volume_mode = Some(mode.to_string());
        self
    }

    /// Adds a PV label.
    pub(crate) fn label(mut self, key: &str, value: &str) -> StaticVolume {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// The PV object.
    pub(crate) fn pv(&self) -> PersistentVolume {
        let (csi, gce_persistent_disk) = match &self.source {
            Source::Csi {
                driver,
                volume_handle,
                read_only,
                volume_attributes,
            } => (
                Some(CSIPersistentVolumeSource {
                    driver: driver.clone(),
                    volume_handle: volume_handle.clone(),
                    read_only: read_only.then_some(true),
                    volume_attributes: (!volume_attributes.is_empty())
                        .then(|| volume_attributes.clone()),
                    ..CSIPersistentVolumeSource::default()
                }),
                None,
            ),
            Source::GcePd { pd_name } => (
                None,
                Some(GCEPersistentDiskVolumeSource {
                    pd_name: pd_name.clone(),
                    fs_type: Some("ext4".to_string()),
                    ..GCEPersistentDiskVolumeSource::default()
                }),
            ),
        };
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("10Gi".to_string()),
                )])),
                access_modes: Some(self.access_modes.clone()),
                persistent_volume_reclaim_policy: Some("Retain".to_string()),
                storage_class_name: Some(String::new()),
                volume_mode: self.volume_mode.clone(),
                claim_ref: Some(ObjectReference {
                    namespace: Some(NAMESPACE.to_string()),
                    name: Some(self.name.clone()),
                    ..ObjectReference::default()
                }),
                csi,
                gce_persistent_disk,
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        }
    }

    /// The claim object, pre-bound to the PV.
    pub(crate) fn pvc(&self) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(NAMESPACE.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(self.access_modes.clone()),
                storage_class_name: Some(String::new()),
                volume_name: Some(self.name.clone()),
                volume_mode: self.volume_mode.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("10Gi".to_string()),
                    )])),
                    ..VolumeResourceRequirements::default()
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        }
    }

    /// Creates the PV and the claim.
    pub(crate) async fn create(&self, client: &Client) {
        Api::<PersistentVolume>::all(client.clone())
            .create(&PostParams::default(), &self.pv())
            .await
            .unwrap_or_else(|e| panic!("creating PV {}: {e}", self.name));
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE)
            .create(&PostParams::default(), &self.pvc())
            .await
            .unwrap_or_else(|e| panic!("creating PVC {}: {e}", self.name));
    }

    /// The name kube-controller-manager gives the volume in
    /// `node.status.volumesAttached` (for a migrated in-tree PD volume: the
    /// translated handle, whose project is left to the driver).
    pub(crate) fn unique_name(&self, zone: &str) -> String {
        match &self.source {
            Source::Csi {
                driver,
                volume_handle,
                ..
            } => unique_volume_name(driver, volume_handle),
            Source::GcePd { pd_name } => unique_volume_name(
                super::pd::PD_MIGRATION_DRIVER,
                &format!("projects/UNSPECIFIED/zones/{zone}/disks/{pd_name}"),
            ),
        }
    }
}

/// `kubernetes.io/csi/<driver>^<handle>`: the unique volume name of a CSI
/// volume in the attach-detach controller and in `node.status`.
pub(crate) fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// A volume of a Pod.
#[derive(Clone, Debug)]
pub(crate) enum PodVolume {
    /// The claim of that name.
    Claim { claim: String, read_only: bool },
    /// An inline in-tree `gcePersistentDisk`.
    GcePd { pd_name: String },
}

impl PodVolume {
    /// A read-write use of claim `claim`.
    pub(crate) fn claim(claim: &str) -> PodVolume {
        PodVolume::Claim {
            claim: claim.to_string(),
            read_only: false,
        }
    }
}

/// Creates Pod `name` on `node` (`spec.nodeName` set: there is no scheduler)
/// with `volumes`.
pub(crate) async fn create_pod(
    client: &Client,
    name: &str,
    node: &str,
    volumes: &[PodVolume],
) -> Pod {
    let volumes: Vec<Volume> = volumes
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            PodVolume::Claim { claim, read_only } => Volume {
                name: format!("v{i}"),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: read_only.then_some(true),
                }),
                ..Volume::default()
            },
            PodVolume::GcePd { pd_name } => Volume {
                name: format!("v{i}"),
                gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                    pd_name: pd_name.clone(),
                    fs_type: Some("ext4".to_string()),
                    ..GCEPersistentDiskVolumeSource::default()
                }),
                ..Volume::default()
            },
        })
        .collect();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![Container {
                name: "app".to_string(),
                image: Some("registry.k8s.io/pause:3.10".to_string()),
                ..Container::default()
            }],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {name}: {e}"))
}

/// Deletes Pod `name` at once (grace period 0: no kubelet would confirm a
/// graceful deletion) and waits until it is gone.
pub(crate) async fn delete_pod(client: &Client, name: &str, timeout: Duration) {
    let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    match api
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("deleting Pod {name}: {e}"),
    }
    wait_deleted(&api, name, timeout)
        .await
        .unwrap_or_else(|e| panic!("Pod {name} not deleted: {e}"));
}

/// Posts a Ready condition with a fresh heartbeat to `node`'s status, as a
/// kubelet does, reporting no volume in use (`status.volumesInUse` empty).
///
/// No kubelet runs here, and the attach-detach controller assumes a volume it
/// has just added to its actual state (attached or, after a failed attach,
/// uncertain) is mounted until a Node update says otherwise: after a
/// successful attach its own `volumesAttached` update is that event; after a
/// failed one nothing else updates the Node, and the detach of a deleted
/// Pod's volume would wait for `maxWaitForUnmountDuration` (6 min).
pub(crate) async fn kubelet_heartbeat(client: &Client, node: &str) {
    let now = chrono_now();
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "posted by the test in place of a kubelet",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }]}});
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap_or_else(|e| panic!("posting the status of Node {node}: {e}"));
}

/// The current time as the API writes it, for status timestamps.
fn chrono_now() -> serde_json::Value {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    serde_json::to_value(now).expect("a timestamp serializes")
}

/// The names in `node.status.volumesAttached` of `node` (empty if the Node is gone).
pub(crate) async fn volumes_attached(client: &Client, node: &str) -> Vec<String> {
    let node = Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .unwrap_or_else(|e| panic!("reading Node {node}: {e}"));
    node.and_then(|n| n.status)
        .and_then(|s| s.volumes_attached)
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect()
}

/// Polls until `pred` holds for `volumes_attached(node)`; returns that list.
pub(crate) async fn wait_volumes_attached(
    client: &Client,
    node: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let start = Instant::now();
    loop {
        let now = volumes_attached(client, node).await;
        if pred(&now) {
            return now;
        }
        assert!(
            start.elapsed() < timeout,
            "node {node}: status.volumesAttached did not show {what} within {timeout:?}; it lists {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `node.status.volumesAttached` of `node` lists `unique_name`.
pub(crate) async fn wait_in_node_status(
    client: &Client,
    node: &str,
    unique_name: &str,
    timeout: Duration,
) {
    wait_volumes_attached(
        client,
        node,
        &format!("{unique_name} listed"),
        timeout,
        |l| l.iter().any(|v| v == unique_name),
    )
    .await;
}

/// Waits until `node.status.volumesAttached` of `node` no longer lists `unique_name`.
pub(crate) async fn wait_gone_from_node_status(
    client: &Client,
    node: &str,
    unique_name: &str,
    timeout: Duration,
) {
    wait_volumes_attached(client, node, &format!("{unique_name} gone"), timeout, |l| {
        !l.iter().any(|v| v == unique_name)
    })
    .await;
}

/// The VolumeAttachments of `driver` to `node`.
pub(crate) async fn vas_of(client: &Client, driver: &str, node: &str) -> Vec<VolumeAttachment> {
    Api::<VolumeAttachment>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("listing VolumeAttachments: {e}"))
        .items
        .into_iter()
        .filter(|va| va.spec.attacher == driver && va.spec.node_name == node)
        .collect()
}

/// Polls the VolumeAttachments of `driver` to `node` until `pred` holds; returns them.
pub(crate) async fn wait_vas(
    client: &Client,
    driver: &str,
    node: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&[VolumeAttachment]) -> bool,
) -> Vec<VolumeAttachment> {
    let start = Instant::now();
    loop {
        let now = vas_of(client, driver, node).await;
        if pred(&now) {
            return now;
        }
        assert!(
            start.elapsed() < timeout,
            "VolumeAttachments of {driver} on {node}: not {what} within {timeout:?}; they are {}",
            serde_json::to_string(&now).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a VolumeAttachment is attached.
pub(crate) fn va_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

/// The PV a VolumeAttachment names (empty for an inline volume).
pub(crate) fn va_pv(va: &VolumeAttachment) -> &str {
    va.spec
        .source
        .persistent_volume_name
        .as_deref()
        .unwrap_or("")
}

/// Deletes what a test created, ignoring what is already gone: Pods first
/// (at once), then claims, PVs, CSINodes and Nodes.
pub(crate) async fn delete_objects(
    client: &Client,
    pods: &[String],
    volumes: &[String],
    nodes: &[String],
) {
    let dp = DeleteParams::default().grace_period(0);
    let pod_api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    for p in pods {
        let _ = pod_api.delete(p, &dp).await;
    }
    let pvc_api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let pv_api = Api::<PersistentVolume>::all(client.clone());
    for v in volumes {
        let _ = pvc_api.delete(v, &dp).await;
        let _ = pv_api.delete(v, &dp).await;
    }
    let csinode_api = Api::<CSINode>::all(client.clone());
    let node_api = Api::<Node>::all(client.clone());
    for n in nodes {
        let _ = csinode_api.delete(n, &dp).await;
        let _ = node_api.delete(n, &dp).await;
    }
}
