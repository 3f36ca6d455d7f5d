//! The leadership-balancing task of a hub replica: keeps its presence Lease, recomputes its
//! share of driver Leases from a watch of the namespace's presence Leases, hands surplus drivers
//! over, and, while some elector can use it, feeds every driver Lease a second watch sees to
//! that Lease's elector.

use std::{ops::ControlFlow, sync::Arc, time::Duration};

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use tokio_util::sync::CancellationToken;

use super::{
    balance_view::{
        FeedChange, LeaseEvent, PresenceView, Reaction, feed_change, feed_wanted, presence_duration,
    },
    context::Context,
    driver::{Driver, State},
};
use crate::{
    api_error::{Grant, one_line},
    k8s::router,
    leader::balance::{self, Presence},
};

/// Settings of leadership balancing.
#[derive(Clone, Debug)]
pub struct BalanceConfig {
    /// Namespace of the presence Leases (the leader-election namespace).
    pub namespace: String,
    /// This replica's identity.
    pub identity: String,
    /// Presence Lease duration: a replica silent this long no longer counts.
    pub lease_duration: Duration,
    /// How often presence is renewed and the share recomputed.
    pub retry_period: Duration,
}

/// Keeps this replica's presence Lease, recomputes its share of driver Leases, and hands
/// surplus drivers over to other replicas. A watch on the namespace's presence Leases tells
/// which replicas of our group are alive. A second watch, on all of the namespace's Leases,
/// tells the electors that wait for a Lease when it is renewed or handed over, so that a
/// replica below its share takes a Lease at once (no gap between the giver's release and the
/// taker's next retry); it runs only while such an elector may exist ([`feed_wanted`]), since
/// every renewal of every driver Lease comes back through it.
pub(crate) async fn balance_leases(
    hub: Arc<Context>,
    config: BalanceConfig,
    stop: CancellationToken,
) {
    use futures::StreamExt;

    let api = kube::Api::<Lease>::namespaced(hub.shared.leader_client.clone(), &config.namespace);
    let presence = Presence::new(
        api,
        &config.identity,
        presence_duration(config.lease_duration, config.retry_period),
        config.retry_period,
    );
    let mut events = lease_watch(&hub, &config.namespace, true);
    let mut balancer = Balancer {
        // Until the first round says otherwise, every elector may be waiting.
        feed: Some(lease_watch(&hub, &config.namespace, false)),
        hub,
        config,
        presence,
        view: PresenceView::default(),
        // Refused Lease watches: a warning at most every WATCH_LOG_EVERY.
        refusals: crate::telemetry::Throttle::new(WATCH_LOG_EVERY),
    };
    let hub = balancer.hub.clone();
    let mut given_up = hub.shared.balance.given_up();

    // The first share must count every configured driver, not the few started so far; and
    // other replicas hand drivers over to this one as soon as its presence counts, so it
    // shows itself only once its drivers have started and it can take them
    // (`super::startup`).
    tokio::select! {
        () = stop.cancelled() => return,
        () = hub.first_reconcile.cancelled() => {}
    }
    if !super::startup::wait_over(&hub, &stop).await {
        return;
    }
    let mut tick = tokio::time::interval(balancer.config.retry_period);
    // A reload that adds or removes drivers changes the share at once, not a period later.
    let mut slots_changed = hub.registry.slots_changed();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Ok(()) = slots_changed.changed() => tick.reset_immediately(),
            // A driver Lease given up: its elector waits for the Lease again, fed from now on.
            Ok(()) = given_up.changed() => balancer.given_up(),
            Some(event) = next_or_pending(balancer.feed.as_mut()) => balancer.fed(event),
            event = events.next() => match event {
                Some(Ok(event)) => {
                    if balancer.presence_event(event) {
                        tick.reset_immediately();
                    }
                }
                Some(Err(error)) => balancer.watch_failed("the presence Lease watch", &error),
                None => break,
            },
            _ = tick.tick() => {
                if balancer.round(&stop).await.is_break() {
                    break;
                }
            }
        }
    }
    balancer.presence.remove().await;
}

