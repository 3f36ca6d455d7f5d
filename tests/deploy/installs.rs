//! Installs side by side: every cluster-scoped object an install makes carries the install
//! (its namespace, and for the chart its release), so that a second install never re-binds the
//! first one's ClusterRoles to its own account, and removing one leaves the others' RBAC alone.
//!
//! * Rendering: the overlays (`deploy/transformers/install-names` names their ClusterRoles and
//!   ClusterRoleBindings `<namespace>:<name>`, also for an overlay an operator moves to another
//!   namespace), the chart (`<release namespace>:<fullname>`, for releases of one name in two
//!   namespaces and of two names in one) and the swap and hub-pod components (which add no
//!   cluster-scoped object) never share a cluster-scoped name between two installs, and each
//!   binding binds its own install's account.
//! * Running: two sidecar swaps in two vendor namespaces (a vendor's controller Deployment in
//!   the shape of external-attacher's own manifests, with `deploy/components/sidecar-swap`),
//!   `deploy/overlays/hub` and two Helm releases named `attacher-hub` (Helm 4 and Helm 3, in two
//!   namespaces) are installed one after the other on the same cluster and run by the pod runner
//!   (tests/pods) as their own ServiceAccounts. Then every install attaches a volume of each of
//!   its drivers; one release is uninstalled, and the others still attach and detach; the API
//!   server refused none of their requests (the audit log).

use crate::pods::PodRunner;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use support::{
    Cluster, NodeDriver, PvBuilder, controller_manager, create_csinode_with, create_node,
    documents, is_attached, kind, kubectl, kustomize, name, namespace, repo, run, va, wait_deleted,
    wait_for,
};

/// The kinds whose objects have no namespace among what the installs render.
const CLUSTER_SCOPED: [&str; 2] = ["ClusterRole", "ClusterRoleBinding"];

/// The cluster-scoped objects among `objs`.
fn cluster_scoped(objs: &[Value]) -> Vec<&Value> {
    objs.iter()
        .filter(|o| CLUSTER_SCOPED.contains(&kind(o)))
        .collect()
}

/// Checks that every cluster-scoped object of attacher-hub among `objs` (one install, whose
/// account lives in `ns`) carries the install: its name starts with `<ns>:`, a binding binds
/// accounts of `ns` only and refers to a ClusterRole of the same install. Returns their
/// `kind/name`s.
fn assert_carries_the_install(what: &str, objs: &[Value], ns: &str) -> BTreeSet<String> {
    let ours = cluster_scoped(objs);
    assert!(!ours.is_empty(), "{what}: no ClusterRole rendered");
    let roles: BTreeSet<&str> = ours
        .iter()
        .filter(|o| kind(o) == "ClusterRole")
        .map(|o| name(o))
        .collect();
    let mut names = BTreeSet::new();
    for o in &ours {
        let n = name(o);
        assert!(
            n.starts_with(&format!("{ns}:")),
            "{what}: {} {n} does not carry the install's namespace {ns}",
            kind(o)
        );
        if kind(o) == "ClusterRoleBinding" {
            let role = o["roleRef"]["name"].as_str().unwrap_or_default();
            assert!(
                roles.contains(role),
                "{what}: ClusterRoleBinding {n} refers to {role}, not a ClusterRole of its own install"
            );
            for s in o["subjects"].as_array().into_iter().flatten() {
                assert_eq!(
                    s["namespace"], ns,
                    "{what}: ClusterRoleBinding {n} binds {s} of another namespace"
                );
            }
        }
        names.insert(format!("{}/{n}", kind(o)));
    }
    names
}

/// `helm template <release> <chart> -n <ns> [--set <set>]...` with Helm `helm`.
fn helm_template(helm: &str, release: &str, ns: &str, set: &[&str]) -> Vec<Value> {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["template", release])
        .arg(repo().join("deploy/helm/attacher-hub"))
        .args(["--namespace", ns]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let (ok, out, err) = run(cmd, None);
    assert!(ok, "{helm} template {release} -n {ns} {set:?}: {err}");
    documents(&out)
}

