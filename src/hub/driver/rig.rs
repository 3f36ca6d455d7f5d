//! A rig for the tests of a driver's life: a driver slot with (or without) leader election on
//! short timings, over a fake API server and caches filled by hand, and what a term or a life
//! needs around it.

use std::{pin::Pin, sync::Arc, time::Duration};

use super::{Driver, Origin, term::Term};
use crate::{
    cli::Args,
    config::{Defaults, Settings},
    controller::{Handler, trivial_handler::TrivialHandler},
    fake_api::FakeApi,
    hub::context::{Context, tests::context},
    k8s::stores::TestStores,
};

/// The driver's name.
pub(super) const DRIVER: &str = crate::controller::fixtures::DRIVER;
/// Lease duration of the rig's leader election.
pub(super) const LEASE: Duration = Duration::from_secs(4);
/// Renew deadline.
pub(super) const RENEW: Duration = Duration::from_secs(3);
/// Retry period.
pub(super) const RETRY: Duration = Duration::from_secs(1);

/// The settings of a driver at `/fake/csi.sock` with two workers per pool, electing (or not)
/// in namespace `default` as `me`.
pub(super) fn settings(leader_election: bool) -> Settings {
    let mut args = Args {
        worker_threads: 2,
        ..Args::default()
    };
    args.leader_election.enabled = leader_election;
    args.leader_election.namespace = Some("default".into());
    args.leader_election.lease_duration = LEASE;
    args.leader_election.renew_deadline = RENEW;
    args.leader_election.retry_period = RETRY;
    Defaults::with_identity(&args, "me".into())
        .settings_for("/fake/csi.sock".parse().expect("a path"))
}

/// A driver slot that has told its name, the hub around it, and the fake API server.
pub(super) struct Rig {
    pub(super) api: FakeApi,
    pub(super) caches: TestStores,
    pub(super) hub: Arc<Context>,
    pub(super) driver: Arc<Driver>,
}

impl Rig {
    pub(super) fn new(leader_election: bool) -> Self {
        Self::with(settings(leader_election))
    }

    pub(super) fn with(settings: Settings) -> Self {
        let api = FakeApi::default();
        let caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let driver = Driver::named(settings, Origin::Configured, DRIVER);
        Rig {
            api,
            caches,
            hub,
            driver,
        }
    }

    /// A trivial handler writing through the fake API server.
    pub(super) fn trivial_handler(&self) -> Arc<Handler> {
        Arc::new(Handler::Trivial(TrivialHandler::new(
            self.api.writer(DRIVER),
        )))
    }

    /// The leader metric of the driver.
    pub(super) fn leader_metric(&self) -> f64 {
        let lease = crate::names::lease_name(DRIVER);
        self.hub
            .shared
            .metrics
            .leader
            .with_label_values(&[lease.as_str(), DRIVER])
            .get()
    }
}

/// Drives `term` until `done` holds (checked every 10 ms of paused time); panics if the term
/// ends first.
pub(super) async fn until<F>(mut term: Pin<&mut F>, what: &str, done: impl Fn() -> bool)
where
    F: Future<Output = Term>,
{
    let wait = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        _ = term.as_mut() => panic!("the term ended before {what}"),
        () = wait => {}
    }
}

/// Drives `term` for `period`; panics if it ends meanwhile.
pub(super) async fn for_a_while<F>(mut term: Pin<&mut F>, what: &str, period: Duration)
where
    F: Future<Output = Term>,
{
    tokio::select! {
        _ = term.as_mut() => panic!("the term ended: {what}"),
        () = tokio::time::sleep(period) => {}
    }
}
