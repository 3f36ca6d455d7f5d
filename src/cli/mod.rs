//! Command line: every external-attacher v4.12 flag, parsed exactly as Go's `flag` package does.
//!
//! attacher-hub is a drop-in replacement for the Go sidecar, so an existing Deployment's argument
//! list must mean the same thing here, including its oddities (spec §1.1):
//!
//! * `-name` and `--name` are the same flag; values go as `-name=value` or `-name value`;
//! * a boolean takes its value only after `=` (`true`, `false`, `1`, `0`, `t`, `f`, `T`, `F`,
//!   `TRUE`, `FALSE`, `True`, `False`); `-x false` makes `false` a positional argument, and the
//!   first positional argument (or `--`) **ends flag parsing**: everything after it is ignored;
//! * integers accept Go's base prefixes and `_` separators (`0x10`, `1_000`), durations use Go
//!   syntax (`300ms`, `1m30s`, `-5s`, bare `0`);
//! * an unknown flag or a bad value prints the error and the usage on stderr and exits **2**;
//!   `-h`, `-help` and `--help` print the usage on stderr (as Go does) and exit **0**.
//!
//! **Why not clap** (STYLE rule 11 asks for clap derive): clap cannot express these semantics.
//! It treats `-name` as a cluster of short options, does not stop at `-x false`, parses booleans
//! and numbers with Rust rules, has no Go durations and exits with its own codes and texts. A
//! reimplementation on top of clap would need a pre-pass that rewrites the arguments, i.e. a Go
//! flag parser anyway. So this module is a small hand-written parser over one declarative table,
//! `FLAGS`, which holds each flag's name, kind, default as shown in the usage text, help text and
//! setter; the rest of rule 11 holds: the result is validated into a typed [`Args`] (durations as
//! [`Duration`]) before anything starts, and failures are a typed [`Error`] carrying the exit code.
//!
//! Deliberate differences from the Go binary, each documented at its flag: the classic klog flags
//! removed in v4.6 (`--logtostderr`, …) are accepted as no-ops with a warning instead of being
//! unknown; negative durations (valid Go syntax) are treated as zero with a warning; the generic
//! kube-apiserver feature gates that the Go binary accepts without effect are unknown here (only
//! the attacher's own gates plus `AllAlpha`/`AllBeta`); hexadecimal floats are not accepted by
//! `--kube-api-qps`; `--vmodule` is validated but not applied. Every number has an upper bound
//! (the `MAX_*` constants below, shown in the usage): a value Go accepts above it, a negative
//! `--max-entries`, and a lease duration under one second with leader election on are
//! configuration errors (exit 1).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::telemetry;

/// The program name used when the argument list is empty.
const DEFAULT_ARGV0: &str = "attacher-hub";

/// `client-go`'s leader-election jitter factor: the renew deadline must exceed
/// `JITTER_FACTOR * retry period`.
const LEADER_ELECTION_JITTER_FACTOR: f64 = 1.2;

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

/// Shortest `--leader-election-lease-duration` / `leaseDuration` (when leader election is on):
/// a Lease stores whole seconds and must hold a positive number, so a shorter one could never be
/// written (the Go sidecar accepts it and then fails every attempt to take the Lease).
pub const MIN_LEASE_DURATION: Duration = Duration::from_secs(1);

// === Args ===

/// The validated command line.
///
/// Field names follow the flag names; defaults are external-attacher v4.12's.
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

impl Args {
    /// The address of the HTTP server: `--metrics-address` if set, else `--http-endpoint`.
    pub fn http_address(&self) -> Option<&str> {
        self.metrics_address
            .as_deref()
            .or(self.http_endpoint.as_deref())
    }

    /// Whether `/healthz/leader-election` is served: only with `--http-endpoint`, never with the
    /// deprecated `--metrics-address` (as in the Go sidecar).
    pub fn serves_leader_election_health(&self) -> bool {
        self.http_endpoint.is_some()
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
    /// `ReleaseLeaderElectionOnExit` (alpha, default false): on SIGTERM, drain and release the
    /// Lease.
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

// === Parsed, Error ===

/// The outcome of a successful parse.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    /// Run with these arguments; the warnings (ignored legacy flags, …) should be logged once
    /// logging is set up.
    Run(Box<Args>, Vec<String>),
    /// Print and exit without running: `--help` (usage on stderr, code 0) or `--version`
    /// (stdout, code 0).
    Exit {
        /// Process exit code.
        code: i32,
        /// Text for stdout.
        stdout: String,
        /// Text for stderr.
        stderr: String,
    },
}

/// Why the command line was rejected. [`Error::exit_code`] gives the process exit code: 2 for a
/// flag that could not be parsed, 1 for a parsed but invalid configuration (as the Go sidecar).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// Unknown flag, missing or unparsable value (Go `flag` error, exit 2).
    #[error("{message}")]
    Usage {
        /// The error line, as Go's `flag` package words it.
        message: String,
        /// The usage text printed after it.
        usage: String,
    },
    /// `--logging-format` names no known format.
    #[error("--logging-format: unsupported value {0:?}: supported values: \"json\", \"text\"")]
    LoggingFormat(String),
    /// `--vmodule` together with a format other than text.
    #[error("--vmodule is only supported with --logging-format=text")]
    VmoduleWithoutText,
    /// An alpha logging option was set; it needs the `LoggingAlphaOptions` gate, which cannot be
    /// enabled from the command line.
    #[error("--{0} cannot be used: feature gate LoggingAlphaOptions is disabled")]
    AlphaLoggingOption(&'static str),
    /// `--feature-gates` names an unknown gate.
    #[error("unrecognized feature gate: {0}")]
    UnknownFeatureGate(String),
    /// `--metrics-address` and `--http-endpoint` were both set.
    #[error("Only one of `--metrics-address` and `--http-endpoint` can be set")]
    MetricsAndHttpEndpoint,
    /// `--worker-threads=0`.
    #[error("Option -worker-threads must be greater than zero")]
    ZeroWorkerThreads,
    /// A negative API burst or cap (client-go would fail every request with a negative burst),
    /// or a negative `--max-entries` (the CSI spec forbids it).
    #[error("--{flag} must not be negative, not {value}")]
    Negative {
        /// The flag name.
        flag: &'static str,
        /// The value given.
        value: String,
    },
    /// A number Go accepts but above attacher-hub's bound for it (the `MAX_*` constants).
    #[error("--{flag} must be at most {max}, not {value}")]
    TooLarge {
        /// The flag name.
        flag: &'static str,
        /// The bound.
        max: String,
        /// The value given (durations as Go prints them).
        value: String,
    },
    /// A leader-election duration is zero (or was negative).
    #[error("--leader-election-{0} must be greater than zero")]
    LeaderElectionZero(&'static str),
    /// `--leader-election-lease-duration` under [`MIN_LEASE_DURATION`].
    #[error(
        "--leader-election-lease-duration ({}) must be at least 1s: a Lease holds whole seconds",
        GoDuration(*.0)
    )]
    LeaseDurationTooShort(Duration),
    /// The lease would expire before the leader gives up renewing it.
    #[error(
        "--leader-election-lease-duration ({}) must be greater than --leader-election-renew-deadline ({})",
        GoDuration(*lease_duration),
        GoDuration(*renew_deadline)
    )]
    LeaseNotLongerThanRenewDeadline {
        /// `--leader-election-lease-duration`.
        lease_duration: Duration,
        /// `--leader-election-renew-deadline`.
        renew_deadline: Duration,
    },
    /// The leader would give up before its last retry could succeed.
    #[error(
        "--leader-election-renew-deadline ({}) must be greater than 1.2 × --leader-election-retry-period ({})",
        GoDuration(*renew_deadline),
        GoDuration(*retry_period)
    )]
    RenewDeadlineNotLongerThanRetry {
        /// `--leader-election-renew-deadline`.
        renew_deadline: Duration,
        /// `--leader-election-retry-period`.
        retry_period: Duration,
    },
}

