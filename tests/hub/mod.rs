//! Helpers for the hub-mode integration tests: the `attacher-hub` process in
//! hub or discovery mode, its HTTP views, driver files (plain or laid out as a
//! ConfigMap mount), in-process Rust mock drivers, bulk PV/VA creation and a
//! watch that timestamps when each VolumeAttachment becomes attached.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(crate) use crate::support::http_get;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use mock_csi_driver::{CallRecord, MockDriver, MockHandle};
use serde_json::Value;
use tokio::process::Command;

use crate::support::{ChildProcess, Cluster, OnWatchError, PvBuilder, create_node, va, watch_vas};

/// Label put on every VolumeAttachment a test creates, so one watch sees
/// exactly that test's objects.
pub(crate) const RUN_LABEL: &str = "attacher-hub-test/run";

/// How many API requests a test keeps in flight when creating objects in bulk.
const CONCURRENCY: usize = 16;

/// A TCP port free at the time of the call.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("local address")
        .port()
}

/// Milliseconds since the Unix epoch (comparable with the mock's call records).
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How to start one hub process.
#[derive(Clone, Debug, Default)]
pub(crate) struct HubOptions {
    /// `--config <path>`.
    pub(crate) config: Option<PathBuf>,
    /// `--driver-sockets <glob>`.
    pub(crate) driver_sockets: Option<String>,
    /// Leader election in this namespace (lease 4s, renew 3s, retry 1s).
    pub(crate) leader_election_namespace: Option<String>,
    /// Run under this host name (a UTS namespace of its own), which becomes
    /// the replica identity.
    pub(crate) hostname: Option<String>,
    /// Further flags, appended last.
    pub(crate) extra_args: Vec<String>,
}

/// A running `attacher-hub` with its HTTP listener.
#[derive(Debug)]
pub(crate) struct Hub {
    /// The process (killed on drop; logs shown if the test fails).
    pub(crate) process: ChildProcess,
    /// Port of `--http-endpoint`.
    pub(crate) port: u16,
    /// Host name it runs under, if set.
    pub(crate) hostname: Option<String>,
}

