//! The Lease codec: the fields of a Lease spec that client-go's `LeaderElectionRecord` carries,
//! the records a candidate writes (acquire, renew, create, release), and client-go's rule for
//! when a Lease held by someone else has expired.
//!
//! Hand-written because attacher-hub and the Go external-attacher contend for the *same*
//! Lease: every field must be written and compared exactly as client-go's `LeaseLock` does
//! (`LeaderElectionRecordToLeaseSpec`, `tryAcquireOrRenew`, `release`), which no Rust crate
//! promises (kube-runtime has no leader election; the crates that do write their own format).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::config::Config;

/// The fields of a Lease spec that client-go's `LeaderElectionRecord` carries; two records are
/// compared to decide whether the Lease changed since we last looked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Record {
    /// `holderIdentity`, empty when vacant.
    pub(crate) holder: String,
    /// `leaseDurationSeconds`.
    pub(crate) lease_duration_seconds: i32,
    /// `acquireTime`.
    pub(crate) acquire_time: Option<MicroTime>,
    /// `renewTime`.
    pub(crate) renew_time: Option<MicroTime>,
    /// `leaseTransitions`.
    pub(crate) transitions: i32,
    /// `strategy` (coordinated leader election; only compared).
    pub(crate) strategy: Option<String>,
    /// `preferredHolder` (coordinated leader election; only compared).
    pub(crate) preferred_holder: Option<String>,
}

impl Record {
    /// The record stored in `spec` (client-go `LeaseSpecToLeaderElectionRecord`).
    pub(crate) fn from_spec(spec: Option<&LeaseSpec>) -> Record {
        let Some(spec) = spec else {
            return Record::default();
        };
        Record {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or_default(),
            acquire_time: spec.acquire_time.clone(),
            renew_time: spec.renew_time.clone(),
            transitions: spec.lease_transitions.unwrap_or_default(),
            strategy: spec.strategy.clone(),
            preferred_holder: spec.preferred_holder.clone(),
        }
    }

    /// The Lease spec for this record (client-go `LeaderElectionRecordToLeaseSpec`, which
    /// always writes `holderIdentity` and `leaseDurationSeconds`, even when empty).
    pub(crate) fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(self.lease_duration_seconds),
            acquire_time: self.acquire_time.clone(),
            renew_time: self.renew_time.clone(),
            lease_transitions: Some(self.transitions),
            strategy: self.strategy.clone(),
            preferred_holder: self.preferred_holder.clone(),
        }
    }
}

/// A record as observed, with the local instant at which it (last) changed.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    /// The record.
    pub(crate) record: Record,
    /// When we first saw this exact record (client-go `observedTime`).
    pub(crate) at: Instant,
}

/// Remembers `record` as observed at `now` unless it equals the one already observed, in which
/// case the original observation instant is kept (an unchanged record is an ageing record).
pub(crate) fn observe(observed: &mut Option<Observed>, record: Record, now: Instant) {
    if observed.as_ref().is_some_and(|o| o.record == record) {
        return;
    }
    *observed = Some(Observed { record, at: now });
}

/// client-go `isLeaseValid`: the observed record changed less than `lease_duration` ago.
pub(crate) fn is_lease_valid(observed: &Observed, lease_duration: Duration, now: Instant) -> bool {
    observed.at + lease_duration > now
}

/// Whether someone else holds a lease that has not expired, so we must not take it.
pub(crate) fn held_by_other(
    observed: &Observed,
    identity: &str,
    lease_duration: Duration,
    now: Instant,
) -> bool {
    !observed.record.holder.is_empty()
        && observed.record.holder != identity
        && is_lease_valid(observed, lease_duration, now)
}

/// The record we write to acquire or renew at wall-clock `now`. A holder keeps its acquire time
/// and transition count; a new holder starts a transition (client-go `tryAcquireOrRenew`).
pub(crate) fn acquire_record(config: &Config, previous: &Record, now: Timestamp) -> Record {
    let now = MicroTime(now);
    let (acquire_time, transitions) = if previous.holder == config.identity {
        (previous.acquire_time.clone(), previous.transitions)
    } else {
        (Some(now.clone()), previous.transitions.saturating_add(1))
    };
    Record {
        holder: config.identity.clone(),
        lease_duration_seconds: config.lease_duration_seconds(),
        acquire_time,
        renew_time: Some(now),
        transitions,
        strategy: None,
        preferred_holder: None,
    }
}

