//! One election term of a driver: stand for its Lease (if it has leader election, and only while
//! the cross-namespace Lease guard allows it), run the workers while leading, and end on stop,
//! connection loss, a lost Lease, a hand-over or a step-down for a holder in another namespace,
//! in two phases (drain the work, then vacate the Lease).

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio_util::sync::CancellationToken;

use super::{Driver, State, context::Shared, workers::Workers};
use crate::{
    controller::Handler,
    leader::{self, AcquireGate, LeaderElector, Leadership, guard},
};

/// How one election term ended.
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
    /// Its view.
    pub(super) view: tokio::sync::watch::Receiver<guard::View>,
    /// Bumped when it starts allowing acquisition.
    pub(super) opened: tokio::sync::watch::Receiver<u64>,
}

/// How one life of a driver ended.
pub(super) enum Outcome {
    Stopped,
    ConnectionLost,
    Failed(String),
}

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
        losses: &mut tokio::sync::watch::Receiver<u64>,
        mut guard: Option<&mut GuardFeed>,
    ) -> Term {
        let election = CancellationToken::new();
        let (mut leadership, election_task) = match &self.settings.leader_election {
            None => {
                let (tx, rx) = tokio::sync::watch::channel(Leadership::Leading);
                drop(tx);
                (rx, None)
            }
            Some(le) => {
                let lease = crate::names::lease_name(name);
                self.info.write().lease = Some(lease.clone());
                let config_name = lease.clone();
                let config = leader::Config {
                    name: lease,
                    namespace: le.namespace.clone(),
                    identity: le.identity.clone(),
                    lease_duration: le.lease_duration,
                    renew_deadline: le.renew_deadline,
                    retry_period: le.retry_period,
                    labels: le.labels.clone(),
                    release_on_cancel: le.release_on_exit,
                };
                let api = Api::<Lease>::namespaced(shared.leader_client.clone(), &le.namespace);
                let elector = match LeaderElector::new(api, config) {
                    Ok(e) => e,
                    Err(e) => return Term::Over(Outcome::Failed(format!("leader election: {e}"))),
                };
                let balance = shared.balance.clone();
                let guard_view = guard.as_ref().map(|g| g.view.clone());
                let feed = shared
                    .lease_feeds
                    .entry(config_name.clone())
                    .or_insert_with(|| tokio::sync::watch::channel(None).0)
                    .subscribe();
                // Acquire only within this replica's share, and never while the guard sees
                // another holder renew the driver's Lease in another namespace.
                let mut gate = AcquireGate::new(move || {
                    balance.may_acquire()
                        && guard_view
                            .as_ref()
                            .is_none_or(|v| v.borrow().allows_acquire())
                })
                .woken_by(shared.balance.opened());
                if let Some(g) = guard.as_ref() {
                    gate = gate.woken_by(g.opened.clone());
                }
                let elector = elector.with_acquire_gate(gate).with_feed(feed);
                shared
                    .leader_status
                    .insert(name.to_string(), elector.status());
                let (rx, task) = elector.spawn(election.clone());
                (rx, Some(task))
            }
        };
        let balanced = election_task.is_some();

        let mut workers: Option<Workers> = None;
        let term = loop {
            let leading = leadership.borrow_and_update().clone();
            match (&leading, workers.is_some()) {
                (Leadership::Leading, false) => {
                    self.set_state(State::Leading);
                    shared.metrics.set_leader(name, true);
                    if balanced {
                        shared.balance.set_leading(true);
                    }
                    workers = Some(self.clone().start_workers(shared, handler));
                }
                (Leadership::Standby { holder }, running) => {
                    if running && let Some(w) = workers.take() {
                        // Another replica may lead already: stop at once, as the Go sidecar
                        // does by exiting. Keys cut short go back to their queues.
                        tracing::warn!("lost leadership; stopping workers now");
                        self.abort_workers(w).await;
                        shared.balance.set_leading(false);
                    }
                    shared.metrics.set_leader(name, false);
                    self.info.write().lease_holder = holder.clone();
                    self.set_state(State::Standby);
                }
                _ => {}
            }
            if leading.is_leading() && balanced {
                self.info.write().lease_holder =
                    shared.leader_status.get(name).and_then(|s| s.holder());
            }
            // A leader steps down for a holder seen renewing the driver's Lease in another
            // namespace: two attachers must not both act, and that one never looks at ours.
            if workers.is_some()
                && let Some(h) = guard
                    .as_ref()
                    .and_then(|g| g.view.borrow().renewing.clone())
            {
                tracing::warn!(
                    other_namespace = %h.namespace,
                    holder = %h.holder,
                    "stepping down: {}",
                    guard::advice(
                        self.info.read().lease.as_deref().unwrap_or("?"),
                        self.lease_namespace().unwrap_or("?"),
                        &h
                    )
                );
                break Term::Yielded(h);
            }
            let guard_changed = async {
                match guard.as_mut() {
                    Some(g) => {
                        if g.view.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = guard_changed => {},
                () = stop.cancelled() => break Term::Over(Outcome::Stopped),
                _ = losses.changed() => break Term::Over(Outcome::ConnectionLost),
                () = self.hand_over.notified(), if workers.is_some() && balanced => break Term::HandedOver,
                changed = leadership.changed() => if changed.is_err() && balanced {
                    // The elector ended on its own: treat as a lost lease.
                    break Term::Over(Outcome::Failed("leader election ended".into()));
                } else if changed.is_err() {
                    // No leader election: wait for stop or loss only.
                    tokio::select! {
                        () = stop.cancelled() => break Term::Over(Outcome::Stopped),
                        _ = losses.changed() => break Term::Over(Outcome::ConnectionLost),
                    }
                },
            }
        };

        // Phase 1: stop taking work; let in-flight calls finish within a bound.
        if let Some(w) = workers.take() {
            self.stop_workers(w).await;
            if balanced {
                shared.balance.set_leading(false);
            }
        }
        // Phase 2: vacate the Lease so the next leader starts at once.
        election.cancel();
        if let Some(task) = election_task {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed"),
                Err(e) => tracing::warn!(error = %e, "leader election task failed"),
            }
        }
        shared.leader_status.remove(name);
        shared.metrics.set_leader(name, false);
        if matches!(term, Term::HandedOver | Term::Yielded(_)) {
            self.info.write().lease_holder = None;
            self.set_state(State::Standby);
        }
        term
    }
}
