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
