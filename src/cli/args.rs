//! [`Args`]: the validated command line, in groups (leader election, feature gates, logging),
//! with external-attacher v4.13's defaults.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::telemetry;

/// The validated command line.
///
/// Field names follow the flag names; defaults are external-attacher v4.13's.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// `--resync`: period after which every cached object is delivered again as an update.
    pub resync: Duration,
    /// `--timeout`: deadline of each ControllerPublish/Unpublish call, of each start-up Probe and
    /// of one whole reconcile pass.
    pub timeout: Duration,
    /// `--retry-interval-start`: first delay of the per-item exponential backoff.
    pub retry_interval_start: Duration,
    /// `--retry-interval-max`: cap of the per-item exponential backoff.
    pub retry_interval_max: Duration,
    /// `--worker-threads`: workers for attach, and as many again for detach; never zero.
    pub worker_threads: usize,
    /// `--max-entries`: `max_entries` of each `ListVolumes` page (0 = no limit). Go casts it to
    /// int32 when building the request; users of this field do the same.
    pub max_entries: i64,
    /// `--default-fstype`: fsType when the PV's `spec.csi.fsType` is empty (`None` = leave empty).
    pub default_fstype: Option<String>,
    /// `--reconcile-sync`: period of the ListVolumes reconciler.
    pub reconcile_sync: Duration,
    /// `--max-grpc-log-length`: cap of a logged gRPC response in characters (≤ 0 = no cap).
    pub max_grpc_log_length: i64,
    /// `--feature-gates`, resolved against the known gates.
    pub feature_gates: FeatureGates,
    /// `--kubeconfig`: kubeconfig file; `None` = in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `--csi-address`: the driver's socket in sidecar mode (`/path`, `unix:///path`).
    pub csi_address: String,
    /// Leader-election flags (`--leader-election*`).
    pub leader_election: LeaderElection,
    /// `--kube-api-qps`: client-side QPS limit of each driver's API requests, as each sidecar's
    /// client had (client-go: 0 means 5, negative means no limit).
    pub kube_api_qps: f64,
    /// `--kube-api-burst`: client-side burst of each driver's API requests (0 means 10).
    pub kube_api_burst: i64,
    /// `--hub-kube-api-qps`: optional cap of the whole process's API request rate, shared fairly
    /// by the drivers on top of their own budgets (0, the default: no cap).
    pub hub_kube_api_qps: f64,
    /// `--hub-kube-api-burst`: burst of that cap (0: twice the QPS).
    pub hub_kube_api_burst: i64,
    /// `--http-endpoint`: address of the HTTP server for metrics and health (`None` = off).
    pub http_endpoint: Option<String>,
    /// `--metrics-address`: deprecated metrics-only address; never set together with
    /// `http_endpoint`.
    pub metrics_address: Option<String>,
    /// `--metrics-path`: HTTP path of the Prometheus handler.
    pub metrics_path: String,
    /// `--automaxprocs`: accepted for compatibility and ignored (the Go runtime sizing knob).
    pub automaxprocs: bool,
    /// Logging flags (`-v`, `--vmodule`, `--logging-format`, `--log-flush-frequency`).
    pub logging: Logging,
    /// `--config`: hub mode, the `drivers.yaml` listing the drivers to serve.
    pub config: Option<PathBuf>,
    /// `--driver-sockets`: discovery mode, a glob of driver sockets.
    pub driver_sockets: Option<String>,
    /// `--kubelet-registration-dir`: discovery mode, the kubelet's plugin
    /// registration directory (CSI plugins registered there are drivers).
    pub kubelet_registration_dir: Option<PathBuf>,
    /// `--exit-on-connection-loss`: exit 1 when a driver connection drops (the Go sidecar's
    /// behaviour) instead of reconnecting and re-detecting capabilities.
    pub exit_on_connection_loss: bool,
    /// `--graceful-shutdown-timeout`: on SIGTERM, how long in-flight CSI calls may take to finish
    /// before leases are released and the process exits.
    pub graceful_shutdown_timeout: Duration,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(10 * 60),
            timeout: Duration::from_secs(15),
            retry_interval_start: Duration::from_secs(1),
            retry_interval_max: Duration::from_secs(5 * 60),
            worker_threads: 10,
            max_entries: 0,
            default_fstype: None,
            reconcile_sync: Duration::from_secs(60),
            max_grpc_log_length: -1,
            feature_gates: FeatureGates::default(),
            kubeconfig: None,
            csi_address: "/run/csi/socket".to_owned(),
            leader_election: LeaderElection::default(),
            kube_api_qps: 5.0,
            kube_api_burst: 10,
            hub_kube_api_qps: 0.0,
            hub_kube_api_burst: 0,
            http_endpoint: None,
            metrics_address: None,
            metrics_path: "/metrics".to_owned(),
            automaxprocs: false,
            logging: Logging::default(),
            config: None,
            driver_sockets: None,
            kubelet_registration_dir: None,
            exit_on_connection_loss: false,
            graceful_shutdown_timeout: Duration::from_secs(10),
        }
    }
}

/// Leader-election settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// `--leader-election`: use a Lease so that only one replica acts.
    pub enabled: bool,
    /// `--leader-election-namespace`: `None` = `$POD_NAMESPACE`, then the service account's
    /// namespace, then `default`.
    pub namespace: Option<String>,
    /// `--leader-election-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-election-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-election-retry-period`.
    pub retry_period: Duration,
    /// `--leader-election-labels`: labels put on the Lease by the leader.
    pub labels: BTreeMap<String, String>,
}

impl Default for LeaderElection {
    fn default() -> Self {
        Self {
            enabled: false,
            namespace: None,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(5),
            labels: BTreeMap::new(),
        }
    }
}

/// The attacher's feature gates after `--feature-gates` was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// `ReleaseLeaderElectionOnExit` (alpha, default false): in the Go sidecar, on SIGTERM, drain
    /// and release the Lease. Accepted and recorded for compatibility only: attacher-hub always
    /// drains and vacates its Leases on a graceful stop (`LeaderSettings::release_on_exit` is
    /// always true, see `config::Defaults`), so the gate changes nothing here.
    pub release_leader_election_on_exit: bool,
    /// `MutableCSINodeAllocatableCount` (GA, default true).
    pub mutable_csi_node_allocatable_count: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            release_leader_election_on_exit: false,
            mutable_csi_node_allocatable_count: true,
        }
    }
}

/// Logging settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logging {
    /// `-v`: klog verbosity; [`telemetry::directive_for_verbosity`] maps it to levels.
    pub verbosity: u32,
    /// `--vmodule`: per-file verbosity `(pattern, level)`; validated, not applied.
    pub vmodule: Vec<(String, u32)>,
    /// `--logging-format`: `text` or `json`.
    pub format: telemetry::Format,
    /// `--log-flush-frequency`: accepted; tracing writes each line at once.
    pub flush_frequency: Duration,
}

impl Default for Logging {
    fn default() -> Self {
        Self {
            verbosity: 0,
            vmodule: Vec::new(),
            format: telemetry::Format::Text,
            flush_frequency: Duration::from_secs(5),
        }
    }
}
