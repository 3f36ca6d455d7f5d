//! What the HTTP listener reports of the hub: leader-election health, readiness (caches synced:
//! the process serves, whatever its drivers do) and the `/drivers` document.

use std::{sync::Arc, time::Duration};

use super::context::Context;
use crate::http;

/// What the HTTP listener reports.
pub(crate) struct HubStatus {
    /// The hub.
    pub(crate) hub: Arc<Context>,
    /// Serve `/healthz/leader-election`.
    pub(crate) leader_election_health: bool,
    /// The driver and queue gauges, refreshed before each rendering of the metrics.
    pub(crate) gauges: Arc<super::gauges::Gauges>,
}

impl http::Status for HubStatus {
    fn leader_election_healthy(&self) -> Option<bool> {
        if !self.leader_election_health {
            return None;
        }
        // client-go's HealthzAdaptor tolerance.
        const TOLERANCE: Duration = Duration::from_secs(20);
        Some(
            self.hub
                .shared
                .leader_status
                .iter()
                .all(|s| s.value().check(TOLERANCE).is_ok()),
        )
    }

    /// Ready once the shared caches are synced and start-up is over (every driver of the first
    /// configuration finished its first start, or the start-up limit passed,
    /// [`super::startup`]): this process serves, and can take its drivers' Leases when a
    /// rolling update ends the old pod. After start-up a sick driver does not make the pod
    /// NotReady: readiness gates rollouts and, through a PodDisruptionBudget, node drains, and
    /// a driver that cannot be reached would block both without anything a restart or a drain
    /// could fix. It shows in `/drivers`, `attacher_hub_driver_up` and the
    /// `AttacherHubDriverDown` alert instead.
    fn ready(&self) -> Result<(), String> {
        if !self.hub.shared.stores.is_synced() {
            return Err(
                "the VolumeAttachment and PersistentVolume caches are not synced yet".into(),
            );
        }
        if !self.hub.started() {
            return Err(format!(
                "the drivers are starting (at most {:?}; see /drivers)",
                super::startup::SETTLE_LIMIT
            ));
        }
        Ok(())
    }

    fn config(&self) -> serde_json::Value {
        self.hub.config.describe()
    }

    fn refresh_metrics(&self) {
        self.gauges.refresh(false);
    }

