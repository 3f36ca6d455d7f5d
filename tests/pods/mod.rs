//! A pod runner for the tests: the shipped manifests run as a cluster runs them.
//!
//! Applied to the real API server, the rendered objects of a shipped path (overlay, component on
//! a vendor's manifests, Helm chart) become Deployments, DaemonSets and ReplicaSets that the
//! real kube-controller-manager turns into Pods. This runner plays the two parts of a cluster
//! that the test control plane lacks, for the Pods of one namespace:
//!
//! * the scheduler ([`scheduler`]): it binds each pending Pod to one of a few emulated nodes
//!   (Node objects it creates, each with a directory of its own as its file system for
//!   `hostPath` volumes);
//! * the kubelet ([`kubelet`]): it runs each bound Pod's containers as separate sandboxed
//!   processes ([`plan`]: bubblewrap and setpriv; [`netns`]: a network namespace per pod;
//!   [`volumes`]: the volumes and the ServiceAccount token; [`image`]: local builds for the
//!   images), probes them, writes the Pod's status and removes the Pod when it is deleted.
//!
//! What the containers do with the API server they do as their Pod's ServiceAccount, with the
//! token the TokenRequest API issued for the Pod, under the RBAC the manifests carry: nothing of
//! the tests' own identity reaches them. The runner needs root (network namespaces, user IDs)
//! and bubblewrap (`scripts/install-deps.sh` installs it).

#![allow(dead_code)]

mod image;
mod kubelet;
mod netns;
mod plan;
mod scheduler;
mod volumes;

// Used by the `deploy` binary (tests/deploy/defaults.rs), not by `measured`.
#[allow(unused_imports)]
pub(crate) use image::PD_NODE_PLUGIN_STAND_IN;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, Node as NodeObject, ObjectReference, Pod};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::support::Cluster;

/// An emulated node.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    /// The Node object's name (and the host name of `hostNetwork` pods).
    pub(crate) name: String,
    /// Its labels (`kubernetes.io/hostname` and `kubernetes.io/os` are added).
    pub(crate) labels: BTreeMap<String, String>,
    /// Its root directory: `hostPath: /x` is `<root>/x`.
    pub(crate) root: PathBuf,
    /// The node's network: `hostNetwork` pods run in it (two emulated nodes are one host, and
    /// two nodes' pods on one host port must not collide, as on real nodes they do not).
    pub(crate) net: Arc<NodeNet>,
}

/// A node's network namespace and the API server forwarder in it.
#[derive(Debug)]
pub(crate) struct NodeNet {
    pub(crate) netns: netns::Netns,
    forwarder: JoinHandle<()>,
}

