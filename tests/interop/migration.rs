//! `docs/migration.md`, step by step, against the real Go external-attacher v4.13.0 and the real
//! API server, in two clusters of drivers, each driver with its sidecar electing in a namespace
//! of its own (one by `--leader-election-namespace`, one by its pod's namespace,
//! `POD_NAMESPACE`), volumes attached; then to one attacher-hub (in a third namespace, as an
//! installed hub would be) and back:
//!
//! * two drivers served by the Go mock CSI driver;
//! * the two real vendors: the GCE PD driver's own controller (`pd-controller`) with PD's
//!   sidecar flags (`--leader-election-namespace`, `--timeout=250s`, as PD's manifests run it)
//!   and the AWS EBS driver's own controller (`ebs-controller`) with the flags EBS's chart
//!   gives its sidecar (electing in its pod's namespace, `--timeout=60s`,
//!   `--worker-threads=100`, `--kube-api-qps=20`, `--kube-api-burst=100`,
//!   `--retry-interval-max=5m`), which drivers.yaml keeps per driver as the document asks.
//!
//! The steps use the commands the document names: `kubectl get lease -A` to find each driver's
//! Lease namespace (drivers.yaml is written from its output), `attacher-hub status -o json` to
//! see the hub stand by behind the sidecars, then lead. Sidecars stop as a removed container
//! does (SIGTERM, Lease kept, as v4.13 does); the way back removes one driver from
//! drivers.yaml (SIGHUP) and stops the hub for the other.
//!
//! A monitor samples, every ~100 ms, each driver's two attachers (the hub's `/drivers`, the
//! sidecar's `leader_election_master_status`, the hub read before and after the sidecar) and
//! every VolumeAttachment: no driver ever has two leaders, no volume is detached (no VA loses
//! `attached`, none is deleted, no controller answers a ControllerUnpublishVolume, counted on
//! each), and no driver goes without a leader for longer than a hand-over takes. With the
//! vendors' controllers, every volume is still attached in their fake clouds at the end.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use support::ebs::{EBS_DRIVER, EbsController, EbsOptions, ebs_attached};
use support::{
    Attacher, Cluster, MockCsi, MockCsiOptions, PdController, PdOptions, Probe, Program, PvBuilder,
    WAIT_TIMEOUT, create_node, create_va, eventually, go_duration, has_disk, is_attached,
    sanitize_driver_name, unique_driver_name, unique_name, wait_deleted, wait_for,
};

/// Short Lease timings: hand-overs take seconds.
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);

/// Longest a driver may go without a leader: a sidecar stopped without releasing its Lease is
/// replaced once the Lease expired (a lease duration after its last renewal, which was up to a
/// retry period before the stop), noticed within a jittered retry period (client-go: up to
/// 2.2 retry periods), plus a loaded machine's slack.
const HANDOVER: Duration = Duration::from_secs(4 + 3 + 5);

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

/// A driver's controller service: the Go mock, or a vendor's own controller on its fake cloud.
enum Controller {
    Mock(MockCsi),
    Pd(PdController),
    Ebs(EbsController),
}

impl Controller {
    /// The driver's name.
    fn name(&self) -> &str {
        match self {
            Controller::Mock(m) => &m.driver,
            Controller::Pd(p) => &p.driver,
            Controller::Ebs(_) => EBS_DRIVER,
        }
    }

    fn socket(&self) -> &Path {
        match self {
            Controller::Mock(m) => m.socket(),
            Controller::Pd(p) => p.socket(),
            Controller::Ebs(e) => e.socket(),
        }
    }

    /// The driver's ID of the Node `node` (its CSINode entry): an instance of the vendor's
    /// cloud, created with the controller.
    fn node_id(&self, node: &str) -> String {
        match self {
            Controller::Mock(m) => m.node_id().to_string(),
            Controller::Pd(_) => PdController::node_id(node),
            Controller::Ebs(_) => ebs_instance(node),
        }
    }

