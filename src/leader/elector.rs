//! [`LeaderElector`]: client-go's `LeaderElector` over one Lease (acquire, lead while renewals
//! succeed, release), publishing [`Leadership`] through a `watch` channel.

mod pace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::config::Config;
use super::error::{Error, Result};
use super::health::Status;
use super::lean::LeanLease;
use super::record::{
    Observed, Record, acquire_record, create_record, held_by_other, is_lease_valid, observe,
    release_record,
};
use super::timing::{JITTER_FACTOR, RenewGrid};
use crate::backoff::Doubling;
use crate::k8s::budget::ApiBudget;
use crate::k8s::pushback::{Kind, Scope, scoped};
use crate::random::random_unit;
use pace::{Attempt, Next, Pace, Report, Turn, Wake};

/// First pause after a failed attempt to acquire (the API server did not answer); it doubles
/// up to [`ERROR_RETRY_MAX`] (or the retry period, if shorter) while failures go on (see
/// [`LeaderElector::acquire`]).
const ERROR_RETRY_MIN: Duration = Duration::from_millis(500);

/// Longest pause between attempts while the API server does not answer: one GET per Lease
/// every 2 s costs a server that is down nothing (its port refuses at once) and brings the
/// Leases back within 2 s of its return.
const ERROR_RETRY_MAX: Duration = Duration::from_secs(2);

/// The pauses after failed attempts in a row, before the retry period bounds them (from the
/// second on; see [`pace`]).
const ERROR_BACKOFF: Doubling = Doubling::new(ERROR_RETRY_MIN, ERROR_RETRY_MAX);

/// A candidate fed by a watch tries this long after the Lease it watches expired (its holder's
/// clock and ours may differ by the API server's write delay).
const EXPIRY_MARGIN: Duration = Duration::from_millis(100);

/// While attempts to acquire the Lease fail, a warning at most this often (the failures in
/// between at debug level): an API server away for long is a few lines a minute per driver,
/// not one per attempt.
const ACQUIRE_LOG_EVERY: Duration = Duration::from_secs(30);

/// Longest wait for the Lease release on shutdown (bounded further by the renew deadline).
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// This candidate's view of the election, published through a `watch` channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// We do not lead; `holder` is the identity of the current holder when known.
    Standby {
        /// The last observed `holderIdentity`, `None` when unknown or empty.
        holder: Option<String>,
    },
    /// We hold the Lease: controllers may work.
    Leading,
}

impl Leadership {
    /// Whether this is [`Leadership::Leading`].
    pub fn is_leading(&self) -> bool {
        matches!(self, Leadership::Leading)
    }
}

/// client-go `wait.Jitter(period, factor)`: `period + r × factor × period` for `r ∈ [0, 1)`.
fn jittered(period: Duration, r: f64) -> Duration {
    period.mul_f64(1.0 + r.clamp(0.0, 1.0) * JITTER_FACTOR)
}

/// Why the leading phase ended.
enum LeadEnd {
    /// The shutdown token was cancelled.
    Cancelled,
    /// Renewals failed for `renew_deadline`.
    Lost,
}

/// A leader elector for one Lease; [`LeaderElector::spawn`] runs it.
#[derive(Debug)]
pub struct LeaderElector {
    /// API for Leases in `config.namespace`, read without their managed fields.
    api: Api<LeanLease>,
    /// Validated settings.
    config: Config,
    /// Shared view for HTTP endpoints.
    status: Status,
    /// Publishes our leadership.
    tx: watch::Sender<Leadership>,
    /// The last record observed and when it changed (client-go `observedRecord`/`observedTime`).
    observed: Option<Observed>,
    /// The last Lease object read or written; its `resourceVersion` guards our next update.
    lease: Option<Lease>,
    /// The holder last reported in logs/the watch value (client-go `reportedLeader`).
    reported_holder: String,
    /// Asked before every acquisition attempt (not before renewals): `false`
    /// skips the attempt. Hub replicas use it to stay within their share.
    gate: Option<AcquireGate>,
    /// Copies of the Lease as a watch sees them (`None`: deleted). A standby candidate then
    /// knows of every renewal the moment it is written, so it judges expiry from the holder's
    /// real last renewal instead of from its own last poll (which lags by up to a jittered retry
    /// period), tries at the instant the Lease expires, and at once when it is vacated.
    feed: Option<watch::Receiver<Option<Seen>>>,
    /// Renewal rounds start on these lines (`None`: a retry period after the last success, as
    /// client-go's).
    grid: Option<RenewGrid>,
    /// The driver's API budget, whose account counts the API server's pushback on the Lease
    /// calls (`None`: not counted; the calls still wait out `Retry-After`).
    pushback: Option<Arc<ApiBudget>>,
}

/// A copy of the Lease as a watch delivered it, and when. The sender outlives elections: a
/// new elector (a new term, after a hand-over) starts from the last copy and the instant it was
/// seen, so a dead holder's Lease expires for it on time instead of a lease duration after the
/// elector's own first read.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The Lease (`None`: deleted).
    pub lease: Option<Lease>,
    /// When the watch delivered it.
    pub at: Instant,
}

impl Seen {
    /// `lease` seen now.
    pub fn now(lease: Option<Lease>) -> Self {
        Seen {
            lease,
            at: Instant::now(),
        }
    }
}

/// A predicate that allows or skips acquisition attempts, and optionally signals that it may
/// have turned from no to yes (so that a gated candidate tries at once instead of at its next
/// jittered attempt), and an optional check made only when the Lease is there for the taking
/// (vacant, expired or missing), right before the write that would take it.
#[derive(Clone)]
pub struct AcquireGate {
    allows: std::sync::Arc<dyn Fn() -> bool + Send + Sync>,
    /// Each change of any of them means the gate may have opened.
    opened: Vec<watch::Receiver<u64>>,
    /// Asked right before taking the Lease; `false` leaves it alone.
    check: Option<std::sync::Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>>,
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl AcquireGate {
    /// A gate that asks `allows` before every acquisition attempt.
    pub fn new(allows: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        AcquireGate {
            allows: std::sync::Arc::new(allows),
            opened: Vec::new(),
            check: None,
        }
    }

    /// Asks `check` right before a write that would take the Lease from nobody (vacant,
    /// expired, or not created yet), never before a renewal: a check that costs an API call is
    /// made only when its answer can matter.
    pub fn checked_by<F, Fut>(mut self, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        self.check = Some(std::sync::Arc::new(move || Box::pin(check())));
        self
    }

    /// Every change of `opened` means the gate may have opened (call once per signal: a gate
    /// that combines several conditions is woken by each).
    pub fn woken_by(mut self, opened: watch::Receiver<u64>) -> Self {
        self.opened.push(opened);
        self
    }

    fn allows(&self) -> bool {
        (self.allows)()
    }
}

impl std::fmt::Debug for AcquireGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AcquireGate")
    }
}

