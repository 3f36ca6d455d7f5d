//! `attacher-hub status` against a running hub (two Rust mock drivers, leader
//! election) and the API server:
//!
//! * the table shows each driver leading with its Lease holder, queue depths
//!   and its VolumeAttachments attached (counted through the API server,
//!   only those of the label selector), and `-o json` the `/drivers` entries
//!   with their counts;
//! * `--until-attached` exits 0 once every VolumeAttachment is attached, and
//!   1 with the table and a reason when one cannot be (its volume does not
//!   exist);
//! * `--pod` goes through the API server's pod proxy (this control plane has
//!   no kubelet and no pod network, so the proxy's own refusals are what can
//!   be seen: a missing pod, a pod without a routable IP);
//! * an unreachable hub is exit code 1 naming the URL; bad flags exit 2.

use crate::hub;
use crate::support;

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use hub::{
    Hub, HubOptions, Planned, RustMock, create_all, create_namespace, create_node_with_drivers,
    driver_entry, drivers_yaml,
};
use support::{Cluster, WAIT_TIMEOUT, is_attached, unique_driver_name, unique_name, wait_for};

/// VolumeAttachments per driver.
const VAS: usize = 3;

fn status(args: &[&str]) -> Output {
    status_with(args, &[])
}

/// `attacher-hub status` with environment variables set (`Some`) or removed (`None`).
fn status_with(args: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
    cmd.arg("status").args(args).stdin(Stdio::null());
    for (key, value) in env {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    cmd.output().expect("run attacher-hub status")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Rows of the table keyed by driver: the whitespace-separated cells.
fn table_rows(stdout: &str) -> BTreeMap<String, Vec<String>> {
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("DRIVER ") && header.contains("LEASE HOLDER"),
        "no table header:\n{stdout}"
    );
    lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let cells: Vec<String> = l.split_whitespace().map(str::to_string).collect();
            (cells[0].clone(), cells)
        })
        .collect()
}

