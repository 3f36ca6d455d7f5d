//! The one connection: a keeper task that dials when a request needs a connection and none is
//! usable, and the requests' side, which waits for it.
//!
//! Dialing: when a request waits and no connection is usable, the keeper dials. An attempt that
//! has not finished after [`HEDGE_AFTER`] gets a companion (at most [`MAX_DIALS_IN_FLIGHT`] at
//! once, each bounded by the connect and TLS handshake timeouts); the first to finish wins.
//! A server that accepts TCP connections and then says nothing (a hung proxy, an overloaded
//! server) would otherwise hold every reconnection for a whole handshake timeout, and a
//! network that comes back would wait for the attempt in flight to time out. When every attempt
//! of a round has failed, the requests that waited for it fail with its error and the next round
//! starts after a backoff ([`DIAL_BACKOFF_MIN`] doubling to [`DIAL_BACKOFF_MAX`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use tokio::{sync::watch, time::Instant};

use super::{
    conn::Conn,
    dial::{Dial, DialError, Dialed},
    health::Alarm,
};
use crate::backoff::Doubling;
use crate::metrics::ConnectionMetrics;

/// A dial attempt still running after this long gets a companion attempt.
pub const HEDGE_AFTER: Duration = Duration::from_millis(2500);

/// Most dial attempts at once: with [`HEDGE_AFTER`] and a 10 s handshake timeout, a new attempt
/// starts every 2.5 s for as long as the server takes connections and answers none.
pub const MAX_DIALS_IN_FLIGHT: usize = 4;

/// Pause before the next round after a failed one, and the least time between the starts of
/// two rounds (so that a server that closes every new connection at once is not dialed in a
/// tight loop).
pub const DIAL_BACKOFF_MIN: Duration = Duration::from_millis(250);

/// Longest pause between rounds. Short: a refused connection costs the server nothing, and the
/// pause adds to the time the hub needs to reconnect once the server is back.
pub const DIAL_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Least time between two warnings about failing dials (the first failure and the recovery are
/// always logged).
const DIAL_LOG_EVERY: Duration = Duration::from_secs(30);

/// Where the connection stands.
#[derive(Clone, Debug)]
pub(crate) enum State {
    /// No connection, and none being dialed.
    Empty,
    /// A round of dial attempts runs.
    Dialing,
    /// A connection, usable unless retired.
    Ready(Arc<Conn>),
    /// The server speaks no HTTP/2: requests go over HTTP/1.1.
    Http1,
    /// The last round failed; the next one starts when a request needs it, after a backoff.
    Failed(Arc<DialError>),
}

/// Where a request goes.
#[derive(Debug)]
pub(crate) enum Route {
    /// On this HTTP/2 connection.
    H2(Arc<Conn>),
    /// Over HTTP/1.1.
    Http1,
}

/// Why a request got no connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The round of dial attempts the request waited for failed.
    #[error(transparent)]
    Dial(Arc<DialError>),
    /// No connection within the bound (the dials hang).
    #[error("no connection to the API server at {server} within {waited:?}")]
    NoConnection {
        /// `host:port`.
        server: String,
        /// How long the request waited.
        waited: Duration,
    },
    /// The keeper is gone (the transport is being dropped).
    #[error("the connection keeper for {0} stopped")]
    Stopped(String),
}

/// The connection state shared by the keeper and the requests.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The state; requests watch it.
    state: watch::Sender<State>,
    /// Requests that need a connection wake the keeper.
    demand: tokio::sync::Notify,
    /// Requests waiting for a connection now (attempts are hedged only for someone).
    waiting: AtomicUsize,
}

impl Slot {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: watch::Sender::new(State::Empty),
            demand: tokio::sync::Notify::new(),
            waiting: AtomicUsize::new(0),
        })
    }

    /// The connection for one request: the usable one at once, else the outcome of the next
    /// dial, waiting at most `wait`.
    pub(crate) async fn route(&self, wait: Duration, server: &str) -> Result<Route, ConnectError> {
        match &*self.state.borrow() {
            State::Ready(conn) if !conn.is_retired() => return Ok(Route::H2(conn.clone())),
            State::Http1 => return Ok(Route::Http1),
            _ => {}
        }
        let _waiting = Waiting::new(&self.waiting);
        let start = Instant::now();
        let mut states = self.state.subscribe();
        let mut asked = false;
        loop {
            match &*states.borrow_and_update() {
                State::Ready(conn) if !conn.is_retired() => return Ok(Route::H2(conn.clone())),
                State::Http1 => return Ok(Route::Http1),
                // A failure seen after asking is the outcome of a round that ran for us.
                State::Failed(e) if asked => return Err(ConnectError::Dial(e.clone())),
                _ => {}
            }
            if !asked {
                self.demand.notify_one();
                asked = true;
            }
            match tokio::time::timeout_at(start + wait, states.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(ConnectError::Stopped(server.to_owned())),
                Err(_) => {
                    return Err(ConnectError::NoConnection {
                        server: server.to_owned(),
                        waited: wait,
                    });
                }
            }
        }
    }

    fn waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }
}

/// Counts a request in [`Slot::waiting`] while it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// When the next hedged attempt of a round starts: `HEDGE_AFTER` after the last one, while
/// someone waits and fewer than [`MAX_DIALS_IN_FLIGHT`] run; `None`: not now.
pub(crate) fn next_hedge(in_flight: usize, last_start: Instant, waiting: bool) -> Option<Instant> {
    (waiting && in_flight < MAX_DIALS_IN_FLIGHT).then(|| last_start + HEDGE_AFTER)
}

