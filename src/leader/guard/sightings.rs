//! The guard's decisions: what it makes of the foreign Leases it listed, and when it looks next.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::view::{Holder, Verdict, View};
use crate::leader::record::Record;

/// One foreign Lease as the guard saw it.
#[derive(Clone, Debug)]
struct Sighting {
    /// The record last seen.
    record: Record,
    /// When that record was first seen (client-go `observedTime`).
    at: Instant,
    /// Whether the record changed while the guard watched it (a renewal seen happening).
    changed: bool,
}

/// What the guard has seen of the driver's Lease in other namespaces.
#[derive(Clone, Debug, Default)]
pub struct Sightings {
    /// By namespace.
    seen: BTreeMap<String, Sighting>,
}

impl Sightings {
    /// Takes in one list of the foreign Leases (namespace and record; the candidate's own
    /// namespace left out by the caller), seen at `now`. A namespace no longer listed (its Lease
    /// deleted) is forgotten.
    pub(crate) fn observe(&mut self, listed: Vec<(String, Record)>, now: Instant) {
        let mut next = BTreeMap::new();
        for (namespace, record) in listed {
            let sighting = match self.seen.remove(&namespace) {
                Some(s) if s.record == record => s,
                Some(_) => Sighting {
                    record,
                    at: now,
                    changed: true,
                },
                None => Sighting {
                    record,
                    at: now,
                    changed: false,
                },
            };
            next.insert(namespace, sighting);
        }
        self.seen = next;
    }

