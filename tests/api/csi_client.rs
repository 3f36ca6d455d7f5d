//! The CSI client layer against real drivers on Unix sockets: the project's
//! Rust mock (in process) and the Go mock built from Kubernetes' e2e mock.

use crate::support;

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use attacher_hub::{
    csi::{
        self, Address, CallMetrics, Capabilities, Connection, DriverClient, PublishRequest,
        Secrets, UnpublishRequest,
        proto::{self, volume_capability},
    },
    metrics::CsiOperations,
};
use mock_csi_driver::{self as mock, MockDriver, fault::Fault};
use prometheus::{Encoder, Registry, TextEncoder};
use support::{Cluster, MockCsi, MockCsiOptions};

const CONNECT_LIMIT: Duration = Duration::from_secs(10);

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("csi.sock")
}

fn address(path: &Path) -> Address {
    path.to_str()
        .expect("socket path is UTF-8")
        .parse()
        .expect("a temp path is a valid address")
}

/// Serves `mock` on a socket in a fresh temporary directory (removed when
/// the returned guard drops).
async fn serve(mock: MockDriver) -> (tempfile::TempDir, PathBuf, mock::MockHandle) {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let handle = mock.serve(&path).await.unwrap();
    (dir, path, handle)
}

async fn client_for(path: &Path, registry: &Registry) -> (Connection, DriverClient) {
    let ops = CsiOperations::register(registry).expect("register metrics");
    let conn = Connection::connect(address(path), Some(CONNECT_LIMIT))
        .await
        .expect("connect to the driver");
    let client = DriverClient::new(&conn, CallMetrics::new(ops));
    (conn, client)
}

async fn detect(client: &DriverClient) -> Capabilities {
    csi::probe::probe_until_ready(client, Duration::from_secs(5))
        .await
        .expect("probe");
    csi::probe::capabilities(client)
        .await
        .expect("capabilities")
}

fn mount_rwo() -> proto::VolumeCapability {
    proto::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

fn mount_rwx() -> proto::VolumeCapability {
    proto::VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
        ..mount_rwo()
    }
}

fn publish(volume: &str, node: &str) -> PublishRequest {
    PublishRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        capability: mount_rwo(),
        ..PublishRequest::default()
    }
}

#[tokio::test]
async fn capabilities_of_the_rust_mock_are_detected_for_each_combination() {
    let all = mock::Capabilities::default();
    let cases: Vec<(&str, mock::Capabilities, Capabilities)> = vec![
        (
            "everything",
            all.clone(),
            Capabilities {
                controller_service: true,
                publish_unpublish: true,
                publish_readonly: true,
                list_volumes: true,
                list_volumes_published_nodes: true,
                single_node_multi_writer: false,
            },
        ),
        (
            "no controller service",
            mock::Capabilities {
                controller_service: false,
                ..all.clone()
            },
            Capabilities::default(),
        ),
        (
            "no publish",
            mock::Capabilities {
                publish_unpublish: false,
                ..all.clone()
            },
            Capabilities {
                controller_service: true,
                publish_readonly: true,
                list_volumes: true,
                list_volumes_published_nodes: true,
                ..Capabilities::default()
            },
        ),
        (
            "no readonly, with single-node multi-writer",
            mock::Capabilities {
                publish_readonly: false,
                single_node_multi_writer: true,
                ..all.clone()
            },
            Capabilities {
                controller_service: true,
                publish_unpublish: true,
                list_volumes: true,
                list_volumes_published_nodes: true,
                single_node_multi_writer: true,
                ..Capabilities::default()
            },
        ),
        (
            "no published-nodes listing",
            mock::Capabilities {
                list_volumes_published_nodes: false,
                ..all.clone()
            },
            Capabilities {
                controller_service: true,
                publish_unpublish: true,
                publish_readonly: true,
                list_volumes: true,
                ..Capabilities::default()
            },
        ),
        (
            "no listing at all",
            mock::Capabilities {
                list_volumes: false,
                list_volumes_published_nodes: false,
                ..all.clone()
            },
            Capabilities {
                controller_service: true,
                publish_unpublish: true,
                publish_readonly: true,
                ..Capabilities::default()
            },
        ),
    ];
    for (label, mock_caps, expected) in cases {
        let (_dir, path, _mock) =
            serve(MockDriver::new("caps.csi.test").capabilities(mock_caps)).await;
        let (_conn, client) = client_for(&path, &Registry::new()).await;
        let caps = detect(&client).await;
        assert_eq!(caps, expected, "{label}");
        assert_eq!(
            caps.needs_attach(),
            expected.controller_service && expected.publish_unpublish,
            "{label}"
        );
        assert_eq!(
            csi::probe::plugin_name(&client).await.unwrap(),
            "caps.csi.test",
            "{label}"
        );
    }
}

