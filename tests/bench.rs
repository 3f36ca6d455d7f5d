//! Benchmark: attacher-hub against the reference Go external-attacher, in one
//! run, on the same control plane, driver and settings.
//!
//! Not part of `cargo test` (ignored); run it with `make bench`, which builds
//! in release mode and prints a Markdown report (also written to
//! `target/bench-report.md`). The two attachers run one after the other,
//! never at the same time, because the API server, etcd and the driver share
//! the machine's cores with them.
//!
//! Measured per attacher:
//! * throughput: `BENCH_VAS` VolumeAttachments (default 300) created at once
//!   on a warm attacher; seconds until all are attached, then seconds until
//!   all are deleted (detached, finalizer removed);
//! * CPU seconds the attacher process used during that window, and its peak
//!   RSS (VmHWM);
//! * API writes (PATCH requests counted by the API server);
//! * memory for many drivers: `BENCH_DRIVERS` (default 5) drivers with a
//!   cache of `BENCH_CACHE` (default 1000) extra VAs and PVs: five Go
//!   sidecars (five processes) against one hub serving all five.

mod support;

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::VolumeAttachment};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use support::{Cluster, MockCsi, MockCsiOptions, PvBuilder};

const CONCURRENCY: usize = 32;
const QPS: &[&str] = &["--kube-api-qps=100", "--kube-api-burst=200"];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Impl {
    Go,
    Hub,
}

impl Impl {
    fn label(self) -> &'static str {
        match self {
            Impl::Go => "external-attacher v4.12.0 (Go)",
            Impl::Hub => "attacher-hub",
        }
    }
}

/// CPU seconds (user + system) of a process.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 here.
    (ticks(11) + ticks(12)) / 100.0
}

/// A `/proc/<pid>/status` value in MiB (`VmHWM`, `VmRSS`).
fn status_mib(pid: u32, key: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Requests the API server has served, by verb.
async fn api_requests(client: &Client) -> BTreeMap<String, f64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(vec![]).unwrap())
        .await
        .expect("apiserver metrics");
    let mut by_verb = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some(verb) = line
            .split("verb=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *by_verb.entry(verb.to_string()).or_insert(0.0) += value;
    }
    by_verb
}

fn start_attacher(cluster: &Cluster, which: Impl, socket: &Path) -> support::ChildProcess {
    match which {
        Impl::Go => {
            let mut args = QPS.to_vec();
            args.extend(["--worker-threads=10", "--v=2"]);
            support::start_reference_attacher(cluster, socket, &args)
        }
        Impl::Hub => {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
            cmd.arg(format!(
                "--kubeconfig={}",
                cluster.attacher_kubeconfig.display()
            ))
            .arg(format!("--csi-address={}", socket.display()))
            .args(QPS)
            .args(["--worker-threads=10", "--timeout=15s", "-v=2"]);
            support::ChildProcess::spawn("attacher-hub", cmd)
        }
    }
}

fn bench_va(name: &str, driver: &str, node: &str, pv: &str, run: &str) -> VolumeAttachment {
    let mut va = support::va(name, driver, node, pv);
    va.metadata.labels = Some(BTreeMap::from([("bench-run".to_string(), run.to_string())]));
    va
}

async fn count(api: &Api<VolumeAttachment>, run: &str) -> (usize, usize) {
    let list = api
        .list(&ListParams::default().labels(&format!("bench-run={run}")))
        .await
        .expect("list VAs");
    let attached = list
        .items
        .iter()
        .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
        .count();
    (list.items.len(), attached)
}

