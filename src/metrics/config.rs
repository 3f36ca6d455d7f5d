//! The series of the driver list's reloads, named as Prometheus names its own
//! (`prometheus_config_last_reload_successful` and its timestamp), so that the usual alert reads
//! alike.

use prometheus::{Gauge, IntCounterVec, Opts, Registry};

/// `attacher_hub_config_*`. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ConfigMetrics {
    /// `attacher_hub_config_last_reload_successful`: 1 if the last load of the driver list
    /// (at start-up, or a reload on SIGHUP or a change of the file) was applied, 0 if it was
    /// rejected (the running configuration is kept, and the next start of a replica would fail
    /// on the file).
    pub last_reload_successful: Gauge,
    /// `attacher_hub_config_last_reload_success_timestamp_seconds`: when the configuration in
    /// force was loaded (Unix time).
    pub last_reload_success_timestamp: Gauge,
    /// `attacher_hub_config_reloads_total{result}`: reloads by outcome (`success`, `failure`),
    /// start-up excluded.
    pub reloads: IntCounterVec,
}

impl ConfigMetrics {
    /// The series, registered on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let this = Self {
            last_reload_successful: Gauge::new(
                "attacher_hub_config_last_reload_successful",
                "Whether the last load of the driver list was applied (1) or rejected (0)",
            )?,
            last_reload_success_timestamp: Gauge::new(
                "attacher_hub_config_last_reload_success_timestamp_seconds",
                "Unix time at which the driver list in force was loaded",
            )?,
            reloads: IntCounterVec::new(
                Opts::new(
                    "attacher_hub_config_reloads_total",
                    "Reloads of the driver list, by result (success, failure)",
                ),
                &["result"],
            )?,
        };
        registry.register(Box::new(this.last_reload_successful.clone()))?;
        registry.register(Box::new(this.last_reload_success_timestamp.clone()))?;
        registry.register(Box::new(this.reloads.clone()))?;
        Ok(this)
    }
}
