//! One driver's life: connect, probe, learn its name and capabilities, register, then hold (or
//! wait for) its Lease term after term; start over when the connection drops or a step fails.
//! What to make of the driver's answers, and how long to pause between lives and between terms,
//! are the pure decisions of `life_course`.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::Instrument;

use super::{
    Driver, State,
    context::Shared,
    life_course::{
        Capable, Ending, Restarts, capable, hand_over_pause, is_node_plugin, step_down_pause,
        wrong_name,
    },
    term::{GuardFeed, Outcome, Term, stop_or_loss},
};
use crate::{
    controller::{
        Handler,
        csi_handler::{self, CsiHandler},
        translation::is_migration_driver,
        trivial_handler::TrivialHandler,
    },
    csi::{self, CallMetrics, Capabilities, Connection, DriverClient},
    k8s::{budget::ApiBudget, writer::Writer},
    leader::guard::Guard,
    random::random_unit,
};

/// Where a container writes why it died (read by the kubelet).
const TERMINATION_LOG: &str = "/dev/termination-log";

/// The connection's cross-namespace Lease guard (with leader election): what its terms see of
/// it, and its task (aborted when dropped, like the elector, so a panic in the driver's task
/// ends it too).
type GuardRun = (Option<GuardFeed>, Option<AbortOnDropHandle<()>>);

