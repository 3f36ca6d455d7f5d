//! Spreading driver leadership across hub replicas.
//!
//! Each replica keeps a presence Lease `attacher-hub-replica-<identity>`
//! (label [`crate::names::REPLICA_LABEL`]), renewed every retry period while another replica of
//! its group is alive, and written only when something changes while it is alone
//! ([`presence_due`]); it is deleted when the replica stops. From the live
//! presence Leases a replica knows how many replicas share the work and so
//! its fair share, `ceil(drivers / replicas)`. A replica at or above its share
//! does not try to acquire more driver Leases; a replica above it hands the
//! surplus back (vacating those Leases), and the replicas below their share
//! pick them up. Kubernetes Leases stay the only coordination: no replica
//! talks to another.

use std::{
    collections::{BTreeMap, HashMap},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, api::PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::names::{REPLICA_GROUP_LABEL, REPLICA_LABEL, replica_lease_name};

/// Longest wait for deleting the presence Lease on shutdown.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(2);

/// How many driver Leases this replica may hold, and how many it holds.
#[derive(Debug, Default)]
pub struct Balance {
    /// Driver Leases held now.
    leading: AtomicUsize,
    /// What the share is computed from, at the moment it is asked for.
    shares: Mutex<Shares>,
    /// Bumped when this replica may acquire a driver Lease where it could not before, so
    /// that gated electors try at once.
    opened: tokio::sync::watch::Sender<u64>,
    /// Bumped when a driver Lease is given up, so that the balancing task feeds the driver's
    /// next elector at once.
    given_up: tokio::sync::watch::Sender<u64>,
}

/// The inputs of the fair share.
#[derive(Debug, Default)]
struct Shares {
    /// Set once a first round has counted the replicas; before that there is no limit.
    counted: bool,
    /// Driver Leases the group shares (0: no limit).
    drivers: usize,
    /// When each other live replica of the group stops counting unless it renews (local clock).
    others: Vec<Instant>,
}

impl Balance {
    /// Whether this replica may try to acquire one more driver Lease.
    pub fn may_acquire(&self) -> bool {
        self.leading() < self.share()
    }

    /// Records that a driver Lease was won (`true`) or given up (`false`).
    pub fn set_leading(&self, gained: bool) {
        if gained {
            self.leading.fetch_add(1, Ordering::AcqRel);
        } else {
            self.opening(|| {
                let _ = self
                    .leading
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            });
            self.given_up.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Signals each driver Lease given up, after [`Balance::leading`] counts it out (the value
    /// itself means nothing).
    pub fn given_up(&self) -> tokio::sync::watch::Receiver<u64> {
        self.given_up.subscribe()
    }

    /// Changes of [`Balance::may_acquire`] from no to yes (the value itself means nothing).
    pub fn opened(&self) -> tokio::sync::watch::Receiver<u64> {
        self.opened.subscribe()
    }

    /// Runs `change` and signals [`Balance::opened`] if it let this replica acquire.
    fn opening(&self, change: impl FnOnce()) {
        let before = self.may_acquire();
        change();
        if !before && self.may_acquire() {
            self.opened.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Driver Leases held now.
    pub fn leading(&self) -> usize {
        self.leading.load(Ordering::Acquire)
    }

    /// The current share: `usize::MAX` before the first count or without drivers, else the
    /// group's drivers divided by the replicas live *now*. A replica that died stops counting
    /// the moment its presence Lease expires, not at the next round.
    pub fn share(&self) -> usize {
        let shares = self.shares.lock();
        if !shares.counted || shares.drivers == 0 {
            return usize::MAX;
        }
        let now = Instant::now();
        let live = 1 + shares.others.iter().filter(|e| **e > now).count();
        fair_share(shares.drivers, live)
    }

    /// How many Leases to hand back now.
    pub fn surplus(&self) -> usize {
        self.leading().saturating_sub(self.share())
    }

    /// The group's drivers and the expiry of each other live replica's presence.
    fn set(&self, drivers: usize, others: Vec<Instant>) {
        self.opening(|| {
            *self.shares.lock() = Shares {
                counted: true,
                drivers,
                others,
            };
        });
    }

    /// The expiry of each other live replica's presence, as the Lease watch shows it between
    /// two rounds (the drivers stay as the last round counted them). Returns the share before
    /// and after. Nothing changes before the first round.
    pub fn set_others(&self, others: Vec<Instant>) -> (usize, usize) {
        let before = self.share();
        self.opening(|| {
            let mut shares = self.shares.lock();
            if shares.counted {
                shares.others = others;
            }
        });
        (before, self.share())
    }
}

/// The fair share of `drivers` among `replicas` (at least one replica).
pub fn fair_share(drivers: usize, replicas: usize) -> usize {
    drivers.div_ceil(replicas.max(1))
}

/// The replica group of a replica serving `sockets`: a stable hash of the sorted socket
/// addresses (FNV-1a, so that replicas of different builds agree), as a label value.
pub fn group_key<'a>(sockets: impl IntoIterator<Item = &'a str>) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut sorted: Vec<&str> = sockets.into_iter().collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut hash = OFFSET;
    for socket in sorted {
        for byte in socket.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    format!("{hash:016x}")
}

/// When the presence Lease `lease` stops counting, on the local clock: its renew time plus its
/// duration, measured against `now_wall` (the same instant as `now`). `None` when it has
/// already expired or is not a presence record.
fn expiry(lease: &Lease, now_wall: Timestamp, now: Instant) -> Option<Instant> {
    let spec = lease.spec.as_ref()?;
    let (renew, secs) = (spec.renew_time.as_ref()?, spec.lease_duration_seconds?);
    let expires = renew.0 + Duration::from_secs(u64::try_from(secs.max(0)).unwrap_or(0));
    let left = now_wall.duration_until(expires);
    let left = Duration::try_from(left).ok().filter(|d| !d.is_zero())?;
    Some(now + left)
}

/// Whether `lease` is a replica's presence Lease (any group).
pub fn is_presence(lease: &Lease) -> bool {
    lease
        .metadata
        .labels
        .as_ref()
        .and_then(|m| m.get(REPLICA_LABEL))
        .is_some_and(|v| v == "true")
}

/// When each presence Lease stops counting, judged from when *this* replica saw it renewed.
///
/// As client-go judges a leader Lease (from the moment it observed the record change, not from
/// the renew time the holder's clock wrote), a renewal counts for the Lease's duration from the
/// moment the Lease watch delivered it: a watch that delivers late, or a peer whose clock is
/// behind ours, does not eat the slack between two renewals (a presence lasts two retry
/// periods and is renewed every one). A Lease seen for the first time (at start-up, a newcomer)
/// counts from its written renew time, so that a replica long dead does not count again because
/// we looked; the same renewal seen again (a re-list) keeps its first sighting.
#[derive(Debug, Default)]
pub struct Sightings(HashMap<String, Sighting>);

#[derive(Debug)]
struct Sighting {
    /// The renew time the Lease showed.
    renewed: Option<Timestamp>,
    /// When it stops counting (`None`: expired when first seen, or not a presence record).
    expires: Option<Instant>,
}

impl Sightings {
    /// Records `lease` as the watch delivers it at `now` (`now_wall` on the wall clock).
    pub fn saw(&mut self, lease: &Lease, now_wall: Timestamp, now: Instant) {
        let Some(name) = lease.metadata.name.as_deref() else {
            return;
        };
        let spec = lease.spec.as_ref();
        let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
        match self.0.get_mut(name) {
            Some(known) if known.renewed == renewed => {}
            Some(known) => {
                let secs = spec.and_then(|s| s.lease_duration_seconds).unwrap_or(0);
                known.renewed = renewed;
                known.expires = renewed
                    .is_some()
                    .then(|| now + Duration::from_secs(u64::try_from(secs).unwrap_or(0)));
            }
            None => {
                let expires = expiry(lease, now_wall, now);
                self.0
                    .insert(name.to_string(), Sighting { renewed, expires });
            }
        }
    }

    /// Forgets a deleted Lease.
    pub fn forget(&mut self, name: &str) {
        self.0.remove(name);
    }

    /// Keeps only the Leases `known` names (after a re-list).
    pub fn retain(&mut self, known: impl Fn(&str) -> bool) {
        self.0.retain(|name, _| known(name));
    }

    fn expires(&self, name: &str) -> Option<Instant> {
        self.0.get(name).and_then(|s| s.expires)
    }
}

/// The other live replicas of `group` among `leases`, as the local instants at which each
/// stops counting (by `sightings`).
pub fn others_in_group<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    sightings: &Sightings,
    own_name: &str,
    group: &str,
    now: Instant,
) -> Vec<Instant> {
    leases
        .into_iter()
        .filter(|l| l.metadata.name.as_deref().is_some_and(|n| n != own_name))
        .filter(|l| {
            let labels = l.metadata.labels.as_ref();
            let label = |k: &str| labels.and_then(|m| m.get(k)).map(String::as_str);
            label(REPLICA_LABEL) == Some("true") && label(REPLICA_GROUP_LABEL) == Some(group)
        })
        .filter_map(|l| sightings.expires(l.metadata.name.as_deref()?))
        .filter(|expires| *expires > now)
        .collect()
}

/// Whether a balancing round writes this replica's presence Lease `own` (as the Lease watch
/// shows it) in `group`: when it is missing or in another group; else only while another
/// replica of the group is alive (`peers`), at most once per half `period` since the `last`
/// write. A replica alone writes nothing round after round (a Lease renewed every retry period
/// for nobody cost 12 writes a minute); a newcomer's presence shows up in its Lease watch, and
/// it renews at once (the watch event starts a round), so that the newcomer counts it.
pub fn presence_due(
    own: Option<&Lease>,
    group: &str,
    peers: bool,
    last: Option<Instant>,
    period: Duration,
    now: Instant,
) -> bool {
    let in_group = own.is_some_and(|l| {
        l.metadata
            .labels
            .as_ref()
            .and_then(|m| m.get(REPLICA_GROUP_LABEL))
            .is_some_and(|g| g == group)
    });
    if !in_group {
        return true;
    }
    peers && last.is_none_or(|t| now >= t + period / 2)
}

/// Keeps this replica's presence Lease and recomputes the share.
#[derive(Debug)]
pub struct Presence {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    /// Bound of each API call: a call slower than a balancing period is as good as failed.
    call_timeout: Duration,
}

impl Presence {
    /// Presence of `identity` in the namespace of `api`; each API call may take `call_timeout`.
    pub fn new(
        api: Api<Lease>,
        identity: &str,
        lease_duration: Duration,
        call_timeout: Duration,
    ) -> Self {
        Self {
            api,
            name: replica_lease_name(identity),
            identity: identity.to_string(),
            lease_duration,
            call_timeout,
        }
    }

    /// The name of our presence Lease.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn record(&self, group: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(BTreeMap::from([
                    (REPLICA_LABEL.to_string(), "true".to_string()),
                    (REPLICA_GROUP_LABEL.to_string(), group.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
                ),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn timed<T>(&self, call: impl Future<Output = kube::Result<T>>) -> kube::Result<T> {
        tokio::time::timeout(self.call_timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(kube::Error::Service(
                    format!("no answer within {:?}", self.call_timeout).into(),
                ))
            })
    }

    /// Renews (or creates) our presence Lease in `group`. `cached` is our Lease as the watch
    /// last showed it: its resourceVersion saves a GET per round; a stale one (409) or a
    /// missing one falls back to reading the Lease first.
    pub async fn renew(&self, group: &str, cached: Option<&Lease>) -> kube::Result<()> {
        if let Some(rv) = cached.and_then(|l| l.metadata.resource_version.clone()) {
            let mut lease = self.record(group);
            lease.metadata.resource_version = Some(rv);
            match self
                .timed(self.api.replace(&self.name, &PostParams::default(), &lease))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        match self.timed(self.api.get_opt(&self.name)).await? {
            None => {
                self.timed(self.api.create(&PostParams::default(), &self.record(group)))
                    .await?;
            }
            Some(existing) => {
                let mut lease = self.record(group);
                lease.metadata.resource_version = existing.metadata.resource_version;
                self.timed(self.api.replace(&self.name, &PostParams::default(), &lease))
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes our presence Lease (on shutdown), so the others count one
    /// replica less at once.
    pub async fn remove(&self) {
        // On shutdown: a courtesy (the Lease expires anyway), never a reason to hang.
        let deleted = tokio::time::timeout(
            self.call_timeout.min(REMOVE_TIMEOUT),
            self.api.delete(&self.name, &Default::default()),
        )
        .await
        .unwrap_or_else(|_| Err(kube::Error::Service("no answer".into())));
        if let Err(error) = deleted {
            let error = crate::api_error::one_line(&error, None);
            tracing::debug!(error, "deleting the presence lease failed");
        }
    }

    /// One round: renew our presence in `group` (if `renew`), then publish the share of
    /// `drivers` driver Leases among the live replicas of the group found in `leases` (the
    /// namespace's Leases, from a watch; when each was seen renewed in `sightings`). Returns
    /// the share.
    pub async fn round(
        &self,
        balance: &Balance,
        drivers: usize,
        group: &str,
        leases: &[&Lease],
        sightings: &Sightings,
        renew: bool,
    ) -> kube::Result<usize> {
        if renew {
            let own = leases
                .iter()
                .copied()
                .find(|l| l.metadata.name.as_deref() == Some(self.name.as_str()));
            self.renew(group, own).await?;
        }
        let others = others_in_group(
            leases.iter().copied(),
            sightings,
            &self.name,
            group,
            Instant::now(),
        );
        let before = balance.share();
        balance.set(drivers, others);
        let share = balance.share();
        if share != before {
            tracing::info!(drivers, share, %group, "leadership share changed");
        }
        Ok(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_rounds_up_so_every_driver_has_a_place() {
        assert_eq!(fair_share(5, 2), 3);
        assert_eq!(fair_share(4, 2), 2);
        assert_eq!(fair_share(1, 3), 1);
        assert_eq!(fair_share(0, 3), 0);
        assert_eq!(fair_share(5, 0), 5);
    }

    /// Gated electors are told when the share grows or a Lease is given up while at the share,
    /// and not on rounds that change nothing for them.
    #[tokio::test(start_paused = true)]
    async fn the_gate_opens_when_room_appears_and_only_then() {
        let b = Balance::default();
        let mut opened = b.opened();
        let later = Instant::now() + Duration::from_secs(60);
        b.set(2, vec![later]);
        b.set_leading(true);
        assert!(!b.may_acquire());
        assert!(
            !opened.has_changed().expect("open"),
            "room existed all along"
        );
        b.set(2, vec![later]);
        assert!(
            !opened.has_changed().expect("open"),
            "a round that changes nothing"
        );
        // A driver is added by a reload: the share grows from 1 to 2.
        b.set(4, vec![later]);
        assert!(opened.has_changed().expect("open"));
        opened.mark_unchanged();
        b.set_leading(true);
        assert!(!b.may_acquire());
        b.set_leading(false);
        assert!(
            opened.has_changed().expect("open"),
            "a Lease given up at the share"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_at_its_share_stops_acquiring_and_above_it_has_a_surplus() {
        let b = Balance::default();
        assert!(b.may_acquire(), "no limit before the first count");
        let later = Instant::now() + Duration::from_secs(60);
        b.set(4, vec![later]);
        assert_eq!(b.share(), 2);
        b.set_leading(true);
        assert!(b.may_acquire());
        b.set_leading(true);
        assert!(!b.may_acquire());
        assert_eq!(b.surplus(), 0);
        b.set_leading(true);
        assert_eq!(b.surplus(), 1);
        for _ in 0..4 {
            b.set_leading(false);
        }
        assert_eq!(b.leading(), 0, "never below zero");
        b.set(0, vec![later]);
        assert_eq!(b.share(), usize::MAX, "no drivers: no limit");
    }

    /// A replica killed with -9 stops counting the moment its presence Lease expires, so the
    /// survivor may take the dead one's drivers as soon as their Leases expire too.
    #[tokio::test(start_paused = true)]
    async fn a_dead_replica_stops_counting_when_its_presence_expires() {
        let b = Balance::default();
        b.set(4, vec![Instant::now() + Duration::from_secs(15)]);
        b.set_leading(true);
        b.set_leading(true);
        assert!(!b.may_acquire());
        tokio::time::sleep(Duration::from_secs(14)).await;
        assert!(!b.may_acquire());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(b.share(), 4);
        assert!(b.may_acquire());
    }

    fn presence(name: &str, group: &str, age_secs: u64, dur: i32, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    (REPLICA_LABEL.to_string(), "true".to_string()),
                    (REPLICA_GROUP_LABEL.to_string(), group.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(now - Duration::from_secs(age_secs))),
                lease_duration_seconds: Some(dur),
                ..LeaseSpec::default()
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_live_replicas_of_the_same_group_count() {
        let wall = Timestamp::now();
        let now = Instant::now();
        let leases = vec![
            presence("attacher-hub-replica-me", "g1", 0, 15, wall),
            presence("attacher-hub-replica-a", "g1", 5, 15, wall),
            presence("attacher-hub-replica-dead", "g1", 20, 15, wall),
            presence("attacher-hub-replica-ds-node", "g2", 1, 15, wall),
            Lease::default(),
        ];
        let mut sightings = Sightings::default();
        for lease in &leases {
            sightings.saw(lease, wall, now);
        }
        let others = others_in_group(&leases, &sightings, "attacher-hub-replica-me", "g1", now);
        assert_eq!(others, vec![now + Duration::from_secs(10)]);
    }

    /// A peer renewing every 5 s with a presence of 10 s, whose renewals the watch delivers
    /// 0.2 to 0.6 s late, counts at every moment, in particular just before each renewal
    /// arrives. (When the share was recounted only at the balancing rounds, every 5 s, a round
    /// that came just before a renewal arrived kept the previous one, which expired just before
    /// the next round: the peer counted out for a moment and the share flipped.)
    #[tokio::test(start_paused = true)]
    async fn a_peer_whose_renewals_arrive_late_never_counts_out() {
        let (wall0, t0) = (Timestamp::now(), Instant::now());
        let peer = |renewed_secs: u64| {
            let mut l = presence("attacher-hub-replica-peer", "g1", 0, 10, wall0);
            l.spec.as_mut().expect("spec").renew_time =
                Some(MicroTime(wall0 + Duration::from_secs(renewed_secs)));
            l
        };
        let mut sightings = Sightings::default();
        sightings.saw(&peer(0), wall0, t0);
        let b = Balance::default();
        let look = |sightings: &Sightings, lease: &Lease| {
            others_in_group(
                [lease],
                sightings,
                "attacher-hub-replica-me",
                "g1",
                Instant::now(),
            )
        };
        b.set(2, look(&sightings, &peer(0)));
        assert_eq!(b.share(), 1);
        let lateness = [600, 200, 600, 200, 600];
        for (i, late_ms) in lateness.into_iter().enumerate() {
            let renewed = 5 * (u64::try_from(i).expect("small") + 1);
            // Just before the renewal arrives, the share still counts the peer...
            tokio::time::sleep_until(t0 + Duration::from_secs(renewed)).await;
            assert_eq!(b.share(), 1, "before the renewal at {renewed}s arrived");
            // ...and it arrives late.
            tokio::time::sleep(Duration::from_millis(late_ms)).await;
            let now_wall = wall0 + (Instant::now() - t0);
            sightings.saw(&peer(renewed), now_wall, Instant::now());
            let (before, after) = b.set_others(look(&sightings, &peer(renewed)));
            assert_eq!(
                (before, after),
                (1, 1),
                "renewal at {renewed}s, {late_ms} ms late"
            );
        }
        // A peer that stops renewing counts out its duration after its last renewal was seen.
        let last_seen = Instant::now();
        tokio::time::sleep_until(last_seen + Duration::from_secs(10) - Duration::from_millis(1))
            .await;
        assert_eq!(b.share(), 1);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(b.share(), 2, "expired");
    }

    /// A presence seen for the first time counts from the renew time written in it (a replica
    /// dead for a while does not count again because we started), and the same renewal seen
    /// again after a re-list keeps its first sighting.
    #[tokio::test(start_paused = true)]
    async fn a_first_sight_counts_from_the_written_renew_time() {
        let (wall, now) = (Timestamp::now(), Instant::now());
        let mut sightings = Sightings::default();
        let dead = presence("attacher-hub-replica-dead", "g1", 12, 10, wall);
        let recent = presence("attacher-hub-replica-a", "g1", 4, 10, wall);
        sightings.saw(&dead, wall, now);
        sightings.saw(&recent, wall, now);
        let look = |s: &Sightings, at: Instant| {
            others_in_group([&dead, &recent], s, "attacher-hub-replica-me", "g1", at)
        };
        assert_eq!(look(&sightings, now), vec![now + Duration::from_secs(6)]);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let later = Instant::now();
        sightings.saw(&recent, wall + Duration::from_secs(3), later);
        assert_eq!(
            look(&sightings, later),
            vec![now + Duration::from_secs(6)],
            "the same renewal, listed again"
        );
        sightings.forget("attacher-hub-replica-a");
        assert!(look(&sightings, later).is_empty(), "deleted");
    }

    #[test]
    fn group_keys_depend_on_the_set_of_sockets_only() {
        let a = group_key(["/csi/a.sock", "/csi/b.sock"]);
        assert_eq!(a, group_key(["/csi/b.sock", "/csi/a.sock", "/csi/a.sock"]));
        assert_ne!(a, group_key(["/csi/a.sock"]));
        assert_ne!(group_key(["/x", "y"]), group_key(["/xy"]));
        assert_eq!(a.len(), 16, "fits a label value");
        assert_eq!(group_key([]), group_key(Vec::<&str>::new()));
    }

    /// A replica alone writes its presence once and then nothing; with another replica alive it
    /// renews every retry period; a missing Lease or one of another group is written at once.
    #[tokio::test(start_paused = true)]
    async fn presence_is_renewed_only_while_another_replica_counts_on_it() {
        let period = Duration::from_secs(5);
        let now = Instant::now();
        let wall = Timestamp::now();
        let own = presence("attacher-hub-replica-me", "g1", 0, 10, wall);
        assert!(
            presence_due(None, "g1", false, None, period, now),
            "create it"
        );
        assert!(
            presence_due(Some(&own), "g2", false, Some(now), period, now),
            "a reload moved it to another group"
        );
        assert!(!presence_due(
            Some(&own),
            "g1",
            false,
            Some(now),
            period,
            now + period * 10
        ));
        assert!(
            !presence_due(Some(&own), "g1", false, None, period, now),
            "alone"
        );
        assert!(
            presence_due(Some(&own), "g1", true, None, period, now),
            "a newcomer"
        );
        assert!(!presence_due(
            Some(&own),
            "g1",
            true,
            Some(now),
            period,
            now + period / 4
        ));
        assert!(presence_due(
            Some(&own),
            "g1",
            true,
            Some(now),
            period,
            now + period
        ));
    }
}
