//! The chart's defaults harm nothing: `helm install` with no values file,
//! as README and docs/deploy.md write it, on two nodes of the pool that also run the GCE PD
//! driver's node plugin, run by the pod runner (tests/pods).
//!
//! PD's node plugin (v1.28.1) offers the controller service it does not run and dies when asked
//! for its capabilities (docs/deploy.md, "What discovery finds but does not serve"). The pod
//! runner has no build of PD's node plugin, so its DaemonSet runs as rendered from PD's
//! manifests with a stand-in in its `gce-pd-driver` container (tests/pods/image.rs: the mock,
//! serving PD's name on the same socket, offering the controller service and exiting with
//! status 2 when asked ControllerGetCapabilities, as PD's Go panic does), without
//! `privileged` (which the test API server refuses) and without its registrar and its other
//! host directories (no local build, no kubelet: nothing here uses them), on the pool's nodes.
//!
//! First the layout the defaults no longer use (`ci/daemonset-values.yaml`, discovery in the
//! kubelet plugins directory): the node plugin restarts on both nodes, which shows the test
//! sees the harm. Then `helm install` with no values: the node plugin never restarts while
//! the release's DaemonSet runs on both nodes, and the release serves a controller socket
//! exported where topology (b) puts it (attaches and detaches a volume).

use crate::pods::{PD_NODE_PLUGIN_STAND_IN, PodRunner};
use crate::support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use support::{
    Cluster, NodeDriver, PvBuilder, controller_manager, create_csinode_with, create_node,
    documents, is_attached, kind, kubectl, kustomize, name, repo, run, va, wait_deleted, wait_for,
};

/// Namespace, DaemonSet and container of PD's node plugin.
const PD_NAMESPACE: &str = "gce-pd-csi-driver";
const PD_NODE: &str = "csi-gce-pd-node";
const PD_CONTAINER: &str = "gce-pd-driver";

/// The release, its namespace (README's command) and its DaemonSet.
const RELEASE: &str = "attacher-hub";
const NAMESPACE: &str = "attacher-hub";
const DAEMONSET: &str = "attacher-hub-node";

/// The pool's label, which NOTES.txt tells the operator to put on the pool's nodes.
const POOL: [(&str, &str); 1] = [("attacher-hub.example.com/pool", "storage")];

/// The node of the test's VolumeAttachment (no pod runs there).
const VOLUME_NODE: &str = "defaults-volume-node";

/// PD's node plugin DaemonSet (and what it needs: its namespace, ServiceAccount and
/// PriorityClass) from PD's manifests, with the stand-in as described above and on the pool's
/// nodes only (the test's nodes; other tests' nodes are left alone).
fn pd_node_plugin() -> Vec<Value> {
    support::vendor_manifests(&repo().join("deploy/examples/gce-pd/vendor"));
    let vendor = documents(&kustomize(
        &repo().join("deploy/examples/gce-pd/vendor/overlays/stable-master"),
    ));
    let mut out = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": PD_NAMESPACE}})];
    for o in vendor {
        match (kind(&o), name(&o)) {
            ("ServiceAccount", "csi-gce-pd-node-sa") | ("PriorityClass", "csi-gce-pd-node") => {
                out.push(o)
            }
            ("DaemonSet", PD_NODE) => {
                let mut ds = o;
                let spec = &mut ds["spec"]["template"]["spec"];
                let containers = spec["containers"].as_array_mut().expect("containers");
                // The registrar has no local build and registers with a kubelet there is not.
                containers.retain(|c| c["name"] == PD_CONTAINER);
                let c = &mut containers[0];
                c["image"] = json!(format!("{PD_NODE_PLUGIN_STAND_IN}:1.28.1"));
                c["args"] = json!(["--endpoint=unix:/csi/csi.sock"]);
                c.as_object_mut()
                    .expect("container")
                    .remove("securityContext");
                c["volumeMounts"] = json!([{"name": "plugin-dir", "mountPath": "/csi"}]);
                let volumes = spec["volumes"].as_array_mut().expect("volumes");
                volumes.retain(|v| v["name"] == "plugin-dir");
                assert_eq!(
                    volumes[0]["hostPath"]["path"],
                    "/var/lib/kubelet/plugins/pd.csi.storage.gke.io/",
                    "PD's node plugin serves in the kubelet plugins directory"
                );
                spec["nodeSelector"][POOL[0].0] = json!(POOL[0].1);
                out.push(ds);
            }
            _ => {}
        }
    }
    assert_eq!(out.len(), 4, "PD's node plugin and what it needs: {out:#?}");
    out
}

