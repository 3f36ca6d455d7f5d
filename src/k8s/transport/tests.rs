//! The transport against in-process servers: hyper's HTTP/2 server over in-memory pipes that the
//! test can stall (both directions, the pipe staying open: writes are swallowed, nothing is ever
//! read again, as through a hung proxy whose kernel keeps ACKing), on Tokio's paused clock; and
//! a TLS server on loopback for ALPN and the server name.
//!
//! `testdata/` holds a test CA and a server certificate for `kubernetes.test` only (DER, valid
//! for a century), made once with `openssl req`/`openssl x509`.

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, combinators::BoxBody};
use hyper::body::Frame;
use tokio::time::Instant;

use super::{
    READ_TIMEOUT, Transport, WATCH_SLACK,
    dial::{Dial, DialError, Dialed},
    health::{Alarm, PING_TIMEOUT, READ_IDLE_TIMEOUT, STALL_AFTER, STALL_PING_TIMEOUT},
    slot::HEDGE_AFTER,
    watch_lifetime,
};
use crate::metrics::ConnectionMetrics;

// === the server ===

/// What the in-process server saw.
#[derive(Debug, Default)]
struct Server {
    /// Connections served.
    connections: AtomicUsize,
    /// Requests served.
    requests: AtomicUsize,
    /// Notified to make every connection go away (GOAWAY, then close after its streams).
    go_away: tokio::sync::Notify,
}

type ServerBody = BoxBody<Bytes, Infallible>;

/// The routes: `/fast`; `/length` (reads the request body, answers its length); `/slow/<ms>` (answers after that long); `/watch/<period ms>/<n>` (a
/// stream of `n` chunks, one per period, the first at once; `n = 0`: forever); `/version`
/// (the HTTP version it was asked with).
async fn handle(request: http::Request<hyper::body::Incoming>) -> http::Response<ServerBody> {
    let path: Vec<String> = request
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let text = |s: String| http_body_util::Full::new(Bytes::from(s)).boxed();
    let body = match path.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["slow", ms] => {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
            text("slow".to_owned())
        }
        ["watch", period, n] => {
            let period = Duration::from_millis(period.parse().unwrap());
            let n: usize = n.parse().unwrap();
            let chunks = futures::stream::unfold(0usize, move |i| async move {
                if n > 0 && i == n {
                    return None;
                }
                if i > 0 {
                    tokio::time::sleep(period).await;
                }
                Some((Ok(Frame::data(Bytes::from(format!("event {i}\n")))), i + 1))
            });
            http_body_util::StreamBody::new(chunks).boxed()
        }
        ["version"] => text(format!("{:?}", request.version())),
        ["length"] => {
            let body = request.into_body().collect().await.expect("a body");
            text(body.to_bytes().len().to_string())
        }
        _ => text("ok".to_owned()),
    };
    http::Response::new(body)
}

impl Server {
    /// Serves HTTP/2 on `io` until the client goes or [`Server::go_away`] is notified.
    async fn serve_h2<I>(self: Arc<Self>, io: I)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let server = self.clone();
        let service = hyper::service::service_fn(move |request| {
            server.requests.fetch_add(1, Ordering::Relaxed);
            async move { Ok::<_, Infallible>(handle(request).await) }
        });
        let connection =
            hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let mut connection = std::pin::pin!(connection);
        tokio::select! {
            _ = connection.as_mut() => {}
            () = self.go_away.notified() => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
    }
}

// === the pipes and the dialer ===

/// Stalls one client connection when set: reads never complete again, writes are swallowed.
type Gate = Arc<AtomicBool>;

/// The client end of an in-memory connection, stallable. It says it takes vectored writes, as
/// a TLS stream does, and counts the writes made on it.
struct Pipe {
    /// The bytes.
    io: tokio::io::DuplexStream,
    /// Set: stalled for good.
    stalled: Gate,
    /// Writes so far, on every pipe of the dialer.
    writes: Arc<AtomicUsize>,
}

