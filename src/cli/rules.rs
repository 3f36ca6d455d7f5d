//! The rule of every per-driver setting, stated once.
//!
//! A driver's settings come from the command-line flags (sidecar mode's driver, a discovered
//! driver without an entry of its own, and every field an entry leaves out) or from its
//! `drivers.yaml` entry. Both check a value with the same rule below ([`Pause`], [`Count`],
//! [`Rate`]), so a value means the same and is refused for the same reason wherever it is
//! written. A [`Refusal`] does not know where the value came from: the caller names the place
//! that set it, the flag (`--timeout must be greater than zero, not 0s`) or the file, line,
//! column and field (`drivers.yaml:4:5: drivers[0].timeout: must be greater than zero, not 0s`).
//!
//! Two rules relate settings:
//!
//! * `retry-interval-max` below `retry-interval-start` is accepted from every source and means
//!   what it means to external-attacher: client-go's per-item rate limiter caps the delay
//!   before it doubles it (`min(start × 2^n, max)`), so every retry waits `max`. Go accepts the
//!   pair, so a drop-in must; the hub's backoff ([`crate::backoff`]'s `Doubling`, used by the
//!   work queues) computes the same.
//! * The leader-election durations must satisfy [`crate::leader::timing::check`] wherever
//!   leader election is on for a driver; an error names the flag or the field of each value
//!   it compares.
//!
//! Every number also has an upper bound (the `MAX_*` constants below). A value Go's `flag`
//! package cannot parse keeps Go's error (exit 2); a value Go accepts that a rule refuses is a
//! configuration error (exit 1 for a flag, exit 2 with file:line:column for `drivers.yaml`).
//! Each bound sits far above what any deployment uses and far below what could exhaust memory
//! or overflow time arithmetic.

use std::time::Duration;

use crate::leader::timing;

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
/// serves. Infinity and NaN (which Go's `ParseFloat` accepts) are above it.
pub const MAX_API_QPS: f64 = 1_000_000.0;

/// Largest API burst (`--kube-api-burst`, `--hub-kube-api-burst`, `kubeApiBurst`,
/// `hubKubeApiBurst`): twice [`MAX_API_QPS`], the ratio of client-go's defaults (5 and 10) and
/// of the hub cap's default burst, so that the burst derived from the largest QPS is within it.
pub const MAX_API_BURST: i64 = 2_000_000;

/// Largest `--max-entries` / `maxEntries`: the CSI field `max_entries` is an int32 (Go casts the
/// flag to int32, so larger values wrap into nonsense).
pub const MAX_LIST_ENTRIES: i64 = i32::MAX as i64;

/// Largest `--max-grpc-log-length`: gRPC frames a message with a 32-bit length, so no response
/// is longer than this many bytes and a larger cap could never cut a log line. Zero and negative
/// values keep their meaning, no cap.
pub const MAX_GRPC_LOG_LENGTH: i64 = u32::MAX as i64;

/// Shortest `--leader-election-lease-duration` / `leaseDuration` (when leader election is on);
/// see [`timing::MIN_LEASE_DURATION`].
pub const MIN_LEASE_DURATION: Duration = timing::MIN_LEASE_DURATION;

/// Why a rule refuses a value. The caller says where the value was set and shows it as it was
/// written there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Zero or negative where only a positive value works.
    NotPositive,
    /// Negative where zero is the smallest meaningful value.
    Negative,
    /// Above the setting's bound, shown as the setting shows its values.
    TooLarge {
        /// The bound.
        max: String,
    },
}

// === durations ===

/// A per-driver duration: greater than zero and at most [`MAX_DURATION`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause {
    /// `--timeout` / `timeout`: the deadline of each ControllerPublish/Unpublish, Probe and
    /// reconcile pass. Zero expires before the call is sent, so nothing would ever attach
    /// (external-attacher accepts it and fails every call).
    Timeout,
    /// `--retry-interval-start` / `retryIntervalStart`: the first retry delay of a failed
    /// attach or detach. Zero retries a failing call at once, forever: the doubling of zero
    /// stays zero, and the driver and its cloud API get a busy loop.
    RetryIntervalStart,
    /// `--retry-interval-max` / `retryIntervalMax`: the cap of the retry delay. Zero is the
    /// same busy loop. Below the start it is accepted (see the module doc): every retry waits
    /// this long.
    RetryIntervalMax,
    /// `--reconcile-sync` / `reconcileSync`: the pause between reconciler passes. Zero runs the
    /// passes back to back, a ListVolumes call and a walk of every VolumeAttachment each.
    ReconcileSync,
    /// `--leader-election-lease-duration` / `leaderElection.leaseDuration`; with the two below,
    /// also [`timing::check`] where leader election is on.
    LeaseDuration,
    /// `--leader-election-renew-deadline` / `leaderElection.renewDeadline`.
    RenewDeadline,
    /// `--leader-election-retry-period` / `leaderElection.retryPeriod`.
    RetryPeriod,
}

