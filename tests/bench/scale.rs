//! The scale curve and start-up at scale: how the hub's cost grows with the number of
//! drivers and of objects in the cluster, against as many Go sidecars, and how long each takes
//! to start when the cluster already holds tens of thousands of attachments.
//!
//! * **Drivers** ([`drivers_sweep`], config `scale-drivers`): for N in `BENCH_SCALE_DRIVERS`
//!   (1, 10, 50, 100), one hub serving N drivers and N Go sidecars, each run through
//!   [`scenario::run`]: idle (RSS, CPU and Lease writes over `BENCH_SCALE_IDLE_SECS`), then a
//!   fixed load of `BENCH_SCALE_LOAD` VAs per driver (throughput, p99), with the seed flags.
//!   The fleet runs only where the machine's available memory allows N sidecars and N is at
//!   most `BENCH_SCALE_FLEET_MAX`; otherwise it runs 10 sidecars, idle only, and its idle
//!   figures (which are per process) are multiplied by N / 10 (marked so). Such a fleet has no
//!   load figures: N sidecars under load would share the machine and the API server, which 10
//!   sidecars times N / 10 does not show.
//! * **Objects** ([`objects_sweep`], config `scale-objects`): with 0 and then
//!   `BENCH_SCALE_OBJECTS` (1,000, 10,000, 50,000, 100,000) extra VAs and as many PVs (of a
//!   driver nobody serves) in the cluster, one hub with one driver and one Go sidecar, idle:
//!   RSS, and bytes per object over the run without extra objects.
//! * **Start-up** ([`startup`], config `startup`): `BENCH_STARTUP_VAS` VAs (50,000), of which
//!   `BENCH_STARTUP_ATTACHED` (20,000) are attached across `BENCH_STARTUP_DRIVERS` (10) drivers
//!   as an attacher leaves them (finalizers, node-ID annotation, `attached: true`, the PV
//!   finalizer; the mocks already publish them), the rest of a driver nobody serves, and one PV
//!   per VA. Each contender is started cold; measured: from the start to every driver synced
//!   and idle, the API requests it took, the ControllerPublish calls for the attached volumes,
//!   then idle RSS and CPU.
//!
//! "Synced and idle" is read from each process's own metrics (`--http-endpoint`), the same
//! series for both: every VA a process queues when its caches fill has been processed
//! (`workqueue_work_duration_seconds_count{name="csi-attacher-va"}`) and its queues are empty
//! (`workqueue_depth`). A Go sidecar queues every VA in the cluster (its informer's add handler
//! does not look at the driver); the hub queues each driver's own.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, future::join_all, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::process::Command;

use crate::control_plane::{self, Baseline, Plane, Window};
use crate::hub::create_node_with_drivers;
use crate::report::median;
use crate::scenario::{self, Contender, RunSpec, Sample, Workload};
use crate::support::{
    ApiServerMetrics, ChildProcess, Cluster, MockProcess, PvBuilder, RequestKind, cpu_seconds,
    free_port, http_get, sanitize_driver_name, status_mib, unique_driver_name, unique_name, va,
};

/// Requests in flight while the benchmark creates or removes objects in bulk.
const CONCURRENCY: usize = 64;

/// Namespace of the leader-election Leases.
const LEASE_NAMESPACE: &str = "default";

/// What one Go sidecar is given of the machine's memory when deciding whether N of them fit
/// (an idle sidecar with a small cluster holds 50-60 MiB), plus what stays free for the rest.
const SIDECAR_MIB: f64 = 80.0;
/// See [`SIDECAR_MIB`].
const HEADROOM_MIB: f64 = 4096.0;

/// How often a start-up is checked for "synced and idle".
const SYNC_POLL: Duration = Duration::from_millis(250);

/// Longest start-up the benchmark waits for.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(900);

/// After "synced and idle": pause before idle RSS, then the window idle CPU is read over.
const STARTUP_SETTLE: Duration = Duration::from_secs(5);
/// See [`STARTUP_SETTLE`].
const STARTUP_IDLE_WINDOW: Duration = Duration::from_secs(20);

