//! The three topologies of `docs/deploy.md`, applied to a vendor's real manifests: the GCE PD
//! CSI driver v1.28.1 (`deploy/kubernetes/overlays/stable-master`, put into
//! `deploy/examples/gce-pd/vendor` by `scripts/vendor-manifests.sh` from the Go module cache, as a
//! user puts them) as the controller Deployment to transform.
//!
//! For each topology, the shipped example (`deploy/examples/gce-pd/<topology>`, as shipped,
//! rendered with the network closed) and its Helm form are rendered, dry-run server-side against
//! the API server (all but PD's node plugin DaemonSets, whose privileged containers the test
//! API server refuses and which no topology touches), and compared with the vendor's
//! manifests as they were:
//!
//! * (a) sidecar swap: the `csi-attacher` container runs attacher-hub's image with the
//!   vendor's arguments, environment, ports, probes and mounts, as root without capabilities
//!   and with the RuntimeDefault seccomp profile (the driver's socket is root's); a metrics
//!   Service named after the Deployment selects its pods for the ServiceMonitor; nothing else
//!   changes. attacher-hub accepts those exact
//!   arguments (the binary runs with them). The Helm post-renderer (Helm 3 as an executable,
//!   Helm 4 as a plugin) renders the same objects from a chart, and changes only the
//!   Deployment that holds a csi-attacher container: PD's webhook Deployment and any other
//!   object pass through byte for byte. The kustomize components, which cannot select by
//!   container, refuse to build a kustomization with such another Deployment. The image's own
//!   user (UID 65532) cannot connect to the root-owned socket (mode 0755) a driver makes:
//!   attacher-hub run as that user says so in one line naming the socket, the UID and the fix,
//!   and connects as root without capabilities.
//! * (b) controller node pool: the PD controller keeps its plugin and sidecars, has no
//!   attacher, and exports its socket through a hostPath
//!   (`/var/lib/attacher-hub/controllers/pd.csi.storage.gke.io/csi.sock`) on the pool's
//!   nodes; the attacher-hub DaemonSet on the same pool mounts that directory and its
//!   `--driver-sockets` glob matches the exported socket. The chart's
//!   `ci/controller-pool-values.yaml` and the post-renderer give the same.
//! * (c) hub pod: the PD controller pod's attacher is attacher-hub in hub mode whose
//!   `drivers.yaml` (checked with attacher-hub's own parser) names a socket that a container of
//!   the pod serves on a volume both mount; it keeps PD's attacher flags (the binary starts with
//!   them after `--config`) and gets the same metrics Service as (a); the chart's hub shape
//!   with PD's containers inside passes the same checks.
//!
//! RBAC, checked by the API server's authorizer (`kubectl auth can-i` as the ServiceAccount,
//! with the rendered RBAC applied for real in a namespace of the test's own): the account
//! attacher-hub runs as may do every call attacher-hub makes; in (b), where attacher-hub has an
//! account of its own, the rules bound to it are exactly those calls and it may do nothing
//! else asked of it; in (a) and (c) the vendor's RBAC is left as it was.
//!
//! (b) also runs end to end: the Rust mock and the Go mockcsi serve their sockets in the
//! export layout (`<dir>/<driver>/csi.sock`); two attacher-hub processes in discovery mode,
//! each with its own identity (two "nodes"), split the two drivers' Leases and attach; the node
//! leading one of them is killed, and the other takes that driver over, attaches new volumes
//! of both and detaches one the dead node attached.
//!
//! (c) also from the AWS EBS driver's own Helm chart (v1.44.0, from the Go module cache) through
//! the post-renderer's `hub-pod`, with Helm 3 and Helm 4; `tests/measured/shipped.rs` runs EBS's
//! chart in (b) and (c) on pods.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use support::{
    Cluster, copy_tree, documents, kind, kubectl, kustomize, name, namespace, repo, run,
    vendor_manifests,
};

/// Namespace of the PD manifests.
const PD_NAMESPACE: &str = "gce-pd-csi-driver";

/// PD's controller Deployment and its ServiceAccount.
const PD_CONTROLLER: &str = "csi-gce-pd-controller";
const PD_SERVICE_ACCOUNT: &str = "csi-gce-pd-controller-sa";

/// PD's driver name.
const PD_DRIVER: &str = "pd.csi.storage.gke.io";

/// The image attacher-hub's components put in place (before a user's `images:`).
const HUB_IMAGE: &str = "registry.example.com/attacher-hub:0.1.0";

/// external-attacher's image, without tag.
const GO_ATTACHER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-attacher";

/// The export directory of topology (b) on the nodes.
const EXPORT_DIR: &str = "/var/lib/attacher-hub/controllers";

// === commands ===============================================================

/// `kind namespace/name`.
fn key(obj: &Value) -> String {
    format!("{} {}/{}", kind(obj), namespace(obj), name(obj))
}

fn find<'a>(objs: &'a [Value], k: &str, n: &str) -> &'a Value {
    objs.iter()
        .find(|o| kind(o) == k && name(o) == n)
        .unwrap_or_else(|| {
            panic!(
                "no {k} {n} among {:?}",
                objs.iter().map(key).collect::<Vec<_>>()
            )
        })
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

// === the workspace ============================================================

/// A copy of `deploy/` with PD's manifests put into `deploy/examples/gce-pd/vendor` by
/// `scripts/vendor-manifests.sh`, as a user puts them (the examples name that directory; a
/// `vendor/` of the checkout is not copied: the script fills the copy's own).
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Workspace {
        let dir = tempfile::Builder::new()
            .prefix("ah-topologies-")
            .tempdir()
            .expect("temporary directory");
        for part in ["base", "components", "overlays", "transformers", "examples"] {
            copy_tree(
                &repo().join("deploy").join(part),
                &dir.path().join("deploy").join(part),
            );
        }
        let ws = Workspace { dir };
        let vendor = ws.examples().join("vendor");
        if vendor.exists() {
            std::fs::remove_dir_all(&vendor).expect("remove the checkout's vendor/ from the copy");
        }
        vendor_manifests(&vendor);
        ws
    }

    fn examples(&self) -> PathBuf {
        self.dir.path().join("deploy/examples/gce-pd")
    }

    fn example(&self, topology: &str) -> PathBuf {
        self.examples().join(topology)
    }

    /// The vendor's manifests as shipped.
    fn vendor(&self) -> Vec<Value> {
        documents(&kustomize(
            &self.examples().join("vendor/overlays/stable-master"),
        ))
    }

    /// `kubectl kustomize` of the example as shipped, with the network closed (every proxy
    /// a closed loopback port): an example that fetches anything fails.
    fn render(&self, topology: &str) -> Vec<Value> {
        let dir = self.example(topology);
        let text = std::fs::read_to_string(dir.join("kustomization.yaml"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert!(
            !text.contains("://"),
            "deploy/examples/gce-pd/{topology} names a remote resource; the examples take PD's manifests from ../vendor (scripts/vendor-manifests.sh):\n{text}"
        );
        let mut cmd = Command::new(Cluster::get().bin("kubectl"));
        cmd.arg("kustomize").arg(&dir);
        for proxy in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            cmd.env(proxy, "http://127.0.0.1:9");
        }
        cmd.env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GOPROXY", "off");
        let (ok, out, err) = run(cmd, None);
        assert!(
            ok,
            "kubectl kustomize {} (offline) failed:\n{err}",
            dir.display()
        );
        documents(&out)
    }

    fn overlay(&self, overlay: &str) -> Vec<Value> {
        documents(&kustomize(
            &self.dir.path().join("deploy/overlays").join(overlay),
        ))
    }
}

// === checks ===================================================================

/// Whether a workload runs a privileged container: PD's node plugin DaemonSets do, and the test
/// API server (no kubelet) runs without `--allow-privileged`, so it refuses them. No topology
/// changes them (`assert_unchanged_except` shows it), so the dry runs leave them out.
fn privileged(obj: &Value) -> bool {
    containers(obj)
        .iter()
        .any(|c| c["securityContext"]["privileged"] == true)
}

/// Applies `objs` as a server-side dry run (their namespaces created first); every object
/// must be accepted. Workloads with privileged containers are left out (see [`privileged`]).
fn dry_run(what: &str, objs: &[Value]) {
    let objs: Vec<Value> = objs.iter().filter(|o| !privileged(o)).cloned().collect();
    let objs = objs.as_slice();
    let namespaces: BTreeSet<&str> = objs
        .iter()
        .map(namespace)
        .filter(|n| !n.is_empty())
        .collect();
    for ns in namespaces {
        let (ok, out) = kubectl(&["create", "namespace", ns], None);
        assert!(
            ok || out.contains("AlreadyExists"),
            "creating namespace {ns}: {out}"
        );
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objs});
    let (ok, out) = kubectl(
        &["apply", "--dry-run=server", "-o", "name", "-f", "-"],
        Some(&list.to_string()),
    );
    assert!(ok, "{what}: server-side dry run failed:\n{out}");
    // `-o name` prints `kind/name` per object; warnings (stderr) are sentences.
    let accepted = out
        .lines()
        .filter(|l| l.contains('/') && !l.trim().contains(' '))
        .count();
    assert_eq!(
        accepted,
        objs.len(),
        "{what}: the API server accepted {accepted} of {} objects:\n{out}",
        objs.len()
    );
}

