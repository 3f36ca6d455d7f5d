//! Pushback from the API server: a `429 Too Many Requests` (API Priority and Fairness turning a
//! request away) or a 5xx that carries `Retry-After` is waited out and the same request sent
//! again, as client-go's REST client does, for every request of the hub's clients.
//!
//! # client-go's rules (`k8s.io/client-go/rest`, `request.go` and `with_retry.go`, v0.36)
//!
//! * **What is retried.** An answer whose status is 429 or any status of 500 and above, *and*
//!   that carries a `Retry-After` header holding a whole number (seconds; the HTTP-date form is
//!   not read, and a header that is no number means no retry). Any other answer is final,
//!   whatever its status: a 5xx without `Retry-After` goes back to the caller at once.
//! * **Which verbs.** Every verb, writes included: the server said it did not serve the request
//!   and when to come back, so sending a PATCH or a POST again is safe. A request whose body is
//!   an opaque stream is not retried (it cannot be sent twice); ours are always bytes. Errors
//!   without an answer (a reset connection, EOF) are retried by client-go for GETs only, as if
//!   the server had answered 500 with `Retry-After: 1`; here the transport sends a request that
//!   never left again once ([`super::transport`]) and the callers retry the rest with their
//!   own backoff, so this layer retries answers only.
//! * **How many times.** At most 10 retries (`maxRetries`, 11 attempts in all); the answer to
//!   the last attempt is returned as it is.
//! * **The wait.** `Retry-After` seconds before the next attempt (client-go's default
//!   `NoBackoff` adds nothing); a zero or negative value means no wait. Before each retry the
//!   request passes the client's rate limiter again, as a new request would (here: the driver's
//!   API budget and the hub's cap).
//! * **The deadline.** The wait and the rate limiter both give up when the request's context
//!   ends, and the request fails with that error (noting the previous attempt's error). Here a
//!   request knows its deadline ([`Scope`]): a retry whose wait would end after it is not
//!   waited for at all, and the throttled answer goes back to the caller at once (whose own
//!   backoff then applies) rather than holding a worker until the deadline to fail anyway.
//! * **What it logs.** At `-v=4` each `Retry-After` answer (delay, attempt, URL); the rate
//!   limiter's wait before the retry names the reason "retries: N, retry-after: Ns -
//!   retry-reason: due to server-side throttling, FlowSchema UID: ..." for a 429. Nothing at the
//!   default level. Here a driver's throttled stretch is logged once at its start and once at
//!   its end at info level, with the priority level and FlowSchema the API server named, and
//!   counted per driver ([`crate::metrics::Observer`]).
//!
//! # Beyond client-go: a throttled driver narrows its own window
//!
//! client-go delays only the request that was turned away; a controller's other workers keep
//! sending into the priority level that just said it is full, and each finds out alone. Here a
//! 429 to one of a driver's work requests (VA and PV writes, Secret and PV reads) also narrows
//! the number of that driver's work requests in flight to half of what was in flight (at least
//! one), as a TCP sender halves its window on a loss; while it is full and nothing is refused it
//! widens again by one request a second ([`WIDEN_EVERY`]), or one per `Retry-After` of the
//! refusal that narrowed it when that is longer (slower than TCP, because a refusal costs a
//! whole `Retry-After`, and API Priority and Fairness raises it while it keeps dropping), and
//! it opens fully only after [`WINDOW_REOPEN`] without a narrowing, so the driver's next burst
//! does not go out as one crowd. Only 429s to requests sent after the last narrowing narrow it
//! again, so one crowd of refusals counts once. A throttled driver so keeps about as many requests in
//! flight as its share of the level takes, instead of refilling the queue with refusals. Its
//! Lease calls never wait for room (a leader's renewals are not queued behind its own writes),
//! and other drivers have windows of their own. Waits run in the driver's own workers; none
//! holds the hub's cap.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use super::budget::ApiBudget;

/// client-go's default `maxRetries` of a request (`rest.NewRequest`).
pub const MAX_RETRIES: u32 = 10;

/// The header in which API Priority and Fairness names the priority level a request was
/// classified into (its UID: the server does not reveal names), `X-Kubernetes-PF-PriorityLevel-UID`.
pub const PRIORITY_LEVEL_HEADER: &str = "x-kubernetes-pf-prioritylevel-uid";

/// The header in which API Priority and Fairness names the FlowSchema that matched the request
/// (its UID), `X-Kubernetes-PF-FlowSchema-UID`.
pub const FLOW_SCHEMA_HEADER: &str = "x-kubernetes-pf-flowschema-uid";

