//! The cross-namespace Lease guard: before a candidate leads a driver, it looks for Leases of the
//! same name in *other* namespaces, and while another holder keeps such a Lease alive it does not
//! lead.
//!
//! Two attachers of one driver that elect on Leases in different namespaces never see each
//! other: each wins its own Lease and both attach. That is what a migration produces when the
//! Go sidecar ran with `--leader-election-namespace=kube-system` (or in its pod's namespace) and
//! attacher-hub elects in its own. The guard lists `external-attacher-leader-<driver>` in every
//! namespace (one LIST with a field selector on `metadata.name`, answered from the API server's
//! cache) every retry period and judges each foreign copy by client-go's rule: a Lease whose
//! record changed less than its lease duration ago, by our own clock, is held (a first sight
//! counts as a change, so a Lease left behind by a dead holder blocks for at most one lease
//! duration). Two verdicts follow:
//!
//! * while not leading, a held foreign Lease closes the acquire gate ([`View::allows_acquire`]);
//! * while leading, a foreign Lease *seen renewing* (its record changed while the guard watched)
//!   asks the leader to step down ([`View::renewing`]): a Lease merely left over from before
//!   never costs a working leader its term.
//!
//! Without the RBAC for the cluster-wide list (`list` on `coordination.k8s.io` `leases` in all
//! namespaces) the guard says so ([`Verdict::Unavailable`]) and the candidate leads as it would
//! without a guard. A holder whose identity is our own is not foreign: it is this process under
//! an earlier configuration.
//!
//! The decisions are the pure [`Sightings`]; [`Guard`] is the polling shell.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::ListParams};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use super::record::Record;
use crate::telemetry::error_with_root_cause;

/// Longest wait for one cluster-wide list; a slower answer counts as a failed check.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// The ClusterRole (kustomize component and Helm value) that grants the cluster-wide list.
pub const GRANT_HINT: &str = "grant `list` on coordination.k8s.io leases in all namespaces (deploy/components/lease-guard, or the chart's rbac.leaseGuard=true)";

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
    /// No check has completed yet: do not acquire.
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

// === decisions ==============================================================

/// One foreign Lease as the guard saw it.
#[derive(Clone, Debug)]
struct Sighting {
    /// The record last seen.
    record: Record,
    /// When that record was first seen (client-go `observedTime`).
    at: Instant,
    /// Whether the record changed while the guard watched it (a renewal seen happening).
    changed: bool,
}

/// What the guard has seen of the driver's Lease in other namespaces.
#[derive(Clone, Debug, Default)]
pub struct Sightings {
    /// By namespace.
    seen: BTreeMap<String, Sighting>,
}

impl Sightings {
    /// Takes in one list of the foreign Leases (namespace and record; the candidate's own
    /// namespace left out by the caller), seen at `now`. A namespace no longer listed (its Lease
    /// deleted) is forgotten.
    pub(crate) fn observe(&mut self, listed: Vec<(String, Record)>, now: Instant) {
        let mut next = BTreeMap::new();
        for (namespace, record) in listed {
            let sighting = match self.seen.remove(&namespace) {
                Some(s) if s.record == record => s,
                Some(_) => Sighting {
                    record,
                    at: now,
                    changed: true,
                },
                None => Sighting {
                    record,
                    at: now,
                    changed: false,
                },
            };
            next.insert(namespace, sighting);
        }
        self.seen = next;
    }

    /// The first (by namespace) foreign Lease held by someone other than `identity` whose
    /// record changed less than its lease duration ago (`fallback` when it states none); with
    /// `renewing`, only one seen changing.
    fn find(
        &self,
        identity: &str,
        fallback: Duration,
        now: Instant,
        renewing: bool,
    ) -> Option<Holder> {
        self.seen.iter().find_map(|(namespace, s)| {
            let holder = &s.record.holder;
            let duration = u64::try_from(s.record.lease_duration_seconds)
                .ok()
                .filter(|secs| *secs > 0)
                .map_or(fallback, Duration::from_secs);
            let held = !holder.is_empty() && holder != identity && s.at + duration > now;
            (held && (s.changed || !renewing)).then(|| Holder {
                namespace: namespace.clone(),
                holder: holder.clone(),
            })
        })
    }

    /// The holder that keeps a candidate (not leading) from acquiring: a foreign Lease held by
    /// someone else, by client-go's rule.
    pub fn live(&self, identity: &str, fallback: Duration, now: Instant) -> Option<Holder> {
        self.find(identity, fallback, now, false)
    }

    /// The holder a leader steps down for: as [`Sightings::live`], and seen renewing.
    pub fn renewing(&self, identity: &str, fallback: Duration, now: Instant) -> Option<Holder> {
        self.find(identity, fallback, now, true)
    }

    /// The view after a successful check.
    pub fn view(&self, identity: &str, fallback: Duration, now: Instant) -> View {
        View {
            verdict: match self.live(identity, fallback, now) {
                Some(holder) => Verdict::Blocked { holder },
                None => Verdict::Clear,
            },
            renewing: self.renewing(identity, fallback, now),
        }
    }
}

