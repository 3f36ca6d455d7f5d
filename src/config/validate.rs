//! Checking a parsed driver list: every entry's values by the rule of their setting (the one the
//! flags are held to, [`cli::rules`]), the flags' defaults applied to what it leaves out, and no
//! two entries for one socket or one finalizer. Pure: the places of the problems in the text
//! are filled in by [`parse`](super::parse).

use std::{collections::HashMap, time::Duration};

use super::bounds::{MAX_DRIVERS, MAX_HUB_WORKERS};
use super::defaults::Defaults;
use super::error::{Invalid, Problem};
use super::file::{DriverEntry, File, LeaderElection, LeaderElectionSettings, WorkerThreads};
use super::settings::{Config, LeaderSettings, NamedSettings, Settings};
use crate::cli::rules::{Count, Pause, Rate, Refusal};
use crate::cli::{self, GoDuration};
use crate::csi::Address;
use crate::k8s::budget::Limit;
use crate::leader::timing::{self, TimingError, TimingField};

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
            Some(q) => rate(Rate::HubKubeApiQps.field(), Rate::HubKubeApiQps, q)?,
        };
        let burst = match self.hub_kube_api_burst {
            None if self.hub_kube_api_qps.is_some() => 0,
            None => flag_burst,
            Some(b) => count(Count::HubKubeApiBurst.field(), Count::HubKubeApiBurst, b)?,
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

/// The problem of a value that the rule of its setting refuses; `value` as written.
fn refused(field: &str, refusal: Refusal, value: String) -> Invalid {
    let problem = match refusal {
        Refusal::NotPositive => Problem::NotPositive(value),
        Refusal::Negative => Problem::Negative(value),
        Refusal::TooLarge { max } => Problem::TooLarge { value, max },
    };
    invalid(field, problem)
}

/// `value` at `field`, by the rule of `setting`.
fn count(field: &str, setting: Count, value: i64) -> Result<u32, Invalid> {
    setting
        .check(value)
        .map_err(|r| refused(field, r, value.to_string()))
}

/// `qps` at `field`, by the rule of `setting`.
fn rate(field: &str, setting: Rate, qps: f64) -> Result<f64, Invalid> {
    setting
        .check(qps)
        .map_err(|r| refused(field, r, qps.to_string()))
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
            let n = count(&field(at, Count::MaxEntries.field()), Count::MaxEntries, n)?;
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

    /// `timeout`, `retryIntervalStart`, `retryIntervalMax` and `reconcileSync`, over the flags'
    /// values in `s`. A maximum below the start is fine, as from the flags (see
    /// [`cli::rules`]): every retry then waits the maximum.
    fn apply_durations(&self, at: &str, s: &mut Settings) -> Result<(), Invalid> {
        let d = |pause: Pause, value: &Option<String>, default| {
            optional_duration(at, pause, value, default)
        };
        s.timeout = d(Pause::Timeout, &self.timeout, s.timeout)?;
        s.retry_interval_start = d(
            Pause::RetryIntervalStart,
            &self.retry_interval_start,
            s.retry_interval_start,
        )?;
        s.retry_interval_max = d(
            Pause::RetryIntervalMax,
            &self.retry_interval_max,
            s.retry_interval_max,
        )?;
        s.reconcile_sync = d(Pause::ReconcileSync, &self.reconcile_sync, s.reconcile_sync)?;
        Ok(())
    }

    /// The driver's own API budget when the entry sets `kubeApiQps` or `kubeApiBurst` (the
    /// other from the flags); `None` keeps the flags' budget.
    fn api_budget(&self, at: &str, defaults: &Defaults) -> Result<Option<Limit>, Invalid> {
        if self.kube_api_qps.is_none() && self.kube_api_burst.is_none() {
            return Ok(None);
        }
        // Read as client-go reads the flags: 0 means 5 (10 for the burst), negative no limit.
        let qps = match self.kube_api_qps {
            None => defaults.kube_api_qps,
            Some(q) => rate(&field(at, Rate::KubeApiQps.field()), Rate::KubeApiQps, q)?,
        };
        let burst = match self.kube_api_burst {
            None => defaults.kube_api_burst,
            Some(b) => count(
                &field(at, Count::KubeApiBurst.field()),
                Count::KubeApiBurst,
                b,
            )?,
        };
        Ok(Some(Limit::client_go(qps, burst)))
    }
}

/// `<at>.<name>`: a field of the entry at `at`.
fn field(at: &str, name: &str) -> String {
    format!("{at}.{name}")
}

/// The duration the entry writes for `pause` (at `<at>.<field>`), else `default`.
fn optional_duration(
    at: &str,
    pause: Pause,
    value: &Option<String>,
    default: Duration,
) -> Result<Duration, Invalid> {
    value.as_deref().map_or(Ok(default), |v| {
        duration(&field(at, pause.field()), pause, v)
    })
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

/// A worker count, by the rule of [`Count::WorkerThreads`].
fn workers(field: &str, n: i64) -> Result<usize, Invalid> {
    let n = count(field, Count::WorkerThreads, n)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// A Go duration at `field`, by the rule of `pause`.
fn duration(field: &str, pause: Pause, value: &str) -> Result<Duration, Invalid> {
    let nanos = cli::parse_go_duration(value).map_err(|reason| {
        invalid(
            field,
            Problem::Duration {
                value: value.to_owned(),
                reason,
            },
        )
    })?;
    pause
        .check(i128::from(nanos))
        .map_err(|r| refused(field, r, value.to_owned()))
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
    let duration = |pause: Pause, value: &Option<String>, default: Duration| {
        optional_duration(at, pause, value, default)
    };
    let lease_duration = duration(
        Pause::LeaseDuration,
        &o.lease_duration,
        flags.lease_duration,
    )?;
    let renew_deadline = duration(
        Pause::RenewDeadline,
        &o.renew_deadline,
        flags.renew_deadline,
    )?;
    let retry_period = duration(Pause::RetryPeriod, &o.retry_period, flags.retry_period)?;
    if o.namespace.as_deref() == Some("") {
        return Err(invalid(field(at, "namespace"), Problem::Empty));
    }
    if o.enabled == Some(false) {
        return Ok(None);
    }
    check_timing(at, o, [lease_duration, renew_deadline, retry_period])?;
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

/// [`timing::check`] of the lease duration, renew deadline and retry period the entry at `at`
/// (`o`) wrote or took from the flags. The message names the place that set each value it
/// compares, the entry's field or the flag; the error is placed at the first of them the entry
/// wrote, else at `leaderElection`, which turned leader election on with the flags' values.
fn check_timing(
    at: &str,
    o: &LeaderElectionSettings,
    [lease, renew, retry]: [Duration; 3],
) -> Result<(), Invalid> {
    let Err(refused) = timing::check(lease, renew, retry) else {
        return Ok(());
    };
    const PAUSES: [Pause; 3] = [
        Pause::LeaseDuration,
        Pause::RenewDeadline,
        Pause::RetryPeriod,
    ];
    let written = [
        o.lease_duration.is_some(),
        o.renew_deadline.is_some(),
        o.retry_period.is_some(),
    ];
    let names: [String; 3] = std::array::from_fn(|i| {
        if written[i] {
            PAUSES[i].field().to_owned()
        } else {
            format!("--{}", PAUSES[i].flag())
        }
    });
    let compared: &[usize] = match refused {
        TimingError::LeaseNotLongerThanRenewDeadline { .. } => &[0, 1],
        TimingError::RenewDeadlineNotLongerThanRetry { .. } => &[1, 2],
        TimingError::LeaseTooShort(_) | TimingError::Zero(TimingField::LeaseDuration) => &[0],
        TimingError::Zero(TimingField::RenewDeadline) => &[1],
        TimingError::Zero(TimingField::RetryPeriod) => &[2],
    };
    let blamed = compared
        .iter()
        .find(|&&i| written[i])
        .map_or_else(|| at.to_owned(), |&i| field(at, PAUSES[i].field()));
    let problem = match refused {
        // The entry's own value: the field says which.
        TimingError::LeaseTooShort(d) if written[0] => {
            Problem::LeaseTooShort(GoDuration(d).to_string())
        }
        _ => Problem::Timing { refused, names },
    };
    Err(invalid(blamed, problem))
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

    /// The flags' rule (`cli::rules`): a maximum below the start is accepted from the flags,
    /// from the entry, and from one of each, and every retry then waits the maximum.
    #[test]
    fn a_retry_maximum_below_the_start_is_accepted_from_every_source() {
        let flags = Args {
            retry_interval_start: Duration::from_secs(10),
            retry_interval_max: Duration::from_secs(1),
            ..Args::default()
        };
        let d = Defaults::with_identity(&flags, "test-host".to_owned());
        let entry = |start: Option<&str>, max: Option<&str>| DriverEntry {
            retry_interval_start: start.map(str::to_owned),
            retry_interval_max: max.map(str::to_owned),
            ..DriverEntry::default()
        };
        let secs = Duration::from_secs;
        for (e, want) in [
            // Neither written: the flags' pair, as for a discovered driver.
            (entry(None, None), (secs(10), secs(1))),
            (entry(Some("1h"), None), (secs(3600), secs(1))),
            (
                entry(None, Some("500ms")),
                (secs(10), Duration::from_millis(500)),
            ),
            (entry(Some("2s"), Some("1s")), (secs(2), secs(1))),
        ] {
            let mut s = d.settings_for("/csi.sock".parse().expect("address"));
            e.apply_durations("e", &mut s).expect("accepted");
            assert_eq!(
                (s.retry_interval_start, s.retry_interval_max),
                want,
                "{e:?}"
            );
        }
        let fine = DriverEntry {
            timeout: Some("7s".into()),
            reconcile_sync: Some("2m".into()),
            ..DriverEntry::default()
        };
        let mut s = defaults().settings_for("/csi.sock".parse().expect("address"));
        fine.apply_durations("e", &mut s).expect("valid");
        assert_eq!((s.timeout, s.reconcile_sync), (secs(7), secs(120)));
        let zero = entry(None, Some("0s"));
        let e = zero.apply_durations("e", &mut s).expect_err("zero");
        assert_eq!(e.field, "e.retryIntervalMax");
        assert_eq!(*e.problem, Problem::NotPositive("0s".into()));
    }

    /// A timing refused for values the flags set names the flags, at the `leaderElection`
    /// field that turned leader election on; a value the entry wrote is named by its field.
    #[test]
    fn a_refused_leader_election_timing_names_where_each_value_was_set() {
        // Leader election off in the flags, so their timing was not checked at start.
        let flags = Args {
            leader_election: cli::LeaderElection {
                renew_deadline: Duration::from_secs(20),
                retry_period: Duration::ZERO,
                ..cli::LeaderElection::default()
            },
            ..Args::default()
        };
        let d = Defaults::with_identity(&flags, "h".to_owned());
        let on = LeaderElection::Enabled(true);
        let e = leader_election("e.leaderElection", &on, &d).expect_err("the flags' timing");
        assert_eq!(e.field, "e.leaderElection");
        assert_eq!(
            e.problem.to_string(),
            "--leader-election-lease-duration (15s) must be greater than --leader-election-renew-deadline (20s)"
        );
        let lease = |v: &str| {
            LeaderElection::Settings(LeaderElectionSettings {
                lease_duration: Some(v.into()),
                ..LeaderElectionSettings::default()
            })
        };
        let e = leader_election("e.leaderElection", &lease("30s"), &d).expect_err("zero retry");
        assert_eq!(e.field, "e.leaderElection");
        assert_eq!(
            e.problem.to_string(),
            "--leader-election-retry-period must be greater than zero, not 0s"
        );
        let e = leader_election("e.leaderElection", &lease("10s"), &d).expect_err("short lease");
        assert_eq!(e.field, "e.leaderElection.leaseDuration");
        assert_eq!(
            e.problem.to_string(),
            "leaseDuration (10s) must be greater than --leader-election-renew-deadline (20s)"
        );
    }

    #[test]
    fn an_entrys_api_budget_takes_the_missing_half_from_the_flags_and_reads_zero_as_client_go() {
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
        // Zero as client-go reads it, as for the flags: 5 requests per second, a burst of 10.
        let zero = DriverEntry {
            kube_api_qps: Some(0.0),
            kube_api_burst: Some(0),
            ..DriverEntry::default()
        };
        assert_eq!(
            zero.api_budget("e", &d),
            Ok(Some(Limit::client_go(5.0, 10)))
        );
    }
}