/// A throttled stretch of a driver ends when this long has passed without a 429 for it; it is
/// also the shortest gap between two of its start lines, which keeps the log quiet under
/// throttling that comes and goes.
pub const STRETCH_QUIET: Duration = Duration::from_secs(10);

/// A narrowed window widens by one request at most this often, and only while it is full and
/// nothing is refused: probing slowly, because a refusal costs its request a `Retry-After` of
/// a second or more (API Priority and Fairness raises it while it keeps dropping requests).
pub const WIDEN_EVERY: Duration = Duration::from_secs(1);

/// A narrowed window opens fully at the first answer this long after its last narrowing.
/// Longer than a throttled stretch: a window that opened as soon as the driver went quiet would
/// send the driver's next burst (the detaches after the attaches) as one crowd into the level
/// that just refused it, and a crowd of refusals makes API Priority and Fairness raise its
/// `Retry-After` (it doubles while drops go on), which every refused request then waits.
pub const WINDOW_REOPEN: Duration = Duration::from_secs(120);

/// How long the server asks to wait before the request is sent again, if it asks (see the
/// module's rules): `Some` for a 429 or a 5xx with a whole number of seconds in `Retry-After`.
pub fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let seconds: i64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.max(0).unsigned_abs()))
}

/// The priority level and FlowSchema (UIDs) API Priority and Fairness named in an answer.
fn flow(headers: &HeaderMap) -> (Option<String>, Option<String>) {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    (get(PRIORITY_LEVEL_HEADER), get(FLOW_SCHEMA_HEADER))
}

// === one driver's account ===

/// One driver's account of the API server's pushback: what it received and waited, its
/// throttled stretch, and until when its work requests are held.
#[derive(Debug, Default)]
pub struct Account {
    /// 429 answers received (work and Lease requests).
    too_many_requests: AtomicU64,
    /// Nanoseconds spent waiting for `Retry-After` before retries.
    waited_nanos: AtomicU64,
    state: Mutex<Stretch>,
    /// The driver's window of work requests in flight.
    window: Mutex<Window>,
    /// Wakes work requests waiting for room in the window.
    freed: tokio::sync::Notify,
}

/// How many work requests of the driver may be in flight.
#[derive(Debug, Default)]
struct Window {
    /// The limit while narrowed (at least 1); `None`: open.
    limit: Option<f64>,
    /// Work requests in flight now.
    in_flight: usize,
    /// When it was last narrowed: only 429s to requests sent since narrow it again.
    narrowed: Option<Instant>,
    /// When it was last narrowed or widened.
    changed: Option<Instant>,
    /// The `Retry-After` of the 429 that last narrowed it: the price of the next refusal.
    price: Duration,
}

/// A work request's place in its driver's window; gives it back when dropped.
pub(crate) struct Room<'a>(&'a Account);

impl Drop for Room<'_> {
    fn drop(&mut self) {
        self.0.window.lock().in_flight -= 1;
        self.0.freed.notify_waiters();
    }
}

/// The current (or last) throttled stretch.
#[derive(Debug, Default)]
struct Stretch {
    /// When the current stretch began; `None` when not throttled.
    since: Option<Instant>,
    /// The last 429.
    last: Option<Instant>,
    /// 429s in the current stretch.
    count: u64,
    /// Priority level and FlowSchema UIDs of the last 429 that named them.
    priority_level: Option<String>,
    flow_schema: Option<String>,
}

/// What a 429 did to the stretch.
pub(crate) enum Began {
    /// It began a stretch.
    Now,
    /// The driver was throttled already.
    Before,
}

impl Account {
    /// A 429 at `now`.
    pub(crate) fn too_many(&self, now: Instant, flow: (Option<String>, Option<String>)) -> Began {
        self.too_many_requests.fetch_add(1, Ordering::Relaxed);
        let mut s = self.state.lock();
        let began = if s.since.is_some() {
            Began::Before
        } else {
            s.since = Some(now);
            s.count = 0;
            Began::Now
        };
        s.count += 1;
        s.last = Some(now);
        let (pl, fs) = flow;
        if pl.is_some() {
            s.priority_level = pl;
        }
        if fs.is_some() {
            s.flow_schema = fs;
        }
        began
    }

