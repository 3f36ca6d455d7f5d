//! The `/healthz/leader-election` and `/drivers` view of an elector: who holds the Lease, and
//! whether a leader still renews it (client-go's `HealthzAdaptor`).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::time::Instant;

use super::config::Config;

/// How long past `lease_duration` a leader may go without a successful renewal before
/// `/healthz/leader-election` reports it unhealthy (client-go's `HealthzAdaptor` timeout as used by
/// external-attacher, `docs/design.md#health`).
pub const HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// The leader is not renewing its Lease (client-go `HealthzAdaptor` failure).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("failed election to renew leadership on lease {lease}: last renewal {since:?} ago")]
pub struct HealthError {
    /// Lease name.
    pub lease: String,
    /// Time since the last successful renewal.
    pub since: Duration,
}

/// Shared, cheaply clonable view of an elector for the HTTP endpoints: the current holder (for
/// `/drivers`) and the last successful renewal (for `/healthz/leader-election`).
#[derive(Clone, Debug)]
pub struct Status {
    /// Lease name, for messages.
    lease: Arc<str>,
    /// Our identity, so `holder()` can answer while we lead.
    identity: Arc<str>,
    /// Configured lease duration; the health check allows this plus a tolerance.
    lease_duration: Duration,
    /// Updated by the elector task; locked only for short synchronous sections.
    inner: Arc<Mutex<StatusInner>>,
}

/// Mutable part of [`Status`].
#[derive(Debug, Default)]
pub(crate) struct StatusInner {
    /// Whether we currently lead.
    pub(crate) leading: bool,
    /// Last observed non-empty `holderIdentity`.
    pub(crate) holder: Option<String>,
    /// Local instant at which the observed Lease record last changed (client-go
    /// `observedTime`): with the lease duration, it tells whether `holder` is alive.
    pub(crate) changed: Option<Instant>,
    /// Local instant of the last successful acquire or renew.
    pub(crate) last_renew: Option<Instant>,
}

impl Status {
    /// A status for `config` in which nobody is known to lead.
    pub(crate) fn new(config: &Config) -> Status {
        Status {
            lease: config.name.as_str().into(),
            identity: config.identity.as_str().into(),
            lease_duration: config.lease_duration,
            inner: Arc::default(),
        }
    }

    /// Locks the state.
    pub(crate) fn lock(&self) -> MutexGuard<'_, StatusInner> {
        self.inner.lock()
    }

    /// Identity of the current holder as last observed (ours while we lead).
    pub fn holder(&self) -> Option<String> {
        let inner = self.lock();
        if inner.leading {
            Some(self.identity.to_string())
        } else {
            inner.holder.clone()
        }
    }

    /// Whether we currently lead.
    pub fn is_leading(&self) -> bool {
        self.lock().leading
    }

    /// The holder other than us that keeps the Lease alive, if we stand by behind one: by
    /// client-go's rule, the Lease record we last observed changed less than a lease duration
    /// before `now` (by our clock), so a candidate must not take it. `None` while we lead,
    /// while the Lease is vacant or unknown (never read: a refused or failing read), and once
    /// its holder has stopped renewing for a lease duration.
    pub fn live_holder(&self, now: Instant) -> Option<String> {
        let inner = self.lock();
        if inner.leading {
            return None;
        }
        let holder = inner.holder.as_ref().filter(|h| **h != *self.identity)?;
        let changed = inner.changed?;
        (changed + self.lease_duration > now).then(|| holder.clone())
    }

    /// Local instant of the last successful acquire or renew by this candidate.
    pub fn last_renew(&self) -> Option<Instant> {
        self.lock().last_renew
    }

    /// client-go's `LeaderElector.Check`: an error iff we lead and our last successful renewal
    /// is older than `lease_duration + tolerance` (use [`HEALTH_TOLERANCE`]). Standbys are healthy.
    pub fn check(&self, tolerance: Duration) -> Result<(), HealthError> {
        let inner = self.lock();
        if !inner.leading {
            return Ok(());
        }
        let since = inner.last_renew.map_or(Duration::MAX, |at| {
            Instant::now().saturating_duration_since(at)
        });
        if since > self.lease_duration.saturating_add(tolerance) {
            return Err(HealthError {
                lease: self.lease.to_string(),
                since,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new("external-attacher-leader-x", "default", "me")
    }

    #[tokio::test(start_paused = true)]
    async fn health_fails_only_for_a_leader_that_stopped_renewing() {
        let mut c = config();
        c.lease_duration = Duration::from_secs(15);
        let status = Status::new(&c);
        assert_eq!(status.check(HEALTH_TOLERANCE), Ok(()));
        assert_eq!(status.holder(), None);
        {
            let mut inner = status.lock();
            inner.leading = true;
            inner.last_renew = Some(Instant::now());
        }
        assert_eq!(status.holder().as_deref(), Some("me"));
        tokio::time::advance(Duration::from_secs(35)).await;
        assert_eq!(status.check(HEALTH_TOLERANCE), Ok(()));
        tokio::time::advance(Duration::from_millis(1)).await;
        let err = status.check(HEALTH_TOLERANCE).expect_err("unhealthy");
        assert_eq!(err.lease, "external-attacher-leader-x");
        // A standby with an old renewal is healthy.
        status.lock().leading = false;
        assert_eq!(status.check(HEALTH_TOLERANCE), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_is_live_until_its_record_has_not_changed_for_a_lease_duration() {
        let mut c = config();
        c.lease_duration = Duration::from_secs(15);
        let status = Status::new(&c);
        // Never read: nobody known to hold it.
        assert_eq!(status.live_holder(Instant::now()), None);
        {
            let mut inner = status.lock();
            inner.holder = Some("go-1".into());
            inner.changed = Some(Instant::now());
        }
        assert_eq!(status.live_holder(Instant::now()).as_deref(), Some("go-1"));
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(status.live_holder(Instant::now()).as_deref(), Some("go-1"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(status.live_holder(Instant::now()), None, "expired");
        // Our own record, or leading, is no other holder.
        {
            let mut inner = status.lock();
            inner.holder = Some("me".into());
            inner.changed = Some(Instant::now());
        }
        assert_eq!(status.live_holder(Instant::now()), None);
        {
            let mut inner = status.lock();
            inner.holder = Some("go-1".into());
            inner.leading = true;
        }
        assert_eq!(status.live_holder(Instant::now()), None);
    }
}