    /// The drivers, then the discovered sockets that are not served.
    fn drivers(&self) -> serde_json::Value {
        let unserved = self.hub.unserved.lock().clone();
        serde_json::Value::Array(
            self.hub
                .registry
                .slots()
                .iter()
                .map(|d| d.describe())
                .chain(unserved.iter().map(|r| r.describe()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use crate::config::Defaults;
    use crate::fake_api::FakeApi;
    use crate::http::Status;
    use crate::hub::context::tests::context;
    use crate::hub::driver::{Driver, Origin};
    use crate::k8s::stores::TestStores;
    use crate::leader::{Config, LeaderElector};

    /// The status of `hub`, with the leader-election check served or not.
    fn status_of(hub: &Arc<Context>, leader_election_health: bool) -> HubStatus {
        HubStatus {
            hub: hub.clone(),
            leader_election_health,
            gauges: crate::hub::gauges::Gauges::new(hub.clone()),
        }
    }

    /// A hub with the slot of a driver `x.csi.io` that never connects.
    fn hub_with_a_driver(caches: &TestStores) -> (Arc<Context>, Arc<Driver>) {
        let hub = context(&FakeApi::default(), caches.stores.clone());
        let defaults = Defaults::with_identity(&Args::default(), "h".into());
        let settings = defaults.settings_for("/x.sock".parse().expect("a path"));
        let driver = Driver::named(settings, Origin::Configured, "x.csi.io");
        hub.registry.add_slot(driver.clone());
        (hub, driver)
    }

    #[tokio::test(start_paused = true)]
    async fn ready_needs_synced_caches_and_start_up_over_and_then_no_driver_can_make_it_unready() {
        let caches = TestStores::new();
        let (hub, _) = hub_with_a_driver(&caches);
        let status = status_of(&hub, false);
        assert_eq!(status.leader_election_healthy(), None);
        caches.set_synced(false);
        assert!(status.ready().expect_err("unsynced").contains("not synced"));
        caches.set_synced(true);
        assert!(
            status
                .ready()
                .expect_err("no drivers yet")
                .contains("starting")
        );
        hub.first_reconcile.cancel();
        // Its driver still connecting, a new replica could not take its Lease.
        assert!(status.ready().expect_err("connecting").contains("starting"));
        // A driver that never connects holds the replica back no longer than the limit ...
        tokio::time::advance(crate::hub::startup::SETTLE_LIMIT).await;
        assert_eq!(status.ready(), Ok(()));
        // ... and then shows in /drivers, not in readiness.
        let drivers = status.drivers();
        assert_eq!(drivers[0]["name"], "x.csi.io");
        assert_eq!(drivers[0]["state"]["state"], "connecting");
        assert_eq!(drivers[0]["queues"]["attach"]["depth"], 0);
    }

    #[tokio::test(start_paused = true)]
    async fn ready_once_every_driver_has_started() {
        let caches = TestStores::new();
        let (hub, driver) = hub_with_a_driver(&caches);
        let status = status_of(&hub, false);
        hub.first_reconcile.cancel();
        assert!(status.ready().is_err());
        driver.set_state_for_test(crate::hub::driver::State::Standby);
        assert_eq!(status.ready(), Ok(()));
        // Over for good: the driver going down later leaves the pod ready.
        driver.set_state_for_test(crate::hub::driver::State::Connecting);
        assert_eq!(status.ready(), Ok(()));
    }

    /// Start-up ends when every driver first started, even if nothing asks then: a driver
    /// that goes down before the first probe must not find start-up going on.
    #[tokio::test(start_paused = true)]
    async fn start_up_is_followed_while_it_happens_not_only_when_asked() {
        let caches = TestStores::new();
        let (hub, driver) = hub_with_a_driver(&caches);
        let stop = tokio_util::sync::CancellationToken::new();
        let follow = tokio::spawn(crate::hub::startup::follow(hub.clone(), stop.clone()));
        hub.first_reconcile.cancel();
        driver.set_state_for_test(crate::hub::driver::State::Leading);
        tokio::time::sleep(crate::hub::startup::POLL * 2).await;
        driver.set_state_for_test(crate::hub::driver::State::Connecting);
        assert_eq!(status_of(&hub, false).ready(), Ok(()));
        stop.cancel();
        follow.await.expect("follow ends on stop");
    }

    #[tokio::test]
    async fn leader_election_health_is_healthy_while_no_leader_stopped_renewing() {
        let api = FakeApi::default();
        let caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let status = status_of(&hub, true);
        assert_eq!(status.leader_election_healthy(), Some(true));
        let elector = LeaderElector::new(
            kube::Api::namespaced(api.client(), "default"),
            Config::new("lease", "default", "me"),
        )
        .expect("valid");
        // A standby elector is healthy.
        hub.shared
            .leader_status
            .insert("x.csi.io".into(), elector.status());
        assert_eq!(status.leader_election_healthy(), Some(true));
    }

    /// The gauges are computed when the metrics are read: a driver added since the last read
    /// shows at the next one, one removed since is gone from it.
    #[tokio::test(start_paused = true)]
    async fn reading_the_metrics_brings_the_driver_gauges_up_to_date() {
        use prometheus::core::Collector;
        let caches = TestStores::new();
        let hub = context(&FakeApi::default(), caches.stores.clone());
        let status = status_of(&hub, false);
        let up_series = || -> Vec<(String, f64)> {
            hub.shared.metrics.driver_up.collect()[0]
                .get_metric()
                .iter()
                .map(|m| {
                    (
                        m.get_label()[0].value().to_owned(),
                        m.get_gauge().get_value(),
                    )
                })
                .collect()
        };
        status.refresh_metrics();
        assert_eq!(up_series(), []);
        let defaults = Defaults::with_identity(&Args::default(), "h".into());
        let settings = defaults.settings_for("/x.sock".parse().expect("a path"));
        let driver = Driver::named(settings, Origin::Configured, "x.csi.io");
        hub.registry.add_slot(driver.clone());
        // Nothing refreshes the gauges between reads: an hour passes on the paused clock, so
        // every timer due within it has fired and the runtime has gone idle, and still no
        // series shows.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(up_series(), []);
        status.refresh_metrics();
        assert_eq!(up_series(), [("x.csi.io".to_owned(), 0.0)]);
        hub.registry.remove_slot(&driver);
        status.refresh_metrics();
        assert_eq!(up_series(), []);
        // A node plugin is recorded, not served: neither up nor down.
        let node = Driver::named(
            defaults.settings_for("/n.sock".parse().expect("a path")),
            Origin::Discovered,
            "node.csi.io",
        );
        node.set_state_for_test(crate::hub::driver::State::NoControllerService);
        hub.registry.add_slot(node);
        status.refresh_metrics();
        assert_eq!(up_series(), []);
    }
}
