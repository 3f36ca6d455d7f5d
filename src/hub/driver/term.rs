//! One election term of a driver: stand for its Lease (if it has leader election, and only while
//! the cross-namespace Lease guard allows it), run the workers while leading, and end on stop,
//! connection loss, a lost Lease, a hand-over or a step-down for a holder in another namespace,
//! in two phases (drain the work, then vacate the Lease). The term is a loop over the decisions
//! of `term_course`: each step it takes is a function here that does one thing.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    Driver, State,
    context::Shared,
    term_course::{Course, Follow, Next, Woke, stands_by_after},
    workers::Workers,
};
use crate::{
    config::LeaderSettings,
    controller::Handler,
    leader::{self, AcquireGate, LeaderElector, Leadership, guard},
};

/// How one election term ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Term {
    /// The driver's life ends (stop, connection loss, failure).
    Over(Outcome),
    /// The Lease was handed to another replica; stand again.
    HandedOver,
    /// Another holder renews a Lease of the driver's name in another namespace: this replica
    /// stepped down (the cross-namespace Lease guard); stand again after a pause.
    Yielded(guard::Holder),
}

/// The cross-namespace Lease guard as one term sees it.
pub(super) struct GuardFeed {
    /// The connection's guard.
    pub(super) guard: Arc<guard::Guard>,
    /// Its view.
    pub(super) view: watch::Receiver<guard::View>,
}

/// What a term changes in what the driver shares while it leads, undone when the term ends,
/// however it ends: also when the driver's task panics and the term's future is dropped
/// mid-way (then nothing else would give the balance its count back or clear the leader
/// metric).
struct Held<'a> {
    driver: &'a Driver,
    shared: &'a Shared,
    name: &'a str,
    /// Counted in the replica's share of Leases (leader election with balancing).
    balanced: bool,
    /// The connection's guard, told whether we lead.
    guard: Option<Arc<guard::Guard>>,
    /// Whether the term leads now.
    leading: bool,
}

impl Held<'_> {
    fn lead(&mut self) {
        if std::mem::replace(&mut self.leading, true) {
            return;
        }
        self.driver.set_state(State::Leading);
        self.shared.metrics.set_leader(self.name, true);
        if self.balanced {
            self.shared.balance.set_leading(true);
        }
        if let Some(g) = &self.guard {
            g.set_leading(true);
        }
    }

    fn unlead(&mut self) {
        if !std::mem::replace(&mut self.leading, false) {
            return;
        }
        *self.driver.handler.write() = None;
        if self.balanced {
            self.shared.balance.set_leading(false);
        }
        if let Some(g) = &self.guard {
            g.set_leading(false);
        }
        self.shared.metrics.set_leader(self.name, false);
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.unlead();
        self.shared.leader_status.remove(self.name);
        self.shared.metrics.set_leader(self.name, false);
    }
}

/// How one life of a driver ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Stopped,
    ConnectionLost,
    Failed(String),
}

/// A term's elector: its view of the leadership, and its task (ended when dropped).
type Election = (
    watch::Receiver<Leadership>,
    leader::runner::Handle<leader::Result<()>>,
);

