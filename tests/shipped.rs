//! What ships runs as rendered: the shipped manifests applied to the real API server, their
//! Pods made by kube-controller-manager and run by the pod runner (tests/pods) as their own
//! ServiceAccount, with their own RBAC, in a namespace whose Pod Security level the API server
//! enforces.

mod pods;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};

use pods::PodRunner;
use support::{Cluster, PvBuilder, controller_manager, documents, kubectl, kustomize, repo, va};

/// The tests of this file one at a time: the overlays share cluster-scoped names (the
/// ClusterRole and ClusterRoleBinding `attacher-hub`, bound to each overlay's own account), and
/// the tests share the volume node and the VA label.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The two drivers of `deploy/overlays/hub` (placeholders the runner serves with the mock).
const HUB_DRIVERS: [&str; 2] = ["fast-disk.csi.example.com", "nfs.csi.example.com"];

/// Label on the test's VolumeAttachments.
const RUN_LABEL: &str = "attacher-hub-test/shipped";

/// The rendered objects of `deploy/<path>`, with attacher-hub's image as the overlay names it.
fn render(path: &str) -> Vec<Value> {
    documents(&kustomize(&repo().join("deploy").join(path)))
}

/// `kubectl apply` of `objects` as the cluster's admin (an operator's apply).
fn apply(objects: &[Value]) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&list.to_string()));
    assert!(ok, "kubectl apply of the rendered objects failed:\n{out}");
}

/// Removes what an earlier run left in `ns` (the namespace itself stays: no namespace
/// controller runs here to empty a deleted one).
async fn clean_namespace(client: &Client, ns: &str) {
    delete_leftovers(client).await;
    for kind in ["deployments", "daemonsets", "replicasets", "pods", "leases"] {
        let (_, _) = kubectl(
            &[
                "delete",
                kind,
                "--all",
                "-n",
                ns,
                "--ignore-not-found",
                "--grace-period=0",
                "--force",
            ],
            None,
        );
    }
    let _ = client;
}

/// A node for the test's VolumeAttachments (no pod runs there) with a CSINode naming `drivers`.
async fn volume_node(client: &Client, name: &str, drivers: &[&str]) {
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes.delete(name, &DeleteParams::default()).await;
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let _ = csinodes.delete(name, &DeleteParams::default()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    support::create_node(client, name).await;
    csinodes
        .create(
            &PostParams::default(),
            &CSINode {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: drivers
                        .iter()
                        .map(|d| CSINodeDriver {
                            name: d.to_string(),
                            node_id: name.to_string(),
                            ..CSINodeDriver::default()
                        })
                        .collect(),
                },
            },
        )
        .await
        .expect("create the CSINode");
}

