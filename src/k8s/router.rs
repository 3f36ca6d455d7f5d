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

use super::{client::WATCH_TIMEOUT, stores::Stores};

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
/// has applied it (see [`Mirror`]).
async fn run_watch<K, F>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
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
    let config = watcher::Config::default()
        .timeout(u32::try_from(WATCH_TIMEOUT.as_secs()).unwrap_or(u32::MAX));
    let stream = watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(|obj: &mut K| obj.managed_fields_mut().clear());
    let mut stream: std::pin::Pin<
        Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>,
    > = Box::pin(stream);
    let mut mirror = Mirror::new(writer, store);
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(event)) => mirror.apply(&event, &on_change),
            Some(Err(error)) => tracing::warn!(%error, "watch failed; retrying with backoff"),
            None => return,
        }
    }
}

/// Pause before watching again after a failed watch: [`WATCH_BACKOFF_MIN`] doubling up to
/// [`WATCH_BACKOFF_MAX`], each pause shortened by a random part of up to half, back to the
/// minimum after any success. kube's default (0.8 s doubling to 30 s) left the watches of a
/// hub whose API server came back blind for up to half a minute; a few requests per watched
/// kind every few seconds are nothing for a server that is up and little for one that is down.
#[derive(Debug)]
pub(crate) struct WatchBackoff {
    next: Duration,
}

/// First pause of [`WatchBackoff`].
const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest pause of [`WatchBackoff`].
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(4);

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            next: WATCH_BACKOFF_MIN,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let pause = self.next;
        self.next = (self.next * 2).min(WATCH_BACKOFF_MAX);
        Some(pause.mul_f64(1.0 - crate::random::random_unit() / 2.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

/// A store kept in step with a watch, reporting what changed.
///
/// Changes are reported after the store applied them. Objects of a re-list
/// (the watch restarted) are reported once the whole list has replaced the
/// store, and objects missing from it as deleted: a deletion that happened
/// while the watch was down is not lost. The first list is not reported:
/// nothing acts before the caches are synced, and then every driver starts
/// from the full cache.
struct Mirror<K: Resource<DynamicType = ()> + Clone + 'static> {
    writer: reflector::store::Writer<K>,
    store: Store<K>,
    /// Keys of a re-list in progress, with the copy the store held before.
    listed: Vec<(ObjectRef<K>, Option<Arc<K>>)>,
    /// The list in progress replaces a store that drivers already act on.
    relisting: bool,
    /// A first list has completed.
    listed_once: bool,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Mirror<K> {
    fn new(writer: reflector::store::Writer<K>, store: Store<K>) -> Self {
        Self {
            writer,
            store,
            listed: Vec::new(),
            relisting: false,
            listed_once: false,
        }
    }

    fn apply(&mut self, event: &watcher::Event<K>, on_change: impl Fn(Change<K>)) {
        match event {
            watcher::Event::Apply(obj) => {
                let key = ObjectRef::from_obj(obj);
                let old = self.store.get(&key);
                self.writer.apply_watcher_event(event);
                if let Some(new) = self.store.get(&key) {
                    on_change(Change::Applied { old, new });
                }
            }
            watcher::Event::Delete(obj) => {
                self.writer.apply_watcher_event(event);
                on_change(Change::Deleted(obj.clone()));
            }
            watcher::Event::Init => {
                self.listed.clear();
                self.relisting = self.listed_once;
                self.writer.apply_watcher_event(event);
            }
            watcher::Event::InitApply(obj) => {
                if self.relisting {
                    let key = ObjectRef::from_obj(obj);
                    let old = self.store.get(&key);
                    self.listed.push((key, old));
                }
                self.writer.apply_watcher_event(event);
            }
            watcher::Event::InitDone => {
                self.listed_once = true;
                let before = self.relisting.then(|| self.store.state());
                self.writer.apply_watcher_event(event);
                let Some(before) = before else { return };
                let present: std::collections::HashSet<&ObjectRef<K>> =
                    self.listed.iter().map(|(key, _)| key).collect();
                let gone: Vec<Arc<K>> = before
                    .into_iter()
                    .filter(|o| !present.contains(&ObjectRef::from_obj(&**o)))
                    .collect();
                for (key, old) in self.listed.drain(..) {
                    if let Some(new) = self.store.get(&key) {
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

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn watch_backoff_stays_short_and_resets_after_a_success() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::default();
        let pauses: Vec<Duration> = (0..8).map(|_| b.next().expect("never gives up")).collect();
        for (i, p) in pauses.iter().enumerate() {
            let nominal = (WATCH_BACKOFF_MIN * 2u32.pow(i as u32)).min(WATCH_BACKOFF_MAX);
            assert!(*p <= nominal && *p >= nominal / 2, "pause {i}: {p:?}");
        }
        b.reset();
        assert!(b.next().expect("pause") <= WATCH_BACKOFF_MIN);
    }

    fn pv(name: &str, rv: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        }
    }

    /// What a change says, as (kind, name, old rv, new rv).
    fn describe(c: &Change<PersistentVolume>) -> (String, String, String, String) {
        let rv = |p: &PersistentVolume| p.metadata.resource_version.clone().unwrap_or_default();
        let name = |p: &PersistentVolume| p.metadata.name.clone().unwrap_or_default();
        match c {
            Change::Applied { old, new } => (
                "applied".into(),
                name(new),
                old.as_deref().map(rv).unwrap_or_default(),
                rv(new),
            ),
            Change::Deleted(o) => ("deleted".into(), name(o), rv(o), String::new()),
        }
    }

    #[test]
    fn changes_are_reported_after_the_store_holds_them_and_relists_report_missed_deletions() {
        let (store, writer) = reflector::store::<PersistentVolume>();
        let mut mirror = Mirror::new(writer, store.clone());
        let seen: RefCell<Vec<(String, String, String, String)>> = RefCell::new(Vec::new());
        let probe = store.clone();
        let record = |c: Change<PersistentVolume>| {
            // The store already holds what is reported.
            if let Change::Applied { new, .. } = &c {
                let now = probe
                    .get(&ObjectRef::from_obj(&**new))
                    .expect("in the store");
                assert_eq!(now.metadata.resource_version, new.metadata.resource_version);
            }
            seen.borrow_mut().push(describe(&c));
        };

        // The first list fills the store and reports nothing.
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(pv("a", "1")),
            watcher::Event::InitApply(pv("b", "2")),
            watcher::Event::InitDone,
        ] {
            mirror.apply(&e, record);
        }
        assert!(seen.borrow().is_empty());
        assert_eq!(store.len(), 2);

        // Live events are reported with the previous copy.
        mirror.apply(&watcher::Event::Apply(pv("a", "3")), record);
        mirror.apply(&watcher::Event::Apply(pv("c", "4")), record);
        assert_eq!(
            seen.borrow_mut().drain(..).collect::<Vec<_>>(),
            vec![
                ("applied".into(), "a".into(), "1".into(), "3".into()),
                ("applied".into(), "c".into(), String::new(), "4".into()),
            ]
        );

        // The watch restarts: b was deleted and a changed meanwhile.
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(pv("a", "7")),
            watcher::Event::InitApply(pv("c", "4")),
            watcher::Event::InitDone,
        ] {
            mirror.apply(&e, record);
        }
        assert_eq!(
            seen.borrow().clone(),
            vec![
                ("applied".into(), "a".into(), "3".into(), "7".into()),
                ("applied".into(), "c".into(), "4".into(), "4".into()),
                ("deleted".into(), "b".into(), "2".into(), String::new()),
            ]
        );
        assert!(store.get(&ObjectRef::new("b")).is_none());
    }
}