/// The view after a failed check: a refused list makes the guard unavailable at once; any other
/// failure keeps the last view, unless no check has succeeded for `patience` since `since`.
fn after_failure(
    previous: &View,
    error: &kube::Error,
    since: Instant,
    patience: Duration,
    now: Instant,
) -> View {
    let forbidden = matches!(error, kube::Error::Api(s) if s.code == 403);
    if forbidden {
        return View {
            verdict: Verdict::Unavailable {
                reason: format!(
                    "cannot list Leases in all namespaces ({}); the guard against another attacher leading this driver from another namespace is off: {GRANT_HINT}",
                    error_with_root_cause(error)
                ),
            },
            renewing: None,
        };
    }
    if previous.verdict == Verdict::Pending && now >= since + patience {
        return View {
            verdict: Verdict::Unavailable {
                reason: format!(
                    "listing Leases in all namespaces keeps failing ({}); the guard is off until it works",
                    error_with_root_cause(error)
                ),
            },
            renewing: None,
        };
    }
    previous.clone()
}

// === the polling shell ======================================================

/// A running [`Guard`].
#[derive(Debug)]
pub struct Running {
    /// The current view.
    pub view: watch::Receiver<View>,
    /// Bumped whenever the view starts allowing acquisition (for [`super::AcquireGate::woken_by`]).
    pub opened: watch::Receiver<u64>,
    /// The polling task; it ends when the stop token is cancelled.
    pub task: JoinHandle<()>,
}

/// Polls the Leases of one name in every namespace and publishes a [`View`].
#[derive(Debug)]
pub struct Guard {
    /// Leases in all namespaces (the leader-election client).
    api: Api<Lease>,
    /// The Lease name.
    name: String,
    /// The candidate's own Lease namespace (not foreign).
    namespace: String,
    /// The candidate's identity (a Lease it holds is not foreign).
    identity: String,
    /// Time between checks: the retry period.
    period: Duration,
    /// Lease duration for records that state none; also how long failures may keep the first
    /// verdict pending.
    lease_duration: Duration,
}

impl Guard {
    /// A guard of Lease `name` for a candidate electing in `namespace` as `identity`.
    pub fn new(
        api: Api<Lease>,
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
        period: Duration,
        lease_duration: Duration,
    ) -> Self {
        Guard {
            api,
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            period,
            lease_duration,
        }
    }

    /// Checks at once, then every period, until `stop`. Own the task (STYLE rule 9).
    pub fn spawn(self, stop: CancellationToken) -> Running {
        let (tx, view) = watch::channel(View::pending());
        let (opened_tx, opened) = watch::channel(0u64);
        let span =
            tracing::info_span!("lease_guard", lease = %self.name, namespace = %self.namespace);
        Running {
            view,
            opened,
            task: tokio::spawn(self.run(tx, opened_tx, stop).instrument(span)),
        }
    }

