//! The shipped alert rules and Grafana dashboard against a real Prometheus
//! (Debian's `prometheus` package, which also provides `promtool`):
//!
//! * `promtool check rules` accepts the rule groups of the PrometheusRule;
//! * Prometheus scrapes two attacher-hub processes (sidecar mode, each with an
//!   in-process mock driver) while VolumeAttachments of both drivers fail
//!   once, attach and detach; then every expression of the dashboard (with
//!   the `driver` variable set to each driver and `$__rate_interval` to 1m)
//!   and every alert signal returns series for each driver (per-replica
//!   signals at least one, `absent()` none), and Prometheus
//!   evaluates every rule without error.
//! * Prometheus scrapes three attacher-hub processes through the scrape config Prometheus
//!   Operator generates for the shipped ServiceMonitor (`honor_labels: false`, the target
//!   labels `namespace`, `pod`, `service`, ... of the hub pod): a driver blocked by a Lease
//!   renewed in another namespace, one standing by while another identity renews its own
//!   Lease (a migration at its step 3), and one whose Lease the hub may not even read (a real
//!   loss). `AttacherHubLeaseHeldElsewhere` names the Lease's namespace in its labels and
//!   annotations, never the pod's; `AttacherHubLeaseLost` is pending for the real loss only.
//!
//! Missing `prometheus` or `promtool` is a failure, never a skip.

use crate::support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::Condition;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::process::Command;

use mock_csi_driver::{MockDriver, MockHandle, fault::Fault};
use support::{
    Attacher, ChildProcess, Cluster, PvBuilder, WAIT_TIMEOUT, create_csinode, create_node,
    create_va, eventually, http_get, is_attached, repo, sanitize_driver_name, tool,
    unique_driver_name, unique_name, wait_deleted, wait_for,
};

/// How to get prometheus and promtool.
const PROMETHEUS_TOOLS: &str = "install Debian's `prometheus` package (apt-get install prometheus)";

/// Scrape and rule-evaluation interval of the test Prometheus.
const SCRAPE_INTERVAL: &str = "1s";

/// What `$__rate_interval` becomes in dashboard queries.
const RATE_INTERVAL: &str = "1m";

/// A free loopback port (bound, then released for the child process).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// Percent-encodes a query parameter value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs an instant query; returns the result vector.
async fn query(port: u16, expr: &str) -> Vec<Value> {
    let (status, body) = http_get(port, &format!("/api/v1/query?query={}", encode(expr)))
        .await
        .expect("query Prometheus");
    let doc: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("Prometheus answered {status} {body:?} ({e}) to {expr}"));
    assert_eq!(
        doc["status"], "success",
        "Prometheus rejected {expr}: {body}"
    );
    doc["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The `driver_name` labels of a query result.
fn driver_names(result: &[Value]) -> BTreeSet<String> {
    result
        .iter()
        .filter_map(|s| s["metric"]["driver_name"].as_str())
        .map(str::to_string)
        .collect()
}

/// Every `expr` of the dashboard's panels (rows' nested panels included).
fn dashboard_exprs(panels: &[Value], out: &mut Vec<String>) {
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(expr.to_string());
            }
        }
        if let Some(nested) = panel["panels"].as_array() {
            dashboard_exprs(nested, out);
        }
    }
}

/// Splits an alert expression `<signal> <op> <threshold>` and returns the
/// same comparison with `bool`, which yields a series per signal series
/// (0 or 1) instead of none while nothing fires.
fn alert_signal(expr: &str) -> String {
    let expr = expr.trim();
    let (rest, threshold) = expr
        .rsplit_once(char::is_whitespace)
        .unwrap_or_else(|| panic!("alert expression without a threshold: {expr}"));
    assert!(
        threshold.parse::<f64>().is_ok(),
        "alert expression must end in a numeric threshold: {expr}"
    );
    let rest = rest.trim_end();
    let op = [">=", "<=", "==", "!=", ">", "<"]
        .into_iter()
        .find(|op| rest.ends_with(op))
        .unwrap_or_else(|| panic!("alert expression must end in `<op> <threshold>`: {expr}"));
    let signal = rest[..rest.len() - op.len()].trim_end();
    format!("{signal} {op} bool {threshold}")
}

