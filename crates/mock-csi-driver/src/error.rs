//! Why the mock could not start or restart.

use std::path::PathBuf;

/// Why the mock could not start or restart.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint or control socket could not be bound.
    #[error("binding {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The serving task is gone (the handle was shut down).
    #[error("the mock has shut down")]
    Gone,
}