/// The state of the balancing task between wake-ups, and what it does at each.
struct Balancer {
    hub: Arc<Context>,
    config: BalanceConfig,
    /// Our presence Lease.
    presence: Presence,
    /// The presence Leases, and what the last round counted.
    view: PresenceView,
    /// The driver Lease watch, while it runs.
    feed: Option<LeaseStream>,
    /// Refusals of either Lease watch, so that they are warned of at most every
    /// [`WATCH_LOG_EVERY`].
    refusals: crate::telemetry::Throttle,
}

impl Balancer {
    /// A driver Lease was given up: its elector waits for it again, so the driver Lease watch
    /// runs.
    fn given_up(&mut self) {
        if self.feed.is_none() {
            tracing::debug!("a driver Lease was given up; watching the driver Leases");
            self.feed = Some(lease_watch(&self.hub, &self.config.namespace, false));
        }
    }

    /// An item of the driver Lease watch: an event goes to the electors, a failure is logged.
    fn fed(&mut self, event: Result<LeaseEvent, kube::runtime::watcher::Error>) {
        match event {
            Ok(event) => feed_electors(&self.hub.shared, &event),
            Err(error) => self.watch_failed("the driver Lease watch", &error),
        }
    }

    /// A failure of the Lease watch `what`.
    fn watch_failed(&mut self, what: &str, error: &kube::runtime::watcher::Error) {
        watch_failed(&mut self.refusals, what, &self.config.namespace, error);
    }

    /// An event of the presence Lease watch; whether a round is due at once.
    fn presence_event(&mut self, event: LeaseEvent) -> bool {
        let (wall, now) = (Timestamp::now(), tokio::time::Instant::now());
        match self.view.on_event(event, self.presence.name(), wall, now) {
            Reaction::Nothing => false,
            Reaction::RoundNow => true,
            Reaction::Recount { group, others } => {
                let (before, share) = self.hub.shared.balance.set_others(others);
                if share != before {
                    tracing::info!(share, %group, "leadership share changed");
                }
                false
            }
        }
    }

    /// One round: writes our presence if due, recounts the share, starts or stops the driver
    /// Lease watch, and hands the surplus over. Breaks when `stop` comes during it.
    async fn round(&mut self, stop: &CancellationToken) -> ControlFlow<()> {
        // Drivers with a Lease: every replica of the group has the same list, so the share is
        // computed over all of them, ready here or not.
        let slots = self.hub.registry.slots();
        let candidates: Vec<_> = slots
            .iter()
            .filter(|d| d.settings().leader_election.is_some())
            .collect();
        let group = balance::group_key(
            candidates
                .iter()
                .map(|d| d.settings().address.path().to_str().unwrap_or_default()),
        );
        let now = tokio::time::Instant::now();
        let (own, period) = (self.presence.name(), self.config.retry_period);
        let renew = self.view.plan_round(own, &group, period, now);
        let known = self.view.known();
        let round = tokio::select! {
            () = stop.cancelled() => return ControlFlow::Break(()),
            r = self.presence.round(
                &self.hub.shared.balance, candidates.len(), &group, &known, self.view.sightings(), renew,
            ) => r,
        };
        self.view.counted(group, round.is_ok() && renew, now);
        if let Err(error) = round {
            let grant = Grant {
                verb: "get, create and update",
                resource: "leases.coordination.k8s.io",
                namespace: Some(&self.config.namespace),
                granted_by: "bind deploy/base/rbac/role.yaml there (chart: rbac.create)",
            };
            let error = one_line(&error, Some(&grant));
            tracing::warn!(error, "renewing replica presence failed");
            return ControlFlow::Continue(());
        }
        let wanted = feed_wanted(
            self.view.peers(),
            candidates.len(),
            self.hub.shared.balance.leading(),
        );
        self.change_feed(feed_change(wanted, self.feed.is_some()));
        for d in to_hand_over(&candidates, self.hub.shared.balance.surplus()) {
            tracing::info!(
                driver = d.name().unwrap_or_default(),
                "over this replica's share; handing the driver over"
            );
            d.hand_over();
        }
        ControlFlow::Continue(())
    }

    /// Starts or stops the driver Lease watch.
    fn change_feed(&mut self, change: Option<FeedChange>) {
        match change {
            Some(FeedChange::Start) => {
                tracing::debug!(peers = self.view.peers(), "watching the driver Leases");
                self.feed = Some(lease_watch(&self.hub, &self.config.namespace, false));
            }
            Some(FeedChange::Stop) => {
                tracing::debug!(
                    "every driver led here and no peer: not watching the driver Leases"
                );
                self.feed = None;
                // What was fed grows stale from now on: a later elector starts from its own read.
                for f in self.hub.shared.lease_feeds.iter() {
                    f.send_replace(None);
                }
            }
            None => {}
        }
    }
}