/// Sizes of the scale curve and the start-up, from `BENCH_SCALE_*` and `BENCH_STARTUP_*`.
#[derive(Clone, Debug)]
pub(crate) struct ScaleKnobs {
    /// `BENCH_SCALE_DRIVERS`: driver counts of the curve (1,10,50,100).
    pub(crate) drivers: Vec<usize>,
    /// `BENCH_SCALE_OBJECTS`: extra VA + PV pairs of the curve (1000,10000,50000,100000).
    pub(crate) objects: Vec<usize>,
    /// `BENCH_SCALE_LOAD`: VAs per driver of the fixed load (10).
    pub(crate) load: usize,
    /// `BENCH_SCALE_IDLE_SECS`: idle window of the drivers sweep (60).
    pub(crate) idle_window: Duration,
    /// `BENCH_STARTUP_VAS`: VAs (and PVs) in the cluster at start-up (50000).
    pub(crate) startup_vas: usize,
    /// `BENCH_STARTUP_ATTACHED`: of those, attached VAs of the served drivers (20000).
    pub(crate) startup_attached: usize,
    /// `BENCH_STARTUP_DRIVERS`: served drivers at start-up (10).
    pub(crate) startup_drivers: usize,
    /// `BENCH_STARTUP_REPEATS`: cold starts per contender (1).
    pub(crate) startup_repeats: usize,
    /// `BENCH_SCALE_FLEET_MAX`: the largest fleet run in full (10); beyond it, 10 sidecars with
    /// their idle figures multiplied by N / 10, as when memory is short. On the project's
    /// two-core machine, fleets of 50 and 100 sidecars lose Leases under the load (their
    /// renewals miss the renew deadline and they exit, which ends the benchmark), so larger
    /// fleets are for larger machines (see docs/benchmarks.md).
    pub(crate) fleet_max: usize,
}

fn list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {s:?} is not a count"))
        })
        .collect()
}

fn number(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a count"))
    })
}

impl ScaleKnobs {
    pub(crate) fn from_env() -> Self {
        Self {
            drivers: list("BENCH_SCALE_DRIVERS", "1,10,50,100"),
            objects: list("BENCH_SCALE_OBJECTS", "1000,10000,50000,100000"),
            load: number("BENCH_SCALE_LOAD", 10),
            idle_window: Duration::from_secs(number("BENCH_SCALE_IDLE_SECS", 60) as u64),
            startup_vas: number("BENCH_STARTUP_VAS", 50_000),
            startup_attached: number("BENCH_STARTUP_ATTACHED", 20_000),
            startup_drivers: number("BENCH_STARTUP_DRIVERS", 10).max(1),
            startup_repeats: number("BENCH_STARTUP_REPEATS", 1).max(1),
            fleet_max: number("BENCH_SCALE_FLEET_MAX", 10).max(10),
        }
    }
}

/// One point of the drivers curve, for one contender.
#[derive(Clone, Debug, Default)]
pub(crate) struct DriverPoint {
    /// Drivers served.
    pub(crate) drivers: usize,
    /// Processes that ran (N sidecars, 10 when scaled, 1 hub).
    pub(crate) processes: usize,
    /// The idle figures are those of 10 sidecars multiplied by `drivers / 10`, and there are no
    /// load figures.
    pub(crate) scaled: bool,
    /// Idle RSS (MiB), summed over the processes.
    pub(crate) idle_rss: f64,
    /// Idle CPU, millicores (CPU milliseconds per second over the idle window).
    pub(crate) idle_cpu_millicores: f64,
    /// Lease writes per minute while idle.
    pub(crate) lease_writes_per_min: f64,
    /// All API requests per minute while idle.
    pub(crate) requests_per_min: f64,
    /// VAs per second under the fixed load.
    pub(crate) throughput: Option<f64>,
    /// Attach latency p50 / p99 (s) under the fixed load.
    pub(crate) p50: Option<f64>,
    /// See `p50`.
    pub(crate) p99: Option<f64>,
    /// ControllerPublish calls beyond the first for a volume under the load.
    pub(crate) duplicate_publishes: Option<usize>,
    /// Times a process stopped leading because it lost a Lease (idle and load runs).
    pub(crate) lease_losses: usize,
    /// The contender's requests (and ListVolumes calls) per minute per driver while idle
    /// ([`crate::periodic`]; per driver of those that ran, so not scaled).
    pub(crate) periodic: BTreeMap<String, f64>,
    /// What the idle window cost the control plane (scaled like the other idle figures: the
    /// watches and Lease renewals of N sidecars are N times those of one).
    pub(crate) plane: control_plane::Cost,
}

