//! Integration tests of the `mock-csi-driver` binary over its Unix socket,
//! with the generated tonic clients and the typed control client.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use attacher_hub::csi::proto::{
    self, controller_client::ControllerClient, controller_service_capability::rpc::Type as Rpc,
    identity_client::IdentityClient, node_client::NodeClient,
    plugin_capability::service::Type as PluginService, volume_capability,
    volume_capability::access_mode::Mode,
};
use mock_csi_driver::{MockDriver, control, fault::Fault};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tonic::{Code, transport::Channel};

/// Time allowed for the binary to say `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running `mock-csi-driver` in a temporary directory; killed on drop.
struct Mock {
    child: Child,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mock {
    async fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("csi.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_mock-csi-driver"))
            .arg("--endpoint")
            .arg(format!("unix://{}", sock.display()))
            .args(["--name", "mock.test.io"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(START_TIMEOUT, lines.next_line())
            .await
            .expect("mock did not start in time")
            .unwrap();
        assert_eq!(first.as_deref(), Some("ready"));
        Self {
            child,
            sock,
            _dir: dir,
        }
    }

    async fn channel(&self) -> Channel {
        connect(&self.sock).await.unwrap()
    }

    async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel().await)
    }

    async fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel().await)
    }

    async fn control(&self) -> control::Client {
        control::Client::for_endpoint(&self.sock).await.unwrap()
    }
}

async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
}

fn cap(mode: Mode) -> proto::VolumeCapability {
    proto::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            },
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn publish(
    vol: &str,
    node: &str,
    mode: Mode,
    readonly: bool,
) -> proto::ControllerPublishVolumeRequest {
    proto::ControllerPublishVolumeRequest {
        volume_id: vol.into(),
        node_id: node.into(),
        volume_capability: Some(cap(mode)),
        readonly,
        ..Default::default()
    }
}

