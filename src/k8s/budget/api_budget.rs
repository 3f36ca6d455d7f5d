//! One driver's API budget: its own token bucket, then the hub's cap.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use super::{
    bucket::Bucket,
    fair_cap::{CapStatus, FairCap},
    limit::Limit,
};
use crate::k8s::pushback::{Account, Kind, PushbackStatus};
use crate::metrics::{Limiter, Observer};

/// Waits longer than this are logged at debug level, as client-go logs them at `-v=3`
/// (`longThrottleLatency`).
const LONG_WAIT: Duration = Duration::from_millis(50);
/// Waits longer than this are logged at info level, at most once per [`INFO_LOG_INTERVAL`] per
/// driver, as client-go's throttled logger does at `-v=0` (`extraLongThrottleLatency`).
const EXTRA_LONG_WAIT: Duration = Duration::from_secs(1);
/// See [`EXTRA_LONG_WAIT`].
const INFO_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// One driver's API budget: its own token bucket, then the hub's cap.
#[derive(Debug)]
pub struct ApiBudget {
    driver: String,
    own: Mutex<Bucket>,
    cap: Arc<FairCap>,
    member: u64,
    observer: Box<dyn Observer>,
    /// What the API server pushed back on this driver's requests (429s, `Retry-After`).
    pushback: Account,
    /// Requests waiting now.
    waiting: AtomicUsize,
    /// Requests that had to wait, since the budget was made.
    throttled: AtomicU64,
    /// When a long wait was last logged at info level.
    last_info_log: Mutex<Option<Instant>>,
}

/// Gives back a driver-budget reservation when its request is dropped before its turn.
struct Reservation<'a> {
    bucket: &'a Mutex<Bucket>,
    armed: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.bucket.lock().refund();
        }
    }
}

/// Counts a request as waiting while it is alive.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ApiBudget {
    /// The budget of `driver`: `limit` of its own, then `cap`.
    pub fn new(
        driver: &str,
        limit: Limit,
        cap: Arc<FairCap>,
        observer: Box<dyn Observer>,
    ) -> Arc<Self> {
        let member = cap.member();
        Arc::new(Self {
            driver: driver.to_owned(),
            own: Mutex::new(Bucket::new(limit, Instant::now())),
            cap,
            member,
            observer,
            pushback: Account::default(),
            waiting: AtomicUsize::new(0),
            throttled: AtomicU64::new(0),
            last_info_log: Mutex::new(None),
        })
    }

    /// Waits until one request of this driver may be sent. `verb` and `target` (for example
    /// `PATCH` and `volumeattachments/va-1/status`) only name the request in the log line of a
    /// long wait. Cancel-safe: a dropped call gives its reservation back.
    pub async fn acquire(&self, verb: &str, target: &str) {
        let started = Instant::now();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting);
        let mut limiter = None;

        let wait = self.own.lock().reserve(started);
        if !wait.is_zero() {
            let mut reservation = Reservation {
                bucket: &self.own,
                armed: true,
            };
            limiter = Some(Limiter::Driver);
            self.observer.throttled(Limiter::Driver);
            tokio::time::sleep(wait).await;
            reservation.armed = false;
        }
        if self.cap.acquire(self.member).await {
            limiter = Some(Limiter::Hub);
            self.observer.throttled(Limiter::Hub);
        }

        let waited = started.elapsed();
        self.observer.waited(waited);
        if limiter.is_some() {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
        if waited > LONG_WAIT {
            self.log_wait(waited, limiter, verb, target);
        }
    }

    fn log_wait(&self, waited: Duration, limiter: Option<Limiter>, verb: &str, target: &str) {
        let reason = match limiter {
            Some(Limiter::Hub) => "the hub's API cap (--hub-kube-api-qps)",
            _ => "client-side throttling, not priority and fairness",
        };
        let info = waited > EXTRA_LONG_WAIT && {
            let now = Instant::now();
            let mut last = self.last_info_log.lock();
            let due = last.is_none_or(|t| now.saturating_duration_since(t) >= INFO_LOG_INTERVAL);
            if due {
                *last = Some(now);
            }
            due
        };
        if info {
            tracing::info!(driver = %self.driver, "Waited for {waited:?} due to {reason}, request: {verb}:{target}");
        } else {
            tracing::debug!(driver = %self.driver, "Waited for {waited:?} due to {reason}, request: {verb}:{target}");
        }
    }

    /// The current settings and state, for `/drivers`.
    pub fn status(&self) -> BudgetStatus {
        let now = Instant::now();
        self.pushback_settled(now);
        let (limit, tokens) = self.own.lock().state(now);
        let cap = self.cap.status();
        BudgetStatus {
            limit,
            available_tokens: limit.qps().map(|_| tokens),
            waiting: self.waiting.load(Ordering::Relaxed),
            throttled_total: self.throttled.load(Ordering::Relaxed),
            hub_cap: cap.limit.qps().map(|_| cap),
            pushback: self.pushback.status(now),
        }
    }

    // --- pushback from the API server (see `super::pushback`) ---

    /// The driver's account of the API server's pushback.
    pub fn pushback(&self) -> &Account {
        &self.pushback
    }

    /// A 429 for one of the driver's requests (`kind`), asking to wait `wait`. Logs the start
    /// of a throttled stretch.
    pub(crate) fn too_many_requests(
        &self,
        now: Instant,
        wait: Duration,
        flow: (Option<String>, Option<String>),
        kind: Kind,
    ) {
        self.observer.too_many_requests();
        let (priority_level, flow_schema) = (flow.0.clone(), flow.1.clone());
        if let crate::k8s::pushback::Began::Now = self.pushback.too_many(now, flow) {
            let request = match kind {
                Kind::Work => "work",
                Kind::Lease => "Lease",
            };
            tracing::info!(
                driver = %self.driver,
                priority_level_uid = priority_level.as_deref().unwrap_or("-"),
                flow_schema_uid = flow_schema.as_deref().unwrap_or("-"),
                retry_after = ?wait,
                request,
                "the API server is throttling this driver's requests (429 Too Many Requests): each waits as long as the server asks (Retry-After) before it is sent again, and the driver sends fewer at a time until it stops"
            );
        }
    }

    /// Time one of the driver's requests spent waiting for `Retry-After`.
    pub(crate) fn retry_after_waited(&self, waited: Duration) {
        self.pushback.waited(waited);
        self.observer.retry_after_waited(waited);
    }

    /// An answer that asked for no wait (or a read of the status) at `now`: ends the throttled
    /// stretch, with a log line, once it has been quiet long enough.
    pub(crate) fn pushback_settled(&self, now: Instant) {
        if let Some((lasted, count)) = self.pushback.settle(now) {
            tracing::info!(
                driver = %self.driver,
                lasted = ?lasted,
                too_many_requests = count,
                "the API server no longer throttles this driver's requests"
            );
        }
    }
}

