//! The Kubernetes side: the API client, the shared watches and caches, the writes a driver
//! makes and the budgets they are spent from, and error texts shaped like client-go's.
//!
//! * [`client`](mod@client) — the clients, over a [`transport`] each for requests and watches;
//! * [`transport`] — an HTTP/2 connection to the API server, checked with PINGs, and told when
//!   its sibling's stalls (HTTP/1.1 where the server has no HTTP/2);
//! * [`router`] — one watch per kind feeding the [`stores`], routing each change;
//! * [`lean`] — the copies the stores hold: only what the attacher reads of each object;
//! * [`writer`] — a driver's PATCHes and Secret reads;
//! * [`budget`] — client-side request budgets (per driver, and the optional hub cap);
//! * [`pushback`] — the API server's pushback (429, `Retry-After`) waited out as client-go does.
//!
//! It uses only [`crate::names`], [`crate::random`], [`crate::telemetry`] (log throttling),
//! [`crate::api_error`], [`crate::backoff`] (the watch and dial pauses), and what [`crate::metrics`] has for it to report into (the
//! [`Observer`](crate::metrics::Observer), [`Limiter`](crate::metrics::Limiter) and
//! [`ConnectionMetrics`](crate::metrics::ConnectionMetrics)).

pub mod budget;
pub mod client;
pub mod lean;
pub mod pushback;
pub mod router;
pub mod stores;
pub mod transport;
pub mod writer;

pub use client::{WATCH_TIMEOUT, client};
pub use stores::Stores;
pub use transport::Transport;
pub use writer::{FIELD_MANAGER, REQUEST_TIMEOUT, Writer};

/// The text of an API error as client-go prints it: the server's message for
/// API errors (for example `volumeattachments.storage.k8s.io "x" not found`),
/// else the error itself.
pub fn error_text(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// Whether the error is a 422 from the API server: for a JSON Patch, a `test` operation that
/// failed because the copy the patch was built from is stale.
pub fn is_unprocessable(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 422)
}

/// Whether the error is a 404 from the API server.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}
