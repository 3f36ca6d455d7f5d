//! A fake CSI driver for unit tests: the Identity and Controller services of [`proto`], served
//! in memory over a duplex pipe (tonic's in-memory server pattern, no socket), answering from a
//! script and recording every call. The integration tests use the project's mock driver
//! (`crates/mock-csi-driver`) on a real socket instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tonic::transport::{Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use super::client::{CallMetrics, DriverClient};
use super::proto::{
    self, controller_server::Controller, controller_server::ControllerServer,
    controller_service_capability, identity_server::Identity, identity_server::IdentityServer,
    plugin_capability,
};
use crate::metrics::CsiOperations;

type Reply<T> = Result<Response<T>, Status>;

/// One call the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    /// The RPC, e.g. `ControllerPublishVolume`.
    pub(crate) method: &'static str,
    /// Its volume ID (empty for calls without one).
    pub(crate) volume_id: String,
    /// Its node ID (empty for calls without one).
    pub(crate) node_id: String,
    /// `readonly` of a publish.
    pub(crate) readonly: bool,
    /// The secrets sent.
    pub(crate) secrets: BTreeMap<String, String>,
}

/// The script and the record.
#[derive(Debug, Default)]
struct Script {
    name: String,
    caps: Vec<controller_service_capability::rpc::Type>,
    /// What the next publishes answer (each error once, then success).
    publish_errors: Vec<Status>,
    /// What the next unpublishes answer (each error once, then success).
    unpublish_errors: Vec<Status>,
    /// ListVolumes: volume ID → published node IDs.
    published: BTreeMap<String, Vec<String>>,
    calls: Vec<Call>,
    /// How long each publish and unpublish takes.
    delay: std::time::Duration,
    /// Publishes and unpublishes in flight now, and the most there ever were.
    in_flight: usize,
    max_in_flight: usize,
}

/// Counts a publish or unpublish in flight for as long as it lives.
struct InFlight(FakeCsi);

impl InFlight {
    async fn start(fake: &FakeCsi) -> Self {
        let delay = {
            let mut s = fake.0.lock();
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
            s.delay
        };
        let this = InFlight(fake.clone());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        this
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.0.lock().in_flight -= 1;
    }
}

/// A fake driver; clones share its script and record.
#[derive(Clone, Debug, Default)]
pub(crate) struct FakeCsi(Arc<Mutex<Script>>);

impl FakeCsi {
    /// A driver named `name` with PUBLISH_UNPUBLISH_VOLUME, LIST_VOLUMES and
    /// LIST_VOLUMES_PUBLISHED_NODES.
    pub(crate) fn new(name: &str) -> Self {
        use controller_service_capability::rpc::Type;
        let fake = Self::default();
        {
            let mut s = fake.0.lock();
            s.name = name.to_owned();
            s.caps = vec![
                Type::PublishUnpublishVolume,
                Type::ListVolumes,
                Type::ListVolumesPublishedNodes,
            ];
        }
        fake
    }

    /// The next publish answers `status` (then publishes work again).
    pub(crate) fn fail_next_publish(&self, status: Status) {
        self.0.lock().publish_errors.push(status);
    }

    /// The next unpublish answers `status`.
    pub(crate) fn fail_next_unpublish(&self, status: Status) {
        self.0.lock().unpublish_errors.push(status);
    }

    /// What ListVolumes reports: `volume` published on `nodes`.
    pub(crate) fn set_published(&self, volume: &str, nodes: &[&str]) {
        self.0.lock().published.insert(
            volume.to_owned(),
            nodes.iter().map(|n| (*n).to_owned()).collect(),
        );
    }

    /// Each publish and unpublish takes `delay` from now on.
    pub(crate) fn set_call_delay(&self, delay: std::time::Duration) {
        self.0.lock().delay = delay;
    }

    /// The most publishes and unpublishes that were ever in flight at once.
    pub(crate) fn max_in_flight(&self) -> usize {
        self.0.lock().max_in_flight
    }

    /// Every call so far, oldest first.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.0.lock().calls.clone()
    }

    /// The calls of `method`.
    pub(crate) fn calls_of(&self, method: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect()
    }

    /// A client of this driver over an in-memory pipe, its metrics on a registry of its own.
    pub(crate) async fn client(&self) -> DriverClient {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = Server::builder()
            .add_service(IdentityServer::new(self.clone()))
            .add_service(ControllerServer::new(self.clone()))
            .serve_with_incoming(tokio_stream::once(Ok::<_, std::io::Error>(server_io)));
        tokio::spawn(server);
        let mut client_io = Some(client_io);
        let channel = Endpoint::from_static("http://fake.csi")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let io = client_io.take();
                async move {
                    io.map(TokioIo::new)
                        .ok_or_else(|| std::io::Error::other("the pipe is taken"))
                }
            }))
            .await
            .expect("an in-memory channel");
        let ops = CsiOperations::register(&prometheus::Registry::new()).expect("metrics");
        DriverClient::from_channel(channel, CallMetrics::new(ops))
    }

    /// Serves this driver on the Unix socket `path` until the handle is dropped: its identity
    /// service, and its controller service unless `controller` is false, as a node plugin
    /// built from one binary for both roles does (the GCE PD driver with
    /// `--run-controller-service=false`): it offers the controller service and does not serve
    /// it.
    pub(crate) fn serve_unix(
        &self,
        path: &std::path::Path,
        controller: bool,
    ) -> tokio_util::task::AbortOnDropHandle<()> {
        let listener = tokio::net::UnixListener::bind(path).expect("bind the fake's socket");
        let server = Server::builder()
            .add_service(IdentityServer::new(self.clone()))
            .add_optional_service(controller.then(|| ControllerServer::new(self.clone())))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener));
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = server.await;
        }))
    }

    fn record(&self, call: Call) {
        self.0.lock().calls.push(call);
    }
}