/// The drivers to hand over for a `surplus` of Leases: the leading ones with the greatest names
/// (deterministic, so that replicas agree), less those already being handed over (they still
/// lead while they drain, and still count in the surplus until they let go).
fn to_hand_over<'a>(candidates: &[&'a Arc<Driver>], surplus: usize) -> Vec<&'a Arc<Driver>> {
    let under_way = candidates.iter().filter(|d| d.handing_over()).count();
    let mut leading: Vec<&'a Arc<Driver>> = candidates
        .iter()
        .copied()
        .filter(|d| d.state() == State::Leading && !d.handing_over())
        .collect();
    leading.sort_by_key(|d| std::cmp::Reverse(d.name()));
    leading.truncate(surplus.saturating_sub(under_way));
    leading
}

/// `event` with the Lease it carries.
fn lease_event(
    event: kube::runtime::watcher::Event<crate::leader::LeanLease>,
) -> kube::runtime::watcher::Event<k8s_openapi::api::coordination::v1::Lease> {
    use kube::runtime::watcher::Event;
    match event {
        Event::Apply(l) => Event::Apply(l.0),
        Event::Delete(l) => Event::Delete(l.0),
        Event::Init => Event::Init,
        Event::InitApply(l) => Event::InitApply(l.0),
        Event::InitDone => Event::InitDone,
    }
}

/// A watch of the namespace's Leases, read without their managed fields (`LeanLease`), which
/// nothing here needs: only the presence Leases, or all of them.
fn lease_watch(hub: &Context, namespace: &str, presence_only: bool) -> LeaseStream {
    use futures::{StreamExt, TryStreamExt};
    use kube::runtime::{WatchStreamExt, watcher};

    let mut config = watcher::Config::default()
        .timeout(u32::try_from(crate::k8s::WATCH_TIMEOUT.as_secs()).unwrap_or(u32::MAX));
    if presence_only {
        config = config.labels(&format!("{}=true", crate::names::REPLICA_LABEL));
    }
    watcher(
        kube::Api::<crate::leader::LeanLease>::namespaced(
            hub.shared.leader_client.clone(),
            namespace,
        ),
        config,
    )
    .backoff(router::WatchBackoff::default())
    .map_ok(lease_event)
    .boxed()
}

/// One of the Lease watches.
type LeaseStream =
    futures::stream::BoxStream<'static, Result<LeaseEvent, kube::runtime::watcher::Error>>;

/// How often a refused Lease watch is worth a warning (it retries every few seconds).
const WATCH_LOG_EVERY: Duration = Duration::from_secs(30);

/// Logs a failure of one of the Lease watches (`what`) in `namespace`: a refusal (a missing
/// grant, which only an operator can fix: until then a hand-over waits for the retry tick) as
/// a warning at most every [`WATCH_LOG_EVERY`] naming the grant; anything else at debug level
/// (the watch retries with backoff).
fn watch_failed(
    refusals: &mut crate::telemetry::Throttle,
    what: &str,
    namespace: &str,
    error: &kube::runtime::watcher::Error,
) {
    use kube::runtime::watcher::Error as W;
    let verb = match error {
        W::InitialListFailed(_) => "list",
        _ => "watch",
    };
    let grant = Grant {
        verb,
        resource: "leases.coordination.k8s.io",
        namespace: Some(namespace),
        granted_by: "add deploy/components/replica-balance (chart: hub and daemonset shapes)",
    };
    let refused = match error {
        W::InitialListFailed(e) | W::WatchStartFailed(e) | W::WatchFailed(e) => {
            matches!(e, kube::Error::Api(s) if s.code == 403)
        }
        W::WatchError(s) => s.code == 403,
        W::NoResourceVersion => false,
    };
    let error = one_line(error, Some(&grant));
    match refused.then(|| refusals.failed()).flatten() {
        Some(failures) => tracing::warn!(error, failures, "{what} failed; retrying"),
        None => tracing::debug!(error, "{what} failed; retrying"),
    }
}

