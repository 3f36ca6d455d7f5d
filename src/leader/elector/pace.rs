//! The decisions of the elector's acquire loop, apart from its IO: what an attempt leads to
//! (lead, look again at once, or pause, and what the log says), when the next attempt is due,
//! and what ends the wait for it. [`LeaderElector::acquire`](super::LeaderElector) makes the
//! calls, asks the gate and logs; these functions decide.

use std::time::Duration;

use tokio::time::Instant;

use super::{ACQUIRE_LOG_EVERY, ERROR_BACKOFF, EXPIRY_MARGIN};
use crate::backoff::Backoff;
use crate::leader::record::Observed;
use crate::telemetry::Throttle;

/// What one attempt to acquire came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Attempt {
    /// We hold the Lease.
    Acquired,
    /// The API server answered, and the Lease is not ours: another candidate holds it, the
    /// gate's check said no, or we only looked.
    Answered,
    /// The API server did not answer (or refused): the error, on one line.
    Failed(String),
}

/// Whether to attempt again at once after an attempt made while the gate was closed (`allowed`
/// false: we only looked): when the look was answered and the gate, asked now
/// (`allows_now`), lets us take the Lease. The signal that it opened may have come during the
/// look, and then no wait ends early for it. The gate is asked only in that case.
pub(super) fn look_again_at_once(
    allowed: bool,
    attempt: &Attempt,
    allows_now: impl FnOnce() -> bool,
) -> bool {
    !allowed && *attempt == Attempt::Answered && allows_now()
}

/// What the acquire loop does after an attempt.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Lead: the Lease is ours.
    Lead,
    /// Log `report` (if any), then wait at most `pause` for the next attempt (see [`due`] and
    /// [`turn`] for what brings it forward).
    Pause {
        /// The longest wait.
        pause: Duration,
        /// What the log says about the attempt.
        report: Option<Report>,
    },
}

/// What the log says after an attempt.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Report {
    /// The API server answers again after `failures` failed attempts in a row.
    Answers {
        /// The failed attempts.
        failures: u64,
    },
    /// An attempt failed.
    Failed {
        /// Why, on one line.
        error: String,
        /// `Some(n)`: a warning, counting the `n` failures since the last one; `None`: a debug
        /// line (a warning came less than [`ACQUIRE_LOG_EVERY`] ago).
        warn: Option<u64>,
    },
}

/// What the acquire loop remembers between attempts: the failures in a row, which shorten the
/// pause, and the warnings about them.
#[derive(Debug)]
pub(super) struct Pace {
    /// The retry period, which bounds the error pauses from the second on.
    retry_period: Duration,
    /// Failed attempts since the last answer.
    errors: Backoff,
    /// A warning at most every [`ACQUIRE_LOG_EVERY`].
    log: Throttle,
}

impl Pace {
    /// The pace of a loop that has made no attempt yet.
    pub(super) fn new(retry_period: Duration) -> Self {
        Self {
            retry_period,
            errors: Backoff::new(ERROR_BACKOFF),
            log: Throttle::new(ACQUIRE_LOG_EVERY),
        }
    }

    /// What to do after `attempt`, `jittered` being this round's jittered retry period: lead
    /// once acquired; after an answer, pause the jittered retry period (and say so when the
    /// answer ends a run of failures); after a failure, pause the shorter of it and the error
    /// pause ([`error_pause`]), so that a Lease lost to an API server that went away is taken
    /// back soon after it returns.
    pub(super) fn after(&mut self, attempt: Attempt, jittered: Duration) -> Next {
        match attempt {
            Attempt::Acquired => Next::Lead,
            Attempt::Answered => {
                self.errors.reset();
                let failures = self.log.succeeded();
                Next::Pause {
                    pause: jittered,
                    report: (failures > 0).then_some(Report::Answers { failures }),
                }
            }
            Attempt::Failed(error) => {
                let warn = self.log.failed();
                Next::Pause {
                    pause: jittered.min(error_pause(&mut self.errors, self.retry_period)),
                    report: Some(Report::Failed { error, warn }),
                }
            }
        }
    }
}