/// A directory for kustomizations of the test's own inside the checkout (kustomize takes the
/// shipped directories by relative path): `.work/<temporary>`.
fn work_dir(prefix: &str) -> tempfile::TempDir {
    std::fs::create_dir_all(repo().join(".work")).expect(".work");
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(repo().join(".work"))
        .expect("a directory in .work")
}

/// The path of `deploy/<what>` relative to `dir` (a directory under `.work/`).
fn shipped_from(dir: &Path, what: &str) -> String {
    let depth = dir
        .strip_prefix(repo())
        .expect("under the checkout")
        .components()
        .count();
    format!("{}deploy/{what}", "../".repeat(depth))
}

#[test]
fn cluster_scoped_names_carry_the_install() {
    let mut installs: Vec<(String, BTreeSet<String>)> = Vec::new();
    let overlays = repo().join("deploy/overlays");

    // The overlays as shipped: sidecar in example-csi, hub in attacher-hub (the daemonset
    // and controller-pool overlays name that namespace too: one of them per namespace).
    for (overlay, ns) in [
        ("sidecar", "example-csi"),
        ("hub", "attacher-hub"),
        ("daemonset", "attacher-hub"),
        ("controller-pool", "attacher-hub"),
    ] {
        let objs = documents(&kustomize(&overlays.join(overlay)));
        let names = assert_carries_the_install(overlay, &objs, ns);
        if matches!(overlay, "sidecar" | "hub") {
            installs.push((format!("deploy/overlays/{overlay}"), names));
        }
    }

    // An operator's second hub, in a namespace of its own, as the transformer's comment
    // writes it; with the publish-secrets component and the observability overlay on top.
    let dir = work_dir("ah-installs-");
    let from = |what: &str| shipped_from(dir.path(), what);
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "resources: [{}, {}]\nnamespace: storage-hub\n\
             components: [{}]\ntransformers: [{}]\n",
            from("overlays/hub"),
            from("overlays/observability"),
            from("components/publish-secrets"),
            from("transformers/install-names"),
        ),
    )
    .expect("write kustomization.yaml");
    let objs = documents(&kustomize(dir.path()));
    let names =
        assert_carries_the_install("the hub overlay moved to storage-hub", &objs, "storage-hub");
    assert!(
        names.iter().any(|n| n.ends_with("publish-secrets")),
        "the publish-secrets component's ClusterRole: {names:?}"
    );
    installs.push(("the hub overlay in storage-hub".into(), names));

    // The chart: a release named attacher-hub in two namespaces, one of another name, with
    // Helm 4 and 3, every optional ClusterRole on.
    for (helm, release, ns) in [
        ("helm", "attacher-hub", "ah-release-a"),
        ("helm3", "attacher-hub", "ah-release-b"),
        ("helm", "second", "ah-release-a"),
    ] {
        for mode in ["daemonset", "hub", "sidecar"] {
            let mut set = vec![
                format!("mode={mode}"),
                "rbac.publishSecrets=true".to_string(),
            ];
            match mode {
                "hub" => set.push("hub.drivers[0].address=/csi/a.sock".into()),
                "sidecar" => set.extend([
                    "sidecar.driverContainers[0].name=driver".to_string(),
                    "sidecar.driverContainers[0].image=registry.example.com/a:1".to_string(),
                ]),
                _ => {}
            }
            let set: Vec<&str> = set.iter().map(String::as_str).collect();
            let objs = helm_template(helm, release, ns, &set);
            let what = format!("release {release} in {ns} ({mode}, {helm})");
            let names = assert_carries_the_install(&what, &objs, ns);
            assert!(
                names.iter().any(|n| n.contains(&format!(":{release}"))),
                "{what}: the names carry the release: {names:?}"
            );
            if mode == "sidecar" {
                installs.push((what, names));
            }
        }
    }

    // No two installs share a cluster-scoped name.
    for (i, (a, names_a)) in installs.iter().enumerate() {
        for (b, names_b) in &installs[i + 1..] {
            let shared: Vec<&String> = names_a.intersection(names_b).collect();
            assert!(shared.is_empty(), "{a} and {b} share {shared:?}");
        }
    }

    // The swap and hub-pod components add no cluster-scoped object to the vendor's.
    support::vendor_manifests(&repo().join("deploy/examples/gce-pd/vendor"));
    let vendor = documents(&kustomize(
        &repo().join("deploy/examples/gce-pd/vendor/overlays/stable-master"),
    ));
    let vendor_names: BTreeSet<String> = cluster_scoped(&vendor)
        .iter()
        .map(|o| format!("{}/{}", kind(o), name(o)))
        .collect();
    for example in ["sidecar-swap", "hub-pod", "controller-pool"] {
        let objs = documents(&kustomize(
            &repo().join("deploy/examples/gce-pd").join(example),
        ));
        let names: BTreeSet<String> = cluster_scoped(&objs)
            .iter()
            .map(|o| format!("{}/{}", kind(o), name(o)))
            .collect();
        assert_eq!(
            names, vendor_names,
            "deploy/examples/gce-pd/{example}: cluster-scoped objects other than the vendor's"
        );
    }
}

