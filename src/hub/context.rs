//! What the hub's own tasks (supervisor, gauges, status, leadership balancing) share: the
//! drivers' shared state, the registry of drivers, and the first reconcile.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{driver::context::Shared, registry::Registry};

/// The hub's state: what its drivers share, and the drivers.
#[derive(Debug)]
pub struct Context {
    /// What every driver shares.
    pub shared: Arc<Shared>,
    /// The drivers, by name and by slot.
    pub registry: Arc<Registry>,
    /// Cancelled once the supervisor has started the first set of drivers: leadership
    /// balancing waits for it, so its first share counts every configured driver.
    pub first_reconcile: CancellationToken,
}
