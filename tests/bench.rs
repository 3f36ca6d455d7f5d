//! Benchmark: N drivers served by one attacher-hub against the same N drivers
//! served by N Go external-attacher v4.13.0 sidecars (the fleet it replaces).
//!
//! Not part of `cargo test` (ignored); `make bench` builds it in release mode,
//! starts a fresh control plane (`tests/bench/run.sh`), runs it and prints a
//! Markdown report, also written to `target/bench-report.md`. Both
//! contenders get the same flags, the same Rust mock driver (one process per
//! driver socket) and the same control plane; they run one after the other
//! (never together: the API server, etcd, the mocks and the contender share
//! the machine's cores), interleaved, and the report gives medians.
//!
//! Configurations (see `docs/benchmarks.md` for the thresholds):
//! * a: the seed manifest's flags unchanged (QPS 5, burst 10), 10 × 20 VAs;
//! * b: QPS 100 / burst 200, 10 × 100 VAs;
//! * c: no client-side limit (`--kube-api-qps=-1`, which client-go reads as
//!   "no rate limiter"), 10 × 100 VAs;
//! * d: noisy neighbour at QPS 5 / 10: one driver gets 500 VAs at once, the
//!   nine others 5 each a second later; the quiet drivers' latency counts;
//! * e1, e2 (hub only): d with a process-wide cap equal to the fleet's total,
//!   and with a cap that binds;
//! * f: idle memory and watches with 5,000 extra VAs and PVs in the cluster;
//! * squeeze (`bench/squeeze.rs`): API Priority and Fairness squeezes the attachers' identity;
//! * startup, scale-objects, scale-drivers (`bench/scale.rs`): start-up with 50,000
//!   VAs and PVs, and the scale curve over objects (1,000 to 100,000) and drivers (1 to 100),
//!   drawn in `target/bench-scale.svg`.
//!
//! Sizes and repeats come from the environment (`BENCH_*`, listed in
//! [`Knobs::from_env`]); `BENCH_CAP=0` skips e1 and e2; `BENCH_HUB_BIN` runs
//! another build of the hub (e.g. the code before a change).

mod hub;
mod support;

#[path = "bench/control_plane.rs"]
mod control_plane;
#[path = "bench/periodic.rs"]
mod periodic;
#[path = "bench/plot.rs"]
mod plot;
#[path = "bench/report.rs"]
mod report;
#[path = "bench/scale.rs"]
mod scale;
#[path = "bench/scale_report.rs"]
mod scale_report;
#[path = "bench/scenario.rs"]
mod scenario;
#[path = "bench/squeeze.rs"]
mod squeeze;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use report::{ConfigResult, Context};
use scenario::{Contender, RunSpec, Workload};
use support::Cluster;

/// Requests in flight while measuring the API server's raw write rate: the
/// best of these levels counts (too few leave cores idle, too many contend).
const RAW_CONCURRENCY: &[usize] = &[8, 32, 128];

/// A run's time beyond its phases' limits: set-up, warm-up, clean-up.
const RUN_OVERHEAD: Duration = Duration::from_secs(600);