/// One point of the objects curve, for one contender.
#[derive(Clone, Debug, Default)]
pub(crate) struct ObjectPoint {
    /// Extra VA + PV pairs in the cluster.
    pub(crate) pairs: usize,
    /// Idle RSS (MiB).
    pub(crate) idle_rss: f64,
    /// Peak RSS (VmHWM, MiB): the start-up, when the caches fill, included.
    pub(crate) peak_rss: f64,
}

/// One cold start at scale.
#[derive(Clone, Debug, Default)]
pub(crate) struct StartupSample {
    /// Processes.
    pub(crate) processes: usize,
    /// Seconds from the start to every driver synced and idle; `None` if it did not get there.
    pub(crate) synced_idle: Option<f64>,
    /// Requests of the start-up (until synced and idle), by kind, on the attacher's resources.
    pub(crate) requests: BTreeMap<RequestKind, f64>,
    /// Watches held once idle.
    pub(crate) watches: f64,
    /// ControllerPublish calls (all for volumes that were attached already).
    pub(crate) publishes: usize,
    /// RSS (MiB) once idle, summed.
    pub(crate) idle_rss: f64,
    /// CPU seconds from the start to synced and idle, summed.
    pub(crate) startup_cpu: f64,
    /// Idle CPU (millicores) after the start-up.
    pub(crate) idle_cpu_millicores: f64,
    /// What the start-up (until synced and idle) cost the API server and etcd.
    pub(crate) plane: control_plane::Cost,
}

/// How a hub's watches get their first state at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Lists {
    /// Streaming lists (`sendInitialEvents`), the default.
    Streaming,
    /// Paginated LISTs (`KUBE_FEATURE_WatchListClient=false`).
    Paginated,
}

/// Everything the scale configurations measured, for the report and the plot.
#[derive(Debug, Default)]
pub(crate) struct ScaleResults {
    /// Drivers curve: (contender, points in driver order).
    pub(crate) drivers: BTreeMap<Contender, Vec<DriverPoint>>,
    /// Objects curve, one driver: (contender, points, the first without extra objects).
    pub(crate) objects: BTreeMap<Contender, Vec<ObjectPoint>>,
    /// Start-up: (contender, cold starts).
    pub(crate) startup: BTreeMap<Contender, Vec<StartupSample>>,
    /// Start-up of the hub with paginated lists instead of streaming ones.
    pub(crate) startup_paginated: Vec<StartupSample>,
    /// Start-up cluster: (VAs, attached VAs, drivers).
    pub(crate) startup_size: (usize, usize, usize),
    /// Fixed load per driver of the drivers curve.
    pub(crate) load: usize,
    /// Idle window of the drivers curve.
    pub(crate) idle_window: Duration,
}

/// The seed manifest's flags (as the other configurations use them).
fn seed_flags() -> Vec<String> {
    vec![
        "--leader-election=true".into(),
        "--retry-interval-start=500ms".into(),
    ]
}

/// Available memory of the machine (MiB), from `/proc/meminfo`.
fn available_mib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Lease writes and all requests per minute of an idle sample. Requests come from the API
/// server's counters, over the time between their two readings (the idle window, the pause
/// before it and the scrapes: about 63 s for a 60 s window, which counted as 60 s made every
/// rate 5 % high, and the hub's renewals, 20 at a time on its grid lines, up to 8 %). Lease
/// writes come from a watch of the run's namespace over the window itself: the counters also
/// count the API server's own Lease in `kube-system` (6 a minute, which a scaled fleet's
/// figure multiplied by N / 10).
fn per_minute(s: &Sample) -> (f64, f64) {
    let seconds = if s.requests_window > 0.0 {
        s.requests_window
    } else {
        s.attach_window
    };
    let minutes = (seconds / 60.0).max(1e-9);
    let leases = match &s.lease_writes {
        Some((writes, seconds)) => {
            writes.values().sum::<usize>() as f64 / (seconds / 60.0).max(1e-9)
        }
        None => {
            s.attach_requests
                .iter()
                .filter(|(k, _)| k.resource == "leases" && k.is_write())
                .map(|(_, v)| v)
                .sum::<f64>()
                / minutes
        }
    };
    let all: f64 = s.attach_requests.values().sum();
    (leases, all / minutes)
}

