//! The course of one election term as pure decisions: what the term does when its Lease's
//! leadership changes, when a leader steps down for a holder in another namespace, and how it
//! ends on what woke it. The term's loop (`term`) performs what these say.

use super::term::{Outcome, Term};
use crate::leader::{Leadership, guard::Holder};

/// What the term does on the leadership it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Follow {
    /// Lead: count the Lease as led and start the workers.
    Lead,
    /// Stand by for `holder` (when known): stop the workers at once if they run
    /// (`stop_workers`), and show the driver standing by.
    StandBy {
        holder: Option<String>,
        stop_workers: bool,
    },
    /// Nothing changes (leading, with the workers already running).
    Keep,
}

/// What woke a term waiting for something to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Woke {
    /// The cross-namespace Lease guard's view changed.
    GuardChanged,
    /// The driver stops.
    Stopped,
    /// The connection to the driver was lost.
    ConnectionLost,
    /// The balance asked this replica to hand the driver over.
    HandOverAsked,
    /// The leadership changed, or its sender went (`ended`).
    Leadership { ended: bool },
}

/// What the term does after it woke.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Look at the leadership and the guard again.
    Look,
    /// Nothing will change the leadership any more (no election: it leads for good); wait for
    /// the driver to stop or its connection to be lost.
    Idle,
    /// The term ends so.
    End(Term),
}

/// The decisions of one term, from what it knows of itself: whether it runs an election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Course {
    /// The driver has leader election: its term runs an elector (and counts in the replica's
    /// share of Leases).
    pub(super) elected: bool,
}

impl Course {
    /// On reading `leadership`, with the workers running or not: lead once, stand by on every
    /// standby reading (the holder may have changed).
    pub(super) fn follow(self, leadership: &Leadership, working: bool) -> Follow {
        match (leadership, working) {
            (Leadership::Leading, false) => Follow::Lead,
            (Leadership::Standby { holder }, working) => Follow::StandBy {
                holder: holder.clone(),
                stop_workers: working,
            },
            (Leadership::Leading, true) => Follow::Keep,
        }
    }

    /// Whether the driver shows its elector's view of the holder: while leading, with an
    /// election (without one there is no Lease).
    pub(super) fn shows_elected_holder(self, leadership: &Leadership) -> bool {
        leadership.is_leading() && self.elected
    }

    /// The holder a leader steps down for: one seen renewing the driver's Lease in another
    /// namespace (two attachers must not both act, and that one never looks at ours). Only a
    /// term whose workers run leads, so only it steps down.
    pub(super) fn steps_down_for(self, working: bool, renewing: Option<Holder>) -> Option<Holder> {
        renewing.filter(|_| working)
    }

    /// Whether a request to hand the driver over is heard: only while it leads (its workers
    /// run) under an election; the balance has nothing to hand over otherwise.
    pub(super) fn hears_hand_over(self, working: bool) -> bool {
        working && self.elected
    }

    /// What the term does on what woke it. An elector that ends on its own ends the term as a
    /// failure (as a lost Lease would); without an election the leadership never changes, and
    /// only a stop or a lost connection ends the term.
    pub(super) fn on_wake(self, woke: Woke) -> Next {
        match woke {
            Woke::GuardChanged | Woke::Leadership { ended: false } => Next::Look,
            Woke::Stopped => Next::End(Term::Over(Outcome::Stopped)),
            Woke::ConnectionLost => Next::End(Term::Over(Outcome::ConnectionLost)),
            Woke::HandOverAsked => Next::End(Term::HandedOver),
            Woke::Leadership { ended: true } if self.elected => {
                Next::End(Term::Over(Outcome::Failed("leader election ended".into())))
            }
            Woke::Leadership { ended: true } => Next::Idle,
        }
    }
}