#[tokio::test]
async fn capabilities_of_the_go_mock_are_detected_with_and_without_attach() {
    let cluster = Cluster::get();
    for disable_attach in [false, true] {
        let driver = support::unique_driver_name("caps-go");
        let go = MockCsi::start(
            cluster,
            &driver,
            MockCsiOptions {
                disable_attach,
                ..MockCsiOptions::default()
            },
        )
        .await;
        let (_conn, client) = client_for(go.socket(), &Registry::new()).await;
        let caps = detect(&client).await;
        assert_eq!(
            caps,
            Capabilities {
                controller_service: true,
                publish_unpublish: !disable_attach,
                publish_readonly: true,
                list_volumes: true,
                list_volumes_published_nodes: true,
                single_node_multi_writer: false,
            },
            "disable_attach={disable_attach}"
        );
        assert_eq!(csi::probe::plugin_name(&client).await.unwrap(), driver);
    }
}

#[tokio::test]
async fn probe_waits_while_the_rust_mock_reports_not_ready() {
    let (_dir, path, mock) =
        serve(MockDriver::new("slow.csi.test").not_ready_for(Duration::from_millis(2500))).await;
    let (_conn, client) = client_for(&path, &Registry::new()).await;
    let started = Instant::now();
    csi::probe::probe_until_ready(&client, Duration::from_secs(5))
        .await
        .unwrap();
    let waited = started.elapsed();
    let probes = mock.calls().iter().filter(|c| c.method == "Probe").count();
    assert!(
        waited >= Duration::from_secs(2),
        "returned after {waited:?}"
    );
    assert!(probes >= 3, "expected repeated probes, saw {probes}");
}

