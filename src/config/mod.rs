//! Hub mode's driver list (`--config drivers.yaml`): plain `serde` types for the file, checked
//! into one [`crate::hub::driver::Settings`] per driver, with the command-line flags as defaults.
//!
//! Every error names the file, the line and column, and the field, e.g.
//! `drivers.yaml:7:5: drivers[1].timeout: invalid duration "15": missing unit`.
//! The types below are parser-neutral `serde`; only [`parse`] knows the YAML parser, which it
//! also uses to index where each field sits in the text.
//!
//! Everything is bounded before anything is allocated for it: the file's size
//! ([`MAX_FILE_BYTES`]), its encoding (UTF-8; the first invalid byte is named with its line and
//! column), the YAML structure (nesting, nodes, anchors and alias expansion: the `yaml` module's
//! budget), the number of drivers ([`MAX_DRIVERS`]) and of workers ([`MAX_HUB_WORKERS`]), and
//! every number (the same bounds as the flags': [`cli::MAX_WORKERS`], [`cli::MAX_DURATION`],
//! [`cli::MAX_API_QPS`], [`cli::MAX_API_BURST`], [`cli::MAX_LIST_ENTRIES`]).

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Deserializer, de};

use crate::{
    cli::{self, Args, DurationError, GoDuration},
    csi::Address,
    hub::driver::{LeaderSettings, Settings},
    k8s::budget::Limit,
    leader,
};

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

// === bounds ===

/// Largest `drivers.yaml` read, in bytes. A ConfigMap holds at most 1 MiB, and a thousand
/// fully commented entries like `drivers.example.yaml`'s first one take about 4 MiB; a larger
/// file is not a driver list, and reading no more than this keeps a mistaken path (a log, a
/// disk image) from filling memory.
pub const MAX_FILE_BYTES: usize = 4 << 20;

/// Most entries under `drivers:`. Clusters run a handful of CSI drivers, the largest a few
/// dozen; each entry costs a connection, a Lease and three worker pools.
pub const MAX_DRIVERS: usize = 1_000;

/// Most workers of all the file's drivers together (attach, detach and PersistentVolume pools).
/// [`cli::MAX_WORKERS`] bounds one pool; this bounds their sum, so that a thousand drivers with
/// large pools cannot start millions of tasks: a hundred drivers with the default ten workers
/// run 3,000.
pub const MAX_HUB_WORKERS: u64 = 100_000;

// === the file ===

/// The whole `drivers.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct File {
    /// The drivers to serve; at least one unless discovery (`--driver-sockets`) is used.
    #[serde(default)]
    pub drivers: Vec<DriverEntry>,
    /// `--hub-kube-api-qps`: the optional cap of the whole process's API request rate.
    pub hub_kube_api_qps: Option<f64>,
    /// `--hub-kube-api-burst`: burst of that cap.
    pub hub_kube_api_burst: Option<i64>,
}

/// What a driver file configures, with the flags' defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// One entry per driver, in file order.
    pub drivers: Vec<Settings>,
    /// The process-wide API cap ([`Limit::Unlimited`]: none).
    pub hub_api_cap: Limit,
}

/// One entry of `drivers:`. Every field but `address` is optional; a missing field takes the
/// value of the corresponding command-line flag.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DriverEntry {
    /// The driver socket: `unix:///path` or `/path` (absolute).
    pub address: String,
    /// The name the driver must report in `GetPluginInfo`.
    pub name: Option<String>,
    /// `--timeout`, as a Go duration (`15s`).
    pub timeout: Option<String>,
    /// `--worker-threads`: one number for both pools, or one per pool.
    pub worker_threads: Option<WorkerThreads>,
    /// `--retry-interval-start`, as a Go duration.
    pub retry_interval_start: Option<String>,
    /// `--retry-interval-max`, as a Go duration.
    pub retry_interval_max: Option<String>,
    /// `--reconcile-sync`, as a Go duration.
    pub reconcile_sync: Option<String>,
    /// `--max-entries` (0 = no limit).
    pub max_entries: Option<i64>,
    /// `--default-fstype` (empty = leave the PV's fsType empty).
    pub default_fstype: Option<String>,
    /// `--kube-api-qps` for this driver: requests per second of its own API budget (negative:
    /// no limit).
    pub kube_api_qps: Option<f64>,
    /// `--kube-api-burst` for this driver: burst of its own API budget.
    pub kube_api_burst: Option<i64>,
    /// `--leader-election*` for this driver.
    pub leader_election: Option<LeaderElection>,
}

/// `workerThreads:` either `4` (4 attach and 4 detach workers) or `{attach: 4, detach: 2}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerThreads {
    /// The same count for the attach and the detach pool.
    Both(i64),
    /// A count per pool.
    Pools(WorkerPools),
}

/// `workerThreads: {attach: N, detach: M}`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerPools {
    /// Workers for attaches (and PVs).
    pub attach: i64,
    /// Workers for detaches.
    pub detach: i64,
}

/// `leaderElection:` either `true`/`false`, or an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderElection {
    /// On with the flags' settings, or off.
    Enabled(bool),
    /// On (unless `enabled: false`) with some settings overridden.
    Settings(LeaderElectionSettings),
}

/// `leaderElection: {enabled, namespace, leaseDuration, renewDeadline, retryPeriod, labels}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaderElectionSettings {
    /// Default `true`: writing the object turns leader election on.
    pub enabled: Option<bool>,
    /// `--leader-election-namespace`.
    pub namespace: Option<String>,
    /// `--leader-election-lease-duration`, as a Go duration.
    pub lease_duration: Option<String>,
    /// `--leader-election-renew-deadline`, as a Go duration.
    pub renew_deadline: Option<String>,
    /// `--leader-election-retry-period`, as a Go duration.
    pub retry_period: Option<String>,
    /// `--leader-election-labels`; replaces the flag's labels for this driver.
    pub labels: Option<BTreeMap<String, String>>,
}

impl<'de> Deserialize<'de> for WorkerThreads {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = WorkerThreads;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of workers, or {attach: N, detach: M}")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(WorkerThreads::Both(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(WorkerThreads::Both)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                WorkerPools::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(WorkerThreads::Pools)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl<'de> Deserialize<'de> for LeaderElection {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = LeaderElection;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false, or {enabled, namespace, leaseDuration, renewDeadline, retryPeriod, labels}")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(LeaderElection::Enabled(v))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                LeaderElectionSettings::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(LeaderElection::Settings)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

// === errors ===

/// Why the driver list was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{}: cannot be read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML, does not match the schema, or holds an invalid value.
    #[error("{file}:{line}:{column}: {}{problem}", field_prefix(.field.as_deref()))]
    Invalid {
        /// The file, as given on the command line.
        file: String,
        /// 1-based line of the offending key, entry or token.
        line: u64,
        /// 1-based column.
        column: u64,
        /// The field path (`drivers[1].timeout`); `None` for syntax errors.
        field: Option<String>,
        /// What is wrong (boxed: keeps `Result`s small).
        problem: Box<Problem>,
    },
}

fn field_prefix(field: Option<&str>) -> String {
    field.map(|f| format!("{f}: ")).unwrap_or_default()
}