fn call(method: &'static str) -> Call {
    Call {
        method,
        volume_id: String::new(),
        node_id: String::new(),
        readonly: false,
        secrets: BTreeMap::new(),
    }
}

#[tonic::async_trait]
impl Identity for FakeCsi {
    async fn get_plugin_info(
        &self,
        _: Request<proto::GetPluginInfoRequest>,
    ) -> Reply<proto::GetPluginInfoResponse> {
        self.record(call("GetPluginInfo"));
        Ok(Response::new(proto::GetPluginInfoResponse {
            name: self.0.lock().name.clone(),
            vendor_version: "0.0.0".into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Reply<proto::GetPluginCapabilitiesResponse> {
        use plugin_capability::{Service, Type, service};
        self.record(call("GetPluginCapabilities"));
        Ok(Response::new(proto::GetPluginCapabilitiesResponse {
            capabilities: vec![proto::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(&self, _: Request<proto::ProbeRequest>) -> Reply<proto::ProbeResponse> {
        self.record(call("Probe"));
        Ok(Response::new(proto::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for FakeCsi {
    async fn create_volume(
        &self,
        _: Request<proto::CreateVolumeRequest>,
    ) -> Reply<proto::CreateVolumeResponse> {
        Err(Status::unimplemented("CreateVolume"))
    }

    async fn delete_volume(
        &self,
        _: Request<proto::DeleteVolumeRequest>,
    ) -> Reply<proto::DeleteVolumeResponse> {
        Err(Status::unimplemented("DeleteVolume"))
    }

    async fn controller_publish_volume(
        &self,
        req: Request<proto::ControllerPublishVolumeRequest>,
    ) -> Reply<proto::ControllerPublishVolumeResponse> {
        let req = req.into_inner();
        self.record(Call {
            volume_id: req.volume_id.clone(),
            node_id: req.node_id.clone(),
            readonly: req.readonly,
            secrets: req.secrets.into_iter().collect(),
            ..call("ControllerPublishVolume")
        });
        let _in_flight = InFlight::start(self).await;
        let mut script = self.0.lock();
        if !script.publish_errors.is_empty() {
            return Err(script.publish_errors.remove(0));
        }
        script
            .published
            .entry(req.volume_id.clone())
            .or_default()
            .push(req.node_id);
        Ok(Response::new(proto::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([("devicePath".to_owned(), req.volume_id)]),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<proto::ControllerUnpublishVolumeRequest>,
    ) -> Reply<proto::ControllerUnpublishVolumeResponse> {
        let req = req.into_inner();
        self.record(Call {
            volume_id: req.volume_id.clone(),
            node_id: req.node_id.clone(),
            secrets: req.secrets.into_iter().collect(),
            ..call("ControllerUnpublishVolume")
        });
        let _in_flight = InFlight::start(self).await;
        let mut script = self.0.lock();
        if !script.unpublish_errors.is_empty() {
            return Err(script.unpublish_errors.remove(0));
        }
        if let Some(nodes) = script.published.get_mut(&req.volume_id) {
            nodes.retain(|n| *n != req.node_id);
        }
        Ok(Response::new(proto::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        _: Request<proto::ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<proto::ValidateVolumeCapabilitiesResponse> {
        Err(Status::unimplemented("ValidateVolumeCapabilities"))
    }

    async fn list_volumes(
        &self,
        _: Request<proto::ListVolumesRequest>,
    ) -> Reply<proto::ListVolumesResponse> {
        use proto::list_volumes_response::{Entry, VolumeStatus};
        self.record(call("ListVolumes"));
        let entries = self
            .0
            .lock()
            .published
            .iter()
            .map(|(volume, nodes)| Entry {
                volume: Some(proto::Volume {
                    volume_id: volume.clone(),
                    ..proto::Volume::default()
                }),
                status: Some(VolumeStatus {
                    published_node_ids: nodes.clone(),
                }),
            })
            .collect();
        Ok(Response::new(proto::ListVolumesResponse {
            entries,
            next_token: String::new(),
        }))
    }

    async fn get_capacity(
        &self,
        _: Request<proto::GetCapacityRequest>,
    ) -> Reply<proto::GetCapacityResponse> {
        Err(Status::unimplemented("GetCapacity"))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Reply<proto::ControllerGetCapabilitiesResponse> {
        use controller_service_capability::{Rpc, Type};
        self.record(call("ControllerGetCapabilities"));
        let capabilities = self
            .0
            .lock()
            .caps
            .iter()
            .map(|t| proto::ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: *t as i32 })),
            })
            .collect();
        Ok(Response::new(proto::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn controller_get_volume(
        &self,
        _: Request<proto::ControllerGetVolumeRequest>,
    ) -> Reply<proto::ControllerGetVolumeResponse> {
        Err(Status::unimplemented("ControllerGetVolume"))
    }

    async fn controller_list_volume_health(
        &self,
        _: Request<proto::ControllerListVolumeHealthRequest>,
    ) -> Reply<proto::ControllerListVolumeHealthResponse> {
        Err(Status::unimplemented("ControllerListVolumeHealth"))
    }

    async fn controller_get_volume_health(
        &self,
        _: Request<proto::ControllerGetVolumeHealthRequest>,
    ) -> Reply<proto::ControllerGetVolumeHealthResponse> {
        Err(Status::unimplemented("ControllerGetVolumeHealth"))
    }

    async fn controller_get_node_info(
        &self,
        _: Request<proto::ControllerGetNodeInfoRequest>,
    ) -> Reply<proto::ControllerGetNodeInfoResponse> {
        Err(Status::unimplemented("ControllerGetNodeInfo"))
    }
}
