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
