//! Client-side API request budgets.
//!
//! Every Go sidecar has its own client-go rate limiter (`--kube-api-qps`/`--kube-api-burst`), so
//! a hub that replaces N sidecars gives each driver its own [`ApiBudget`] with exactly those
//! limits: a driver never waits for another driver's tokens. On top of that, an operator may set
//! an optional process-wide [`FairCap`] (off by default) that bounds the hub's total request
//! rate and hands its tokens to the waiting drivers in turn, so a driver with one pending write
//! is served within about one round of the drivers that wait, however many writes another
//! driver has queued.
//!
//! Order: the driver's own budget is taken first, then the cap, so a driver held back by its
//! own budget never holds shared tokens.
//!
//! Hand-written because the two crates that offer token buckets (`governor`, `leaky-bucket`)
//! have no notion of fairness between callers, and client-go's limiter is a reservation-based
//! token bucket (`golang.org/x/time/rate`) whose FIFO pacing we reproduce in `Bucket`.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::{sync::oneshot, time::Instant};
use tokio_util::sync::CancellationToken;

use super::pushback::{Account, Kind, PushbackStatus};
use crate::metrics::{Limiter, Observer};

/// client-go's `rest.DefaultQPS`: what a QPS of 0 means.
const CLIENT_GO_DEFAULT_QPS: f64 = 5.0;
/// client-go's `rest.DefaultBurst`: what a burst of 0 means.
const CLIENT_GO_DEFAULT_BURST: u32 = 10;
/// Waits longer than this are logged at debug level, as client-go logs them at `-v=3`
/// (`longThrottleLatency`).
const LONG_WAIT: Duration = Duration::from_millis(50);
/// Waits longer than this are logged at info level, at most once per [`INFO_LOG_INTERVAL`] per
/// driver, as client-go's throttled logger does at `-v=0` (`extraLongThrottleLatency`).
const EXTRA_LONG_WAIT: Duration = Duration::from_secs(1);
/// See [`EXTRA_LONG_WAIT`].
const INFO_LOG_INTERVAL: Duration = Duration::from_secs(10);

// === limits ===

/// A request rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Limit {
    /// No client-side limit.
    Unlimited,
    /// `qps` requests per second on average, bursts of up to `burst`.
    Rate {
        /// Tokens per second; finite and greater than zero.
        qps: f64,
        /// Bucket size; at least 1.
        burst: u32,
    },
}

impl Limit {
    /// What client-go makes of a QPS/burst pair (`rest.Config`): QPS 0 means 5, burst 0 means
    /// 10, and a negative QPS turns the limiter off. `burst` must not be negative; callers
    /// refuse that before.
    pub fn client_go(qps: f64, burst: u32) -> Self {
        let qps = if qps == 0.0 {
            CLIENT_GO_DEFAULT_QPS
        } else {
            qps
        };
        let burst = if burst == 0 {
            CLIENT_GO_DEFAULT_BURST
        } else {
            burst
        };
        Self::rate(qps, burst)
    }

    /// The process-wide cap from `--hub-kube-api-qps`/`--hub-kube-api-burst` (or the
    /// `hubKubeApiQps`/`hubKubeApiBurst` fields): QPS 0 (the default) or below means no cap;
    /// burst 0 means twice the QPS (client-go's default ratio), at least 1.
    pub fn cap(qps: f64, burst: u32) -> Self {
        // NaN and non-positive values alike mean no cap.
        if qps.is_nan() || qps <= 0.0 {
            return Self::Unlimited;
        }
        let burst = if burst == 0 {
            // Saturating float-to-int conversion; at least one token.
            ((qps * 2.0).ceil() as u32).max(1)
        } else {
            burst
        };
        Self::rate(qps, burst)
    }

    fn rate(qps: f64, burst: u32) -> Self {
        if qps.is_finite() && qps > 0.0 {
            Self::Rate {
                qps,
                burst: burst.max(1),
            }
        } else {
            Self::Unlimited
        }
    }

    /// The rate, if limited.
    pub fn qps(&self) -> Option<f64> {
        match self {
            Self::Unlimited => None,
            Self::Rate { qps, .. } => Some(*qps),
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unlimited => f.write_str("no limit"),
            Self::Rate { qps, burst } => write!(f, "{qps} QPS, burst {burst}"),
        }
    }
}

// === token bucket ===

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug)]
struct Bucket {
    limit: Limit,
    /// Tokens at `last`; negative when reservations are outstanding.
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(limit: Limit, now: Instant) -> Self {
        let tokens = match limit {
            Limit::Unlimited => 0.0,
            Limit::Rate { burst, .. } => f64::from(burst),
        };
        Self {
            limit,
            tokens,
            last: now,
        }
    }

