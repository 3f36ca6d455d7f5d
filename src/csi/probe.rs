//! Start-up conversation with a driver: wait until it is ready, learn its
//! name, detect its capabilities (`docs/design.md#startup`).

use std::time::Duration;

use super::{
    client::{CallError, DriverClient},
    proto::{controller_service_capability, plugin_capability},
};

/// Deadline of GetPluginInfo and of the capability calls (fixed in the Go
/// sidecar, not tied to `--timeout`).
pub const INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between Probe calls while the driver is not ready.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Errors of the start-up conversation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// GetPluginInfo returned an empty name.
    #[error("driver name is empty")]
    EmptyName,
}

/// What a driver can do, as far as an attacher cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Plugin capability CONTROLLER_SERVICE.
    pub controller_service: bool,
    /// Controller capability PUBLISH_UNPUBLISH_VOLUME.
    pub publish_unpublish: bool,
    /// Controller capability PUBLISH_READONLY.
    pub publish_readonly: bool,
    /// Controller capability LIST_VOLUMES.
    pub list_volumes: bool,
    /// Controller capability LIST_VOLUMES_PUBLISHED_NODES.
    pub list_volumes_published_nodes: bool,
    /// Controller capability SINGLE_NODE_MULTI_WRITER.
    pub single_node_multi_writer: bool,
}

impl Capabilities {
    /// The CSI handler is used; otherwise the trivial handler (`docs/design.md#startup`).
    pub fn needs_attach(&self) -> bool {
        self.controller_service && self.publish_unpublish
    }

    /// The ListVolumes reconciler can run (`docs/design.md#reconciler`).
    pub fn can_reconcile(&self) -> bool {
        self.controller_service && self.list_volumes && self.list_volumes_published_nodes
    }
}

impl std::fmt::Display for Capabilities {
    /// The capabilities offered, in CSI's words, comma-separated (`none` without any): short
    /// enough for a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (self.controller_service, "CONTROLLER_SERVICE"),
            (self.publish_unpublish, "PUBLISH_UNPUBLISH_VOLUME"),
            (self.publish_readonly, "PUBLISH_READONLY"),
            (self.list_volumes, "LIST_VOLUMES"),
            (
                self.list_volumes_published_nodes,
                "LIST_VOLUMES_PUBLISHED_NODES",
            ),
            (self.single_node_multi_writer, "SINGLE_NODE_MULTI_WRITER"),
        ];
        let offered: Vec<&str> = names
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        if offered.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&offered.join(","))
        }
    }
}

/// Calls Probe until the driver is ready: a `ready=false` answer or a
/// `DeadlineExceeded` is retried every second, for ever; any other error ends
/// the wait. An absent `ready` field means ready.
pub async fn probe_until_ready(
    client: &DriverClient,
    per_call_timeout: Duration,
) -> Result<(), CallError> {
    let mut interval = tokio::time::interval(PROBE_INTERVAL);
    loop {
        interval.tick().await;
        match client.probe(per_call_timeout).await {
            Ok(None | Some(true)) => return Ok(()),
            Ok(Some(false)) => tracing::info!("CSI driver is not ready yet"),
            Err(e) if e.code() == tonic::Code::DeadlineExceeded => {
                tracing::info!(error = %e, "CSI driver probe timed out; retrying")
            }
            Err(e) => return Err(e),
        }
    }
}

/// GetPluginInfo with its 1 s deadline: the driver's name, never empty.
pub async fn plugin_name(client: &DriverClient) -> Result<String, Error> {
    let info = client.plugin_info(INFO_TIMEOUT).await?;
    if info.name.is_empty() {
        return Err(Error::EmptyName);
    }
    Ok(info.name)
}

/// Whether GetPluginCapabilities' answer offers the CONTROLLER_SERVICE plugin capability.
pub fn offers_controller_service(capabilities: &[super::proto::PluginCapability]) -> bool {
    capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(plugin_capability::Type::Service(s))
            if s.r#type() == plugin_capability::service::Type::ControllerService)
    })
}

/// GetPluginCapabilities and, when the controller service is offered,
/// ControllerGetCapabilities.
pub async fn capabilities(client: &DriverClient) -> Result<Capabilities, CallError> {
    let mut caps = Capabilities {
        controller_service: offers_controller_service(
            &client.plugin_capabilities(INFO_TIMEOUT).await?,
        ),
        ..Capabilities::default()
    };
    if !caps.controller_service {
        return Ok(caps);
    }
    use controller_service_capability::rpc::Type;
    for c in client.controller_capabilities(INFO_TIMEOUT).await? {
        let Some(controller_service_capability::Type::Rpc(rpc)) = c.r#type else {
            continue;
        };
        match rpc.r#type() {
            Type::PublishUnpublishVolume => caps.publish_unpublish = true,
            Type::PublishReadonly => caps.publish_readonly = true,
            Type::ListVolumes => caps.list_volumes = true,
            Type::ListVolumesPublishedNodes => caps.list_volumes_published_nodes = true,
            Type::SingleNodeMultiWriter => caps.single_node_multi_writer = true,
            _ => {}
        }
    }
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csi_handler_needs_both_controller_service_and_publish() {
        let mut c = Capabilities {
            controller_service: true,
            ..Default::default()
        };
        assert!(!c.needs_attach());
        c.publish_unpublish = true;
        assert!(c.needs_attach());
        c.controller_service = false;
        assert!(!c.needs_attach());
    }

    #[test]
    fn reconciling_needs_both_list_capabilities() {
        let mut c = Capabilities {
            controller_service: true,
            list_volumes: true,
            ..Default::default()
        };
        assert!(!c.can_reconcile());
        c.list_volumes_published_nodes = true;
        assert!(c.can_reconcile());
    }
}
