//! One HTTP/2 connection: its task (which drives the h2 connection and checks its health), and
//! sending one request on it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    body::ResponseBody,
    dial::{DialError, Io},
    health::{self, Activity, Alarm, Next, Reason, Tracked},
};
use crate::metrics::ConnectionMetrics;

/// Stream flow-control window: what the server may send on one stream before we read it (Go's
/// `transportDefaultStreamFlow`, 4 MiB). h2's default (64 KiB) would cost a round trip per
/// 64 KiB of a large LIST.
const STREAM_WINDOW_BYTES: u32 = 4 << 20;

/// Connection flow-control window (Go's `transportDefaultConnFlow`, 1 GiB): one stream whose
/// reader lags never holds back the others.
const CONNECTION_WINDOW_BYTES: u32 = 1 << 30;

/// Longest HTTP/2 handshake (the preface and SETTINGS exchange that follows TLS).
const H2_HANDSHAKE_TIMEOUT: Duration = super::dial::TLS_HANDSHAKE_TIMEOUT;

/// Numbers connections in logs.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A request could not be sent, or failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The request never reached the server (the connection was closing or closed, or the server
    /// refused the stream): it may be sent again on another connection.
    #[error("the request was not sent: {0}")]
    NotSent(#[source] h2::Error),
    /// The request was sent (or may have been) and failed.
    #[error("{0}")]
    Failed(#[source] h2::Error),
    /// No response headers within the bound.
    #[error("no response within {0:?}")]
    NoResponse(Duration),
}

/// One HTTP/2 connection to the API server.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Number in logs.
    id: u64,
    /// Opens streams.
    send: h2::client::SendRequest<Bytes>,
    /// Reads and sends, for the health check.
    activity: Arc<Activity>,
    /// Cancelled once the connection takes no new request: dead, closed, or going away.
    retired: CancellationToken,
    /// The connection's task; aborted when the last handle (the slot's, or a response body's)
    /// goes, which closes the socket.
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

impl Conn {
    /// Runs the HTTP/2 handshake on `io` and starts the connection's task.
    pub(crate) async fn start(
        io: Box<dyn Io>,
        server: &str,
        metrics: &ConnectionMetrics,
        alarm: &Alarm,
    ) -> Result<Arc<Self>, DialError> {
        let activity = Activity::new(Instant::now());
        let tracked = Tracked::new(io, activity.clone());
        let handshake = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .enable_push(false)
            .handshake::<_, Bytes>(tracked);
        let (send, mut connection) = tokio::time::timeout(H2_HANDSHAKE_TIMEOUT, handshake)
            .await
            .map_err(|_| DialError::Tls {
                server: server.to_owned(),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no HTTP/2 handshake within {H2_HANDSHAKE_TIMEOUT:?}"),
                ),
            })?
            .map_err(|source| DialError::H2 {
                server: server.to_owned(),
                source,
            })?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let retired = CancellationToken::new();
        let ping_pong = connection.ping_pong();
        let drive = Drive {
            id,
            server: server.to_owned(),
            activity: activity.clone(),
            retired: retired.clone(),
            metrics: metrics.clone(),
            alarm: alarm.clone(),
        };
        let span = tracing::debug_span!("api-connection", id, server);
        let task = tokio::spawn(drive.run(connection, ping_pong).instrument(span));
        Ok(Arc::new(Self {
            id,
            send,
            activity,
            retired,
            _task: tokio_util::task::AbortOnDropHandle::new(task),
        }))
    }

    /// Whether the connection takes no new request.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.is_cancelled()
    }

    /// Resolves once the connection takes no new request.
    pub(crate) async fn retired(&self) {
        self.retired.cancelled().await;
    }

    /// Sends one request and waits for its response headers, at most `bound`; the body then
    /// streams, each frame within `bound` of the one before and all of it before `deadline`.
    pub(crate) async fn send(
        self: &Arc<Self>,
        head: &http::request::Parts,
        body: Bytes,
        bound: Duration,
        deadline: Option<Instant>,
    ) -> Result<http::Response<ResponseBody>, SendError> {
        let answer = async {
            let mut send = self.send.clone().ready().await.map_err(|e| {
                self.retired.cancel();
                SendError::NotSent(e)
            })?;
            let mut request = http::Request::new(());
            *request.method_mut() = head.method.clone();
            *request.uri_mut() = head.uri.clone();
            *request.version_mut() = http::Version::HTTP_2;
            *request.headers_mut() = h2_headers(&head.headers);
            let end = body.is_empty();
            let (response, mut stream) = send.send_request(request, end).map_err(|e| {
                if e.is_go_away() || e.is_io() {
                    self.retired.cancel();
                }
                SendError::NotSent(e)
            })?;
            self.activity.record_send(Instant::now());
            if !end && let Err(e) = send_body(&mut stream, body).await {
                // RFC 9113 8.1: a server may answer before it has read the whole request, then
                // reset the stream with NO_ERROR; the answer stands.
                if e.reason() != Some(h2::Reason::NO_ERROR) {
                    return Err(SendError::Failed(e));
                }
            }
            response.await.map_err(|e| {
                if e.reason() == Some(h2::Reason::REFUSED_STREAM) {
                    // RFC 9113 8.7: a refused stream was not processed.
                    SendError::NotSent(e)
                } else {
                    if e.is_go_away() {
                        self.retired.cancel();
                    }
                    SendError::Failed(e)
                }
            })
        };
        let response = tokio::time::timeout(bound, answer)
            .await
            .map_err(|_| SendError::NoResponse(bound))??;
        Ok(response.map(|recv| ResponseBody::h2(recv, self.clone(), bound, deadline)))
    }

    /// The connection's number in logs.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

