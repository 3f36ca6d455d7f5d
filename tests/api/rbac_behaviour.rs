//! The RBAC we ship, derived from what attacher-hub does.
//!
//! Each mode (sidecar, hub with two replicas, discovery with two replicas) runs against the real
//! API server as a ServiceAccount of its own that may do anything, and goes through everything
//! it does in a cluster: it attaches and detaches volumes (one with a controller-publish
//! secret), takes, renews, hands over and releases its Leases, counts its replicas, asks the
//! cross-namespace Lease guard and shuts down. The API server's audit log (scripts/cluster-up.sh
//! logs every ServiceAccount's requests) then says which requests the mode made: verb, API
//! group, resource and subresource, and namespace or cluster scope. The first replica of each
//! mode gets its watches' first state by paginated LISTs (streaming lists off), the second by
//! streaming lists (the default; a watch), so that the RBAC serves both, and the fallback
//! from one to the other.
//!
//! Every shipped RBAC (the kustomize overlays with their components, and the Helm chart in each
//! shape) must grant each request of the modes it is for, to the ServiceAccount its workload
//! runs as, in the namespace the workload runs in; and each of its rules must be asked for by
//! one of those requests: all of what the code needs, nothing more.

use crate::hub;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Secret, ServiceAccount};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use hub::{RustMock, driver_entry, drivers_yaml, free_port};
use support::{
    ChildProcess, Cluster, PvBuilder, create_csinode, create_node, create_va, documents, http_get,
    is_attached, kubectl, kustomize, repo, unique_driver_name, unique_name, wait_deleted, wait_for,
};

/// One API request, as the audit log records it, with the namespace made relative: `Own` is
/// the namespace the hub runs in (its Leases), `Other` any other one, `All` a request across
/// namespaces, `Cluster` a cluster-scoped object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    verb: String,
    group: String,
    /// `resource` or `resource/subresource`.
    resource: String,
    scope: Scope,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Cluster,
    All,
    Own,
    Other,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(
            f,
            "{} {group}/{} ({:?})",
            self.verb, self.resource, self.scope
        )
    }
}

/// The requests `user` made, from the API server's audit log; `own` is the hub's namespace.
fn audited(user: &str, own: &str) -> BTreeSet<Request> {
    support::audit_events(user)
        .iter()
        .filter_map(|e| {
            let obj = &e["objectRef"];
            let resource = obj["resource"].as_str()?;
            let resource = match obj["subresource"].as_str() {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_string(),
            };
            let scope = match (obj["namespace"].as_str(), e["verb"].as_str()) {
                (Some(ns), _) if ns == own => Scope::Own,
                (Some(_), _) => Scope::Other,
                (None, Some("list" | "watch")) if is_namespaced(&resource) => Scope::All,
                (None, _) => Scope::Cluster,
            };
            Some(Request {
                verb: e["verb"].as_str()?.to_string(),
                group: obj["apiGroup"].as_str().unwrap_or_default().to_string(),
                resource,
                scope,
            })
        })
        .collect()
}

/// The namespaced resources the hub may touch (everything else it reads is cluster-scoped).
fn is_namespaced(resource: &str) -> bool {
    matches!(
        resource.split('/').next(),
        Some("leases" | "secrets" | "events")
    )
}

