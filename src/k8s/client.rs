//! The Kubernetes client: kube's default client, whose connections are checked for life (TCP
//! keepalive, a TCP user timeout, connect, read and write timeouts), and the watch timeout that
//! keeps healthy watches from looking dead.

/// Longest wait for a TCP connection to the API server.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection idle this long gets TCP keepalive probes: a watch whose peer vanished without a
/// FIN or RST (a black-holed network, a conntrack flush, an idle load-balancer drop) is noticed
/// after [`TCP_KEEPALIVE_IDLE`] + [`TCP_KEEPALIVE_PROBES`] × [`TCP_KEEPALIVE_INTERVAL`] (25 s)
/// instead of never. client-go relies on HTTP/2 pings for this (30-45 s); kube's client speaks
/// HTTP/1.1, so the kernel does the probing.
const TCP_KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Pause between unanswered keepalive probes.
const TCP_KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Unanswered probes before the connection is dropped.
const TCP_KEEPALIVE_PROBES: u32 = 3;

/// Data the API server has not acknowledged for this long ends the connection
/// (`TCP_USER_TIMEOUT`): a request sent into a black hole fails instead of hanging for the
/// kernel's ~15 minutes of retransmissions.
const TCP_USER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// No byte from the API server for this long fails the request or watch on that connection. The
/// shared watches ask the server to end each watch after [`WATCH_TIMEOUT`] and re-watch, so a
/// healthy watch never stays silent this long; a stopped or wedged API server whose kernel
/// still answers keepalive probes is noticed here.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// Sending a request may take this long.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The server-side timeout asked for each watch request (`timeoutSeconds`); below
/// `READ_TIMEOUT`.
pub const WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A Kubernetes client like kube's default one (base URI, authentication, impersonation
/// headers, rustls, HTTP/1.1), whose connections are checked for life: TCP keepalive and a TCP
/// user timeout on every socket, connect, read and write timeouts. Callers bound each request
/// as a whole ([`REQUEST_TIMEOUT`](super::writer::REQUEST_TIMEOUT), the leader's renew deadline); watches are bounded by
/// [`WATCH_TIMEOUT`] and `READ_TIMEOUT`.
pub fn client(config: &kube::Config) -> kube::Result<kube::Client> {
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_keepalive(Some(TCP_KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(TCP_KEEPALIVE_PROBES));
    http.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_read_timeout(Some(READ_TIMEOUT));
    timed.set_write_timeout(Some(WRITE_TIMEOUT));
    // Time a pooled connection sat idle must not count against the next response.
    timed.set_reset_reader_on_write(true);
    let transport =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(timed);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(transport);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// The client configuration from the kubeconfig at `path`, or (`None`) the in-cluster
/// configuration, else the usual kubeconfig search (`$KUBECONFIG`, `~/.kube/config`).
pub async fn kube_config(
    path: Option<&std::path::Path>,
) -> Result<kube::Config, Box<dyn std::error::Error + Send + Sync>> {
    match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            Ok(kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?)
        }
        None => Ok(kube::Config::infer().await?),
    }
}
