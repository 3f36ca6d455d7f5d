//! The client side of CSI: connecting to a driver's Unix socket, probing it,
//! detecting its capabilities and calling it in domain types.

pub mod client;
pub mod codes;
pub mod connection;
#[cfg(test)]
pub(crate) mod fake;
pub mod probe;
pub mod proto;
pub mod redact;
pub mod registration;

pub use client::{CallError, CallMetrics, DriverClient, PublishRequest, UnpublishRequest};
pub use connection::{Address, Connection};
pub use probe::Capabilities;
pub use redact::Secrets;
