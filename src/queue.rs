//! A work queue with client-go `workqueue` semantics, keyed by object name.
//!
//! external-attacher runs two client-go rate-limiting queues (`csi-attacher-va`, `csi-attacher-pv`;
//! `docs/design.md#work-queue`). Why hand-written (`docs/design.md#why-own-queue`): the retries,
//! their timing and the metrics must match the Go sidecar's, and no Rust crate reproduces these
//! semantics. kube-runtime's
//! scheduler merges duplicate triggers but has no "dirty while processing" state, no per-key
//! failure count with exponential backoff, and no `workqueue_*` metrics; the crates that offer
//! delay queues (`tokio-util`'s `DelayQueue`) have none of the dedup rules. So the queue is ours:
//!
//! * a key is handed to at most one worker at a time ([`Queue::claim`] … [`Claim::done`]);
//! * adding a key that is already queued is a no-op (dedup);
//! * adding a key that is being processed marks it *dirty*; it is queued again on `done`;
//! * [`Queue::add_rate_limited`] delays the key by `start × 2^failures`, capped at `max`
//!   (client-go's per-item exponential failure rate limiter, no global bucket);
//! * [`Queue::forget`] resets the failure count;
//! * a plain [`Queue::add`] makes a key that waits in backoff available immediately.
//!
//! Two queues may keep one failure count per key between them ([`Queue::sharing`] over one
//! [`History`]): a driver's attach and detach pools are two queues so that a detach storm never
//! starves attaches, but external-attacher has one queue for both, so a VolumeAttachment that
//! failed to attach and is then deleted backs off its detach from where its attaches left off.
//! One history per key keeps that pace (`docs/design.md#work-queue`).
//!
//! Difference from client-go, on purpose: a plain `add` also drops the key's pending delayed add,
//! so the key is not processed a second time when the old delay expires. The key's failure count
//! is kept, so the next `add_rate_limited` still backs off further.
//!
//! Locking: one `parking_lot::Mutex` guards the state and is never held across an `.await`;
//! waiters sleep on a [`tokio::sync::Notify`] or until the earliest backoff deadline.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backoff::Doubling;

/// A client-go-compatible rate-limiting work queue keyed by `String`.
///
/// Share it between producers and workers behind an `Arc`.
#[derive(Debug)]
pub struct Queue {
    /// Name used for metrics and logs (`csi-attacher-va`, `csi-attacher-pv`).
    name: String,
    /// Backoff of the first failure (`--retry-interval-start`).
    retry_start: Duration,
    /// Backoff cap (`--retry-interval-max`).
    retry_max: Duration,
    /// All mutable state; only locked for short, synchronous sections.
    state: Mutex<State>,
    /// Wakes workers blocked in [`Queue::get`].
    notify: Notify,
    /// Failures per key since the last `forget`, perhaps shared with another queue.
    history: Arc<History>,
    /// Adds so far, plain and rate-limited (`workqueue_adds_total`).
    adds: std::sync::atomic::AtomicU64,
}

/// The queue's bookkeeping; see client-go `workqueue.Typed` for the model.
#[derive(Debug, Default)]
struct State {
    /// Keys ready to be handed out, oldest first, with the instant they became ready.
    ready: VecDeque<(String, Instant)>,
    /// Keys that need processing: queued ones plus processing ones that were re-added.
    dirty: HashSet<String>,
    /// Keys handed to a worker and not yet `done`, with the instant processing started.
    processing: HashMap<String, Instant>,
    /// Keys waiting out a backoff delay: key → instant they become ready.
    waiting: HashMap<String, Instant>,
    /// Min-heap over `waiting`; entries whose instant differs from `waiting` are stale.
    deadlines: BinaryHeap<Reverse<(Instant, String)>>,
}

