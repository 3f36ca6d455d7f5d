//! The settings of one leader elector (one Lease): client-go's defaults, and the combinations
//! client-go's `NewLeaderElector` refuses.

use std::collections::BTreeMap;
use std::time::Duration;

use super::timing::{self, TimingError};

/// client-go's default `LeaseDuration` (`--leader-election-lease-duration`).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// client-go's default `RenewDeadline` (`--leader-election-renew-deadline`).
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// client-go's default `RetryPeriod` (`--leader-election-retry-period`).
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(5);

/// An invalid leader-election configuration (client-go panics on the same combinations).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The Lease name is empty.
    #[error("the lease name must not be empty")]
    EmptyName,
    /// The Lease namespace is empty.
    #[error("the lease namespace must not be empty")]
    EmptyNamespace,
    /// The identity is empty.
    #[error("the leader-election identity must not be empty")]
    EmptyIdentity,
    /// The timing is refused (see [`super::timing::check`]).
    #[error(transparent)]
    Timing(#[from] TimingError),
}

/// Settings of one leader elector (one Lease).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Lease name, e.g. [`lease_name`](crate::names::lease_name)`(driver)`.
    pub name: String,
    /// Lease namespace, e.g. from [`resolve_namespace`](super::resolve_namespace).
    pub namespace: String,
    /// Our `holderIdentity`; must differ between candidates (see [`default_identity`](super::default_identity)).
    pub identity: String,
    /// How long a non-leader waits after the last change of the Lease before taking it over.
    pub lease_duration: Duration,
    /// How long the leader keeps retrying failed renewals before it stops leading.
    pub renew_deadline: Duration,
    /// Interval between attempts to acquire or renew.
    pub retry_period: Duration,
    /// Labels put on the Lease whenever this candidate writes it (`--leader-election-labels`).
    pub labels: BTreeMap<String, String>,
    /// Whether to vacate the Lease when the shutdown token is cancelled while leading.
    pub release_on_cancel: bool,
}

impl Config {
    /// A configuration with client-go's default timings, no labels and no release on cancel.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Config {
        Config {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            labels: BTreeMap::new(),
            release_on_cancel: false,
        }
    }

    /// Checks the combinations client-go's `NewLeaderElector` rejects, plus a lease duration of
    /// at least one second (the Lease stores whole seconds).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::EmptyName);
        }
        if self.namespace.is_empty() {
            return Err(ConfigError::EmptyNamespace);
        }
        if self.identity.is_empty() {
            return Err(ConfigError::EmptyIdentity);
        }
        timing::check(self.lease_duration, self.renew_deadline, self.retry_period)?;
        Ok(())
    }

    /// `leaseDurationSeconds` as client-go writes it: whole seconds, truncated.
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new("external-attacher-leader-x", "default", "me")
    }

    #[test]
    fn validation_matches_client_go() {
        assert_eq!(config().validate(), Ok(()));
        let mut c = config();
        c.renew_deadline = c.lease_duration;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Timing(
                TimingError::LeaseNotLongerThanRenewDeadline { .. }
            ))
        ));
        let mut c = config();
        c.retry_period = Duration::from_secs(9); // 1.2 × 9 > 10
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Timing(
                TimingError::RenewDeadlineNotLongerThanRetry { .. }
            ))
        ));
        let mut c = config();
        c.identity.clear();
        assert_eq!(c.validate(), Err(ConfigError::EmptyIdentity));
        let mut c = config();
        c.retry_period = Duration::ZERO;
        assert_eq!(
            c.validate(),
            Err(ConfigError::Timing(TimingError::Zero(
                timing::TimingField::RetryPeriod
            )))
        );
        let mut c = config();
        c.lease_duration = Duration::from_millis(900);
        c.renew_deadline = Duration::from_millis(800);
        c.retry_period = Duration::from_millis(100);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Timing(TimingError::LeaseTooShort(_)))
        ));
        // The durations used by the integration tests are valid.
        let mut c = config();
        c.lease_duration = Duration::from_secs(2);
        c.renew_deadline = Duration::from_millis(1500);
        c.retry_period = Duration::from_millis(500);
        assert_eq!(c.validate(), Ok(()));
    }
}
