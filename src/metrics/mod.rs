//! Prometheus metrics, on one non-global registry created at start-up.
//!
//! Series names, labels and buckets follow the Go sidecars so that existing
//! dashboards and alerts keep working.

use prometheus::{
    HistogramOpts, HistogramVec, Registry,
    core::{Collector, Desc},
    proto::MetricFamily,
};

/// Buckets of `csi_sidecar_operations_seconds`, in seconds (csi-lib-utils).
pub const CSI_OPERATIONS_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Name of the CSI call histogram.
pub const CSI_OPERATIONS_NAME: &str = "csi_sidecar_operations_seconds";
const CSI_OPERATIONS_HELP: &str =
    "[ALPHA] Container Storage Interface operation duration with gRPC error code status total";

/// `driver_name` label value before the driver has told its name.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

/// `csi_sidecar_operations_seconds`: one sample per CSI call.
///
/// Drivers that are CSI-migration targets get the extra label `migrated`, as
/// in the Go sidecar; the others do not. Both kinds are exposed as one metric
/// family, which a single collector makes possible (the registry would refuse
/// two collectors of one name with different label names).
#[derive(Clone)]
pub struct CsiOperations {
    /// Series of drivers that are not migration targets.
    plain: HistogramVec,
    /// Series of migration-target drivers (extra `migrated` label).
    migrated: HistogramVec,
}

impl CsiOperations {
    /// Creates the histogram and registers it on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let opts = || {
            HistogramOpts::new(CSI_OPERATIONS_NAME, CSI_OPERATIONS_HELP)
                .buckets(CSI_OPERATIONS_BUCKETS.to_vec())
        };
        let this = Self {
            plain: HistogramVec::new(opts(), &["driver_name", "method_name", "grpc_status_code"])?,
            migrated: HistogramVec::new(
                opts(),
                &["driver_name", "method_name", "grpc_status_code", "migrated"],
            )?,
        };
        registry.register(Box::new(this.clone()))?;
        Ok(this)
    }

    /// Records one call. `migrated` is `None` for drivers that are not
    /// migration targets, else whether the call was for a translated volume.
    pub fn observe(
        &self,
        driver: &str,
        method: &str,
        code: &str,
        migrated: Option<bool>,
        seconds: f64,
    ) {
        match migrated {
            None => self
                .plain
                .with_label_values(&[driver, method, code])
                .observe(seconds),
            Some(m) => self
                .migrated
                .with_label_values(&[driver, method, code, if m { "true" } else { "false" }])
                .observe(seconds),
        }
    }
}

impl CsiOperations {
    /// Removes every series of `driver` (a driver that is no longer served).
    pub fn remove_driver(&self, driver: &str) {
        remove_driver_series(&self.plain, driver);
        remove_driver_series(&self.migrated, driver);
    }
}

/// Removes the series of `vec` whose `driver_name` is `driver`, whatever their other labels.
fn remove_driver_series<T: prometheus::core::MetricVecBuilder>(
    vec: &prometheus::core::MetricVec<T>,
    driver: &str,
) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("driver_name") == Some(&driver) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

impl std::fmt::Debug for CsiOperations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiOperations").finish_non_exhaustive()
    }
}