/// Pod spec of a workload.
fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn containers(workload: &Value) -> Vec<&Value> {
    pod(workload)["containers"]
        .as_array()
        .map(|c| c.iter().collect())
        .unwrap_or_default()
}

fn container<'a>(workload: &'a Value, n: &str) -> Option<&'a Value> {
    containers(workload).into_iter().find(|c| c["name"] == n)
}

/// No container of any workload runs external-attacher.
fn assert_no_go_attacher(what: &str, objs: &[Value]) {
    for obj in objs {
        for c in containers(obj) {
            let image = c["image"].as_str().unwrap_or_default();
            assert!(
                !image.starts_with(GO_ATTACHER_IMAGE),
                "{what}: {} still runs {image} in container {}",
                key(obj),
                c["name"]
            );
        }
    }
}

/// The volume mounted at `path` in `c`, and its mount.
fn volume_at<'a>(workload: &'a Value, c: &'a Value, path: &str) -> (&'a Value, &'a Value) {
    let mount = c["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == path))
        .unwrap_or_else(|| panic!("{}: nothing mounted at {path}", c["name"]));
    let volume = pod(workload)["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
    (volume, mount)
}

/// The attacher container runs as root without capabilities (the socket is root's).
fn assert_root_without_capabilities(what: &str, c: &Value) {
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsUser"], 0, "{what}: {sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}: {sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}: {sc}");
    assert_eq!(
        strings(&sc["capabilities"]["drop"]),
        ["ALL"],
        "{what}: {sc}"
    );
    assert!(sc["capabilities"]["add"].is_null(), "{what}: {sc}");
    assert_eq!(
        sc["seccompProfile"]["type"], "RuntimeDefault",
        "{what}: {sc}"
    );
}

/// The objects of `after` other than `changed` (keys) equal those of `before`, and none is
/// added or removed except `added` (keys).
fn assert_unchanged_except(
    what: &str,
    before: &[Value],
    after: &[Value],
    changed: &[String],
    added: &[String],
) {
    let index = |objs: &[Value]| -> BTreeMap<String, Value> {
        objs.iter().map(|o| (key(o), o.clone())).collect()
    };
    let (b, a) = (index(before), index(after));
    let gone: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    assert!(gone.is_empty(), "{what}: objects removed: {gone:?}");
    let new: Vec<&String> = a
        .keys()
        .filter(|k| !b.contains_key(*k) && !added.contains(k))
        .collect();
    assert!(new.is_empty(), "{what}: unexpected objects added: {new:?}");
    for (k, obj) in &b {
        if !changed.contains(k) {
            assert_eq!(Some(obj), a.get(k), "{what}: {k} changed");
        }
    }
}

/// Every container other than `except` is the vendor's, unchanged.
fn assert_other_containers_unchanged(what: &str, before: &Value, after: &Value, except: &str) {
    let others = |w: &Value| -> Vec<Value> {
        containers(w)
            .into_iter()
            .filter(|c| c["name"] != except)
            .cloned()
            .collect()
    };
    assert_eq!(
        others(before),
        others(after),
        "{what}: the vendor's other containers changed"
    );
}

// === RBAC ====================================================================

/// What attacher-hub asks the API server for: (verb, resource, subresource, namespace of the
/// request; `None` for cluster-scoped resources).
type Call = (
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<String>,
);

/// Every call attacher-hub makes with leader election in `lease_ns` (hub and discovery modes
/// also count replicas through presence Leases there).
fn hub_calls(lease_ns: &str, replicas: bool) -> Vec<Call> {
    let mut calls: Vec<Call> = vec![
        ("get", "persistentvolumes", None, None),
        ("list", "persistentvolumes", None, None),
        ("watch", "persistentvolumes", None, None),
        ("patch", "persistentvolumes", None, None),
        ("list", "volumeattachments.storage.k8s.io", None, None),
        ("watch", "volumeattachments.storage.k8s.io", None, None),
        ("patch", "volumeattachments.storage.k8s.io", None, None),
        (
            "patch",
            "volumeattachments.storage.k8s.io",
            Some("status"),
            None,
        ),
        ("list", "csinodes.storage.k8s.io", None, None),
        ("watch", "csinodes.storage.k8s.io", None, None),
    ];
    for verb in ["get", "create", "update"] {
        calls.push((
            verb,
            "leases.coordination.k8s.io",
            None,
            Some(lease_ns.into()),
        ));
    }
    if replicas {
        for verb in ["list", "watch", "delete"] {
            calls.push((
                verb,
                "leases.coordination.k8s.io",
                None,
                Some(lease_ns.into()),
            ));
        }
    }
    calls
}

/// The cross-namespace Lease guard's one call: Leases listed in all namespaces.
const GUARD_CALL: (&str, &str) = ("list", "leases.coordination.k8s.io");

/// Whether `user` may make `call` (`kubectl auth can-i`, the API server's authorizer).
fn can_i(user: &str, verb: &str, resource: &str, sub: Option<&str>, ns: Option<&str>) -> bool {
    let mut args = vec![
        "auth".to_string(),
        "can-i".into(),
        verb.into(),
        resource.into(),
        format!("--as={user}"),
    ];
    if let Some(s) = sub {
        args.push(format!("--subresource={s}"));
    }
    match ns {
        Some(ns) => args.push(format!("--namespace={ns}")),
        None => args.push("--all-namespaces".into()),
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, out) = kubectl(&args, None);
    match out.lines().next().map(str::trim) {
        Some("yes") => true,
        Some(l) if l.starts_with("no") => false,
        _ => panic!("kubectl auth can-i {args:?}: {out}"),
    }
}

/// The RBAC objects of `objs` applied for real, moved from namespace `from` to a namespace of
/// the test's own (cluster-scoped names get its name as a suffix, so runs never meet); deleted
/// on drop.
struct IsolatedRbac {
    namespace: String,
    applied: String,
}

impl IsolatedRbac {
    fn apply(objs: &[Value], from: &str, tag: &str) -> IsolatedRbac {
        let ns = format!("ah-topo-{tag}-{}", std::process::id());
        let (ok, out) = kubectl(&["create", "namespace", &ns], None);
        assert!(ok || out.contains("AlreadyExists"), "namespace {ns}: {out}");
        let rbac_kinds = [
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
        ];
        let mut items = Vec::new();
        for obj in objs.iter().filter(|o| rbac_kinds.contains(&kind(o))) {
            let mut obj = obj.clone();
            let cluster_scoped = kind(&obj).starts_with("Cluster");
            if cluster_scoped {
                let n = format!("{}-{ns}", name(&obj));
                obj["metadata"]["name"] = json!(n);
            } else if namespace(&obj) == from {
                obj["metadata"]["namespace"] = json!(ns);
            } else {
                continue;
            }
            if obj["roleRef"]["kind"] == "ClusterRole" {
                let n = format!(
                    "{}-{ns}",
                    obj["roleRef"]["name"].as_str().unwrap_or_default()
                );
                obj["roleRef"]["name"] = json!(n);
            }
            if let Some(subjects) = obj["subjects"].as_array_mut() {
                for s in subjects {
                    if s["namespace"] == from {
                        s["namespace"] = json!(ns);
                    }
                }
            }
            items.push(obj);
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
        let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&list));
        assert!(ok, "applying the RBAC in {ns}: {out}");
        IsolatedRbac {
            namespace: ns,
            applied: list,
        }
    }

    fn user(&self, service_account: &str) -> String {
        format!("system:serviceaccount:{}:{service_account}", self.namespace)
    }

    /// Every call of `calls` (their namespace, when set, is `from`'s: moved here) is allowed.
    fn assert_allows(&self, what: &str, service_account: &str, calls: &[Call]) {
        let user = self.user(service_account);
        let mut denied = Vec::new();
        for (verb, resource, sub, ns) in calls {
            let ns = ns.as_ref().map(|_| self.namespace.as_str());
            if !can_i(&user, verb, resource, *sub, ns) {
                denied.push(format!(
                    "{verb} {resource}{} in {ns:?}",
                    sub.map(|s| format!("/{s}")).unwrap_or_default()
                ));
            }
        }
        assert!(
            denied.is_empty(),
            "{what}: {service_account} may not make these calls attacher-hub makes: {denied:?}"
        );
    }
}

impl Drop for IsolatedRbac {
    fn drop(&mut self) {
        let _ = kubectl(
            &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            Some(&self.applied),
        );
        let _ = kubectl(
            &["delete", "namespace", &self.namespace, "--wait=false"],
            None,
        );
    }
}

