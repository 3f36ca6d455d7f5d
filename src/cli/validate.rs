//! The checks after parsing, in the Go sidecar's start-up order, so that the same mistake gives
//! the same message: logging options, feature gates, `--version`, the HTTP address exclusion,
//! `--worker-threads`, the bounds of every number, API limits and leader-election timing.

use std::collections::BTreeMap;
use std::time::Duration;

use super::args::{Args, FeatureGates, LeaderElection};
use super::error::{Error, Parsed};
use super::state::State;
use super::values::GoDuration;
use crate::leader::timing;
use crate::telemetry;

// === bounds ===
//
// Every number of the command line and of `drivers.yaml` has an upper bound, checked before
// anything is allocated or started. A value Go's `flag` package cannot parse keeps Go's error
// (exit 2); a value Go accepts but that is above our bound is a configuration error (exit 1 for
// a flag, exit 2 with file:line:column for `drivers.yaml`). Each bound sits far above what any
// deployment uses and far below what could exhaust memory or overflow time arithmetic.

/// Most workers per pool (`--worker-threads`, `workerThreads`). A worker is a task holding at
/// most one CSI call; real manifests use 10 to 100, a hundred times less. A driver runs three
/// pools (attach, detach, PersistentVolumes), so the bound caps it at 30,000 tasks, where
/// `--worker-threads=1000000000` used to abort the process on allocation failure.
pub const MAX_WORKERS: u64 = 10_000;

/// Longest duration of every duration flag and field (`--timeout`, `--resync`,
/// `--retry-interval-*`, `--reconcile-sync`, `--leader-election-*`,
/// `--graceful-shutdown-timeout`, `--log-flush-frequency`): one day. Deployments use seconds to
/// an hour; an RPC deadline, retry cap, resync or lease of more than a day is a mistake (a unit
/// slip, `1000h` for `1000s`), and the bound keeps deadline arithmetic (`now + d`) far from
/// overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// Highest API request rate (`--kube-api-qps`, `--hub-kube-api-qps`, `kubeApiQps`,
/// `hubKubeApiQps`): one million requests per second, a thousand times what a large API server
/// serves. Infinity and NaN (which Go's `ParseFloat` accepts) are above it; a negative
/// `--kube-api-qps` keeps client-go's meaning, no limit.
pub const MAX_API_QPS: f64 = 1_000_000.0;

/// Largest API burst (`--kube-api-burst`, `--hub-kube-api-burst`, `kubeApiBurst`,
/// `hubKubeApiBurst`): twice [`MAX_API_QPS`], the ratio of client-go's defaults (5 and 10) and
/// of the hub cap's default burst, so that the burst derived from the largest QPS is within it.
pub const MAX_API_BURST: i64 = 2_000_000;

/// Largest `--max-entries` / `maxEntries`: the CSI field `max_entries` is an int32 (Go casts the
/// flag to int32, so larger values wrap into nonsense), and the CSI spec forbids negative ones.
pub const MAX_LIST_ENTRIES: i64 = i32::MAX as i64;

/// Largest `--max-grpc-log-length`: gRPC frames a message with a 32-bit length, so no response
/// is longer than this many bytes and a larger cap could never cut a log line. Zero and negative
/// values keep their meaning, no cap.
pub const MAX_GRPC_LOG_LENGTH: i64 = u32::MAX as i64;

/// Shortest `--leader-election-lease-duration` / `leaseDuration` (when leader election is on);
/// see [`timing::MIN_LEASE_DURATION`].
pub const MIN_LEASE_DURATION: Duration = timing::MIN_LEASE_DURATION;

/// Refuses numbers above their bound (see the `MAX_*` constants).
pub(super) fn validate_bounds(args: &Args) -> Result<(), Error> {
    let too_large = |flag, max: String, value: String| Err(Error::TooLarge { flag, max, value });
    let le = &args.leader_election;
    let durations = [
        ("graceful-shutdown-timeout", args.graceful_shutdown_timeout),
        ("leader-election-lease-duration", le.lease_duration),
        ("leader-election-renew-deadline", le.renew_deadline),
        ("leader-election-retry-period", le.retry_period),
        ("log-flush-frequency", args.logging.flush_frequency),
        ("reconcile-sync", args.reconcile_sync),
        ("resync", args.resync),
        ("retry-interval-max", args.retry_interval_max),
        ("retry-interval-start", args.retry_interval_start),
        ("timeout", args.timeout),
    ];
    for (flag, value) in durations {
        if value > MAX_DURATION {
            let (max, value) = (GoDuration(MAX_DURATION), GoDuration(value));
            return too_large(flag, max.to_string(), value.to_string());
        }
    }
    for (flag, qps) in [
        ("hub-kube-api-qps", args.hub_kube_api_qps),
        ("kube-api-qps", args.kube_api_qps),
    ] {
        // NaN is not at most the bound either.
        if qps.is_nan() || qps > MAX_API_QPS {
            return too_large(flag, MAX_API_QPS.to_string(), qps.to_string());
        }
    }
    for (flag, burst) in [
        ("hub-kube-api-burst", args.hub_kube_api_burst),
        ("kube-api-burst", args.kube_api_burst),
    ] {
        if burst > MAX_API_BURST {
            return too_large(flag, MAX_API_BURST.to_string(), burst.to_string());
        }
    }
    if args.max_entries < 0 {
        return Err(Error::Negative {
            flag: "max-entries",
            value: args.max_entries.to_string(),
        });
    }
    if args.max_entries > MAX_LIST_ENTRIES {
        let max = MAX_LIST_ENTRIES.to_string();
        return too_large("max-entries", max, args.max_entries.to_string());
    }
    if args.max_grpc_log_length > MAX_GRPC_LOG_LENGTH {
        let (max, value) = (MAX_GRPC_LOG_LENGTH, args.max_grpc_log_length);
        return too_large("max-grpc-log-length", max.to_string(), value.to_string());
    }
    if args.worker_threads as u64 > MAX_WORKERS {
        let (max, value) = (MAX_WORKERS, args.worker_threads);
        return too_large("worker-threads", max.to_string(), value.to_string());
    }
    Ok(())
}

