//! The checks after parsing, in the Go sidecar's start-up order, so that the same mistake gives
//! the same message: logging options, feature gates, `--version`, the HTTP address exclusion,
//! `--worker-threads`, the rules of the per-driver settings ([`rules`](super::rules)) and the
//! bounds of every other number, and leader-election timing.

use std::collections::BTreeMap;

use super::args::{Args, FeatureGates, LeaderElection};
use super::error::{Error, Parsed};
use super::rules::{Count, MAX_DURATION, MAX_GRPC_LOG_LENGTH, Pause, Rate, Refusal};
use super::state::State;
use super::values::GoDuration;
use crate::leader::timing;
use crate::telemetry;

/// Refuses a per-driver setting's value its rule ([`rules`]) refuses, and every other number
/// above its bound. The leader-election durations are held to their bound here; the rest of
/// their rule applies where leader election is on ([`validate_leader_election`], and in
/// `drivers.yaml` for an entry that turns it on).
pub(super) fn validate_bounds(args: &Args) -> Result<(), Error> {
    let le = &args.leader_election;
    let too_large = |flag, max: String, value: String| Err(Error::TooLarge { flag, max, value });
    for (flag, value) in [
        ("graceful-shutdown-timeout", args.graceful_shutdown_timeout),
        ("log-flush-frequency", args.logging.flush_frequency),
        ("resync", args.resync),
    ] {
        if value > MAX_DURATION {
            let (max, value) = (GoDuration(MAX_DURATION), GoDuration(value));
            return too_large(flag, max.to_string(), value.to_string());
        }
    }
    for (pause, value) in [
        (Pause::LeaseDuration, le.lease_duration),
        (Pause::RenewDeadline, le.renew_deadline),
        (Pause::RetryPeriod, le.retry_period),
    ] {
        pause
            .check_bound(value)
            .map_err(|r| refused(pause.flag(), r, GoDuration(value).to_string()))?;
    }
    validate_driver_settings(args)?;
    if args.max_grpc_log_length > MAX_GRPC_LOG_LENGTH {
        let (max, value) = (MAX_GRPC_LOG_LENGTH, args.max_grpc_log_length);
        return too_large("max-grpc-log-length", max.to_string(), value.to_string());
    }
    Ok(())
}

/// The per-driver settings and the hub cap, by their rules: the defaults of every driver, so
/// held to what a `drivers.yaml` entry is held to.
fn validate_driver_settings(args: &Args) -> Result<(), Error> {
    for (pause, value) in [
        (Pause::ReconcileSync, args.reconcile_sync),
        (Pause::RetryIntervalMax, args.retry_interval_max),
        (Pause::RetryIntervalStart, args.retry_interval_start),
        (Pause::Timeout, args.timeout),
    ] {
        let nanos = i128::try_from(value.as_nanos()).unwrap_or(i128::MAX);
        pause
            .check(nanos)
            .map_err(|r| refused(pause.flag(), r, GoDuration(value).to_string()))?;
    }
    for (rate, qps) in [
        (Rate::HubKubeApiQps, args.hub_kube_api_qps),
        (Rate::KubeApiQps, args.kube_api_qps),
    ] {
        rate.check(qps)
            .map_err(|r| refused(rate.flag(), r, qps.to_string()))?;
    }
    let workers = i64::try_from(args.worker_threads).unwrap_or(i64::MAX);
    for (count, n) in [
        (Count::HubKubeApiBurst, args.hub_kube_api_burst),
        (Count::KubeApiBurst, args.kube_api_burst),
        (Count::MaxEntries, args.max_entries),
        (Count::WorkerThreads, workers),
    ] {
        count
            .check(n)
            .map_err(|r| refused(count.flag(), r, n.to_string()))?;
    }
    Ok(())
}

/// The error of a flag's value that its rule refuses.
fn refused(flag: &'static str, refusal: Refusal, value: String) -> Error {
    match refusal {
        Refusal::NotPositive if flag == Count::WorkerThreads.flag() => Error::ZeroWorkerThreads,
        Refusal::NotPositive => Error::NotPositive { flag, value },
        Refusal::Negative => Error::Negative { flag, value },
        Refusal::TooLarge { max } => Error::TooLarge { flag, max, value },
    }
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
                stdout: format!("{argv0} v{}\n", super::VERSION),
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
        if args.leader_election.enabled {
            validate_leader_election(&args.leader_election)?;
        }
        Ok(Parsed::Run(Box::new(args), self.warnings))
    }
}
