//! `make bench`'s end-to-end configuration: Pods through
//! kube-controller-manager to two real vendors' controllers, the GCE PD
//! driver's and the AWS EBS driver's own controller services on their fake
//! clouds, with a cloud-like publish latency (1 s ± 20 % by default), served
//! by one attacher-hub (hub mode) or by the Go fleet (one external-attacher
//! v4.13.0 per driver: two sidecars), with the same flags: those of the PD
//! driver's own Deployment for its attacher (`--v=5 --timeout=250s
//! --leader-election`, QPS 5 / burst 10 by default).
//!
//! What a user waits for is measured: from creating a Pod to its volume in
//! its Node's `status.volumesAttached` (the kubelet's signal), and from
//! deleting the Pod to its VolumeAttachment gone (the attacher unpublished
//! and let go). All Pods are created at once, then deleted at once; the
//! contenders run one after the other, alternating first place per repeat,
//! each on fresh drivers, Nodes and volumes; the report gives the median of
//! the runs' p50 and p99.
//!
//! Sizes: `BENCH_E2E_PODS` (60), `BENCH_E2E_PD_DRIVERS` (1: PD controllers,
//! each its own driver name), `BENCH_E2E_EBS` (1: with the EBS controller; 0
//! without, whose driver name is fixed so there is at most one),
//! `BENCH_E2E_NODES` (4), `BENCH_E2E_LATENCY_MS` (1000), `BENCH_E2E_REPEATS` (5: one run's
//! p99 moves by about 0.3 s with kube-controller-manager's pace, and the
//! median of three could not tell two contenders 1 % apart),
//! `BENCH_E2E_TIMEOUT_SECS` (300).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::peers::{Attacher, start_attachers};
use crate::support::ebs::{EBS_DRIVER, EBS_TOPOLOGY_KEYS, EBS_ZONE, EbsController, EbsOptions};
use crate::support::{
    Cluster, NAMESPACE, NodeDriver, PD_TOPOLOGY_KEY, PD_ZONE, PdController, PdOptions, PodVolume,
    Source, StaticVolume, controller_manager, create_csinode_with, create_managed_node, create_pod,
    delete_objects, sanitize_driver_name,
};

/// Requests in flight while creating or deleting objects in bulk.
const CONCURRENCY: usize = 16;

/// The label on the run's Nodes (their watch selects it).
const RUN_LABEL: &str = "attacher-hub-bench/e2e-run";