/// Sends `body` on `stream` as the flow-control windows allow, and ends the stream.
async fn send_body(stream: &mut h2::SendStream<Bytes>, mut body: Bytes) -> Result<(), h2::Error> {
    while !body.is_empty() {
        stream.reserve_capacity(body.len());
        let granted = match std::future::poll_fn(|cx| stream.poll_capacity(cx)).await {
            Some(granted) => granted?,
            None => {
                // The stream was reset: its error says why.
                return std::future::poll_fn(|cx| stream.poll_reset(cx))
                    .await
                    .and_then(|reason| Err(h2::Error::from(reason)));
            }
        };
        if granted == 0 {
            continue;
        }
        let chunk = body.split_to(granted.min(body.len()));
        stream.send_data(chunk, body.is_empty())?;
    }
    Ok(())
}

/// The request's headers minus those HTTP/2 forbids (RFC 9113 8.2.2) and `Host` (the URI's
/// authority becomes `:authority`).
fn h2_headers(headers: &http::HeaderMap) -> http::HeaderMap {
    use http::header;
    let mut out = headers.clone();
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::HOST,
    ] {
        out.remove(name);
    }
    out.remove("keep-alive");
    out.remove("proxy-connection");
    if out
        .get(header::TE)
        .is_some_and(|te| te.as_bytes() != b"trailers")
    {
        out.remove(header::TE);
    }
    out
}

/// What the connection's task needs.
struct Drive {
    /// Number in logs.
    id: u64,
    /// `host:port`.
    server: String,
    /// Reads and sends.
    activity: Arc<Activity>,
    /// Cancelled when the task ends.
    retired: CancellationToken,
    /// Where PINGs and deaths are counted.
    metrics: ConnectionMetrics,
    /// Shared with the other connections to the server.
    alarm: Alarm,
}

/// How a connection ended.
enum End {
    /// The server closed it, or it went away and its last stream finished.
    Closed,
    /// An IO or protocol error.
    Error(h2::Error),
    /// A health PING went unanswered.
    Dead {
        /// Why the PING was sent.
        reason: Reason,
        /// How long nothing was read before giving up.
        silent: Duration,
    },
}

impl Drive {
    /// Drives the connection and checks its health until it ends or is declared dead; then
    /// drops it, which fails every stream still open on it.
    async fn run(
        self,
        connection: h2::client::Connection<Tracked<Box<dyn Io>>, Bytes>,
        ping_pong: Option<h2::PingPong>,
    ) {
        let _open = OpenGauge::inc(&self.metrics.open);
        let mut connection = std::pin::pin!(connection);
        let end = tokio::select! {
            ended = &mut connection => match ended {
                Ok(()) => End::Closed,
                Err(e) => End::Error(e),
            },
            end = self.check(ping_pong) => end,
        };
        self.retired.cancel();
        match end {
            End::Closed => tracing::debug!("the API server closed the connection"),
            End::Error(error) => {
                tracing::info!(server = %self.server, id = self.id, %error, "the connection to the API server failed; the next request opens a new one");
            }
            End::Dead { reason, silent } => {
                self.metrics.dead.with_label_values(&[reason.label()]).inc();
                tracing::warn!(
                    server = %self.server,
                    id = self.id,
                    cause = match reason {
                        Reason::Idle => "nothing read, and a health PING unanswered",
                        Reason::Stalled => "a request unanswered, and a health PING unanswered",
                        Reason::Peer => "another connection to the server stalled, and a health PING unanswered",
                    },
                    silent_s = silent.as_secs_f64(),
                    "the connection to the API server is dead; closing it (its requests and watches fail and are retried on a new connection)"
                );
            }
        }
    }

    /// The health check: pings when [`health::next`] says so or another connection to the
    /// server raises the [`Alarm`]; returns when a PING goes unanswered or cannot be sent.
    /// Never returns for a connection without PINGs.
    async fn check(&self, ping_pong: Option<h2::PingPong>) -> End {
        let Some(mut ping_pong) = ping_pong else {
            return std::future::pending().await;
        };
        let mut peers = self.alarm.listen();
        loop {
            let reason = match health::next(self.activity.seen(), Instant::now()) {
                Next::WaitUntil(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => continue,
                        () = self.activity.request_sent() => continue,
                        Ok(()) = peers.changed() => Reason::Peer,
                    }
                }
                Next::Ping(reason) => reason,
            };
            // This PING answers every alarm raised so far.
            peers.borrow_and_update();
            if reason == Reason::Stalled {
                self.alarm.raise(&mut peers);
            }
            let sent = Instant::now();
            tracing::debug!(reason = reason.label(), "health PING");
            if let Err(e) = ping_pong.send_ping(h2::Ping::opaque()) {
                return End::Error(e);
            }
            let answered = loop {
                let deadline = health::ping_deadline(reason, sent, self.activity.last_read());
                tokio::select! {
                    pong = std::future::poll_fn(|cx| ping_pong.poll_pong(cx)) => break pong.map(|_| ()),
                    () = tokio::time::sleep_until(deadline) => {
                        let now = Instant::now();
                        if now >= health::ping_deadline(reason, sent, self.activity.last_read()) {
                            self.metrics.pings.with_label_values(&[reason.label(), "unanswered"]).inc();
                            return End::Dead { reason, silent: now - self.activity.last_read() };
                        }
                    }
                }
            };
            match answered {
                Ok(()) => {
                    self.metrics
                        .pings
                        .with_label_values(&[reason.label(), "answered"])
                        .inc();
                }
                Err(e) => return End::Error(e),
            }
        }
    }
}

/// Counts a connection in `attacher_hub_api_connections_open` while it lives (also when its task
/// is aborted).
struct OpenGauge(prometheus::IntGauge);

impl OpenGauge {
    fn inc(gauge: &prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for OpenGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}
