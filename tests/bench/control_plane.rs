//! The control plane's side of the bill: what a contender costs the API server and etcd while
//! it runs, measured on the benchmark's own control plane (`scripts/cluster-up.sh` writes the
//! processes' IDs into the cluster directory).
//!
//! A [`Window`] is opened before a contender starts and closed at the point the configuration
//! measures (start-up: every driver synced and idle). It reads:
//!
//! * the CPU seconds of kube-apiserver and etcd (`/proc/<pid>/stat`), less what the same
//!   processes spend in as long a stretch with no attacher running ([`Baseline`], measured once
//!   beside the contenders), so that the figure is the attachers' share;
//! * their peak RSS during the window above their RSS when it opened, sampled every
//!   [`SAMPLE_EVERY`] (the start-up's LIST responses and watch-cache reads are transient);
//! * from the API server's own metrics, on the attacher's resources (VolumeAttachments,
//!   PersistentVolumes, CSINodes, Leases): watch events sent and their bytes
//!   (`apiserver_watch_events_total`, `apiserver_watch_events_sizes_sum`), the bytes of LIST and
//!   of WATCH responses (`apiserver_response_sizes_sum`), and the requests the API server made
//!   to etcd for them (`etcd_requests_total`).
//!
//! * from the API server's log, the watches on those resources it cut off because their client
//!   fell behind (`Forcing ... watcher close due to unresponsiveness`: a watcher whose buffered
//!   events the client did not take in time; the client then watches again from where it was).
//!
//! Other clients of the control plane during a window (the benchmark's own watches) count in
//! both contenders' figures alike; the baseline removes only CPU.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::Client;

use crate::support::{Cluster, apiserver_metrics_text as metrics_text, cpu_seconds, status_mib};

/// How often the control plane's RSS is read during a window.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The resources of the attachers, as the API server's metrics label them.
const RESOURCES: [&str; 4] = [
    "volumeattachments",
    "persistentvolumes",
    "csinodes",
    "leases",
];

/// The control plane's processes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plane {
    apiserver: u32,
    etcd: u32,
}

impl Plane {
    /// The processes of `cluster`, from the pid files next to its kubeconfig.
    pub(crate) fn of(cluster: &Cluster) -> Plane {
        let dir = cluster
            .kubeconfig
            .parent()
            .expect("the kubeconfig lives in the cluster directory");
        let _ = APISERVER_LOG.set(dir.join("apiserver.log"));
        Plane {
            apiserver: pid(dir, "apiserver"),
            etcd: pid(dir, "etcd"),
        }
    }

    /// The API server's log, where it names the watches it cuts off.
    fn log() -> Option<&'static Path> {
        APISERVER_LOG.get().map(PathBuf::as_path)
    }

    fn cpu(self) -> (f64, f64) {
        (cpu_seconds(self.apiserver), cpu_seconds(self.etcd))
    }

    fn rss(self) -> (f64, f64) {
        (
            status_mib(self.apiserver, "VmRSS:"),
            status_mib(self.etcd, "VmRSS:"),
        )
    }
}

/// The API server's log of this run's control plane (one per benchmark run).
static APISERVER_LOG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// What the API server logs when it cuts off a watch whose client does not take its events.
const CUT_OFF: &str = "watcher close due to unresponsiveness";

/// Watches on the attachers' resources the API server cut off in `log` from byte `from` on.
fn cut_off_since(log: &Path, from: u64) -> f64 {
    use std::io::{Read, Seek};
    let Ok(mut file) = std::fs::File::open(log) else {
        return 0.0;
    };
    let mut text = String::new();
    if file.seek(std::io::SeekFrom::Start(from)).is_err() || file.read_to_string(&mut text).is_err()
    {
        return 0.0;
    }
    text.lines()
        .filter(|l| l.contains(CUT_OFF))
        .filter(|l| {
            RESOURCES
                .iter()
                .any(|r| l.contains(&format!("Forcing {r}")))
        })
        .count() as f64
}

fn pid(dir: &Path, name: &str) -> u32 {
    let file = dir.join(format!("{name}.pid"));
    std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no process ID in {}", file.display()))
}