/// What is wrong with a field (the part of an [`Error::Invalid`] after the field path).
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Problem {
    /// Not YAML, or not the expected shape (the parser's own words).
    #[error("{0}")]
    Syntax(String),
    /// Longer than [`MAX_FILE_BYTES`]; the position is where the limit was passed.
    #[error("the file is longer than {max} bytes, the most a driver list may have")]
    TooLong {
        /// [`MAX_FILE_BYTES`].
        max: usize,
    },
    /// Not UTF-8; the position is that of the first invalid byte.
    #[error("not UTF-8: invalid byte 0x{byte:02x}")]
    NotUtf8 {
        /// The first invalid byte.
        byte: u8,
    },
    /// More entries than [`MAX_DRIVERS`]; the position is the first one too many.
    #[error("more than {max} drivers")]
    TooManyDrivers {
        /// [`MAX_DRIVERS`].
        max: usize,
    },
    /// The drivers up to this one run more workers than [`MAX_HUB_WORKERS`].
    #[error(
        "the drivers up to this one run {total} workers in all (attach, detach and PersistentVolume pools), more than {max}"
    )]
    TooManyWorkers {
        /// Workers of the drivers up to and including this one.
        total: u64,
        /// [`MAX_HUB_WORKERS`].
        max: u64,
    },
    /// No `drivers`, or an empty list, without discovery.
    #[error("at least one driver is required")]
    NoDrivers,
    /// Not a Unix socket address with an absolute path.
    #[error("invalid address {0:?}: must be unix:///absolute/path or /absolute/path")]
    Address(String),
    /// An empty string where a value is needed.
    #[error("must not be empty")]
    Empty,
    /// Not a Go duration.
    #[error("invalid duration {value:?}{}", duration_reason(reason))]
    Duration {
        /// The value as written.
        value: String,
        /// Why it is not a duration.
        reason: DurationError,
    },
    /// Zero or negative where only positive values make sense.
    #[error("must be greater than zero, not {0}")]
    NotPositive(String),
    /// Negative where zero means "off".
    #[error("must not be negative, not {0}")]
    Negative(String),
    /// `kubeApiQps: 0`, which client-go would read as its default of 5.
    #[error(
        "must not be {0}: write the requests per second (the client-go default is 5), or a negative number for no limit"
    )]
    ZeroQps(String),
    /// A number above the bound of the setting (see the `MAX_*` constants of [`cli`]).
    #[error("must be at most {max}, not {value}")]
    TooLarge {
        /// The value (durations as written, numbers as read).
        value: String,
        /// The bound.
        max: String,
    },
    /// A lease duration under [`cli::MIN_LEASE_DURATION`].
    #[error("must be at least 1s, not {0}: a Lease holds whole seconds")]
    LeaseTooShort(String),
    /// `retryIntervalMax` below `retryIntervalStart` (after defaults are applied).
    #[error(
        "retryIntervalMax ({}) must not be less than retryIntervalStart ({})",
        GoDuration(*max),
        GoDuration(*start)
    )]
    RetryMaxBelowStart {
        /// First retry delay.
        start: Duration,
        /// Cap of the retry delay.
        max: Duration,
    },
    /// The Lease would expire before the leader gives up renewing it.
    #[error(
        "leaseDuration ({}) must be greater than renewDeadline ({})",
        GoDuration(*lease_duration),
        GoDuration(*renew_deadline)
    )]
    LeaseNotLongerThanRenewDeadline {
        /// Lease duration in effect.
        lease_duration: Duration,
        /// Renew deadline in effect.
        renew_deadline: Duration,
    },
    /// The leader would give up before its last retry could succeed.
    #[error(
        "renewDeadline ({}) must be greater than 1.2 × retryPeriod ({})",
        GoDuration(*renew_deadline),
        GoDuration(*retry_period)
    )]
    RenewDeadlineNotLongerThanRetry {
        /// Renew deadline in effect.
        renew_deadline: Duration,
        /// Retry period in effect.
        retry_period: Duration,
    },
    /// Two entries for one socket.
    #[error("socket {address} is already the address of {other} (line {other_line})")]
    DuplicateAddress {
        /// The socket.
        address: Address,
        /// The earlier entry (`drivers[0]`).
        other: String,
        /// Its line.
        other_line: u64,
    },
    /// Two entries expecting the same driver name.
    #[error("driver name {name:?} is already configured for {other} (line {other_line})")]
    DuplicateName {
        /// The name.
        name: String,
        /// The earlier entry.
        other: String,
        /// Its line.
        other_line: u64,
    },
    /// Two different names that sanitize alike, so the drivers would share finalizer and Lease.
    #[error(
        "driver names {name:?} and {other_name:?} ({other}, line {other_line}) both use the finalizer {finalizer:?}"
    )]
    SanitizedNameCollision {
        /// This entry's name.
        name: String,
        /// The earlier entry's name.
        other_name: String,
        /// The earlier entry.
        other: String,
        /// Its line.
        other_line: u64,
        /// The shared finalizer.
        finalizer: String,
    },
}

fn duration_reason(reason: &DurationError) -> String {
    match reason {
        DurationError::Invalid(_) => String::new(),
        DurationError::MissingUnit(_) => ": missing unit".to_owned(),
        DurationError::UnknownUnit { unit, .. } => format!(": unknown unit {unit:?}"),
    }
}

/// A problem at a field path, before it is placed in the text ([`File::validate`]'s error).
#[derive(Debug, PartialEq)]
pub struct Invalid {
    /// The field path, e.g. `drivers[1].timeout`; the location of the nearest written
    /// ancestor is used when the field itself is absent from the file.
    pub field: String,
    /// What is wrong (boxed: keeps `Result`s small).
    pub problem: Box<Problem>,
}

