//! The optional process-wide cap, fair between the drivers that wait for it.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::{sync::oneshot, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{bucket::Bucket, limit::Limit};

/// The optional process-wide cap: one token bucket whose tokens go to the drivers that wait for
/// one, in turn (round robin over drivers, first come first served within a driver).
///
/// [`FairCap::run`] hands the tokens out; without a limit set it is idle and every request
/// passes at once.
#[derive(Debug)]
pub struct FairCap {
    state: Mutex<CapState>,
    /// Wakes [`FairCap::run`] when a driver starts waiting or the limit changes.
    wake: tokio::sync::Notify,
    next_member: AtomicU64,
}

#[derive(Debug)]
struct CapState {
    bucket: Bucket,
    /// Drivers with waiting requests, in the order they are served next.
    turn: VecDeque<u64>,
    /// Each waiting driver's requests, oldest first.
    waiting: HashMap<u64, VecDeque<oneshot::Sender<()>>>,
}

impl CapState {
    /// Hands out the tokens there are, one per driver in turn. Returns how long until the next
    /// token is due, or `None` when nobody waits.
    fn dispatch(&mut self, now: Instant) -> Option<Duration> {
        while let Some(&member) = self.turn.front() {
            let queue = self.waiting.entry(member).or_default();
            // Requests given up by their callers (dropped futures) need no token.
            while queue.front().is_some_and(oneshot::Sender::is_closed) {
                queue.pop_front();
            }
            if queue.is_empty() {
                self.waiting.remove(&member);
                self.turn.pop_front();
                continue;
            }
            if !self.bucket.try_take(now) {
                return Some(self.bucket.until_next());
            }
            self.turn.pop_front();
            if let Some(tx) = queue.pop_front()
                && tx.send(()).is_err()
            {
                // Gone between the check and the send: the token was not used.
                self.bucket.refund();
            }
            if queue.is_empty() {
                self.waiting.remove(&member);
            } else {
                self.turn.push_back(member);
            }
        }
        None
    }
}

impl FairCap {
    /// A cap with `limit` ([`Limit::Unlimited`]: off).
    pub fn new(limit: Limit) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(CapState {
                bucket: Bucket::new(limit, Instant::now()),
                turn: VecDeque::new(),
                waiting: HashMap::new(),
            }),
            wake: tokio::sync::Notify::new(),
            next_member: AtomicU64::new(0),
        })
    }

    /// Changes the limit (a reloaded `drivers.yaml`); waiting requests are re-dispatched.
    pub fn set_limit(&self, limit: Limit) {
        let changed = {
            let mut state = self.state.lock();
            let changed = state.bucket.limit != limit;
            state.bucket.set_limit(limit, Instant::now());
            changed
        };
        if changed {
            tracing::info!(%limit, "the hub's API cap changed");
            self.wake.notify_one();
        }
    }

    /// The current limit.
    pub fn limit(&self) -> Limit {
        self.state.lock().bucket.limit
    }

    pub(super) fn member(&self) -> u64 {
        self.next_member.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes one token for `member`; `true` if it had to wait. Never waits when no limit is
    /// set. Cancel-safe: a dropped call uses no token.
    pub(super) async fn acquire(&self, member: u64) -> bool {
        let rx = {
            let mut state = self.state.lock();
            let now = Instant::now();
            // Nobody is queued: take a token if there is one, as an unfair bucket would.
            if state.turn.is_empty() && state.bucket.try_take(now) {
                return false;
            }
            let (tx, rx) = oneshot::channel();
            let queue = state.waiting.entry(member).or_default();
            let first = queue.is_empty();
            queue.push_back(tx);
            if first && !state.turn.contains(&member) {
                state.turn.push_back(member);
            }
            rx
        };
        self.wake.notify_one();
        // An error means the dispatcher is gone (shutdown): let the request through.
        let _ = rx.await;
        true
    }

    /// Hands tokens to waiting drivers until `stop` is cancelled.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let next = self.state.lock().dispatch(Instant::now());
            let sleep = async {
                match next {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.wake.notified() => {}
                () = sleep => {}
            }
        }
        // Let every waiting request through: nothing will dispatch them any more.
        let mut state = self.state.lock();
        state.turn.clear();
        state.waiting.clear();
    }

    pub(super) fn status(&self) -> CapStatus {
        let mut state = self.state.lock();
        let (limit, tokens) = state.bucket.state(Instant::now());
        CapStatus {
            limit,
            available_tokens: limit.qps().map(|_| tokens),
            waiting_drivers: state.turn.len(),
            waiting_requests: state.waiting.values().map(VecDeque::len).sum(),
        }
    }
}

/// The process-wide cap as `/drivers` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapStatus {
    /// The cap.
    pub limit: Limit,
    /// Tokens in the shared bucket now.
    pub available_tokens: Option<f64>,
    /// Drivers with requests waiting for the cap.
    pub waiting_drivers: usize,
    /// Requests waiting for the cap, all drivers.
    pub waiting_requests: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::budget::testing::budget;
    use crate::metrics::Limiter;

    /// The fairness of the cap: one driver floods it, the other's single request waits about
    /// one turn, not behind the flood.
    #[tokio::test(start_paused = true)]
    async fn the_cap_serves_a_quiet_driver_within_one_turn_of_a_flooding_one() {
        let cap = FairCap::new(Limit::Rate {
            qps: 10.0,
            burst: 1,
        });
        let stop = CancellationToken::new();
        let pump = tokio::spawn(cap.clone().run(stop.clone()));
        let (flooder, flood_counts) = budget("flood", Limit::Unlimited, &cap);
        let (quiet, quiet_counts) = budget("quiet", Limit::Unlimited, &cap);

        let mut flood = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let f = flooder.clone();
            flood.spawn(async move { f.acquire("PATCH", "x").await });
        }
        // Let the flood queue up (200 requests = 20 s of the cap).
        tokio::time::sleep(Duration::from_millis(150)).await;
        let start = Instant::now();
        quiet.acquire("PATCH", "y").await;
        let waited = start.elapsed();
        // Two drivers take turns: the quiet one gets the token after next at the latest.
        assert!(waited <= Duration::from_millis(201), "{waited:?}");
        assert_eq!(*quiet_counts.throttled.lock(), vec![Limiter::Hub]);
        let status = quiet.status();
        assert!(status.hub_cap.is_some());
        assert!(!flood_counts.throttled.lock().is_empty());

        // The cap still paces the flood: after 5 s about 50 of its requests passed.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let passed = flood_counts.waited.lock().len();
        assert!((45..=56).contains(&passed), "{passed}");
        stop.cancel();
        pump.await.expect("pump");
        flood.abort_all();
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_can_be_turned_on_and_off_at_run_time() {
        let cap = FairCap::new(Limit::Unlimited);
        let stop = CancellationToken::new();
        let pump = tokio::spawn(cap.clone().run(stop.clone()));
        let (b, _) = budget("d", Limit::Unlimited, &cap);
        let start = Instant::now();
        for _ in 0..100 {
            b.acquire("PATCH", "x").await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        cap.set_limit(Limit::Rate { qps: 1.0, burst: 1 });
        b.acquire("PATCH", "x").await;
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.acquire("PATCH", "x").await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished());
        // Turned off: the waiting request passes at once.
        cap.set_limit(Limit::Unlimited);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(waiter.is_finished());
        stop.cancel();
        pump.await.expect("pump");
    }
}