/// The Leases of an idle window written more often than once a retry period (the seed flags
/// keep both contenders' default, 5 s), with their counts: a renewal loop gone wrong, or a
/// write that is not a renewal, named.
fn overwritten(s: &Sample) -> Vec<(String, usize)> {
    const RETRY_PERIOD_SECS: f64 = 5.0;
    let Some((writes, seconds)) = &s.lease_writes else {
        return Vec::new();
    };
    let most = (seconds / RETRY_PERIOD_SECS).ceil() as usize + 1;
    writes
        .iter()
        .filter(|(_, n)| **n > most)
        .map(|(lease, n)| (lease.clone(), *n))
        .collect()
}

/// The drivers curve.
pub(crate) async fn drivers_sweep(cluster: &Cluster, k: &ScaleKnobs, out: &mut ScaleResults) {
    out.load = k.load;
    out.idle_window = k.idle_window;
    for &n in &k.drivers {
        for contender in [Contender::Hub, Contender::Fleet] {
            let fits = n <= k.fleet_max && available_mib() >= n as f64 * SIDECAR_MIB + HEADROOM_MIB;
            let (ran, scale) = match contender {
                Contender::Fleet if !fits && n > 10 => (10, n as f64 / 10.0),
                _ => (n, 1.0),
            };
            let spec = |id: &str, workload| RunSpec {
                id: id.to_string(),
                drivers: ran,
                flags: seed_flags(),
                hub_flags: vec![],
                workload,
                settle: Duration::from_secs(8),
                timeout: Duration::from_secs(600),
                // 100 Go sidecars starting at once on a small machine may miss a renewal; one
                // that loses its Lease exits, and comes back as the kubelet would bring it
                // back (counted, and named in the report).
                restart: true,
            };
            let t = Instant::now();
            let idle = scenario::run(
                cluster,
                contender,
                &spec(
                    "si",
                    Workload::Idle {
                        window: k.idle_window,
                    },
                ),
            )
            .await;
            // A scaled fleet's load figures would mean nothing (see the module documentation).
            let load = if scale == 1.0 {
                Some(
                    scenario::run(
                        cluster,
                        contender,
                        &spec("sl", Workload::Uniform { per_driver: k.load }),
                    )
                    .await,
                )
            } else {
                None
            };
            let (lease_writes, requests) = per_minute(&idle);
            for (lease, n) in overwritten(&idle) {
                eprintln!(
                    "bench: scale-drivers {n_drivers} {contender:?}: Lease {lease} written {n} times in the {:.0} s idle window",
                    idle.lease_writes.as_ref().map_or(0.0, |(_, s)| *s),
                    n_drivers = n,
                );
            }
            let point = DriverPoint {
                drivers: n,
                processes: idle.processes,
                scaled: scale != 1.0,
                idle_rss: idle.idle_rss * scale,
                idle_cpu_millicores: 1000.0 * idle.cpu / idle.attach_window.max(1e-9) * scale,
                lease_writes_per_min: lease_writes * scale,
                requests_per_min: requests * scale,
                throughput: load.as_ref().and_then(|l| l.throughput),
                p50: load.as_ref().and_then(|l| l.p50),
                p99: load.as_ref().and_then(|l| l.p99),
                duplicate_publishes: load.as_ref().map(|l| l.duplicate_publishes),
                plane: idle.plane.scaled(scale),
                lease_losses: idle.lease_losses + load.as_ref().map_or(0, |l| l.lease_losses),
                periodic: crate::periodic::per_driver_minute(
                    &idle.periodic,
                    idle.attach_window,
                    ran,
                ),
            };
            eprintln!(
                "bench: scale-drivers {n} {contender:?} ({:.0} s){}: idle {:.1} MiB, {:.1} m CPU, \
                 {:.0} Lease writes/min; {} VAs/s, p99 {} s; {} Leases lost",
                t.elapsed().as_secs_f64(),
                if point.scaled {
                    " (10 sidecars, idle, scaled)"
                } else {
                    ""
                },
                point.idle_rss,
                point.idle_cpu_millicores,
                point.lease_writes_per_min,
                point.throughput.map_or("—".into(), |v| format!("{v:.1}")),
                point.p99.map_or("—".into(), |v| format!("{v:.2}")),
                point.lease_losses,
            );
            out.drivers.entry(contender).or_default().push(point);
        }
    }
}