impl Collector for CsiOperations {
    fn desc(&self) -> Vec<&Desc> {
        // One descriptor for the family; the registry only uses it to refuse
        // duplicates.
        self.plain.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.plain.collect();
        for mut family in self.migrated.collect() {
            match families.iter_mut().find(|f| f.name() == family.name()) {
                Some(existing) => existing.mut_metric().extend(family.take_metric()),
                None => families.push(family),
            }
        }
        families.retain(|f| !f.get_metric().is_empty());
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    fn render(registry: &Registry) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut buf)
            .expect("text encoding of gathered metrics");
        String::from_utf8(buf).expect("metrics are UTF-8")
    }

    #[test]
    fn plain_and_migrated_series_share_one_family() {
        let registry = Registry::new();
        let ops = CsiOperations::register(&registry).unwrap();
        ops.observe("a.csi", "/csi.v1.Identity/Probe", "OK", None, 0.2);
        ops.observe(
            "pd.csi.storage.gke.io",
            "/csi.v1.Controller/ControllerPublishVolume",
            "OK",
            Some(true),
            3.0,
        );
        let text = render(&registry);
        assert_eq!(
            text.matches("# TYPE csi_sidecar_operations_seconds histogram")
                .count(),
            1
        );
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_count{driver_name="a.csi",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#
        ), "{text}");
        assert!(text.contains(r#"migrated="true""#), "{text}");
        for le in ["0.1", "0.25", "15", "120", "600", "+Inf"] {
            assert!(
                text.contains(&format!("le=\"{le}\"")),
                "bucket {le} missing"
            );
        }
    }

    #[test]
    fn end_to_end_latency_is_observed_once_per_attach_and_detach() {
        use crate::controller::Synced;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let registry = Registry::new();
        let m = HubMetrics::register(&registry).unwrap();
        let mut va = k8s_openapi::api::storage::v1::VolumeAttachment::default();
        va.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        m.observe_sync("d", &va, Synced::Attached);
        // The echo of our own write, a resync, a forced re-publish: no new attach.
        m.observe_sync("d", &va, Synced::Unchanged);
        m.observe_sync("d", &va, Synced::Unchanged);
        va.metadata.deletion_timestamp = va.metadata.creation_timestamp.clone();
        m.observe_sync("d", &va, Synced::Detached);
        let count = |h: &HistogramVec| h.with_label_values(&["d"]).get_sample_count();
        assert_eq!((count(&m.attach_e2e), count(&m.detach_e2e)), (1, 1));
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

    #[test]
    fn nothing_is_exposed_before_the_first_call() {
        let registry = Registry::new();
        let _ops = CsiOperations::register(&registry).unwrap();
        assert!(!render(&registry).contains(CSI_OPERATIONS_NAME));
    }
}

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
}

/// Buckets of the API budget wait, in seconds: from "no wait" to minutes of backlog.
pub const API_BUDGET_WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