/// Starts Prometheus on a free loopback port with `rules` and one scrape config, its data in
/// `work`; returns once it is ready.
async fn start_prometheus(
    prometheus: &std::path::Path,
    work: &std::path::Path,
    rules: &std::path::Path,
    scrape: Value,
) -> (ChildProcess, u16) {
    let port = free_port();
    let config = work.join("prometheus.yml");
    let config_doc = json!({
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [rules],
        "scrape_configs": [scrape],
    });
    // JSON is YAML: Prometheus reads it as its configuration file.
    std::fs::write(&config, config_doc.to_string()).expect("write prometheus.yml");
    let mut cmd = Command::new(prometheus);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            work.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null());
    let mut prom = ChildProcess::spawn("prometheus", cmd);
    let start = Instant::now();
    loop {
        if let Ok((200, _)) = http_get(port, "/-/ready").await {
            break;
        }
        if prom.exited().is_some() {
            prom.dump_logs();
            panic!("prometheus exited");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "prometheus not ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (prom, port)
}

/// Holds once `status.attachError` is set.
/// An attach error from the driver itself (a gRPC code is recorded), not one
/// from an object that is not in the cache yet.
fn has_csi_attach_error() -> impl Condition<VolumeAttachment> {
    |va: Option<&VolumeAttachment>| {
        va.and_then(|va| va.status.as_ref())
            .and_then(|s| s.attach_error.as_ref())
            .is_some_and(|e| e.error_code.is_some())
    }
}

/// One driver: the in-process mock and the attacher-hub serving it.
struct Served {
    driver: String,
    mock: MockHandle,
    hub: ChildProcess,
    port: u16,
    _dir: tempfile::TempDir,
}

async fn serve_driver(cluster: &Cluster, tag: &str) -> Served {
    let driver = unique_driver_name(tag);
    let dir = tempfile::Builder::new()
        .prefix("ah-prom-")
        .tempdir()
        .expect("temp dir");
    let socket = dir.path().join("csi.sock");
    let mock = MockDriver::new(&driver)
        .volumes(2)
        .serve(&socket)
        .await
        .expect("start the mock driver");
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
    cmd.arg(format!(
        "--kubeconfig={}",
        cluster.attacher_kubeconfig.display()
    ))
    .arg(format!("--csi-address={}", socket.display()))
    .arg(format!("--http-endpoint=127.0.0.1:{port}"))
    .args([
        "--leader-election",
        "--leader-election-namespace=default",
        "--retry-interval-start=200ms",
        "--retry-interval-max=1s",
        "--timeout=5s",
    ]);
    let hub = ChildProcess::spawn(&format!("attacher-hub {tag}"), cmd);
    Served {
        driver,
        mock,
        hub,
        port,
        _dir: dir,
    }
}

/// Makes one attach fail, then attaches and detaches two VolumeAttachments
/// of the driver; returns once both are gone.
async fn exercise(cluster: &Cluster, served: &Served) {
    let client = cluster.client().await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let node = unique_name("node");
    create_node(&client, &node).await;
    create_csinode(&client, &node, &served.driver, &node).await;
    let mut names = Vec::new();
    for (i, volume) in ["vol-0", "vol-1"].into_iter().enumerate() {
        let pv = unique_name(&format!("pv{i}"));
        PvBuilder::new(&pv, &served.driver, volume)
            .create(&client)
            .await;
        let va = unique_name(&format!("va{i}"));
        if i == 0 {
            // A failed attach first: error series, a retry, then success.
            served.mock.set_fault(
                "ControllerPublishVolume",
                Fault::code(tonic::Code::Unavailable),
            );
            create_va(&client, &va, &served.driver, &node, &pv).await;
            wait_for(
                &vas,
                &va,
                "attachError with a gRPC code",
                has_csi_attach_error(),
                WAIT_TIMEOUT,
            )
            .await
            .unwrap();
            served.mock.clear_faults();
        } else {
            create_va(&client, &va, &served.driver, &node, &pv).await;
        }
        wait_for(&vas, &va, "attached", is_attached(), WAIT_TIMEOUT)
            .await
            .unwrap();
        names.push(va);
    }
    for va in &names {
        vas.delete(va, &DeleteParams::default())
            .await
            .expect("delete VA");
    }
    for va in &names {
        wait_deleted(&vas, va, WAIT_TIMEOUT).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alert_queries_return_series_for_every_driver() {
    let prometheus = tool("prometheus", PROMETHEUS_TOOLS);
    let promtool = tool("promtool", PROMETHEUS_TOOLS);
    let cluster = Cluster::get();
    let work = tempfile::Builder::new()
        .prefix("ah-prometheus-")
        .tempdir()
        .expect("temp dir");

    // The PrometheusRule's groups as a Prometheus rules file; promtool checks it.
    let rule_text =
        std::fs::read_to_string(repo().join("deploy/overlays/observability/prometheusrule.yaml"))
            .expect("read prometheusrule.yaml");
    let rule: Value = serde_saphyr::from_str(&rule_text).expect("PrometheusRule YAML");
    let groups = rule["spec"]["groups"].clone();
    let rules_file = work.path().join("rules.yml");
    // JSON is YAML: Prometheus reads it as a rules file.
    std::fs::write(&rules_file, json!({ "groups": groups }).to_string()).expect("write rules");
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules_file)
        .output()
        .await
        .expect("run promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool check rules:\n{report}");
    let alerts: Vec<(String, String)> = groups
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["alert"].as_str().expect("alert rules only").to_string(),
                r["expr"].as_str().expect("expr").to_string(),
            )
        })
        .collect();
    let wanted = [
        "AttacherHubDriverDown",
        "AttacherHubLeaseLost",
        "AttacherHubBacklogGrowing",
        "AttacherHubAttachErrorRate",
        "AttacherHubAttachLatencyHigh",
        "AttacherHubDetachErrorRate",
        "AttacherHubConfigReloadFailed",
        "AttacherHubDriverUnserved",
        "AttacherHubAbsent",
    ];
    for w in wanted {
        assert!(alerts.iter().any(|(a, _)| a == w), "alert {w} is missing");
    }
    assert!(
        report.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "promtool: {report}"
    );

    // Two drivers, each with its own attacher-hub.
    let a = serve_driver(cluster, "prom-a").await;
    let b = serve_driver(cluster, "prom-b").await;
    let served = [&a, &b];

    // Prometheus scraping both, evaluating the rules.
    let targets: Vec<String> = served
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let scrape = json!({
        "job_name": "attacher-hub",
        "static_configs": [{"targets": targets}],
    });
    let (mut prom, prom_port) =
        start_prometheus(&prometheus, work.path(), &rules_file, scrape).await;

    // Work for both drivers, side by side.
    tokio::join!(exercise(cluster, &a), exercise(cluster, &b));

    // Wait until Prometheus has scraped both detaches.
    let drivers: BTreeSet<String> = served.iter().map(|s| s.driver.clone()).collect();
    let start = Instant::now();
    loop {
        let done = query(prom_port, "attacher_hub_detach_duration_seconds_count >= 2").await;
        if driver_names(&done) == drivers {
            break;
        }
        assert!(
            start.elapsed() < WAIT_TIMEOUT,
            "Prometheus did not see both drivers' detaches: {done:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // rate() needs two samples of a series inside its window: let a few
    // more scrapes land after the last change.
    tokio::time::sleep(Duration::from_secs(4)).await;

    // Every dashboard query, for each driver.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            repo().join("deploy/overlays/observability/dashboards/attacher-hub.json"),
        )
        .expect("read the dashboard"),
    )
    .expect("dashboard JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(dashboard["panels"].as_array().expect("panels"), &mut exprs);
    assert!(exprs.len() >= 10, "dashboard queries: {exprs:?}");
    let mut failures = Vec::new();
    for expr in &exprs {
        assert!(expr.contains("$driver"), "not filtered by driver: {expr}");
        for driver in &drivers {
            let q = expr
                .replace("${driver}", driver)
                .replace("$driver", driver)
                .replace("$__rate_interval", RATE_INTERVAL);
            let result = query(prom_port, &q).await;
            let names = driver_names(&result);
            if names != BTreeSet::from([driver.clone()]) {
                failures.push(format!("{q}\n  -> {result:?}"));
            }
        }
    }

    // The driver variable's values: label_values(<metric>, driver_name).
    let variable = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .find(|v| v["name"] == "driver")
        .expect("a `driver` variable");
    let definition = variable["definition"].as_str().expect("definition");
    let metric = definition
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(", driver_name)"))
        .unwrap_or_else(|| panic!("unexpected variable query {definition}"));
    let values = driver_names(&query(prom_port, metric).await);
    assert!(
        drivers.is_subset(&values),
        "the driver variable offers {values:?}"
    );

    // Every alert signal: for each driver when it is per driver, at least one series when it is
    // per replica, none for absent() (the hubs are there).
    for (alert, expr) in &alerts {
        let q = alert_signal(expr);
        let result = query(prom_port, &q).await;
        if expr.starts_with("absent(") {
            if !result.is_empty() {
                failures.push(format!("{alert}: {q}\n  -> {result:?} while the hubs run"));
            }
        } else if !expr.contains("driver_name") {
            if result.is_empty() {
                failures.push(format!("{alert}: {q}\n  -> no series"));
            }
        } else {
            let names = driver_names(&result);
            if !drivers.is_subset(&names) {
                failures.push(format!("{alert}: {q}\n  -> drivers {names:?}"));
            }
        }
    }

    // Prometheus evaluates every rule without error.
    let (_, body) = http_get(prom_port, "/api/v1/rules").await.expect("rules");
    let doc: Value = serde_json::from_str(&body).expect("rules JSON");
    for group in doc["data"]["groups"].as_array().expect("rule groups") {
        for r in group["rules"].as_array().expect("rules") {
            if r["health"] != "ok" {
                failures.push(format!(
                    "rule {} is {}: {}",
                    r["name"], r["health"], r["lastError"]
                ));
            }
        }
    }

    if !failures.is_empty() {
        a.hub.dump_logs();
        b.hub.dump_logs();
        panic!(
            "{} queries without a series for each driver:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    eprintln!(
        "{} dashboard queries x {} drivers and {} alert signals returned series for every driver",
        exprs.len(),
        drivers.len(),
        alerts.len()
    );
    prom.stop().await;
    for s in [a, b] {
        let Served { mut hub, mock, .. } = s;
        hub.stop().await;
        mock.shutdown().await;
    }
}

