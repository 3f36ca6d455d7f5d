//! The leadership-balancing task of a hub replica: keeps its presence Lease, recomputes its
//! share of driver Leases from one watch of the namespace's Leases, hands surplus drivers over,
//! and feeds every driver Lease it sees to that Lease's elector.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{context::Context, driver::State};
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
    use futures::StreamExt;
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
        api.clone(),
        &config.identity,
        presence_duration,
        config.retry_period,
    );
    let mut leases: HashMap<String, Lease> = HashMap::new();
    let mut listing: HashMap<String, Lease> = HashMap::new();
    let mut events = watcher(
        api,
        watcher::Config::default()
            .timeout(u32::try_from(crate::k8s::WATCH_TIMEOUT.as_secs()).unwrap_or(u32::MAX)),
    )
    .backoff(router::WatchBackoff::default())
    .boxed();

    // The first share must count every configured driver, not the few started so far.
    tokio::select! {
        () = stop.cancelled() => return,
        () = hub.first_reconcile.cancelled() => {}
    }
    let mut tick = tokio::time::interval(config.retry_period);
    // A reload that adds or removes drivers changes the share at once, not a period later.
    let mut slots_changed = hub.registry.slots_changed();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Ok(()) = slots_changed.changed() => {
                tick.reset_immediately();
                continue;
            }
            event = events.next() => {
                match event {
                    Some(Ok(event)) => apply_lease_event(&hub.shared, &mut leases, &mut listing, event),
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
        let known: Vec<Lease> = leases.values().cloned().collect();
        let round = tokio::select! {
            () = stop.cancelled() => break,
            r = presence.round(&hub.shared.balance, candidates.len(), &group, &known) => r,
        };
        if let Err(error) = round {
            tracing::warn!(%error, "renewing replica presence failed");
            continue;
        }
        let surplus = hub.shared.balance.surplus();
        if surplus > 0 {
            // Hand over the drivers with the greatest names, deterministically.
            let mut leading: Vec<_> = candidates
                .iter()
                .filter(|d| d.state() == State::Leading)
                .collect();
            leading.sort_by_key(|d| std::cmp::Reverse(d.name()));
            for d in leading.into_iter().take(surplus) {
                tracing::info!(driver = ?d.name(), "over this replica's share; handing the driver over");
                d.hand_over();
            }
        }
    }
    presence.remove().await;
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
