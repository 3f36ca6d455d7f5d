//! One driver's life: connect, probe, learn its name and capabilities, win its
//! Lease, run its workers and reconciler; and start over when its connection
//! drops. A sick driver only ever affects itself.
//!
//! The parts: this module holds the slot ([`Driver`]: its state, its queues, the events the
//! router delivers); [`context`] what every driver shares; `life` the connect-probe-register
//! cycle and `term` one election term, each a loop over the pure decisions of `life_course` and
//! `term_course`; `workers` the workers and the reconciler; `key_locks` the per-key exclusion
//! between the attach and the detach pool; [`panic_guard`] a panic in a sync or a task turned
//! into an error with its message.

pub mod context;
mod key_locks;
mod life;
mod life_course;
pub mod panic_guard;
#[cfg(test)]
mod rig;
mod term;
mod term_course;
mod workers;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use parking_lot::RwLock;
use serde::Serialize;
use tokio::sync::watch;

use crate::{
    config::Settings,
    controller::{Handler, patches::should_enqueue_pv, predicate::should_enqueue_va_change},
    csi::Capabilities,
    k8s::budget::ApiBudget,
    k8s::lean::{Pv, Va},
    leader::guard as lease_guard,
    names::{PV_QUEUE_NAME, VA_QUEUE_NAME},
    queue::{History, Queue},
};
use key_locks::KeyLocks;

/// Where a driver is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum State {
    /// Waiting for its socket to accept a connection.
    Connecting,
    /// Connected; Probe says not ready (or name/capabilities not read yet).
    NotReady,
    /// Ready; another replica holds its Lease.
    Standby,
    /// Ready, but another holder renews a Lease of the driver's name in another namespace, so
    /// this process does not lead it (the cross-namespace Lease guard, [`crate::leader::guard`]).
    Blocked {
        /// Namespace of the other Lease.
        namespace: String,
        /// Its holder.
        holder: String,
        /// The whole story: where, who, and the fix.
        reason: String,
    },
    /// Ready and acting for the driver.
    Leading,
    /// A start-up step failed; retried with backoff.
    Failed {
        /// What went wrong.
        reason: String,
    },
    /// A discovered socket whose driver has no controller service (a node
    /// plugin): recorded, not served, not an error.
    NoControllerService,
    /// Stopped (removed from the configuration or shutting down).
    Stopped,
}

/// How a driver slot came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Named on the command line or in `drivers.yaml`: it is served whatever
    /// its capabilities (the trivial handler for non-attaching drivers).
    Configured,
    /// Found by `--driver-sockets`: without a controller service it is a node
    /// plugin, which this process records but does not act for.
    Discovered,
}

/// What `/drivers` shows of a driver.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Info {
    name: Option<String>,
    state: Option<State>,
    capabilities: Option<Capabilities>,
    lease: Option<String>,
    lease_holder: Option<String>,
    /// Shown by [`Driver::describe`] as `lastError` and `lastErrorTime`.
    #[serde(skip)]
    last_error: Option<LastError>,
}

/// The last error a driver met, shown in `/drivers` until what caused it is over: a VA's error
/// until that VA syncs or goes, the driver's own (a lost connection, a failed start) until it
/// serves again.
#[derive(Clone, Debug)]
struct LastError {
    /// The VolumeAttachment whose sync failed; `None` for the driver itself.
    key: Option<String>,
    /// What went wrong.
    message: String,
    /// When.
    at: k8s_openapi::jiff::Timestamp,
}

/// Which queue a VolumeAttachment key is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Attach,
    Detach,
}

