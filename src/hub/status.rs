//! What the HTTP listener reports of the hub: leader-election health, readiness (caches synced,
//! every driver standing by or leading) and the `/drivers` document.

use std::{sync::Arc, time::Duration};

use super::{context::Context, driver::State};
use crate::http;

/// What the HTTP listener reports.
pub(crate) struct HubStatus {
    /// The hub.
    pub(crate) hub: Arc<Context>,
    /// Serve `/healthz/leader-election`.
    pub(crate) leader_election_health: bool,
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

    fn ready(&self) -> Result<(), String> {
        if !self.hub.shared.stores.is_synced() {
            return Err(
                "the VolumeAttachment and PersistentVolume caches are not synced yet".into(),
            );
        }
        let not_ready: Vec<String> = self
            .hub
            .registry
            .slots()
            .iter()
            .filter(|d| {
                !matches!(
                    d.state(),
                    State::Standby | State::Leading | State::NoControllerService
                )
            })
            .map(|d| {
                format!(
                    "{} ({}): {:?}",
                    d.name().unwrap_or_else(|| "?".into()),
                    d.settings().address,
                    d.state()
                )
            })
            .collect();
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(format!("drivers not ready: {}", not_ready.join("; ")))
        }
    }

    fn drivers(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.hub
                .registry
                .slots()
                .iter()
                .map(|d| d.describe())
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

    #[tokio::test]
    async fn ready_needs_synced_caches_and_every_driver_standing_by_or_leading() {
        let caches = TestStores::new();
        let hub = context(&FakeApi::default(), caches.stores.clone());
        let status = HubStatus {
            hub: hub.clone(),
            leader_election_health: false,
        };
        assert_eq!(status.ready(), Ok(()));
        assert_eq!(status.leader_election_healthy(), None);
        caches.set_synced(false);
        assert!(status.ready().expect_err("unsynced").contains("not synced"));
        caches.set_synced(true);
        let defaults = Defaults::with_identity(&Args::default(), "h".into());
        let settings = defaults.settings_for("/x.sock".parse().expect("a path"));
        hub.registry
            .add_slot(Driver::named(settings, Origin::Configured, "x.csi.io"));
        assert_eq!(
            status.ready(),
            Err("drivers not ready: x.csi.io (unix:///x.sock): Connecting".into())
        );
        let drivers = status.drivers();
        assert_eq!(drivers[0]["name"], "x.csi.io");
        assert_eq!(drivers[0]["state"]["state"], "connecting");
        assert_eq!(drivers[0]["queues"]["attach"]["depth"], 0);
    }

    #[tokio::test]
    async fn leader_election_health_is_healthy_while_no_leader_stopped_renewing() {
        let api = FakeApi::default();
        let caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let status = HubStatus {
            hub: hub.clone(),
            leader_election_health: true,
        };
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
}
