//! One watch per kind (VolumeAttachment, PersistentVolume, CSINode), shared by
//! every driver, feeding in-memory stores and routing events to drivers.
//!
//! `managedFields` are stripped before objects reach the stores: the attacher
//! never reads them and they are the bulk of many objects.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use k8s_openapi::api::{
    core::v1::PersistentVolume,
    storage::v1::{CSINode, VolumeAttachment},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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
    synced: watch::Receiver<bool>,
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

/// Receives routed events. Implementations must not block: they look up the
/// driver and add keys to its queues.
pub trait Route: Send + Sync + 'static {
    /// A VolumeAttachment was added or changed (`old` is the cached copy
    /// before the change; on resync `old` and `new` are the same object).
    fn va_applied(&self, old: Option<&VolumeAttachment>, new: &VolumeAttachment);
    /// A VolumeAttachment is gone from the API server.
    fn va_deleted(&self, va: &VolumeAttachment);
    /// A PersistentVolume was added or changed (or re-delivered on resync).
    fn pv_applied(&self, pv: &PersistentVolume);
}

/// Starts the three watches and the resync timer. Returns the stores at once;
/// they fill in the background. The tasks end when `shutdown` is cancelled;
/// the returned future resolves when all of them have ended.
pub fn start(
    client: Client,
    route: Arc<dyn Route>,
    resync: Duration,
    shutdown: &CancellationToken,
) -> (
    Stores,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (vas, va_writer) = reflector::store::<VolumeAttachment>();
    let (pvs, pv_writer) = reflector::store::<PersistentVolume>();
    let (csinodes, csinode_writer) = reflector::store::<CSINode>();
    let (synced_tx, synced) = watch::channel(false);
    let stores = Stores {
        vas,
        pvs,
        csinodes,
        synced,
    };
    let sync_task = {
        let vas = stores.vas.clone();
        let pvs = stores.pvs.clone();
        let shutdown = shutdown.clone();
        async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                (va, pv) = futures::future::join(vas.wait_until_ready(), pvs.wait_until_ready()) => {
                    if va.is_ok() && pv.is_ok() {
                        tracing::debug!("VolumeAttachment and PersistentVolume caches synced");
                        let _ = synced_tx.send(true);
                    }
                }
            }
        }
    };

    let va_task = {
        let route = route.clone();
        run_watch(
            Api::<VolumeAttachment>::all(client.clone()),
            va_writer,
            stores.vas.clone(),
            move |change| match change {
                Change::Applied { old, new } => route.va_applied(old.as_deref(), &new),
                Change::Deleted(va) => route.va_deleted(&va),
            },
            shutdown.clone(),
        )
        .instrument(tracing::info_span!("watch", kind = "VolumeAttachment"))
    };
    let pv_task = {
        let route = route.clone();
        run_watch(
            Api::<PersistentVolume>::all(client.clone()),
            pv_writer,
            stores.pvs.clone(),
            move |change| {
                if let Change::Applied { new, .. } = change {
                    route.pv_applied(&new);
                }
            },
            shutdown.clone(),
        )
        .instrument(tracing::info_span!("watch", kind = "PersistentVolume"))
    };
    let csinode_task = run_watch(
        Api::<CSINode>::all(client),
        csinode_writer,
        stores.csinodes.clone(),
        |_| {},
        shutdown.clone(),
    )
    .instrument(tracing::info_span!("watch", kind = "CSINode"));

    let resync_task = {
        let stores = stores.clone();
        let shutdown = shutdown.clone();
        async move {
            if resync.is_zero() {
                return;
            }
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                tracing::debug!("resync");
                for va in stores.vas.state() {
                    route.va_applied(Some(&va), &va);
                }
                for pv in stores.pvs.state() {
                    route.pv_applied(&pv);
                }
            }
        }
        .instrument(tracing::info_span!("resync"))
    };

    let all = async move {
        tokio::join!(va_task, pv_task, csinode_task, resync_task, sync_task);
    };
    (stores, all)
}

/// What changed in a cache, delivered after the cache holds the change (so a
/// worker woken by it reads the new object, as client-go's informers
/// guarantee).
enum Change<K> {
    /// Added or modified; `old` is the copy the cache held before.
    Applied {
        /// The previous copy, if any.
        old: Option<Arc<K>>,
        /// The object now (the cache's own copy).
        new: Arc<K>,
    },
    /// Gone (including objects found missing when a watch is re-listed).
    Deleted(K),
}

/// Drives one watch into its store and reports each change once the store
/// has applied it. Objects of a re-list are reported when the whole list has
/// replaced the store; objects missing from it are reported deleted.
async fn run_watch<K, F>(
    api: Api<K>,
    mut writer: reflector::store::Writer<K>,
    store: Store<K>,
    on_change: F,
    shutdown: CancellationToken,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + serde::de::DeserializeOwned
        + 'static,
    F: Fn(Change<K>),
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|obj: &mut K| obj.managed_fields_mut().clear());
    let mut stream: std::pin::Pin<
        Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>,
    > = Box::pin(stream);
    // Objects of a re-list in progress (keys only), with the copy the store
    // held before. The first list is not tracked: nothing acts before the
    // caches are synced, and then every driver starts from the full cache.
    let mut listed: Vec<(ObjectRef<K>, Option<Arc<K>>)> = Vec::new();
    let mut relisting = false;
    let mut listed_once = false;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = stream.next() => next,
        };
        let event = match next {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                tracing::warn!(%error, "watch failed; retrying with backoff");
                continue;
            }
            None => return,
        };
        match &event {
            watcher::Event::Apply(obj) => {
                let key = ObjectRef::from_obj(obj);
                let old = store.get(&key);
                writer.apply_watcher_event(&event);
                if let Some(new) = store.get(&key) {
                    on_change(Change::Applied { old, new });
                }
            }
            watcher::Event::Delete(obj) => {
                writer.apply_watcher_event(&event);
                on_change(Change::Deleted(obj.clone()));
            }
            watcher::Event::Init => {
                listed.clear();
                // Only a list after the first one (the watch restarted)
                // replaces a cache that drivers already act on.
                relisting = listed_once;
                writer.apply_watcher_event(&event);
            }
            watcher::Event::InitApply(obj) => {
                if relisting {
                    let key = ObjectRef::from_obj(obj);
                    let old = store.get(&key);
                    listed.push((key, old));
                }
                writer.apply_watcher_event(&event);
            }
            watcher::Event::InitDone => {
                listed_once = true;
                let before = relisting.then(|| store.state());
                writer.apply_watcher_event(&event);
                let Some(before) = before else { continue };
                let present: std::collections::HashSet<&ObjectRef<K>> =
                    listed.iter().map(|(key, _)| key).collect();
                let gone: Vec<Arc<K>> = before
                    .into_iter()
                    .filter(|o| !present.contains(&ObjectRef::from_obj(&**o)))
                    .collect();
                for (key, old) in listed.drain(..) {
                    if let Some(new) = store.get(&key) {
                        on_change(Change::Applied { old, new });
                    }
                }
                for obj in gone {
                    on_change(Change::Deleted((*obj).clone()));
                }
            }
        }
    }
}