    pub(crate) fn waited(&self, waited: Duration) {
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.waited_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Waits for room in the window for one work request.
    pub(crate) async fn enter(&self) -> Room<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut w = self.window.lock();
                let room = w
                    .limit
                    .is_none_or(|l| (w.in_flight as f64) < l.floor().max(1.0));
                if room {
                    w.in_flight += 1;
                    return Room(self);
                }
            }
            freed.await;
        }
    }

    /// The answer to a work request sent at `sent` came at `now` (its room still held): a 429
    /// (`refused`, with its `Retry-After`) narrows the window to half of what is in flight,
    /// unless it was sent before the last narrowing; any other answer to a full window widens
    /// it by one, at most once per [`WIDEN_EVERY`] or per the `Retry-After` of the last
    /// narrowing, whichever is longer: the dearer a refusal, the slower the probing.
    pub(crate) fn answered(&self, sent: Instant, now: Instant, refused: Option<Duration>) {
        let mut w = self.window.lock();
        if let Some(retry_after) = refused {
            if w.narrowed.is_none_or(|t| sent >= t) {
                w.price = retry_after;
                let flight = w.in_flight as f64;
                let base = w.limit.map_or(flight, |l| l.min(flight));
                w.limit = Some((base / 2.0).max(1.0).floor());
                w.narrowed = Some(now);
                w.changed = Some(now);
            }
        } else if w
            .narrowed
            .is_some_and(|t| now.saturating_duration_since(t) >= WINDOW_REOPEN)
        {
            // Long without a refusal: the level has room again.
            w.limit = None;
            w.narrowed = None;
            w.changed = None;
            drop(w);
            self.freed.notify_waiters();
        } else if let Some(l) = w.limit {
            let full = w.in_flight as f64 >= l;
            let every = WIDEN_EVERY.max(w.price);
            let due = w
                .changed
                .is_none_or(|t| now.saturating_duration_since(t) >= every);
            if full && due {
                w.limit = Some(l + 1.0);
                w.changed = Some(now);
            }
        }
    }

    /// Ends the stretch if [`STRETCH_QUIET`] has passed since its last 429; returns its length
    /// and 429 count when it ended now.
    pub(crate) fn settle(&self, now: Instant) -> Option<(Duration, u64)> {
        let mut s = self.state.lock();
        let since = s.since?;
        let last = s.last.unwrap_or(since);
        if now.saturating_duration_since(last) < STRETCH_QUIET {
            return None;
        }
        s.since = None;
        Some((last.saturating_duration_since(since), s.count))
    }

    /// The account as `/drivers` shows it.
    pub fn status(&self, now: Instant) -> PushbackStatus {
        let s = self.state.lock();
        let throttled = s.since.is_some()
            && s.last
                .is_some_and(|l| now.saturating_duration_since(l) < STRETCH_QUIET);
        let w = self.window.lock();
        PushbackStatus {
            too_many_requests: self.too_many_requests.load(Ordering::Relaxed),
            retry_after_wait_seconds: Duration::from_nanos(
                self.waited_nanos.load(Ordering::Relaxed),
            )
            .as_secs_f64(),
            throttled,
            throttled_seconds: s
                .since
                .filter(|_| throttled)
                .map(|t| now.saturating_duration_since(t).as_secs_f64()),
            window: w.limit,
            in_flight: w.in_flight,
            priority_level_uid: s.priority_level.clone(),
            flow_schema_uid: s.flow_schema.clone(),
        }
    }
}

/// A driver's pushback from the API server as `/drivers` shows it (under `apiBudget`).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushbackStatus {
    /// 429 answers received since the driver last connected.
    pub too_many_requests: u64,
    /// Seconds its requests waited for `Retry-After` since it last connected.
    pub retry_after_wait_seconds: f64,
    /// Whether the API server throttles the driver now (a 429 within the last
    /// [`STRETCH_QUIET`]).
    pub throttled: bool,
    /// How long the current throttled stretch has lasted.
    pub throttled_seconds: Option<f64>,
    /// How many work requests of the driver may be in flight while it is throttled (`None`:
    /// no limit).
    pub window: Option<f64>,
    /// Work requests of the driver in flight now.
    pub in_flight: usize,
    /// The priority level API Priority and Fairness last named in a 429 (UID).
    pub priority_level_uid: Option<String>,
    /// The FlowSchema it last named (UID).
    pub flow_schema_uid: Option<String>,
}

// === the scope of a request ===

/// Whose request it is, and what it may cost: set around a driver's API calls with
/// [`scoped`], read by the [`RetryAfter`] service as it sends them.
#[derive(Clone, Debug)]
pub struct Scope {
    /// The driver's budget: its account, and the tokens a retried work request spends.
    budget: Arc<ApiBudget>,
    /// Work (within the driver's window; retries spend budget) or a Lease call.
    kind: Kind,
    /// When the caller gives up on the request.
    deadline: Instant,
}

