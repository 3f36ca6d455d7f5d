//! Whether an HTTP/2 connection is alive: what it last read, which request waits with nothing
//! read since it was sent, and the pure decisions of when to send a PING and when an unanswered
//! one means the connection is dead.
//!
//! Three reasons to ping:
//!
//! * [`Reason::Idle`]: nothing read for [`READ_IDLE_TIMEOUT`] (client-go's `ReadIdleTimeout`),
//!   whatever the requests do; a PING unanswered for [`PING_TIMEOUT`] (client-go's
//!   `PingTimeout`) ends the connection, as Go's `http2.Transport` does;
//! * [`Reason::Stalled`]: a request sent [`STALL_AFTER`] ago, and not one byte read from the
//!   connection since. Go's transport sends a PING with the RST_STREAM of a request cancelled in
//!   that state (and takes no new stream on it until the PING is answered); we ping as soon as
//!   the request has waited [`STALL_AFTER`], and give up on the connection after
//!   [`STALL_PING_TIMEOUT`]. A server that is slow to answer a request still answers a PING at
//!   once (Go's HTTP/2 server answers PINGs from its frame loop, not from the handlers), so a
//!   slow request costs one PING, never the connection;
//! * [`Reason::Peer`]: another connection to the same API server sent a stall PING
//!   ([`Alarm`]). A connection that carries only watches sends no request while the network
//!   under it is frozen, so its own stall check never fires and its idle check finds the
//!   freeze [`READ_IDLE_TIMEOUT`] + [`PING_TIMEOUT`] late; its sibling, which sends requests
//!   every few seconds, finds the same freeze within [`STALL_AFTER`]. The PING is judged as a
//!   stall check's.
//!
//! Either way a connection is declared dead only when the PING is unanswered *and* nothing at
//! all was read for the timeout: bytes that keep arriving (a PING ACK queued behind a long
//! response) prove the connection alive.

use std::{sync::Arc, time::Duration};

use parking_lot::Mutex;
use tokio::time::Instant;

/// Nothing read from the connection for this long sends a PING (client-go's `ReadIdleTimeout`).
pub const READ_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// An idle check's PING unanswered (and nothing else read) for this long ends the connection
/// (client-go's `PingTimeout`).
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A request sent this long ago with not one byte read from the connection since sends a PING at
/// once. Short, because a PING costs 17 bytes and a healthy server answers it in a round trip:
/// what ends a connection is the unanswered PING, not the wait.
pub const STALL_AFTER: Duration = Duration::from_secs(3);

/// A stall check's PING unanswered (and nothing else read) for this long ends the connection.
/// Several round trips of any network the hub runs on, and a stall is found within
/// [`STALL_AFTER`] + this of the first request that got no answer: well inside the leader
/// election's renew deadline (10 s by default), so that the Leases are renewed on a fresh
/// connection once the network allows.
pub const STALL_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a PING was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Nothing read for [`READ_IDLE_TIMEOUT`].
    Idle,
    /// A request waited [`STALL_AFTER`] with nothing read since it was sent.
    Stalled,
    /// Another connection to the same server sent a [`Reason::Stalled`] PING.
    Peer,
}

impl Reason {
    /// The `reason` label of the connection metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Stalled => "stalled",
            Self::Peer => "peer",
        }
    }

    /// How long the PING may go unanswered, with nothing read, before the connection is dead.
    pub(crate) fn timeout(self) -> Duration {
        match self {
            Self::Idle => PING_TIMEOUT,
            Self::Stalled | Self::Peer => STALL_PING_TIMEOUT,
        }
    }
}

/// What the connections of the transports to one API server tell each other: each connection
/// that sends a [`Reason::Stalled`] PING raises it, and every other connection listening then
/// checks itself with a [`Reason::Peer`] PING. Only a stall raises it: an idle check is
/// routine, and a peer check raising it again would set the connections pinging each other.
/// On a live connection it costs one PING and its answer.
#[derive(Clone, Debug)]
pub struct Alarm(Arc<tokio::sync::watch::Sender<u64>>);