impl Error {
    /// The process exit code: 2 for a parse error, 1 for an invalid configuration.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Usage { .. } => 2,
            _ => 1,
        }
    }

    /// What to print on stderr: the message, followed by the usage for parse errors.
    pub fn stderr_text(&self) -> String {
        match self {
            Self::Usage { message, usage } => format!("{message}\n{usage}"),
            other => format!("{other}\n"),
        }
    }
}

// === entry points ===

/// Parses and validates a full argument list (`argv[0]` first).
///
/// Validation follows the Go sidecar's start-up order, so that the same mistake gives the same
/// message: flags, logging options, feature gates, `--version`, the HTTP address exclusion,
/// `--worker-threads`, leader-election timing.
pub fn parse_from<I: IntoIterator<Item = String>>(argv: I) -> Result<Parsed, Error> {
    let mut argv = argv.into_iter();
    let argv0 = argv.next().unwrap_or_else(|| DEFAULT_ARGV0.to_owned());
    let rest: Vec<String> = argv.collect();

    let mut state = State::default();
    let mut i = 0;
    while let Some(arg) = rest.get(i) {
        // A lone `-` or anything not starting with `-` is a positional argument: stop.
        if arg.len() < 2 || !arg.starts_with('-') {
            break;
        }
        let body = match arg.strip_prefix("--") {
            Some("") => break, // `--` ends the flags
            Some(body) => body,
            None => &arg[1..],
        };
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            return Err(usage_error(&argv0, format!("bad flag syntax: {arg}")));
        }
        i += 1;
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let Some(flag) = FLAGS.iter().find(|f| f.name == name) else {
            if name == "help" || name == "h" {
                return Ok(Parsed::Exit {
                    code: 0,
                    stdout: String::new(),
                    stderr: usage(&argv0),
                });
            }
            return Err(usage_error(
                &argv0,
                format!("flag provided but not defined: -{name}"),
            ));
        };
        match flag.kind {
            Kind::Bool => {
                let value = inline.unwrap_or("true");
                if let Err(err) = (flag.set)(&mut state, value) {
                    let message = match inline {
                        Some(_) => format!("invalid boolean value {value:?} for -{name}: {err}"),
                        None => format!("invalid boolean flag {name}: {err}"),
                    };
                    return Err(usage_error(&argv0, message));
                }
            }
            Kind::Value(_) => {
                let value = match inline {
                    Some(value) => value,
                    None => match rest.get(i) {
                        Some(value) => {
                            i += 1;
                            value.as_str()
                        }
                        None => {
                            return Err(usage_error(
                                &argv0,
                                format!("flag needs an argument: -{name}"),
                            ));
                        }
                    },
                };
                if let Err(err) = (flag.set)(&mut state, value) {
                    return Err(usage_error(
                        &argv0,
                        format!("invalid value {value:?} for flag -{name}: {err}"),
                    ));
                }
            }
        }
    }
    state.finish(&argv0)
}

/// Parses the process's arguments; prints and exits on `--help`, `--version` and errors.
/// Returns the arguments and the warnings to log once logging is set up.
pub fn parse_env_or_exit() -> (Args, Vec<String>) {
    let argv = std::env::args_os().map(|a| a.to_string_lossy().into_owned());
    match parse_from(argv) {
        Ok(Parsed::Run(args, warnings)) => (*args, warnings),
        Ok(Parsed::Exit {
            code,
            stdout,
            stderr,
        }) => {
            emit(&stdout, &stderr);
            std::process::exit(code)
        }
        Err(err) => {
            emit("", &err.stderr_text());
            std::process::exit(err.exit_code())
        }
    }
}

