//! One driver's life: connect, probe, learn its name and capabilities, win its
//! Lease, run its workers and reconciler; and start over when its connection
//! drops. A sick driver only ever affects itself.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    coordination::v1::Lease, core::v1::PersistentVolume, storage::v1::VolumeAttachment,
};
use kube::Api;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    config::Settings,
    controller::{
        Handler, Synced,
        csi_handler::{self, CsiHandler},
        predicate::should_enqueue_va_change,
        trivial_handler::TrivialHandler,
    },
    csi::{self, CallMetrics, Capabilities, Connection, DriverClient},
    hub::Shared,
    k8s::{Writer, budget::ApiBudget},
    leader::{self, AcquireGate, LeaderElector, Leadership},
    names::{PV_QUEUE_NAME, VA_QUEUE_NAME},
    queue::Queue,
};

/// First pause after a failed start-up step of a driver.
const RESTART_BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest pause between start-up attempts of a failing driver.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Where a container writes why it died (read by the kubelet).
const TERMINATION_LOG: &str = "/dev/termination-log";

/// Where a driver is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum State {
    /// Waiting for its socket to accept a connection.
    Connecting,
    /// Connected; Probe says not ready (or name/capabilities not read yet).
    NotReady,
    /// Ready; another replica holds its Lease.
    Standby,
    /// Ready and acting for the driver.
    Leading,
    /// A start-up step failed; retried with backoff.
    Failed {
        /// What went wrong.
        reason: String,
    },
    /// A discovered socket whose driver has no controller service (a node
    /// plugin): recorded, not served, not an error.
    NoControllerService,
    /// Stopped (removed from the configuration or shutting down).
    Stopped,
}

/// How a driver slot came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Named on the command line or in `drivers.yaml`: it is served whatever
    /// its capabilities (the trivial handler for non-attaching drivers).
    Configured,
    /// Found by `--driver-sockets`: without a controller service it is a node
    /// plugin, which this process records but does not act for.
    Discovered,
}

/// What `/drivers` shows of a driver.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Info {
    name: Option<String>,
    state: Option<State>,
    capabilities: Option<Capabilities>,
    lease: Option<String>,
    lease_holder: Option<String>,
    last_error: Option<String>,
}

/// Which queue a VolumeAttachment key is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Attach,
    Detach,
}

/// One configured driver socket and, once known, the driver behind it.
#[derive(Debug)]
pub struct Driver {
    /// Its settings.
    settings: Settings,
    /// Configured or discovered.
    origin: Origin,
    /// VAs to attach.
    attach_queue: Queue,
    /// VAs to detach: a separate pool, so a detach storm never starves attaches.
    detach_queue: Queue,
    /// PVs whose finalizer may go.
    pv_queue: Queue,
    /// Set while this replica acts for the driver; events are dropped otherwise.
    handler: RwLock<Option<Arc<Handler>>>,
    /// Keys being processed, so a VA moving from the attach to the detach
    /// queue is never worked on twice at once.
    busy: KeyLocks,
    /// For `/drivers` and readiness.
    info: RwLock<Info>,
    /// The API budget of the current connection, for `/drivers`.
    budget: RwLock<Option<Arc<ApiBudget>>>,
    /// Set by the hub when this replica holds more than its share of Leases.
    hand_over: tokio::sync::Notify,
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    peek(l, T::clone)
}