/// The record of a Lease we create: we hold it, no transitions yet.
pub(crate) fn create_record(config: &Config, now: Timestamp) -> Record {
    let now = MicroTime(now);
    Record {
        holder: config.identity.clone(),
        lease_duration_seconds: config.lease_duration_seconds(),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        transitions: 0,
        strategy: None,
        preferred_holder: None,
    }
}

/// The record that vacates the Lease (client-go `release`): empty holder, a one-second duration,
/// acquire and renew set to now, transitions kept.
pub(crate) fn release_record(previous: &Record, now: Timestamp) -> Record {
    let now = MicroTime(now);
    Record {
        holder: String::new(),
        lease_duration_seconds: 1,
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        transitions: previous.transitions,
        strategy: None,
        preferred_holder: None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::leader::config::DEFAULT_LEASE_DURATION;

    fn config() -> Config {
        Config::new("external-attacher-leader-x", "default", "me")
    }

    pub(crate) fn record(holder: &str, transitions: i32) -> Record {
        Record {
            holder: holder.to_string(),
            lease_duration_seconds: 15,
            acquire_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            transitions,
            strategy: None,
            preferred_holder: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn foreign_lease_expires_lease_duration_after_last_change() {
        let lease_duration = Duration::from_secs(15);
        let mut observed = None;
        observe(&mut observed, record("other", 3), Instant::now());
        let o = observed.clone().expect("observed");
        assert!(held_by_other(&o, "me", lease_duration, Instant::now()));

        // Re-reading the same record does not refresh the observation time.
        tokio::time::advance(Duration::from_secs(10)).await;
        observe(&mut observed, record("other", 3), Instant::now());
        let o = observed.clone().expect("observed");
        assert!(held_by_other(&o, "me", lease_duration, Instant::now()));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            !held_by_other(&o, "me", lease_duration, Instant::now()),
            "expired exactly lease_duration after the record was first seen"
        );

        // A renewal by the holder (new renewTime) restarts the clock.
        let mut renewed = record("other", 3);
        renewed.renew_time = Some(MicroTime(Timestamp::constant(1, 0)));
        observe(&mut observed, renewed, Instant::now());
        let o = observed.clone().expect("observed");
        assert!(held_by_other(&o, "me", lease_duration, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn empty_or_own_holder_is_never_held_by_other() {
        let now = Instant::now();
        let vacant = Observed {
            record: record("", 1),
            at: now,
        };
        assert!(!held_by_other(&vacant, "me", DEFAULT_LEASE_DURATION, now));
        let mine = Observed {
            record: record("me", 1),
            at: now,
        };
        assert!(!held_by_other(&mine, "me", DEFAULT_LEASE_DURATION, now));
    }

    #[test]
    fn acquire_record_starts_a_transition_for_a_new_holder() {
        let c = config();
        let now = Timestamp::constant(1000, 0);
        let r = acquire_record(&c, &record("other", 4), now);
        assert_eq!(r.holder, "me");
        assert_eq!(r.lease_duration_seconds, 15);
        assert_eq!(r.transitions, 5);
        assert_eq!(r.acquire_time, Some(MicroTime(now)));
        assert_eq!(r.renew_time, Some(MicroTime(now)));

        // From a released lease, too.
        let r = acquire_record(&c, &release_record(&record("x", 7), now), now);
        assert_eq!(r.transitions, 8);
    }

    #[test]
    fn renew_record_keeps_acquire_time_and_transitions() {
        let c = config();
        let now = Timestamp::constant(2000, 0);
        let previous = record("me", 4);
        let r = acquire_record(&c, &previous, now);
        assert_eq!(r.transitions, 4);
        assert_eq!(r.acquire_time, previous.acquire_time);
        assert_eq!(r.renew_time, Some(MicroTime(now)));
    }

    #[test]
    fn create_and_release_records() {
        let c = config();
        let now = Timestamp::constant(3000, 0);
        let r = create_record(&c, now);
        assert_eq!((r.holder.as_str(), r.transitions), ("me", 0));
        assert_eq!(r.acquire_time, Some(MicroTime(now)));
        let released = release_record(&record("me", 9), now);
        assert_eq!(released.holder, "");
        assert_eq!(released.lease_duration_seconds, 1);
        assert_eq!(released.transitions, 9);
        assert_eq!(released.acquire_time, Some(MicroTime(now)));
        let spec = released.to_spec();
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(Record::from_spec(Some(&spec)), released);
        assert_eq!(Record::from_spec(None), Record::default());
    }
}