// === defaults ===

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
    kube_api_qps: f64,
    kube_api_burst: u32,
    hub_api_cap: Limit,
    leader_election: cli::LeaderElection,
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

    fn leader_settings(&self, namespace: Option<&str>) -> LeaderSettings {
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

// === validation ===

/// `client-go`'s leader-election jitter factor.
const LEADER_ELECTION_JITTER_FACTOR: f64 = 1.2;

impl File {
    /// Checks every entry and applies `defaults` to what it leaves out. `discovery`: drivers
    /// also come from `--driver-sockets`, so an empty list is fine. Pure: the places of the
    /// problems are filled in by [`parse`].
    pub fn validate(&self, defaults: &Defaults, discovery: bool) -> Result<Config, Invalid> {
        if self.drivers.is_empty() && !discovery {
            return Err(invalid("drivers", Problem::NoDrivers));
        }
        if self.drivers.len() > MAX_DRIVERS {
            return Err(invalid(
                format!("drivers[{MAX_DRIVERS}]"),
                Problem::TooManyDrivers { max: MAX_DRIVERS },
            ));
        }
        let drivers: Vec<Settings> = self
            .drivers
            .iter()
            .enumerate()
            .map(|(i, entry)| entry.validate(&format!("drivers[{i}]"), defaults))
            .collect::<Result<_, _>>()?;
        let mut total: u64 = 0;
        for (i, d) in drivers.iter().enumerate() {
            // Each count is at most `cli::MAX_WORKERS`: no overflow.
            total += 2 * d.attach_workers as u64 + d.detach_workers as u64;
            if total > MAX_HUB_WORKERS {
                return Err(invalid(
                    format!("drivers[{i}].workerThreads"),
                    Problem::TooManyWorkers {
                        total,
                        max: MAX_HUB_WORKERS,
                    },
                ));
            }
        }
        Ok(Config {
            drivers,
            hub_api_cap: self.hub_api_cap(defaults)?,
        })
    }

    /// `hubKubeApiQps`/`hubKubeApiBurst`, each defaulting to its flag.
    fn hub_api_cap(&self, defaults: &Defaults) -> Result<Limit, Invalid> {
        if self.hub_kube_api_qps.is_none() && self.hub_kube_api_burst.is_none() {
            return Ok(defaults.hub_api_cap);
        }
        let (flag_qps, flag_burst) = match defaults.hub_api_cap {
            Limit::Unlimited => (0.0, 0),
            Limit::Rate { qps, burst } => (qps, burst),
        };
        let qps = match self.hub_kube_api_qps {
            None => flag_qps,
            Some(q) if q < 0.0 => {
                return Err(invalid("hubKubeApiQps", Problem::Negative(q.to_string())));
            }
            Some(q) => qps_at_most_max("hubKubeApiQps", q)?,
        };
        let burst = match self.hub_kube_api_burst {
            None if self.hub_kube_api_qps.is_some() => 0,
            None => flag_burst,
            Some(b) => bounded("hubKubeApiBurst", b, 0, cli::MAX_API_BURST)?,
        };
        Ok(Limit::cap(qps, burst))
    }
}

fn invalid(field: impl Into<String>, problem: Problem) -> Invalid {
    Invalid {
        field: field.into(),
        problem: Box::new(problem),
    }
}

/// `value` within `min..=max` (`min` 0 or 1, `max` at most `u32::MAX`), as a `u32`.
fn bounded(field: &str, value: i64, min: i64, max: i64) -> Result<u32, Invalid> {
    let problem = if value < min {
        if min == 0 {
            Problem::Negative(value.to_string())
        } else {
            Problem::NotPositive(value.to_string())
        }
    } else if value > max {
        Problem::TooLarge {
            value: value.to_string(),
            max: max.to_string(),
        }
    } else {
        // Within `min..=max`, so within `u32`.
        return Ok(u32::try_from(value).unwrap_or(u32::MAX));
    };
    Err(invalid(field, problem))
}

/// A QPS not above [`cli::MAX_API_QPS`] (NaN and infinity are above it).
fn qps_at_most_max(field: &str, qps: f64) -> Result<f64, Invalid> {
    if qps <= cli::MAX_API_QPS {
        Ok(qps)
    } else {
        Err(invalid(
            field,
            Problem::TooLarge {
                value: qps.to_string(),
                max: cli::MAX_API_QPS.to_string(),
            },
        ))
    }
}

impl DriverEntry {
    fn validate(&self, at: &str, defaults: &Defaults) -> Result<Settings, Invalid> {
        let field = |name: &str| format!("{at}.{name}");
        let address = self
            .address
            .parse::<Address>()
            .ok()
            .filter(|a| a.path().is_absolute())
            .ok_or_else(|| invalid(field("address"), Problem::Address(self.address.clone())))?;
        let mut s = defaults.settings_for(address);
        if let Some(name) = &self.name {
            if name.is_empty() {
                return Err(invalid(field("name"), Problem::Empty));
            }
            s.expected_name = Some(name.clone());
        }
        let duration = |name: &str, value: &Option<String>, default: Duration| {
            value
                .as_deref()
                .map_or(Ok(default), |v| positive_duration(&field(name), v))
        };
        s.timeout = duration("timeout", &self.timeout, s.timeout)?;
        s.retry_interval_start = duration(
            "retryIntervalStart",
            &self.retry_interval_start,
            s.retry_interval_start,
        )?;
        s.retry_interval_max = duration(
            "retryIntervalMax",
            &self.retry_interval_max,
            s.retry_interval_max,
        )?;
        if s.retry_interval_max < s.retry_interval_start {
            let name = if self.retry_interval_max.is_some() {
                "retryIntervalMax"
            } else {
                "retryIntervalStart"
            };
            return Err(invalid(
                field(name),
                Problem::RetryMaxBelowStart {
                    start: s.retry_interval_start,
                    max: s.retry_interval_max,
                },
            ));
        }
        s.reconcile_sync = duration("reconcileSync", &self.reconcile_sync, s.reconcile_sync)?;
        match &self.worker_threads {
            None => {}
            Some(WorkerThreads::Both(n)) => {
                let n = workers(&field("workerThreads"), *n)?;
                (s.attach_workers, s.detach_workers) = (n, n);
            }
            Some(WorkerThreads::Pools(p)) => {
                s.attach_workers = workers(&field("workerThreads.attach"), p.attach)?;
                s.detach_workers = workers(&field("workerThreads.detach"), p.detach)?;
            }
        }
        if let Some(n) = self.max_entries {
            let n = bounded(&field("maxEntries"), n, 0, cli::MAX_LIST_ENTRIES)?;
            // At most `MAX_LIST_ENTRIES`, which is `i32::MAX`.
            s.max_entries = i32::try_from(n).unwrap_or(i32::MAX);
        }
        if let Some(fstype) = &self.default_fstype {
            s.default_fstype = fstype.clone();
        }
        if self.kube_api_qps.is_some() || self.kube_api_burst.is_some() {
            let qps = match self.kube_api_qps {
                None => defaults.kube_api_qps,
                // 0 would silently mean client-go's default of 5: ask for what is meant.
                Some(q) if q == 0.0 => {
                    return Err(invalid(
                        field("kubeApiQps"),
                        Problem::ZeroQps(q.to_string()),
                    ));
                }
                // Negative: no limit, as client-go reads it.
                Some(q) => qps_at_most_max(&field("kubeApiQps"), q)?,
            };
            let burst = match self.kube_api_burst {
                None => defaults.kube_api_burst,
                Some(b) => bounded(&field("kubeApiBurst"), b, 1, cli::MAX_API_BURST)?,
            };
            s.api_budget = Limit::client_go(qps, burst);
        }
        if let Some(le) = &self.leader_election {
            s.leader_election = leader_election(&field("leaderElection"), le, defaults)?;
        }
        Ok(s)
    }
}

/// A worker count in `1..=cli::MAX_WORKERS`.
fn workers(field: &str, n: i64) -> Result<usize, Invalid> {
    let max = i64::try_from(cli::MAX_WORKERS).unwrap_or(i64::MAX);
    let n = bounded(field, n, 1, max)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// A Go duration greater than zero and at most [`cli::MAX_DURATION`].
fn positive_duration(field: &str, value: &str) -> Result<Duration, Invalid> {
    let nanos = cli::parse_go_duration(value).map_err(|reason| {
        invalid(
            field,
            Problem::Duration {
                value: value.to_owned(),
                reason,
            },
        )
    })?;
    match u64::try_from(nanos) {
        Ok(n) if n > 0 => {
            let d = Duration::from_nanos(n);
            if d > cli::MAX_DURATION {
                let max = GoDuration(cli::MAX_DURATION).to_string();
                let value = value.to_owned();
                return Err(invalid(field, Problem::TooLarge { value, max }));
            }
            Ok(d)
        }
        _ => Err(invalid(field, Problem::NotPositive(value.to_owned()))),
    }
}

fn leader_election(
    at: &str,
    le: &LeaderElection,
    defaults: &Defaults,
) -> Result<Option<LeaderSettings>, Invalid> {
    let flags = &defaults.leader_election;
    let o = match le {
        LeaderElection::Enabled(false) => return Ok(None),
        LeaderElection::Enabled(true) => &LeaderElectionSettings::default(),
        LeaderElection::Settings(o) => o,
    };
    let field = |name: &str| format!("{at}.{name}");
    let duration = |name: &str, value: &Option<String>, default: Duration| {
        value
            .as_deref()
            .map_or(Ok(default), |v| positive_duration(&field(name), v))
    };
    let lease_duration = duration("leaseDuration", &o.lease_duration, flags.lease_duration)?;
    let renew_deadline = duration("renewDeadline", &o.renew_deadline, flags.renew_deadline)?;
    let retry_period = duration("retryPeriod", &o.retry_period, flags.retry_period)?;
    if o.namespace.as_deref() == Some("") {
        return Err(invalid(field("namespace"), Problem::Empty));
    }
    if o.enabled == Some(false) {
        return Ok(None);
    }
    // The field to blame: the first of `candidates` written in the file, else the object.
    let blame = |candidates: [(&str, bool); 2]| {
        candidates
            .iter()
            .find(|(_, written)| *written)
            .map_or_else(|| at.to_owned(), |(name, _)| field(name))
    };
    if lease_duration <= renew_deadline {
        return Err(invalid(
            blame([
                ("leaseDuration", o.lease_duration.is_some()),
                ("renewDeadline", o.renew_deadline.is_some()),
            ]),
            Problem::LeaseNotLongerThanRenewDeadline {
                lease_duration,
                renew_deadline,
            },
        ));
    }
    // Go truncates the product to whole nanoseconds.
    let jittered_retry = (LEADER_ELECTION_JITTER_FACTOR * retry_period.as_nanos() as f64) as u128;
    if renew_deadline.as_nanos() <= jittered_retry {
        return Err(invalid(
            blame([
                ("renewDeadline", o.renew_deadline.is_some()),
                ("retryPeriod", o.retry_period.is_some()),
            ]),
            Problem::RenewDeadlineNotLongerThanRetry {
                renew_deadline,
                retry_period,
            },
        ));
    }
    if lease_duration < cli::MIN_LEASE_DURATION {
        let blamed = match o.lease_duration {
            Some(_) => field("leaseDuration"),
            None => at.to_owned(),
        };
        let problem = Problem::LeaseTooShort(GoDuration(lease_duration).to_string());
        return Err(invalid(blamed, problem));
    }
    let mut settings =
        defaults.leader_settings(o.namespace.as_deref().or(flags.namespace.as_deref()));
    settings.lease_duration = lease_duration;
    settings.renew_deadline = renew_deadline;
    settings.retry_period = retry_period;
    if let Some(labels) = &o.labels {
        settings.labels = labels.clone();
    }
    Ok(Some(settings))
}

/// Refuses two entries for one socket, one name, or two names that share a finalizer.
fn check_unique(settings: &[Settings]) -> Result<(), (Invalid, usize)> {
    let mut addresses: HashMap<&Address, usize> = HashMap::new();
    let mut names: HashMap<String, (usize, &str)> = HashMap::new();
    for (i, s) in settings.iter().enumerate() {
        if let Some(&other) = addresses.get(&s.address) {
            let problem = Problem::DuplicateAddress {
                address: s.address.clone(),
                other: format!("drivers[{other}]"),
                other_line: 0,
            };
            return Err((invalid(format!("drivers[{i}].address"), problem), other));
        }
        addresses.insert(&s.address, i);
        let Some(name) = s.expected_name.as_deref() else {
            continue;
        };
        let sanitized = crate::names::sanitize_driver_name(name);
        if let Some(&(other_index, other_name)) = names.get(&sanitized) {
            let at = format!("drivers[{i}].name");
            let (other, other_line) = (format!("drivers[{other_index}]"), 0);
            let problem = if other_name == name {
                Problem::DuplicateName {
                    name: name.to_owned(),
                    other,
                    other_line,
                }
            } else {
                Problem::SanitizedNameCollision {
                    name: name.to_owned(),
                    other_name: other_name.to_owned(),
                    other,
                    other_line,
                    finalizer: format!("{}{sanitized}", crate::names::FINALIZER_PREFIX),
                }
            };
            return Err((invalid(at, problem), other_index));
        }
        names.insert(sanitized, (i, name));
    }
    Ok(())
}

// === loading ===

/// Reads, parses and validates the driver list at `path`. `discovery`: see [`File::validate`].
/// Reads at most one byte more than [`MAX_FILE_BYTES`].
pub fn load(path: &Path, defaults: &Defaults, discovery: bool) -> Result<Config> {
    use std::io::Read as _;
    let read_error = |source| Error::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    parse_bytes(&bytes, &path.display().to_string(), defaults, discovery)
}

/// Checks that `bytes` are UTF-8, then [`parse`]s them; the first invalid byte is named with its
/// line and column.
pub fn parse_bytes(
    bytes: &[u8],
    file_label: &str,
    defaults: &Defaults,
    discovery: bool,
) -> Result<Config> {
    check_size(bytes, file_label)?;
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        invalid_text(file_label, bytes, at, Problem::NotUtf8 { byte: bytes[at] })
    })?;
    parse(text, file_label, defaults, discovery)
}