    /// ControllerUnpublishVolume calls the controller answered so far.
    async fn unpublishes(&self) -> usize {
        const UNPUBLISH: &str = "ControllerUnpublishVolume";
        match self {
            Controller::Mock(m) => m.calls(UNPUBLISH),
            Controller::Pd(p) => p
                .calls()
                .await
                .iter()
                .filter(|c| c.method == UNPUBLISH)
                .count(),
            Controller::Ebs(e) => e
                .calls()
                .await
                .iter()
                .filter(|c| c.method == UNPUBLISH)
                .count(),
        }
    }

    /// Whether the cloud has the volume of `handle` attached to `node`; `None` for the mock,
    /// which keeps no cloud to ask.
    async fn attached_in_cloud(&self, node: &str, handle: &str) -> Option<bool> {
        match self {
            Controller::Mock(_) => None,
            Controller::Pd(p) => {
                let disk = handle.rsplit('/').next().unwrap_or(handle);
                Some(has_disk(&p.attachments().await, node, disk, "READ_WRITE"))
            }
            Controller::Ebs(e) => Some(ebs_attached(
                &e.attachments().await,
                &ebs_instance(node),
                handle,
            )),
        }
    }
}

/// The EC2 instance of the Node `node` in EBS's fake cloud.
fn ebs_instance(node: &str) -> String {
    format!("i-{node}")
}

/// One driver of the migration: its controller, its sidecar's flags and way of choosing a
/// namespace, the same flags as drivers.yaml settings, its sidecar (when running) and its
/// volumes.
struct Driver {
    controller: Controller,
    /// `--leader-election-namespace` of the sidecar, or `None`: the sidecar's pod namespace.
    flag_namespace: Option<String>,
    /// The sidecar's pod namespace (`POD_NAMESPACE`).
    pod_namespace: String,
    /// The sidecar's flags besides the socket, the Lease namespace, leader election and `-v`.
    flags: Vec<String>,
    /// The same flags as settings of the driver's drivers.yaml entry (YAML lines indented by
    /// four spaces), as the document's step 2 keeps them.
    settings: String,
    sidecar: Option<Attacher>,
    /// Where the monitor finds the sidecar (0: none).
    sidecar_port: Arc<AtomicU16>,
    volumes: std::vec::IntoIter<String>,
}

impl Driver {
    fn name(&self) -> &str {
        self.controller.name()
    }

    /// The namespace the sidecar elects in.
    fn lease_namespace(&self) -> &str {
        self.flag_namespace
            .as_deref()
            .unwrap_or(&self.pod_namespace)
    }

    /// Starts the sidecar as the driver's controller Deployment runs it.
    fn start_sidecar(&mut self, cluster: &Cluster) {
        let mut args = vec![
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--csi-address={}", self.controller.socket().display()),
            "--v=4".into(),
        ];
        args.extend(self.flags.iter().cloned());
        if let Some(ns) = &self.flag_namespace {
            args.push(format!("--leader-election-namespace={ns}"));
        }
        // The pod's namespace, as the downward API gives it to the container.
        let mut go = Attacher::go_with_env(
            cluster,
            "sidecar",
            &election(&args),
            &[("POD_NAMESPACE", self.pod_namespace.as_str())],
        );
        go.assert_running();
        self.sidecar_port.store(go.port, Ordering::Relaxed);
        self.sidecar = Some(go);
    }

    /// Stops the sidecar as removing its container does: SIGTERM; v4.13 keeps its Lease.
    async fn stop_sidecar(&mut self) {
        let mut go = self.sidecar.take().expect("a running sidecar");
        self.sidecar_port.store(0, Ordering::Relaxed);
        go.process.stop().await;
    }
}

/// What the monitor saw.
#[derive(Debug, Default)]
struct Report {
    samples: usize,
    /// (driver, when) of samples where the hub and the sidecar both led.
    two_leaders: Vec<String>,
    /// Longest time per driver without a leader.
    longest_leaderless: BTreeMap<String, Duration>,
    /// VAs seen attached and later not attached, or deleted.
    detached: Vec<String>,
}

