//! Checking a parsed driver list: every entry's values and bounds, the flags' defaults applied
//! to what it leaves out, and no two entries for one socket or one finalizer. Pure: the places
//! of the problems in the text are filled in by [`parse`](super::parse).

use std::{collections::HashMap, time::Duration};

use super::bounds::{MAX_DRIVERS, MAX_HUB_WORKERS};
use super::defaults::Defaults;
use super::error::{Invalid, Problem};
use super::file::{DriverEntry, File, LeaderElection, LeaderElectionSettings, WorkerThreads};
use super::settings::{Config, LeaderSettings, NamedSettings, Settings};
use crate::cli::{self, GoDuration};
use crate::csi::Address;
use crate::k8s::budget::Limit;
use crate::leader::timing::{self, TimingError};

impl File {
    /// Checks every entry and applies `defaults` to what it leaves out. `discovery`: drivers
    /// also come from `--driver-sockets`, so an empty list is fine. Pure: the places of the
    /// problems are filled in by [`parse`](super::parse).
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
        let entries: Vec<(bool, Settings)> = self
            .drivers
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let at = format!("drivers[{i}]");
                let settings = entry.validate(&at, defaults, discovery)?;
                Ok((entry.address.is_some(), settings))
            })
            .collect::<Result<_, _>>()?;
        let mut total: u64 = 0;
        for (i, (_, d)) in entries.iter().enumerate() {
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
        let (drivers, discovered) = entries.into_iter().fold(
            (Vec::new(), Vec::new()),
            |(mut drivers, mut discovered), (addressed, settings)| {
                if addressed {
                    drivers.push(settings);
                } else {
                    discovered.push(NamedSettings::new(settings));
                }
                (drivers, discovered)
            },
        );
        Ok(Config {
            drivers,
            discovered,
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

/// The address of the settings of an entry without one (never used: [`NamedSettings::at`]
/// replaces it with the address the driver is discovered at).
const NO_ADDRESS: &str = "/-";

impl DriverEntry {
    /// The entry's settings. An entry without `address` needs `name` and `discovery`; its
    /// settings get a placeholder address.
    fn validate(
        &self,
        at: &str,
        defaults: &Defaults,
        discovery: bool,
    ) -> Result<Settings, Invalid> {
        let mut s = defaults.settings_for(self.address(at, discovery)?);
        if let Some(name) = &self.name {
            if name.is_empty() {
                return Err(invalid(field(at, "name"), Problem::Empty));
            }
            s.expected_name = Some(name.clone());
        }
        self.apply_durations(at, &mut s)?;
        if let Some(threads) = &self.worker_threads {
            (s.attach_workers, s.detach_workers, s.csi_calls) = worker_pools(at, threads)?;
        }
        if let Some(n) = self.max_entries {
            let n = bounded(&field(at, "maxEntries"), n, 0, cli::MAX_LIST_ENTRIES)?;
            // At most `MAX_LIST_ENTRIES`, which is `i32::MAX`.
            s.max_entries = i32::try_from(n).unwrap_or(i32::MAX);
        }
        if let Some(fstype) = &self.default_fstype {
            s.default_fstype = fstype.clone();
        }
        if let Some(budget) = self.api_budget(at, defaults)? {
            s.api_budget = budget;
        }
        if let Some(le) = &self.leader_election {
            s.leader_election = leader_election(&field(at, "leaderElection"), le, defaults)?;
        }
        Ok(s)
    }

    /// The entry's socket: an absolute Unix socket path, or, for an entry that names a
    /// discovered driver, the placeholder [`NO_ADDRESS`].
    fn address(&self, at: &str, discovery: bool) -> Result<Address, Invalid> {
        match &self.address {
            Some(address) => address
                .parse::<Address>()
                .ok()
                .filter(|a| a.path().is_absolute())
                .ok_or_else(|| invalid(field(at, "address"), Problem::Address(address.clone()))),
            None if self.name.is_none() => Err(invalid(at, Problem::NoAddressNorName)),
            None if !discovery => Err(invalid(at, Problem::NameWithoutDiscovery)),
            None => NO_ADDRESS
                .parse::<Address>()
                .map_err(|_| invalid(at, Problem::Address(NO_ADDRESS.into()))),
        }
    }

    /// `timeout`, `retryIntervalStart`, `retryIntervalMax` (not below the start) and
    /// `reconcileSync`, over the flags' values in `s`.
    fn apply_durations(&self, at: &str, s: &mut Settings) -> Result<(), Invalid> {
        s.timeout = optional_duration(at, "timeout", &self.timeout, s.timeout)?;
        s.retry_interval_start = optional_duration(
            at,
            "retryIntervalStart",
            &self.retry_interval_start,
            s.retry_interval_start,
        )?;
        s.retry_interval_max = optional_duration(
            at,
            "retryIntervalMax",
            &self.retry_interval_max,
            s.retry_interval_max,
        )?;
        if s.retry_interval_max < s.retry_interval_start {
            // Blame the one the entry wrote: the maximum if it did, else the start.
            let name = if self.retry_interval_max.is_some() {
                "retryIntervalMax"
            } else {
                "retryIntervalStart"
            };
            return Err(invalid(
                field(at, name),
                Problem::RetryMaxBelowStart {
                    start: s.retry_interval_start,
                    max: s.retry_interval_max,
                },
            ));
        }
        s.reconcile_sync =
            optional_duration(at, "reconcileSync", &self.reconcile_sync, s.reconcile_sync)?;
        Ok(())
    }

    /// The driver's own API budget when the entry sets `kubeApiQps` or `kubeApiBurst` (the
    /// other from the flags); `None` keeps the flags' budget.
    fn api_budget(&self, at: &str, defaults: &Defaults) -> Result<Option<Limit>, Invalid> {
        if self.kube_api_qps.is_none() && self.kube_api_burst.is_none() {
            return Ok(None);
        }
        let qps = match self.kube_api_qps {
            None => defaults.kube_api_qps,
            // 0 would silently mean client-go's default of 5: ask for what is meant.
            Some(q) if q == 0.0 => {
                return Err(invalid(
                    field(at, "kubeApiQps"),
                    Problem::ZeroQps(q.to_string()),
                ));
            }
            // Negative: no limit, as client-go reads it.
            Some(q) => qps_at_most_max(&field(at, "kubeApiQps"), q)?,
        };
        let burst = match self.kube_api_burst {
            None => defaults.kube_api_burst,
            Some(b) => bounded(&field(at, "kubeApiBurst"), b, 1, cli::MAX_API_BURST)?,
        };
        Ok(Some(Limit::client_go(qps, burst)))
    }
}

/// `<at>.<name>`: a field of the entry at `at`.
fn field(at: &str, name: &str) -> String {
    format!("{at}.{name}")
}

/// The duration the entry writes at `<at>.<name>`, else `default`.
fn optional_duration(
    at: &str,
    name: &str,
    value: &Option<String>,
    default: Duration,
) -> Result<Duration, Invalid> {
    value
        .as_deref()
        .map_or(Ok(default), |v| positive_duration(&field(at, name), v))
}

/// `workerThreads`: the attach workers, the detach workers and the concurrent CSI calls. One
/// count is each pool's and the cap of CSI calls; two counts cap the CSI calls at their sum.
fn worker_pools(at: &str, threads: &WorkerThreads) -> Result<(usize, usize, usize), Invalid> {
    match threads {
        WorkerThreads::Both(n) => {
            let n = workers(&field(at, "workerThreads"), *n)?;
            Ok((n, n, n))
        }
        WorkerThreads::Pools(p) => {
            let attach = workers(&field(at, "workerThreads.attach"), p.attach)?;
            let detach = workers(&field(at, "workerThreads.detach"), p.detach)?;
            Ok((attach, detach, attach + detach))
        }
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
    let field = |name: &str| field(at, name);
    let duration = |name: &str, value: &Option<String>, default: Duration| {
        optional_duration(at, name, value, default)
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
    if let Err(refused) = timing::check(lease_duration, renew_deadline, retry_period) {
        let (blamed, problem) = match refused {
            TimingError::LeaseNotLongerThanRenewDeadline { .. } => (
                blame([
                    ("leaseDuration", o.lease_duration.is_some()),
                    ("renewDeadline", o.renew_deadline.is_some()),
                ]),
                Problem::Timing(refused),
            ),
            TimingError::RenewDeadlineNotLongerThanRetry { .. } => (
                blame([
                    ("renewDeadline", o.renew_deadline.is_some()),
                    ("retryPeriod", o.retry_period.is_some()),
                ]),
                Problem::Timing(refused),
            ),
            TimingError::LeaseTooShort(d) => (
                match o.lease_duration {
                    Some(_) => field("leaseDuration"),
                    None => at.to_owned(),
                },
                Problem::LeaseTooShort(GoDuration(d).to_string()),
            ),
            // Every duration was checked positive above; kept for completeness.
            TimingError::Zero(_) => (
                at.to_owned(),
                Problem::NotPositive(GoDuration(Duration::ZERO).to_string()),
            ),
        };
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

/// Refuses two entries for one socket, one name, or two names that share a finalizer. Each
/// entry is its address (`None`: an entry for a discovered driver) and its settings.
pub(crate) fn check_unique(
    entries: &[(Option<&Address>, &Settings)],
) -> Result<(), (Invalid, usize)> {
    let mut addresses: HashMap<&Address, usize> = HashMap::new();
    let mut names: HashMap<String, (usize, &str)> = HashMap::new();
    for (i, (address, s)) in entries.iter().enumerate() {
        if let Some(address) = address {
            if let Some(&other) = addresses.get(address) {
                let problem = Problem::DuplicateAddress {
                    address: (*address).clone(),
                    other: format!("drivers[{other}]"),
                    other_line: 0,
                };
                return Err((invalid(format!("drivers[{i}].address"), problem), other));
            }
            addresses.insert(address, i);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use crate::config::file::WorkerPools;

    fn defaults() -> Defaults {
        Defaults::with_identity(&Args::default(), "test-host".to_owned())
    }

    #[test]
    fn one_worker_count_is_each_pool_and_the_csi_cap_two_counts_cap_at_their_sum() {
        assert_eq!(worker_pools("d", &WorkerThreads::Both(4)), Ok((4, 4, 4)));
        let pools = WorkerThreads::Pools(WorkerPools {
            attach: 3,
            detach: 2,
        });
        assert_eq!(worker_pools("d", &pools), Ok((3, 2, 5)));
        let e = worker_pools(
            "d",
            &WorkerThreads::Pools(WorkerPools {
                attach: 1,
                detach: 0,
            }),
        )
        .expect_err("no detach worker");
        assert_eq!(e.field, "d.workerThreads.detach");
        let e = worker_pools("d", &WorkerThreads::Both(0)).expect_err("no worker");
        assert_eq!(e.field, "d.workerThreads");
    }

    #[test]
    fn an_entry_without_address_needs_a_name_and_discovery() {
        let named = DriverEntry {
            name: Some("x.csi".into()),
            ..DriverEntry::default()
        };
        let fail = |entry: &DriverEntry, discovery| {
            *entry.address("e", discovery).expect_err("refused").problem
        };
        assert_eq!(
            fail(&DriverEntry::default(), true),
            Problem::NoAddressNorName
        );
        assert_eq!(fail(&named, false), Problem::NameWithoutDiscovery);
        assert_eq!(
            named.address("e", true).map(|a| a.to_string()),
            Ok(format!("unix://{NO_ADDRESS}"))
        );
        let relative = DriverEntry {
            address: Some("csi.sock".into()),
            ..DriverEntry::default()
        };
        let e = relative.address("e", true).expect_err("relative");
        assert_eq!(e.field, "e.address");
        assert_eq!(*e.problem, Problem::Address("csi.sock".into()));
    }

    #[test]
    fn a_retry_maximum_below_the_start_blames_the_one_the_entry_wrote() {
        let d = defaults();
        let mut s = d.settings_for("/csi.sock".parse().expect("address"));
        let start_only = DriverEntry {
            retry_interval_start: Some("1h".into()),
            ..DriverEntry::default()
        };
        let e = start_only
            .apply_durations("e", &mut s)
            .expect_err("start above the flags' maximum");
        assert_eq!(e.field, "e.retryIntervalStart");
        let both = DriverEntry {
            retry_interval_max: Some("2s".into()),
            ..start_only
        };
        let e = both
            .apply_durations("e", &mut s)
            .expect_err("max below start");
        assert_eq!(e.field, "e.retryIntervalMax");
        let fine = DriverEntry {
            timeout: Some("7s".into()),
            reconcile_sync: Some("2m".into()),
            ..DriverEntry::default()
        };
        let mut s = d.settings_for("/csi.sock".parse().expect("address"));
        fine.apply_durations("e", &mut s).expect("valid");
        assert_eq!(
            (s.timeout, s.reconcile_sync),
            (Duration::from_secs(7), Duration::from_secs(120))
        );
    }

    #[test]
    fn an_entrys_api_budget_takes_the_missing_half_from_the_flags_and_refuses_zero_qps() {
        let d = defaults();
        assert_eq!(DriverEntry::default().api_budget("e", &d), Ok(None));
        let burst_only = DriverEntry {
            kube_api_burst: Some(7),
            ..DriverEntry::default()
        };
        assert_eq!(
            burst_only.api_budget("e", &d),
            Ok(Some(Limit::client_go(d.kube_api_qps, 7)))
        );
        let zero = DriverEntry {
            kube_api_qps: Some(0.0),
            ..DriverEntry::default()
        };
        let e = zero.api_budget("e", &d).expect_err("zero qps");
        assert_eq!(e.field, "e.kubeApiQps");
        assert_eq!(*e.problem, Problem::ZeroQps("0".into()));
    }
}
