//! The hub's per-driver series: work queues, leadership, driver health, end-to-end latency and
//! API budgets. Every series carries `driver_name`, and a driver no longer served loses all of
//! them.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use parking_lot::Mutex;
use prometheus::core::Collector;
use prometheus::{
    CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
};

use super::api::{ApiObserver, Observer};
use super::series::remove_driver_series;

/// Exponential buckets of the work-queue histograms (component-base:
/// 1e-8 × 10^k, k = 0..9).
fn workqueue_buckets() -> Vec<f64> {
    (0..10).map(|k| 1e-8 * 10f64.powi(k)).collect()
}

/// Buckets of the end-to-end attach/detach latency, in seconds.
pub const END_TO_END_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// Per-driver series of the hub: queues, leadership, driver health and
/// end-to-end latency. Every series carries `driver_name`.
#[derive(Clone, Debug)]
pub struct HubMetrics {
    /// `workqueue_depth{name, driver_name, pool}`.
    pub queue_depth: prometheus::GaugeVec,
    /// `workqueue_oldest_item_age_seconds{name, driver_name, pool}`: age of the
    /// oldest waiting key (the backlog signal of external-attacher #706).
    pub queue_oldest_age: prometheus::GaugeVec,
    /// `workqueue_longest_running_processor_seconds{name, driver_name, pool}`.
    pub queue_longest_running: prometheus::GaugeVec,
    /// `workqueue_retries_total{name, driver_name}`.
    pub queue_retries: prometheus::IntCounterVec,
    /// `workqueue_work_duration_seconds{name, driver_name}`.
    pub queue_work_duration: HistogramVec,
    /// `workqueue_queue_duration_seconds{name, driver_name}`: from ready to
    /// handed to a worker.
    pub queue_wait_duration: HistogramVec,
    /// `workqueue_adds_total{name, driver_name}`.
    pub queue_adds: prometheus::IntCounterVec,
    /// `leader_election_master_status{name, driver_name}`: 1 leading, 0 not.
    pub leader: prometheus::GaugeVec,
    /// `attacher_hub_driver_up{driver_name}`: 1 when the driver is ready
    /// (standby or leading), else 0.
    pub driver_up: prometheus::GaugeVec,
    /// `attacher_hub_task_panics_total{driver_name, task}`: panics caught in a
    /// driver's sync (`attach`, `detach`, `pv`) or life (`driver`).
    pub panics: prometheus::IntCounterVec,
    /// `attacher_hub_attach_duration_seconds{driver_name}`: VA creation to
    /// `attached=true` written by us.
    pub attach_e2e: HistogramVec,
    /// `attacher_hub_detach_duration_seconds{driver_name}`: VA deletion
    /// timestamp to detached.
    pub detach_e2e: HistogramVec,
    /// `attacher_hub_api_budget_wait_seconds{driver_name}`: time each API request of a driver
    /// waited for its API budget (its own, then the hub's cap); one observation per request.
    pub api_budget_wait: HistogramVec,
    /// `attacher_hub_api_throttled_requests_total{driver_name, limiter}`: requests that had to
    /// wait, by the limit that held them (`driver`: its own budget, `hub`: the process cap).
    pub api_throttled: prometheus::IntCounterVec,
    /// `attacher_hub_api_budget_qps{driver_name}`: the driver's own API budget in requests per
    /// second (absent when it has no limit).
    pub api_budget_qps: prometheus::GaugeVec,
    /// `attacher_hub_api_requests_total{driver_name, verb, resource, code}`: API requests made
    /// for a driver, by HTTP status code (`error` when no answer came).
    pub api_requests: prometheus::IntCounterVec,
    /// `attacher_hub_api_too_many_requests_total{driver_name}`: answers 429 Too Many Requests
    /// the API server gave the driver's requests (work and Lease calls; API Priority and
    /// Fairness turning them away).
    pub api_too_many_requests: prometheus::IntCounterVec,
    /// `attacher_hub_api_retry_after_wait_seconds_total{driver_name}`: time the driver's
    /// requests waited because the API server asked (`Retry-After`), retries and held work.
    pub api_retry_after_wait: prometheus::CounterVec,
    /// `attacher_hub_lease_guard_blocked{driver_name, lease_namespace, holder}`: 1 while another
    /// holder renews the driver's Lease in another namespace (labels: that Lease's namespace and
    /// holder), so this replica does not lead it; else one series with empty labels and value 0.
    /// Only for drivers with leader election. The label is not `namespace`: under Prometheus
    /// Operator (`honor_labels: false`) the target's own `namespace` label (the pod's) would
    /// replace it, and the Lease's would end up as `exported_namespace`.
    pub lease_guard_blocked: prometheus::GaugeVec,
    /// `attacher_hub_lease_guard_available{driver_name}`: 1 when the cross-namespace Lease guard
    /// can list Leases in all namespaces, 0 when it cannot (RBAC) and so does not guard.
    pub lease_guard_available: prometheus::GaugeVec,
    /// `attacher_hub_lease_held_by_other{driver_name}`: 1 while this replica stands by because
    /// another holder keeps the driver's Lease alive: the holder of its own Lease renews it (a
    /// replica of this hub, or the driver's Go external-attacher during a migration), or the
    /// cross-namespace Lease guard blocks for a Lease of the same name renewed elsewhere. 0 while
    /// it leads, or stands by with nobody renewing the Lease (a loss). Only for drivers with
    /// leader election; `AttacherHubLeaseLost` leaves out the drivers where it is 1.
    pub lease_held_by_other: prometheus::GaugeVec,
    /// The `lease_namespace` and `holder` labels of each driver's `lease_guard_blocked` series, so
    /// that a refresh that changes nothing costs one lookup (scanning the family for each
    /// driver every second cost a third of an idle hub's CPU at 100 drivers).
    guard_shown: Arc<Mutex<HashMap<String, [String; 2]>>>,
}

