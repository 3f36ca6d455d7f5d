//! The transport under the hub's Kubernetes clients: a multiplexed HTTP/2 connection to the API
//! server, checked for life with PINGs, as client-go's transport does; HTTP/1.1 where the server
//! offers no HTTP/2. The hub has two: one for its requests, a [sibling](Transport::sibling) for
//! its shared watches.
//!
//! ```text
//!  kube::Client (main) ──┐                       ┌─ Conn: h2 connection task ── TLS ── TCP ── API server
//!                        ├─▶ Transport ─▶ Slot ──┤   + health check (PINGs)
//!  kube::Client (leader)─┘    (tower::Service)   └─ or HTTP/1.1 (hyper-util pool, timeouts)
//!                                 ┆ Alarm (a stall on one: a PING on the other)
//!  kube::Client (watches) ──▶ Transport ─▶ Slot ── Conn ── TLS ── TCP ── API server
//! ```
//!
//! * [`dial`]: TCP (connect timeout, keepalive, `TCP_USER_TIMEOUT`), TLS (handshake timeout,
//!   ALPN `h2` then `http/1.1`, kube's CA, client identity and `tls_server_name`);
//! * [`slot`]: the one connection, dialed when a request needs it (hedged attempts, backoff);
//! * [`conn`]: one HTTP/2 connection, its requests and its health check;
//! * [`health`]: when to PING and when an unanswered PING means a dead connection;
//! * [`body`]: response bodies (flow control, read bounds).
//!
//! # Why HTTP/2, and how a dead connection is found
//!
//! client-go (and so the Go external-attacher) shares one HTTP/2 connection between every
//! client made from one configuration and runs `golang.org/x/net/http2`'s health check on it:
//! after `ReadIdleTimeout` (30 s) without a frame read it sends a PING, and closes the
//! connection if no answer comes within `PingTimeout` (15 s)
//! (`k8s.io/apimachinery/pkg/util/net/http.go`, `readIdleTimeoutSeconds`,
//! `pingTimeoutSeconds`). HTTP/1.1 has no PING: a connection that accepts bytes and never
//! answers (a hung proxy or load balancer, while the kernels on both ends keep ACKing, so TCP
//! keepalive and `TCP_USER_TIMEOUT` see nothing) held every request sent into it until its
//! read timeout, and the pool kept handing it out.
//!
//! The idle check alone finds such a stall 30-45 s late. Go's transport does one more thing
//! (`x/net/http2` `transport.go`, `pendingResets`): a request cancelled while nothing has been
//! read since it was sent is reset together with a PING, and the connection takes no new
//! request until that PING is answered. We go one step further, because the hub, unlike a
//! sidecar that loses its Lease, exits and is restarted with fresh connections, must heal
//! itself: a request that has waited [`health::STALL_AFTER`] with nothing read since it was sent
//! sends a PING at once, and a PING unanswered for [`health::STALL_PING_TIMEOUT`] with nothing
//! read meanwhile closes the connection. Its streams fail (the watches re-watch, the writes are
//! retried by their callers) and the next request dials a new one.
//!
//! # Why a second connection for the watches
//!
//! The API server's HTTP/2 server writes the frames of one connection one at a time, and a
//! watch's handler waits for each of its frames to be written before it takes the next event
//! (`x/net/http2` `server.go`, `writeDataFromHandler`). On one connection with the writes of
//! every driver (hundreds a second under churn) the hub's VolumeAttachment watch fell behind,
//! its buffer on the API server stayed full past the time the API server allows, and the API
//! server cut the watch off; a Go sidecar's connection carries one driver's writes. So the
//! watches get a [`Transport::sibling`]. Such a connection sends no request while its watches
//! run, so a freeze under it never trips its stall check; its sibling's does (Lease renewals
//! go out every few seconds), and raises an [`health::Alarm`] that makes it PING at once,
//! closed after the same [`health::STALL_PING_TIMEOUT`] if unanswered.
//!
//! # Why our own HTTP/2 client
//!
//! hyper's HTTP/2 client takes h2's only PING handle (`Connection::ping_pong`) for its own
//! keep-alive (`hyper/src/proto/h2/client.rs`), which pings on a fixed interval after the last
//! read; nothing sends a PING when a request stalls, and hyper-util's pool gives no hook to
//! retire a connection from outside. So the connection is driven by the `h2` crate directly
//! (hyper uses the same crate underneath): requests wait for a stream slot (`ready()`, the
//! server's `MAX_CONCURRENT_STREAMS`), request bodies are sent as the flow-control windows allow,
//! response bodies give their window back as they are read, trailers are ignored, and a stream
//! refused by the server or a request not sent because the connection was going away is sent
//! again once on a new connection.
//!
//! # Bounds
//!
//! Every request waits at most [`CONNECTION_WAIT`] for a connection and [`READ_TIMEOUT`] for
//! its response headers and for each DATA frame after that; a watch (`watch=true` with
//! `timeoutSeconds`) ends at most [`WATCH_SLACK`] after the server should have ended it.
//! Callers bound their requests as a whole ([`REQUEST_TIMEOUT`](super::REQUEST_TIMEOUT), the
//! leader's renew deadline).
//!
//! # HTTP/1.1
//!
//! For `http://` URLs and servers whose ALPN answer is not `h2`, requests go through hyper-util's
//! pool, one connection per concurrent request, each with TCP keepalive, a TCP user timeout and
//! read and write timeouts. It has no PING: a stalled connection is found by the read timeout.