/// The next item of `stream`; never, without one.
async fn next_or_pending<S: futures::Stream + Unpin>(stream: Option<&mut S>) -> Option<S::Item> {
    use futures::StreamExt;
    match stream {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// Passes the driver Lease `event` shows to that Lease's elector (which then knows of
/// renewals, releases and deletions at once).
fn feed_electors(shared: &crate::hub::driver::context::Shared, event: &LeaseEvent) {
    use kube::runtime::watcher::Event;
    let (lease, seen) = match event {
        Event::Apply(l) | Event::InitApply(l) => (l, Some(l.clone())),
        Event::Delete(l) => (l, None),
        Event::Init | Event::InitDone => return,
    };
    if let Some(tx) = lease
        .metadata
        .name
        .as_deref()
        .and_then(|n| shared.lease_feeds.get(n))
    {
        tx.send_replace(Some(crate::leader::Seen::now(seen)));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::cli::Args;
    use crate::config::Defaults;
    use crate::fake_api::FakeApi;
    use crate::hub::context::tests::context;
    use crate::hub::driver::Origin;
    use crate::k8s::stores::TestStores;

    fn leading_driver(name: &str) -> Arc<Driver> {
        let defaults = Defaults::with_identity(&Args::default(), "me".into());
        let settings = defaults.settings_for(format!("/csi/{name}.sock").parse().expect("a path"));
        let driver = Driver::named(settings, Origin::Configured, name);
        driver.set_state_for_test(State::Leading);
        driver
    }

    fn names(drivers: &[&Arc<Driver>]) -> Vec<String> {
        drivers
            .iter()
            .map(|d| d.name().unwrap_or_default())
            .collect()
    }

    /// A surplus of two hands over the two greatest names; asked again while the first is
    /// still handing over (it leads until its Lease is vacated), only one more goes, not two.
    #[test]
    fn the_surplus_is_handed_over_once_counting_hand_overs_under_way() {
        let (a, b, c) = (
            leading_driver("a"),
            leading_driver("b"),
            leading_driver("c"),
        );
        let all = [&a, &b, &c];
        assert_eq!(names(&to_hand_over(&all, 2)), ["c", "b"]);
        assert!(to_hand_over(&all, 0).is_empty());
        c.hand_over();
        assert!(c.handing_over());
        assert_eq!(names(&to_hand_over(&all, 2)), ["b"]);
        assert!(to_hand_over(&all, 1).is_empty(), "c is on its way");
        // Standby drivers are never asked.
        b.set_state_for_test(State::Standby);
        b.hand_over();
        assert!(!b.handing_over());
        assert_eq!(names(&to_hand_over(&all, 2)), ["a"]);
    }

    fn lease(name: &str, holder: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.into());
        l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(holder.into()),
            ..Default::default()
        });
        l
    }

    /// The driver Lease watch passes each copy of a driver Lease, and its deletion, to that
    /// Lease's elector, and nothing of other Leases.
    #[tokio::test(start_paused = true)]
    async fn the_driver_lease_watch_feeds_each_electors_lease() {
        let caches = TestStores::new();
        let hub = context(&FakeApi::default(), caches.stores.clone());
        let shared = &hub.shared;
        let (feed, mut seen) = tokio::sync::watch::channel(None);
        shared.lease_feeds.insert("lease-a".into(), feed);
        let holder = |s: &tokio::sync::watch::Receiver<Option<crate::leader::Seen>>| {
            s.borrow().as_ref().map(|seen| {
                seen.lease
                    .as_ref()
                    .and_then(|l| l.spec.clone())
                    .and_then(|s| s.holder_identity)
            })
        };
        feed_electors(shared, &Event::Init);
        feed_electors(shared, &Event::InitApply(lease("presence-x", "x")));
        feed_electors(shared, &Event::InitDone);
        assert!(
            !seen.has_changed().expect("open"),
            "not this elector's Lease"
        );
        feed_electors(shared, &Event::InitApply(lease("lease-a", "other")));
        assert_eq!(holder(&seen), Some(Some("other".into())));
        seen.mark_unchanged();
        feed_electors(shared, &Event::Apply(lease("lease-a", "")));
        assert!(seen.has_changed().expect("open"));
        assert_eq!(holder(&seen), Some(Some(String::new())));
        feed_electors(shared, &Event::Delete(lease("lease-a", "")));
        assert_eq!(holder(&seen), Some(None), "deleted");
    }
}
