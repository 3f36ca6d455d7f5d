//! The decisions of the leadership-balancing task ([`super::balance_loop`]), apart from its
//! IO: what it knows of the namespace's presence Leases between rounds and what each event of
//! their watch asks of it ([`PresenceView`]), whether our presence is written at a round, and
//! whether the driver Lease watch should run ([`feed_change`]).

use std::{collections::HashMap, time::Duration};

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::runtime::watcher::Event;
use tokio::time::Instant;

use crate::leader::balance::{self, Sightings};

/// A Lease event as the watches pass it on.
pub(crate) type LeaseEvent = Event<Lease>;

/// How long this replica's presence Lease lasts, for driver Leases of `lease_duration` renewed
/// every `retry_period`. A replica's presence expires before its driver Leases do (they are
/// renewed as often and last a retry period longer), so when a dead replica's driver Leases
/// expire the survivors already count it out and may take them at once; never below two
/// retry periods (a presence renewed every one).
pub(crate) fn presence_duration(lease_duration: Duration, retry_period: Duration) -> Duration {
    lease_duration
        .saturating_sub(retry_period)
        .max(retry_period * 2)
}

/// What an event of the presence Lease watch asks of the balancing loop.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reaction {
    /// Nothing before the next round.
    Nothing,
    /// A round now: another replica showed up while this one counted itself alone, and our
    /// presence is renewed at once so that the newcomer counts it.
    RoundNow,
    /// The share follows at once, not a round later: the other live replicas of `group` (the
    /// group the last round counted in), as the instants they stop counting.
    Recount {
        /// The group.
        group: String,
        /// When each other live replica of it stops counting.
        others: Vec<Instant>,
    },
}

/// What the balancing task knows of the presence Leases between rounds.
#[derive(Debug, Default)]
pub(crate) struct PresenceView {
    /// The presence Leases, by name, as their watch shows them.
    leases: HashMap<String, Lease>,
    /// A re-list under way: it replaces `leases` whole once done.
    listing: HashMap<String, Lease>,
    /// When each presence Lease was seen renewed.
    sightings: Sightings,
    /// The group the last round counted in (none before the first round).
    counted_group: Option<String>,
    /// Whether the last round saw another live replica of its group.
    peers: bool,
    /// When a round last wrote our presence.
    renewed: Option<Instant>,
}

impl PresenceView {
    /// Takes in `event` of the presence Lease watch, delivered at `now` (`wall` on the wall
    /// clock); `own` is our presence Lease's name. Returns what the loop does about it.
    pub(crate) fn on_event(
        &mut self,
        event: LeaseEvent,
        own: &str,
        wall: Timestamp,
        now: Instant,
    ) -> Reaction {
        let newcomer = !self.peers && is_other_presence(&event, own);
        let recount = sight(&mut self.sightings, &event, wall, now);
        apply_lease_event(&mut self.leases, &mut self.listing, event);
        if recount {
            self.sightings.retain(|name| self.leases.contains_key(name));
        }
        if newcomer {
            return Reaction::RoundNow;
        }
        match &self.counted_group {
            // A renewal, a departure: judged by a round's snapshot, a peer whose renewal came
            // just after it looked expired just before the next.
            Some(group) if recount => Reaction::Recount {
                group: group.clone(),
                others: balance::others_in_group(
                    self.leases.values(),
                    &self.sightings,
                    own,
                    group,
                    now,
                ),
            },
            _ => Reaction::Nothing,
        }
    }

    /// Readies a round in `group` at `now` (`own` our presence Lease's name, renewed every
    /// `period`): notes whether another live replica of the group is seen, and returns whether
    /// the round writes our presence.
    pub(crate) fn plan_round(
        &mut self,
        own: &str,
        group: &str,
        period: Duration,
        now: Instant,
    ) -> bool {
        self.peers =
            !balance::others_in_group(self.leases.values(), &self.sightings, own, group, now)
                .is_empty();
        let own_lease = self
            .leases
            .values()
            .find(|l| l.metadata.name.as_deref() == Some(own));
        balance::presence_due(own_lease, group, self.peers, self.renewed, period, now)
    }

    /// Notes a round in `group` done (the share counted in it), `wrote` our presence at `now`
    /// or not.
    pub(crate) fn counted(&mut self, group: String, wrote: bool, now: Instant) {
        self.counted_group = Some(group);
        if wrote {
            self.renewed = Some(now);
        }
    }