/// The objects curve.
pub(crate) async fn objects_sweep(cluster: &Cluster, k: &ScaleKnobs, out: &mut ScaleResults) {
    let client = cluster.client().await;
    let spec = RunSpec {
        id: "so".to_string(),
        drivers: 1,
        flags: seed_flags(),
        hub_flags: vec![],
        workload: Workload::Idle {
            window: Duration::from_secs(2),
        },
        settle: Duration::from_secs(10),
        timeout: Duration::from_secs(600),
        restart: false,
    };
    let mut created: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut have = 0;
    let mut levels = vec![0];
    levels.extend(k.objects.iter().copied());
    for level in levels {
        if level > have {
            let t = Instant::now();
            created.push(scenario::create_extra(&client, level - have).await);
            eprintln!(
                "bench: scale-objects: {} more VAs + PVs in {:.0} s",
                level - have,
                t.elapsed().as_secs_f64()
            );
            have = level;
        }
        for contender in [Contender::Hub, Contender::Fleet] {
            let s = scenario::run(cluster, contender, &spec).await;
            eprintln!(
                "bench: scale-objects {level} {contender:?}: idle {:.1} MiB, peak {:.1} MiB",
                s.idle_rss, s.peak_rss
            );
            out.objects.entry(contender).or_default().push(ObjectPoint {
                pairs: level,
                idle_rss: s.idle_rss,
                peak_rss: s.peak_rss,
            });
        }
    }
    let t = Instant::now();
    for extra in &created {
        scenario::remove_extra(&client, extra).await;
    }
    eprintln!(
        "bench: scale-objects: removed in {:.0} s",
        t.elapsed().as_secs_f64()
    );
}

/// Bytes per cached object between two points of the objects curve (a pair is two objects).
pub(crate) fn bytes_per_object(base: &ObjectPoint, p: &ObjectPoint) -> Option<f64> {
    (p.pairs > base.pairs).then(|| {
        (p.idle_rss - base.idle_rss) * 1024.0 * 1024.0 / (2 * (p.pairs - base.pairs)) as f64
    })
}

/// Start-up at scale.
pub(crate) async fn startup(cluster: &Cluster, k: &ScaleKnobs, out: &mut ScaleResults) {
    let client = cluster.client().await;
    let run = unique_name("start");
    let n = k.startup_drivers;
    let per_driver = k.startup_attached / n;
    let attached = per_driver * n;
    let unserved = k.startup_vas.saturating_sub(attached);
    out.startup_size = (attached + unserved, attached, n);
    let drivers: Vec<String> = (0..n)
        .map(|i| unique_driver_name(&format!("st{i}")))
        .collect();
    let node = format!("{run}-node");

    // The drivers, each already publishing its attached volumes to the node: a driver that
    // lists its volumes (the reconciler) reports them in sync.
    let mocks = join_all(drivers.iter().map(|d| MockProcess::start(d, per_driver))).await;
    let node_ids: Vec<(String, String)> =
        drivers.iter().map(|d| (d.clone(), node.clone())).collect();
    create_node_with_drivers(&client, &node, &node_ids).await;
    let t = Instant::now();
    for m in &mocks {
        publish_all(m.socket(), per_driver, &node).await;
        reset_calls(m.socket()).await;
    }
    eprintln!(
        "bench: startup: {attached} volumes published on the mocks in {:.0} s",
        t.elapsed().as_secs_f64()
    );

    // The objects.
    let t = Instant::now();
    let plan: Vec<(usize, usize)> = (0..n)
        .flat_map(|d| (0..per_driver).map(move |j| (d, j)))
        .collect();
    let vas: Vec<String> = plan
        .iter()
        .map(|(d, j)| format!("{run}-d{d}-{j}"))
        .collect();
    let pvs: Vec<String> = vas.iter().map(|v| format!("{v}-pv")).collect();
    stream::iter(plan.iter().zip(vas.iter().zip(&pvs)))
        .for_each_concurrent(CONCURRENCY, |(&(d, j), (va_name, pv_name))| {
            let client = client.clone();
            let driver = &drivers[d];
            let node = &node;
            async move { create_attached(&client, driver, node, va_name, pv_name, j).await }
        })
        .await;
    let extra = scenario::create_extra(&client, unserved).await;
    eprintln!(
        "bench: startup: {attached} attached VAs + PVs of {n} drivers and {unserved} others created in {:.0} s",
        t.elapsed().as_secs_f64()
    );

    // What the control plane spends with no attacher running, as long as a hub's start-up.
    let plane = Plane::of(cluster);
    let baseline = Baseline::init(cluster).await;
    for rep in 0..k.startup_repeats {
        let order = if rep % 2 == 0 {
            [
                (Contender::Hub, Lists::Streaming),
                (Contender::Fleet, Lists::Streaming),
                (Contender::Hub, Lists::Paginated),
            ]
        } else {
            [
                (Contender::Hub, Lists::Paginated),
                (Contender::Fleet, Lists::Streaming),
                (Contender::Hub, Lists::Streaming),
            ]
        };
        for (contender, lists) in order {
            let total_vas = attached + unserved;
            let start = ColdStart {
                contender,
                lists,
                per_driver,
                total_vas,
                plane: (plane, baseline),
            };
            let s = cold_start(cluster, &client, &start, &mocks).await;
            eprintln!(
                "bench: startup {contender:?} ({lists:?} lists): synced and idle after {} s, {:.0} MiB, {} ControllerPublish, requests {:?}; control plane {:?}",
                s.synced_idle.map_or("—".into(), |v| format!("{v:.1}")),
                s.idle_rss,
                s.publishes,
                s.requests,
                s.plane
            );
            if lists == Lists::Paginated {
                out.startup_paginated.push(s);
            } else {
                out.startup.entry(contender).or_default().push(s);
            }
            for m in &mocks {
                reset_calls(m.socket()).await;
            }
            let leases: Vec<String> = drivers
                .iter()
                .map(|d| format!("external-attacher-leader-{}", sanitize_driver_name(d)))
                .collect();
            scenario::remove_all::<Lease>(
                &Api::namespaced(client.clone(), LEASE_NAMESPACE),
                &leases,
            )
            .await;
        }
    }

    let t = Instant::now();
    let mut mocks = mocks;
    join_all(mocks.iter_mut().map(MockProcess::stop)).await;
    scenario::remove_all::<VolumeAttachment>(&Api::all(client.clone()), &vas).await;
    scenario::remove_all::<PersistentVolume>(&Api::all(client.clone()), &pvs).await;
    scenario::remove_extra(&client, &extra).await;
    scenario::remove_all::<CSINode>(&Api::all(client.clone()), std::slice::from_ref(&node)).await;
    scenario::remove_all::<Node>(&Api::all(client.clone()), std::slice::from_ref(&node)).await;
    eprintln!(
        "bench: startup: objects removed in {:.0} s",
        t.elapsed().as_secs_f64()
    );
}