impl LeaderElector {
    /// An elector over `api` (which must address `config.namespace`; use
    /// `Api::namespaced(client, &config.namespace)` with a client dedicated to leader election).
    pub fn new(api: Api<Lease>, config: Config) -> Result<LeaderElector> {
        config.validate()?;
        let (tx, _) = watch::channel(Leadership::Standby { holder: None });
        Ok(LeaderElector {
            api: Api::namespaced(api.into_client(), &config.namespace),
            status: Status::new(&config),
            config,
            tx,
            observed: None,
            lease: None,
            reported_holder: String::new(),
            gate: None,
            feed: None,
            grid: None,
            pushback: None,
        })
    }

    /// Counts the API server's pushback on the Lease calls (429s, `Retry-After` waits) in
    /// `budget`'s driver account; the calls spend none of its budget and are never held
    /// behind the driver's throttled work.
    pub fn with_pushback(mut self, budget: Arc<ApiBudget>) -> Self {
        self.pushback = Some(budget);
        self
    }

    /// Start renewal rounds on the lines of `grid` (shared with the process's other electors,
    /// so that renewals due together go out together).
    pub fn with_renew_grid(mut self, grid: RenewGrid) -> Self {
        self.grid = Some(grid);
        self
    }

    /// Observe the Lease through `feed` (copies from a watch) while waiting to acquire it,
    /// starting from the copy it holds now, as observed when the watch delivered it.
    pub fn with_feed(mut self, mut feed: watch::Receiver<Option<Seen>>) -> Self {
        let current = feed.borrow_and_update().clone();
        if let Some(seen) = current {
            self.absorb(seen);
        }
        self.feed = Some(feed);
        self
    }

    /// Takes in a copy of the Lease from the feed; returns when the next attempt is due: now
    /// if the Lease is gone or vacant, at its expiry if someone else holds it, else `None`
    /// (keep the current pause).
    fn absorb(&mut self, seen: Seen) -> Option<Instant> {
        let now = Instant::now();
        let Some(lease) = seen.lease else {
            return Some(now);
        };
        if lease.metadata.name.as_deref() != Some(self.config.name.as_str()) {
            return None;
        }
        let record = Record::from_spec(lease.spec.as_ref());
        let vacant = record.holder.is_empty();
        self.lease = Some(lease);
        observe(&mut self.observed, record, seen.at.min(now));
        self.report_holder();
        if vacant {
            return Some(now);
        }
        pace::foreign_expiry(
            self.observed.as_ref(),
            &self.config.identity,
            self.config.lease_duration,
        )
    }

