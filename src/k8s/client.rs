//! The Kubernetes clients: kube's client stack (base URI, authentication, impersonation headers)
//! over a shared [`Transport`] (a health-checked HTTP/2 connection), and the watch timeout that
//! keeps healthy watches from looking dead.

use std::path::{Path, PathBuf};

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

    let mut config = config.clone();
    if !config
        .headers
        .iter()
        .any(|(name, _)| name == http::header::USER_AGENT)
    {
        config
            .headers
            .push((http::header::USER_AGENT, user_agent()));
    }
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .layer(super::pushback::RetryAfterLayer)
        .service(transport.clone());
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// The `User-Agent` of every request, in client-go's shape (`<program>/<version> (<os>/<arch>)`,
/// Go's names for the architecture): what the API server's audit log, its flow-control
/// matching and an operator reading either tell attacher-hub's requests by. kube's own client
/// stack, which [`client`] replaces, would have sent none.
pub fn user_agent() -> http::HeaderValue {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let agent = format!(
        "attacher-hub/v{} ({}/{arch})",
        env!("ATTACHER_HUB_VERSION"),
        std::env::consts::OS
    );
    http::HeaderValue::try_from(agent).expect("a version and platform names are visible ASCII")
}

/// Why no client configuration could be built. Each variant says its cause once, with the path
/// it concerns (kube's own errors repeat their cause in their text and as their source, which
/// printed a missing file's error three times).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The kubeconfig file could not be read.
    #[error("cannot read kubeconfig {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig was read but cannot be used (not YAML, no current context, a context
    /// naming a cluster or user it lacks, unreadable certificate files...).
    #[error("kubeconfig {} cannot be used: {reason}", path.display())]
    Invalid {
        /// The file (or `$KUBECONFIG`'s list).
        path: PathBuf,
        /// kube's explanation.
        reason: String,
    },
    /// In a pod, the in-cluster configuration cannot be used (no service account token...).
    #[error("the in-cluster configuration cannot be used: {reason}")]
    InCluster {
        /// kube's explanation.
        reason: String,
    },
    /// Nothing to use.
    #[error(
        "no Kubernetes client configuration: not in a pod (KUBERNETES_SERVICE_HOST is not set), $KUBECONFIG is not set, and {} does not exist; give --kubeconfig",
        default.display()
    )]
    NotFound {
        /// The default kubeconfig path that was tried.
        default: PathBuf,
    },
}

/// Where to look for a client configuration when no kubeconfig is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// In a pod, its service account (client-go's `InClusterConfig`, what the Go sidecar uses
    /// without `--kubeconfig`); outside one, `$KUBECONFIG`, then `~/.kube/config`.
    InClusterFirst,
    /// `$KUBECONFIG`, then `~/.kube/config`, then the in-cluster configuration (kubectl's
    /// order, for `attacher-hub status`).
    KubeconfigFirst,
}

/// The client configuration from the kubeconfig at `path`, or (`None`) from where `search`
/// looks.
pub async fn kube_config(path: Option<&Path>, search: Search) -> Result<kube::Config, ConfigError> {
    if let Some(path) = path {
        return from_file(path).await;
    }
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    if in_pod && search == Search::InClusterFirst {
        return in_cluster();
    }
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        return kube::Config::from_kubeconfig(&kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| ConfigError::Invalid {
                path: PathBuf::from(list),
                reason: e.to_string(),
            });
    }
    let default = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".kube").join("config"))
        .unwrap_or_else(|| PathBuf::from("~/.kube/config"));
    if default.exists() {
        return from_file(&default).await;
    }
    if in_pod {
        return in_cluster();
    }
    Err(ConfigError::NotFound { default })
}

async fn from_file(path: &Path) -> Result<kube::Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let invalid = |reason: String| ConfigError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&text).map_err(|e| invalid(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))
}

fn in_cluster() -> Result<kube::Config, ConfigError> {
    kube::Config::incluster().map_err(|e| ConfigError::InCluster {
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::error_chain;

    /// A missing kubeconfig is one line naming the file and the OS error once.
    #[tokio::test]
    async fn a_missing_kubeconfig_names_the_file_and_its_cause_once() {
        let e = kube_config(Some(Path::new("/nope/kc")), Search::InClusterFirst)
            .await
            .expect_err("no such file");
        assert_eq!(
            error_chain(&e),
            "cannot read kubeconfig /nope/kc: No such file or directory (os error 2)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let bad = dir.path().join("kc");
        std::fs::write(&bad, "clusters: [").expect("write");
        let e = kube_config(Some(&bad), Search::InClusterFirst)
            .await
            .expect_err("not YAML");
        let text = error_chain(&e);
        assert!(
            text.starts_with(&format!("kubeconfig {} cannot be used: ", bad.display())),
            "{text}"
        );
    }
}