impl Driver {
    /// One term of the election: from candidacy to stop, loss, hand-over, or a step-down for a
    /// holder of the driver's Lease in another namespace (`guard`: the connection's
    /// cross-namespace Lease guard, with leader election).
    pub(super) async fn serve_term(
        self: Arc<Self>,
        shared: &Arc<Shared>,
        stop: &CancellationToken,
        name: &str,
        handler: &Arc<Handler>,
        losses: &mut watch::Receiver<u64>,
        mut guard: Option<&mut GuardFeed>,
    ) -> Term {
        let election = CancellationToken::new();
        let (mut leadership, election_task) = match &self.settings.leader_election {
            None => (leading_for_good(), None),
            Some(le) => match self.stand(shared, name, le, guard.as_deref(), &election) {
                Ok((rx, task)) => (rx, Some(task)),
                Err(e) => return Term::Over(Outcome::Failed(format!("leader election: {e}"))),
            },
        };
        let course = Course {
            elected: election_task.is_some(),
        };
        // A hand-over asked during an earlier term (or while this one stood by) is not for it.
        self.hand_over.send_replace(false);
        let mut hand_over = self.hand_over.subscribe();
        let mut held = Held {
            driver: &self,
            shared,
            name,
            balanced: course.elected,
            guard: guard.as_ref().map(|g| g.guard.clone()),
            leading: false,
        };

        let mut workers: Option<Workers> = None;
        let term = loop {
            let leading = leadership.borrow_and_update().clone();
            let step = course.follow(&leading, workers.is_some());
            self.follow(step, &mut held, &mut workers, shared, handler)
                .await;
            if course.shows_elected_holder(&leading) {
                self.info.write().lease_holder =
                    shared.leader_status.get(name).and_then(|s| s.holder());
            }
            let renewing = guard
                .as_ref()
                .and_then(|g| g.view.borrow().renewing.clone());
            if let Some(h) = course.steps_down_for(workers.is_some(), renewing) {
                self.warn_stepping_down(&h);
                break Term::Yielded(h);
            }
            let hears_hand_over = course.hears_hand_over(workers.is_some());
            let guard_view = guard.as_mut().map(|g| &mut g.view);
            let woke = wait(
                stop,
                losses,
                guard_view,
                &mut hand_over,
                &mut leadership,
                hears_hand_over,
            )
            .await;
            match course.on_wake(woke) {
                Next::Look => {}
                Next::End(term) => break term,
                Next::Idle => break Term::Over(stop_or_loss(stop, losses).await),
            }
        };

        // Phase 1: stop taking work; let in-flight calls finish within a bound.
        self.drain(workers.take(), &mut held).await;
        // Phase 2: vacate the Lease so the next leader starts at once.
        vacate(&election, election_task).await;
        drop(held);
        self.close_term(&term);
        term
    }

    /// Stands for the driver's Lease: an elector in the hub's election task, which acquires
    /// only within this replica's share and while the guard allows, and is ended by `election`.
    fn stand(
        &self,
        shared: &Arc<Shared>,
        name: &str,
        le: &LeaderSettings,
        guard: Option<&GuardFeed>,
        election: &CancellationToken,
    ) -> leader::Result<Election> {
        let lease = crate::names::lease_name(name);
        self.info.write().lease = Some(lease.clone());
        let config = elector_config(lease.clone(), le);
        let api = Api::<Lease>::namespaced(shared.leader_client.clone(), &le.namespace);
        let elector = LeaderElector::new(api, config)?;
        let feed = shared
            .lease_feeds
            .entry(lease)
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        let mut elector = elector
            .with_acquire_gate(acquire_gate(shared, guard))
            .with_feed(feed)
            .with_renew_grid(shared.renew_grid);
        // The Lease calls' 429s count as the driver's; they are never held behind its
        // throttled work.
        if let Some(budget) = self.budget.read().clone() {
            elector = elector.with_pushback(budget);
        }
        shared
            .leader_status
            .insert(name.to_string(), elector.status());
        // Run with the other drivers' electors; dropped (and so ended) if this term is
        // dropped mid-way (a panic in the driver's task): an elector must never renew
        // a Lease with no workers behind it.
        Ok(elector.spawn_in(&shared.electors, election.clone()))
    }

    /// Does what the term decided on reading its leadership.
    async fn follow(
        self: &Arc<Self>,
        step: Follow,
        held: &mut Held<'_>,
        workers: &mut Option<Workers>,
        shared: &Arc<Shared>,
        handler: &Arc<Handler>,
    ) {
        match step {
            Follow::Lead => {
                held.lead();
                *workers = Some(self.clone().start_workers(shared, handler));
            }
            Follow::StandBy {
                holder,
                stop_workers,
            } => {
                if stop_workers && let Some(w) = workers.take() {
                    // Another replica may lead already: stop at once, as the Go sidecar
                    // does by exiting. Keys cut short go back to their queues.
                    tracing::warn!("lost leadership; stopping workers now");
                    self.abort_workers(w).await;
                }
                held.unlead();
                shared.metrics.set_leader(held.name, false);
                self.info.write().lease_holder = holder;
                self.set_state(State::Standby);
            }
            Follow::Keep => {}
        }
    }

    /// Says why a leader steps down for `h`, and how to end the clash.
    fn warn_stepping_down(&self, h: &guard::Holder) {
        tracing::warn!(
            other_namespace = %h.namespace,
            holder = %h.holder,
            "stepping down: {}",
            guard::advice(
                self.info.read().lease.as_deref().unwrap_or("?"),
                self.lease_namespace().unwrap_or("?"),
                h
            )
        );
    }

