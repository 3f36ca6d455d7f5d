//! The leader-election timing rules, checked in one place for the command line, for
//! `drivers.yaml` and for the elector itself: what client-go's `NewLeaderElector` refuses, in
//! its order, plus a lease of at least one second (a Lease stores whole seconds). Each caller
//! maps [`TimingError`] to its own message (a flag name, a field path, the elector's text).

use std::time::Duration;

/// client-go's `JitterFactor`: an acquire attempt waits `retry_period × (1 + r × 1.2)` with a
/// random `r ∈ [0, 1)` before the next one. The renew deadline must exceed
/// `JITTER_FACTOR × retry_period`.
pub const JITTER_FACTOR: f64 = 1.2;

/// Shortest lease duration (when leader election is on): a Lease stores whole seconds and must
/// hold a positive number, so a shorter one could never be written (the Go sidecar accepts it
/// and then fails every attempt to take the Lease).
pub const MIN_LEASE_DURATION: Duration = Duration::from_secs(1);

/// Which duration of the three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimingField {
    /// The lease duration.
    LeaseDuration,
    /// The renew deadline.
    RenewDeadline,
    /// The retry period.
    RetryPeriod,
}

/// Why a leader-election timing is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The Lease would expire before the leader gives up renewing it.
    #[error(
        "the lease duration ({lease_duration:?}) must be greater than the renew deadline ({renew_deadline:?})"
    )]
    LeaseNotLongerThanRenewDeadline {
        /// The lease duration.
        lease_duration: Duration,
        /// The renew deadline.
        renew_deadline: Duration,
    },
    /// The leader would give up before its last retry could succeed.
    #[error(
        "the renew deadline ({renew_deadline:?}) must be greater than {JITTER_FACTOR} × the retry period ({retry_period:?})"
    )]
    RenewDeadlineNotLongerThanRetry {
        /// The renew deadline.
        renew_deadline: Duration,
        /// The retry period.
        retry_period: Duration,
    },
    /// A duration is zero.
    #[error("the {0:?} must be positive")]
    Zero(TimingField),
    /// The lease duration is under [`MIN_LEASE_DURATION`].
    #[error("the lease duration ({0:?}) must be at least one second")]
    LeaseTooShort(Duration),
}

/// Longest slot of a [`RenewGrid`].
pub const MAX_RENEW_SLOT: Duration = Duration::from_secs(1);

/// Shared instants for the renewals of many Leases held by one process.
///
/// A hub renews one Lease per driver every retry period. Renewed each on its own phase, 100
/// drivers cost 20 separate wake-ups, writes and reads of the API server connection a second.
/// On a grid, a leader's next renewal round starts on the first grid line at or after client-go's
/// start ("retry period after the last success", [`RenewGrid::round_start`]): never sooner than
/// client-go's renewal, at most one slot later, and after the first round always on the lines
/// of the grid, so that the Leases whose lines coincide are renewed together, one wake-up and
/// one write of the connection for all of them. So renewals are never more frequent than a
/// Go sidecar's (whose rounds come a retry period after its last answer, so a little less than
/// 12 a minute at 5 s): with the default timings one every 6 s. The round's renew deadline
/// still counts from client-go's start, so a leader that cannot renew stops leading no later
/// than a Go sidecar would, and a late line that would cost the round one of the tries client-go
/// gets before its deadline is not taken. A retry period is cut into whole slots of at most
/// [`MAX_RENEW_SLOT`], and at least two: 1 s slots for the default 5 s, five lines per period,
/// about a fifth of the drivers on each.
#[derive(Clone, Copy, Debug)]
pub struct RenewGrid {
    origin: tokio::time::Instant,
}

impl RenewGrid {
    /// A grid with a line at `origin`.
    pub fn new(origin: tokio::time::Instant) -> Self {
        RenewGrid { origin }
    }

    /// The slot for `retry_period`: the period cut into at least two whole slots of at most
    /// [`MAX_RENEW_SLOT`].
    pub fn slot(retry_period: Duration) -> Duration {
        let slots = retry_period
            .as_nanos()
            .div_ceil(MAX_RENEW_SLOT.as_nanos())
            .clamp(2, u128::from(u32::MAX));
        retry_period / u32::try_from(slots).unwrap_or(u32::MAX)
    }

    /// When a leader's renewal round that client-go would start at `due` starts: the first line
    /// at or after `due` for `retry_period`, unless a try of the round that client-go would
    /// make before `due + renew_deadline` would then come after it; else `due` (also before the
    /// origin).
    pub fn round_start(
        &self,
        due: tokio::time::Instant,
        retry_period: Duration,
        renew_deadline: Duration,
    ) -> tokio::time::Instant {
        let line = self.at_or_before(due, retry_period);
        let line = if line < due {
            line + Self::slot(retry_period)
        } else {
            line
        };
        // client-go tries at due, due + r, ... while before due + renew_deadline; each try of
        // a round started `late` comes `late` after its own, and the last must still be before.
        let late = line - due;
        let tries_before_deadline = renew_deadline
            .as_nanos()
            .div_ceil(retry_period.as_nanos().max(1))
            .saturating_sub(1);
        let last_try = retry_period.as_nanos() * tries_before_deadline;
        let slack = renew_deadline.as_nanos().saturating_sub(last_try);
        if late.as_nanos() < slack { line } else { due }
    }

    /// The last line at or before `due` for `retry_period` (`due` itself before the origin).
    pub fn at_or_before(
        &self,
        due: tokio::time::Instant,
        retry_period: Duration,
    ) -> tokio::time::Instant {
        let slot = Self::slot(retry_period).as_nanos().max(1);
        match due.checked_duration_since(self.origin) {
            Some(since) => {
                let lines = since.as_nanos() / slot;
                let offset = u64::try_from(lines * slot).unwrap_or(u64::MAX);
                self.origin + Duration::from_nanos(offset)
            }
            None => due,
        }
    }
}

