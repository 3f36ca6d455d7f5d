//! One measured run: one contender (a fleet of Go sidecars, one per driver,
//! or one attacher-hub serving every driver) serves N fresh drivers through
//! one workload; everything is measured from outside the contender.
//!
//! A run, step by step:
//! 1. N `mock-csi-driver` processes (one per driver socket), one Node whose
//!    CSINode lists every driver, the PVs of every VA to come;
//! 2. a label-selected watch that stamps when each VA was first seen, first
//!    seen attached and seen deleted (the latency clock);
//! 3. the contender starts; one warm-up VA per driver must attach (start-up
//!    and cache sync are not measured); then a pause lets the client-side
//!    budgets refill and the process settle: idle RSS and watches held are
//!    read here;
//! 4. the workload; API server counters are read before, after the attaches
//!    and after the detaches; CPU seconds of the contender over the workload;
//! 5. the mocks' call records (ControllerPublish calls, duplicates); the
//!    contender and the mocks stop; the admin removes every object of the run.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, future::join_all, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::process::Command;

use crate::hub::create_node_with_drivers;
use crate::support::{
    ApiServerMetrics, ChildProcess, Cluster, MockProcess, OnWatchError, PvBuilder, RequestKind,
    cpu_seconds, sanitize_driver_name, status_mib, tcp_connections_to, unique_driver_name,
    unique_name, va, watch_vas,
};

/// Label on every VA of a run, so that one watch sees exactly that run.
pub(crate) const RUN_LABEL: &str = "attacher-hub-bench/run";

/// API requests the benchmark keeps in flight when it creates or removes
/// objects in bulk: enough that creating 1,000 VAs takes a second or two on
/// two cores, so that VA creation does not pace the attachers.
const CONCURRENCY: usize = 64;

/// Namespace of the leader-election Leases.
pub(crate) const LEASE_NAMESPACE: &str = "default";

/// How long the contender may take to start, sync its caches and attach the
/// warm-up VA of every driver.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Pause before reading the API server's counters at the end of a phase:
/// requests still in flight when the watch showed the phase done (e.g. the
/// Go attacher's status PATCH after its finalizer removal, which usually
/// finds the VA gone) are counted in the phase that caused them.
const TRAILING_REQUESTS: Duration = Duration::from_secs(1);

/// How often the contender's TCP connections to the API server are counted during a workload.
const CONNECTION_SAMPLE_PERIOD: Duration = Duration::from_millis(250);

/// Who serves the drivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Contender {
    /// One Go external-attacher process per driver (the test tools' build; the report's first
    /// line names its version).
    Fleet,
    /// One attacher-hub process for all drivers (hub mode, `--config`).
    Hub,
}

impl Contender {
    /// Short tag for object names.
    fn tag(self) -> &'static str {
        match self {
            Contender::Fleet => "go",
            Contender::Hub => "hub",
        }
    }

    /// Row label in the report.
    pub(crate) fn label(self, drivers: usize) -> String {
        match self {
            Contender::Fleet => format!("{drivers} × external-attacher"),
            Contender::Hub => format!("attacher-hub, {drivers} drivers"),
        }
    }
}

/// What the drivers are asked to do once the contender is warm.
#[derive(Clone, Debug)]
pub(crate) enum Workload {
    /// Every driver gets `per_driver` VAs at once; all attach, then all are deleted.
    Uniform {
        /// VAs per driver.
        per_driver: usize,
    },
    /// Driver 0 gets `noisy` VAs at once; `delay` later each other driver
    /// gets `quiet`. Measured: the quiet drivers' attach latency.
    Noisy {
        /// VAs of the noisy driver.
        noisy: usize,
        /// VAs of each quiet driver.
        quiet: usize,
        /// Between the start of the noisy driver's VAs and the quiet ones.
        delay: Duration,
    },
    /// Every driver gets `per_driver` VAs at once; once all are attached, `detach` of them
    /// (taken from the drivers in turn) are deleted; the others stay until the clean-up.
    Partial {
        /// VAs per driver.
        per_driver: usize,
        /// VAs deleted after the attaches, over all drivers.
        detach: usize,
    },
    /// Nothing beyond the warm-up: idle memory, watches, and the API
    /// requests of `window` doing nothing.
    Idle {
        /// How long the idle requests are counted.
        window: Duration,
    },
}

impl Workload {
    /// Measured VAs of driver `i`.
    fn vas_of(&self, i: usize) -> usize {
        match *self {
            Workload::Uniform { per_driver } | Workload::Partial { per_driver, .. } => per_driver,
            Workload::Noisy { noisy, .. } if i == 0 => noisy,
            Workload::Noisy { quiet, .. } => quiet,
            Workload::Idle { .. } => 0,
        }
    }
}