/// Benchmark sizes and switches, from `BENCH_*` environment variables.
#[derive(Clone, Debug)]
struct Knobs {
    /// `BENCH_CONFIGS`: comma-separated configuration IDs to run (default all).
    configs: Vec<String>,
    /// `BENCH_REPEATS`: runs per contender and configuration (3).
    repeats: usize,
    /// `BENCH_DRIVERS`: drivers (10).
    drivers: usize,
    /// `BENCH_A_VAS`: VAs per driver in a (20).
    a_vas: usize,
    /// `BENCH_B_VAS`: VAs per driver in b and c (100).
    b_vas: usize,
    /// `BENCH_NOISY_VAS`: VAs of the noisy driver (500).
    noisy_vas: usize,
    /// `BENCH_QUIET_VAS`: VAs of each quiet driver (5).
    quiet_vas: usize,
    /// `BENCH_NOISY_DELAY_MS`: quiet VAs come this long after the noisy ones (1000).
    noisy_delay: Duration,
    /// `BENCH_IDLE_EXTRA`: extra VAs and PVs in the cluster for f (5000).
    idle_extra: usize,
    /// `BENCH_CAP`: 0 skips the configurations with a process-wide cap (1).
    cap: bool,
    /// `BENCH_TIGHT_QPS` / `BENCH_TIGHT_BURST`: the cap of e2 (10 / 20).
    tight_cap: (f64, u32),
    /// `BENCH_RAW_SECONDS`: how long the raw write rate is measured (10).
    raw_seconds: f64,
    /// `BENCH_SETTLE_SECS`: pause after the warm-up (3); f uses `BENCH_IDLE_SETTLE_SECS` (8).
    settle: Duration,
    /// See `settle`.
    idle_settle: Duration,
    /// `BENCH_IDLE_WINDOW_SECS`: f counts the idle API requests this long (10).
    idle_window: Duration,
    /// `BENCH_TIMEOUT_SECS`: limit of each attach or detach phase (600).
    timeout: Duration,
    /// `BENCH_STRICT=1`: fail the test when a check fails.
    strict: bool,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

impl Knobs {
    fn from_env() -> Knobs {
        let configs: String = env_or(
            "BENCH_CONFIGS",
            "a,b,bp,c,d,e1,e2,f,startup,scale-objects,scale-drivers,squeeze".to_string(),
        );
        Knobs {
            configs: configs
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            repeats: env_or("BENCH_REPEATS", 3usize).max(1),
            drivers: env_or("BENCH_DRIVERS", 10usize).max(2),
            a_vas: env_or("BENCH_A_VAS", 20),
            b_vas: env_or("BENCH_B_VAS", 100),
            noisy_vas: env_or("BENCH_NOISY_VAS", 500),
            quiet_vas: env_or("BENCH_QUIET_VAS", 5),
            noisy_delay: Duration::from_millis(env_or("BENCH_NOISY_DELAY_MS", 1000)),
            idle_extra: env_or("BENCH_IDLE_EXTRA", 5000),
            cap: env_or("BENCH_CAP", 1u8) != 0,
            tight_cap: (
                env_or("BENCH_TIGHT_QPS", 10.0),
                env_or("BENCH_TIGHT_BURST", 20),
            ),
            raw_seconds: env_or("BENCH_RAW_SECONDS", 10.0),
            settle: Duration::from_secs_f64(env_or("BENCH_SETTLE_SECS", 3.0)),
            idle_settle: Duration::from_secs_f64(env_or("BENCH_IDLE_SETTLE_SECS", 8.0)),
            idle_window: Duration::from_secs_f64(env_or("BENCH_IDLE_WINDOW_SECS", 10.0)),
            timeout: Duration::from_secs(env_or("BENCH_TIMEOUT_SECS", 600)),
            strict: env_or("BENCH_STRICT", 0u8) != 0,
        }
    }
}

/// The seed manifest's flags: leader election on, a short first retry, the
/// default client-side budget (QPS 5, burst 10).
fn seed_flags() -> Vec<String> {
    vec![
        "--leader-election=true".into(),
        "--retry-interval-start=500ms".into(),
    ]
}

fn with(mut flags: Vec<String>, more: &[String]) -> Vec<String> {
    flags.extend_from_slice(more);
    flags
}

/// One configuration to run.
struct Config {
    id: &'static str,
    title: String,
    spec: RunSpec,
    contenders: Vec<Contender>,
    /// Extra VAs and PVs in the cluster while it runs.
    extra: usize,
    /// Set when it cannot run here.
    not_run: Option<String>,
}

fn configs(k: &Knobs, hub_has_cap: bool) -> Vec<Config> {
    let n = k.drivers;
    let spec = |id: &str, flags: Vec<String>, hub_flags: Vec<String>, workload| RunSpec {
        id: id.to_string(),
        drivers: n,
        flags,
        hub_flags,
        workload,
        settle: k.settle,
        timeout: k.timeout,
        restart: false,
    };
    let noisy = Workload::Noisy {
        noisy: k.noisy_vas,
        quiet: k.quiet_vas,
        delay: k.noisy_delay,
    };
    let both = vec![Contender::Fleet, Contender::Hub];
    // The fleet's total budget: N sidecars at the default 5 QPS / burst 10.
    let fleet_cap = vec![
        format!("--hub-kube-api-qps={}", 5 * n),
        format!("--hub-kube-api-burst={}", 10 * n),
    ];
    let tight_cap = vec![
        format!("--hub-kube-api-qps={}", k.tight_cap.0),
        format!("--hub-kube-api-burst={}", k.tight_cap.1),
    ];
    let cap_not_run = if !k.cap {
        Some("BENCH_CAP=0".to_string())
    } else if !hub_has_cap {
        Some(
            "this attacher-hub has no --hub-kube-api-qps (per-driver budgets not merged yet)"
                .into(),
        )
    } else {
        None
    };
    let raised = [
        "--kube-api-qps=100".to_string(),
        "--kube-api-burst=200".to_string(),
    ];
    // client-go (rest.Config): a negative QPS means no rate limiter; the hub reads any QPS <= 0 so.
    let unlimited = ["--kube-api-qps=-1".to_string()];
    let mut out = vec![
        Config {
            id: "a",
            title: "seed flags (QPS 5 / burst 10)".into(),
            spec: spec(
                "a",
                seed_flags(),
                vec![],
                Workload::Uniform {
                    per_driver: k.a_vas,
                },
            ),
            contenders: both.clone(),
            extra: 0,
            not_run: None,
        },
        Config {
            id: "b",
            title: "raised QPS (100 / 200)".into(),
            spec: spec(
                "b",
                with(seed_flags(), &raised),
                vec![],
                Workload::Uniform {
                    per_driver: k.b_vas,
                },
            ),
            contenders: both.clone(),
            extra: 0,
            not_run: None,
        },
        Config {
            id: report::PACED,
            title: format!(
                "b at the Go fleet's pace (the hub's process-wide cap set to the fleet's write rate in {})",
                report::PACED_LIKE
            ),
            // The cap comes from the fleet's figures of the same run, when it is reached.
            spec: spec(
                report::PACED,
                with(seed_flags(), &raised),
                vec![],
                Workload::Uniform {
                    per_driver: k.b_vas,
                },
            ),
            contenders: vec![Contender::Hub],
            extra: 0,
            not_run: cap_not_run.clone(),
        },
        Config {
            id: "c",
            title: "no client-side limit".into(),
            spec: spec(
                "c",
                with(seed_flags(), &unlimited),
                vec![],
                Workload::Uniform {
                    per_driver: k.b_vas,
                },
            ),
            contenders: both.clone(),
            extra: 0,
            not_run: None,
        },
        Config {
            id: "d",
            title: "noisy neighbour, per-driver budgets (5 / 10)".into(),
            spec: spec("d", seed_flags(), vec![], noisy.clone()),
            contenders: both.clone(),
            extra: 0,
            not_run: None,
        },
        Config {
            id: "e1",
            title: format!(
                "noisy neighbour, hub cap = fleet total ({} / {})",
                5 * n,
                10 * n
            ),
            spec: spec("e1", seed_flags(), fleet_cap, noisy.clone()),
            contenders: vec![Contender::Hub],
            extra: 0,
            not_run: cap_not_run.clone(),
        },
        Config {
            id: "e2",
            title: format!(
                "noisy neighbour, binding hub cap ({} / {})",
                k.tight_cap.0, k.tight_cap.1
            ),
            spec: spec("e2", seed_flags(), tight_cap, noisy),
            contenders: vec![Contender::Hub],
            extra: 0,
            not_run: cap_not_run,
        },
        Config {
            id: "f",
            title: format!("idle, {} extra VAs + PVs", k.idle_extra),
            spec: RunSpec {
                settle: k.idle_settle,
                ..spec(
                    "f",
                    seed_flags(),
                    vec![],
                    Workload::Idle {
                        window: k.idle_window,
                    },
                )
            },
            contenders: both,
            extra: k.idle_extra,
            not_run: None,
        },
    ];
    for c in &mut out {
        if c.not_run.is_none() && !k.configs.iter().any(|id| id == c.id) {
            c.not_run = Some("not in BENCH_CONFIGS".into());
        }
    }
    out
}

/// Whether this attacher-hub has the process-wide cap flags (the per-driver
/// budget change).
fn hub_knows_cap_flags() -> bool {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .arg("--help")
        .output()
        .expect("run attacher-hub --help");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.contains("hub-kube-api-qps")
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(String::new(), |kib| {
            format!(", {:.0} GiB", kib / 1024.0 / 1024.0)
        });
    format!("{cores} cores{mem}")
}

/// The reference attacher's, kube-apiserver's and etcd's versions as their binaries print them
/// (a `TESTBINS_PROFILE` run uses another release's), e.g. `external-attacher v4.13.0 ·
/// kube-apiserver v1.37.2 + etcd v3.7.3`.
fn tool_versions(testbins: &Path) -> String {
    let version = |tool: &str, pick: fn(&str) -> Option<String>| {
        std::process::Command::new(testbins.join(tool))
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| pick(&String::from_utf8_lossy(&o.stdout)))
            .unwrap_or_else(|| "(version unknown)".to_string())
    };
    // `<path> v4.13.0`, `Kubernetes v1.37.2`, `etcd Version: 3.7.3`.
    let last_word = |out: &str| {
        out.lines()
            .next()?
            .split_whitespace()
            .last()
            .map(str::to_owned)
    };
    let etcd = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("etcd Version:"))
            .map(|v| format!("v{}", v.trim()))
    };
    format!(
        "external-attacher {} · kube-apiserver {} + etcd {}",
        version("csi-attacher", last_word),
        version("kube-apiserver", last_word),
        version("etcd", etcd)
    )
}