/// `kubectl apply` of `objects`.
fn apply(what: &str, objects: &[Value]) -> Result<(), String> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&list.to_string()));
    if ok {
        Ok(())
    } else {
        Err(format!("kubectl apply of {what}:\n{out}"))
    }
}

/// README's install command (`helm install attacher-hub deploy/helm/attacher-hub -n
/// attacher-hub --create-namespace`), with `args` added.
fn helm_install(args: &[&str]) -> Result<(), String> {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin("helm"));
    cmd.args(["install", RELEASE])
        .arg(repo().join("deploy/helm/attacher-hub"))
        .args(["-n", NAMESPACE, "--create-namespace"])
        .args(args)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()));
    let (ok, out, err) = run(cmd, None);
    if ok {
        Ok(())
    } else {
        Err(format!("helm install {args:?}:\n{out}{err}"))
    }
}

/// `helm uninstall`, and the release's pods gone.
async fn helm_uninstall(client: &Client) {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin("helm"));
    cmd.args(["uninstall", RELEASE, "--ignore-not-found", "-n", NAMESPACE])
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()));
    let _ = run(cmd, None);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let lp = ListParams::default().labels("app.kubernetes.io/component=node");
    let deadline = Instant::now() + Duration::from_secs(60);
    while pods.list(&lp).await.map(|l| l.items.len()).unwrap_or(0) > 0 && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until DaemonSet `name` in `ns` runs `nodes` ready pods of its current template.
async fn wait_daemonset(client: &Client, ns: &str, name: &str, nodes: i32) -> Result<(), String> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ds = api.get_opt(name).await.ok().flatten();
        let generation = ds.as_ref().and_then(|d| d.metadata.generation).unwrap_or(0);
        let s = ds.and_then(|d| d.status).unwrap_or_default();
        if s.observed_generation.unwrap_or(0) >= generation
            && s.desired_number_scheduled == nodes
            && s.updated_number_scheduled == Some(nodes)
            && s.number_ready == nodes
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "DaemonSet {ns}/{name} not ready on {nodes} nodes: {s:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Restarts of the node plugin's container, by node.
async fn restarts(client: &Client) -> BTreeMap<String, i32> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), PD_NAMESPACE);
    let lp = ListParams::default().labels("app=gcp-compute-persistent-disk-csi-driver");
    pods.list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let count = p
                .status?
                .container_statuses?
                .iter()
                .find(|c| c.name == PD_CONTAINER)
                .map(|c| c.restart_count)?;
            Some((node, count))
        })
        .collect()
}

/// Removes what this test (or an earlier run) left: the release, PD's node plugin objects,
/// the volume node and the test's volume.
async fn clean_up(client: &Client, pd: &[Value]) {
    helm_uninstall(client).await;
    crate::installs::clean_namespace(NAMESPACE);
    crate::installs::clean_namespace(PD_NAMESPACE);
    let priority: Vec<&Value> = pd.iter().filter(|o| kind(o) == "PriorityClass").collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": priority});
    let (_, _) = kubectl(
        &["delete", "--ignore-not-found", "-f", "-"],
        Some(&list.to_string()),
    );
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let lp = ListParams::default().labels("attacher-hub-test/defaults=1");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for v in vas.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        let n = v.metadata.name.unwrap_or_default();
        let _ = vas.patch(&n, &PatchParams::default(), &unfinalize).await;
        let _ = vas.delete(&n, &DeleteParams::default()).await;
    }
    for p in pvs.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        let n = p.metadata.name.unwrap_or_default();
        let _ = pvs.patch(&n, &PatchParams::default(), &unfinalize).await;
        let _ = pvs.delete(&n, &DeleteParams::default()).await;
    }
    let _ = Api::<CSINode>::all(client.clone())
        .delete(VOLUME_NODE, &DeleteParams::default())
        .await;
    let _ = Api::<Node>::all(client.clone())
        .delete(VOLUME_NODE, &DeleteParams::default())
        .await;
}