fn monitor(
    client: Client,
    hub_port: Arc<AtomicU16>,
    drivers: Vec<(String, Arc<AtomicU16>)>,
    watched: Arc<Mutex<Vec<String>>>,
) -> (CancellationToken, tokio::task::JoinHandle<Report>) {
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let vas: Api<VolumeAttachment> = Api::all(client);
        let mut report = Report::default();
        let mut leaderless_since: BTreeMap<String, Option<Instant>> = BTreeMap::new();
        let mut attached_once: BTreeMap<String, bool> = BTreeMap::new();
        while !token.is_cancelled() {
            let hub = Probe {
                program: Program::Hub,
                port: hub_port.load(Ordering::Relaxed),
            };
            for (driver, port) in &drivers {
                let go = Probe {
                    program: Program::Go,
                    port: port.load(Ordering::Relaxed),
                };
                let hub_leads = |p: Probe| {
                    let d = driver.clone();
                    async move { p.port != 0 && p.leads(&d).await == Some(true) }
                };
                let h1 = hub_leads(hub).await;
                let g = go.port != 0 && go.leads(driver).await == Some(true);
                let h2 = hub_leads(hub).await;
                if h1 && g && h2 {
                    report
                        .two_leaders
                        .push(format!("{driver} at sample {}", report.samples));
                }
                let led = h1 || g || h2;
                let since = leaderless_since.entry(driver.clone()).or_insert(None);
                match (led, *since) {
                    (true, Some(t)) => {
                        let gap = t.elapsed();
                        let longest = report.longest_leaderless.entry(driver.clone()).or_default();
                        *longest = (*longest).max(gap);
                        *since = None;
                    }
                    (false, None) => *since = Some(Instant::now()),
                    _ => {}
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
        for (driver, since) in leaderless_since {
            if let Some(t) = since {
                let longest = report.longest_leaderless.entry(driver).or_default();
                *longest = (*longest).max(t.elapsed());
            }
        }
        report
    });
    (stop, task)
}

/// `kubectl get lease -A` (as the document says), parsed: (namespace, name, holder).
fn kubectl_get_leases(cluster: &Cluster) -> Vec<(String, String, String)> {
    let out = std::process::Command::new(cluster.bin("kubectl"))
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(["get", "lease", "-A"])
        .output()
        .expect("run kubectl get lease -A");
    assert!(out.status.success(), "kubectl get lease -A failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells.len() >= 3).then(|| (cells[0].into(), cells[1].into(), cells[2].into()))
        })
        .collect()
}

/// The row of `kubectl get lease -A` of `driver`'s Lease (exactly one must exist).
fn lease_row(cluster: &Cluster, driver: &str) -> (String, String) {
    let lease = format!("external-attacher-leader-{}", sanitize_driver_name(driver));
    let rows: Vec<_> = kubectl_get_leases(cluster)
        .into_iter()
        .filter(|(_, n, _)| *n == lease)
        .collect();
    assert_eq!(
        rows.len(),
        1,
        "one Lease of {driver} in all namespaces: {rows:?}"
    );
    let (ns, _, holder) = rows.into_iter().next().expect("one row");
    (ns, holder)
}

/// `attacher-hub status --address ... -o json`: each driver's state and Lease holder (`None`
/// while the hub does not answer).
async fn hub_status(hub: &Attacher) -> Option<BTreeMap<String, (String, String)>> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .args(["status", "-o", "json", "--address"])
        .arg(format!("http://127.0.0.1:{}", hub.port))
        .output()
        .await
        .expect("run attacher-hub status");
    if !out.status.success() {
        return None;
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let map = doc
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|d| {
            Some((
                d["name"].as_str()?.to_string(),
                (
                    d["state"]["state"].as_str().unwrap_or_default().to_string(),
                    d["leaseHolder"].as_str().unwrap_or_default().to_string(),
                ),
            ))
        })
        .collect();
    Some(map)
}

async fn create_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
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