/// Buckets of the API budget wait, in seconds: from "no wait" to minutes of backlog.
pub const API_BUDGET_WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Labels of the queue gauges: the queue, its driver and the worker pool.
const POOL_LABELS: &[&str] = &["name", "driver_name", "pool"];
/// Labels of the other queue series and of the Lease's leadership.
const NAMED_LABELS: &[&str] = &["name", "driver_name"];
/// Labels of a series that is the driver's alone.
const DRIVER_LABELS: &[&str] = &["driver_name"];

fn gauge(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    GaugeVec::new(Opts::new(name, help), labels)
}

fn counter(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn histogram(
    name: &str,
    help: &str,
    buckets: Vec<f64>,
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
}

/// The work queues' series, under client-go's names.
struct QueueSeries {
    depth: GaugeVec,
    oldest_age: GaugeVec,
    longest_running: GaugeVec,
    retries: IntCounterVec,
    work_duration: HistogramVec,
    wait_duration: HistogramVec,
    adds: IntCounterVec,
}

impl QueueSeries {
    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            depth: gauge("workqueue_depth", "Current depth of workqueue", POOL_LABELS)?,
            oldest_age: gauge(
                "workqueue_oldest_item_age_seconds",
                "How long the oldest key has been waiting in the workqueue",
                POOL_LABELS,
            )?,
            longest_running: gauge(
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                POOL_LABELS,
            )?,
            retries: counter(
                "workqueue_retries_total",
                "Total number of retries handled by workqueue",
                NAMED_LABELS,
            )?,
            work_duration: histogram(
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
                workqueue_buckets(),
                NAMED_LABELS,
            )?,
            wait_duration: histogram(
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested.",
                workqueue_buckets(),
                NAMED_LABELS,
            )?,
            adds: counter(
                "workqueue_adds_total",
                "Total number of adds handled by workqueue",
                NAMED_LABELS,
            )?,
        })
    }
}

/// A driver's leadership, health, caught panics and end-to-end latency.
struct DriverSeries {
    leader: GaugeVec,
    up: GaugeVec,
    panics: IntCounterVec,
    attach_e2e: HistogramVec,
    detach_e2e: HistogramVec,
}

impl DriverSeries {
    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            leader: gauge(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
                NAMED_LABELS,
            )?,
            up: gauge(
                "attacher_hub_driver_up",
                "1 if the CSI driver is connected and ready, else 0",
                DRIVER_LABELS,
            )?,
            panics: counter(
                "attacher_hub_task_panics_total",
                "Panics caught in a driver's tasks; each one is a bug worth reporting",
                &["driver_name", "task"],
            )?,
            attach_e2e: histogram(
                "attacher_hub_attach_duration_seconds",
                "Time from VolumeAttachment creation to attached=true",
                END_TO_END_BUCKETS.to_vec(),
                DRIVER_LABELS,
            )?,
            detach_e2e: histogram(
                "attacher_hub_detach_duration_seconds",
                "Time from VolumeAttachment deletion to detached",
                END_TO_END_BUCKETS.to_vec(),
                DRIVER_LABELS,
            )?,
        })
    }
}