/// Writes the texts; a closed stdout or stderr (`--help | head`) is not an error worth a panic.
fn emit(stdout: &str, stderr: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().write_all(stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(stderr.as_bytes());
}

/// The usage text, in the layout of Go's `flag.PrintDefaults`: flags sorted by name, each with
/// its value type, help and non-zero default.
pub fn usage(argv0: &str) -> String {
    let mut flags: Vec<&Flag> = FLAGS.iter().collect();
    flags.sort_by_key(|f| f.name);
    let mut out = format!("Usage of {argv0}:\n");
    for flag in flags {
        let mut line = format!("  -{}", flag.name);
        if let Kind::Value(type_name) = flag.kind {
            line.push(' ');
            line.push_str(type_name);
        }
        // Go puts a short flag's help on the same line.
        line.push_str(if line.len() <= 4 { "\t" } else { "\n    \t" });
        line.push_str(&flag.help.replace('\n', "\n    \t"));
        if !matches!(flag.default, "" | "0" | "false" | "0s") {
            match flag.kind {
                Kind::Value("string") => line.push_str(&format!(" (default {:?})", flag.default)),
                _ => line.push_str(&format!(" (default {})", flag.default)),
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn usage_error(argv0: &str, message: String) -> Error {
    Error::Usage {
        message,
        usage: usage(argv0),
    }
}

// === parse state ===

/// Everything the setters record; [`State::finish`] turns it into [`Args`].
#[derive(Default)]
struct State {
    args: Args,
    warnings: Vec<String>,
    /// `--feature-gates` entries in order; later ones win.
    gates: BTreeMap<String, bool>,
    /// `--version` was given.
    version: bool,
    /// `--logging-format` as given (validated in `finish`).
    logging_format: Option<String>,
    /// Alpha logging options set to a non-default value, by flag name.
    alpha_logging: Vec<&'static str>,
}

impl State {
    fn warn_once(&mut self, warning: String) {
        if !self.warnings.contains(&warning) {
            self.warnings.push(warning);
        }
    }

    /// Parses a Go duration for flag `name`; negative values become zero with a warning.
    fn duration(&mut self, name: &str, value: &str) -> Result<Duration, String> {
        let nanos = parse_go_duration(value).map_err(|_| PARSE_ERROR.to_owned())?;
        match u64::try_from(nanos) {
            Ok(nanos) => Ok(Duration::from_nanos(nanos)),
            Err(_) => {
                self.warn_once(format!(
                    "flag -{name}: negative duration {value:?} is treated as 0s"
                ));
                Ok(Duration::ZERO)
            }
        }
    }

    fn legacy_klog(&mut self, name: &str) {
        self.warn_once(format!(
            "flag -{name} is a klog flag that external-attacher removed in v4.6; it is accepted and ignored"
        ));
    }

    fn finish(mut self, argv0: &str) -> Result<Parsed, Error> {
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

/// Refuses numbers above their bound (see the `MAX_*` constants).
fn validate_bounds(args: &Args) -> Result<(), Error> {
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
fn validate_api_limits(args: &Args) -> Result<(), Error> {
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

/// The checks client-go makes when the leader elector is built.
fn validate_leader_election(le: &LeaderElection) -> Result<(), Error> {
    if le.lease_duration <= le.renew_deadline {
        return Err(Error::LeaseNotLongerThanRenewDeadline {
            lease_duration: le.lease_duration,
            renew_deadline: le.renew_deadline,
        });
    }
    // Go truncates the product to whole nanoseconds.
    let jittered_retry =
        (LEADER_ELECTION_JITTER_FACTOR * le.retry_period.as_nanos() as f64) as u128;
    if le.renew_deadline.as_nanos() <= jittered_retry {
        return Err(Error::RenewDeadlineNotLongerThanRetry {
            renew_deadline: le.renew_deadline,
            retry_period: le.retry_period,
        });
    }
    for (name, value) in [
        ("lease-duration", le.lease_duration),
        ("renew-deadline", le.renew_deadline),
        ("retry-period", le.retry_period),
    ] {
        if value.is_zero() {
            return Err(Error::LeaderElectionZero(name));
        }
    }
    if le.lease_duration < MIN_LEASE_DURATION {
        return Err(Error::LeaseDurationTooShort(le.lease_duration));
    }
    Ok(())
}

/// Applies `--feature-gates` entries to the attacher's gates.
fn resolve_feature_gates(entries: &BTreeMap<String, bool>) -> Result<FeatureGates, Error> {
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

// === the flag table ===

/// How a flag takes its value.
#[derive(Clone, Copy)]
enum Kind {
    /// Bare means `true`; a value only after `=`.
    Bool,
    /// Takes a value after `=` or as the next argument; the type name shown in the usage.
    Value(&'static str),
}

/// Stores a flag's value; the error text follows Go's (`parse error`, `value out of range`, …).
type Setter = fn(&mut State, &str) -> Result<(), String>;

/// One command-line flag.
struct Flag {
    name: &'static str,
    kind: Kind,
    /// The default as Go's usage shows it; equal to the matching field of `Args::default()`.
    default: &'static str,
    help: &'static str,
    set: Setter,
}

/// Go's `flag` error for a value that does not parse.
const PARSE_ERROR: &str = "parse error";
/// Go's `flag` error for a number out of range.
const RANGE_ERROR: &str = "value out of range";

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// Every flag the binary accepts, in no particular order (the usage sorts them).
static FLAGS: &[Flag] = &[
    // --- external-attacher (cmd/csi-attacher/main.go), spec §1.2 ---
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
        help: "Deadline of each ControllerPublish/ControllerUnpublish call, of each start-up Probe and of one reconcile pass. At most 24h.",
        set: |s, v| {
            s.args.timeout = s.duration("timeout", v)?;
            Ok(())
        },
    },
    Flag {
        name: "retry-interval-start",
        kind: Kind::Value("duration"),
        default: "1s",
        help: "Initial retry interval of a failed attach or detach. It doubles with each failure, up to retry-interval-max. At most 24h.",
        set: |s, v| {
            s.args.retry_interval_start = s.duration("retry-interval-start", v)?;
            Ok(())
        },
    },
    Flag {
        name: "retry-interval-max",
        kind: Kind::Value("duration"),
        default: "5m0s",
        help: "Maximum retry interval of a failed attach or detach. At most 24h.",
        set: |s, v| {
            s.args.retry_interval_max = s.duration("retry-interval-max", v)?;
            Ok(())
        },
    },
    Flag {
        name: "worker-threads",
        kind: Kind::Value("uint"),
        default: "10",
        help: "Number of attach workers; as many detach workers run beside them. 1 to 10000.",
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
        help: "Interval between passes of the ListVolumes reconciler. At most 24h.",
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
    // --- common sidecar flags (csi-lib-utils standardflags), spec §1.3 ---
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
    // --- logging (component-base logs/api/v1), spec §1.4 ---
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
    // --- attacher-hub's own flags (DESIGN.md) ---
    Flag {
        name: "config",
        kind: Kind::Value("string"),
        default: "",
        help: "Hub mode: path of the drivers.yaml that lists the drivers to serve.",
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

// === value parsers (Go semantics) ===

/// Go's `strconv.ParseBool`.
fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(PARSE_ERROR.to_owned()),
    }
}

/// Go's `strconv.ParseUint(value, 0, bits)`: decimal, `0x`/`0o`/`0b`/leading-`0` prefixes and
/// `_` between digits; no sign.
fn parse_go_uint(value: &str, bits: u32) -> Result<u64, String> {
    let syntax = || PARSE_ERROR.to_owned();
    let bytes = value.as_bytes();
    let (radix, digits) = match bytes {
        [] => return Err(syntax()),
        [b'0', p, _, ..] if matches!(p.to_ascii_lowercase(), b'x' | b'o' | b'b') => {
            let radix = match p.to_ascii_lowercase() {
                b'x' => 16,
                b'o' => 8,
                _ => 2,
            };
            (radix, &value[2..])
        }
        [b'0', ..] => (8, &value[1..]),
        _ => (10, value),
    };
    let max = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let mut n: u64 = 0;
    let mut underscores = false;
    for c in digits.chars() {
        if c == '_' {
            underscores = true;
            continue;
        }
        let d = c.to_digit(radix).ok_or_else(syntax)?;
        n = n
            .checked_mul(u64::from(radix))
            .and_then(|n| n.checked_add(u64::from(d)))
            .filter(|n| *n <= max)
            .ok_or_else(|| RANGE_ERROR.to_owned())?;
    }
    if underscores && !go_underscores_ok(value) {
        return Err(syntax());
    }
    Ok(n)
}

/// Go's `strconv.ParseInt(value, 0, bits)`.
fn parse_go_int(value: &str, bits: u32) -> Result<i64, String> {
    let (negative, magnitude) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    let limit = 1u64 << (bits.clamp(1, 64) - 1); // |min|; max is limit - 1
    let n = parse_go_uint(magnitude, 64)?;
    if negative {
        if n > limit {
            return Err(RANGE_ERROR.to_owned());
        }
        // n ≤ 2^63, so 0 - n fits in i64.
        Ok(0i64.wrapping_sub_unsigned(n))
    } else {
        i64::try_from(n)
            .ok()
            .filter(|_| n < limit)
            .ok_or_else(|| RANGE_ERROR.to_owned())
    }
}

/// Go's rule for `_` in number literals: only between digits, or between a base prefix and a
/// digit.
fn go_underscores_ok(value: &str) -> bool {
    let mut s = value.as_bytes();
    if let [b'+' | b'-', rest @ ..] = s {
        s = rest;
    }
    // `saw`: '^' start, '0' digit or prefix, '_' underscore, '!' anything else.
    let mut saw = b'^';
    let mut hex = false;
    if let [b'0', p, rest @ ..] = s
        && matches!(p.to_ascii_lowercase(), b'x' | b'o' | b'b')
    {
        hex = p.eq_ignore_ascii_case(&b'x');
        saw = b'0';
        s = rest;
    }
    for &c in s {
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
    }
    saw != b'_'
}

/// Go's `strconv.ParseFloat(value, 64)` for decimal forms, `Inf`/`Infinity`/`NaN` and `_`
/// separators (hexadecimal floats are not supported).
fn parse_go_float(value: &str) -> Result<f64, String> {
    let cleaned;
    let text = if value.contains('_') {
        if !go_underscores_ok(value) {
            return Err(PARSE_ERROR.to_owned());
        }
        cleaned = value.replace('_', "");
        cleaned.as_str()
    } else {
        value
    };
    let f: f64 = text.parse().map_err(|_| PARSE_ERROR.to_owned())?;
    let lower = text.to_ascii_lowercase();
    if f.is_infinite() && !lower.trim_start_matches(['+', '-']).starts_with("inf") {
        return Err(RANGE_ERROR.to_owned());
    }
    Ok(f)
}

/// A decimal `uint32` (klog's verbosity level).
fn parse_decimal_u32(value: &str) -> Result<u32, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PARSE_ERROR.to_owned());
    }
    value.parse().map_err(|_| RANGE_ERROR.to_owned())
}

/// Go's `time.ParseDuration`, in nanoseconds: a sequence of decimal numbers, each with an
/// optional fraction and a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`), optionally signed;
/// a bare `0` needs no unit.
pub fn parse_go_duration(value: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(value.to_owned());
    let (negative, mut s) = match value.as_bytes().first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    // Go allows up to 2^63 ns, which only fits when negative.
    const LIMIT: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !s.is_empty() {
        // The number: integer part, then an optional fraction.
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let mut whole: u64 = 0;
        for b in s[..int_len].bytes() {
            whole = whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(u64::from(b - b'0')))
                .filter(|w| *w <= LIMIT)
                .ok_or_else(invalid)?;
        }
        s = &s[int_len..];
        let (mut frac, mut scale, mut frac_len) = (0u64, 1f64, 0usize);
        if let Some(rest) = s.strip_prefix('.') {
            frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflow = false;
            for b in rest[..frac_len].bytes() {
                if overflow {
                    continue;
                }
                match frac
                    .checked_mul(10)
                    .and_then(|f| f.checked_add(u64::from(b - b'0')))
                {
                    Some(f) if f <= LIMIT => {
                        frac = f;
                        scale *= 10.0;
                    }
                    _ => overflow = true, // further digits do not matter
                }
            }
            s = &rest[frac_len..];
        } else if int_len == 0 {
            return Err(invalid());
        }
        if int_len == 0 && frac_len == 0 {
            return Err(invalid());
        }
        // The unit: everything up to the next digit or dot.
        let unit_len = s
            .bytes()
            .take_while(|b| *b != b'.' && !b.is_ascii_digit())
            .count();
        let unit = match &s[..unit_len] {
            "" => return Err(DurationError::MissingUnit(value.to_owned())),
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            other => {
                return Err(DurationError::UnknownUnit {
                    unit: other.to_owned(),
                    duration: value.to_owned(),
                });
            }
        };
        s = &s[unit_len..];
        let mut v = whole
            .checked_mul(unit)
            .filter(|v| *v <= LIMIT)
            .ok_or_else(invalid)?;
        if frac > 0 {
            v = v
                .checked_add((frac as f64 * (unit as f64 / scale)) as u64)
                .filter(|v| *v <= LIMIT)
                .ok_or_else(invalid)?;
        }
        total = total
            .checked_add(v)
            .filter(|t| *t <= LIMIT)
            .ok_or_else(invalid)?;
    }
    if negative {
        Ok(0i64.wrapping_sub_unsigned(total))
    } else {
        i64::try_from(total).map_err(|_| invalid())
    }
}

/// Why [`parse_go_duration`] rejected a value (Go's wording).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    /// Not a duration at all, or out of range.
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    /// A number without a unit (other than a bare `0`).
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    /// A unit other than ns, us, µs, ms, s, m, h.
    #[error("time: unknown unit {unit:?} in duration {duration:?}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole value.
        duration: String,
    },
}

/// Formats a [`Duration`] as Go's `time.Duration.String` does (`1m30s`, `300ms`, `0s`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        /// `whole.fraction` with the fraction's trailing zeros dropped.
        fn decimal(f: &mut fmt::Formatter<'_>, n: u128, per_unit: u128, unit: &str) -> fmt::Result {
            let (whole, frac) = (n / per_unit, n % per_unit);
            write!(f, "{whole}")?;
            if frac > 0 {
                let width = per_unit.ilog10() as usize;
                let digits = format!("{frac:0width$}");
                write!(f, ".{}", digits.trim_end_matches('0'))?;
            }
            f.write_str(unit)
        }
        const SEC: u128 = 1_000_000_000;
        match nanos {
            0 => f.write_str("0s"),
            n if n < 1_000 => write!(f, "{n}ns"),
            n if n < 1_000_000 => decimal(f, n, 1_000, "µs"),
            n if n < SEC => decimal(f, n, 1_000_000, "ms"),
            n => {
                let (hours, rest) = (n / (3600 * SEC), n % (3600 * SEC));
                let (minutes, rest) = (rest / (60 * SEC), rest % (60 * SEC));
                if hours > 0 {
                    write!(f, "{hours}h{minutes}m")?;
                } else if minutes > 0 {
                    write!(f, "{minutes}m")?;
                }
                decimal(f, rest, SEC, "s")
            }
        }
    }
}

/// `--feature-gates`: `Name=bool,Name2=bool` (spaces around names and values allowed).
fn parse_feature_gates(value: &str) -> Result<Vec<(String, bool)>, String> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|item| {
            let (name, setting) = item
                .split_once('=')
                .ok_or_else(|| format!("malformed pair {item:?}, expected Name=bool"))?;
            let setting = setting.trim();
            let enabled = parse_go_bool(setting)
                .map_err(|_| format!("invalid value of {}: {setting:?}", name.trim()))?;
            Ok((name.trim().to_owned(), enabled))
        })
        .collect()
}

/// `--leader-election-labels`: `key:value,key2:value2`, exactly one `:` per item.
fn parse_labels(value: &str) -> Result<Vec<(String, String)>, String> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|item| {
            let mut parts = item.split(':');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(key), Some(value), None) => Ok((key.to_owned(), value.to_owned())),
                _ => Err(format!("{item:?} is not a key:value pair")),
            }
        })
        .collect()
}