pub mod body;
pub mod conn;
pub mod dial;
pub mod health;
pub mod slot;

#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use tokio::time::Instant;
use tracing::Instrument;

pub use body::{BodyError, ResponseBody};
pub use conn::SendError;
pub use dial::DialError;
pub use slot::ConnectError;

use crate::metrics::ConnectionMetrics;
use dial::{Dial, TcpDialer};
use health::Alarm;
use slot::{Route, Slot};

/// Longest wait of a request for a connection.
pub const CONNECTION_WAIT: Duration = Duration::from_secs(30);

/// No byte of a response for this long fails it: its headers after the request was sent, each
/// DATA frame after the one before. The shared watches ask the server to end each watch after
/// [`WATCH_TIMEOUT`](super::WATCH_TIMEOUT) and re-watch, so a healthy watch never stays silent
/// this long; a stream the server forgot on a connection that is otherwise alive is noticed
/// here.
pub const READ_TIMEOUT: Duration = Duration::from_secs(90);

/// A watch may run this much longer than the `timeoutSeconds` it asked the server for.
pub const WATCH_SLACK: Duration = Duration::from_secs(30);

/// Why a request failed in the transport.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection could be had.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The request body could not be read.
    #[error("reading the request body failed: {0}")]
    RequestBody(#[source] kube::Error),
    /// The request failed on its connection.
    #[error("request to the API server at {server} failed: {source}")]
    Send {
        /// `host:port`.
        server: String,
        /// The cause.
        #[source]
        source: SendError,
    },
}

/// The HTTP/1.1 path: hyper-util's pool with connection-level protections.
type Http1 = tower::util::BoxCloneSyncService<
    http::Request<kube::client::Body>,
    http::Response<hyper::body::Incoming>,
    tower::BoxError,
>;

/// The transport: a `tower::Service` for [`kube::Client`]s. Clones share the connection; the
/// last one dropped stops the keeper and closes it.
#[derive(Clone)]
pub struct Transport {
    /// What the clones share.
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("server", &self.inner.server)
            .finish_non_exhaustive()
    }
}

/// [`Transport`]'s shared part.
struct Inner {
    /// `host:port` of the API server.
    server: String,
    /// Where the connection's dials, PINGs and deaths are counted (shared with siblings).
    metrics: ConnectionMetrics,
    /// Shared with siblings.
    alarm: Alarm,
    /// The connection.
    slot: Arc<Slot>,
    /// Requests when the server speaks HTTP/1.1 only.
    http1: Http1,
    /// The keeper task, aborted with the last clone.
    _keeper: tokio_util::task::AbortOnDropHandle<()>,
}

impl Transport {
    /// A transport to `config.cluster_url` with kube's TLS settings. Starts the keeper task
    /// (so must run inside a Tokio runtime); connects on the first request.
    pub fn new(config: &kube::Config, metrics: ConnectionMetrics) -> kube::Result<Self> {
        let dialer = TcpDialer::new(config)?;
        let http1 = http1_client(config)?;
        Ok(Self::with_dialer(
            Arc::new(dialer),
            http1,
            metrics,
            Alarm::new(),
        ))
    }

