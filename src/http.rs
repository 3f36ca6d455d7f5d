//! The diagnostics HTTP listener (`--http-endpoint`): metrics, health,
//! readiness and the `/drivers` view.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
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
    /// `Ok` when every configured driver is standby or leading; otherwise a
    /// short text saying which is not.
    fn ready(&self) -> Result<(), String>;
    /// The `/drivers` document.
    fn drivers(&self) -> serde_json::Value;
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

fn handle(routes: &Routes, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let path = req.uri().path();
    if path == routes.metrics_path {
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
        "/drivers" => {
            let body = serde_json::to_vec_pretty(&routes.status.drivers()).unwrap_or_default();
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
