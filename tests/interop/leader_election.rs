//! Leader election against the real kube-apiserver: two Rust electors on one
//! Lease, and a Rust elector contending with the reference Go external-attacher
//! (client-go) for the same Lease. Hand-over times are printed (`--nocapture`).

use crate::support;

use std::time::{Duration, Instant};

use attacher_hub::leader::{self, Config, JITTER_FACTOR, LeaderElector, Leadership};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use support::{
    Cluster, MockCsi, MockCsiOptions, start_reference_attacher, unique_driver_name, unique_name,
};

/// Namespace of every test Lease (the Go attacher is told the same).
const NAMESPACE: &str = "default";

/// How often the monitors sample the watch values and the Lease.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(25);

/// Slack for API round trips on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(1500);

/// The earliest a candidate may take over after the holder died, measured
/// from the death: the holder's last renewal can be up to one retry period
/// (plus a request) before it, and the Lease is honoured for `lease_duration`
/// after that renewal was observed.
fn earliest_takeover(lease_duration: Duration, retry: Duration) -> Duration {
    lease_duration.saturating_sub(retry + Duration::from_millis(250))
}

/// Shows the electors' logs (captured by libtest unless `--nocapture`).
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "attacher_hub::leader=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A Rust elector started by a test.
struct Candidate {
    identity: String,
    rx: watch::Receiver<Leadership>,
    handle: JoinHandle<leader::Result<()>>,
    shutdown: CancellationToken,
}

fn config(lease: &str, identity: &str, lease_s: f64, renew_s: f64, retry_s: f64) -> Config {
    let mut config = Config::new(lease, NAMESPACE, identity);
    config.lease_duration = Duration::from_secs_f64(lease_s);
    config.renew_deadline = Duration::from_secs_f64(renew_s);
    config.retry_period = Duration::from_secs_f64(retry_s);
    config.release_on_cancel = true;
    config
        .labels
        .insert("attacher-hub.test/elector".to_string(), "rust".to_string());
    config
}

fn start(leases: &Api<Lease>, config: Config) -> Candidate {
    let identity = config.identity.clone();
    let elector = LeaderElector::new(leases.clone(), config).expect("valid config");
    let shutdown = CancellationToken::new();
    let (rx, handle) = elector.spawn(shutdown.clone());
    Candidate {
        identity,
        rx,
        handle,
        shutdown,
    }
}

/// Waits until `rx` shows `Leading`; returns how long that took.
async fn wait_leading(rx: &mut watch::Receiver<Leadership>, timeout: Duration) -> Duration {
    let start = Instant::now();
    let result = tokio::time::timeout(timeout, rx.wait_for(Leadership::is_leading))
        .await
        .map(|r| r.is_ok());
    match result {
        Ok(true) => start.elapsed(),
        Ok(false) => panic!("elector task ended before leading"),
        Err(_) => panic!("not leading within {timeout:?}: {:?}", *rx.borrow()),
    }
}

