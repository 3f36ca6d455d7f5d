//! [`Defaults`]: the per-driver settings the command-line flags give, to every entry of
//! `drivers.yaml` for what it leaves out, and to sidecar mode's single driver.

use std::time::Duration;

use super::settings::{LeaderSettings, Settings};
use crate::cli::{self, Args};
use crate::csi::Address;
use crate::k8s::budget::Limit;
use crate::leader;

/// The per-driver settings given by the command-line flags: what an entry gets for every field
/// it leaves out, and what sidecar mode's single driver gets.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    timeout: Duration,
    worker_threads: usize,
    retry_interval_start: Duration,
    retry_interval_max: Duration,
    reconcile_sync: Duration,
    max_entries: i32,
    default_fstype: String,
    pub(crate) kube_api_qps: f64,
    pub(crate) kube_api_burst: u32,
    pub(crate) hub_api_cap: Limit,
    pub(crate) leader_election: cli::LeaderElection,
    identity: String,
    exit_on_connection_loss: bool,
    save_error_code: bool,
    drain_timeout: Duration,
}

impl Defaults {
    /// The flags' per-driver settings; the Lease holder identity is the host name.
    pub fn from_args(args: &Args) -> Result<Self, leader::Error> {
        Ok(Self::with_identity(args, leader::default_identity()?))
    }

    /// The Lease holder identity of this process.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// As [`Defaults::from_args`], with the given Lease holder identity.
    pub fn with_identity(args: &Args, identity: String) -> Self {
        Self {
            timeout: args.timeout,
            worker_threads: args.worker_threads,
            retry_interval_start: args.retry_interval_start,
            retry_interval_max: args.retry_interval_max,
            reconcile_sync: args.reconcile_sync,
            // Go casts the flag to int32 when it builds the request.
            max_entries: i32::try_from(args.max_entries).unwrap_or(i32::MAX),
            default_fstype: args.default_fstype.clone().unwrap_or_default(),
            kube_api_qps: args.kube_api_qps,
            // Negative bursts are refused by the flag check.
            kube_api_burst: u32::try_from(args.kube_api_burst.max(0)).unwrap_or(u32::MAX),
            hub_api_cap: Limit::cap(
                args.hub_kube_api_qps,
                u32::try_from(args.hub_kube_api_burst.max(0)).unwrap_or(u32::MAX),
            ),
            leader_election: args.leader_election.clone(),
            identity,
            exit_on_connection_loss: args.exit_on_connection_loss,
            save_error_code: args.feature_gates.mutable_csi_node_allocatable_count,
            drain_timeout: args.graceful_shutdown_timeout,
        }
    }

    /// The settings of a driver at `address` configured by flags alone (sidecar mode).
    pub fn settings_for(&self, address: Address) -> Settings {
        let le = &self.leader_election;
        Settings {
            address,
            expected_name: None,
            timeout: self.timeout,
            attach_workers: self.worker_threads,
            detach_workers: self.worker_threads,
            csi_calls: self.worker_threads,
            retry_interval_start: self.retry_interval_start,
            retry_interval_max: self.retry_interval_max,
            reconcile_sync: self.reconcile_sync,
            max_entries: self.max_entries,
            default_fstype: self.default_fstype.clone(),
            api_budget: Limit::client_go(self.kube_api_qps, self.kube_api_burst),
            leader_election: le
                .enabled
                .then(|| self.leader_settings(le.namespace.as_deref())),
            exit_on_connection_loss: self.exit_on_connection_loss,
            save_error_code: self.save_error_code,
            drain_timeout: self.drain_timeout,
        }
    }

    /// The process-wide API cap the flags set.
    pub fn hub_api_cap(&self) -> Limit {
        self.hub_api_cap
    }

    pub(crate) fn leader_settings(&self, namespace: Option<&str>) -> LeaderSettings {
        let le = &self.leader_election;
        LeaderSettings {
            namespace: leader::resolve_namespace(namespace),
            identity: self.identity.clone(),
            lease_duration: le.lease_duration,
            renew_deadline: le.renew_deadline,
            retry_period: le.retry_period,
            labels: le.labels.clone(),
            // attacher-hub always hands its Leases over on a graceful stop;
            // the Go gate ReleaseLeaderElectionOnExit only adds this to Go.
            release_on_exit: true,
        }
    }
}