impl Hub {
    /// Starts the hub and waits until its HTTP listener answers.
    pub(crate) async fn start(cluster: &Cluster, label: &str, opts: HubOptions) -> Hub {
        let port = free_port();
        let mut args = vec![
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--kube-api-qps=200".to_string(),
            "--kube-api-burst=400".to_string(),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "--timeout=5s".to_string(),
            "-v=2".to_string(),
        ];
        if let Some(config) = &opts.config {
            args.push(format!("--config={}", config.display()));
        }
        if let Some(glob) = &opts.driver_sockets {
            args.push(format!("--driver-sockets={glob}"));
        }
        if let Some(ns) = &opts.leader_election_namespace {
            args.extend([
                "--leader-election".to_string(),
                format!("--leader-election-namespace={ns}"),
                "--leader-election-lease-duration=4s".to_string(),
                "--leader-election-renew-deadline=3s".to_string(),
                "--leader-election-retry-period=1s".to_string(),
            ]);
        }
        args.extend(opts.extra_args.iter().cloned());
        let bin = env!("CARGO_BIN_EXE_attacher-hub");
        let cmd = match &opts.hostname {
            None => {
                let mut cmd = Command::new(bin);
                cmd.args(&args);
                cmd
            }
            Some(host) => {
                // unshare(1) and sh both exec, so the PID is the hub's own.
                let mut cmd = Command::new("unshare");
                cmd.args([
                    "--uts",
                    "sh",
                    "-c",
                    "hostname \"$0\" && exec \"$@\"",
                    host,
                    bin,
                ])
                .args(&args);
                cmd
            }
        };
        let mut process = ChildProcess::spawn(label, cmd);
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = http_get(port, "/healthz").await {
                break;
            }
            if let Some(status) = process.exited() {
                process.dump_logs();
                panic!("{label} exited ({status}) before serving HTTP");
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{label} did not serve HTTP on port {port} within 30s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Hub {
            process,
            port,
            hostname: opts.hostname.clone(),
        }
    }

    /// The process ID.
    pub(crate) fn pid(&self) -> u32 {
        self.process.id().expect("the hub is running")
    }

    /// `GET path`.
    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port, path)
            .await
            .unwrap_or_else(|e| panic!("GET {path} from the hub: {e}"))
    }

    /// Waits until `/readyz` answers 200 (the caches are synced and every
    /// driver is ready) and returns its body.
    pub(crate) async fn wait_ready(&self, what: &str, timeout: Duration) -> String {
        let started = Instant::now();
        loop {
            let (code, body) = self.get("/readyz").await;
            if code == 200 {
                return body;
            }
            assert!(
                started.elapsed() < timeout,
                "{what}: /readyz still {code} after {timeout:?}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `/drivers` document.
    pub(crate) async fn drivers(&self) -> Vec<Value> {
        let (status, body) = self.get("/drivers").await;
        assert_eq!(status, 200, "/drivers answered {status}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/drivers is not JSON ({e}): {body}"))
    }

    /// The `/drivers` entry of the driver named `name`, if any.
    pub(crate) async fn driver(&self, name: &str) -> Option<Value> {
        self.drivers()
            .await
            .into_iter()
            .find(|d| d["name"].as_str() == Some(name))
    }

    /// Polls `/drivers` until `pred` holds; returns the document.
    pub(crate) async fn wait_drivers(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let drivers = self.drivers().await;
            if pred(&drivers) {
                return drivers;
            }
            if let Some(status) = self.process.exited() {
                panic!("the hub exited ({status}) while waiting for {what}");
            }
            if start.elapsed() > timeout {
                panic!(
                    "/drivers did not show {what} within {timeout:?}; last: {}",
                    serde_json::to_string_pretty(&drivers).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until driver `name` is in state `state`; returns its entry.
    pub(crate) async fn wait_state(&mut self, name: &str, state: &str, timeout: Duration) -> Value {
        let drivers = self
            .wait_drivers(&format!("{name} {state}"), timeout, |ds| {
                ds.iter().any(|d| d["name"] == name && state_of(d) == state)
            })
            .await;
        drivers.into_iter().find(|d| d["name"] == name).unwrap()
    }

    /// Sends a signal (`"KILL"`, `"HUP"`, ...) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Lines of the log (stderr and stdout) containing `needle`.
    pub(crate) fn log_lines(&self, needle: &str) -> Vec<String> {
        let mut text = self.process.stderr();
        text.push_str(&self.process.stdout());
        text.lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Waits until at least `n` log lines contain `needle`.
    pub(crate) async fn wait_log(&mut self, needle: &str, n: usize, timeout: Duration) {
        self.process
            .wait_for_output(needle, n, timeout)
            .await
            .unwrap_or_else(|e| panic!("hub log: {e}"));
    }
}

/// The `state.state` of a `/drivers` entry.
pub(crate) fn state_of(d: &Value) -> &str {
    d["state"]["state"].as_str().unwrap_or("")
}

/// A Rust mock driver served in this test process on a socket of its own.
pub(crate) struct RustMock {
    /// Driver name.
    pub(crate) name: String,
    /// The running mock.
    pub(crate) handle: MockHandle,
    /// Socket path.
    pub(crate) socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl RustMock {
    /// Serves `name` with `volumes` pre-created volumes (`vol-0` …).
    pub(crate) async fn start(name: &str, volumes: usize) -> RustMock {
        Self::start_with(name, volumes, mock_csi_driver::Capabilities::default()).await
    }

    /// As [`RustMock::start`], advertising `capabilities`.
    pub(crate) async fn start_with(
        name: &str,
        volumes: usize,
        capabilities: mock_csi_driver::Capabilities,
    ) -> RustMock {
        let dir = tempfile::Builder::new()
            .prefix("ah-hub-")
            .tempdir()
            .expect("temp dir");
        let socket = dir.path().join("csi.sock");
        let handle = MockDriver::new(name)
            .volumes(volumes)
            .capabilities(capabilities)
            .serve(&socket)
            .await
            .unwrap_or_else(|e| panic!("serving mock {name}: {e}"));
        RustMock {
            name: name.to_string(),
            handle,
            socket,
            _dir: dir,
        }
    }

    /// Calls of `method` so far.
    pub(crate) fn calls(&self, method: &str) -> Vec<CallRecord> {
        self.handle
            .calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect()
    }

    /// Successful ControllerPublishVolume calls per (volume, node).
    pub(crate) fn ok_publishes(&self) -> BTreeMap<(String, String), Vec<u64>> {
        let mut out: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        for c in self.calls("ControllerPublishVolume") {
            if c.grpc_code() == Some(tonic::Code::Ok) {
                out.entry((c.volume_id.clone(), c.node_id.clone()))
                    .or_default()
                    .push(c.time_unix_ms);
            }
        }
        out
    }
}

/// A `drivers.yaml` entry.
pub(crate) fn driver_entry(socket: &Path, name: &str) -> String {
    format!(
        "  - address: unix://{}\n    name: {name}\n",
        socket.display()
    )
}

/// A driver file listing `entries`.
pub(crate) fn drivers_yaml(entries: &[String]) -> String {
    format!("drivers:\n{}", entries.concat())
}

/// A directory laid out like a ConfigMap volume: `drivers.yaml ->
/// ..data/drivers.yaml`, `..data -> ..<timestamp>`; updates swap `..data`
/// atomically as the kubelet does.
pub(crate) struct ConfigMapDir {
    dir: tempfile::TempDir,
    generation: u32,
}

impl ConfigMapDir {
    /// A mount holding `content` as `drivers.yaml`.
    pub(crate) fn new(content: &str) -> ConfigMapDir {
        let dir = tempfile::Builder::new()
            .prefix("ah-cm-")
            .tempdir()
            .expect("temp dir");
        let mut cm = ConfigMapDir { dir, generation: 0 };
        cm.swap(content);
        std::os::unix::fs::symlink("..data/drivers.yaml", cm.dir.path().join("drivers.yaml"))
            .expect("drivers.yaml link");
        cm
    }

    /// The path the hub is given.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("drivers.yaml")
    }

    /// Publishes new content: a new timestamped directory, then an atomic
    /// rename of a fresh `..data` link over the old one; the old directory is
    /// removed afterwards.
    pub(crate) fn swap(&mut self, content: &str) {
        let root = self.dir.path();
        let old = std::fs::read_link(root.join("..data")).ok();
        self.generation += 1;
        let ts = format!(
            "..2026_01_01_00_00_{:02}.{}",
            self.generation,
            std::process::id()
        );
        std::fs::create_dir(root.join(&ts)).expect("timestamped dir");
        std::fs::write(root.join(&ts).join("drivers.yaml"), content).expect("write drivers.yaml");
        let tmp = root.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&ts, &tmp).expect("..data_tmp link");
        std::fs::rename(&tmp, root.join("..data")).expect("swap ..data");
        if let Some(old) = old {
            let _ = std::fs::remove_dir_all(root.join(old));
        }
    }
}

/// Creates a Namespace (for Leases of one test).
pub(crate) async fn create_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    api.create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

/// Creates `node` and its CSINode with one entry per `(driver, node ID)`.
pub(crate) async fn create_node_with_drivers(
    client: &Client,
    node: &str,
    drivers: &[(String, String)],
) {
    create_node(client, node).await;
    let api: Api<CSINode> = Api::all(client.clone());
    let csinode = CSINode {
        status: None,
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|(name, id)| CSINodeDriver {
                    name: name.clone(),
                    node_id: id.clone(),
                    ..CSINodeDriver::default()
                })
                .collect(),
        },
    };
    api.create(&PostParams::default(), &csinode)
        .await
        .unwrap_or_else(|e| panic!("creating CSINode {node}: {e}"));
}

/// One VolumeAttachment to create: its name, driver, node, PV and volume.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    pub(crate) va: String,
    pub(crate) driver: String,
    pub(crate) node: String,
    pub(crate) pv: String,
    pub(crate) volume: String,
}

impl Planned {
    /// A PV `<va>-pv` for `volume` and a VA for it on `node`.
    pub(crate) fn new(va_name: &str, driver: &str, node: &str, volume: &str) -> Planned {
        Planned {
            va: va_name.to_string(),
            driver: driver.to_string(),
            node: node.to_string(),
            pv: format!("{va_name}-pv"),
            volume: volume.to_string(),
        }
    }
}

/// Creates the PV of `p`.
pub(crate) async fn create_pv(client: &Client, p: &Planned) {
    PvBuilder::new(&p.pv, &p.driver, &p.volume)
        .create(client)
        .await;
}

/// Creates the VA of `p`, labelled with `run`.
pub(crate) async fn create_labelled_va(client: &Client, p: &Planned, run: &str) {
    let mut obj = va(&p.va, &p.driver, &p.node, &p.pv);
    obj.metadata.labels = Some(BTreeMap::from([(RUN_LABEL.to_string(), run.to_string())]));
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating VA {}: {e}", p.va));
}

/// Creates the PVs, then the VAs, of `plan`, many at a time.
pub(crate) async fn create_all(client: &Client, plan: &[Planned], run: &str) {
    futures::stream::iter(plan)
        .for_each_concurrent(CONCURRENCY, |p| create_pv(client, p))
        .await;
    futures::stream::iter(plan)
        .for_each_concurrent(CONCURRENCY, |p| create_labelled_va(client, p, run))
        .await;
}

/// Deletes every named object of kind `K`, many at a time (missing ones are fine).
pub(crate) async fn delete_all<K>(api: &Api<K>, names: &[String])
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    futures::stream::iter(names)
        .for_each_concurrent(CONCURRENCY, |n| async move {
            match api.delete(n, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => panic!("deleting {n}: {e}"),
            }
        })
        .await;
}

