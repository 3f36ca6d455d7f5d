//! The one backoff rule of the crate: a pause that starts at a first value and doubles with
//! every failure in a row, never beyond a cap.
//!
//! Every retry loop uses it: the work queue's per-key retries, the watches, the API server
//! dials, the CSI connection, a driver's restarts and the leader elector's error pauses. What
//! differs between them stays at the call site: the first pause and the cap (each loop's own
//! constants, most of them the Go sidecar's), the jitter (client-go jitters its watch retries
//! upward, the dialer jitters downward, the rest not at all) and when a loop starts over
//! ([`Backoff::reset`]: on success, or after a quiet spell).
//!
//! [`Doubling`] is the rule as a pure function of the failure count; [`Backoff`] counts the
//! failures for a loop that keeps its own state.

use std::time::Duration;

/// Doublings at most: 2^64 times even a nanosecond is beyond any cap a retry loop has, and a
/// failure count of millions costs no more than this many steps.
const MAX_DOUBLINGS: u32 = 64;

/// A pause of `first` after the first failure, twice that after the second, and so on, never
/// more than `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Doubling {
    first: Duration,
    max: Duration,
}

impl Doubling {
    /// The rule starting at `first` and capped at `max` (a `max` below `first` caps every pause,
    /// the first one too).
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max }
    }

    /// The first pause.
    pub const fn first(&self) -> Duration {
        self.first
    }

    /// The cap.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The pause after `failures` failures in a row: `first × 2^(failures − 1)`, capped at
    /// `max`. No failure yet (0) earns the first pause, as one does.
    pub fn after(&self, failures: u32) -> Duration {
        let mut pause = self.first;
        for _ in 0..failures.saturating_sub(1).min(MAX_DOUBLINGS) {
            if pause >= self.max {
                break;
            }
            pause = pause.saturating_mul(2);
        }
        pause.min(self.max)
    }
}

/// Failures in a row of one retry loop, and the pause each one earns by its [`Doubling`] rule.
#[derive(Clone, Debug)]
pub struct Backoff {
    rule: Doubling,
    failures: u32,
}

impl Backoff {
    /// A loop that has not failed yet.
    pub const fn new(rule: Doubling) -> Self {
        Self { rule, failures: 0 }
    }

    /// Counts a failure and returns the pause it earns: the first pause, then twice that, ...
    /// up to the cap.
    pub fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.rule.after(self.failures)
    }

    /// The pause the next failure will earn, without counting it.
    pub fn next_pause(&self) -> Duration {
        self.rule.after(self.failures.saturating_add(1))
    }

    /// Starts over: the next failure earns the first pause again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures counted since the last [`reset`](Self::reset).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The rule.
    pub fn rule(&self) -> Doubling {
        self.rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_pause_doubles_from_the_first_and_stops_at_the_cap() {
        let rule = Doubling::new(100 * MS, 1000 * MS);
        let pauses: Vec<_> = (0..=6).map(|n| rule.after(n)).collect();
        assert_eq!(
            pauses,
            [100, 100, 200, 400, 800, 1000, 1000].map(|ms| ms * MS)
        );
    }

    #[test]
    fn any_number_of_failures_earns_the_cap_without_overflow() {
        let rule = Doubling::new(Duration::from_secs(1), Duration::from_secs(30));
        for n in [31, 32, 33, 64, 1000, u32::MAX] {
            assert_eq!(rule.after(n), Duration::from_secs(30), "{n} failures");
        }
        // A first pause so long that doubling it overflows a Duration: the cap.
        let huge = Doubling::new(Duration::MAX / 2, Duration::MAX);
        assert_eq!(huge.after(3), Duration::MAX);
    }

    #[test]
    fn a_cap_below_the_first_pause_caps_the_first_pause_too() {
        let rule = Doubling::new(500 * MS, 200 * MS);
        assert_eq!(rule.after(1), 200 * MS);
        assert_eq!(rule.after(5), 200 * MS);
    }

    #[test]
    fn a_loop_counts_its_failures_and_starts_over_on_reset() {
        let mut b = Backoff::new(Doubling::new(250 * MS, 2000 * MS));
        assert_eq!(b.next_pause(), 250 * MS);
        assert_eq!(b.fail(), 250 * MS);
        assert_eq!(b.fail(), 500 * MS);
        assert_eq!(b.next_pause(), 1000 * MS);
        assert_eq!(b.fail(), 1000 * MS);
        assert_eq!(b.fail(), 2000 * MS);
        assert_eq!(b.fail(), 2000 * MS);
        assert_eq!(b.failures(), 5);
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.fail(), 250 * MS);
    }
}
