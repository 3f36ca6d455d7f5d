//! The API server squeezes the attachers' identity: a PriorityLevelConfiguration of
//! about 3 seats with one queue of 2, and a FlowSchema that puts every request of the
//! attacher's ServiceAccount in it (API Priority and Fairness, `flowcontrol.apiserver.k8s.io/v1`).
//! Then the Go fleet (one external-attacher per driver) and the hub, one after the other on the
//! same control plane and under the same squeeze, each serve 3 drivers: 300 VAs attached, then
//! 100 deleted.
//!
//! Measured per side: the requests the API server turned away (its own counter of rejections
//! for the FlowSchema, `apiserver_flowcontrol_rejected_requests_total`, so both sides are
//! counted the same way, over their whole run); the settle times; VAs never attached or never
//! gone; and Lease losses (a Lease of the side taken by another holder, or not renewed for
//! longer than its duration, from a watch of the Leases). For the hub, also what it shows of
//! the throttling: `/drivers`, its metrics, `attacher-hub status` and its log, read while it
//! runs.
//!
//! Used by `make faults` (tests/faults/faults.rs, where the comparison is asserted) and `make bench`
//! (one report row).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::scenario::{self, Contender, RunSpec, Sample, Workload};
use crate::support::Cluster;

/// Name of the FlowSchema, and the first part of the PriorityLevelConfiguration's (one per
/// side: the API server raises a level's `Retry-After` while it drops requests and lowers it
/// only as it drops more, so a side on a level the other side left would start with its
/// `Retry-After`).
pub(crate) const SQUEEZE: &str = "attacher-hub-squeeze";

/// The identity both sides use (`scripts/cluster-up.sh`'s attacher kubeconfig).
const ATTACHER_SA: (&str, &str) = ("default", "csi-attacher");

/// Nominal concurrency shares of the squeezed level: with the API server's default 600 seats
/// (400 + 200 in flight) shared with the built-in levels (245 shares in all), ceil(600 / 246)
/// = 3 seats; nothing lent or borrowed.
const SHARES: i32 = 1;

/// Drivers, VAs per driver, VAs deleted after the attaches: the run.
pub(crate) const DRIVERS: usize = 3;
pub(crate) const PER_DRIVER: usize = 100;
pub(crate) const DETACH: usize = 100;

/// Lease duration of both sides (the flags' default, the Go sidecar's): a Lease not renewed
/// for longer could have been taken.
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// How often the hub's `/drivers` and metrics are read during its run.
const POLL: Duration = Duration::from_millis(250);

/// The squeeze, in place until [`Squeeze::remove`].
pub(crate) struct Squeeze {
    client: Client,
    /// The level's name.
    level: String,
}