// === side by side, on pods ====================================================

/// The emulated nodes of the pod runner.
const NODES: [(&str, &[(&str, &str)]); 2] = [("side-node-a", &[]), ("side-node-b", &[])];

/// The node of the test's VolumeAttachments (no pod runs there).
const VOLUME_NODE: &str = "side-volume-node";

/// A vendor's controller Deployment with external-attacher as its attacher, in the shape of
/// external-attacher's own manifests (`deploy/kubernetes/{rbac,deployment}.yaml` of v4.13.0:
/// its ClusterRole and Role, the `http-endpoint` port), the vendor's names prefixed with
/// `vendor`, in namespace `ns` labelled `baseline` (the level docs/deploy.md gives topology
/// (a): the swapped attacher runs as root without capabilities). The driver container is the
/// placeholder `registry.example.com/<vendor>-csi-driver`, which runs as root as most plugins
/// do, so its socket is root's, mode 0755.
fn vendor_manifests(vendor: &str, ns: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
  labels:
    pod-security.kubernetes.io/enforce: baseline
    pod-security.kubernetes.io/warn: baseline
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {vendor}-csi-controller-sa, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {vendor}-external-attacher-runner}}
rules:
  - {{apiGroups: [""], resources: [persistentvolumes], verbs: [get, list, watch, patch]}}
  - {{apiGroups: [storage.k8s.io], resources: [csinodes], verbs: [get, list, watch]}}
  - {{apiGroups: [storage.k8s.io], resources: [volumeattachments], verbs: [get, list, watch, patch]}}
  - {{apiGroups: [storage.k8s.io], resources: [volumeattachments/status], verbs: [patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {vendor}-csi-attacher-role}}
subjects: [{{kind: ServiceAccount, name: {vendor}-csi-controller-sa, namespace: {ns}}}]
roleRef: {{kind: ClusterRole, name: {vendor}-external-attacher-runner, apiGroup: rbac.authorization.k8s.io}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: external-attacher-cfg, namespace: {ns}}}
rules:
  - {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, watch, list, delete, update, create]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: csi-attacher-role-cfg, namespace: {ns}}}
subjects: [{{kind: ServiceAccount, name: {vendor}-csi-controller-sa, namespace: {ns}}}]
roleRef: {{kind: Role, name: external-attacher-cfg, apiGroup: rbac.authorization.k8s.io}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {vendor}-csi-controller, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {vendor}-csi-controller}}}}
  template:
    metadata: {{labels: {{app: {vendor}-csi-controller}}}}
    spec:
      serviceAccountName: {vendor}-csi-controller-sa
      containers:
        - name: csi-driver
          image: registry.example.com/{vendor}-csi-driver:1.0.0
          args: ["--endpoint=unix:///csi/csi.sock"]
          volumeMounts: [{{name: socket-dir, mountPath: /csi}}]
        - name: csi-attacher
          image: registry.k8s.io/sig-storage/csi-attacher:v4.13.0
          args: ["--v=5", "--csi-address=$(ADDRESS)", "--leader-election", "--http-endpoint=:8080"]
          env: [{{name: ADDRESS, value: /csi/csi.sock}}]
          ports: [{{containerPort: 8080, name: http-endpoint, protocol: TCP}}]
          livenessProbe:
            httpGet: {{path: /healthz/leader-election, port: http-endpoint}}
            initialDelaySeconds: 10
            timeoutSeconds: 10
            failureThreshold: 1
          volumeMounts: [{{name: socket-dir, mountPath: /csi}}]
      volumes: [{{name: socket-dir, emptyDir: {{}}}}]