/// Waits until `workload` (`deployment/<name>` or `daemonset/<name>`) in `ns` has `replicas`
/// updated, ready and available pods and no others.
async fn wait_rolled_out(
    client: &Client,
    ns: &str,
    workload: &str,
    replicas: i32,
    timeout: Duration,
) -> Result<(), String> {
    let start = Instant::now();
    let (kind, name) = workload.split_once('/').expect("kind/name");
    loop {
        let (done, status) = if kind == "daemonset" {
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
            let d = api.get(name).await.map_err(|e| e.to_string())?;
            let generation = d.metadata.generation.unwrap_or(0);
            let s = d.status.clone().unwrap_or_default();
            let done = s.observed_generation.unwrap_or(0) >= generation
                && s.desired_number_scheduled == replicas
                && s.updated_number_scheduled == Some(replicas)
                && s.number_ready == replicas
                && s.number_available == Some(replicas);
            (done, format!("{s:?}"))
        } else {
            let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
            let d = api.get(name).await.map_err(|e| e.to_string())?;
            let generation = d.metadata.generation.unwrap_or(0);
            let s = d.status.clone().unwrap_or_default();
            let done = s.observed_generation.unwrap_or(0) >= generation
                && s.updated_replicas == Some(replicas)
                && s.ready_replicas == Some(replicas)
                && s.available_replicas == Some(replicas)
                && s.replicas == Some(replicas);
            (done, format!("{s:?}"))
        };
        if done {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(format!("{workload} in {ns} not rolled out: {status}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One Lease's history as a watch saw it: (when, holder).
type LeaseLog = Arc<Mutex<BTreeMap<String, Vec<(Instant, String)>>>>;

/// Watches the Leases of `ns` and logs each one's holder at every change.
fn watch_leases(client: &Client, ns: &str) -> (LeaseLog, tokio::task::JoinHandle<()>) {
    let log: LeaseLog = Arc::default();
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let sink = log.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(lease)) = stream.next().await {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let holder = lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            sink.lock()
                .expect("lease log")
                .entry(name)
                .or_default()
                .push((Instant::now(), holder));
        }
    });
    (log, task)
}

/// The longest time within `[from, to]` that the Lease had no holder: from a release (holder
/// emptied) to the next holder, or from a holder's last renewal to another holder taking over.
fn longest_leaderless(history: &[(Instant, String)], from: Instant, to: Instant) -> Duration {
    let mut longest = Duration::ZERO;
    let mut last_held: Option<Instant> = None;
    let mut released: Option<Instant> = None;
    let mut holder = String::new();
    for (at, h) in history {
        if h.is_empty() {
            released.get_or_insert(*at);
        } else {
            let gap_start = match (released, h != &holder) {
                (Some(r), _) => Some(r),
                (None, true) if !holder.is_empty() => last_held,
                _ => None,
            };
            if let Some(start) = gap_start {
                let (s, e) = (start.max(from), (*at).min(to));
                if e > s {
                    longest = longest.max(e - s);
                }
            }
            released = None;
            last_held = Some(*at);
            holder = h.clone();
        }
    }
    if let Some(r) = released {
        let (s, e) = (r.max(from), to);
        if e > s {
            longest = longest.max(e - s);
        }
    }
    longest
}

#[test]
fn leaderless_time_counts_releases_and_takeovers() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let h = vec![
        (at(0), "a".to_string()),
        (at(2000), "a".to_string()),
        (at(2100), String::new()),
        (at(2400), "b".to_string()),
        (at(4000), "b".to_string()),
        (at(5500), "c".to_string()),
    ];
    assert_eq!(
        longest_leaderless(&h, t0, at(10_000)),
        Duration::from_millis(1500)
    );
    assert_eq!(
        longest_leaderless(&h, t0, at(3000)),
        Duration::from_millis(300)
    );
    let released = vec![(at(0), "a".to_string()), (at(100), String::new())];
    assert_eq!(
        longest_leaderless(&released, t0, at(600)),
        Duration::from_millis(500)
    );
}

/// Which of `pods` claim to lead each Lease, from `leader_election_master_status`, polled one
/// pod after the other; a pod that claims a Lease on two polls in a row while another pod
/// claims it on a poll in between means two leaders at once.
struct LeaderPolls {
    seen: Vec<(String, BTreeMap<String, bool>)>,
}

impl LeaderPolls {
    fn parse(metrics: &str) -> BTreeMap<String, bool> {
        metrics
            .lines()
            .filter(|l| l.starts_with("leader_election_master_status{"))
            .filter_map(|l| {
                let (labels, value) = l.split_once('}')?;
                let name = labels
                    .trim_start_matches("leader_election_master_status{")
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("name=\""))?
                    .trim_end_matches('"')
                    .to_string();
                Some((name, value.trim() == "1"))
            })
            .collect()
    }

    /// Pairs (lease, pod, other pod) where both led at once.
    fn overlaps(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, (pod, claims)) in self.seen.iter().enumerate() {
            let Some(next) = self.seen[i + 1..].iter().position(|(p, _)| p == pod) else {
                continue;
            };
            let next = i + 1 + next;
            for (lease, leads) in claims {
                if !leads || self.seen[next].1.get(lease) != Some(&true) {
                    continue;
                }
                for (other, other_claims) in &self.seen[i + 1..next] {
                    if other != pod && other_claims.get(lease) == Some(&true) {
                        out.push(format!("{lease}: {pod} and {other}"));
                    }
                }
            }
        }
        out
    }
}

#[test]
fn two_leaders_show_only_between_two_claims_of_the_same_pod() {
    let claim =
        |pod: &str, leads: bool| (pod.to_string(), BTreeMap::from([("l".to_string(), leads)]));
    let handover = LeaderPolls {
        seen: vec![claim("a", true), claim("b", true), claim("a", false)],
    };
    assert!(handover.overlaps().is_empty());
    let both = LeaderPolls {
        seen: vec![claim("a", true), claim("b", true), claim("a", true)],
    };
    assert_eq!(both.overlaps(), ["l: a and b"]);
    let metrics =
        "leader_election_master_status{driver_name=\"d\",name=\"external-attacher-leader-d\"} 1\n";
    assert!(LeaderPolls::parse(metrics)["external-attacher-leader-d"]);
}