/// When each VolumeAttachment of one run was first seen attached, through one
/// label-selected watch.
#[derive(Clone)]
pub(crate) struct AttachWatch {
    seen: Arc<Mutex<HashMap<String, (Instant, u64)>>>,
    present: Arc<Mutex<HashMap<String, bool>>>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl AttachWatch {
    /// Starts watching VAs labelled `run`; returns once the initial list is in.
    pub(crate) async fn start(client: &Client, run: &str) -> AttachWatch {
        let seen: Arc<Mutex<HashMap<String, (Instant, u64)>>> = Arc::default();
        let present: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
        let (s, p) = (seen.clone(), present.clone());
        let on_error = OnWatchError {
            log: Some("attach watch error (retrying)"),
            pause: Duration::from_millis(200),
        };
        let labels = format!("{RUN_LABEL}={run}");
        let task = watch_vas(
            client,
            &labels,
            "attach watch",
            Duration::from_secs(30),
            on_error,
            move |event| match event {
                watcher::Event::Apply(va) | watcher::Event::InitApply(va) => {
                    let name = va.metadata.name.clone().unwrap_or_default();
                    let attached = va.status.as_ref().is_some_and(|s| s.attached);
                    if attached {
                        s.lock()
                            .unwrap()
                            .entry(name.clone())
                            .or_insert((Instant::now(), unix_ms()));
                    }
                    p.lock().unwrap().insert(name, attached);
                }
                watcher::Event::Delete(va) => {
                    let name = va.metadata.name.clone().unwrap_or_default();
                    p.lock().unwrap().remove(&name);
                }
                watcher::Event::Init | watcher::Event::InitDone => {}
            },
        )
        .await;
        AttachWatch {
            seen,
            present,
            task: Arc::new(task),
        }
    }

    /// When `va` was first seen attached: monotonic instant and Unix ms.
    pub(crate) fn attached(&self, va: &str) -> Option<(Instant, u64)> {
        self.seen.lock().unwrap().get(va).copied()
    }

    /// Waits until every VA in `names` has been seen attached.
    pub(crate) async fn wait_attached(
        &self,
        names: &[String],
        timeout: Duration,
    ) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let missing: Vec<String> = {
                let seen = self.seen.lock().unwrap();
                names
                    .iter()
                    .filter(|n| !seen.contains_key(*n))
                    .cloned()
                    .collect()
            };
            if missing.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "{} of {} VAs not attached within {timeout:?}, e.g. {:?}",
                    missing.len(),
                    names.len(),
                    &missing[..missing.len().min(5)]
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until no VA in `names` exists any more.
    pub(crate) async fn wait_gone(
        &self,
        names: &[String],
        timeout: Duration,
    ) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let left: Vec<String> = {
                let present = self.present.lock().unwrap();
                names
                    .iter()
                    .filter(|n| present.contains_key(*n))
                    .cloned()
                    .collect()
            };
            if left.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "{} of {} VAs still exist after {timeout:?}, e.g. {:?}",
                    left.len(),
                    names.len(),
                    &left[..left.len().min(5)]
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for AttachWatch {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

/// The `q`-quantile (0..=1) of `samples` (nearest rank); panics when empty.
pub(crate) fn quantile(samples: &[Duration], q: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples");
    let mut v = samples.to_vec();
    v.sort();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Waits until every PV in `names` is gone.
pub(crate) async fn wait_pvs_gone(client: &Client, names: &[String], timeout: Duration) {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    let start = Instant::now();
    loop {
        let mut left = Vec::new();
        for n in names {
            if api.get_opt(n).await.expect("get PV").is_some() {
                left.push(n.clone());
            }
        }
        if left.is_empty() {
            return;
        }
        if start.elapsed() > timeout {
            let example = api.get_opt(&left[0]).await.ok().flatten();
            panic!(
                "{} PVs not deleted within {timeout:?}; e.g. {:?} finalizers {:?}",
                left.len(),
                left[0],
                example.and_then(|p| p.metadata.finalizers)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