    async fn run(
        self,
        tx: watch::Sender<View>,
        opened: watch::Sender<u64>,
        stop: CancellationToken,
    ) {
        let started = Instant::now();
        let mut sightings = Sightings::default();
        loop {
            let now = Instant::now();
            let previous = tx.borrow().clone();
            let listed = tokio::select! {
                () = stop.cancelled() => return,
                listed = self.list() => listed,
            };
            let next = match listed {
                Ok(listed) => {
                    sightings.observe(listed, now);
                    sightings.view(&self.identity, self.lease_duration, Instant::now())
                }
                Err(e) => after_failure(&previous, &e, started, self.lease_duration, now),
            };
            self.report(&previous, &next);
            let opens = !previous.allows_acquire() && next.allows_acquire();
            tx.send_if_modified(|v| {
                let changed = *v != next;
                *v = next;
                changed
            });
            if opens {
                opened.send_modify(|n| *n = n.wrapping_add(1));
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.period) => {}
            }
        }
    }

    /// The foreign Leases of the name: namespace and record.
    async fn list(&self) -> Result<Vec<(String, Record)>, kube::Error> {
        let params = ListParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .match_any();
        let leases = tokio::time::timeout(LIST_TIMEOUT, self.api.list(&params))
            .await
            .map_err(|_| {
                kube::Error::Service(format!("no answer within {LIST_TIMEOUT:?}").into())
            })??;
        Ok(leases
            .items
            .into_iter()
            .filter_map(|l| {
                let ns = l.metadata.namespace.clone()?;
                (ns != self.namespace).then(|| (ns, Record::from_spec(l.spec.as_ref())))
            })
            .collect())
    }

    /// Logs a change of verdict: the namespace, the holder and the fix.
    fn report(&self, previous: &View, next: &View) {
        if previous.verdict == next.verdict {
            return;
        }
        match &next.verdict {
            Verdict::Blocked { holder } => warn!(
                other_namespace = %holder.namespace,
                holder = %holder.holder,
                "not leading: {}",
                advice(&self.name, &self.namespace, holder)
            ),
            Verdict::Clear => match previous.blocked_by() {
                Some(h) => info!(
                    other_namespace = %h.namespace,
                    "the Lease {} in namespace {} is no longer renewed; leading is allowed again",
                    self.name, h.namespace
                ),
                None => info!("no other namespace holds the Lease {}", self.name),
            },
            Verdict::Unavailable { reason } => warn!("lease guard unavailable: {reason}"),
            Verdict::Pending => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn record(holder: &str, renewed: i64) -> Record {
        Record {
            holder: holder.into(),
            lease_duration_seconds: 15,
            renew_time: Some(MicroTime(Timestamp::constant(renewed, 0))),
            ..Record::default()
        }
    }

    fn listed(items: &[(&str, Record)]) -> Vec<(String, Record)> {
        items
            .iter()
            .map(|(ns, r)| ((*ns).to_string(), r.clone()))
            .collect()
    }

    fn holder(ns: &str, who: &str) -> Holder {
        Holder {
            namespace: ns.into(),
            holder: who.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_foreign_lease_seen_for_the_first_time_blocks_for_one_lease_duration() {
        let mut s = Sightings::default();
        let t0 = Instant::now();
        s.observe(listed(&[("kube-system", record("go-1", 100))]), t0);
        let v = s.view("hub-1", LEASE, t0);
        assert_eq!(
            v.verdict,
            Verdict::Blocked {
                holder: holder("kube-system", "go-1")
            }
        );
        assert!(!v.allows_acquire());
        // Not seen renewing: a leader would not step down for a leftover.
        assert_eq!(v.renewing, None);
        // Never renewed: expired a lease duration after it was first seen.
        tokio::time::advance(LEASE).await;
        s.observe(
            listed(&[("kube-system", record("go-1", 100))]),
            Instant::now(),
        );
        assert_eq!(
            s.view("hub-1", LEASE, Instant::now()).verdict,
            Verdict::Clear
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewing_holder_blocks_and_makes_a_leader_step_down_until_it_stops() {
        let mut s = Sightings::default();
        s.observe(
            listed(&[("kube-system", record("go-1", 100))]),
            Instant::now(),
        );
        for renewed in [102, 104, 106, 108, 110, 112, 114, 116, 118] {
            tokio::time::advance(Duration::from_secs(2)).await;
            s.observe(
                listed(&[("kube-system", record("go-1", renewed))]),
                Instant::now(),
            );
            let v = s.view("hub-1", LEASE, Instant::now());
            assert_eq!(v.blocked_by(), Some(&holder("kube-system", "go-1")));
            assert_eq!(v.renewing, Some(holder("kube-system", "go-1")));
        }
        // The holder stops renewing (killed): blocked until its lease duration has passed.
        tokio::time::advance(LEASE - Duration::from_secs(1)).await;
        s.observe(
            listed(&[("kube-system", record("go-1", 118))]),
            Instant::now(),
        );
        assert!(!s.view("hub-1", LEASE, Instant::now()).allows_acquire());
        tokio::time::advance(Duration::from_secs(1)).await;
        s.observe(
            listed(&[("kube-system", record("go-1", 118))]),
            Instant::now(),
        );
        let v = s.view("hub-1", LEASE, Instant::now());
        assert_eq!((v.verdict, v.renewing), (Verdict::Clear, None));
    }

    #[tokio::test(start_paused = true)]
    async fn vacant_deleted_and_own_leases_never_block() {
        let mut s = Sightings::default();
        let now = Instant::now();
        // Released (client-go writes an empty holder) or held by this very process.
        s.observe(
            listed(&[("a", record("", 100)), ("b", record("hub-1", 100))]),
            now,
        );
        assert_eq!(s.view("hub-1", LEASE, now).verdict, Verdict::Clear);
        // A held one that is then deleted is forgotten at once.
        s.observe(listed(&[("c", record("go-1", 100))]), now);
        assert!(!s.view("hub-1", LEASE, now).allows_acquire());
        s.observe(Vec::new(), now);
        assert_eq!(s.view("hub-1", LEASE, now).verdict, Verdict::Clear);
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_own_lease_duration_decides_and_the_first_namespace_is_reported() {
        let mut s = Sightings::default();
        let mut short = record("go-1", 100);
        short.lease_duration_seconds = 4;
        let mut unstated = record("go-2", 100);
        unstated.lease_duration_seconds = 0;
        s.observe(listed(&[("b", short), ("c", unstated)]), Instant::now());
        assert_eq!(
            s.view("hub-1", LEASE, Instant::now()).blocked_by(),
            Some(&holder("b", "go-1"))
        );
        // b's 4 s have passed; c states no duration, so the fallback (15 s) holds.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            s.view("hub-1", LEASE, Instant::now()).blocked_by(),
            Some(&holder("c", "go-2"))
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(s.view("hub-1", LEASE, Instant::now()).allows_acquire());
    }

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
        assert!(
            reason.contains("cannot list Leases in all namespaces"),
            "{reason}"
        );
        assert!(reason.contains("deploy/components/lease-guard"), "{reason}");
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