impl Drop for NodeNet {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

/// What every pod task needs.
pub(crate) struct Shared {
    pub(crate) client: Client,
    /// The runner's directory: pods' volumes and roots, container logs.
    pub(crate) dir: PathBuf,
    /// The API server's address on the host's loopback.
    pub(crate) api: SocketAddr,
    /// The cluster's CA certificate (PEM), the pods' `ca.crt`.
    pub(crate) ca: Vec<u8>,
    pod_index: AtomicUsize,
    /// Network namespace of each running pod, by pod name.
    netns: Mutex<HashMap<String, PathBuf>>,
    /// The lock on `dir` (released when the runner's last task lets go of this).
    _lock: Arc<std::fs::File>,
}

/// The lock on the runner directory of `namespace` under `root`: taken from another process
/// (another test suite) by waiting for it, shared within this one (a test may start a runner
/// for a namespace before the last one's tasks are all gone).
async fn directory_lock(root: &std::path::Path, namespace: &str) -> Arc<std::fs::File> {
    static HELD: std::sync::Mutex<BTreeMap<String, std::sync::Weak<std::fs::File>>> =
        std::sync::Mutex::new(BTreeMap::new());
    if let Some(held) = HELD
        .lock()
        .expect("the runners' locks")
        .get(namespace)
        .and_then(std::sync::Weak::upgrade)
    {
        return held;
    }
    let path = root.join(format!("{namespace}.lock"));
    let file = tokio::task::spawn_blocking(move || {
        let file = std::fs::File::create(&path)?;
        file.lock()?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .expect("the runner's lock")
    .unwrap_or_else(|e| panic!("locking the runner directory of {namespace}: {e}"));
    let mut held = HELD.lock().expect("the runners' locks");
    // Another runner of this process may have taken it meanwhile: then it is ours already,
    // and this file (a second lock on it would wait for ourselves) is dropped.
    if let Some(other) = held.get(namespace).and_then(std::sync::Weak::upgrade) {
        return other;
    }
    let file = Arc::new(file);
    held.insert(namespace.to_string(), Arc::downgrade(&file));
    file
}

impl Shared {
    pub(crate) fn next_pod_index(&self) -> usize {
        self.pod_index.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn set_netns(&self, pod: &str, path: Option<PathBuf>) {
        let mut map = self.netns.lock().expect("netns map");
        match path {
            Some(p) => map.insert(pod.to_string(), p),
            None => map.remove(pod),
        };
    }
}

/// One pod the runner runs: the channel that tells its task what the API server shows.
struct Running {
    updates: watch::Sender<Option<Pod>>,
    task: JoinHandle<()>,
}

/// The scheduler and kubelet of the pods of one namespace on a few emulated nodes.
pub(crate) struct PodRunner {
    shared: Arc<Shared>,
    namespace: String,
    nodes: Vec<Node>,
    pods: Arc<Mutex<HashMap<String, Running>>>,
    /// One pod watch per namespace run here.
    watches: Vec<JoinHandle<()>>,
}

impl PodRunner {
    /// Creates the nodes (name and extra labels) and starts scheduling and running the pods of
    /// `namespace` on them.
    pub(crate) async fn start(namespace: &str, nodes: &[(&str, &[(&str, &str)])]) -> PodRunner {
        let uid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .map(str::to_string)
            })
            .unwrap_or_default();
        assert!(
            uid.split_whitespace().nth(2) == Some("0"),
            "the pod runner needs root (a network namespace per pod, the containers' own user \
             IDs): run the tests as root, as CI does"
        );
        for (tool, package) in [
            ("bwrap", "bubblewrap"),
            ("nsenter", "util-linux"),
            ("setpriv", "util-linux"),
            ("ip", "iproute2"),
        ] {
            crate::support::tool(
                tool,
                &format!("scripts/install-deps.sh installs it (Debian package {package})"),
            );
        }
        let cluster = Cluster::get();
        // The local builds behind the images, made before any pod starts (a build takes
        // minutes and must not hold up a runtime thread).
        tokio::task::spawn_blocking(|| {
            image::release_binary();
            crate::support::mock_csi_driver_bin();
        })
        .await
        .expect("building the images' programs");
        let client = cluster.client().await;
        let kubeconfig =
            kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("admin kubeconfig");
        let server = kubeconfig.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone())
            .expect("the API server's URL");
        let port: u16 = server
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .expect("the API server's port");
        let ca = std::fs::read(
            cluster
                .kubeconfig
                .parent()
                .expect("cluster directory")
                .join("pki/ca.crt"),
        )
        .expect("the cluster's CA");
        // Short, so that a socket a test serves in a node's directory stays within the 108
        // bytes of a Unix socket address: /tmp/ahp/<namespace>/n-<node>/... (the longest the
        // tests make has one byte to spare). Two test suites on one machine (two clones'
        // `make test`, each on a control plane of its own) run the same tests in the same
        // namespaces: the directory is theirs in turn, under a lock held as long as the runner.
        let root = std::env::temp_dir().join("ahp");
        std::fs::create_dir_all(&root).expect("the runners' directory");
        let dir = root.join(namespace);
        let lock = directory_lock(&root, namespace).await;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the runner's directory");
        let shared = Arc::new(Shared {
            client: client.clone(),
            dir: dir.clone(),
            api: SocketAddr::from(([127, 0, 0, 1], port)),
            ca,
            pod_index: AtomicUsize::new(0),
            netns: Mutex::new(HashMap::new()),
            _lock: lock,
        });
        let mut made = Vec::new();
        for (i, (name, labels)) in nodes.iter().enumerate() {
            let mut all: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            all.insert("kubernetes.io/hostname".into(), name.to_string());
            all.insert("kubernetes.io/os".into(), "linux".into());
            let netns = netns::Netns::create(&format!("ah-node-{}-{i}", std::process::id()))
                .expect("the node's network namespace");
            let forwarder = netns
                .forward(shared.api)
                .expect("the API server forwarder in the node's network");
            let node = Node {
                name: name.to_string(),
                labels: all,
                root: dir.join(format!("n-{name}")),
                net: Arc::new(NodeNet { netns, forwarder }),
            };
            std::fs::create_dir_all(&node.root).expect("the node's root");
            create_node(&client, &node).await;
            made.push(node);
        }
        let pods = Arc::new(Mutex::new(HashMap::new()));
        let watch = tokio::spawn(watch_pods(
            shared.clone(),
            namespace.to_string(),
            made.clone(),
            pods.clone(),
        ));
        PodRunner {
            shared,
            namespace: namespace.to_string(),
            nodes: made,
            pods,
            watches: vec![watch],
        }
    }

    /// Also schedules and runs the pods of `namespace` on the same nodes, for paths whose
    /// pods of two namespaces share a node's files (a vendor's controller exporting its
    /// socket to the controller pool's DaemonSet). Each namespace's pods are placed apart
    /// from the other's: anti-affinity and host ports count the pods of the same namespace.
    pub(crate) fn also_run(&mut self, namespace: &str) {
        self.watches.push(tokio::spawn(watch_pods(
            self.shared.clone(),
            namespace.to_string(),
            self.nodes.clone(),
            self.pods.clone(),
        )));
    }

    /// The emulated nodes.
    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The runner's directory (pods' files and container logs).
    pub(crate) fn dir(&self) -> &std::path::Path {
        &self.shared.dir
    }

