//! The diagnostics HTTP listener (`--http-endpoint`): metrics, health,
//! readiness and the `/drivers` view.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Path of the leader-election liveness check (external-attacher's name).
pub const LEADER_ELECTION_HEALTH_PATH: &str = "/healthz/leader-election";

/// What the process reports about itself; implemented by the hub.
pub trait Status: Send + Sync + 'static {
    /// `None` when the leader-election check is not served (leader election
    /// off, or `--metrics-address` used); otherwise whether it passes.
    fn leader_election_healthy(&self) -> Option<bool>;
    /// `Ok` when the process serves (its caches are synced); otherwise a short
    /// text saying why not. Never depends on a driver's health.
    fn ready(&self) -> Result<(), String>;
    /// The `/drivers` document.
    fn drivers(&self) -> serde_json::Value;
    /// The `/config` document: where the driver list comes from, when it was loaded, how the
    /// last reload went.
    fn config(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Brings gauges that are computed when read up to date; called before each rendering of
    /// the metrics.
    fn refresh_metrics(&self) {}
}

/// Routing of the listener.
#[derive(Clone)]
pub struct Routes {
    /// Path of the Prometheus handler (`--metrics-path`).
    pub metrics_path: String,
    /// Registry rendered on the metrics path.
    pub registry: Registry,
    /// Health, readiness and drivers.
    pub status: Arc<dyn Status>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("metrics_path", &self.metrics_path)
            .finish_non_exhaustive()
    }
}

/// Binds `address` (`host:port`; an empty host, as in `:8080`, means every
/// interface, as in Go).
pub async fn bind(address: &str) -> std::io::Result<TcpListener> {
    let address = if address.starts_with(':') {
        format!("0.0.0.0{address}")
    } else {
        address.to_string()
    };
    TcpListener::bind(address).await
}

/// Open connections served at once (scrapers, probes, `attacher-hub status`); more are closed
/// at once rather than queued, so a misbehaving client cannot exhaust the process.
const MAX_CONNECTIONS: usize = 128;
/// A client must send its request headers within this time (slow-loris protection).
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `routes` on `listener` until `shutdown`; every connection is owned and ends with it.
pub async fn serve(listener: TcpListener, routes: Routes, shutdown: CancellationToken) {
    let routes = Arc::new(routes);
    // Every connection task is owned here: reaped when it ends, aborted on shutdown.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    tracing::warn!(%error, "accepting an HTTP connection failed");
                    continue;
                }
            },
        };
        if connections.len() >= MAX_CONNECTIONS {
            tracing::warn!(peer = %peer_label(peer), limit = MAX_CONNECTIONS, "too many open HTTP connections; closing a new one");
            continue;
        }
        let routes = routes.clone();
        connections.spawn(
            async move {
                let service = service_fn(move |req| {
                    let routes = routes.clone();
                    async move { Ok::<_, Infallible>(handle(&routes, &req)) }
                });
                let conn = http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(error) = conn.await {
                    tracing::debug!(%error, "HTTP connection ended with an error");
                }
            }
            .instrument(tracing::debug_span!("http", peer = %peer_label(peer))),
        );
    }
    connections.shutdown().await;
}

fn peer_label(peer: SocketAddr) -> String {
    peer.to_string()
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn handle<B>(routes: &Routes, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let path = req.uri().path();
    if path == routes.metrics_path {
        routes.status.refresh_metrics();
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(error) = encoder.encode(&routes.registry.gather(), &mut buf) {
            return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"));
        }
        let mut r = Response::new(Full::new(Bytes::from(buf)));
        if let Ok(v) = header::HeaderValue::from_str(encoder.format_type()) {
            r.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        return r;
    }
    match path {
        LEADER_ELECTION_HEALTH_PATH => match routes.status.leader_election_healthy() {
            None => text(StatusCode::NOT_FOUND, "404 page not found\n"),
            Some(true) => text(StatusCode::OK, "ok"),
            Some(false) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal server error: failed election to renew leadership on lease \n",
            ),
        },
        "/healthz" => text(StatusCode::OK, "ok"),
        "/readyz" => match routes.status.ready() {
            Ok(()) => text(StatusCode::OK, "ok"),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        "/drivers" | "/config" => {
            let doc = if path == "/drivers" {
                routes.status.drivers()
            } else {
                routes.status.config()
            };
            let body = serde_json::to_vec_pretty(&doc).unwrap_or_default();
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// A status whose answers the test sets.
    struct Fixed {
        health: Option<bool>,
        ready: Result<(), String>,
    }

    impl Status for Fixed {
        fn leader_election_healthy(&self) -> Option<bool> {
            self.health
        }

        fn ready(&self) -> Result<(), String> {
            self.ready.clone()
        }

        fn drivers(&self) -> serde_json::Value {
            serde_json::json!([{ "name": "d.csi.io", "state": { "state": "leading" } }])
        }
    }

    fn routes(health: Option<bool>, ready: Result<(), String>) -> Routes {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("probe_total", "a test counter").expect("valid");
        counter.inc();
        registry
            .register(Box::new(counter))
            .expect("fresh registry");
        Routes {
            metrics_path: "/custom-metrics".into(),
            registry,
            status: Arc::new(Fixed { health, ready }),
        }
    }

    async fn get(routes: &Routes, method: Method, path: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .expect("a request");
        let resp = handle(routes, &req);
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("a body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn every_route_answers_as_the_go_sidecar_does() {
        let ok = routes(Some(true), Ok(()));
        let (code, body) = get(&ok, Method::GET, "/custom-metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert!(body.contains("probe_total 1"), "{body}");
        assert_eq!(
            get(&ok, Method::GET, "/healthz").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            get(&ok, Method::GET, "/readyz").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            get(&ok, Method::GET, LEADER_ELECTION_HEALTH_PATH).await,
            (StatusCode::OK, "ok".into())
        );
        let (code, body) = get(&ok, Method::GET, "/drivers").await;
        assert_eq!(code, StatusCode::OK);
        let drivers: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(drivers[0]["name"], "d.csi.io");
        assert_eq!(
            get(&ok, Method::GET, "/metrics").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            get(&ok, Method::POST, "/healthz").await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(get(&ok, Method::HEAD, "/healthz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn unready_and_unhealthy_answers_say_why() {
        let sick = routes(Some(false), Err("the caches are not synced yet".into()));
        assert_eq!(
            get(&sick, Method::GET, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the caches are not synced yet\n".into()
            )
        );
        assert_eq!(
            get(&sick, Method::GET, LEADER_ELECTION_HEALTH_PATH).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        // Without leader election (or with --metrics-address) the path does not exist.
        let without = routes(None, Ok(()));
        assert_eq!(
            get(&without, Method::GET, LEADER_ELECTION_HEALTH_PATH)
                .await
                .0,
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn the_listener_serves_until_shutdown() {
        let listener = bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("bound");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, routes(None, Ok(())), stop.clone()));
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let req = Request::get("/healthz")
            .header(header::HOST, address.to_string())
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("a request");
        let resp = sender.send_request(req).await.expect("an answer");
        assert_eq!(resp.status(), StatusCode::OK);
        stop.cancel();
        server.await.expect("the server ends");
    }
}