/// Failures per key since its last [`Queue::forget`] (client-go's per-item failure count), which
/// queues built with [`Queue::sharing`] keep between them.
///
/// Locking: taken only inside a queue's own state lock (never the other way round), for a
/// lookup or an update.
#[derive(Debug, Default)]
pub struct History {
    failures: Mutex<HashMap<String, u32>>,
}

// === impl Queue ===

impl Queue {
    /// Creates a queue whose failure backoff starts at `retry_start` and doubles up to `retry_max`.
    pub fn new(name: impl Into<String>, retry_start: Duration, retry_max: Duration) -> Self {
        Self::sharing(name, retry_start, retry_max, Arc::default())
    }

    /// [`Queue::new`], counting failures in `history`, which other queues may share: a key
    /// failed in one of them backs off further in the other, and a `forget` in either starts
    /// it over in both.
    pub fn sharing(
        name: impl Into<String>,
        retry_start: Duration,
        retry_max: Duration,
        history: Arc<History>,
    ) -> Self {
        Self {
            name: name.into(),
            retry_start,
            retry_max,
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            adds: std::sync::atomic::AtomicU64::new(0),
            history,
        }
    }

    /// The queue's name (the `name` label of the `workqueue_*` metrics).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // parking_lot's lock does not poison: a panic while holding it can only come from a bug
        // in this module, and the state is still consistent enough to keep serving.
        self.state.lock()
    }

    /// Adds `key` for processing now. No-op if already queued; marks it dirty if being processed.
    /// Also cancels any pending backoff of the key (the key becomes available immediately).
    pub fn add(&self, key: impl Into<String>) {
        let key = key.into();
        self.adds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let woke = {
            let mut st = self.lock();
            st.waiting.remove(&key);
            st.insert_now(key, Instant::now())
        };
        if woke {
            self.notify.notify_one();
        }
    }

    /// Adds `key` after its backoff: `retry_start × 2^failures`, capped at `retry_max`, then
    /// counts one more failure. If the key already waits with an earlier deadline, that one stays.
    pub fn add_rate_limited(&self, key: impl Into<String>) {
        let key = key.into();
        self.adds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = Instant::now();
        let woke = {
            let mut st = self.lock();
            let delay = {
                let mut history = self.history.failures.lock();
                let failures = history.entry(key.clone()).or_insert(0);
                let delay = backoff(self.retry_start, self.retry_max, *failures);
                *failures = failures.saturating_add(1);
                delay
            };
            if delay.is_zero() {
                st.waiting.remove(&key);
                st.insert_now(key, now)
            } else {
                let at = now + delay;
                match st.waiting.get(&key) {
                    Some(existing) if *existing <= at => {}
                    _ => {
                        st.waiting.insert(key.clone(), at);
                        st.deadlines.push(Reverse((at, key)));
                    }
                }
                // A worker may be sleeping until a later deadline; let one re-evaluate.
                true
            }
        };
        if woke {
            self.notify.notify_one();
        }
    }

    /// Resets the failure count of `key` (call after a successful sync), in every queue that
    /// shares this one's history.
    pub fn forget(&self, key: &str) {
        self.history.failures.lock().remove(key);
    }

    /// Drops the pending retry of `key`, if it waits out a backoff: another queue that shares
    /// the history has the key now, and the retry would sync it a second time. The failure
    /// count stays.
    pub fn cancel_retry(&self, key: &str) {
        self.lock().waiting.remove(key);
    }

    /// Adds `key` now unless this queue has it already: ready, being processed, or waiting out
    /// a backoff (a plain [`Queue::add`] would cut that backoff short). Returns whether it added.
    pub fn add_unless_known(&self, key: &str) -> bool {
        let woke = {
            let mut st = self.lock();
            if st.dirty.contains(key)
                || st.processing.contains_key(key)
                || st.waiting.contains_key(key)
            {
                return false;
            }
            self.adds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            st.insert_now(key.to_owned(), Instant::now())
        };
        if woke {
            self.notify.notify_one();
        }
        true
    }

    /// How many times `key` was added with [`Queue::add_rate_limited`] since the last `forget`.
    #[cfg(test)]
    pub(crate) fn num_requeues(&self, key: &str) -> u32 {
        self.history.failures.lock().get(key).copied().unwrap_or(0)
    }

    /// Waits for the next key and marks it as being processed; call [`Queue::done`] afterwards.
    /// (Workers use [`Queue::claim`], which also gives the key back if they are cut short.)
    #[cfg(test)]
    pub(crate) async fn get(&self) -> String {
        self.get_timed().await.0
    }

    /// Adds so far (plain and rate-limited), for `workqueue_adds_total`.
    pub fn adds(&self) -> u64 {
        self.adds.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The next key (see [`Queue::claim`]), also telling how long the key waited since it became
    /// ready (`workqueue_queue_duration_seconds`).
    pub async fn get_timed(&self) -> (String, Duration) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register interest before looking at the state so an `add` between the check and
            // the `await` is not lost.
            notified.as_mut().enable();
            let next_deadline = {
                let mut st = self.lock();
                let now = Instant::now();
                st.promote_due(now);
                if let Some((key, ready_at)) = st.ready.pop_front() {
                    st.dirty.remove(&key);
                    st.processing.insert(key.clone(), now);
                    return (key, now.saturating_duration_since(ready_at));
                }
                st.next_deadline()
            };
            match next_deadline {
                Some(at) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// [`Queue::get_timed`], with the key held by a [`Claim`]: whatever ends the worker that
    /// holds it (abort, panic, a cancelled future), the key leaves `processing` and is queued
    /// again, so no key is ever lost.
    pub async fn claim(&self) -> (Claim<'_>, Duration) {
        let (key, waited) = self.get_timed().await;
        (
            Claim {
                queue: self,
                key: Some(key),
            },
            waited,
        )
    }

    /// Marks `key` as no longer processed; queues it again if it was re-added meanwhile.
    pub fn done(&self, key: &str) {
        let woke = {
            let mut st = self.lock();
            if st.processing.remove(key).is_none() {
                return;
            }
            if st.dirty.contains(key) {
                st.ready.push_back((key.to_owned(), Instant::now()));
                true
            } else {
                false
            }
        };
        if woke {
            self.notify.notify_one();
        }
    }

    /// Number of keys ready to be handed out (the `workqueue_depth` metric).
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    /// True if no key is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of keys currently handed to workers.
    pub fn processing_len(&self) -> usize {
        self.lock().processing.len()
    }

    /// How long the oldest ready key has been waiting for a worker (backlog age), if any.
    pub fn oldest_age(&self) -> Option<Duration> {
        let st = self.lock();
        st.ready
            .front()
            .map(|(_, since)| Instant::now().saturating_duration_since(*since))
    }

    /// How long the longest-running key has been processed, if any
    /// (`workqueue_longest_running_processor_seconds`).
    pub fn longest_processing(&self) -> Option<Duration> {
        let st = self.lock();
        let now = Instant::now();
        st.processing
            .values()
            .map(|since| now.saturating_duration_since(*since))
            .max()
    }
}

/// A key handed to one worker by [`Queue::claim`]. [`Claim::done`] finishes it as
/// [`Queue::done`] does; dropping it unfinished (the worker was aborted or cancelled mid-sync)
/// hands the key back to the queue, ready at once, for the next worker or the next term.
#[derive(Debug)]
pub struct Claim<'a> {
    queue: &'a Queue,
    /// `None` once finished.
    key: Option<String>,
}

