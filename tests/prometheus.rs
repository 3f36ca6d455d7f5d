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
//!
//! Missing `prometheus` or `promtool` is a failure, never a skip.

mod support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::DeleteParams;
use kube::runtime::wait::Condition;
use serde_json::{Value, json};
use tokio::process::Command;

use mock_csi_driver::{MockDriver, MockHandle, fault::Fault};
use support::{
    ChildProcess, Cluster, PvBuilder, WAIT_TIMEOUT, create_csinode, create_node, create_va,
    http_get, is_attached, repo, tool, unique_driver_name, unique_name, wait_deleted, wait_for,
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
    let prom_port = free_port();
    let config = work.path().join("prometheus.yml");
    let targets: Vec<String> = served
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let config_doc = json!({
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [rules_file],
        "scrape_configs": [{
            "job_name": "attacher-hub",
            "static_configs": [{"targets": targets}],
        }],
    });
    std::fs::write(&config, config_doc.to_string()).expect("write prometheus.yml");
    let mut cmd = Command::new(&prometheus);
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            work.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdin(Stdio::null());
    let mut prom = ChildProcess::spawn("prometheus", cmd);
    let start = Instant::now();
    loop {
        if let Ok((200, _)) = http_get(prom_port, "/-/ready").await {
            break;
        }
        assert!(prom.exited().is_none(), "prometheus exited");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "prometheus not ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

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
