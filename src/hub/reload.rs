//! What the hub reports of its driver list: where it comes from, when the list in force was
//! loaded, and how the last reload went. A rejected reload keeps the running drivers, but the
//! next start of a replica reads the same file and exits 2: so it shows in `/config`, in
//! `attacher-hub status`, and in `attacher_hub_config_last_reload_successful` (the
//! `AttacherHubConfigReloadFailed` alert), not only in the log.

use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;

use crate::metrics::config::ConfigMetrics;

/// The last reload.
#[derive(Clone, Debug)]
struct Reload {
    at: Timestamp,
    /// Why it was rejected (`None`: applied).
    error: Option<String>,
}

/// Where the driver list comes from and how its loads went.
#[derive(Debug)]
pub struct ConfigStatus {
    /// The driver file (`None`: the command line, or discovery).
    path: Option<String>,
    /// When the list in force was loaded, and the last reload.
    state: Mutex<(Timestamp, Option<Reload>)>,
    metrics: ConfigMetrics,
}

impl ConfigStatus {
    /// The status of a list loaded now from `path` (or the command line), reported on `metrics`.
    pub fn new(path: Option<String>, metrics: ConfigMetrics) -> Self {
        let now = Timestamp::now();
        metrics.last_reload_successful.set(1.0);
        metrics.last_reload_success_timestamp.set(seconds(now));
        Self {
            path,
            state: Mutex::new((now, None)),
            metrics,
        }
    }

    /// A reload was applied.
    pub fn reloaded(&self) {
        let now = Timestamp::now();
        *self.state.lock() = (
            now,
            Some(Reload {
                at: now,
                error: None,
            }),
        );
        self.metrics.last_reload_successful.set(1.0);
        self.metrics.last_reload_success_timestamp.set(seconds(now));
        self.metrics.reloads.with_label_values(&["success"]).inc();
    }

    /// A reload was rejected for `error`; the list in force stays.
    pub fn rejected(&self, error: &str) {
        self.state.lock().1 = Some(Reload {
            at: Timestamp::now(),
            error: Some(error.to_owned()),
        });
        self.metrics.last_reload_successful.set(0.0);
        self.metrics.reloads.with_label_values(&["failure"]).inc();
    }

    /// The `/config` document.
    pub fn describe(&self) -> serde_json::Value {
        let (loaded, last) = self.state.lock().clone();
        serde_json::json!({
            "path": self.path,
            "loadedTime": loaded.to_string(),
            "lastReload": last.map(|r| serde_json::json!({
                "time": r.at.to_string(),
                "successful": r.error.is_none(),
                "error": r.error,
            })),
        })
    }
}

fn seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_reload_shows_in_the_document_and_the_series_until_one_is_applied() {
        let registry = prometheus::Registry::new();
        let metrics = ConfigMetrics::register(&registry).expect("fresh registry");
        let status = ConfigStatus::new(Some("/etc/hub/drivers.yaml".into()), metrics.clone());
        assert_eq!(metrics.last_reload_successful.get(), 1.0);
        assert!(metrics.last_reload_success_timestamp.get() > 1.7e9);
        let doc = status.describe();
        assert_eq!(doc["path"], "/etc/hub/drivers.yaml");
        assert!(doc["lastReload"].is_null());
        let loaded = doc["loadedTime"].clone();

        status.rejected("drivers.yaml:6:5: drivers[1].timeout: invalid duration \"15\"");
        assert_eq!(metrics.last_reload_successful.get(), 0.0);
        let doc = status.describe();
        assert_eq!(doc["lastReload"]["successful"], false);
        assert!(
            doc["lastReload"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("drivers.yaml:6:5"))
        );
        assert_eq!(
            doc["loadedTime"], loaded,
            "the list in force is the old one"
        );

        status.reloaded();
        assert_eq!(metrics.last_reload_successful.get(), 1.0);
        let doc = status.describe();
        assert_eq!(doc["lastReload"]["successful"], true);
        assert!(doc["lastReload"]["error"].is_null());
        assert_eq!(metrics.reloads.with_label_values(&["failure"]).get(), 1);
        assert_eq!(metrics.reloads.with_label_values(&["success"]).get(), 1);
    }
}
