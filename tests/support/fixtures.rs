//! Builders that create Node, CSINode, PersistentVolume and VolumeAttachment
//! objects through the API, plus conditions and names used on them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, PersistentVolume, PersistentVolumeSpec, SecretReference,
};
use k8s_openapi::api::storage::v1::{
    CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment, VolumeAttachmentSource,
    VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::wait::Condition;
use kube::{Api, Client, Resource};

/// Creates a Node with no spec (no kubelet runs; nothing schedules on it).
pub(crate) async fn create_node(client: &Client, name: &str) -> Node {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    create(client, &node).await
}

/// Creates the CSINode of `node` with one driver entry, as a kubelet with a
/// registered node plugin would.
pub(crate) async fn create_csinode(
    client: &Client,
    node: &str,
    driver: &str,
    node_id: &str,
) -> CSINode {
    let csinode = CSINode {
        status: None,
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: driver.to_string(),
                node_id: node_id.to_string(),
                ..CSINodeDriver::default()
            }],
        },
    };
    create(client, &csinode).await
}

/// A CSI PersistentVolume, 1Gi, `ReadWriteOnce` and `Retain` unless changed.
#[derive(Clone, Debug)]
pub(crate) struct PvBuilder {
    name: String,
    driver: String,
    volume_handle: String,
    access_modes: Vec<String>,
    volume_mode: Option<String>,
    read_only: Option<bool>,
    fs_type: Option<String>,
    controller_publish_secret: Option<(String, String)>,
    volume_attributes: BTreeMap<String, String>,
}

impl PvBuilder {
    /// A PV named `name` served by CSI driver `driver` as volume `volume_handle`.
    pub(crate) fn new(name: &str, driver: &str, volume_handle: &str) -> PvBuilder {
        PvBuilder {
            name: name.to_string(),
            driver: driver.to_string(),
            volume_handle: volume_handle.to_string(),
            access_modes: vec!["ReadWriteOnce".to_string()],
            volume_mode: None,
            read_only: None,
            fs_type: None,
            controller_publish_secret: None,
            volume_attributes: BTreeMap::new(),
        }
    }

    /// Replaces the access modes (`ReadWriteOnce`, `ReadOnlyMany`, `ReadWriteMany`, `ReadWriteOncePod`).
    pub(crate) fn access_modes(mut self, modes: &[&str]) -> Self {
        self.access_modes = modes.iter().map(|m| m.to_string()).collect();
        self
    }

    /// Sets `spec.volumeMode` (`Filesystem` or `Block`).
    pub(crate) fn volume_mode(mut self, mode: &str) -> Self {
        self.volume_mode = Some(mode.to_string());
        self
    }

    /// Sets `spec.csi.readOnly`.
    pub(crate) fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = Some(read_only);
        self
    }

    /// Sets `spec.csi.fsType`.
    pub(crate) fn fs_type(mut self, fs_type: &str) -> Self {
        self.fs_type = Some(fs_type.to_string());
        self
    }

    /// Sets `spec.csi.controllerPublishSecretRef`.
    pub(crate) fn controller_publish_secret(mut self, name: &str, namespace: &str) -> Self {
        self.controller_publish_secret = Some((name.to_string(), namespace.to_string()));
        self
    }

    /// Adds an entry to `spec.csi.volumeAttributes`.
    pub(crate) fn volume_attribute(mut self, key: &str, value: &str) -> Self {
        self.volume_attributes
            .insert(key.to_string(), value.to_string());
        self
    }

    /// The object, not yet created.
    pub(crate) fn build(&self) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("1Gi".to_string()),
                )])),
                access_modes: Some(self.access_modes.clone()),
                persistent_volume_reclaim_policy: Some("Retain".to_string()),
                volume_mode: self.volume_mode.clone(),
                csi: Some(CSIPersistentVolumeSource {
                    driver: self.driver.clone(),
                    volume_handle: self.volume_handle.clone(),
                    read_only: self.read_only,
                    fs_type: self.fs_type.clone(),
                    controller_publish_secret_ref: self.controller_publish_secret.as_ref().map(
                        |(name, namespace)| SecretReference {
                            name: Some(name.clone()),
                            namespace: Some(namespace.clone()),
                        },
                    ),
                    volume_attributes: (!self.volume_attributes.is_empty())
                        .then(|| self.volume_attributes.clone()),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        }
    }

    /// Creates the PV through the API and returns the stored object.
    pub(crate) async fn create(&self, client: &Client) -> PersistentVolume {
        create(client, &self.build()).await
    }
}

/// A VolumeAttachment of PV `pv` to node `node`, handled by `attacher`, not yet created.
pub(crate) fn va(name: &str, attacher: &str, node: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: attacher.to_string(),
            node_name: node.to_string(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.to_string()),
                ..VolumeAttachmentSource::default()
            },
        },
        status: None,
    }
}

/// Creates a VolumeAttachment (see [`va`]) and returns the stored object.
pub(crate) async fn create_va(
    client: &Client,
    name: &str,
    attacher: &str,
    node: &str,
    pv: &str,
) -> VolumeAttachment {
    create(client, &va(name, attacher, node, pv)).await
}

/// Creates a cluster-scoped object; panics with the object's kind and name on error.
async fn create<K>(client: &Client, obj: &K) -> K
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    api.create(&PostParams::default(), obj)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "creating {} {:?} failed: {e}",
                K::kind(&K::DynamicType::default()),
                obj.meta().name
            )
        })
}

/// external-attacher's sanitization of a driver name (`docs/design.md#names`).
pub(crate) use attacher_hub::names::sanitize_driver_name;

/// The finalizer an attacher for `driver` puts on VAs and PVs:
/// `external-attacher/<sanitized driver>`.
pub(crate) fn attacher_finalizer(driver: &str) -> String {
    format!("external-attacher/{}", sanitize_driver_name(driver))
}

/// Holds when the VolumeAttachment exists and `status.attached` is true.
pub(crate) fn is_attached() -> impl Condition<VolumeAttachment> {
    |va: Option<&VolumeAttachment>| {
        va.and_then(|va| va.status.as_ref())
            .is_some_and(|status| status.attached)
    }
}

/// Holds when the object exists and carries `finalizer`.
pub(crate) fn has_finalizer<K: Resource>(finalizer: &str) -> impl Condition<K> + '_ {
    move |obj: Option<&K>| {
        obj.and_then(|o| o.meta().finalizers.as_ref())
            .is_some_and(|f| f.iter().any(|x| x == finalizer))
    }
}
