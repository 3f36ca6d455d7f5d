//! The series of drivers that have VolumeAttachments waiting and no live attacher: any hub
//! replica that watches the cluster's VolumeAttachments reports every driver it sees in them,
//! whether it serves that driver or not (`crate::hub::unserved` decides).

use prometheus::{GaugeVec, Opts, Registry};

use super::series::remove_driver_series;

/// `attacher_hub_driver_unserved` and `attacher_hub_driver_waiting_volumeattachments`.
///
/// Unlike [`super::HubMetrics`], these series do not belong to the drivers this replica serves:
/// a replica that stops serving a driver keeps reporting it, and a driver loses its series only
/// when no VolumeAttachment names it any more.
#[derive(Clone, Debug)]
pub struct UnservedMetrics {
    /// `attacher_hub_driver_unserved{driver_name}`: 1 while the driver has VolumeAttachments
    /// waiting for an attacher and none acts for it, else 0.
    pub unserved: GaugeVec,
    /// `attacher_hub_driver_waiting_volumeattachments{driver_name}`: the driver's
    /// VolumeAttachments that have waited for an attach or a detach longer than the check's
    /// settling time.
    pub waiting: GaugeVec,
}

impl UnservedMetrics {
    /// Creates the two families and registers them on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let this = Self {
            unserved: GaugeVec::new(
                Opts::new(
                    "attacher_hub_driver_unserved",
                    "1 while the driver has VolumeAttachments waiting and no live attacher (its Lease unheld, or VolumeAttachments nobody touched for minutes), else 0; reported by every replica for every driver named by a VolumeAttachment",
                ),
                &["driver_name"],
            )?,
            waiting: GaugeVec::new(
                Opts::new(
                    "attacher_hub_driver_waiting_volumeattachments",
                    "VolumeAttachments of the driver waiting for an attach or a detach for longer than the settling time of the unserved-driver check",
                ),
                &["driver_name"],
            )?,
        };
        registry.register(Box::new(this.unserved.clone()))?;
        registry.register(Box::new(this.waiting.clone()))?;
        Ok(this)
    }

    /// Shows `driver` as unserved or not, with `waiting` VolumeAttachments.
    pub fn set(&self, driver: &str, unserved: bool, waiting: usize) {
        self.unserved
            .with_label_values(&[driver])
            .set(if unserved { 1.0 } else { 0.0 });
        self.waiting
            .with_label_values(&[driver])
            .set(waiting as f64);
    }

    /// Removes the series of `driver` (no VolumeAttachment names it any more).
    pub fn remove(&self, driver: &str) {
        remove_driver_series(&self.unserved, driver);
        remove_driver_series(&self.waiting, driver);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_shows_both_series_until_removed() {
        let registry = Registry::new();
        let m = UnservedMetrics::register(&registry).unwrap();
        m.set("d", true, 3);
        m.set("e", false, 0);
        let text = crate::metrics::csi::tests::render(&registry);
        assert!(text.contains(r#"attacher_hub_driver_unserved{driver_name="d"} 1"#));
        assert!(
            text.contains(r#"attacher_hub_driver_waiting_volumeattachments{driver_name="d"} 3"#)
        );
        assert!(text.contains(r#"attacher_hub_driver_unserved{driver_name="e"} 0"#));
        m.remove("d");
        let text = crate::metrics::csi::tests::render(&registry);
        assert!(!text.contains(r#"driver_name="d""#));
        assert!(text.contains(r#"driver_name="e""#));
    }
}
