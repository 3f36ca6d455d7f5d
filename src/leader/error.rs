//! Errors of leader election.

use super::config::ConfigError;
use crate::api_error::{self, Grant};

/// What grants the Lease verbs in a namespace: the hub's own namespace has the manifests'
/// Role; a Lease namespace set per driver (a sidecar's, during a migration) needs one too.
const LEASE_ROLE: &str = "bind a Role like deploy/base/rbac/role.yaml there (the manifests and chart grant the hub's own namespace only)";

/// Result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of leader election. None of them is fatal to the elector: failed API calls are retried
/// every `retry_period`, as client-go does.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid; see [`ConfigError`].
    #[error("invalid leader-election configuration")]
    Config(#[from] ConfigError),
    /// The host name could not be read to build the default identity.
    #[error("cannot read the host name for the leader-election identity")]
    Hostname(#[source] std::io::Error),
    /// Reading the Lease failed (other than NotFound).
    #[error("cannot get Lease {namespace}/{name}")]
    Get {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Creating the Lease failed (an AlreadyExists means another candidate created it first).
    #[error("cannot create Lease {namespace}/{name}")]
    Create {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Updating the Lease failed (a 409 Conflict means another candidate wrote it first).
    #[error("cannot update Lease {namespace}/{name}")]
    Update {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// An API call did not complete in time (the renew deadline, or `renew_deadline` per call
    /// while acquiring or releasing).
    #[error("Lease {namespace}/{name}: API call timed out")]
    Timeout {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
    },
}

impl Error {
    /// The grant a refused request needed: the verb on Leases in the Lease's namespace.
    pub fn grant(&self) -> Option<Grant<'_>> {
        let (verb, namespace) = match self {
            Error::Get { namespace, .. } => ("get", namespace),
            Error::Create { namespace, .. } => ("create", namespace),
            Error::Update { namespace, .. } => ("update", namespace),
            Error::Config(_) | Error::Hostname(_) | Error::Timeout { .. } => return None,
        };
        Some(Grant {
            verb,
            resource: "leases.coordination.k8s.io",
            namespace: Some(namespace),
            granted_by: LEASE_ROLE,
        })
    }

    /// The error on one line for logs: the step, then the API server's answer (a refusal
    /// with the grant it lacks), never a dump of it.
    pub fn one_line(&self) -> String {
        api_error::one_line(self, self.grant().as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_lease_request_names_the_verb_the_namespace_and_the_role() {
        let e = Error::Get {
            namespace: "kube-system".into(),
            name: "external-attacher-leader-pd-csi-storage-gke-io".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("leases \"x\" is forbidden: ...", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ),
        };
        assert_eq!(
            e.one_line(),
            "cannot get Lease kube-system/external-attacher-leader-pd-csi-storage-gke-io: 403 Forbidden: no grant to get leases.coordination.k8s.io in namespace kube-system; bind a Role like deploy/base/rbac/role.yaml there (the manifests and chart grant the hub's own namespace only)"
        );
        let e = Error::Update {
            namespace: "attacher-hub".into(),
            name: "l".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("the object has been modified", "Conflict")
                    .with_code(409)
                    .boxed(),
            ),
        };
        assert_eq!(
            e.one_line(),
            "cannot update Lease attacher-hub/l: 409 Conflict: the object has been modified"
        );
    }
}