async fn wait_until(
    api: &Api<VolumeAttachment>,
    run: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(usize, usize) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let (total, attached) = count(api, run).await;
        if done(total, attached) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not done after {limit:?} ({attached}/{total} attached)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Throughput {
    attach: Duration,
    detach: Duration,
    cpu: f64,
    peak_rss: f64,
    patches: f64,
    gets: f64,
    publishes: usize,
}

async fn throughput(cluster: &Cluster, which: Impl, n: usize) -> Throughput {
    let client = cluster.client().await;
    let driver = support::unique_driver_name("bench");
    let run = support::unique_name("run");
    let mut mock = MockCsi::start(
        cluster,
        &driver,
        MockCsiOptions {
            volumes: n + 1,
            ..MockCsiOptions::default()
        },
    )
    .await;
    let node = support::unique_name("bench-node");
    support::create_node(&client, &node).await;
    support::create_csinode(&client, &node, &driver, mock.node_id()).await;
    let pvs: Vec<String> = (0..=n).map(|i| format!("{run}-pv-{i}")).collect();
    stream::iter(pvs.iter().zip(&mock.volumes))
        .for_each_concurrent(CONCURRENCY, |(pv, handle)| {
            let client = client.clone();
            let driver = driver.clone();
            async move {
                PvBuilder::new(pv, &driver, handle).create(&client).await;
            }
        })
        .await;

    let mut attacher = start_attacher(cluster, which, mock.socket());
    let pid = attacher.id().expect("attacher pid");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    // Warm-up: one VA, so that start-up is not measured.
    vas.create(
        &PostParams::default(),
        &bench_va(
            &format!("{run}-warm"),
            &driver,
            &node,
            &pvs[n],
            &format!("{run}-warm"),
        ),
    )
    .await
    .unwrap();
    wait_until(
        &vas,
        &format!("{run}-warm"),
        "warm-up",
        Duration::from_secs(120),
        |t, a| t == 1 && a == 1,
    )
    .await;

    let before_api = api_requests(&client).await;
    let cpu_before = cpu_seconds(pid);
    let publishes_before = mock.calls("ControllerPublishVolume");
    let started = Instant::now();
    stream::iter(0..n)
        .for_each_concurrent(CONCURRENCY, |i| {
            let vas = vas.clone();
            let va = bench_va(&format!("{run}-va-{i}"), &driver, &node, &pvs[i], &run);
            async move {
                vas.create(&PostParams::default(), &va).await.unwrap();
            }
        })
        .await;
    wait_until(&vas, &run, "attach", Duration::from_secs(600), |t, a| {
        t == n && a == n
    })
    .await;
    let attach = started.elapsed();
    let publishes = mock.calls("ControllerPublishVolume") - publishes_before;

    let started = Instant::now();
    stream::iter(0..n)
        .for_each_concurrent(CONCURRENCY, |i| {
            let vas = vas.clone();
            let name = format!("{run}-va-{i}");
            async move {
                vas.delete(&name, &DeleteParams::default()).await.unwrap();
            }
        })
        .await;
    wait_until(&vas, &run, "detach", Duration::from_secs(600), |t, _| {
        t == 0
    })
    .await;
    let detach = started.elapsed();
    let cpu = cpu_seconds(pid) - cpu_before;
    let after_api = api_requests(&client).await;
    let peak_rss = status_mib(pid, "VmHWM:");
    let delta = |verb: &str| {
        after_api.get(verb).copied().unwrap_or(0.0) - before_api.get(verb).copied().unwrap_or(0.0)
    };
    let patches = delta("PATCH");
    let gets = delta("GET");

    // Clean up: the warm-up VA and every PV (the attacher removes its finalizers).
    let _ = vas
        .delete(&format!("{run}-warm"), &DeleteParams::default())
        .await;
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    stream::iter(pvs.iter())
        .for_each_concurrent(CONCURRENCY, |pv| {
            let pv_api = pv_api.clone();
            async move {
                let _ = pv_api.delete(pv, &DeleteParams::default()).await;
            }
        })
        .await;
    attacher.stop().await;
    mock.driver_process.process.stop().await;
    Throughput {
        attach,
        detach,
        cpu,
        peak_rss,
        patches,
        gets,
        publishes,
    }
}

/// Idle memory of `k` drivers with a cache of `cache` foreign VAs and PVs.
async fn many_drivers_memory(cluster: &Cluster, which: Impl, k: usize) -> (f64, usize) {
    let mut mocks = Vec::new();
    for _ in 0..k {
        let driver = support::unique_driver_name("mem");
        mocks.push(MockCsi::start(cluster, &driver, MockCsiOptions::default()).await);
    }
    let mut processes = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    match which {
        Impl::Go => {
            for m in &mocks {
                processes.push(start_attacher(cluster, Impl::Go, m.socket()));
            }
        }
        Impl::Hub => {
            let file = dir.path().join("drivers.yaml");
            let mut yaml = String::from("drivers:\n");
            for m in &mocks {
                yaml.push_str(&format!("  - address: unix://{}\n", m.socket().display()));
            }
            std::fs::write(&file, yaml).unwrap();
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
            cmd.arg(format!(
                "--kubeconfig={}",
                cluster.attacher_kubeconfig.display()
            ))
            .arg(format!("--config={}", file.display()))
            .args(QPS)
            .arg("-v=2");
            processes.push(support::ChildProcess::spawn("attacher-hub", cmd));
        }
    }
    // Let every cache fill and settle.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let rss: f64 = processes
        .iter()
        .filter_map(|p| p.id())
        .map(|pid| status_mib(pid, "VmRSS:"))
        .sum();
    let count = processes.len();
    for mut p in processes {
        p.stop().await;
    }
    for mut m in mocks {
        m.driver_process.process.stop().await;
    }
    (rss, count)
}

async fn fill_cache(client: &Client, cache: usize) -> String {
    let run = support::unique_name("cache");
    let driver = support::unique_driver_name("unserved");
    stream::iter(0..cache)
        .for_each_concurrent(CONCURRENCY, |i| {
            let client = client.clone();
            let driver = driver.clone();
            let run = run.clone();
            async move {
                let pv = format!("{run}-pv-{i}");
                PvBuilder::new(&pv, &driver, &format!("h-{i}"))
                    .create(&client)
                    .await;
                let va = bench_va(&format!("{run}-va-{i}"), &driver, "nowhere", &pv, &run);
                Api::<VolumeAttachment>::all(client)
                    .create(&PostParams::default(), &va)
                    .await
                    .unwrap();
            }
        })
        .await;
    run
}

async fn drop_cache(client: &Client, run: &str, cache: usize) {
    stream::iter(0..cache)
        .for_each_concurrent(CONCURRENCY, |i| {
            let client = client.clone();
            async move {
                let _ = Api::<VolumeAttachment>::all(client.clone())
                    .delete(&format!("{run}-va-{i}"), &DeleteParams::default())
                    .await;
                let _ = Api::<PersistentVolume>::all(client)
                    .delete(&format!("{run}-pv-{i}"), &DeleteParams::default())
                    .await;
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with `make bench`"]
async fn go_external_attacher_versus_attacher_hub() {
    let cluster = Cluster::get();
    let n = env_usize("BENCH_VAS", 300);
    let k = env_usize("BENCH_DRIVERS", 5);
    let cache = env_usize("BENCH_CACHE", 1000);
    let mut report = String::new();
    report.push_str(&format!(
        "# attacher-hub benchmark\n\n{n} VolumeAttachments on one node of the Go mock driver, created at once on a warm attacher; \
         both attachers with `--kube-api-qps=100 --kube-api-burst=200 --worker-threads=10`, run one after the other on the same \
         local kube-apiserver. Machine: {} cores.\n\n",
        std::thread::available_parallelism().map_or(0, usize::from)
    ));

    let go = throughput(cluster, Impl::Go, n).await;
    let hub = throughput(cluster, Impl::Hub, n).await;
    report.push_str("| | attach all (s) | detach all (s) | CPU (s) | peak RSS (MiB) | API PATCHes | API GETs | ControllerPublish calls |\n|---|---|---|---|---|---|---|---|\n");
    for (which, t) in [(Impl::Go, &go), (Impl::Hub, &hub)] {
        report.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.0} | {:.0} | {} |\n",
            which.label(),
            t.attach.as_secs_f64(),
            t.detach.as_secs_f64(),
            t.cpu,
            t.peak_rss,
            t.patches,
            t.gets,
            t.publishes
        ));
    }
    let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { f64::NAN };
    report.push_str(&format!(
        "| **hub / Go** | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | | |\n\n",
        ratio(go.attach.as_secs_f64(), hub.attach.as_secs_f64()),
        ratio(go.detach.as_secs_f64(), hub.detach.as_secs_f64()),
        ratio(go.cpu, hub.cpu),
        ratio(go.peak_rss, hub.peak_rss),
        ratio(go.patches, hub.patches),
    ));

    println!("\n{report}");
    let client = cluster.client().await;
    let run = fill_cache(&client, cache).await;
    let (go_rss, go_procs) = many_drivers_memory(cluster, Impl::Go, k).await;
    let (hub_rss, hub_procs) = many_drivers_memory(cluster, Impl::Hub, k).await;
    drop_cache(&client, &run, cache).await;
    report.push_str(&format!(
        "Memory for {k} drivers with {cache} extra VAs and PVs in the cluster (RSS after 8 s idle):\n\n\
         | | processes | total RSS (MiB) |\n|---|---|---|\n\
         | {k} × external-attacher | {go_procs} | {go_rss:.1} |\n\
         | attacher-hub, {k} drivers | {hub_procs} | {hub_rss:.1} |\n\
         | **hub / Go** | | {:.2} |\n",
        ratio(go_rss, hub_rss)
    ));

    println!("\n{report}");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-report.md");
    std::fs::write(&target, &report).expect("write target/bench-report.md");
    assert_eq!(
        hub.publishes, n,
        "attacher-hub publishes each volume exactly once"
    );
}