/// The flags of the attacher in the PD driver's own Deployment
/// (`deploy/kubernetes/base/controller/controller.yaml` of the pinned
/// module), leader election in `default`.
/// The Deployment sets no QPS or burst: external-attacher's defaults (5 / 10,
/// csi-lib-utils `standardflags`) are given explicitly because the test
/// helpers' own defaults are higher.
const FLAGS: &[&str] = &[
    "--v=5",
    "--timeout=250s",
    "--leader-election",
    "--leader-election-namespace=default",
    "--kube-api-qps=5",
    "--kube-api-burst=10",
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// Sizes, from `BENCH_E2E_*`.
#[derive(Clone, Debug)]
pub(crate) struct Knobs {
    pods: usize,
    pd_drivers: usize,
    ebs: bool,
    nodes: usize,
    latency: Duration,
    repeats: usize,
    timeout: Duration,
}

impl Knobs {
    pub(crate) fn from_env() -> Knobs {
        let k = Knobs {
            pods: env_or("BENCH_E2E_PODS", 60usize).max(1),
            pd_drivers: env_or("BENCH_E2E_PD_DRIVERS", 1usize),
            ebs: env_or("BENCH_E2E_EBS", 1u8) != 0,
            nodes: env_or("BENCH_E2E_NODES", 4usize).max(1),
            latency: Duration::from_millis(env_or("BENCH_E2E_LATENCY_MS", 1000)),
            repeats: env_or("BENCH_E2E_REPEATS", 5usize).max(1),
            timeout: Duration::from_secs(env_or("BENCH_E2E_TIMEOUT_SECS", 300)),
        };
        assert!(
            k.drivers() > 0,
            "BENCH_E2E_PD_DRIVERS=0 and BENCH_E2E_EBS=0 leave no driver"
        );
        k
    }

    fn drivers(&self) -> usize {
        self.pd_drivers + usize::from(self.ebs)
    }
}

/// One vendor's controller on its fake cloud, as the run uses it.
enum Vendor {
    Pd(PdController),
    Ebs(EbsController),
}

impl Vendor {
    fn driver(&self) -> &str {
        match self {
            Vendor::Pd(pd) => &pd.driver,
            Vendor::Ebs(_) => EBS_DRIVER,
        }
    }

    fn socket(&self) -> &std::path::Path {
        match self {
            Vendor::Pd(pd) => pd.socket(),
            Vendor::Ebs(ebs) => ebs.socket(),
        }
    }

    /// The driver's node ID of Node `node`: PD's instance path, EBS's instance ID.
    fn node_id(&self, node: &str) -> String {
        match self {
            Vendor::Pd(_) => PdController::node_id(node),
            Vendor::Ebs(_) => ebs_instance(node),
        }
    }

    /// The CSINode entry of Node `node` for the driver, with its zone topology keys.
    fn node_driver(&self, node: &str) -> NodeDriver {
        let entry = NodeDriver::new(self.driver(), &self.node_id(node));
        match self {
            Vendor::Pd(_) => entry.topology_key(PD_TOPOLOGY_KEY),
            Vendor::Ebs(_) => EBS_TOPOLOGY_KEYS
                .iter()
                .fold(entry, |e, key| e.topology_key(key)),
        }
    }

    /// The CSI volume ID of disk `disk`.
    fn volume_id(&self, disk: &str) -> String {
        match self {
            Vendor::Pd(_) => PdController::volume_id(disk),
            Vendor::Ebs(_) => ebs_volume(disk),
        }
    }

    /// (method, gRPC code) of every Controller(Un)PublishVolume call answered.
    async fn calls(&self) -> Vec<(String, String)> {
        match self {
            Vendor::Pd(pd) => pd
                .calls()
                .await
                .into_iter()
                .map(|c| (c.method, c.code))
                .collect(),
            Vendor::Ebs(ebs) => ebs
                .calls()
                .await
                .into_iter()
                .map(|c| (c.method, c.code))
                .collect(),
        }
    }
}

/// The EBS volume ID of disk `disk`.
fn ebs_volume(disk: &str) -> String {
    format!("vol-{disk}")
}

/// The EC2 instance ID of Node `node`.
fn ebs_instance(node: &str) -> String {
    format!("i-{node}")
}

/// One run's measurements.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    /// Pod created → volume in `node.status.volumesAttached`, seconds, per Pod.
    attach: Vec<f64>,
    /// Pod deleted → its VolumeAttachment gone, seconds, per Pod.
    detach: Vec<f64>,
    /// The attacher's share of `attach`: VA created → `status.attached`.
    va_attach: Vec<f64>,
    /// The attacher's share of `detach`: VA deleted (deletion timestamp) → gone.
    va_detach: Vec<f64>,
    /// ControllerPublishVolume calls answered OK, all drivers.
    publishes: usize,
    /// ControllerUnpublishVolume calls answered OK, all drivers.
    unpublishes: usize,
    /// Calls answered with an error.
    refused: usize,
    /// Wall time of the attach phase and of the detach phase, seconds.
    attach_wall: f64,
    detach_wall: f64,
}

/// Quantile `q` of `v` (nearest rank), seconds.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Runs the configuration and returns the Markdown report.
pub(crate) async fn run(cluster: &'static Cluster, k: &Knobs) -> String {
    controller_manager(cluster);
    let mut samples: BTreeMap<&'static str, Vec<Sample>> = BTreeMap::new();
    for r in 0..k.repeats {
        let order = if r % 2 == 0 {
            [Attacher::Go, Attacher::Hub]
        } else {
            [Attacher::Hub, Attacher::Go]
        };
        for which in order {
            let t = Instant::now();
            let s = run_once(cluster, k, which, r).await;
            eprintln!(
                "bench e2e: {} run {} in {:.1}s: attach p50 {:.2}s p99 {:.2}s, detach p50 {:.2}s p99 {:.2}s, {} publishes; \
                 attacher's share: attach p99 {:.2}s, detach p99 {:.2}s",
                label(which),
                r + 1,
                t.elapsed().as_secs_f64(),
                quantile(&s.attach, 0.5),
                quantile(&s.attach, 0.99),
                quantile(&s.detach, 0.5),
                quantile(&s.detach, 0.99),
                s.publishes,
                quantile(&s.va_attach, 0.99),
                quantile(&s.va_detach, 0.99),
            );
            samples.entry(label(which)).or_default().push(s);
        }
    }
    report(k, &samples)
}

