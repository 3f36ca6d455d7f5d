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

use std::collections::BTreeMap;
use std::sync::Arc;
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
use crate::api_error::{Grant, one_line};

/// Longest wait for one cluster-wide list; a slower answer counts as a failed check.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a leader whose list was refused (`403`: no grant) looks again, to notice a grant
/// added later. Refused, the guard sees nothing, so a look every lease duration would only
/// cost the API server a refused request per driver four times a minute.
pub const REFUSED_LOOK_INTERVAL: Duration = Duration::from_secs(300);

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

    /// The foreign Leases held by someone other than `identity`, each with the instant it
    /// expires by client-go's rule (its record's lease duration, `fallback` when it states none,
    /// after the record was first seen).
    fn held<'a>(
        &'a self,
        identity: &'a str,
        fallback: Duration,
    ) -> impl Iterator<Item = (&'a String, &'a Sighting, Instant)> + 'a {
        self.seen.iter().filter_map(move |(namespace, s)| {
            let holder = &s.record.holder;
            let duration = u64::try_from(s.record.lease_duration_seconds)
                .ok()
                .filter(|secs| *secs > 0)
                .map_or(fallback, Duration::from_secs);
            (!holder.is_empty() && holder != identity).then_some((namespace, s, s.at + duration))
        })
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
        self.held(identity, fallback)
            .find(|(_, s, expires)| *expires > now && (s.changed || !renewing))
            .map(|(namespace, s, _)| Holder {
                namespace: namespace.clone(),
                holder: s.record.holder.clone(),
            })
    }

    /// When the guard looks next on its own, without an attempt to take the Lease asking
    /// (`None`: not until one asks); `last` is its last look, `period` the retry period.
    ///
    /// * Leading: at once if it never looked, else a lease duration (`fallback`) after the last
    ///   look, or a retry period after it while a live foreign Lease has not been seen renewing
    ///   yet (so that a holder that renews is confirmed, and stepped down for, within a few
    ///   retry periods of being seen).
    /// * Not leading and blocked: when the first blocking Lease would expire (nothing unblocks
    ///   earlier), at least a retry period after the last look.
    /// * Otherwise: never; an attempt to take the Lease asks.
    pub fn next_look(
        &self,
        leading: bool,
        identity: &str,
        fallback: Duration,
        period: Duration,
        last: Option<Instant>,
        now: Instant,
    ) -> Option<Instant> {
        let live_at = |at: Instant| {
            self.held(identity, fallback)
                .filter(move |(_, _, expires)| *expires > at)
        };
        if leading {
            let Some(last) = last else {
                return Some(now);
            };
            let unconfirmed = live_at(now).any(|(_, s, _)| !s.changed);
            return Some(last + if unconfirmed { period } else { fallback });
        }
        // The Leases that blocked at the last look: the verdict stands until the first of them
        // expires (then a look is due, also if that instant has passed).
        let last = last?;
        let first_expiry = live_at(last).map(|(_, _, expires)| expires).min()?;
        Some(first_expiry.max(last + period))
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

/// The view after a failed look: a refused list makes the guard unavailable at once; any other
/// failure keeps the last view, unless every look has failed for `patience` since `since`.
fn after_failure(
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

// === the shell ==============================================================

/// What a [`Guard`] has seen and when it looked; one look at a time.
#[derive(Debug, Default)]
struct Looks {
    /// The foreign Leases seen.
    sightings: Sightings,
    /// The last look (successful or not).
    last: Option<Instant>,
    /// Since when every look failed (`None`: the last one worked, or none was made).
    failing_since: Option<Instant>,
    /// Whether the last look was refused (`403`).
    refused: bool,
}

/// The cross-namespace Lease guard of one driver for one connection: it looks (one LIST)
/// before the candidate tries to take the Lease ([`Guard::may_acquire`]), and on its own only
/// while the candidate leads or is blocked ([`Guard::run`]); see [`Sightings::next_look`] for
/// the cadence and what it costs.
#[derive(Debug)]
pub struct Guard {
    /// Leases in all namespaces (the leader-election client), read without managed fields.
    api: Api<super::LeanLease>,
    /// The Lease name.
    name: String,
    /// The candidate's own Lease namespace (not foreign).
    namespace: String,
    /// The candidate's identity (a Lease it holds is not foreign).
    identity: String,
    /// The retry period: how long a look stays fresh for an acquire attempt, and how soon a
    /// leader looks again at a foreign Lease it has not yet seen renewing.
    period: Duration,
    /// Lease duration for records that state none; how often a leader looks; how long failures
    /// may keep the first verdict pending.
    lease_duration: Duration,
    /// What it saw; held across a look, so that two askers share one LIST.
    looks: tokio::sync::Mutex<Looks>,
    /// The current view.
    view: watch::Sender<View>,
    /// Bumped whenever the view stops blocking (for [`super::AcquireGate::woken_by`]).
    opened: watch::Sender<u64>,
    /// Whether the candidate leads now (set by its election terms).
    leading: watch::Sender<bool>,
    /// LISTs made so far; each one may move the next look of [`Guard::run`].
    lists: watch::Sender<u64>,
    /// A leader's looks start on these lines, with the process's Lease renewals (`None`: when
    /// due).
    grid: Option<super::RenewGrid>,
}

impl Guard {
    /// A guard of Lease `name` for a candidate electing in `namespace` as `identity`, with the
    /// candidate's retry period and lease duration, and the renew grid of its elector.
    pub fn new(
        api: Api<Lease>,
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
        period: Duration,
        lease_duration: Duration,
        grid: Option<super::RenewGrid>,
    ) -> Arc<Self> {
        Arc::new(Guard {
            api: Api::all(api.into_client()),
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            period,
            lease_duration,
            looks: tokio::sync::Mutex::new(Looks::default()),
            view: watch::channel(View::pending()).0,
            opened: watch::channel(0).0,
            leading: watch::channel(false).0,
            lists: watch::channel(0).0,
            grid,
        })
    }

    /// The current view, and its changes.
    pub fn view(&self) -> watch::Receiver<View> {
        self.view.subscribe()
    }

    /// Changes whenever the view stops blocking (the value itself means nothing).
    pub fn opened(&self) -> watch::Receiver<u64> {
        self.opened.subscribe()
    }

    /// Tells the guard whether the candidate leads now: a leader is looked after on a timer.
    pub fn set_leading(&self, leading: bool) {
        self.leading
            .send_if_modified(|l| std::mem::replace(l, leading) != leading);
    }

    /// The LISTs made so far (what the guard costs the API server).
    pub fn lists(&self) -> u64 {
        *self.lists.borrow()
    }

    /// Asked before an attempt to take the Lease: whether no other holder keeps a Lease of the
    /// name in another namespace. Looks unless it looked less than a retry period ago.
    pub async fn may_acquire(&self) -> bool {
        let mut looks = self.looks.lock().await;
        let fresh = looks.last.is_some_and(|l| Instant::now() < l + self.period);
        let view = if fresh {
            self.view.borrow().clone()
        } else {
            self.look(&mut looks).await
        };
        view.allows_acquire()
    }

    /// Starts [`Guard::run`] in a task instrumented with the Lease. The caller keeps the handle
    /// and awaits or aborts it: a task nobody owns would go on after its driver stopped, and
    /// its panic would go unobserved.
    pub fn spawn(self: &Arc<Self>, stop: CancellationToken) -> JoinHandle<()> {
        // The driver (and so the Lease) comes from the caller's span.
        let span = tracing::info_span!("lease_guard");
        tokio::spawn(self.clone().run(stop).instrument(span))
    }

    /// Looks on its own when [`Sightings::next_look`] says so (while leading, or blocked), until
    /// `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut leading = self.leading.subscribe();
        let mut looked = self.lists.subscribe();
        loop {
            let due = {
                let looks = self.looks.lock().await;
                looked.mark_unchanged();
                self.next_look(&looks, *leading.borrow_and_update())
            };
            let wait = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                _ = leading.changed() => continue,
                _ = looked.changed() => continue,
                () = wait => {}
            }
            let mut looks = self.looks.lock().await;
            // An acquire attempt may have looked meanwhile.
            if self
                .next_look(&looks, *self.leading.borrow())
                .is_some_and(|at| at <= Instant::now())
            {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = self.look(&mut looks) => {}
                }
            }
        }
    }

    /// When the next look is due; a leader's on the grid's last line at or before it, so that
    /// it goes out with the renewals due there. A leader whose last look was refused looks
    /// again after [`REFUSED_LOOK_INTERVAL`].
    fn next_look(&self, looks: &Looks, leading: bool) -> Option<Instant> {
        let due = match looks.last {
            Some(last) if leading && looks.refused => last + REFUSED_LOOK_INTERVAL,
            _ => looks.sightings.next_look(
                leading,
                &self.identity,
                self.lease_duration,
                self.period,
                looks.last,
                Instant::now(),
            )?,
        };
        Some(match self.grid {
            Some(grid) if leading => grid.at_or_before(due, self.period),
            _ => due,
        })
    }

    /// One look: lists the Leases of the name, judges them and publishes the view.
    async fn look(&self, looks: &mut Looks) -> View {
        let now = Instant::now();
        let previous = self.view.borrow().clone();
        let next = match self.list().await {
            Ok(listed) => {
                looks.failing_since = None;
                looks.refused = false;
                looks.sightings.observe(listed, now);
                looks
                    .sightings
                    .view(&self.identity, self.lease_duration, Instant::now())
            }
            Err(e) => {
                let since = *looks.failing_since.get_or_insert(now);
                looks.refused = matches!(&e, kube::Error::Api(s) if s.code == 403);
                after_failure(&previous, &e, since, self.lease_duration, now)
            }
        };
        looks.last = Some(Instant::now());
        self.lists.send_modify(|n| *n += 1);
        self.report(&previous, &next);
        let opens = previous.blocked_by().is_some() && next.blocked_by().is_none();
        self.view.send_if_modified(|v| {
            let changed = *v != next;
            *v = next.clone();
            changed
        });
        if opens {
            self.opened.send_modify(|n| *n = n.wrapping_add(1));
        }
        next
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
            .filter_map(|super::LeanLease(l)| {
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

    const PERIOD: Duration = Duration::from_secs(5);

    /// With the process's renew grid, a leader's looks fall on its lines (at most a slot
    /// early), so that they go out with the renewals; a blocked candidate's do not move.
    #[tokio::test(start_paused = true)]
    async fn a_leaders_looks_fall_on_the_renew_grid() {
        let api = crate::fake_api::FakeApi::default();
        let t0 = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        let t1 = Instant::now();
        let guard = guard_with(&api, Some(super::super::RenewGrid::new(t0)));
        let mut looks = Looks::default();
        looks.sightings.observe(Vec::new(), t1);
        looks.last = Some(t1);
        // Due at t1 + 15 s = t0 + 15.3 s: on the line at t0 + 15 s.
        assert_eq!(guard.next_look(&looks, true), Some(t0 + LEASE));
        // Refused: five minutes on (on the grid), not a lease duration.
        looks.refused = true;
        assert_eq!(
            guard.next_look(&looks, true),
            Some(t0 + REFUSED_LOOK_INTERVAL)
        );
        looks.refused = false;
        // Blocked by a live foreign Lease: at its expiry, off the grid.
        looks
            .sightings
            .observe(listed(&[("kube-system", record("go-1", 100))]), t1);
        let blocked = looks
            .sightings
            .next_look(false, "hub-1", LEASE, PERIOD, Some(t1), t1);
        assert!(blocked.is_some());
        assert_eq!(guard.next_look(&looks, false), blocked);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_looks_every_lease_duration_and_every_retry_period_at_an_unconfirmed_lease() {
        let mut s = Sightings::default();
        let t0 = Instant::now();
        // Leading, never looked: at once.
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, None, t0),
            Some(t0)
        );
        // Nothing foreign: a lease duration on.
        s.observe(Vec::new(), t0);
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + LEASE)
        );
        // A foreign holder seen once (a leftover, or a newcomer): a retry period on, to see
        // whether it renews.
        s.observe(listed(&[("kube-system", record("go-1", 100))]), t0);
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + PERIOD)
        );
        // Seen renewing: the leader steps down; while it leads, a lease duration on.
        tokio::time::advance(PERIOD).await;
        let t1 = Instant::now();
        s.observe(listed(&[("kube-system", record("go-1", 105))]), t1);
        assert!(s.renewing("hub-1", LEASE, t1).is_some());
        assert_eq!(
            s.next_look(true, "hub-1", LEASE, PERIOD, Some(t1), t1),
            Some(t1 + LEASE)
        );
        // Our own or a vacant Lease elsewhere is nothing to confirm.
        let mut own = Sightings::default();
        own.observe(
            listed(&[("a", record("hub-1", 1)), ("b", record("", 1))]),
            t1,
        );
        assert_eq!(
            own.next_look(true, "hub-1", LEASE, PERIOD, Some(t1), t1),
            Some(t1 + LEASE)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_candidate_looks_only_when_asked_or_when_what_blocks_it_expires() {
        let mut s = Sightings::default();
        let t0 = Instant::now();
        assert_eq!(s.next_look(false, "hub-1", LEASE, PERIOD, None, t0), None);
        s.observe(Vec::new(), t0);
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), t0),
            None
        );
        // Blocked: when the blocking Lease would expire.
        s.observe(listed(&[("kube-system", record("go-1", 100))]), t0);
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + LEASE)
        );
        // A Lease stating a short duration: not sooner than a retry period after the last look.
        let mut short = record("go-2", 100);
        short.lease_duration_seconds = 1;
        s.observe(listed(&[("b", short)]), t0);
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), t0),
            Some(t0 + PERIOD)
        );
        // Expired since the last look: due (the verdict is stale); once a look has seen it
        // expired, nothing to wait for.
        tokio::time::advance(LEASE).await;
        let now = Instant::now();
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(t0), now),
            Some(t0 + PERIOD)
        );
        assert_eq!(
            s.next_look(false, "hub-1", LEASE, PERIOD, Some(now), now),
            None
        );
    }

    fn stored_lease(namespace: &str, holder: &str, renewed: i64) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some("external-attacher-leader-d".into());
        lease.metadata.namespace = Some(namespace.into());
        lease.spec = Some(record(holder, renewed).to_spec());
        lease
    }

    fn guard_on(api: &crate::fake_api::FakeApi) -> Arc<Guard> {
        guard_with(api, None)
    }

    fn guard_with(
        api: &crate::fake_api::FakeApi,
        grid: Option<super::super::RenewGrid>,
    ) -> Arc<Guard> {
        Guard::new(
            Api::all(api.client()),
            "external-attacher-leader-d",
            "attacher-hub",
            "hub-1",
            PERIOD,
            LEASE,
            grid,
        )
    }

    /// What the guard costs: a standby candidate whose Lease another replica holds never
    /// lists; an attempt to take the Lease lists once (a second attempt within a retry period
    /// reuses the look); a leader lists once per lease duration, where a look every retry
    /// period cost three times as much.
    #[tokio::test(start_paused = true)]
    async fn the_guard_lists_before_taking_the_lease_and_once_per_lease_duration_while_leading() {
        let api = crate::fake_api::FakeApi::default();
        api.put(&stored_lease("attacher-hub", "hub-2", 1));
        let guard = guard_on(&api);
        let stop = CancellationToken::new();
        let task = guard.spawn(stop.clone());
        tokio::time::sleep(LEASE * 4).await;
        assert_eq!(
            guard.lists(),
            0,
            "a standby candidate that does not try never looks"
        );

        assert!(guard.may_acquire().await);
        assert!(guard.may_acquire().await);
        assert_eq!(guard.lists(), 1, "a second attempt reuses a fresh look");
        assert_eq!(
            *guard.view().borrow(),
            View {
                verdict: Verdict::Clear,
                renewing: None
            }
        );

        guard.set_leading(true);
        tokio::time::sleep(LEASE * 4 + Duration::from_millis(100)).await;
        assert_eq!(
            guard.lists(),
            1 + 4,
            "one look per lease duration while leading"
        );
        guard.set_leading(false);
        tokio::time::sleep(LEASE * 4).await;
        assert_eq!(guard.lists(), 5);
        stop.cancel();
        task.await.expect("the guard ends on stop");
    }

    /// A holder in another namespace blocks an attempt to take the Lease; the guard then looks
    /// when that Lease would expire, and lets the candidate try again once it has.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_candidate_is_let_go_when_the_other_lease_expires() {
        let api = crate::fake_api::FakeApi::default();
        api.put(&stored_lease("kube-system", "go-1", 1));
        let guard = guard_on(&api);
        let mut opened = guard.opened();
        let stop = CancellationToken::new();
        let task = guard.spawn(stop.clone());
        assert!(!guard.may_acquire().await);
        assert_eq!(
            guard.view().borrow().blocked_by(),
            Some(&holder("kube-system", "go-1"))
        );
        let blocked = Instant::now();
        opened.changed().await.expect("the guard opens");
        assert!(blocked.elapsed() >= LEASE && blocked.elapsed() < LEASE + PERIOD);
        assert_eq!(guard.view().borrow().verdict, Verdict::Clear);
        assert_eq!(guard.lists(), 2);
        assert!(guard.may_acquire().await);
        stop.cancel();
        task.await.expect("the guard ends on stop");
    }
}