/// What the control plane spends per second with no attacher running.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Baseline {
    /// kube-apiserver's CPU seconds per second.
    pub(crate) apiserver_cpu: f64,
    /// etcd's CPU seconds per second.
    pub(crate) etcd_cpu: f64,
}

/// The baseline of this benchmark run, measured once before the configurations.
static BASELINE: std::sync::OnceLock<Baseline> = std::sync::OnceLock::new();

impl Baseline {
    /// Measures the baseline of this run (once: later calls keep the first).
    pub(crate) async fn init(cluster: &Cluster) -> Baseline {
        if let Some(b) = BASELINE.get() {
            return *b;
        }
        let b = Baseline::measure(Plane::of(cluster), Duration::from_secs(20)).await;
        eprintln!("bench: the control plane at rest: {b:?}");
        *BASELINE.get_or_init(|| b)
    }

    /// The baseline [`init`](Self::init) measured; none (zero) before that.
    pub(crate) fn of_run() -> Baseline {
        BASELINE.get().copied().unwrap_or_default()
    }

    /// Measures `plane` over `window` with nothing of the benchmark's running.
    pub(crate) async fn measure(plane: Plane, window: Duration) -> Baseline {
        let (a0, e0) = plane.cpu();
        tokio::time::sleep(window).await;
        let (a1, e1) = plane.cpu();
        let secs = window.as_secs_f64();
        Baseline {
            apiserver_cpu: (a1 - a0) / secs,
            etcd_cpu: (e1 - e0) / secs,
        }
    }
}

/// The API server's counters on the attachers' resources.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Counters {
    watch_events: f64,
    watch_event_bytes: f64,
    list_bytes: f64,
    watch_bytes: f64,
    etcd_requests: f64,
}

impl Counters {
    pub(crate) async fn scrape(client: &Client) -> Counters {
        Counters::parse(&metrics_text(client).await)
    }

    /// The counters of a `/metrics` text, summed over the attachers' resources.
    pub(crate) fn parse(text: &str) -> Counters {
        let mut c = Counters::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let Some((name, labels)) = series.split_once('{') else {
                continue;
            };
            if !RESOURCES
                .iter()
                .any(|r| labels.contains(&format!("resource=\"{r}\"")))
            {
                continue;
            }
            match name {
                "apiserver_watch_events_total" => c.watch_events += value,
                "apiserver_watch_events_sizes_sum" => c.watch_event_bytes += value,
                "apiserver_response_sizes_sum" if labels.contains("verb=\"LIST\"") => {
                    c.list_bytes += value;
                }
                "apiserver_response_sizes_sum" if labels.contains("verb=\"WATCH\"") => {
                    c.watch_bytes += value;
                }
                "etcd_requests_total" => c.etcd_requests += value,
                _ => {}
            }
        }
        c
    }

    fn since(&self, before: &Counters) -> Counters {
        Counters {
            watch_events: self.watch_events - before.watch_events,
            watch_event_bytes: self.watch_event_bytes - before.watch_event_bytes,
            list_bytes: self.list_bytes - before.list_bytes,
            watch_bytes: self.watch_bytes - before.watch_bytes,
            etcd_requests: self.etcd_requests - before.etcd_requests,
        }
    }
}

/// What one window cost the control plane.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cost {
    /// Length of the window, seconds.
    pub(crate) seconds: f64,
    /// kube-apiserver CPU seconds above the baseline.
    pub(crate) apiserver_cpu: f64,
    /// etcd CPU seconds above the baseline.
    pub(crate) etcd_cpu: f64,
    /// kube-apiserver's highest RSS during the window above its RSS at the start, MiB.
    pub(crate) apiserver_peak_rss: f64,
    /// etcd's, likewise.
    pub(crate) etcd_peak_rss: f64,
    /// Watch events the API server sent on the attachers' resources.
    pub(crate) watch_events: f64,
    /// Their bytes.
    pub(crate) watch_event_bytes: f64,
    /// Bytes of LIST responses on the attachers' resources.
    pub(crate) list_bytes: f64,
    /// Bytes of WATCH responses (ended watches count when they end).
    pub(crate) watch_bytes: f64,
    /// Requests of the API server to etcd for the attachers' resources.
    pub(crate) etcd_requests: f64,
    /// Watches on those resources the API server cut off because their client fell behind.
    pub(crate) cut_off: f64,
}