/// Whether the driver shows as standing by once `term` is over: after a hand-over or a
/// step-down it stands again; any other end is its life's to show.
pub(super) fn stands_by_after(term: &Term) -> bool {
    matches!(term, Term::HandedOver | Term::Yielded(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ELECTED: Course = Course { elected: true };
    const UNELECTED: Course = Course { elected: false };

    fn standby(holder: Option<&str>) -> Leadership {
        Leadership::Standby {
            holder: holder.map(str::to_string),
        }
    }

    fn other() -> Holder {
        Holder {
            namespace: "other".into(),
            holder: "them".into(),
        }
    }

    #[test]
    fn a_term_leads_once_and_stands_by_on_every_standby_reading() {
        for course in [ELECTED, UNELECTED] {
            assert_eq!(course.follow(&Leadership::Leading, false), Follow::Lead);
            assert_eq!(course.follow(&Leadership::Leading, true), Follow::Keep);
            assert_eq!(
                course.follow(&standby(Some("them")), true),
                Follow::StandBy {
                    holder: Some("them".into()),
                    stop_workers: true
                },
                "a lost Lease stops the running workers"
            );
            assert_eq!(
                course.follow(&standby(None), false),
                Follow::StandBy {
                    holder: None,
                    stop_workers: false
                },
                "standing by again shows the holder anew"
            );
        }
    }

    #[test]
    fn the_elected_holder_is_shown_only_while_leading_an_election() {
        assert!(ELECTED.shows_elected_holder(&Leadership::Leading));
        assert!(!ELECTED.shows_elected_holder(&standby(Some("them"))));
        assert!(!UNELECTED.shows_elected_holder(&Leadership::Leading));
    }

    #[test]
    fn only_a_working_leader_steps_down_for_a_holder_renewing_elsewhere() {
        assert_eq!(ELECTED.steps_down_for(true, Some(other())), Some(other()));
        assert_eq!(ELECTED.steps_down_for(false, Some(other())), None);
        assert_eq!(ELECTED.steps_down_for(true, None), None);
    }

    #[test]
    fn a_hand_over_is_heard_only_by_a_working_elected_leader() {
        assert!(ELECTED.hears_hand_over(true));
        assert!(!ELECTED.hears_hand_over(false));
        assert!(!UNELECTED.hears_hand_over(true));
    }

    #[test]
    fn a_term_ends_on_stop_loss_and_hand_over_and_looks_again_on_changes() {
        for course in [ELECTED, UNELECTED] {
            assert_eq!(course.on_wake(Woke::GuardChanged), Next::Look);
            assert_eq!(
                course.on_wake(Woke::Leadership { ended: false }),
                Next::Look
            );
            assert_eq!(
                course.on_wake(Woke::Stopped),
                Next::End(Term::Over(Outcome::Stopped))
            );
            assert_eq!(
                course.on_wake(Woke::ConnectionLost),
                Next::End(Term::Over(Outcome::ConnectionLost))
            );
            assert_eq!(
                course.on_wake(Woke::HandOverAsked),
                Next::End(Term::HandedOver)
            );
        }
    }

    #[test]
    fn an_elector_that_ends_on_its_own_fails_the_term_and_no_election_idles() {
        assert_eq!(
            ELECTED.on_wake(Woke::Leadership { ended: true }),
            Next::End(Term::Over(Outcome::Failed("leader election ended".into())))
        );
        assert_eq!(
            UNELECTED.on_wake(Woke::Leadership { ended: true }),
            Next::Idle
        );
    }

    #[test]
    fn the_driver_stands_by_after_a_hand_over_or_a_step_down_only() {
        assert!(stands_by_after(&Term::HandedOver));
        assert!(stands_by_after(&Term::Yielded(other())));
        assert!(!stands_by_after(&Term::Over(Outcome::Stopped)));
        assert!(!stands_by_after(&Term::Over(Outcome::ConnectionLost)));
        assert!(!stands_by_after(&Term::Over(Outcome::Failed("x".into()))));
    }
}
