//! Calls to one driver, in domain types. No `tonic::Request` leaves this
//! module; every call has a deadline and leaves one metric sample.

use std::{
    collections::HashMap,
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::RwLock;
use tonic::transport::Channel;

use super::{
    codes,
    connection::Connection,
    proto::{self, controller_client::ControllerClient, identity_client::IdentityClient},
    redact::{NotUtf8, Secrets},
};
use crate::metrics::{CsiOperations, UNKNOWN_DRIVER};

/// Full gRPC method names, as they appear in the `method_name` label.
pub mod method {
    /// `Identity/Probe`.
    pub const PROBE: &str = "/csi.v1.Identity/Probe";
    /// `Identity/GetPluginInfo`.
    pub const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";
    /// `Identity/GetPluginCapabilities`.
    pub const GET_PLUGIN_CAPABILITIES: &str = "/csi.v1.Identity/GetPluginCapabilities";
    /// `Controller/ControllerGetCapabilities`.
    pub const CONTROLLER_GET_CAPABILITIES: &str = "/csi.v1.Controller/ControllerGetCapabilities";
    /// `Controller/ControllerPublishVolume`.
    pub const CONTROLLER_PUBLISH_VOLUME: &str = "/csi.v1.Controller/ControllerPublishVolume";
    /// `Controller/ControllerUnpublishVolume`.
    pub const CONTROLLER_UNPUBLISH_VOLUME: &str = "/csi.v1.Controller/ControllerUnpublishVolume";
    /// `Controller/ListVolumes`.
    pub const LIST_VOLUMES: &str = "/csi.v1.Controller/ListVolumes";
}

/// Largest response this client accepts. gRPC's default is 4 MiB, which a
/// ListVolumes page of a big cluster can exceed when `--max-entries` is unset
/// (`docs/design.md#reconciler`); 64 MiB leaves ample room while still bounding memory.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// `text` cut to `max` characters, with external-attacher's note appended.
fn capped(text: String, max: Option<usize>) -> String {
    match max {
        Some(max) if text.chars().count() > max => {
            let cut: String = text.chars().take(max).collect();
            format!("{cut} [response body too large, log capped to {max} chars]")
        }
        _ => text,
    }
}

/// The status of a call whose deadline passed, worded as grpc-go words it.
fn deadline_exceeded() -> tonic::Status {
    tonic::Status::deadline_exceeded("context deadline exceeded")
}

/// The status of a request grpc-go cannot marshal, worded as grpc-go words it
/// (`rpc_util.go` `encode`): the Go sidecars fail such a call before it leaves
/// the process, and the call still counts in their metrics.
fn marshal_error(cause: &NotUtf8) -> tonic::Status {
    tonic::Status::internal(format!("grpc: error while marshaling: {cause}"))
}

/// A failed CSI call.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}", codes::go_error_text(.status))]
pub struct CallError {
    /// The full gRPC method name.
    pub method: &'static str,
    /// The status the call ended with (a deadline hit by us is reported as
    /// `DeadlineExceeded` / `context deadline exceeded`, as grpc-go does).
    pub status: tonic::Status,
}

impl CallError {
    /// The gRPC code.
    pub fn code(&self) -> tonic::Code {
        self.status.code()
    }
}

/// Labels and histogram for the calls of one driver.
#[derive(Clone, Debug)]
pub struct CallMetrics {
    /// The shared histogram.
    ops: CsiOperations,
    /// `driver_name` label: `unknown-driver` until GetPluginInfo answered.
    driver_name: Arc<RwLock<String>>,
    /// Whether this driver is a CSI-migration target (adds the `migrated` label).
    migration_target: bool,
}

impl CallMetrics {
    /// Metrics for a driver whose name is not known yet.
    pub fn new(ops: CsiOperations) -> Self {
        Self {
            ops,
            driver_name: Arc::new(RwLock::new(UNKNOWN_DRIVER.to_string())),
            migration_target: false,
        }
    }

    /// Sets the `driver_name` label and whether the driver is a migration target.
    pub fn set_driver(&mut self, name: &str, migration_target: bool) {
        *self.driver_name.write() = name.to_string();
        self.migration_target = migration_target;
    }

    fn observe(&self, method: &str, code: &str, migrated: bool, elapsed: Duration) {
        let driver = self.driver_name.read().clone();
        let migrated = self.migration_target.then_some(migrated);
        self.ops
            .observe(&driver, method, code, migrated, elapsed.as_secs_f64());
    }
}

/// A ControllerPublishVolume request in domain terms.
#[derive(Clone, Debug, Default)]
pub struct PublishRequest {
    /// `PersistentVolume.spec.csi.volumeHandle`.
    pub volume_id: String,
    /// The node as the driver knows it.
    pub node_id: String,
    /// Access type and mode.
    pub capability: proto::VolumeCapability,
    /// Read-only publish (only sent when the driver has PUBLISH_READONLY).
    pub readonly: bool,
    /// `volumeAttributes` of the PV.
    pub volume_context: HashMap<String, String>,
    /// From `controllerPublishSecretRef`; `None` when no secret is referenced.
    pub secrets: Option<Secrets>,
    /// The volume is a translated in-tree volume (`migrated` metric label).
    pub migrated: bool,
}

/// A ControllerUnpublishVolume request in domain terms.
#[derive(Clone, Debug, Default)]
pub struct UnpublishRequest {
    /// The volume handle.
    pub volume_id: String,
    /// The node as the driver knows it.
    pub node_id: String,
    /// From `controllerPublishSecretRef`.
    pub secrets: Option<Secrets>,
    /// The volume is a translated in-tree volume.
    pub migrated: bool,
}

/// One page of ListVolumes: volume handle → nodes it is published to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishedPage {
    /// Entries with both a volume and a status, in the driver's order.
    pub volumes: Vec<(String, Vec<String>)>,
    /// Token for the next page; empty on the last.
    pub next_token: String,
}