/// One configured driver socket and, once known, the driver behind it.
#[derive(Debug)]
pub struct Driver {
    /// Its settings.
    settings: Settings,
    /// Configured or discovered.
    origin: Origin,
    /// VAs to attach.
    attach_queue: Queue,
    /// VAs to detach: a separate pool, so a detach storm never starves attaches.
    detach_queue: Queue,
    /// PVs whose finalizer may go.
    pv_queue: Queue,
    /// Set while this replica acts for the driver; events are dropped otherwise.
    handler: RwLock<Option<Arc<Handler>>>,
    /// The handler of the current connection, leading or not: a VA deleted while this replica
    /// stands by is forgotten by it too (its memory of our own writes would grow otherwise).
    connected: RwLock<Option<Arc<Handler>>>,
    /// Keys being processed, so a VA moving from the attach to the detach
    /// queue is never worked on twice at once.
    busy: KeyLocks,
    /// VAs whose last sync failed because their PV was not in the cache yet, by PV name, with
    /// the queue they wait in. A VA's watch event can come before its PV's (two watches, one
    /// per kind); the VA is queued again the moment the PV arrives rather than after its
    /// backoff. Bounded by the VAs failing so; emptied as their PVs arrive or they go.
    awaiting_pv: parking_lot::Mutex<HashMap<String, HashSet<(String, Kind)>>>,
    /// Attach and detach syncs in flight ([`Settings::csi_calls`] permits, shared by the two
    /// pools; tokio's semaphore serves waiters in order, so neither pool starves the other).
    csi_calls: tokio::sync::Semaphore,
    /// For `/drivers` and readiness.
    info: RwLock<Info>,
    /// The API budget of the current connection, for `/drivers`.
    budget: RwLock<Option<Arc<ApiBudget>>>,
    /// Set by the hub when this replica holds more than its share of Leases, only while the
    /// driver leads; reset when a term starts and ends, so that a request never outlives the
    /// term it was made in.
    hand_over: watch::Sender<bool>,
    /// The cross-namespace Lease guard of the current connection (with leader election only).
    lease_guard: RwLock<Option<watch::Receiver<lease_guard::View>>>,
}

impl Driver {
    /// A driver slot for `settings`; [`Driver::run`] brings it to life.
    pub fn new(settings: Settings, origin: Origin) -> Arc<Self> {
        let q = |name: &str, history: &Arc<History>| {
            Queue::sharing(
                name,
                settings.retry_interval_start,
                settings.retry_interval_max,
                history.clone(),
            )
        };
        // One retry history per VA across the attach and detach pools, as in the Go sidecar's
        // one VA queue: a VA whose attaches failed backs off its detach from there.
        let va_history = Arc::default();
        let calls = settings.csi_calls.max(1);
        Arc::new(Self {
            origin,
            attach_queue: q(VA_QUEUE_NAME, &va_history),
            detach_queue: q(VA_QUEUE_NAME, &va_history),
            pv_queue: q(PV_QUEUE_NAME, &Arc::default()),
            settings,
            handler: RwLock::new(None),
            connected: RwLock::new(None),
            busy: KeyLocks::default(),
            awaiting_pv: parking_lot::Mutex::default(),
            csi_calls: tokio::sync::Semaphore::new(calls),
            info: RwLock::new(Info {
                state: Some(State::Connecting),
                ..Info::default()
            }),
            budget: RwLock::new(None),
            hand_over: watch::channel(false).0,
            lease_guard: RwLock::new(None),
        })
    }