/// Waits until one of `candidates` shows `Leading`; returns its index and
/// how long that took.
async fn wait_any_leading(candidates: &[Candidate], timeout: Duration) -> (usize, Duration) {
    let start = Instant::now();
    loop {
        if let Some(i) = candidates.iter().position(|c| c.rx.borrow().is_leading()) {
            return (i, start.elapsed());
        }
        assert!(start.elapsed() < timeout, "nobody leads after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The Lease's `holderIdentity` ("" when vacant or missing).
async fn holder(leases: &Api<Lease>, name: &str) -> String {
    leases
        .get_opt(name)
        .await
        .expect("read the Lease")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

/// Waits until the Lease names `who`; returns how long that took.
async fn wait_holder(leases: &Api<Lease>, name: &str, who: &str, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let h = holder(leases, name).await;
        if h == who {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "Lease {name} held by {h:?}, not {who:?}, after {timeout:?}"
        );
        tokio::time::sleep(SAMPLE_INTERVAL).await;
    }
}

/// Whether `rx` shows `Leading` and kept showing it while `probe` ran. A
/// closed channel (task ended or aborted) never counts as leading.
async fn leading_throughout<F: Future>(
    rx: &mut watch::Receiver<Leadership>,
    probe: F,
) -> (bool, F::Output) {
    let before = rx.borrow_and_update().is_leading();
    let out = probe.await;
    let unchanged = matches!(rx.has_changed(), Ok(false));
    (before && unchanged, out)
}

/// Samples several Rust electors until stopped; returns (samples, violations)
/// where a violation is two of them leading at the same time.
fn monitor_rust(
    mut rxs: Vec<watch::Receiver<Leadership>>,
    stop: CancellationToken,
) -> JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let mut samples = 0;
        let mut violations = Vec::new();
        while !stop.is_cancelled() {
            for i in 0..rxs.len() {
                let (first, rest) = rxs.split_at_mut(i + 1);
                let a = &mut first[i];
                for b in rest.iter_mut() {
                    let (a_leads, b_leads) = leading_throughout(a, async {
                        b.borrow().is_leading() && b.has_changed().is_ok()
                    })
                    .await;
                    if a_leads && b_leads {
                        violations.push(format!("electors {i} and another lead at once"));
                    }
                }
            }
            samples += 1;
            tokio::time::sleep(SAMPLE_INTERVAL).await;
        }
        (samples, violations)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rust_electors_hand_over_on_release_and_on_expiry() {
    init_tracing();
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let leases: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let lease = unique_name("lease");
    let (lease_s, renew_s, retry_s) = (2.0, 1.5, 0.5);
    let retry = Duration::from_secs_f64(retry_s);
    let lease_duration = Duration::from_secs_f64(lease_s);

    let a = start(&leases, config(&lease, "rust-a", lease_s, renew_s, retry_s));
    let b = start(&leases, config(&lease, "rust-b", lease_s, renew_s, retry_s));
    let c = start(&leases, config(&lease, "rust-c", lease_s, renew_s, retry_s));
    let stop = CancellationToken::new();
    let monitor = monitor_rust(vec![a.rx.clone(), b.rx.clone(), c.rx.clone()], stop.clone());

    // Exactly one of the three leads, and the Lease names it.
    let mut all = vec![a, b, c];
    let (first, _) = wait_any_leading(&all, Duration::from_secs(10)).await;
    let leader = all.remove(first);
    assert_eq!(holder(&leases, &lease).await, leader.identity);
    // An operator annotates the Lease between two renewals (the leader's next update then
    // conflicts and goes through a read). Renewals send no managedFields, which keeps the
    // stored ones: the operator's entry must survive them, and so must the annotation.
    let annotated = leases
        .patch(
            &lease,
            &kube::api::PatchParams {
                field_manager: Some("an-operator".to_string()),
                ..Default::default()
            },
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"example.com/note": "kept"}}
            })),
        )
        .await
        .expect("annotate the Lease");
    // Hold for longer than a lease duration: renewals keep the others out.
    tokio::time::sleep(lease_duration + retry * 2).await;
    assert!(leader.rx.borrow().is_leading());
    for other in &all {
        assert!(
            matches!(&*other.rx.borrow(), Leadership::Standby { holder: Some(h) } if *h == leader.identity),
            "{} shows {:?}",
            other.identity,
            *other.rx.borrow()
        );
    }
    let got = leases.get(&lease).await.expect("Lease");
    assert!(
        got.metadata.resource_version != annotated.metadata.resource_version,
        "no renewal after the annotation"
    );
    assert_eq!(
        got.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("example.com/note"))
            .map(String::as_str),
        Some("kept")
    );
    let managers: Vec<&str> = got
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|e| e.manager.as_deref())
        .collect();
    assert!(
        managers.contains(&"an-operator") && managers.len() >= 2,
        "managed fields after renewals: {managers:?}"
    );
    let spec = got.spec.expect("spec");
    assert_eq!(spec.lease_duration_seconds, Some(2));
    assert_eq!(
        got.metadata
            .labels
            .unwrap_or_default()
            .get("attacher-hub.test/elector")
            .map(String::as_str),
        Some("rust")
    );

    // 1. Release on cancel: a waiting candidate takes over within one jittered retry.
    let released_at = Instant::now();
    leader.shutdown.cancel();
    leader
        .handle
        .await
        .expect("elector task")
        .expect("released cleanly");
    let (next, handover) = wait_any_leading(&all, Duration::from_secs(10)).await;
    let released_to = released_at.elapsed();
    let leader = all.remove(next);
    let mut waiting = all.pop().expect("one candidate left");
    assert!(leader.rx.borrow().is_leading());
    assert_eq!(holder(&leases, &lease).await, leader.identity);
    let bound = retry.mul_f64(1.0 + JITTER_FACTOR) + SLACK;
    println!(
        "rust→rust hand-over after release: {released_to:?} (new leader waited {handover:?}); bound {bound:?}"
    );
    assert!(
        released_to <= bound,
        "hand-over after release took {released_to:?}"
    );

    // 2. Crash (abort without release): the other takes over after the lease expires.
    let leader_identity = leader.identity.clone();
    let killed_at = Instant::now();
    leader.handle.abort();
    let _ = leader.handle.await;
    let waited = wait_leading(&mut waiting.rx, Duration::from_secs(20)).await;
    let killed_to = killed_at.elapsed();
    let bound = lease_duration + retry.mul_f64(2.0 * (1.0 + JITTER_FACTOR)) + SLACK;
    println!(
        "rust→rust hand-over after crash: {killed_to:?} (lease {lease_duration:?}, retry {retry:?}); bound {bound:?}"
    );
    assert!(
        killed_to >= earliest_takeover(lease_duration, retry),
        "{} took over a live lease of {leader_identity} after {waited:?}",
        waiting.identity
    );
    assert!(
        killed_to <= bound,
        "hand-over after crash took {killed_to:?}"
    );
    assert_eq!(holder(&leases, &lease).await, waiting.identity);
    let got = leases.get(&lease).await.expect("Lease");
    assert_eq!(
        got.spec.and_then(|s| s.lease_transitions),
        Some(2),
        "two transitions after create"
    );

    stop.cancel();
    let (samples, violations) = monitor.await.expect("monitor");
    assert!(samples > 50, "monitor took only {samples} samples");
    assert!(violations.is_empty(), "{violations:?}");

    waiting.shutdown.cancel();
    waiting.handle.await.expect("task").expect("release");
    assert_eq!(holder(&leases, &lease).await, "");
    leases
        .delete(&lease, &Default::default())
        .await
        .expect("delete Lease");
}