/// `--vmodule`: `pattern=N,...`; empty items are skipped.
fn parse_vmodule(value: &str) -> Result<Vec<(String, u32)>, String> {
    value
        .split(',')
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('=') {
            Some((pattern, level))
                if !pattern.is_empty() && !level.is_empty() && !level.contains('=') =>
            {
                let level = parse_decimal_u32(level)
                    .map_err(|_| format!("{item:?} does not have the pattern=N format"))?;
                Ok((pattern.to_owned(), level))
            }
            _ => Err(format!("{item:?} does not have the pattern=N format")),
        })
        .collect()
}

/// Checks a Kubernetes resource quantity (`0`, `64Ki`, `1.5M`, `1e3`) and says whether it is
/// zero.
fn quantity_is_zero(value: &str) -> Result<bool, String> {
    let bad = || {
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'".to_owned()
    };
    let unsigned = value.strip_prefix(['+', '-']).unwrap_or(value);
    let number_len = unsigned
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = unsigned.split_at(number_len);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix.strip_prefix(['e', 'E']).is_some_and(|exp| {
        parse_go_int(exp, 32).is_ok() && !exp.contains(['x', 'X', 'o', 'O', 'b', 'B', '_'])
    });
    if !suffix_ok {
        return Err(bad());
    }
    Ok(number.bytes().all(|b| b == b'0' || b == b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed, Error> {
        parse_from(
            std::iter::once("attacher-hub")
                .chain(args.iter().copied())
                .map(str::to_owned),
        )
    }

    fn run(args: &[&str]) -> (Args, Vec<String>) {
        match parse(args) {
            Ok(Parsed::Run(a, w)) => (*a, w),
            other => panic!("{args:?} should parse to Run, got {other:?}"),
        }
    }

    fn args(list: &[&str]) -> Args {
        run(list).0
    }

    fn err(args: &[&str]) -> Error {
        match parse(args) {
            Err(e) => e,
            other => panic!("{args:?} should fail, got {other:?}"),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn no_arguments_give_the_external_attacher_defaults() {
        assert_eq!(run(&[]), (Args::default(), vec![]));
        assert_eq!(parse_from(Vec::new()), parse(&[]));
    }

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

    #[test]
    fn single_and_double_dash_and_both_value_forms_are_equivalent() {
        for list in [
            &["-timeout=30s"][..],
            &["--timeout=30s"],
            &["-timeout", "30s"],
            &["--timeout", "30s"],
        ] {
            assert_eq!(args(list).timeout, secs(30), "{list:?}");
        }
    }

    #[test]
    fn a_space_separated_value_may_start_with_a_dash() {
        assert_eq!(
            args(&["--csi-address", "-weird"]).csi_address,
            "-weird".to_owned()
        );
        assert_eq!(
            args(&["--max-grpc-log-length", "-5"]).max_grpc_log_length,
            -5
        );
    }

    #[test]
    fn the_last_occurrence_of_a_flag_wins() {
        assert_eq!(args(&["-timeout=1s", "--timeout=2s"]).timeout, secs(2));
    }

    #[test]
    fn booleans_take_go_parse_bool_values_after_equals_only() {
        for (value, expected) in [
            ("true", true),
            ("True", true),
            ("TRUE", true),
            ("t", true),
            ("T", true),
            ("1", true),
            ("false", false),
            ("False", false),
            ("FALSE", false),
            ("f", false),
            ("F", false),
            ("0", false),
        ] {
            let flag = format!("--leader-election={value}");
            assert_eq!(args(&[&flag]).leader_election.enabled, expected, "{flag}");
        }
        assert!(args(&["-leader-election"]).leader_election.enabled);
        let e = err(&["--leader-election=yes"]);
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "invalid boolean value \"yes\" for -leader-election: parse error"
        );
        assert_eq!(err(&["--leader-election=tRue"]).exit_code(), 2);
        assert_eq!(err(&["--leader-election="]).exit_code(), 2);
    }

    #[test]
    fn a_boolean_followed_by_false_stops_flag_parsing() {
        let a = args(&["--leader-election", "false", "--timeout=1s", "--bogus"]);
        assert!(a.leader_election.enabled);
        assert_eq!(a.timeout, secs(15));
    }

    #[test]
    fn positional_arguments_and_double_dash_stop_parsing() {
        assert_eq!(args(&["x", "--timeout=1s"]).timeout, secs(15));
        assert_eq!(args(&["-", "--timeout=1s"]).timeout, secs(15));
        assert_eq!(args(&["--", "--bogus"]).timeout, secs(15));
        assert_eq!(
            args(&["--timeout=3s", "--", "--timeout=1s"]).timeout,
            secs(3)
        );
    }

    #[test]
    fn flag_syntax_errors_exit_2_with_go_messages() {
        for (list, message) in [
            (&["--bogus"][..], "flag provided but not defined: -bogus"),
            (&["-bogus=1"], "flag provided but not defined: -bogus"),
            (&["---timeout=1s"], "bad flag syntax: ---timeout=1s"),
            (&["-=x"], "bad flag syntax: -=x"),
            (&["--timeout"], "flag needs an argument: -timeout"),
            (
                &["--timeout=10"],
                "invalid value \"10\" for flag -timeout: parse error",
            ),
            (
                &["--worker-threads=-1"],
                "invalid value \"-1\" for flag -worker-threads: parse error",
            ),
            (
                &["--kube-api-burst=99999999999999999999"],
                "invalid value \"99999999999999999999\" for flag -kube-api-burst: value out of range",
            ),
        ] {
            let e = err(list);
            assert_eq!(e.exit_code(), 2, "{list:?}");
            assert_eq!(e.to_string(), message, "{list:?}");
            assert!(
                e.stderr_text().contains("Usage of attacher-hub:"),
                "{list:?}"
            );
        }
    }

    #[test]
    fn help_prints_usage_on_stderr_and_exits_0_but_earlier_errors_win() {
        for flag in ["-h", "--h", "-help", "--help"] {
            match parse(&["--timeout=1s", flag, "--bogus"]) {
                Ok(Parsed::Exit {
                    code: 0,
                    stdout,
                    stderr,
                }) => {
                    assert!(stdout.is_empty());
                    assert!(stderr.starts_with("Usage of attacher-hub:\n"));
                    assert!(stderr.contains("  -csi-address string\n    \tAddress"));
                    assert!(stderr.contains("(default \"/run/csi/socket\")"));
                    assert!(stderr.contains("(default 10m0s)"));
                    assert!(stderr.contains("  -v Level\n"));
                }
                other => panic!("{flag}: {other:?}"),
            }
        }
        assert_eq!(err(&["--bogus", "--help"]).exit_code(), 2);
    }

    #[test]
    fn version_prints_argv0_and_version() {
        let expected = Parsed::Exit {
            code: 0,
            stdout: format!("/attacher-hub v{}\n", env!("CARGO_PKG_VERSION")),
            stderr: String::new(),
        };
        for flag in ["--version", "-version", "--version=true"] {
            let argv = ["/attacher-hub", flag].map(str::to_owned);
            assert_eq!(parse_from(argv), Ok(expected.clone()), "{flag}");
        }
        assert!(matches!(parse(&["--version=false"]), Ok(Parsed::Run(..))));
        // Parse errors come first; validation after `--version` does not run.
        assert_eq!(err(&["--version", "--bogus"]).exit_code(), 2);
        assert!(matches!(
            parse(&["--version", "--worker-threads=0"]),
            Ok(Parsed::Exit { code: 0, .. })
        ));
    }

    #[test]
    fn go_durations_parse_like_time_parse_duration() {
        // Vectors checked against Go 1.26's time.ParseDuration.
        for (text, nanos) in [
            ("0", 0),
            ("-0", 0),
            ("+0", 0),
            ("1.5s", 1_500_000_000),
            ("-1m30s", -90_000_000_000),
            ("2h", 7_200_000_000_000),
            ("300ms", 300_000_000),
            (".5s", 500_000_000),
            ("5.s", 5_000_000_000),
            ("1µs", 1_000),
            ("1μs", 1_000),
            ("1us", 1_000),
            ("1ns", 1),
            ("1h1m1s", 3_661_000_000_000),
            ("9223372036ns", 9_223_372_036),
            ("-9223372036854775808ns", i64::MIN),
            ("1.0000000000000000001s", 1_000_000_000),
        ] {
            assert_eq!(parse_go_duration(text), Ok(nanos), "{text}");
        }
        for text in [
            "",
            "1",
            "1h1",
            "x",
            ".s",
            "1x",
            "1h 30m",
            "9223372036854775808ns",
            "-",
            "1.2.3s",
        ] {
            assert!(parse_go_duration(text).is_err(), "{text:?} should fail");
        }
        assert_eq!(
            parse_go_duration("1").unwrap_err().to_string(),
            "time: missing unit in duration \"1\""
        );
        assert_eq!(
            parse_go_duration("1d").unwrap_err().to_string(),
            "time: unknown unit \"d\" in duration \"1d\""
        );
    }

    #[test]
    fn duration_flags_accept_go_syntax_and_clamp_negatives_with_a_warning() {
        let a = args(&[
            "--resync=1m30s",
            "--retry-interval-start=500ms",
            "--retry-interval-max=0",
            "--reconcile-sync=2h",
            "--graceful-shutdown-timeout=1.5s",
        ]);
        assert_eq!(a.resync, secs(90));
        assert_eq!(a.retry_interval_start, Duration::from_millis(500));
        assert_eq!(a.retry_interval_max, Duration::ZERO);
        assert_eq!(a.reconcile_sync, secs(7200));
        assert_eq!(a.graceful_shutdown_timeout, Duration::from_millis(1500));
        let (a, warnings) = run(&["--timeout=-5s"]);
        assert_eq!(a.timeout, Duration::ZERO);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("-timeout"));
    }

    #[test]
    fn go_duration_display_matches_go() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(5), "5ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_millis(300), "300ms"),
            (Duration::from_millis(1500), "1.5s"),
            (secs(15), "15s"),
            (secs(90), "1m30s"),
            (secs(600), "10m0s"),
            (secs(7200), "2h0m0s"),
        ] {
            assert_eq!(GoDuration(d).to_string(), text);
        }
    }

    #[test]
    fn integers_parse_like_strconv_with_base_0() {
        for (text, value) in [
            ("0", 0),
            ("10", 10),
            ("010", 8),
            ("0x_1f", 31),
            ("0b101", 5),
            ("0o17", 15),
            ("1_000", 1000),
        ] {
            assert_eq!(parse_go_uint(text, 64), Ok(value), "{text}");
            assert_eq!(parse_go_int(text, 64), Ok(value as i64), "{text}");
        }
        assert_eq!(parse_go_int("-0x10", 64), Ok(-16));
        assert_eq!(parse_go_int("+5", 64), Ok(5));
        assert_eq!(parse_go_int("-9223372036854775808", 64), Ok(i64::MIN));
        assert_eq!(
            parse_go_int("9223372036854775808", 64),
            Err(RANGE_ERROR.to_owned())
        );
        for text in ["", "+5", "-1", "1__0", "_1", "1_", "0x", "08", "1.0"] {
            assert!(parse_go_uint(text, 64).is_err(), "{text:?}");
        }
        assert_eq!(
            parse_go_uint("18446744073709551616", 64),
            Err(RANGE_ERROR.to_owned())
        );
        assert_eq!(parse_decimal_u32("4294967296"), Err(RANGE_ERROR.to_owned()));
        assert_eq!(parse_go_float("1e3"), Ok(1000.0));
        assert_eq!(parse_go_float("1_000"), Ok(1000.0));
        assert_eq!(parse_go_float("inf"), Ok(f64::INFINITY));
        assert_eq!(parse_go_float("1e400"), Err(RANGE_ERROR.to_owned()));
        assert!(parse_go_float("fast").is_err());
    }

    #[test]
    fn numeric_flags() {
        let a = args(&[
            "--worker-threads=20",
            "--max-entries=100",
            "--max-grpc-log-length=0",
            "--kube-api-qps=50.5",
            "--kube-api-burst=100",
            "-v=5",
        ]);
        assert_eq!(a.worker_threads, 20);
        assert_eq!(a.max_entries, 100);
        assert_eq!(a.max_grpc_log_length, 0);
        assert_eq!(a.kube_api_qps, 50.5);
        assert_eq!(a.kube_api_burst, 100);
        assert_eq!(a.logging.verbosity, 5);
        assert_eq!(err(&["-v=-1"]).exit_code(), 2);
        assert_eq!(err(&["-v=x"]).exit_code(), 2);
    }

    #[test]
    fn worker_threads_zero_is_a_start_up_error() {
        let e = err(&["--worker-threads=0"]);
        assert_eq!(e, Error::ZeroWorkerThreads);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.to_string(),
            "Option -worker-threads must be greater than zero"
        );
    }

    #[test]
    fn every_number_is_accepted_at_its_bound_and_refused_above_it() {
        // (flag, the largest value accepted, the smallest refused, the bound as the usage
        // and the error show it)
        let cases: &[(&str, &str, &str, &str)] = &[
            ("worker-threads", "10000", "10001", "10000"),
            ("worker-threads", "10000", "1000000000", "10000"),
            ("max-entries", "2147483647", "2147483648", "2147483647"),
            (
                "max-grpc-log-length",
                "4294967295",
                "4294967296",
                "4294967295",
            ),
            ("kube-api-qps", "1e6", "1000000.5", "1000000"),
            ("kube-api-qps", "1e6", "+Inf", "1000000"),
            ("kube-api-qps", "1e6", "NaN", "1000000"),
            ("hub-kube-api-qps", "1000000", "1e7", "1000000"),
            ("kube-api-burst", "2000000", "2000001", "2000000"),
            ("hub-kube-api-burst", "2000000", "2000001", "2000000"),
            ("timeout", "24h", "24h0m0.000000001s", "24h"),
            ("resync", "24h", "25h", "24h"),
            ("retry-interval-start", "1440m", "2562047h", "24h"),
            ("retry-interval-max", "24h", "25h", "24h"),
            ("reconcile-sync", "24h", "25h", "24h"),
            ("graceful-shutdown-timeout", "24h", "25h", "24h"),
            ("log-flush-frequency", "24h", "25h", "24h"),
            ("leader-election-lease-duration", "24h", "25h", "24h"),
            ("leader-election-renew-deadline", "24h", "25h", "24h"),
            ("leader-election-retry-period", "24h", "25h", "24h"),
        ];
        assert_eq!(GoDuration(MAX_DURATION).to_string(), "24h0m0s");
        for &(flag, ok, bad, bound) in cases {
            let help = FLAGS
                .iter()
                .find(|f| f.name == flag)
                .map(|f| f.help)
                .expect("a known flag");
            assert!(
                help.contains(bound),
                "-{flag}: the usage shows the bound: {help}"
            );
            // Leader election off: only the bound applies, not the timing rules.
            assert!(
                matches!(parse(&[&format!("--{flag}={ok}")]), Ok(Parsed::Run(..))),
                "--{flag}={ok}"
            );
            let e = err(&[&format!("--{flag}={bad}")]);
            assert_eq!(e.exit_code(), 1, "--{flag}={bad}: {e}");
            assert!(
                matches!(e, Error::TooLarge { flag: f, .. } if f == flag),
                "--{flag}={bad}: {e:?}"
            );
        }
        assert_eq!(
            err(&["--worker-threads=1000000000"]).to_string(),
            "--worker-threads must be at most 10000, not 1000000000"
        );
        assert_eq!(
            err(&["--timeout=25h"]).to_string(),
            "--timeout must be at most 24h0m0s, not 25h0m0s"
        );
        assert_eq!(
            err(&["--kube-api-qps=Inf"]).to_string(),
            "--kube-api-qps must be at most 1000000, not inf"
        );
        // Go's own range errors keep exit 2.
        assert_eq!(
            err(&["--worker-threads=18446744073709551616"]).exit_code(),
            2
        );
        assert_eq!(err(&["--timeout=2562048h"]).exit_code(), 2);
        // Negative QPS (no limit) and negative log length (no cap) keep their meaning.
        assert_eq!(
            args(&["--kube-api-qps=-Inf"]).kube_api_qps,
            f64::NEG_INFINITY
        );
        assert_eq!(
            args(&["--max-grpc-log-length=-9223372036854775808"]).max_grpc_log_length,
            i64::MIN
        );
        let e = err(&["--max-entries=-1"]);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(e.to_string(), "--max-entries must not be negative, not -1");
    }

    #[test]
    fn a_lease_under_one_second_is_refused_when_leader_election_is_on() {
        let short = [
            "--leader-election-lease-duration=900ms",
            "--leader-election-renew-deadline=800ms",
            "--leader-election-retry-period=100ms",
        ];
        assert!(matches!(parse(&short), Ok(Parsed::Run(..))));
        let with: Vec<&str> = short.iter().copied().chain(["--leader-election"]).collect();
        let e = err(&with);
        assert_eq!(e, Error::LeaseDurationTooShort(Duration::from_millis(900)));
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.to_string(),
            "--leader-election-lease-duration (900ms) must be at least 1s: a Lease holds whole seconds"
        );
        assert!(
            args(&[
                "--leader-election",
                "--leader-election-lease-duration=1s",
                "--leader-election-renew-deadline=800ms",
                "--leader-election-retry-period=100ms",
            ])
            .leader_election
            .enabled
        );
    }

    #[test]
    fn the_hub_cap_is_off_by_default_and_negative_limits_are_refused() {
        let a = args(&[]);
        assert_eq!((a.hub_kube_api_qps, a.hub_kube_api_burst), (0.0, 0));
        let a = args(&["--hub-kube-api-qps=50", "--hub-kube-api-burst=100"]);
        assert_eq!((a.hub_kube_api_qps, a.hub_kube_api_burst), (50.0, 100));
        // A negative QPS keeps client-go's meaning: no limit.
        assert_eq!(args(&["--kube-api-qps=-1"]).kube_api_qps, -1.0);
        for (list, text) in [
            (
                &["--kube-api-burst=-1"][..],
                "--kube-api-burst must not be negative, not -1",
            ),
            (
                &["--hub-kube-api-qps=-2.5"][..],
                "--hub-kube-api-qps must not be negative, not -2.5",
            ),
            (
                &["--hub-kube-api-burst=-3"][..],
                "--hub-kube-api-burst must not be negative, not -3",
            ),
        ] {
            let e = err(list);
            assert_eq!(e.exit_code(), 1, "{list:?}");
            assert_eq!(e.to_string(), text);
        }
    }

    #[test]
    fn metrics_address_excludes_http_endpoint() {
        let e = err(&["--metrics-address=:8080", "--http-endpoint=:8081"]);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.to_string(),
            "Only one of `--metrics-address` and `--http-endpoint` can be set"
        );
        let a = args(&["--metrics-address=:9090"]);
        assert_eq!(a.http_address(), Some(":9090"));
        assert!(!a.serves_leader_election_health());
        let a = args(&["--http-endpoint=:8080"]);
        assert_eq!(a.http_address(), Some(":8080"));
        assert!(a.serves_leader_election_health());
        assert_eq!(Args::default().http_address(), None);
    }

    #[test]
    fn feature_gates() {
        let a = args(&["--feature-gates=ReleaseLeaderElectionOnExit=true"]);
        assert!(a.feature_gates.release_leader_election_on_exit);
        assert!(a.feature_gates.mutable_csi_node_allocatable_count);
        let a = args(&[
            "--feature-gates= ReleaseLeaderElectionOnExit = t ,MutableCSINodeAllocatableCount=false",
        ]);
        assert!(a.feature_gates.release_leader_election_on_exit);
        assert!(!a.feature_gates.mutable_csi_node_allocatable_count);
        // Repeated flags merge.
        let a = args(&[
            "--feature-gates=MutableCSINodeAllocatableCount=false",
            "--feature-gates=ReleaseLeaderElectionOnExit=true",
        ]);
        assert_eq!(
            a.feature_gates,
            FeatureGates {
                release_leader_election_on_exit: true,
                mutable_csi_node_allocatable_count: false,
            }
        );
        assert!(
            args(&["--feature-gates=AllAlpha=true"])
                .feature_gates
                .release_leader_election_on_exit
        );
        assert!(
            !args(&["--feature-gates=AllAlpha=true,ReleaseLeaderElectionOnExit=false"])
                .feature_gates
                .release_leader_election_on_exit
        );
        assert_eq!(
            args(&["--feature-gates=AllBeta=true"]).feature_gates,
            FeatureGates::default()
        );
        assert_eq!(
            args(&["--feature-gates="]).feature_gates,
            FeatureGates::default()
        );

        let e = err(&["--feature-gates=Bogus=true"]);
        assert_eq!(e, Error::UnknownFeatureGate("Bogus".to_owned()));
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            err(&["--feature-gates=ReleaseLeaderElectionOnExit"]).exit_code(),
            2
        );
        assert_eq!(
            err(&["--feature-gates=ReleaseLeaderElectionOnExit=maybe"]).exit_code(),
            2
        );
    }

    #[test]
    fn leader_election_labels_need_exactly_one_colon_per_item() {
        let a = args(&["--leader-election-labels=app:attacher,tier:storage"]);
        assert_eq!(
            a.leader_election.labels,
            BTreeMap::from([
                ("app".to_owned(), "attacher".to_owned()),
                ("tier".to_owned(), "storage".to_owned()),
            ])
        );
        for bad in ["a", "a:b:c", "a:b,", "a=b"] {
            let flag = format!("--leader-election-labels={bad}");
            assert_eq!(err(&[&flag]).exit_code(), 2, "{bad}");
        }
    }

    #[test]
    fn leader_election_timing_is_validated_only_when_enabled() {
        let ok = args(&[
            "--leader-election",
            "--leader-election-namespace=kube-system",
        ]);
        assert_eq!(ok.leader_election.namespace.as_deref(), Some("kube-system"));
        assert_eq!(ok.leader_election.lease_duration, secs(15));
        for (list, expected) in [
            (
                &["--leader-election-lease-duration=10s"][..],
                Error::LeaseNotLongerThanRenewDeadline {
                    lease_duration: secs(10),
                    renew_deadline: secs(10),
                },
            ),
            (
                &["--leader-election-retry-period=9s"],
                Error::RenewDeadlineNotLongerThanRetry {
                    renew_deadline: secs(10),
                    retry_period: secs(9),
                },
            ),
            (
                &["--leader-election-retry-period=-1s"],
                Error::LeaderElectionZero("retry-period"),
            ),
            (
                &[
                    "--leader-election-lease-duration=0",
                    "--leader-election-renew-deadline=0",
                ],
                Error::LeaseNotLongerThanRenewDeadline {
                    lease_duration: Duration::ZERO,
                    renew_deadline: Duration::ZERO,
                },
            ),
        ] {
            let with: Vec<&str> = list.iter().copied().chain(["--leader-election"]).collect();
            let e = err(&with);
            assert_eq!(e.exit_code(), 1);
            assert_eq!(e, expected, "{list:?}");
            assert!(matches!(parse(list), Ok(Parsed::Run(..))), "{list:?}");
        }
        // 10s > 1.2 × 8s = 9.6s
        assert!(
            args(&["--leader-election", "--leader-election-retry-period=8s"])
                .leader_election
                .enabled
        );
        assert_eq!(
            Error::LeaseNotLongerThanRenewDeadline {
                lease_duration: secs(10),
                renew_deadline: secs(90),
            }
            .to_string(),
            "--leader-election-lease-duration (10s) must be greater than --leader-election-renew-deadline (1m30s)"
        );
    }

    #[test]
    fn logging_flags() {
        let a = args(&[
            "--logging-format=json",
            "--log-flush-frequency=1s",
            "-v",
            "3",
        ]);
        assert_eq!(a.logging.format, telemetry::Format::Json);
        assert_eq!(a.logging.flush_frequency, secs(1));
        assert_eq!(a.logging.verbosity, 3);
        let (a, warnings) = run(&["--vmodule=controller*=5,,csi_handler=4"]);
        assert_eq!(
            a.logging.vmodule,
            vec![("controller*".to_owned(), 5), ("csi_handler".to_owned(), 4)]
        );
        assert_eq!(warnings.len(), 1);
        assert_eq!(err(&["--vmodule=x"]).exit_code(), 2);
        assert_eq!(err(&["--vmodule==3"]).exit_code(), 2);

        let e = err(&["--logging-format=xml"]);
        assert_eq!(e, Error::LoggingFormat("xml".to_owned()));
        assert_eq!(e.exit_code(), 1);
        let e = err(&["--logging-format=json", "--vmodule=a=1"]);
        assert_eq!(e, Error::VmoduleWithoutText);
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn alpha_logging_options_parse_then_fail_validation_unless_default() {
        for flag in [
            "--log-text-split-stream",
            "--log-json-split-stream=true",
            "--log-text-info-buffer-size=64Ki",
            "--log-json-info-buffer-size=1M",
        ] {
            let e = err(&[flag]);
            assert_eq!(e.exit_code(), 1, "{flag}");
            assert!(matches!(e, Error::AlphaLoggingOption(_)), "{flag}");
        }
        for flag in [
            "--log-text-split-stream=false",
            "--log-text-info-buffer-size=0",
            "--log-json-info-buffer-size=0Mi",
        ] {
            assert!(matches!(parse(&[flag]), Ok(Parsed::Run(..))), "{flag}");
        }
        for bad in [
            "--log-text-info-buffer-size=lots",
            "--log-json-split-stream=yes",
        ] {
            assert_eq!(err(&[bad]).exit_code(), 2, "{bad}");
        }
        assert_eq!(quantity_is_zero("1e3"), Ok(false));
        assert_eq!(quantity_is_zero("-0.0"), Ok(true));
        assert!(quantity_is_zero("1Xi").is_err());
    }

    #[test]
    fn legacy_klog_flags_are_accepted_with_one_warning_each() {
        let (a, warnings) = run(&[
            "--logtostderr",
            "--alsologtostderr=false",
            "--log_dir=/tmp",
            "--log_file",
            "/tmp/x.log",
            "--log_file_max_size=1800",
            "--stderrthreshold=INFO",
            "--skip_headers=true",
            "--skip_log_headers",
            "--add_dir_header",
            "--log_backtrace_at",
            "main.go:10",
            "--one_output",
            "--logtostderr=true",
            "--timeout=20s",
        ]);
        assert_eq!(a.timeout, secs(20));
        assert_eq!(warnings.len(), 11);
        assert!(warnings[0].contains("-logtostderr"));
        assert_eq!(err(&["--log_dir"]).exit_code(), 2);
    }

    #[test]
    fn hub_flags() {
        let a = args(&[
            "--config=/etc/hub/drivers.yaml",
            "--driver-sockets=/var/lib/kubelet/plugins/*/csi.sock",
            "--exit-on-connection-loss",
            "--graceful-shutdown-timeout=30s",
        ]);
        assert_eq!(a.config, Some(PathBuf::from("/etc/hub/drivers.yaml")));
        assert_eq!(
            a.driver_sockets.as_deref(),
            Some("/var/lib/kubelet/plugins/*/csi.sock")
        );
        assert!(a.exit_on_connection_loss);
        assert_eq!(a.graceful_shutdown_timeout, secs(30));
        assert!(!Args::default().exit_on_connection_loss);
    }

    #[test]
    fn automaxprocs_is_accepted_bare_or_with_a_value() {
        assert!(args(&["-automaxprocs"]).automaxprocs);
        assert!(!args(&["-automaxprocs=false"]).automaxprocs);
        assert!(args(&["-automaxprocs=anything"]).automaxprocs);
    }

    #[test]
    fn external_attacher_example_deployment_arguments_parse() {
        let a = args(&[
            "--v=5",
            "--csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock",
            "--leader-election",
            "--http-endpoint=:8080",
        ]);
        assert_eq!(a.logging.verbosity, 5);
        assert_eq!(a.csi_address, "/var/lib/csi/sockets/pluginproxy/csi.sock");
        assert!(a.leader_election.enabled);
        assert_eq!(a.http_endpoint.as_deref(), Some(":8080"));
    }

    #[test]
    fn old_manifest_arguments_parse_with_a_klog_warning() {
        let (a, warnings) = run(&[
            "--v=5",
            "--csi-address=/csi/csi.sock",
            "--leader-election=true",
            "--retry-interval-start=500ms",
            "--logtostderr",
        ]);
        assert_eq!(a.logging.verbosity, 5);
        assert_eq!(a.csi_address, "/csi/csi.sock");
        assert!(a.leader_election.enabled);
        assert_eq!(a.retry_interval_start, Duration::from_millis(500));
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn v4_12_manifest_arguments_parse() {
        let (a, warnings) = run(&[
            "-v=2",
            "-csi-address=/csi/csi.sock",
            "-leader-election",
            "-leader-election-namespace=kube-system",
            "-http-endpoint=:8080",
            "-timeout=60s",
            "-worker-threads=20",
            "-kube-api-qps=50",
            "-kube-api-burst=100",
            "-feature-gates=ReleaseLeaderElectionOnExit=true",
            "-automaxprocs",
        ]);
        assert!(warnings.is_empty());
        assert_eq!(a.logging.verbosity, 2);
        assert_eq!(a.csi_address, "/csi/csi.sock");
        assert!(a.leader_election.enabled);
        assert_eq!(a.leader_election.namespace.as_deref(), Some("kube-system"));
        assert_eq!(a.http_endpoint.as_deref(), Some(":8080"));
        assert_eq!(a.timeout, secs(60));
        assert_eq!(a.worker_threads, 20);
        assert_eq!(a.kube_api_qps, 50.0);
        assert_eq!(a.kube_api_burst, 100);
        assert!(a.feature_gates.release_leader_election_on_exit);
        assert!(a.automaxprocs);
    }
}
