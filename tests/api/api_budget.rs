//! API budgets against the real API server: each driver of a hub has the budget its
//! sidecar had, never waiting for another driver's tokens; the optional process-wide cap lets a
//! quiet driver through while another floods it; `/drivers`, the metrics and the log tell why a
//! driver waits; and a detach costs one API write, not two.
//!
//! The assertions compare progress, not clocks: "the quiet driver's volume was attached while
//! most of the busy driver's volumes were still waiting" holds on a loaded machine as well,
//! because the budgets (not the CPU) pace the busy driver.

use crate::hub;
use crate::support;

use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use serde_json::Value;

use hub::{
    AttachWatch, Hub, HubOptions, Planned, RustMock, create_all, create_node_with_drivers,
    delete_all, driver_entry, drivers_yaml,
};
use support::{Cluster, unique_driver_name, unique_name};

/// Limit for a batch of attaches or detaches.
const BATCH_TIMEOUT: Duration = Duration::from_secs(180);
/// Limit for a driver to come up in `/drivers`.
const STATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Volumes each mock driver has (`vol-0` ...).
const VOLUMES: usize = 30;

/// A hub serving a busy and a quiet driver on one node.
struct Setup {
    client: kube::Client,
    busy: RustMock,
    quiet: RustMock,
    node: String,
    hub: Hub,
    _config: tempfile::TempDir,
}

async fn setup(tag: &str, flags: &[&str]) -> Setup {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let busy = RustMock::start(&unique_driver_name(&format!("{tag}-busy")), VOLUMES).await;
    let quiet = RustMock::start(&unique_driver_name(&format!("{tag}-quiet")), VOLUMES).await;
    let node = unique_name(&format!("{tag}-node"));
    create_node_with_drivers(
        &client,
        &node,
        &[
            (busy.name.clone(), format!("{node}-id")),
            (quiet.name.clone(), format!("{node}-id")),
        ],
    )
    .await;
    let dir = tempfile::Builder::new()
        .prefix("ah-budget-")
        .tempdir()
        .expect("temp dir");
    let config = dir.path().join("drivers.yaml");
    std::fs::write(
        &config,
        drivers_yaml(&[
            driver_entry(&busy.socket, &busy.name),
            driver_entry(&quiet.socket, &quiet.name),
        ]),
    )
    .expect("write drivers.yaml");
    let mut hub = Hub::start(
        cluster,
        &format!("hub-{tag}"),
        HubOptions {
            config: Some(config),
            extra_args: flags.iter().map(|f| (*f).to_string()).collect(),
            ..HubOptions::default()
        },
    )
    .await;
    let names = [busy.name.clone(), quiet.name.clone()];
    hub.wait_drivers("both drivers leading", STATE_TIMEOUT, |ds| {
        names.iter().all(|n| {
            ds.iter()
                .any(|d| d["name"] == n.as_str() && hub::state_of(d) == "leading")
        })
    })
    .await;
    Setup {
        client,
        busy,
        quiet,
        node,
        hub,
        _config: dir,
    }
}

fn plan(driver: &RustMock, node: &str, tag: &str, n: usize) -> Vec<Planned> {
    (0..n)
        .map(|i| {
            Planned::new(
                &unique_name(&format!("{tag}-{i}")),
                &driver.name,
                node,
                &format!("vol-{i}"),
            )
        })
        .collect()
}

fn names(plan: &[Planned]) -> Vec<String> {
    plan.iter().map(|p| p.va.clone()).collect()
}

/// The sum of every sample of `metric` whose labels include all of `labels`.
fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metrics(hub: &Hub) -> String {
    let (code, body) = hub.get("/metrics").await;
    assert_eq!(code, 200, "/metrics: {body}");
    body
}

/// The `apiBudget` entry `/drivers` shows for `driver`.
async fn budget_of(hub: &Hub, driver: &str) -> Value {
    let d = hub
        .driver(driver)
        .await
        .unwrap_or_else(|| panic!("{driver} is not in /drivers"));
    d["apiBudget"].clone()
}

/// Waits until `quiet` is attached; returns how many of `busy` were attached then.
async fn busy_attached_when_quiet_was(
    watch: &AttachWatch,
    s: &Setup,
    busy: &[String],
    quiet: &[String],
) -> usize {
    if let Err(e) = watch.wait_attached(quiet, BATCH_TIMEOUT).await {
        eprintln!("/drivers: {:#}", Value::Array(s.hub.drivers().await));
        panic!("{e}");
    }
    // The watch saw the quiet VA attached; busy VAs attached before that were seen earlier.
    let when = watch.attached(&quiet[0]).expect("attached").0;
    busy.iter()
        .filter(|n| watch.attached(n).is_some_and(|(t, _)| t <= when))
        .count()
}

