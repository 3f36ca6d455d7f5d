//! The cross-namespace Lease guard: before a candidate leads a driver, it looks for Leases of the
//! same name in *other* namespaces, and while another holder keeps such a Lease alive it does not
//! lead.
//!
//! Two attachers of one driver that elect on Leases in different namespaces never see each
//! other: each wins its own Lease and both attach. That is what a migration produces when the
//! Go sidecar ran with `--leader-election-namespace=kube-system` (or in its pod's namespace) and
//! attacher-hub elects in its own. The guard lists `external-attacher-leader-<driver>` in every
//! namespace (one LIST with a field selector on `metadata.name`, answered from the API server's
//! cache) and judges each foreign copy by client-go's rule: a Lease whose record changed less
//! than its lease duration ago, by our own clock, is held (a first sight counts as a change, so
//! a Lease left behind by a dead holder blocks for at most one lease duration). Two verdicts
//! follow:
//!
//! * a candidate about to take the Lease asks first ([`Guard::may_acquire`]): a held foreign
//!   Lease makes it stand by ([`View::allows_acquire`]);
//! * a leader steps down for a foreign Lease *seen renewing* (its record changed while the
//!   guard watched, [`View::renewing`]): a Lease merely left over from before never costs a
//!   working leader its term.
//!
//! It looks only when that can matter ([`Sightings::next_look`]): before an attempt to take the
//! Lease (a look less than a retry period old is reused), every lease duration while leading
//! (every retry period while a foreign Lease it has not yet seen renewing is live), and while
//! blocked, when the blocking Lease would expire. A standby candidate whose Lease another
//! replica holds never looks. So a hub costs the API server one LIST per led driver per lease
//! duration (4 a minute at the default 15 s), where a look every retry period for every driver
//! cost 12 a minute per driver. A leader that another attacher starts next to (one without a
//! guard, in another namespace) leads beside it for at most a lease duration plus a few retry
//! periods: the time to see it, then to see it renew.
//!
//! Without the RBAC for the cluster-wide list (`list` on `coordination.k8s.io` `leases` in all
//! namespaces) the guard says so ([`Verdict::Unavailable`]) and the candidate leads as it would
//! without a guard. A holder whose identity is our own is not foreign: it is this process under
//! an earlier configuration.
//!
//! The decisions are the pure [`Sightings`]; [`Guard`] is the shell that lists.

mod shell;
mod sightings;
mod view;

pub use shell::{Guard, REFUSED_LOOK_INTERVAL};
pub use sightings::Sightings;
pub use view::{Holder, LIST_GRANT, Verdict, View, advice};

/// What the tests of the parts share.
#[cfg(test)]
mod testing {
    use std::time::Duration;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    use super::Holder;
    use crate::leader::record::Record;

    pub(super) const LEASE: Duration = Duration::from_secs(15);

    pub(super) fn record(holder: &str, renewed: i64) -> Record {
        Record {
            holder: holder.into(),
            lease_duration_seconds: 15,
            renew_time: Some(MicroTime(Timestamp::constant(renewed, 0))),
            ..Record::default()
        }
    }

    pub(super) fn listed(items: &[(&str, Record)]) -> Vec<(String, Record)> {
        items
            .iter()
            .map(|(ns, r)| ((*ns).to_string(), r.clone()))
            .collect()
    }

    pub(super) fn holder(ns: &str, who: &str) -> Holder {
        Holder {
            namespace: ns.into(),
            holder: who.into(),
        }
    }

    pub(super) const PERIOD: Duration = Duration::from_secs(5);
}
