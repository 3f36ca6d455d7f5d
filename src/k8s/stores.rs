//! The shared caches every driver reads: VolumeAttachments, PersistentVolumes and CSINodes as
//! [lean](super::lean) copies, filled by the watches of [`router`](super::router).

use std::{
    borrow::Borrow,
    collections::HashSet,
    hash::{Hash, Hasher},
    sync::Arc,
};

use parking_lot::RwLock;
use tokio::sync::watch;

use super::lean::{Cached, CsiNode, Pv, Va};

/// The shared caches, readable by every driver.
#[derive(Clone)]
pub struct Stores {
    /// Every VolumeAttachment in the cluster.
    pub vas: Store<Va>,
    /// Every PersistentVolume in the cluster.
    pub pvs: Store<Pv>,
    /// Every CSINode in the cluster.
    pub csinodes: Store<CsiNode>,
    /// True once the VolumeAttachment and PersistentVolume caches hold a full list.
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
    pub fn va(&self, name: &str) -> Option<Arc<Va>> {
        self.vas.get(name)
    }

    /// A PersistentVolume by name.
    pub fn pv(&self, name: &str) -> Option<Arc<Pv>> {
        self.pvs.get(name)
    }

    /// A CSINode by name.
    pub fn csinode(&self, name: &str) -> Option<Arc<CsiNode>> {
        self.csinodes.get(name)
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

/// One cache: the objects of one kind by name, shared by the watch that writes it and every
/// reader.
///
/// The name is not stored twice: the set's entries are the objects themselves, hashed and
/// compared by their name (kube-runtime's store keys each object with a copy of its name,
/// namespace, UID and resourceVersion, some 200 bytes per object). Readers clone an `Arc` out
/// and let go of the lock at once; nothing awaits while holding it.
pub struct Store<T> {
    objects: Arc<RwLock<Objects<T>>>,
}

/// The set behind a [`Store`].
type Objects<T> = HashSet<ByName<T>>;

impl<T> Clone for Store<T> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
        }
    }
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Self {
            objects: Arc::default(),
        }
    }
}

impl<T: Cached> Store<T> {
    /// The object named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<T>> {
        self.objects.read().get(name).map(|o| o.0.clone())
    }

    /// Every object, in no particular order (a snapshot: later changes do not show in it).
    pub fn state(&self) -> Vec<Arc<T>> {
        self.objects.read().iter().map(|o| o.0.clone()).collect()
    }

    /// Whether any object satisfies `f`; the store is locked for reading meanwhile, so `f`
    /// must be quick and must not touch the store.
    pub fn any(&self, f: impl FnMut(&T) -> bool) -> bool {
        let mut f = f;
        self.objects.read().iter().any(|o| f(&o.0))
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.objects.read().len()
    }

    /// Whether it holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds or replaces `obj`; the copy it replaces. (The watch's side, as are [`Self::delete`]
    /// and the list replacement; public for `tests/standalone/cache_memory.rs`, which fills stores the
    /// way the watch does.)
    pub fn apply(&self, obj: Arc<T>) -> Option<Arc<T>> {
        self.objects.write().replace(ByName(obj)).map(|o| o.0)
    }

    /// Removes the object named `name`; the copy removed.
    pub fn delete(&self, name: &str) -> Option<Arc<T>> {
        self.objects.write().take(name).map(|o| o.0)
    }

    /// Replaces every object by `objects` (a completed list); what it held before.
    pub(crate) fn replace(&self, objects: Objects<T>) -> Objects<T> {
        std::mem::replace(&mut *self.objects.write(), objects)
    }
}

/// A cached object as a set entry: hashed and compared by name, and borrowed as its name, so
/// that the set is looked up by `&str`.
pub(crate) struct ByName<T>(pub(crate) Arc<T>);

impl<T: Cached> Borrow<str> for ByName<T> {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

impl<T: Cached> Hash for ByName<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Exactly as `str` hashes, as `Borrow<str>` requires.
        self.0.name().hash(state);
    }
}

impl<T: Cached> PartialEq for ByName<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl<T: Cached> Eq for ByName<T> {}

/// Stores filled by hand, for unit tests: what the watches would have delivered, through the
/// same conversion to lean copies.
#[cfg(test)]
pub(crate) struct TestStores {
    /// The stores (synced).
    pub(crate) stores: Stores,
    synced_tx: watch::Sender<bool>,
}

#[cfg(test)]
impl TestStores {
    /// Empty, synced stores.
    pub(crate) fn new() -> Self {
        let (synced_tx, synced) = watch::channel(true);
        Self {
            stores: Stores {
                vas: Store::default(),
                pvs: Store::default(),
                csinodes: Store::default(),
                synced,
            },
            synced_tx,
        }
    }

    /// Whether the VolumeAttachment and PersistentVolume caches count as synced.
    pub(crate) fn set_synced(&self, synced: bool) {
        self.synced_tx.send_replace(synced);
    }

    /// The cache now holds `va`; its cached copy.
    pub(crate) fn apply_va(
        &mut self,
        va: &k8s_openapi::api::storage::v1::VolumeAttachment,
    ) -> Arc<Va> {
        let va = Arc::new(Va::from(va.clone()));
        self.stores.vas.apply(va.clone());
        va
    }

    /// The cache no longer holds `va`.
    pub(crate) fn delete_va(&mut self, va: &k8s_openapi::api::storage::v1::VolumeAttachment) {
        self.stores
            .vas
            .delete(va.metadata.name.as_deref().unwrap_or_default());
    }

    /// The cache now holds `pv`; its cached copy.
    pub(crate) fn apply_pv(
        &mut self,
        pv: &k8s_openapi::api::core::v1::PersistentVolume,
    ) -> Arc<Pv> {
        let pv = Arc::new(Pv::from(pv.clone()));
        self.stores.pvs.apply(pv.clone());
        pv
    }

    /// The cache now holds `csinode`.
    pub(crate) fn apply_csinode(&mut self, csinode: &k8s_openapi::api::storage::v1::CSINode) {
        self.stores
            .csinodes
            .apply(Arc::new(CsiNode::from(csinode.clone())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, id: &str) -> Arc<CsiNode> {
        Arc::new(CsiNode {
            name: name.into(),
            drivers: vec![("d".into(), id.into())].into_boxed_slice(),
        })
    }

    #[test]
    fn objects_are_found_replaced_and_removed_by_name() {
        let store = Store::<CsiNode>::default();
        assert!(store.apply(node("a", "1")).is_none());
        assert!(store.apply(node("b", "2")).is_none());
        let old = store.apply(node("a", "3")).expect("replaced");
        assert_eq!(old.node_id("d"), Some("1"));
        assert_eq!(
            store
                .get("a")
                .and_then(|n| n.node_id("d").map(str::to_owned)),
            Some("3".into())
        );
        assert_eq!(store.len(), 2);
        assert!(store.any(|n| n.name == "b"));
        assert_eq!(store.delete("b").map(|n| n.name.clone()), Some("b".into()));
        assert!(store.get("b").is_none() && store.delete("b").is_none());
        let before = store.replace([ByName(node("c", "4"))].into_iter().collect());
        assert_eq!(before.len(), 1);
        let names: Vec<String> = store.state().iter().map(|n| n.name.clone()).collect();
        assert_eq!(names, ["c"]);
    }
}