/// A PV with the attacher's finalizer and a VA marked attached, as an attacher leaves them.
async fn create_attached(
    client: &Client,
    driver: &str,
    node: &str,
    va_name: &str,
    pv_name: &str,
    volume: usize,
) {
    let finalizer = format!("external-attacher/{}", sanitize_driver_name(driver));
    let mut pv = PvBuilder::new(pv_name, driver, &format!("vol-{volume}")).build();
    pv.metadata.finalizers = Some(vec![
        "kubernetes.io/pv-protection".into(),
        finalizer.clone(),
    ]);
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap_or_else(|e| panic!("creating PV {pv_name}: {e}"));
    let mut obj = va(va_name, driver, node, pv_name);
    obj.metadata.finalizers = Some(vec![finalizer]);
    obj.metadata.annotations = Some(BTreeMap::from([(
        "csi.alpha.kubernetes.io/node-id".to_string(),
        node.to_string(),
    )]));
    let api = Api::<VolumeAttachment>::all(client.clone());
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating VA {va_name}: {e}"));
    let status = Patch::Merge(serde_json::json!({
        "status": {"attached": true, "attachmentMetadata": {"devicePath": format!("vol-{volume}")}}
    }));
    api.patch_status(va_name, &PatchParams::default(), &status)
        .await
        .unwrap_or_else(|e| panic!("marking VA {va_name} attached: {e}"));
}

/// Publishes the mock's volumes `vol-0` … to `node`, as an attacher did before.
async fn publish_all(socket: &Path, volumes: usize, node: &str) {
    use attacher_hub::csi::{
        Connection,
        proto::{
            ControllerPublishVolumeRequest, VolumeCapability,
            controller_client::ControllerClient,
            volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode},
        },
    };
    let address = socket
        .to_str()
        .and_then(|s| s.parse().ok())
        .expect("a socket path");
    let conn = Connection::connect(address, Some(Duration::from_secs(10)))
        .await
        .expect("connect to the mock");
    let client = ControllerClient::new(conn.channel());
    stream::iter(0..volumes)
        .for_each_concurrent(CONCURRENCY, |j| {
            let mut client = client.clone();
            async move {
                let req = ControllerPublishVolumeRequest {
                    volume_id: format!("vol-{j}"),
                    node_id: node.to_string(),
                    volume_capability: Some(VolumeCapability {
                        access_type: Some(AccessType::Mount(MountVolume {
                            fs_type: "ext4".into(),
                            ..MountVolume::default()
                        })),
                        access_mode: Some(AccessMode {
                            mode: Mode::SingleNodeWriter as i32,
                        }),
                    }),
                    ..ControllerPublishVolumeRequest::default()
                };
                client
                    .controller_publish_volume(req)
                    .await
                    .unwrap_or_else(|e| panic!("publishing vol-{j}: {e}"));
            }
        })
        .await;
}