    /// Another transport to the same API server (`config` should name it), with a connection of
    /// its own: a request that stalls on either connection makes the other check itself with
    /// a PING at once ([`health::Alarm`]). Counted in the same metrics.
    pub fn sibling(&self, config: &kube::Config) -> kube::Result<Self> {
        let dialer = TcpDialer::new(config)?;
        let http1 = http1_client(config)?;
        Ok(Self::with_dialer(
            Arc::new(dialer),
            http1,
            self.inner.metrics.clone(),
            self.inner.alarm.clone(),
        ))
    }

    /// A transport over `dialer` (the tests' in-process servers), its connections' health tied
    /// to those of the transports sharing `alarm`.
    pub(crate) fn with_dialer(
        dialer: Arc<dyn Dial>,
        http1: Http1,
        metrics: ConnectionMetrics,
        alarm: Alarm,
    ) -> Self {
        let server = dialer.server().to_owned();
        let slot = Slot::new();
        let span = tracing::info_span!("api-transport", server);
        let keeper = tokio::spawn(
            slot::keep(slot.clone(), dialer, metrics.clone(), alarm.clone()).instrument(span),
        );
        Self {
            inner: Arc::new(Inner {
                server,
                metrics,
                alarm,
                slot,
                http1,
                _keeper: tokio_util::task::AbortOnDropHandle::new(keeper),
            }),
        }
    }
}

impl tower::Service<http::Request<kube::client::Body>> for Transport {
    type Response = http::Response<ResponseBody>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // Backpressure is per request: a stream slot on the connection (`ready()`).
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(request).await })
    }
}

impl Inner {
    async fn send(
        &self,
        request: http::Request<kube::client::Body>,
    ) -> Result<http::Response<ResponseBody>, tower::BoxError> {
        let (head, body) = request.into_parts();
        let body: Bytes = body.collect().await.map_err(Error::RequestBody)?.to_bytes();
        let deadline = watch_lifetime(&head.uri).map(|life| Instant::now() + life);
        let mut retried = false;
        loop {
            match self
                .slot
                .route(CONNECTION_WAIT, &self.server)
                .await
                .map_err(Error::Connect)?
            {
                Route::Http1 => {
                    let request = http::Request::from_parts(head, kube::client::Body::from(body));
                    let response = tower::ServiceExt::oneshot(self.http1.clone(), request).await?;
                    return Ok(response.map(ResponseBody::http1));
                }
                Route::H2(conn) => {
                    match conn.send(&head, body.clone(), READ_TIMEOUT, deadline).await {
                        Ok(response) => return Ok(response),
                        Err(SendError::NotSent(error)) if !retried => {
                            tracing::debug!(%error, "the request was not sent; sending it on a new connection");
                            retried = true;
                        }
                        Err(source) => {
                            return Err(Error::Send {
                                server: self.server.clone(),
                                source,
                            }
                            .into());
                        }
                    }
                }
            }
        }
    }
}

/// How long a watch request may stream: its `timeoutSeconds` plus [`WATCH_SLACK`]; `None` for
/// other requests (and watches that ask for no timeout).
pub(crate) fn watch_lifetime(uri: &http::Uri) -> Option<Duration> {
    let query = uri.query()?;
    let mut watch = false;
    let mut timeout = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("watch", "true" | "1")) => watch = true,
            Some(("timeoutSeconds", secs)) => timeout = secs.parse::<u64>().ok(),
            _ => {}
        }
    }
    watch
        .then_some(timeout)
        .flatten()
        .map(|secs| Duration::from_secs(secs) + WATCH_SLACK)
}

/// hyper-util's HTTP/1.1 pool as the HTTP/1.1 path: kube's TLS connector (ALPN `http/1.1`),
/// TCP keepalive and user timeout, connect, read and write timeouts.
fn http1_client(config: &kube::Config) -> kube::Result<Http1> {
    use kube::client::ConfigExt;

    /// Sending a request may take this long.
    const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(dial::CONNECT_TIMEOUT));
    http.set_keepalive(Some(dial::TCP_KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(dial::TCP_KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(dial::TCP_KEEPALIVE_PROBES));
    http.set_tcp_user_timeout(Some(dial::TCP_USER_TIMEOUT));
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_read_timeout(Some(READ_TIMEOUT));
    timed.set_write_timeout(Some(WRITE_TIMEOUT));
    // Time a pooled connection sat idle must not count against the next response.
    timed.set_reset_reader_on_write(true);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(timed);
    Ok(tower::util::BoxCloneSyncService::new(
        tower::ServiceExt::map_err(client, tower::BoxError::from),
    ))
}
