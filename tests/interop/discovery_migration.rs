//! `docs/migration.md` for topology (b), a controller node pool in discovery mode, against the
//! real Go external-attacher v4.13.0, the real API server and the Go mock CSI driver.
//!
//! The driver's sidecar elects in the vendor's namespace (`--leader-election-namespace`); the
//! hub runs in a namespace of its own, finds the driver's exported socket with
//! `--driver-sockets`, and reads `--config drivers.yaml` for what it cannot find on a socket:
//! an entry with the driver's `name` and no `address` gives the discovered driver its Lease
//! namespace, the sidecar's. The hub stands by behind the sidecar on that one Lease, takes it
//! over when the sidecar stops, and hands it back when the socket is no longer exported. A
//! monitor samples both attachers every ~100 ms: never two leaders, no volume detached, and
//! never a second Lease of the driver in another namespace.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use support::{
    Attacher, Cluster, MockCsi, MockCsiOptions, NodeDriver, Probe, Program, PvBuilder,
    WAIT_TIMEOUT, create_csinode_with, create_node, create_va, eventually, go_duration,
    is_attached, sanitize_driver_name, unique_driver_name, unique_name, wait_for,
};

/// Short Lease timings: hand-overs take seconds.
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);

/// Longest a hand-over may take: the stopped sidecar's Lease expires (a lease duration after
/// its last renewal, up to a retry period before the stop), noticed within a jittered retry
/// period, plus a discovery scan (2 s) and a loaded machine's slack.
const HANDOVER: Duration = Duration::from_secs(4 + 3 + 2 + 5);

fn election(extra: &[String]) -> Vec<String> {
    let mut args = vec![
        "--leader-election".to_string(),
        format!("--leader-election-lease-duration={}", go_duration(LEASE)),
        format!("--leader-election-renew-deadline={}", go_duration(RENEW)),
        format!("--leader-election-retry-period={}", go_duration(RETRY)),
    ];
    args.extend_from_slice(extra);
    args
}

/// (namespace, holder) of every Lease of `driver`.
async fn leases_of(client: &Client, driver: &str) -> Vec<(String, String)> {
    let name = format!("external-attacher-leader-{}", sanitize_driver_name(driver));
    Api::<Lease>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list Leases")
        .items
        .into_iter()
        .filter(|l| l.metadata.name.as_deref() == Some(name.as_str()))
        .map(|l| {
            (
                l.metadata.namespace.unwrap_or_default(),
                l.spec.and_then(|s| s.holder_identity).unwrap_or_default(),
            )
        })
        .collect()
}