fn label(which: Attacher) -> &'static str {
    match which {
        Attacher::Go => "Go fleet",
        _ => "attacher-hub",
    }
}

/// What the watches saw.
#[derive(Default)]
struct Seen {
    /// Unique volume name → first seen in a Node's `status.volumesAttached`.
    listed: HashMap<String, Instant>,
    /// VA name → (attacher, node, PV), from its first event.
    vas: HashMap<String, (String, String, String)>,
    /// VA name → first seen (created by kube-controller-manager).
    created: HashMap<String, Instant>,
    /// VA name → first seen with `status.attached`.
    attached: HashMap<String, Instant>,
    /// VA name → first seen with a deletion timestamp (kube-controller-manager deleted it).
    deleting: HashMap<String, Instant>,
    /// VA name → seen deleted.
    deleted: HashMap<String, Instant>,
}

/// One contender on a fresh set of drivers, Nodes and volumes.
async fn run_once(cluster: &'static Cluster, k: &Knobs, which: Attacher, repeat: usize) -> Sample {
    let client = cluster.client().await;
    let run = format!("e2e{}{repeat}{}", std::process::id() % 1000, which.tag());
    let nodes: Vec<String> = (0..k.nodes).map(|n| format!("{run}-n{n}")).collect();
    // Pod i: driver i % D, Node i % N, its own disk and claim.
    let pods: Vec<(String, usize, usize)> = (0..k.pods)
        .map(|i| (format!("{run}-p{i}"), i % k.drivers(), i % k.nodes))
        .collect();
    let disk = |i: usize| format!("{run}-d{i}");
    let disks_of = |d: usize| -> Vec<String> {
        (0..k.pods)
            .filter(|i| i % k.drivers() == d)
            .map(disk)
            .collect()
    };

    let mut vendors = Vec::new();
    for d in 0..k.pd_drivers {
        let pd = PdController::start(
            cluster,
            &format!("{run}-{d}.pd.csi.test"),
            PdOptions {
                instances: nodes.clone(),
                disks: disks_of(d),
                latency: Some(k.latency),
            },
        )
        .await;
        vendors.push(Vendor::Pd(pd));
    }
    if k.ebs {
        let ebs = EbsController::start(
            cluster,
            EbsOptions {
                instances: nodes.iter().map(|n| ebs_instance(n)).collect(),
                volumes: disks_of(k.pd_drivers)
                    .iter()
                    .map(|d| ebs_volume(d))
                    .collect(),
                latency: Some(k.latency),
            },
        )
        .await;
        vendors.push(Vendor::Ebs(ebs));
    }
    let drivers: Vec<String> = vendors.iter().map(|v| v.driver().to_string()).collect();
    for node in &nodes {
        let mut labels = vec![(PD_TOPOLOGY_KEY, PD_ZONE), (RUN_LABEL, run.as_str())];
        if k.ebs {
            labels.extend(EBS_TOPOLOGY_KEYS.iter().map(|key| (*key, EBS_ZONE)));
        }
        create_managed_node(&client, node, &labels).await;
        let entries: Vec<NodeDriver> = vendors.iter().map(|v| v.node_driver(node)).collect();
        create_csinode_with(&client, node, &entries).await;
    }
    let volumes: Vec<StaticVolume> = pods
        .iter()
        .enumerate()
        .map(|(i, (name, d, _))| {
            StaticVolume::new(
                name,
                Source::csi(&drivers[*d], &vendors[*d].volume_id(&disk(i))),
            )
        })
        .collect();
    stream::iter(&volumes)
        .for_each_concurrent(CONCURRENCY, |v| {
            let client = client.clone();
            async move { v.create(&client).await }
        })
        .await;
    wait_bound(
        &client,
        &pods.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
        k.timeout,
    )
    .await;

    let sockets: Vec<(String, std::path::PathBuf)> = vendors
        .iter()
        .map(|v| (v.driver().to_string(), v.socket().to_path_buf()))
        .collect();
    let mut attachers = start_attachers(
        cluster,
        if which == Attacher::Go {
            Attacher::Go
        } else {
            Attacher::Hub
        },
        &sockets,
        FLAGS,
    );
    wait_leading(&client, &drivers, k.timeout).await;

    let seen: Arc<Mutex<Seen>> = Arc::default();
    let watches = start_watches(&client, &run, &drivers, Arc::clone(&seen)).await;

    // Attach: every Pod at once.
    let names: Vec<String> = pods
        .iter()
        .zip(&volumes)
        .map(|(_, v)| v.unique_name(PD_ZONE))
        .collect();
    let t0 = Instant::now();
    let nodes_ref = &nodes;
    let created: Vec<Instant> = stream::iter(&pods)
        .map(|(name, _, n)| {
            let client = client.clone();
            async move {
                create_pod(&client, name, &nodes_ref[*n], &[PodVolume::claim(name)]).await;
                Instant::now()
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    wait_seen(&seen, k.timeout, "attached", |s| {
        names.iter().all(|n| s.listed.contains_key(n))
    })
    .await;
    let attach_wall = t0.elapsed().as_secs_f64();
    let attach: Vec<f64> = {
        let s = seen.lock().expect("seen lock");
        names
            .iter()
            .zip(&created)
            .map(|(n, c)| s.listed[n].duration_since(*c).as_secs_f64())
            .collect()
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Detach: every Pod deleted at once.
    let pod_api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let t1 = Instant::now();
    let deleted: Vec<Instant> = stream::iter(&pods)
        .map(|(name, _, _)| {
            let api = pod_api.clone();
            async move {
                api.delete(name, &DeleteParams::default().grace_period(0))
                    .await
                    .unwrap_or_else(|e| panic!("deleting Pod {name}: {e}"));
                Instant::now()
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let va_of = |s: &Seen, (name, d, n): &(String, usize, usize)| -> Option<String> {
        s.vas
            .iter()
            .find(|(_, (a, node, pv))| a == &drivers[*d] && node == &nodes[*n] && pv == name)
            .map(|(va, _)| va.clone())
    };
    wait_seen(&seen, k.timeout, "detached", |s| {
        pods.iter()
            .all(|p| va_of(s, p).is_some_and(|va| s.deleted.contains_key(&va)))
    })
    .await;
    let detach_wall = t1.elapsed().as_secs_f64();
    let detach: Vec<f64> = {
        let s = seen.lock().expect("seen lock");
        pods.iter()
            .zip(&deleted)
            .map(|(p, t)| {
                let va = va_of(&s, p).expect("waited for above");
                s.deleted[&va].duration_since(*t).as_secs_f64()
            })
            .collect()
    };
    let (va_attach, va_detach) = {
        let s = seen.lock().expect("seen lock");
        let span = |from: &HashMap<String, Instant>, to: &HashMap<String, Instant>| -> Vec<f64> {
            pods.iter()
                .filter_map(|p| va_of(&s, p))
                .filter_map(|va| Some(to.get(&va)?.duration_since(*from.get(&va)?).as_secs_f64()))
                .collect()
        };
        (span(&s.created, &s.attached), span(&s.deleting, &s.deleted))
    };
    watches.iter().for_each(tokio::task::JoinHandle::abort);

    let mut sample = Sample {
        attach,
        detach,
        va_attach,
        va_detach,
        attach_wall,
        detach_wall,
        ..Sample::default()
    };
    for vendor in &vendors {
        for (method, code) in vendor.calls().await {
            match (method.as_str(), code.as_str()) {
                ("ControllerPublishVolume", "OK") => sample.publishes += 1,
                ("ControllerUnpublishVolume", "OK") => sample.unpublishes += 1,
                _ => sample.refused += 1,
            }
        }
    }

    attachers.stop().await;
    let volume_names: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    delete_objects(&client, &[], &volume_names, &nodes).await;
    let leases = Api::<Lease>::namespaced(client.clone(), "default");
    for d in &drivers {
        let _ = leases
            .delete(
                &format!("external-attacher-leader-{}", sanitize_driver_name(d)),
                &DeleteParams::default(),
            )
            .await;
    }
    sample
}

/// Waits until every claim in `claims` is Bound (the PV binder's work).
async fn wait_bound(client: &Client, claims: &[String], timeout: Duration) {
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let start = Instant::now();
    loop {
        let list = api.list(&ListParams::default()).await.expect("list PVCs");
        let bound = list
            .items
            .iter()
            .filter(|c| claims.contains(c.metadata.name.as_ref().unwrap_or(&String::new())))
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound == claims.len() {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "{bound} of {} claims bound within {timeout:?}",
            claims.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every driver's Lease has a holder.
async fn wait_leading(client: &Client, drivers: &[String], timeout: Duration) {
    let api = Api::<Lease>::namespaced(client.clone(), "default");
    let start = Instant::now();
    for d in drivers {
        let name = format!("external-attacher-leader-{}", sanitize_driver_name(d));
        loop {
            let held = api
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .is_some_and(|h| !h.is_empty());
            if held {
                break;
            }
            assert!(
                start.elapsed() < timeout,
                "no holder of Lease {name} within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Watches the run's Nodes (their volumes listed as attached) and every VA of
/// the run's drivers (their deletion); returns once both have listed.
async fn start_watches(
    client: &Client,
    run: &str,
    drivers: &[String],
    seen: Arc<Mutex<Seen>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (node_tx, node_rx) = tokio::sync::oneshot::channel::<()>();
    let (va_tx, va_rx) = tokio::sync::oneshot::channel::<()>();
    let nodes: Api<Node> = Api::all(client.clone());
    let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
    let s1 = Arc::clone(&seen);
    let node_task = tokio::spawn(async move {
        let mut ready = Some(node_tx);
        let mut events = watcher(nodes, config).boxed();
        while let Ok(Some(event)) = events.try_next().await {
            let now = Instant::now();
            match event {
                watcher::Event::InitApply(n) | watcher::Event::Apply(n) => {
                    let mut s = s1.lock().expect("seen lock");
                    for v in n
                        .status
                        .and_then(|st| st.volumes_attached)
                        .unwrap_or_default()
                    {
                        s.listed.entry(v.name).or_insert(now);
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    });
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let ours: Vec<String> = drivers.to_vec();
    let s2 = Arc::clone(&seen);
    let va_task = tokio::spawn(async move {
        let mut ready = Some(va_tx);
        let mut events = watcher(vas, watcher::Config::default()).boxed();
        while let Ok(Some(event)) = events.try_next().await {
            let now = Instant::now();
            match event {
                watcher::Event::InitApply(va) | watcher::Event::Apply(va) => {
                    if ours.contains(&va.spec.attacher) {
                        let name = va.metadata.name.clone().unwrap_or_default();
                        let pv = va
                            .spec
                            .source
                            .persistent_volume_name
                            .clone()
                            .unwrap_or_default();
                        let attached = va.status.as_ref().is_some_and(|st| st.attached);
                        let deleting = va.metadata.deletion_timestamp.is_some();
                        let mut s = s2.lock().expect("seen lock");
                        s.created.entry(name.clone()).or_insert(now);
                        if attached {
                            s.attached.entry(name.clone()).or_insert(now);
                        }
                        if deleting {
                            s.deleting.entry(name.clone()).or_insert(now);
                        }
                        s.vas.entry(name).or_insert((
                            va.spec.attacher.clone(),
                            va.spec.node_name.clone(),
                            pv,
                        ));
                    }
                }
                watcher::Event::Delete(va) => {
                    if ours.contains(&va.spec.attacher) {
                        let name = va.metadata.name.clone().unwrap_or_default();
                        let mut s = s2.lock().expect("seen lock");
                        // A VA deleted without a finalizer left: no update showed its deletion.
                        s.deleting.entry(name.clone()).or_insert(now);
                        s.deleted.entry(name).or_insert(now);
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                watcher::Event::Init => {}
            }
        }
    });
    for rx in [node_rx, va_rx] {
        tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .expect("a watch did not list within 60s")
            .expect("a watch ended");
    }
    vec![node_task, va_task]
}

/// Polls what the watches saw until `done` holds.
async fn wait_seen(
    seen: &Mutex<Seen>,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Seen) -> bool,
) {
    let start = Instant::now();
    loop {
        if done(&seen.lock().expect("seen lock")) {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "not every Pod {what} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Markdown report: per contender the medians over runs, then the ratios.
fn report(k: &Knobs, samples: &BTreeMap<&'static str, Vec<Sample>>) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## End to end: Pods through kube-controller-manager ({}, {} ms ± 20 % per attach/detach)\n",
        vendors_text(k),
        k.latency.as_millis()
    );
    let _ = writeln!(
        md,
        "{} Pods (one claim each) created at once over {} Nodes and {} drivers ({}: one Go sidecar each, one attacher-hub for all), then deleted at once; \
         {} runs per contender, alternating; flags of the PD Deployment's attacher ({}). \
         Attach: Pod created → volume in `node.status.volumesAttached`; detach: Pod deleted → its VolumeAttachment gone. \
         Medians over runs of each run's quantile.\n",
        k.pods,
        k.nodes,
        k.drivers(),
        vendors_text(k),
        k.repeats,
        FLAGS.join(" ")
    );
    let _ = writeln!(
        md,
        "| contender | attach p50 | attach p99 | detach p50 | detach p99 | attach phase | detach phase | publishes / unpublishes (OK) | refused | VA created → attached p50 / p99 | VA deleted → gone p50 / p99 |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    let summary = |s: &[Sample]| {
        let m = |f: &dyn Fn(&Sample) -> f64| median(s.iter().map(f).collect());
        [
            m(&|x| quantile(&x.attach, 0.5)),
            m(&|x| quantile(&x.attach, 0.99)),
            m(&|x| quantile(&x.detach, 0.5)),
            m(&|x| quantile(&x.detach, 0.99)),
            m(&|x| x.attach_wall),
            m(&|x| x.detach_wall),
            m(&|x| x.publishes as f64),
            m(&|x| x.unpublishes as f64),
            m(&|x| x.refused as f64),
            m(&|x| quantile(&x.va_attach, 0.5)),
            m(&|x| quantile(&x.va_attach, 0.99)),
            m(&|x| quantile(&x.va_detach, 0.5)),
            m(&|x| quantile(&x.va_detach, 0.99)),
        ]
    };
    let mut sums = BTreeMap::new();
    for (name, s) in samples {
        let v = summary(s);
        let _ = writeln!(
            md,
            "| {name} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.1} s | {:.1} s | {:.0} / {:.0} | {:.0} | {:.2} / {:.2} s | {:.2} / {:.2} s |",
            v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12]
        );
        sums.insert(*name, v);
    }
    if let (Some(hub), Some(go)) = (sums.get("attacher-hub"), sums.get("Go fleet")) {
        let r = |i: usize| hub[i] / go[i];
        let verdict = |x: f64| if x <= 1.0 { "PASS" } else { "FAIL" };
        let _ = writeln!(md);
        let _ = writeln!(md, "| hub / Go | ratio | target |");
        let _ = writeln!(md, "|---|---|---|");
        let _ = writeln!(md, "| attach p50 | {:.2}x | |", r(0));
        let _ = writeln!(
            md,
            "| attach p99 | {:.2}x | ≤ 1.0x: {} |",
            r(1),
            verdict(r(1))
        );
        let _ = writeln!(md, "| detach p50 | {:.2}x | |", r(2));
        let _ = writeln!(
            md,
            "| detach p99 | {:.2}x | ≤ 1.0x: {} |",
            r(3),
            verdict(r(3))
        );
    }
    md
}

/// The vendors' controllers of the run, in words.
fn vendors_text(k: &Knobs) -> String {
    let pd = match k.pd_drivers {
        0 => None,
        1 => Some("the PD controller".to_string()),
        n => Some(format!("{n} PD controllers")),
    };
    let ebs = k.ebs.then(|| "the EBS controller".to_string());
    pd.into_iter().chain(ebs).collect::<Vec<_>>().join(" and ")
}

/// Writes the report next to the main one.
pub(crate) fn write_report(md: &str) {
    let target = crate::support::target_dir().join("bench-e2e-report.md");
    std::fs::write(&target, md).expect("write target/bench-e2e-report.md");
}
