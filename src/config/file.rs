//! The plain `serde` types of `drivers.yaml`, as written: parser-neutral (no YAML type in
//! them), every field but a driver's `address` optional.

use std::{collections::BTreeMap, fmt};

use serde::{Deserialize, Deserializer, de};

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

/// One entry of `drivers:`: a driver to serve at `address`, or (with discovery, and only `name`
/// to identify it) the settings of the discovered driver that reports `name`. Every other field
/// is optional; a missing field takes the value of the corresponding command-line flag.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DriverEntry {
    /// The driver socket: `unix:///path` or `/path` (absolute). Without it, the entry gives its
    /// settings to the discovered driver named `name`.
    pub address: Option<String>,
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