/// When each of the test's VAs was created (or seen attached), by name.
type Times = Arc<Mutex<HashMap<String, Instant>>>;

/// Creates a PV and a VA for one of `drivers` (in turn) every `every` until stopped; records
/// when each VA was created.
fn create_volumes(
    client: &Client,
    node: &str,
    drivers: &[&str],
    every: Duration,
) -> (
    Times,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let client = client.clone();
    let node = node.to_string();
    let drivers: Vec<String> = drivers.iter().map(|d| d.to_string()).collect();
    let sink = created.clone();
    let task = tokio::spawn(async move {
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let mut n = 0usize;
        loop {
            let driver = &drivers[n % drivers.len()];
            let name = support::unique_name("shipped-va");
            let mut pv = PvBuilder::new(&name, driver, &format!("vol-{n}")).build();
            pv.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(RUN_LABEL.into(), "1".into());
            Api::<PersistentVolume>::all(client.clone())
                .create(&PostParams::default(), &pv)
                .await
                .expect("create a PV");
            let mut object = va(&name, driver, &node, &name);
            object
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(RUN_LABEL.into(), "1".into());
            let t = Instant::now();
            vas.create(&PostParams::default(), &object)
                .await
                .expect("create a VA");
            sink.lock().expect("created").insert(name, t);
            n += 1;
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopped.changed() => return,
            }
        }
    });
    (created, stop, task)
}

/// Watches the test's VAs and records when each was first seen attached.
fn watch_attached(
    client: &Client,
) -> (
    Arc<Mutex<HashMap<String, Instant>>>,
    tokio::task::JoinHandle<()>,
) {
    let attached: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let sink = attached.clone();
    let task = tokio::spawn(async move {
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}=1"));
        let mut stream = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(va)) = stream.next().await {
            if va.status.as_ref().is_some_and(|s| s.attached) {
                let name = va.metadata.name.clone().unwrap_or_default();
                sink.lock()
                    .expect("attached")
                    .entry(name)
                    .or_insert_with(Instant::now);
            }
        }
    });
    (attached, task)
}

/// Deletes every VA and PV a run of these tests left (an interrupted run leaves them, and a
/// hub that finds hundreds of them has work before it attaches anything new).
async fn delete_leftovers(client: &Client) {
    let lp = kube::api::ListParams::default().labels(&format!("{RUN_LABEL}=1"));
    let mut names: Vec<String> = Vec::new();
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for list in [
        vas.list(&lp).await.map(|l| {
            l.items
                .into_iter()
                .filter_map(|v| v.metadata.name)
                .collect::<Vec<_>>()
        }),
        pvs.list(&lp).await.map(|l| {
            l.items
                .into_iter()
                .filter_map(|v| v.metadata.name)
                .collect::<Vec<_>>()
        }),
    ] {
        names.extend(list.unwrap_or_default());
    }
    names.sort();
    names.dedup();
    delete_volumes(client, &names).await;
}

/// Deletes the test's VAs and PVs, clearing finalizers a failed run may have left.
async fn delete_volumes(client: &Client, names: &[String]) {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for name in names {
        let _ = vas.patch(name, &PatchParams::default(), &unfinalize).await;
        let _ = vas.delete(name, &DeleteParams::default()).await;
        let _ = pvs.patch(name, &PatchParams::default(), &unfinalize).await;
        let _ = pvs.delete(name, &DeleteParams::default()).await;
    }
}

/// What a rolling update showed.
#[derive(Debug)]
struct Rollout {
    /// From the update to the last old pod gone (and 8 s more).
    seconds: f64,
    /// VolumeAttachments made meanwhile.
    made: usize,
    /// Their time to attached: 99th percentile and most.
    p99: Duration,
    max: Duration,
    /// The longest time each driver's Lease had no holder.
    gaps: BTreeMap<String, Duration>,
    /// Two pods leading one Lease at once.
    overlaps: Vec<String>,
    /// VAs never attached.
    missing: Vec<String>,
    /// Requests of the workload's ServiceAccount the API server refused.
    refused: Vec<String>,
}

