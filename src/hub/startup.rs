//! When a new replica has started: every driver of its first configuration has finished its
//! first start (it stands by, leads, is blocked by the Lease guard, failed a step, or has no
//! controller service), or [`SETTLE_LIMIT`] has passed.
//!
//! Two things wait for it. Readiness: in a rolling update the old pod ends once the new one
//! is ready, and its drivers' Leases are released then; a new replica whose driver is still
//! connecting (its controller container starting beside it on a loaded node) cannot take
//! them, and the driver goes without a leader until it can. And the replica's presence in the
//! leadership balance: another replica hands drivers over to a newcomer as soon as it counts
//! it, so the newcomer must be able to serve them first. After start-up, readiness follows the
//! caches only: a driver that goes down later shows in `/drivers`, the metrics and the alerts,
//! never as a NotReady pod (which would block rollouts and drains).

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::driver::State;

/// The longest a replica waits for its drivers' first start before it reports ready and
/// counts in the balance anyway: a driver whose socket never appears must not keep the pod
/// out of service. Ample for a vendor's controller container that starts beside the hub on a
/// loaded node (the GCE PD controller took 5 s on two busy cores), short against a rollout's
/// progress deadline (10 minutes by default).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// Whether a driver in `state` has finished its first start, well or not.
pub fn finished(state: &State) -> bool {
    !matches!(state, State::Connecting | State::NotReady)
}

/// The start-up of a replica, latched once over.
#[derive(Debug)]
pub struct Startup {
    /// When the hub began.
    began: Instant,
    /// Set once start-up is over; never reset.
    over: AtomicBool,
}

/// Whether start-up is over, from the states of the first configuration's drivers and the
/// time since the hub began: every driver finished its first start, or `limit` passed.
pub fn over(states: &[State], since: Duration, limit: Duration) -> bool {
    since >= limit || states.iter().all(finished)
}

impl Startup {
    /// A start-up that begins now.
    pub fn new() -> Self {
        Self {
            began: Instant::now(),
            over: AtomicBool::new(false),
        }
    }

    /// Whether start-up is over: `configured` says whether the first configuration's drivers
    /// have been started (before, nothing is known of them), `states` are theirs. The first
    /// time it is, the drivers that never finished (the limit passed) are named in a warning.
    pub fn check(&self, configured: bool, states: impl FnOnce() -> Vec<(String, State)>) -> bool {
        if self.over.load(Ordering::Acquire) {
            return true;
        }
        if !configured {
            return false;
        }
        let states = states();
        let plain: Vec<State> = states.iter().map(|(_, s)| s.clone()).collect();
        if !over(&plain, self.began.elapsed(), SETTLE_LIMIT) {
            return false;
        }
        if !self.over.swap(true, Ordering::AcqRel) {
            let waiting: Vec<String> = states
                .iter()
                .filter(|(_, s)| !finished(s))
                .map(|(socket, s)| {
                    let what = match s {
                        State::Connecting => "its socket does not accept a connection",
                        _ => "its Probe does not answer ready",
                    };
                    format!("{socket} ({what})")
                })
                .collect();
            if waiting.is_empty() {
                tracing::info!(after = ?self.began.elapsed(), "every driver has started");
            } else {
                tracing::warn!(
                    limit = ?SETTLE_LIMIT,
                    waiting = waiting.join(", "),
                    "drivers still starting after the start-up limit; serving without them"
                );
            }
        }
        true
    }
}

/// How often [`follow`] looks at the drivers until start-up is over: a fraction of the time a
/// driver takes to start.
pub const POLL: Duration = Duration::from_millis(100);

/// Follows start-up until it is over, then waits for `stop`. Start-up ends at the moment every
/// driver has first finished starting, whatever they do later: it must be looked at while it
/// happens, not only when readiness is asked (a probe that comes after a driver went down
/// again would otherwise find start-up still going).
pub async fn follow(hub: std::sync::Arc<super::context::Context>, stop: CancellationToken) {
    if wait_over(&hub, &stop).await {
        stop.cancelled().await;
    }
}

/// Waits until start-up is over, looking every [`POLL`]: true then, false if `stop` came first.
/// What waits for start-up (the leadership balance, the unserved check) waits here.
pub async fn wait_over(hub: &super::context::Context, stop: &CancellationToken) -> bool {
    while !hub.started() {
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(POLL) => {}
        }
    }
    true
}

impl Default for Startup {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(20);

    #[test]
    fn start_up_is_over_when_every_driver_finished_its_first_start() {
        let failed = State::Failed {
            reason: "probe failed".into(),
        };
        let cases = [
            (vec![], Duration::ZERO, true),
            (vec![State::Standby, State::Leading], Duration::ZERO, true),
            (
                vec![failed.clone(), State::NoControllerService],
                Duration::ZERO,
                true,
            ),
            (
                vec![State::Leading, State::Connecting],
                Duration::from_secs(5),
                false,
            ),
            (vec![State::NotReady], Duration::from_secs(19), false),
            // A driver that never comes does not hold the replica back past the limit.
            (vec![State::Connecting], LIMIT, true),
        ];
        for (states, since, want) in cases {
            assert_eq!(
                over(&states, since, LIMIT),
                want,
                "{states:?} after {since:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn start_up_waits_for_the_configuration_then_latches() {
        let s = Startup::new();
        let states = |state: State| move || vec![("/csi/csi.sock".to_string(), state)];
        assert!(
            !s.check(false, states(State::Leading)),
            "no configuration yet"
        );
        assert!(!s.check(true, states(State::Connecting)));
        assert!(s.check(true, states(State::Standby)));
        // Over for good: a driver that goes down later does not undo it.
        assert!(s.check(true, states(State::Connecting)));
    }

    #[tokio::test(start_paused = true)]
    async fn start_up_ends_at_the_limit_without_a_driver_that_never_comes() {
        let s = Startup::new();
        let connecting = || vec![("/csi/csi.sock".to_string(), State::Connecting)];
        assert!(!s.check(true, connecting));
        tokio::time::advance(SETTLE_LIMIT).await;
        assert!(s.check(true, connecting));
    }
}