impl Squeeze {
    /// Creates a level of its own for `tag` and the FlowSchema (replacing leftovers of an
    /// earlier run) and waits until the API server uses them.
    pub(crate) async fn apply(client: &Client, tag: &str) -> Squeeze {
        let squeeze = Squeeze {
            client: client.clone(),
            level: format!("{SQUEEZE}-{tag}"),
        };
        squeeze.delete().await;
        let level_name = squeeze.level.clone();
        let level: PriorityLevelConfiguration = serde_json::from_value(json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration",
            "metadata": {"name": level_name},
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": SHARES,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {
                        "type": "Queue",
                        "queuing": {"queues": 1, "handSize": 1, "queueLengthLimit": 2}
                    }
                }
            }
        }))
        .expect("valid PriorityLevelConfiguration");
        let (ns, name) = ATTACHER_SA;
        let schema: FlowSchema = serde_json::from_value(json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": SQUEEZE},
            "spec": {
                "priorityLevelConfiguration": {"name": level_name},
                // Before the built-in service-accounts (9000) and catch-all (10000) schemas.
                "matchingPrecedence": 500,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [{
                    "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"namespace": ns, "name": name}}],
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true, "namespaces": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
                }]
            }
        }))
        .expect("valid FlowSchema");
        Api::<PriorityLevelConfiguration>::all(client.clone())
            .create(&PostParams::default(), &level)
            .await
            .unwrap_or_else(|e| panic!("creating PriorityLevelConfiguration {level_name}: {e}"));
        let schemas = Api::<FlowSchema>::all(client.clone());
        schemas
            .create(&PostParams::default(), &schema)
            .await
            .unwrap_or_else(|e| panic!("creating FlowSchema {SQUEEZE}: {e}"));
        // The API server's flow-control controller marks the schema not dangling once it has
        // taken it (and its level) in.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = schemas.get(SQUEEZE).await.expect("read FlowSchema");
            let taken = s
                .status
                .and_then(|st| st.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Dangling" && c.status.as_deref() == Some("False"));
            if taken {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the API server did not take FlowSchema {SQUEEZE} in within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        squeeze
    }

    async fn delete(&self) {
        let dp = DeleteParams::default();
        let _ = Api::<FlowSchema>::all(self.client.clone())
            .delete(SQUEEZE, &dp)
            .await;
        let levels = Api::<PriorityLevelConfiguration>::all(self.client.clone());
        let _ = levels.delete(&self.level, &dp).await;
        // Until the level is gone (a new one of the same name would be a new object, but the
        // API server's flow control could still hold the old one's state).
        for _ in 0..50 {
            if matches!(levels.get_opt(&self.level).await, Ok(None)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Takes the squeeze away.
    pub(crate) async fn remove(self) {
        self.delete().await;
    }
}

/// Requests the API server has turned away (429) for the FlowSchema so far, every reason
/// (queue full, timed out in the queue, ...).
pub(crate) async fn rejected(client: &Client) -> f64 {
    rejected_in(&crate::support::apiserver_metrics_text(client).await)
}

/// [`rejected`] from a `/metrics` text.
pub(crate) fn rejected_in(text: &str) -> f64 {
    let needle = format!("flow_schema=\"{SQUEEZE}\"");
    text.lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_rejected_requests_total{"))
        .filter(|l| l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One side's run under the squeeze.
#[derive(Debug)]
pub(crate) struct Side {
    /// Who.
    pub(crate) contender: Contender,
    /// The bench's measurements (settle times, completeness).
    pub(crate) sample: Sample,
    /// Requests the API server turned away with 429 during the run.
    pub(crate) rejected: f64,
    /// Leases lost: times a contender stopped leading because its Lease was lost (its log),
    /// and Leases taken by another holder or not renewed for longer than their duration (a
    /// watch).
    pub(crate) lease_losses: Vec<String>,
    /// How many times a Lease was lost: the more of the log's count and the watch's.
    pub(crate) lease_losses_count: usize,
    /// The hub only: what it showed of the throttling.
    pub(crate) shown: Option<Shown>,
}

/// What the hub showed of the throttling while it ran.
#[derive(Debug, Default, Clone)]
pub(crate) struct Shown {
    /// The most 429s `/drivers` counted (sum over drivers).
    pub(crate) drivers_429: u64,
    /// Whether `/drivers` said a driver was throttled at some reading.
    pub(crate) throttled_seen: bool,
    /// The priority level UID `/drivers` named.
    pub(crate) priority_level_uid: Option<String>,
    /// The most `attacher_hub_api_too_many_requests_total` counted (sum over drivers).
    pub(crate) metric_429: f64,
    /// `attacher_hub_api_retry_after_wait_seconds_total` at the last reading (sum).
    pub(crate) metric_wait: f64,
    /// The notes of `attacher-hub status` run while a driver was throttled.
    pub(crate) status_notes: Vec<String>,
    /// The hub's log lines about the throttled stretches.
    pub(crate) log_lines: Vec<String>,
}

/// The squeeze run's spec: the sizes, raised client-side budgets (as config b of the
/// bench, so that the API server, not the client, is what holds the attachers back), and
/// `hub_flags` for the hub.
pub(crate) fn spec(timeout: Duration, settle: Duration, hub_flags: Vec<String>) -> RunSpec {
    RunSpec {
        id: "sq".into(),
        drivers: DRIVERS,
        flags: vec![
            "--leader-election=true".into(),
            "--retry-interval-start=500ms".into(),
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
        ],
        hub_flags,
        workload: Workload::Partial {
            per_driver: PER_DRIVER,
            detach: DETACH,
        },
        settle,
        timeout,
        // A Go sidecar that loses its Lease to the squeeze exits; the kubelet would restart it.
        restart: true,
    }
}

/// The level's name part for `contender`.
fn contender_tag(contender: Contender) -> &'static str {
    match contender {
        Contender::Fleet => "go",
        Contender::Hub => "hub",
    }
}

/// Runs `contender` under a squeeze of its own (a fresh level) and measures it.
pub(crate) async fn run_side(
    cluster: &Cluster,
    contender: Contender,
    timeout: Duration,
    settle: Duration,
) -> Side {
    let client = cluster.client().await;
    let port = crate::support::free_port();
    let hub_flags = vec![format!("--http-endpoint=127.0.0.1:{port}")];
    let spec = spec(timeout, settle, hub_flags);
    let squeeze = Squeeze::apply(&client, contender_tag(contender)).await;
    let leases = LeaseWatch::start(&client).await;
    let stop = CancellationToken::new();
    let poller = (contender == Contender::Hub).then(|| {
        let stop = stop.clone();
        tokio::spawn(watch_hub(port, stop))
    });
    let before = rejected(&client).await;
    let sample = scenario::run(cluster, contender, &spec).await;
    let after = rejected(&client).await;
    squeeze.remove().await;
    stop.cancel();
    let shown = match poller {
        Some(task) => Some(task.await.expect("the hub poller")),
        None => None,
    };
    let mut lease_losses = leases.stop();
    let lease_losses_count = sample.lease_losses.max(lease_losses.len());
    if sample.lease_losses > 0 {
        lease_losses.push(format!(
            "stopped leading {} time(s): the Lease was lost",
            sample.lease_losses
        ));
    }
    Side {
        lease_losses_count,
        contender,
        sample,
        rejected: after - before,
        lease_losses,
        shown,
    }
}

/// Reads the hub's `/drivers`, metrics and log until `stop`; runs `attacher-hub status` once
/// while a driver is throttled.
async fn watch_hub(port: u16, stop: CancellationToken) -> Shown {
    let mut shown = Shown::default();
    let address = format!("127.0.0.1:{port}");
    let mut log_file: Option<std::path::PathBuf> = None;
    while !stop.is_cancelled() {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(POLL) => {}
        }
        if let Ok(drivers) = get(&address, "/drivers").await
            && let Ok(Value::Array(drivers)) = serde_json::from_str::<Value>(&drivers)
        {
            let pushback: Vec<&Value> = drivers
                .iter()
                .map(|d| &d["apiBudget"]["pushback"])
                .collect();
            let count: u64 = pushback
                .iter()
                .filter_map(|p| p["tooManyRequests"].as_u64())
                .sum();
            shown.drivers_429 = shown.drivers_429.max(count);
            if let Some(uid) = pushback.iter().find_map(|p| p["priorityLevelUid"].as_str()) {
                shown.priority_level_uid = Some(uid.to_string());
            }
            let throttled = pushback.iter().any(|p| p["throttled"] == true);
            if throttled && !shown.throttled_seen {
                shown.throttled_seen = true;
                shown.status_notes = status_notes(&address).await;
            }
        }
        if let Ok(metrics) = get(&address, "/metrics").await {
            let sum = |name: &str| -> f64 {
                metrics
                    .lines()
                    .filter(|l| l.starts_with(&format!("{name}{{")))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            };
            shown.metric_429 = shown
                .metric_429
                .max(sum("attacher_hub_api_too_many_requests_total"));
            shown.metric_wait = sum("attacher_hub_api_retry_after_wait_seconds_total");
        }
        if log_file.is_none() {
            log_file = hub_stderr(port);
        }
        if let Some(file) = &log_file
            && let Ok(text) = std::fs::read_to_string(file)
        {
            shown.log_lines = text
                .lines()
                .filter(|l| {
                    l.contains("throttling this driver") || l.contains("no longer throttles")
                })
                .map(str::to_string)
                .collect();
        }
    }
    shown
}

/// A GET on the hub's HTTP endpoint: the body of a 200.
async fn get(address: &str, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no body")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or_default().to_string());
    }
    Ok(body.to_string())
}

/// The `note:` lines of `attacher-hub status --address http://<address>`.
async fn status_notes(address: &str) -> Vec<String> {
    let out = tokio::process::Command::new(scenario::hub_bin())
        .args(["status", "--address", &format!("http://{address}")])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run attacher-hub status");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("note: "))
        .map(str::to_string)
        .collect()
}

/// The file the hub serving on `port` writes its log to (its stderr), found through /proc.
fn hub_stderr(port: u16) -> Option<std::path::PathBuf> {
    let flag = format!("--http-endpoint=127.0.0.1:{port}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|b| *b == 0).any(|a| a == flag.as_bytes()) {
            return std::fs::read_link(entry.path().join("fd/2")).ok();
        }
    }
    None
}

/// Per Lease: each write seen (when, holder).
type LeaseWrites = Arc<Mutex<BTreeMap<String, Vec<(Instant, String)>>>>;

/// Every write of the Leases of the bench's namespace, while it runs.
struct LeaseWatch {
    seen: LeaseWrites,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseWatch {
    async fn start(client: &Client) -> LeaseWatch {
        let api: Api<Lease> = Api::namespaced(client.clone(), scenario::LEASE_NAMESPACE);
        let seen: LeaseWrites = Arc::default();
        let shared = seen.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                let lease = match event {
                    watcher::Event::Apply(l) | watcher::Event::InitApply(l) => l,
                    watcher::Event::InitDone => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let Some(name) = lease.metadata.name.clone() else {
                    continue;
                };
                let holder = lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                shared
                    .lock()
                    .unwrap()
                    .entry(name)
                    .or_default()
                    .push((Instant::now(), holder));
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(30), ready_rx).await;
        LeaseWatch { seen, task }
    }

    /// The losses seen: a Lease whose holder changed to another (not to nobody: a release at
    /// the end), or whose holder let more than [`LEASE_DURATION`] pass between two renewals.
    fn stop(self) -> Vec<String> {
        self.task.abort();
        let seen = self.seen.lock().unwrap();
        let mut losses = Vec::new();
        for (name, writes) in seen.iter() {
            for pair in writes.windows(2) {
                let ((t0, h0), (t1, h1)) = (&pair[0], &pair[1]);
                if h0.is_empty() || h1.is_empty() {
                    continue;
                }
                if h0 != h1 {
                    losses.push(format!("{name}: taken from {h0} by {h1}"));
                } else if t1.duration_since(*t0) > LEASE_DURATION {
                    losses.push(format!(
                        "{name}: not renewed for {:.1} s",
                        t1.duration_since(*t0).as_secs_f64()
                    ));
                }
            }
        }
        losses
    }
}

/// The comparison's table (Markdown).
pub(crate) fn table(sides: &[&Side]) -> String {
    let mut md = String::from(
        "| contender | 300 attached | 100 gone | requests rejected with 429 | lost | Lease losses |\n|---|---|---|---|---|---|\n",
    );
    for s in sides {
        md.push_str(&format!(
            "| {} | {:.1} s | {} | {:.0} | {} | {} |\n",
            s.contender.label(DRIVERS),
            s.sample.attach_window,
            s.sample
                .detach
                .map_or_else(|| "-".to_string(), |d| format!("{d:.1} s")),
            s.rejected,
            s.sample.incomplete.as_deref().unwrap_or("none"),
            s.lease_losses_count,
        ));
    }
    md
}

/// The `make bench` row: `repeats` pairs of runs (the fleet first, then the hub; the other
/// way round in every second pair) under one squeeze; a Markdown section with each run and
/// what the issue asks of each pair.
pub(crate) async fn bench_section(
    cluster: &Cluster,
    repeats: usize,
    timeout: Duration,
    settle: Duration,
) -> String {
    let mut pairs = Vec::new();
    for rep in 0..repeats {
        let mut order = vec![Contender::Fleet, Contender::Hub];
        if rep % 2 == 1 {
            order.reverse();
        }
        let mut sides = Vec::new();
        for c in order {
            let side = run_side(cluster, c, timeout, settle).await;
            eprintln!(
                "bench: squeeze run {}/{repeats} {c:?}: {:.0} rejected with 429, attached in {:.1} s",
                rep + 1,
                side.rejected,
                side.sample.attach_window
            );
            sides.push(side);
        }
        sides.sort_by_key(|s| s.contender);
        pairs.push(sides);
    }
    let mut md = format!(
        "\n## squeeze: API Priority and Fairness squeezes the attachers\n\n\
         A FlowSchema puts every request of the attachers' ServiceAccount in a priority level of \
         about 3 seats and one queue of 2; {DRIVERS} drivers, {} VAs attached, then {DETACH} \
         deleted; QPS 100 / burst 200 on both sides; each run on a fresh level. 429s are the API \
         server's own count of the requests it turned away for the FlowSchema during each run.\n\n",
        DRIVERS * PER_DRIVER
    );
    for (i, pair) in pairs.iter().enumerate() {
        md.push_str(&format!("Run {}:\n\n", i + 1));
        md.push_str(&table(&pair.iter().collect::<Vec<_>>()));
        let [go, hub] = [&pair[0], &pair[1]];
        if let Some(shown) = &hub.shown {
            md.push_str(&format!(
                "\nThe hub counted {:.0} 429s itself (`attacher_hub_api_too_many_requests_total`; \
                 the shared watches' are not a driver's) and waited {:.1} s for `Retry-After`.\n",
                shown.metric_429, shown.metric_wait
            ));
        }
        let v = violations(go, hub);
        if v.is_empty() {
            md.push_str("\nThe hub: no more 429s, no later, nothing lost, Leases kept.\n\n");
        } else {
            md.push_str(&format!("\n**Not met:** {}.\n\n", v.join("; ")));
        }
    }
    md
}

/// What the issue asks of the hub against the fleet, as violations (empty: done).
pub(crate) fn violations(go: &Side, hub: &Side) -> Vec<String> {
    let mut v = Vec::new();
    if hub.rejected > go.rejected {
        v.push(format!(
            "the hub received more 429s ({:.0}) than the Go fleet ({:.0})",
            hub.rejected, go.rejected
        ));
    }
    if hub.sample.attach_window > go.sample.attach_window {
        v.push(format!(
            "the hub attached later ({:.1} s) than the Go fleet ({:.1} s)",
            hub.sample.attach_window, go.sample.attach_window
        ));
    }
    if let (Some(h), Some(g)) = (hub.sample.detach, go.sample.detach)
        && h > g
    {
        v.push(format!(
            "the hub detached later ({h:.1} s) than the Go fleet ({g:.1} s)"
        ));
    }
    // The Go fleet's own losses are the reference's behaviour under the squeeze (its Lease
    // renewals wait for the same level as its writes), reported in the table, not held
    // against the hub.
    if let Some(why) = &hub.sample.incomplete {
        v.push(format!("the hub lost objects: {why}"));
    }
    for l in &hub.lease_losses {
        v.push(format!("the hub lost a Lease: {l}"));
    }
    if go.rejected == 0.0 {
        v.push("the squeeze turned nothing of the Go fleet away: it squeezes nothing".into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_are_summed_over_reasons_for_the_squeeze_only() {
        let text = format!(
            "# TYPE apiserver_flowcontrol_rejected_requests_total counter\n\
             apiserver_flowcontrol_rejected_requests_total{{flow_schema=\"{SQUEEZE}\",priority_level=\"{SQUEEZE}\",reason=\"queue-full\"}} 40\n\
             apiserver_flowcontrol_rejected_requests_total{{flow_schema=\"{SQUEEZE}\",priority_level=\"{SQUEEZE}\",reason=\"time-out\"}} 2\n\
             apiserver_flowcontrol_rejected_requests_total{{flow_schema=\"global-default\",priority_level=\"global-default\",reason=\"queue-full\"}} 7\n"
        );
        assert_eq!(rejected_in(&text), 42.0);
    }
}