/// Everything one run needs to know.
#[derive(Clone, Debug)]
pub(crate) struct RunSpec {
    /// Short configuration ID, used in object names (`a`, `b`, ...).
    pub(crate) id: String,
    /// Number of drivers.
    pub(crate) drivers: usize,
    /// Flags given to every contender (each Go sidecar and the hub).
    pub(crate) flags: Vec<String>,
    /// Flags given to the hub only (the process-wide cap).
    pub(crate) hub_flags: Vec<String>,
    /// The workload.
    pub(crate) workload: Workload,
    /// Pause after the warm-up, before idle readings and the workload.
    pub(crate) settle: Duration,
    /// Limit for the attaches (and for the detaches) of the workload; a run
    /// that hits it is reported as incomplete, with lower bounds.
    pub(crate) timeout: Duration,
    /// Restart a Go sidecar that exits (it does when it loses its Lease) a second later, as
    /// the kubelet restarts a container, instead of failing the run.
    pub(crate) restart: bool,
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    /// Processes of the contender.
    pub(crate) processes: usize,
    /// What the workload cost kube-apiserver and etcd.
    pub(crate) plane: crate::control_plane::Cost,
    /// Measured VAs (all of a uniform run; the quiet drivers' of a noisy one).
    pub(crate) vas: usize,
    /// Measured VAs per second, from the first one seen to the last one attached (uniform runs).
    pub(crate) throughput: Option<f64>,
    /// Attach latency quantiles in seconds (VA seen → seen attached).
    pub(crate) p50: Option<f64>,
    /// See `p50`.
    pub(crate) p99: Option<f64>,
    /// Seconds from the first delete to the last VA gone (uniform and partial runs).
    pub(crate) detach: Option<f64>,
    /// CPU seconds of the contender's processes during the workload.
    pub(crate) cpu: f64,
    /// CPU seconds of the API server during the workload, if its PID is known.
    pub(crate) apiserver_cpu: Option<f64>,
    /// Sum of the processes' peak RSS (VmHWM) in MiB, read at the end.
    pub(crate) peak_rss: f64,
    /// Sum of the processes' RSS in MiB after the warm-up and the pause.
    pub(crate) idle_rss: f64,
    /// Watches the contender holds on the API server (after the warm-up).
    pub(crate) watches: f64,
    /// TCP connections the contender's processes hold to the API server after the warm-up.
    pub(crate) idle_connections: f64,
    /// The most TCP connections the contender's processes held to the API server at once
    /// during the workload (sampled every [`CONNECTION_SAMPLE_PERIOD`]).
    pub(crate) connections: f64,
    /// The contender's API requests while the VAs attached (idle runs: during the window).
    pub(crate) attach_requests: BTreeMap<RequestKind, f64>,
    /// The contender's API requests while the VAs were detached and deleted.
    pub(crate) detach_requests: BTreeMap<RequestKind, f64>,
    /// Seconds from the first create to the last attach (uniform runs),
    /// until the quiet drivers were done (noisy runs), or the idle window.
    pub(crate) attach_window: f64,
    /// Idle runs: seconds between the two readings of the API server's counters that the
    /// window's requests are counted between (a little longer than the window; 0 otherwise).
    pub(crate) requests_window: f64,
    /// Idle runs: writes to the Leases of the run's namespace during the window, by Lease
    /// (from a watch), and the seconds they were counted over.
    pub(crate) lease_writes: Option<(BTreeMap<String, usize>, f64)>,
    /// Idle runs: the contender's requests during the window, by kind, from the API server's
    /// audit log ([`crate::periodic`]), and its drivers' ListVolumes calls (`CSI ListVolumes`).
    pub(crate) periodic: BTreeMap<String, usize>,
    /// ControllerPublishVolume calls for the workload's VAs (the noisy driver's included).
    pub(crate) publishes: usize,
    /// Of those, calls beyond the first for the same volume and node.
    pub(crate) duplicate_publishes: usize,
    /// ControllerUnpublishVolume calls answered OK for the workload's VAs.
    pub(crate) unpublishes: usize,
    /// Of those, calls beyond the first for the same volume and node (each VA is detached
    /// once; a second successful call comes from a stale copy of a detached VA).
    pub(crate) duplicate_unpublishes: usize,
    /// Noisy runs: the noisy driver's VAs attached when the quiet ones were done.
    pub(crate) noisy_attached: Option<usize>,
    /// Why the run did not complete (a timeout); its figures are lower bounds.
    pub(crate) incomplete: Option<String>,
    /// Times a contender stopped leading a driver because it lost the Lease (from its log,
    /// before it is stopped).
    pub(crate) lease_losses: usize,
}

impl Sample {
    /// Contender API writes per second while the VAs attached.
    pub(crate) fn write_rate(&self) -> f64 {
        let writes: f64 = self
            .attach_requests
            .iter()
            .filter(|(k, _)| k.is_write())
            .map(|(_, v)| v)
            .sum();
        if self.attach_window > 0.0 {
            writes / self.attach_window
        } else {
            0.0
        }
    }
}

/// One VA of a run and its PV.
#[derive(Clone, Debug)]
struct Planned {
    va: String,
    pv: String,
    driver: usize,
    volume: String,
}

/// Runs `spec` with `contender` and measures it.
/// A `drivers.yaml` in `dir` naming every mock's socket; its path.
pub(crate) fn write_drivers_yaml(dir: &Path, mocks: &[MockProcess]) -> std::path::PathBuf {
    let file = dir.join("drivers.yaml");
    let mut yaml = String::from("drivers:\n");
    for m in mocks {
        yaml.push_str(&format!(
            "  - address: unix://{}\n    name: {}\n",
            m.socket().display(),
            m.driver
        ));
    }
    std::fs::write(&file, yaml).expect("write drivers.yaml");
    file
}

/// The hub binary to run: this build's, or `BENCH_HUB_BIN` (another build of the hub, e.g.
/// the code before a change).
pub(crate) fn hub_bin() -> String {
    std::env::var("BENCH_HUB_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_attacher-hub").to_string())
}