    /// A slot whose driver has told its name already (for the tests of what holds slots).
    #[cfg(test)]
    pub(crate) fn named(settings: Settings, origin: Origin, name: &str) -> Arc<Self> {
        let driver = Self::new(settings, origin);
        driver.info.write().name = Some(name.to_owned());
        driver
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The driver name, once it has told it.
    pub fn name(&self) -> Option<String> {
        self.info.read().name.clone()
    }

    /// The current state: a driver standing by while the Lease guard blocks it is
    /// [`State::Blocked`].
    pub fn state(&self) -> State {
        let (state, lease) = {
            let info = self.info.read();
            (
                info.state.clone().unwrap_or(State::Connecting),
                info.lease.clone(),
            )
        };
        if state != State::Standby {
            return state;
        }
        match (self.lease_guard_view(), lease) {
            (Some(view), Some(lease)) => match view.blocked_by() {
                Some(h) => State::Blocked {
                    namespace: h.namespace.clone(),
                    holder: h.holder.clone(),
                    reason: lease_guard::advice(&lease, self.lease_namespace().unwrap_or("?"), h),
                },
                None => state,
            },
            _ => state,
        }
    }

    /// Whether this replica stands by for another holder that keeps the driver's Lease alive,
    /// so that not leading is no loss: the guard blocks it for a Lease of the same name
    /// renewed in another namespace, or (`own`: the status of its own Lease's elector) the
    /// holder of its own Lease renews it.
    pub fn stands_by_for_live_holder(&self, own: Option<&crate::leader::Status>) -> bool {
        match self.state() {
            State::Blocked { .. } => true,
            State::Standby => {
                own.is_some_and(|s| s.live_holder(tokio::time::Instant::now()).is_some())
            }
            _ => false,
        }
    }

    /// What the cross-namespace Lease guard says now (`None` without leader election or before
    /// the driver is ready).
    pub fn lease_guard_view(&self) -> Option<lease_guard::View> {
        self.lease_guard
            .read()
            .as_ref()
            .map(|rx| rx.borrow().clone())
    }

    /// The namespace of this driver's Lease, with leader election.
    fn lease_namespace(&self) -> Option<&str> {
        self.settings
            .leader_election
            .as_ref()
            .map(|le| le.namespace.as_str())
    }

    fn set_state(&self, state: State) {
        if let State::Failed { reason } = &state {
            tracing::warn!(%reason, "driver failed; retrying");
            self.record_error(None, reason.clone());
        }
        if matches!(state, State::Standby | State::Leading) {
            self.clear_error(None);
        }
        self.info.write().state = Some(state);
    }

    /// Sets the state, as a term would (for the tests of what reads it).
    #[cfg(test)]
    pub(crate) fn set_state_for_test(&self, state: State) {
        self.set_state(state);
    }

    /// Records the driver's last error: of the VA `key`, or (`None`) of the driver itself.
    fn record_error(&self, key: Option<&str>, message: String) {
        self.info.write().last_error = Some(LastError {
            key: key.map(str::to_owned),
            message,
            at: k8s_openapi::jiff::Timestamp::now(),
        });
    }

    /// Clears the last error if it was of the VA `key` (or, for `None`, of the driver itself):
    /// what caused it is over.
    fn clear_error(&self, key: Option<&str>) {
        let mut info = self.info.write();
        if info
            .last_error
            .as_ref()
            .is_some_and(|e| e.key.as_deref() == key)
        {
            info.last_error = None;
        }
    }

    /// The `/drivers` entry.
    pub fn describe(&self) -> serde_json::Value {
        let info = self.info.read().clone();
        let state = info.state.as_ref().map(|_| self.state());
        serde_json::json!({
            "socket": self.settings.address.to_string(),
            "name": info.name,
            "configuredName": self.settings.expected_name,
            "state": state,
            "capabilities": info.capabilities,
            "lease": info.lease,
            "leaseHolder": info.lease_holder,
            "leaderElection": self.settings.leader_election.is_some(),
            "leaseNamespace": self.lease_namespace(),
            "leaseGuard": self.lease_guard_view().map(|v| v.verdict),
            "discovered": self.origin == Origin::Discovered,
            "queues": {
                "attach": { "depth": self.attach_queue.len(), "processing": self.attach_queue.processing_len(), "oldestSeconds": self.attach_queue.oldest_age().map(|d| d.as_secs_f64()) },
                "detach": { "depth": self.detach_queue.len(), "processing": self.detach_queue.processing_len(), "oldestSeconds": self.detach_queue.oldest_age().map(|d| d.as_secs_f64()) },
                "pv": { "depth": self.pv_queue.len(), "processing": self.pv_queue.processing_len(), "oldestSeconds": self.pv_queue.oldest_age().map(|d| d.as_secs_f64()) },
            },
            "lastError": info.last_error.as_ref().map(|e| e.message.clone()),
            "lastErrorTime": info.last_error.as_ref().map(|e| e.at.to_string()),
            "apiBudget": self.budget.read().clone().map(|b| b.status()),
        })
    }

    /// Depths of the attach, detach and PV queues.
    pub fn queue_depths(&self) -> [(&'static str, &Queue); 3] {
        [
            ("attach", &self.attach_queue),
            ("detach", &self.detach_queue),
            ("pv", &self.pv_queue),
        ]
    }

    fn handler(&self) -> Option<Arc<Handler>> {
        self.handler.read().clone()
    }

    // === events (called by the router through the hub; must not block) ===

    /// A VA of this driver was added or changed.
    pub fn on_va(&self, old: Option<&Va>, new: &Va) {
        let Some(handler) = self.handler() else {
            return;
        };
        if old.is_none_or(|old| should_enqueue_va_change(old, new)) {
            self.enqueue_va(&handler, new);
        }
    }

    fn enqueue_va(&self, handler: &Handler, va: &Va) {
        let Some(name) = va.metadata.name.as_deref() else {
            return;
        };
        let deleting = va.metadata.deletion_timestamp.is_some();
        let (to, from) = if handler.detaches() && deleting {
            (&self.detach_queue, &self.attach_queue)
        } else {
            (&self.attach_queue, &self.detach_queue)
        };
        // One pending sync per VA across the two pools, as in the Go sidecar's one queue, where
        // an event's add makes a VA that waits out a backoff ready at once: a retry still
        // waiting in the other pool would sync it a second time.
        from.cancel_retry(name);
        to.add(name);
    }

    /// A PV reached the cache (or changed): VAs whose sync found it missing are queued now.
    pub fn on_pv_arrived(&self, pv: &str) {
        let waiting = {
            let mut awaiting = self.awaiting_pv.lock();
            if awaiting.is_empty() {
                return;
            }
            awaiting.remove(pv)
        };
        if self.handler().is_none() {
            return;
        }
        for (va, kind) in waiting.into_iter().flatten() {
            tracing::debug!(
                va,
                pv,
                "the PersistentVolume arrived; syncing its VolumeAttachment"
            );
            self.queue_of(kind).add(va);
        }
    }

    /// Remembers that the sync of VA `va` (in the `kind` queue) found PV `pv` missing.
    fn await_pv(&self, pv: &str, va: &str, kind: Kind) {
        self.awaiting_pv
            .lock()
            .entry(pv.to_owned())
            .or_default()
            .insert((va.to_owned(), kind));
    }

    /// The attach or detach queue.
    fn queue_of(&self, kind: Kind) -> &Queue {
        match kind {
            Kind::Attach => &self.attach_queue,
            Kind::Detach => &self.detach_queue,
        }
    }

    /// A VA of this driver is gone: its PV may lose our finalizer now.
    pub fn on_va_deleted(&self, va: &Va) {
        if let (Some(pv), Some(name)) = (
            va.spec.source.persistent_volume_name.as_deref(),
            va.metadata.name.as_deref(),
        ) {
            let mut awaiting = self.awaiting_pv.lock();
            if let Some(vas) = awaiting.get_mut(pv) {
                vas.retain(|(v, _)| v != name);
                if vas.is_empty() {
                    awaiting.remove(pv);
                }
            }
        }
        // Forgotten by the connection's handler whether or not this replica leads.
        let connected = self.connected.read().clone();
        if let (Some(handler), Some(name)) = (connected, va.metadata.name.as_deref()) {
            handler.va_deleted(name);
        }
        if self.handler().is_none() {
            return;
        }
        if let Some(pv) = va.spec.source.persistent_volume_name.as_deref() {
            self.pv_queue.add(pv);
        }
    }

    /// A PV carrying our finalizer was added or changed.
    pub fn on_pv(&self, driver: &str, pv: &Pv) {
        if self.handler().is_none() {
            return;
        }
        if should_enqueue_pv(pv, driver)
            && let Some(name) = pv.metadata.name.as_deref()
        {
            self.pv_queue.add(name);
        }
    }

    /// Asks the driver to vacate its Lease so another replica takes it over
    /// (leadership balancing). Ignored unless it leads; the request ends with the term.
    pub fn hand_over(&self) {
        if self.info.read().state != Some(State::Leading) {
            return;
        }
        self.hand_over
            .send_if_modified(|asked| !std::mem::replace(asked, true));
    }

    /// Whether a hand-over was asked in this term and is under way (the driver drains and
    /// vacates its Lease): it no longer counts as a driver to hand over.
    pub fn handing_over(&self) -> bool {
        *self.hand_over.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use crate::config::Defaults;
    use crate::leader::guard::{Holder, Verdict, View};

    fn driver_with_guard(view: View) -> (Arc<Driver>, watch::Sender<View>) {
        let mut args = Args::default();
        args.leader_election.enabled = true;
        args.leader_election.namespace = Some("attacher-hub".into());
        let defaults = Defaults::with_identity(&args, "hub-1".into());
        let settings = defaults.settings_for("/x.sock".parse().expect("a path"));
        let driver = Driver::named(settings, Origin::Configured, "pd.csi.storage.gke.io");
        let (tx, rx) = watch::channel(view);
        *driver.lease_guard.write() = Some(rx);
        driver.info.write().lease = Some(crate::names::lease_name("pd.csi.storage.gke.io"));
        (driver, tx)
    }

    #[test]
    fn a_standby_driver_blocked_by_the_guard_shows_as_blocked_with_the_fix() {
        let (driver, guard) = driver_with_guard(View::pending());
        driver.set_state(State::Standby);
        assert_eq!(driver.state(), State::Standby);
        guard.send_replace(View {
            verdict: Verdict::Blocked {
                holder: Holder {
                    namespace: "kube-system".into(),
                    holder: "go-1".into(),
                },
            },
            renewing: None,
        });
        let State::Blocked {
            namespace,
            holder,
            reason,
        } = driver.state()
        else {
            panic!("{:?}", driver.state())
        };
        assert_eq!(
            (namespace.as_str(), holder.as_str()),
            ("kube-system", "go-1")
        );
        assert!(
            reason.contains("leaderElection.namespace: kube-system"),
            "{reason}"
        );
        assert!(reason.contains("namespace attacher-hub"), "{reason}");
        let d = driver.describe();
        assert_eq!(d["state"]["state"], "blocked");
        assert_eq!(d["state"]["namespace"], "kube-system");
        assert_eq!(d["leaseGuard"]["state"], "blocked");
        assert_eq!(d["leaseNamespace"], "attacher-hub");
        // A leader is shown leading whatever the guard says (it steps down on its own).
        driver.set_state(State::Leading);
        assert_eq!(driver.state(), State::Leading);
    }

    /// What `attacher_hub_lease_held_by_other` says, which `AttacherHubLeaseLost` leaves out.
    #[tokio::test(start_paused = true)]
    async fn standing_by_for_a_live_holder_is_told_apart_from_a_lost_lease() {
        let (driver, guard) = driver_with_guard(View {
            verdict: Verdict::Clear,
            renewing: None,
        });
        let lease = crate::names::lease_name("pd.csi.storage.gke.io");
        let own = crate::leader::Status::new(&crate::leader::Config::new(
            &lease,
            "attacher-hub",
            "hub-1",
        ));
        driver.set_state(State::Standby);
        // Nobody known to renew the Lease: a loss.
        assert!(!driver.stands_by_for_live_holder(None));
        assert!(!driver.stands_by_for_live_holder(Some(&own)));
        // The Go sidecar holds the same Lease and renews it (step 3 of a migration).
        {
            let mut inner = own.lock();
            inner.holder = Some("csi-gce-pd-controller-0".into());
            inner.changed = Some(tokio::time::Instant::now());
        }
        assert!(driver.stands_by_for_live_holder(Some(&own)));
        // It stopped renewing a lease duration ago: a loss again.
        tokio::time::advance(crate::leader::DEFAULT_LEASE_DURATION).await;
        assert!(!driver.stands_by_for_live_holder(Some(&own)));
        // The guard blocks for a Lease renewed in another namespace.
        guard.send_replace(View {
            verdict: Verdict::Blocked {
                holder: Holder {
                    namespace: "kube-system".into(),
                    holder: "go-1".into(),
                },
            },
            renewing: None,
        });
        assert!(driver.stands_by_for_live_holder(None));
        // Leading, or not ready, is never standing by.
        driver.set_state(State::Leading);
        assert!(!driver.stands_by_for_live_holder(Some(&own)));
        driver.set_state(State::NotReady);
        assert!(!driver.stands_by_for_live_holder(None));
    }
}