/// Each driver of a hub has the budget its sidecar had: a quiet driver's volume attaches while a
/// busy driver works through a backlog that its own budget paces. With one budget shared by
/// both (the old behaviour) the quiet volume waited behind most of the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_driver_never_waits_for_a_busy_drivers_budget() {
    // 2 requests per second, burst 1: the busy driver's 20 VAs (3 writes each) take ~30 s.
    let s = setup("own", &["--kube-api-qps=2", "--kube-api-burst=1"]).await;
    let budget = budget_of(&s.hub, &s.busy.name).await;
    assert_eq!(
        budget["limit"],
        serde_json::json!({"kind": "rate", "qps": 2.0, "burst": 1}),
        "{budget}"
    );
    assert!(budget["hubCap"].is_null(), "no cap by default: {budget}");

    let run = unique_name("run-own");
    let watch = AttachWatch::start(&s.client, &run).await;
    let busy_plan = plan(&s.busy, &s.node, "own-busy", 20);
    let busy = names(&busy_plan);
    create_all(&s.client, &busy_plan, &run).await;
    // The busy driver is working through its backlog: one of its VAs is attached.
    let started = std::time::Instant::now();
    while busy.iter().all(|n| watch.attached(n).is_none()) {
        assert!(
            started.elapsed() < BATCH_TIMEOUT,
            "no busy VA attached within {BATCH_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let quiet_plan = plan(&s.quiet, &s.node, "own-quiet", 1);
    let quiet = names(&quiet_plan);
    let created = std::time::Instant::now();
    create_all(&s.client, &quiet_plan, &run).await;
    let busy_done = busy_attached_when_quiet_was(&watch, &s, &busy, &quiet).await;
    println!(
        "quiet driver attached {:?} after its VA was created, when {busy_done} of 20 busy VAs were attached",
        watch.attached(&quiet[0]).expect("attached").0 - created
    );
    // Sharing one budget, the quiet driver's 3 writes would queue behind the busy driver's
    // workers and its volume would come last or nearly.
    assert!(
        busy_done <= 12,
        "the quiet driver's volume waited for the busy driver: {busy_done} of 20 busy VAs were attached first"
    );

    // The busy driver was held by its own budget, and says so.
    watch
        .wait_attached(&busy, BATCH_TIMEOUT)
        .await
        .expect("all busy VAs attached");
    // The watch can see the last status write before the hub has read its response (and
    // counted the request): read the metrics once the busy driver's counts have settled, every
    // request that waited for the budget answered.
    let settled = |text: &str| {
        let of = |name: &str| metric_sum(text, name, &[("driver_name", &s.busy.name)]);
        of("attacher_hub_api_budget_wait_seconds_count") == of("attacher_hub_api_requests_total")
    };
    let mut text = metrics(&s.hub).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !settled(&text) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        text = metrics(&s.hub).await;
    }
    let throttled = metric_sum(
        &text,
        "attacher_hub_api_throttled_requests_total",
        &[("driver_name", &s.busy.name), ("limiter", "driver")],
    );
    assert!(throttled > 0.0, "busy driver never throttled:\n{text}");
    let hub_throttled = metric_sum(
        &text,
        "attacher_hub_api_throttled_requests_total",
        &[("driver_name", &s.busy.name), ("limiter", "hub")],
    );
    assert_eq!(hub_throttled, 0.0, "no cap, so no hub throttling");
    let waits = metric_sum(
        &text,
        "attacher_hub_api_budget_wait_seconds_count",
        &[("driver_name", &s.busy.name)],
    );
    let requests = metric_sum(
        &text,
        "attacher_hub_api_requests_total",
        &[("driver_name", &s.busy.name)],
    );
    assert!(
        waits >= 60.0 && waits == requests,
        "one budget wait per request: {waits} waits, {requests} requests"
    );
    assert_eq!(
        metric_sum(
            &text,
            "attacher_hub_api_budget_qps",
            &[("driver_name", &s.busy.name)]
        ),
        2.0
    );
    let budget = budget_of(&s.hub, &s.busy.name).await;
    assert!(
        budget["throttledTotal"].as_u64().is_some_and(|n| n > 0),
        "{budget}"
    );
    let logged = s.hub.log_lines("due to client-side throttling");
    assert!(
        logged.iter().any(|l| l.contains(&s.busy.name)),
        "no throttling log line for the busy driver"
    );

    // Detach: one write per VA (the finalizer), no status patch that could only answer 404.
    let before = metrics(&s.hub).await;
    let count = |text: &str, resource: &str| {
        metric_sum(
            text,
            "attacher_hub_api_requests_total",
            &[
                ("driver_name", &s.busy.name),
                ("verb", "PATCH"),
                ("resource", resource),
            ],
        )
    };
    let vas: Api<VolumeAttachment> = Api::all(s.client.clone());
    delete_all(&vas, &busy).await;
    watch
        .wait_gone(&busy, BATCH_TIMEOUT)
        .await
        .expect("busy VAs detached and gone");
    let after = metrics(&s.hub).await;
    assert_eq!(
        count(&after, "volumeattachments") - count(&before, "volumeattachments"),
        20.0,
        "one finalizer removal per detached VA"
    );
    assert_eq!(
        count(&after, "volumeattachments/status") - count(&before, "volumeattachments/status"),
        0.0,
        "no status patch after the VA is gone"
    );
    assert_eq!(
        metric_sum(
            &after,
            "attacher_hub_api_requests_total",
            &[("driver_name", &s.busy.name), ("code", "404")]
        ),
        0.0,
        "no write that could not succeed"
    );
    assert_eq!(s.busy.calls("ControllerUnpublishVolume").len(), 20);
    delete_all(&vas, &quiet).await;
}