#[tokio::test]
async fn status_shows_each_driver_of_a_running_hub_with_its_attachments() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let ns = unique_name("ah-status");
    create_namespace(&client, &ns).await;

    let mocks = [
        RustMock::start(&unique_driver_name("status-a"), VAS + 1).await,
        RustMock::start(&unique_driver_name("status-b"), VAS).await,
    ];
    let config = tempfile::NamedTempFile::new().expect("temp file");
    let entries: Vec<String> = mocks
        .iter()
        .map(|m| driver_entry(&m.socket, &m.name))
        .collect();
    std::fs::write(config.path(), drivers_yaml(&entries)).expect("write drivers.yaml");
    let mut hub = Hub::start(
        cluster,
        "hub",
        HubOptions {
            config: Some(config.path().to_path_buf()),
            leader_election_namespace: Some(ns.clone()),
            ..HubOptions::default()
        },
    )
    .await;
    for m in &mocks {
        hub.wait_state(&m.name, "leading", WAIT_TIMEOUT).await;
    }

    // VolumeAttachments of this run (labelled), on one node.
    let run = unique_name("run");
    let node = unique_name("ah-status-node");
    let node_ids: Vec<(String, String)> = mocks
        .iter()
        .map(|m| (m.name.clone(), node.clone()))
        .collect();
    create_node_with_drivers(&client, &node, &node_ids).await;
    let mut plan = Vec::new();
    for m in &mocks {
        for i in 0..VAS {
            let va = unique_name(&format!("ah-status-{i}"));
            plan.push(Planned::new(&va, &m.name, &node, &format!("vol-{i}")));
        }
    }
    create_all(&client, &plan, &run).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    for p in &plan {
        wait_for(&vas, &p.va, "attached", is_attached(), WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let address = format!("http://127.0.0.1:{}", hub.port);
    let selector = format!("{}={run}", hub::RUN_LABEL);

    // The table.
    let out = status(&[
        "--address",
        &address,
        "--kubeconfig",
        &kubeconfig,
        "-l",
        &selector,
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "status failed:\n{stdout}{stderr}");
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 2, "{stdout}");
    for m in &mocks {
        let row = &rows[&m.name];
        assert_eq!(row[1], "leading", "{stdout}");
        let holder = hub.driver(&m.name).await.expect("in /drivers")["leaseHolder"].clone();
        assert_eq!(json!(row[2]), holder, "{stdout}");
        assert_eq!(
            row[3]
                .split('/')
                .filter(|d| d.parse::<u64>().is_ok())
                .count(),
            3,
            "{stdout}"
        );
        assert_eq!(row[4], format!("{VAS}/{VAS}"), "{stdout}");
        assert_eq!(row[5..], ["-"], "{stdout}");
    }
    assert!(
        stdout.contains(&format!("attached: {0}/{0} VolumeAttachments", 2 * VAS)),
        "{stdout}"
    );

    // Without --kubeconfig, $KUBECONFIG counts them, as kubectl would use it.
    let out = status_with(
        &["--address", &address],
        &[("KUBECONFIG", Some(&kubeconfig))],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let rows = table_rows(&stdout);
    assert!(
        rows.values().all(|r| r[4] == format!("{VAS}/{VAS}")),
        "{stdout}"
    );

    // With no configuration at all (no $KUBECONFIG, no ~/.kube/config) nothing is counted;
    // the rest is the same.
    let home = tempfile::tempdir().expect("an empty home");
    let home = home.path().display().to_string();
    let out = status_with(
        &["--address", &address],
        &[
            ("KUBECONFIG", None),
            ("HOME", Some(&home)),
            ("KUBERNETES_SERVICE_HOST", None),
        ],
    );
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    let rows = table_rows(&stdout);
    assert!(rows.values().all(|r| r[4] == "-"), "{stdout}");
    assert!(!stdout.contains("attached:"), "{stdout}");

    // A configuration found by default that does not answer leaves the counts out and says
    // why; the hub's own table still shows (as above), and the command succeeds.
    let dead = tempfile::tempdir().expect("a directory");
    let dead_kubeconfig = dead.path().join("kubeconfig");
    std::fs::write(
        &dead_kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
         users:\n- name: u\n  user:\n    token: t\n",
    )
    .expect("write a kubeconfig");
    let out = status_with(
        &["--address", &address, "--request-timeout", "3s"],
        &[("KUBECONFIG", Some(&dead_kubeconfig.display().to_string()))],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(rows.values().all(|r| r[4] == "-"), "{stdout}");
    assert!(
        stdout.contains("VolumeAttachments not counted") && stdout.contains("give --kubeconfig"),
        "{stdout}"
    );

    // JSON: the /drivers entries, each with its counts.
    let out = status(&[
        "--address",
        &address,
        "--kubeconfig",
        &kubeconfig,
        "-l",
        &selector,
        "-o",
        "json",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let doc: Vec<Value> = serde_json::from_str(&stdout).expect("JSON array");
    assert_eq!(doc.len(), 2);
    for d in &doc {
        assert_eq!(d["state"]["state"], "leading");
        assert_eq!(
            d["volumeAttachments"],
            json!({"attached": VAS, "total": VAS, "withAttachError": 0}),
            "{d}"
        );
        assert!(
            d["capabilities"].is_object() || d["capabilities"].is_array(),
            "{d}"
        );
    }

    // --until-attached: done at once here.
    let out = status(&[
        "--address",
        &address,
        "--kubeconfig",
        &kubeconfig,
        "-l",
        &selector,
        "--until-attached",
        "--interval",
        "200ms",
        "--wait-timeout",
        "60s",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(table_rows(&stdout).len(), 2, "the final table:\n{stdout}");

    // A VolumeAttachment whose volume the driver does not have never
    // attaches: --until-attached gives up after its timeout with exit 1.
    let broken = Planned::new(
        &unique_name("ah-status-broken"),
        &mocks[0].name,
        &node,
        "no-such-volume",
    );
    create_all(&client, std::slice::from_ref(&broken), &run).await;
    let out = status(&[
        "--address",
        &address,
        "--kubeconfig",
        &kubeconfig,
        "-l",
        &selector,
        "--until-attached",
        "--interval",
        "200ms",
        "--wait-timeout",
        "3s",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("timed out after 3s"),
        "the reason on stderr:\n{stderr}"
    );
    let rows = table_rows(&stdout);
    assert_eq!(
        rows[&mocks[0].name][4],
        format!("{VAS}/{}", VAS + 1),
        "{stdout}"
    );
    // Its attach error shows once the hub has tried.
    wait_for(
        &vas,
        &broken.va,
        "status.attachError",
        |va: Option<&VolumeAttachment>| {
            va.and_then(|v| v.status.as_ref())
                .is_some_and(|s| s.attach_error.is_some())
        },
        WAIT_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let out = status(&[
        "--address",
        &address,
        "--kubeconfig",
        &kubeconfig,
        "-l",
        &selector,
    ]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains(&format!(
            "note: {}: 1 VolumeAttachment(s) with an attach error",
            mocks[0].name
        )),
        "{stdout}"
    );

    // The hub gone: exit 1, naming what could not be read.
    hub.process.stop().await;
    let out = status(&["--address", &address]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.starts_with(&format!("attacher-hub status: reading {address}/drivers: ")),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}

#[tokio::test]
async fn status_through_the_pod_proxy_reaches_the_api_server_route() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let ns = unique_name("ah-status-pod");
    create_namespace(&client, &ns).await;

    // No such pod: the API server's pod proxy says so.
    let out = status(&["--kubeconfig", &kubeconfig, "-n", &ns, "--pod", "hub-0"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "reading /drivers of pod {ns}/hub-0 through the API server's pod proxy"
        )) && stderr.contains("pods \"hub-0\" not found"),
        "{stderr}"
    );

    // A pod whose IP is loopback (all this control plane can offer without a
    // pod network): the proxy finds the pod and its port, then refuses the
    // address, as for any pod without a routable IP.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "hub-0"},
        "spec": {"containers": [{"name": "attacher-hub", "image": "attacher-hub",
                                 "ports": [{"name": "http-metrics", "containerPort": 8080}]}]},
    }))
    .expect("a Pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    pods.patch_status(
        "hub-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})),
    )
    .await
    .expect("set the pod's IP");
    let out = status(&[
        "--kubeconfig",
        &kubeconfig,
        "-n",
        &ns,
        "--pod",
        "hub-0",
        "--request-timeout",
        "5s",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("address not allowed"), "{stderr}");

    // Bad usage is exit code 2 with clap's message.
    for bad in [
        &["--pod", "p", "--address", ":1"][..],
        &["--address", ":1", "-o", "yaml"][..],
        &[][..],
    ] {
        let out = status(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {:?}", text(&out));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let _ = namespaces
            .delete(&ns, &kube::api::DeleteParams::default())
            .await;
    })
    .await;
}