async fn create_namespace(client: &Client, name: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// What the monitor saw.
#[derive(Debug, Default)]
struct Report {
    samples: usize,
    two_leaders: Vec<usize>,
    other_namespaces: Vec<String>,
    detached: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_hub_takes_over_the_sidecars_lease_in_the_vendor_namespace_and_back() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let vendor = unique_name("vendor");
    let hub_ns = unique_name("hub");
    for ns in [&vendor, &hub_ns] {
        create_namespace(&client, ns).await;
    }
    let driver = unique_driver_name("disc-mig");
    let mock = MockCsi::start(
        cluster,
        &driver,
        MockCsiOptions {
            volumes: 6,
            ..MockCsiOptions::default()
        },
    )
    .await;
    let node = unique_name("node");
    create_node(&client, &node).await;
    create_csinode_with(&client, &node, &[NodeDriver::new(&driver, mock.node_id())]).await;
    let mut volumes = mock.volumes.clone().into_iter();
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let watched: Arc<Mutex<Vec<String>>> = Arc::default();
    let attach_new = async |volumes: &mut std::vec::IntoIter<String>, who: &str| {
        let (pv, va) = (unique_name("pv"), unique_name("va"));
        let handle = volumes.next().expect("a free volume");
        PvBuilder::new(&pv, &driver, &handle).create(&client).await;
        create_va(&client, &va, &driver, &node, &pv).await;
        wait_for(&vas, &va, "attached", is_attached(), WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{va} attached by {who}: {e}"));
        watched.lock().push(va);
    };
    let start_sidecar = || {
        let mut go = Attacher::go_with_env(
            cluster,
            "sidecar",
            &election(&[
                format!("--kubeconfig={}", cluster.kubeconfig.display()),
                format!("--csi-address={}", mock.socket().display()),
                format!("--leader-election-namespace={vendor}"),
                "--timeout=15s".into(),
            ]),
            &[("POD_NAMESPACE", vendor.as_str())],
        );
        go.assert_running();
        go
    };

    // The sidecar leads in the vendor's namespace and attaches.
    let mut sidecar = start_sidecar();
    eventually("the sidecar leads", WAIT_TIMEOUT, || async {
        (sidecar.leads(&driver).await == Some(true)).then_some(())
    })
    .await;
    attach_new(&mut volumes, "the sidecar").await;

    let sidecar_port = Arc::new(AtomicU16::new(sidecar.port));
    let hub_port = Arc::new(AtomicU16::new(0));
    let stop = CancellationToken::new();
    let monitor = {
        let (client, driver, vendor, watched) = (
            client.clone(),
            driver.clone(),
            vendor.clone(),
            watched.clone(),
        );
        let (sidecar_port, hub_port, stop) = (sidecar_port.clone(), hub_port.clone(), stop.clone());
        tokio::spawn(async move {
            let vas: Api<VolumeAttachment> = Api::all(client.clone());
            let mut report = Report::default();
            let mut attached_once = std::collections::BTreeMap::<String, bool>::new();
            while !stop.is_cancelled() {
                let leads = |program, port: u16| {
                    let d = driver.clone();
                    async move { port != 0 && Probe { program, port }.leads(&d).await == Some(true) }
                };
                let h1 = leads(Program::Hub, hub_port.load(Ordering::Relaxed)).await;
                let g = leads(Program::Go, sidecar_port.load(Ordering::Relaxed)).await;
                let h2 = leads(Program::Hub, hub_port.load(Ordering::Relaxed)).await;
                if h1 && g && h2 {
                    report.two_leaders.push(report.samples);
                }
                for (ns, holder) in leases_of(&client, &driver).await {
                    if ns != vendor {
                        report.other_namespaces.push(format!("{ns} ({holder})"));
                    }
                }
                let names = watched.lock().clone();
                for name in names {
                    match vas.get_opt(&name).await {
                        Ok(Some(va)) => {
                            let attached = va.status.as_ref().is_some_and(|s| s.attached);
                            let was = attached_once.entry(name.clone()).or_insert(false);
                            if *was && !attached {
                                report.detached.push(format!("{name} lost attached"));
                            }
                            *was |= attached;
                        }
                        Ok(None) => report.detached.push(format!("{name} deleted")),
                        Err(_) => {}
                    }
                }
                report.samples += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            report
        })
    };

    // --- To the hub ----------------------------------------------------------------------
    // 1. Before: where is the Lease?
    assert_eq!(
        leases_of(&client, &driver).await,
        [(vendor.clone(), sidecar.identity.clone())]
    );
    // 2. drivers.yaml: the discovered driver's Lease where its sidecar keeps it.
    let dir = tempfile::Builder::new()
        .prefix("ah-disc-migration-")
        .tempdir()
        .expect("temporary directory");
    let drivers_yaml = dir.path().join("drivers.yaml");
    std::fs::write(
        &drivers_yaml,
        format!("drivers:\n  - name: {driver}\n    leaderElection:\n      namespace: {vendor}\n"),
    )
    .expect("write drivers.yaml");
    // The controller's socket exported into the pool's directory (export-controller-socket):
    // here a link to the mock's socket directory.
    let exports = dir.path().join("controllers");
    std::fs::create_dir(&exports).expect("the export directory");
    // (A short name: a socket's path must fit in 108 bytes.)
    let export = exports.join("pd");
    std::os::unix::fs::symlink(
        mock.socket().parent().expect("the socket's directory"),
        &export,
    )
    .expect("export the socket");
    // 3. Start the hub in discovery mode; it stands by behind the sidecar.
    let mut hub = Attacher::hub_with_env(
        "pool",
        &election(&[
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--config={}", drivers_yaml.display()),
            format!("--driver-sockets={}/*/csi.sock", exports.display()),
            "-v=2".into(),
        ]),
        &[("POD_NAMESPACE", hub_ns.as_str())],
    );
    hub_port.store(hub.port, Ordering::Relaxed);
    let standby = eventually(
        "the hub stands by behind the sidecar",
        WAIT_TIMEOUT,
        || async {
            let d = hub.driver(&driver).await?;
            (d["state"]["state"] == "standby" && d["leaseHolder"] == sidecar.identity.as_str())
                .then_some(d)
        },
    )
    .await;
    eprintln!("discovery migration: the hub stands by: {standby}");
    assert_eq!(standby["leaseNamespace"], vendor.as_str());
    assert_eq!(standby["discovered"], true);
    tokio::time::sleep(LEASE).await;
    assert_eq!(
        leases_of(&client, &driver).await,
        [(vendor.clone(), sidecar.identity.clone())],
        "one Lease, still the sidecar's"
    );

    // 4. Take the attacher out of the driver's controller: the hub takes the same Lease over.
    let stopped = Instant::now();
    sidecar_port.store(0, Ordering::Relaxed);
    sidecar.process.stop().await;
    eventually("the hub leads", HANDOVER * 2, || async {
        (hub.leads(&driver).await == Some(true)).then_some(())
    })
    .await;
    eprintln!(
        "discovery migration: the hub led {:.1}s after the sidecar stopped",
        stopped.elapsed().as_secs_f64()
    );
    // 5. After: the Lease is in the vendor's namespace, held by the hub.
    assert_eq!(
        leases_of(&client, &driver).await,
        [(vendor.clone(), hub.identity.clone())]
    );
    attach_new(&mut volumes, "the hub").await;

    // --- And back ------------------------------------------------------------------------
    // 1. Put the sidecar back: it stands by.
    sidecar = start_sidecar();
    sidecar_port.store(sidecar.port, Ordering::Relaxed);
    tokio::time::sleep(LEASE).await;
    assert_eq!(
        leases_of(&client, &driver).await,
        [(vendor.clone(), hub.identity.clone())],
        "the hub keeps its Lease while the sidecar stands by"
    );
    // 2. The socket is no longer exported: the hub stops serving the driver and vacates its
    //    Lease; the sidecar takes it over.
    std::fs::remove_file(&export).expect("remove the export");
    eventually("the sidecar leads again", HANDOVER * 2, || async {
        (sidecar.leads(&driver).await == Some(true)).then_some(())
    })
    .await;
    eventually(
        "the hub no longer lists the driver",
        WAIT_TIMEOUT,
        || async { hub.driver(&driver).await.is_none().then_some(()) },
    )
    .await;
    // 3. Check.
    assert_eq!(
        leases_of(&client, &driver).await,
        [(vendor.clone(), sidecar.identity.clone())]
    );
    attach_new(&mut volumes, "the sidecar again").await;
    hub.assert_running();

    stop.cancel();
    let report = monitor.await.expect("the monitor");
    eprintln!("discovery migration: {} samples", report.samples);
    assert!(
        report.two_leaders.is_empty(),
        "two leaders at samples {:?}",
        report.two_leaders
    );
    assert!(
        report.other_namespaces.is_empty(),
        "a Lease of the driver outside the vendor's namespace: {:?}",
        report.other_namespaces
    );
    assert!(report.detached.is_empty(), "{:?}", report.detached);
    assert_eq!(mock.calls("ControllerUnpublishVolume"), 0);

    let all = watched.lock().clone();
    for va in all {
        let _ = vas.delete(&va, &DeleteParams::default()).await;
    }
    hub.process.stop().await;
    sidecar.process.stop().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&vendor, &hub_ns] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
}