#[tokio::test]
async fn probe_waits_through_deadlines_and_continues_when_ready() {
    let (_dir, path, mock) =
        serve(MockDriver::new("hung.csi.test").fault("Probe", Fault::hang())).await;
    let (_conn, client) = client_for(&path, &Registry::new()).await;
    let probing = tokio::spawn(async move {
        csi::probe::probe_until_ready(&client, Duration::from_millis(200)).await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !probing.is_finished(),
        "probe must keep waiting while calls time out"
    );
    mock.clear_faults();
    tokio::time::timeout(Duration::from_secs(5), probing)
        .await
        .expect("probe returns once the driver answers")
        .unwrap()
        .expect("probe succeeds");
}

#[tokio::test]
async fn other_probe_errors_end_the_wait() {
    let (_dir, path, _mock) =
        serve(MockDriver::new("bad.csi.test").fault("Probe", Fault::code(tonic::Code::Internal)))
            .await;
    let (_conn, client) = client_for(&path, &Registry::new()).await;
    let err = csi::probe::probe_until_ready(&client, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
    assert!(
        err.to_string()
            .starts_with("rpc error: code = Internal desc = "),
        "{err}"
    );
}

fn assert_deadline(err: &csi::CallError) {
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(
        err.to_string(),
        "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    );
}

#[tokio::test]
async fn a_publish_deadline_is_classified_as_may_be_in_progress_on_the_rust_mock() {
    let (_dir, path, _mock) = serve(MockDriver::new("late.csi.test").volumes(1).fault(
        "ControllerPublishVolume",
        Fault::delay(Duration::from_secs(3)),
    ))
    .await;
    let (_conn, client) = client_for(&path, &Registry::new()).await;
    let started = Instant::now();
    let err = client
        .publish(publish("vol-0", "node-1"), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the deadline was not applied"
    );
    assert_deadline(&err);
}

#[tokio::test]
async fn a_publish_deadline_is_classified_as_may_be_in_progress_on_the_go_mock() {
    let cluster = Cluster::get();
    let driver = support::unique_driver_name("late-go");
    let go = MockCsi::start(
        cluster,
        &driver,
        MockCsiOptions {
            publish_delay: Some(Duration::from_secs(3)),
            ..MockCsiOptions::default()
        },
    )
    .await;
    let (_conn, client) = client_for(go.socket(), &Registry::new()).await;
    let err = client
        .publish(publish(&go.volumes[0], &driver), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_deadline(&err);
}

#[tokio::test]
async fn final_errors_keep_the_grpc_code_in_the_message() {
    let (_dir, path, _mock) = serve(MockDriver::new("final.csi.test").volumes(1)).await;
    let (_conn, client) = client_for(&path, &Registry::new()).await;
    let err = client
        .publish(publish("no-such-volume", "node-1"), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(
        err.to_string()
            .starts_with("rpc error: code = NotFound desc = "),
        "{err}"
    );
}

/// Capabilities detected again through the same client, once the driver
/// behind the socket answers.
async fn redetect(client: &DriverClient, what: &str) -> Capabilities {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(c) = csi::probe::capabilities(client).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the same client reaches {what} within 10 s"))
}

async fn wait_for_loss(conn: &Connection, seen: u64) {
    let mut losses = conn.losses();
    tokio::time::timeout(Duration::from_secs(10), losses.wait_for(|n| *n > seen))
        .await
        .expect("the connection loss is noticed within 10 s")
        .expect("the loss channel stays open");
}

#[tokio::test]
async fn a_dropped_rust_mock_connection_is_noticed_and_capabilities_are_detected_again() {
    let (_dir, path, first) = serve(MockDriver::new("flaky.csi.test")).await;
    let (conn, client) = client_for(&path, &Registry::new()).await;
    assert!(detect(&client).await.publish_readonly);

    // The driver goes away and comes back on the same socket, upgraded to a
    // version without PUBLISH_READONLY.
    first.shutdown().await;
    wait_for_loss(&conn, 0).await;
    let _second = MockDriver::new("flaky.csi.test")
        .capabilities(mock::Capabilities {
            publish_readonly: false,
            ..Default::default()
        })
        .serve(&path)
        .await
        .unwrap();
    let caps = redetect(&client, "the new driver").await;
    assert!(!caps.publish_readonly);
    assert!(caps.publish_unpublish);
}

#[tokio::test]
async fn a_dropped_go_mock_connection_is_noticed_and_capabilities_are_detected_again() {
    let cluster = Cluster::get();
    let driver = support::unique_driver_name("flaky-go");
    let mut go = MockCsi::start(cluster, &driver, MockCsiOptions::default()).await;
    let (conn, client) = client_for(go.socket(), &Registry::new()).await;
    assert!(detect(&client).await.publish_unpublish);
    let socket = go.socket().to_path_buf();

    go.driver_process.process.stop().await;
    wait_for_loss(&conn, 0).await;

    // A new Go mock on the same socket, without attach support.
    let program = cluster.bin("mockcsi");
    let mut restarted = support::ChildProcess::spawn("mockcsi-restarted", {
        let mut c = tokio::process::Command::new(program);
        c.arg(format!("--endpoint={}", socket.display()))
            .arg(format!("--name={driver}"))
            .arg("--disable-attach");
        c
    });
    restarted
        .wait_for_output("ready\n", 1, Duration::from_secs(20))
        .await
        .expect("restarted mock is ready");
    let caps = redetect(&client, "the restarted driver").await;
    assert!(!caps.publish_unpublish);
    assert!(caps.controller_service);
    drop(go);
}

fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .unwrap();
    String::from_utf8(buf).unwrap()
}

fn count(text: &str, driver: &str, method: &str, code: &str) -> u64 {
    let needle = format!(
        "csi_sidecar_operations_seconds_count{{driver_name=\"{driver}\",grpc_status_code=\"{code}\",method_name=\"{method}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn every_call_leaves_one_sample_with_driver_method_and_code() {
    let (_dir, path, _mock) = serve(MockDriver::new("metrics.csi.test").volumes(1)).await;
    let registry = Registry::new();
    let (_conn, mut client) = client_for(&path, &registry).await;

    client.probe(Duration::from_secs(1)).await.unwrap();
    let name = csi::probe::plugin_name(&client).await.unwrap();
    client.metrics_mut().set_driver(&name, false);
    csi::probe::capabilities(&client).await.unwrap();
    client
        .publish(publish("vol-0", "n1"), Duration::from_secs(5))
        .await
        .unwrap();
    client
        .publish(publish("vol-0", "n1"), Duration::from_secs(5))
        .await
        .unwrap();
    client
        .publish(publish("missing", "n1"), Duration::from_secs(5))
        .await
        .unwrap_err();
    client
        .unpublish(
            UnpublishRequest {
                volume_id: "vol-0".into(),
                node_id: "n1".into(),
                ..Default::default()
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    client
        .list_published(0, Duration::from_secs(5))
        .await
        .unwrap();

    let text = render(&registry);
    let d = "metrics.csi.test";
    // Before GetPluginInfo answered, the driver name is not known (as in Go).
    assert_eq!(
        count(&text, "unknown-driver", "/csi.v1.Identity/Probe", "OK"),
        1,
        "{text}"
    );
    assert_eq!(
        count(
            &text,
            "unknown-driver",
            "/csi.v1.Identity/GetPluginInfo",
            "OK"
        ),
        1
    );
    assert_eq!(
        count(&text, d, "/csi.v1.Identity/GetPluginCapabilities", "OK"),
        1
    );
    assert_eq!(
        count(
            &text,
            d,
            "/csi.v1.Controller/ControllerGetCapabilities",
            "OK"
        ),
        1
    );
    assert_eq!(
        count(&text, d, "/csi.v1.Controller/ControllerPublishVolume", "OK"),
        2
    );
    assert_eq!(
        count(
            &text,
            d,
            "/csi.v1.Controller/ControllerPublishVolume",
            "NotFound"
        ),
        1
    );
    assert_eq!(
        count(
            &text,
            d,
            "/csi.v1.Controller/ControllerUnpublishVolume",
            "OK"
        ),
        1
    );
    assert_eq!(count(&text, d, "/csi.v1.Controller/ListVolumes", "OK"), 1);
    assert!(
        !text.contains("migrated="),
        "non-migration drivers have no migrated label"
    );
}

#[tokio::test]
async fn migration_drivers_get_the_migrated_label() {
    let (_dir, path, _mock) = serve(MockDriver::new("pd.csi.storage.gke.io").volumes(1)).await;
    let registry = Registry::new();
    let (_conn, mut client) = client_for(&path, &registry).await;
    client
        .metrics_mut()
        .set_driver("pd.csi.storage.gke.io", true);
    let mut req = publish("vol-0", "n1");
    req.migrated = true;
    client.publish(req, Duration::from_secs(5)).await.unwrap();
    let text = render(&registry);
    assert!(
        text.contains(r#"csi_sidecar_operations_seconds_count{driver_name="pd.csi.storage.gke.io",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume",migrated="true"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn paginated_listing_collects_every_page() {
    let (_dir, path, _mock) = serve(MockDriver::new("pages.csi.test").volumes(7)).await;
    let (_conn, client) = client_for(&path, &Registry::new()).await;
    for (v, n) in [("vol-1", "a"), ("vol-1", "b"), ("vol-6", "c")] {
        let mut req = publish(v, n);
        req.capability = mount_rwx();
        client.publish(req, Duration::from_secs(5)).await.unwrap();
    }
    let first = client
        .list_published_page(3, String::new(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(first.volumes.len(), 3);
    assert!(!first.next_token.is_empty());
    let all = client
        .list_published(3, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(all.len(), 7);
    let mut nodes = all["vol-1"].clone();
    nodes.sort();
    assert_eq!(nodes, ["a", "b"]);
    assert_eq!(all["vol-6"], ["c"]);
    assert!(all["vol-0"].is_empty());
}

/// A `tracing` writer that appends to a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn secrets_never_appear_in_logs_debug_output_or_errors() {
    const SECRET: &str = "Pa55w0rd-recognisable-9f3c1e";
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (_dir, path, mock) = serve(MockDriver::new("secret.csi.test").volumes(1)).await;
    let (_conn, client) = client_for(&path, &Registry::new()).await;
    let secrets = || {
        Some(Secrets::new(
            [("password".to_string(), SECRET.to_string())].into(),
        ))
    };

    let mut req = publish("vol-0", "n1");
    req.secrets = secrets();
    let printed_request = format!("{req:?} {req:#?}");
    client.publish(req, Duration::from_secs(5)).await.unwrap();

    // A failing call with the secret: the error text must not carry it.
    mock.set_fault(
        "ControllerUnpublishVolume",
        Fault::code(tonic::Code::PermissionDenied),
    );
    let err = client
        .unpublish(
            UnpublishRequest {
                volume_id: "vol-0".into(),
                node_id: "n1".into(),
                secrets: secrets(),
                migrated: false,
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();

    // The driver did get the secret: the test would prove nothing otherwise.
    let received = mock.calls();
    let publish_call = received
        .iter()
        .find(|c| c.method == "ControllerPublishVolume")
        .expect("the publish reached the mock");
    assert_eq!(
        publish_call.secrets.get("password").map(String::as_str),
        Some(SECRET)
    );

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("ControllerPublishVolume"),
        "trace logging was captured: {logs}"
    );
    for (what, text) in [
        ("logs", logs.as_str()),
        ("Debug of the request", printed_request.as_str()),
        ("error", &err.to_string()),
        ("error Debug", &format!("{err:?}")),
    ] {
        assert!(!text.contains(SECRET), "secret leaked into {what}: {text}");
    }
}

/// A Secret value that is not UTF-8 cannot be a protobuf string. The Go
/// sidecars fail such a call in grpc-go's marshalling, before it leaves the
/// process, and their metrics interceptor still counts it; so do we. The
/// value is never altered to make it fit.
#[tokio::test]
async fn a_secret_that_is_not_utf8_is_refused_as_grpc_go_refuses_it_and_counted() {
    let (_dir, path, mock) = serve(MockDriver::new("utf8.csi.test").volumes(1)).await;
    let registry = Registry::new();
    let (_conn, mut client) = client_for(&path, &registry).await;
    client.metrics_mut().set_driver("utf8.csi.test", false);
    let bad = || {
        Some(Secrets::new(std::collections::HashMap::from([
            ("user".to_string(), b"admin".to_vec()),
            ("password".to_string(), b"p\xff55".to_vec()),
        ])))
    };
    const TEXT: &str = "rpc error: code = Internal desc = grpc: error while marshaling: string field contains invalid UTF-8";

    let mut req = publish("vol-0", "n1");
    req.secrets = bad();
    let err = client
        .publish(req, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
    assert_eq!(err.to_string(), TEXT);
    let err = client
        .unpublish(
            UnpublishRequest {
                volume_id: "vol-0".into(),
                node_id: "n1".into(),
                secrets: bad(),
                migrated: false,
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), TEXT);
    assert!(
        mock.calls().is_empty(),
        "nothing reached the driver: {:?}",
        mock.calls()
    );
    let text = render(&registry);
    for method in [
        "/csi.v1.Controller/ControllerPublishVolume",
        "/csi.v1.Controller/ControllerUnpublishVolume",
    ] {
        assert_eq!(
            count(&text, "utf8.csi.test", method, "Internal"),
            1,
            "{text}"
        );
    }

    // Valid UTF-8, however odd, passes byte for byte.
    let odd = "\0\u{1}\u{7f}ü€😀\u{feff}\u{fffd}";
    let mut req = publish("vol-0", "n1");
    req.secrets = Some(Secrets::new(std::collections::HashMap::from([(
        "blob".to_string(),
        odd.to_string(),
    )])));
    client.publish(req, Duration::from_secs(5)).await.unwrap();
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].secrets["blob"], odd);
}