/// Creates the namespace `name`.
async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// A namespace with a ServiceAccount that may do anything (so that no refusal hides a later
/// request) and a kubeconfig with a token of it, issued by the TokenRequest API as a pod's is.
async fn unrestricted_identity(client: &Client, dir: &Path, ns: &str) -> (PathBuf, String) {
    create_namespace(client, ns).await;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta {
                name: Some("attacher-hub".into()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        },
    )
    .await
    .expect("create the ServiceAccount");
    let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": format!("ah-everything-{ns}")},
         "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": format!("ah-everything-{ns}")},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("ah-everything-{ns}")},
         "subjects": [{"kind": "ServiceAccount", "name": "attacher-hub", "namespace": ns}]}
    ]});
    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&rbac.to_string()));
    assert!(ok, "{out}");
    let token = sas
        .create_token_request(
            "attacher-hub",
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..TokenRequestSpec::default()
                }),
                ..TokenRequest::default()
            },
        )
        .await
        .expect("a token")
        .status
        .and_then(|s| s.token)
        .expect("a token in the answer");
    let cluster = Cluster::get();
    let admin = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("admin kubeconfig");
    let server = admin.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .expect("server");
    let ca = cluster
        .kubeconfig
        .parent()
        .expect("cluster dir")
        .join("pki/ca.crt");
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
             users:\n- name: u\n  user:\n    token: {token}\n\
             contexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: {ns}}}\ncurrent-context: c\n",
            ca.display()
        ),
    )
    .expect("write the kubeconfig");
    (path, format!("system:serviceaccount:{ns}:attacher-hub"))
}

/// A hub process: `args` plus the kubeconfig, HTTP endpoint and POD_NAMESPACE a pod would
/// give it, under its own host name (its Lease identity).
struct Replica {
    process: ChildProcess,
    port: u16,
}

/// How a replica gets its watches' first state: streamed by the API server (the default) or
/// listed in pages (`KUBE_FEATURE_WatchListClient=false`, and what the hub falls back to where
/// the API server refuses streaming lists). The first replica of each mode lists, the second
/// streams, so that the RBAC is checked against both.
#[derive(Clone, Copy, PartialEq, Eq)]
enum InitialList {
    Paginated,
    Streaming,
}

fn start_replica(
    label: &str,
    kubeconfig: &Path,
    ns: &str,
    host: &str,
    (args, initial): (&[String], InitialList),
) -> Replica {
    let port = free_port();
    let mut all = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--leader-election".to_string(),
        "--leader-election-lease-duration=4s".to_string(),
        "--leader-election-renew-deadline=3s".to_string(),
        "--leader-election-retry-period=1s".to_string(),
        "--retry-interval-start=200ms".to_string(),
        "--retry-interval-max=2s".to_string(),
        "-v=2".to_string(),
    ];
    all.extend(args.iter().cloned());
    let mut cmd =
        support::under_hostname(host, Path::new(env!("CARGO_BIN_EXE_attacher-hub")), &all);
    cmd.env("POD_NAMESPACE", ns);
    if initial == InitialList::Paginated {
        cmd.env("KUBE_FEATURE_WatchListClient", "false");
    }
    Replica {
        process: ChildProcess::spawn(label, cmd),
        port,
    }
}