impl Rollout {
    /// One line for the test's output (and docs/benchmarks.md).
    fn summary(&self) -> String {
        format!(
            "update {:.1} s; {} VAs made meanwhile: attach p99 {:.2} s, max {:.2} s; longest \
             leaderless time {:.2} s; two leaders {}; never attached {}; refused {}",
            self.seconds,
            self.made,
            self.p99.as_secs_f64(),
            self.max.as_secs_f64(),
            self.longest_gap().as_secs_f64(),
            self.overlaps.len(),
            self.missing.len(),
            self.refused.len()
        )
    }

    /// The longest leaderless time of any driver.
    fn longest_gap(&self) -> Duration {
        self.gaps.values().copied().max().unwrap_or_default()
    }

    /// Every way the rollout broke the promise of a hand-over: VAs lost, two leaders, refusals,
    /// a driver without a leader for more than `gap`, VAs made meanwhile later than `p99`.
    fn problems(&self, gap: Duration, p99: Duration) -> Vec<String> {
        let mut out = Vec::new();
        if !self.missing.is_empty() {
            out.push(format!(
                "{} VAs never attached, e.g. {:?}",
                self.missing.len(),
                &self.missing[..self.missing.len().min(5)]
            ));
        }
        if !self.overlaps.is_empty() {
            out.push(format!(
                "two pods led one driver at once: {:?}",
                self.overlaps
            ));
        }
        if !self.refused.is_empty() {
            out.push(format!(
                "the API server refused the ServiceAccount: {:?}",
                self.refused
            ));
        }
        if self.made < 20 {
            out.push(format!("only {} VAs made during the update", self.made));
        }
        for (lease, g) in &self.gaps {
            if *g > gap {
                out.push(format!("{lease} had no leader for {g:?} during the update"));
            }
        }
        if self.p99 > p99 {
            out.push(format!(
                "VAs made during the update attached after {:?} at p99",
                self.p99
            ));
        }
        out
    }
}