impl tokio::io::AsyncRead for Pipe {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.stalled.load(Ordering::Relaxed) {
            // Nothing will ever arrive, and nothing will wake us.
            return Poll::Pending;
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Pipe {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.stalled.load(Ordering::Relaxed) {
            // Accepted, as a kernel ACKs, and never delivered.
            return Poll::Ready(Ok(buf.len()));
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Dials the in-process server, and misbehaves on request.
#[derive(Debug, Default)]
struct Dialer {
    /// The server.
    server: Arc<Server>,
    /// The gate of every connection so far.
    gates: parking_lot::Mutex<Vec<Gate>>,
    /// Dial attempts so far.
    dials: AtomicUsize,
    /// The next this many attempts hang for [`HANG`], then fail.
    hang: AtomicUsize,
    /// The next this many attempts fail at once.
    refuse: AtomicUsize,
    /// Writes on the client ends of every connection so far.
    writes: Arc<AtomicUsize>,
}

/// How long a hanging dial attempt hangs (the TLS handshake timeout).
const HANG: Duration = Duration::from_secs(10);

impl Dialer {
    fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Stalls every connection made so far, for good.
    fn stall_all(&self) {
        for gate in self.gates.lock().iter() {
            gate.store(true, Ordering::Relaxed);
        }
    }

    fn dials(&self) -> usize {
        self.dials.load(Ordering::Relaxed)
    }

    fn connections(&self) -> usize {
        self.server.connections.load(Ordering::Relaxed)
    }
}

/// Takes one from `n` if it is above zero.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1))
        .is_ok()
}

impl Dial for Dialer {
    fn dial(&self) -> BoxFuture<'static, Result<Dialed, DialError>> {
        self.dials.fetch_add(1, Ordering::Relaxed);
        let refused = || DialError::Connect {
            server: "test".to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        if take_one(&self.hang) {
            return Box::pin(async move {
                tokio::time::sleep(HANG).await;
                Err(DialError::Tls {
                    server: "test".to_owned(),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                })
            });
        }
        if take_one(&self.refuse) {
            return Box::pin(async move { Err(refused()) });
        }
        let (client, server) = tokio::io::duplex(1 << 20);
        let gate = Gate::default();
        self.gates.lock().push(gate.clone());
        tokio::spawn(self.server.clone().serve_h2(server));
        let writes = self.writes.clone();
        Box::pin(async move {
            Ok(Dialed::H2(Box::new(Pipe {
                io: client,
                stalled: gate,
                writes,
            })))
        })
    }

    fn server(&self) -> &str {
        "test"
    }
}

// === helpers ===

/// A transport over `dialer`, with its metrics.
fn transport(dialer: &Arc<Dialer>) -> (Transport, ConnectionMetrics) {
    let metrics = ConnectionMetrics::new();
    (
        Transport::with_dialer(dialer.clone(), no_http1(), metrics.clone(), Alarm::new()),
        metrics,
    )
}

/// A second transport to `dialer`'s server beside `transport`, as the hub makes for its
/// watches (`Transport::sibling`).
fn sibling(transport: &Transport, dialer: &Arc<Dialer>) -> Transport {
    Transport::with_dialer(
        dialer.clone(),
        no_http1(),
        transport.inner.metrics.clone(),
        transport.inner.alarm.clone(),
    )
}

/// The HTTP/1.1 path of the tests' transports: every test server speaks HTTP/2.
fn no_http1() -> super::Http1 {
    tower::util::BoxCloneSyncService::new(tower::service_fn(
        |_: http::Request<kube::client::Body>| async {
            Err::<http::Response<hyper::body::Incoming>, tower::BoxError>(
                "no HTTP/1.1 in this test".into(),
            )
        },
    ))
}

/// `GET https://test.local<path>`: the response.
async fn get(
    transport: &Transport,
    path: &str,
) -> Result<http::Response<super::ResponseBody>, tower::BoxError> {
    get_url(transport, &format!("https://test.local{path}")).await
}

async fn get_url(
    transport: &Transport,
    url: &str,
) -> Result<http::Response<super::ResponseBody>, tower::BoxError> {
    let request = http::Request::get(url)
        .body(kube::client::Body::empty())
        .expect("a valid request");
    tower::ServiceExt::oneshot(transport.clone(), request).await
}

/// `GET`, then the whole body as text.
async fn get_text(transport: &Transport, path: &str) -> Result<String, tower::BoxError> {
    let body = get(transport, path).await?.into_body().collect().await?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

/// The next DATA frame of `body`.
async fn next_chunk(body: &mut super::ResponseBody) -> Option<Result<Bytes, tower::BoxError>> {
    loop {
        match body.frame().await? {
            Ok(frame) => match frame.into_data() {
                Ok(data) => return Some(Ok(data)),
                Err(_) => continue,
            },
            Err(e) => return Some(Err(e)),
        }
    }
}

fn count(metric: &prometheus::IntCounterVec, labels: &[&str]) -> u64 {
    metric.with_label_values(labels).get()
}

/// `d` is within `[from, from + slack]`.
fn within(d: Duration, from: Duration, slack: Duration) -> bool {
    d >= from && d <= from + slack
}

// === multiplexing ===

#[tokio::test(start_paused = true)]
async fn concurrent_requests_share_one_connection() {
    let dialer = Dialer::new();
    let (transport, metrics) = transport(&dialer);
    let answers =
        futures::future::join_all((0..50).map(|_| get_text(&transport, "/slow/100"))).await;
    assert!(answers.iter().all(|a| a.as_deref().ok() == Some("slow")));
    assert_eq!(dialer.dials(), 1);
    assert_eq!(dialer.connections(), 1);
    assert_eq!(dialer.server.requests.load(Ordering::Relaxed), 50);
    assert_eq!(count(&metrics.dials, &["h2"]), 1);
    assert_eq!(metrics.open.get(), 1);
}

/// Requests with small bodies sent together leave together: h2 copies their payloads into
/// its write buffer rather than flushing once per request, as it would on a stream that takes
/// vectored writes (the pipe says it does, as TLS streams do).
#[tokio::test(start_paused = true)]
async fn small_request_bodies_sent_together_leave_in_a_few_writes() {
    const REQUESTS: usize = 40;
    let dialer = Dialer::new();
    let (transport, _metrics) = transport(&dialer);
    // Open the connection first: its handshake writes are not counted.
    assert_eq!(get_text(&transport, "/fast").await.expect("answered"), "ok");
    let before = dialer.writes.load(Ordering::Relaxed);
    // A Lease renewal's size.
    let body = Bytes::from(vec![b'x'; 600]);
    let put = |i: usize| {
        let request = http::Request::put(format!("https://test.local/length?lease={i}"))
            .body(kube::client::Body::from(body.to_vec()))
            .expect("a valid request");
        tower::ServiceExt::oneshot(transport.clone(), request)
    };
    let answers = futures::future::join_all((0..REQUESTS).map(put)).await;
    for answer in answers {
        let body = answer.expect("answered").into_body().collect().await;
        assert_eq!(body.expect("a body").to_bytes(), "600");
    }
    let writes = dialer.writes.load(Ordering::Relaxed) - before;
    assert!(
        writes <= REQUESTS / 4,
        "{REQUESTS} small requests sent together took {writes} writes (81 when each flushes)"
    );
}

/// A server may answer before it has read the request's body, and reset the stream with
/// NO_ERROR (RFC 9113 8.1): the answer stands.
#[tokio::test(start_paused = true)]
async fn an_answer_given_before_the_body_was_read_stands() {
    let dialer = Dialer::new();
    let (transport, _metrics) = transport(&dialer);
    let request = http::Request::put("https://test.local/fast")
        .body(kube::client::Body::from(vec![b'x'; 100_000]))
        .expect("a valid request");
    let answer = tower::ServiceExt::oneshot(transport.clone(), request)
        .await
        .expect("answered");
    let body = answer.into_body().collect().await.expect("a body");
    assert_eq!(body.to_bytes(), "ok");
}

#[tokio::test(start_paused = true)]
async fn clones_of_a_transport_share_its_connection() {
    let dialer = Dialer::new();
    let (transport, _) = transport(&dialer);
    let other = transport.clone();
    assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    assert_eq!(get_text(&other, "/fast").await.unwrap(), "ok");
    assert_eq!(dialer.dials(), 1);
}

// === health ===

#[tokio::test(start_paused = true)]
async fn a_stalled_connection_is_closed_after_an_unanswered_ping_and_the_next_request_dials() {
    let dialer = Dialer::new();
    let (transport, metrics) = transport(&dialer);
    assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    dialer.stall_all();
    let start = Instant::now();
    let failed = get(&transport, "/fast").await;
    let took = start.elapsed();
    assert!(failed.is_err(), "a request on a stalled connection failed");
    assert!(
        within(
            took,
            STALL_AFTER + STALL_PING_TIMEOUT,
            Duration::from_millis(100)
        ),
        "found after {took:?}, expected {:?}",
        STALL_AFTER + STALL_PING_TIMEOUT
    );
    assert_eq!(count(&metrics.pings, &["stalled", "unanswered"]), 1);
    assert_eq!(count(&metrics.dead, &["stalled"]), 1);
    assert_eq!(metrics.open.get(), 0);
    // The next request gets a new connection at once.
    let start = Instant::now();
    assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    assert!(start.elapsed() <= Duration::from_millis(300));
    assert_eq!(dialer.dials(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_watch_on_a_stalled_quiet_connection_ends_after_the_idle_ping_goes_unanswered() {
    let dialer = Dialer::new();
    let (transport, metrics) = transport(&dialer);
    let mut watch = get(&transport, "/watch/1000000/0")
        .await
        .unwrap()
        .into_body();
    assert!(next_chunk(&mut watch).await.unwrap().is_ok());
    let start = Instant::now();
    dialer.stall_all();
    let ended = next_chunk(&mut watch).await.unwrap();
    let took = start.elapsed();
    assert!(ended.is_err(), "the watch failed");
    assert!(
        within(
            took,
            READ_IDLE_TIMEOUT + PING_TIMEOUT,
            Duration::from_millis(100)
        ),
        "found after {took:?}"
    );
    assert_eq!(count(&metrics.dead, &["idle"]), 1);
    assert_eq!(count(&metrics.pings, &["idle", "unanswered"]), 1);
}

#[tokio::test(start_paused = true)]
async fn a_watch_on_a_sibling_of_a_stalled_connection_ends_with_the_stall_not_the_idle_check() {
    let dialer = Dialer::new();
    let (requests, metrics) = transport(&dialer);
    let watches = sibling(&requests, &dialer);
    assert_eq!(get_text(&requests, "/fast").await.unwrap(), "ok");
    let mut watch = get(&watches, "/watch/1000000/0").await.unwrap().into_body();
    assert!(next_chunk(&mut watch).await.unwrap().is_ok());
    assert_eq!(dialer.connections(), 2, "one connection each");
    dialer.stall_all();
    let start = Instant::now();
    let (failed, ended) = tokio::join!(get(&requests, "/fast"), async {
        let ended = next_chunk(&mut watch).await.unwrap();
        (ended, start.elapsed())
    });
    assert!(
        failed.is_err(),
        "the request on the stalled connection failed"
    );
    let (ended, took) = ended;
    assert!(ended.is_err(), "the watch failed");
    // Without its sibling it would have waited for its idle check: READ_IDLE_TIMEOUT +
    // PING_TIMEOUT (`a_watch_on_a_stalled_quiet_connection_ends_after_the_idle_ping_goes_unanswered`).
    assert!(
        within(
            took,
            STALL_AFTER + STALL_PING_TIMEOUT,
            Duration::from_millis(100)
        ),
        "the watch's connection found dead after {took:?}, expected {:?}",
        STALL_AFTER + STALL_PING_TIMEOUT
    );
    assert_eq!(count(&metrics.dead, &["stalled"]), 1);
    assert_eq!(count(&metrics.dead, &["peer"]), 1);
    assert_eq!(count(&metrics.dead, &["idle"]), 0);
    assert_eq!(metrics.open.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_stall_on_one_connection_costs_its_live_sibling_a_ping_not_the_connection() {
    let dialer = Dialer::new();
    let (requests, metrics) = transport(&dialer);
    assert_eq!(get_text(&requests, "/fast").await.unwrap(), "ok");
    let watches = sibling(&requests, &dialer);
    // An event every 20 s: the sibling's idle check never fires on its own.
    let mut watch = get(&watches, "/watch/20000/4").await.unwrap().into_body();
    assert!(next_chunk(&mut watch).await.unwrap().is_ok());
    // Only the requests' connection (dialed first) stalls.
    dialer.gates.lock()[0].store(true, Ordering::Relaxed);
    assert!(get(&requests, "/fast").await.is_err());
    let mut events = 1;
    while let Some(chunk) = next_chunk(&mut watch).await {
        chunk.expect("the live sibling's watch is not cut");
        events += 1;
    }
    assert_eq!(events, 4);
    assert_eq!(count(&metrics.pings, &["peer", "answered"]), 1);
    assert_eq!(count(&metrics.pings, &["peer", "unanswered"]), 0);
    assert_eq!(count(&metrics.dead, &["stalled"]), 1);
    assert_eq!(count(&metrics.dead, &["peer"]), 0);
    // The stalled one's next request gets a new connection; the sibling kept its own.
    assert_eq!(get_text(&requests, "/fast").await.unwrap(), "ok");
    assert_eq!(dialer.dials(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_slow_answer_on_a_live_connection_costs_a_ping_not_the_connection() {
    let dialer = Dialer::new();
    let (transport, metrics) = transport(&dialer);
    let start = Instant::now();
    assert_eq!(get_text(&transport, "/slow/20000").await.unwrap(), "slow");
    assert!(within(
        start.elapsed(),
        Duration::from_secs(20),
        Duration::from_millis(100)
    ));
    assert_eq!(count(&metrics.pings, &["stalled", "answered"]), 1);
    assert_eq!(count(&metrics.dead, &["stalled"]), 0);
    assert_eq!(dialer.dials(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_quiet_watch_on_a_live_connection_is_not_cut() {
    let dialer = Dialer::new();
    let (transport, metrics) = transport(&dialer);
    // Three events a minute apart: twice the idle timeout without a byte, each time answered.
    let start = Instant::now();
    let mut watch = get(&transport, "/watch/60000/3").await.unwrap().into_body();
    let mut events = 0;
    while let Some(chunk) = next_chunk(&mut watch).await {
        chunk.expect("a healthy watch is not cut");
        events += 1;
    }
    assert_eq!(events, 3);
    assert!(within(
        start.elapsed(),
        Duration::from_secs(120),
        Duration::from_millis(100)
    ));
    assert!(count(&metrics.pings, &["idle", "answered"]) >= 2);
    assert_eq!(count(&metrics.pings, &["idle", "unanswered"]), 0);
    assert_eq!(dialer.dials(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stream_silent_past_the_read_timeout_fails_while_its_connection_lives() {
    let dialer = Dialer::new();
    let (transport, metrics) = transport(&dialer);
    let mut watch = get(&transport, "/watch/1000000/0")
        .await
        .unwrap()
        .into_body();
    assert!(next_chunk(&mut watch).await.unwrap().is_ok());
    let start = Instant::now();
    let silent = next_chunk(&mut watch).await.unwrap();
    let error = silent.expect_err("a silent stream fails");
    assert!(
        error.to_string().contains("no data"),
        "unexpected error: {error}"
    );
    assert!(within(
        start.elapsed(),
        READ_TIMEOUT,
        Duration::from_millis(100)
    ));
    assert_eq!(count(&metrics.dead, &["idle"]), 0);
    assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    assert_eq!(dialer.dials(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_watch_ends_at_its_timeout_plus_the_slack() {
    let dialer = Dialer::new();
    let (transport, _) = transport(&dialer);
    // Events every 10 s, forever: the server never ends it.
    let start = Instant::now();
    let mut watch = get(&transport, "/watch/10000/0?watch=true&timeoutSeconds=5")
        .await
        .unwrap()
        .into_body();
    let error = loop {
        match next_chunk(&mut watch).await {
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            None => panic!("the server does not end this watch"),
        }
    };
    assert!(error.to_string().contains("deadline"), "{error}");
    assert!(within(
        start.elapsed(),
        Duration::from_secs(5) + WATCH_SLACK,
        Duration::from_millis(100)
    ));
}

#[test]
fn only_watches_with_a_timeout_get_a_lifetime() {
    let life = |s: &str| watch_lifetime(&s.parse().unwrap());
    assert_eq!(
        life("/api/v1/pods?watch=true&timeoutSeconds=60&resourceVersion=1"),
        Some(Duration::from_secs(60) + WATCH_SLACK)
    );
    assert_eq!(
        life("/api/v1/pods?timeoutSeconds=290&watch=1"),
        Some(Duration::from_secs(290) + WATCH_SLACK)
    );
    assert_eq!(life("/api/v1/pods?watch=true"), None);
    assert_eq!(life("/api/v1/pods?timeoutSeconds=60"), None);
    assert_eq!(life("/api/v1/pods?watch=false&timeoutSeconds=60"), None);
    assert_eq!(life("/api/v1/pods"), None);
}

// === dialing ===

#[tokio::test(start_paused = true)]
async fn a_hanging_dial_gets_companions_and_the_first_to_connect_wins() {
    let dialer = Dialer::new();
    dialer.hang.store(2, Ordering::Relaxed);
    let (transport, metrics) = transport(&dialer);
    let start = Instant::now();
    assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    assert!(
        within(start.elapsed(), HEDGE_AFTER * 2, Duration::from_millis(100)),
        "connected after {:?}",
        start.elapsed()
    );
    assert_eq!(dialer.dials(), 3);
    assert_eq!(count(&metrics.dials, &["h2"]), 1);
    assert_eq!(count(&metrics.dials, &["error"]), 0);
}

#[tokio::test(start_paused = true)]
async fn a_refused_dial_fails_the_waiting_request_and_the_next_one_connects() {
    let dialer = Dialer::new();
    dialer.refuse.store(1, Ordering::Relaxed);
    let (transport, metrics) = transport(&dialer);
    let error = get(&transport, "/fast").await.expect_err("refused");
    assert!(
        error.to_string().contains("connecting to test failed"),
        "{error}"
    );
    assert_eq!(count(&metrics.dials, &["error"]), 1);
    let start = Instant::now();
    assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    assert!(start.elapsed() <= super::slot::DIAL_BACKOFF_MIN);
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_for_a_hanging_dial_no_longer_than_the_connection_wait() {
    let dialer = Dialer::new();
    dialer.hang.store(usize::MAX, Ordering::Relaxed);
    let (transport, _) = transport(&dialer);
    let start = Instant::now();
    let error = get(&transport, "/fast").await.expect_err("no connection");
    assert!(error.to_string().contains("no connection"), "{error}");
    assert!(within(
        start.elapsed(),
        super::CONNECTION_WAIT,
        Duration::from_millis(100)
    ));
    // At most four attempts at once, a new one every 2.5 s.
    let dials = dialer.dials();
    assert!((10..=13).contains(&dials), "{dials} attempts in 30 s");
}

#[tokio::test(start_paused = true)]
async fn a_server_going_away_sends_the_next_requests_on_a_new_connection() {
    let dialer = Dialer::new();
    let (transport, metrics) = transport(&dialer);
    assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    dialer.server.go_away.notify_waiters();
    tokio::time::sleep(Duration::from_millis(10)).await;
    for _ in 0..3 {
        assert_eq!(get_text(&transport, "/fast").await.unwrap(), "ok");
    }
    assert_eq!(dialer.dials(), 2);
    assert_eq!(
        count(&metrics.dead, &["idle"]) + count(&metrics.dead, &["stalled"]),
        0
    );
}

// === TLS, ALPN and the server name (loopback, real clock) ===

/// A TLS server on loopback offering `alpn`; serves HTTP/2 when it is negotiated, else
/// HTTP/1.1. Returns its port.
async fn tls_server(alpn: &[&[u8]]) -> (u16, tokio::task::JoinHandle<()>) {
    let cert =
        rustls::pki_types::CertificateDer::from(include_bytes!("testdata/server.der").to_vec());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
        include_bytes!("testdata/server.key.der").to_vec().into(),
    );
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("default protocol versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .expect("the test certificate");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = Arc::new(Server::default());
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let server = server.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                    server.serve_h2(tls).await;
                } else {
                    let service = hyper::service::service_fn(|request| async move {
                        Ok::<_, Infallible>(handle(request).await)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                }
            });
        }
    });
    (port, task)
}

fn tls_config(port: u16, server_name: Option<&str>) -> kube::Config {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
    config.root_cert = Some(vec![include_bytes!("testdata/ca.der").to_vec()]);
    config.tls_server_name = server_name.map(str::to_owned);
    config
}

#[tokio::test]
async fn tls_with_h2_in_alpn_speaks_http2_and_verifies_the_configured_server_name() {
    let (port, server) = tls_server(&[b"h2", b"http/1.1"]).await;
    let metrics = ConnectionMetrics::new();
    let config = tls_config(port, Some("kubernetes.test"));
    let transport = Transport::new(&config, metrics.clone()).unwrap();
    let url = format!("https://127.0.0.1:{port}/version");
    let body = get_url(&transport, &url).await.unwrap().into_body();
    let text = body.collect().await.unwrap().to_bytes();
    assert_eq!(&text[..], b"HTTP/2.0");
    assert_eq!(count(&metrics.dials, &["h2"]), 1);
    server.abort();
}

#[tokio::test]
async fn tls_without_the_server_name_fails_to_verify_a_certificate_for_another_name() {
    let (port, server) = tls_server(&[b"h2", b"http/1.1"]).await;
    let metrics = ConnectionMetrics::new();
    let transport = Transport::new(&tls_config(port, None), metrics.clone()).unwrap();
    let url = format!("https://127.0.0.1:{port}/version");
    let error = get_url(&transport, &url)
        .await
        .expect_err("a name mismatch");
    assert!(error.to_string().contains("TLS handshake"), "{error}");
    assert_eq!(count(&metrics.dials, &["error"]), 1);
    server.abort();
}

#[tokio::test]
async fn a_server_without_h2_in_alpn_is_spoken_to_in_http1() {
    let (port, server) = tls_server(&[b"http/1.1"]).await;
    let metrics = ConnectionMetrics::new();
    let config = tls_config(port, Some("kubernetes.test"));
    let transport = Transport::new(&config, metrics.clone()).unwrap();
    let url = format!("https://127.0.0.1:{port}/version");
    for _ in 0..2 {
        let body = get_url(&transport, &url).await.unwrap().into_body();
        let text = body.collect().await.unwrap().to_bytes();
        assert_eq!(&text[..], b"HTTP/1.1");
    }
    assert_eq!(count(&metrics.dials, &["http1"]), 1);
    assert_eq!(count(&metrics.dials, &["h2"]), 0);
    server.abort();
}

#[tokio::test]
async fn a_plain_http_url_is_spoken_to_in_http1() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|request| async move {
                    Ok::<_, Infallible>(handle(request).await)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    let metrics = ConnectionMetrics::new();
    let transport = Transport::new(&config, metrics.clone()).unwrap();
    let url = format!("http://127.0.0.1:{port}/version");
    let body = get_url(&transport, &url).await.unwrap().into_body();
    assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"HTTP/1.1");
    assert_eq!(count(&metrics.dials, &["http1"]), 1);
    server.abort();
}