/// `(apiGroup, resource, verb)` of every rule bound to ServiceAccount `sa` of namespace `ns`
/// in `objs`, with the namespace the grant holds in (`*` for cluster-wide).
fn grants_of(objs: &[Value], ns: &str, sa: &str) -> BTreeSet<String> {
    let bound = |b: &Value| {
        b["subjects"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns)
        })
    };
    let mut out = BTreeSet::new();
    for b in objs
        .iter()
        .filter(|o| kind(o) == "ClusterRoleBinding" || kind(o) == "RoleBinding")
        .filter(|b| bound(b))
    {
        let scope = if kind(b) == "ClusterRoleBinding" {
            "*".to_string()
        } else {
            namespace(b).to_string()
        };
        let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
        let role = objs
            .iter()
            .find(|o| {
                kind(o) == role_kind
                    && name(o) == role_name
                    && (role_kind == "ClusterRole" || namespace(o) == namespace(b))
            })
            .unwrap_or_else(|| panic!("{} binds missing {role_kind} {role_name}", key(b)));
        for rule in role["rules"].as_array().into_iter().flatten() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        out.insert(format!("{scope} {group}/{resource} {verb}"));
                    }
                }
            }
        }
    }
    out
}

// === (a) sidecar swap ==========================================================

#[test]
fn sidecar_swap_puts_attacher_hub_in_the_place_of_the_pd_attacher() {
    let ws = Workspace::new();
    let vendor = ws.vendor();
    let swapped = ws.render("sidecar-swap");
    dry_run("sidecar swap", &swapped);
    assert_no_go_attacher("sidecar swap", &swapped);

    let before = find(&vendor, "Deployment", PD_CONTROLLER);
    let after = find(&swapped, "Deployment", PD_CONTROLLER);
    let go = container(before, "csi-attacher").expect("PD ships a csi-attacher container");
    let hub = container(after, "csi-attacher").expect("the attacher container is kept");
    assert_eq!(hub["image"], HUB_IMAGE);
    for field in [
        "args",
        "env",
        "ports",
        "livenessProbe",
        "volumeMounts",
        "resources",
    ] {
        assert_eq!(
            hub[field], go[field],
            "sidecar swap: {field} of the attacher changed"
        );
    }
    assert_root_without_capabilities("sidecar swap", hub);
    assert_other_containers_unchanged("sidecar swap", before, after, "csi-attacher");
    assert_eq!(pod(before)["volumes"], pod(after)["volumes"]);
    assert_eq!(
        pod(before)["serviceAccountName"],
        pod(after)["serviceAccountName"]
    );
    // Only the Deployment changed (and its metrics Service is added): RBAC, the CSIDriver, the
    // node plugins are the vendor's.
    let service = metrics_service("sidecar swap", &swapped, after, "sidecar-swap");
    assert_unchanged_except(
        "sidecar swap",
        &vendor,
        &swapped,
        &[key(after)],
        &[key(service)],
    );

    // The vendor's ServiceAccount may make every call attacher-hub makes, its Lease in the
    // pod's namespace (--leader-election-namespace=$(PDCSI_NAMESPACE)).
    let rbac = IsolatedRbac::apply(&swapped, PD_NAMESPACE, "swap");
    rbac.assert_allows(
        "sidecar swap",
        PD_SERVICE_ACCOUNT,
        &hub_calls(PD_NAMESPACE, false),
    );

    assert_hub_accepts_the_arguments(&strings(&hub["args"]));
}

/// The metrics Service the component (`component`: sidecar-swap or hub-pod) adds next to the
/// vendor's controller `workload`: named after it, in its namespace, labelled for the
/// ServiceMonitor of deploy/overlays/observability, selecting exactly the workload's pods (by
/// the label the component gives them) on the attacher container's metrics port.
fn metrics_service<'a>(
    what: &str,
    objs: &'a [Value],
    workload: &Value,
    component: &str,
) -> &'a Value {
    let service = find(
        objs,
        "Service",
        &format!("{}-attacher-metrics", name(workload)),
    );
    assert_eq!(namespace(service), namespace(workload), "{what}");
    assert_eq!(
        service["metadata"]["labels"]["app.kubernetes.io/name"], "attacher-hub",
        "{what}: the ServiceMonitor selects it"
    );
    let label = format!("attacher-hub.example.com/{component}");
    assert_eq!(
        service["spec"]["selector"],
        json!({ label.clone(): name(workload) }),
        "{what}"
    );
    assert_eq!(
        workload["spec"]["template"]["metadata"]["labels"][&label],
        name(workload),
        "{what}: the pods carry the Service's label"
    );
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["name"], "http-metrics", "{what}");
    let hub = container(workload, "csi-attacher").expect("the attacher container");
    let declared = hub["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == port["targetPort"] || p["containerPort"] == port["targetPort"]);
    assert!(
        declared,
        "{what}: the Service targets {}, which the attacher container does not declare",
        port["targetPort"]
    );
    service
}