    /// The pods of the namespace with `selector` (a label selector), as the API server has them.
    pub(crate) async fn pods(&self, selector: &str) -> Vec<Pod> {
        self.pods_in(&self.namespace, selector).await
    }

    /// The pods of `namespace` with `selector`, as the API server has them.
    pub(crate) async fn pods_in(&self, namespace: &str, selector: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), namespace);
        api.list(&ListParams::default().labels(selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// `GET path` on `port` of a running pod, from inside its network: status and body.
    pub(crate) async fn http_get(
        &self,
        pod: &str,
        port: u16,
        path: &str,
    ) -> std::io::Result<(u16, String)> {
        let netns = self
            .shared
            .netns
            .lock()
            .expect("netns map")
            .get(pod)
            .cloned();
        let stream = match netns {
            Some(ns) => netns::connect_in(&ns, port, Duration::from_secs(2)).await?,
            None => {
                return Err(std::io::Error::other(format!(
                    "pod {pod} does not run here"
                )));
            }
        };
        tokio::time::timeout(
            Duration::from_secs(5),
            crate::support::request_over(stream, pod, "GET", path),
        )
        .await
        .map_err(|_| std::io::Error::other("no answer within 5 s"))?
    }

    /// Everything `container` of `pod` printed (all its runs).
    pub(crate) fn logs(&self, pod: &str, container: &str) -> String {
        std::fs::read_to_string(
            self.shared
                .dir
                .join("logs")
                .join(format!("{pod}_{container}.log")),
        )
        .unwrap_or_default()
    }

    /// The last lines of every container log, for a failing test's message.
    pub(crate) fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        let Ok(entries) = std::fs::read_dir(self.shared.dir.join("logs")) else {
            return out;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(lines).collect();
            out.push_str(&format!("--- {}\n", path.display()));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Stops every container at once (no grace) and removes the nodes.
    pub(crate) async fn shutdown(self) {
        for w in &self.watches {
            w.abort();
        }
        let running: Vec<Running> = self
            .pods
            .lock()
            .expect("pods")
            .drain()
            .map(|(_, r)| r)
            .collect();
        for r in &running {
            let _ = r.updates.send(None);
        }
        for r in running {
            let _ = tokio::time::timeout(Duration::from_secs(10), r.task).await;
        }
        let nodes: Api<NodeObject> = Api::all(self.shared.client.clone());
        for n in &self.nodes {
            let _ = nodes.delete(&n.name, &DeleteParams::default()).await;
        }
    }
}

/// Creates `node` Ready, without the not-ready taint the API server puts on new nodes (the
/// node lifecycle controller that would lift it does not run here), managed by the
/// attach-detach controller.
async fn create_node(client: &Client, node: &Node) {
    let api: Api<NodeObject> = Api::all(client.clone());
    let _ = api.delete(&node.name, &DeleteParams::default()).await;
    let object = NodeObject {
        metadata: ObjectMeta {
            name: Some(node.name.clone()),
            labels: Some(node.labels.clone()),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                "true".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        ..NodeObject::default()
    };
    for _ in 0..50 {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let _ = api
        .patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await;
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    api.patch_status(
        &node.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "pod runner of the tests", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": node.name}],
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.37.2",
                "bootID": "", "containerRuntimeVersion": "bwrap://0.8", "kernelVersion": "", "kubeProxyVersion": "",
                "machineID": "", "osImage": "", "systemUUID": ""}
        }})),
    )
    .await
    .unwrap_or_else(|e| panic!("status of node {}: {e}", node.name));
}