/// A rolling update of `deployment` (`deployment/<name>` or `daemonset/<name>`, two pods,
/// already applied) while a VA of one of
/// `drivers` is made every 400 ms: each Lease's holders watched, every pod's
/// `leader_election_master_status` polled on `metrics_port`, each VA timed to attached, and
/// the ServiceAccount's refused requests since `began` read from the audit log.
#[allow(clippy::too_many_arguments)]
async fn roll_over(
    client: &Client,
    runner: &PodRunner,
    ns: &str,
    deployment: &str,
    selector: &str,
    service_account: &str,
    drivers: &[&str],
    metrics_port: u16,
    began: std::time::SystemTime,
) -> Result<Rollout, String> {
    wait_rolled_out(client, ns, deployment, 2, Duration::from_secs(120)).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease_names: Vec<String> = drivers
        .iter()
        .map(|d| {
            format!(
                "external-attacher-leader-{}",
                support::sanitize_driver_name(d)
            )
        })
        .collect();
    // Both drivers led before the update.
    let start = Instant::now();
    loop {
        let mut held = 0;
        for name in &lease_names {
            if let Ok(Some(l)) = leases.get_opt(name).await
                && l.spec
                    .and_then(|s| s.holder_identity)
                    .is_some_and(|h| !h.is_empty())
            {
                held += 1;
            }
        }
        if held == lease_names.len() {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err("the drivers' Leases were not taken".to_string());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let node = "shipped-volume-node";
    volume_node(client, node, drivers).await;
    let (lease_log, lease_watch) = watch_leases(client, ns);
    let (attached, attach_watch) = watch_attached(client);
    // One VA every 400 ms, each driver's in turn: 1.25 a second per driver, about 2.5
    // writes a second, well inside the default budget of 5 QPS that each driver has (as
    // its sidecar would), so that what the VAs measure is the hand-over, not the budget.
    let (created, stop_creating, creator) =
        create_volumes(client, node, drivers, Duration::from_millis(400));

    // Two leaders at once, polled from every pod's metrics until the update is done.
    let (stop_polls, mut polls_stopped) = tokio::sync::watch::channel(false);
    let poll_runner = runner;
    let poller = async {
        let mut polls = LeaderPolls { seen: Vec::new() };
        loop {
            for pod in poll_runner.pods(selector).await {
                let name = pod.metadata.name.clone().unwrap_or_default();
                if let Ok((200, body)) = poll_runner.http_get(&name, metrics_port, "/metrics").await
                {
                    polls.seen.push((name, LeaderPolls::parse(&body)));
                }
            }
            if *polls_stopped.borrow() {
                return polls;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = polls_stopped.changed() => {}
            }
        }
    };
    let update = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let from = Instant::now();
        let restarted = json!({"spec": {"template": {"metadata": {"annotations": {
            "kubectl.kubernetes.io/restartedAt": format!("{:?}", std::time::SystemTime::now())}}}}});
        let (kind, name) = deployment.split_once('/').expect("kind/name");
        let patched = if kind == "daemonset" {
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
            api.patch(name, &PatchParams::default(), &Patch::Merge(&restarted))
                .await
                .map(drop)
        } else {
            let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
            api.patch(name, &PatchParams::default(), &Patch::Merge(&restarted))
                .await
                .map(drop)
        };
        patched.map_err(|e| format!("rolling update: {e}"))?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        wait_rolled_out(client, ns, deployment, 2, Duration::from_secs(180)).await?;
        // Old pods gone too (a terminating pod is no longer counted in the status).
        let deadline = Instant::now() + Duration::from_secs(60);
        while poll_runner.pods(selector).await.len() > 2 {
            if Instant::now() > deadline {
                return Err("old pods still there a minute after the rollout".to_string());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // VAs keep coming for a while after the last old pod went: a standby that takes the
        // Lease over at its next retry does so within this window.
        tokio::time::sleep(Duration::from_secs(8)).await;
        let _ = stop_polls.send(true);
        Ok::<(Instant, Instant), String>((from, Instant::now()))
    };
    let (window, polls) = tokio::join!(update, poller);
    let (from, to) = window?;
    let _ = stop_creating.send(true);
    let _ = creator.await;

    // Every VA attached; those made during the update within a second at p99.
    let names: Vec<String> = created.lock().expect("created").keys().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while attached.lock().expect("attached").len() < names.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lease_watch.abort();
    attach_watch.abort();
    let created = created.lock().expect("created").clone();
    let attached = attached.lock().expect("attached").clone();
    let mut latencies: Vec<Duration> = Vec::new();
    let mut missing = Vec::new();
    for (name, t) in &created {
        match attached.get(name) {
            Some(a) if *t >= from && *t <= to => latencies.push(a.saturating_duration_since(*t)),
            Some(_) => {}
            None => missing.push(name.clone()),
        }
    }
    latencies.sort();
    let mut slowest: Vec<(Duration, f64, &String)> = created
        .iter()
        .filter_map(|(n, t)| {
            Some((
                attached.get(n)?.saturating_duration_since(*t),
                t.saturating_duration_since(from).as_secs_f64(),
                n,
            ))
        })
        .collect();
    slowest.sort_by_key(|s| s.0);
    for (latency, at, name) in slowest.iter().rev().take(5) {
        eprintln!("slow: {name} made {at:.2} s into the update, attached after {latency:?}");
    }
    let p99 = latencies
        .get((latencies.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or_default();
    let log = lease_log.lock().expect("lease log").clone();
    let gaps: BTreeMap<String, Duration> = lease_names
        .iter()
        .map(|l| {
            (
                l.clone(),
                longest_leaderless(log.get(l).map_or(&[][..], Vec::as_slice), from, to),
            )
        })
        .collect();
    let overlaps = polls.overlaps();
    let holders: BTreeMap<&String, Vec<&String>> = log
        .iter()
        .map(|(l, h)| (l, h.iter().map(|(_, x)| x).collect()))
        .collect();
    eprintln!(
        "rolling update of {deployment}: {:.1} s; {} VAs made meanwhile, attach p99 {:?}, max {:?}; \
         longest leaderless time per driver {gaps:?}; {} leader polls; holders {holders:?}",
        (to - from).as_secs_f64(),
        latencies.len(),
        p99,
        latencies.last(),
        polls.seen.len(),
    );
    delete_volumes(client, &created.keys().cloned().collect::<Vec<_>>()).await;
    missing.sort();
    Ok(Rollout {
        seconds: (to - from).as_secs_f64(),
        made: latencies.len(),
        p99,
        max: latencies.last().copied().unwrap_or_default(),
        gaps,
        overlaps,
        missing,
        refused: support::forbidden(
            &format!("system:serviceaccount:{ns}:{service_account}"),
            began,
        ),
    })
}

/// `deploy/overlays/hub` as an operator applies it: two replicas of the hub with the two
/// placeholder drivers in each pod, as the ServiceAccount and RBAC the overlay ships, in the
/// namespace it ships. A rolling update while VolumeAttachments keep coming: no driver is
/// without a leader for more than a second, the VAs made meanwhile are attached within a
/// second at p99, no two replicas ever lead one driver, and the API server refuses none of
/// the hub's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hub_overlay_rolls_over_without_a_leaderless_driver() {
    let (_serial, client, objects, ns) = set_up("overlays/hub").await;
    let runner = PodRunner::start(&ns, &[("hub-node-a", &[]), ("hub-node-b", &[])]).await;
    let began = std::time::SystemTime::now();
    apply(&objects);
    let outcome = roll_over(
        &client,
        &runner,
        &ns,
        "deployment/attacher-hub",
        "app.kubernetes.io/component=hub",
        "attacher-hub",
        &HUB_DRIVERS,
        8080,
        began,
    )
    .await;
    finish(&client, runner, &ns, &objects).await;
    let rollout = outcome.unwrap_or_else(|why| panic!("{why}"));
    eprintln!("hub overlay: {}", rollout.summary());
    let problems = rollout.problems(Duration::from_secs(1), Duration::from_secs(1));
    assert!(
        problems.is_empty(),
        "rolling update of deploy/overlays/hub: {problems:#?}"
    );
}

/// What each test here starts with: its turn, an admin client, kube-controller-manager
/// running, the rendered objects of `deploy/<path>` and their namespace, emptied of what an
/// earlier run left.
async fn set_up(
    path: &str,
) -> (
    tokio::sync::MutexGuard<'static, ()>,
    Client,
    Vec<Value>,
    String,
) {
    let serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::get();
    controller_manager(cluster);
    let client = cluster.client().await;
    let objects = render(path);
    let ns = namespace_of(&objects);
    clean_namespace(&client, &ns).await;
    (serial, client, objects, ns)
}

/// The namespace of the workload among `objects`.
fn namespace_of(objects: &[Value]) -> String {
    objects
        .iter()
        .find(|o| matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet")))
        .and_then(|d| d["metadata"]["namespace"].as_str())
        .expect("the rendered workload has a namespace")
        .to_string()
}

/// Stops the runner and removes what the test made (the cluster-scoped objects of `objects`
/// too, which another test or a chart install may name), printing the containers' last lines.
async fn finish(client: &Client, runner: PodRunner, ns: &str, objects: &[Value]) {
    eprintln!("{}", runner.log_tails(15));
    for kind in ["deployments", "daemonsets", "replicasets"] {
        let (_, _) = kubectl(
            &["delete", kind, "--all", "-n", ns, "--ignore-not-found"],
            None,
        );
    }
    runner.shutdown().await;
    clean_namespace(client, ns).await;
    let cluster_scoped: Vec<&Value> = objects
        .iter()
        .filter(|o| {
            matches!(
                o["kind"].as_str(),
                Some("ClusterRole" | "ClusterRoleBinding")
            )
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": cluster_scoped});
    let (_, _) = kubectl(
        &["delete", "--ignore-not-found", "-f", "-"],
        Some(&list.to_string()),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .delete("shipped-volume-node", &DeleteParams::default())
        .await;
}

/// `deploy/overlays/sidecar` as an operator applies it (two replicas of a driver's controller
/// pod with attacher-hub as its attacher, in sidecar mode), and the same Deployment with the Go
/// external-attacher's image in the attacher's place, each rolled over while VAs keep coming.
/// attacher-hub loses nothing, never leads twice and is refused nothing, and no driver waits
/// longer for a leader than with the Go sidecar (both wait for the Lease to be retried, every
/// retry period).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sidecar_overlay_rolls_over_no_worse_than_the_go_sidecar() {
    let (_serial, client, shipped, ns) = set_up("overlays/sidecar").await;
    let driver = "example.csi.example.com";
    let mut results = Vec::new();
    for go in [false, true] {
        let mut objects = shipped.clone();
        if go {
            for o in objects.iter_mut().filter(|o| o["kind"] == "Deployment") {
                for c in o["spec"]["template"]["spec"]["containers"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if c["name"] == "csi-attacher" {
                        c["image"] = json!("registry.k8s.io/sig-storage/csi-attacher:v4.12.0");
                    }
                }
            }
        }
        clean_namespace(&client, &ns).await;
        let runner =
            PodRunner::start(&ns, &[("sidecar-node-a", &[]), ("sidecar-node-b", &[])]).await;
        let began = std::time::SystemTime::now();
        apply(&objects);
        let outcome = roll_over(
            &client,
            &runner,
            &ns,
            "deployment/example-csi-controller",
            "app.kubernetes.io/name=example-csi-controller",
            "attacher-hub",
            &[driver],
            8080,
            began,
        )
        .await;
        finish(&client, runner, &ns, &objects).await;
        let rollout =
            outcome.unwrap_or_else(|why| panic!("{}: {why}", if go { "Go" } else { "hub" }));
        eprintln!(
            "sidecar overlay, {}: {}",
            if go {
                "Go external-attacher"
            } else {
                "attacher-hub"
            },
            rollout.summary()
        );
        results.push(rollout);
    }
    let (hub, go) = (&results[0], &results[1]);
    // Lease hand-overs and attach times are compared with the Go sidecar's, with one retry
    // period (5 s, the default of both) of slack for where in its period each one was.
    let retry = Duration::from_secs(5);
    let problems = hub.problems(go.longest_gap() + retry, go.p99 + retry);
    assert!(
        problems.is_empty(),
        "rolling update of deploy/overlays/sidecar: {problems:#?}"
    );
    assert!(
        go.missing.is_empty() && go.overlaps.is_empty(),
        "the Go sidecar's run itself failed: {go:?}"
    );
}

/// `deploy/overlays/controller-pool` as an operator applies it: the attacher-hub DaemonSet on
/// two nodes of the pool, in discovery mode, as its own ServiceAccount in its `privileged`
/// namespace, finding two drivers' sockets that the vendors' controllers export on each node
/// (here the Rust mock serving in the node's directory, not listing published nodes, for the
/// reason `tests/pods/image.rs` gives). A rolling update of the DaemonSet, one node at a time,
/// while VAs keep coming: no driver without a leader for more than a second, VAs attached
/// within a second at p99, never two leaders, nothing refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_pool_overlay_rolls_over_without_a_leaderless_driver() {
    let (_serial, client, objects, ns) = set_up("overlays/controller-pool").await;
    let pool = [("attacher-hub.example.com/pool", "storage")];
    let runner = PodRunner::start(&ns, &[("pool-node-a", &pool), ("pool-node-b", &pool)]).await;
    // Each node's vendor controllers export their sockets where the DaemonSet looks.
    let drivers = ["pool-a.csi.example.com", "pool-b.csi.example.com"];
    let mut mocks = Vec::new();
    for node in runner.nodes() {
        for d in drivers {
            let dir = node.root.join("var/lib/attacher-hub/controllers").join(d);
            std::fs::create_dir_all(&dir).expect("the export directory");
            let mock = mock_csi_driver::MockDriver::new(d)
                .volumes(10_000)
                .capabilities(mock_csi_driver::Capabilities {
                    list_volumes_published_nodes: false,
                    ..mock_csi_driver::Capabilities::default()
                })
                .serve(&dir.join("csi.sock"))
                .await
                .expect("serve the mock in the node's export directory");
            mocks.push(mock);
        }
    }
    let began = std::time::SystemTime::now();
    apply(&objects);
    let outcome = roll_over(
        &client,
        &runner,
        &ns,
        "daemonset/attacher-hub-node",
        "app.kubernetes.io/component=node",
        "attacher-hub",
        &drivers,
        8080,
        began,
    )
    .await;
    finish(&client, runner, &ns, &objects).await;
    for m in mocks {
        m.shutdown().await;
    }
    let rollout = outcome.unwrap_or_else(|why| panic!("{why}"));
    eprintln!("controller-pool overlay: {}", rollout.summary());
    let problems = rollout.problems(Duration::from_secs(1), Duration::from_secs(1));
    assert!(
        problems.is_empty(),
        "rolling update of deploy/overlays/controller-pool: {problems:#?}"
    );
}