fn unpublish(vol: &str, node: &str) -> proto::ControllerUnpublishVolumeRequest {
    proto::ControllerUnpublishVolumeRequest {
        volume_id: vol.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

async fn code_of<T>(f: impl std::future::Future<Output = Result<T, tonic::Status>>) -> Code {
    match f.await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

async fn all_published(c: &mut ControllerClient<Channel>) -> Vec<(String, Vec<String>)> {
    let mut token = String::new();
    let mut out = Vec::new();
    loop {
        let page = c
            .list_volumes(proto::ListVolumesRequest {
                max_entries: 1,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        for e in page.entries {
            out.push((
                e.volume.unwrap().volume_id,
                e.status.unwrap_or_default().published_node_ids,
            ));
        }
        if page.next_token.is_empty() {
            return out;
        }
        token = page.next_token;
    }
}

#[tokio::test]
async fn publish_is_idempotent_and_returns_the_device_path() {
    let mock = Mock::start(&["--volumes", "2"]).await;
    let mut c = mock.controller().await;
    let first = c
        .controller_publish_volume(publish("vol-1", "node-a", Mode::SingleNodeWriter, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.publish_context["devicePath"], "/dev/mock/vol-1");
    let again = c
        .controller_publish_volume(publish("vol-1", "node-a", Mode::SingleNodeWriter, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, first);
    for _ in 0..2 {
        c.controller_unpublish_volume(unpublish("vol-1", "node-a"))
            .await
            .unwrap();
    }
    assert!(
        mock.control()
            .await
            .state()
            .await
            .unwrap()
            .attachments()
            .is_empty()
    );
}

#[tokio::test]
async fn a_volume_published_to_many_nodes_lists_every_node() {
    let mock = Mock::start(&["--volumes", "3"]).await;
    let mut c = mock.controller().await;
    for node in ["node-c", "node-a", "node-b"] {
        c.controller_publish_volume(publish("vol-2", node, Mode::MultiNodeMultiWriter, false))
            .await
            .unwrap();
    }
    c.controller_publish_volume(publish("vol-0", "node-a", Mode::SingleNodeWriter, false))
        .await
        .unwrap();
    c.controller_unpublish_volume(unpublish("vol-2", "node-b"))
        .await
        .unwrap();
    assert_eq!(
        all_published(&mut c).await,
        vec![
            ("vol-0".to_string(), vec!["node-a".to_string()]),
            ("vol-1".to_string(), vec![]),
            (
                "vol-2".to_string(),
                vec!["node-a".to_string(), "node-c".to_string()]
            ),
        ]
    );
    let got = c
        .controller_get_volume(proto::ControllerGetVolumeRequest {
            volume_id: "vol-2".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.status.unwrap().published_node_ids,
        vec!["node-a", "node-c"]
    );
    let state = mock.control().await.state().await.unwrap();
    assert_eq!(
        state.volume("vol-2").unwrap().attachments[0].access_mode,
        "MULTI_NODE_MULTI_WRITER"
    );
}

#[tokio::test]
async fn errors_carry_the_csi_spec_codes() {
    let mock = Mock::start(&[
        "--volumes",
        "3",
        "--max-volumes-per-node",
        "1",
        "--missing-node-prefix",
        "gone-",
    ])
    .await;
    let mut c = mock.controller().await;
    let mut no_vol = publish("", "node-a", Mode::SingleNodeWriter, false);
    assert_eq!(
        code_of(c.controller_publish_volume(no_vol.clone())).await,
        Code::InvalidArgument
    );
    no_vol.volume_id = "vol-0".into();
    no_vol.node_id.clear();
    assert_eq!(
        code_of(c.controller_publish_volume(no_vol)).await,
        Code::InvalidArgument
    );
    let mut no_cap = publish("vol-0", "node-a", Mode::SingleNodeWriter, false);
    no_cap.volume_capability = None;
    assert_eq!(
        code_of(c.controller_publish_volume(no_cap)).await,
        Code::InvalidArgument
    );
    assert_eq!(
        code_of(c.controller_publish_volume(publish(
            "nope",
            "node-a",
            Mode::SingleNodeWriter,
            false
        )))
        .await,
        Code::NotFound
    );
    assert_eq!(
        code_of(c.controller_publish_volume(publish(
            "vol-0",
            "gone-1",
            Mode::SingleNodeWriter,
            false
        )))
        .await,
        Code::NotFound
    );
    c.controller_publish_volume(publish("vol-0", "node-a", Mode::SingleNodeWriter, false))
        .await
        .unwrap();
    assert_eq!(
        code_of(c.controller_publish_volume(publish(
            "vol-0",
            "node-a",
            Mode::SingleNodeWriter,
            true
        )))
        .await,
        Code::AlreadyExists
    );
    assert_eq!(
        code_of(c.controller_publish_volume(publish(
            "vol-0",
            "node-b",
            Mode::SingleNodeWriter,
            false
        )))
        .await,
        Code::FailedPrecondition
    );
    assert_eq!(
        code_of(c.controller_publish_volume(publish(
            "vol-1",
            "node-a",
            Mode::SingleNodeWriter,
            false
        )))
        .await,
        Code::ResourceExhausted
    );
    assert_eq!(
        code_of(c.controller_unpublish_volume(unpublish("", "node-a"))).await,
        Code::InvalidArgument
    );
    assert_eq!(
        code_of(c.controller_unpublish_volume(unpublish("nope", "node-a"))).await,
        Code::Ok
    );
    assert_eq!(
        code_of(c.controller_unpublish_volume(unpublish("vol-2", "node-a"))).await,
        Code::Ok
    );
    assert_eq!(
        code_of(c.list_volumes(proto::ListVolumesRequest {
            max_entries: 0,
            starting_token: "invalid-token".into(),
        }))
        .await,
        Code::Aborted
    );
}

#[tokio::test]
async fn capability_switches_change_what_is_advertised() {
    let full = Mock::start(&[]).await;
    let plugin = full
        .identity()
        .await
        .get_plugin_capabilities(proto::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        plugin.capabilities[0].r#type,
        Some(proto::plugin_capability::Type::Service(
            proto::plugin_capability::Service {
                r#type: PluginService::ControllerService as i32
            }
        ))
    );
    let rpcs = controller_rpcs(&full).await;
    for want in [
        Rpc::PublishUnpublishVolume,
        Rpc::PublishReadonly,
        Rpc::ListVolumes,
        Rpc::ListVolumesPublishedNodes,
    ] {
        assert!(rpcs.contains(&want), "{want:?} missing from {rpcs:?}");
    }
    assert!(!rpcs.contains(&Rpc::SingleNodeMultiWriter));

    let bare = Mock::start(&[
        "--no-controller-service",
        "--no-publish",
        "--no-readonly",
        "--no-published-nodes",
        "--no-list-volumes",
        "--single-node-multi-writer",
        "--volumes",
        "1",
    ])
    .await;
    let plugin = bare
        .identity()
        .await
        .get_plugin_capabilities(proto::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(plugin.capabilities.is_empty());
    let rpcs = controller_rpcs(&bare).await;
    for gone in [
        Rpc::PublishUnpublishVolume,
        Rpc::PublishReadonly,
        Rpc::ListVolumes,
        Rpc::ListVolumesPublishedNodes,
    ] {
        assert!(!rpcs.contains(&gone), "{gone:?} still in {rpcs:?}");
    }
    assert!(rpcs.contains(&Rpc::SingleNodeMultiWriter));
    let mut c = bare.controller().await;
    assert_eq!(
        code_of(c.controller_publish_volume(publish("vol-0", "n", Mode::SingleNodeWriter, false)))
            .await,
        Code::Unimplemented
    );
    assert_eq!(
        code_of(c.list_volumes(proto::ListVolumesRequest::default())).await,
        Code::Unimplemented
    );

    // Published-nodes switch alone: ListVolumes works but reports no nodes.
    let quiet = Mock::start(&["--no-published-nodes", "--volumes", "1"]).await;
    let mut c = quiet.controller().await;
    c.controller_publish_volume(publish("vol-0", "n", Mode::SingleNodeWriter, false))
        .await
        .unwrap();
    assert_eq!(
        all_published(&mut c).await,
        vec![("vol-0".to_string(), vec![])]
    );
}

async fn controller_rpcs(mock: &Mock) -> Vec<Rpc> {
    mock.controller()
        .await
        .controller_get_capabilities(proto::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(proto::controller_service_capability::Type::Rpc(r)) => {
                Rpc::try_from(r.r#type).ok()
            }
            None => None,
        })
        .collect()
}

#[tokio::test]
async fn a_runtime_fault_is_set_and_cleared_through_the_control_socket() {
    let mock = Mock::start(&["--volumes", "1"]).await;
    let mut c = mock.controller().await;
    let mut ctl = mock.control().await;
    let req = || publish("vol-0", "node-a", Mode::SingleNodeWriter, false);

    ctl.set_fault("ControllerPublishVolume", Fault::code(Code::Unavailable))
        .await
        .unwrap();
    assert_eq!(
        ctl.faults().await.unwrap(),
        vec!["ControllerPublishVolume=code:Unavailable"]
    );
    assert_eq!(
        code_of(c.controller_publish_volume(req())).await,
        Code::Unavailable
    );
    assert!(ctl.state().await.unwrap().attachments().is_empty());

    ctl.set_fault("*", Fault::every(2, Code::Aborted))
        .await
        .unwrap();
    ctl.clear_fault("ControllerPublishVolume").await.unwrap();
    let codes = [
        code_of(c.controller_publish_volume(req())).await,
        code_of(c.controller_publish_volume(req())).await,
        code_of(c.controller_publish_volume(req())).await,
    ];
    assert_eq!(codes, [Code::Ok, Code::Aborted, Code::Ok]);

    ctl.set_fault(
        "ControllerUnpublishVolume",
        Fault::delay(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let started = Instant::now();
    c.controller_unpublish_volume(unpublish("vol-0", "node-a"))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));

    ctl.clear_faults().await.unwrap();
    assert!(ctl.faults().await.unwrap().is_empty());
    for _ in 0..3 {
        assert_eq!(code_of(c.controller_publish_volume(req())).await, Code::Ok);
    }
}

#[tokio::test]
async fn a_fault_given_at_start_applies_from_the_first_call() {
    let mock = Mock::start(&[
        "--volumes",
        "1",
        "--fault",
        "ControllerPublishVolume=code:ResourceExhausted",
    ])
    .await;
    let mut c = mock.controller().await;
    assert_eq!(
        code_of(c.controller_publish_volume(publish("vol-0", "n", Mode::SingleNodeWriter, false)))
            .await,
        Code::ResourceExhausted
    );
}

#[tokio::test]
async fn a_hung_call_answers_once_the_fault_is_cleared() {
    let mock = Mock::start(&[]).await;
    let mut ctl = mock.control().await;
    ctl.set_fault("Probe", Fault::hang()).await.unwrap();
    let mut id = mock.identity().await;
    let probe = tokio::spawn(async move { id.probe(proto::ProbeRequest {}).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!probe.is_finished());
    ctl.clear_faults().await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), probe)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.unwrap().into_inner().ready, Some(true));
}

#[tokio::test]
async fn close_drops_the_connection_and_serves_again_after_the_delay() {
    let mock = Mock::start(&[]).await;
    let mut ctl = mock.control().await;
    ctl.set_fault("Probe", Fault::close(Some(Duration::from_millis(500))))
        .await
        .unwrap();
    let mut id = mock.identity().await;
    let err = tokio::time::timeout(Duration::from_secs(5), id.probe(proto::ProbeRequest {}))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            err.code(),
            Code::Unavailable | Code::Unknown | Code::Internal
        ),
        "{err:?}"
    );
    // The rule fired once and is gone; the mock comes back on the same path.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(ch) = connect(&mock.sock).await
            && IdentityClient::new(ch)
                .probe(proto::ProbeRequest {})
                .await
                .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "mock did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ctl.faults().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_exit_fault_ends_the_process_with_its_status() {
    let mut mock = Mock::start(&["--fault", "Probe=exit:7"]).await;
    let mut id = mock.identity().await;
    let _ = id.probe(proto::ProbeRequest {}).await;
    let status = tokio::time::timeout(Duration::from_secs(5), mock.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(7));
}

#[tokio::test]
async fn probe_is_not_ready_for_the_given_time_and_on_request() {
    let mock = Mock::start(&["--not-ready-for", "1s"]).await;
    let mut id = mock.identity().await;
    let ready = |r: proto::ProbeResponse| r.ready;
    assert_eq!(
        ready(id.probe(proto::ProbeRequest {}).await.unwrap().into_inner()),
        Some(false)
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        ready(id.probe(proto::ProbeRequest {}).await.unwrap().into_inner()),
        Some(true)
    );
    mock.control().await.set_ready(false).await.unwrap();
    assert_eq!(
        ready(id.probe(proto::ProbeRequest {}).await.unwrap().into_inner()),
        Some(false)
    );
}

#[tokio::test]
async fn the_call_record_keeps_what_arrived_including_secrets() {
    let mock = Mock::start(&["--volumes", "1", "--node-id", "worker-7"]).await;
    let mut ctl = mock.control().await;
    ctl.reset_calls().await.unwrap();
    let mut c = mock.controller().await;
    let mut req = publish("vol-0", "worker-7", Mode::SingleNodeWriter, true);
    req.secrets
        .insert("password".into(), "hunter2-for-vol-0".into());
    req.volume_context.insert("pool".into(), "fast".into());
    c.controller_publish_volume(req).await.unwrap();
    let _ = c
        .controller_publish_volume(publish(
            "missing",
            "worker-7",
            Mode::SingleNodeWriter,
            false,
        ))
        .await;
    let node = NodeClient::new(mock.channel().await)
        .node_get_info(proto::NodeGetInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node.node_id, "worker-7");

    let calls = ctl.calls().await.unwrap();
    let publishes: Vec<_> = calls
        .iter()
        .filter(|r| r.method == "ControllerPublishVolume")
        .collect();
    assert_eq!(publishes.len(), 2);
    let first = publishes[0];
    assert_eq!(first.volume_id, "vol-0");
    assert_eq!(first.node_id, "worker-7");
    assert!(first.readonly);
    assert_eq!(first.access_mode, "SINGLE_NODE_WRITER");
    assert_eq!(first.access_type, "mount");
    assert_eq!(first.fs_type, "ext4");
    assert_eq!(first.secrets["password"], "hunter2-for-vol-0");
    assert_eq!(first.volume_context["pool"], "fast");
    assert_eq!(first.grpc_code(), Some(Code::Ok));
    assert!(first.time_unix_ms > 0);
    assert_eq!(publishes[1].grpc_code(), Some(Code::NotFound));
    assert!(calls.iter().any(|r| r.method == "NodeGetInfo"));

    ctl.reset_calls().await.unwrap();
    assert!(ctl.calls().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_in_process_mock_stops_and_restarts_on_the_same_path() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("inproc.sock");
    let handle = MockDriver::new("inproc.test.io")
        .volumes(1)
        .serve(&sock)
        .await
        .unwrap();
    let mut c = ControllerClient::new(connect(&sock).await.unwrap());
    c.controller_publish_volume(publish("vol-0", "n1", Mode::SingleNodeWriter, false))
        .await
        .unwrap();

    handle.stop().await;
    assert!(!sock.exists());
    assert!(connect(&sock).await.is_err());
    handle.restart().await.unwrap();
    let mut c = ControllerClient::new(connect(&sock).await.unwrap());
    // State survives a restart.
    assert_eq!(
        code_of(c.controller_publish_volume(publish("vol-0", "n2", Mode::SingleNodeWriter, false)))
            .await,
        Code::FailedPrecondition
    );
    handle.set_fault("ControllerGetVolume", Fault::code(Code::Internal));
    assert_eq!(
        code_of(c.controller_get_volume(proto::ControllerGetVolumeRequest {
            volume_id: "vol-0".into()
        }))
        .await,
        Code::Internal
    );
    assert_eq!(
        handle.state().attachments(),
        vec![("vol-0".to_string(), "n1".to_string())]
    );
    assert!(
        handle
            .calls()
            .iter()
            .any(|r| r.method == "ControllerGetVolume")
    );
    handle.shutdown().await;
    assert!(!sock.exists());
}