impl Cost {
    /// The cost times `factor` (the window's length stays).
    pub(crate) fn scaled(&self, factor: f64) -> Cost {
        Cost {
            seconds: self.seconds,
            apiserver_cpu: self.apiserver_cpu * factor,
            etcd_cpu: self.etcd_cpu * factor,
            apiserver_peak_rss: self.apiserver_peak_rss * factor,
            etcd_peak_rss: self.etcd_peak_rss * factor,
            watch_events: self.watch_events * factor,
            watch_event_bytes: self.watch_event_bytes * factor,
            list_bytes: self.list_bytes * factor,
            watch_bytes: self.watch_bytes * factor,
            etcd_requests: self.etcd_requests * factor,
            cut_off: self.cut_off * factor,
        }
    }
}

/// A measurement of the control plane under way.
pub(crate) struct Window {
    plane: Plane,
    started: Instant,
    cpu: (f64, f64),
    rss: (f64, f64),
    counters: Counters,
    /// The length of the API server's log when the window opened.
    log_from: u64,
    /// Highest RSS seen so far, KiB, apiserver and etcd.
    peaks: Arc<[AtomicU64; 2]>,
    sampler: tokio::task::JoinHandle<()>,
}

impl Window {
    /// Opens a window on `plane`.
    pub(crate) async fn open(plane: Plane, client: &Client) -> Window {
        let counters = Counters::scrape(client).await;
        let rss = plane.rss();
        let kib = |mib: f64| (mib * 1024.0) as u64;
        let peaks = Arc::new([AtomicU64::new(kib(rss.0)), AtomicU64::new(kib(rss.1))]);
        let seen = Arc::clone(&peaks);
        let sampler = tokio::spawn(async move {
            loop {
                tokio::time::sleep(SAMPLE_EVERY).await;
                let (a, e) = plane.rss();
                seen[0].fetch_max(kib(a), Ordering::Relaxed);
                seen[1].fetch_max(kib(e), Ordering::Relaxed);
            }
        });
        Window {
            plane,
            started: Instant::now(),
            cpu: plane.cpu(),
            rss,
            counters,
            log_from: Plane::log()
                .and_then(|l| std::fs::metadata(l).ok())
                .map_or(0, |m| m.len()),
            peaks,
            sampler,
        }
    }

    /// Closes the window: its cost above `baseline`.
    pub(crate) async fn close(self, client: &Client, baseline: Baseline) -> Cost {
        let seconds = self.started.elapsed().as_secs_f64();
        let (a1, e1) = self.plane.cpu();
        self.sampler.abort();
        let counters = Counters::scrape(client).await.since(&self.counters);
        let peak = |i: usize| self.peaks[i].load(Ordering::Relaxed) as f64 / 1024.0;
        Cost {
            seconds,
            apiserver_cpu: (a1 - self.cpu.0 - baseline.apiserver_cpu * seconds).max(0.0),
            etcd_cpu: (e1 - self.cpu.1 - baseline.etcd_cpu * seconds).max(0.0),
            apiserver_peak_rss: (peak(0) - self.rss.0).max(0.0),
            etcd_peak_rss: (peak(1) - self.rss.1).max(0.0),
            watch_events: counters.watch_events,
            watch_event_bytes: counters.watch_event_bytes,
            list_bytes: counters.list_bytes,
            watch_bytes: counters.watch_bytes,
            etcd_requests: counters.etcd_requests,
            cut_off: Plane::log().map_or(0.0, |l| cut_off_since(l, self.log_from)),
        }
    }
}

