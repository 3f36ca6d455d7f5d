//! What every driver of the process shares, and the claim on a driver name: the one thing a
//! driver asks of the hub's registry, behind a trait so that the driver does not depend on the
//! registry that holds it.

use std::sync::Arc;

use dashmap::DashMap;
use kube::Client;

use super::Driver;
use crate::{
    k8s::{budget::FairCap, stores::Stores},
    leader::{self, balance::Balance},
    metrics::{CsiOperations, HubMetrics},
};

/// Where drivers claim the names they report (the hub's registry).
pub trait Names: Send + Sync {
    /// Claims `name` for `driver`; the error says why it is refused (another socket serves the
    /// name, or another name shares its finalizer and Lease).
    fn register(&self, name: &str, driver: &Arc<Driver>) -> Result<(), String>;
    /// Releases `name` if `driver` holds it.
    fn unregister(&self, name: &str, driver: &Arc<Driver>);
}

/// What every driver of the process shares: API clients, caches, metrics, the API cap,
/// leadership bookkeeping, and where it claims its name.
pub struct Shared {
    /// API client for watches and writes.
    pub client: Client,
    /// A separate client for leader election, so throttling or a busy
    /// connection of the main client never costs a Lease.
    pub leader_client: Client,
    /// The shared caches.
    pub stores: Stores,
    /// Where a driver claims (and releases) the name it reports.
    pub names: Arc<dyn Names>,
    /// The CSI call histogram.
    pub csi_ops: CsiOperations,
    /// Per-driver series.
    pub metrics: HubMetrics,
    /// The optional process-wide API cap, shared fairly by the drivers' own budgets.
    pub api_cap: Arc<FairCap>,
    /// Leader-election status per driver name, for health and `/drivers`.
    pub leader_status: DashMap<String, leader::Status>,
    /// This replica's share of driver Leases.
    pub balance: Arc<Balance>,
    /// Cap of logged CSI responses (`--max-grpc-log-length`).
    pub max_grpc_log_length: i64,
    /// Copies of each driver Lease from the Lease watch of `balance_leases`, for its electors.
    /// An entry lives as long as its driver's connection, across election terms.
    pub lease_feeds: DashMap<String, tokio::sync::watch::Sender<Option<crate::leader::Seen>>>,
    /// The lines on which the drivers' Leases are renewed, together when they coincide.
    pub renew_grid: leader::RenewGrid,
    /// The task the drivers' electors run in: a round of renewals is one wake-up, and its
    /// requests leave together.
    pub electors: leader::Runner,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("stores", &self.stores)
            .finish_non_exhaustive()
    }
}