/// A driver's API budget as `/drivers` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    /// The driver's own limit.
    pub limit: Limit,
    /// Tokens in the driver's bucket now (negative: reserved by waiting requests).
    pub available_tokens: Option<f64>,
    /// Requests of this driver waiting for budget now.
    pub waiting: usize,
    /// Requests that had to wait, since the driver last connected.
    pub throttled_total: u64,
    /// The process-wide cap, when one is set.
    pub hub_cap: Option<CapStatus>,
    /// What the API server pushed back (429s, `Retry-After`) since the driver last connected.
    pub pushback: PushbackStatus,
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::k8s::budget::testing::budget;

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_free_and_then_requests_are_paced_in_order() {
        let cap = FairCap::new(Limit::Unlimited);
        let (b, counts) = budget(
            "d",
            Limit::Rate {
                qps: 10.0,
                burst: 5,
            },
            &cap,
        );
        let start = Instant::now();
        for _ in 0..5 {
            b.acquire("PATCH", "x").await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(counts.throttled.lock().is_empty());
        // Ten more at 10/s: the tenth passes one second later.
        let mut order = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..10 {
            let b = b.clone();
            tasks.spawn(async move {
                b.acquire("PATCH", "x").await;
                (i, Instant::now())
            });
            tokio::task::yield_now().await;
        }
        while let Some(r) = tasks.join_next().await {
            order.push(r.expect("task"));
        }
        order.sort_by_key(|(_, t)| *t);
        let indexes: Vec<_> = order.iter().map(|(i, _)| *i).collect();
        assert_eq!(
            indexes,
            (0..10).collect::<Vec<_>>(),
            "served in arrival order"
        );
        let last = order.last().expect("ten").1 - start;
        assert!(
            last >= Duration::from_millis(999) && last <= Duration::from_millis(1001),
            "{last:?}"
        );
        assert_eq!(counts.throttled.lock().len(), 10);
        assert_eq!(b.status().throttled_total, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn drivers_never_wait_for_each_others_tokens() {
        let cap = FairCap::new(Limit::Unlimited);
        let limit = Limit::Rate { qps: 1.0, burst: 1 };
        let (busy, _) = budget("busy", limit, &cap);
        let (quiet, quiet_counts) = budget("quiet", limit, &cap);
        // The busy driver queues 100 requests (100 s of its budget).
        let mut flood = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let busy = busy.clone();
            flood.spawn(async move { busy.acquire("PATCH", "x").await });
        }
        tokio::task::yield_now().await;
        let start = Instant::now();
        quiet.acquire("PATCH", "y").await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(quiet_counts.throttled.lock().is_empty());
        flood.abort_all();
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_request_gives_its_reservation_back() {
        let cap = FairCap::new(Limit::Unlimited);
        let (b, _) = budget("d", Limit::Rate { qps: 1.0, burst: 1 }, &cap);
        b.acquire("GET", "x").await;
        // The next token is due in 1 s; give up after 100 ms.
        let gave_up = tokio::time::timeout(Duration::from_millis(100), b.acquire("GET", "x")).await;
        assert!(gave_up.is_err());
        assert_eq!(b.status().waiting, 0);
        // The refunded token makes the next request due at 1 s, not 2 s.
        let start = Instant::now();
        b.acquire("GET", "x").await;
        let waited = start.elapsed();
        assert!(waited <= Duration::from_millis(901), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_drivers_own_budget_is_taken_before_the_cap() {
        // A driver throttled by its own budget never queues at the cap, so its pending
        // requests do not hold shared tokens.
        let cap = FairCap::new(Limit::Rate { qps: 2.0, burst: 2 });
        let stop = CancellationToken::new();
        let pump = tokio::spawn(cap.clone().run(stop.clone()));
        let (slow, _) = budget("slow", Limit::Rate { qps: 0.1, burst: 1 }, &cap);
        let (other, other_counts) = budget("other", Limit::Unlimited, &cap);
        slow.acquire("PATCH", "x").await;
        let mut slow_tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let s = slow.clone();
            slow_tasks.spawn(async move { s.acquire("PATCH", "x").await });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(cap.status().waiting_requests, 0);
        // The other driver has the remaining shared token and the next one.
        let start = Instant::now();
        other.acquire("PATCH", "y").await;
        other.acquire("PATCH", "y").await;
        assert!(start.elapsed() <= Duration::from_millis(501));
        assert_eq!(other_counts.waited.lock().len(), 2);
        stop.cancel();
        pump.await.expect("pump");
        slow_tasks.abort_all();
    }
}