// === through a ServiceMonitor ==============================================

/// Lease timings of the hubs below, so that expiry takes seconds.
const LEASE_FLAGS: [&str; 3] = [
    "--leader-election-lease-duration=4s",
    "--leader-election-renew-deadline=3s",
    "--leader-election-retry-period=1s",
];

/// The lease duration another holder writes into its Lease (the hubs' own).
const FOREIGN_LEASE_SECONDS: i32 = 4;

/// One hub pod as Kubernetes endpoints discovery reports it behind the metrics Service.
struct HubPod {
    /// `host:port` of its metrics listener.
    address: String,
    /// The pod's name.
    pod: String,
}

/// The `__meta_kubernetes_*` name of a Kubernetes label (Prometheus replaces every character
/// outside `[a-zA-Z0-9_]` with `_`).
fn meta_label_name(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The scrape config Prometheus Operator generates for endpoint 0 of `monitor` (a
/// ServiceMonitor in `namespace`) whose selector finds `service` (a Service of that namespace)
/// with the hub `pods` behind it: `generateServiceMonitorConfig` of its
/// `pkg/prometheus/promcfg.go` (role `endpoints`, the default label selection by relabeling,
/// one shard), field for field. Only the discovery differs: instead of
/// `kubernetes_sd_configs`, each pod is a static target carrying the `__meta_kubernetes_*`
/// labels endpoints discovery gives it, so that the relabeling rules work on what they work
/// on in a cluster.
fn service_monitor_scrape(
    monitor: &Value,
    namespace: &str,
    service: &Value,
    pods: &[HubPod],
) -> Value {
    let name = monitor["metadata"]["name"]
        .as_str()
        .expect("ServiceMonitor name");
    let endpoint = &monitor["spec"]["endpoints"][0];
    let port = endpoint["port"].as_str().expect("endpoints[0].port");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector.matchLabels");
    let service_name = service["metadata"]["name"].as_str().expect("Service name");
    let container = "attacher-hub";

    let mut relabel =
        vec![json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"})];
    // The operator sorts the selector's keys.
    let keys: BTreeSet<&String> = selector.keys().collect();
    for key in keys {
        let meta = meta_label_name(key);
        relabel.push(json!({
            "action": "keep",
            "source_labels": [
                format!("__meta_kubernetes_service_label_{meta}"),
                format!("__meta_kubernetes_service_labelpresent_{meta}"),
            ],
            "regex": format!("({});true", selector[key.as_str()].as_str().expect("a label value")),
        }));
    }
    relabel.extend([
        json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port}),
        json!({
            "source_labels": ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"],
            "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node",
        }),
        json!({
            "source_labels": ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"],
            "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod",
        }),
        json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
        json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
        json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
        json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
        json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}),
        json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}),
        json!({"target_label": "endpoint", "replacement": port}),
        // Sharding by address over one shard; `$(SHARD)` is replaced by the shard's number
        // (0) when the operator's config reloader writes the file Prometheus reads.
        json!({
            "source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash",
            "regex": "(.+);", "replacement": "$1", "action": "replace",
        }),
        json!({"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"}),
        json!({"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": "0;|.+;.+", "action": "keep"}),
    ]);

    let service_labels = service["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let service_port = service["spec"]["ports"][0]["name"]
        .as_str()
        .expect("the Service's port name");
    let targets: Vec<Value> = pods
        .iter()
        .map(|p| {
            let mut labels = serde_json::Map::new();
            let mut put = |k: String, v: &str| {
                labels.insert(k, Value::String(v.to_string()));
            };
            put("__meta_kubernetes_namespace".into(), namespace);
            put("__meta_kubernetes_service_name".into(), service_name);
            for (k, v) in &service_labels {
                let meta = meta_label_name(k);
                put(
                    format!("__meta_kubernetes_service_label_{meta}"),
                    v.as_str().unwrap_or(""),
                );
                put(
                    format!("__meta_kubernetes_service_labelpresent_{meta}"),
                    "true",
                );
            }
            put("__meta_kubernetes_endpoint_port_name".into(), service_port);
            put(
                "__meta_kubernetes_endpoint_address_target_kind".into(),
                "Pod",
            );
            put(
                "__meta_kubernetes_endpoint_address_target_name".into(),
                &p.pod,
            );
            put("__meta_kubernetes_pod_name".into(), &p.pod);
            put("__meta_kubernetes_pod_container_name".into(), container);
            put("__meta_kubernetes_pod_phase".into(), "Running");
            json!({"targets": [p.address], "labels": labels})
        })
        .collect();

    json!({
        "job_name": format!("serviceMonitor/{namespace}/{name}/0"),
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "static_configs": targets,
        "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
        // The ServiceMonitor's interval is minutes of test time; scrape as often as the rules run.
        "scrape_interval": SCRAPE_INTERVAL,
        "relabel_configs": relabel,
    })
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

/// Another identity holding Lease `name` in `namespace` and renewing it every second, as a Go
/// external-attacher does, until the task is aborted.
fn renew_as(
    client: Client,
    namespace: &str,
    name: &str,
    holder: &str,
) -> tokio::task::JoinHandle<()> {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let (name, holder) = (name.to_string(), holder.to_string());
    tokio::spawn(async move {
        let acquired = MicroTime(k8s_openapi::jiff::Timestamp::now());
        loop {
            let spec = LeaseSpec {
                holder_identity: Some(holder.clone()),
                lease_duration_seconds: Some(FOREIGN_LEASE_SECONDS),
                acquire_time: Some(acquired.clone()),
                renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            };
            match leases.get_opt(&name).await {
                Ok(Some(mut lease)) => {
                    lease.spec = Some(spec);
                    let _ = leases.replace(&name, &PostParams::default(), &lease).await;
                }
                Ok(None) => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(spec),
                    };
                    let _ = leases.create(&PostParams::default(), &lease).await;
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// The labels of the active (pending or firing) alerts named `alert` for `driver`.
fn alerts_of(alerts: &[Value], alert: &str, driver: &str) -> Vec<Value> {
    alerts
        .iter()
        .filter(|a| a["labels"]["alertname"] == alert && a["labels"]["driver_name"] == driver)
        .cloned()
        .collect()
}

/// Prometheus's active alerts.
async fn active_alerts(port: u16) -> Vec<Value> {
    let (_, body) = http_get(port, "/api/v1/alerts").await.expect("alerts");
    let doc: Value = serde_json::from_str(&body).expect("alerts JSON");
    doc["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The last evaluation of every rule, as Prometheus reports it (RFC 3339).
async fn rule_evaluations(port: u16) -> Vec<k8s_openapi::jiff::Timestamp> {
    let (_, body) = http_get(port, "/api/v1/rules").await.expect("rules");
    let doc: Value = serde_json::from_str(&body).expect("rules JSON");
    doc["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["lastEvaluation"].as_str()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_service_monitor_the_lease_alerts_name_the_leases_namespace_and_a_live_holder_is_no_loss()
 {
    let prometheus = tool("prometheus", PROMETHEUS_TOOLS);
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let work = tempfile::Builder::new()
        .prefix("ah-servicemonitor-")
        .tempdir()
        .expect("temp dir");
    let rule: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("deploy/overlays/observability/prometheusrule.yaml"))
            .expect("read prometheusrule.yaml"),
    )
    .expect("PrometheusRule YAML");
    let rules_file = work.path().join("rules.yml");
    std::fs::write(
        &rules_file,
        json!({ "groups": rule["spec"]["groups"] }).to_string(),
    )
    .expect("write rules");

    // The hub pods' namespace (where the ServiceMonitor and the metrics Service are), the
    // namespace the hubs elect in, and the one another attacher of driver `a` elects in.
    let pod_ns = unique_name("hub-pods");
    let hub_ns = unique_name("hub-leases");
    let other_ns = unique_name("sidecar-leases");
    for ns in [&hub_ns, &other_ns] {
        create_namespace(&client, ns).await;
    }

    // a: blocked, its Lease renewed in another namespace; b: standing by, another identity
    // renews its own Lease (step 3 of a migration); c: a real loss, the hub may not even read
    // its Lease (the attacher identity has no grant in that namespace).
    let (a, b, c) = (
        unique_driver_name("sm-blocked"),
        unique_driver_name("sm-standby"),
        unique_driver_name("sm-lost"),
    );
    let lease = |d: &str| format!("external-attacher-leader-{}", sanitize_driver_name(d));
    let renewers = [
        renew_as(client.clone(), &other_ns, &lease(&a), "csi-a-controller-0"),
        renew_as(client.clone(), &hub_ns, &lease(&b), "csi-b-controller-0"),
    ];
    let admin = cluster.kubeconfig.display().to_string();
    let attacher = cluster.attacher_kubeconfig.display().to_string();
    let mut mocks = Vec::new();
    let mut hubs = Vec::new();
    let dir = tempfile::Builder::new()
        .prefix("ah-sm-")
        .tempdir()
        .expect("temp dir");
    for (driver, kubeconfig) in [(&a, &admin), (&b, &admin), (&c, &attacher)] {
        let socket = dir.path().join(format!("{}.sock", hubs.len()));
        mocks.push(
            MockDriver::new(driver)
                .serve(&socket)
                .await
                .expect("start the mock driver"),
        );
        let mut args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--csi-address={}", socket.display()),
            "--leader-election".into(),
            format!("--leader-election-namespace={hub_ns}"),
        ];
        args.extend(LEASE_FLAGS.map(String::from));
        hubs.push(Attacher::hub("sm", &args));
    }

    // Prometheus scraping them as Prometheus Operator would through the shipped ServiceMonitor
    // and the hub overlay's metrics Service.
    let yaml = |path: &str| -> Value {
        serde_saphyr::from_str(
            &std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}")),
        )
        .unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let monitor = yaml("deploy/overlays/observability/servicemonitor.yaml");
    let service = yaml("deploy/overlays/hub/service.yaml");
    let pods: Vec<HubPod> = hubs
        .iter()
        .zip(["hub-a", "hub-b", "hub-c"])
        .map(|(h, pod)| HubPod {
            address: format!("127.0.0.1:{}", h.port),
            pod: format!("attacher-hub-{pod}"),
        })
        .collect();
    let scrape = service_monitor_scrape(&monitor, &pod_ns, &service, &pods);
    let (mut prom, port) = start_prometheus(&prometheus, work.path(), &rules_file, scrape).await;

    // Each hub's own view: a blocked, b standing by for a live holder, c standing by for nobody.
    let series = |text: &str, name: &str, driver: &str| -> Option<f64> {
        text.lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{"))
                    && l.contains(&format!("driver_name=\"{driver}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    for (hub, driver, held) in [
        (&hubs[0], &a, 1.0),
        (&hubs[1], &b, 1.0),
        (&hubs[2], &c, 0.0),
    ] {
        eventually(
            &format!("{driver}: held_by_other {held}, not leading"),
            WAIT_TIMEOUT,
            || async {
                let text = hub.metrics().await?;
                (series(&text, "attacher_hub_lease_held_by_other", driver) == Some(held)
                    && series(&text, "leader_election_master_status", driver) == Some(0.0))
                .then_some(())
            },
        )
        .await;
    }

    // c's refusals, in its log: one line naming the missing grant and what gives it.
    let refusal = format!("no grant to get leases.coordination.k8s.io in namespace {hub_ns}");
    hubs[2]
        .process
        .wait_for_output(&refusal, 1, WAIT_TIMEOUT)
        .await
        .expect("a log line naming the grant");
    let log = format!("{}{}", hubs[2].process.stdout(), hubs[2].process.stderr());
    assert!(
        log.lines()
            .any(|l| l.contains(&refusal) && l.contains("deploy/base/rbac/role.yaml")),
        "{log}"
    );
    for dump in ["Status {", "ErrorResponse {", "StatusDetails {"] {
        assert!(
            !log.contains(dump),
            "a Debug dump ({dump}) in the log:\n{log}"
        );
    }

    // Prometheus has scraped that state, with the labels the ServiceMonitor's relabeling gives.
    let blocked = eventually("Prometheus sees a blocked", WAIT_TIMEOUT, || async {
        let r = query(
            port,
            &format!("attacher_hub_lease_guard_blocked{{driver_name=\"{a}\"}} == 1"),
        )
        .await;
        r.into_iter().next()
    })
    .await;
    let labels = &blocked["metric"];
    assert_eq!(labels["lease_namespace"], other_ns.as_str(), "{blocked}");
    assert_eq!(labels["holder"], "csi-a-controller-0", "{blocked}");
    assert_eq!(
        labels["namespace"],
        pod_ns.as_str(),
        "the target's namespace label: {blocked}"
    );
    assert_eq!(labels["pod"], "attacher-hub-hub-a", "{blocked}");
    assert_eq!(labels["service"], service["metadata"]["name"], "{blocked}");
    assert!(labels.get("exported_namespace").is_none(), "{blocked}");
    eventually("Prometheus sees b and c stand by", WAIT_TIMEOUT, || async {
        let held = query(port, "attacher_hub_lease_held_by_other").await;
        let value = |d: &str| {
            held.iter()
                .find(|s| s["metric"]["driver_name"] == d)
                .and_then(|s| s["value"][1].as_str().map(str::to_string))
        };
        (value(&b).as_deref() == Some("1") && value(&c).as_deref() == Some("0")).then_some(())
    })
    .await;

    // Once every rule has been evaluated on that state: the alerts.
    let seen = k8s_openapi::jiff::Timestamp::now();
    eventually("every rule evaluated again", WAIT_TIMEOUT, || async {
        let evaluations = rule_evaluations(port).await;
        (!evaluations.is_empty() && evaluations.iter().all(|t| *t > seen)).then_some(())
    })
    .await;
    let alerts = active_alerts(port).await;
    let held = alerts_of(&alerts, "AttacherHubLeaseHeldElsewhere", &a);
    assert_eq!(held.len(), 1, "{alerts:#?}");
    let alert = &held[0];
    assert_eq!(
        alert["labels"]["lease_namespace"],
        other_ns.as_str(),
        "{alert}"
    );
    let summary = alert["annotations"]["summary"].as_str().unwrap_or_default();
    let description = alert["annotations"]["description"]
        .as_str()
        .unwrap_or_default();
    assert!(
        summary.ends_with(&format!("held in namespace {other_ns}")),
        "{summary}"
    );
    for needle in [
        format!("in namespace {other_ns}"),
        format!("leaderElection.namespace: {other_ns}"),
        format!("--leader-election-namespace={other_ns}"),
    ] {
        assert!(
            description.contains(&needle),
            "{needle} missing: {description}"
        );
    }
    assert!(
        !summary.contains(&pod_ns) && !description.contains(&pod_ns),
        "the alert names the pod's namespace: {alert}"
    );
    assert_eq!(
        alerts_of(&alerts, "AttacherHubLeaseLost", &a),
        Vec::<Value>::new(),
        "a is led from another namespace, not lost"
    );
    assert_eq!(
        alerts_of(&alerts, "AttacherHubLeaseLost", &b),
        Vec::<Value>::new(),
        "b stands by for a live holder, not lost"
    );
    assert_eq!(
        alerts_of(&alerts, "AttacherHubLeaseLost", &c).len(),
        1,
        "c is lost: {alerts:#?}"
    );

    prom.stop().await;
    for r in renewers {
        r.abort();
    }
    for mut h in hubs {
        h.process.stop().await;
    }
    for m in mocks {
        m.shutdown().await;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&hub_ns, &other_ns] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
}
