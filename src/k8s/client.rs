//! The Kubernetes clients: kube's client stack (base URI, authentication, impersonation headers)
//! over one shared [`Transport`] (one health-checked HTTP/2 connection), and the watch timeout
//! that keeps healthy watches from looking dead.

use super::transport::Transport;

/// The server-side timeout asked for each watch request (`timeoutSeconds`); below the
/// transport's [`READ_TIMEOUT`](super::transport::READ_TIMEOUT), so a healthy watch never looks
/// dead.
pub const WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A Kubernetes client like kube's default one (base URI, authentication, impersonation
/// headers) over `transport`. Clients made over one transport share its connection, as
/// client-go's clientsets made from one configuration share theirs. Callers bound each request
/// as a whole ([`REQUEST_TIMEOUT`](super::writer::REQUEST_TIMEOUT), the leader's renew
/// deadline); the transport bounds the wait for a connection, for each response byte, and each
/// watch.
pub fn client(config: &kube::Config, transport: &Transport) -> kube::Result<kube::Client> {
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(transport.clone());
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
