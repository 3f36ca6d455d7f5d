//! The CSI Identity, Controller and Node services of the mock, thin shells
//! over [`State`](crate::state::State): each records the call, applies its
//! fault and answers from the in-memory world.

use std::{io, path::Path, sync::Arc};

use tonic::{Request, Response, Status};

use crate::{record::CallRecord, shared::Shared};
use attacher_hub::csi::proto::{
    self, controller_server::Controller, controller_service_capability, identity_server::Identity,
    node_server::Node, node_service_capability, plugin_capability, volume_capability::AccessType,
};

/// The three CSI services over one shared mock.
#[derive(Debug, Clone)]
pub(crate) struct Service(pub(crate) Arc<Shared>);

type Reply<T> = Result<Response<T>, Status>;

fn controller_cap(
    t: controller_service_capability::rpc::Type,
) -> proto::ControllerServiceCapability {
    proto::ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

fn node_cap(t: node_service_capability::rpc::Type) -> proto::NodeServiceCapability {
    proto::NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!("{what} is switched off in this mock"))
}

/// Creates the node-side target: a directory for a mount volume, a file for
/// a block volume (the parent must exist, as CSI says the CO creates it).
fn create_target(path: &Path, block: bool) -> io::Result<()> {
    if block {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    } else {
        std::fs::create_dir_all(path)
    }
}

/// Removes what [`create_target`] made; a missing path is fine.
fn remove_target(path: &Path) -> io::Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn io_status(what: &str, e: &io::Error) -> Status {
    Status::internal(format!("{what}: {e}"))
}

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _req: Request<proto::GetPluginInfoRequest>,
    ) -> Reply<proto::GetPluginInfoResponse> {
        self.0
            .call(CallRecord::new("GetPluginInfo"), |s| {
                Ok(proto::GetPluginInfoResponse {
                    name: s.config.name.clone(),
                    vendor_version: s.config.vendor_version.clone(),
                    manifest: Default::default(),
                })
            })
            .await
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Reply<proto::GetPluginCapabilitiesResponse> {
        self.0
            .call(CallRecord::new("GetPluginCapabilities"), |s| {
                let mut capabilities = Vec::new();
                if s.config.capabilities.controller_service {
                    capabilities.push(proto::PluginCapability {
                        r#type: Some(plugin_capability::Type::Service(
                            plugin_capability::Service {
                                r#type: plugin_capability::service::Type::ControllerService as i32,
                            },
                        )),
                    });
                }
                Ok(proto::GetPluginCapabilitiesResponse { capabilities })
            })
            .await
    }

    async fn probe(&self, _req: Request<proto::ProbeRequest>) -> Reply<proto::ProbeResponse> {
        self.0
            .call(CallRecord::new("Probe"), |s| {
                Ok(proto::ProbeResponse {
                    ready: Some(s.ready()),
                })
            })
            .await
    }
}