/// Clears the mock's call record.
async fn reset_calls(socket: &Path) {
    let mut ctl = mock_csi_driver::control::Client::for_endpoint(socket)
        .await
        .expect("the mock's control socket");
    ctl.reset_calls().await.expect("reset the call record");
}

/// One cold start, and what it is measured against.
struct ColdStart {
    contender: Contender,
    /// How a hub gets its watches' first state (a Go sidecar: its own default, streaming).
    lists: Lists,
    /// Attached VAs per driver.
    per_driver: usize,
    /// VAs in the cluster.
    total_vas: usize,
    /// The control plane and its cost at rest.
    plane: (Plane, Baseline),
}

/// One cold start of `start.contender` over `mocks`.
async fn cold_start(
    cluster: &Cluster,
    client: &Client,
    start: &ColdStart,
    mocks: &[MockProcess],
) -> StartupSample {
    let &ColdStart {
        contender,
        lists,
        per_driver,
        total_vas,
        plane: (plane, baseline),
    } = start;
    let m0 = ApiServerMetrics::scrape(client).await;
    let window = Window::open(plane, client).await;
    let dir = tempfile::Builder::new()
        .prefix("ah-bench-start-")
        .tempdir()
        .expect("temporary directory");
    let kubeconfig = format!("--kubeconfig={}", cluster.attacher_kubeconfig.display());
    // (process, its metrics port, the VAs it queues when its caches fill)
    let mut processes: Vec<(ChildProcess, u16, usize)> = Vec::new();
    let started = Instant::now();
    match contender {
        Contender::Fleet => {
            for m in mocks {
                let port = free_port();
                let mut cmd = Command::new(cluster.bin("csi-attacher"));
                cmd.arg(&kubeconfig)
                    .arg(format!("--csi-address={}", m.socket().display()))
                    .arg(format!("--leader-election-namespace={LEASE_NAMESPACE}"))
                    .arg(format!("--http-endpoint=127.0.0.1:{port}"))
                    .args(seed_flags());
                processes.push((ChildProcess::spawn("csi-attacher", cmd), port, total_vas));
            }
        }
        Contender::Hub => {
            let file = scenario::write_drivers_yaml(dir.path(), mocks);
            let port = free_port();
            let mut cmd = Command::new(scenario::hub_bin());
            cmd.arg(&kubeconfig)
                .arg(format!("--config={}", file.display()))
                .arg(format!("--leader-election-namespace={LEASE_NAMESPACE}"))
                .arg(format!("--http-endpoint=127.0.0.1:{port}"))
                .args(seed_flags());
            if lists == Lists::Paginated {
                cmd.env("KUBE_FEATURE_WatchListClient", "false");
            }
            processes.push((
                ChildProcess::spawn("attacher-hub", cmd),
                port,
                per_driver * mocks.len(),
            ));
        }
    }
    let pids: Vec<u32> = processes.iter().filter_map(|(p, ..)| p.id()).collect();
    let mut sample = StartupSample {
        processes: processes.len(),
        ..StartupSample::default()
    };
    loop {
        let mut done = true;
        for (p, port, expected) in &mut processes {
            if let Some(status) = p.exited() {
                panic!("a contender process exited during start-up ({status})");
            }
            let q = queues(*port).await;
            done &= q.is_some_and(|q| q.va_processed >= *expected as f64 && q.depth == 0.0);
        }
        if done {
            sample.synced_idle = Some(started.elapsed().as_secs_f64());
            break;
        }
        if started.elapsed() > STARTUP_TIMEOUT {
            break;
        }
        tokio::time::sleep(SYNC_POLL).await;
    }
    sample.startup_cpu = pids.iter().map(|p| cpu_seconds(*p)).sum();
    sample.plane = window.close(client, baseline).await;
    let m1 = ApiServerMetrics::scrape(client).await;
    sample.requests = m1
        .requests_since(&m0)
        .into_iter()
        .filter(|(k, _)| {
            [
                "volumeattachments",
                "persistentvolumes",
                "csinodes",
                "leases",
            ]
            .contains(&k.resource.as_str())
        })
        .collect();
    tokio::time::sleep(STARTUP_SETTLE).await;
    sample.watches = ApiServerMetrics::scrape(client).await.watches - m0.watches;
    sample.idle_rss = pids.iter().map(|p| status_mib(*p, "VmRSS:")).sum();
    let cpu0: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    tokio::time::sleep(STARTUP_IDLE_WINDOW).await;
    let cpu1: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    sample.idle_cpu_millicores = 1000.0 * (cpu1 - cpu0) / STARTUP_IDLE_WINDOW.as_secs_f64();
    for m in mocks {
        sample.publishes += m
            .calls()
            .await
            .iter()
            .filter(|c| c.method == "ControllerPublishVolume")
            .count();
    }
    join_all(processes.iter_mut().map(|(p, ..)| p.stop())).await;
    sample
}