"#
    )
}

/// One install of the test: how it is made and removed, and what it serves.
struct Install {
    what: String,
    namespace: String,
    /// `deployment/<name>` of its workload, and its replicas.
    workload: (String, i32),
    /// The account its pods run as (`system:serviceaccount:<ns>:<name>`).
    user: String,
    drivers: Vec<&'static str>,
    /// Its rendered objects (for the clean-up of what a failed run left).
    objects: Vec<Value>,
    /// A Helm release (`helm` binary, release name), uninstalled with Helm.
    release: Option<(&'static str, &'static str)>,
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

/// The vendor `vendor` in `ns` with attacher-hub swapped in by `deploy/components/sidecar-swap`,
/// as docs/deploy.md writes the kustomization, plus the Lease guard's grant docs/deploy.md
/// gives as two kubectl commands (named after the install).
fn swapped_vendor(dir: &Path, vendor: &str, ns: &str, driver: &'static str) -> Install {
    let own = dir.join(vendor);
    std::fs::create_dir_all(&own).expect("vendor directory");
    std::fs::write(own.join("vendor.yaml"), vendor_manifests(vendor, ns)).expect("vendor.yaml");
    std::fs::write(
        own.join("kustomization.yaml"),
        format!(
            "resources: [vendor.yaml]\ncomponents: [{}]\n",
            shipped_from(&own, "components/sidecar-swap")
        ),
    )
    .expect("kustomization.yaml");
    let objects = documents(&kustomize(&own));
    let sa = format!("{vendor}-csi-controller-sa");
    Install {
        what: format!("{vendor} with the sidecar swap in {ns}"),
        namespace: ns.to_string(),
        workload: (format!("{vendor}-csi-controller"), 1),
        user: format!("system:serviceaccount:{ns}:{sa}"),
        drivers: vec![driver],
        objects,
        release: None,
    }
}

/// The Lease guard's grant to a swapped vendor's account, as docs/deploy.md gives it.
fn grant_lease_guard(ns: &str, deployment: &str, sa: &str) -> Result<(), String> {
    let role = format!("{ns}:{deployment}:attacher-hub-lease-guard");
    for args in [
        vec![
            "create",
            "clusterrole",
            &role,
            "--verb=list",
            "--resource=leases.coordination.k8s.io",
        ],
        vec![
            "create",
            "clusterrolebinding",
            &role,
            "--clusterrole",
            &role,
        ],
    ] {
        let mut args: Vec<String> = args.into_iter().map(str::to_string).collect();
        if args[1] == "clusterrolebinding" {
            args.push(format!("--serviceaccount={ns}:{sa}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out) = kubectl(&args, None);
        if !ok && !out.contains("AlreadyExists") {
            return Err(format!("kubectl {args:?}: {out}"));
        }
    }
    Ok(())
}

/// A release `attacher-hub` of the chart in `ns` (sidecar shape, one replica), serving the
/// placeholder driver `driver` of `registry.example.com/<image>`, installed with `helm`
/// into a namespace labelled `restricted` (docs/deploy.md's level for the shape).
fn release(helm: &'static str, ns: &str, image: &str, driver: &'static str) -> Install {
    let values = json!({
        "mode": "sidecar",
        "replicaCount": 1,
        "sidecar": {
            "deploymentName": format!("{image}-controller"),
            "driverContainers": [{
                "name": "csi-driver",
                "image": format!("registry.example.com/{image}:1.0.0"),
                "args": ["--endpoint=unix:///csi/csi.sock"],
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}],
            }],
        },
    });
    let cluster = Cluster::get();
    let file = std::env::temp_dir().join(format!("ah-installs-{ns}-values.json"));
    std::fs::write(&file, values.to_string()).expect("values file");
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["template", "attacher-hub"])
        .arg(repo().join("deploy/helm/attacher-hub"))
        .args(["--namespace", ns, "-f"])
        .arg(&file);
    let (ok, out, err) = run(cmd, None);
    assert!(ok, "{helm} template in {ns}: {err}");
    Install {
        what: format!("release attacher-hub in {ns} ({helm})"),
        namespace: ns.to_string(),
        workload: (format!("{image}-controller"), 1),
        user: format!("system:serviceaccount:{ns}:attacher-hub"),
        drivers: vec![driver],
        objects: documents(&out),
        release: Some((helm, "attacher-hub")),
    }
}

/// Installs `release` as docs/deploy.md does: its namespace labelled for the shape, then
/// `helm install`.
fn helm_install(install: &Install) -> Result<(), String> {
    let (helm, name) = install.release.expect("a release");
    let ns = &install.namespace;
    apply(
        "the release's namespace",
        &[
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/audit": "restricted",
            "pod-security.kubernetes.io/warn": "restricted"}}}),
        ],
    )?;
    let cluster = Cluster::get();
    let file = std::env::temp_dir().join(format!("ah-installs-{ns}-values.json"));
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["install", name])
        .arg(repo().join("deploy/helm/attacher-hub"))
        .args(["--namespace", ns, "-f"])
        .arg(&file)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()));
    let (ok, out, err) = run(cmd, None);
    if ok {
        Ok(())
    } else {
        Err(format!("{helm} install {name} -n {ns}:\n{out}{err}"))
    }
}

