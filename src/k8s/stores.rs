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

/// Stores filled by hand, for unit tests: what the watches would have delivered.
#[cfg(test)]
pub(crate) struct TestStores {
    /// The stores (synced).
    pub(crate) stores: Stores,
    vas: kube::runtime::reflector::store::Writer<VolumeAttachment>,
    pvs: kube::runtime::reflector::store::Writer<PersistentVolume>,
    csinodes: kube::runtime::reflector::store::Writer<CSINode>,
    synced_tx: watch::Sender<bool>,
}

#[cfg(test)]
impl TestStores {
    /// Empty, synced stores.
    pub(crate) fn new() -> Self {
        use kube::runtime::reflector::store;
        let (vas_store, vas) = store();
        let (pvs_store, pvs) = store();
        let (csinodes_store, csinodes) = store();
        let (synced_tx, synced) = watch::channel(true);
        Self {
            stores: Stores {
                vas: vas_store,
                pvs: pvs_store,
                csinodes: csinodes_store,
                synced,
            },
            vas,
            pvs,
            csinodes,
            synced_tx,
        }
    }

    /// Whether the VolumeAttachment and PersistentVolume caches count as synced.
    pub(crate) fn set_synced(&self, synced: bool) {
        self.synced_tx.send_replace(synced);
    }

    /// The cache now holds `va`.
    pub(crate) fn apply_va(&mut self, va: &VolumeAttachment) {
        self.vas
            .apply_watcher_event(&kube::runtime::watcher::Event::Apply(va.clone()));
    }

    /// The cache no longer holds `va`.
    pub(crate) fn delete_va(&mut self, va: &VolumeAttachment) {
        self.vas
            .apply_watcher_event(&kube::runtime::watcher::Event::Delete(va.clone()));
    }

    /// The cache now holds `pv`.
    pub(crate) fn apply_pv(&mut self, pv: &PersistentVolume) {
        self.pvs
            .apply_watcher_event(&kube::runtime::watcher::Event::Apply(pv.clone()));
    }

    /// The cache now holds `csinode`.
    pub(crate) fn apply_csinode(&mut self, csinode: &CSINode) {
        self.csinodes
            .apply_watcher_event(&kube::runtime::watcher::Event::Apply(csinode.clone()));
    }
}