/// Refuses negative API bursts and caps: client-go accepts a negative burst and then fails every
/// request, which no one wants; a negative QPS keeps client-go's meaning (no limit).
pub(super) fn validate_api_limits(args: &Args) -> Result<(), Error> {
    let negative = |flag, value: String| Err(Error::Negative { flag, value });
    if args.kube_api_burst < 0 {
        return negative("kube-api-burst", args.kube_api_burst.to_string());
    }
    if args.hub_kube_api_qps < 0.0 {
        return negative("hub-kube-api-qps", args.hub_kube_api_qps.to_string());
    }
    if args.hub_kube_api_burst < 0 {
        return negative("hub-kube-api-burst", args.hub_kube_api_burst.to_string());
    }
    Ok(())
}

/// The checks client-go makes when the leader elector is built ([`timing::check`]).
pub(super) fn validate_leader_election(le: &LeaderElection) -> Result<(), Error> {
    timing::check(le.lease_duration, le.renew_deadline, le.retry_period)
        .map_err(Error::LeaderElection)
}

/// Applies `--feature-gates` entries to the attacher's gates.
pub(super) fn resolve_feature_gates(
    entries: &BTreeMap<String, bool>,
) -> Result<FeatureGates, Error> {
    let mut gates = FeatureGates::default();
    for name in entries.keys() {
        if !matches!(
            name.as_str(),
            "ReleaseLeaderElectionOnExit"
                | "MutableCSINodeAllocatableCount"
                | "AllAlpha"
                | "AllBeta"
        ) {
            return Err(Error::UnknownFeatureGate(name.clone()));
        }
    }
    // `AllAlpha=true` turns on every alpha gate that is not set explicitly (there is no beta gate
    // among the attacher's own, so `AllBeta` changes nothing).
    let all_alpha = entries.get("AllAlpha").copied().unwrap_or(false);
    gates.release_leader_election_on_exit = entries
        .get("ReleaseLeaderElectionOnExit")
        .copied()
        .unwrap_or(all_alpha || gates.release_leader_election_on_exit);
    if let Some(&value) = entries.get("MutableCSINodeAllocatableCount") {
        gates.mutable_csi_node_allocatable_count = value;
    }
    Ok(gates)
}

impl State {
    /// The checks after parsing, in the Go sidecar's start-up order.
    pub(super) fn finish(mut self, argv0: &str) -> Result<Parsed, Error> {
        // 1. Logging configuration.
        if let Some(format) = self.logging_format.take() {
            self.args.logging.format = match format.as_str() {
                "text" => telemetry::Format::Text,
                "json" => telemetry::Format::Json,
                _ => return Err(Error::LoggingFormat(format)),
            };
        }
        if !self.args.logging.vmodule.is_empty() {
            if self.args.logging.format != telemetry::Format::Text {
                return Err(Error::VmoduleWithoutText);
            }
            self.warn_once("flag -vmodule is accepted but per-file verbosity is not applied; -v applies to all files".to_owned());
        }
        if let Some(flag) = self.alpha_logging.first() {
            return Err(Error::AlphaLoggingOption(flag));
        }
        // 2. Feature gates.
        self.args.feature_gates = resolve_feature_gates(&self.gates)?;
        // 3. `--version`.
        if self.version {
            return Ok(Parsed::Exit {
                code: 0,
                stdout: format!("{argv0} v{}\n", env!("CARGO_PKG_VERSION")),
                stderr: String::new(),
            });
        }
        // 4. The rest, in the Go sidecar's start-up order.
        let args = self.args;
        if args.metrics_address.is_some() && args.http_endpoint.is_some() {
            return Err(Error::MetricsAndHttpEndpoint);
        }
        if args.worker_threads == 0 {
            return Err(Error::ZeroWorkerThreads);
        }
        validate_bounds(&args)?;
        validate_api_limits(&args)?;
        if args.leader_election.enabled {
            validate_leader_election(&args.leader_election)?;
        }
        Ok(Parsed::Run(Box::new(args), self.warnings))
    }
}
