//! Why `attacher-hub status` could not read the hub or the API server.

use std::time::Duration;

/// Why the drivers could not be shown. Every variant is a failure to read
/// (exit code 1): the caller retries in `--watch` mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--address` is not an HTTP endpoint.
    #[error("--address {address:?}: {problem}")]
    Address {
        /// As given.
        address: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// Connecting to, or talking HTTP with, the hub failed.
    #[error("reading {url}")]
    Http {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The hub answered with a status other than 200.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// No answer within `--request-timeout`.
    #[error("{what}: no answer within {timeout:?}")]
    Timeout {
        /// What was asked.
        what: String,
        /// The deadline.
        timeout: Duration,
    },
    /// `/drivers` is not the expected JSON document.
    #[error("{url} did not return a list of drivers")]
    Document {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// No usable kubeconfig.
    #[error("loading the kubeconfig")]
    KubeConfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Reading `/drivers` through the pod proxy failed.
    #[error("reading /drivers of pod {namespace}/{pod} through the API server's pod proxy")]
    Proxy {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Listing VolumeAttachments failed.
    #[error("listing VolumeAttachments")]
    ListVolumeAttachments(#[source] kube::Error),
}
