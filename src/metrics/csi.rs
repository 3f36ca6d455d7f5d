//! `csi_sidecar_operations_seconds`: one sample per CSI call, with the Go sidecars' name,
//! labels and buckets.

use prometheus::{
    HistogramOpts, HistogramVec, Registry,
    core::{Collector, Desc},
    proto::MetricFamily,
};

use super::series::remove_driver_series;

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
pub(crate) mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    pub(crate) fn render(registry: &Registry) -> String {
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
    fn nothing_is_exposed_before_the_first_call() {
        let registry = Registry::new();
        let _ops = CsiOperations::register(&registry).unwrap();
        assert!(!render(&registry).contains(CSI_OPERATIONS_NAME));
    }
}