/// What a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A driver's work (VA and PV writes, reads for them): sent within the driver's window;
    /// each retry spends the driver's budget.
    Work,
    /// A Lease call of the driver's elector: never waits for room, spends no budget (leader
    /// election has a client of its own, as in the Go sidecar).
    Lease,
}

impl Scope {
    /// A scope for `budget`'s driver.
    pub fn new(budget: Arc<ApiBudget>, kind: Kind, deadline: Instant) -> Self {
        Self {
            budget,
            kind,
            deadline,
        }
    }
}

tokio::task_local! {
    static SCOPE: Scope;
}

/// Runs `request` (one or more API calls) in `scope`.
pub async fn scoped<F: Future>(scope: Scope, request: F) -> F::Output {
    SCOPE.scope(scope, request).await
}

// === the service ===

/// The layer that puts [`RetryAfter`] over a service.
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryAfterLayer;

impl<S> tower::Layer<S> for RetryAfterLayer {
    type Service = RetryAfter<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryAfter { inner }
    }
}

/// Sends each request again when the server asks for it (module rules), within the request's
/// [`Scope`] when it has one: its deadline, its driver's budget and account.
#[derive(Clone, Debug)]
pub struct RetryAfter<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<kube::client::Body>> for RetryAfter<S>
where
    S: tower::Service<Request<kube::client::Body>, Response = Response<B>, Error = tower::BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, tower::BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        // The ready clone sends the first attempt; another clone the retries.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        // kube's client runs this call in its buffer's task but polls the future in the
        // caller's: the scope is read on the first poll.
        Box::pin(send(inner, request))
    }
}

/// Why a work request was not sent.
#[derive(Debug, thiserror::Error)]
#[error(
    "{method} {path}: no room before this request's deadline in the driver's window of requests in flight, narrowed while the API server throttles it"
)]
pub struct NoRoom {
    method: http::Method,
    path: String,
}

async fn send<S, B>(
    mut inner: S,
    request: Request<kube::client::Body>,
) -> Result<Response<B>, tower::BoxError>
where
    S: tower::Service<Request<kube::client::Body>, Response = Response<B>, Error = tower::BoxError>
        + Clone,
{
    use tower::ServiceExt;

    let scope = SCOPE.try_with(Scope::clone).ok();
    let (head, body) = request.into_parts();
    let body: Bytes = body.collect().await?.to_bytes();
    let path = head.uri.path().to_owned();
    let mut retries = 0;
    loop {
        let room = match &scope {
            Some(scope) if scope.kind == Kind::Work => {
                if retries > 0 {
                    scope.budget.acquire(head.method.as_str(), &path).await;
                }
                let account = scope.budget.pushback();
                match tokio::time::timeout_at(scope.deadline, account.enter()).await {
                    Ok(room) => Some(room),
                    Err(_) => {
                        return Err(NoRoom {
                            method: head.method.clone(),
                            path,
                        }
                        .into());
                    }
                }
            }
            _ => None,
        };
        let sent = Instant::now();
        let attempt = Request::from_parts(head.clone(), kube::client::Body::from(body.clone()));
        let response = inner.ready().await?.call(attempt).await?;
        let now = Instant::now();
        let wait = retry_after(response.status(), response.headers());
        let too_many = wait.is_some() && response.status() == StatusCode::TOO_MANY_REQUESTS;
        if let Some(scope) = &scope {
            if room.is_some() {
                let refused = wait.filter(|_| too_many);
                scope.budget.pushback().answered(sent, now, refused);
            }
            drop(room);
            if too_many {
                scope.budget.too_many_requests(
                    now,
                    wait.unwrap_or_default(),
                    flow(response.headers()),
                    scope.kind,
                );
            } else if wait.is_none() {
                scope.budget.pushback_settled(now);
            }
        }
        let Some(wait) = wait else {
            return Ok(response);
        };
        if retries >= MAX_RETRIES {
            tracing::debug!(method = %head.method, path, retries, "the API server still turns the request away after the last retry");
            return Ok(response);
        }
        let until = now + wait;
        if scope.as_ref().is_some_and(|s| until > s.deadline) {
            tracing::debug!(method = %head.method, path, ?wait, "Retry-After ends beyond the request's deadline; not retried");
            return Ok(response);
        }
        tracing::debug!(method = %head.method, path, status = response.status().as_u16(), ?wait, attempt = retries + 1, "Got a Retry-After response");
        drop(response);
        tokio::time::sleep_until(until).await;
        if let Some(scope) = &scope {
            scope.budget.retry_after_waited(wait);
        }
        retries += 1;
    }
}

#[cfg(test)]
mod tests;