pub(crate) async fn run(cluster: &Cluster, contender: Contender, spec: &RunSpec) -> Sample {
    let client = cluster.client().await;
    let run = unique_name(&format!("{}-{}", spec.id, contender.tag()));
    let drivers: Vec<String> = (0..spec.drivers)
        .map(|i| unique_driver_name(&format!("{}{}", spec.id, i)))
        .collect();

    // 1. Drivers, node, PVs.
    let mocks = join_all(
        drivers
            .iter()
            .enumerate()
            .map(|(i, d)| MockProcess::start(d, spec.workload.vas_of(i) + 1)),
    )
    .await;
    let node = format!("{run}-node");
    let node_ids: Vec<(String, String)> =
        drivers.iter().map(|d| (d.clone(), node.clone())).collect();
    create_node_with_drivers(&client, &node, &node_ids).await;
    let warm: Vec<Planned> = (0..spec.drivers)
        .map(|i| {
            let va = format!("{run}-d{i}-warm");
            Planned {
                pv: format!("{va}-pv"),
                va,
                driver: i,
                volume: format!("vol-{}", spec.workload.vas_of(i)),
            }
        })
        .collect();
    let measured: Vec<Planned> = (0..spec.drivers)
        .flat_map(|i| {
            let run = run.clone();
            (0..spec.workload.vas_of(i)).map(move |j| {
                let va = format!("{run}-d{i}-{j}");
                Planned {
                    pv: format!("{va}-pv"),
                    va,
                    driver: i,
                    volume: format!("vol-{j}"),
                }
            })
        })
        .collect();
    let all: Vec<&Planned> = warm.iter().chain(&measured).collect();
    stream::iter(&all)
        .for_each_concurrent(CONCURRENCY, |p| {
            let client = client.clone();
            let driver = drivers[p.driver].clone();
            async move {
                PvBuilder::new(&p.pv, &driver, &p.volume)
                    .create(&client)
                    .await;
            }
        })
        .await;

    // 2. The latency clock.
    let timeline = Timeline::start(&client, &run).await;
    let baseline = ApiServerMetrics::scrape(&client).await;

    // 3. The contender, warm.
    let config_dir = tempfile::Builder::new()
        .prefix("ah-bench-")
        .tempdir()
        .expect("temporary directory");
    let mut processes = start(cluster, contender, spec, &mocks, config_dir.path());
    create_vas(&client, &warm, &node, &drivers, &run).await;
    let warm_names: Vec<String> = warm.iter().map(|p| p.va.clone()).collect();
    let deadline = Instant::now() + START_TIMEOUT;
    while let Err(e) = timeline
        .wait(&warm_names, Duration::from_millis(500), |t| {
            t.attached.is_some()
        })
        .await
    {
        assert_running(&mut processes);
        assert!(
            Instant::now() < deadline,
            "{contender:?} did not attach the warm-up VAs of config {} within {START_TIMEOUT:?}: {e}",
            spec.id
        );
    }
    tokio::time::sleep(spec.settle).await;
    assert_running(&mut processes);
    let pids = workers(&processes);
    let mut sample = Sample {
        processes: pids.len(),
        idle_rss: pids.iter().map(|p| status_mib(*p, "VmRSS:")).sum(),
        ..Sample::default()
    };
    // Watches: the median of a few readings, as a watch being re-opened shows twice or not at all.
    let mut readings = Vec::new();
    // The counters are read while the scrape is answered: the midpoint of the request.
    let mut m0_at = Instant::now();
    for _ in 0..WATCH_READINGS {
        let before = Instant::now();
        readings.push(ApiServerMetrics::scrape(&client).await);
        m0_at = before + before.elapsed() / 2;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    sample.watches = median_of(readings.iter().map(|m| m.watches - baseline.watches));
    let m0 = readings.pop().expect("WATCH_READINGS > 0");
    let api_port = api_port(cluster);
    sample.idle_connections = connections_of(&pids, api_port) as f64;
    let connections = ConnectionSampler::start(pids.clone(), api_port);
    let apiserver = apiserver_pid(cluster);
    let cpu0: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    let apiserver_cpu0 = apiserver.map_or(0.0, cpu_seconds);

    let lease_writes = match spec.workload {
        Workload::Idle { .. } => Some(LeaseWrites::start(&client).await),
        _ => None,
    };

    // 4. The workload, and what it costs the control plane.
    let plane =
        crate::control_plane::Window::open(crate::control_plane::Plane::of(cluster), &client).await;
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let list_volumes0 = match spec.workload {
        Workload::Idle { .. } => list_volumes(&mocks).await,
        _ => 0,
    };
    match spec.workload {
        Workload::Uniform { .. } | Workload::Partial { .. } => {
            let names: Vec<String> = measured.iter().map(|p| p.va.clone()).collect();
            // What is deleted after the attaches: all, or `detach` taken from the drivers in turn.
            let doomed: Vec<String> = match spec.workload {
                Workload::Partial { per_driver, detach } => (0..per_driver)
                    .flat_map(|j| (0..spec.drivers).map(move |i| i * per_driver + j))
                    .take(detach)
                    .map(|k| names[k].clone())
                    .collect(),
                _ => names.clone(),
            };
            create_vas(&client, &measured, &node, &drivers, &run).await;
            if let Err(e) = timeline
                .wait_running(&mut processes, &names, spec.timeout, |t| {
                    t.attached.is_some()
                })
                .await
            {
                sample.incomplete = Some(format!("attach: {e}"));
            }
            sample.attach_window = started.elapsed().as_secs_f64();
            tokio::time::sleep(TRAILING_REQUESTS).await;
            let m1 = ApiServerMetrics::scrape(&client).await;
            sample.attach_requests = contender_requests(&m1.requests_since(&m0));
            let times = timeline.times(&names);
            sample.vas = names.len();
            latencies(&mut sample, &times);
            let first = times.iter().filter_map(|t| t.added).min();
            let last = times.iter().filter_map(|t| t.attached).max();
            if let (Some(first), Some(last)) = (first, last) {
                sample.throughput =
                    Some(names.len() as f64 / last.duration_since(first).as_secs_f64());
            }

            let deleting = Instant::now();
            delete_all::<VolumeAttachment>(&client, &doomed).await;
            match timeline
                .wait_running(&mut processes, &doomed, spec.timeout, |t| {
                    t.deleted.is_some()
                })
                .await
            {
                Ok(()) => sample.detach = Some(deleting.elapsed().as_secs_f64()),
                Err(e) => {
                    sample.detach = Some(deleting.elapsed().as_secs_f64());
                    let prior = sample.incomplete.take();
                    sample.incomplete =
                        Some(prior.map_or(format!("detach: {e}"), |p| format!("{p}; detach: {e}")));
                }
            }
            tokio::time::sleep(TRAILING_REQUESTS).await;
            let m2 = ApiServerMetrics::scrape(&client).await;
            sample.detach_requests = contender_requests(&m2.requests_since(&m1));
        }
        Workload::Noisy { delay, .. } => {
            let (noisy, quiet): (Vec<Planned>, Vec<Planned>) =
                measured.iter().cloned().partition(|p| p.driver == 0);
            let quiet_names: Vec<String> = quiet.iter().map(|p| p.va.clone()).collect();
            tokio::join!(create_vas(&client, &noisy, &node, &drivers, &run), async {
                tokio::time::sleep_until((started + delay).into()).await;
                create_vas(&client, &quiet, &node, &drivers, &run).await;
            });
            if let Err(e) = timeline
                .wait_running(&mut processes, &quiet_names, spec.timeout, |t| {
                    t.attached.is_some()
                })
                .await
            {
                sample.incomplete = Some(format!("quiet drivers: {e}"));
            }
            sample.attach_window = started.elapsed().as_secs_f64();
            let m1 = ApiServerMetrics::scrape(&client).await;
            sample.attach_requests = contender_requests(&m1.requests_since(&m0));
            let noisy_names: Vec<String> = noisy.iter().map(|p| p.va.clone()).collect();
            sample.noisy_attached = Some(
                timeline
                    .times(&noisy_names)
                    .iter()
                    .filter(|t| t.attached.is_some())
                    .count(),
            );
            sample.vas = quiet_names.len();
            latencies(&mut sample, &timeline.times(&quiet_names));
        }
        Workload::Idle { window } => {
            tokio::time::sleep(window).await;
            sample.attach_window = started.elapsed().as_secs_f64();
            sample.periodic = crate::periodic::audited(started_at, std::time::SystemTime::now());
            let list_volumes = list_volumes(&mocks).await - list_volumes0;
            if list_volumes > 0 {
                sample
                    .periodic
                    .insert("CSI ListVolumes".to_string(), list_volumes);
            }
            sample.lease_writes = lease_writes.map(LeaseWrites::stop);
            let before = Instant::now();
            let m1 = ApiServerMetrics::scrape(&client).await;
            let m1_at = before + before.elapsed() / 2;
            sample.requests_window = m1_at.duration_since(m0_at).as_secs_f64();
            sample.attach_requests = contender_requests(&m1.requests_since(&m0));
        }
    }
    sample.plane = plane
        .close(&client, crate::control_plane::Baseline::of_run())
        .await;
    sample.connections = connections.stop() as f64;
    // A sidecar restarted by its loop (`spec.restart`) is read as the process that runs now.
    let pids = workers(&processes);
    sample.cpu = (pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu0).max(0.0);
    sample.apiserver_cpu = apiserver.map(|p| cpu_seconds(p) - apiserver_cpu0);
    sample.peak_rss = pids.iter().map(|p| status_mib(*p, "VmHWM:")).sum();
    assert_running(&mut processes);

    // 5. Call records, then clean up.
    let warm_volumes: HashSet<(usize, &str)> =
        warm.iter().map(|p| (p.driver, p.volume.as_str())).collect();
    for (i, mock) in mocks.iter().enumerate() {
        let calls = mock.calls().await;
        let publishes: Vec<(String, String)> = calls
            .iter()
            .filter(|c| c.method == "ControllerPublishVolume")
            .filter(|c| !warm_volumes.contains(&(i, c.volume_id.as_str())))
            .map(|c| (c.volume_id.clone(), c.node_id.clone()))
            .collect();
        let distinct: BTreeSet<&(String, String)> = publishes.iter().collect();
        sample.publishes += publishes.len();
        sample.duplicate_publishes += publishes.len() - distinct.len();
        let unpublishes: Vec<(String, String)> = calls
            .iter()
            .filter(|c| c.method == "ControllerUnpublishVolume" && c.code.as_deref() == Some("Ok"))
            .filter(|c| !warm_volumes.contains(&(i, c.volume_id.as_str())))
            .map(|c| (c.volume_id.clone(), c.node_id.clone()))
            .collect();
        let distinct: BTreeSet<&(String, String)> = unpublishes.iter().collect();
        sample.unpublishes += unpublishes.len();
        sample.duplicate_unpublishes += unpublishes.len() - distinct.len();
    }
    let lost = match contender {
        Contender::Fleet => GO_LEASE_LOST,
        Contender::Hub => HUB_LEASE_LOST,
    };
    sample.lease_losses = processes.iter().map(|p| p.count_in_output(lost)).sum();
    join_all(processes.iter_mut().map(ChildProcess::stop)).await;
    let mut mocks = mocks;
    join_all(mocks.iter_mut().map(MockProcess::stop)).await;
    drop(timeline);
    let vas: Vec<String> = all.iter().map(|p| p.va.clone()).collect();
    let pvs: Vec<String> = all.iter().map(|p| p.pv.clone()).collect();
    remove_all::<VolumeAttachment>(&Api::all(client.clone()), &vas).await;
    remove_all::<PersistentVolume>(&Api::all(client.clone()), &pvs).await;
    remove_all::<CSINode>(&Api::all(client.clone()), std::slice::from_ref(&node)).await;
    remove_all::<Node>(&Api::all(client.clone()), std::slice::from_ref(&node)).await;
    let leases: Vec<String> = drivers
        .iter()
        .map(|d| format!("external-attacher-leader-{}", sanitize_driver_name(d)))
        .collect();
    remove_all::<Lease>(&Api::namespaced(client.clone(), LEASE_NAMESPACE), &leases).await;
    sample
}

/// What the Go external-attacher logs when it loses its Lease (then it exits).
const GO_LEASE_LOST: &str = "Stopped leading";

/// What the hub logs when a driver's Lease is lost.
const HUB_LEASE_LOST: &str = "stopped leading: lost the lease";

/// A Go sidecar run again a second after it exits, until it is stopped (SIGTERM stops the one
/// running); its arguments follow.
const RESTART_LOOP: &str = "trap 'kill $pid 2>/dev/null; exit 0' TERM INT; \
    while :; do \"$0\" \"$@\" & pid=$!; wait $pid; sleep 1; done";

/// The processes that do the contender's work: each process itself, or, for a Go sidecar
/// under [`RESTART_LOOP`], the sidecar its shell runs now (reading the shell gave its 2 MiB and
/// no CPU for every sidecar).
fn workers(processes: &[ChildProcess]) -> Vec<u32> {
    processes
        .iter()
        .filter_map(ChildProcess::id)
        .flat_map(|p| {
            let children =
                std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
            let children: Vec<u32> = children
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect();
            if children.is_empty() {
                vec![p]
            } else {
                children
            }
        })
        .collect()
}

/// Readings of the watch gauge per run.
const WATCH_READINGS: usize = 3;

fn median_of(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The API server's PID, from `apiserver.pid` next to the admin kubeconfig
/// (where `scripts/cluster-up.sh` writes both).
fn apiserver_pid(cluster: &Cluster) -> Option<u32> {
    let dir = cluster.kubeconfig.parent()?;
    std::fs::read_to_string(dir.join("apiserver.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The API server's port, from the `server:` line of the kubeconfig the contenders use.
fn api_port(cluster: &Cluster) -> u16 {
    let text = std::fs::read_to_string(&cluster.attacher_kubeconfig).expect("read the kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server:"))
        .expect("a server line in the kubeconfig")
        .trim()
        .to_owned();
    let uri: http::Uri = server.parse().expect("the server is a URL");
    uri.port_u16().unwrap_or(443)
}

/// TCP connections `pids` hold to `port` now.
fn connections_of(pids: &[u32], port: u16) -> usize {
    pids.iter().map(|p| tcp_connections_to(*p, port)).sum()
}

/// Counts the contender's connections to the API server while the workload runs and keeps the
/// most seen at once.
struct ConnectionSampler {
    /// The most seen so far.
    most: Arc<std::sync::atomic::AtomicUsize>,
    /// The sampling task.
    task: tokio::task::JoinHandle<()>,
}

impl ConnectionSampler {
    fn start(pids: Vec<u32>, port: u16) -> Self {
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = most.clone();
        let task = tokio::spawn(async move {
            loop {
                let now = connections_of(&pids, port);
                seen.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(CONNECTION_SAMPLE_PERIOD).await;
            }
        });
        Self { most, task }
    }

    /// Stops sampling; the most connections seen at once.
    fn stop(self) -> usize {
        self.task.abort();
        self.most.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// ListVolumes calls the drivers have had so far, all of them together.
async fn list_volumes(mocks: &[MockProcess]) -> usize {
    let mut n = 0;
    for mock in mocks {
        n += mock
            .calls()
            .await
            .iter()
            .filter(|c| c.method == "ListVolumes")
            .count();
    }
    n
}

/// Counts the writes to the Leases of [`LEASE_NAMESPACE`] while an idle window runs, one per
/// watch event (every create, update and delete of a Lease is one event). The API server's
/// request counters cannot tell whose Lease a write was: they count its own identity Lease in
/// `kube-system` too (6 a minute, multiplied with a scaled fleet's figures), and name no Lease
/// when a figure looks high.
struct LeaseWrites {
    /// Writes seen so far, by Lease name.
    seen: Arc<Mutex<BTreeMap<String, usize>>>,
    /// The watching task.
    task: tokio::task::JoinHandle<()>,
    /// When counting started (the watch had been opened).
    since: Instant,
}

impl LeaseWrites {
    /// Starts counting from the namespace's current state.
    async fn start(client: &Client) -> LeaseWrites {
        let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        let mut version = api
            .list_metadata(&kube::api::ListParams::default().limit(1))
            .await
            .unwrap_or_else(|e| panic!("listing the Leases of {LEASE_NAMESPACE}: {e}"))
            .metadata
            .resource_version
            .expect("a list has a resourceVersion");
        let seen: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let shared = seen.clone();
        let task = tokio::spawn(async move {
            use kube::core::WatchEvent;
            loop {
                let params = kube::api::WatchParams::default().timeout(290);
                let mut events = match api.watch(&params, &version).await {
                    Ok(events) => events.boxed(),
                    Err(e) => panic!("watching the Leases of {LEASE_NAMESPACE}: {e}"),
                };
                while let Some(event) = events.next().await {
                    let (lease, rv) = match event {
                        Ok(
                            WatchEvent::Added(l) | WatchEvent::Modified(l) | WatchEvent::Deleted(l),
                        ) => {
                            let rv = l.metadata.resource_version.clone();
                            (l.metadata.name, rv)
                        }
                        Ok(WatchEvent::Bookmark(b)) => (None, Some(b.metadata.resource_version)),
                        Ok(WatchEvent::Error(e)) => {
                            panic!("the Lease watch of an idle window ended: {e}")
                        }
                        Err(e) => panic!("the Lease watch of an idle window failed: {e}"),
                    };
                    if let Some(name) = lease {
                        *shared
                            .lock()
                            .expect("lease writes lock")
                            .entry(name)
                            .or_default() += 1;
                    }
                    if let Some(rv) = rv {
                        version = rv;
                    }
                }
            }
        });
        LeaseWrites {
            seen,
            task,
            since: Instant::now(),
        }
    }

    /// Stops counting: the writes seen, by Lease, and the seconds counted over. Panics if the
    /// watch failed during the window (its task panicked): its count would be short, in the
    /// contender's favour.
    fn stop(self) -> (BTreeMap<String, usize>, f64) {
        let seconds = self.since.elapsed().as_secs_f64();
        assert!(
            !self.task.is_finished(),
            "the Lease watch of the idle window failed (see its panic above); the window's Lease \
             writes cannot be counted"
        );
        self.task.abort();
        let seen = std::mem::take(&mut *self.seen.lock().expect("lease writes lock"));
        (seen, seconds)
    }
}

/// Starts the contender's processes.
fn start(
    cluster: &Cluster,
    contender: Contender,
    spec: &RunSpec,
    mocks: &[MockProcess],
    dir: &Path,
) -> Vec<ChildProcess> {
    let kubeconfig = format!("--kubeconfig={}", cluster.attacher_kubeconfig.display());
    match contender {
        Contender::Fleet => mocks
            .iter()
            .map(|m| {
                let mut cmd = if spec.restart {
                    let mut sh = Command::new("sh");
                    sh.args(["-c", RESTART_LOOP])
                        .arg(cluster.bin("csi-attacher"));
                    sh
                } else {
                    Command::new(cluster.bin("csi-attacher"))
                };
                cmd.arg(&kubeconfig)
                    .arg(format!("--csi-address={}", m.socket().display()))
                    .arg(format!("--leader-election-namespace={LEASE_NAMESPACE}"))
                    .args(&spec.flags);
                ChildProcess::spawn("csi-attacher", cmd)
            })
            .collect(),
        Contender::Hub => {
            let file = write_drivers_yaml(dir, mocks);
            let mut cmd = Command::new(hub_bin());
            cmd.arg(&kubeconfig)
                .arg(format!("--config={}", file.display()))
                .arg(format!("--leader-election-namespace={LEASE_NAMESPACE}"))
                .args(&spec.flags)
                .args(&spec.hub_flags);
            vec![ChildProcess::spawn("attacher-hub", cmd)]
        }
    }
}

/// Panics (showing the logs) if a contender process has exited.
fn assert_running(processes: &mut [ChildProcess]) {
    for p in processes {
        if let Some(status) = p.exited() {
            panic!("a contender process exited during the run ({status})");
        }
    }
}

/// Resources an attacher touches (its RBAC, `docs/design.md#rbac`). Requests on others come
/// from the API server itself (its own informers' watches end and are counted).
const ATTACHER_RESOURCES: &[&str] = &[
    "volumeattachments",
    "persistentvolumes",
    "csinodes",
    "leases",
    "secrets",
    "events",
];

/// The requests the contender made: requests on the resources an attacher
/// uses, except the benchmark's own (during a workload it only creates and
/// deletes VAs, and reads `/metrics`, a non-resource path; its watch stays
/// open and so is not counted). Nothing else writes during a run.
fn contender_requests(delta: &BTreeMap<RequestKind, f64>) -> BTreeMap<RequestKind, f64> {
    delta
        .iter()
        .filter(|(k, _)| ATTACHER_RESOURCES.contains(&k.resource.as_str()))
        .filter(|(k, _)| {
            !(k.resource == "volumeattachments"
                && k.subresource.is_empty()
                && (k.verb == "POST" || k.verb == "DELETE"))
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// Fills the latency quantiles; a VA not attached counts with its time so far
/// (a lower bound; the run is then marked incomplete by the caller).
fn latencies(sample: &mut Sample, times: &[Times]) {
    let now = Instant::now();
    let mut l: Vec<f64> = times
        .iter()
        .filter_map(|t| {
            let added = t.added?;
            Some(
                t.attached
                    .unwrap_or(now)
                    .duration_since(added)
                    .as_secs_f64(),
            )
        })
        .collect();
    if l.is_empty() {
        return;
    }
    l.sort_by(f64::total_cmp);
    sample.p50 = Some(quantile(&l, 0.50));
    sample.p99 = Some(quantile(&l, 0.99));
}

/// Nearest-rank quantile of sorted `v` (not empty).
pub(crate) fn quantile(v: &[f64], q: f64) -> f64 {
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Creates the VAs of `plan` on `node`, labelled with `run`, many at a time.
async fn create_vas(client: &Client, plan: &[Planned], node: &str, drivers: &[String], run: &str) {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    stream::iter(plan)
        .for_each_concurrent(CONCURRENCY, |p| {
            let api = api.clone();
            let mut obj = va(&p.va, &drivers[p.driver], node, &p.pv);
            obj.metadata.labels = Some(BTreeMap::from([(RUN_LABEL.to_string(), run.to_string())]));
            async move {
                api.create(&PostParams::default(), &obj)
                    .await
                    .unwrap_or_else(|e| panic!("creating VA {}: {e}", p.va));
            }
        })
        .await;
}

/// Deletes the named objects, many at a time (missing ones are fine).
async fn delete_all<K>(client: &Client, names: &[String])
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    stream::iter(names)
        .for_each_concurrent(CONCURRENCY, |n| {
            let api = api.clone();
            async move {
                match api.delete(n, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => panic!("deleting {n}: {e}"),
                }
            }
        })
        .await;
}

/// Removes the named objects for good: finalizers cleared, then deleted.
pub(crate) async fn remove_all<K>(api: &Api<K>, names: &[String])
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let clear = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    stream::iter(names)
        .for_each_concurrent(CONCURRENCY, |n| {
            let clear = &clear;
            async move {
                match api.patch(n, &PatchParams::default(), clear).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => return,
                    Err(e) => panic!("clearing the finalizers of {n}: {e}"),
                }
                match api.delete(n, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => panic!("deleting {n}: {e}"),
                }
            }
        })
        .await;
}

/// When one VA was seen, seen attached and seen deleted by the watch.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Times {
    /// First seen (its creation, as the watch delivers it).
    pub(crate) added: Option<Instant>,
    /// First seen with `status.attached=true`.
    pub(crate) attached: Option<Instant>,
    /// Seen deleted (or missing from a re-list).
    pub(crate) deleted: Option<Instant>,
}

/// Timestamps of every VA of one run, from one label-selected watch.
pub(crate) struct Timeline {
    times: Arc<Mutex<HashMap<String, Times>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    /// Starts watching the VAs labelled `run`; returns once the watch has listed.
    pub(crate) async fn start(client: &Client, run: &str) -> Timeline {
        let times: Arc<Mutex<HashMap<String, Times>>> = Arc::default();
        let shared = times.clone();
        let mut listed: HashSet<String> = HashSet::new();
        let on_error = OnWatchError {
            log: Some("bench: VA watch error (it retries)"),
            pause: Duration::ZERO,
        };
        let labels = format!("{RUN_LABEL}={run}");
        let task = watch_vas(
            client,
            &labels,
            "VA watch",
            Duration::from_secs(60),
            on_error,
            move |event| {
                let now = Instant::now();
                let mut times = shared.lock().expect("timeline lock");
                match event {
                    watcher::Event::Init => listed.clear(),
                    watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
                        let name = obj.metadata.name.clone().unwrap_or_default();
                        listed.insert(name.clone());
                        let t = times.entry(name).or_default();
                        t.added.get_or_insert(now);
                        if obj.status.as_ref().is_some_and(|s| s.attached) {
                            t.attached.get_or_insert(now);
                        }
                    }
                    watcher::Event::Delete(obj) => {
                        let name = obj.metadata.name.clone().unwrap_or_default();
                        times.entry(name).or_default().deleted.get_or_insert(now);
                    }
                    watcher::Event::InitDone => {
                        // A re-list after a broken watch: what it lacks is gone.
                        for (name, t) in times.iter_mut() {
                            if !listed.contains(name) {
                                t.deleted.get_or_insert(now);
                            }
                        }
                    }
                }
            },
        )
        .await;
        Timeline { times, task }
    }

    /// The times of `names`, in order (defaults for VAs never seen).
    pub(crate) fn times(&self, names: &[String]) -> Vec<Times> {
        let times = self.times.lock().expect("timeline lock");
        names
            .iter()
            .map(|n| times.get(n).copied().unwrap_or_default())
            .collect()
    }

    /// Waits until `done` holds for every VA in `names`.
    pub(crate) async fn wait(
        &self,
        names: &[String],
        timeout: Duration,
        done: impl Fn(&Times) -> bool,
    ) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let left = self.times(names).iter().filter(|t| !done(t)).count();
            if left == 0 {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "{left} of {} VAs not done within {timeout:?}",
                    names.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// [`Timeline::wait`], checking every [`PROCESS_CHECK`] that the contender's processes
    /// still run (panicking, with their logs, if one has exited): a Go sidecar that loses its
    /// Lease exits, and the VAs of its driver would otherwise be waited for until the phase's
    /// limit.
    pub(crate) async fn wait_running(
        &self,
        processes: &mut [ChildProcess],
        names: &[String],
        timeout: Duration,
        done: impl Fn(&Times) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self
                .wait(names, left.min(PROCESS_CHECK), &done)
                .await
                .is_ok()
            {
                return Ok(());
            }
            assert_running(processes);
            if left <= PROCESS_CHECK {
                let left = self.times(names).iter().filter(|t| !done(t)).count();
                return Err(format!(
                    "{left} of {} VAs not done within {timeout:?}",
                    names.len()
                ));
            }
        }
    }
}

/// How often [`Timeline::wait_running`] looks at the contender's processes.
const PROCESS_CHECK: Duration = Duration::from_secs(1);

impl Drop for Timeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The API server's raw write rate on this machine: merge PATCHes on VAs (of
/// a driver nobody serves) with no client-side limit, `concurrency` requests
/// in flight (each on its own VA), for `seconds`. Writes per second.
pub(crate) async fn raw_write_rate(client: &Client, seconds: f64, concurrency: usize) -> f64 {
    let run = unique_name("raw");
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let names: Vec<String> = (0..concurrency).map(|i| format!("{run}-{i}")).collect();
    stream::iter(&names)
        .for_each_concurrent(CONCURRENCY, |n| {
            let api = api.clone();
            let obj = va(n, "raw.bench.csi.test", "nowhere", "nothing");
            async move {
                api.create(&PostParams::default(), &obj)
                    .await
                    .unwrap_or_else(|e| panic!("creating VA {n}: {e}"));
            }
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let counts = join_all(names.iter().map(|n| {
        let api = api.clone();
        async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                let patch = Patch::Merge(serde_json::json!({
                    "metadata": {"annotations": {"bench.attacher-hub/seq": done.to_string()}}
                }));
                api.patch(n, &PatchParams::default(), &patch)
                    .await
                    .unwrap_or_else(|e| panic!("patching VA {n}: {e}"));
                done += 1;
            }
            done
        }
    }))
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    remove_all(&api, &names).await;
    counts.iter().sum::<u64>() as f64 / elapsed
}

/// Creates `count` VAs and PVs of a driver nobody serves (so that every
/// contender caches them); returns their names for [`remove_extra`].
pub(crate) async fn create_extra(client: &Client, count: usize) -> (Vec<String>, Vec<String>) {
    let run = unique_name("extra");
    let driver = unique_driver_name("unserved");
    let vas: Vec<String> = (0..count).map(|i| format!("{run}-{i}")).collect();
    let pvs: Vec<String> = vas.iter().map(|v| format!("{v}-pv")).collect();
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    stream::iter(vas.iter().zip(&pvs))
        .for_each_concurrent(CONCURRENCY, |(v, p)| {
            let api = api.clone();
            let client = client.clone();
            let driver = driver.clone();
            async move {
                PvBuilder::new(p, &driver, &format!("h-{v}"))
                    .create(&client)
                    .await;
                api.create(&PostParams::default(), &va(v, &driver, "nowhere", p))
                    .await
                    .unwrap_or_else(|e| panic!("creating VA {v}: {e}"));
            }
        })
        .await;
    (vas, pvs)
}

/// Removes what [`create_extra`] created.
pub(crate) async fn remove_extra(client: &Client, (vas, pvs): &(Vec<String>, Vec<String>)) {
    delete_all::<VolumeAttachment>(client, vas).await;
    delete_all::<PersistentVolume>(client, pvs).await;
}

/// Gives the attachers' identity (`system:serviceaccount:default:csi-attacher`) the
/// cross-namespace Lease guard's grant as attacher-hub ships it
/// (`deploy/components/lease-guard`, its ClusterRole bound to that ServiceAccount): every
/// shipped overlay has it, so the hub measured here makes the guard's LISTs it makes when
/// deployed. The Go sidecars never list Leases outside their namespace, so the grant changes
/// nothing of theirs.
pub(crate) async fn grant_lease_guard(client: &Client) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/components/lease-guard");
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
    };
    let role: ClusterRole =
        serde_saphyr::from_str(&read("clusterrole.yaml")).expect("the shipped ClusterRole parses");
    let mut binding: ClusterRoleBinding = serde_saphyr::from_str(&read("clusterrolebinding.yaml"))
        .expect("the shipped ClusterRoleBinding parses");
    for subject in binding.subjects.iter_mut().flatten() {
        subject.name = "csi-attacher".into();
        subject.namespace = Some(LEASE_NAMESPACE.into());
    }
    apply_cluster_scoped(client, &role).await;
    apply_cluster_scoped(client, &binding).await;
}

/// Server-side applies the cluster-scoped `object` as the benchmark.
async fn apply_cluster_scoped<K>(client: &Client, object: &K)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().expect("the object has a name");
    Api::<K>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("attacher-hub-bench").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|err| panic!("applying {} {name}: {err}", K::kind(&())));
}