/// The optional process-wide cap hands its tokens to waiting drivers in turn: a driver with
/// one volume is served within about a turn while another driver keeps 30 writes queued at
/// the cap. First come, first served would put it behind the whole queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_cap_lets_a_quiet_driver_through_a_flood() {
    let mut s = setup(
        "cap",
        &[
            "--kube-api-qps=-1",
            "--hub-kube-api-qps=3",
            "--hub-kube-api-burst=1",
            "--worker-threads=40",
        ],
    )
    .await;
    let budget = budget_of(&s.hub, &s.quiet.name).await;
    assert_eq!(
        budget["limit"],
        serde_json::json!({"kind": "unlimited"}),
        "{budget}"
    );
    assert_eq!(
        budget["hubCap"]["limit"],
        serde_json::json!({"kind": "rate", "qps": 3.0, "burst": 1}),
        "{budget}"
    );

    let run = unique_name("run-cap");
    let watch = AttachWatch::start(&s.client, &run).await;
    // 30 VAs x 3 writes at 3 per second: about 30 s of the cap, all queued at once.
    let busy_plan = plan(&s.busy, &s.node, "cap-busy", 30);
    let busy = names(&busy_plan);
    create_all(&s.client, &busy_plan, &run).await;
    // Wait until the flood holds the cap (requests waiting for it).
    let busy_name = s.busy.name.clone();
    s.hub
        .wait_drivers("the busy driver waiting for the cap", STATE_TIMEOUT, |ds| {
            ds.iter().any(|d| {
                d["name"] == busy_name.as_str()
                    && d["apiBudget"]["hubCap"]["waitingRequests"]
                        .as_u64()
                        .is_some_and(|n| n >= 10)
            })
        })
        .await;
    let quiet_plan = plan(&s.quiet, &s.node, "cap-quiet", 1);
    let quiet = names(&quiet_plan);
    create_all(&s.client, &quiet_plan, &run).await;
    let busy_done = busy_attached_when_quiet_was(&watch, &s, &busy, &quiet).await;
    println!("quiet driver attached when {busy_done} of 30 busy VAs were attached");
    assert!(
        busy_done <= 20,
        "the quiet driver waited behind the flood: {busy_done} of 30 busy VAs were attached first"
    );
    let text = metrics(&s.hub).await;
    assert!(
        metric_sum(
            &text,
            "attacher_hub_api_throttled_requests_total",
            &[("driver_name", &s.busy.name), ("limiter", "hub")],
        ) > 0.0,
        "the flood was held by the cap"
    );
    watch
        .wait_attached(&busy, BATCH_TIMEOUT)
        .await
        .expect("the flood attaches in the end");
    let vas: Api<VolumeAttachment> = Api::all(s.client.clone());
    delete_all(&vas, &busy).await;
    delete_all(&vas, &quiet).await;
}