/// Reads one part of a locked value without cloning the rest.
fn peek<T, R>(l: &RwLock<T>, f: impl FnOnce(&T) -> R) -> R {
    f(&l.read().unwrap_or_else(std::sync::PoisonError::into_inner))
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Driver {
    /// A driver slot for `settings`; [`Driver::run`] brings it to life.
    pub fn new(settings: Settings, origin: Origin) -> Arc<Self> {
        let q = |name: &str| {
            Queue::new(
                name,
                settings.retry_interval_start,
                settings.retry_interval_max,
            )
        };
        Arc::new(Self {
            origin,
            attach_queue: q(VA_QUEUE_NAME),
            detach_queue: q(VA_QUEUE_NAME),
            pv_queue: q(PV_QUEUE_NAME),
            settings,
            handler: RwLock::new(None),
            busy: KeyLocks::default(),
            info: RwLock::new(Info {
                state: Some(State::Connecting),
                ..Info::default()
            }),
            budget: RwLock::new(None),
            hand_over: tokio::sync::Notify::new(),
        })
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The driver name, once it has told it.
    pub fn name(&self) -> Option<String> {
        peek(&self.info, |i| i.name.clone())
    }

    /// The current state.
    pub fn state(&self) -> State {
        peek(&self.info, |i| i.state.clone()).unwrap_or(State::Connecting)
    }

    fn set_state(&self, state: State) {
        if let State::Failed { reason } = &state {
            tracing::warn!(%reason, "driver failed; retrying");
            write(&self.info).last_error = Some(reason.clone());
        }
        write(&self.info).state = Some(state);
    }

    /// The `/drivers` entry.
    pub fn describe(&self) -> serde_json::Value {
        let info = read(&self.info);
        serde_json::json!({
            "socket": self.settings.address.to_string(),
            "name": info.name,
            "state": info.state,
            "capabilities": info.capabilities,
            "lease": info.lease,
            "leaseHolder": info.lease_holder,
            "leaderElection": self.settings.leader_election.is_some(),
            "discovered": self.origin == Origin::Discovered,
            "queues": {
                "attach": { "depth": self.attach_queue.len(), "processing": self.attach_queue.processing_len(), "oldestSeconds": self.attach_queue.oldest_age().map(|d| d.as_secs_f64()) },
                "detach": { "depth": self.detach_queue.len(), "processing": self.detach_queue.processing_len(), "oldestSeconds": self.detach_queue.oldest_age().map(|d| d.as_secs_f64()) },
                "pv": { "depth": self.pv_queue.len(), "processing": self.pv_queue.processing_len(), "oldestSeconds": self.pv_queue.oldest_age().map(|d| d.as_secs_f64()) },
            },
            "lastError": info.last_error,
            "apiBudget": read(&self.budget).map(|b| b.status()),
        })
    }

    /// Depths of the attach, detach and PV queues.
    pub fn queue_depths(&self) -> [(&'static str, &Queue); 3] {
        [
            ("attach", &self.attach_queue),
            ("detach", &self.detach_queue),
            ("pv", &self.pv_queue),
        ]
    }

    fn handler(&self) -> Option<Arc<Handler>> {
        read(&self.handler)
    }

    // === events (called by the router through the hub; must not block) ===

    /// A VA of this driver was added or changed.
    pub fn on_va(&self, old: Option<&VolumeAttachment>, new: &VolumeAttachment) {
        let Some(handler) = self.handler() else {
            return;
        };
        if old.is_none_or(|old| should_enqueue_va_change(old, new)) {
            self.enqueue_va(&handler, new);
        }
    }

    fn enqueue_va(&self, handler: &Handler, va: &VolumeAttachment) {
        let Some(name) = va.metadata.name.as_deref() else {
            return;
        };
        let deleting = va.metadata.deletion_timestamp.is_some();
        if handler.detaches() && deleting {
            self.detach_queue.add(name);
        } else {
            self.attach_queue.add(name);
        }
    }

    /// A VA of this driver is gone: its PV may lose our finalizer now.
    pub fn on_va_deleted(&self, va: &VolumeAttachment) {
        let Some(handler) = self.handler() else {
            return;
        };
        if let Some(name) = va.metadata.name.as_deref() {
            handler.va_deleted(name);
        }
        if let Some(pv) = va.spec.source.persistent_volume_name.as_deref() {
            self.pv_queue.add(pv);
        }
    }

    /// A PV carrying our finalizer was added or changed.
    pub fn on_pv(&self, driver: &str, pv: &PersistentVolume) {
        if self.handler().is_none() {
            return;
        }
        if crate::controller::patches::should_enqueue_pv(pv, driver)
            && let Some(name) = pv.metadata.name.as_deref()
        {
            self.pv_queue.add(name);
        }
    }

    // === life ===

    /// Runs the driver until `stop` is cancelled: connect, probe, register,
    /// lead, work; start over on connection loss or a failed step.
    pub async fn run(self: Arc<Self>, shared: Arc<Shared>, stop: CancellationToken) {
        let mut backoff = RESTART_BACKOFF_START;
        loop {
            let outcome = self.clone().run_once(&shared, &stop).await;
            if let Some(name) = self.name() {
                shared.registry.unregister(&name, &self);
            }
            match outcome {
                Outcome::Stopped => {
                    self.set_state(State::Stopped);
                    return;
                }
                Outcome::ConnectionLost => {
                    if self.settings.exit_on_connection_loss {
                        let msg = "Lost connection to CSI driver, exiting";
                        tracing::error!("{msg}");
                        let _ = std::fs::write(TERMINATION_LOG, msg);
                        std::process::exit(1);
                    }
                    tracing::warn!("lost connection to the CSI driver; reconnecting");
                    write(&self.info).last_error = Some("lost connection to the CSI driver".into());
                    backoff = RESTART_BACKOFF_START;
                }
                Outcome::Failed(reason) => {
                    self.set_state(State::Failed { reason });
                    tokio::select! {
                        () = stop.cancelled() => {
                            self.set_state(State::Stopped);
                            return;
                        }
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
                }
            }
        }
    }

    async fn run_once(self: Arc<Self>, shared: &Arc<Shared>, stop: &CancellationToken) -> Outcome {
        self.set_state(State::Connecting);
        let connection = tokio::select! {
            () = stop.cancelled() => return Outcome::Stopped,
            c = Connection::connect(self.settings.address.clone(), None) => match c {
                Ok(c) => c,
                Err(e) => return Outcome::Failed(e.to_string()),
            },
        };
        let mut losses = connection.losses();
        losses.mark_unchanged();
        let mut client = DriverClient::new(&connection, CallMetrics::new(shared.csi_ops.clone()))
            .with_max_log_length(shared.max_grpc_log_length);

        self.set_state(State::NotReady);
        let ready = tokio::select! {
            () = stop.cancelled() => return Outcome::Stopped,
            _ = losses.changed() => return Outcome::ConnectionLost,
            r = csi::probe::probe_until_ready(&client, self.settings.timeout) => r,
        };
        if let Err(e) = ready {
            return Outcome::Failed(format!("probe failed: {e}"));
        }
        let name = match csi::probe::plugin_name(&client).await {
            Ok(n) => n,
            Err(e) => return Outcome::Failed(format!("GetPluginInfo failed: {e}")),
        };
        if let Some(expected) = &self.settings.expected_name
            && *expected != name
        {
            return Outcome::Failed(format!(
                "driver at {} reports name {name:?}, but the configuration expects {expected:?}",
                self.settings.address
            ));
        }
        client.metrics_mut().set_driver(
            &name,
            crate::controller::translation::is_migration_driver(&name),
        );
        let caps = match csi::probe::capabilities(&client).await {
            Ok(c) => c,
            Err(e) => return Outcome::Failed(format!("capability detection failed: {e}")),
        };
        {
            let mut info = write(&self.info);
            info.name = Some(name.clone());
            info.capabilities = Some(caps);
        }
        if self.origin == Origin::Discovered && !caps.controller_service {
            tracing::info!(driver = %name, "discovered socket has no controller service; recording it as a node plugin");
            self.set_state(State::NoControllerService);
            return tokio::select! {
                () = stop.cancelled() => Outcome::Stopped,
                _ = losses.changed() => Outcome::ConnectionLost,
            };
        }
        if let Err(reason) = shared.registry.register(&name, &self) {
            return Outcome::Failed(reason);
        }
        let span = tracing::info_span!("driver", driver = %name);
        tracing::info!(parent: &span, ?caps, "driver ready");
        self.clone()
            .serve(shared, stop, &name, caps, client, losses)
            .instrument(span)
            .await
    }

    /// Holds (or waits for) the Lease and runs the workers while leading.
    /// When the hub asks this replica to hand the driver over (leadership
    /// balancing), the Lease is vacated and the election starts again.
    async fn serve(
        self: Arc<Self>,
        shared: &Arc<Shared>,
        stop: &CancellationToken,
        name: &str,
        caps: Capabilities,
        client: DriverClient,
        mut losses: tokio::sync::watch::Receiver<u64>,
    ) -> Outcome {
        let handler = Arc::new(self.build_handler(shared, name, caps, client));
        loop {
            match self
                .clone()
                .serve_term(shared, stop, name, &handler, &mut losses)
                .await
            {
                Term::Over(outcome) => return outcome,
                Term::HandedOver => {
                    tracing::info!("handed the driver over to another replica");
                    // Give the others a retry period to pick the Lease up
                    // before this replica competes for it again.
                    let pause = self
                        .settings
                        .leader_election
                        .as_ref()
                        .map_or(Duration::ZERO, |le| le.retry_period);
                    tokio::select! {
                        () = stop.cancelled() => return Outcome::Stopped,
                        _ = losses.changed() => return Outcome::ConnectionLost,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }

    /// One term of the election: from candidacy to stop, loss, or hand-over.
    async fn serve_term(
        self: Arc<Self>,
        shared: &Arc<Shared>,
        stop: &CancellationToken,
        name: &str,
        handler: &Arc<Handler>,
        losses: &mut tokio::sync::watch::Receiver<u64>,
    ) -> Term {
        let election = CancellationToken::new();
        let (mut leadership, election_task) = match &self.settings.leader_election {
            None => {
                let (tx, rx) = tokio::sync::watch::channel(Leadership::Leading);
                drop(tx);
                (rx, None)
            }
            Some(le) => {
                let lease = crate::names::lease_name(name);
                write(&self.info).lease = Some(lease.clone());
                let config_name = lease.clone();
                let config = leader::Config {
                    name: lease,
                    namespace: le.namespace.clone(),
                    identity: le.identity.clone(),
                    lease_duration: le.lease_duration,
                    renew_deadline: le.renew_deadline,
                    retry_period: le.retry_period,
                    labels: le.labels.clone(),
                    release_on_cancel: le.release_on_exit,
                };
                let api = Api::<Lease>::namespaced(shared.leader_client.clone(), &le.namespace);
                let elector = match LeaderElector::new(api, config) {
                    Ok(e) => e,
                    Err(e) => return Term::Over(Outcome::Failed(format!("leader election: {e}"))),
                };
                let balance = shared.balance.clone();
                let feed = shared
                    .lease_feeds
                    .entry(config_name.clone())
                    .or_insert_with(|| tokio::sync::watch::channel(None).0)
                    .subscribe();
                let elector = elector
                    .with_acquire_gate(AcquireGate(Arc::new(move || balance.may_acquire())))
                    .with_feed(feed);
                shared
                    .leader_status
                    .insert(name.to_string(), elector.status());
                let (rx, task) = elector.spawn(election.clone());
                (rx, Some(task))
            }
        };
        let balanced = election_task.is_some();

        let mut workers: Option<Workers> = None;
        let term = loop {
            let leading = leadership.borrow_and_update().clone();
            match (&leading, workers.is_some()) {
                (Leadership::Leading, false) => {
                    self.set_state(State::Leading);
                    shared.metrics.set_leader(name, true);
                    if balanced {
                        shared.balance.set_leading(true);
                    }
                    workers = Some(self.clone().start_workers(shared, handler));
                }
                (Leadership::Standby { holder }, running) => {
                    if running && let Some(w) = workers.take() {
                        // Another replica may lead already: stop at once, as the Go sidecar
                        // does by exiting. Keys cut short go back to their queues.
                        tracing::warn!("lost leadership; stopping workers now");
                        self.abort_workers(w).await;
                        shared.balance.set_leading(false);
                    }
                    shared.metrics.set_leader(name, false);
                    write(&self.info).lease_holder = holder.clone();
                    self.set_state(State::Standby);
                }
                _ => {}
            }
            if leading.is_leading() && balanced {
                write(&self.info).lease_holder =
                    shared.leader_status.get(name).and_then(|s| s.holder());
            }
            tokio::select! {
                () = stop.cancelled() => break Term::Over(Outcome::Stopped),
                _ = losses.changed() => break Term::Over(Outcome::ConnectionLost),
                () = self.hand_over.notified(), if workers.is_some() && balanced => break Term::HandedOver,
                changed = leadership.changed() => if changed.is_err() && balanced {
                    // The elector ended on its own: treat as a lost lease.
                    break Term::Over(Outcome::Failed("leader election ended".into()));
                } else if changed.is_err() {
                    // No leader election: wait for stop or loss only.
                    tokio::select! {
                        () = stop.cancelled() => break Term::Over(Outcome::Stopped),
                        _ = losses.changed() => break Term::Over(Outcome::ConnectionLost),
                    }
                },
            }
        };

        // Phase 1: stop taking work; let in-flight calls finish within a bound.
        if let Some(w) = workers.take() {
            self.stop_workers(w).await;
            if balanced {
                shared.balance.set_leading(false);
            }
        }
        // Phase 2: vacate the Lease so the next leader starts at once.
        election.cancel();
        if let Some(task) = election_task {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed"),
                Err(e) => tracing::warn!(error = %e, "leader election task failed"),
            }
        }
        shared.leader_status.remove(name);
        shared.lease_feeds.remove(&crate::names::lease_name(name));
        shared.metrics.set_leader(name, false);
        if matches!(term, Term::HandedOver) {
            write(&self.info).lease_holder = None;
            self.set_state(State::Standby);
        }
        term
    }

    /// Asks the driver to vacate its Lease so another replica takes it over
    /// (leadership balancing). Ignored unless it leads.
    pub fn hand_over(&self) {
        self.hand_over.notify_one();
    }

    fn build_handler(
        &self,
        shared: &Shared,
        name: &str,
        caps: Capabilities,
        client: DriverClient,
    ) -> Handler {
        let limit = self.settings.api_budget;
        let budget = ApiBudget::new(
            name,
            limit,
            shared.api_cap.clone(),
            shared.metrics.api_observer(name, limit.qps()),
        );
        *write(&self.budget) = Some(budget.clone());
        let writer = Writer::new(shared.client.clone(), budget)
            .with_request_counter(shared.metrics.api_requests.clone(), name);
        if caps.needs_attach() {
            Handler::Csi(Box::new(CsiHandler::new(
                name.to_string(),
                client,
                caps,
                writer,
                shared.stores.clone(),
                csi_handler::Config {
                    timeout: self.settings.timeout,
                    default_fstype: self.settings.default_fstype.clone(),
                    max_entries: self.settings.max_entries,
                    save_error_code: self.settings.save_error_code,
                },
            )))
        } else {
            tracing::info!("driver does not attach; using the trivial handler");
            Handler::Trivial(TrivialHandler::new(writer))
        }
    }

    fn start_workers(self: Arc<Self>, shared: &Arc<Shared>, handler: &Arc<Handler>) -> Workers {
        let token = CancellationToken::new();
        let mut set = JoinSet::new();
        *write(&self.handler) = Some(handler.clone());
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
    async fn abort_workers(&self, mut w: Workers) {
        *write(&self.handler) = None;
        w.token.cancel();
        w.set.abort_all();
        while w.set.join_next().await.is_some() {}
    }

    /// Stops the workers, letting in-flight work finish within the drain timeout (we still
    /// hold the Lease: shutdown or hand-over).
    async fn stop_workers(&self, mut w: Workers) {
        *write(&self.handler) = None;
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
                next = queue.claim() => match next { Some(c) => c, None => return },
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
                write(&self.info).last_error = Some(format!("{key}: internal error: {panic}"));
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
                write(&self.info).last_error = Some(format!("{key}: {error}"));
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

/// Runs `fut`, turning a panic inside it into an error with the panic's
/// message, so that a bug hit by one object or one driver stays there.
pub async fn guarded<T>(fut: impl std::future::Future<Output = T>) -> Result<T, String> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|payload| panic_message(&*payload))
}

/// The message a panic was raised with (`"panic"` when it carried no text).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

/// How one election term ended.
enum Term {
    /// The driver's life ends (stop, connection loss, failure).
    Over(Outcome),
    /// The Lease was handed to another replica; stand again.
    HandedOver,
}

/// How one life of a driver ended.
enum Outcome {
    Stopped,
    ConnectionLost,
    Failed(String),
}

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

struct Workers {
    token: CancellationToken,
    set: JoinSet<()>,
}

/// Per-key async locks; entries disappear when the last holder is done.
#[derive(Debug, Default)]
struct KeyLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyLocks {
    async fn lock(&self, key: &str) -> KeyGuard<'_> {
        let m = {
            let mut map = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            map.entry(key.to_string()).or_default().clone()
        };
        let guard = m.lock_owned().await;
        KeyGuard {
            locks: self,
            key: key.to_string(),
            guard: Some(guard),
        }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self
            .locks
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_sync_becomes_an_error_with_its_message() {
        let ok = guarded(async { 7 }).await;
        assert_eq!(ok, Ok(7));
        let failed = guarded(async {
            let v: Vec<u8> = Vec::new();
            if v.is_empty() {
                panic!("bug for key {}", "va-1");
            }
            1
        })
        .await;
        assert_eq!(failed, Err("bug for key va-1".to_string()));
        let static_msg: Result<(), String> = guarded(async {
            if ok.is_ok() {
                panic!("static");
            }
        })
        .await;
        assert_eq!(static_msg, Err("static".to_string()));
    }
}
