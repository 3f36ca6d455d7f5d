//! What the guard publishes: the verdict for a candidate, the holder a leader steps down for,
//! what is said about a blocked driver, and the view after a failed look.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::api_error::{Grant, one_line};

/// The grant the guard needs, and the ClusterRole (kustomize component and Helm value) that
/// gives it.
pub const LIST_GRANT: Grant<'static> = Grant {
    verb: "list",
    resource: "leases.coordination.k8s.io",
    namespace: None,
    granted_by: "add deploy/components/lease-guard (chart: rbac.leaseGuard=true)",
};

/// Another holder of the driver's Lease name, in another namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Namespace of that Lease.
    pub namespace: String,
    /// Its `holderIdentity`.
    pub holder: String,
}

/// What the guard allows a candidate that does not lead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Verdict {
    /// No look has completed yet (a standby candidate whose Lease another replica holds never
    /// needs one): it looks before an attempt to take the Lease, and until a look works, does
    /// not take it.
    Pending,
    /// No other namespace holds a Lease of this name: acquire as usual.
    Clear,
    /// Another holder keeps a Lease of this name in another namespace: do not acquire.
    Blocked {
        /// Who, and where.
        #[serde(flatten)]
        holder: Holder,
    },
    /// The guard cannot look (no RBAC for the list, or the list keeps failing): acquire as
    /// usual, and say so.
    Unavailable {
        /// Why.
        reason: String,
    },
}

/// What the guard publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// For a candidate that does not lead.
    pub verdict: Verdict,
    /// For a leader: a holder in another namespace seen renewing its Lease, to step down for.
    pub renewing: Option<Holder>,
}

impl View {
    /// The view before the first check.
    pub fn pending() -> Self {
        View {
            verdict: Verdict::Pending,
            renewing: None,
        }
    }

    /// Whether a candidate that does not lead may try to acquire the Lease.
    pub fn allows_acquire(&self) -> bool {
        matches!(self.verdict, Verdict::Clear | Verdict::Unavailable { .. })
    }

    /// The holder that blocks this candidate, if any.
    pub fn blocked_by(&self) -> Option<&Holder> {
        match &self.verdict {
            Verdict::Blocked { holder } => Some(holder),
            _ => None,
        }
    }
}

/// What a log line, `/drivers` and `attacher-hub status` say about a blocked driver: the other
/// Lease, its holder, and the fix.
pub fn advice(lease: &str, own_namespace: &str, h: &Holder) -> String {
    format!(
        "the Lease {lease} in namespace {ns} is held and renewed by {holder}, so this hub (Lease in namespace {own_namespace}) does not lead the driver; \
         if {holder} is the driver's external-attacher, set leaderElection.namespace: {ns} for this driver in drivers.yaml \
         (or --leader-election-namespace={ns}) so that both contend for one Lease, otherwise stop that attacher",
        ns = h.namespace,
        holder = h.holder,
    )
}

/// The view after a failed look: a refused list makes the guard unavailable at once; any other
/// failure keeps the last view, unless every look has failed for `patience` since `since`.
pub(super) fn after_failure(
    previous: &View,
    error: &kube::Error,
    since: Instant,
    patience: Duration,
    now: Instant,
) -> View {
    let forbidden = matches!(error, kube::Error::Api(s) if s.code == 403);
    if forbidden {
        // The refusal names the grant and what gives it; "lease guard unavailable" in front of
        // it (status note, log line) says what it costs.
        return View {
            verdict: Verdict::Unavailable {
                reason: one_line(error, Some(&LIST_GRANT)),
            },
            renewing: None,
        };
    }
    if previous.verdict == Verdict::Pending && now >= since + patience {
        return View {
            verdict: Verdict::Unavailable {
                reason: format!(
                    "listing Leases in all namespaces keeps failing ({}); the guard is off until it works",
                    one_line(error, Some(&LIST_GRANT))
                ),
            },
            renewing: None,
        };
    }
    previous.clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::guard::testing::{LEASE, holder};

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("leases is forbidden", "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_list_turns_the_guard_off_saying_how_to_grant_it() {
        let start = Instant::now();
        let v = after_failure(&View::pending(), &api_error(403), start, LEASE, start);
        assert!(v.allows_acquire());
        let Verdict::Unavailable { reason } = &v.verdict else {
            panic!("{v:?}")
        };
        assert_eq!(
            reason,
            "403 Forbidden: no grant to list leases.coordination.k8s.io cluster-wide; add deploy/components/lease-guard (chart: rbac.leaseGuard=true)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn other_failures_keep_the_last_view_and_give_up_waiting_after_a_lease_duration() {
        let start = Instant::now();
        let blocked = View {
            verdict: Verdict::Blocked {
                holder: holder("kube-system", "go-1"),
            },
            renewing: None,
        };
        assert_eq!(
            after_failure(&blocked, &api_error(500), start, LEASE, start + LEASE * 2),
            blocked
        );
        // Pending (no check succeeded) stays pending for a lease duration...
        assert_eq!(
            after_failure(&View::pending(), &api_error(500), start, LEASE, start),
            View::pending()
        );
        // ... then lets the candidate lead as it would without a guard.
        assert!(
            after_failure(
                &View::pending(),
                &api_error(500),
                start,
                LEASE,
                start + LEASE
            )
            .allows_acquire()
        );
    }

    #[test]
    fn the_advice_names_the_namespace_the_holder_and_the_fix() {
        let text = advice(
            "external-attacher-leader-pd-csi-storage-gke-io",
            "attacher-hub",
            &holder("kube-system", "csi-gce-pd-controller-0"),
        );
        for needle in [
            "external-attacher-leader-pd-csi-storage-gke-io",
            "namespace kube-system",
            "csi-gce-pd-controller-0",
            "namespace attacher-hub",
            "leaderElection.namespace: kube-system",
            "--leader-election-namespace=kube-system",
        ] {
            assert!(text.contains(needle), "{needle} missing from: {text}");
        }
    }
}