/// `helm uninstall` of the install's release, if installed.
fn helm_uninstall(install: &Install) {
    let Some((helm, name)) = install.release else {
        return;
    };
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["uninstall", name, "--ignore-not-found", "--namespace"])
        .arg(&install.namespace)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()));
    let _ = run(cmd, None);
}

/// Removes what an install (or an earlier run of this test) left: its release, its workloads
/// and pods, its namespaced and cluster-scoped objects (the namespace stays: no namespace
/// controller runs here).
fn remove(install: &Install) {
    helm_uninstall(install);
    let ns = install.namespace.as_str();
    clean_namespace(ns);
    let cluster_scoped: Vec<&Value> = cluster_scoped(&install.objects);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": cluster_scoped});
    let (_, _) = kubectl(
        &["delete", "--ignore-not-found", "-f", "-"],
        Some(&list.to_string()),
    );
    let (_, _) = kubectl(
        &[
            "delete",
            "clusterrole,clusterrolebinding",
            "--ignore-not-found",
            &format!("{ns}:{}:attacher-hub-lease-guard", install.workload.0),
        ],
        None,
    );
}

/// Empties namespace `ns` of what an install (an overlay, a release, a vendor's manifests)
/// leaves in it, whoever made it (an overlay's objects make `helm install` refuse to adopt
/// them, a release's Secrets keep its name); the namespace stays (no namespace controller runs
/// here to empty a deleted one).
pub(crate) fn clean_namespace(ns: &str) {
    for kind in [
        "deployments,daemonsets,replicasets,pods",
        "leases,services,poddisruptionbudgets,roles,rolebindings,secrets",
    ] {
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
    for (kind, keep) in [
        ("serviceaccounts", "default"),
        ("configmaps", "kube-root-ca.crt"),
    ] {
        let (_, _) = kubectl(
            &[
                "delete",
                kind,
                "-n",
                ns,
                "--field-selector",
                &format!("metadata.name!={keep}"),
                "--ignore-not-found",
            ],
            None,
        );
    }
}

/// Waits until Deployment `name` in `ns` has `replicas` updated, ready pods and no others.
async fn wait_ready(client: &Client, ns: &str, name: &str, replicas: i32) -> Result<(), String> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let status = api
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|d| d.status)
            .unwrap_or_default();
        if status.updated_replicas == Some(replicas)
            && status.ready_replicas == Some(replicas)
            && status.replicas == Some(replicas)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("deployment {ns}/{name} not ready: {status:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A PV and a VA of `driver` on the volume node, labelled for the clean-up; its name.
async fn make_volume(client: &Client, driver: &str, n: usize) -> String {
    let name = support::unique_name("side-va");
    let mut pv = PvBuilder::new(&name, driver, &format!("vol-{n}")).build();
    pv.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(RUN_LABEL.into(), "1".into());
    Api::<PersistentVolume>::all(client.clone())
        .create(&Default::default(), &pv)
        .await
        .expect("create a PV");
    let mut object = va(&name, driver, VOLUME_NODE, &name);
    object
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(RUN_LABEL.into(), "1".into());
    Api::<VolumeAttachment>::all(client.clone())
        .create(&Default::default(), &object)
        .await
        .expect("create a VA");
    name
}

/// Label on the test's PVs and VAs.
const RUN_LABEL: &str = "attacher-hub-test/installs";

/// Deletes the test's VAs and PVs, finalizers included (an attacher that is gone leaves them).
async fn delete_volumes(client: &Client) {
    let lp = kube::api::ListParams::default().labels(&format!("{RUN_LABEL}=1"));
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
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
}

/// The volume node and its CSINode naming every driver (node ID: the node's name, as the
/// placeholder drivers take it).
async fn volume_node(client: &Client, drivers: &[&str]) {
    let _ = Api::<CSINode>::all(client.clone())
        .delete(VOLUME_NODE, &DeleteParams::default())
        .await;
    let _ = Api::<Node>::all(client.clone())
        .delete(VOLUME_NODE, &DeleteParams::default())
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    create_node(client, VOLUME_NODE).await;
    let entries: Vec<NodeDriver> = drivers
        .iter()
        .map(|d| NodeDriver::new(d, VOLUME_NODE))
        .collect();
    create_csinode_with(client, VOLUME_NODE, &entries).await;
}

/// Makes a volume of every driver of `installs` and waits until each is attached; the
/// drivers whose volume was not attached, with the wait's error.
async fn attach_one_each(client: &Client, installs: &[&Install], round: usize) -> Vec<String> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let mut made = Vec::new();
    for (i, install) in installs.iter().enumerate() {
        for (j, driver) in install.drivers.iter().enumerate() {
            let name = make_volume(client, driver, round * 100 + i * 10 + j).await;
            made.push((install.what.clone(), *driver, name));
        }
    }
    let mut failed = Vec::new();
    for (what, driver, name) in &made {
        if let Err(e) = wait_for(
            &vas,
            name,
            "attached",
            is_attached(),
            Duration::from_secs(90),
        )
        .await
        {
            failed.push(format!("{what}: {driver}: VA {name} not attached: {e}"));
        }
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn installs_side_by_side_each_keep_attaching() {
    let _turn = support::alone().await;
    let cluster = Cluster::get();
    controller_manager(cluster);
    let client = cluster.client().await;
    let dir = work_dir("ah-side-");

    let hub = {
        let objects = documents(&kustomize(&repo().join("deploy/overlays/hub")));
        Install {
            what: "deploy/overlays/hub".into(),
            namespace: namespace(
                objects
                    .iter()
                    .find(|o| kind(o) == "Deployment")
                    .expect("the hub Deployment"),
            )
            .to_string(),
            workload: ("attacher-hub".into(), 2),
            user: "system:serviceaccount:attacher-hub:attacher-hub".into(),
            drivers: vec!["fast-disk.csi.example.com", "nfs.csi.example.com"],
            objects,
            release: None,
        }
    };
    let installs = [
        swapped_vendor(
            dir.path(),
            "vendor-a",
            "ah-side-vendor-a",
            "vendor-a.csi.example.com",
        ),
        swapped_vendor(
            dir.path(),
            "vendor-b",
            "ah-side-vendor-b",
            "vendor-b.csi.example.com",
        ),
        hub,
        release(
            "helm",
            "ah-side-release-a",
            "release-a-csi-driver",
            "release-a.csi.example.com",
        ),
        release(
            "helm3",
            "ah-side-release-b",
            "release-b-csi-driver",
            "release-b.csi.example.com",
        ),
    ];
    for install in &installs {
        remove(install);
    }
    delete_volumes(&client).await;
    let drivers: Vec<&str> = installs.iter().flat_map(|i| i.drivers.clone()).collect();
    volume_node(&client, &drivers).await;

    let mut runner = PodRunner::start(&installs[0].namespace, &NODES).await;
    for install in &installs[1..] {
        runner.also_run(&install.namespace);
    }
    let began = std::time::SystemTime::now();
    // What the API server refused the uninstalled release's account while it was installed.
    let mut refused_before_uninstall = Vec::new();
    let outcome = async {
        // One after the other, as an operator adds them; each running before the next.
        for install in &installs {
            let t = Instant::now();
            if install.release.is_some() {
                helm_install(install)?;
            } else {
                // The Lease guard's grant first (a binding may name an account to come), so
                // that the swapped attacher's first look is allowed.
                if install.what.contains("sidecar swap") {
                    let sa = install.user.rsplit(':').next().expect("account");
                    grant_lease_guard(&install.namespace, &install.workload.0, sa)?;
                }
                apply(&install.what, &install.objects)?;
            }
            let (name, replicas) = &install.workload;
            wait_ready(&client, &install.namespace, name, *replicas).await?;
            eprintln!("{} running after {:?}", install.what, t.elapsed());
        }
        // Every install attaches for each of its drivers.
        let all: Vec<&Install> = installs.iter().collect();
        let failed = attach_one_each(&client, &all, 0).await;
        if !failed.is_empty() {
            return Err(format!("with all five installed: {failed:#?}"));
        }
        // One release goes; the others keep attaching, and detach. Its pods may still renew
        // their Leases after its RoleBinding went, and be refused: what counts for it is what
        // the API server refused before.
        refused_before_uninstall = support::forbidden(&installs[3].user, began);
        helm_uninstall(&installs[3]);
        let rest: Vec<&Install> = installs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 3)
            .map(|(_, install)| install)
            .collect();
        let failed = attach_one_each(&client, &rest, 1).await;
        if !failed.is_empty() {
            return Err(format!(
                "after {} was uninstalled: {failed:#?}",
                installs[3].what
            ));
        }
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let lp = kube::api::ListParams::default().labels(&format!("{RUN_LABEL}=1"));
        let served: BTreeSet<&str> = rest.iter().flat_map(|i| i.drivers.clone()).collect();
        let mine: Vec<String> = vas
            .list(&lp)
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|v| served.contains(v.spec.attacher.as_str()))
            .filter_map(|v| v.metadata.name)
            .collect();
        for n in &mine {
            vas.delete(n, &DeleteParams::default())
                .await
                .map_err(|e| e.to_string())?;
        }
        for n in &mine {
            wait_deleted(&vas, n, Duration::from_secs(90))
                .await
                .map_err(|e| format!("VA {n} not detached: {e}"))?;
        }
        Ok::<(), String>(())
    }
    .await;

    let refused: Vec<String> = installs
        .iter()
        .enumerate()
        .flat_map(|(n, i)| {
            let refused = if n == 3 {
                refused_before_uninstall.clone()
            } else {
                support::forbidden(&i.user, began)
            };
            refused.into_iter().map(move |r| format!("{}: {r}", i.what))
        })
        .collect();
    if outcome.is_err() || !refused.is_empty() {
        eprintln!("{}", runner.log_tails(20));
    }
    runner.shutdown().await;
    delete_volumes(&client).await;
    for install in &installs {
        remove(install);
    }
    let _ = Api::<CSINode>::all(client.clone())
        .delete(VOLUME_NODE, &DeleteParams::default())
        .await;
    let _ = Api::<Node>::all(client.clone())
        .delete(VOLUME_NODE, &DeleteParams::default())
        .await;
    outcome.unwrap_or_else(|why| panic!("installs side by side: {why}"));
    assert!(
        refused.is_empty(),
        "the API server refused requests of the installs' accounts: {refused:#?}"
    );
    drop(dir);
}