/// One driver's entry of drivers.yaml: its name, socket, the Lease namespace `kubectl get
/// lease -A` showed, and its sidecar's other flags as settings.
struct Entry {
    name: String,
    socket: PathBuf,
    namespace: String,
    settings: String,
}

/// drivers.yaml for `entries`, each driver's Lease where its sidecar keeps it.
fn write_drivers_yaml(path: &Path, entries: &[Entry]) {
    let mut text = String::from("drivers:\n");
    for e in entries {
        text.push_str(&format!(
            "  - address: unix://{}\n    name: {}\n{}    leaderElection:\n      namespace: {}\n",
            e.socket.display(),
            e.name,
            e.settings,
            e.namespace
        ));
    }
    std::fs::write(path, text).expect("write drivers.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_to_one_hub_and_back_as_documented() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let node = unique_name("node");
    create_node(&client, &node).await;

    // Two drivers, each with a sidecar electing in a namespace of its own.
    let by_flag = unique_name("sidecar-flag");
    let by_pod = unique_name("sidecar-pod");
    let hub_ns = unique_name("hub");
    for ns in [&by_flag, &by_pod, &hub_ns] {
        create_namespace(&client, ns).await;
    }
    let mut drivers = Vec::new();
    for (i, flag) in [Some(by_flag.clone()), None].into_iter().enumerate() {
        let name = unique_driver_name(&format!("mig{i}"));
        let mock = MockCsi::start(
            cluster,
            &name,
            MockCsiOptions {
                volumes: 6,
                ..MockCsiOptions::default()
            },
        )
        .await;
        let volumes = mock.volumes.clone().into_iter();
        drivers.push(Driver {
            controller: Controller::Mock(mock),
            flag_namespace: flag,
            pod_namespace: by_pod.clone(),
            flags: vec!["--timeout=15s".into()],
            settings: "    timeout: 15s\n".into(),
            sidecar: None,
            sidecar_port: Arc::new(AtomicU16::new(0)),
            volumes,
        });
    }
    migrate(cluster, &client, &node, drivers, &hub_ns).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&by_flag, &by_pod, &hub_ns] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
}

/// The same on a cluster with the two real vendors: the GCE PD driver's own controller, its
/// sidecar electing in PD's namespace by `--leader-election-namespace` with the flags of PD's
/// manifests, and the AWS EBS driver's own controller, its sidecar with the flags of EBS's
/// chart electing in its pod's namespace (`kube-system` in a real install). Each has attached
/// volumes; the hub takes both over and gives them back, as for the mocks. The EBS driver's
/// name is fixed, so this test takes its turn with the other tests that serve it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pd_and_ebs_migrate_to_one_hub_and_back_as_documented() {
    let _ebs = support::ebs::turn().await;
    let cluster = Cluster::get();
    let client = cluster.client().await;
    // EBS's Lease has one name in every run: those an earlier run or test left (namespaces
    // stay, no namespace controller runs here) would be a second row of `kubectl get lease -A`.
    delete_ebs_leases(&client).await;
    let node = unique_name("node");
    create_node(&client, &node).await;

    let pd_ns = unique_name("gce-pd-csi-driver");
    let ebs_ns = unique_name("kube-system");
    let hub_ns = unique_name("attacher-hub");
    for ns in [&pd_ns, &ebs_ns, &hub_ns] {
        create_namespace(&client, ns).await;
    }
    const VOLUMES: usize = 6;
    let disks: Vec<String> = (0..VOLUMES).map(|i| format!("disk-{i}")).collect();
    let pd = PdController::start(
        cluster,
        &unique_driver_name("pd"),
        PdOptions {
            instances: vec![node.clone()],
            disks: disks.clone(),
            ..PdOptions::default()
        },
    )
    .await;
    let ebs_volumes: Vec<String> = (0..VOLUMES).map(|i| format!("vol-{i:017x}")).collect();
    let ebs = EbsController::start(
        cluster,
        EbsOptions {
            instances: vec![ebs_instance(&node)],
            volumes: ebs_volumes.clone(),
            ..EbsOptions::default()
        },
    )
    .await;
    let drivers = vec![
        Driver {
            controller: Controller::Pd(pd),
            flag_namespace: Some(pd_ns.clone()),
            pod_namespace: pd_ns.clone(),
            // PD v1.28.1's csi-attacher (deploy/kubernetes/base/controller/controller.yaml).
            flags: vec!["--timeout=250s".into()],
            settings: "    timeout: 250s\n".into(),
            sidecar: None,
            sidecar_port: Arc::new(AtomicU16::new(0)),
            volumes: disks
                .iter()
                .map(|d| PdController::volume_id(d))
                .collect::<Vec<_>>()
                .into_iter(),
        },
        Driver {
            controller: Controller::Ebs(ebs),
            flag_namespace: None,
            pod_namespace: ebs_ns.clone(),
            // EBS v1.44.0's chart, its csi-attacher with the chart's defaults.
            flags: [
                "--timeout=60s",
                "--kube-api-qps=20",
                "--kube-api-burst=100",
                "--worker-threads=100",
                "--retry-interval-max=5m",
            ]
            .map(String::from)
            .to_vec(),
            settings: "    timeout: 60s\n    kubeApiQps: 20\n    kubeApiBurst: 100\n    \
                       workerThreads: 100\n    retryIntervalMax: 5m\n"
                .into(),
            sidecar: None,
            sidecar_port: Arc::new(AtomicU16::new(0)),
            volumes: ebs_volumes.into_iter(),
        },
    ];
    migrate(cluster, &client, &node, drivers, &hub_ns).await;
    delete_ebs_leases(&client).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&pd_ns, &ebs_ns, &hub_ns] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
}

