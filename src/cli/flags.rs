//! `FLAGS`: every flag the binary accepts, with its kind, its default as Go's usage shows it,
//! its help text and its setter.

use std::path::PathBuf;

use super::state::{Flag, Kind};
use super::values::{
    RANGE_ERROR, parse_decimal_u32, parse_feature_gates, parse_go_bool, parse_go_float,
    parse_go_int, parse_go_uint, parse_labels, parse_vmodule, quantity_is_zero,
};

pub(super) fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// Every flag the binary accepts, in no particular order (the usage sorts them).
pub(super) static FLAGS: &[Flag] = &[
    // --- external-attacher (cmd/csi-attacher/main.go), docs/design.md#flags-attacher ---
    Flag {
        name: "resync",
        kind: Kind::Value("duration"),
        default: "10m0s",
        help: "Resync interval of the controller: every cached object is processed again this often; 0 turns it off. At most 24h.",
        set: |s, v| {
            s.args.resync = s.duration("resync", v)?;
            Ok(())
        },
    },
    Flag {
        name: "timeout",
        kind: Kind::Value("duration"),
        default: "15s",
        help: "Deadline of each ControllerPublish/ControllerUnpublish call, of each start-up Probe and of one reconcile pass. Greater than zero, at most 24h.",
        set: |s, v| {
            s.args.timeout = s.duration("timeout", v)?;
            Ok(())
        },
    },
    Flag {
        name: "retry-interval-start",
        kind: Kind::Value("duration"),
        default: "1s",
        help: "Initial retry interval of a failed attach or detach. It doubles with each failure, up to retry-interval-max. Greater than zero, at most 24h.",
        set: |s, v| {
            s.args.retry_interval_start = s.duration("retry-interval-start", v)?;
            Ok(())
        },
    },
    Flag {
        name: "retry-interval-max",
        kind: Kind::Value("duration"),
        default: "5m0s",
        help: "Maximum retry interval of a failed attach or detach; below retry-interval-start, every retry waits this long (as in external-attacher). Greater than zero, at most 24h.",
        set: |s, v| {
            s.args.retry_interval_max = s.duration("retry-interval-max", v)?;
            Ok(())
        },
    },
    Flag {
        name: "worker-threads",
        kind: Kind::Value("uint"),
        default: "10",
        help: "Number of attach workers; as many detach workers run beside them, and at most this many ControllerPublish/ControllerUnpublish calls are in flight per driver, attaches and detaches together, as with the Go sidecar (workerThreads: {attach: A, detach: D} in drivers.yaml allows A + D). 1 to 10000.",
        set: |s, v| {
            let n = parse_go_uint(v, 64)?;
            s.args.worker_threads = usize::try_from(n).map_err(|_| RANGE_ERROR.to_owned())?;
            Ok(())
        },
    },
    Flag {
        name: "max-entries",
        kind: Kind::Value("int"),
        default: "0",
        help: "Maximum number of entries per ListVolumes page of the reconciler; 0 means no limit. 0 to 2147483647.",
        set: |s, v| {
            s.args.max_entries = parse_go_int(v, 64)?;
            Ok(())
        },
    },
    Flag {
        name: "default-fstype",
        kind: Kind::Value("string"),
        default: "",
        help: "Filesystem type used when a PersistentVolume does not specify one.",
        set: |s, v| {
            s.args.default_fstype = non_empty(v);
            Ok(())
        },
    },
    Flag {
        name: "reconcile-sync",
        kind: Kind::Value("duration"),
        default: "1m0s",
        help: "Interval between passes of the ListVolumes reconciler. Greater than zero, at most 24h.",
        set: |s, v| {
            s.args.reconcile_sync = s.duration("reconcile-sync", v)?;
            Ok(())
        },
    },
    Flag {
        name: "max-grpc-log-length",
        kind: Kind::Value("int"),
        default: "-1",
        help: "Maximum number of characters of a logged gRPC response; a value of 0 or less means no limit. At most 4294967295.",
        set: |s, v| {
            s.args.max_grpc_log_length = parse_go_int(v, 64)?;
            Ok(())
        },
    },
    Flag {
        name: "feature-gates",
        kind: Kind::Value("mapStringBool"),
        default: "",
        help: "Comma-separated Name=bool pairs of feature gates. Known gates:\nAllAlpha=true|false (ALPHA - default=false)\nAllBeta=true|false (BETA - default=false)\nMutableCSINodeAllocatableCount=true|false (GA - default=true)\nReleaseLeaderElectionOnExit=true|false (ALPHA - default=false)",
        set: |s, v| {
            for (name, value) in parse_feature_gates(v)? {
                s.gates.insert(name, value);
            }
            Ok(())
        },
    },
    // --- common sidecar flags (csi-lib-utils standardflags), docs/design.md#flags-common ---
    Flag {
        name: "version",
        kind: Kind::Bool,
        default: "false",
        help: "Print the version and exit.",
        set: |s, v| {
            s.version = parse_go_bool(v)?;
            Ok(())
        },
    },
    Flag {
        name: "kubeconfig",
        kind: Kind::Value("string"),
        default: "",
        help: "Path of a kubeconfig file; empty means the in-cluster service account.",
        set: |s, v| {
            s.args.kubeconfig = non_empty(v).map(PathBuf::from);
            Ok(())
        },
    },
    Flag {
        name: "csi-address",
        kind: Kind::Value("string"),
        default: "/run/csi/socket",
        help: "Address of the CSI driver socket.",
        set: |s, v| {
            v.clone_into(&mut s.args.csi_address);
            Ok(())
        },
    },
    Flag {
        name: "leader-election",
        kind: Kind::Bool,
        default: "false",
        help: "Take a Lease so that only one replica acts for the driver.",
        set: |s, v| {
            s.args.leader_election.enabled = parse_go_bool(v)?;
            Ok(())
        },
    },
    Flag {
        name: "leader-election-namespace",
        kind: Kind::Value("string"),
        default: "",
        help: "Namespace of the leader-election Lease. Defaults to the pod's namespace.",
        set: |s, v| {
            s.args.leader_election.namespace = non_empty(v);
            Ok(())
        },
    },
    Flag {
        name: "leader-election-lease-duration",
        kind: Kind::Value("duration"),
        default: "15s",
        help: "How long non-leaders wait after the last renewal before trying to take the lead. 1s to 24h.",
        set: |s, v| {
            s.args.leader_election.lease_duration =
                s.duration("leader-election-lease-duration", v)?;
            Ok(())
        },
    },
    Flag {
        name: "leader-election-renew-deadline",
        kind: Kind::Value("duration"),
        default: "10s",
        help: "How long the leader keeps retrying to renew before it gives up the lead. At most 24h.",
        set: |s, v| {
            s.args.leader_election.renew_deadline =
                s.duration("leader-election-renew-deadline", v)?;
            Ok(())
        },
    },
    Flag {
        name: "leader-election-retry-period",
        kind: Kind::Value("duration"),
        default: "5s",
        help: "Interval between attempts to take or renew the lead. At most 24h.",
        set: |s, v| {
            s.args.leader_election.retry_period = s.duration("leader-election-retry-period", v)?;
            Ok(())
        },
    },
    Flag {
        name: "leader-election-labels",
        kind: Kind::Value("value"),
        default: "",
        help: "Comma-separated key:value labels put on the Lease by the leader.",
        set: |s, v| {
            s.args.leader_election.labels.extend(parse_labels(v)?);
            Ok(())
        },
    },
    Flag {
        name: "kube-api-qps",
        kind: Kind::Value("float"),
        default: "5",
        help: "Queries per second allowed to the Kubernetes API server, per driver (each driver has the budget its sidecar had; 0 means 5, negative means no limit). At most 1000000.",
        set: |s, v| {
            s.args.kube_api_qps = parse_go_float(v)?;
            Ok(())
        },
    },
    Flag {
        name: "kube-api-burst",
        kind: Kind::Value("int"),
        default: "10",
        help: "Burst of queries allowed to the Kubernetes API server, per driver (0 means 10). 0 to 2000000.",
        set: |s, v| {
            s.args.kube_api_burst = parse_go_int(v, 64)?;
            Ok(())
        },
    },
    Flag {
        name: "hub-kube-api-qps",
        kind: Kind::Value("float"),
        default: "0",
        help: "Optional cap of the whole process's queries per second to the Kubernetes API server, on top of each driver's own budget; waiting drivers take turns. 0 means no cap. 0 to 1000000.",
        set: |s, v| {
            s.args.hub_kube_api_qps = parse_go_float(v)?;
            Ok(())
        },
    },
    Flag {
        name: "hub-kube-api-burst",
        kind: Kind::Value("int"),
        default: "0",
        help: "Burst of the process-wide cap (0 means twice -hub-kube-api-qps). 0 to 2000000.",
        set: |s, v| {
            s.args.hub_kube_api_burst = parse_go_int(v, 64)?;
            Ok(())
        },
    },
    Flag {
        name: "http-endpoint",
        kind: Kind::Value("string"),
        default: "",
        help: "host:port of the HTTP server for metrics and leader-election health (e.g. `:8080`). Empty disables it. Excludes -metrics-address.",
        set: |s, v| {
            s.args.http_endpoint = non_empty(v);
            Ok(())
        },
    },
    Flag {
        name: "metrics-address",
        kind: Kind::Value("string"),
        default: "",
        help: "(deprecated) host:port of the metrics server. Excludes -http-endpoint.",
        set: |s, v| {
            s.args.metrics_address = non_empty(v);
            Ok(())
        },
    },
    Flag {
        name: "metrics-path",
        kind: Kind::Value("string"),
        default: "/metrics",
        help: "HTTP path of the Prometheus metrics.",
        set: |s, v| {
            v.clone_into(&mut s.args.metrics_path);
            Ok(())
        },
    },
    Flag {
        name: "automaxprocs",
        kind: Kind::Bool,
        default: "false",
        help: "Accepted for compatibility with the Go sidecar (where it sizes GOMAXPROCS); ignored.",
        // Go declares it with `flag.BoolFunc`, which hands any value to its function.
        set: |s, v| {
            s.args.automaxprocs = parse_go_bool(v).unwrap_or(true);
            Ok(())
        },
    },
    // --- logging (component-base logs/api/v1), docs/design.md#flags-logging ---
    Flag {
        name: "v",
        kind: Kind::Value("Level"),
        default: "0",
        help: "Log verbosity: 0 info, 1-3 debug, 4 and above trace. 0 to 4294967295.",
        set: |s, v| {
            s.args.logging.verbosity = parse_decimal_u32(v)?;
            Ok(())
        },
    },
    Flag {
        name: "vmodule",
        kind: Kind::Value("pattern=N,..."),
        default: "",
        help: "Comma-separated pattern=N per-file verbosity (text format only). Validated but not applied.",
        set: |s, v| {
            s.args.logging.vmodule = parse_vmodule(v)?;
            Ok(())
        },
    },
    Flag {
        name: "logging-format",
        kind: Kind::Value("string"),
        default: "text",
        help: "Log format: \"text\" or \"json\".",
        set: |s, v| {
            s.logging_format = Some(v.to_owned());
            Ok(())
        },
    },
    Flag {
        name: "log-flush-frequency",
        kind: Kind::Value("duration"),
        default: "5s",
        help: "Maximum interval between log flushes. At most 24h.",
        set: |s, v| {
            s.args.logging.flush_frequency = s.duration("log-flush-frequency", v)?;
            Ok(())
        },
    },
    Flag {
        name: "log-text-split-stream",
        kind: Kind::Bool,
        default: "false",
        help: "[Alpha] Text format: errors to stderr, info to stdout. Needs the LoggingAlphaOptions gate, which is off.",
        set: |s, v| {
            if parse_go_bool(v)? {
                s.alpha_logging.push("log-text-split-stream");
            }
            Ok(())
        },
    },
    Flag {
        name: "log-text-info-buffer-size",
        kind: Kind::Value("quantity"),
        default: "",
        help: "[Alpha] Text format with split streams: buffer size of the info stream. Needs the LoggingAlphaOptions gate, which is off.",
        set: |s, v| {
            if !quantity_is_zero(v)? {
                s.alpha_logging.push("log-text-info-buffer-size");
            }
            Ok(())
        },
    },
    Flag {
        name: "log-json-split-stream",
        kind: Kind::Bool,
        default: "false",
        help: "[Alpha] JSON format: errors to stderr, info to stdout. Needs the LoggingAlphaOptions gate, which is off.",
        set: |s, v| {
            if parse_go_bool(v)? {
                s.alpha_logging.push("log-json-split-stream");
            }
            Ok(())
        },
    },
    Flag {
        name: "log-json-info-buffer-size",
        kind: Kind::Value("quantity"),
        default: "",
        help: "[Alpha] JSON format with split streams: buffer size of the info stream. Needs the LoggingAlphaOptions gate, which is off.",
        set: |s, v| {
            if !quantity_is_zero(v)? {
                s.alpha_logging.push("log-json-info-buffer-size");
            }
            Ok(())
        },
    },
    // --- attacher-hub's own flags, docs/design.md#flags-hub ---
    Flag {
        name: "config",
        kind: Kind::Value("string"),
        default: "",
        help: "Hub mode: path of the drivers.yaml that lists the drivers to serve. With discovery, its entries without an address give settings to the discovered drivers of their names.",
        set: |s, v| {
            s.args.config = non_empty(v).map(PathBuf::from);
            Ok(())
        },
    },
    Flag {
        name: "driver-sockets",
        kind: Kind::Value("string"),
        default: "",
        help: "Discovery mode: glob of driver sockets to serve, e.g. '/var/lib/kubelet/plugins/*/csi.sock'.",
        set: |s, v| {
            s.args.driver_sockets = non_empty(v);
            Ok(())
        },
    },
    Flag {
        name: "kubelet-registration-dir",
        kind: Kind::Value("string"),
        default: "",
        help: "Discovery mode: the kubelet's plugin registration directory, e.g. /var/lib/kubelet/plugins_registry; every CSI plugin registered there is served.",
        set: |s, v| {
            s.args.kubelet_registration_dir = non_empty(v).map(PathBuf::from);
            Ok(())
        },
    },
    Flag {
        name: "exit-on-connection-loss",
        kind: Kind::Bool,
        default: "false",
        help: "Exit when a driver connection is lost, like the Go sidecar, instead of reconnecting.",
        set: |s, v| {
            s.args.exit_on_connection_loss = parse_go_bool(v)?;
            Ok(())
        },
    },
    Flag {
        name: "graceful-shutdown-timeout",
        kind: Kind::Value("duration"),
        default: "10s",
        help: "On SIGTERM, how long in-flight CSI calls may take to finish before leases are released. At most 24h.",
        set: |s, v| {
            s.args.graceful_shutdown_timeout = s.duration("graceful-shutdown-timeout", v)?;
            Ok(())
        },
    },
    // --- classic klog flags, removed from external-attacher in v4.6: accepted, ignored ---
    Flag {
        name: "logtostderr",
        kind: Kind::Bool,
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("logtostderr");
            Ok(())
        },
    },
    Flag {
        name: "alsologtostderr",
        kind: Kind::Bool,
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("alsologtostderr");
            Ok(())
        },
    },
    Flag {
        name: "log_dir",
        kind: Kind::Value("string"),
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("log_dir");
            Ok(())
        },
    },
    Flag {
        name: "log_file",
        kind: Kind::Value("string"),
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("log_file");
            Ok(())
        },
    },
    Flag {
        name: "log_file_max_size",
        kind: Kind::Value("uint"),
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("log_file_max_size");
            Ok(())
        },
    },
    Flag {
        name: "stderrthreshold",
        kind: Kind::Value("severity"),
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("stderrthreshold");
            Ok(())
        },
    },
    Flag {
        name: "skip_headers",
        kind: Kind::Bool,
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("skip_headers");
            Ok(())
        },
    },
    Flag {
        name: "skip_log_headers",
        kind: Kind::Bool,
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("skip_log_headers");
            Ok(())
        },
    },
    Flag {
        name: "add_dir_header",
        kind: Kind::Bool,
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("add_dir_header");
            Ok(())
        },
    },
    Flag {
        name: "log_backtrace_at",
        kind: Kind::Value("traceLocation"),
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("log_backtrace_at");
            Ok(())
        },
    },
    Flag {
        name: "one_output",
        kind: Kind::Bool,
        default: "",
        help: "Ignored (klog flag of external-attacher before v4.6).",
        set: |s, _| {
            s.legacy_klog("one_output");
            Ok(())
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use crate::cli::state::State;
    use crate::cli::tests::args;
    use crate::telemetry;

    #[test]
    fn every_flag_table_default_matches_args_default() {
        for flag in FLAGS {
            if flag.default.is_empty() || flag.name == "logging-format" {
                continue;
            }
            let mut state = State::default();
            (flag.set)(&mut state, flag.default)
                .unwrap_or_else(|e| panic!("default of -{} does not parse: {e}", flag.name));
            assert_eq!(state.args, Args::default(), "default of -{}", flag.name);
        }
        assert_eq!(
            args(&["-logging-format=text"]).logging.format,
            telemetry::Format::Text
        );
    }

    #[test]
    fn flag_names_are_unique() {
        let mut names: Vec<_> = FLAGS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FLAGS.len());
    }
}