impl Replica {
    /// Waits until this replica leads `lease` (its `/metrics`).
    async fn wait_leading(&mut self, count: usize, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Ok((200, body)) = http_get(self.port, "/metrics").await {
                let leading = body
                    .lines()
                    .filter(|l| {
                        l.starts_with("leader_election_master_status{") && l.ends_with(" 1")
                    })
                    .count();
                if leading >= count {
                    return Ok(());
                }
            }
            if let Some(status) = self.process.exited() {
                return Err(format!("exited: {status}"));
            }
            if start.elapsed() > timeout {
                return Err(format!("does not lead {count} drivers"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn stop(mut self) {
        self.process.stop().await;
    }
}

/// The objects a volume of `driver` needs on `node`, attached and then detached; `secret_ns`
/// holds the controller-publish secret.
async fn attach_and_detach(
    client: &Client,
    driver: &str,
    node: &str,
    secret_ns: &str,
    n: usize,
) -> Result<(), String> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let name = unique_name("rbac-beh");
    PvBuilder::new(&name, driver, &format!("vol-{n}"))
        .controller_publish_secret("publish", secret_ns)
        .create(client)
        .await;
    create_va(client, &name, driver, node, &name).await;
    let result = async {
        wait_for(
            &vas,
            &name,
            "attached",
            is_attached(),
            Duration::from_secs(30),
        )
        .await
        .map_err(|e| format!("{driver}: attach: {e}"))?;
        vas.delete(&name, &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        wait_deleted(&vas, &name, Duration::from_secs(30))
            .await
            .map_err(|e| format!("{driver}: detach: {e}"))
    }
    .await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let _ = vas.patch(&name, &PatchParams::default(), &unfinalize).await;
    let _ = vas.delete(&name, &DeleteParams::default()).await;
    let _ = pvs.patch(&name, &PatchParams::default(), &unfinalize).await;
    let _ = pvs.delete(&name, &DeleteParams::default()).await;
    result
}

/// Two VAs of one multi-node PV made at once, on `nodes[0]` and `nodes[1]`: the second sync
/// builds its PV finalizer patch from a cached copy without the finalizer the first one just
/// added, the API server refuses the patch (422), and the hub reads the PV live (`get`). The
/// race is repeated until the audit log shows that read (a few tries at most).
async fn stale_pv_race(
    client: &Client,
    driver: &str,
    nodes: &[String],
    user: &str,
) -> Result<(), String> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for _ in 0..20 {
        let pv = unique_name("rbac-race");
        PvBuilder::new(&pv, driver, "vol-3")
            .access_modes(&["ReadWriteMany"])
            .create(client)
            .await;
        let names: Vec<String> = nodes.iter().map(|n| format!("{pv}-{n}")).collect();
        futures::future::join_all(
            names
                .iter()
                .zip(nodes)
                .map(|(va, node)| create_va(client, va, driver, node, &pv)),
        )
        .await;
        for va in &names {
            wait_for(&vas, va, "attached", is_attached(), Duration::from_secs(30))
                .await
                .map_err(|e| format!("{driver}: attach of one of two VAs of a PV: {e}"))?;
        }
        for va in &names {
            let _ = vas.delete(va, &DeleteParams::default()).await;
        }
        for va in &names {
            wait_deleted(&vas, va, Duration::from_secs(30))
                .await
                .map_err(|e| format!("{driver}: detach of one of two VAs of a PV: {e}"))?;
        }
        let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let _ = pvs.patch(&pv, &PatchParams::default(), &unfinalize).await;
        let _ = pvs.delete(&pv, &DeleteParams::default()).await;
        let read = support::audit_events(user)
            .iter()
            .any(|e| e["verb"] == "get" && e["objectRef"]["resource"] == "persistentvolumes");
        if read {
            return Ok(());
        }
    }
    Err(format!(
        "{driver}: 20 pairs of VAs of one PV never made the hub read a PV live"
    ))
}

/// The publish secret in `ns`.
async fn publish_secret(client: &Client, ns: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("publish".into()),
                    ..ObjectMeta::default()
                },
                string_data: Some(BTreeMap::from([("password".into(), "s3cret".into())])),
                ..Secret::default()
            },
        )
        .await
        .expect("create the publish secret");
}

/// The modes whose requests the shipped RBAC must grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    Sidecar,
    Hub,
    Discovery,
}