impl Claim<'_> {
    /// The key.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or_default()
    }

    /// The sync of the key is over (its outcome already recorded with `forget` or
    /// `add_rate_limited`).
    pub fn done(mut self) {
        if let Some(key) = self.key.take() {
            self.queue.done(&key);
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            // Cut short: the object may still need work. Marked dirty while processing,
            // `done` puts it back in the ready queue.
            tracing::debug!(queue = %self.queue.name, %key, "sync cut short; queuing the key again");
            self.queue.add(key.clone());
            self.queue.done(&key);
        }
    }
}

/// Backoff for a key that failed `failures` times before: `start × 2^failures`, capped at
/// `max`. The failure being added is the `failures + 1`-th in a row: a key that never failed
/// waits `start`.
fn backoff(start: Duration, max: Duration, failures: u32) -> Duration {
    Doubling::new(start, max).after(failures.saturating_add(1))
}

// === impl State ===

impl State {
    /// Queues `key` now unless it already needs processing. Returns true if a worker should wake.
    fn insert_now(&mut self, key: String, now: Instant) -> bool {
        if self.dirty.contains(&key) {
            return false;
        }
        self.dirty.insert(key.clone());
        if self.processing.contains_key(&key) {
            // Re-queued by `done`.
            return false;
        }
        self.ready.push_back((key, now));
        true
    }