    /// The first phase of a term's end: the workers stop taking work, and in-flight calls
    /// finish within the drain timeout; then the term no longer leads.
    async fn drain(&self, workers: Option<Workers>, held: &mut Held<'_>) {
        if let Some(w) = workers {
            self.stop_workers(w).await;
        }
        held.unlead();
    }

    /// What `/drivers` shows once `term` is over, and no hand-over left asked.
    fn close_term(&self, term: &Term) {
        // Whoever holds the Lease now, it is not the holder this term saw: leading, we have
        // just vacated it; standing by, nobody watches it until the next term's elector does.
        self.info.write().lease_holder = None;
        if stands_by_after(term) {
            self.set_state(State::Standby);
        }
        self.hand_over.send_replace(false);
    }
}

/// The leadership of a driver without leader election: leading, for good (its sender gone).
fn leading_for_good() -> watch::Receiver<Leadership> {
    let (tx, rx) = watch::channel(Leadership::Leading);
    drop(tx);
    rx
}

/// The elector's configuration for the Lease `lease` under the driver's settings.
fn elector_config(lease: String, le: &LeaderSettings) -> leader::Config {
    leader::Config {
        name: lease,
        namespace: le.namespace.clone(),
        identity: le.identity.clone(),
        lease_duration: le.lease_duration,
        renew_deadline: le.renew_deadline,
        retry_period: le.retry_period,
        labels: le.labels.clone(),
        release_on_cancel: le.release_on_exit,
    }
}

/// Acquire only within this replica's share, and never while the guard sees another holder
/// keep the driver's Lease in another namespace; the guard looks (one LIST) only right before
/// the Lease would be taken.
fn acquire_gate(shared: &Shared, guard: Option<&GuardFeed>) -> AcquireGate {
    let balance = shared.balance.clone();
    let guard_view = guard.map(|g| g.view.clone());
    let guard_check = guard.map(|g| g.guard.clone());
    let mut gate = AcquireGate::new(move || {
        balance.may_acquire()
            && guard_view
                .as_ref()
                .is_none_or(|v| v.borrow().blocked_by().is_none())
    })
    .woken_by(shared.balance.opened());
    if let Some(g) = guard_check {
        gate = gate.woken_by(g.opened()).checked_by(move || {
            let g = g.clone();
            async move { g.may_acquire().await }
        });
    }
    gate
}