    /// Only try to acquire the Lease while `gate` says yes (renewing a held
    /// Lease is never gated).
    pub fn with_acquire_gate(mut self, gate: AcquireGate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The shared status view; clone it out before [`LeaderElector::spawn`].
    pub fn status(&self) -> Status {
        self.status.clone()
    }

    /// Starts the election in a task instrumented with the Lease name. The task runs until
    /// `shutdown` is cancelled; then, if we lead, it publishes `Standby` and (with
    /// `release_on_cancel`) vacates the Lease before ending. It ends with an error only if that
    /// release failed. The caller keeps the returned handle and awaits it at shutdown: a dropped
    /// handle would leave the release unobserved.
    pub fn spawn(
        self,
        shutdown: CancellationToken,
    ) -> (watch::Receiver<Leadership>, JoinHandle<Result<()>>) {
        let rx = self.tx.subscribe();
        // The Lease and its namespace: the driver (and so the Lease) comes from the span of
        // the caller; the identity is the process's, logged once at start-up.
        let span = info_span!("leader_election", lease_namespace = %self.config.namespace);
        let handle = tokio::spawn(self.run(shutdown).instrument(span));
        (rx, handle)
    }

    /// Like [`LeaderElector::spawn`], but runs the election in `runner`'s task, with the other
    /// electors it runs (a hub's): their renewals of a round wake one task and leave together.
    /// Dropping the handle ends the election, as aborting its task would.
    pub fn spawn_in(
        self,
        runner: &super::Runner,
        shutdown: CancellationToken,
    ) -> (
        watch::Receiver<Leadership>,
        super::runner::Handle<Result<()>>,
    ) {
        let rx = self.tx.subscribe();
        let span = info_span!("leader_election", lease_namespace = %self.config.namespace);
        let handle = runner.run(self.run(shutdown).instrument(span));
        (rx, handle)
    }

    /// The election loop: acquire, lead while renewals succeed, repeat until cancelled.
    async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        info!("attempting to acquire leader lease");
        loop {
            if !self.acquire(&shutdown).await {
                return Ok(());
            }
            self.set_leading(true);
            match self.lead(&shutdown).await {
                LeadEnd::Lost => {
                    info!("stopped leading: lost the lease");
                    self.set_leading(false);
                }
                LeadEnd::Cancelled => {
                    info!("stopped leading: shutting down");
                    self.set_leading(false);
                    if self.config.release_on_cancel {
                        return self.release().await;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Tries to acquire every jittered retry period until it succeeds (`true`) or `shutdown`
    /// is cancelled (`false`).
    ///
    /// While the API server does not answer, attempts come sooner: [`ERROR_RETRY_MIN`]
    /// doubling up to the jittered retry period. A hub that lost its Leases to a network
    /// cut-off takes them back within moments of the network's return (nobody else can have
    /// taken a Lease still recorded as ours before it expires); a candidate that got an answer
    /// (the Lease is held by someone else) keeps client-go's pace. The decisions are
    /// [`pace`]'s.
    async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        let mut pace = Pace::new(self.config.retry_period);
        loop {
            let deadline = Instant::now() + self.config.renew_deadline;
            let allowed = self.gate.as_ref().is_none_or(AcquireGate::allows);
            let Some(result) = self.attempt(allowed, deadline, shutdown).await else {
                return false;
            };
            let attempt = match result {
                Ok(true) => Attempt::Acquired,
                Ok(false) => Attempt::Answered,
                Err(e) => Attempt::Failed(e.one_line()),
            };
            // The gate opened while we only looked: try at once, not a retry period later. A
            // driver's own lost Lease is counted out of the replica's share a moment after this
            // elector reports the loss, so the first look after a loss is often gated by the
            // loss itself; the signal that the gate opened may have come during the look.
            if pace::look_again_at_once(allowed, &attempt, || {
                self.gate.as_ref().is_some_and(AcquireGate::allows)
            }) {
                continue;
            }
            match pace.after(attempt, jittered(self.config.retry_period, random_unit())) {
                Next::Lead => {
                    debug!("successfully acquired lease");
                    return true;
                }
                Next::Pause { pause, report } => {
                    if let Some(report) = report {
                        log_attempt(report);
                    }
                    let due = pace::due(
                        Instant::now(),
                        pause,
                        self.observed.as_ref(),
                        &self.config.identity,
                        self.config.lease_duration,
                    );
                    if !self.wait_turn(due, shutdown).await {
                        return false;
                    }
                }
            }
        }
    }

    /// One attempt, its calls bounded by `deadline`: to take the Lease (or renew it) if
    /// `allowed`, else only to look at it, so that the holder stays known. `None`: `shutdown`
    /// was cancelled first.
    async fn attempt(
        &mut self,
        allowed: bool,
        deadline: Instant,
        shutdown: &CancellationToken,
    ) -> Option<Result<bool>> {
        if allowed {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                result = self.try_acquire_or_renew(deadline) => Some(result),
            }
        } else {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                result = self.observe_only(deadline) => Some(result.map(|()| false)),
            }
        }
    }

    /// Waits for the next attempt, due at `due` unless a copy of the Lease from the feed brings
    /// it forward or the gate opens; `false`: `shutdown` was cancelled first.
    async fn wait_turn(&mut self, mut due: Instant, shutdown: &CancellationToken) -> bool {
        loop {
            // A gated attempt is repeated the moment the gate may have opened.
            let closed = self.gate.as_ref().is_some_and(|g| !g.allows());
            let wake = tokio::select! {
                biased;
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep_until(due) => Wake::Due,
                seen = next_copy(self.feed.as_mut()) => {
                    Wake::Seen(seen.and_then(|seen| self.absorb(seen)))
                }
                () = gate_signal(self.gate.as_mut(), closed) => Wake::Opened {
                    allows: self.gate.as_ref().is_some_and(AcquireGate::allows),
                },
            };
            match pace::turn(due, wake) {
                Turn::Now => return true,
                Turn::WaitUntil(at) => due = at,
            }
        }
    }

    /// Renews every retry period; returns when a renewal round has failed for `renew_deadline`,
    /// when another candidate is seen holding the Lease, or when `shutdown` is cancelled.
    ///
    /// As client-go's `renew`: a round starts one retry period after the last success and tries
    /// at once, then every retry period, until `renew_deadline` after the round started; every
    /// call of the round is bounded by that deadline. So a transient error (a 403 or 503 from an
    /// API server that is restarting) costs nothing as long as a later try of the round works.
    /// One deliberate difference, which ends leadership earlier, never later: a Lease observed in
    /// another candidate's hands ends leadership at once instead of at the deadline. On a renew
    /// grid a round starts on a line ([`RenewGrid::round_start`]), at most a slot after
    /// client-go's start; its deadline still counts from client-go's start.
    async fn lead(&mut self, shutdown: &CancellationToken) -> LeadEnd {
        let mut succeeded = Instant::now();
        loop {
            let due = succeeded + self.config.retry_period;
            let next = self.grid.map_or(due, |g| {
                g.round_start(due, self.config.retry_period, self.config.renew_deadline)
            });
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return LeadEnd::Cancelled,
                () = tokio::time::sleep_until(next) => {}
            }
            // From client-go's start of the round, even when the grid started it later.
            let deadline = Instant::now().min(due) + self.config.renew_deadline;
            loop {
                let attempt = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return LeadEnd::Cancelled,
                    result = self.try_acquire_or_renew(deadline) => result,
                };
                match attempt {
                    Ok(true) => {
                        succeeded = Instant::now();
                        break;
                    }
                    Ok(false) => {
                        warn!("the lease was taken over by another candidate");
                        return LeadEnd::Lost;
                    }
                    Err(e) => warn!(error = %e.one_line(), "failed to renew lease"),
                }
                let next = Instant::now() + self.config.retry_period;
                if next >= deadline {
                    warn!(renew_deadline = ?self.config.renew_deadline, "failed to renew the lease before the renew deadline");
                    return LeadEnd::Lost;
                }
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return LeadEnd::Cancelled,
                    () = tokio::time::sleep_until(next) => {}
                }
            }
        }
    }

    /// Whether the observed record names us (client-go `IsLeader`).
    fn is_leader(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|o| o.record.holder == self.config.identity)
    }

    /// client-go `tryAcquireOrRenew`: `Ok(true)` if we hold the Lease afterwards, `Ok(false)` if
    /// another candidate holds a valid one. Every API call must finish before `deadline`.
    async fn try_acquire_or_renew(&mut self, deadline: Instant) -> Result<bool> {
        // 1. Fast path for the leader: update from the cached Lease without reading it first.
        if let Some(observed) = self.observed.clone()
            && observed.record.holder == self.config.identity
            && is_lease_valid(&observed, self.config.lease_duration, Instant::now())
            && let Some(lease) = self.lease.clone()
        {
            let record = acquire_record(&self.config, &observed.record, Timestamp::now());
            match self.update(lease, &record, deadline).await {
                Ok(()) => return Ok(true),
                Err(e) => debug!(
                    error = %e.one_line(),
                    "failed to update lease optimistically, falling back to slow path"
                ),
            }
        }

        // 2. Read the Lease, or create it.
        let Some(lease) = self.read(deadline).await? else {
            if !self.may_take(deadline).await? {
                return Ok(false);
            }
            let record = create_record(&self.config, Timestamp::now());
            self.create(&record, deadline).await?;
            return Ok(true);
        };

        // 3. Remember the record (and when it changed); respect a valid foreign holder.
        let current = self.remember(lease);
        if let Some(observed) = &self.observed
            && held_by_other(
                observed,
                &self.config.identity,
                self.config.lease_duration,
                Instant::now(),
            )
        {
            debug!(holder = %observed.record.holder, "lease is held by another candidate and has not yet expired");
            return Ok(false);
        }

        // 4. Take over (or renew through the slow path) with the resourceVersion we read.
        if current.holder != self.config.identity && !self.may_take(deadline).await? {
            return Ok(false);
        }
        let record = acquire_record(&self.config, &current, Timestamp::now());
        let Some(lease) = self.lease.clone() else {
            return Ok(false);
        };
        self.update(lease, &record, deadline).await?;
        Ok(true)
    }

    /// What the gate's check says about taking the Lease now (yes without a check).
    async fn may_take(&self, deadline: Instant) -> Result<bool> {
        match self.gate.as_ref().and_then(|g| g.check.clone()) {
            Some(check) => self.timed(deadline, check()).await,
            None => Ok(true),
        }
    }

    /// Reads the Lease and records its holder, without trying to take it.
    async fn observe_only(&mut self, deadline: Instant) -> Result<()> {
        if let Some(lease) = self.read(deadline).await? {
            self.remember(lease);
        }
        Ok(())
    }

    /// Reads the Lease (`None`: it does not exist), within `deadline`.
    async fn read(&self, deadline: Instant) -> Result<Option<Lease>> {
        self.timed(deadline, self.api.get_opt(&self.config.name))
            .await?
            .map(|lease| lease.map(LeanLease::into_inner))
            .map_err(|source| Error::Get {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                source,
            })
    }

    /// Remembers `lease` as read, and its record with the instant it (last) changed; reports
    /// a new holder. Returns the record.
    fn remember(&mut self, lease: Lease) -> Record {
        let record = Record::from_spec(lease.spec.as_ref());
        self.lease = Some(lease);
        observe(&mut self.observed, record.clone(), Instant::now());
        self.report_holder();
        record
    }

    /// Creates the Lease with `record` and our labels.
    async fn create(&mut self, record: &Record, deadline: Instant) -> Result<()> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                labels: (!self.config.labels.is_empty()).then(|| self.config.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(record.to_spec()),
        };
        let created = self
            .timed(
                deadline,
                self.api.create(&PostParams::default(), &LeanLease(lease)),
            )
            .await?
            .map(LeanLease::into_inner)
            .map_err(|source| Error::Create {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                source,
            })?;
        self.wrote(created, record.clone());
        Ok(())
    }

    /// Replaces `lease` (keeping its `resourceVersion` as the precondition) with `record` and
    /// our labels merged into its labels (client-go `LeaseLock.Update`).
    async fn update(&mut self, mut lease: Lease, record: &Record, deadline: Instant) -> Result<()> {
        lease.spec = Some(record.to_spec());
        if !self.config.labels.is_empty() {
            lease
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .extend(self.config.labels.clone());
        }
        let updated = self
            .timed(
                deadline,
                self.api
                    .replace(&self.config.name, &PostParams::default(), &LeanLease(lease)),
            )
            .await?
            .map(LeanLease::into_inner)
            .map_err(|source| Error::Update {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                source,
            })?;
        self.wrote(updated, record.clone());
        Ok(())
    }

    /// Records a successful write of `record` as our new observation.
    fn wrote(&mut self, lease: Lease, record: Record) {
        let ours = record.holder == self.config.identity;
        self.lease = Some(lease);
        self.observed = Some(Observed {
            record,
            at: Instant::now(),
        });
        if ours {
            self.status.lock().last_renew = Some(Instant::now());
        }
        self.report_holder();
    }

    /// Runs `fut` unless `deadline` passes first; a wait the API server asks for
    /// (`Retry-After`) ends before the deadline or is not waited.
    async fn timed<T>(&self, deadline: Instant, fut: impl Future<Output = T>) -> Result<T> {
        let fut = async {
            match &self.pushback {
                Some(budget) => {
                    let scope = Scope::new(budget.clone(), Kind::Lease, deadline);
                    scoped(scope, fut).await
                }
                None => fut.await,
            }
        };
        tokio::time::timeout_at(deadline, fut)
            .await
            .map_err(|_| Error::Timeout {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
            })
    }

    /// client-go `maybeReportTransition`: logs and publishes a change of the observed holder;
    /// shares when the observed record last changed (for [`Status::live_holder`]).
    fn report_holder(&mut self) {
        let Some(observed) = &self.observed else {
            return;
        };
        self.status.lock().changed = Some(observed.at);
        if observed.record.holder == self.reported_holder {
            return;
        }
        self.reported_holder = observed.record.holder.clone();
        let holder = (!self.reported_holder.is_empty()).then(|| self.reported_holder.clone());
        self.status.lock().holder = holder.clone();
        if self.reported_holder == self.config.identity {
            return;
        }
        match &holder {
            Some(h) => info!(holder = %h, "new leader is {h}"),
            None => info!("the lease is vacant"),
        }
        self.tx.send_if_modified(|current| {
            if let Leadership::Standby { holder: shown } = current
                && *shown != holder
            {
                *shown = holder.clone();
                return true;
            }
            false
        });
    }

    /// Publishes that we lead (`true`) or no longer lead (`false`).
    fn set_leading(&mut self, leading: bool) {
        self.status.lock().leading = leading;
        if leading {
            info!("became leader");
            self.tx.send_replace(Leadership::Leading);
        } else {
            let holder = self
                .observed
                .as_ref()
                .map(|o| o.record.holder.clone())
                .filter(|h| !h.is_empty() && *h != self.config.identity);
            self.tx.send_replace(Leadership::Standby { holder });
        }
    }

    /// client-go `release`: if the observed record names us, vacate the Lease (guarded by the
    /// cached `resourceVersion`) so a waiting candidate takes over at once.
    async fn release(&mut self) -> Result<()> {
        if !self.is_leader() {
            return Ok(());
        }
        let (Some(observed), Some(lease)) = (self.observed.clone(), self.lease.clone()) else {
            return Ok(());
        };
        let record = release_record(&observed.record, Timestamp::now());
        // Releasing is a courtesy that saves the next leader a lease duration: on a network
        // that does not answer, give up quickly so a stopping process ends in time.
        let deadline = Instant::now() + self.config.renew_deadline.min(RELEASE_TIMEOUT);
        let mut result = self.update(lease, &record, deadline).await;
        // A renewal cut short by the shutdown may have been written after all, under a
        // resourceVersion we never saw: read the Lease and release it if it is still ours,
        // again after each conflict until the deadline (client-go v0.37's `release` retries
        // conflicts the same way).
        while result.as_ref().is_err_and(is_conflict) {
            if Instant::now() >= deadline {
                break;
            }
            result = match self.read(deadline).await {
                Ok(Some(current)) => {
                    let current_record = Record::from_spec(current.spec.as_ref());
                    if current_record.holder == self.config.identity {
                        let record = release_record(&current_record, Timestamp::now());
                        self.update(current, &record, deadline).await
                    } else {
                        debug!(holder = %current_record.holder, "the lease has another holder; nothing to release");
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => Err(e),
            };
        }
        match result {
            Ok(()) => {
                info!("released the lease");
                Ok(())
            }
            Err(e) => {
                warn!(error = %e.one_line(), "failed to release the lease");
                Err(e)
            }
        }
    }
}

/// Logs what an attempt to acquire came to.
fn log_attempt(report: Report) {
    match report {
        Report::Answers { failures } => info!(failures, "the API server answers again"),
        Report::Failed {
            error,
            warn: Some(n),
        } => warn!(error, failures = n, "failed to acquire lease"),
        Report::Failed { error, warn: None } => debug!(error, "failed to acquire lease"),
    }
}

/// The next copy of the Lease from `feed` (`None` inside: deleted); never, without a feed or
/// once its sender is gone.
async fn next_copy(feed: Option<&mut watch::Receiver<Option<Seen>>>) -> Option<Seen> {
    match feed {
        Some(f) => match f.changed().await {
            Ok(()) => f.borrow_and_update().clone(),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Resolves when one of `gate`'s signals says it may have opened, if it is `closed` now;
/// never otherwise (nor for a signal whose sender is gone).
async fn gate_signal(gate: Option<&mut AcquireGate>, closed: bool) {
    match gate {
        Some(g) if closed && !g.opened.is_empty() => {
            let signals = g.opened.iter_mut().map(|o| {
                Box::pin(async move {
                    if o.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                })
            });
            futures::future::select_all(signals).await;
        }
        _ => std::future::pending().await,
    }
}

/// Whether `e` is a `409 Conflict` on an update (the Lease changed since it was read).
fn is_conflict(e: &Error) -> bool {
    matches!(e, Error::Update { source: kube::Error::Api(s), .. } if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::FakeApi;
    use crate::leader::config::DEFAULT_LEASE_DURATION;
    use crate::leader::health::HEALTH_TOLERANCE;
    use crate::leader::record::tests::record;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[test]
    fn jitter_stays_within_client_go_bounds() {
        let p = Duration::from_secs(5);
        assert_eq!(jittered(p, 0.0), p);
        assert_eq!(jittered(p, 1.0), Duration::from_secs(11));
        for _ in 0..100 {
            let j = jittered(p, random_unit());
            assert!(j >= p && j < Duration::from_secs(11));
        }
    }

    fn fast_config(identity: &str) -> Config {
        let mut c = Config::new("lease", "default", identity);
        c.lease_duration = Duration::from_secs(4);
        c.renew_deadline = Duration::from_secs(3);
        c.retry_period = Duration::from_secs(1);
        c.release_on_cancel = true;
        c
    }

    fn spawn_on(
        fake: &FakeApi,
        config: Config,
    ) -> (
        watch::Receiver<Leadership>,
        JoinHandle<Result<()>>,
        CancellationToken,
        Status,
    ) {
        let elector =
            LeaderElector::new(Api::namespaced(fake.client(), "default"), config).expect("valid");
        let status = elector.status();
        let token = CancellationToken::new();
        let (rx, handle) = elector.spawn(token.clone());
        (rx, handle, token, status)
    }

    fn held_by(holder: &str, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("lease".into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: Some(record(holder, transitions).to_spec()),
        }
    }

    fn stored_lease(fake: &FakeApi) -> Option<Lease> {
        fake.get(Some("default"), "lease")
    }

    /// The stored Lease's holder renews it, writing `secs` (since the epoch) as its renew time.
    fn renew_stored(fake: &FakeApi, secs: i64) {
        let mut lease = stored_lease(fake).expect("lease");
        let mut r = stored_record(fake);
        r.renew_time = Some(MicroTime(Timestamp::constant(secs, 0)));
        lease.spec = Some(r.to_spec());
        fake.put(&lease);
    }

    fn stored_record(fake: &FakeApi) -> Record {
        Record::from_spec(stored_lease(fake).as_ref().and_then(|l| l.spec.as_ref()))
    }

    /// Two leaders on one renew grid, which took their Leases at different moments, renew on
    /// the grid's lines from their first renewal on: together, never sooner than a retry
    /// period after the last answer (client-go's pace), and at most a slot later. Each answer
    /// takes 20 ms, so a line a period after the last is already behind: the next one is taken.
    #[tokio::test(start_paused = true)]
    async fn leaders_on_one_grid_renew_together() {
        let fake = FakeApi::default();
        fake.set_latency(Duration::from_millis(20));
        let origin = Instant::now();
        let grid = RenewGrid::new(origin);
        let start = |name: &str| {
            let mut c = fast_config("me");
            c.name = name.into();
            let elector = LeaderElector::new(Api::namespaced(fake.client(), "default"), c)
                .expect("valid")
                .with_renew_grid(grid);
            let token = CancellationToken::new();
            let (rx, handle) = elector.spawn(token.clone());
            (rx, handle, token)
        };
        tokio::time::sleep(Duration::from_millis(130)).await;
        let (mut a, _ha, ta) = start("lease-a");
        a.wait_for(Leadership::is_leading).await.expect("a leads");
        tokio::time::sleep(Duration::from_millis(210)).await;
        let (mut b, _hb, tb) = start("lease-b");
        b.wait_for(Leadership::is_leading).await.expect("b leads");
        // When each Lease was written, to 10 ms.
        let writes = |name: &str| {
            fake.writes()
                .iter()
                .filter(|w| w.wrote() && w.path.ends_with(&format!("/{name}")))
                .count()
        };
        let mut seen: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
        let mut counts = (writes("lease-a"), writes("lease-b"));
        for _ in 0..600 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = (writes("lease-a"), writes("lease-b"));
            if now.0 > counts.0 {
                seen.entry("a").or_default().push(origin.elapsed());
            }
            if now.1 > counts.1 {
                seen.entry("b").or_default().push(origin.elapsed());
            }
            counts = now;
        }
        let slot = RenewGrid::slot(Duration::from_secs(1));
        for (name, times) in &seen {
            assert!(times.len() >= 3, "{name}: {times:?}");
            for t in times {
                // Seen written at the line plus the answer's 20 ms, to 10 ms.
                let off_line = t.as_nanos() % slot.as_nanos();
                assert!(
                    (20_000_000..=30_000_000).contains(&off_line),
                    "{name} renewed off the grid at {t:?}"
                );
            }
            for pair in times.windows(2) {
                let gap = pair[1] - pair[0];
                assert!(
                    gap >= Duration::from_millis(1_490) && gap <= Duration::from_millis(1_510),
                    "{name}: {gap:?} between renewals, not a retry period after the last \
                     answer and on to the next line ({times:?})"
                );
            }
        }
        assert_eq!(seen["a"], seen["b"], "renewed together");
        ta.cancel();
        tb.cancel();
    }

    /// A renewal that the shutdown cut short may still have been written: the release then
    /// meets a resourceVersion it never saw, reads the Lease, and releases it all the same
    /// while it is still ours.
    #[tokio::test(start_paused = true)]
    async fn a_release_after_an_unseen_write_of_our_own_still_releases() {
        let fake = FakeApi::default();
        let (mut rx, handle, token, _status) = spawn_on(&fake, fast_config("me"));
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        // Our renewal, as the API server stored it, whose answer never came back.
        renew_stored(&fake, 1_000);
        token.cancel();
        handle.await.expect("task").expect("released");
        let released = stored_record(&fake);
        assert_eq!(released.holder, "");
        assert_eq!(released.lease_duration_seconds, 1);
    }

    /// Each retry of the release can meet yet another unseen write: it reads and retries again
    /// (client-go v0.37 retries a conflicting release until its deadline).
    #[tokio::test(start_paused = true)]
    async fn a_release_retries_every_conflict_while_the_lease_is_ours() {
        let fake = FakeApi::default();
        let (mut rx, handle, token, _status) = spawn_on(&fake, fast_config("me"));
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        fake.unseen_write_before_next_puts(3);
        token.cancel();
        handle.await.expect("task").expect("released");
        let released = stored_record(&fake);
        assert_eq!(released.holder, "");
        assert_eq!(released.lease_duration_seconds, 1);
    }

    /// A Lease taken by someone else meanwhile is not ours to release.
    #[tokio::test(start_paused = true)]
    async fn a_release_leaves_a_lease_another_holder_took() {
        let fake = FakeApi::default();
        let (mut rx, handle, token, _status) = spawn_on(&fake, fast_config("me"));
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        let mut lease = stored_lease(&fake).expect("lease");
        lease.spec = Some(record("other", 1).to_spec());
        fake.put(&lease);
        token.cancel();
        handle.await.expect("task").expect("nothing to release");
        assert_eq!(stored_record(&fake).holder, "other");
    }

    #[tokio::test(start_paused = true)]
    async fn creates_renews_and_releases() {
        let fake = FakeApi::default();
        let mut c = fast_config("me");
        c.labels.insert("k".into(), "v".into());
        let (mut rx, handle, token, status) = spawn_on(&fake, c);
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        let created = stored_record(&fake);
        assert_eq!((created.holder.as_str(), created.transitions), ("me", 0));
        assert_eq!(created.lease_duration_seconds, 4);
        assert_eq!(status.holder().as_deref(), Some("me"));

        tokio::time::sleep(Duration::from_millis(3500)).await;
        let renewed = stored_record(&fake);
        assert_eq!(renewed.acquire_time, created.acquire_time);
        assert_eq!(renewed.transitions, 0);
        assert_eq!(fake.writes().len(), 4, "create + one renewal per second");
        assert!(fake.writes().iter().all(|w| {
            w.body
                .as_ref()
                .is_some_and(|l| l["metadata"]["labels"]["k"] == "v")
        }));
        assert_eq!(status.check(HEALTH_TOLERANCE), Ok(()));

        token.cancel();
        handle.await.expect("task").expect("released");
        assert!(!rx.borrow().is_leading());
        let released = stored_record(&fake);
        assert_eq!(released.holder, "");
        assert_eq!(released.lease_duration_seconds, 1);
        assert_eq!(released.transitions, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn takes_over_a_stale_foreign_lease_after_lease_duration() {
        let fake = FakeApi::default();
        fake.put(&held_by("other", 2));
        let start = Instant::now();
        let (mut rx, _handle, _token, status) = spawn_on(&fake, fast_config("me"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            *rx.borrow(),
            Leadership::Standby {
                holder: Some("other".into())
            }
        );
        assert_eq!(status.holder().as_deref(), Some("other"));
        assert_eq!(status.live_holder(Instant::now()).as_deref(), Some("other"));
        // The holder never renews: live until a lease duration after it was first seen.
        tokio::time::sleep(Duration::from_millis(3950)).await;
        assert_eq!(status.live_holder(Instant::now()), None);
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        let waited = start.elapsed();
        assert!(
            waited > Duration::from_secs(4) && waited < Duration::from_millis(6300),
            "took over after {waited:?}"
        );
        let r = stored_record(&fake);
        assert_eq!((r.holder.as_str(), r.transitions), ("me", 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewing_foreign_holder_is_never_displaced() {
        let fake = FakeApi::default();
        fake.put(&held_by("other", 0));
        let (rx, _handle, _token, status) = spawn_on(&fake, fast_config("me"));
        for i in 0..20 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            renew_stored(&fake, i);
            assert!(!rx.borrow().is_leading());
            // The standby knows it stands by for a live holder (not a loss).
            assert_eq!(status.live_holder(Instant::now()).as_deref(), Some("other"));
        }
        assert_eq!(stored_record(&fake).holder, "other");
    }

    #[tokio::test(start_paused = true)]
    async fn stops_leading_when_renewals_fail_for_the_renew_deadline() {
        let fake = FakeApi::default();
        let (mut rx, _handle, _token, status) = spawn_on(&fake, fast_config("me"));
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let last_renew = status.last_renew().expect("renewed");
        fake.set_failing(true);
        rx.wait_for(|l| !l.is_leading()).await.expect("loses");
        // client-go: the failing round starts a retry period after the last renewal and lasts
        // the renew deadline (1 s + 3 s here), still within the lease duration (4 s).
        let lost_after = last_renew.elapsed();
        assert!(
            lost_after <= Duration::from_secs(4),
            "lost {lost_after:?} after the last renewal, beyond the renew deadline"
        );
        assert!(
            lost_after >= Duration::from_secs(3),
            "gave up early: {lost_after:?}"
        );
        // It competes again once the API server recovers.
        fake.set_failing(false);
        rx.wait_for(Leadership::is_leading)
            .await
            .expect("leads again");
    }

    /// With client-go's default timings (retry 5 s, renew deadline 10 s) one failed renewal
    /// is retried within the round; leadership survives a server that answers 503 briefly.
    #[tokio::test(start_paused = true)]
    async fn a_transient_renewal_error_does_not_cost_leadership() {
        let fake = FakeApi::default();
        let mut c = Config::new("lease", "default", "me");
        c.release_on_cancel = true;
        let (mut rx, _handle, _token, status) = spawn_on(&fake, c);
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        let mut changes = rx.clone();
        changes.mark_unchanged();
        // The next renewal's fast-path update and its fallback read both fail.
        fake.fail_next(2);
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert_eq!(fake.failures_left(), 0, "the failing renewal happened");
        assert!(rx.borrow().is_leading());
        assert!(
            !changes.has_changed().expect("elector alive"),
            "leadership never flipped"
        );
        assert!(status.last_renew().expect("renewed").elapsed() < Duration::from_secs(5));
    }

    /// After a cut-off long enough to lose the Lease, it is taken back within moments of the
    /// API server answering again, not a jittered retry period (up to 11 s) later.
    #[tokio::test(start_paused = true)]
    async fn leadership_lost_to_a_cut_off_comes_back_soon_after_it() {
        let fake = FakeApi::default();
        let mut c = Config::new("lease", "default", "me");
        c.release_on_cancel = true;
        let (mut rx, _handle, _token, _status) = spawn_on(&fake, c);
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        fake.set_failing(true);
        rx.wait_for(|l| !l.is_leading()).await.expect("loses");
        tokio::time::sleep(Duration::from_secs(20)).await;
        fake.set_failing(false);
        let back = Instant::now();
        rx.wait_for(Leadership::is_leading)
            .await
            .expect("leads again");
        assert!(
            back.elapsed() <= ERROR_RETRY_MAX,
            "took {:?} to lead again",
            back.elapsed()
        );
    }

    fn fed_elector(fake: &FakeApi) -> (LeaderElector, watch::Sender<Option<Seen>>) {
        let (feed, rx) = watch::channel(None);
        (elector_on(fake, rx), feed)
    }

    fn elector_on(fake: &FakeApi, feed: watch::Receiver<Option<Seen>>) -> LeaderElector {
        LeaderElector::new(
            Api::namespaced(fake.client(), "default"),
            Config::new("lease", "default", "me"),
        )
        .expect("valid")
        .with_feed(feed)
    }

    /// A Lease handed over (vacated by its holder) is taken as soon as the watch shows it,
    /// not a jittered retry period later.
    #[tokio::test(start_paused = true)]
    async fn a_fed_candidate_takes_a_vacated_lease_at_once() {
        let fake = FakeApi::default();
        fake.put(&held_by("other", 0));
        let (elector, feed) = fed_elector(&fake);
        let token = CancellationToken::new();
        let (mut rx, _handle) = elector.spawn(token.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!rx.borrow().is_leading());
        // The holder hands it over; the watch shows it.
        let mut lease = stored_lease(&fake).expect("lease");
        lease.spec = Some(release_record(&record("other", 0), Timestamp::now()).to_spec());
        fake.put(&lease);
        let vacated = Instant::now();
        feed.send_replace(Some(Seen::now(stored_lease(&fake))));
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        assert!(
            vacated.elapsed() < Duration::from_millis(100),
            "{:?}",
            vacated.elapsed()
        );
        token.cancel();
    }

    /// A take-over `took` after the holder's last renewal was seen happened when the Lease
    /// expired (client-go's rule, plus [`EXPIRY_MARGIN`]), not a retry period later.
    fn assert_took_over_at_expiry(took: Duration) {
        assert!(
            took >= DEFAULT_LEASE_DURATION
                && took <= DEFAULT_LEASE_DURATION + Duration::from_millis(200),
            "took over {took:?} after the last renewal was seen"
        );
    }

    /// A holder that dies is replaced one lease duration after its last renewal as the watch
    /// showed it (client-go's rule), not after a further retry period of polling.
    #[tokio::test(start_paused = true)]
    async fn a_fed_candidate_takes_over_when_the_lease_expires() {
        let fake = FakeApi::default();
        fake.put(&held_by("other", 0));
        let (elector, feed) = fed_elector(&fake);
        let token = CancellationToken::new();
        let (mut rx, _handle) = elector.spawn(token.clone());
        // The holder renews three times, each renewal seen through the watch, then dies.
        for i in 0..3 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            renew_stored(&fake, 1000 + i);
            feed.send_replace(Some(Seen::now(stored_lease(&fake))));
        }
        let died = Instant::now();
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        assert_took_over_at_expiry(died.elapsed());
        token.cancel();
    }

    /// An elector of `me` for `lease` with default timings behind `gate`.
    fn gated_elector(fake: &FakeApi, gate: AcquireGate) -> LeaderElector {
        LeaderElector::new(
            Api::namespaced(fake.client(), "default"),
            Config::new("lease", "default", "me"),
        )
        .expect("valid")
        .with_acquire_gate(gate)
    }

    /// A candidate held back by its gate (a replica at its share) tries the moment the gate
    /// signals that it opened, not at its next jittered attempt (5-11 s with these timings).
    #[tokio::test(start_paused = true)]
    async fn a_gated_candidate_tries_as_soon_as_the_gate_opens() {
        let fake = FakeApi::default();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (opened, opened_rx) = watch::channel(0u64);
        let gate = {
            let open = open.clone();
            AcquireGate::new(move || open.load(std::sync::atomic::Ordering::SeqCst))
                .woken_by(opened_rx)
        };
        let elector = gated_elector(&fake, gate);
        let token = CancellationToken::new();
        let (mut rx, _handle) = elector.spawn(token.clone());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!rx.borrow().is_leading(), "the gate is closed");
        assert!(stored_lease(&fake).is_none());
        open.store(true, std::sync::atomic::Ordering::SeqCst);
        let signalled = Instant::now();
        opened.send_modify(|n| *n += 1);
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        assert!(
            signalled.elapsed() < Duration::from_millis(100),
            "took {:?} after the gate opened",
            signalled.elapsed()
        );
        token.cancel();
    }

    /// The first look after a loss is gated by the loss itself (the replica's share counts the
    /// driver until its term has noticed): when the gate opens during that look, the next
    /// attempt follows at once, not a retry period later. (In a stalled-connection fault, one
    /// driver's Lease came back 7-11 s after the others.)
    #[tokio::test(start_paused = true)]
    async fn a_gate_that_opens_during_a_look_is_tried_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let fake = FakeApi::default();
        let checks = std::sync::Arc::new(AtomicUsize::new(0));
        let (opened, opened_rx) = watch::channel(0u64);
        let gate = {
            let checks = checks.clone();
            AcquireGate::new(move || {
                // Closed when first asked; the count drops (and says so) right after.
                if checks.fetch_add(1, Ordering::SeqCst) == 0 {
                    opened.send_modify(|n| *n += 1);
                    return false;
                }
                true
            })
            .woken_by(opened_rx)
        };
        let elector = gated_elector(&fake, gate);
        let token = CancellationToken::new();
        let start = Instant::now();
        let (mut rx, _handle) = elector.spawn(token.clone());
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "took {:?}; the retry period is {:?}",
            start.elapsed(),
            Config::new("lease", "default", "me").retry_period
        );
        token.cancel();
    }

    /// An elector of a later term (after a hand-over) starts from what the watch showed
    /// earlier: a holder that died before the term began is replaced one lease duration after
    /// its last renewal was seen, not one lease duration after the new elector's first read.
    #[tokio::test(start_paused = true)]
    async fn a_new_term_judges_expiry_from_the_copy_seen_before_it() {
        let fake = FakeApi::default();
        fake.put(&held_by("other", 0));
        let (feed, _) = watch::channel(None);
        feed.send_replace(Some(Seen::now(stored_lease(&fake))));
        let last_renewal_seen = Instant::now();
        // The holder dies; our previous term ends and the next one starts 8 s later.
        tokio::time::sleep(Duration::from_secs(8)).await;
        let token = CancellationToken::new();
        let (mut rx, _handle) = elector_on(&fake, feed.subscribe()).spawn(token.clone());
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        assert_took_over_at_expiry(last_renewal_seen.elapsed());
        token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn stops_leading_at_once_when_another_candidate_holds_the_lease() {
        let fake = FakeApi::default();
        let (mut rx, _handle, _token, _status) = spawn_on(&fake, fast_config("me"));
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        let mut lease = stored_lease(&fake).expect("lease");
        lease.spec = Some(record("intruder", 1).to_spec());
        fake.put(&lease);
        let start = Instant::now();
        rx.wait_for(|l| !l.is_leading()).await.expect("loses");
        assert!(start.elapsed() <= Duration::from_millis(1100));
        assert_eq!(
            *rx.borrow(),
            Leadership::Standby {
                holder: Some("intruder".into())
            }
        );
    }

    /// A gate's check (the cross-namespace Lease guard, which costs a LIST) is asked only when
    /// the Lease is there for the taking: never while another candidate holds it, never for a
    /// renewal; and a `no` leaves the Lease alone.
    #[tokio::test(start_paused = true)]
    async fn the_gates_check_is_asked_only_when_the_lease_is_for_the_taking() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let fake = FakeApi::default();
        fake.put(&held_by("other", 0));
        let asked = std::sync::Arc::new(AtomicUsize::new(0));
        let allow = std::sync::Arc::new(AtomicBool::new(false));
        let gate = AcquireGate::new(|| true).checked_by({
            let (asked, allow) = (asked.clone(), allow.clone());
            move || {
                asked.fetch_add(1, Ordering::SeqCst);
                let allow = allow.load(Ordering::SeqCst);
                async move { allow }
            }
        });
        let elector =
            LeaderElector::new(Api::namespaced(fake.client(), "default"), fast_config("me"))
                .expect("valid")
                .with_acquire_gate(gate);
        let token = CancellationToken::new();
        let (mut rx, _handle) = elector.spawn(token.clone());
        // "other" renews for a while: nothing to take, nothing asked.
        for i in 0..3 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            renew_stored(&fake, i);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 0);
        // It stops renewing: once expired, the check is asked, says no, and the Lease stays.
        // Expired a lease duration after the elector saw the last renewal, which its jittered
        // looks (1 to 2.2 s apart) see up to 2.2 s late: asked within 4 + 2 × 2.2 s.
        let stopped = Instant::now();
        while asked.load(Ordering::SeqCst) == 0 {
            assert!(
                stopped.elapsed() <= Duration::from_millis(8400),
                "the check was never asked"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(stored_record(&fake).holder, "other");
        assert!(!rx.borrow().is_leading());
        // It says yes: the Lease is taken, and renewals ask nothing more.
        allow.store(true, Ordering::SeqCst);
        rx.wait_for(Leadership::is_leading).await.expect("leads");
        let after = asked.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(rx.borrow().is_leading());
        assert_eq!(asked.load(Ordering::SeqCst), after, "renewals ask nothing");
        token.cancel();
    }
}