/// What a process's work queues show.
struct Queues {
    /// VA keys processed so far (all VA queues of the process).
    va_processed: f64,
    /// Keys waiting in every queue of the process.
    depth: f64,
}

/// Reads the work-queue series from a process's `/metrics`; `None` until it serves them.
async fn queues(port: u16) -> Option<Queues> {
    let (status, body) = http_get(port, "/metrics").await.ok()?;
    if status != 200 {
        return None;
    }
    let mut q = Queues {
        va_processed: 0.0,
        depth: 0.0,
    };
    let mut seen = false;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let attacher_queue = series.contains("name=\"csi-attacher-va\"")
            || series.contains("name=\"csi-attacher-pv\"");
        if series.starts_with("workqueue_depth{") && attacher_queue {
            q.depth += value;
            seen = true;
        } else if series.starts_with("workqueue_work_duration_seconds_count{")
            && series.contains("name=\"csi-attacher-va\"")
        {
            q.va_processed += value;
        }
    }
    seen.then_some(q)
}

/// Medians of the start-up samples of one contender.
pub(crate) fn startup_median(samples: &[StartupSample]) -> StartupSample {
    let m = |f: fn(&StartupSample) -> f64| median(samples.iter().map(f)).unwrap_or(0.0);
    StartupSample {
        processes: samples.first().map_or(0, |s| s.processes),
        synced_idle: median(samples.iter().filter_map(|s| s.synced_idle)),
        requests: samples
            .first()
            .map(|s| s.requests.clone())
            .unwrap_or_default(),
        watches: m(|s| s.watches),
        publishes: samples.iter().map(|s| s.publishes).max().unwrap_or(0),
        idle_rss: m(|s| s.idle_rss),
        startup_cpu: m(|s| s.startup_cpu),
        idle_cpu_millicores: m(|s| s.idle_cpu_millicores),
        plane: control_plane::median(&samples.iter().map(|s| s.plane.clone()).collect::<Vec<_>>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(writes: &[(&str, usize)], seconds: f64) -> Sample {
        Sample {
            requests_window: 63.0,
            attach_window: 60.0,
            lease_writes: Some((
                writes.iter().map(|(l, n)| ((*l).to_string(), *n)).collect(),
                seconds,
            )),
            ..Sample::default()
        }
    }

    /// Lease writes per minute are the watch's count over its own window; a Lease written more
    /// than once a retry period is named.
    #[test]
    fn lease_writes_come_from_the_watch_and_an_overwritten_lease_is_named() {
        let s = idle(&[("a", 12), ("b", 12), ("c", 30)], 60.0);
        assert_eq!(per_minute(&s).0, 54.0);
        assert_eq!(overwritten(&s), vec![("c".to_string(), 30)]);
        let half = idle(&[("a", 6)], 30.0);
        assert_eq!(per_minute(&half).0, 12.0);
        assert!(overwritten(&half).is_empty());
        // Without a watch (not an idle run), the API server's counters over their window.
        let mut counted = Sample {
            requests_window: 30.0,
            ..Sample::default()
        };
        counted.attach_requests.insert(
            RequestKind {
                verb: "PUT".into(),
                resource: "leases".into(),
                subresource: String::new(),
            },
            10.0,
        );
        assert_eq!(per_minute(&counted), (20.0, 20.0));
    }
}