/// Waits for what may change a term's course: the guard's view, a stop, a lost connection, a
/// hand-over request (when `hears_hand_over`), or the leadership.
async fn wait(
    stop: &CancellationToken,
    losses: &mut watch::Receiver<u64>,
    guard_view: Option<&mut watch::Receiver<guard::View>>,
    hand_over: &mut watch::Receiver<bool>,
    leadership: &mut watch::Receiver<Leadership>,
    hears_hand_over: bool,
) -> Woke {
    let guard_changed = async {
        match guard_view {
            Some(view) => {
                if view.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    };
    let asked_to_hand_over = async {
        if hand_over.wait_for(|asked| *asked).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = guard_changed => Woke::GuardChanged,
        () = stop.cancelled() => Woke::Stopped,
        _ = losses.changed() => Woke::ConnectionLost,
        () = asked_to_hand_over, if hears_hand_over => Woke::HandOverAsked,
        changed = leadership.changed() => Woke::Leadership { ended: changed.is_err() },
    }
}

/// Waits for the driver to stop or its connection to be lost, whichever comes first.
pub(super) async fn stop_or_loss(
    stop: &CancellationToken,
    losses: &mut watch::Receiver<u64>,
) -> Outcome {
    tokio::select! {
        () = stop.cancelled() => Outcome::Stopped,
        _ = losses.changed() => Outcome::ConnectionLost,
    }
}

/// The second phase of a term's end: the elector vacates the Lease (when it leads and is told
/// to) and ends.
async fn vacate(
    election: &CancellationToken,
    task: Option<leader::runner::Handle<leader::Result<()>>>,
) {
    election.cancel();
    if let Some(task) = task {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e.one_line(), "releasing the lease failed"),
            Err(e) => tracing::warn!(error = %e, "leader election task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use tokio::sync::watch;

    use super::*;
    use crate::hub::driver::panic_guard::guarded;
    use crate::hub::driver::rig::{DRIVER, LEASE, RETRY, Rig, for_a_while, until};

    /// One term of the rig's driver, without a Lease guard.
    fn term_of<'a>(
        rig: &'a Rig,
        stop: &'a CancellationToken,
        handler: &'a Arc<Handler>,
        losses: &'a mut watch::Receiver<u64>,
    ) -> impl Future<Output = Term> + 'a {
        rig.driver
            .clone()
            .serve_term(&rig.hub.shared, stop, DRIVER, handler, losses, None)
    }

    /// The balance loop asks a driver over the replica's share to hand over, and asks again at
    /// its next round while the driver drains (it still leads until its Lease is vacated). The
    /// second request must end with the term: the driver's next term leads and keeps leading,
    /// without a needless hand-over and the gap with no leader that follows.
    #[tokio::test(start_paused = true)]
    async fn a_hand_over_asked_again_while_the_term_drains_does_not_end_the_next_term() {
        let rig = Rig::new(true);
        let handler = rig.trivial_handler();
        let stop = CancellationToken::new();
        let (_loss, mut losses) = watch::channel(0u64);
        let leading = || rig.driver.state() == State::Leading;
        {
            let mut term = pin!(term_of(&rig, &stop, &handler, &mut losses));
            until(term.as_mut(), "it leads", leading).await;
            rig.driver.hand_over();
            rig.driver.hand_over();
            assert!(matches!(term.await, Term::HandedOver));
        }
        assert_eq!(rig.hub.shared.balance.leading(), 0);
        let mut term = pin!(term_of(&rig, &stop, &handler, &mut losses));
        until(term.as_mut(), "it leads again", leading).await;
        for_a_while(
            term.as_mut(),
            "nobody asked for a hand-over in this term",
            RETRY * 5,
        )
        .await;
        assert!(leading());
        assert_eq!(rig.hub.shared.balance.leading(), 1);
        stop.cancel();
        assert!(matches!(term.await, Term::Over(Outcome::Stopped)));
        assert_eq!(rig.hub.shared.balance.leading(), 0);
    }

    /// A term that ends because the driver's connection is lost (or the driver stops) vacates
    /// the Lease: `/drivers` (and so `attacher-hub status`) must not keep naming this replica
    /// as its holder.
    #[tokio::test(start_paused = true)]
    async fn a_vacated_lease_is_not_shown_with_its_old_holder() {
        let rig = Rig::new(true);
        let handler = rig.trivial_handler();
        let stop = CancellationToken::new();
        let (loss, mut losses) = watch::channel(0u64);
        let holder = || rig.driver.describe()["leaseHolder"].clone();
        let mut term = pin!(term_of(&rig, &stop, &handler, &mut losses));
        until(term.as_mut(), "it leads", || {
            rig.driver.state() == State::Leading
        })
        .await;
        assert_eq!(holder(), "me");
        loss.send_replace(1);
        assert!(matches!(term.await, Term::Over(Outcome::ConnectionLost)));
        let lease: k8s_openapi::api::coordination::v1::Lease = rig
            .api
            .get(Some("default"), &crate::names::lease_name(DRIVER))
            .expect("the Lease");
        let spec = lease.spec.expect("a spec");
        assert_eq!(spec.holder_identity.as_deref().unwrap_or(""), "", "vacated");
        assert!(holder().is_null(), "shown holder: {}", holder());
    }

    /// A panic in the driver's task drops its term mid-way. The elector must go with it (no
    /// Lease renewed with no workers behind it), the replica's count of led drivers must go
    /// down, and the leader metric must say so; the restarted driver then starts one elector,
    /// not a second one next to the first.
    #[tokio::test(start_paused = true)]
    async fn a_term_cut_short_by_a_panic_stops_its_elector_and_gives_its_lease_count_back() {
        let rig = Rig::new(true);
        let handler = rig.trivial_handler();
        let stop = CancellationToken::new();
        let (_loss, mut losses) = watch::channel(0u64);
        let panicked = guarded(async {
            let mut term = pin!(term_of(&rig, &stop, &handler, &mut losses));
            until(term.as_mut(), "it leads", || {
                rig.driver.state() == State::Leading
            })
            .await;
            assert_eq!(rig.hub.shared.balance.leading(), 1);
            panic!("a bug in the driver's task");
        })
        .await;
        assert_eq!(panicked, Err("a bug in the driver's task".to_string()));
        let writes = rig.api.writes().len();
        tokio::time::sleep(LEASE * 3).await;
        assert_eq!(
            rig.api.writes().len(),
            writes,
            "nothing renews the Lease after the panic"
        );
        assert_eq!(rig.hub.shared.balance.leading(), 0);
        assert_eq!(rig.leader_metric(), 0.0);
        assert!(rig.hub.shared.leader_status.is_empty());
    }
}
