//! The cross-namespace Lease guard against the real Go external-attacher (v4.13.0), the real
//! API server and the Go mock CSI driver (`leader::guard`).
//!
//! * `a_go_sidecar_leading_in_another_namespace_keeps_the_hub_from_leading`: the Go sidecar
//!   leads the driver with its Lease in one namespace; attacher-hub, electing in another, does
//!   not lead: it makes no ControllerPublishVolume call and never takes its own Lease while the
//!   sidecar attaches, and says why in `/drivers` (state `blocked`, the namespace and the
//!   holder), in `attacher-hub status`, in `attacher_hub_lease_guard_blocked` and in a log line
//!   naming the namespace, the holder and the fix. The sidecar stops (without releasing its
//!   Lease, as v4.13 does by default): the hub leads once the Lease has expired and attaches.
//!   A sidecar started again in the other namespace while the hub leads makes the hub step
//!   down. A monitor samples both processes all along: the two never both lead for longer
//!   than the time the hub needs to see a renewal of a sidecar that started leading without
//!   looking (the Go sidecar has no guard), and never while the hub is the newcomer.
//! * `without_the_cluster_wide_list_the_hub_says_so_and_leads_as_before`: without RBAC for the
//!   list, the hub reports the guard unavailable (`/drivers`, `attacher-hub status`,
//!   `attacher_hub_lease_guard_available 0`, a log line with the fix) and leads as it did
//!   before the guard existed. What it says is one line under 200 characters naming the
//!   refusal, the missing grant (verb, resource, scope) and the component or chart value that
//!   gives it, never a dump of the API server's Status.
//!
//! Both programs take their identity from the host name, so each runs in a UTS namespace of
//! its own (`support::under_hostname`).

use crate::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use support::{
    Attacher, Cluster, MockCsi, MockCsiOptions, Probe, Program, PvBuilder, WAIT_TIMEOUT,
    create_csinode, create_node, create_va, eventually, go_duration, is_attached,
    sanitize_driver_name, unique_driver_name, unique_name, wait_deleted, wait_for,
};

/// Short Lease timings, so that expiry and hand-over take seconds.
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);

/// How long the hub may take to notice a holder in another namespace renewing: two of its
/// checks (one retry period apart) must see the record change, plus process start and a
/// loaded machine.
const NOTICE: Duration = Duration::from_secs(15);

/// The leader-election flags both programs get.
fn election(namespace: &str) -> Vec<String> {
    vec![
        "--leader-election".into(),
        format!("--leader-election-namespace={namespace}"),
        format!("--leader-election-lease-duration={}", go_duration(LEASE)),
        format!("--leader-election-renew-deadline={}", go_duration(RENEW)),
        format!("--leader-election-retry-period={}", go_duration(RETRY)),
    ]
}

/// The Go sidecar for `mock`'s driver with `kubeconfig`, electing in `namespace`.
fn go_sidecar(cluster: &Cluster, mock: &MockCsi, kubeconfig: &str, namespace: &str) -> Attacher {
    let mut args = vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--csi-address={}", mock.socket().display()),
        "--timeout=15s".into(),
        "--v=4".into(),
    ];
    args.extend(election(namespace));
    Attacher::go(cluster, "go", &args)
}

/// attacher-hub for `mock`'s driver (sidecar mode, the Go sidecar's flags) with `kubeconfig`,
/// electing in `namespace`.
fn hub(mock: &MockCsi, kubeconfig: &str, namespace: &str) -> Attacher {
    let mut args = vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--csi-address={}", mock.socket().display()),
        "--timeout=15s".into(),
        "-v=2".into(),
    ];
    args.extend(election(namespace));
    Attacher::hub("hub", &args)
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