/// Deletes every Lease of the EBS driver, in any namespace.
async fn delete_ebs_leases(client: &Client) {
    let name = format!(
        "external-attacher-leader-{}",
        sanitize_driver_name(EBS_DRIVER)
    );
    let all: Api<Lease> = Api::all(client.clone());
    let leases = all
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .expect("list EBS's Leases");
    for lease in leases.items {
        let ns = lease.metadata.namespace.unwrap_or_default();
        let _ = Api::<Lease>::namespaced(client.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await;
    }
}

/// docs/migration.md with `drivers` on `node`: the sidecars attach, the hub (electing in
/// `hub_ns` by its pod) stands by, takes each driver over as its sidecar goes, and gives
/// them back; checked as the module says.
async fn migrate(
    cluster: &'static Cluster,
    client: &Client,
    node: &str,
    mut drivers: Vec<Driver>,
    hub_ns: &str,
) {
    // One CSINode with both drivers, as their node plugins register them.
    let csinodes: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(client.clone());
    csinodes
        .create(
            &PostParams::default(),
            &k8s_openapi::api::storage::v1::CSINode {
                status: None,
                metadata: ObjectMeta {
                    name: Some(node.to_string()),
                    ..ObjectMeta::default()
                },
                spec: k8s_openapi::api::storage::v1::CSINodeSpec {
                    drivers: drivers
                        .iter()
                        .map(|d| k8s_openapi::api::storage::v1::CSINodeDriver {
                            name: d.name().into(),
                            node_id: d.controller.node_id(node),
                            ..Default::default()
                        })
                        .collect(),
                },
            },
        )
        .await
        .expect("create the CSINode");

    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let watched: Arc<Mutex<Vec<String>>> = Arc::default();
    // The VAs made, each with its driver and volume handle.
    let made: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let attach_new = async |d: &mut Driver, who: &str| {
        let (pv, va) = (unique_name("pv"), unique_name("va"));
        let handle = d.volumes.next().expect("a free volume");
        PvBuilder::new(&pv, d.name(), &handle).create(client).await;
        create_va(client, &va, d.name(), node, &pv).await;
        wait_for(&vas, &va, "attached", is_attached(), WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{va} of {} attached by {who}: {e}", d.name()));
        made.lock().push((d.name().to_string(), handle, va.clone()));
        watched.lock().push(va);
    };

    // The sidecars run and attach.
    for d in &mut drivers {
        d.start_sidecar(cluster);
    }
    for d in &mut drivers {
        let go = d.sidecar.as_ref().expect("sidecar");
        let name = d.name().to_string();
        eventually(
            &format!("the sidecar of {name} leads"),
            WAIT_TIMEOUT,
            || async { (go.leads(&name).await == Some(true)).then_some(()) },
        )
        .await;
    }
    for d in &mut drivers {
        for _ in 0..2 {
            attach_new(d, "its sidecar").await;
        }
    }

    let hub_port = Arc::new(AtomicU16::new(0));
    let (stop, report) = monitor(
        client.clone(),
        hub_port.clone(),
        drivers
            .iter()
            .map(|d| (d.name().to_string(), d.sidecar_port.clone()))
            .collect(),
        watched.clone(),
    );

    // --- To the hub ---------------------------------------------------------
    // 1. Before: where is each Lease? (kubectl get lease -A)
    let mut entries = Vec::new();
    for d in &drivers {
        let (ns, holder) = lease_row(cluster, d.name());
        assert_eq!(ns, d.lease_namespace(), "{}", d.name());
        assert_eq!(holder, d.sidecar.as_ref().expect("sidecar").identity);
        entries.push(Entry {
            name: d.name().to_string(),
            socket: d.controller.socket().to_path_buf(),
            namespace: ns,
            settings: d.settings.clone(),
        });
    }
    // 2. drivers.yaml with each driver's Lease where its sidecar keeps it.
    let dir = tempfile::Builder::new()
        .prefix("ah-migration-")
        .tempdir()
        .expect("temporary directory");
    let drivers_yaml = dir.path().join("drivers.yaml");
    write_drivers_yaml(&drivers_yaml, &entries);
    // 3. Start the hub (its own namespace is another one); it stands by.
    let mut hub = Attacher::hub_with_env(
        "hub",
        &election(&[
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--config={}", drivers_yaml.display()),
            "-v=2".into(),
        ]),
        &[("POD_NAMESPACE", hub_ns)],
    );
    hub_port.store(hub.port, Ordering::Relaxed);
    let standby = eventually(
        "attacher-hub status: every driver standby",
        WAIT_TIMEOUT,
        || async {
            let s = hub_status(&hub).await?;
            drivers
                .iter()
                .all(|d| {
                    s.get(d.name()).is_some_and(|(state, holder)| {
                        state == "standby"
                            && *holder == d.sidecar.as_ref().expect("sidecar").identity
                    })
                })
                .then_some(s)
        },
    )
    .await;
    eprintln!("migration: the hub stands by behind the sidecars: {standby:?}");
    // Standing by, it stays so: a few more seconds, still standby, still the sidecars' Leases.
    tokio::time::sleep(LEASE).await;
    for d in &drivers {
        let (ns, holder) = lease_row(cluster, d.name());
        assert_eq!(
            (ns.as_str(), holder.as_str()),
            (
                d.lease_namespace(),
                d.sidecar.as_ref().expect("sidecar").identity.as_str()
            )
        );
    }
    // 4. Take the attacher out of each driver's controller, one driver at a time; 5. after.
    for d in &mut drivers {
        let stopped = Instant::now();
        d.stop_sidecar().await;
        let name = d.name().to_string();
        eventually(&format!("the hub leads {name}"), HANDOVER * 2, || async {
            (hub.leads(&name).await == Some(true)).then_some(())
        })
        .await;
        eprintln!(
            "migration: the hub led {name} {:.1}s after its sidecar stopped",
            stopped.elapsed().as_secs_f64()
        );
        let (ns, holder) = lease_row(cluster, &name);
        assert_eq!(
            (ns.as_str(), holder.as_str()),
            (d.lease_namespace(), hub.identity.as_str())
        );
        let s = hub_status(&hub).await.expect("attacher-hub status");
        assert_eq!(
            s[&name].0, "leading",
            "attacher-hub status after step 4: {s:?}"
        );
        attach_new(d, "the hub").await;
    }
    hub.assert_running();

    // --- And back -------------------------------------------------------------
    // 1. Put the sidecars back: they stand by.
    for d in &mut drivers {
        d.start_sidecar(cluster);
    }
    tokio::time::sleep(LEASE).await;
    for d in &drivers {
        let (_, holder) = lease_row(cluster, d.name());
        assert_eq!(
            holder,
            hub.identity,
            "{}: the hub keeps its Lease while the sidecar stands by",
            d.name()
        );
    }
    // 2. The hub stops serving the first driver (drivers.yaml without it, SIGHUP) ...
    write_drivers_yaml(&drivers_yaml, &entries[1..]);
    hub.signal("-HUP");
    let first = drivers[0].name().to_string();
    let go = drivers[0].sidecar.as_ref().expect("sidecar");
    eventually(
        &format!("the sidecar leads {first} again"),
        HANDOVER * 2,
        || async { (go.leads(&first).await == Some(true)).then_some(()) },
    )
    .await;
    eventually(
        "attacher-hub status no longer lists it",
        WAIT_TIMEOUT,
        || async { (!hub_status(&hub).await?.contains_key(&first)).then_some(()) },
    )
    .await;
    // ... and is stopped for the second (SIGTERM: it vacates its Leases).
    hub_port.store(0, Ordering::Relaxed);
    hub.process.stop().await;
    let second = drivers[1].name().to_string();
    let go = drivers[1].sidecar.as_ref().expect("sidecar");
    eventually(
        &format!("the sidecar leads {second} again"),
        HANDOVER * 2,
        || async { (go.leads(&second).await == Some(true)).then_some(()) },
    )
    .await;
    // 3. Check: the sidecars hold the Leases, in their namespaces, and attach.
    for d in &mut drivers {
        let (ns, holder) = lease_row(cluster, d.name());
        assert_eq!(
            (ns.as_str(), holder.as_str()),
            (
                d.lease_namespace(),
                d.sidecar.as_ref().expect("sidecar").identity.as_str()
            )
        );
        attach_new(d, "its sidecar again").await;
    }

    stop.cancel();
    let report = report.await.expect("the monitor");
    eprintln!(
        "migration: {} samples; longest time without a leader per driver: {:?}",
        report.samples, report.longest_leaderless
    );
    assert!(
        report.two_leaders.is_empty(),
        "two leaders: {:?}",
        report.two_leaders
    );
    assert!(
        report.detached.is_empty(),
        "volumes detached: {:?}",
        report.detached
    );
    for (driver, gap) in &report.longest_leaderless {
        assert!(
            *gap <= HANDOVER,
            "{driver} went {gap:?} without a leader (a hand-over takes at most {HANDOVER:?})"
        );
    }
    let mut unpublishes = BTreeMap::new();
    for d in &drivers {
        unpublishes.insert(d.name().to_string(), d.controller.unpublishes().await);
    }
    eprintln!("migration: ControllerUnpublishVolume answered per driver: {unpublishes:?}");
    for (driver, n) in &unpublishes {
        assert_eq!(*n, 0, "{driver}: nothing was unpublished");
    }
    let all = watched.lock().clone();
    for va in &all {
        let v = vas.get(va).await.expect("the VA");
        assert!(
            v.status.is_some_and(|s| s.attached),
            "{va} is attached at the end"
        );
    }
    let made = made.lock().clone();
    for (driver, handle, va) in &made {
        let d = drivers
            .iter()
            .find(|d| d.name() == driver)
            .expect("the VA's driver");
        assert_ne!(
            d.controller.attached_in_cloud(node, handle).await,
            Some(false),
            "{va}: {handle} of {driver} is still attached to {node} in its cloud"
        );
    }
    eprintln!("migration: {} VAs attached throughout", made.len());

    // Clean up: the sidecars detach everything.
    for va in &all {
        let _ = vas.delete(va, &DeleteParams::default()).await;
    }
    for va in &all {
        let _ = wait_deleted(&vas, va, WAIT_TIMEOUT).await;
    }
    for d in &mut drivers {
        d.stop_sidecar().await;
    }
}