/// Counts a failed attempt to acquire in `errors` and returns the longest pause it allows
/// before the next: [`ERROR_RETRY_MIN`](super::ERROR_RETRY_MIN) after the first failure in a
/// row, doubling up to [`ERROR_RETRY_MAX`](super::ERROR_RETRY_MAX). From the second failure on
/// the pause is also no longer than `retry_period`; the first keeps the minimum even under a
/// shorter retry period (that attempt waits the shorter of it and the jittered retry period).
fn error_pause(errors: &mut Backoff, retry_period: Duration) -> Duration {
    let pause = errors.fail();
    if errors.failures() > 1 {
        pause.min(retry_period)
    } else {
        pause
    }
}

/// When a Lease held by another candidate is worth trying again: the moment it expires by
/// client-go's rule (our observation of its last change + the lease duration), plus
/// [`EXPIRY_MARGIN`]. `None` when nobody or we hold it (or nothing was observed).
pub(super) fn foreign_expiry(
    observed: Option<&Observed>,
    identity: &str,
    lease_duration: Duration,
) -> Option<Instant> {
    let o = observed?;
    (!o.record.holder.is_empty() && o.record.holder != identity)
        .then(|| o.at + lease_duration + EXPIRY_MARGIN)
}

/// When the next attempt is due, `pause` after `now`: sooner if the Lease we observed held by
/// another candidate expires before ([`foreign_expiry`]). Only a future expiry counts: an
/// expired Lease we were not allowed to take waits for the pause, or for the feed.
pub(super) fn due(
    now: Instant,
    pause: Duration,
    observed: Option<&Observed>,
    identity: &str,
    lease_duration: Duration,
) -> Instant {
    let due = now + pause;
    match foreign_expiry(observed, identity, lease_duration) {
        Some(expiry) if expiry > now => due.min(expiry),
        _ => due,
    }
}

/// What woke the wait for the next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// The due instant came.
    Due,
    /// The feed brought a copy of the Lease; `Some(at)`: with it, the next attempt is due at
    /// `at` (at once for a vacant or deleted Lease, at its expiry for another's).
    Seen(Option<Instant>),
    /// The gate signalled that it may have opened; `allows`: whether it does now.
    Opened {
        /// The gate's answer now.
        allows: bool,
    },
}

/// What the wait for the next attempt does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Attempt now.
    Now,
    /// Wait on, until this instant.
    WaitUntil(Instant),
}

