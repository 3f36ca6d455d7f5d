//! Errors of leader election.

use super::config::ConfigError;

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