impl HubMetrics {
    /// Creates the series and registers them on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        use prometheus::{GaugeVec, IntCounterVec, Opts};
        let pool = &["name", "driver_name", "pool"];
        let this = Self {
            queue_depth: GaugeVec::new(
                Opts::new("workqueue_depth", "Current depth of workqueue"),
                pool,
            )?,
            queue_oldest_age: GaugeVec::new(
                Opts::new(
                    "workqueue_oldest_item_age_seconds",
                    "How long the oldest key has been waiting in the workqueue",
                ),
                pool,
            )?,
            queue_longest_running: GaugeVec::new(
                Opts::new(
                    "workqueue_longest_running_processor_seconds",
                    "How many seconds has the longest running processor for workqueue been running.",
                ),
                pool,
            )?,
            queue_retries: IntCounterVec::new(
                Opts::new(
                    "workqueue_retries_total",
                    "Total number of retries handled by workqueue",
                ),
                &["name", "driver_name"],
            )?,
            queue_work_duration: HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_work_duration_seconds",
                    "How long in seconds processing an item from workqueue takes.",
                )
                .buckets(workqueue_buckets()),
                &["name", "driver_name"],
            )?,
            queue_wait_duration: HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_queue_duration_seconds",
                    "How long in seconds an item stays in workqueue before being requested.",
                )
                .buckets(workqueue_buckets()),
                &["name", "driver_name"],
            )?,
            queue_adds: IntCounterVec::new(
                Opts::new(
                    "workqueue_adds_total",
                    "Total number of adds handled by workqueue",
                ),
                &["name", "driver_name"],
            )?,
            leader: GaugeVec::new(
                Opts::new(
                    "leader_election_master_status",
                    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
                ),
                &["name", "driver_name"],
            )?,
            driver_up: GaugeVec::new(
                Opts::new(
                    "attacher_hub_driver_up",
                    "1 if the CSI driver is connected and ready, else 0",
                ),
                &["driver_name"],
            )?,
            panics: IntCounterVec::new(
                Opts::new(
                    "attacher_hub_task_panics_total",
                    "Panics caught in a driver's tasks; each one is a bug worth reporting",
                ),
                &["driver_name", "task"],
            )?,
            attach_e2e: HistogramVec::new(
                HistogramOpts::new(
                    "attacher_hub_attach_duration_seconds",
                    "Time from VolumeAttachment creation to attached=true",
                )
                .buckets(END_TO_END_BUCKETS.to_vec()),
                &["driver_name"],
            )?,
            detach_e2e: HistogramVec::new(
                HistogramOpts::new(
                    "attacher_hub_detach_duration_seconds",
                    "Time from VolumeAttachment deletion to detached",
                )
                .buckets(END_TO_END_BUCKETS.to_vec()),
                &["driver_name"],
            )?,
            api_budget_wait: HistogramVec::new(
                HistogramOpts::new(
                    "attacher_hub_api_budget_wait_seconds",
                    "Time an API request of the driver waited for API budget (the driver's own, then the hub's cap)",
                )
                .buckets(API_BUDGET_WAIT_BUCKETS.to_vec()),
                &["driver_name"],
            )?,
            api_throttled: IntCounterVec::new(
                Opts::new(
                    "attacher_hub_api_throttled_requests_total",
                    "API requests of the driver that had to wait for budget, by the limit that held them (driver or hub)",
                ),
                &["driver_name", "limiter"],
            )?,
            api_budget_qps: GaugeVec::new(
                Opts::new(
                    "attacher_hub_api_budget_qps",
                    "The driver's own API budget in requests per second (absent: no limit)",
                ),
                &["driver_name"],
            )?,
            api_requests: IntCounterVec::new(
                Opts::new(
                    "attacher_hub_api_requests_total",
                    "API requests made for the driver, by verb, resource and HTTP status code (error: no answer)",
                ),
                &["driver_name", "verb", "resource", "code"],
            )?,
        };
        registry.register(Box::new(this.queue_depth.clone()))?;
        registry.register(Box::new(this.queue_oldest_age.clone()))?;
        registry.register(Box::new(this.queue_longest_running.clone()))?;
        registry.register(Box::new(this.queue_retries.clone()))?;
        registry.register(Box::new(this.queue_work_duration.clone()))?;
        registry.register(Box::new(this.queue_wait_duration.clone()))?;
        registry.register(Box::new(this.queue_adds.clone()))?;
        registry.register(Box::new(this.leader.clone()))?;
        registry.register(Box::new(this.driver_up.clone()))?;
        registry.register(Box::new(this.panics.clone()))?;
        registry.register(Box::new(this.attach_e2e.clone()))?;
        registry.register(Box::new(this.detach_e2e.clone()))?;
        registry.register(Box::new(this.api_budget_wait.clone()))?;
        registry.register(Box::new(this.api_throttled.clone()))?;
        registry.register(Box::new(this.api_budget_qps.clone()))?;
        registry.register(Box::new(this.api_requests.clone()))?;
        Ok(this)
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
    }

    /// Where the API budget of `driver` reports its waits; also publishes its limit.
    pub fn api_observer(
        &self,
        driver: &str,
        limit: crate::k8s::budget::Limit,
    ) -> Box<dyn crate::k8s::budget::Observer> {
        match limit.qps() {
            Some(qps) => self.api_budget_qps.with_label_values(&[driver]).set(qps),
            None => {
                let _ = self.api_budget_qps.remove_label_values(&[driver]);
            }
        }
        Box::new(ApiObserver {
            wait: self.api_budget_wait.with_label_values(&[driver]),
            throttled_driver: self.api_throttled.with_label_values(&[driver, "driver"]),
            throttled_hub: self.api_throttled.with_label_values(&[driver, "hub"]),
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

    /// Records the end-to-end latency of a VA this sync attached (from its creation) or
    /// detached (from its deletion); a sync that changed nothing is not an attach.
    pub fn observe_sync(
        &self,
        driver: &str,
        va: &k8s_openapi::api::storage::v1::VolumeAttachment,
        synced: crate::controller::Synced,
    ) {
        use crate::controller::Synced;
        let (since, h) = match synced {
            Synced::Attached => (va.metadata.creation_timestamp.as_ref(), &self.attach_e2e),
            Synced::Detached => (va.metadata.deletion_timestamp.as_ref(), &self.detach_e2e),
            Synced::Unchanged => return,
        };
        let Some(since) = since else { return };
        let now = k8s_openapi::jiff::Timestamp::now();
        let seconds = now.duration_since(since.0).as_secs_f64().max(0.0);
        h.with_label_values(&[driver]).observe(seconds);
    }
}

/// A driver's API budget metrics.
#[derive(Debug)]
struct ApiObserver {
    wait: prometheus::Histogram,
    throttled_driver: prometheus::IntCounter,
    throttled_hub: prometheus::IntCounter,
}

impl crate::k8s::budget::Observer for ApiObserver {
    fn waited(&self, waited: std::time::Duration) {
        self.wait.observe(waited.as_secs_f64());
    }

    fn throttled(&self, limiter: crate::k8s::budget::Limiter) {
        match limiter {
            crate::k8s::budget::Limiter::Driver => self.throttled_driver.inc(),
            crate::k8s::budget::Limiter::Hub => self.throttled_hub.inc(),
        }
    }
}