/// Refuses more than [`MAX_FILE_BYTES`], at the position of the first byte too many.
fn check_size(bytes: &[u8], file_label: &str) -> Result<()> {
    if bytes.len() > MAX_FILE_BYTES {
        let problem = Problem::TooLong {
            max: MAX_FILE_BYTES,
        };
        return Err(invalid_text(file_label, bytes, MAX_FILE_BYTES, problem));
    }
    Ok(())
}

/// An error at byte `offset` of `bytes`, placed by [`position_of`].
fn invalid_text(file_label: &str, bytes: &[u8], offset: usize, problem: Problem) -> Error {
    let (line, column) = position_of(bytes, offset);
    Error::Invalid {
        file: file_label.to_owned(),
        line,
        column,
        field: None,
        problem: Box::new(problem),
    }
}

/// The 1-based line and column of byte `offset`: lines end at `\n`, `\r\n` or a lone `\r`
/// (as in YAML), and columns count characters (as the YAML parser's positions do), the bytes
/// before `offset` read as UTF-8 (an invalid sequence counts as one character).
fn position_of(bytes: &[u8], offset: usize) -> Pos {
    let offset = offset.min(bytes.len());
    let mut line: u64 = 1;
    let mut line_start = 0;
    for (i, &b) in bytes[..offset].iter().enumerate() {
        let ends_line = b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n'));
        if ends_line {
            line += 1;
            line_start = i + 1;
        }
    }
    let column = String::from_utf8_lossy(&bytes[line_start..offset])
        .chars()
        .count() as u64
        + 1;
    (line, column)
}

/// Parses and validates a driver list; `file_label` names the file in errors.
pub fn parse(text: &str, file_label: &str, defaults: &Defaults, discovery: bool) -> Result<Config> {
    let error = |(line, column): Pos, field: Option<String>, problem: Problem| Error::Invalid {
        file: file_label.to_owned(),
        line,
        column,
        field,
        problem: Box::new(problem),
    };
    check_size(text.as_bytes(), file_label)?;
    // Syntax first, on a schema-free tree: it also tells where every field is.
    let index =
        yaml::index(text).map_err(|(pos, message)| error(pos, None, Problem::Syntax(message)))?;
    let file: File = serde_saphyr::from_str_with_options(text, yaml::options()).map_err(|e| {
        let (pos, field) = index.locate_error(&e);
        error(pos, field, Problem::Syntax(yaml::message(&e)))
    })?;
    let place =
        |Invalid { field, problem }: Invalid| error(index.position(&field), Some(field), *problem);
    let config = file.validate(defaults, discovery).map_err(place)?;
    check_unique(&config.drivers).map_err(|(mut bad, other)| {
        let other_line = index.position(&format!("drivers[{other}]")).0;
        match bad.problem.as_mut() {
            Problem::DuplicateAddress { other_line: l, .. }
            | Problem::DuplicateName { other_line: l, .. }
            | Problem::SanitizedNameCollision { other_line: l, .. } => *l = other_line,
            _ => {}
        }
        place(bad)
    })?;
    Ok(config)
}

/// A 1-based (line, column).
type Pos = (u64, u64);