/// Samples the Lease and a Rust elector until stopped; a violation is the
/// Rust elector leading throughout a read that shows the Lease held by `go_id`.
fn monitor_go(
    leases: Api<Lease>,
    lease: String,
    go_id: String,
    mut rx: watch::Receiver<Leadership>,
    stop: CancellationToken,
) -> JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let mut samples = 0;
        let mut violations = Vec::new();
        while !stop.is_cancelled() {
            let (rust_leads, h) = leading_throughout(&mut rx, holder(&leases, &lease)).await;
            if rust_leads && h == go_id {
                violations.push(format!(
                    "sample {samples}: Rust leads while the Lease names {h}"
                ));
            }
            samples += 1;
            tokio::time::sleep(SAMPLE_INTERVAL).await;
        }
        (samples, violations)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_go_external_attacher_never_both_lead() {
    init_tracing();
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let leases: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let driver = unique_driver_name("le");
    let lease = attacher_hub::names::lease_name(&driver);
    assert_eq!(
        lease,
        format!(
            "external-attacher-leader-{}",
            support::sanitize_driver_name(&driver)
        )
    );
    let (lease_s, renew_s, retry_s) = (4.0, 3.0, 1.0);
    let lease_duration = Duration::from_secs_f64(lease_s);
    let retry = Duration::from_secs_f64(retry_s);
    let go_args = |kubeconfig: String| -> Vec<String> {
        vec![
            format!("--kubeconfig={kubeconfig}"),
            "--leader-election".into(),
            format!("--leader-election-namespace={NAMESPACE}"),
            "--leader-election-lease-duration=4s".into(),
            "--leader-election-renew-deadline=3s".into(),
            "--leader-election-retry-period=1s".into(),
            "--v=3".into(),
        ]
    };
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let args = go_args(kubeconfig.clone());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let mock = MockCsi::start(cluster, &driver, MockCsiOptions::default()).await;
    let mut go1 = start_reference_attacher(cluster, mock.socket(), &args);
    // The Go attacher's identity is its sanitized host name, like ours by default.
    let go_id = leader::default_identity().expect("host name");
    wait_holder(&leases, &lease, &go_id, Duration::from_secs(30)).await;
    go1.wait_for_output("Successfully acquired lease", 1, Duration::from_secs(10))
        .await
        .expect("Go attacher leads");

    let rust_id = format!("attacher-hub-{}", unique_name("rust"));
    let mut rust = start(&leases, config(&lease, &rust_id, lease_s, renew_s, retry_s));
    let stop = CancellationToken::new();
    let monitor = monitor_go(
        leases.clone(),
        lease.clone(),
        go_id.clone(),
        rust.rx.clone(),
        stop.clone(),
    );

    // While Go renews, Rust stays standby and sees Go as holder.
    tokio::time::sleep(lease_duration * 2).await;
    assert_eq!(
        *rust.rx.borrow(),
        Leadership::Standby {
            holder: Some(go_id.clone())
        }
    );
    assert_eq!(holder(&leases, &lease).await, go_id);

    // SIGKILL the Go attacher: Rust takes over once the lease expires.
    let pid = go1.id().expect("Go attacher running");
    let killed_at = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let waited = wait_leading(&mut rust.rx, Duration::from_secs(30)).await;
    let go_to_rust = killed_at.elapsed();
    let bound = lease_duration + retry.mul_f64(2.0 * (1.0 + JITTER_FACTOR)) + SLACK;
    println!(
        "go→rust hand-over after SIGKILL: {go_to_rust:?} (Rust waited {waited:?}); lease {lease_duration:?}, retry {retry:?}, bound {bound:?}"
    );
    assert!(go_to_rust <= bound, "took {go_to_rust:?}");
    assert!(
        go_to_rust >= earliest_takeover(lease_duration, retry),
        "Rust took over a live lease after {go_to_rust:?}"
    );
    assert_eq!(holder(&leases, &lease).await, rust_id);
    drop(go1);

    // A new Go attacher while Rust leads: it waits and does not take over.
    let mut go2 = start_reference_attacher(cluster, mock.socket(), &args);
    go2.wait_for_output(
        "Attempting to acquire leader lease",
        1,
        Duration::from_secs(30),
    )
    .await
    .expect("Go attacher tries to acquire");
    tokio::time::sleep(lease_duration * 2).await;
    assert_eq!(holder(&leases, &lease).await, rust_id);
    assert!(rust.rx.borrow().is_leading());
    assert_eq!(
        go2.count_in_output("Successfully acquired lease"),
        0,
        "the Go attacher must not acquire a lease Rust renews"
    );
    assert!(
        go2.exited().is_none(),
        "the waiting Go attacher keeps running"
    );

    // Release the Rust elector: the waiting Go attacher takes over at once.
    let released_at = Instant::now();
    rust.shutdown.cancel();
    rust.handle
        .await
        .expect("elector task")
        .expect("released cleanly");
    assert!(!rust.rx.borrow().is_leading());
    wait_holder(&leases, &lease, &go_id, Duration::from_secs(15)).await;
    let rust_to_go = released_at.elapsed();
    let bound = retry.mul_f64(1.0 + JITTER_FACTOR) + SLACK;
    println!("rust→go hand-over after release: {rust_to_go:?}; bound {bound:?}");
    assert!(rust_to_go <= bound, "took {rust_to_go:?}");
    go2.wait_for_output("Successfully acquired lease", 1, Duration::from_secs(10))
        .await
        .expect("Go attacher logs the acquisition");

    stop.cancel();
    let (samples, violations) = monitor.await.expect("monitor");
    println!(
        "monitor: {samples} samples, {} violations",
        violations.len()
    );
    assert!(samples > 100, "monitor took only {samples} samples");
    assert!(violations.is_empty(), "{violations:?}");

    go2.stop().await;
    drop(mock);
    let _ = leases.delete(&lease, &Default::default()).await;
}