#[tonic::async_trait]
impl Controller for Service {
    async fn create_volume(
        &self,
        req: Request<proto::CreateVolumeRequest>,
    ) -> Reply<proto::CreateVolumeResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("CreateVolume")
            .ids(&req.name, "")
            .capability(req.volume_capabilities.first())
            .maps(&req.secrets, &req.parameters);
        self.0
            .call(rec, |s| {
                let volume = s.state.lock().create_volume(&req)?;
                Ok(proto::CreateVolumeResponse {
                    volume: Some(volume),
                })
            })
            .await
    }

    async fn delete_volume(
        &self,
        req: Request<proto::DeleteVolumeRequest>,
    ) -> Reply<proto::DeleteVolumeResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("DeleteVolume")
            .ids(&req.volume_id, "")
            .maps(&req.secrets, &Default::default());
        self.0
            .call(rec, |s| {
                s.state.lock().delete_volume(&req.volume_id)?;
                Ok(proto::DeleteVolumeResponse {})
            })
            .await
    }

    async fn controller_publish_volume(
        &self,
        req: Request<proto::ControllerPublishVolumeRequest>,
    ) -> Reply<proto::ControllerPublishVolumeResponse> {
        let req = req.into_inner();
        let mut rec = CallRecord::new("ControllerPublishVolume")
            .ids(&req.volume_id, &req.node_id)
            .capability(req.volume_capability.as_ref())
            .maps(&req.secrets, &req.volume_context);
        rec.readonly = req.readonly;
        self.0
            .call(rec, |s| {
                if !s.config.capabilities.publish_unpublish {
                    return Err(unimplemented("PUBLISH_UNPUBLISH_VOLUME"));
                }
                let ctx = s.state.lock().publish(&req)?;
                Ok(proto::ControllerPublishVolumeResponse {
                    publish_context: ctx.into_iter().collect(),
                })
            })
            .await
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<proto::ControllerUnpublishVolumeRequest>,
    ) -> Reply<proto::ControllerUnpublishVolumeResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("ControllerUnpublishVolume")
            .ids(&req.volume_id, &req.node_id)
            .maps(&req.secrets, &Default::default());
        self.0
            .call(rec, |s| {
                if !s.config.capabilities.publish_unpublish {
                    return Err(unimplemented("PUBLISH_UNPUBLISH_VOLUME"));
                }
                s.state.lock().unpublish(&req.volume_id, &req.node_id)?;
                Ok(proto::ControllerUnpublishVolumeResponse {})
            })
            .await
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<proto::ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<proto::ValidateVolumeCapabilitiesResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("ValidateVolumeCapabilities")
            .ids(&req.volume_id, "")
            .capability(req.volume_capabilities.first())
            .maps(&req.secrets, &req.volume_context);
        self.0
            .call(rec, |s| Ok(s.state.lock().validate(&req)?))
            .await
    }

    async fn list_volumes(
        &self,
        req: Request<proto::ListVolumesRequest>,
    ) -> Reply<proto::ListVolumesResponse> {
        let req = req.into_inner();
        self.0
            .call(CallRecord::new("ListVolumes"), |s| {
                let caps = &s.config.capabilities;
                if !caps.list_volumes {
                    return Err(unimplemented("LIST_VOLUMES"));
                }
                Ok(s.state.lock().list(
                    req.max_entries,
                    &req.starting_token,
                    caps.list_volumes_published_nodes,
                )?)
            })
            .await
    }

    async fn get_capacity(
        &self,
        _req: Request<proto::GetCapacityRequest>,
    ) -> Reply<proto::GetCapacityResponse> {
        self.0
            .call(CallRecord::new("GetCapacity"), |s| {
                Ok(proto::GetCapacityResponse {
                    available_capacity: s.config.capacity_bytes,
                    maximum_volume_size: None,
                    minimum_volume_size: None,
                })
            })
            .await
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Reply<proto::ControllerGetCapabilitiesResponse> {
        use controller_service_capability::rpc::Type;
        self.0
            .call(CallRecord::new("ControllerGetCapabilities"), |s| {
                let c = &s.config.capabilities;
                let capabilities = [
                    (true, Type::CreateDeleteVolume),
                    (true, Type::GetCapacity),
                    (true, Type::GetVolume),
                    (c.publish_unpublish, Type::PublishUnpublishVolume),
                    (c.publish_readonly, Type::PublishReadonly),
                    (c.list_volumes, Type::ListVolumes),
                    (
                        c.list_volumes_published_nodes,
                        Type::ListVolumesPublishedNodes,
                    ),
                    (c.single_node_multi_writer, Type::SingleNodeMultiWriter),
                ]
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, t)| controller_cap(t))
                .collect();
                Ok(proto::ControllerGetCapabilitiesResponse { capabilities })
            })
            .await
    }

    async fn controller_get_volume(
        &self,
        req: Request<proto::ControllerGetVolumeRequest>,
    ) -> Reply<proto::ControllerGetVolumeResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("ControllerGetVolume").ids(&req.volume_id, "");
        self.0
            .call(rec, |s| Ok(s.state.lock().get(&req.volume_id)?))
            .await
    }

    // The alpha health RPCs of CSI v1.13: the mock advertises neither capability.
    async fn controller_list_volume_health(
        &self,
        _req: Request<proto::ControllerListVolumeHealthRequest>,
    ) -> Reply<proto::ControllerListVolumeHealthResponse> {
        Err(Status::unimplemented("ControllerListVolumeHealth"))
    }

    async fn controller_get_volume_health(
        &self,
        _req: Request<proto::ControllerGetVolumeHealthRequest>,
    ) -> Reply<proto::ControllerGetVolumeHealthResponse> {
        Err(Status::unimplemented("ControllerGetVolumeHealth"))
    }

    async fn controller_get_node_info(
        &self,
        _req: Request<proto::ControllerGetNodeInfoRequest>,
    ) -> Reply<proto::ControllerGetNodeInfoResponse> {
        Err(Status::unimplemented("ControllerGetNodeInfo"))
    }
}