impl Alarm {
    /// An alarm nobody has raised.
    pub(crate) fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(0).0))
    }

    /// Tells every listener but `own` (which marks it heard).
    pub(crate) fn raise(&self, own: &mut tokio::sync::watch::Receiver<u64>) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
        own.borrow_and_update();
    }

    /// A listener that has heard every alarm raised so far. Its `changed()` fails only when
    /// every [`Alarm`] is gone, which cannot happen while a holder of one listens.
    pub(crate) fn listen(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.subscribe()
    }
}

/// What the health check reads of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    /// When a byte was last read (the connection's start until the first read).
    pub(crate) last_read: Instant,
    /// When the oldest request sent after the last read was sent: `None` when every request
    /// sent so far was followed by a read.
    pub(crate) unanswered_since: Option<Instant>,
}

/// What the health check does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send a PING now.
    Ping(Reason),
    /// Look again at this instant (or when a request is sent).
    WaitUntil(Instant),
}

/// When to ping: a stalled request first (the faster check), else an idle connection.
pub(crate) fn next(seen: Seen, now: Instant) -> Next {
    let idle_at = seen.last_read + READ_IDLE_TIMEOUT;
    let stall_at = seen.unanswered_since.map(|sent| sent + STALL_AFTER);
    if stall_at.is_some_and(|at| now >= at) {
        return Next::Ping(Reason::Stalled);
    }
    if now >= idle_at {
        return Next::Ping(Reason::Idle);
    }
    Next::WaitUntil(stall_at.map_or(idle_at, |at| at.min(idle_at)))
}

/// The instant at which a PING sent at `sent` for `reason`, still unanswered, declares the
/// connection dead, given the last read: any byte read after the PING went out pushes it back.
pub(crate) fn ping_deadline(reason: Reason, sent: Instant, last_read: Instant) -> Instant {
    sent.max(last_read) + reason.timeout()
}

/// The reads and sends of one connection, written by its IO and its requests, read by its
/// health check.
#[derive(Debug)]
pub(crate) struct Activity {
    /// What was seen so far.
    state: Mutex<State>,
    /// Woken when a request is sent after a read, so that the health check times its stall
    /// check from that request.
    sent: tokio::sync::Notify,
}

/// [`Activity`]'s record.
#[derive(Debug)]
struct State {
    /// When a byte was last read.
    last_read: Instant,
    /// Reads so far (an order that does not depend on the clock's resolution).
    reads: u64,
    /// The oldest request sent after the read numbered `.1`: when it was sent.
    unanswered: Option<(Instant, u64)>,
}

impl Activity {
    /// A connection that starts now.
    pub(crate) fn new(now: Instant) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                last_read: now,
                reads: 0,
                unanswered: None,
            }),
            sent: tokio::sync::Notify::new(),
        })
    }

    /// Bytes were read.
    pub(crate) fn record_read(&self, now: Instant) {
        let mut state = self.state.lock();
        state.last_read = now;
        state.reads += 1;
    }

    /// A request was sent.
    pub(crate) fn record_send(&self, now: Instant) {
        let mut state = self.state.lock();
        let reads = state.reads;
        if state.unanswered.is_some_and(|(_, r)| r == reads) {
            // An older request still waits with nothing read since: it times the check.
            return;
        }
        state.unanswered = Some((now, reads));
        drop(state);
        self.sent.notify_one();
    }

    /// What the health check reads.
    pub(crate) fn seen(&self) -> Seen {
        let state = self.state.lock();
        Seen {
            last_read: state.last_read,
            unanswered_since: state
                .unanswered
                .filter(|(_, r)| *r == state.reads)
                .map(|(at, _)| at),
        }
    }

    /// When a byte was last read.
    pub(crate) fn last_read(&self) -> Instant {
        self.state.lock().last_read
    }

    /// Resolves when a request is sent after a read (or was, since the last call).
    pub(crate) async fn request_sent(&self) {
        self.sent.notified().await;
    }
}

