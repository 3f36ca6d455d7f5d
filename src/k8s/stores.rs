//! The shared caches every driver reads: VolumeAttachments, PersistentVolumes and CSINodes,
//! filled by the watches of [`router`](super::router).

use std::sync::Arc;

use k8s_openapi::api::{
    core::v1::PersistentVolume,
    storage::v1::{CSINode, VolumeAttachment},
};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

/// The shared caches, readable by every driver.
#[derive(Clone)]
pub struct Stores {
    /// Every VolumeAttachment in the cluster.
    pub vas: Store<VolumeAttachment>,
    /// Every PersistentVolume in the cluster.
    pub pvs: Store<PersistentVolume>,
    /// Every CSINode in the cluster.
    pub csinodes: Store<CSINode>,
    /// True once the VolumeAttachment and PersistentVolume caches hold a full
    /// list. (kube-runtime's `Store::wait_until_ready` wakes only its latest
    /// waiter, so one task waits there and every other waiter watches this.)
    pub(crate) synced: watch::Receiver<bool>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("vas", &self.vas.len())
            .field("pvs", &self.pvs.len())
            .field("csinodes", &self.csinodes.len())
            .field("synced", &*self.synced.borrow())
            .finish()
    }
}

impl Stores {
    /// A VolumeAttachment by name.
    pub fn va(&self, name: &str) -> Option<Arc<VolumeAttachment>> {
        self.vas.get(&ObjectRef::new(name))
    }

    /// A PersistentVolume by name.
    pub fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.pvs.get(&ObjectRef::new(name))
    }

    /// A CSINode by name.
    pub fn csinode(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csinodes.get(&ObjectRef::new(name))
    }

    /// Waits until the VolumeAttachment and PersistentVolume caches hold a
    /// complete list (the CSINode cache may still be filling, as in the Go
    /// attacher).
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the router is gone: the caller is shutting down.
        let _ = synced.wait_for(|s| *s).await;
    }

    /// Whether the VolumeAttachment and PersistentVolume caches are full.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }
}