/// Where things are in the YAML text; the only part of this module that knows the parser.
mod yaml {
    use std::{borrow::Cow, fmt};

    use serde::{Deserialize, Deserializer, de};
    use serde_saphyr::{Location, MessageFormatter, Spanned, UserMessageFormatter};

    use super::Pos;

    /// A schema-free YAML tree with the location of every key and value.
    enum Node {
        Map(Vec<(Spanned<Key>, Spanned<Node>)>),
        Seq(Vec<Spanned<Node>>),
        Scalar,
    }

    /// A mapping key as text (non-string keys are kept as their rendering).
    struct Key(String);

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl de::Visitor<'_> for V {
                type Value = Key;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a mapping key")
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                    // Control characters (a quoted "a\nb") escaped: error messages stay on one line.
                    Ok(Key(v
                        .chars()
                        .map(|c| {
                            if c.is_control() {
                                c.escape_default().to_string()
                            } else {
                                c.to_string()
                            }
                        })
                        .collect()))
                }
                fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                    Ok(Key(v.to_string()))
                }
                fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                    Ok(Key(v.to_string()))
                }
                fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                    Ok(Key(v.to_string()))
                }
                fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                    Ok(Key(v.to_string()))
                }
                fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                    Ok(Key("~".to_owned()))
                }
            }
            d.deserialize_any(V)
        }
    }

    impl<'de> Deserialize<'de> for Node {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> de::Visitor<'de> for V {
                type Value = Node;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any YAML value")
                }
                fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                    Node::deserialize(d)
                }
                fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                    let mut items = Vec::new();
                    while let Some(item) = a.next_element()? {
                        items.push(item);
                    }
                    Ok(Node::Seq(items))
                }
                fn visit_map<A: de::MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
                    let mut entries = Vec::new();
                    while let Some(entry) = a.next_entry()? {
                        entries.push(entry);
                    }
                    Ok(Node::Map(entries))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// One node of the tree, by field path.
    struct Entry {
        path: String,
        /// The key (map entries) or the item (sequence items); names the field in errors.
        at: Pos,
        /// Where the value starts.
        value: Pos,
        /// The value is a mapping.
        is_map: bool,
    }

    /// Every node of a document by field path, in document order.
    pub(super) struct Index(Vec<Entry>);

    fn pos(l: &Location) -> Pos {
        (l.line().max(1), l.column().max(1))
    }

    /// Deepest nesting of collections. The deepest field, `drivers[i].leaderElection.labels`,
    /// sits in four; the parser's default (64) recurses deeper than a driver list ever needs.
    const MAX_DEPTH: usize = 16;

    /// Most YAML nodes (scalars, sequences, mappings; keys count), alias expansions included.
    /// An entry with every field written has about 50, so [`super::MAX_DRIVERS`] such entries
    /// fit twice over; the parser's default (250,000) takes seconds to build in a debug build.
    const MAX_NODES: usize = 100_000;

    /// Most events replayed by aliases in the whole document: enough to share a
    /// `leaderElection` object of four settings (ten events) among every one of
    /// [`super::MAX_DRIVERS`] entries, while a "billion laughs" document stops after this many
    /// (in well under a second in a debug build).
    const MAX_ALIAS_REPLAY_EVENTS: usize = 10 * super::MAX_DRIVERS;

    /// The parser's options: its defaults (duplicate keys refused, non-finite untyped floats
    /// refused) with a budget sized for driver lists. Every breach is an error at the position
    /// where it happened, like any syntax error.
    pub(super) fn options() -> serde_saphyr::Options {
        serde_saphyr::options! {
            budget: serde_saphyr::budget! {
                max_reader_input_bytes: Some(super::MAX_FILE_BYTES),
                max_depth: MAX_DEPTH,
                flow_nesting_limit: MAX_DEPTH,
                max_nodes: MAX_NODES,
                // Every node is one event, every collection one more for its end.
                max_events: 2 * MAX_NODES + 16,
                max_aliases: MAX_ALIAS_REPLAY_EVENTS,
                max_anchors: MAX_NODES,
                max_total_scalar_bytes: super::MAX_FILE_BYTES,
            },
            alias_limits: serde_saphyr::alias_limits! {
                max_total_replayed_events: MAX_ALIAS_REPLAY_EVENTS,
                max_replay_stack_depth: MAX_DEPTH,
            },
            // Comments are never read; not keeping them keeps them out of the event budget.
            emit_comments: false,
            // `.inf`/`.nan` reach the typed pass, which names the field they are refused for.
            non_finite_float_policy: serde_saphyr::options::NonFiniteFloatPolicy::PassThrough,
        }
    }

    /// Parses `text` without a schema; a syntax error comes back as its position and message.
    pub(super) fn index(text: &str) -> Result<Index, (Pos, String)> {
        let root: Spanned<Node> =
            serde_saphyr::from_str_with_options(text, options()).map_err(|e| {
                let at = e.location().map_or((1, 1), |l| pos(&l));
                (at, message(&e))
            })?;
        let mut entries = Vec::new();
        let start = pos(&root.referenced);
        walk(&root.value, "", start, start, &mut entries);
        Ok(Index(entries))
    }

    fn walk(node: &Node, path: &str, at: Pos, value: Pos, out: &mut Vec<Entry>) {
        out.push(Entry {
            path: path.to_owned(),
            at,
            value,
            is_map: matches!(node, Node::Map(_)),
        });
        match node {
            Node::Map(entries) => {
                for (key, v) in entries {
                    let child = if path.is_empty() {
                        key.value.0.clone()
                    } else {
                        format!("{path}.{}", key.value.0)
                    };
                    walk(
                        &v.value,
                        &child,
                        pos(&key.referenced),
                        pos(&v.referenced),
                        out,
                    );
                }
            }
            Node::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    let p = pos(&item.referenced);
                    walk(&item.value, &format!("{path}[{i}]"), p, p, out);
                }
            }
            Node::Scalar => {}
        }
    }

    impl Index {
        /// Where `path` is written, or else its nearest written ancestor.
        pub(super) fn position(&self, path: &str) -> Pos {
            let mut path = path;
            loop {
                if let Some(e) = self.0.iter().find(|e| e.path == path) {
                    return e.at;
                }
                match path.rfind(['.', '[']) {
                    Some(cut) => path = &path[..cut],
                    None => return (1, 1),
                }
            }
        }

        /// The position and field path of a deserialisation error.
        pub(super) fn locate_error(&self, e: &serde_saphyr::Error) -> (Pos, Option<String>) {
            let Some(at) = e.location().map(|l| pos(&l)) else {
                return ((1, 1), None);
            };
            let missing_field = matches!(
                e.without_snippet(),
                serde_saphyr::Error::SerdeMissingField { .. }
            );
            // A missing field is reported where its mapping starts; anything else at a key or
            // value: take the deepest match.
            let found = self
                .0
                .iter()
                .filter(|x| {
                    if missing_field {
                        x.is_map && x.value == at
                    } else {
                        x.at == at || x.value == at
                    }
                })
                .max_by_key(|x| x.path.len());
            let found = found.or_else(|| self.0.iter().rev().find(|x| x.at <= at));
            (at, found.map(|x| x.path.clone()).filter(|p| !p.is_empty()))
        }
    }

    /// The parser's message, without location or snippet, on one line.
    pub(super) fn message(e: &serde_saphyr::Error) -> String {
        let text: Cow<'_, str> = UserMessageFormatter.format_message(e.without_snippet());
        text.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults::with_identity(&Args::default(), "test-host".to_owned())
    }

    fn parse_ok(text: &str) -> Vec<Settings> {
        parse_config(text).drivers
    }

    fn parse_config(text: &str) -> Config {
        match parse(text, "drivers.yaml", &defaults(), false) {
            Ok(c) => c,
            Err(e) => panic!("{text:?} should load, got: {e}"),
        }
    }

    fn parse_err(text: &str) -> String {
        match parse(text, "drivers.yaml", &defaults(), false) {
            Ok(s) => panic!("{text:?} should be refused, got {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_entry_without_overrides_gets_the_sidecar_settings_of_the_flags() {
        let got = parse_ok("drivers:\n  - address: unix:///csi/a.sock\n");
        let want = defaults().settings_for("/csi/a.sock".parse().expect("valid address"));
        assert_eq!(got, vec![want]);
    }

    #[test]
    fn every_override_lands_in_the_settings() {
        let got = parse_ok(
            "drivers:
  - address: /csi/a.sock
    name: a.example.com
    timeout: 30s
    workerThreads: {attach: 4, detach: 2}
    retryIntervalStart: 500ms
    retryIntervalMax: 1m
    reconcileSync: 2m
    maxEntries: 100
    defaultFstype: xfs
    kubeApiQps: 2.5
    kubeApiBurst: 7
    leaderElection:
      namespace: storage
      leaseDuration: 30s
      renewDeadline: 20s
      retryPeriod: 4s
      labels: {team: storage}
  - address: unix:/csi/b.sock
    workerThreads: 3
    kubeApiQps: 1
    leaderElection: true
",
        );
        let a = &got[0];
        assert_eq!(a.expected_name.as_deref(), Some("a.example.com"));
        assert_eq!(a.timeout, secs(30));
        assert_eq!((a.attach_workers, a.detach_workers), (4, 2));
        assert_eq!(a.retry_interval_start, Duration::from_millis(500));
        assert_eq!(a.retry_interval_max, secs(60));
        assert_eq!(a.reconcile_sync, secs(120));
        assert_eq!(a.max_entries, 100);
        assert_eq!(a.default_fstype, "xfs");
        assert_eq!(a.api_budget, Limit::Rate { qps: 2.5, burst: 7 });
        let le = a.leader_election.as_ref().expect("leader election on");
        assert_eq!(le.namespace, "storage");
        assert_eq!(le.identity, "test-host");
        assert_eq!(
            (le.lease_duration, le.renew_deadline, le.retry_period),
            (secs(30), secs(20), secs(4))
        );
        assert_eq!(le.labels.get("team").map(String::as_str), Some("storage"));
        let b = &got[1];
        assert_eq!((b.attach_workers, b.detach_workers), (3, 3));
        // The burst a driver leaves out is the flag's.
        assert_eq!(
            b.api_budget,
            Limit::Rate {
                qps: 1.0,
                burst: 10
            }
        );
        let le = b.leader_election.as_ref().expect("leader election on");
        assert_eq!(
            (le.lease_duration, le.renew_deadline, le.retry_period),
            (secs(15), secs(10), secs(5))
        );
    }

    #[test]
    fn every_driver_has_its_own_budget_and_the_hub_cap_is_optional() {
        let c = parse_config("drivers:\n- address: /a\n- address: /b\n  kubeApiQps: -1\n");
        // Each driver gets what its sidecar had, not a share of one budget.
        assert_eq!(c.drivers[0].api_budget, Limit::client_go(5.0, 10));
        assert_eq!(c.drivers[1].api_budget, Limit::Unlimited);
        assert_eq!(c.hub_api_cap, Limit::Unlimited);

        let c = parse_config("hubKubeApiQps: 50\ndrivers:\n- address: /a\n");
        assert_eq!(
            c.hub_api_cap,
            Limit::Rate {
                qps: 50.0,
                burst: 100
            }
        );
        let c = parse_config("hubKubeApiQps: 50\nhubKubeApiBurst: 60\ndrivers:\n- address: /a\n");
        assert_eq!(
            c.hub_api_cap,
            Limit::Rate {
                qps: 50.0,
                burst: 60
            }
        );
        // The file's 0 turns off a cap the flags set.
        let args = Args {
            hub_kube_api_qps: 20.0,
            hub_kube_api_burst: 30,
            ..Args::default()
        };
        let d = Defaults::with_identity(&args, "h".to_owned());
        let with_flags = |text: &str| parse(text, "f", &d, false).expect("valid").hub_api_cap;
        assert_eq!(
            with_flags("drivers:\n- address: /a\n"),
            Limit::Rate {
                qps: 20.0,
                burst: 30
            }
        );
        assert_eq!(
            with_flags("hubKubeApiQps: 0\ndrivers:\n- address: /a\n"),
            Limit::Unlimited
        );
        // Only the burst written: the flag's QPS with that burst.
        assert_eq!(
            with_flags("hubKubeApiBurst: 5\ndrivers:\n- address: /a\n"),
            Limit::Rate {
                qps: 20.0,
                burst: 5
            }
        );
    }

    #[test]
    fn leader_election_can_be_turned_off_per_driver() {
        let mut args = Args::default();
        args.leader_election.enabled = true;
        let d = Defaults::with_identity(&args, "h".to_owned());
        let text = "drivers:\n- address: /a\n- address: /b\n  leaderElection: false\n- address: /c\n  leaderElection: {enabled: false}\n";
        let got = parse(text, "f", &d, false).expect("valid").drivers;
        assert!(got[0].leader_election.is_some());
        assert!(got[1].leader_election.is_none());
        assert!(got[2].leader_election.is_none());
    }

    #[test]
    fn an_empty_list_is_fine_only_with_discovery() {
        assert_eq!(
            parse_err("drivers: []\n"),
            "drivers.yaml:1:1: drivers: at least one driver is required"
        );
        assert_eq!(
            parse_err(""),
            "drivers.yaml:1:1: drivers: at least one driver is required"
        );
        let got = parse("drivers: []\n", "f", &defaults(), true).expect("valid with discovery");
        assert!(got.drivers.is_empty());
    }

    #[test]
    fn each_bad_input_is_refused_naming_file_line_and_field() {
        let cases: &[(&str, &str)] = &[
            (
                "drivers:\n  - address: [/a\n",
                "drivers.yaml:2:14: unclosed bracket '['",
            ),
            (
                "drivers:\n  - address: /a\n    timeout: 15\n",
                "drivers.yaml:3:5: drivers[0].timeout: invalid duration \"15\": missing unit",
            ),
            (
                "drivers:\n  - address: /a\n  - address: /b\n    timeout: 15\n",
                "drivers.yaml:4:5: drivers[1].timeout: invalid duration \"15\": missing unit",
            ),
            (
                "drivers:\n- address: /a\n  reconcileSync: 5x\n",
                "drivers.yaml:3:3: drivers[0].reconcileSync: invalid duration \"5x\": unknown unit \"x\"",
            ),
            (
                "drivers:\n- address: /a\n  retryIntervalStart: soon\n",
                "drivers.yaml:3:3: drivers[0].retryIntervalStart: invalid duration \"soon\"",
            ),
            (
                "drivers:\n- address: /a\n  timeout: -1s\n",
                "drivers.yaml:3:3: drivers[0].timeout: must be greater than zero, not -1s",
            ),
            (
                "drivers:\n- address: /a\n  timeout: 0s\n",
                "drivers.yaml:3:3: drivers[0].timeout: must be greater than zero, not 0s",
            ),
            (
                "drivers:\n- address: /a\n  retryIntervalMax: 500ms\n",
                "drivers.yaml:3:3: drivers[0].retryIntervalMax: retryIntervalMax (500ms) must not be less than retryIntervalStart (1s)",
            ),
            (
                "drivers:\n  - address: /a\n  - timeout: 5s\n",
                "drivers.yaml:3:5: drivers[1]: missing field `address`",
            ),
            (
                "drivers:\n  - address: csi.sock\n",
                "drivers.yaml:2:5: drivers[0].address: invalid address \"csi.sock\": must be unix:///absolute/path or /absolute/path",
            ),
            (
                "drivers:\n  - address: unix://csi.sock\n",
                "drivers.yaml:2:5: drivers[0].address: invalid address \"unix://csi.sock\": must be unix:///absolute/path or /absolute/path",
            ),
            (
                "drivers:\n  - address: tcp://10.0.0.1:9000\n",
                "drivers.yaml:2:5: drivers[0].address: invalid address \"tcp://10.0.0.1:9000\": must be unix:///absolute/path or /absolute/path",
            ),
            (
                "drivers:\n  - address: /a\n    bogus: 1\n",
                "drivers.yaml:3:5: drivers[0].bogus: unknown field `bogus`, expected one of address, name, timeout, workerThreads, retryIntervalStart, retryIntervalMax, reconcileSync, maxEntries, defaultFstype, kubeApiQps, kubeApiBurst, leaderElection",
            ),
            (
                "driver:\n  - address: /a\n",
                "drivers.yaml:1:1: driver: unknown field `driver`, expected one of drivers, hubKubeApiQps, hubKubeApiBurst",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: 0\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: must be greater than zero, not 0",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads:\n    attach: 2\n    detach: -1\n",
                "drivers.yaml:5:5: drivers[0].workerThreads.detach: must be greater than zero, not -1",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads:\n    attach: 2\n    detach: 2\n    pv: 1\n",
                "drivers.yaml:6:5: drivers[0].workerThreads.pv: unknown field `pv`, expected one of attach, detach",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: many\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: invalid type: string \"many\", expected a number of workers, or {attach: N, detach: M}",
            ),
            (
                "drivers:\n- address: /a\n  maxEntries: -1\n",
                "drivers.yaml:3:3: drivers[0].maxEntries: must not be negative, not -1",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiQps: 0\n",
                "drivers.yaml:3:3: drivers[0].kubeApiQps: must not be 0: write the requests per second (the client-go default is 5), or a negative number for no limit",
            ),
            (
                "drivers:\n- address: /a\nhubKubeApiQps: -1\n",
                "drivers.yaml:3:1: hubKubeApiQps: must not be negative, not -1",
            ),
            (
                "drivers:\n- address: /a\nhubKubeApiQps: 10\nhubKubeApiBurst: -5\n",
                "drivers.yaml:4:1: hubKubeApiBurst: must not be negative, not -5",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiBurst: 0\n",
                "drivers.yaml:3:3: drivers[0].kubeApiBurst: must be greater than zero, not 0",
            ),
            (
                "drivers:\n- address: /a\n  name: \"\"\n",
                "drivers.yaml:3:3: drivers[0].name: must not be empty",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection:\n    leaseDuration: 10s\n",
                "drivers.yaml:4:5: drivers[0].leaderElection.leaseDuration: leaseDuration (10s) must be greater than renewDeadline (10s)",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection:\n    retryPeriod: 9s\n",
                "drivers.yaml:4:5: drivers[0].leaderElection.retryPeriod: renewDeadline (10s) must be greater than 1.2 × retryPeriod (9s)",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection:\n    renewDeadline: 0s\n",
                "drivers.yaml:4:5: drivers[0].leaderElection.renewDeadline: must be greater than zero, not 0s",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: yes please\n",
                "drivers.yaml:3:3: drivers[0].leaderElection: invalid type: string \"yes please\", expected true, false, or {enabled, namespace, leaseDuration, renewDeadline, retryPeriod, labels}",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: {leaseDuration: 20s, renew: 5s}\n",
                "drivers.yaml:3:40: drivers[0].leaderElection.renew: unknown field `renew`, expected one of enabled, namespace, leaseDuration, renewDeadline, retryPeriod, labels",
            ),
            (
                "drivers:\n- address: /a\n- address: unix:///a\n",
                "drivers.yaml:3:3: drivers[1].address: socket unix:///a is already the address of drivers[0] (line 2)",
            ),
            (
                "drivers:\n- address: /a\n  name: x.io\n\n- address: /b\n  name: x.io\n",
                "drivers.yaml:6:3: drivers[1].name: driver name \"x.io\" is already configured for drivers[0] (line 2)",
            ),
            (
                "drivers:\n- address: /a\n  name: a.b\n- address: /b\n  name: a-b\n",
                "drivers.yaml:5:3: drivers[1].name: driver names \"a-b\" and \"a.b\" (drivers[0], line 2) both use the finalizer \"external-attacher/a-b\"",
            ),
            (
                "drivers:\n- address: /a\n  timeout: 1s\n  timeout: 2s\n",
                "drivers.yaml:4:3: duplicate mapping key `timeout` is not allowed here",
            ),
            // Bounds: the same as the flags'.
            (
                "drivers:\n- address: /a\n  workerThreads: 1000000000\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: must be at most 10000, not 1000000000",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: {attach: 10001, detach: 1}\n",
                "drivers.yaml:3:19: drivers[0].workerThreads.attach: must be at most 10000, not 10001",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads:\n    attach: 1\n    detach: 20000\n",
                "drivers.yaml:5:5: drivers[0].workerThreads.detach: must be at most 10000, not 20000",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: 18446744073709551615\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: invalid value: integer `18446744073709551615`, expected a number of workers, or {attach: N, detach: M}",
            ),
            (
                "drivers:\n- address: /a\n  timeout: 25h\n",
                "drivers.yaml:3:3: drivers[0].timeout: must be at most 24h0m0s, not 25h",
            ),
            (
                "drivers:\n- address: /a\n  retryIntervalMax: 24h0m1s\n",
                "drivers.yaml:3:3: drivers[0].retryIntervalMax: must be at most 24h0m0s, not 24h0m1s",
            ),
            (
                "drivers:\n- address: /a\n  reconcileSync: 2562047h\n",
                "drivers.yaml:3:3: drivers[0].reconcileSync: must be at most 24h0m0s, not 2562047h",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: {leaseDuration: 48h}\n",
                "drivers.yaml:3:20: drivers[0].leaderElection.leaseDuration: must be at most 24h0m0s, not 48h",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: {leaseDuration: 900ms, renewDeadline: 800ms, retryPeriod: 100ms}\n",
                "drivers.yaml:3:20: drivers[0].leaderElection.leaseDuration: must be at least 1s, not 900ms: a Lease holds whole seconds",
            ),
            (
                "drivers:\n- address: /a\n  maxEntries: 2147483648\n",
                "drivers.yaml:3:3: drivers[0].maxEntries: must be at most 2147483647, not 2147483648",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiQps: 1e7\n",
                "drivers.yaml:3:3: drivers[0].kubeApiQps: must be at most 1000000, not 10000000",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiQps: .inf\n",
                "drivers.yaml:3:3: drivers[0].kubeApiQps: must be at most 1000000, not inf",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiQps: .nan\n",
                "drivers.yaml:3:3: drivers[0].kubeApiQps: must be at most 1000000, not NaN",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiBurst: 2000001\n",
                "drivers.yaml:3:3: drivers[0].kubeApiBurst: must be at most 2000000, not 2000001",
            ),
            (
                "hubKubeApiQps: .inf\ndrivers:\n- address: /a\n",
                "drivers.yaml:1:1: hubKubeApiQps: must be at most 1000000, not inf",
            ),
            (
                "hubKubeApiBurst: 2000001\ndrivers:\n- address: /a\n",
                "drivers.yaml:1:1: hubKubeApiBurst: must be at most 2000000, not 2000001",
            ),
            // Characters YAML does not allow, wherever they are.
            (
                "drivers:\n- address: /a\0b\n",
                "drivers.yaml:2:14: unexpected character: `\\u{0}'",
            ),
            (
                "drivers:\n\u{feff}- address: /a\n",
                "drivers.yaml:2:1: a BOM must not appear inside a document",
            ),
            (
                "drivers:\n- address: /a\n  \"time\\nout\": 5s\n",
                "drivers.yaml:3:3: drivers[0].time\\nout: unknown field `time out`, expected one of address, name, timeout, workerThreads, retryIntervalStart, retryIntervalMax, reconcileSync, maxEntries, defaultFstype, kubeApiQps, kubeApiBurst, leaderElection",
            ),
            (
                "drivers:\n- address: /a\n---\ndrivers: []\n",
                "drivers.yaml:4:1: only single YAML document expected but multiple found",
            ),
        ];
        let mut failures = Vec::new();
        for (text, want) in cases {
            let got = parse_err(text);
            if got != *want {
                failures.push(format!("input {text:?}\n  want {want}\n  got  {got}"));
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    #[test]
    fn a_file_that_is_not_utf8_is_refused_at_its_first_invalid_byte() {
        let err = |bytes: &[u8]| match parse_bytes(bytes, "drivers.yaml", &defaults(), false) {
            Ok(c) => panic!("{bytes:?} should be refused, got {c:?}"),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            err(b"\xff"),
            "drivers.yaml:1:1: not UTF-8: invalid byte 0xff"
        );
        // Columns count characters: `- address: /é` is 13.
        assert_eq!(
            err(b"drivers:\n- address: /\xc3\xa9\xfe\n"),
            "drivers.yaml:2:14: not UTF-8: invalid byte 0xfe"
        );
        // A sequence cut short at the end of the file; CR LF and a lone CR end lines.
        assert_eq!(
            err(b"drivers:\r\n- name: x\r- address: /\xe6\x97"),
            "drivers.yaml:3:13: not UTF-8: invalid byte 0xe6"
        );
        // Latin-1 instead of UTF-8.
        assert_eq!(
            err(b"drivers:\n- address: /a\n  name: caf\xe9\n"),
            "drivers.yaml:3:12: not UTF-8: invalid byte 0xe9"
        );
        let ok = "drivers:\n- address: /a\n  name: caf\u{e9}\n";
        assert!(parse_bytes(ok.as_bytes(), "f", &defaults(), false).is_ok());
        // A BOM before the document is fine.
        let bom = "\u{feff}drivers:\n- address: /a\n";
        assert!(parse_bytes(bom.as_bytes(), "f", &defaults(), false).is_ok());
    }

    #[test]
    fn a_file_longer_than_the_bound_is_refused_where_it_passes_it() {
        let line = "# a comment line of sixty-four bytes, padded to that length....\n";
        assert_eq!(line.len(), 64);
        let mut text = format!(
            "drivers:\n- address: /a\n{}",
            line.repeat(MAX_FILE_BYTES / 64)
        );
        text.truncate(MAX_FILE_BYTES);
        assert!(
            parse(&text, "f", &defaults(), false).is_ok(),
            "exactly the bound"
        );
        text.push('x');
        // 2 lines, then 65,535 full comment lines and 41 bytes of the next: the byte past the
        // bound is the last one, at column 42 of line 65,538.
        assert_eq!(
            parse_err(&text),
            "drivers.yaml:65538:42: the file is longer than 4194304 bytes, the most a driver list may have"
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("drivers.yaml");
        std::fs::write(&path, text.repeat(4)).expect("writing");
        let e = load(&path, &defaults(), false).expect_err("too long");
        assert!(
            e.to_string().ends_with(
                ":65538:42: the file is longer than 4194304 bytes, the most a driver list may have"
            ),
            "{e}"
        );
    }

    #[test]
    fn yaml_bombs_and_deep_nesting_stop_at_the_budget_with_a_position() {
        // Ten levels of ten aliases each: 10^10 nodes if expanded.
        let mut bomb =
            String::from("drivers:\n- address: /a\n  labels:\n    l0: &l0 [x,x,x,x,x,x,x,x,x,x]\n");
        for i in 1..10 {
            let p = i - 1;
            bomb.push_str(&format!(
                "    l{i}: &l{i} [*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p}]\n"
            ));
        }
        let started = std::time::Instant::now();
        let e = parse_err(&bomb);
        assert!(e.starts_with("drivers.yaml:"), "{e}");
        assert!(e.contains("YAML document too large or too complex"), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );

        let deep = format!("drivers: {}{}\n", "[".repeat(17), "]".repeat(17));
        let e = parse_err(&deep);
        assert!(e.starts_with("drivers.yaml:1:"), "{e}");
        let deep = format!("drivers: {}1{}\n", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_err(&deep).starts_with("drivers.yaml:1:"));
        let mut block = String::from("drivers:\n");
        for i in 1..40 {
            block.push_str(&format!("{}- \n", " ".repeat(i)));
        }
        assert!(parse_err(&block).starts_with("drivers.yaml:"));
        // A real file's depth (labels inside leaderElection inside an entry) is well within it.
        parse_ok("drivers:\n- address: /a\n  leaderElection:\n    labels: {a: b}\n");
    }

    #[test]
    fn the_number_of_drivers_and_of_all_their_workers_is_bounded() {
        let entries = |n: usize, extra: &str| {
            let mut text = String::from("drivers:\n");
            for i in 0..n {
                text.push_str(&format!("- address: /d{i}\n{extra}"));
            }
            text
        };
        assert_eq!(parse_ok(&entries(MAX_DRIVERS, "")).len(), MAX_DRIVERS);
        assert_eq!(
            parse_err(&entries(MAX_DRIVERS + 1, "")),
            "drivers.yaml:1002:3: drivers[1000]: more than 1000 drivers"
        );
        // Three drivers with 10,000 workers per pool run 90,000 workers; a fourth is too many.
        let big = "  workerThreads: 10000\n";
        assert_eq!(parse_ok(&entries(3, big)).len(), 3);
        assert_eq!(
            parse_err(&entries(4, big)),
            "drivers.yaml:9:3: drivers[3].workerThreads: the drivers up to this one run 120000 workers in all (attach, detach and PersistentVolume pools), more than 100000"
        );
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let err = load(Path::new("/nonexistent/drivers.yaml"), &defaults(), false)
            .expect_err("no such file");
        assert_eq!(err.to_string(), "/nonexistent/drivers.yaml: cannot be read");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn the_example_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers.example.yaml");
        let config = load(&path, &defaults(), false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            config.hub_api_cap,
            Limit::Rate {
                qps: 200.0,
                burst: 400
            }
        );
        let got = config.drivers;
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0].expected_name.as_deref(),
            Some("fast-disk.csi.example.com")
        );
        assert_eq!((got[0].attach_workers, got[0].detach_workers), (20, 5));
        assert_eq!(
            got[0].api_budget,
            Limit::Rate {
                qps: 10.0,
                burst: 20
            }
        );
        // The other driver has the flags' budget, as its sidecar had.
        assert_eq!(got[1].api_budget, Limit::client_go(5.0, 10));
        assert_eq!((got[1].attach_workers, got[1].detach_workers), (4, 4));
        assert!(got[1].leader_election.is_some());
    }
}