impl Driver {
    /// Runs the driver until `stop` is cancelled: connect, probe, register,
    /// lead, work; start over on connection loss or a failed step.
    pub async fn run(self: Arc<Self>, shared: Arc<Shared>, stop: CancellationToken) {
        let mut restarts = Restarts::new();
        loop {
            let started = tokio::time::Instant::now();
            let outcome = self.clone().run_once(&shared, &stop).await;
            self.forget_name(&shared);
            let ending = match outcome {
                Outcome::ConnectionLost => Ending::Lost,
                _ => Ending::Failed,
            };
            let pause = restarts.after_life(started.elapsed(), ending);
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
                    tracing::warn!(pause = ?pause, "lost connection to the CSI driver; reconnecting");
                    self.record_error(None, "lost connection to the CSI driver".into());
                    self.set_state(State::Connecting);
                }
                Outcome::Failed(reason) => self.set_state(State::Failed { reason }),
            }
            tokio::select! {
                () = stop.cancelled() => {
                    self.set_state(State::Stopped);
                    return;
                }
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// After a life: the driver's name is free for another slot, and its Lease feed goes.
    fn forget_name(self: &Arc<Self>, shared: &Shared) {
        if let Some(name) = self.name() {
            shared.names.unregister(&name, self);
            // The Lease feed served every term of this connection; a new connection (maybe
            // to a driver of another name) starts a new one.
            shared.lease_feeds.remove(&crate::names::lease_name(&name));
        }
    }

    /// One life: connect, learn the driver's name and capabilities, register the name, and
    /// serve the driver until the connection or a step ends it.
    async fn run_once(self: Arc<Self>, shared: &Arc<Shared>, stop: &CancellationToken) -> Outcome {
        self.set_state(State::Connecting);
        let connection = match self.connect(stop).await {
            Ok(c) => c,
            Err(outcome) => return outcome,
        };
        let mut losses = connection.losses();
        losses.mark_unchanged();
        let mut client = DriverClient::new(&connection, CallMetrics::new(shared.csi_ops.clone()))
            .with_max_log_length(shared.max_grpc_log_length);
        let name = match self.identify(&client, stop, &mut losses).await {
            Ok(n) => n,
            Err(outcome) => return outcome,
        };
        client
            .metrics_mut()
            .set_driver(&name, is_migration_driver(&name));
        let caps = match self
            .learn_capabilities(&client, &name, stop, &mut losses)
            .await
        {
            Ok(c) => c,
            Err(outcome) => return outcome,
        };
        if let Err(reason) = shared.names.register(&name, &self) {
            return Outcome::Failed(reason);
        }
        tracing::Span::current().record("driver", name.as_str());
        // Connected and named: the socket is said once here; the lines of its terms, workers,
        // Lease and guard name the driver only.
        let span = tracing::info_span!(parent: None, "driver", driver = %name);
        tracing::info!(parent: &span, socket = %self.settings.address, capabilities = %caps, "driver ready");
        self.clone()
            .serve(shared, stop, &name, caps, client, losses)
            .instrument(span)
            .await
    }

    /// Connects to the driver's socket (each failed attempt shown as the driver's error).
    async fn connect(&self, stop: &CancellationToken) -> Result<Connection, Outcome> {
        tokio::select! {
            () = stop.cancelled() => Err(Outcome::Stopped),
            c = Connection::connect_reporting(self.settings.address.clone(), None, |cause| {
                self.record_error(None, cause.to_owned());
            }) => c.map_err(|e| Outcome::Failed(e.to_string())),
        }
    }

    /// Waits for the driver to be ready, and reads its name: the one configured, if any.
    async fn identify(
        &self,
        client: &DriverClient,
        stop: &CancellationToken,
        losses: &mut watch::Receiver<u64>,
    ) -> Result<String, Outcome> {
        self.set_state(State::NotReady);
        let ready = tokio::select! {
            () = stop.cancelled() => return Err(Outcome::Stopped),
            _ = losses.changed() => return Err(Outcome::ConnectionLost),
            r = csi::probe::probe_until_ready(client, self.settings.timeout) => r,
        };
        if let Err(e) = ready {
            return Err(Outcome::Failed(format!("probe failed: {e}")));
        }
        let name = csi::probe::plugin_name(client)
            .await
            .map_err(|e| Outcome::Failed(format!("GetPluginInfo failed: {e}")))?;
        let expected = self.settings.expected_name.as_deref();
        match wrong_name(expected, &name, &self.settings.address) {
            Some(reason) => Err(Outcome::Failed(reason)),
            None => Ok(name),
        }
    }

    /// Reads the driver's capabilities and shows them with its name. A node plugin is recorded
    /// as one, and its life goes on without serving it until it stops or its connection goes
    /// (the life's outcome then).
    async fn learn_capabilities(
        &self,
        client: &DriverClient,
        name: &str,
        stop: &CancellationToken,
        losses: &mut watch::Receiver<u64>,
    ) -> Result<Capabilities, Outcome> {
        let caps = match capable(self.origin, csi::probe::capabilities(client).await) {
            Capable::Known(caps) => caps,
            Capable::Unserved(e) => {
                tracing::info!(driver = %name, error = %e, "discovered socket does not serve the controller service it offers; recording it as a node plugin");
                self.info.write().name = Some(name.to_string());
                self.set_state(State::NoControllerService);
                return Err(stop_or_loss(stop, losses).await);
            }
            Capable::Failed(reason) => return Err(Outcome::Failed(reason)),
        };
        {
            let mut info = self.info.write();
            info.name = Some(name.to_string());
            info.capabilities = Some(caps);
        }
        if is_node_plugin(self.origin, &caps) {
            tracing::info!(driver = %name, "discovered socket has no controller service; recording it as a node plugin");
            self.set_state(State::NoControllerService);
            return Err(stop_or_loss(stop, losses).await);
        }
        Ok(caps)
    }

    /// Holds (or waits for) the Lease and runs the workers while leading.
    /// When the hub asks this replica to hand the driver over (leadership
    /// balancing), the Lease is vacated and the election starts again. With leader election, the
    /// cross-namespace Lease guard runs for the whole connection, across terms, so that what it
    /// has seen of other namespaces survives a hand-over.
    async fn serve(
        self: Arc<Self>,
        shared: &Arc<Shared>,
        stop: &CancellationToken,
        name: &str,
        caps: Capabilities,
        client: DriverClient,
        mut losses: watch::Receiver<u64>,
    ) -> Outcome {
        let handler = Arc::new(self.build_handler(shared, name, caps, client));
        *self.connected.write() = Some(handler.clone());
        let guard_stop = stop.child_token();
        let (mut feed, guard_task) = self.start_guard(shared, name, &guard_stop);
        let outcome = loop {
            let term = self
                .clone()
                .serve_term(shared, stop, name, &handler, &mut losses, feed.as_mut())
                .await;
            let pause = match term {
                Term::Over(outcome) => break outcome,
                Term::HandedOver => {
                    tracing::info!("handed the driver over to another replica");
                    let le = self.settings.leader_election.as_ref();
                    hand_over_pause(le.map(|le| le.retry_period))
                }
                Term::Yielded(holder) => {
                    let le = self.settings.leader_election.as_ref();
                    let pause = le.map_or(Duration::ZERO, |le| {
                        step_down_pause(le.lease_duration, random_unit())
                    });
                    tracing::info!(other_namespace = %holder.namespace, holder = %holder.holder, ?pause, "stepped down for the holder of the Lease in another namespace");
                    pause
                }
            };
            tokio::select! {
                () = stop.cancelled() => break Outcome::Stopped,
                _ = losses.changed() => break Outcome::ConnectionLost,
                () = tokio::time::sleep(pause) => {}
            }
        };
        self.end_connection(&guard_stop, guard_task).await;
        outcome
    }

    /// Starts the connection's cross-namespace Lease guard, with leader election; it runs
    /// until `guard_stop`.
    fn start_guard(&self, shared: &Shared, name: &str, guard_stop: &CancellationToken) -> GuardRun {
        let Some(le) = &self.settings.leader_election else {
            return (None, None);
        };
        let guard = Guard::new(
            kube::Api::all(shared.leader_client.clone()),
            crate::names::lease_name(name),
            le.namespace.clone(),
            le.identity.clone(),
            le.retry_period,
            le.lease_duration,
            Some(shared.renew_grid),
        );
        // Aborted with this future, like the elector (a panic in the driver's task).
        let task = AbortOnDropHandle::new(guard.spawn(guard_stop.clone()));
        *self.lease_guard.write() = Some(guard.view());
        let feed = GuardFeed {
            view: guard.view(),
            guard,
        };
        (Some(feed), Some(task))
    }

    /// The end of a connection: its guard stops, and the driver shows neither its guard's view
    /// nor a handler any more.
    async fn end_connection(
        &self,
        guard_stop: &CancellationToken,
        guard_task: Option<AbortOnDropHandle<()>>,
    ) {
        guard_stop.cancel();
        if let Some(task) = guard_task
            && let Err(e) = task.await
        {
            tracing::warn!(error = %e, "the lease guard task failed");
        }
        *self.lease_guard.write() = None;
        *self.connected.write() = None;
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
        *self.budget.write() = Some(budget.clone());
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::driver::rig::{self, Rig};

    /// A socket that accepts every connection and closes it at once (a driver crash-looping
    /// behind a socket that stays): the driver reconnects after growing pauses (1 s, 2 s, ...),
    /// never in a hot loop.
    #[tokio::test(start_paused = true)]
    async fn a_socket_that_drops_every_connection_is_retried_after_growing_pauses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        // When each connection was accepted, on the paused clock.
        let accepted = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let stamps = accepted.clone();
        // Each connection: read the client's HTTP/2 preface, answer with an empty SETTINGS
        // frame (so the client's handshake succeeds), then close.
        let server = AbortOnDropHandle::new(tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut stream, _)) = listener.accept().await {
                stamps.lock().push(tokio::time::Instant::now());
                let mut preface = [0u8; 24];
                let _ = stream.read_exact(&mut preface).await;
                let _ = stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
                drop(stream);
            }
        }));
        // The clock must not jump to the next timer while a connection is under way (the
        // socket's I/O is real): a blocking task holds it still, and the test moves it by hand.
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let still = tokio::task::spawn_blocking(move || held.recv());
        let mut settings = rig::settings(false);
        settings.address = path.to_str().expect("UTF-8").parse().expect("a path");
        let rig = Rig::with(settings);
        let stop = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let life = tokio::spawn(rig.driver.clone().run(rig.hub.shared.clone(), stop.clone()));
        // 3.5 s in 100 ms steps; at each, the driver runs as far as it can without the clock
        // (whatever it has to do on the socket) before the clock moves on.
        for _ in 0..35 {
            for _ in 0..500 {
                tokio::task::yield_now().await;
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        stop.cancel();
        drop(hold);
        still.await.expect("the clock's hold ends").ok();
        life.await.expect("the driver's life ends on stop");
        drop(server);
        let at: Vec<Duration> = accepted.lock().iter().map(|t| *t - start).collect();
        // Lives start at 0 s, 1 s and 3 s (each may dial more than once: the channel re-dials
        // on its own); reconnecting at once made hundreds in the first second.
        let mut lives = at.clone();
        lives.dedup();
        assert_eq!(
            lives,
            [0, 1, 3].map(Duration::from_secs),
            "connections at {at:?}"
        );
        assert!(at.len() <= 10, "connections at {at:?}");
        assert_eq!(rig.driver.state(), State::Stopped);
    }

    /// The handler remembers each `attached: true` it wrote (so that a stale copy from the
    /// watch does not publish again) until the VA goes. A VA deleted while this replica stands
    /// by must be forgotten too, or the memory grows for as long as the connection lasts.
    #[tokio::test(start_paused = true)]
    async fn a_va_deleted_while_standing_by_is_forgotten_by_the_handler() {
        use crate::controller::fixtures::{DRIVER, csi_spec, csinode, lean_va, now, pv, va};
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::storage::v1::VolumeAttachment;

        let mut rig = Rig::new(true);
        let csi = crate::csi::fake::FakeCsi::new(DRIVER);
        let stored = rig.api.put(&pv("pv1", csi_spec(&["ReadWriteOnce"])));
        rig.caches.apply_pv(&stored);
        rig.caches.apply_csinode(&csinode(&[(DRIVER, "id-1")]));
        let mut added = va(Some("pv1"));
        added.metadata.uid = Some("uid-1".into());
        added.metadata.creation_timestamp = Some(now());
        let added = rig.api.put(&added);
        rig.caches.apply_va(&added);

        let caps = Capabilities {
            controller_service: true,
            publish_unpublish: true,
            ..Capabilities::default()
        };
        let (_loss, losses) = tokio::sync::watch::channel(0u64);
        let stop = CancellationToken::new();
        let life = tokio::spawn({
            let (driver, shared, stop, client) = (
                rig.driver.clone(),
                rig.hub.shared.clone(),
                stop.clone(),
                csi.client().await,
            );
            async move {
                driver
                    .serve(&shared, &stop, DRIVER, caps, client, losses)
                    .await
            }
        });
        let eventually = async |what: &str, done: &dyn Fn() -> bool| {
            for _ in 0..10_000 {
                if done() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("{what} did not happen");
        };
        let attached = || {
            rig.api
                .get::<VolumeAttachment>(None, "va")
                .and_then(|v| v.status)
                .is_some_and(|s| s.attached)
        };
        eventually("the attach", &attached).await;
        let remembers = || match rig.driver.handler().as_deref() {
            Some(crate::controller::Handler::Csi(h)) => h.remembers("va"),
            _ => panic!("no CSI handler at work"),
        };
        assert!(remembers(), "our attached: true is remembered");

        // Another holder takes the Lease: this replica stands by.
        let lease_name = crate::names::lease_name(DRIVER);
        let set_holder = |holder: &str| {
            let mut lease: Lease = rig
                .api
                .get(Some("default"), &lease_name)
                .expect("the Lease");
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(holder.into());
            spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            ));
            rig.api.put(&lease);
        };
        set_holder("other");
        eventually("standing by", &|| rig.driver.state() == State::Standby).await;

        // The VA goes while this replica stands by.
        rig.caches.delete_va(&added);
        rig.driver.on_va_deleted(&lean_va(&added));

        // The other holder lets go; this replica leads again with the same handler.
        set_holder("");
        eventually("leading again", &|| rig.driver.state() == State::Leading).await;
        assert!(!remembers(), "the deleted VA is forgotten");
        stop.cancel();
        let _ = life.await;
    }
}