impl Pause {
    /// The flag that sets it for every driver (without dashes).
    pub const fn flag(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::RetryIntervalStart => "retry-interval-start",
            Self::RetryIntervalMax => "retry-interval-max",
            Self::ReconcileSync => "reconcile-sync",
            Self::LeaseDuration => "leader-election-lease-duration",
            Self::RenewDeadline => "leader-election-renew-deadline",
            Self::RetryPeriod => "leader-election-retry-period",
        }
    }

    /// The `drivers.yaml` field that sets it for one driver (under `leaderElection` for the
    /// last three).
    pub const fn field(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::RetryIntervalStart => "retryIntervalStart",
            Self::RetryIntervalMax => "retryIntervalMax",
            Self::ReconcileSync => "reconcileSync",
            Self::LeaseDuration => "leaseDuration",
            Self::RenewDeadline => "renewDeadline",
            Self::RetryPeriod => "retryPeriod",
        }
    }

    /// The duration of `nanos` nanoseconds (negative from a file; a flag's negative value was
    /// already read as zero), if the rule takes it.
    pub fn check(self, nanos: i128) -> Result<Duration, Refusal> {
        if nanos <= 0 {
            return Err(Refusal::NotPositive);
        }
        within_bound(nanos)
    }

    /// Only the bound: the leader-election flags' value when leader election is off (it is
    /// then checked in full where a `drivers.yaml` entry turns leader election on).
    pub fn check_bound(self, d: Duration) -> Result<Duration, Refusal> {
        within_bound(d.as_nanos().try_into().unwrap_or(i128::MAX))
    }
}

/// A duration of at most [`MAX_DURATION`] (`nanos` not negative).
fn within_bound(nanos: i128) -> Result<Duration, Refusal> {
    match u64::try_from(nanos) {
        Ok(n) if Duration::from_nanos(n) <= MAX_DURATION => Ok(Duration::from_nanos(n)),
        _ => Err(Refusal::TooLarge {
            max: super::GoDuration(MAX_DURATION).to_string(),
        }),
    }
}

// === counts ===

/// A per-driver (or hub-wide) whole number within its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// `--worker-threads` / `workerThreads` (each pool's count): 1 to [`MAX_WORKERS`]; zero
    /// workers would never sync anything (Go refuses it too, with its own message).
    WorkerThreads,
    /// `--max-entries` / `maxEntries`: 0 (no limit) to [`MAX_LIST_ENTRIES`]; the CSI spec
    /// forbids a negative `max_entries`, so the driver would refuse every ListVolumes.
    MaxEntries,
    /// `--kube-api-burst` / `kubeApiBurst`: 0 to [`MAX_API_BURST`], read as client-go reads it
    /// (0 means 10), so that a sidecar's flags mean the same in an entry. Negative is refused:
    /// client-go accepts it and then fails every request.
    KubeApiBurst,
    /// `--hub-kube-api-burst` / `hubKubeApiBurst`: 0 (twice the cap's QPS) to
    /// [`MAX_API_BURST`].
    HubKubeApiBurst,
}

impl Count {
    /// The flag (without dashes).
    pub const fn flag(self) -> &'static str {
        match self {
            Self::WorkerThreads => "worker-threads",
            Self::MaxEntries => "max-entries",
            Self::KubeApiBurst => "kube-api-burst",
            Self::HubKubeApiBurst => "hub-kube-api-burst",
        }
    }

    /// The `drivers.yaml` field (top-level for the hub cap).
    pub const fn field(self) -> &'static str {
        match self {
            Self::WorkerThreads => "workerThreads",
            Self::MaxEntries => "maxEntries",
            Self::KubeApiBurst => "kubeApiBurst",
            Self::HubKubeApiBurst => "hubKubeApiBurst",
        }
    }

    const fn range(self) -> (i64, i64) {
        match self {
            Self::WorkerThreads => (1, MAX_WORKERS as i64),
            Self::MaxEntries => (0, MAX_LIST_ENTRIES),
            Self::KubeApiBurst | Self::HubKubeApiBurst => (0, MAX_API_BURST),
        }
    }

    /// `n` as a `u32`, if the rule takes it (every range is within `u32`).
    pub fn check(self, n: i64) -> Result<u32, Refusal> {
        let (min, max) = self.range();
        if n < min {
            return Err(if min == 0 {
                Refusal::Negative
            } else {
                Refusal::NotPositive
            });
        }
        if n > max {
            return Err(Refusal::TooLarge {
                max: max.to_string(),
            });
        }
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }
}

// === rates ===

/// A request rate: at most [`MAX_API_QPS`] (NaN and infinity are above it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// `--kube-api-qps` / `kubeApiQps`: a driver's own budget, read as client-go reads it (0
    /// means 5, negative means no limit), so that a sidecar's flags mean the same in an entry.
    KubeApiQps,
    /// `--hub-kube-api-qps` / `hubKubeApiQps`: the optional process-wide cap, 0 meaning none;
    /// negative is refused, as it has no meaning of its own.
    HubKubeApiQps,
}

