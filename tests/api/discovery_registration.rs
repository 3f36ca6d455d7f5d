//! Discovery through the kubelet's plugin registration directory: a CSI
//! plugin registered there (as node-driver-registrar registers it) becomes a
//! driver of attacher-hub, at the endpoint and under the name it registered;
//! when its registration socket goes away, the driver stops.

use crate::support;

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use attacher_hub::csi::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::{Registration, RegistrationServer},
};
use mock_csi_driver::MockDriver;
use support::{Cluster, PvBuilder};
use tokio_util::sync::CancellationToken;

/// A plugin's registration socket, as node-driver-registrar serves it.
struct Registrar {
    info: PluginInfo,
    /// NotifyRegistrationStatus calls received (only a kubelet may make them).
    notified: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        _: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        // Only the kubelet may register a plugin; attacher-hub must not call this.
        self.notified.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::permission_denied(
            "attacher-hub must not register plugins",
        ))
    }
}

fn serve_registration(
    path: &Path,
    info: PluginInfo,
    notified: Arc<AtomicUsize>,
) -> CancellationToken {
    let listener = tokio::net::UnixListener::bind(path).expect("bind registration socket");
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Registrar { info, notified }))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                s.cancelled(),
            )
            .await
            .expect("registration server");
    });
    stop
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn drivers(port: u16) -> Vec<serde_json::Value> {
    let url = format!("http://127.0.0.1:{port}/drivers");
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "2", &url])
        .output()
        .await
        .expect("curl");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

async fn wait_drivers(
    port: u16,
    what: &str,
    ok: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let started = Instant::now();
    loop {
        let d = drivers(port).await;
        if ok(&d) {
            return d;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: /drivers is {d:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_plugin_registered_with_the_kubelet_becomes_a_driver_and_leaves_with_its_registration() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let dir = tempfile::tempdir().unwrap();
    let registry_dir = dir.path().join("plugins_registry");
    std::fs::create_dir(&registry_dir).unwrap();
    let driver = support::unique_driver_name("registered");
    let csi_socket: PathBuf = dir.path().join("csi.sock");
    let mock = MockDriver::new(&driver)
        .volumes(2)
        .serve(&csi_socket)
        .await
        .unwrap();

    let notified = Arc::new(AtomicUsize::new(0));
    // A registration socket that is not a CSI plugin is ignored.
    let _device_plugin = serve_registration(
        &registry_dir.join("gpu-reg.sock"),
        PluginInfo {
            r#type: "DevicePlugin".into(),
            name: "gpu.example.com".into(),
            endpoint: "/nonexistent/device.sock".into(),
            supported_versions: vec!["v1beta1".into()],
        },
        notified.clone(),
    );
    let registration = serve_registration(
        &registry_dir.join(format!("{driver}-reg.sock")),
        PluginInfo {
            r#type: "CSIPlugin".into(),
            name: driver.clone(),
            endpoint: csi_socket.display().to_string(),
            supported_versions: vec!["1.0.0".into()],
        },
        notified.clone(),
    );

    let port = free_port();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
    cmd.arg(format!(
        "--kubeconfig={}",
        cluster.attacher_kubeconfig.display()
    ))
    .arg(format!(
        "--kubelet-registration-dir={}",
        registry_dir.display()
    ))
    .arg(format!("--http-endpoint=127.0.0.1:{port}"))
    .args(["--kube-api-qps=100", "--kube-api-burst=200", "-v=2"]);
    let mut hub = support::ChildProcess::spawn("attacher-hub", cmd);

    let listed = wait_drivers(port, "the registered plugin is served", |d| {
        d.len() == 1 && d[0]["state"]["state"] == "leading" && d[0]["name"] == driver.as_str()
    })
    .await;
    assert_eq!(
        listed[0]["socket"],
        format!("unix://{}", csi_socket.display())
    );
    assert_eq!(listed[0]["discovered"], true);

    // It works: a VA of the driver gets attached.
    let node = support::unique_name("reg-node");
    support::create_node(&client, &node).await;
    support::create_csinode(&client, &node, &driver, "node-1").await;
    let pv = support::unique_name("reg-pv");
    PvBuilder::new(&pv, &driver, "vol-0").create(&client).await;
    let va = support::unique_name("reg-va");
    support::create_va(&client, &va, &driver, &node, &pv).await;
    let vas = kube::Api::<k8s_openapi::api::storage::v1::VolumeAttachment>::all(client.clone());
    support::wait_for(
        &vas,
        &va,
        "status.attached=true",
        support::is_attached(),
        support::WAIT_TIMEOUT,
    )
    .await
    .expect("the VA of the registered driver is attached");
    assert_eq!(
        notified.load(Ordering::SeqCst),
        0,
        "attacher-hub never registers plugins"
    );
    assert!(
        mock.calls()
            .iter()
            .any(|c| c.method == "ControllerPublishVolume"),
        "the registered endpoint is the one that was published through"
    );

    // The plugin is unregistered: its registration socket disappears.
    registration.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = std::fs::remove_file(registry_dir.join(format!("{driver}-reg.sock")));
    wait_drivers(
        port,
        "the unregistered plugin is no longer served",
        <[_]>::is_empty,
    )
    .await;
    assert!(hub.exited().is_none(), "the hub keeps running");
    hub.stop().await;
}
