//! The shell: the guard of one driver, which lists the Leases of every namespace when a
//! decision asks for it, and publishes the view.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, api::ListParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use super::sightings::Sightings;
use super::view::{Verdict, View, advice, after_failure};
use crate::leader::record::Record;

/// Longest wait for one cluster-wide list; a slower answer counts as a failed check.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a leader whose list was refused (`403`: no grant) looks again, to notice a grant
/// added later. Refused, the guard sees nothing, so a look every lease duration would only
/// cost the API server a refused request per driver four times a minute.
pub const REFUSED_LOOK_INTERVAL: Duration = Duration::from_secs(300);

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
    api: Api<crate::leader::LeanLease>,
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
    /// Bumped whenever the view stops blocking (for [`crate::leader::AcquireGate::woken_by`]).
    opened: watch::Sender<u64>,
    /// Whether the candidate leads now (set by its election terms).
    leading: watch::Sender<bool>,
    /// LISTs made so far; each one may move the next look of [`Guard::run`].
    lists: watch::Sender<u64>,
    /// A leader's looks start on these lines, with the process's Lease renewals (`None`: when
    /// due).
    grid: Option<crate::leader::RenewGrid>,
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
        grid: Option<crate::leader::RenewGrid>,
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
            .filter_map(|crate::leader::LeanLease(l)| {
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
    use super::*;
    use crate::leader::guard::testing::{LEASE, PERIOD, holder, listed, record};

    /// With the process's renew grid, a leader's looks fall on its lines (at most a slot
    /// early), so that they go out with the renewals; a blocked candidate's do not move.
    #[tokio::test(start_paused = true)]
    async fn a_leaders_looks_fall_on_the_renew_grid() {
        let api = crate::fake_api::FakeApi::default();
        let t0 = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        let t1 = Instant::now();
        let guard = guard_with(&api, Some(crate::leader::RenewGrid::new(t0)));
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
        grid: Option<crate::leader::RenewGrid>,
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
