//! The leadership-balancing task of a hub replica: keeps its presence Lease, recomputes its
//! share of driver Leases from a watch of the namespace's presence Leases, hands surplus drivers
//! over, and, while some elector can use it, feeds every driver Lease a second watch sees to
//! that Lease's elector.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{
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
    use k8s_openapi::api::coordination::v1::Lease;

    let api = kube::Api::<Lease>::namespaced(hub.shared.leader_client.clone(), &config.namespace);
    // A replica's presence expires before its driver Leases do (they are renewed as often and
    // last a retry period longer), so when a dead replica's driver Leases expire the survivors
    // already count it out and may take them at once.
    let presence_duration = config
        .lease_duration
        .saturating_sub(config.retry_period)
        .max(config.retry_period * 2);
    let presence = Presence::new(
        api,
        &config.identity,
        presence_duration,
        config.retry_period,
    );
    let mut leases: HashMap<String, Lease> = HashMap::new();
    let mut listing: HashMap<String, Lease> = HashMap::new();
    let mut events = lease_watch(&hub, &config.namespace, true);
    // Until the first round says otherwise, every elector may be waiting.
    let mut feed = Some(lease_watch(&hub, &config.namespace, false));
    let mut given_up = hub.shared.balance.given_up();

    // The first share must count every configured driver, not the few started so far.
    tokio::select! {
        () = stop.cancelled() => return,
        () = hub.first_reconcile.cancelled() => {}
    }
    let mut tick = tokio::time::interval(config.retry_period);
    // Refused Lease watches: a warning at most every WATCH_LOG_EVERY.
    let mut refusals = crate::telemetry::Throttle::new(WATCH_LOG_EVERY);
    // A reload that adds or removes drivers changes the share at once, not a period later.
    let mut slots_changed = hub.registry.slots_changed();
    // Whether the last round saw another live replica, and when we last wrote our presence.
    let mut peers = false;
    let mut renewed: Option<tokio::time::Instant> = None;
    // When each presence Lease was seen renewed, and the group the last round counted in.
    let mut sightings = balance::Sightings::default();
    let mut counted_group: Option<String> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Ok(()) = slots_changed.changed() => {
                tick.reset_immediately();
                continue;
            }
            // A driver Lease given up: its elector waits for the Lease again, fed from now on.
            Ok(()) = given_up.changed() => {
                if feed.is_none() {
                    tracing::debug!("a driver Lease was given up; watching the driver Leases");
                    feed = Some(lease_watch(&hub, &config.namespace, false));
                }
                continue;
            }
            Some(event) = next_or_pending(feed.as_mut()) => {
                match event {
                    Ok(event) => feed_electors(&hub.shared, &event),
                    Err(error) => watch_failed(&mut refusals, "the driver Lease watch", &config.namespace, &error),
                }
                continue;
            }
            event = events.next() => {
                match event {
                    Some(Ok(event)) => {
                        // A replica alone learns of a newcomer at once, and renews its presence
                        // so that the newcomer counts it.
                        let newcomer = !peers && is_other_presence(&event, presence.name());
                        let recount = sight(&mut sightings, &event);
                        apply_lease_event(&mut leases, &mut listing, event);
                        if recount {
                            sightings.retain(|name| leases.contains_key(name));
                        }
                        if newcomer {
                            tick.reset_immediately();
                        } else if recount && let Some(group) = &counted_group {
                            // A renewal, a departure: the share follows at once, not a round
                            // later (judged by a round's snapshot, a peer whose renewal came
                            // just after it looked expired just before the next).
                            let others = balance::others_in_group(
                                leases.values(),
                                &sightings,
                                presence.name(),
                                group,
                                tokio::time::Instant::now(),
                            );
                            let (before, share) = hub.shared.balance.set_others(others);
                            if share != before {
                                tracing::info!(share, %group, "leadership share changed");
                            }
                        }
                    }
                    Some(Err(error)) => watch_failed(&mut refusals, "the presence Lease watch", &config.namespace, &error),
                    None => break,
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        // Drivers with a Lease: every replica of the group has the same list, so the share is
        // computed over all of them, ready here or not.
        let slots = hub.registry.slots();
        let candidates: Vec<_> = slots
            .iter()
            .filter(|d| d.settings().leader_election.is_some())
            .collect();
        let group = balance::group_key(
            candidates
                .iter()
                .map(|d| d.settings().address.path().to_str().unwrap_or_default()),
        );
        let known: Vec<&Lease> = leases.values().collect();
        let now = tokio::time::Instant::now();
        peers = !balance::others_in_group(
            known.iter().copied(),
            &sightings,
            presence.name(),
            &group,
            now,
        )
        .is_empty();
        let own = known
            .iter()
            .copied()
            .find(|l| l.metadata.name.as_deref() == Some(presence.name()));
        let renew = balance::presence_due(own, &group, peers, renewed, config.retry_period, now);
        let round = tokio::select! {
            () = stop.cancelled() => break,
            r = presence.round(
                &hub.shared.balance, candidates.len(), &group, &known, &sightings, renew,
            ) => r,
        };
        counted_group = Some(group);
        match round {
            Ok(_) if renew => renewed = Some(now),
            Ok(_) => {}
            Err(error) => {
                let grant = Grant {
                    verb: "get, create and update",
                    resource: "leases.coordination.k8s.io",
                    namespace: Some(&config.namespace),
                    granted_by: "bind deploy/base/rbac/role.yaml there (chart: rbac.create)",
                };
                let error = one_line(&error, Some(&grant));
                tracing::warn!(error, "renewing replica presence failed");
                continue;
            }
        }
        let wanted = feed_wanted(peers, candidates.len(), hub.shared.balance.leading());
        match (wanted, feed.is_some()) {
            (true, false) => {
                tracing::debug!(peers, "watching the driver Leases");
                feed = Some(lease_watch(&hub, &config.namespace, false));
            }
            (false, true) => {
                tracing::debug!(
                    "every driver led here and no peer: not watching the driver Leases"
                );
                feed = None;
                // What was fed grows stale from now on: a later elector starts from its own read.
                for f in hub.shared.lease_feeds.iter() {
                    f.send_replace(None);
                }
            }
            _ => {}
        }
        for d in to_hand_over(&candidates, hub.shared.balance.surplus()) {
            tracing::info!(
                driver = d.name().unwrap_or_default(),
                "over this replica's share; handing the driver over"
            );
            d.hand_over();
        }
    }
    presence.remove().await;
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

/// Records in `sightings` the presence Lease `event` shows; whether the share should be
/// recounted (a presence Lease applied or deleted, or a re-list done).
fn sight(
    sightings: &mut balance::Sightings,
    event: &kube::runtime::watcher::Event<k8s_openapi::api::coordination::v1::Lease>,
) -> bool {
    use kube::runtime::watcher::Event;
    let (wall, now) = (
        k8s_openapi::jiff::Timestamp::now(),
        tokio::time::Instant::now(),
    );
    match event {
        Event::Apply(l) | Event::InitApply(l) if balance::is_presence(l) => {
            sightings.saw(l, wall, now);
            matches!(event, Event::Apply(_))
        }
        Event::Delete(l) if balance::is_presence(l) => {
            sightings.forget(l.metadata.name.as_deref().unwrap_or_default());
            true
        }
        Event::InitDone => true,
        _ => false,
    }
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

/// Whether `event` shows another replica's presence Lease (applied, not deleted).
fn is_other_presence(
    event: &kube::runtime::watcher::Event<k8s_openapi::api::coordination::v1::Lease>,
    own: &str,
) -> bool {
    use kube::runtime::watcher::Event;
    match event {
        Event::Apply(l) | Event::InitApply(l) => {
            l.metadata.name.as_deref() != Some(own) && balance::is_presence(l)
        }
        _ => false,
    }
}

/// A Lease event as the watches pass it on.
type LeaseEvent = kube::runtime::watcher::Event<k8s_openapi::api::coordination::v1::Lease>;

/// A watch of the namespace's Leases, read without their managed fields (`LeanLease`), which
/// nothing here needs: only the presence Leases, or all of them.
fn lease_watch(
    hub: &Context,
    namespace: &str,
    presence_only: bool,
) -> futures::stream::BoxStream<'static, Result<LeaseEvent, kube::runtime::watcher::Error>> {
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

/// Whether the driver Lease watch should run: while another replica of the group is alive
/// (hand-overs between replicas), or while fewer driver Leases are held than there are drivers
/// with leader election (an elector of ours may be waiting for a Lease: a Go sidecar's, one
/// another replica holds, or a dead holder's). A lone replica that leads every driver has no
/// use for it: each renewal of its own Leases would come back through it, a second read of
/// every renewal for nothing (a leader learns that its Lease was taken from its next renewal,
/// as client-go's does).
fn feed_wanted(peers: bool, drivers: usize, leading: usize) -> bool {
    peers || leading < drivers
}

/// Keeps `leases` (the presence Leases) in step with their watch.
fn apply_lease_event(
    leases: &mut HashMap<String, k8s_openapi::api::coordination::v1::Lease>,
    listing: &mut HashMap<String, k8s_openapi::api::coordination::v1::Lease>,
    event: LeaseEvent,
) {
    use kube::runtime::watcher::Event;
    let name =
        |l: &k8s_openapi::api::coordination::v1::Lease| l.metadata.name.clone().unwrap_or_default();
    match event {
        Event::Apply(lease) => {
            leases.insert(name(&lease), lease);
        }
        Event::InitApply(lease) => {
            listing.insert(name(&lease), lease);
        }
        Event::Delete(lease) => {
            leases.remove(&name(&lease));
        }
        Event::Init => listing.clear(),
        Event::InitDone => std::mem::swap(leases, listing),
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

    /// The presence watch keeps the replica's view of the presence Leases (a re-list replaces
    /// it whole).
    #[test]
    fn the_presence_watch_keeps_the_view() {
        let (mut leases, mut listing) = (HashMap::new(), HashMap::new());
        let mut apply = |e| apply_lease_event(&mut leases, &mut listing, e);
        apply(Event::Init);
        apply(Event::InitApply(lease("presence-x", "x")));
        apply(Event::InitApply(lease("presence-y", "y")));
        apply(Event::InitDone);
        apply(Event::Delete(lease("presence-y", "y")));
        apply(Event::Apply(lease("presence-z", "z")));
        let mut kept: Vec<&String> = leases.keys().collect();
        kept.sort();
        assert_eq!(kept, ["presence-x", "presence-z"]);
        // A re-list without presence-x forgets it.
        let (mut leases2, mut listing2) = (leases.clone(), HashMap::new());
        let mut apply = |e| apply_lease_event(&mut leases2, &mut listing2, e);
        apply(Event::Init);
        apply(Event::InitApply(lease("presence-z", "z")));
        apply(Event::InitDone);
        let kept: Vec<&String> = leases2.keys().collect();
        assert_eq!(kept, ["presence-z"]);
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

    /// A lone replica that leads every driver does not watch the driver Leases; one that does
    /// not lead them all, or has a peer, does.
    #[test]
    fn the_driver_lease_watch_runs_only_while_an_elector_may_wait() {
        assert!(!feed_wanted(false, 100, 100));
        assert!(!feed_wanted(false, 0, 0));
        assert!(feed_wanted(false, 100, 99), "one driver is not led here");
        assert!(feed_wanted(true, 100, 100), "a peer may hand a Lease over");
        assert!(feed_wanted(true, 2, 1));
    }
}