/// The calls attacher-hub makes to a driver. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DriverClient {
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    metrics: CallMetrics,
    /// Cap of a logged response, in characters (`--max-grpc-log-length`;
    /// `None`: no cap).
    max_log_length: Option<usize>,
}

impl DriverClient {
    /// A client over an established connection.
    pub fn new(connection: &Connection, metrics: CallMetrics) -> Self {
        Self::from_channel(connection.channel(), metrics)
    }

    /// A client over a gRPC channel to the driver.
    pub fn from_channel(channel: Channel, metrics: CallMetrics) -> Self {
        Self {
            identity: IdentityClient::new(channel.clone())
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            controller: ControllerClient::new(channel)
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            metrics,
            max_log_length: None,
        }
    }

    /// Caps logged responses at `chars` characters, as external-attacher's
    /// `--max-grpc-log-length` does (`<= 0`: no cap).
    pub fn with_max_log_length(mut self, chars: i64) -> Self {
        self.max_log_length = usize::try_from(chars).ok().filter(|n| *n > 0);
        self
    }

    /// The metric labels, to set the driver name once known.
    pub fn metrics_mut(&mut self) -> &mut CallMetrics {
        &mut self.metrics
    }

    /// Runs one unary call with a deadline and records it.
    async fn call<T, F>(
        &self,
        method: &'static str,
        migrated: bool,
        timeout: Duration,
        fut: F,
    ) -> Result<T, CallError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
        T: std::fmt::Debug,
    {
        let started = Instant::now();
        let result = match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            // Our deadline passed; the server noticed it first (it got the
            // grpc-timeout header) and reset the stream. grpc-go clients
            // report their own context's deadline here, and so do we.
            Ok(Err(status))
                if started.elapsed() >= timeout
                    && matches!(
                        status.code(),
                        tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
                    ) =>
            {
                Err(deadline_exceeded())
            }
            Ok(Err(status)) => Err(status),
            Err(_) => Err(deadline_exceeded()),
        };
        if let Ok(response) = &result
            && tracing::enabled!(tracing::Level::TRACE)
        {
            tracing::trace!(method, response = %capped(format!("{response:?}"), self.max_log_length), "CSI call succeeded");
        }
        let code = match &result {
            Ok(_) => "OK",
            Err(s) => codes::go_code_name(s.code()),
        };
        self.metrics
            .observe(method, code, migrated, started.elapsed());
        result.map_err(|status| {
            tracing::trace!(method, %status, "CSI call failed");
            CallError { method, status }
        })
    }

    /// A call refused before it is sent because its request cannot be
    /// marshalled: recorded like any failed call (as the Go sidecars' metrics
    /// interceptor records it), with grpc-go's status.
    fn refused(&self, method: &'static str, migrated: bool, cause: &NotUtf8) -> CallError {
        let status = marshal_error(cause);
        tracing::trace!(method, %status, "CSI call refused");
        self.metrics.observe(
            method,
            codes::go_code_name(status.code()),
            migrated,
            Duration::ZERO,
        );
        CallError { method, status }
    }

    fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        // Tell the driver the deadline too (grpc-timeout header).
        request.set_timeout(timeout);
        request
    }

    /// `Identity/Probe`: `Some(ready)`, or `None` when the driver left the
    /// field out (which means ready).
    pub async fn probe(&self, timeout: Duration) -> Result<Option<bool>, CallError> {
        let mut c = self.identity.clone();
        let r = self
            .call(
                method::PROBE,
                false,
                timeout,
                c.probe(Self::request(proto::ProbeRequest {}, timeout)),
            )
            .await?;
        Ok(r.ready)
    }

    /// `Identity/GetPluginInfo`: the driver's name and version.
    pub async fn plugin_info(
        &self,
        timeout: Duration,
    ) -> Result<proto::GetPluginInfoResponse, CallError> {
        let mut c = self.identity.clone();
        self.call(
            method::GET_PLUGIN_INFO,
            false,
            timeout,
            c.get_plugin_info(Self::request(proto::GetPluginInfoRequest {}, timeout)),
        )
        .await
    }

    /// `Identity/GetPluginCapabilities`.
    pub async fn plugin_capabilities(
        &self,
        timeout: Duration,
    ) -> Result<Vec<proto::PluginCapability>, CallError> {
        let mut c = self.identity.clone();
        let r = self
            .call(
                method::GET_PLUGIN_CAPABILITIES,
                false,
                timeout,
                c.get_plugin_capabilities(Self::request(
                    proto::GetPluginCapabilitiesRequest {},
                    timeout,
                )),
            )
            .await?;
        Ok(r.capabilities)
    }

    /// `Controller/ControllerGetCapabilities`.
    pub async fn controller_capabilities(
        &self,
        timeout: Duration,
    ) -> Result<Vec<proto::ControllerServiceCapability>, CallError> {
        let mut c = self.controller.clone();
        let r = self
            .call(
                method::CONTROLLER_GET_CAPABILITIES,
                false,
                timeout,
                c.controller_get_capabilities(Self::request(
                    proto::ControllerGetCapabilitiesRequest {},
                    timeout,
                )),
            )
            .await?;
        Ok(r.capabilities)
    }

    /// `Controller/ControllerPublishVolume`: the publish context on success.
    pub async fn publish(
        &self,
        request: PublishRequest,
        timeout: Duration,
    ) -> Result<HashMap<String, String>, CallError> {
        let PublishRequest {
            volume_id,
            node_id,
            capability,
            readonly,
            volume_context,
            secrets,
            migrated,
        } = request;
        let method = method::CONTROLLER_PUBLISH_VOLUME;
        let secrets = match secrets.map(Secrets::expose).transpose() {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => return Err(self.refused(method, migrated, &e)),
        };
        let message = proto::ControllerPublishVolumeRequest {
            volume_id,
            node_id,
            volume_capability: Some(capability),
            readonly,
            secrets,
            volume_context,
        };
        tracing::trace!(request = ?message, "ControllerPublishVolume");
        let mut c = self.controller.clone();
        let r = self
            .call(
                method,
                migrated,
                timeout,
                c.controller_publish_volume(Self::request(message, timeout)),
            )
            .await?;
        Ok(r.publish_context)
    }

    /// `Controller/ControllerUnpublishVolume`.
    pub async fn unpublish(
        &self,
        request: UnpublishRequest,
        timeout: Duration,
    ) -> Result<(), CallError> {
        let UnpublishRequest {
            volume_id,
            node_id,
            secrets,
            migrated,
        } = request;
        let method = method::CONTROLLER_UNPUBLISH_VOLUME;
        let secrets = match secrets.map(Secrets::expose).transpose() {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => return Err(self.refused(method, migrated, &e)),
        };
        let message = proto::ControllerUnpublishVolumeRequest {
            volume_id,
            node_id,
            secrets,
            // CSI v1.14's alpha reason stays unset, as external-attacher v4.13.0 leaves it.
            reason: proto::controller_unpublish_volume_request::Reason::Unknown.into(),
        };
        tracing::trace!(request = ?message, "ControllerUnpublishVolume");
        let mut c = self.controller.clone();
        self.call(
            method,
            migrated,
            timeout,
            c.controller_unpublish_volume(Self::request(message, timeout)),
        )
        .await?;
        Ok(())
    }

    /// One page of `Controller/ListVolumes`. Entries without a volume or a
    /// status are skipped, as external-attacher skips them.
    pub async fn list_published_page(
        &self,
        max_entries: i32,
        starting_token: String,
        timeout: Duration,
    ) -> Result<PublishedPage, CallError> {
        let mut c = self.controller.clone();
        let r = self
            .call(
                method::LIST_VOLUMES,
                false,
                timeout,
                c.list_volumes(Self::request(
                    proto::ListVolumesRequest {
                        max_entries,
                        starting_token,
                    },
                    timeout,
                )),
            )
            .await?;
        let volumes = r
            .entries
            .into_iter()
            .filter_map(|e| match (e.volume, e.status) {
                (Some(v), Some(s)) => Some((v.volume_id, s.published_node_ids)),
                _ => None,
            })
            .collect();
        Ok(PublishedPage {
            volumes,
            next_token: r.next_token,
        })
    }

    /// Every page of ListVolumes within one overall `timeout`: volume handle →
    /// published node IDs (later duplicates overwrite earlier ones). Any error
    /// aborts the whole listing.
    pub async fn list_published(
        &self,
        max_entries: i32,
        timeout: Duration,
    ) -> Result<HashMap<String, Vec<String>>, CallError> {
        let deadline = Instant::now() + timeout;
        let mut published = HashMap::new();
        let mut token = String::new();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(CallError {
                    method: method::LIST_VOLUMES,
                    status: deadline_exceeded(),
                });
            }
            let page = self
                .list_published_page(max_entries, token, remaining)
                .await?;
            published.extend(page.volumes);
            if page.next_token.is_empty() {
                return Ok(published);
            }
            token = page.next_token;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{NotUtf8, capped, codes, marshal_error};

    #[test]
    fn an_unmarshalable_request_fails_as_grpc_go_fails_it() {
        let s = marshal_error(&NotUtf8);
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(
            codes::go_error_text(&s),
            "rpc error: code = Internal desc = grpc: error while marshaling: string field contains invalid UTF-8"
        );
    }

    #[test]
    fn logged_responses_are_capped_as_external_attacher_caps_them() {
        assert_eq!(capped("abcdef".into(), None), "abcdef");
        assert_eq!(capped("abcdef".into(), Some(10)), "abcdef");
        assert_eq!(
            capped("abcdef".into(), Some(3)),
            "abc [response body too large, log capped to 3 chars]"
        );
    }
}
