//! A leading driver's workers: the attach, detach and PV pools over the driver's queues, the
//! ListVolumes reconciler, and the initial sync; each sync guarded so that a panic stays with
//! its key.

use std::{sync::Arc, time::Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Driver, Kind, context::Shared, panic_guard::guarded};
use crate::{
    controller::{Handler, Synced},
    queue::Queue,
};

#[derive(Clone, Copy, Debug)]
enum Pool {
    Va(Kind),
    Pv,
}

impl Pool {
    fn label(self) -> &'static str {
        match self {
            Pool::Va(Kind::Attach) => "attach",
            Pool::Va(Kind::Detach) => "detach",
            Pool::Pv => "pv",
        }
    }
}

pub(super) struct Workers {
    token: CancellationToken,
    set: JoinSet<()>,
}

impl Driver {
    pub(super) fn start_workers(
        self: Arc<Self>,
        shared: &Arc<Shared>,
        handler: &Arc<Handler>,
    ) -> Workers {
        let token = CancellationToken::new();
        let mut set = JoinSet::new();
        *self.handler.write() = Some(handler.clone());
        let name = self.name().unwrap_or_default();
        let pools = [
            (Pool::Va(Kind::Attach), self.settings.attach_workers),
            (Pool::Va(Kind::Detach), self.settings.detach_workers),
            (Pool::Pv, self.settings.attach_workers),
        ];
        for (pool, count) in pools {
            for i in 0..count.max(1) {
                // In the driver's span (a disabled debug span would cut the lines of the sync
                // off from it, and from the driver's name).
                let span = tracing::debug_span!("worker", pool = pool.label(), i);
                set.spawn(
                    self.clone()
                        .worker(shared.clone(), handler.clone(), pool, token.clone())
                        .instrument(span)
                        .in_current_span(),
                );
            }
        }
        let reconcile = {
            let (this, shared, handler) = (self.clone(), shared.clone(), handler.clone());
            move || {
                let (this, shared, handler) = (this.clone(), shared.clone(), handler.clone());
                async move { this.reconcile_pass(&shared, &handler).await }
            }
        };
        set.spawn(
            self.clone()
                .reconciler(shared.clone(), token.clone(), reconcile)
                .instrument(tracing::debug_span!("reconciler"))
                .in_current_span(),
        );
        // Everything already in the cache, as the Go attacher's informers
        // deliver it when they start.
        let this = self.clone();
        let shared2 = shared.clone();
        let stop = token.clone();
        set.spawn(
            async move {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = shared2.stores.wait_synced() => {}
                }
                // One object's panic (a bug) stays with it: the others are still queued.
                let guarded = |what: &str, key: Option<&str>, f: &dyn Fn()| {
                    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                        let panic = super::panic_guard::panic_message(&*panic);
                        tracing::error!(key = key.unwrap_or(""), %panic, "queuing a {what} after the start of a term panicked");
                        shared2.metrics.count_panic(&name, "initial-sync");
                    }
                };
                for va in shared2.stores.vas.state() {
                    if va.spec.attacher == name {
                        guarded("VolumeAttachment", va.metadata.name.as_deref(), &|| this.on_va(None, &va));
                    }
                }
                for pv in shared2.stores.pvs.state() {
                    guarded("PersistentVolume", pv.metadata.name.as_deref(), &|| this.on_pv(&name, &pv));
                }
            }
            .instrument(tracing::debug_span!("initial-sync"))
            .in_current_span(),
        );
        Workers { token, set }
    }

    /// Stops the workers without waiting for in-flight work (leadership is gone).
    pub(super) async fn abort_workers(&self, mut w: Workers) {
        *self.handler.write() = None;
        w.token.cancel();
        w.set.abort_all();
        while w.set.join_next().await.is_some() {}
    }

    /// Stops the workers, letting in-flight work finish within the drain timeout (we still
    /// hold the Lease: shutdown or hand-over).
    pub(super) async fn stop_workers(&self, mut w: Workers) {
        *self.handler.write() = None;
        w.token.cancel();
        let drained = tokio::time::timeout(self.settings.drain_timeout, async {
            while w.set.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(timeout = ?self.settings.drain_timeout, "in-flight work did not finish in time; aborting it");
            w.set.abort_all();
            while w.set.join_next().await.is_some() {}
        }
    }

    fn queue(&self, pool: Pool) -> &Queue {
        match pool {
            Pool::Va(Kind::Attach) => &self.attach_queue,
            Pool::Va(Kind::Detach) => &self.detach_queue,
            Pool::Pv => &self.pv_queue,
        }
    }

    async fn worker(
        self: Arc<Self>,
        shared: Arc<Shared>,
        handler: Arc<Handler>,
        pool: Pool,
        stop: CancellationToken,
    ) {
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.stores.wait_synced() => {}
        }
        let queue = self.queue(pool);
        // Workers start after the driver registered its name; it does not
        // change while they run.
        let driver = self.name().unwrap_or_default();
        loop {
            // The claim hands the key back if this worker is aborted mid-sync (leadership
            // lost, shutdown past the drain): a sync cut short is never a key lost.
            let (claim, waited) = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                next = queue.claim() => next,
            };
            let key = claim.key().to_owned();
            shared.metrics.observe_wait(&driver, queue.name(), waited);
            let started = Instant::now();
            // Boxed: a sync's future (its CSI call and API writes) is kilobytes, and a worker
            // spends nearly all its life waiting for a key. Inline, every idle worker of every
            // driver would carry that space (about 23 KB each, 66 MB for 100 drivers' 2,900).
            let work = Box::pin(async {
                match pool {
                    Pool::Va(kind) => self.process_va(&shared, &handler, kind, &key).await,
                    Pool::Pv => self.process_pv(&shared, &handler, &key).await,
                }
            });
            if let Err(panic) = guarded(work).await {
                // A bug, not bad input: keep the worker, retry the key later.
                tracing::error!(key = %key, %panic, "a sync panicked; retrying the key with backoff");
                shared.metrics.count_panic(&driver, pool.label());
                self.record_error(Some(&key), format!("{key}: internal error: {panic}"));
                queue.add_rate_limited(&key);
            }
            shared
                .metrics
                .observe_work(&driver, queue.name(), started.elapsed());
            claim.done();
        }
    }

    async fn process_va(&self, shared: &Shared, handler: &Handler, kind: Kind, key: &str) {
        let queue = self.queue(Pool::Va(kind));
        let _busy = self.busy.lock(key).await;
        // At most `csi_calls` attach and detach syncs at once, as the Go sidecar's workers. The
        // VA is read once the slot is ours: a copy read before the wait could be long stale.
        let Ok(_call) = self.csi_calls.acquire().await else {
            return;
        };
        let Some(va) = shared.stores.va(key) else {
            queue.forget(key);
            self.clear_error(Some(key));
            return;
        };
        let driver = self.name().unwrap_or_default();
        if va.spec.attacher != driver {
            queue.forget(key);
            self.clear_error(Some(key));
            return;
        }
        let deleting = va.metadata.deletion_timestamp.is_some();
        if handler.detaches() && deleting != (kind == Kind::Detach) {
            // The VA changed sides since it was queued: the other pool syncs it, with the
            // retry history the two share, unless it has the key already (a plain add would
            // cut a backoff there short and call a failing driver again at once).
            let other = if deleting { Kind::Detach } else { Kind::Attach };
            self.queue(Pool::Va(other)).add_unless_known(key);
            return;
        }
        let span = tracing::info_span!("sync_va", va = key, node = %va.spec.node_name, pv = va.spec.source.persistent_volume_name.as_deref().unwrap_or(""));
        match handler.sync_va(&va).instrument(span.clone()).await {
            Ok(synced) => {
                queue.forget(key);
                self.clear_error(Some(key));
                match synced {
                    Synced::Attached => shared
                        .metrics
                        .observe_attached(&driver, va.metadata.creation_timestamp.as_ref()),
                    Synced::Detached => shared
                        .metrics
                        .observe_detached(&driver, va.metadata.deletion_timestamp.as_ref()),
                    // The echo of our own write, a resync, a forced re-publish: no new attach.
                    Synced::Unchanged => {}
                }
            }
            Err(error) => {
                tracing::warn!(parent: &span, %error, "sync failed; retrying with backoff");
                self.record_error(Some(key), format!("{key}: {error}"));
                shared.metrics.count_retry(&driver, queue.name());
                queue.add_rate_limited(key);
                // Or at once, should the PV reach the cache before the backoff ends (and not
                // already have, between the sync's read and now).
                if let Some(pv) = error.missing_pv() {
                    self.await_pv(pv, key, kind);
                    if shared.stores.pv(pv).is_some() {
                        self.on_pv_arrived(pv);
                    }
                }
            }
        }
    }

    async fn process_pv(&self, shared: &Shared, handler: &Handler, key: &str) {
        let Some(pv) = shared.stores.pv(key) else {
            self.pv_queue.forget(key);
            return;
        };
        match handler
            .sync_pv(&pv)
            .instrument(tracing::info_span!("sync_pv", pv = key))
            .await
        {
            Ok(()) => self.pv_queue.forget(key),
            Err(error) => {
                tracing::warn!(pv = key, %error, "PV sync failed; retrying with backoff");
                self.pv_queue.add_rate_limited(key);
            }
        }
    }

    /// One pass of the ListVolumes reconciler: VAs whose `attached` disagrees with the driver
    /// are queued again.
    async fn reconcile_pass(&self, shared: &Shared, handler: &Handler) {
        match handler.reconcile().await {
            Ok(names) => {
                for name in names {
                    if let Some(va) = shared.stores.va(&name) {
                        self.enqueue_va(handler, &va);
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "Failed to reconcile VolumeAttachment"),
        }
    }

    /// Runs `pass` every reconcile period until `stop`. A pass that panics (a bug) is logged
    /// and counted, and the next one runs on time: one panic never ends reconciliation for the
    /// rest of the term.
    async fn reconciler<F, Fut>(
        self: Arc<Self>,
        shared: Arc<Shared>,
        stop: CancellationToken,
        pass: F,
    ) where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.stores.wait_synced() => {}
        }
        loop {
            // Boxed, as a worker's sync: a pass is large and runs once a reconcile period.
            if let Err(panic) = guarded(Box::pin(pass())).await {
                tracing::error!(%panic, "a reconcile pass panicked; the next one runs on time");
                shared
                    .metrics
                    .count_panic(&self.name().unwrap_or_default(), "reconciler");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.settings.reconcile_sync) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::storage::v1::VolumeAttachment;

    use super::*;
    use crate::cli::Args;
    use crate::config::Defaults;
    use crate::controller::csi_handler::{self, CsiHandler};
    use crate::controller::fixtures::{DRIVER, csi_spec, csinode, lean_va, now, pv, va};
    use crate::csi::{Capabilities, fake::FakeCsi};
    use crate::fake_api::FakeApi;
    use crate::hub::context::tests::context;
    use crate::hub::driver::Origin;
    use crate::k8s::stores::TestStores;

    /// Waits (up to 10 s) until `done` holds.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what} did not happen");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A driver with a CSI handler between a fake API server and a fake CSI driver, its caches
    /// holding the PV `pv1`, and (with `csinode`) the CSINode of the VA's node.
    async fn rig(
        api: &FakeApi,
        caches: &mut TestStores,
        csi: &FakeCsi,
        csinode_too: bool,
    ) -> (Arc<Driver>, Arc<Handler>) {
        rig_with(api, caches, csi, csinode_too, &Args::default()).await
    }

    /// [`rig`] with the flags `args`.
    async fn rig_with(
        api: &FakeApi,
        caches: &mut TestStores,
        csi: &FakeCsi,
        csinode_too: bool,
        args: &Args,
    ) -> (Arc<Driver>, Arc<Handler>) {
        let pv = api.put(&pv("pv1", csi_spec(&["ReadWriteOnce"])));
        caches.apply_pv(&pv);
        if csinode_too {
            caches.apply_csinode(&csinode(&[(DRIVER, "id-1")]));
        }
        let defaults = Defaults::with_identity(args, "test-host".into());
        let settings = defaults.settings_for("/fake/csi.sock".parse().expect("a path"));
        let driver = Driver::named(settings, Origin::Configured, DRIVER);
        let caps = Capabilities {
            controller_service: true,
            publish_unpublish: true,
            ..Capabilities::default()
        };
        let handler = Arc::new(Handler::Csi(Box::new(CsiHandler::new(
            DRIVER.into(),
            csi.client().await,
            caps,
            api.writer(DRIVER),
            caches.stores.clone(),
            csi_handler::Config {
                timeout: Duration::from_secs(5),
                default_fstype: String::new(),
                max_entries: 0,
                save_error_code: true,
            },
        ))));
        (driver, handler)
    }

    /// A new VA `va` of `pv1`, in the API server and the caches.
    fn added_va(api: &FakeApi, caches: &mut TestStores) -> VolumeAttachment {
        let mut added = va(Some("pv1"));
        added.metadata.uid = Some("uid-1".into());
        added.metadata.creation_timestamp = Some(now());
        let added = api.put(&added);
        caches.apply_va(&added);
        added
    }

    /// A driver has dozens of workers that mostly wait: the state a waiting worker (or the
    /// reconciler) keeps must stay small, whatever the size of a sync. Without the boxes,
    /// a worker's future was about 23 KB (measured with heaptrack: 66 MB for 100 drivers).
    #[tokio::test]
    async fn a_waiting_worker_keeps_little_state() {
        let api = FakeApi::default();
        let mut caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let csi = FakeCsi::new(DRIVER);
        let (driver, handler) = rig(&api, &mut caches, &csi, false).await;
        let token = CancellationToken::new();
        for pool in [Pool::Va(Kind::Attach), Pool::Va(Kind::Detach), Pool::Pv] {
            let worker =
                driver
                    .clone()
                    .worker(hub.shared.clone(), handler.clone(), pool, token.clone());
            let size = std::mem::size_of_val(&worker);
            assert!(
                size <= 1024,
                "a {} worker's future is {size} bytes",
                pool.label()
            );
        }
        let pass = {
            let (this, shared, handler) = (driver.clone(), hub.shared.clone(), handler.clone());
            move || {
                let (this, shared, handler) = (this.clone(), shared.clone(), handler.clone());
                async move { this.reconcile_pass(&shared, &handler).await }
            }
        };
        let reconciler = driver
            .clone()
            .reconciler(hub.shared.clone(), token.clone(), pass);
        let size = std::mem::size_of_val(&reconciler);
        assert!(size <= 1024, "the reconciler's future is {size} bytes");
    }

    #[tokio::test]
    async fn a_vas_error_shows_in_drivers_until_it_syncs() {
        let api = FakeApi::default();
        let mut caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let csi = FakeCsi::new(DRIVER);
        let (driver, handler) = rig(&api, &mut caches, &csi, false).await;
        let added = added_va(&api, &mut caches);
        let workers = driver.clone().start_workers(&hub.shared, &handler);
        driver.on_va(None, &lean_va(&added));
        let last_error = || driver.describe()["lastError"].as_str().map(str::to_owned);
        eventually("the CSINode error", || last_error().is_some()).await;
        let shown = driver.describe();
        assert!(
            shown["lastError"]
                .as_str()
                .is_some_and(|e| e.starts_with("va: ") && e.contains("not found")),
            "{shown}"
        );
        assert!(shown["lastErrorTime"].is_string(), "{shown}");
        // The node plugin registers; the retry attaches and the error is over.
        caches.apply_csinode(&csinode(&[(DRIVER, "id-1")]));
        eventually("the error to clear", || last_error().is_none()).await;
        assert!(driver.describe()["lastErrorTime"].is_null());
        assert_eq!(csi.calls_of("ControllerPublishVolume").len(), 1);
        driver.stop_workers(workers).await;
    }

    /// The VA's watch event can come before its PV's: the sync fails ("persistentvolume ...
    /// not found", saved as Go saves it), and the VA is synced again the moment the PV reaches
    /// the cache, not a backoff later (here a minute, longer than the test waits).
    #[tokio::test]
    async fn a_va_whose_pv_was_not_cached_yet_attaches_as_soon_as_the_pv_arrives() {
        let api = FakeApi::default();
        let mut caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let csi = FakeCsi::new(DRIVER);
        let args = Args {
            retry_interval_start: Duration::from_secs(60),
            retry_interval_max: Duration::from_secs(60),
            ..Args::default()
        };
        let (driver, handler) = rig_with(&api, &mut caches, &csi, true, &args).await;
        let mut early = va(Some("pv2"));
        early.metadata.uid = Some("uid-2".into());
        early.metadata.creation_timestamp = Some(now());
        let early = api.put(&early);
        caches.apply_va(&early);
        let workers = driver.clone().start_workers(&hub.shared, &handler);
        driver.on_va(None, &lean_va(&early));
        let attach_error = || {
            api.get::<VolumeAttachment>(None, "va")
                .and_then(|v| v.status)
                .and_then(|s| s.attach_error)
                .and_then(|e| e.message)
        };
        eventually("the attach error", || attach_error().is_some()).await;
        assert_eq!(
            attach_error().as_deref(),
            Some("persistentvolume \"pv2\" not found")
        );
        let pv = api.put(&pv("pv2", csi_spec(&["ReadWriteOnce"])));
        caches.apply_pv(&pv);
        driver.on_pv_arrived("pv2");
        eventually("the attach once the PV arrived", || {
            api.get::<VolumeAttachment>(None, "va")
                .and_then(|v| v.status)
                .is_some_and(|s| s.attached)
        })
        .await;
        assert_eq!(csi.calls_of("ControllerPublishVolume").len(), 1);
        assert!(driver.awaiting_pv.lock().is_empty(), "nothing left waiting");
        driver.stop_workers(workers).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_workers_attach_an_added_va_once_and_detach_it_once_deleted() {
        let api = FakeApi::default();
        let mut caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let csi = FakeCsi::new(DRIVER);
        let (driver, handler) = rig(&api, &mut caches, &csi, true).await;
        let added = added_va(&api, &mut caches);
        let workers = driver.clone().start_workers(&hub.shared, &handler);

        // The initial sync and the add event both queue the VA: one publish.
        driver.on_va(None, &lean_va(&added));
        let attached = || {
            api.get::<VolumeAttachment>(None, "va")
                .and_then(|v| v.status)
                .is_some_and(|s| s.attached)
        };
        eventually("the attach", attached).await;
        let stored: VolumeAttachment = api.get(None, "va").expect("the VA");
        caches.apply_va(&stored);
        let syncs = || {
            hub.shared
                .metrics
                .queue_work_duration
                .with_label_values(&[driver.attach_queue.name(), DRIVER])
                .get_sample_count()
        };
        let before = syncs();
        driver.on_va(Some(&lean_va(&added)), &lean_va(&stored));
        // The update is synced (the fakes answer in memory, so the paused clock moves only once
        // every worker waits), and that sync publishes nothing more.
        eventually("the update's sync", || syncs() > before).await;
        assert_eq!(csi.calls_of("ControllerPublishVolume").len(), 1);
        let e2e = |h: &prometheus::HistogramVec| h.with_label_values(&[DRIVER]).get_sample_count();
        assert_eq!(
            e2e(&hub.shared.metrics.attach_e2e),
            1,
            "one attach observed"
        );

        // Deleted: the detach pool unpublishes and lets the VA go.
        let mut deleting = stored.clone();
        deleting.metadata.deletion_timestamp = Some(now());
        let deleting = api.put(&deleting);
        caches.apply_va(&deleting);
        driver.on_va(Some(&lean_va(&stored)), &lean_va(&deleting));
        eventually("the detach", || {
            api.get::<VolumeAttachment>(None, "va").is_none()
        })
        .await;
        assert_eq!(csi.calls_of("ControllerUnpublishVolume").len(), 1);
        assert_eq!(
            e2e(&hub.shared.metrics.detach_e2e),
            1,
            "one detach observed"
        );
        driver.stop_workers(workers).await;
        // Without workers, events are dropped.
        driver.on_va(None, &lean_va(&added));
        assert!(driver.queue_depths().iter().all(|(_, q)| q.is_empty()));
    }

    /// With `--worker-threads=2` a driver runs two attach and two detach workers, but, as the
    /// Go sidecar with its two workers, never more than two ControllerPublish/Unpublish calls at
    /// once; attaches and detaches share them first come first served, so neither waits for
    /// the other's whole backlog.
    #[tokio::test(start_paused = true)]
    async fn attaches_and_detaches_share_the_worker_threads_calls_in_flight() {
        use crate::controller::fixtures::{FIN, va_annotated, va_finalizers, with_status};
        use k8s_openapi::api::storage::v1::VolumeAttachmentStatus;

        let api = FakeApi::default();
        let mut caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let csi = FakeCsi::new(DRIVER);
        csi.set_call_delay(Duration::from_secs(1));
        let args = Args {
            worker_threads: 2,
            ..Args::default()
        };
        let (driver, handler) = rig_with(&api, &mut caches, &csi, true, &args).await;
        let mut vas = Vec::new();
        for i in 0..4 {
            for side in ["a", "d"] {
                let volume = format!("pv-{side}{i}");
                caches.apply_pv(&api.put(&pv(&volume, csi_spec(&["ReadWriteOnce"]))));
                let mut v = va(Some(&volume));
                if side == "d" {
                    let attached = VolumeAttachmentStatus {
                        attached: true,
                        ..VolumeAttachmentStatus::default()
                    };
                    v = with_status(va_annotated(va_finalizers(v, &[FIN]), "id-1"), attached);
                    v.metadata.deletion_timestamp = Some(now());
                }
                v.metadata.name = Some(format!("va-{side}{i}"));
                v.metadata.uid = Some(format!("uid-{side}{i}"));
                v.metadata.creation_timestamp = Some(now());
                let v = api.put(&v);
                caches.apply_va(&v);
                vas.push(v);
            }
        }
        let workers = driver.clone().start_workers(&hub.shared, &handler);
        for v in &vas {
            driver.on_va(None, &lean_va(v));
        }
        let calls = |m: &str| csi.calls_of(m).len();
        eventually("four attaches and four detaches", || {
            calls("ControllerPublishVolume") == 4 && calls("ControllerUnpublishVolume") == 4
        })
        .await;
        assert_eq!(csi.max_in_flight(), 2, "calls in flight at once");
        let first: Vec<&str> = csi
            .calls()
            .iter()
            .map(|c| c.method)
            .filter(|m| m.starts_with("ControllerPublish") || m.starts_with("ControllerUnpublish"))
            .take(4)
            .collect();
        assert!(
            first.contains(&"ControllerPublishVolume")
                && first.contains(&"ControllerUnpublishVolume"),
            "the first calls are of both kinds: {first:?}"
        );
        driver.stop_workers(workers).await;
    }

    /// A reconcile pass that panics (a bug) is logged and counted, and the next pass runs on
    /// time: one panic does not end reconciliation for the rest of the term.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_pass_is_followed_by_the_next_one_on_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        let api = FakeApi::default();
        let caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let defaults = Defaults::with_identity(&Args::default(), "test-host".into());
        let settings = defaults.settings_for("/fake/csi.sock".parse().expect("a path"));
        let period = settings.reconcile_sync;
        let driver = Driver::named(settings, Origin::Configured, DRIVER);
        let passes = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let reconciler = tokio::spawn(driver.clone().reconciler(
            hub.shared.clone(),
            stop.clone(),
            {
                let passes = passes.clone();
                move || {
                    let n = passes.fetch_add(1, Ordering::SeqCst);
                    async move {
                        assert!(n != 0, "a bug in the first pass");
                    }
                }
            },
        ));
        tokio::time::sleep(period * 2 + Duration::from_secs(1)).await;
        assert_eq!(
            passes.load(Ordering::SeqCst),
            3,
            "passes at 0, 1 and 2 periods"
        );
        let panics = hub
            .shared
            .metrics
            .panics
            .with_label_values(&[DRIVER, "reconciler"])
            .get();
        assert_eq!(panics, 1);
        stop.cancel();
        reconciler.await.expect("no panic escapes the reconciler");
    }
}
