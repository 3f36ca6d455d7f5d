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

impl Error {
    /// The error on one line, as the subcommand prints it: each step once, the API server's
    /// answer as `<code> <reason>: <message>`, a refusal naming the grant the user of the
    /// kubeconfig lacks (never a dump of the server's Status).
    pub fn one_line(&self) -> String {
        let grant = match self {
            Error::Proxy { namespace, .. } => Some(crate::api_error::Grant {
                verb: "get",
                resource: "pods/proxy",
                namespace: Some(namespace),
                granted_by: "use a kubeconfig whose user may (kubectl auth can-i get pods/proxy), or --address",
            }),
            Error::ListVolumeAttachments(_) => Some(crate::api_error::Grant {
                verb: "list",
                resource: "volumeattachments.storage.k8s.io",
                namespace: None,
                granted_by: "use a kubeconfig whose user may (kubectl auth can-i list volumeattachments)",
            }),
            _ => None,
        };
        crate::api_error::one_line(self, grant.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_read_names_the_grant_on_one_line() {
        let e = Error::Proxy {
            namespace: "attacher-hub".into(),
            pod: "attacher-hub-0".into(),
            source: kube::Error::Api(
                kube::core::Status::failure(
                    "pods \"attacher-hub-0\" is forbidden: ...",
                    "Forbidden",
                )
                .with_code(403)
                .boxed(),
            ),
        };
        assert_eq!(
            e.one_line(),
            "reading /drivers of pod attacher-hub/attacher-hub-0 through the API server's pod proxy: 403 Forbidden: no grant to get pods/proxy in namespace attacher-hub; use a kubeconfig whose user may (kubectl auth can-i get pods/proxy), or --address"
        );
    }
}