    /// Moves keys whose backoff expired into the ready queue.
    fn promote_due(&mut self, now: Instant) {
        while let Some(Reverse((at, _))) = self.deadlines.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, key))) = self.deadlines.pop() else {
                break;
            };
            if self.waiting.get(&key) == Some(&at) {
                self.waiting.remove(&key);
                self.insert_now(key, now);
            }
        }
    }

    /// The earliest live backoff deadline, discarding stale heap entries.
    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, key))) = self.deadlines.peek() {
            if self.waiting.get(key) == Some(at) {
                return Some(*at);
            }
            self.deadlines.pop();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(300);

    fn queue() -> Arc<Queue> {
        Arc::new(Queue::new("test", START, MAX))
    }

    /// Returns the next key if one is available within `within`.
    async fn get_within(q: &Queue, within: Duration) -> Option<String> {
        tokio::time::timeout(within, q.get()).await.ok()
    }

    #[test]
    fn backoff_doubles_from_start_and_is_capped_at_max() {
        let cases = [
            (0, 1),
            (1, 2),
            (2, 4),
            (8, 256),
            (9, 300),
            (10, 300),
            (31, 300),
            (32, 300),
            (u32::MAX, 300),
        ];
        for (failures, secs) in cases {
            assert_eq!(
                backoff(START, MAX, failures),
                Duration::from_secs(secs),
                "failures={failures}"
            );
        }
    }

    /// The doubling goes on past 32 failures, as client-go's limiter's: a start so short that
    /// it has not reached the cap by then keeps doubling, and a zero start never waits.
    #[test]
    fn backoff_keeps_doubling_past_32_failures_and_a_zero_start_stays_zero() {
        let ns = Duration::from_nanos;
        assert_eq!(backoff(ns(1), MAX, 31), ns(1 << 31));
        assert_eq!(backoff(ns(1), MAX, 32), ns(1 << 32));
        assert_eq!(backoff(ns(1), MAX, 38), ns(1 << 38));
        assert_eq!(backoff(ns(1), MAX, 39), MAX);
        for failures in [0, 1, 31, 32, 100, u32::MAX] {
            assert_eq!(backoff(Duration::ZERO, MAX, failures), Duration::ZERO);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn adding_a_queued_key_twice_hands_it_out_once() {
        let q = queue();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, "a");
        assert_eq!(q.get().await, "b");
        assert_eq!(get_within(&q, Duration::from_secs(10)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_is_handed_out_again_after_done() {
        let q = queue();
        q.add("a");
        let key = q.get().await;
        assert_eq!(key, "a");
        q.add("a");
        q.add("a");
        // Never to two workers at once.
        assert_eq!(q.len(), 0);
        assert_eq!(get_within(&q, Duration::from_secs(1)).await, None);
        q.done("a");
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, "a");
        q.done("a");
        assert_eq!(get_within(&q, Duration::from_secs(10)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_done_key_that_was_not_re_added_is_not_handed_out_again() {
        let q = queue();
        q.add("a");
        let _ = q.get().await;
        q.done("a");
        assert!(q.is_empty());
        assert_eq!(q.processing_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_exponentially() {
        let q = queue();
        let t0 = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..4 {
            q.add_rate_limited("a");
            let start = Instant::now();
            assert_eq!(q.get().await, "a");
            delays.push(Instant::now() - start);
            q.done("a");
        }
        assert_eq!(
            delays,
            [1, 2, 4, 8].map(Duration::from_secs).to_vec(),
            "since {t0:?}"
        );
        assert_eq!(q.num_requeues("a"), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_backoff_is_capped_at_max() {
        let q = queue();
        for _ in 0..12 {
            q.add_rate_limited("a");
            // Only the earliest deadline counts; drain it each time.
            let _ = q.get().await;
            q.done("a");
        }
        q.add_rate_limited("a");
        let start = Instant::now();
        assert_eq!(q.get().await, "a");
        assert_eq!(Instant::now() - start, MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_add_makes_a_key_in_backoff_available_immediately() {
        let q = queue();
        for _ in 0..5 {
            q.add_rate_limited("a");
        }
        // Waiting out its backoff: not ready.
        assert_eq!(q.len(), 0);
        q.add("a");
        assert_eq!(q.len(), 1);
        let start = Instant::now();
        assert_eq!(q.get().await, "a");
        assert_eq!(Instant::now(), start);
        q.done("a");
        // The dropped delayed add does not fire later.
        assert_eq!(get_within(&q, Duration::from_secs(600)).await, None);
        // The failure count is kept.
        assert_eq!(q.num_requeues("a"), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_dropped_mid_sync_gives_the_key_back() {
        let q = queue();
        q.add("a");
        q.add("b");
        let worker = {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                let (claim, _) = q.claim().await;
                // A sync that never ends (a CSI call longer than the drain).
                std::future::pending::<()>().await;
                claim.done();
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(q.processing_len(), 1);
        // A watch event for the key while it is processed only marks it dirty.
        q.add("a");
        worker.abort();
        assert!(worker.await.expect_err("aborted").is_cancelled());
        assert_eq!(q.processing_len(), 0, "no key stuck in processing");
        let mut keys = vec![q.get().await, q.get().await];
        keys.sort();
        assert_eq!(keys, ["a", "b"]);
        // A finished claim does not queue its key again.
        q.done("a");
        q.done("b");
        q.add("c");
        let (claim, _) = q.claim().await;
        assert_eq!(claim.key(), "c");
        claim.done();
        assert_eq!(get_within(&q, Duration::from_secs(60)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn forget_resets_the_backoff_to_start() {
        let q = queue();
        for _ in 0..3 {
            q.add_rate_limited("a");
            let _ = q.get().await;
            q.done("a");
        }
        assert_eq!(q.num_requeues("a"), 3);
        q.forget("a");
        assert_eq!(q.num_requeues("a"), 0);
        q.add_rate_limited("a");
        let start = Instant::now();
        assert_eq!(q.get().await, "a");
        assert_eq!(Instant::now() - start, START);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_backoff_deadline_wakes_a_worker_already_sleeping() {
        let q = queue();
        // b waits 4 s, then a (fresh key) only 1 s; the worker must not oversleep.
        for _ in 0..2 {
            q.add_rate_limited("b");
            let _ = q.get().await;
            q.done("b");
        }
        q.add_rate_limited("b");
        let worker = {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                let start = Instant::now();
                let key = q.get().await;
                (key, Instant::now() - start)
            })
        };
        tokio::task::yield_now().await;
        q.add_rate_limited("a");
        let (key, waited) = worker.await.expect("worker task");
        assert_eq!(key, "a");
        assert_eq!(waited, START);
    }

    #[tokio::test(start_paused = true)]
    async fn oldest_age_reports_how_long_the_front_key_has_waited() {
        let q = queue();
        assert_eq!(q.oldest_age(), None);
        q.add("a");
        tokio::time::advance(Duration::from_secs(3)).await;
        q.add("b");
        assert_eq!(q.oldest_age(), Some(Duration::from_secs(3)));
        let _ = q.get().await;
        assert_eq!(q.oldest_age(), Some(Duration::ZERO));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(q.longest_processing(), Some(Duration::from_secs(2)));
    }

    /// Two queues over one history, as a driver's attach and detach pools.
    fn pair() -> (Arc<Queue>, Arc<Queue>) {
        let history = Arc::new(History::default());
        let q = |name| Arc::new(Queue::sharing(name, START, MAX, history.clone()));
        (q("attach"), q("detach"))
    }

    /// external-attacher's one queue keeps a VA's failures from its attaches when the VA is
    /// deleted: its first failed detach waits `start × 2^attach failures`, not `start`.
    #[tokio::test(start_paused = true)]
    async fn a_key_that_failed_in_one_queue_backs_off_further_in_the_other() {
        let (attach, detach) = pair();
        for _ in 0..3 {
            attach.add_rate_limited("va");
            assert_eq!(attach.get().await, "va");
            attach.done("va");
        }
        detach.add("va");
        assert_eq!(detach.get().await, "va");
        detach.add_rate_limited("va");
        detach.done("va");
        let start = Instant::now();
        assert_eq!(detach.get().await, "va");
        assert_eq!(
            Instant::now() - start,
            START * 8,
            "the fourth failure in a row"
        );
        assert_eq!(attach.num_requeues("va"), 4);
        assert_eq!(detach.num_requeues("va"), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_forget_in_one_queue_starts_the_key_over_in_both() {
        let (attach, detach) = pair();
        for _ in 0..3 {
            attach.add_rate_limited("va");
            let _ = attach.get().await;
            attach.done("va");
        }
        detach.forget("va");
        assert_eq!(attach.num_requeues("va"), 0);
        attach.add_rate_limited("va");
        let start = Instant::now();
        assert_eq!(attach.get().await, "va");
        assert_eq!(Instant::now() - start, START);
    }

    /// A key moved to the other pool while that pool has it waiting out a backoff must not cut
    /// the backoff short (a driver whose detach fails would be called again at once).
    #[tokio::test(start_paused = true)]
    async fn adding_a_key_unless_known_leaves_a_waiting_key_to_its_backoff() {
        let (_, detach) = pair();
        for _ in 0..2 {
            detach.add_rate_limited("va");
            let _ = detach.get().await;
            detach.done("va");
        }
        detach.add_rate_limited("va");
        assert!(!detach.add_unless_known("va"), "it waits out its backoff");
        let start = Instant::now();
        assert_eq!(detach.get().await, "va");
        assert_eq!(Instant::now() - start, START * 4);
        // Being processed, or queued: not added either (the sync under way covers it).
        assert!(!detach.add_unless_known("va"));
        detach.done("va");
        assert_eq!(get_within(&detach, Duration::from_secs(600)).await, None);
        // Unknown: added, ready at once.
        assert!(detach.add_unless_known("va"));
        assert!(!detach.add_unless_known("va"));
        assert_eq!(detach.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_retry_never_fires_and_the_count_stays() {
        let (attach, _) = pair();
        attach.add_rate_limited("va");
        attach.cancel_retry("va");
        assert_eq!(get_within(&attach, Duration::from_secs(600)).await, None);
        assert_eq!(attach.num_requeues("va"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn two_workers_never_get_the_same_key() {
        let q = queue();
        q.add("a");
        q.add("b");
        let first = q.get().await;
        q.add("a");
        q.add("b");
        let second = q.get().await;
        assert_ne!(first, second);
        assert_eq!(get_within(&q, Duration::from_secs(1)).await, None);
    }
}