/// A driver's API budget and the API server's answers to its requests.
struct ApiSeries {
    budget_wait: HistogramVec,
    throttled: IntCounterVec,
    budget_qps: GaugeVec,
    requests: IntCounterVec,
    too_many_requests: IntCounterVec,
    retry_after_wait: CounterVec,
}

impl ApiSeries {
    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            budget_wait: histogram(
                "attacher_hub_api_budget_wait_seconds",
                "Time an API request of the driver waited for API budget (the driver's own, then the hub's cap)",
                API_BUDGET_WAIT_BUCKETS.to_vec(),
                DRIVER_LABELS,
            )?,
            throttled: counter(
                "attacher_hub_api_throttled_requests_total",
                "API requests of the driver that had to wait for budget, by the limit that held them (driver or hub)",
                &["driver_name", "limiter"],
            )?,
            budget_qps: gauge(
                "attacher_hub_api_budget_qps",
                "The driver's own API budget in requests per second (absent: no limit)",
                DRIVER_LABELS,
            )?,
            requests: counter(
                "attacher_hub_api_requests_total",
                "API requests made for the driver, by verb, resource and HTTP status code (error: no answer)",
                &["driver_name", "verb", "resource", "code"],
            )?,
            too_many_requests: counter(
                "attacher_hub_api_too_many_requests_total",
                "Answers 429 Too Many Requests the API server gave the driver's requests (API Priority and Fairness turning them away)",
                DRIVER_LABELS,
            )?,
            retry_after_wait: CounterVec::new(
                Opts::new(
                    "attacher_hub_api_retry_after_wait_seconds_total",
                    "Seconds the driver's API requests waited because the API server asked them to (Retry-After)",
                ),
                DRIVER_LABELS,
            )?,
        })
    }
}

/// Who keeps a driver's Lease, as the cross-namespace Lease guard and the elector see it.
struct LeaseSeries {
    guard_blocked: GaugeVec,
    guard_available: GaugeVec,
    held_by_other: GaugeVec,
}

impl LeaseSeries {
    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            guard_blocked: gauge(
                "attacher_hub_lease_guard_blocked",
                "1 while another holder renews the driver's Lease in another namespace (labels lease_namespace, holder), so this replica does not lead the driver",
                &["driver_name", "lease_namespace", "holder"],
            )?,
            guard_available: gauge(
                "attacher_hub_lease_guard_available",
                "1 if the cross-namespace Lease guard can list Leases in all namespaces, 0 if not (it then does not guard)",
                DRIVER_LABELS,
            )?,
            held_by_other: gauge(
                "attacher_hub_lease_held_by_other",
                "1 while this replica stands by because another holder renews the driver's Lease (its own, or one of the same name in another namespace); 0 while it leads or nobody renews the Lease",
                DRIVER_LABELS,
            )?,
        })
    }
}

/// What the Lease guard of one driver says, as the gauges show it: the guard itself lives with
/// leader election, which this module does not use (the hub translates).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardGauge<'a> {
    /// The namespace and holder of the other Lease that blocks the driver, if one does.
    pub blocked_by: Option<(&'a str, &'a str)>,
    /// Whether the guard can read the other namespaces' Leases at all.
    pub available: bool,
}

