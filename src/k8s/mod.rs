//! The few Kubernetes API calls the controllers make, each behind the
//! driver's API budget, and error texts shaped like client-go's.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::{
    core::v1::{PersistentVolume, Secret},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::Value;

pub mod budget;
pub mod router;

use budget::ApiBudget;

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
/// [`READ_TIMEOUT`].
pub const WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Deadline of every API request a driver makes (PATCH, Secret GET), on top of the API server's
/// own 60 s request timeout: a request on a connection that went silent fails and is retried
/// with the key's backoff.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A Kubernetes client like kube's default one (base URI, authentication, impersonation
/// headers, rustls, HTTP/1.1), whose connections are checked for life: TCP keepalive and a TCP
/// user timeout on every socket, connect, read and write timeouts. Callers bound each request
/// as a whole ([`REQUEST_TIMEOUT`], the leader's renew deadline); watches are bounded by
/// [`WATCH_TIMEOUT`] and [`READ_TIMEOUT`].
pub fn client(config: &kube::Config) -> kube::Result<Client> {
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
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// Field manager recorded in `managedFields` for our patches (the Go
/// attacher's client-go default is the binary name).
pub const FIELD_MANAGER: &str = "csi-attacher";

/// API access of one driver's controller: the shared client, spent from the
/// driver's own [`ApiBudget`] (which includes the hub's optional cap), with
/// every request counted by outcome.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    budget: Arc<ApiBudget>,
    /// `attacher_hub_api_requests_total`, and the driver's label value.
    requests: Option<(prometheus::IntCounterVec, String)>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// API access spending `budget` before each request.
    pub fn new(client: Client, budget: Arc<ApiBudget>) -> Self {
        Self {
            client,
            budget,
            requests: None,
        }
    }

    /// Counts every request in `counter` (`attacher_hub_api_requests_total`) under `driver`.
    pub fn with_request_counter(
        mut self,
        counter: prometheus::IntCounterVec,
        driver: &str,
    ) -> Self {
        self.requests = Some((counter, driver.to_owned()));
        self
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The driver's API budget.
    pub fn budget(&self) -> &Arc<ApiBudget> {
        &self.budget
    }

    /// Spends budget for one request, sends it, and counts its outcome.
    async fn send<T>(
        &self,
        verb: &str,
        resource: &str,
        name: &str,
        request: impl std::future::Future<Output = kube::Result<T>>,
    ) -> kube::Result<T> {
        self.budget
            .acquire(verb, &format!("{resource}/{name}"))
            .await;
        let result = match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(
                format!("{verb} {resource}/{name}: no answer within {REQUEST_TIMEOUT:?}").into(),
            )),
        };
        if let Some((counter, driver)) = &self.requests {
            let code = match &result {
                Ok(_) => "200".to_owned(),
                Err(kube::Error::Api(status)) => status.code.to_string(),
                Err(_) => "error".to_owned(),
            };
            counter
                .with_label_values(&[driver.as_str(), verb, resource, code.as_str()])
                .inc();
        }
        result
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        }
    }

    /// JSON merge patch on a VolumeAttachment's main resource.
    pub async fn merge_va(&self, name: &str, patch: &Value) -> kube::Result<VolumeAttachment> {
        let api = Api::<VolumeAttachment>::all(self.client.clone());
        let params = Self::params();
        let patch = Patch::Merge(patch);
        self.send(
            "PATCH",
            "volumeattachments",
            name,
            api.patch(name, &params, &patch),
        )
        .await
    }

    /// JSON merge patch on a VolumeAttachment's `status` subresource.
    pub async fn merge_va_status(
        &self,
        name: &str,
        patch: &Value,
    ) -> kube::Result<VolumeAttachment> {
        let api = Api::<VolumeAttachment>::all(self.client.clone());
        let params = Self::params();
        let patch = Patch::Merge(patch);
        self.send(
            "PATCH",
            "volumeattachments/status",
            name,
            api.patch_status(name, &params, &patch),
        )
        .await
    }

    /// JSON Patch (RFC 6902) on a PersistentVolume.
    pub async fn json_patch_pv(&self, name: &str, patch: Value) -> kube::Result<PersistentVolume> {
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let params = Self::params();
        let patch = Patch::<()>::Json(patch);
        self.send(
            "PATCH",
            "persistentvolumes",
            name,
            api.patch(name, &params, &patch),
        )
        .await
    }

    /// A Secret's data, byte for byte, read live (never cached). Whether the
    /// values can be sent is for the CSI client to say (see
    /// [`crate::csi::redact::NotUtf8`]); nothing is altered here.
    pub async fn secret_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> kube::Result<HashMap<String, Vec<u8>>> {
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let secret = self.send("GET", "secrets", name, api.get(name)).await?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect())
    }
}

/// The text of an API error as client-go prints it: the server's message for
/// API errors (for example `volumeattachments.storage.k8s.io "x" not found`),
/// else the error itself.
pub fn error_text(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// Whether the error is a 404 from the API server.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}