/// The holder of Lease `name` in `namespace` (`None`: no Lease or no holder).
async fn holder(client: &Client, namespace: &str, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// `attacher-hub status --address ...` of `hub`.
async fn status(hub: &Attacher) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .args(["status", "--address"])
        .arg(format!("http://127.0.0.1:{}", hub.port))
        .output()
        .await
        .expect("run attacher-hub status");
    assert!(
        out.status.success(),
        "attacher-hub status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What operators read (a note, a reason, a log line): one line under 200 characters, never a
/// `Debug` dump of an API error.
fn assert_operator_text(text: &str, what: &str) {
    assert!(!text.contains('\n'), "{what} spans lines: {text}");
    assert!(
        text.chars().count() < 200,
        "{what} has {} characters: {text}",
        text.chars().count()
    );
    for dump in ["Status {", "ErrorResponse {", "StatusDetails {", "ApiError"] {
        assert!(!text.contains(dump), "{what} has a dump ({dump}): {text}");
    }
}

/// What the monitor saw of both attachers.
#[derive(Debug, Default)]
struct Seen {
    samples: usize,
    /// When both said they led.
    both: Vec<Instant>,
}

/// Samples "does the hub lead" before and after "does the Go sidecar lead" (the sidecar on
/// the port in `go_port`, 0 for none) until stopped; both lead in a sample when the hub did at
/// both of its reads and Go at its one.
fn monitor(
    hub: Probe,
    go_port: Arc<AtomicU16>,
    driver: String,
) -> (CancellationToken, tokio::task::JoinHandle<Seen>) {
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let mut seen = Seen::default();
        while !token.is_cancelled() {
            let port = go_port.load(Ordering::Relaxed);
            let go = Probe {
                program: Program::Go,
                port,
            };
            let h1 = hub.leads(&driver).await == Some(true);
            let g = port != 0 && go.leads(&driver).await == Some(true);
            let h2 = hub.leads(&driver).await == Some(true);
            seen.samples += 1;
            if h1 && g && h2 {
                seen.both.push(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_sidecar_leading_in_another_namespace_keeps_the_hub_from_leading() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let driver = unique_driver_name("guard");
    let lease = format!("external-attacher-leader-{}", sanitize_driver_name(&driver));
    let mock = MockCsi::start(
        cluster,
        &driver,
        MockCsiOptions {
            volumes: 4,
            ..MockCsiOptions::default()
        },
    )
    .await;
    // The sidecar's Lease in `default` (the attacher identity's namespace); the hub's in a
    // namespace of its own, as a hub installed next to a sidecar would have it.
    let go_ns = "default";
    let hub_ns = unique_name("guard-hub");
    create_namespace(&client, &hub_ns).await;
    let node = unique_name("node");
    create_node(&client, &node).await;
    create_csinode(&client, &node, &driver, mock.node_id()).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let mut volumes = mock.volumes.clone().into_iter();
    let mut created = Vec::new();
    let mut new_va = async |client: &Client| {
        let (pv, va) = (unique_name("pv"), unique_name("va"));
        let handle = volumes.next().expect("a free volume");
        PvBuilder::new(&pv, &driver, &handle).create(client).await;
        create_va(client, &va, &driver, &node, &pv).await;
        created.push(va.clone());
        va
    };

    // 1. The Go sidecar leads.
    let attacher_kubeconfig = cluster.attacher_kubeconfig.display().to_string();
    let admin_kubeconfig = cluster.kubeconfig.display().to_string();
    let mut go = go_sidecar(cluster, &mock, &attacher_kubeconfig, go_ns);
    eventually("the Go sidecar leads", WAIT_TIMEOUT, || async {
        (go.leads(&driver).await == Some(true)).then_some(())
    })
    .await;

    // 2. attacher-hub starts in its own namespace (admin: it may list Leases everywhere).
    let mut h = hub(&mock, &admin_kubeconfig, &hub_ns);
    let go_port = Arc::new(AtomicU16::new(go.port));
    let (stop, samples) = monitor(h.probe(), go_port.clone(), driver.clone());

    let blocked = eventually("the hub reports the driver blocked", NOTICE * 2, || async {
        let d = h.driver(&driver).await?;
        (d["state"]["state"] == "blocked").then_some(d)
    })
    .await;
    assert_eq!(blocked["state"]["namespace"], go_ns, "{blocked}");
    assert_eq!(
        blocked["state"]["holder"],
        go.identity.as_str(),
        "{blocked}"
    );
    let reason = blocked["state"]["reason"].as_str().unwrap_or_default();
    for needle in [
        format!("namespace {go_ns}"),
        go.identity.clone(),
        format!("leaderElection.namespace: {go_ns}"),
        format!("--leader-election-namespace={go_ns}"),
    ] {
        assert!(
            reason.contains(&needle),
            "/drivers reason lacks {needle:?}: {reason}"
        );
    }
    assert_eq!(blocked["leaseGuard"]["state"], "blocked", "{blocked}");
    let table = status(&h).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&driver) && l.contains(" blocked ")),
        "attacher-hub status shows the driver blocked:\n{table}"
    );
    assert!(
        table.contains(&format!("note: {driver}: blocked: "))
            && table.contains(&format!("leaderElection.namespace: {go_ns}")),
        "attacher-hub status explains it:\n{table}"
    );
    let series = format!(
        "attacher_hub_lease_guard_blocked{{driver_name=\"{driver}\",holder=\"{}\",lease_namespace=\"{go_ns}\"}} 1",
        go.identity
    );
    eventually(
        "the blocked metric names the other Lease",
        NOTICE,
        || async {
            h.metrics()
                .await?
                .lines()
                .any(|l| l == series)
                .then_some(())
        },
    )
    .await;
    h.process
        .wait_for_output(&format!("--leader-election-namespace={go_ns}"), 1, NOTICE)
        .await
        .expect("a log line with the fix");
    let log = format!("{}{}", h.process.stdout(), h.process.stderr());
    let line = log
        .lines()
        .find(|l| {
            l.contains("not leading") && l.contains(&format!("--leader-election-namespace={go_ns}"))
        })
        .unwrap_or_else(|| panic!("no log line naming the fix:\n{log}"));
    assert!(
        line.contains(&go.identity) && line.contains(&format!("namespace {go_ns}")),
        "the log line names the holder and the namespace: {line}"
    );

    // 3. Volumes attach, by the sidecar: the hub makes no CSI call and takes no Lease.
    for _ in 0..2 {
        let va = new_va(&client).await;
        wait_for(&vas, &va, "attached", is_attached(), WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{va} attached by the sidecar: {e}"));
    }
    assert_eq!(
        h.publish_calls().await,
        0,
        "the blocked hub published nothing"
    );
    assert!(go.publish_calls().await >= 2, "the sidecar attached them");
    assert_eq!(
        holder(&client, &hub_ns, &lease).await,
        None,
        "the blocked hub never took its own Lease"
    );
    assert_ne!(h.leads(&driver).await, Some(true));

    // 4. The sidecar stops (SIGTERM; v4.13 keeps its Lease): once the Lease has expired the
    //    hub leads, in its own namespace, and attaches.
    go_port.store(0, Ordering::Relaxed);
    go.signal("-TERM");
    let stopped = Instant::now();
    let _ = go.process.stop().await;
    eventually(
        "the hub leads once the sidecar's Lease expired",
        NOTICE * 2,
        || async { (h.leads(&driver).await == Some(true)).then_some(()) },
    )
    .await;
    eprintln!(
        "guard: the hub led {:.1}s after the sidecar stopped (lease duration {LEASE:?})",
        stopped.elapsed().as_secs_f64()
    );
    assert_eq!(
        holder(&client, &hub_ns, &lease).await.as_deref(),
        Some(h.identity.as_str())
    );
    let va = new_va(&client).await;
    wait_for(&vas, &va, "attached", is_attached(), WAIT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{va} attached by the hub: {e}"));
    assert!(h.publish_calls().await >= 1, "the hub attached it");
    let d = h.driver(&driver).await.expect("/drivers");
    assert_eq!(d["leaseGuard"]["state"], "clear", "{d}");

    // 5. A sidecar started again in the other namespace leads at once (it has no guard); the
    //    hub sees it renew and steps down.
    let restarted = Instant::now();
    let mut go = go_sidecar(cluster, &mock, &attacher_kubeconfig, go_ns);
    go_port.store(go.port, Ordering::Relaxed);
    eventually("the new sidecar leads", WAIT_TIMEOUT, || async {
        (go.leads(&driver).await == Some(true)).then_some(())
    })
    .await;
    let since = Instant::now();
    eventually("the hub steps down for the new sidecar", NOTICE, || async {
        let d = h.driver(&driver).await?;
        (d["state"]["state"] == "blocked").then_some(())
    })
    .await;
    let stepped_down = Instant::now();
    eprintln!(
        "guard: the hub stepped down {:.1}s after the new sidecar led",
        stepped_down.duration_since(since).as_secs_f64()
    );
    let va = new_va(&client).await;
    wait_for(&vas, &va, "attached", is_attached(), WAIT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{va} attached after the hub stepped down: {e}"));

    stop.cancel();
    let seen = samples.await.expect("the monitor");
    eprintln!(
        "guard: {} samples, both leading in {} of them",
        seen.samples,
        seen.both.len()
    );
    // Both led only in step 5, where the sidecar (no guard) started leading next to the
    // leading hub, and only until the hub saw it renew.
    assert!(
        seen.both.iter().all(|t| *t >= restarted),
        "both led before step 5, while the hub was the newcomer: {:?}",
        seen.both.iter().filter(|t| **t < restarted).count()
    );
    // (A sample reads for a few hundred milliseconds: one may end just after the step-down.)
    assert!(
        seen.both
            .iter()
            .all(|t| *t <= stepped_down + Duration::from_secs(1)),
        "both still led after the hub stepped down"
    );
    h.assert_running();

    // Clean up.
    for va in &created {
        let _ = vas.delete(va, &DeleteParams::default()).await;
    }
    for va in &created {
        let _ = wait_deleted(&vas, va, WAIT_TIMEOUT).await;
    }
    h.process.stop().await;
    go.process.stop().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&hub_ns, &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_cluster_wide_list_the_hub_says_so_and_leads_as_before() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let driver = unique_driver_name("unguarded");
    let mock = MockCsi::start(cluster, &driver, MockCsiOptions::default()).await;
    let go_ns = unique_name("unguarded-go");
    create_namespace(&client, &go_ns).await;
    // The Go sidecar (admin: it may elect anywhere) leads in its namespace ...
    let admin_kubeconfig = cluster.kubeconfig.display().to_string();
    let go = go_sidecar(cluster, &mock, &admin_kubeconfig, &go_ns);
    eventually("the Go sidecar leads", WAIT_TIMEOUT, || async {
        (go.leads(&driver).await == Some(true)).then_some(())
    })
    .await;
    // ... and the hub, with external-attacher's RBAC (no list of Leases in all namespaces),
    // cannot see it: it leads as it did before the guard, and says it cannot guard.
    let attacher_kubeconfig = cluster.attacher_kubeconfig.display().to_string();
    let mut h = hub(&mock, &attacher_kubeconfig, "default");
    let d = eventually("the hub leads without a guard", NOTICE * 2, || async {
        let d = h.driver(&driver).await?;
        (d["state"]["state"] == "leading").then_some(d)
    })
    .await;
    assert_eq!(d["leaseGuard"]["state"], "unavailable", "{d}");
    // One line naming the refusal, the missing grant and what gives it; no dump of the API
    // server's Status (kube's own text of the error had one: about 1,500 characters).
    let reason = d["leaseGuard"]["reason"].as_str().unwrap_or_default();
    assert_operator_text(reason, "/drivers leaseGuard.reason");
    assert_eq!(
        reason,
        "403 Forbidden: no grant to list leases.coordination.k8s.io cluster-wide; add deploy/components/lease-guard (chart: rbac.leaseGuard=true)"
    );
    let table = status(&h).await;
    let prefix = format!("note: {driver}: lease guard unavailable: ");
    let note = table
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("attacher-hub status says the guard is off:\n{table}"));
    assert_operator_text(note, "the status note");
    assert_eq!(note, reason, "{table}");
    for line in table.lines().filter(|l| l.starts_with("note: ")) {
        assert!(
            !line.contains("Status {") && !line.contains("ApiError"),
            "a note with a dump: {line}"
        );
    }
    let series = format!("attacher_hub_lease_guard_available{{driver_name=\"{driver}\"}} 0");
    eventually("attacher_hub_lease_guard_available 0", NOTICE, || async {
        h.metrics()
            .await?
            .lines()
            .any(|l| l == series)
            .then_some(())
    })
    .await;
    h.process
        .wait_for_output(
            "lease guard unavailable: 403 Forbidden: no grant to list leases.coordination.k8s.io cluster-wide",
            1,
            NOTICE,
        )
        .await
        .expect("a log line");
    let log = format!("{}{}", h.process.stdout(), h.process.stderr());
    for dump in ["Status {", "ErrorResponse {", "StatusDetails {"] {
        assert!(
            !log.contains(dump),
            "a Debug dump ({dump}) in the log:\n{log}"
        );
    }
    h.assert_running();
    h.process.stop().await;
    drop(go);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&go_ns, &DeleteParams::default()).await;
}
