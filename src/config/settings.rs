//! What a validated configuration is made of: the [`Settings`] of each driver (flags as
//! defaults, `drivers.yaml` entries overriding them) and the process-wide API cap ([`Config`]).

use std::time::Duration;

use crate::csi::Address;
use crate::k8s::budget::Limit;

/// Leader-election settings of one driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderSettings {
    /// Lease namespace.
    pub namespace: String,
    /// Our holder identity.
    pub identity: String,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Renew deadline.
    pub renew_deadline: Duration,
    /// Retry period.
    pub retry_period: Duration,
    /// Labels put on the Lease.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Vacate the Lease on shutdown so the next leader starts at once.
    pub release_on_exit: bool,
}

/// Everything configurable per driver (flags give the defaults; `drivers.yaml`
/// may override per driver).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The driver socket.
    pub address: Address,
    /// The name the driver must report, if configured.
    pub expected_name: Option<String>,
    /// Deadline of publish/unpublish, of each Probe, and of a reconcile pass.
    pub timeout: Duration,
    /// Workers for attaches (VAs without deletion timestamp) and for PVs.
    pub attach_workers: usize,
    /// Workers for detaches (VAs being deleted).
    pub detach_workers: usize,
    /// Attach and detach syncs (so ControllerPublish/Unpublish calls) in flight at once, shared
    /// by the two pools, first come first served so that neither starves the other. One number
    /// of workers (`--worker-threads=N`, `workerThreads: N`) gives N, the calls the Go sidecar's
    /// N workers make at most; `workerThreads: {attach: A, detach: D}` gives A + D.
    pub csi_calls: usize,
    /// First retry delay of a failed item.
    pub retry_interval_start: Duration,
    /// Cap of the retry delay.
    pub retry_interval_max: Duration,
    /// Pause between reconciler passes.
    pub reconcile_sync: Duration,
    /// `max_entries` of ListVolumes (0: no limit).
    pub max_entries: i32,
    /// fsType for PVs without one.
    pub default_fstype: String,
    /// The driver's own API budget (`--kube-api-qps`/`--kube-api-burst`, as its sidecar had).
    pub api_budget: Limit,
    /// `None`: this replica always acts for the driver.
    pub leader_election: Option<LeaderSettings>,
    /// Exit the process (code 1) when the connection drops, as the Go
    /// sidecar does; otherwise reconnect and re-detect capabilities.
    pub exit_on_connection_loss: bool,
    /// Write `errorCode` into `attachError` for gRPC errors.
    pub save_error_code: bool,
    /// Bound for in-flight work when leadership ends or the process stops.
    pub drain_timeout: Duration,
}

/// The settings an entry without `address` gives to the discovered driver that reports its
/// `name` (discovery mode with `--config`): applied by [`NamedSettings::at`] to whatever socket
/// that driver is found at.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedSettings {
    /// The entry's settings; their `address` is a placeholder that [`NamedSettings::at`]
    /// replaces, and `expected_name` is the entry's `name`.
    settings: Settings,
}

impl NamedSettings {
    /// Settings validated from an entry with `name` and no address (`settings.address` is a
    /// placeholder).
    pub(crate) fn new(settings: Settings) -> Self {
        Self { settings }
    }

    /// The driver name these settings are for.
    pub fn name(&self) -> &str {
        self.settings.expected_name.as_deref().unwrap_or_default()
    }

    /// The settings, with their placeholder address.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The settings of this driver found at `address`.
    pub fn at(&self, address: Address) -> Settings {
        Settings {
            address,
            ..self.settings.clone()
        }
    }
}

/// What a driver file configures, with the flags' defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// One entry per driver to serve at its address, in file order.
    pub drivers: Vec<Settings>,
    /// The entries without an address: settings for discovered drivers by name, in file order.
    pub discovered: Vec<NamedSettings>,
    /// The process-wide API cap ([`Limit::Unlimited`]: none).
    pub hub_api_cap: Limit,
}