/// attacher-hub starts with exactly the arguments of PD's attacher container (the Lease
/// namespace variable expanded as the kubelet does; a loopback listener appended, which Go's
/// flag parsing lets win), serves `/readyz` while the driver's socket does not exist (once
/// the start-up limit of 20 s has passed: this process serves; the driver shows in
/// `/drivers`) and shows the driver's socket.
fn assert_hub_accepts_the_arguments(args: &[&str]) {
    let cluster = Cluster::get();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("$(PDCSI_NAMESPACE)", "default"))
        .collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .args(&args)
        .arg(format!(
            "--kubeconfig={}",
            cluster.attacher_kubeconfig.display()
        ))
        .arg(format!("--http-endpoint=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start attacher-hub");
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        if let Some(status) = child.try_wait().expect("poll attacher-hub") {
            let mut err = String::new();
            use std::io::Read as _;
            let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("attacher-hub refused PD's attacher arguments {args:?} ({status}):\n{err}");
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let ready = rt.block_on(support::http_get(port, "/readyz")).ok();
        if let Some((200, _)) = ready {
            let (_, drivers) = rt
                .block_on(support::http_get(port, "/drivers"))
                .expect("/drivers");
            break drivers;
        }
        assert!(
            Instant::now() < deadline,
            "attacher-hub with PD's arguments was not ready within a minute: {ready:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    let drivers: Value = serde_json::from_str(&answer).expect("/drivers is JSON");
    assert_eq!(
        drivers[0]["socket"], "unix:///csi/csi.sock",
        "the hub serves PD's socket: {drivers}"
    );
}

/// The shortcut of setting only a vendor chart's attacher image keeps the image's user, UID
/// 65532, while the vendor's driver creates its socket as root with the usual mode 0755, and
/// connecting to a Unix socket needs write permission on it. attacher-hub run as that user
/// (setpriv, as the kubelet runs the image's USER) is refused, and says so in one line naming
/// the socket, its own UID and the fix (in its log and in `/drivers`); run as root with every
/// capability dropped (what the components and the post-renderer set) it connects to the same
/// socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_user_cannot_connect_to_a_root_socket_and_says_how_to_fix_it() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use support::{ChildProcess, eventually, free_port, http_get};

    let cluster = Cluster::get();
    let dir = tempfile::Builder::new()
        .prefix("ah-uid-")
        .tempdir()
        .expect("temporary directory");
    let mode = |m| std::fs::Permissions::from_mode(m);
    // Every directory above the socket is searchable (the kubelet's emptyDir is): only the
    // socket's own mode decides.
    std::fs::set_permissions(dir.path(), mode(0o755)).expect("chmod the directory");
    let socket = dir.path().join("csi.sock");
    let mut cmd = tokio::process::Command::new(support::mock_csi_driver_bin());
    cmd.arg(format!("--endpoint={}", socket.display()))
        .arg("--name=uid.csi.test")
        .arg("--volumes=1");
    let mut driver = ChildProcess::spawn("mock-csi-driver", cmd);
    driver
        .wait_for_output("ready\n", 1, Duration::from_secs(30))
        .await
        .expect("the mock driver serves");
    std::fs::set_permissions(&socket, mode(0o755)).expect("chmod the socket");
    let meta = std::fs::metadata(&socket).expect("the socket");
    assert_eq!(
        (meta.uid(), meta.mode() & 0o7777),
        (0, 0o755),
        "a root-owned socket, 0755"
    );
    // The test's kubeconfig, readable by the image's user.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::copy(&cluster.attacher_kubeconfig, &kubeconfig).expect("copy the kubeconfig");
    std::fs::set_permissions(&kubeconfig, mode(0o644)).expect("chmod the kubeconfig");

    let start = |tag: &str, ids: &[&str]| {
        let port = free_port();
        let mut cmd = tokio::process::Command::new("setpriv");
        cmd.args(ids)
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_attacher-hub"))
            .arg(format!("--csi-address=unix://{}", socket.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .env_remove("POD_NAMESPACE");
        (ChildProcess::spawn(tag, cmd), port)
    };
    let drivers = async |port: u16| -> Option<Value> {
        let (status, body) = http_get(port, "/drivers").await.ok()?;
        (status == 200)
            .then(|| serde_json::from_str::<Value>(&body).ok())??
            .get(0)
            .cloned()
    };

    // The image's user.
    let (mut hub, port) = start(
        "attacher-hub-65532",
        &["--reuid=65532", "--regid=65532", "--clear-groups"],
    );
    hub.wait_for_output("cannot connect to", 1, Duration::from_secs(60))
        .await
        .expect("attacher-hub as UID 65532 reports the failed connection");
    let line = hub
        .stderr()
        .lines()
        .find(|l| l.contains("cannot connect to"))
        .expect("the line")
        .to_owned();
    let path = socket.display().to_string();
    for part in [
        path.as_str(),
        "Permission denied",
        "this process (UID 65532, GID 65532)",
        "owner UID 0, GID 0, mode 0755",
        "runAsUser: 0 with every capability dropped",
        "writable by a group of this process (runAsGroup, fsGroup)",
    ] {
        assert!(line.contains(part), "{part:?} not in the log line:\n{line}");
    }
    let last_error = eventually(
        "/drivers shows the error",
        Duration::from_secs(30),
        || async {
            drivers(port).await?["lastError"]
                .as_str()
                .map(str::to_owned)
        },
    )
    .await;
    assert!(
        last_error.contains(&path)
            && last_error.contains("UID 65532")
            && !last_error.contains('\n'),
        "/drivers: {last_error}"
    );
    hub.stop().await;

    // Root with every capability dropped (no DAC_OVERRIDE: it reaches what root owns).
    let (mut root, port) = start(
        "attacher-hub-root",
        &[
            "--reuid=0",
            "--regid=0",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ],
    );
    eventually(
        "root without capabilities connects",
        Duration::from_secs(60),
        || async { (drivers(port).await?["name"] == "uid.csi.test").then_some(()) },
    )
    .await;
    assert_eq!(
        root.count_in_output("cannot connect to"),
        0,
        "{}",
        root.stderr()
    );
    root.stop().await;
}

// === (b) controller node pool ==================================================

/// The path on the node of the socket a Deployment's driver container exports, from its
/// `--endpoint` and the hostPath of the volume mounted there.
fn exported_socket(what: &str, workload: &Value, driver_container: &str) -> PathBuf {
    let c = container(workload, driver_container).expect("the driver container");
    let endpoint = strings(&c["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix("--endpoint="))
        .unwrap_or_else(|| panic!("{what}: {driver_container} has no --endpoint"));
    let address: attacher_hub::csi::Address = endpoint.parse().expect("a socket address");
    let socket = address.path();
    let dir = socket.parent().expect("socket directory").to_string_lossy();
    let (volume, _) = volume_at(workload, c, &dir);
    let host = volume["hostPath"]["path"].as_str().unwrap_or_else(|| {
        panic!("{what}: the socket directory {dir} is not a hostPath: {volume}")
    });
    Path::new(host).join(socket.file_name().expect("socket file"))
}

/// Checks the attacher-hub DaemonSet of topology (b) against the socket a controller exports
/// on the node: it mounts the export directory and its `--driver-sockets` glob matches the
/// socket as the container sees it; both run on the same node pool.
fn assert_daemonset_discovers(what: &str, ds: &Value, exported: &Path, controller: &Value) {
    let hub = containers(ds)
        .into_iter()
        .find(|c| {
            c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("registry.example.com/attacher-hub"))
        })
        .unwrap_or_else(|| panic!("{what}: no attacher-hub container"));
    let glob = strings(&hub["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix("--driver-sockets="))
        .unwrap_or_else(|| panic!("{what}: no --driver-sockets"));
    let (volume, mount) = pod(ds)["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let host = v["hostPath"]["path"].as_str()?;
            let rel = exported.strip_prefix(host).ok()?;
            let mount = hub["volumeMounts"]
                .as_array()?
                .iter()
                .find(|m| m["name"] == v["name"])?;
            Some((v, (mount, rel.to_path_buf())))
        })
        .next()
        .unwrap_or_else(|| {
            panic!(
                "{what}: no hostPath of the DaemonSet holds {}",
                exported.display()
            )
        });
    let (mount, rel) = mount;
    assert_eq!(volume["hostPath"]["path"], EXPORT_DIR, "{what}");
    assert_eq!(
        volume["hostPath"]["type"], "DirectoryOrCreate",
        "{what}: created when missing"
    );
    assert_eq!(
        mount["readOnly"], true,
        "{what}: read-only is enough to connect"
    );
    let seen = Path::new(mount["mountPath"].as_str().expect("mountPath")).join(rel);
    assert!(
        glob::Pattern::new(glob)
            .expect("a glob")
            .matches_path(&seen),
        "{what}: --driver-sockets={glob} does not match {} (the exported {})",
        seen.display(),
        exported.display()
    );
    let pool = "attacher-hub.example.com/pool";
    assert_eq!(
        pod(ds)["nodeSelector"][pool],
        pod(controller)["nodeSelector"][pool],
        "{what}: the DaemonSet and the controller run on the same node pool"
    );
    assert!(
        pod(ds)["nodeSelector"][pool].is_string(),
        "{what}: a node pool"
    );
}

/// The vendor side of topology (b): no attacher, the socket exported, everything else kept.
fn assert_exports_socket(what: &str, vendor: &[Value], exported: &[Value]) -> PathBuf {
    assert_no_go_attacher(what, exported);
    let before = find(vendor, "Deployment", PD_CONTROLLER);
    let after = find(exported, "Deployment", PD_CONTROLLER);
    assert!(
        container(after, "csi-attacher").is_none(),
        "{what}: the attacher is gone"
    );
    assert_other_containers_unchanged(what, before, after, "csi-attacher");
    let socket = exported_socket(what, after, "gce-pd-driver");
    assert_eq!(
        socket,
        Path::new(EXPORT_DIR).join(PD_DRIVER).join("csi.sock"),
        "{what}: one subdirectory per driver"
    );
    // Every container that shared the socket directory still does, where it did.
    for c in containers(before)
        .into_iter()
        .filter(|c| c["name"] != "csi-attacher")
    {
        assert_eq!(
            c["volumeMounts"],
            container(after, c["name"].as_str().unwrap_or_default()).expect("kept")["volumeMounts"],
            "{what}"
        );
    }
    assert_unchanged_except(what, vendor, exported, &[key(after)], &[]);
    socket
}

#[test]
fn controller_pool_exports_the_pd_socket_to_the_attacher_hub_daemonset() {
    let ws = Workspace::new();
    let vendor = ws.vendor();
    let exported = ws.render("controller-pool");
    dry_run("controller pool, PD side", &exported);
    let socket = assert_exports_socket("controller pool (kustomize)", &vendor, &exported);
    let controller = find(&exported, "Deployment", PD_CONTROLLER);
    assert_eq!(
        pod(controller)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0]["topologyKey"],
        "kubernetes.io/hostname",
        "one PD controller per node: two would share the socket"
    );

    let hub = ws.overlay("controller-pool");
    dry_run("controller pool, attacher-hub side", &hub);
    let ds = find(&hub, "DaemonSet", "attacher-hub-node");
    assert_daemonset_discovers("controller pool (kustomize)", ds, &socket, controller);

    // attacher-hub's own account: exactly its calls, as the authorizer sees them.
    let sa_ns = namespace(ds).to_string();
    let expected: BTreeSet<String> = [
        "* /persistentvolumes get",
        "* /persistentvolumes list",
        "* /persistentvolumes watch",
        "* /persistentvolumes patch",
        "* storage.k8s.io/volumeattachments list",
        "* storage.k8s.io/volumeattachments watch",
        "* storage.k8s.io/volumeattachments patch",
        "* storage.k8s.io/volumeattachments/status patch",
        "* storage.k8s.io/csinodes list",
        "* storage.k8s.io/csinodes watch",
        "* coordination.k8s.io/leases list",
    ]
    .into_iter()
    .map(str::to_string)
    .chain(
        ["get", "create", "update", "list", "watch", "delete"]
            .map(|v| format!("{sa_ns} coordination.k8s.io/leases {v}")),
    )
    .collect();
    assert_eq!(
        grants_of(&hub, &sa_ns, "attacher-hub"),
        expected,
        "controller pool: the rules bound to attacher-hub are exactly its calls"
    );
    let rbac = IsolatedRbac::apply(&hub, &sa_ns, "pool");
    rbac.assert_allows("controller pool", "attacher-hub", &hub_calls(&sa_ns, true));
    let user = rbac.user("attacher-hub");
    assert!(
        can_i(&user, GUARD_CALL.0, GUARD_CALL.1, None, None),
        "the Lease guard may list"
    );
    for (verb, resource, sub, ns) in [
        ("get", "secrets", None, Some("default")),
        ("delete", "persistentvolumes", None, None),
        ("update", "volumeattachments.storage.k8s.io", None, None),
        ("create", "volumeattachments.storage.k8s.io", None, None),
        ("delete", "volumeattachments.storage.k8s.io", None, None),
        ("get", "leases.coordination.k8s.io", None, Some("default")),
        (
            "update",
            "leases.coordination.k8s.io",
            None,
            Some("default"),
        ),
        ("watch", "leases.coordination.k8s.io", None, None),
        ("list", "pods", None, None),
        ("get", "nodes", None, None),
        ("create", "events", None, Some("default")),
        ("update", "csinodes.storage.k8s.io", None, None),
    ] {
        assert!(
            !can_i(&user, verb, resource, sub, ns),
            "controller pool: attacher-hub may {verb} {resource} in {ns:?}, which it never does"
        );
    }
}

// === (c) hub pod ==============================================================

/// The arguments attacher-hub gets in `c`: after the entrypoint, those of its `command` (the
/// hub-pod component puts `--config` there, before the vendor's arguments), then its `args`.
fn hub_arguments(c: &Value) -> Vec<&str> {
    let command = strings(&c["command"]);
    command
        .into_iter()
        .skip(1)
        .chain(strings(&c["args"]))
        .collect()
}

/// The hub container of a hub pod reads a drivers.yaml that attacher-hub's own parser
/// accepts, and every driver it names listens on a volume the hub container mounts too.
fn assert_hub_pod(what: &str, objs: &[Value], workload: &Value, hub_name: &str) {
    let hub = container(workload, hub_name).unwrap_or_else(|| panic!("{what}: no {hub_name}"));
    assert!(
        hub["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("registry.example.com/attacher-hub")),
        "{what}: {}",
        hub["image"]
    );
    let args = hub_arguments(hub);
    let config = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .unwrap_or_else(|| panic!("{what}: hub mode needs --config: {args:?}"));
    assert!(args.contains(&"--leader-election"), "{what}: {args:?}");
    let endpoint = args
        .iter()
        .find_map(|a| a.strip_prefix("--http-endpoint=:"))
        .unwrap_or_else(|| panic!("{what}: {args:?}"));
    for probe in ["livenessProbe", "readinessProbe"] {
        let port = &hub[probe]["httpGet"]["port"];
        let port = match port {
            Value::String(p) => hub["ports"]
                .as_array()
                .and_then(|ps| ps.iter().find(|x| x["name"] == *p))
                .map(|x| x["containerPort"].to_string())
                .unwrap_or_default(),
            other => other.to_string(),
        };
        assert_eq!(port, endpoint, "{what}: {probe} asks the hub's listener");
    }
    let (volume, _) = volume_at(
        workload,
        hub,
        Path::new(config).parent().unwrap().to_str().unwrap(),
    );
    let cm = find(
        objs,
        "ConfigMap",
        volume["configMap"]["name"].as_str().expect("a ConfigMap"),
    );
    assert_eq!(
        namespace(cm),
        namespace(workload),
        "{what}: the ConfigMap is in the pod's namespace"
    );
    let file = Path::new(config).file_name().unwrap().to_str().unwrap();
    let text = cm["data"][file]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no {file} in {}", key(cm)));
    let defaults = attacher_hub::config::Defaults::with_identity(
        &attacher_hub::cli::Args::default(),
        "test".into(),
    );
    let parsed = attacher_hub::config::parse(text, file, &defaults, false)
        .unwrap_or_else(|e| panic!("{what}: attacher-hub refuses {file}: {e}"));
    assert!(!parsed.drivers.is_empty());
    for d in &parsed.drivers {
        let socket = d.address.path();
        let dir = socket.parent().unwrap().to_string_lossy();
        let (shared, _) = volume_at(workload, hub, &dir);
        let served = containers(workload)
            .into_iter()
            .filter(|c| c["name"] != hub_name)
            .any(|c| {
                let listens = strings(&c["args"]).iter().any(|a| {
                    a.strip_prefix("--endpoint=")
                        .and_then(|e| e.parse::<attacher_hub::csi::Address>().ok())
                        .is_some_and(|e| e.path() == socket)
                });
                listens
                    && c["volumeMounts"].as_array().is_some_and(|m| {
                        m.iter()
                            .any(|m| m["mountPath"] == *dir && m["name"] == shared["name"])
                    })
            });
        assert!(
            served,
            "{what}: no container of the pod listens on {} on the hub's volume",
            socket.display()
        );
    }
}

#[test]
fn hub_pod_turns_the_pd_attacher_into_attacher_hub_serving_drivers_yaml() {
    let ws = Workspace::new();
    let vendor = ws.vendor();
    let hubbed = ws.render("hub-pod");
    dry_run("hub pod", &hubbed);
    assert_no_go_attacher("hub pod", &hubbed);
    let before = find(&vendor, "Deployment", PD_CONTROLLER);
    let after = find(&hubbed, "Deployment", PD_CONTROLLER);
    assert_hub_pod("hub pod (kustomize)", &hubbed, after, "csi-attacher");
    assert_root_without_capabilities("hub pod", container(after, "csi-attacher").unwrap());
    assert_other_containers_unchanged("hub pod", before, after, "csi-attacher");
    let drivers = find(&hubbed, "ConfigMap", "attacher-hub-drivers");
    let service = metrics_service("hub pod", &hubbed, after, "hub-pod");
    assert_unchanged_except(
        "hub pod",
        &vendor,
        &hubbed,
        &[key(after)],
        &[key(drivers), key(service)],
    );
    // The vendor's flags, after --config, are the defaults of every driver of drivers.yaml:
    // attacher-hub starts with them and serves the socket drivers.yaml names.
    let hub = container(after, "csi-attacher").expect("the hub container");
    let go = container(before, "csi-attacher").expect("PD's attacher");
    assert_eq!(
        hub["args"], go["args"],
        "hub pod: the vendor's flags are kept"
    );
    let file = ws.dir.path().join("drivers.yaml");
    std::fs::write(
        &file,
        drivers["data"]["drivers.yaml"]
            .as_str()
            .expect("drivers.yaml"),
    )
    .expect("write drivers.yaml");
    let config = format!("--config={}", file.display());
    let args: Vec<&str> = hub_arguments(hub)
        .into_iter()
        .map(|a| {
            if a.starts_with("--config=") {
                config.as_str()
            } else {
                a
            }
        })
        .collect();
    assert_hub_accepts_the_arguments(&args);
    let rbac = IsolatedRbac::apply(&hubbed, PD_NAMESPACE, "hubpod");
    rbac.assert_allows(
        "hub pod",
        PD_SERVICE_ACCOUNT,
        &hub_calls(PD_NAMESPACE, true),
    );
}

// === Helm =====================================================================

/// A chart whose one template is the vendor's manifests as rendered (a stand-in for the
/// vendor's own chart: the post-renderer sees what any chart renders).
fn vendor_chart(ws: &Workspace, vendor: &[Value]) -> PathBuf {
    let dir = ws.dir.path().join("pd-chart");
    std::fs::create_dir_all(dir.join("templates")).expect("chart directory");
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: gcp-compute-persistent-disk-csi-driver\nversion: 1.28.1\n",
    )
    .expect("write Chart.yaml");
    let yaml: Vec<String> = vendor
        .iter()
        .map(|o| serde_json::to_string(o).expect("JSON"))
        .collect();
    std::fs::write(dir.join("templates/manifests.yaml"), yaml.join("\n---\n"))
        .expect("write the template");
    dir
}

/// `helm template` of `chart` through attacher-hub's post-renderer with `args`: Helm 3 runs
/// the script, Helm 4 the plugin (`deploy/helm-post-renderer` linked into a plugins directory
/// of the test's own).
fn post_rendered(ws: &Workspace, helm: &str, chart: &Path, args: &[&str]) -> Vec<Value> {
    documents(&post_rendered_text(ws, helm, chart, args))
}

/// As [`post_rendered`], the text Helm prints.
fn post_rendered_text(ws: &Workspace, helm: &str, chart: &Path, args: &[&str]) -> String {
    let cluster = Cluster::get();
    let script = repo().join("deploy/helm-post-renderer/attacher-hub-post-renderer");
    let plugins = ws.dir.path().join("helm-plugins");
    if !plugins.join("attacher-hub-topology").exists() {
        std::fs::create_dir_all(&plugins).expect("plugins directory");
        std::os::unix::fs::symlink(
            repo().join("deploy/helm-post-renderer"),
            plugins.join("attacher-hub-topology"),
        )
        .expect("link the plugin");
    }
    let path = format!(
        "{}:{}",
        cluster.testbins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["template", "pd"])
        .arg(chart)
        .env("PATH", path)
        .env("HELM_PLUGINS", &plugins)
        .env("HELM_CONFIG_HOME", ws.dir.path().join("helm-config"))
        .env("HELM_CACHE_HOME", ws.dir.path().join("helm-cache"))
        .env("HELM_DATA_HOME", ws.dir.path().join("helm-data"));
    match helm {
        "helm3" => cmd.arg("--post-renderer").arg(&script),
        _ => cmd.args(["--post-renderer", "attacher-hub-topology"]),
    };
    for a in args {
        cmd.args(["--post-renderer-args", a]);
    }
    let (ok, out, err) = run(cmd, None);
    assert!(
        ok,
        "{helm} template through the post-renderer {args:?}:\n{err}"
    );
    out
}

/// The objects of `objs` by key.
fn by_key(objs: &[Value]) -> BTreeMap<String, Value> {
    objs.iter().map(|o| (key(o), o.clone())).collect()
}

#[test]
fn helm_post_renderer_applies_the_topologies_to_a_vendor_chart_with_helm_3_and_4() {
    let ws = Workspace::new();
    let vendor = ws.vendor();
    let chart = vendor_chart(&ws, &vendor);
    let swapped = by_key(&ws.render("sidecar-swap"));
    for helm in ["helm3", "helm"] {
        // (a): the same objects as the kustomize component.
        let objs = post_rendered(&ws, helm, &chart, &[]);
        assert_eq!(
            by_key(&objs),
            swapped,
            "{helm}: the post-renderer and deploy/examples/gce-pd/sidecar-swap differ"
        );
        // (b): the vendor side of the controller node pool.
        let socket_dir = format!("{EXPORT_DIR}/{PD_DRIVER}");
        let objs = post_rendered(
            &ws,
            helm,
            &chart,
            &["export-controller-socket", &socket_dir, "storage"],
        );
        let what = format!("{helm} post-renderer, controller pool");
        dry_run(&what, &objs);
        let socket = assert_exports_socket(&what, &vendor, &objs);
        let ds_objs = documents(&helm_chart_template(
            helm,
            "attacher-hub",
            &["-f", "ci/controller-pool-values.yaml"],
        ));
        let ds = ds_objs
            .iter()
            .find(|o| kind(o) == "DaemonSet")
            .expect("a DaemonSet");
        assert_daemonset_discovers(&what, ds, &socket, find(&objs, "Deployment", PD_CONTROLLER));
    }
    // Bad settings are refused naming what is wrong.
    let cluster = Cluster::get();
    for (args, needle) in [
        (&["bogus"][..], "unknown topology 'bogus'"),
        (
            &["export-controller-socket"][..],
            "needs the socket directory",
        ),
        (
            &["export-controller-socket", "relative/dir", "storage"][..],
            "must be an absolute path",
        ),
    ] {
        let mut cmd = Command::new(cluster.bin("helm3"));
        cmd.args(["template", "pd"])
            .arg(&chart)
            .arg("--post-renderer")
            .arg(repo().join("deploy/helm-post-renderer/attacher-hub-post-renderer"))
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    cluster.testbins.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            );
        for a in args {
            cmd.args(["--post-renderer-args", a]);
        }
        let (ok, _, err) = run(cmd, None);
        assert!(!ok && err.contains(needle), "{args:?}: {err}");
    }
}

/// PD's own webhook Deployment (`base/webhook`, which stable-master leaves out): a Deployment
/// next to the controller, in its namespace, with no csi-attacher container. Its file's text
/// (comments included) and the object.
fn pd_webhook(ws: &Workspace) -> (String, Value) {
    let file = ws.examples().join("vendor/base/webhook/deployment.yaml");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let obj = documents(&text).pop().expect("the webhook Deployment");
    assert_eq!(kind(&obj), "Deployment");
    assert!(container(&obj, "csi-attacher").is_none());
    (text, obj)
}

#[test]
fn helm_post_renderer_changes_only_the_deployment_that_holds_csi_attacher() {
    let ws = Workspace::new();
    let vendor = ws.vendor();
    let chart = vendor_chart(&ws, &vendor);
    let (webhook_text, webhook) = pd_webhook(&ws);
    std::fs::write(chart.join("templates/webhook.yaml"), &webhook_text).expect("write template");
    // An object that names csi-attacher without being a Deployment that runs it.
    let notes_text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: attacher-notes\n  \
                      namespace: gce-pd-csi-driver\ndata:\n  \
                      container: csi-attacher # swapped by attacher-hub\n";
    std::fs::write(chart.join("templates/notes.yaml"), notes_text).expect("write template");
    let socket_dir = format!("{EXPORT_DIR}/{PD_DRIVER}");
    for helm in ["helm3", "helm"] {
        for args in [
            &["sidecar-swap"][..],
            &["export-controller-socket", &socket_dir, "storage"][..],
        ] {
            let what = format!("{helm} post-renderer {args:?}");
            let text = post_rendered_text(&ws, helm, &chart, args);
            let objs = documents(&text);
            assert_eq!(
                find(&objs, "Deployment", "pd-csi-taint-webhook"),
                &webhook,
                "{what}: a Deployment without a csi-attacher container changed"
            );
            // Not through kustomize, which drops comments. Helm 3 prints what the post-renderer
            // wrote; Helm 4 re-indents the documents it is given back (keeping comments).
            for comment in [
                "# REQUIRED: Must contain tls.crt and tls.key",
                "# swapped by attacher-hub",
            ] {
                assert!(text.contains(comment), "{what}: {comment:?} lost:\n{text}");
            }
            if helm == "helm3" {
                for written in [webhook_text.trim_end(), notes_text.trim_end()] {
                    assert!(
                        text.contains(written),
                        "{what}: not written byte for byte as the chart rendered it:\n{written}\n--- in ---\n{text}"
                    );
                }
            }
            let pd = find(&objs, "Deployment", PD_CONTROLLER);
            match args[0] {
                "sidecar-swap" => assert_eq!(
                    container(pd, "csi-attacher").expect("the attacher")["image"],
                    HUB_IMAGE,
                    "{what}"
                ),
                _ => assert!(container(pd, "csi-attacher").is_none(), "{what}"),
            }
            // Everything else is the vendor's (and the swap's metrics Service is added).
            let pd_key = key(pd);
            let mut added = vec![
                key(&webhook),
                "ConfigMap gce-pd-csi-driver/attacher-notes".into(),
            ];
            if args[0] == "sidecar-swap" {
                added.push(key(metrics_service(&what, &objs, pd, "sidecar-swap")));
            }
            assert_unchanged_except(&what, &vendor, &objs, &[pd_key], &added);
        }
    }
    // The script itself, fed a stream as any renderer writes it: every document but the
    // controller's comes out byte for byte.
    let cluster = Cluster::get();
    let script = || {
        let mut cmd =
            Command::new(repo().join("deploy/helm-post-renderer/attacher-hub-post-renderer"));
        cmd.env(
            "PATH",
            format!(
                "{}:{}",
                cluster.testbins.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
        cmd
    };
    let others: Vec<String> = vendor
        .iter()
        .filter(|o| key(o) != key(find(&vendor, "Deployment", PD_CONTROLLER)))
        .map(|o| serde_json::to_string(o).expect("JSON"))
        .chain([
            webhook_text.trim_end().to_string(),
            notes_text.trim_end().to_string(),
        ])
        .collect();
    let controller =
        serde_json::to_string(find(&vendor, "Deployment", PD_CONTROLLER)).expect("JSON");
    let stream = format!("{}\n---\n{controller}\n", others.join("\n---\n"));
    let (ok, out, err) = run(script(), Some(&stream));
    assert!(ok, "the post-renderer on a stream: {err}");
    let written: Vec<&str> = out
        .strip_prefix("---\n")
        .unwrap_or(&out)
        .split("\n---\n")
        .map(str::trim_end)
        .collect();
    for doc in &others {
        assert!(
            written.contains(&doc.as_str()),
            "not written byte for byte:\n{doc}\n--- in ---\n{out}"
        );
    }
    // Manifests without such a Deployment are refused: the topology would change nothing.
    let (ok, _, err) = run(script(), Some(&webhook_text));
    assert!(
        !ok && err.contains("no Deployment with a container named csi-attacher"),
        "{err}"
    );
}

#[test]
fn components_refuse_a_deployment_without_csi_attacher_instead_of_patching_it() {
    let ws = Workspace::new();
    let (webhook_text, _) = pd_webhook(&ws);
    for (topology, component) in [
        ("sidecar-swap", "sidecar-swap"),
        ("controller-pool", "export-controller-socket"),
        ("hub-pod", "hub-pod"),
    ] {
        // The example with PD's webhook Deployment among its resources.
        let dir = ws.example(topology);
        std::fs::write(dir.join("webhook.yaml"), &webhook_text).expect("write webhook.yaml");
        let file = dir.join("kustomization.yaml");
        let text = std::fs::read_to_string(&file).expect("read kustomization");
        let from = "  - ../vendor/overlays/stable-master\n";
        assert!(text.contains(from), "{}: {text}", file.display());
        std::fs::write(
            &file,
            text.replace(from, &format!("{from}  - webhook.yaml\n")),
        )
        .expect("write kustomization");
        let mut cmd = Command::new(Cluster::get().bin("kubectl"));
        cmd.arg("kustomize").arg(&dir);
        let (ok, out, err) = run(cmd, None);
        assert!(
            !ok,
            "{component}: a kustomization with a Deployment without csi-attacher was built:\n{}",
            documents(&out)
                .iter()
                .filter(|o| name(o) == "pd-csi-taint-webhook")
                .map(|o| o.to_string())
                .collect::<String>()
        );
        assert!(
            err.contains("csi-attacher-guard")
                && err.contains("spec.template.spec.containers.[name=csi-attacher]"),
            "{component}: kustomize's refusal names the guard and the container:\n{err}"
        );
    }
}

/// `helm template <release> deploy/helm/attacher-hub <args>` (values files relative to the chart).
fn helm_chart_template(helm: &str, namespace: &str, args: &[&str]) -> String {
    let cluster = Cluster::get();
    let chart = repo().join("deploy/helm/attacher-hub");
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["template", "attacher-hub"])
        .arg(&chart)
        .args(["--namespace", namespace])
        .current_dir(&chart)
        .args(args);
    let (ok, out, err) = run(cmd, None);
    assert!(ok, "{helm} template {args:?}:\n{err}");
    out
}

#[test]
fn helm_hub_shape_holds_the_pd_controller_plugin_and_serves_it() {
    let ws = Workspace::new();
    let vendor = ws.vendor();
    let pd = find(&vendor, "Deployment", PD_CONTROLLER);
    // The PD controller pod's containers and volumes, but its attacher, in the chart's hub pod
    // (topology c), running as PD's ServiceAccount in PD's namespace.
    let driver_containers: Vec<&Value> = containers(pd)
        .into_iter()
        .filter(|c| c["name"] != "csi-attacher")
        .collect();
    let extra_volumes: Vec<&Value> = pod(pd)["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter(|v| v["name"] != "socket-dir")
        .collect();
    let drivers: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(ws.example("hub-pod").join("drivers.yaml")).expect("drivers.yaml"),
    )
    .expect("YAML");
    let values = json!({
        "mode": "hub",
        "serviceAccount": {"create": false, "name": PD_SERVICE_ACCOUNT},
        "hub": {"drivers": drivers["drivers"], "driverContainers": driver_containers},
        "extraVolumes": extra_volumes,
    });
    let file = ws.dir.path().join("pd-hub-values.json");
    std::fs::write(&file, values.to_string()).expect("write values");
    for helm in ["helm", "helm3"] {
        let what = format!("{helm} hub shape with PD");
        let objs = documents(&helm_chart_template(
            helm,
            PD_NAMESPACE,
            &["-f", &file.to_string_lossy()],
        ));
        dry_run(&what, &objs);
        assert_no_go_attacher(&what, &objs);
        let hub = find(&objs, "Deployment", "attacher-hub");
        assert_hub_pod(&what, &objs, hub, "attacher-hub");
        for c in &driver_containers {
            assert_eq!(
                container(hub, c["name"].as_str().unwrap_or_default()),
                Some(*c),
                "{what}: PD's containers run unchanged in the hub pod"
            );
        }
        if helm == "helm" {
            // PD's RBAC and the chart's, bound to PD's account: every call attacher-hub makes.
            let mut both = vendor.clone();
            both.extend(objs.iter().cloned());
            let rbac = IsolatedRbac::apply(&both, PD_NAMESPACE, "helmhub");
            rbac.assert_allows(&what, PD_SERVICE_ACCOUNT, &hub_calls(PD_NAMESPACE, true));
            assert!(
                can_i(
                    &rbac.user(PD_SERVICE_ACCOUNT),
                    GUARD_CALL.0,
                    GUARD_CALL.1,
                    None,
                    None
                ),
                "{what}: the chart's lease guard grant reaches PD's account"
            );
        }
    }
}

// === (b) end to end ==========================================================

/// Lease timings of the end-to-end run: a dead node's drivers are taken over within seconds.
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_secs(1);

/// A driver process serving `<export>/<name>/csi.sock`, as a controller pod exports it.
struct ExportedDriver {
    name: String,
    node_id: String,
    /// Handles of its volumes.
    volumes: Vec<String>,
    /// The driver process, killed when dropped.
    _process: support::ChildProcess,
}

/// Starts the Rust mock (`rust: true`) or the Go mockcsi as driver `name` on its socket in the
/// export directory and waits for its ready line.
async fn start_exported(
    cluster: &Cluster,
    export: &Path,
    name: &str,
    rust: bool,
) -> ExportedDriver {
    let dir = export.join(name);
    std::fs::create_dir_all(&dir).expect("driver subdirectory");
    let socket = dir.join("csi.sock");
    let (label, program, extra): (&str, PathBuf, Vec<String>) = if rust {
        (
            "mock-csi-driver",
            support::mock_csi_driver_bin().to_path_buf(),
            vec![],
        )
    } else {
        ("mockcsi", cluster.bin("mockcsi"), vec!["-v=2".into()])
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg(format!("--endpoint={}", socket.display()))
        .arg(format!("--name={name}"))
        .arg("--volumes=4")
        .args(extra);
    let mut process = support::ChildProcess::spawn(label, cmd);
    process
        .wait_for_output("ready\n", 1, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{label} {name}: {e}"));
    assert!(socket.exists(), "{} was not created", socket.display());
    // The Rust mock's volumes are vol-0, vol-1, ...; the Go mock prints `vol-<i> <handle>`.
    let volumes = if rust {
        (0..4).map(|i| format!("vol-{i}")).collect()
    } else {
        process
            .stdout()
            .lines()
            .filter(|l| l.starts_with("vol-"))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect()
    };
    ExportedDriver {
        name: name.to_string(),
        // The Go mock knows one node, named after the driver; the Rust mock takes any.
        node_id: if rust { "node-1".into() } else { name.into() },
        volumes,
        _process: process,
    }
}

/// Which of `hubs` lead `driver` (by their own `/drivers`).
async fn leaders(hubs: &[&support::Attacher], driver: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, h) in hubs.iter().enumerate() {
        if h.leads(driver).await == Some(true) {
            out.push(i);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_pool_end_to_end_two_nodes_one_dies() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::Api;
    use support::{
        Attacher, PvBuilder, create_node, create_va, eventually, go_duration, is_attached, wait_for,
    };

    let cluster = Cluster::get();
    let client = cluster.client().await;
    // The hostPath layout of topology (b): one subdirectory per driver. Short names: a Unix
    // socket path holds at most 107 bytes.
    let root = tempfile::Builder::new()
        .prefix("ah-pool-")
        .tempdir()
        .expect("temporary directory");
    let export = root.path().join("controllers");
    let token = format!("{:x}", std::process::id());
    let rust = start_exported(cluster, &export, &format!("r{token}.pool.test"), true).await;
    let go = start_exported(cluster, &export, &format!("g{token}.pool.test"), false).await;
    let drivers = [&rust, &go];

    // Two "nodes" of the pool, each an attacher-hub in discovery mode with its own identity.
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", cluster.attacher_kubeconfig.display()),
        format!("--driver-sockets={}/*/csi.sock", export.display()),
        "--leader-election".into(),
        "--leader-election-namespace=default".into(),
        format!("--leader-election-lease-duration={}", go_duration(LEASE)),
        format!("--leader-election-renew-deadline={}", go_duration(RENEW)),
        format!("--leader-election-retry-period={}", go_duration(RETRY)),
        "-v=2".into(),
    ];
    let mut node_a = Attacher::hub("node-a", &args);
    let mut node_b = Attacher::hub("node-b", &args);

    let node = support::unique_name("pool-node");
    create_node(&client, &node).await;
    // One CSINode entry per driver, as the node plugins would register them.
    let csinode = k8s_openapi::api::storage::v1::CSINode {
        status: None,
        metadata: kube::api::ObjectMeta {
            name: Some(node.clone()),
            ..Default::default()
        },
        spec: k8s_openapi::api::storage::v1::CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|d| k8s_openapi::api::storage::v1::CSINodeDriver {
                    name: d.name.clone(),
                    node_id: d.node_id.clone(),
                    ..Default::default()
                })
                .collect(),
        },
    };
    Api::<k8s_openapi::api::storage::v1::CSINode>::all(client.clone())
        .create(&Default::default(), &csinode)
        .await
        .expect("create the CSINode");

    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let mut created = Vec::new();
    let mut attach = |d: &ExportedDriver, vol: usize| {
        let (pv, va) = (
            support::unique_name(&format!("pv{vol}")),
            support::unique_name(&format!("va{vol}")),
        );
        created.push(va.clone());
        (d.name.clone(), pv, va, d.volumes[vol].clone())
    };
    // Both nodes discover both sockets; the Leases split the drivers between them.
    let first: Vec<_> = drivers.iter().map(|d| attach(d, 0)).collect();
    for (driver, pv, va, vol) in &first {
        PvBuilder::new(pv, driver, vol).create(&client).await;
        create_va(&client, va, driver, &node, pv).await;
    }
    for (_, _, va, _) in &first {
        wait_for(&vas, va, "attached", is_attached(), support::WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{va} attached by the pool: {e}"));
    }
    // Each node leads one driver once leadership is balanced (two drivers, two live nodes).
    let hubs = [&node_a, &node_b];
    let split = eventually(
        "each node leads one of the two drivers",
        Duration::from_secs(90),
        || async {
            let mut split = BTreeMap::new();
            for d in drivers {
                let l = leaders(&hubs, &d.name).await;
                if l.len() != 1 {
                    return None;
                }
                split.insert(d.name.clone(), l[0]);
            }
            (split[&rust.name] != split[&go.name]).then_some(split)
        },
    )
    .await;
    eprintln!("controller pool: leaders by driver (0 = node-a, 1 = node-b): {split:?}");

    // The node leading the Rust mock's driver dies (SIGKILL: no Lease handed over).
    let dead = split[&rust.name];
    let (dead_hub, survivor) = if dead == 0 {
        (&mut node_a, &mut node_b)
    } else {
        (&mut node_b, &mut node_a)
    };
    dead_hub.signal("-KILL");
    let killed = Instant::now();
    for d in drivers {
        eventually(
            &format!("the surviving node leads {}", d.name),
            LEASE * 4 + Duration::from_secs(10),
            || async { (survivor.leads(&d.name).await == Some(true)).then_some(()) },
        )
        .await;
    }
    eprintln!(
        "controller pool: the survivor led both drivers {:.1}s after the other node was killed",
        killed.elapsed().as_secs_f64()
    );
    // It attaches new volumes of both drivers and detaches one the dead node attached.
    let second: Vec<_> = drivers.iter().map(|d| attach(d, 1)).collect();
    for (driver, pv, va, vol) in &second {
        PvBuilder::new(pv, driver, vol).create(&client).await;
        create_va(&client, va, driver, &node, pv).await;
    }
    for (_, _, va, _) in &second {
        wait_for(&vas, va, "attached", is_attached(), support::WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{va} attached by the surviving node: {e}"));
    }
    let (_, _, gone, _) = first
        .iter()
        .find(|(d, ..)| *d == rust.name)
        .expect("the Rust mock's first VA");
    vas.delete(gone, &Default::default())
        .await
        .expect("delete a VA");
    support::wait_deleted(&vas, gone, support::WAIT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{gone} detached by the surviving node: {e}"));
    survivor.assert_running();

    // Clean up: the survivor detaches the rest.
    for va in created.iter().filter(|v| *v != gone) {
        let _ = vas.delete(va, &Default::default()).await;
    }
    for va in created.iter().filter(|v| *v != gone) {
        let _ = support::wait_deleted(&vas, va, support::WAIT_TIMEOUT).await;
    }
    survivor.process.stop().await;
}

// === the AWS EBS driver's chart ===============================================

/// The namespace EBS's chart is rendered into here.
const EBS_NAMESPACE: &str = "ebs-csi-driver";

/// EBS's controller Deployment, as its chart names it.
const EBS_CONTROLLER: &str = "ebs-csi-controller";

/// `helm template aws-ebs-csi-driver <EBS's chart> -n ebs-csi-driver -f
/// deploy/examples/aws-ebs/values.yaml`, through attacher-hub's post-renderer with `args`
/// unless `args` is `None`: Helm 3 (`helm3`) runs the script, Helm 4 (`helm`) the plugin.
fn ebs_chart(helm: &str, args: Option<&[&str]>) -> Vec<Value> {
    let cluster = Cluster::get();
    let home = tempfile::tempdir().expect("a directory for Helm");
    let plugins = home.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins directory");
    std::os::unix::fs::symlink(
        repo().join("deploy/helm-post-renderer"),
        plugins.join("attacher-hub-topology"),
    )
    .expect("link the plugin");
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["template", "aws-ebs-csi-driver"])
        .arg(support::ebs_chart())
        .args(["--namespace", EBS_NAMESPACE, "-f"])
        .arg(repo().join("deploy/examples/aws-ebs/values.yaml"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                cluster.testbins.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("HELM_PLUGINS", &plugins)
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_DATA_HOME", home.path().join("data"));
    if let Some(args) = args {
        match helm {
            "helm3" => cmd
                .arg("--post-renderer")
                .arg(repo().join("deploy/helm-post-renderer/attacher-hub-post-renderer")),
            _ => cmd.args(["--post-renderer", "attacher-hub-topology"]),
        };
        for a in args {
            cmd.args(["--post-renderer-args", a]);
        }
    }
    let (ok, out, err) = run(cmd, None);
    assert!(ok, "{helm} template of EBS's chart {args:?}:\n{err}");
    // The chart's `helm test` objects are hooks, which `helm install` does not apply.
    documents(&out)
        .into_iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect()
}

/// Topology (c) from the AWS EBS driver's own chart (v1.44.0's `charts/aws-ebs-csi-driver`,
/// with `deploy/examples/aws-ebs/values.yaml`), through the post-renderer's `hub-pod` with
/// `deploy/examples/aws-ebs/drivers.yaml`, by Helm 3 and Helm 4 alike. The chart's
/// csi-attacher declares no port and no `--http-endpoint`: the post-renderer gives it both
/// (`--http-endpoint=:8080`, port 8080 named `http-endpoint`), which the hub's readiness probe
/// and metrics Service use. Otherwise as for PD: the attacher becomes attacher-hub in hub mode
/// reading the ConfigMap `attacher-hub-drivers` (drivers.yaml as given, which attacher-hub's
/// parser accepts, naming the socket the chart's plugin serves on a volume both containers
/// mount), root without capabilities, with the chart's attacher flags; every other container
/// and object is the chart's; the API server accepts the objects. Without a drivers.yaml the
/// post-renderer refuses, saying what it needs.
#[test]
fn helm_post_renderer_makes_a_hub_pod_of_the_ebs_chart_with_helm_3_and_4() {
    let file = repo().join("deploy/examples/aws-ebs/drivers.yaml");
    let args = ["hub-pod", file.to_str().expect("a UTF-8 path")];
    let chart = ebs_chart("helm3", None);
    let hubbed = ebs_chart("helm3", Some(&args));
    assert_eq!(
        by_key(&hubbed),
        by_key(&ebs_chart("helm", Some(&args))),
        "Helm 3 and Helm 4 render EBS's chart through the post-renderer alike"
    );
    let what = "EBS hub pod";
    dry_run(what, &hubbed);
    assert_no_go_attacher(what, &hubbed);
    let before = find(&chart, "Deployment", EBS_CONTROLLER);
    let after = find(&hubbed, "Deployment", EBS_CONTROLLER);
    let hub = container(after, "csi-attacher").expect("the hub container");
    let go = container(before, "csi-attacher").expect("EBS's attacher");
    assert!(
        go["ports"].is_null() && !strings(&go["args"]).iter().any(|a| a.contains("http")),
        "EBS's chart gives its attacher no port and no listener: {go}"
    );
    assert_eq!(
        hub["image"], HUB_IMAGE,
        "{what}: attacher-hub's image in the csi-attacher's place"
    );
    assert_eq!(
        strings(&hub["command"]),
        ["/attacher-hub", "--config=/etc/attacher-hub/drivers.yaml"],
        "{what}"
    );
    let mut expected = strings(&go["args"]);
    expected.push("--http-endpoint=:8080");
    assert_eq!(
        strings(&hub["args"]),
        expected,
        "{what}: the chart's flags, and the listener the post-renderer adds"
    );
    assert_eq!(
        hub["ports"],
        json!([{"containerPort": 8080, "name": "http-endpoint", "protocol": "TCP"}]),
        "{what}"
    );
    assert_eq!(
        hub["readinessProbe"]["httpGet"]["path"], "/readyz",
        "{what}"
    );
    assert_eq!(hub["readinessProbe"]["httpGet"]["port"], 8080, "{what}");
    assert_root_without_capabilities(what, hub);
    assert_other_containers_unchanged(what, before, after, "csi-attacher");
    let drivers = find(&hubbed, "ConfigMap", "attacher-hub-drivers");
    assert_eq!(namespace(drivers), EBS_NAMESPACE, "{what}");
    let text = drivers["data"]["drivers.yaml"]
        .as_str()
        .expect("drivers.yaml");
    assert_eq!(
        text,
        std::fs::read_to_string(&file).expect("drivers.yaml"),
        "{what}: the ConfigMap holds the given drivers.yaml"
    );
    let defaults = attacher_hub::config::Defaults::with_identity(
        &attacher_hub::cli::Args::default(),
        "test".into(),
    );
    let parsed = attacher_hub::config::parse(text, "drivers.yaml", &defaults, false)
        .unwrap_or_else(|e| panic!("{what}: attacher-hub refuses drivers.yaml: {e}"));
    let socket = parsed.drivers[0].address.path().to_path_buf();
    let dir = format!("{}/", socket.parent().expect("a directory").display());
    let (shared, _) = volume_at(after, hub, &dir);
    let plugin = container(after, "ebs-plugin").expect("EBS's plugin");
    let (served, _) = volume_at(after, plugin, &dir);
    assert_eq!(shared, served, "{what}: the hub and the plugin share {dir}");
    assert!(
        plugin["env"]
            .as_array()
            .is_some_and(|env| env.iter().any(|e| {
                e["name"] == "CSI_ENDPOINT"
                    && e["value"].as_str() == Some(&format!("unix://{}", socket.display()))
            })),
        "{what}: EBS's plugin serves {}",
        socket.display()
    );
    let service = metrics_service(what, &hubbed, after, "hub-pod");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], 8080, "{what}");
    assert_unchanged_except(
        what,
        &chart,
        &hubbed,
        &[key(after)],
        &[key(drivers), key(service)],
    );
    // hub-pod without its drivers.yaml.
    let mut cmd = Command::new(Cluster::get().bin("helm3"));
    cmd.args(["template", "aws-ebs-csi-driver"])
        .arg(support::ebs_chart())
        .arg("--post-renderer")
        .arg(repo().join("deploy/helm-post-renderer/attacher-hub-post-renderer"))
        .args(["--post-renderer-args", "hub-pod"])
        .env(
            "PATH",
            format!(
                "{}:{}",
                Cluster::get().testbins.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
    let (ok, _, err) = run(cmd, None);
    assert!(
        !ok && err.contains("hub-pod needs the drivers.yaml"),
        "hub-pod without drivers.yaml: {err}"
    );
}