impl HubMetrics {
    /// Creates the series and registers them on `registry`: all of them are created before the
    /// first is registered, then registered in the order of [`HubMetrics::collectors`].
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let queue = QueueSeries::new()?;
        let driver = DriverSeries::new()?;
        let api = ApiSeries::new()?;
        let lease = LeaseSeries::new()?;
        let this = Self {
            queue_depth: queue.depth,
            queue_oldest_age: queue.oldest_age,
            queue_longest_running: queue.longest_running,
            queue_retries: queue.retries,
            queue_work_duration: queue.work_duration,
            queue_wait_duration: queue.wait_duration,
            queue_adds: queue.adds,
            leader: driver.leader,
            driver_up: driver.up,
            panics: driver.panics,
            attach_e2e: driver.attach_e2e,
            detach_e2e: driver.detach_e2e,
            api_budget_wait: api.budget_wait,
            api_throttled: api.throttled,
            api_budget_qps: api.budget_qps,
            api_requests: api.requests,
            api_too_many_requests: api.too_many_requests,
            api_retry_after_wait: api.retry_after_wait,
            lease_guard_blocked: lease.guard_blocked,
            lease_guard_available: lease.guard_available,
            lease_held_by_other: lease.held_by_other,
            guard_shown: Arc::default(),
        };
        for collector in this.collectors() {
            registry.register(collector)?;
        }
        Ok(this)
    }

    /// Every series family, in the order they are registered.
    fn collectors(&self) -> [Box<dyn Collector>; 21] {
        [
            Box::new(self.queue_depth.clone()),
            Box::new(self.queue_oldest_age.clone()),
            Box::new(self.queue_longest_running.clone()),
            Box::new(self.queue_retries.clone()),
            Box::new(self.queue_work_duration.clone()),
            Box::new(self.queue_wait_duration.clone()),
            Box::new(self.queue_adds.clone()),
            Box::new(self.leader.clone()),
            Box::new(self.driver_up.clone()),
            Box::new(self.panics.clone()),
            Box::new(self.attach_e2e.clone()),
            Box::new(self.detach_e2e.clone()),
            Box::new(self.api_budget_wait.clone()),
            Box::new(self.api_throttled.clone()),
            Box::new(self.api_budget_qps.clone()),
            Box::new(self.api_requests.clone()),
            Box::new(self.api_too_many_requests.clone()),
            Box::new(self.api_retry_after_wait.clone()),
            Box::new(self.lease_guard_blocked.clone()),
            Box::new(self.lease_guard_available.clone()),
            Box::new(self.lease_held_by_other.clone()),
        ]
    }

    /// Sets `leader_election_master_status` of a driver's Lease.
    pub fn set_leader(&self, driver: &str, leading: bool) {
        let lease = crate::names::lease_name(driver);
        self.leader
            .with_label_values(&[lease.as_str(), driver])
            .set(if leading { 1.0 } else { 0.0 });
    }

    /// Records how long one key took.
    pub fn observe_work(&self, driver: &str, queue: &str, elapsed: std::time::Duration) {
        self.queue_work_duration
            .with_label_values(&[queue, driver])
            .observe(elapsed.as_secs_f64());
    }

    /// Records how long a key waited before a worker took it.
    pub fn observe_wait(&self, driver: &str, queue: &str, waited: std::time::Duration) {
        self.queue_wait_duration
            .with_label_values(&[queue, driver])
            .observe(waited.as_secs_f64());
    }

    /// Removes every series of `driver`: it is no longer served (removed from the driver file,
    /// its socket gone), so its gauges must not keep their last values.
    pub fn remove_driver(&self, driver: &str) {
        remove_driver_series(&self.queue_depth, driver);
        remove_driver_series(&self.queue_oldest_age, driver);
        remove_driver_series(&self.queue_longest_running, driver);
        remove_driver_series(&self.queue_retries, driver);
        remove_driver_series(&self.queue_work_duration, driver);
        remove_driver_series(&self.queue_wait_duration, driver);
        remove_driver_series(&self.queue_adds, driver);
        remove_driver_series(&self.leader, driver);
        remove_driver_series(&self.driver_up, driver);
        remove_driver_series(&self.panics, driver);
        remove_driver_series(&self.attach_e2e, driver);
        remove_driver_series(&self.detach_e2e, driver);
        remove_driver_series(&self.api_budget_wait, driver);
        remove_driver_series(&self.api_throttled, driver);
        remove_driver_series(&self.api_budget_qps, driver);
        remove_driver_series(&self.api_requests, driver);
        remove_driver_series(&self.api_too_many_requests, driver);
        remove_driver_series(&self.api_retry_after_wait, driver);
        remove_driver_series(&self.lease_guard_blocked, driver);
        remove_driver_series(&self.lease_guard_available, driver);
        remove_driver_series(&self.lease_held_by_other, driver);
        self.guard_shown.lock().remove(driver);
    }

    /// Publishes what the cross-namespace Lease guard of `driver` says (`None`: the driver has
    /// no guard, so no series): one `lease_guard_blocked` series, naming the other Lease's
    /// namespace and holder while it blocks, and `lease_guard_available`.
    pub fn set_lease_guard(&self, driver: &str, view: Option<GuardGauge<'_>>) {
        let Some(view) = view else {
            if self.guard_shown.lock().remove(driver).is_some() {
                remove_driver_series(&self.lease_guard_blocked, driver);
                remove_driver_series(&self.lease_guard_available, driver);
            }
            return;
        };
        let (namespace, holder) = view.blocked_by.unwrap_or(("", ""));
        let current = [driver, namespace, holder];
        // Keep exactly one series per driver: drop the previous label set when it changes.
        {
            let mut shown = self.guard_shown.lock();
            match shown.get_mut(driver) {
                Some([ns, h]) if ns == namespace && h == holder => {}
                Some(labels) => {
                    let [ns, h] = labels;
                    let _ = self.lease_guard_blocked.remove_label_values(&[
                        driver,
                        ns.as_str(),
                        h.as_str(),
                    ]);
                    *labels = [namespace.to_string(), holder.to_string()];
                }
                None => {
                    shown.insert(
                        driver.to_string(),
                        [namespace.to_string(), holder.to_string()],
                    );
                }
            }
        }
        self.lease_guard_blocked
            .with_label_values(&current)
            .set(if view.blocked_by.is_some() { 1.0 } else { 0.0 });
        self.lease_guard_available
            .with_label_values(&[driver])
            .set(if view.available { 1.0 } else { 0.0 });
    }

    /// Where the API budget of `driver` reports its waits; also publishes its limit (`qps`:
    /// requests per second, `None` for no limit).
    pub fn api_observer(&self, driver: &str, qps: Option<f64>) -> Box<dyn Observer> {
        match qps {
            Some(qps) => self.api_budget_qps.with_label_values(&[driver]).set(qps),
            None => {
                let _ = self.api_budget_qps.remove_label_values(&[driver]);
            }
        }
        Box::new(ApiObserver {
            wait: self.api_budget_wait.with_label_values(&[driver]),
            throttled_driver: self.api_throttled.with_label_values(&[driver, "driver"]),
            throttled_hub: self.api_throttled.with_label_values(&[driver, "hub"]),
            too_many_requests: self.api_too_many_requests.with_label_values(&[driver]),
            retry_after_wait: self.api_retry_after_wait.with_label_values(&[driver]),
        })
    }

    /// Counts one caught panic.
    pub fn count_panic(&self, driver: &str, task: &str) {
        self.panics.with_label_values(&[driver, task]).inc();
    }

    /// Counts one rate-limited re-add.
    pub fn count_retry(&self, driver: &str, queue: &str) {
        self.queue_retries.with_label_values(&[queue, driver]).inc();
    }

    /// Records the end-to-end latency of a VA a sync marked attached: from its creation
    /// timestamp.
    pub fn observe_attached(&self, driver: &str, created: Option<&Time>) {
        observe_since(&self.attach_e2e, driver, created);
    }

    /// Records the end-to-end latency of a VA a sync detached: from its deletion timestamp.
    pub fn observe_detached(&self, driver: &str, deleted: Option<&Time>) {
        observe_since(&self.detach_e2e, driver, deleted);
    }
}