#[tonic::async_trait]
impl Node for Service {
    async fn node_stage_volume(
        &self,
        req: Request<proto::NodeStageVolumeRequest>,
    ) -> Reply<proto::NodeStageVolumeResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("NodeStageVolume")
            .ids(&req.volume_id, "")
            .capability(req.volume_capability.as_ref())
            .maps(&req.secrets, &req.volume_context);
        self.0
            .call(rec, |s| {
                if !s.config.capabilities.stage_unstage {
                    return Err(unimplemented("STAGE_UNSTAGE_VOLUME"));
                }
                s.state.lock().stage(&req)?;
                Ok(proto::NodeStageVolumeResponse {})
            })
            .await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<proto::NodeUnstageVolumeRequest>,
    ) -> Reply<proto::NodeUnstageVolumeResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("NodeUnstageVolume").ids(&req.volume_id, "");
        self.0
            .call(rec, |s| {
                if !s.config.capabilities.stage_unstage {
                    return Err(unimplemented("STAGE_UNSTAGE_VOLUME"));
                }
                s.state
                    .lock()
                    .unstage(&req.volume_id, &req.staging_target_path)?;
                Ok(proto::NodeUnstageVolumeResponse {})
            })
            .await
    }

    async fn node_publish_volume(
        &self,
        req: Request<proto::NodePublishVolumeRequest>,
    ) -> Reply<proto::NodePublishVolumeResponse> {
        let req = req.into_inner();
        let mut rec = CallRecord::new("NodePublishVolume")
            .ids(&req.volume_id, "")
            .capability(req.volume_capability.as_ref())
            .maps(&req.secrets, &req.volume_context);
        rec.readonly = req.readonly;
        self.0
            .call(rec, |s| {
                s.state.lock().node_publish(&req)?;
                let block = matches!(
                    req.volume_capability
                        .as_ref()
                        .and_then(|c| c.access_type.as_ref()),
                    Some(AccessType::Block(_))
                );
                create_target(Path::new(&req.target_path), block)
                    .map_err(|e| io_status("creating the target path", &e))?;
                Ok(proto::NodePublishVolumeResponse {})
            })
            .await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Reply<proto::NodeUnpublishVolumeResponse> {
        let req = req.into_inner();
        let rec = CallRecord::new("NodeUnpublishVolume").ids(&req.volume_id, "");
        self.0
            .call(rec, |s| {
                s.state
                    .lock()
                    .node_unpublish(&req.volume_id, &req.target_path)?;
                remove_target(Path::new(&req.target_path))
                    .map_err(|e| io_status("removing the target path", &e))?;
                Ok(proto::NodeUnpublishVolumeResponse {})
            })
            .await
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Reply<proto::NodeGetCapabilitiesResponse> {
        use node_service_capability::rpc::Type;
        self.0
            .call(CallRecord::new("NodeGetCapabilities"), |s| {
                let c = &s.config.capabilities;
                let capabilities = [
                    (c.stage_unstage, Type::StageUnstageVolume),
                    (c.single_node_multi_writer, Type::SingleNodeMultiWriter),
                ]
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, t)| node_cap(t))
                .collect();
                Ok(proto::NodeGetCapabilitiesResponse { capabilities })
            })
            .await
    }

    async fn node_get_info(
        &self,
        _req: Request<proto::NodeGetInfoRequest>,
    ) -> Reply<proto::NodeGetInfoResponse> {
        let rec = CallRecord::new("NodeGetInfo").ids("", &self.0.config.node_id);
        self.0
            .call(rec, |s| {
                Ok(proto::NodeGetInfoResponse {
                    node_id: s.config.node_id.clone(),
                    max_volumes_per_node: s.config.max_volumes_per_node,
                    accessible_topology: None,
                })
            })
            .await
    }

    async fn node_get_volume_health(
        &self,
        _req: Request<proto::NodeGetVolumeHealthRequest>,
    ) -> Reply<proto::NodeGetVolumeHealthResponse> {
        Err(Status::unimplemented("NodeGetVolumeHealth"))
    }

    async fn node_get_storage_health(
        &self,
        _req: Request<proto::NodeGetStorageHealthRequest>,
    ) -> Reply<proto::NodeGetStorageHealthResponse> {
        Err(Status::unimplemented("NodeGetStorageHealth"))
    }
}
