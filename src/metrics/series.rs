//! Removing the series of one driver from a labelled metric.

use prometheus::core::Collector;

/// Removes the series of `vec` whose `driver_name` is `driver`, whatever their other labels.
pub(crate) fn remove_driver_series<T: prometheus::core::MetricVecBuilder>(
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
