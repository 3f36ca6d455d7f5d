//! A leading driver's workers: the attach, detach and PV pools over the driver's queues, the
//! ListVolumes reconciler, and the initial sync; each sync guarded so that a panic stays with
//! its key.

use std::{sync::Arc, time::Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Driver, Kind, context::Shared, guard::guarded};
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
                let span = tracing::debug_span!("worker", pool = pool.label(), i);
                set.spawn(
                    self.clone()
                        .worker(shared.clone(), handler.clone(), pool, token.clone())
                        .instrument(span),
                );
            }
        }
        set.spawn(
            self.clone()
                .reconciler(shared.clone(), handler.clone(), token.clone())
                .instrument(tracing::debug_span!("reconciler")),
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
                for va in shared2.stores.vas.state() {
                    if va.spec.attacher == name {
                        this.on_va(None, &va);
                    }
                }
                for pv in shared2.stores.pvs.state() {
                    this.on_pv(&name, &pv);
                }
            }
            .instrument(tracing::debug_span!("initial-sync")),
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
            let work = async {
                match pool {
                    Pool::Va(kind) => self.process_va(&shared, &handler, kind, &key).await,
                    Pool::Pv => self.process_pv(&shared, &handler, &key).await,
                }
            };
            if let Err(panic) = guarded(work).await {
                // A bug, not bad input: keep the worker, retry the key later.
                tracing::error!(key = %key, %panic, "a sync panicked; retrying the key with backoff");
                shared.metrics.count_panic(&driver, pool.label());
                self.info.write().last_error = Some(format!("{key}: internal error: {panic}"));
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
        let Some(va) = shared.stores.va(key) else {
            queue.forget(key);
            return;
        };
        let driver = self.name().unwrap_or_default();
        if va.spec.attacher != driver {
            queue.forget(key);
            return;
        }
        let deleting = va.metadata.deletion_timestamp.is_some();
        if handler.detaches() && deleting != (kind == Kind::Detach) {
            // The VA changed sides since it was queued.
            queue.forget(key);
            let other = if deleting { Kind::Detach } else { Kind::Attach };
            self.queue(Pool::Va(other)).add(key);
            return;
        }
        let span = tracing::info_span!("sync_va", va = key, node = %va.spec.node_name, pv = va.spec.source.persistent_volume_name.as_deref().unwrap_or(""));
        match handler.sync_va(&va).instrument(span.clone()).await {
            Ok(synced) => {
                queue.forget(key);
                match synced {
                    Synced::Attached => shared.metrics.observe_attached(&driver, &va),
                    Synced::Detached => shared.metrics.observe_detached(&driver, &va),
                    // The echo of our own write, a resync, a forced re-publish: no new attach.
                    Synced::Unchanged => {}
                }
            }
            Err(error) => {
                tracing::warn!(parent: &span, %error, "sync failed; retrying with backoff");
                self.info.write().last_error = Some(format!("{key}: {error}"));
                shared.metrics.count_retry(&driver, queue.name());
                queue.add_rate_limited(key);
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

    async fn reconciler(
        self: Arc<Self>,
        shared: Arc<Shared>,
        handler: Arc<Handler>,
        stop: CancellationToken,
    ) {
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.stores.wait_synced() => {}
        }
        loop {
            match handler.reconcile().await {
                Ok(names) => {
                    for name in names {
                        if let Some(va) = shared.stores.va(&name) {
                            self.enqueue_va(&handler, &va);
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "Failed to reconcile VolumeAttachment"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.settings.reconcile_sync) => {}
            }
        }
    }
}