/// The least time between the start of one round and the next after `failures` failed rounds
/// in a row: [`DIAL_BACKOFF_MIN`] doubling up to [`DIAL_BACKOFF_MAX`] (before the jitter the
/// keeper takes off). After a connection that retired, no failure yet: the minimum.
pub(crate) fn backoff(failures: u32) -> Duration {
    Doubling::new(DIAL_BACKOFF_MIN, DIAL_BACKOFF_MAX).after(failures)
}

/// Keeps the connection: dials on demand, publishes it, and starts over when it retires. Ends
/// only when the server turns out to speak HTTP/1.1 only (the state stays [`State::Http1`]).
pub(crate) async fn keep(
    slot: Arc<Slot>,
    dialer: Arc<dyn Dial>,
    metrics: ConnectionMetrics,
    alarm: Alarm,
) {
    let server = dialer.server().to_owned();
    let mut failures = 0u32;
    let mut last_round: Option<Instant> = None;
    let mut log = DialLog::default();
    loop {
        slot.demand.notified().await;
        if let Some(last) = last_round {
            let pause = backoff(failures).mul_f64(1.0 - crate::random::random_unit() / 4.0);
            tokio::time::sleep_until(last + pause).await;
        }
        last_round = Some(Instant::now());
        slot.state.send_replace(State::Dialing);
        let outcome = match dial_round(&slot, &*dialer, &metrics).await {
            Ok(Dialed::H2(io)) => Conn::start(io, &server, &metrics, &alarm)
                .await
                .inspect_err(|_| {
                    // The TLS connection was made, the HTTP/2 handshake failed: a failed attempt.
                    metrics.dials.with_label_values(&["error"]).inc();
                }),
            Ok(Dialed::Http1) => {
                metrics.dials.with_label_values(&["http1"]).inc();
                tracing::info!(%server, "the API server offers no HTTP/2; using HTTP/1.1 connections");
                slot.state.send_replace(State::Http1);
                return;
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(conn) => {
                metrics.dials.with_label_values(&["h2"]).inc();
                log.connected(&server, conn.id());
                failures = 0;
                slot.state.send_replace(State::Ready(conn.clone()));
                conn.retired().await;
                slot.state.send_replace(State::Empty);
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                log.failed(&server, &error);
                slot.state.send_replace(State::Failed(Arc::new(error)));
            }
        }
    }
}

/// One round of dial attempts: the first success, or the last error once every attempt failed.
/// Counts each failed attempt.
async fn dial_round(
    slot: &Slot,
    dialer: &dyn Dial,
    metrics: &ConnectionMetrics,
) -> Result<Dialed, DialError> {
    let mut attempts = futures::stream::FuturesUnordered::new();
    attempts.push(dialer.dial());
    let mut last_start = Instant::now();
    loop {
        let hedge = next_hedge(attempts.len(), last_start, slot.waiting());
        tokio::select! {
            Some(outcome) = attempts.next() => match outcome {
                Ok(dialed) => return Ok(dialed),
                Err(error) => {
                    metrics.dials.with_label_values(&["error"]).inc();
                    if attempts.is_empty() {
                        return Err(error);
                    }
                    tracing::debug!(%error, "a dial attempt failed; others run");
                }
            },
            () = sleep_until(hedge) => {
                tracing::debug!(in_flight = attempts.len(), "a dial attempt hangs; starting another");
                attempts.push(dialer.dial());
                last_start = Instant::now();
            }
            // A new request waits: look at the hedge again.
            () = slot.demand.notified() => {}
        }
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Rate-limits the dial warnings: the first failure of a streak, then at most one per
/// [`DIAL_LOG_EVERY`], and the recovery.
#[derive(Debug, Default)]
struct DialLog {
    /// Failed rounds since the last success.
    failed: u64,
    /// When the last warning was logged.
    warned: Option<Instant>,
    /// Connections made so far.
    connected: u64,
}

impl DialLog {
    fn failed(&mut self, server: &str, error: &DialError) {
        self.failed += 1;
        let now = Instant::now();
        if self.warned.is_none_or(|at| now >= at + DIAL_LOG_EVERY) {
            self.warned = Some(now);
            tracing::warn!(%server, %error, failed_rounds = self.failed, "cannot connect to the API server; retrying with backoff");
        } else {
            tracing::debug!(%server, %error, failed_rounds = self.failed, "cannot connect to the API server");
        }
    }

    fn connected(&mut self, server: &str, id: u64) {
        if self.connected == 0 && self.failed == 0 {
            tracing::debug!(%server, id, "connected to the API server (HTTP/2)");
        } else {
            // A new connection after a dead or closed one, or after failures: worth a line.
            tracing::info!(%server, id, failed_rounds = self.failed, "connected to the API server again (HTTP/2)");
        }
        self.connected += 1;
        self.failed = 0;
        self.warned = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hanging_dial_gets_a_companion_while_someone_waits() {
        let t0 = Instant::now();
        assert_eq!(next_hedge(1, t0, true), Some(t0 + HEDGE_AFTER));
        assert_eq!(
            next_hedge(MAX_DIALS_IN_FLIGHT - 1, t0, true),
            Some(t0 + HEDGE_AFTER)
        );
        assert_eq!(next_hedge(MAX_DIALS_IN_FLIGHT, t0, true), None);
        assert_eq!(next_hedge(1, t0, false), None);
    }

    #[test]
    fn the_dial_backoff_doubles_from_the_minimum_to_the_maximum() {
        assert_eq!(backoff(0), DIAL_BACKOFF_MIN);
        assert_eq!(backoff(1), DIAL_BACKOFF_MIN);
        assert_eq!(backoff(2), DIAL_BACKOFF_MIN * 2);
        assert_eq!(backoff(3), DIAL_BACKOFF_MIN * 4);
        assert_eq!(backoff(4), DIAL_BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), DIAL_BACKOFF_MAX);
    }
}