    /// The foreign Leases held by someone other than `identity`, each with the instant it
    /// expires by client-go's rule (its record's lease duration, `fallback` when it states none,
    /// after the record was first seen).
    fn held<'a>(
        &'a self,
        identity: &'a str,
        fallback: Duration,
    ) -> impl Iterator<Item = (&'a String, &'a Sighting, Instant)> + 'a {
        self.seen.iter().filter_map(move |(namespace, s)| {
            let holder = &s.record.holder;
            let duration = u64::try_from(s.record.lease_duration_seconds)
                .ok()
                .filter(|secs| *secs > 0)
                .map_or(fallback, Duration::from_secs);
            (!holder.is_empty() && holder != identity).then_some((namespace, s, s.at + duration))
        })
    }

    /// The first (by namespace) foreign Lease held by someone other than `identity` whose
    /// record changed less than its lease duration ago (`fallback` when it states none); with
    /// `renewing`, only one seen changing.
    fn find(
        &self,
        identity: &str,
        fallback: Duration,
        now: Instant,
        renewing: bool,
    ) -> Option<Holder> {
        self.held(identity, fallback)
            .find(|(_, s, expires)| *expires > now && (s.changed || !renewing))
            .map(|(namespace, s, _)| Holder {
                namespace: namespace.clone(),
                holder: s.record.holder.clone(),
            })
    }

    /// When the guard looks next on its own, without an attempt to take the Lease asking
    /// (`None`: not until one asks); `last` is its last look, `period` the retry period.
    ///
    /// * Leading: at once if it never looked, else a lease duration (`fallback`) after the last
    ///   look, or a retry period after it while a live foreign Lease has not been seen renewing
    ///   yet (so that a holder that renews is confirmed, and stepped down for, within a few
    ///   retry periods of being seen).
    /// * Not leading and blocked: when the first blocking Lease would expire (nothing unblocks
    ///   earlier), at least a retry period after the last look.
    /// * Otherwise: never; an attempt to take the Lease asks.
    pub fn next_look(
        &self,
        leading: bool,
        identity: &str,
        fallback: Duration,
        period: Duration,
        last: Option<Instant>,
        now: Instant,
    ) -> Option<Instant> {
        let live_at = |at: Instant| {
            self.held(identity, fallback)
                .filter(move |(_, _, expires)| *expires > at)
        };
        if leading {
            let Some(last) = last else {
                return Some(now);
            };
            let unconfirmed = live_at(now).any(|(_, s, _)| !s.changed);
            return Some(last + if unconfirmed { period } else { fallback });
        }
        // The Leases that blocked at the last look: the verdict stands until the first of them
        // expires (then a look is due, also if that instant has passed).
        let last = last?;
        let first_expiry = live_at(last).map(|(_, _, expires)| expires).min()?;
        Some(first_expiry.max(last + period))
    }

    /// The holder that keeps a candidate (not leading) from acquiring: a foreign Lease held by
    /// someone else, by client-go's rule.
    pub fn live(&self, identity: &str, fallback: Duration, now: Instant) -> Option<Holder> {
        self.find(identity, fallback, now, false)
    }

    /// The holder a leader steps down for: as [`Sightings::live`], and seen renewing.
    pub fn renewing(&self, identity: &str, fallback: Duration, now: Instant) -> Option<Holder> {
        self.find(identity, fallback, now, true)
    }

    /// The view after a successful check.
    pub fn view(&self, identity: &str, fallback: Duration, now: Instant) -> View {
        View {
            verdict: match self.live(identity, fallback, now) {
                Some(holder) => Verdict::Blocked { holder },
                None => Verdict::Clear,
            },
            renewing: self.renewing(identity, fallback, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::guard::testing::{LEASE, PERIOD, holder, listed, record};

    #[tokio::test(start_paused = true)]
    async fn a_foreign_lease_seen_for_the_first_time_blocks_for_one_lease_duration() {
        let mut s = Sightings::default();
        let t0 = Instant::now();
        s.observe(listed(&[("kube-system", record("go-1", 100))]), t0);
        let v = s.view("hub-1", LEASE, t0);
        assert_eq!(
            v.verdict,
            Verdict::Blocked {
                holder: holder("kube-system", "go-1")
            }
        );
        assert!(!v.allows_acquire());
        // Not seen renewing: a leader would not step down for a leftover.
        assert_eq!(v.renewing, None);
        // Never renewed: expired a lease duration after it was first seen.
        tokio::time::advance(LEASE).await;
        s.observe(
            listed(&[("kube-system", record("go-1", 100))]),
            Instant::now(),
        );
        assert_eq!(
            s.view("hub-1", LEASE, Instant::now()).verdict,
            Verdict::Clear
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewing_holder_blocks_and_makes_a_leader_step_down_until_it_stops() {
        let mut s = Sightings::default();
        s.observe(
            listed(&[("kube-system", record("go-1", 100))]),
            Instant::now(),
        );
        for renewed in [102, 104, 106, 108, 110, 112, 114, 116, 118] {
            tokio::time::advance(Duration::from_secs(2)).await;
            s.observe(
                listed(&[("kube-system", record("go-1", renewed))]),
                Instant::now(),
            );
            let v = s.view("hub-1", LEASE, Instant::now());
            assert_eq!(v.blocked_by(), Some(&holder("kube-system", "go-1")));
            assert_eq!(v.renewing, Some(holder("kube-system", "go-1")));
        }
        // The holder stops renewing (killed): blocked until its lease duration has passed.
        tokio::time::advance(LEASE - Duration::from_secs(1)).await;
        s.observe(
            listed(&[("kube-system", record("go-1", 118))]),
            Instant::now(),
        );
        assert!(!s.view("hub-1", LEASE, Instant::now()).allows_acquire());
        tokio::time::advance(Duration::from_secs(1)).await;
        s.observe(
            listed(&[("kube-system", record("go-1", 118))]),
            Instant::now(),
        );
        let v = s.view("hub-1", LEASE, Instant::now());
        assert_eq!((v.verdict, v.renewing), (Verdict::Clear, None));
    }

    #[tokio::test(start_paused = true)]
    async fn vacant_deleted_and_own_leases_never_block() {
        let mut s = Sightings::default();
        let now = Instant::now();
        // Released (client-go writes an empty holder) or held by this very process.
        s.observe(
            listed(&[("a", record("", 100)), ("b", record("hub-1", 100))]),
            now,
        );
        assert_eq!(s.view("hub-1", LEASE, now).verdict, Verdict::Clear);
        // A held one that is then deleted is forgotten at once.
        s.observe(listed(&[("c", record("go-1", 100))]), now);
        assert!(!s.view("hub-1", LEASE, now).allows_acquire());
        s.observe(Vec::new(), now);
        assert_eq!(s.view("hub-1", LEASE, now).verdict, Verdict::Clear);
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_own_lease_duration_decides_and_the_first_namespace_is_reported() {
        let mut s = Sightings::default();
        let mut short = record("go-1", 100);
        short.lease_duration_seconds = 4;
        let mut unstated = record("go-2", 100);
        unstated.lease_duration_seconds = 0;
        s.observe(listed(&[("b", short), ("c", unstated)]), Instant::now());
        assert_eq!(
            s.view("hub-1", LEASE, Instant::now()).blocked_by(),
            Some(&holder("b", "go-1"))
        );
        // b's 4 s have passed; c states no duration, so the fallback (15 s) holds.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            s.view("hub-1", LEASE, Instant::now()).blocked_by(),
            Some(&holder("c", "go-2"))
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(s.view("hub-1", LEASE, Instant::now()).allows_acquire());
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_looks_every_lease_duration_and_every_retry_period_at_an_unconfirmed_lease() {
        let mut s = Sightings::default();
        let t0 = Instant::now();
        // Leading, never looked: at once.
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, None, t0),
            Some(t0)
        );
        // Nothing foreign: a lease duration on.
        s.observe(Vec::new(), t0);
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + LEASE)
        );
        // A foreign holder seen once (a leftover, or a newcomer): a retry period on, to see
        // whether it renews.
        s.observe(listed(&[("kube-system", record("go-1", 100))]), t0);
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + PERIOD)
        );
        // Seen renewing: the leader steps down; while it leads, a lease duration on.
        tokio::time::advance(PERIOD).await;
        let t1 = Instant::now();
        s.observe(listed(&[("kube-system", record("go-1", 105))]), t1);
        assert!(s.renewing("hub-1", LEASE, t1).is_some());
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, Some(t1), t1),
            Some(t1 + LEASE)
        );
        // Our own or a vacant Lease elsewhere is nothing to confirm.
        let mut own = Sightings::default();
        own.observe(
            listed(&[("a", record("hub-1", 1)), ("b", record("", 1))]),
            t1,
        );
        assert_eq!(
            own.next_look(true, "hub-1", LEASE, PERIOD, Some(t1), t1),
            Some(t1 + LEASE)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_candidate_looks_only_when_asked_or_when_what_blocks_it_expires() {
        let mut s = Sightings::default();
        let t0 = Instant::now();
        assert_eq!(s.next_look(false, "hub-1", LEASE, PERIOD, None, t0), None);
        s.observe(Vec::new(), t0);
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), t0),
            None
        );
        // Blocked: when the blocking Lease would expire.
        s.observe(listed(&[("kube-system", record("go-1", 100))]), t0);
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + LEASE)
        );
        // A Lease stating a short duration: not sooner than a retry period after the last look.
        let mut short = record("go-2", 100);
        short.lease_duration_seconds = 1;
        s.observe(listed(&[("b", short)]), t0);
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + PERIOD)
        );
        // Expired since the last look: due (the verdict is stale); once a look has seen it
        // expired, nothing to wait for.
        tokio::time::advance(LEASE).await;
        let now = Instant::now();
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), now),
            Some(t0 + PERIOD)
        );
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(now), now),
            None
        );
    }
}