/// Runs `mode` through everything it does; its requests.
async fn record(mode: Mode) -> BTreeSet<Request> {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let dir = tempfile::Builder::new()
        .prefix("ah-rbac-beh-")
        .tempdir()
        .expect("temp dir");
    // Short: the secrets' namespace adds a suffix, and a namespace name has at most 63 bytes.
    let ns = format!(
        "ah-rbac-{}-{}-{:x}",
        format!("{mode:?}").to_lowercase(),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default()
    );
    let (kubeconfig, user) = unrestricted_identity(&client, dir.path(), &ns).await;
    // The secret lives in another namespace than the hub's, as a PV's secret usually does.
    let secret_ns = format!("{ns}-secrets");
    create_namespace(&client, &secret_ns).await;
    publish_secret(&client, &secret_ns).await;
    let node = unique_name("rbac-node");
    create_node(&client, &node).await;
    let node2 = format!("{node}-2");
    create_node(&client, &node2).await;

    let drivers: Vec<String> = match mode {
        Mode::Sidecar => vec![unique_driver_name("rbac-s")],
        _ => vec![unique_driver_name("rbac-a"), unique_driver_name("rbac-b")],
    };
    let sockets = dir.path().join("sockets");
    let mut mocks = Vec::new();
    for d in &drivers {
        let mock = RustMock::start(d, 4).await;
        // Discovery mode finds `<dir>/<driver>/csi.sock`: a link to the mock's socket.
        let driver_dir = sockets.join(d);
        std::fs::create_dir_all(&driver_dir).expect("socket dir");
        std::os::unix::fs::symlink(&mock.socket, driver_dir.join("csi.sock")).expect("socket link");
        mocks.push(mock);
    }
    // One CSINode entry per driver.
    let csinodes: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(client.clone());
    for n in [&node, &node2] {
        create_csinode(&client, n, &drivers[0], n).await;
        if drivers.len() > 1 {
            let patch = json!({"spec": {"drivers": drivers.iter().map(|d| json!({"name": d, "nodeID": n})).collect::<Vec<_>>()}});
            csinodes
                .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("CSINode drivers");
        }
    }

    let args: Vec<String> = match mode {
        Mode::Sidecar => vec![format!("--csi-address={}", mocks[0].socket.display())],
        Mode::Hub => {
            let file = dir.path().join("drivers.yaml");
            let entries: Vec<String> = mocks
                .iter()
                .map(|m| driver_entry(&m.socket, &m.name))
                .collect();
            std::fs::write(&file, drivers_yaml(&entries)).expect("drivers.yaml");
            vec![format!("--config={}", file.display())]
        }
        Mode::Discovery => vec![format!("--driver-sockets={}/*/csi.sock", sockets.display())],
    };
    let replicas = if mode == Mode::Sidecar { 1 } else { 2 };
    let label = format!("rbac-{mode:?}").to_lowercase();
    let outcome = async {
        let mut first = start_replica(
            &format!("{label}-1"),
            &kubeconfig,
            &ns,
            &format!("{ns}-1"),
            (&args, InitialList::Paginated),
        );
        first
            .wait_leading(drivers.len(), Duration::from_secs(30))
            .await
            .map_err(|e| format!("replica 1: {e}"))?;
        for (i, d) in drivers.iter().enumerate() {
            attach_and_detach(&client, d, &node, &secret_ns, i).await?;
        }
        stale_pv_race(&client, &drivers[0], &[node.clone(), node2.clone()], &user).await?;
        if replicas > 1 {
            // A second replica joins (the drivers are shared out), then the first leaves (its
            // drivers are handed over), then the second leaves too.
            let mut second = start_replica(
                &format!("{label}-2"),
                &kubeconfig,
                &ns,
                &format!("{ns}-2"),
                (&args, InitialList::Streaming),
            );
            second
                .wait_leading(1, Duration::from_secs(30))
                .await
                .map_err(|e| format!("replica 2 joining: {e}"))?;
            first.stop().await;
            second
                .wait_leading(drivers.len(), Duration::from_secs(30))
                .await
                .map_err(|e| format!("replica 2 taking over: {e}"))?;
            for (i, d) in drivers.iter().enumerate() {
                attach_and_detach(&client, d, &node, &secret_ns, i + 2).await?;
            }
            second.stop().await;
        } else {
            first.stop().await;
        }
        Ok::<(), String>(())
    }
    .await;
    for m in mocks {
        m.handle.shutdown().await;
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for n in [&node, &node2] {
        let _ = csinodes.delete(n, &DeleteParams::default()).await;
        let _ = nodes.delete(n, &DeleteParams::default()).await;
    }
    let (_, _) = kubectl(
        &[
            "delete",
            "clusterrolebinding,clusterrole",
            &format!("ah-everything-{ns}"),
            "--ignore-not-found",
        ],
        None,
    );
    if let Err(why) = outcome {
        panic!("{mode:?} mode did not go through its steps: {why}");
    }
    // Both ways of getting the watches' first state went to the API server: pages of a LIST
    // (replica 1) and, where a second replica ran, a watch that streams the current objects.
    let uris: Vec<String> = support::audit_events(&user)
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "volumeattachments")
        .map(|e| {
            format!(
                "{} {}",
                e["verb"].as_str().unwrap_or_default(),
                e["requestURI"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert!(
        uris.iter().any(|u| u.starts_with("list ")),
        "{mode:?}: no LIST of VolumeAttachments with streaming lists off: {uris:#?}"
    );
    if replicas > 1 {
        assert!(
            uris.iter()
                .any(|u| u.starts_with("watch ") && u.contains("sendInitialEvents=true")),
            "{mode:?}: no streaming list of VolumeAttachments: {uris:#?}"
        );
    }
    // Every request names its program, as client-go's do: the audit log, the API server's
    // flow schemas and an operator tell attacher-hub's requests by their User-Agent.
    let agents: BTreeSet<String> = support::audit_events(&user)
        .iter()
        .map(|e| e["userAgent"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        agents
            .iter()
            .all(|a| a.starts_with("attacher-hub/v") && a.contains(" (linux/")),
        "{mode:?}: requests without attacher-hub's User-Agent: {agents:?}"
    );
    audited(&user, &ns)
}

/// One rule of a shipped role, as bound to the hub's ServiceAccount: namespace `None` for a
/// ClusterRoleBinding.
#[derive(Clone, Debug)]
struct Grant {
    role: String,
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    namespace: Option<String>,
}

impl Grant {
    fn allows(&self, r: &Request, own: &str) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        let scoped = match (&self.namespace, &r.scope) {
            (None, _) => true,
            (Some(ns), Scope::Own) => ns == own,
            _ => false,
        };
        scoped
            && any(&self.groups, &r.group)
            && any(&self.resources, &r.resource)
            && any(&self.verbs, &r.verb)
    }
}

/// The grants the rendered `objects` give to the ServiceAccount their attacher-hub workload
/// runs as, and that workload's namespace.
fn grants(objects: &[Value]) -> (Vec<Grant>, String) {
    let workload = objects
        .iter()
        .find(|o| {
            matches!(o["kind"].as_str(), Some("Deployment" | "DaemonSet"))
                && o["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c["image"]
                                .as_str()
                                .is_some_and(|i| i.contains("attacher-hub"))
                        })
                    })
        })
        .expect("a workload running attacher-hub");
    let ns = workload["metadata"]["namespace"]
        .as_str()
        .expect("the workload's namespace")
        .to_string();
    let sa = workload["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let mut out = Vec::new();
    for b in objects.iter().filter(|o| {
        matches!(
            o["kind"].as_str(),
            Some("RoleBinding" | "ClusterRoleBinding")
        )
    }) {
        let ours = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == sa.as_str()
                && s["namespace"].as_str().unwrap_or(&ns) == ns
        });
        if !ours {
            continue;
        }
        let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
        let role = objects
            .iter()
            .find(|o| o["kind"] == role_kind && o["metadata"]["name"] == role_name)
            .unwrap_or_else(|| {
                panic!(
                    "{} binds {role_kind} {role_name}, which is not shipped",
                    b["metadata"]["name"]
                )
            });
        let namespace = (b["kind"] == "RoleBinding").then(|| {
            b["metadata"]["namespace"]
                .as_str()
                .unwrap_or(&ns)
                .to_string()
        });
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        };
        for rule in role["rules"].as_array().into_iter().flatten() {
            out.push(Grant {
                role: format!("{role_kind} {role_name}"),
                groups: strings(&rule["apiGroups"]),
                resources: strings(&rule["resources"]),
                verbs: strings(&rule["verbs"]),
                namespace: namespace.clone(),
            });
        }
    }
    (out, ns)
}