/// A volume of `driver` attached and detached by the release, through the volume node.
async fn attaches_and_detaches(client: &Client, driver: &str) -> Result<(), String> {
    create_node(client, VOLUME_NODE).await;
    create_csinode_with(client, VOLUME_NODE, &[NodeDriver::new(driver, VOLUME_NODE)]).await;
    let name = support::unique_name("defaults-va");
    let label = |labels: &mut Option<BTreeMap<String, String>>| {
        labels
            .get_or_insert_with(BTreeMap::new)
            .insert("attacher-hub-test/defaults".into(), "1".into());
    };
    let mut pv = PvBuilder::new(&name, driver, "vol-0").build();
    label(&mut pv.metadata.labels);
    Api::<PersistentVolume>::all(client.clone())
        .create(&Default::default(), &pv)
        .await
        .map_err(|e| e.to_string())?;
    let mut object = va(&name, driver, VOLUME_NODE, &name);
    label(&mut object.metadata.labels);
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    vas.create(&Default::default(), &object)
        .await
        .map_err(|e| e.to_string())?;
    wait_for(
        &vas,
        &name,
        "attached",
        is_attached(),
        Duration::from_secs(90),
    )
    .await
    .map_err(|e| format!("the exported controller's volume: {e}"))?;
    vas.delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| e.to_string())?;
    wait_deleted(&vas, &name, Duration::from_secs(90))
        .await
        .map_err(|e| format!("the exported controller's volume not detached: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_defaults_never_restart_a_node_plugin() {
    let _turn = support::alone().await;
    let cluster = Cluster::get();
    controller_manager(cluster);
    let client = cluster.client().await;
    let pd = pd_node_plugin();
    clean_up(&client, &pd).await;

    let nodes: [(&str, &[(&str, &str)]); 2] = [("dflt-node-a", &POOL), ("dflt-node-b", &POOL)];
    let mut runner = PodRunner::start(PD_NAMESPACE, &nodes).await;
    runner.also_run(NAMESPACE);
    let outcome = async {
        // The release's namespace at the level docs/deploy.md gives the daemonset shape (an
        // earlier test may have left it at another).
        apply(
            "the release's namespace",
            &[
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE,
                "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
            ],
        )?;
        apply("PD's node plugin", &pd)?;
        wait_daemonset(&client, PD_NAMESPACE, PD_NODE, 2).await?;
        let before = restarts(&client).await;
        if before.len() != 2 || before.values().any(|r| *r != 0) {
            return Err(format!(
                "the node plugin before any install: restarts {before:?}"
            ));
        }

        // The kubelet plugins layout: the node plugin dies once on each node.
        let layout = repo().join("deploy/helm/attacher-hub/ci/daemonset-values.yaml");
        helm_install(&["-f", &layout.to_string_lossy()])?;
        wait_daemonset(&client, NAMESPACE, DAEMONSET, 2).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let harmed = loop {
            let now = restarts(&client).await;
            if now.len() == 2 && now.values().all(|r| *r >= 1) {
                break now;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "with ci/daemonset-values.yaml the node plugin was expected to die when \
                     asked for its controller service on both nodes: restarts {now:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        eprintln!("kubelet plugins layout: node plugin restarts {harmed:?}");
        helm_uninstall(&client).await;
        // Back to running, restarts counted from here.
        wait_daemonset(&client, PD_NAMESPACE, PD_NODE, 2).await?;
        let before = restarts(&client).await;

        // No values file: runs on both pool nodes, never asks the node plugin.
        helm_install(&[])?;
        wait_daemonset(&client, NAMESPACE, DAEMONSET, 2).await?;
        // A controller exported where topology (b) puts it, on one node: served.
        // Short: the socket's path under the node's directory must fit in 108 bytes (the
        // namespace's Leases were emptied at the start, so no old holder waits on it).
        let driver = "pool.csi.example.com";
        let node = &runner.nodes()[0];
        let dir = node
            .root
            .join("var/lib/attacher-hub/controllers")
            .join(driver);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mock = mock_csi_driver::MockDriver::new(driver)
            .volumes(1)
            .serve(&dir.join("csi.sock"))
            .await
            .map_err(|e| format!("the exported controller: {e}"))?;
        let served = attaches_and_detaches(&client, driver).await;
        mock.shutdown().await;
        served?;
        // Well past every discovery scan of both pods since they started.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let after = restarts(&client).await;
        if after != before {
            return Err(format!(
                "with the chart's defaults the node plugin restarted: {before:?} -> {after:?}"
            ));
        }
        eprintln!("defaults: node plugin restarts {after:?} (unchanged)");
        Ok::<(), String>(())
    }
    .await;
    if outcome.is_err() {
        eprintln!("{}", runner.log_tails(20));
    }
    let (_, _) = kubectl(
        &[
            "delete",
            "daemonsets",
            "--all",
            "-n",
            NAMESPACE,
            "--ignore-not-found",
        ],
        None,
    );
    runner.shutdown().await;
    clean_up(&client, &pd).await;
    outcome.unwrap_or_else(|why| panic!("the chart's defaults next to PD's node plugin: {why}"));
}