/// An IO stream whose reads are recorded in an [`Activity`]: any byte read is a sign of life,
/// whichever stream or frame it belongs to.
pub(crate) struct Tracked<T> {
    /// The stream (TLS over TCP, or a test's pipe).
    io: T,
    /// Where reads are recorded.
    activity: Arc<Activity>,
}

impl<T> Tracked<T> {
    pub(crate) fn new(io: T, activity: Arc<Activity>) -> Self {
        Self { io, activity }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.record_read(Instant::now());
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    /// Reported as not vectored, whatever the stream is. On a vectored stream h2 sends each
    /// DATA payload of 256 bytes or more from its own buffer, and flushes before the next frame:
    /// a write, a TLS record and a system call for every request with a body, however many go
    /// out together (100 drivers' Lease renewals were 100 writes a round). Told otherwise, h2
    /// copies payloads below 1 KiB into its write buffer, and the requests of a round leave in
    /// a few writes. The hub's request bodies (Lease renewals, finalizer and status patches)
    /// are far below 1 KiB; a larger one is still sent from its own buffer.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_pinged_after_the_read_idle_timeout() {
        let t0 = Instant::now();
        let seen = Seen {
            last_read: t0,
            unanswered_since: None,
        };
        assert_eq!(next(seen, at(t0, 1)), Next::WaitUntil(at(t0, 30)));
        assert_eq!(next(seen, at(t0, 30)), Next::Ping(Reason::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_with_nothing_read_since_is_pinged_after_the_stall_delay() {
        let t0 = Instant::now();
        let seen = Seen {
            last_read: t0,
            unanswered_since: Some(at(t0, 10)),
        };
        assert_eq!(next(seen, at(t0, 11)), Next::WaitUntil(at(t0, 13)));
        assert_eq!(next(seen, at(t0, 13)), Next::Ping(Reason::Stalled));
        // Near the idle limit, the earlier of the two.
        let late = Seen {
            last_read: t0,
            unanswered_since: Some(at(t0, 29)),
        };
        assert_eq!(next(late, at(t0, 29)), Next::WaitUntil(at(t0, 30)));
        assert_eq!(next(late, at(t0, 30)), Next::Ping(Reason::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_after_a_send_answers_it() {
        let t0 = Instant::now();
        let activity = Activity::new(t0);
        activity.record_send(at(t0, 1));
        activity.record_send(at(t0, 2));
        assert_eq!(activity.seen().unanswered_since, Some(at(t0, 1)));
        activity.record_read(at(t0, 2));
        assert_eq!(activity.seen().unanswered_since, None);
        // A send at the very instant of the read, after it, waits for the next read.
        activity.record_send(at(t0, 2));
        assert_eq!(activity.seen().unanswered_since, Some(at(t0, 2)));
        assert_eq!(activity.seen().last_read, at(t0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_ping_is_fatal_only_when_nothing_was_read_meanwhile() {
        let t0 = Instant::now();
        assert_eq!(ping_deadline(Reason::Idle, t0, at(t0, 0)), at(t0, 15));
        assert_eq!(ping_deadline(Reason::Stalled, at(t0, 3), t0), at(t0, 8));
        // Bytes read 4 s after the PING went out: the connection lives on.
        assert_eq!(
            ping_deadline(Reason::Stalled, at(t0, 3), at(t0, 7)),
            at(t0, 12)
        );
        assert_eq!(ping_deadline(Reason::Peer, at(t0, 3), t0), at(t0, 8));
    }

    #[tokio::test]
    async fn an_alarm_reaches_every_listener_but_the_one_that_raised_it() {
        let alarm = Alarm::new();
        let mut raiser = alarm.listen();
        let other = alarm.listen();
        assert!(!other.has_changed().unwrap());
        alarm.raise(&mut raiser);
        assert!(other.has_changed().unwrap());
        assert!(!raiser.has_changed().unwrap());
        // A listener made after it has heard it.
        assert!(!alarm.listen().has_changed().unwrap());
    }
}
