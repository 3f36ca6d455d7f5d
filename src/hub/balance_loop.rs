//! The leadership-balancing task of a hub replica: keeps its presence Lease, recomputes its
//! share of driver Leases from one watch of the namespace's Leases, hands surplus drivers over,
//! and feeds every driver Lease it sees to that Lease's elector.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{
    context::Context,
    driver::{Driver, State},
};
use crate::{
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
/// surplus drivers over to other replicas. One watch on the namespace's Leases tells which
/// replicas of our group are alive and when a driver Lease is handed over, so that a replica
/// below its share takes it at once (no gap between the giver's release and the taker's
/// next retry).
pub(crate) async fn balance_leases(
    hub: Arc<Context>,
    config: BalanceConfig,
    stop: CancellationToken,
) {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::runtime::{WatchStreamExt, watcher};

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
    // Every driver Lease's renewals come back through this watch: read without their managed
    // fields (`LeanLease`), which nothing here needs.
    let mut events = watcher(
        kube::Api::<crate::leader::LeanLease>::namespaced(
            hub.shared.leader_client.clone(),
            &config.namespace,
        ),
        watcher::Config::default()
            .timeout(u32::try_from(crate::k8s::WATCH_TIMEOUT.as_secs()).unwrap_or(u32::MAX)),
    )
    .backoff(router::WatchBackoff::default())
    .map_ok(lease_event)
    .boxed();

    // The first share must count every configured driver, not the few started so far.
    tokio::select! {
        () = stop.cancelled() => return,
        () = hub.first_reconcile.cancelled() => {}
    }
    let mut tick = tokio::time::interval(config.retry_period);
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
            event = events.next() => {
                match event {
                    Some(Ok(event)) => {
                        // A replica alone learns of a newcomer at once, and renews its presence
                        // so that the newcomer counts it.
                        let newcomer = !peers && is_other_presence(&event, presence.name());
                        let recount = sight(&mut sightings, &event);
                        apply_lease_event(&hub.shared, &mut leases, &mut listing, event);
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
                    Some(Err(error)) => tracing::debug!(%error, "the Lease watch failed; retrying"),
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
                tracing::warn!(%error, "renewing replica presence failed");
                continue;
            }
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

/// Keeps `leases` in step with the Lease watch and passes every driver Lease it sees to that
/// Lease's elector (which then knows of renewals, releases and deletions at once).
fn apply_lease_event(
    shared: &crate::hub::driver::context::Shared,
    leases: &mut HashMap<String, k8s_openapi::api::coordination::v1::Lease>,
    listing: &mut HashMap<String, k8s_openapi::api::coordination::v1::Lease>,
    event: kube::runtime::watcher::Event<k8s_openapi::api::coordination::v1::Lease>,
) {
    use kube::runtime::watcher::Event;
    let name =
        |l: &k8s_openapi::api::coordination::v1::Lease| l.metadata.name.clone().unwrap_or_default();
    let feed = |name: &str, lease: Option<&k8s_openapi::api::coordination::v1::Lease>| {
        if let Some(tx) = shared.lease_feeds.get(name) {
            tx.send_replace(Some(crate::leader::Seen::now(lease.cloned())));
        }
    };
    match event {
        Event::Apply(lease) => {
            feed(&name(&lease), Some(&lease));
            leases.insert(name(&lease), lease);
        }
        Event::InitApply(lease) => {
            feed(&name(&lease), Some(&lease));
            listing.insert(name(&lease), lease);
        }
        Event::Delete(lease) => {
            feed(&name(&lease), None);
            leases.remove(&name(&lease));
        }
        Event::Init => listing.clear(),
        Event::InitDone => std::mem::swap(leases, listing),
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

    /// The Lease watch keeps the replica's view of the namespace's Leases (a re-list replaces
    /// it whole) and passes each copy of a driver Lease to that Lease's elector.
    #[tokio::test(start_paused = true)]
    async fn the_lease_watch_keeps_the_view_and_feeds_each_electors_lease() {
        let caches = TestStores::new();
        let hub = context(&FakeApi::default(), caches.stores.clone());
        let shared = &hub.shared;
        let (feed, mut seen) = tokio::sync::watch::channel(None);
        shared.lease_feeds.insert("lease-a".into(), feed);
        let (mut leases, mut listing) = (HashMap::new(), HashMap::new());
        let mut apply = |e| apply_lease_event(shared, &mut leases, &mut listing, e);
        apply(Event::Init);
        apply(Event::InitApply(lease("lease-a", "other")));
        apply(Event::InitApply(lease("presence-x", "x")));
        apply(Event::InitDone);
        let holder = |s: &tokio::sync::watch::Receiver<Option<crate::leader::Seen>>| {
            s.borrow().as_ref().map(|seen| {
                seen.lease
                    .as_ref()
                    .and_then(|l| l.spec.clone())
                    .and_then(|s| s.holder_identity)
            })
        };
        assert_eq!(holder(&seen), Some(Some("other".into())));
        seen.mark_unchanged();
        apply(Event::Apply(lease("lease-a", "")));
        assert!(seen.has_changed().expect("open"));
        assert_eq!(holder(&seen), Some(Some(String::new())));
        apply(Event::Delete(lease("lease-a", "")));
        assert_eq!(holder(&seen), Some(None), "deleted");
        // A re-list without presence-x forgets it.
        apply(Event::Init);
        apply(Event::InitApply(lease("lease-b", "me")));
        apply(Event::InitDone);
        let mut kept: Vec<&String> = leases.keys().collect();
        kept.sort();
        assert_eq!(kept, ["lease-b"]);
    }
}