/// Checks a lease duration, renew deadline and retry period in client-go's order (the lease
/// outlives the renew deadline; the renew deadline outlives the jittered retry period, the
/// product truncated to whole nanoseconds as Go does; no duration is zero), then the
/// one-second minimum.
pub fn check(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), TimingError> {
    if lease_duration <= renew_deadline {
        return Err(TimingError::LeaseNotLongerThanRenewDeadline {
            lease_duration,
            renew_deadline,
        });
    }
    let jittered_retry = (JITTER_FACTOR * retry_period.as_nanos() as f64) as u128;
    if renew_deadline.as_nanos() <= jittered_retry {
        return Err(TimingError::RenewDeadlineNotLongerThanRetry {
            renew_deadline,
            retry_period,
        });
    }
    for (field, value) in [
        (TimingField::LeaseDuration, lease_duration),
        (TimingField::RenewDeadline, renew_deadline),
        (TimingField::RetryPeriod, retry_period),
    ] {
        if value.is_zero() {
            return Err(TimingError::Zero(field));
        }
    }
    if lease_duration < MIN_LEASE_DURATION {
        return Err(TimingError::LeaseTooShort(lease_duration));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots divide the retry period into at least two; a due instant goes back to the last
    /// line, never forward, and by less than a slot.
    #[test]
    fn the_renew_grid_rounds_down_to_its_lines() {
        assert_eq!(RenewGrid::slot(ms(5_000)), ms(1_000));
        assert_eq!(
            RenewGrid::slot(ms(2_500)),
            ms(833) + Duration::from_nanos(333_333)
        );
        assert_eq!(RenewGrid::slot(ms(1_000)), ms(500));
        assert_eq!(RenewGrid::slot(ms(300)), ms(150));
        assert_eq!(RenewGrid::slot(ms(10_000)), ms(1_000));
        let origin = tokio::time::Instant::now();
        let grid = RenewGrid::new(origin);
        let at = |ms_after: u64| grid.at_or_before(origin + ms(ms_after), ms(5_000)) - origin;
        assert_eq!(at(0), ms(0));
        assert_eq!(at(999), ms(0));
        assert_eq!(at(1_000), ms(1_000));
        assert_eq!(at(7_350), ms(7_000));
        // A leader renewed 20 ms after a line: its next round is one period after that line.
        assert_eq!(at(5_000 + 5_020), ms(10_000));
        // Before the origin: as due.
        let early = origin.checked_sub(ms(10)).expect("an earlier instant");
        assert_eq!(grid.at_or_before(early, ms(5_000)), early);
    }

    /// A round starts on the first line at or after client-go's start, never sooner; on it
    /// too when client-go's start is a line; at client-go's start when the late line would
    /// push the round's last try past its renew deadline.
    #[test]
    fn a_round_starts_on_the_next_line_unless_that_costs_a_try() {
        let origin = tokio::time::Instant::now();
        let grid = RenewGrid::new(origin);
        let start = |due_ms: u64, retry: u64, deadline: u64| {
            grid.round_start(origin + ms(due_ms), ms(retry), ms(deadline)) - origin
        };
        // Defaults (5 s, 10 s): tries at +0 and +5 s; the last may come up to 5 s late.
        assert_eq!(start(5_020, 5_000, 10_000), ms(6_000));
        assert_eq!(start(10_999, 5_000, 10_000), ms(11_000));
        assert_eq!(start(6_000, 5_000, 10_000), ms(6_000));
        // 5 s and 10.1 s: client-go also tries at +10 s, which a line 100 ms late or more would
        // push past the deadline.
        assert_eq!(start(5_950, 5_000, 10_100), ms(6_000));
        assert_eq!(start(5_900, 5_000, 10_100), ms(5_900));
        assert_eq!(start(5_020, 5_000, 10_100), ms(5_020));
        // Before the origin: as due.
        let early = origin.checked_sub(ms(10)).expect("an earlier instant");
        assert_eq!(grid.round_start(early, ms(5_000), ms(10_000)), early);
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn timings_are_refused_in_client_go_order() {
        assert_eq!(check(ms(15_000), ms(10_000), ms(5_000)), Ok(()));
        assert_eq!(check(ms(2_000), ms(1_500), ms(500)), Ok(()));
        assert!(matches!(
            check(ms(10_000), ms(10_000), ms(5_000)),
            Err(TimingError::LeaseNotLongerThanRenewDeadline { .. })
        ));
        // 1.2 × 9 s > 10 s; exactly 1.2 × the retry period is refused too.
        assert!(matches!(
            check(ms(15_000), ms(10_000), ms(9_000)),
            Err(TimingError::RenewDeadlineNotLongerThanRetry { .. })
        ));
        assert!(matches!(
            check(ms(15_000), ms(1_200), ms(1_000)),
            Err(TimingError::RenewDeadlineNotLongerThanRetry { .. })
        ));
        assert_eq!(
            check(ms(15_000), ms(10_000), Duration::ZERO),
            Err(TimingError::Zero(TimingField::RetryPeriod))
        );
        // Several rules broken: the first in client-go's order is named.
        assert!(matches!(
            check(Duration::ZERO, Duration::ZERO, Duration::ZERO),
            Err(TimingError::LeaseNotLongerThanRenewDeadline { .. })
        ));
        assert_eq!(
            check(ms(900), ms(800), ms(100)),
            Err(TimingError::LeaseTooShort(ms(900)))
        );
    }
}
