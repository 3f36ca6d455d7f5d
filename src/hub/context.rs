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
    /// Where the driver list comes from, and how its reloads went.
    pub config: super::reload::ConfigStatus,
    /// Cancelled once the supervisor has started the first set of drivers: leadership
    /// balancing waits for it, so its first share counts every configured driver.
    pub first_reconcile: CancellationToken,
    /// The discovered sockets that are not served (stale, node plugins, unreachable), as the
    /// last scan found them: shown in `/drivers` after the drivers.
    pub unserved: parking_lot::Mutex<Vec<super::discovery::Record>>,
    /// Whether the first configuration's drivers have started: readiness and the replica's
    /// presence in the balance wait for it.
    pub startup: super::startup::Startup,
}

impl Context {
    /// Whether start-up is over ([`super::startup`]).
    pub fn started(&self) -> bool {
        self.startup.check(self.first_reconcile.is_cancelled(), || {
            self.registry
                .slots()
                .iter()
                .map(|d| (d.settings().address.to_string(), d.state()))
                .collect()
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use dashmap::DashMap;

    use super::*;
    use crate::fake_api::FakeApi;
    use crate::k8s::budget::{FairCap, Limit};
    use crate::k8s::stores::Stores;
    use crate::leader::balance::Balance;
    use crate::metrics::{CsiOperations, HubMetrics};

    /// A hub over a fake API server and caches filled by hand, its metrics on a registry of
    /// their own.
    pub(crate) fn context(api: &FakeApi, stores: Stores) -> Arc<Context> {
        let registry = Arc::new(Registry::default());
        let metrics = prometheus::Registry::new();
        let shared = Arc::new(Shared {
            client: api.client(),
            leader_client: api.client(),
            stores,
            names: registry.clone(),
            csi_ops: CsiOperations::register(&metrics).expect("fresh registry"),
            metrics: HubMetrics::register(&metrics).expect("fresh registry"),
            api_cap: FairCap::new(Limit::Unlimited),
            leader_status: DashMap::new(),
            balance: Arc::new(Balance::default()),
            max_grpc_log_length: -1,
            lease_feeds: DashMap::new(),
            renew_grid: crate::leader::RenewGrid::new(tokio::time::Instant::now()),
            electors: crate::leader::Runner::new(),
        });
        Arc::new(Context {
            shared,
            registry,
            first_reconcile: CancellationToken::new(),
            unserved: parking_lot::Mutex::default(),
            startup: crate::hub::startup::Startup::new(),
            config: crate::hub::reload::ConfigStatus::new(
                None,
                crate::metrics::config::ConfigMetrics::register(&metrics).expect("fresh registry"),
            ),
        })
    }
}