/// Observes the seconds since `since` (none when absent; never negative).
fn observe_since(h: &HistogramVec, driver: &str, since: Option<&Time>) {
    let Some(since) = since else { return };
    let now = k8s_openapi::jiff::Timestamp::now();
    let seconds = now.duration_since(since.0).as_secs_f64().max(0.0);
    h.with_label_values(&[driver]).observe(seconds);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::csi::{CsiOperations, tests::render};

    #[test]
    fn the_families_are_registered_queues_first_then_driver_api_and_lease() {
        let registry = Registry::new();
        let m = HubMetrics::register(&registry).unwrap();
        let names: Vec<String> = m
            .collectors()
            .iter()
            .map(|c| c.desc()[0].fq_name.clone())
            .collect();
        assert_eq!(
            names,
            [
                "workqueue_depth",
                "workqueue_oldest_item_age_seconds",
                "workqueue_longest_running_processor_seconds",
                "workqueue_retries_total",
                "workqueue_work_duration_seconds",
                "workqueue_queue_duration_seconds",
                "workqueue_adds_total",
                "leader_election_master_status",
                "attacher_hub_driver_up",
                "attacher_hub_task_panics_total",
                "attacher_hub_attach_duration_seconds",
                "attacher_hub_detach_duration_seconds",
                "attacher_hub_api_budget_wait_seconds",
                "attacher_hub_api_throttled_requests_total",
                "attacher_hub_api_budget_qps",
                "attacher_hub_api_requests_total",
                "attacher_hub_api_too_many_requests_total",
                "attacher_hub_api_retry_after_wait_seconds_total",
                "attacher_hub_lease_guard_blocked",
                "attacher_hub_lease_guard_available",
                "attacher_hub_lease_held_by_other",
            ]
        );
        // A second hub on the same registry is refused at its first family.
        assert!(matches!(
            HubMetrics::register(&registry),
            Err(prometheus::Error::AlreadyReg)
        ));
    }

    #[test]
    fn end_to_end_latency_is_observed_from_creation_and_from_deletion() {
        let registry = Registry::new();
        let m = HubMetrics::register(&registry).unwrap();
        // Without the timestamp there is nothing to measure from.
        m.observe_attached("d", None);
        m.observe_detached("d", None);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        m.observe_attached("d", Some(&now));
        m.observe_detached("d", Some(&now));
        let count = |h: &HistogramVec| h.with_label_values(&["d"]).get_sample_count();
        assert_eq!((count(&m.attach_e2e), count(&m.detach_e2e)), (1, 1));
    }

    #[test]
    fn the_lease_guard_keeps_one_blocked_series_per_driver_naming_the_other_lease() {
        let registry = Registry::new();
        let m = HubMetrics::register(&registry).unwrap();
        let clear = GuardGauge {
            blocked_by: None,
            available: true,
        };
        let blocked = GuardGauge {
            blocked_by: Some(("kube-system", "go-1")),
            available: true,
        };
        let unavailable = GuardGauge {
            blocked_by: None,
            available: false,
        };
        let series = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("attacher_hub_lease_guard"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        m.set_lease_guard("d", Some(clear));
        assert_eq!(
            series(&render(&registry)),
            [
                r#"attacher_hub_lease_guard_available{driver_name="d"} 1"#,
                r#"attacher_hub_lease_guard_blocked{driver_name="d",holder="",lease_namespace=""} 0"#,
            ]
        );
        m.set_lease_guard("d", Some(blocked));
        assert_eq!(
            series(&render(&registry)),
            [
                r#"attacher_hub_lease_guard_available{driver_name="d"} 1"#,
                r#"attacher_hub_lease_guard_blocked{driver_name="d",holder="go-1",lease_namespace="kube-system"} 1"#,
            ]
        );
        m.set_lease_guard("d", Some(unavailable));
        assert_eq!(
            series(&render(&registry)),
            [
                r#"attacher_hub_lease_guard_available{driver_name="d"} 0"#,
                r#"attacher_hub_lease_guard_blocked{driver_name="d",holder="",lease_namespace=""} 0"#,
            ]
        );
        // No leader election, no guard, no series.
        m.set_lease_guard("d", None);
        assert!(series(&render(&registry)).is_empty());
    }

    #[test]
    fn the_api_servers_pushback_is_counted_per_driver_from_its_first_connection() {
        let registry = Registry::new();
        let m = HubMetrics::register(&registry).unwrap();
        let a = m.api_observer("a", Some(5.0));
        let _b = m.api_observer("b", None);
        a.too_many_requests();
        a.too_many_requests();
        a.retry_after_waited(std::time::Duration::from_millis(2500));
        let text = render(&registry);
        for line in [
            r#"attacher_hub_api_too_many_requests_total{driver_name="a"} 2"#,
            r#"attacher_hub_api_retry_after_wait_seconds_total{driver_name="a"} 2.5"#,
            // A driver never throttled has its series at 0 (alerts and rates see it).
            r#"attacher_hub_api_too_many_requests_total{driver_name="b"} 0"#,
            r#"attacher_hub_api_retry_after_wait_seconds_total{driver_name="b"} 0"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        m.remove_driver("a");
        let text = render(&registry);
        assert!(!text.contains(r#"{driver_name="a"}"#), "{text}");
    }

    #[test]
    fn a_removed_driver_leaves_no_series_and_the_others_keep_theirs() {
        let registry = Registry::new();
        let m = HubMetrics::register(&registry).unwrap();
        let ops = CsiOperations::register(&registry).unwrap();
        for d in ["gone", "kept"] {
            m.driver_up.with_label_values(&[d]).set(1.0);
            m.queue_depth
                .with_label_values(&["csi-attacher-va", d, "attach"])
                .set(3.0);
            m.set_leader(d, true);
            m.api_requests
                .with_label_values(&[d, "PATCH", "volumeattachments", "200"])
                .inc();
            ops.observe(
                d,
                "/csi.v1.Controller/ControllerPublishVolume",
                "OK",
                None,
                0.1,
            );
        }
        m.remove_driver("gone");
        ops.remove_driver("gone");
        let text = render(&registry);
        assert!(!text.contains("\"gone\""), "{text}");
        assert!(text.matches("driver_name=\"kept\"").count() >= 5, "{text}");
    }
}