impl Rate {
    /// The flag (without dashes).
    pub const fn flag(self) -> &'static str {
        match self {
            Self::KubeApiQps => "kube-api-qps",
            Self::HubKubeApiQps => "hub-kube-api-qps",
        }
    }

    /// The `drivers.yaml` field (top-level for the hub cap).
    pub const fn field(self) -> &'static str {
        match self {
            Self::KubeApiQps => "kubeApiQps",
            Self::HubKubeApiQps => "hubKubeApiQps",
        }
    }

    /// `qps`, if the rule takes it.
    pub fn check(self, qps: f64) -> Result<f64, Refusal> {
        // NaN is not at most the bound either.
        if qps.is_nan() || qps > MAX_API_QPS {
            return Err(Refusal::TooLarge {
                max: MAX_API_QPS.to_string(),
            });
        }
        if qps < 0.0 && self == Self::HubKubeApiQps {
            return Err(Refusal::Negative);
        }
        Ok(qps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i128 = 1_000_000_000;

    #[test]
    fn a_pause_is_positive_and_at_most_a_day() {
        for p in [
            Pause::Timeout,
            Pause::RetryIntervalStart,
            Pause::RetryIntervalMax,
            Pause::ReconcileSync,
            Pause::LeaseDuration,
        ] {
            assert_eq!(p.check(0), Err(Refusal::NotPositive), "{p:?}");
            assert_eq!(p.check(-SECOND), Err(Refusal::NotPositive), "{p:?}");
            assert_eq!(p.check(1), Ok(Duration::from_nanos(1)), "{p:?}");
            assert_eq!(p.check(86_400 * SECOND), Ok(MAX_DURATION), "{p:?}");
            let too_large = Err(Refusal::TooLarge {
                max: "24h0m0s".into(),
            });
            assert_eq!(p.check(86_400 * SECOND + 1), too_large, "{p:?}");
            assert_eq!(p.check(i128::MAX), too_large, "{p:?}");
            assert_eq!(p.check_bound(Duration::ZERO), Ok(Duration::ZERO));
            assert_eq!(p.check_bound(Duration::MAX), too_large);
        }
    }

    #[test]
    fn counts_have_their_ranges_and_the_bursts_keep_client_gos_zero() {
        let large = |max: &str| {
            Err(Refusal::TooLarge {
                max: max.to_owned(),
            })
        };
        assert_eq!(Count::WorkerThreads.check(0), Err(Refusal::NotPositive));
        assert_eq!(Count::WorkerThreads.check(10_000), Ok(10_000));
        assert_eq!(Count::WorkerThreads.check(10_001), large("10000"));
        assert_eq!(Count::MaxEntries.check(-1), Err(Refusal::Negative));
        assert_eq!(Count::MaxEntries.check(0), Ok(0));
        assert_eq!(
            Count::MaxEntries.check(i64::from(i32::MAX) + 1),
            large("2147483647")
        );
        for burst in [Count::KubeApiBurst, Count::HubKubeApiBurst] {
            assert_eq!(burst.check(0), Ok(0), "{burst:?}");
            assert_eq!(burst.check(-1), Err(Refusal::Negative), "{burst:?}");
            assert_eq!(burst.check(2_000_001), large("2000000"), "{burst:?}");
        }
    }

    #[test]
    fn a_drivers_qps_may_be_zero_or_negative_the_hub_caps_not_negative() {
        assert_eq!(Rate::KubeApiQps.check(0.0), Ok(0.0));
        assert_eq!(
            Rate::KubeApiQps.check(f64::NEG_INFINITY),
            Ok(f64::NEG_INFINITY)
        );
        assert_eq!(Rate::HubKubeApiQps.check(0.0), Ok(0.0));
        assert_eq!(Rate::HubKubeApiQps.check(-1.0), Err(Refusal::Negative));
        for rate in [Rate::KubeApiQps, Rate::HubKubeApiQps] {
            for q in [f64::NAN, f64::INFINITY, 1e6 + 1.0] {
                assert_eq!(
                    rate.check(q),
                    Err(Refusal::TooLarge {
                        max: "1000000".into()
                    }),
                    "{rate:?} {q}"
                );
            }
        }
    }

    /// The retry pair needs no rule of its own: a maximum below the start caps every delay, as
    /// client-go's `ItemExponentialFailureRateLimiter.When` does (`if calculated > maxDelay {
    /// return maxDelay }`, before any doubling can matter).
    #[test]
    fn a_retry_maximum_below_the_start_makes_every_delay_the_maximum() {
        let rule = crate::backoff::Doubling::new(Duration::from_secs(10), Duration::from_secs(1));
        for failures in [1, 2, 3, 40] {
            assert_eq!(rule.after(failures), Duration::from_secs(1));
        }
    }
}