    /// The presence Leases known.
    pub(crate) fn known(&self) -> Vec<&Lease> {
        self.leases.values().collect()
    }

    /// When each presence Lease was seen renewed.
    pub(crate) fn sightings(&self) -> &Sightings {
        &self.sightings
    }

    /// Whether the last round saw another live replica of its group.
    pub(crate) fn peers(&self) -> bool {
        self.peers
    }
}

/// Records in `sightings` the presence Lease `event` shows, delivered at `now` (`wall` on the
/// wall clock); whether the share should be recounted (a presence Lease applied or deleted,
/// or a re-list done).
fn sight(sightings: &mut Sightings, event: &LeaseEvent, wall: Timestamp, now: Instant) -> bool {
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

/// Whether `event` shows another replica's presence Lease (applied, not deleted).
fn is_other_presence(event: &LeaseEvent, own: &str) -> bool {
    match event {
        Event::Apply(l) | Event::InitApply(l) => {
            l.metadata.name.as_deref() != Some(own) && balance::is_presence(l)
        }
        _ => false,
    }
}

/// Keeps `leases` (the presence Leases) in step with their watch.
fn apply_lease_event(
    leases: &mut HashMap<String, Lease>,
    listing: &mut HashMap<String, Lease>,
    event: LeaseEvent,
) {
    let name = |l: &Lease| l.metadata.name.clone().unwrap_or_default();
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

/// Whether the driver Lease watch should run: while another replica of the group is alive
/// (hand-overs between replicas), or while fewer driver Leases are held than there are drivers
/// with leader election (an elector of ours may be waiting for a Lease: a Go sidecar's, one
/// another replica holds, or a dead holder's). A lone replica that leads every driver has no
/// use for it: each renewal of its own Leases would come back through it, a second read of
/// every renewal for nothing (a leader learns that its Lease was taken from its next renewal,
/// as client-go's does).
pub(crate) fn feed_wanted(peers: bool, drivers: usize, leading: usize) -> bool {
    peers || leading < drivers
}

/// A change to the driver Lease watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FeedChange {
    /// Start watching.
    Start,
    /// Stop watching (what was fed grows stale from now on).
    Stop,
}

/// What becomes of the driver Lease watch after a round: it runs (`watching`) or not, and is
/// `wanted` ([`feed_wanted`]) or not.
pub(crate) fn feed_change(wanted: bool, watching: bool) -> Option<FeedChange> {
    match (wanted, watching) {
        (true, false) => Some(FeedChange::Start),
        (false, true) => Some(FeedChange::Stop),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::coordination::v1::LeaseSpec,
        apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    };

    use super::*;
    use crate::names::{REPLICA_GROUP_LABEL, REPLICA_LABEL};

    const OWN: &str = "attacher-hub-replica-me";
    const PERIOD: Duration = Duration::from_secs(5);

    fn lease(name: &str, holder: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.into());
        l.spec = Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            ..Default::default()
        });
        l
    }

    /// A presence Lease of `group` renewed at `renewed` for 15 s.
    fn presence(name: &str, group: &str, renewed: Timestamp) -> Lease {
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
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
        }
    }

    fn wall() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("a time")
    }

    #[test]
    fn a_presence_lasts_a_period_less_than_a_driver_lease_and_at_least_two_periods() {
        let s = Duration::from_secs;
        assert_eq!(presence_duration(s(15), s(5)), s(10));
        assert_eq!(presence_duration(s(137), s(26)), s(111));
        assert_eq!(
            presence_duration(s(12), s(5)),
            s(10),
            "two periods at least"
        );
        assert_eq!(presence_duration(s(2), s(5)), s(10));
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

    /// Alone, a replica answers another replica's presence with a round at once; before its
    /// first round it recounts nothing; other Leases ask nothing.
    #[tokio::test(start_paused = true)]
    async fn a_newcomer_seen_by_a_lone_replica_asks_for_a_round_at_once() {
        let (wall, now) = (wall(), Instant::now());
        let mut view = PresenceView::default();
        let mine = presence(OWN, "g", wall);
        assert_eq!(
            view.on_event(Event::Apply(mine), OWN, wall, now),
            Reaction::Nothing,
            "our own presence, before the first round"
        );
        let gone = presence("attacher-hub-replica-gone", "g", wall);
        assert_eq!(
            view.on_event(Event::Delete(gone), OWN, wall, now),
            Reaction::Nothing,
            "a departure, before the first round"
        );
        let other = presence("attacher-hub-replica-b", "g", wall);
        assert_eq!(
            view.on_event(Event::Apply(other.clone()), OWN, wall, now),
            Reaction::RoundNow
        );
        assert_eq!(
            view.on_event(Event::InitApply(other), OWN, wall, now),
            Reaction::RoundNow,
            "a re-list shows it too"
        );
        assert_eq!(view.known().len(), 2);
    }

    /// Once a round has counted, a presence renewed or deleted, or a re-list done, recounts the
    /// share in the counted group at once; a peer known already asks no round.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_or_a_departure_recounts_the_share_in_the_counted_group() {
        let (wall, now) = (wall(), Instant::now());
        let mut view = PresenceView::default();
        let b = presence("attacher-hub-replica-b", "g", wall);
        let c = presence("attacher-hub-replica-c", "other", wall);
        assert_eq!(
            view.on_event(Event::Apply(b.clone()), OWN, wall, now),
            Reaction::RoundNow
        );
        view.on_event(Event::Apply(c), OWN, wall, now);
        assert!(
            view.plan_round(OWN, "g", PERIOD, now),
            "no presence of ours yet"
        );
        assert!(view.peers(), "b counts in g, c does not");
        view.counted("g".into(), true, now);

        let later = now + Duration::from_secs(3);
        let renewed = presence("attacher-hub-replica-b", "g", wall + Duration::from_secs(3));
        assert_eq!(
            view.on_event(Event::Apply(renewed.clone()), OWN, wall, later),
            Reaction::Recount {
                group: "g".into(),
                others: vec![later + Duration::from_secs(15)],
            },
            "b counts for 15 s from when it was seen renewed"
        );
        assert_eq!(
            view.on_event(Event::InitApply(renewed.clone()), OWN, wall, later),
            Reaction::Nothing,
            "a re-list's copy waits for the re-list's end"
        );
        assert_eq!(
            view.on_event(Event::Delete(renewed), OWN, wall, later),
            Reaction::Recount {
                group: "g".into(),
                others: Vec::new(),
            }
        );
        assert_eq!(
            view.on_event(Event::InitDone, OWN, wall, later),
            Reaction::Recount {
                group: "g".into(),
                others: Vec::new(),
            }
        );
    }

    /// A round writes our presence when it is missing or in another group; in its group, only
    /// with a peer and at most every half period.
    #[tokio::test(start_paused = true)]
    async fn a_round_writes_the_presence_when_missing_or_due_for_a_peer() {
        let (wall, now) = (wall(), Instant::now());
        let mut view = PresenceView::default();
        assert!(view.plan_round(OWN, "g", PERIOD, now), "no presence yet");
        assert!(!view.peers());
        view.counted("g".into(), true, now);
        view.on_event(Event::Apply(presence(OWN, "g", wall)), OWN, wall, now);
        assert!(
            !view.plan_round(OWN, "g", PERIOD, now),
            "alone: nothing to write"
        );
        assert!(view.plan_round(OWN, "g2", PERIOD, now), "another group");

        view.on_event(
            Event::Apply(presence("attacher-hub-replica-b", "g", wall)),
            OWN,
            wall,
            now,
        );
        let soon = now + PERIOD / 4;
        assert!(
            !view.plan_round(OWN, "g", PERIOD, soon),
            "written a moment ago"
        );
        assert!(view.peers());
        let half = now + PERIOD / 2;
        assert!(view.plan_round(OWN, "g", PERIOD, half));
        view.counted("g".into(), false, half);
        assert!(
            view.plan_round(OWN, "g", PERIOD, half),
            "a failed write is no write"
        );
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

    #[test]
    fn the_driver_lease_watch_starts_and_stops_only_on_a_change() {
        assert_eq!(feed_change(true, false), Some(FeedChange::Start));
        assert_eq!(feed_change(false, true), Some(FeedChange::Stop));
        assert_eq!(feed_change(true, true), None);
        assert_eq!(feed_change(false, false), None);
    }
}