/// Medians of `costs`, field by field.
pub(crate) fn median(costs: &[Cost]) -> Cost {
    let m = |f: &dyn Fn(&Cost) -> f64| {
        let mut v: Vec<f64> = costs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    Cost {
        seconds: m(&|c| c.seconds),
        apiserver_cpu: m(&|c| c.apiserver_cpu),
        etcd_cpu: m(&|c| c.etcd_cpu),
        apiserver_peak_rss: m(&|c| c.apiserver_peak_rss),
        etcd_peak_rss: m(&|c| c.etcd_peak_rss),
        watch_events: m(&|c| c.watch_events),
        watch_event_bytes: m(&|c| c.watch_event_bytes),
        list_bytes: m(&|c| c.list_bytes),
        watch_bytes: m(&|c| c.watch_bytes),
        etcd_requests: m(&|c| c.etcd_requests),
        cut_off: m(&|c| c.cut_off),
    }
}

/// The Markdown table of the control plane's cost per contender (rows in the given order),
/// with the ratio of each row to the first.
pub(crate) fn table(title: &str, rows: &[(String, Cost)]) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let _ = writeln!(md, "\n{title}\n");
    let _ = writeln!(
        md,
        "| contender | window (s) | API server CPU (s) | API server peak RSS (MiB) | etcd CPU (s) | etcd peak RSS (MiB) | etcd requests | watch events | watch event MiB | LIST MiB | WATCH MiB | watches cut off |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mib = |b: f64| b / (1024.0 * 1024.0);
    for (name, c) in rows {
        let _ = writeln!(
            md,
            "| {name} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} |",
            c.seconds,
            c.apiserver_cpu,
            c.apiserver_peak_rss,
            c.etcd_cpu,
            c.etcd_peak_rss,
            c.etcd_requests,
            c.watch_events,
            mib(c.watch_event_bytes),
            mib(c.list_bytes),
            mib(c.watch_bytes),
            c.cut_off,
        );
    }
    if let Some((first, base)) = rows.first() {
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}x", a / b)
            } else {
                "—".to_string()
            }
        };
        for (name, c) in &rows[1..] {
            let _ = writeln!(
                md,
                "| {name} / {first} | {} | **{}** | **{}** | {} | {} | **{}** | **{}** | {} | {} | {} | |",
                ratio(c.seconds, base.seconds),
                ratio(c.apiserver_cpu, base.apiserver_cpu),
                ratio(c.apiserver_peak_rss, base.apiserver_peak_rss),
                ratio(c.etcd_cpu, base.etcd_cpu),
                ratio(c.etcd_peak_rss, base.etcd_peak_rss),
                ratio(c.etcd_requests, base.etcd_requests),
                ratio(c.watch_events, base.watch_events),
                ratio(c.watch_event_bytes, base.watch_event_bytes),
                ratio(c.list_bytes, base.list_bytes),
                ratio(c.watch_bytes, base.watch_bytes),
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_off_watches_are_counted_from_the_windows_start_on_the_attachers_resources() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("apiserver.log");
        let line = |r: &str| {
            format!(
                "I1207 10:16:37.076443 12553 cache_watcher.go:214] Forcing {r}.storage.k8s.io \
                 watcher close due to unresponsiveness: key: \"/{r}/\", labels: \"\"\n"
            )
        };
        let before = line("volumeattachments");
        let after = [
            line("volumeattachments"),
            line("pods"),
            "I1207 other\n".into(),
        ]
        .concat();
        std::fs::write(&log, format!("{before}{after}")).expect("write");
        assert_eq!(cut_off_since(&log, before.len() as u64), 1.0);
        assert_eq!(cut_off_since(&log, 0), 2.0);
    }

    #[test]
    fn counters_sum_the_attachers_resources_only_and_split_list_from_watch_bytes() {
        let text = r#"
# HELP apiserver_watch_events_total x
apiserver_watch_events_total{group="storage.k8s.io",resource="volumeattachments",version="v1"} 10
apiserver_watch_events_total{group="",resource="pods",version="v1"} 1000
apiserver_watch_events_sizes_sum{group="",resource="persistentvolumes",version="v1"} 2048
apiserver_response_sizes_sum{component="apiserver",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="LIST",version="v1"} 300
apiserver_response_sizes_sum{component="apiserver",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="WATCH",version="v1"} 700
apiserver_response_sizes_sum{component="apiserver",group="",resource="persistentvolumes",scope="resource",subresource="",verb="GET",version="v1"} 5
etcd_requests_total{group="coordination.k8s.io",operation="update",resource="leases"} 4
etcd_requests_total{group="",operation="get",resource="configmaps"} 99
"#;
        let c = Counters::parse(text);
        let expected = Counters {
            watch_events: 10.0,
            watch_event_bytes: 2048.0,
            list_bytes: 300.0,
            watch_bytes: 700.0,
            etcd_requests: 4.0,
        };
        assert_eq!(c, expected);
    }
}