    /// Brings `tokens` up to `now`.
    fn advance(&mut self, now: Instant) {
        if let Limit::Rate { qps, burst } = self.limit {
            let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * qps).min(f64::from(burst));
        }
        self.last = self.last.max(now);
    }

    /// Reserves one token (golang.org/x/time/rate's `reserveN`): the token is ours after the
    /// returned wait. Reservations are served in the order they are made.
    fn reserve(&mut self, now: Instant) -> Duration {
        let Limit::Rate { qps, .. } = self.limit else {
            return Duration::ZERO;
        };
        self.advance(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / qps)
        }
    }

    /// Gives back a reserved token that was not used.
    fn refund(&mut self) {
        if let Limit::Rate { burst, .. } = self.limit {
            self.tokens = (self.tokens + 1.0).min(f64::from(burst));
        }
    }

    /// Takes a token if one is there now.
    fn try_take(&mut self, now: Instant) -> bool {
        match self.limit {
            Limit::Unlimited => true,
            Limit::Rate { .. } => {
                self.advance(now);
                if self.tokens >= 1.0 {
                    self.tokens -= 1.0;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// How long until a whole token is there.
    fn until_next(&self) -> Duration {
        match self.limit {
            Limit::Unlimited => Duration::ZERO,
            Limit::Rate { qps, .. } => {
                Duration::from_secs_f64(((1.0 - self.tokens) / qps).max(0.0))
            }
        }
    }

    /// A new limit; keeps the tokens there are, within the new burst.
    fn set_limit(&mut self, limit: Limit, now: Instant) {
        self.advance(now);
        self.tokens = match (self.limit, limit) {
            (_, Limit::Unlimited) => 0.0,
            (Limit::Unlimited, Limit::Rate { burst, .. }) => f64::from(burst),
            (Limit::Rate { .. }, Limit::Rate { burst, .. }) => self.tokens.min(f64::from(burst)),
        };
        self.limit = limit;
    }

    fn state(&mut self, now: Instant) -> (Limit, f64) {
        self.advance(now);
        (self.limit, self.tokens)
    }
}

// === the process-wide cap ===

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

    fn member(&self) -> u64 {
        self.next_member.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes one token for `member`; `true` if it had to wait. Never waits when no limit is
    /// set. Cancel-safe: a dropped call uses no token.
    async fn acquire(&self, member: u64) -> bool {
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

    fn status(&self) -> CapStatus {
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

// === one driver's budget ===

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
        if let super::pushback::Began::Now = self.pushback.too_many(now, flow) {
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

    #[derive(Debug, Default)]
    struct Counts {
        waited: Mutex<Vec<Duration>>,
        throttled: Mutex<Vec<Limiter>>,
    }

    #[derive(Debug)]
    struct Shared(Arc<Counts>);

    impl Observer for Shared {
        fn waited(&self, waited: Duration) {
            self.0.waited.lock().push(waited);
        }
        fn throttled(&self, limiter: Limiter) {
            self.0.throttled.lock().push(limiter);
        }
    }

    fn budget(name: &str, limit: Limit, cap: &Arc<FairCap>) -> (Arc<ApiBudget>, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        let b = ApiBudget::new(name, limit, cap.clone(), Box::new(Shared(counts.clone())));
        (b, counts)
    }

    #[test]
    fn client_go_defaults_apply_to_zero_and_a_negative_qps_means_no_limit() {
        assert_eq!(
            Limit::client_go(0.0, 0),
            Limit::Rate {
                qps: 5.0,
                burst: 10
            }
        );
        assert_eq!(Limit::client_go(2.5, 7), Limit::Rate { qps: 2.5, burst: 7 });
        assert_eq!(Limit::client_go(-1.0, 10), Limit::Unlimited);
        assert_eq!(Limit::client_go(f64::NAN, 10), Limit::Unlimited);
    }

    #[test]
    fn the_cap_is_off_by_default_and_its_burst_defaults_to_twice_the_qps() {
        assert_eq!(Limit::cap(0.0, 0), Limit::Unlimited);
        assert_eq!(Limit::cap(-3.0, 5), Limit::Unlimited);
        assert_eq!(
            Limit::cap(50.0, 0),
            Limit::Rate {
                qps: 50.0,
                burst: 100
            }
        );
        assert_eq!(Limit::cap(0.2, 0), Limit::Rate { qps: 0.2, burst: 1 });
        assert_eq!(
            Limit::cap(50.0, 60),
            Limit::Rate {
                qps: 50.0,
                burst: 60
            }
        );
    }

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