fn hub_version() -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::process::Command::new("git")
        .args([
            "-C",
            &repo.display().to_string(),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .map_or_else(
            || env!("CARGO_PKG_VERSION").to_string(),
            |c| format!("`{c}`"),
        )
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(String::new, |s| s.trim().to_string())
}

fn progress(c: Contender, s: &scenario::Sample) -> String {
    let f = |v: Option<f64>| v.map_or("—".into(), |x| format!("{x:.2}"));
    format!(
        "{c:?}: {} VAs, {} VA/s, p50 {} s, p99 {} s, detach {} s, CPU {:.2} s, peak {:.0} MiB, idle {:.0} MiB, watches {:.0}, publishes {} (dup {}), unpublishes {} (dup {}){}",
        s.vas,
        f(s.throughput),
        f(s.p50),
        f(s.p99),
        f(s.detach),
        s.cpu,
        s.peak_rss,
        s.idle_rss,
        s.watches,
        s.publishes,
        s.duplicate_publishes,
        s.unpublishes,
        s.duplicate_unpublishes,
        s.incomplete
            .as_ref()
            .map_or(String::new(), |w| format!(" INCOMPLETE: {w}"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with `make bench`"]
async fn one_hub_against_a_fleet_of_go_sidecars() {
    let started = Instant::now();
    let knobs = Knobs::from_env();
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let hub_has_cap = hub_knows_cap_flags();
    eprintln!("bench: {knobs:?}; hub has the cap flags: {hub_has_cap}");

    scenario::grant_lease_guard(&client).await;

    let mut raw = Vec::new();
    for &c in RAW_CONCURRENCY {
        let seconds = knobs.raw_seconds / RAW_CONCURRENCY.len() as f64;
        let rate = scenario::raw_write_rate(&client, seconds, c).await;
        eprintln!("bench: raw write rate with {c} in flight: {rate:.0} PATCH/s");
        raw.push((c, rate));
    }
    let (raw_concurrency, raw_writes) = raw
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("RAW_CONCURRENCY is not empty");

    // What the control plane spends with nothing of the benchmark running.
    control_plane::Baseline::init(cluster).await;

    let mut results = Vec::new();
    for mut config in configs(&knobs, hub_has_cap) {
        if config.id == report::PACED && config.not_run.is_none() {
            match report::fleet_write_rate(&results, report::PACED_LIKE) {
                Some(rate) => {
                    let rate = rate.round().max(1.0);
                    config.spec.hub_flags = vec![
                        format!("--hub-kube-api-qps={rate}"),
                        format!("--hub-kube-api-burst={rate}"),
                    ];
                }
                None => {
                    config.not_run = Some(format!(
                        "needs {}'s Go fleet from the same run (BENCH_CONFIGS)",
                        report::PACED_LIKE
                    ));
                }
            }
        }
        let mut result = ConfigResult {
            id: config.id.to_string(),
            title: config.title.clone(),
            spec: config.spec.clone(),
            extra: config.extra,
            samples: BTreeMap::new(),
            not_run: config.not_run.clone(),
        };
        if config.not_run.is_none() {
            let extra = if config.extra > 0 {
                let t = Instant::now();
                let e = scenario::create_extra(&client, config.extra).await;
                eprintln!(
                    "bench: {} extra VAs + PVs created in {:.1} s",
                    config.extra,
                    t.elapsed().as_secs_f64()
                );
                Some(e)
            } else {
                None
            };
            for rep in 0..knobs.repeats {
                let mut order = config.contenders.clone();
                if rep % 2 == 1 {
                    order.reverse();
                }
                for c in order {
                    let t = Instant::now();
                    // Each phase has its own limit; this one catches a run stuck on a
                    // control plane that died (its processes are killed on drop).
                    let limit = knobs.timeout * 3 + RUN_OVERHEAD;
                    let sample = tokio::time::timeout(limit, scenario::run(cluster, c, &config.spec))
                        .await
                        .unwrap_or_else(|_| {
                            panic!(
                                "config {} run {} ({c:?}) did not finish within {limit:?}: is the control plane \
                                 still up? (logs next to {})",
                                config.id,
                                rep + 1,
                                cluster.kubeconfig.display()
                            )
                        });
                    eprintln!(
                        "bench: {} run {}/{} ({:.0} s) {}",
                        config.id,
                        rep + 1,
                        knobs.repeats,
                        t.elapsed().as_secs_f64(),
                        progress(c, &sample)
                    );
                    result.samples.entry(c).or_default().push(sample);
                }
            }
            if let Some(extra) = extra {
                scenario::remove_extra(&client, &extra).await;
            }
        }
        results.push(result);
    }

    // Start-up at scale and the scale curve (bench/scale.rs).
    let scale_knobs = scale::ScaleKnobs::from_env();
    let mut scale_results = scale::ScaleResults::default();
    let wants = |id: &str| knobs.configs.iter().any(|c| c == id);
    if wants("startup") {
        scale::startup(cluster, &scale_knobs, &mut scale_results).await;
    }
    if wants("scale-objects") {
        scale::objects_sweep(cluster, &scale_knobs, &mut scale_results).await;
    }
    if wants("scale-drivers") {
        scale::drivers_sweep(cluster, &scale_knobs, &mut scale_results).await;
    }

    // API Priority and Fairness squeezes the attachers (bench/squeeze.rs).
    let squeezed = if wants("squeeze") {
        Some(squeeze::bench_section(cluster, knobs.repeats, knobs.timeout, knobs.settle).await)
    } else {
        None
    };

    let ctx = Context {
        date: utc_now(),
        machine: machine(),
        hub_version: hub_version(),
        versions: tool_versions(&cluster.testbins),
        hub_has_cap,
        repeats: knobs.repeats,
        drivers: knobs.drivers,
        raw_writes,
        raw_concurrency,
        tight_cap: knobs.tight_cap,
        duration: started.elapsed(),
    };
    let mut checks = report::checks(&results, &ctx);
    let scale_checks = scale_report::checks(&scale_results);
    let mut md = report::render(&results, &checks, &ctx);
    md.push_str(&scale_report::render(&scale_results, &scale_checks));
    if let Some(section) = &squeezed {
        md.push_str(section);
    }
    checks.extend(scale_checks);
    // Where cargo builds (`CARGO_TARGET_DIR` included), as `tests/bench/run.sh` expects.
    let target_dir = support::target_dir();
    if let Some(svg) = plot::svg(&scale_results) {
        let file = target_dir.join("bench-scale.svg");
        std::fs::write(&file, svg).expect("write target/bench-scale.svg");
        md.push_str("\nThe scale curve: `target/bench-scale.svg`.\n");
        eprintln!("bench: scale curve drawn in {}", file.display());
    }
    println!("\n{md}");
    let target = target_dir.join("bench-report.md");
    std::fs::write(&target, &md).expect("write target/bench-report.md");
    eprintln!("bench: report written to {}", target.display());
    if knobs.strict {
        let failed: Vec<&str> = checks
            .iter()
            .filter(|c| c.pass == Some(false))
            .map(|c| c.what.as_str())
            .collect();
        assert!(failed.is_empty(), "failed checks: {failed:?}");
    }
}

// The pure parts of the benchmark, checked by `cargo test` (cheap, no cluster).

#[test]
fn medians_and_quantiles() {
    assert_eq!(report::median([3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(report::median([4.0, 1.0, 2.0, 3.0]), Some(2.5));
    assert_eq!(report::median(Vec::<f64>::new()), None);
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(scenario::quantile(&v, 0.5), 50.0);
    assert_eq!(scenario::quantile(&v, 0.99), 99.0);
    assert_eq!(scenario::quantile(&[7.0], 0.99), 7.0);
}

#[test]
fn api_server_counters_are_read_by_verb_resource_and_subresource() {
    let text = r#"# HELP apiserver_request_total Counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="storage.k8s.io",resource="volumeattachments",scope="resource",subresource="status",verb="PATCH",version="v1"} 3
apiserver_request_total{code="404",component="apiserver",dry_run="",group="storage.k8s.io",resource="volumeattachments",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 1
apiserver_longrunning_requests{component="apiserver",group="storage.k8s.io",resource="volumeattachments",scope="cluster",subresource="",verb="WATCH",version="v1"} 4
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="exec",verb="CONNECT",version="v1"} 1
"#;
    let m = support::ApiServerMetrics::parse(text);
    let status = support::RequestKind {
        verb: "PATCH".into(),
        resource: "volumeattachments".into(),
        subresource: "status".into(),
    };
    assert_eq!(m.requests[&status], 5.0);
    assert_eq!(status.to_string(), "PATCH volumeattachments/status");
    assert!(status.is_write());
    assert_eq!(m.watches, 4.0);
    let before = support::ApiServerMetrics::parse(&text.replace("} 3", "} 1"));
    assert_eq!(m.requests_since(&before)[&status], 2.0);
}

#[test]
fn thresholds_pass_and_fail_on_the_right_side() {
    use scenario::Sample;
    let knobs = Knobs {
        configs: vec![],
        ..Knobs::from_env()
    };
    let sample = |throughput: f64, p99: f64, cpu: f64, detach_writes: f64| Sample {
        vas: 10,
        throughput: Some(throughput),
        p50: Some(p99 / 2.0),
        p99: Some(p99),
        cpu,
        detach_requests: BTreeMap::from([(
            support::RequestKind {
                verb: "PATCH".into(),
                resource: "volumeattachments".into(),
                subresource: String::new(),
            },
            detach_writes * 10.0,
        )]),
        ..Sample::default()
    };
    let result = |id: &str, fleet: Sample, hub: Sample| {
        let cfg = configs(&knobs, true)
            .into_iter()
            .find(|c| c.id == id)
            .expect("known config");
        ConfigResult {
            id: id.into(),
            title: cfg.title,
            spec: cfg.spec,
            extra: 0,
            samples: BTreeMap::from([(Contender::Fleet, vec![fleet]), (Contender::Hub, vec![hub])]),
            not_run: None,
        }
    };
    let ctx = Context {
        date: String::new(),
        machine: String::new(),
        hub_version: String::new(),
        versions: String::new(),
        hub_has_cap: true,
        repeats: 1,
        drivers: 10,
        raw_writes: 1000.0,
        raw_concurrency: 32,
        tight_cap: (10.0, 20),
        duration: Duration::ZERO,
    };
    let results = vec![
        // a: hub as fast and no slower: pass both.
        result(
            "a",
            sample(10.0, 2.0, 1.0, 2.0),
            sample(10.0, 2.0, 1.0, 1.0),
        ),
        // b: hub slower: fail.
        result("b", sample(10.0, 2.0, 1.0, 2.0), sample(9.0, 2.0, 1.0, 1.0)),
        // c: 1.3x and 0.25x exactly: pass both.
        result(
            "c",
            sample(10.0, 2.0, 4.0, 2.0),
            sample(13.0, 2.0, 1.0, 1.0),
        ),
    ];
    let checks = report::checks(&results, &ctx);
    let verdict = |prefix: &str| {
        checks
            .iter()
            .find(|c| c.what.starts_with(prefix))
            .unwrap_or_else(|| panic!("no check {prefix}"))
            .pass
    };
    assert_eq!(verdict("a: throughput"), Some(true));
    assert_eq!(verdict("a: p99"), Some(true));
    assert_eq!(verdict("b: throughput"), Some(false));
    assert_eq!(verdict("c: throughput"), Some(true));
    assert_eq!(verdict("c: CPU"), Some(true));
    assert_eq!(verdict("d:"), None, "d was not run");
    assert_eq!(verdict("b: API writes per detached VA"), Some(true));
    let md = report::render(&results, &checks, &ctx);
    assert!(
        md.contains("| **b** | hub / fleet | | | **0.90** |"),
        "{md}"
    );
}

/// The connection count of the report: a process's own established connections to one port.
#[test]
fn tcp_connections_to_counts_only_this_process_s_connections_to_the_port() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let me = std::process::id();
    use support::{tcp_connections_to, tcp_sockets};
    assert_eq!(tcp_connections_to(me, port), 0);
    let a = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let b = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    // The accepted ends are ours too, but their remote port is the clients'.
    let _accepted: Vec<_> = (0..2).map(|_| listener.accept().expect("accept")).collect();
    assert_eq!(tcp_connections_to(me, port), 2);
    let sockets = tcp_sockets(me);
    let ours = sockets
        .iter()
        .find(|s| Some(s.local) == a.local_addr().ok())
        .expect("the connection is listed");
    assert_eq!(ours.remote, listener.local_addr().expect("address"));
    drop((a, b));
}