/// The wait for an attempt due at `due` after `wake`: the due instant and an open gate end it;
/// a copy of the Lease can only bring it forward.
pub(super) fn turn(due: Instant, wake: Wake) -> Turn {
    match wake {
        Wake::Due | Wake::Opened { allows: true } => Turn::Now,
        Wake::Seen(Some(at)) => Turn::WaitUntil(due.min(at)),
        Wake::Seen(None) | Wake::Opened { allows: false } => Turn::WaitUntil(due),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::record::tests::record;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn only_an_answered_look_asks_the_gate_again_and_its_yes_means_at_once() {
        let asked = std::cell::Cell::new(0);
        let ask = |answer: bool| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                answer
            }
        };
        assert!(look_again_at_once(false, &Attempt::Answered, ask(true)));
        assert!(!look_again_at_once(false, &Attempt::Answered, ask(false)));
        assert_eq!(asked.get(), 2);
        // An attempt the gate allowed, or a look that failed: the gate is not asked.
        for attempt in [
            Attempt::Answered,
            Attempt::Acquired,
            Attempt::Failed("x".into()),
        ] {
            assert!(!look_again_at_once(true, &attempt, ask(true)));
        }
        assert!(!look_again_at_once(
            false,
            &Attempt::Failed("x".into()),
            ask(true)
        ));
        assert_eq!(asked.get(), 2);
    }

    /// The longest pause after each failed attempt in a row: 0.5 s doubling to 2 s, within the
    /// retry period from the second failure on; an answer starts over.
    #[test]
    fn error_pauses_double_to_two_seconds_within_the_retry_period() {
        let pauses = |retry_period: Duration, n: usize| {
            let mut errors = Backoff::new(ERROR_BACKOFF);
            (0..n)
                .map(|_| error_pause(&mut errors, retry_period))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pauses(5000 * MS, 5),
            [500, 1000, 2000, 2000, 2000].map(|ms| ms * MS)
        );
        assert_eq!(
            pauses(1500 * MS, 4),
            [500, 1000, 1500, 1500].map(|ms| ms * MS)
        );
        assert_eq!(pauses(500 * MS, 3), [500, 500, 500].map(|ms| ms * MS));
        // A retry period below the first pause: the first pause stays (the jittered retry
        // period bounds that attempt), the later ones are the retry period.
        assert_eq!(pauses(200 * MS, 3), [500, 200, 200].map(|ms| ms * MS));
    }

    /// Failures pause the shorter of the jittered period and the error pause, warn once and
    /// then at most every 30 s; an answer pauses the jittered period, says the server answers
    /// again (with the failures), and starts the error pauses over.
    #[tokio::test(start_paused = true)]
    async fn after_an_attempt_the_loop_leads_or_pauses_and_says_what_happened() {
        let mut pace = Pace::new(5000 * MS);
        let jittered = 7000 * MS;
        assert_eq!(pace.after(Attempt::Answered, jittered), pause(7000, None));
        let failed = |warn| {
            Some(Report::Failed {
                error: "down".into(),
                warn,
            })
        };
        let down = || Attempt::Failed("down".into());
        assert_eq!(pace.after(down(), jittered), pause(500, failed(Some(1))));
        tokio::time::advance(500 * MS).await;
        assert_eq!(pace.after(down(), jittered), pause(1000, failed(None)));
        tokio::time::advance(1000 * MS).await;
        assert_eq!(pace.after(down(), jittered), pause(2000, failed(None)));
        // A jittered period shorter than the error pause wins.
        assert_eq!(pace.after(down(), 1500 * MS), pause(1500, failed(None)));
        tokio::time::advance(ACQUIRE_LOG_EVERY).await;
        assert_eq!(pace.after(down(), jittered), pause(2000, failed(Some(4))));
        assert_eq!(
            pace.after(Attempt::Answered, jittered),
            pause(7000, Some(Report::Answers { failures: 5 }))
        );
        assert_eq!(pace.after(down(), jittered), pause(500, failed(Some(1))));
        assert_eq!(pace.after(Attempt::Acquired, jittered), Next::Lead);
    }

    fn pause(ms: u64, report: Option<Report>) -> Next {
        Next::Pause {
            pause: Duration::from_millis(ms),
            report,
        }
    }

    fn observed(holder: &str, at: Instant) -> Observed {
        Observed {
            record: record(holder, 0),
            at,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_attempt_comes_after_the_pause_or_when_another_holders_lease_expires() {
        let lease = 4000 * MS;
        let pause = 3000 * MS;
        let t0 = Instant::now();
        let now = t0 + 2000 * MS;
        let due_with = |o: Option<&Observed>| due(now, pause, o, "me", lease);
        // Nothing observed, the Lease vacant, or ours: the pause.
        assert_eq!(due_with(None), now + pause);
        assert_eq!(due_with(Some(&observed("", t0))), now + pause);
        assert_eq!(due_with(Some(&observed("me", t0))), now + pause);
        // Another's, expiring before the pause ends: at its expiry (plus the margin).
        let expiry = t0 + lease + EXPIRY_MARGIN;
        assert_eq!(due_with(Some(&observed("other", t0))), expiry);
        assert_eq!(
            foreign_expiry(Some(&observed("other", t0)), "me", lease),
            Some(expiry)
        );
        // Expiring after the pause: the pause.
        assert_eq!(
            due_with(Some(&observed("other", now))),
            now + pause,
            "expires at {:?}",
            now + lease
        );
        // Expired already: the pause (only a future expiry brings the attempt forward).
        let long_ago = t0;
        let later = t0 + 10 * lease;
        assert_eq!(
            due(
                later,
                pause,
                Some(&observed("other", long_ago)),
                "me",
                lease
            ),
            later + pause
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_when_due_or_when_the_gate_opens_and_a_copy_only_brings_it_forward() {
        let due = Instant::now() + 5000 * MS;
        let sooner = due - 3000 * MS;
        let later = due + 3000 * MS;
        assert_eq!(turn(due, Wake::Due), Turn::Now);
        assert_eq!(turn(due, Wake::Opened { allows: true }), Turn::Now);
        assert_eq!(
            turn(due, Wake::Opened { allows: false }),
            Turn::WaitUntil(due)
        );
        assert_eq!(turn(due, Wake::Seen(Some(sooner))), Turn::WaitUntil(sooner));
        assert_eq!(turn(due, Wake::Seen(Some(later))), Turn::WaitUntil(due));
        assert_eq!(turn(due, Wake::Seen(None)), Turn::WaitUntil(due));
    }
}
