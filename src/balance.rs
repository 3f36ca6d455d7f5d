//! Spreading driver leadership across hub replicas.
//!
//! Each replica keeps a presence Lease `attacher-hub-replica-<identity>`
//! (label [`REPLICA_LABEL`]) renewed every retry period. From the live
//! presence Leases a replica knows how many replicas share the work and so
//! its fair share, `ceil(drivers / replicas)`. A replica at or above its share
//! does not try to acquire more driver Leases; a replica above it hands the
//! surplus back (vacating those Leases), and the replicas below their share
//! pick them up. Kubernetes Leases stay the only coordination: no replica
//! talks to another.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};

/// Label on presence Leases.
pub const REPLICA_LABEL: &str = "attacher-hub.kubernetes.io/replica";
/// Name prefix of presence Leases.
pub const REPLICA_LEASE_PREFIX: &str = "attacher-hub-replica-";

/// How many driver Leases this replica may hold, and how many it holds.
#[derive(Debug)]
pub struct Balance {
    /// The fair share; `usize::MAX` when leadership is not balanced (one
    /// replica, sidecar mode, or before the first count).
    share: AtomicUsize,
    /// Driver Leases held now.
    leading: AtomicUsize,
}

impl Default for Balance {
    fn default() -> Self {
        Self {
            share: AtomicUsize::new(usize::MAX),
            leading: AtomicUsize::new(0),
        }
    }
}

impl Balance {
    /// Whether this replica may try to acquire one more driver Lease.
    pub fn may_acquire(&self) -> bool {
        self.leading.load(Ordering::Acquire) < self.share.load(Ordering::Acquire)
    }

    /// Records that a driver Lease was won (`true`) or given up (`false`).
    pub fn set_leading(&self, gained: bool) {
        if gained {
            self.leading.fetch_add(1, Ordering::AcqRel);
        } else {
            let _ = self
                .leading
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    /// Driver Leases held now.
    pub fn leading(&self) -> usize {
        self.leading.load(Ordering::Acquire)
    }

    /// The current share.
    pub fn share(&self) -> usize {
        self.share.load(Ordering::Acquire)
    }

    /// How many Leases to hand back now.
    pub fn surplus(&self) -> usize {
        self.leading().saturating_sub(self.share())
    }

    fn set_share(&self, share: usize) {
        self.share.store(share, Ordering::Release);
    }
}

/// The fair share of `drivers` among `replicas` (at least one replica).
pub fn fair_share(drivers: usize, replicas: usize) -> usize {
    drivers.div_ceil(replicas.max(1))
}

/// Name of a replica's presence Lease (lower-cased: Lease names are DNS
/// subdomains).
pub fn replica_lease_name(identity: &str) -> String {
    format!("{REPLICA_LEASE_PREFIX}{}", identity.to_lowercase())
}

/// Whether a presence Lease was renewed within its duration of `now`.
fn is_live(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    let (Some(renew), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return false;
    };
    let expires = renew.0 + Duration::from_secs(u64::try_from(secs.max(0)).unwrap_or(0));
    expires > now
}

/// Keeps this replica's presence Lease and recomputes the share.
#[derive(Debug)]
pub struct Presence {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
}

impl Presence {
    /// Presence of `identity` in the namespace of `api`.
    pub fn new(api: Api<Lease>, identity: &str, lease_duration: Duration) -> Self {
        Self {
            api,
            name: replica_lease_name(identity),
            identity: identity.to_string(),
            lease_duration,
        }
    }

    fn record(&self) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(BTreeMap::from([(
                    REPLICA_LABEL.to_string(),
                    "true".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(
                    i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
                ),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Renews (or creates) our presence Lease.
    pub async fn renew(&self) -> kube::Result<()> {
        match self.api.get_opt(&self.name).await? {
            None => {
                self.api
                    .create(&PostParams::default(), &self.record())
                    .await?;
            }
            Some(existing) => {
                let mut lease = self.record();
                lease.metadata.resource_version = existing.metadata.resource_version;
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await?;
            }
        }
        Ok(())
    }

    /// Number of live replicas (ourselves included).
    pub async fn replicas(&self) -> kube::Result<usize> {
        let now = Timestamp::now();
        let list = self
            .api
            .list(&ListParams::default().labels(&format!("{REPLICA_LABEL}=true")))
            .await?;
        let others = list
            .items
            .iter()
            .filter(|l| l.metadata.name.as_deref() != Some(self.name.as_str()))
            .filter(|l| is_live(l, now))
            .count();
        Ok(others + 1)
    }

    /// Deletes our presence Lease (on shutdown), so the others count one
    /// replica less at once.
    pub async fn remove(&self) {
        if let Err(error) = self.api.delete(&self.name, &Default::default()).await {
            tracing::debug!(%error, "deleting the presence lease failed");
        }
    }

    /// One round: renew, count replicas, publish the share for `drivers`
    /// driver Leases. Returns the share.
    pub async fn round(&self, balance: &Balance, drivers: usize) -> kube::Result<usize> {
        self.renew().await?;
        let replicas = self.replicas().await?;
        // No drivers (yet): nothing to share, and a share of 0 must not
        // block the first ones that appear.
        let share = if drivers == 0 {
            usize::MAX
        } else {
            fair_share(drivers, replicas)
        };
        if share != balance.share() {
            tracing::info!(replicas, drivers, share, "leadership share changed");
        }
        balance.set_share(share);
        Ok(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_rounds_up_so_every_driver_has_a_place() {
        assert_eq!(fair_share(5, 2), 3);
        assert_eq!(fair_share(4, 2), 2);
        assert_eq!(fair_share(1, 3), 1);
        assert_eq!(fair_share(0, 3), 0);
        assert_eq!(fair_share(5, 0), 5);
    }

    #[test]
    fn a_replica_at_its_share_stops_acquiring_and_above_it_has_a_surplus() {
        let b = Balance::default();
        assert!(b.may_acquire());
        b.set_share(2);
        b.set_leading(true);
        assert!(b.may_acquire());
        b.set_leading(true);
        assert!(!b.may_acquire());
        assert_eq!(b.surplus(), 0);
        b.set_leading(true);
        assert_eq!(b.surplus(), 1);
        b.set_leading(false);
        b.set_leading(false);
        b.set_leading(false);
        b.set_leading(false);
        assert_eq!(b.leading(), 0, "never below zero");
    }

    #[test]
    fn presence_is_live_until_its_duration_has_passed() {
        let now = Timestamp::now();
        let lease = |age_secs: i64, dur: i32| Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(now - Duration::from_secs(age_secs as u64))),
                lease_duration_seconds: Some(dur),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert!(is_live(&lease(5, 15), now));
        assert!(!is_live(&lease(20, 15), now));
        assert!(!is_live(&Lease::default(), now));
    }

    #[test]
    fn presence_lease_names_are_lower_case() {
        assert_eq!(replica_lease_name("Node-A"), "attacher-hub-replica-node-a");
    }
}