/// Binds the pending `pod` to the node the scheduler picks and records it in `placed`; why not
/// when no node fits or the binding fails.
async fn bind(
    api: &Api<Pod>,
    namespace: &str,
    views: &[scheduler::NodeView],
    placed: &mut HashMap<String, scheduler::Placed>,
    pod: &Pod,
) -> Result<(), String> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let placed_now: Vec<scheduler::Placed> = placed.values().cloned().collect();
    let node = scheduler::pick(pod, views, &placed_now)?;
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.clone()),
            ..ObjectReference::default()
        },
    };
    api.create_subresource::<_, serde_json::Value>(
        "binding",
        &name,
        &PostParams::default(),
        &binding,
    )
    .await
    .map_err(|e| format!("binding {namespace}/{name}: {e}"))?;
    placed.insert(
        uid,
        scheduler::Placed {
            node,
            namespace: namespace.to_string(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            host_ports: scheduler::host_ports(pod),
        },
    );
    Ok(())
}

/// Watches the namespace's pods: binds the pending ones (again whenever a pod goes), runs the
/// bound ones, passes on changes.
async fn watch_pods(
    shared: Arc<Shared>,
    namespace: String,
    nodes: Vec<Node>,
    pods: Arc<Mutex<HashMap<String, Running>>>,
) {
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &namespace);
    let views: Vec<scheduler::NodeView> = nodes
        .iter()
        .map(|n| scheduler::NodeView {
            name: n.name.clone(),
            labels: n.labels.clone(),
        })
        .collect();
    let mut placed: HashMap<String, scheduler::Placed> = HashMap::new();
    // Pods no node could take yet, by UID.
    let mut pending: HashMap<String, Pod> = HashMap::new();
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let (pod, gone) = match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, false),
            watcher::Event::Delete(p) => (p, true),
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if gone {
            placed.remove(&uid);
            pending.remove(&uid);
            if let Some(r) = pods.lock().expect("pods").remove(&uid) {
                let _ = r.updates.send(None);
            }
            // A pod gone may leave room for one that waits (a surge pod of a rolling update
            // kept off a node by a required anti-affinity): the scheduler tries again, as
            // kube-scheduler does when the cluster changes.
            let waiting: Vec<(String, Pod)> = pending.drain().collect();
            for (uid, pod) in waiting {
                if bind(&api, &namespace, &views, &mut placed, &pod)
                    .await
                    .is_err()
                {
                    pending.insert(uid, pod);
                }
            }
            continue;
        }
        match node_name {
            None if pod.metadata.deletion_timestamp.is_none() => {
                if let Err(why) = bind(&api, &namespace, &views, &mut placed, &pod).await {
                    eprintln!("pod runner: {why}");
                    pending.insert(uid, pod);
                } else {
                    pending.remove(&uid);
                }
            }
            None => {}
            Some(node_name) => {
                placed.insert(
                    uid.clone(),
                    scheduler::Placed {
                        node: node_name.clone(),
                        namespace: namespace.clone(),
                        labels: pod.metadata.labels.clone().unwrap_or_default(),
                        host_ports: scheduler::host_ports(&pod),
                    },
                );
                let Some(node) = nodes.iter().find(|n| n.name == node_name) else {
                    continue;
                };
                let mut map = pods.lock().expect("pods");
                match map.get(&uid) {
                    Some(r) => {
                        let _ = r.updates.send(Some(pod));
                    }
                    None => {
                        let (tx, rx) = watch::channel(Some(pod));
                        let task = tokio::spawn(kubelet::run_pod(shared.clone(), node.clone(), rx));
                        map.insert(uid, Running { updates: tx, task });
                    }
                }
            }
        }
    }
}