/// The requests a grant covers that `requests` never made: each (verb, resource) of the grant.
fn unused(grant: &Grant, requests: &BTreeSet<Request>, own: &str) -> Vec<String> {
    let mut out = Vec::new();
    for verb in &grant.verbs {
        for resource in &grant.resources {
            for group in &grant.groups {
                let used = requests.iter().any(|r| {
                    &r.verb == verb
                        && &r.resource == resource
                        && &r.group == group
                        && grant.allows(r, own)
                });
                if !used {
                    out.push(format!("{}: {verb} {group}/{resource}", grant.role));
                }
            }
        }
    }
    out
}

/// The shipped shapes: (what, rendered objects, the modes it runs, whether it grants the
/// optional publish-secrets rule).
fn shapes() -> Vec<(String, Vec<Value>, Vec<Mode>)> {
    let mut out = Vec::new();
    for (overlay, modes) in [
        ("sidecar", vec![Mode::Sidecar]),
        ("hub", vec![Mode::Hub]),
        ("daemonset", vec![Mode::Discovery]),
        ("controller-pool", vec![Mode::Discovery]),
    ] {
        let objects = documents(&kustomize(&repo().join("deploy/overlays").join(overlay)));
        out.push((format!("deploy/overlays/{overlay}"), objects, modes));
    }
    let helm = Cluster::get().bin("helm");
    for (values, modes) in [
        ("sidecar-values.yaml", vec![Mode::Sidecar]),
        ("hub-values.yaml", vec![Mode::Hub]),
        ("daemonset-values.yaml", vec![Mode::Discovery]),
        ("controller-pool-values.yaml", vec![Mode::Discovery]),
    ] {
        let chart = repo().join("deploy/helm/attacher-hub");
        for extra in [&[][..], &["--set", "rbac.publishSecrets=true"][..]] {
            let mut cmd = std::process::Command::new(&helm);
            cmd.args(["template", "attacher-hub"])
                .arg(&chart)
                .args(["--namespace", "attacher-hub", "-f"])
                .arg(chart.join("ci").join(values))
                .args(extra);
            let (ok, stdout, stderr) = support::run(cmd, None);
            assert!(ok, "helm template with {values}: {stderr}");
            out.push((
                format!("chart with ci/{values} {}", extra.join(" ")),
                documents(&stdout),
                modes.clone(),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shipped_rbac_grants_what_each_mode_asks_and_nothing_else() {
    let modes = [Mode::Sidecar, Mode::Hub, Mode::Discovery];
    let recorded: Vec<BTreeSet<Request>> =
        futures::future::join_all(modes.iter().map(|m| record(*m))).await;
    let by_mode: BTreeMap<Mode, BTreeSet<Request>> = modes.iter().copied().zip(recorded).collect();
    for (mode, requests) in &by_mode {
        eprintln!("{mode:?} mode asks for:");
        for r in requests {
            eprintln!("  {r}");
        }
        assert!(
            requests
                .iter()
                .any(|r| r.resource == "volumeattachments/status" && r.verb == "patch"),
            "{mode:?}: the audit log shows no attach: is the audit policy on?"
        );
    }
    // The publish secret is read only where a PV names one; the rule for it is opt-in.
    let optional = |r: &Request| r.resource == "secrets";
    let mut problems = Vec::new();
    for (what, objects, modes) in shapes() {
        let (grants, _ns) = grants(&objects);
        // The recordings ran in their own namespace: `Own` there is the workload's namespace here.
        let own = "own";
        let mut asked: BTreeSet<Request> = BTreeSet::new();
        for m in &modes {
            asked.extend(by_mode[m].iter().cloned());
        }
        let grants: Vec<Grant> = grants
            .into_iter()
            .map(|mut g| {
                if g.namespace.is_some() {
                    g.namespace = Some(own.into());
                }
                g
            })
            .collect();
        let secrets_granted = grants
            .iter()
            .any(|g| g.resources.iter().any(|r| r == "secrets"));
        for r in &asked {
            if optional(r) && !secrets_granted {
                continue;
            }
            if !grants.iter().any(|g| g.allows(r, own)) {
                problems.push(format!("{what}: does not grant {r}"));
            }
        }
        for g in &grants {
            problems.extend(
                unused(g, &asked, own)
                    .into_iter()
                    .map(|u| format!("{what}: grants {u}, never asked for")),
            );
        }
    }
    assert!(
        problems.is_empty(),
        "shipped RBAC and behaviour disagree:\n{}",
        problems.join("\n")
    );
}
