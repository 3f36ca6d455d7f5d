//! One scenario's world: mock CSI drivers (in-process or as processes, each
//! recording calls and attachments), a node per driver set with its CSINode,
//! a namespace for Leases, a Secret whose value must never leak, PVs and VAs
//! labelled with the scenario's run, a ledger of when each VA was attached
//! and gone, and the invariants every scenario checks at its end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use mock_csi_driver::control::Client as Control;
use mock_csi_driver::fault::Fault;
use mock_csi_driver::{CallRecord, MockDriver, MockHandle};
use tokio::process::Command;

use super::fhub::{FHub, metric_sum};
use crate::hub::{RUN_LABEL, create_namespace, create_node_with_drivers, unix_ms};
use crate::support::{
    ChildProcess, Cluster, OnWatchError, PvBuilder, attacher_finalizer, unique_name, watch_vas,
};

/// How many API requests are kept in flight when creating or deleting in bulk.
const CONCURRENCY: usize = 16;

/// Where a mock driver runs.
enum Runner {
    /// In the test process (survives hub faults; cannot crash for real).
    InProcess(MockHandle),
    /// The `mock-csi-driver` binary (can crash and restart).
    Process(Box<ChildProcess>),
    /// The process is gone (crashed or killed).
    Dead,
}

/// A mock CSI driver on a socket of its own. Calls, attachments and faults go
/// through its control socket, whichever way it runs.
pub(crate) struct Mock {
    /// Driver name.
    pub(crate) name: String,
    /// Socket path.
    pub(crate) socket: PathBuf,
    /// Volumes pre-created (`vol-0` …).
    volumes: usize,
    runner: Runner,
    _dir: tempfile::TempDir,
}

impl Mock {
    fn dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("ahf-mock-")
            .tempdir()
            .expect("temp dir")
    }

    /// An in-process mock with `volumes` volumes.
    pub(crate) async fn in_process(name: &str, volumes: usize) -> Mock {
        let dir = Mock::dir();
        let socket = dir.path().join("csi.sock");
        let handle = MockDriver::new(name)
            .volumes(volumes)
            .serve(&socket)
            .await
            .unwrap_or_else(|e| panic!("serving mock {name}: {e}"));
        Mock {
            name: name.to_string(),
            socket,
            volumes,
            runner: Runner::InProcess(handle),
            _dir: dir,
        }
    }

    /// The `mock-csi-driver` binary with `volumes` volumes and `extra` flags.
    pub(crate) async fn process(name: &str, volumes: usize, extra: &[&str]) -> Mock {
        let dir = Mock::dir();
        let socket = dir.path().join("csi.sock");
        let mut mock = Mock {
            name: name.to_string(),
            socket,
            volumes,
            runner: Runner::Dead,
            _dir: dir,
        };
        mock.start_process(extra).await;
        mock
    }

    /// Starts the binary (again) on the same socket.
    pub(crate) async fn start_process(&mut self, extra: &[&str]) {
        let mut cmd = Command::new(crate::support::mock_csi_driver_bin());
        cmd.arg(format!("--endpoint={}", self.socket.display()))
            .arg(format!("--name={}", self.name))
            .arg(format!("--volumes={}", self.volumes))
            .args(extra);
        let mut p = ChildProcess::spawn("mock-csi-driver", cmd);
        p.wait_for_output("ready\n", 1, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("mock {}: {e}", self.name));
        self.runner = Runner::Process(Box::new(p));
    }

    /// The process's exit status once it has exited (`None` while it runs or
    /// for an in-process mock).
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        match &mut self.runner {
            Runner::Process(p) => p.exited(),
            _ => None,
        }
    }

    /// Marks a crashed process as gone (keeps its logs if the test fails).
    pub(crate) fn forget_process(&mut self) {
        self.runner = Runner::Dead;
    }

    /// Kills the process (SIGKILL) and forgets it.
    pub(crate) async fn kill(&mut self) {
        if let Runner::Process(p) = &mut self.runner
            && let Some(pid) = p.id()
        {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            for _ in 0..100 {
                if p.exited().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.runner = Runner::Dead;
    }

    async fn control(&self) -> Control {
        Control::for_endpoint(&self.socket)
            .await
            .unwrap_or_else(|e| panic!("control socket of mock {}: {e}", self.name))
    }

    /// Every call so far, oldest first.
    pub(crate) async fn calls(&self) -> Vec<CallRecord> {
        self.control()
            .await
            .calls()
            .await
            .unwrap_or_else(|e| panic!("calls of mock {}: {e}", self.name))
    }

    /// `(volume, node)` pairs the driver holds as published.
    pub(crate) async fn attachments(&self) -> BTreeSet<(String, String)> {
        self.control()
            .await
            .state()
            .await
            .unwrap_or_else(|e| panic!("state of mock {}: {e}", self.name))
            .attachments()
            .into_iter()
            .collect()
    }

    /// Sets the fault of `method` (`*` for all), e.g. `"delay:5s"`, `"hang"`.
    pub(crate) async fn set_fault(&self, method: &str, fault: &str) {
        let fault: Fault = fault
            .parse()
            .unwrap_or_else(|e| panic!("fault {fault:?}: {e}"));
        self.control()
            .await
            .set_fault(method, fault)
            .await
            .unwrap_or_else(|e| panic!("set fault on mock {}: {e}", self.name));
    }

    /// Clears every fault.
    pub(crate) async fn clear_faults(&self) {
        self.control()
            .await
            .clear_faults()
            .await
            .unwrap_or_else(|e| panic!("clear faults on mock {}: {e}", self.name));
    }

    /// A `drivers.yaml` entry for this mock.
    pub(crate) fn entry(&self) -> String {
        format!(
            "  - address: unix://{}\n    name: {}\n",
            self.socket.display(),
            self.name
        )
    }
}

/// What the ledger knows of one VA.
#[derive(Clone, Debug, Default)]
pub(crate) struct VaLife {
    /// Unix ms when first seen attached.
    pub(crate) attached_ms: Option<u64>,
    /// Monotonic instant when first seen attached.
    pub(crate) attached_at: Option<Instant>,
    /// Unix ms when seen gone.
    pub(crate) gone_ms: Option<u64>,
    /// Monotonic instant when seen gone.
    pub(crate) gone_at: Option<Instant>,
    /// Present now.
    pub(crate) present: bool,
    /// `status.attached` now.
    pub(crate) attached_now: bool,
}

/// When each VA of one run was attached and gone, through one label-selected watch.
#[derive(Clone)]
pub(crate) struct Ledger {
    lives: Arc<Mutex<HashMap<String, VaLife>>>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl Ledger {
    async fn start(client: &Client, run: &str) -> Ledger {
        let lives: Arc<Mutex<HashMap<String, VaLife>>> = Arc::default();
        let l = lives.clone();
        let mut listed: BTreeSet<String> = BTreeSet::new();
        // The API server may be down on purpose: retry, quietly.
        let on_error = OnWatchError {
            log: None,
            pause: Duration::from_millis(200),
        };
        let labels = format!("{RUN_LABEL}={run}");
        let task = watch_vas(
            client,
            &labels,
            "VA ledger",
            Duration::from_secs(30),
            on_error,
            move |event| {
                let now = (Instant::now(), unix_ms());
                let mut lives = l.lock().unwrap();
                let seen = |va: &VolumeAttachment, lives: &mut HashMap<String, VaLife>| {
                    let name = va.metadata.name.clone().unwrap_or_default();
                    let attached = va.status.as_ref().is_some_and(|s| s.attached);
                    let life = lives.entry(name).or_default();
                    life.present = true;
                    life.attached_now = attached;
                    if attached && life.attached_at.is_none() {
                        life.attached_at = Some(now.0);
                        life.attached_ms = Some(now.1);
                    }
                };
                match event {
                    watcher::Event::Apply(va) => seen(&va, &mut lives),
                    watcher::Event::Delete(va) => {
                        let name = va.metadata.name.clone().unwrap_or_default();
                        let life = lives.entry(name).or_default();
                        life.present = false;
                        life.gone_at.get_or_insert(now.0);
                        life.gone_ms.get_or_insert(now.1);
                    }
                    watcher::Event::Init => listed.clear(),
                    watcher::Event::InitApply(va) => {
                        listed.insert(va.metadata.name.clone().unwrap_or_default());
                        seen(&va, &mut lives);
                    }
                    watcher::Event::InitDone => {
                        // A re-list: whatever is not listed is gone.
                        for (name, life) in lives.iter_mut() {
                            if life.present && !listed.contains(name) {
                                life.present = false;
                                life.gone_at.get_or_insert(now.0);
                                life.gone_ms.get_or_insert(now.1);
                            }
                        }
                    }
                }
            },
        )
        .await;
        Ledger {
            lives,
            task: Arc::new(task),
        }
    }

    /// What is known of `va`.
    pub(crate) fn life(&self, va: &str) -> VaLife {
        self.lives
            .lock()
            .unwrap()
            .get(va)
            .cloned()
            .unwrap_or_default()
    }

    /// Names among `names` not yet seen attached / still present.
    fn missing(&self, names: &[String], gone: bool) -> Vec<String> {
        let lives = self.lives.lock().unwrap();
        names
            .iter()
            .filter(|n| {
                let l = lives.get(*n);
                if gone {
                    l.is_some_and(|l| l.present)
                } else {
                    l.is_none_or(|l| l.attached_at.is_none())
                }
            })
            .cloned()
            .collect()
    }

    /// Waits until every VA in `names` has been seen attached.
    pub(crate) async fn wait_attached(
        &self,
        names: &[String],
        bound: Duration,
    ) -> Result<Duration, String> {
        self.wait(names, false, bound).await
    }

    /// Waits until no VA in `names` exists.
    pub(crate) async fn wait_gone(
        &self,
        names: &[String],
        bound: Duration,
    ) -> Result<Duration, String> {
        self.wait(names, true, bound).await
    }

    async fn wait(
        &self,
        names: &[String],
        gone: bool,
        bound: Duration,
    ) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            let missing = self.missing(names, gone);
            if missing.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > bound {
                return Err(format!(
                    "{} of {} VAs {} within {bound:?}, e.g. {:?}",
                    missing.len(),
                    names.len(),
                    if gone { "still exist" } else { "not attached" },
                    &missing[..missing.len().min(4)]
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

/// A scenario's world.
pub(crate) struct World {
    /// Admin client, straight to the API server.
    pub(crate) client: Client,
    /// Label value of this run's VAs.
    pub(crate) run: String,
    /// Namespace of the Leases (and of the Secret).
    pub(crate) namespace: String,
    /// The drivers.
    pub(crate) mocks: Vec<Mock>,
    /// Node name per driver set (one node serving every driver).
    pub(crate) node: String,
    /// The Secret's value, which must never leak.
    pub(crate) secret_value: String,
    /// Name of the Secret.
    secret_name: String,
    /// VA name → (driver index, volume ID, PV name).
    vas: Mutex<BTreeMap<String, (usize, String, String)>>,
    /// VAs deleted on purpose.
    deleted: Mutex<BTreeSet<String>>,
    /// Next free volume per driver.
    next_volume: Mutex<Vec<usize>>,
    /// When each VA was attached and gone.
    pub(crate) ledger: Ledger,
    /// `drivers.yaml` of the hub (plain file).
    pub(crate) config: PathBuf,
    _config_dir: tempfile::TempDir,
}

impl World {
    /// A world with these mocks (already started), one node carrying every
    /// driver, a Lease namespace, a Secret, and a `drivers.yaml` listing all.
    pub(crate) async fn new(cluster: &Cluster, tag: &str, mocks: Vec<Mock>) -> World {
        let client = cluster.client().await;
        let run = unique_name(tag);
        let namespace = unique_name(&format!("{tag}-ns"));
        create_namespace(&client, &namespace).await;
        let node = unique_name(&format!("{tag}-node"));
        let entries: Vec<(String, String)> = mocks
            .iter()
            .map(|m| (m.name.clone(), format!("{node}-id")))
            .collect();
        create_node_with_drivers(&client, &node, &entries).await;
        let secret_name = "publish-secret".to_string();
        let secret_value = format!("s3cr3t-{}", unique_name("v"));
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        secrets
            .create(
                &PostParams::default(),
                &Secret {
                    metadata: ObjectMeta {
                        name: Some(secret_name.clone()),
                        ..ObjectMeta::default()
                    },
                    string_data: Some(BTreeMap::from([
                        ("password".to_string(), secret_value.clone()),
                        ("token".to_string(), format!("{secret_value}-token")),
                    ])),
                    ..Secret::default()
                },
            )
            .await
            .expect("create the publish Secret");
        let ledger = Ledger::start(&client, &run).await;
        let dir = tempfile::Builder::new()
            .prefix("ahf-cfg-")
            .tempdir()
            .expect("temp dir");
        let config = dir.path().join("drivers.yaml");
        let entries: String = mocks.iter().map(Mock::entry).collect();
        std::fs::write(&config, format!("drivers:\n{entries}")).expect("write drivers.yaml");
        let n = mocks.len();
        World {
            client,
            run,
            namespace,
            mocks,
            node,
            secret_value,
            secret_name,
            vas: Mutex::default(),
            deleted: Mutex::default(),
            next_volume: Mutex::new(vec![0; n]),
            ledger,
            config,
            _config_dir: dir,
        }
    }

    /// Driver names.
    pub(crate) fn driver_names(&self) -> Vec<String> {
        self.mocks.iter().map(|m| m.name.clone()).collect()
    }

    /// Rewrites `drivers.yaml` with the mocks at `indices`.
    pub(crate) fn write_config(&self, indices: &[usize]) {
        let entries: String = indices.iter().map(|i| self.mocks[*i].entry()).collect();
        std::fs::write(&self.config, format!("drivers:\n{entries}")).expect("write drivers.yaml");
    }

    /// Creates `n` PVs and VAs spread over the drivers (round robin), each on
    /// its own volume; returns the VA names.
    pub(crate) async fn create_vas(&self, n: usize, tag: &str) -> Vec<String> {
        let drivers: Vec<usize> = (0..self.mocks.len()).collect();
        self.create_vas_on(n, tag, &drivers).await
    }

    /// [`World::create_vas`] on the drivers at `drivers` only.
    pub(crate) async fn create_vas_on(
        &self,
        n: usize,
        tag: &str,
        drivers: &[usize],
    ) -> Vec<String> {
        let mut planned = Vec::new();
        {
            let mut next = self.next_volume.lock().unwrap();
            for i in 0..n {
                let d = drivers[i % drivers.len()];
                let vol = next[d];
                next[d] += 1;
                assert!(
                    vol < self.mocks[d].volumes,
                    "mock {} has only {} volumes",
                    self.mocks[d].name,
                    self.mocks[d].volumes
                );
                let va = unique_name(tag);
                let pv = format!("{va}-pv");
                planned.push((va, d, format!("vol-{vol}"), pv));
            }
        }
        let client = &self.client;
        futures::stream::iter(&planned)
            .for_each_concurrent(CONCURRENCY, |(_, d, vol, pv)| async move {
                PvBuilder::new(pv, &self.mocks[*d].name, vol)
                    .controller_publish_secret(&self.secret_name, &self.namespace)
                    .create(client)
                    .await;
            })
            .await;
        {
            let mut vas = self.vas.lock().unwrap();
            for (va, d, vol, pv) in &planned {
                vas.insert(va.clone(), (*d, vol.clone(), pv.clone()));
            }
        }
        let api: Api<VolumeAttachment> = Api::all(client.clone());
        futures::stream::iter(&planned)
            .for_each_concurrent(CONCURRENCY, |(va, d, _, pv)| {
                let api = api.clone();
                async move {
                    let mut obj = crate::support::va(va, &self.mocks[*d].name, &self.node, pv);
                    obj.metadata.labels =
                        Some(BTreeMap::from([(RUN_LABEL.to_string(), self.run.clone())]));
                    api.create(&PostParams::default(), &obj)
                        .await
                        .unwrap_or_else(|e| panic!("creating VA {va}: {e}"));
                }
            })
            .await;
        planned.into_iter().map(|(va, ..)| va).collect()
    }

    /// Deletes VAs (the hub detaches them; their finalizer holds them meanwhile).
    pub(crate) async fn delete_vas(&self, names: &[String]) {
        self.deleted.lock().unwrap().extend(names.iter().cloned());
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        futures::stream::iter(names)
            .for_each_concurrent(CONCURRENCY, |n| {
                let api = api.clone();
                async move {
                    match api.delete(n, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => panic!("deleting VA {n}: {e}"),
                    }
                }
            })
            .await;
    }

    /// VAs created and not deleted.
    pub(crate) fn live(&self) -> Vec<String> {
        let deleted = self.deleted.lock().unwrap();
        self.vas
            .lock()
            .unwrap()
            .keys()
            .filter(|n| !deleted.contains(*n))
            .cloned()
            .collect()
    }

    /// VAs deleted on purpose.
    pub(crate) fn deleted(&self) -> Vec<String> {
        self.deleted.lock().unwrap().iter().cloned().collect()
    }

    /// The invariants every scenario checks at its end (after its fault is
    /// over), given `settle` to converge. Returns the violations; none is a pass.
    ///
    /// 1. every live VA attached and every deleted VA gone;
    /// 2. per driver, the attachments the driver holds equal the VAs marked
    ///    attached;
    /// 3. every volume published for a VA was unpublished before the VA
    ///    disappeared;
    /// 4. no secret value in any hub's log, metrics or `/drivers`;
    /// 5. no panic in any hub (log, `attacher_hub_task_panics_total`).
    ///
    /// [`World::finish`] adds: no finalizer of ours left behind.
    pub(crate) async fn check(&self, hubs: &[&FHub], settle: Duration) -> Vec<String> {
        let mut bad = Vec::new();
        let live = self.live();
        let deleted = self.deleted();
        let start = Instant::now();
        if let Err(e) = self.ledger.wait_attached(&live, settle).await {
            bad.push(format!("live VAs: {e}"));
        }
        let left = settle
            .saturating_sub(start.elapsed())
            .max(Duration::from_secs(5));
        if let Err(e) = self.ledger.wait_gone(&deleted, left).await {
            bad.push(format!("deleted VAs: {e}"));
        }
        bad.extend(self.check_driver_state(settle).await);
        bad.extend(self.check_unpublish_order().await);
        for hub in hubs {
            bad.extend(self.check_hub(hub).await);
        }
        bad
    }

    /// Invariant 2, retried for a while (a status write may still be in flight).
    async fn check_driver_state(&self, settle: Duration) -> Vec<String> {
        let start = Instant::now();
        loop {
            let mut bad = Vec::new();
            let api: Api<VolumeAttachment> = Api::all(self.client.clone());
            let list = api
                .list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run)))
                .await
                .expect("list VAs");
            let vas = self.vas.lock().unwrap().clone();
            for (i, mock) in self.mocks.iter().enumerate() {
                let expected: BTreeSet<(String, String)> = list
                    .items
                    .iter()
                    .filter(|va| va.spec.attacher == mock.name)
                    .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
                    .filter_map(|va| vas.get(va.metadata.name.as_deref().unwrap_or_default()))
                    .filter(|(d, ..)| *d == i)
                    .map(|(_, vol, _)| (vol.clone(), format!("{}-id", self.node)))
                    .collect();
                let held = mock.attachments().await;
                if held != expected {
                    let extra: Vec<_> = held.difference(&expected).take(3).collect();
                    let missing: Vec<_> = expected.difference(&held).take(3).collect();
                    bad.push(format!(
                        "driver {}: holds {} attachments, {} VAs are marked attached; held but not attached: {extra:?}; attached but not held: {missing:?}",
                        mock.name,
                        held.len(),
                        expected.len()
                    ));
                }
            }
            if bad.is_empty() || start.elapsed() > settle {
                return bad;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Invariant 3, from the drivers' call records and the ledger.
    async fn check_unpublish_order(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let vas = self.vas.lock().unwrap().clone();
        let node_id = format!("{}-id", self.node);
        for (i, mock) in self.mocks.iter().enumerate() {
            let calls = mock.calls().await;
            let ok = |c: &CallRecord, m: &str| c.method == m && c.code.as_deref() == Some("Ok");
            for (va, (d, vol, _)) in &vas {
                if *d != i {
                    continue;
                }
                let Some(gone) = self.ledger.life(va).gone_ms else {
                    continue;
                };
                let last_publish = calls
                    .iter()
                    .filter(|c| {
                        ok(c, "ControllerPublishVolume")
                            && c.volume_id == *vol
                            && c.node_id == node_id
                    })
                    .filter(|c| c.time_unix_ms <= gone)
                    .map(|c| c.time_unix_ms)
                    .max();
                let Some(published) = last_publish else {
                    continue;
                };
                let unpublished = calls.iter().any(|c| {
                    ok(c, "ControllerUnpublishVolume")
                        && c.volume_id == *vol
                        && c.node_id == node_id
                        && c.time_unix_ms >= published
                        && c.time_unix_ms <= gone
                });
                if !unpublished {
                    bad.push(format!(
                        "VA {va} ({vol} on driver {}) disappeared without a ControllerUnpublishVolume after its last publish",
                        mock.name
                    ));
                }
            }
        }
        bad.truncate(5);
        bad
    }

    /// Invariants 4 and 5 for one hub.
    pub(crate) async fn check_hub(&self, hub: &FHub) -> Vec<String> {
        let mut bad = Vec::new();
        let log = hub.log();
        // The value as read from the Secret, and as it travels in API responses.
        let encoded = base64_encode(self.secret_value.as_bytes());
        let leaks = |text: &str| text.contains(&self.secret_value) || text.contains(&encoded);
        if leaks(&log) {
            bad.push(format!(
                "{}: the Secret's value is in the log",
                hub.spec.label
            ));
        }
        if let Some(line) = log.lines().find(|l| {
            l.contains("panicked at")
                || l.contains("task panicked")
                || l.contains("memory allocation")
        }) {
            bad.push(format!("{}: panic in the log: {line}", hub.spec.label));
        }
        if let Ok((200, metrics)) = super::fhub::http_get(hub.http, "/metrics").await {
            if leaks(&metrics) {
                bad.push(format!(
                    "{}: the Secret's value is in /metrics",
                    hub.spec.label
                ));
            }
            if let Some(n) = metric_sum(&metrics, "attacher_hub_task_panics_total", &[])
                && n > 0.0
            {
                bad.push(format!(
                    "{}: attacher_hub_task_panics_total = {n}",
                    hub.spec.label
                ));
            }
        }
        if let Ok((200, drivers)) = super::fhub::http_get(hub.http, "/drivers").await
            && leaks(&drivers)
        {
            bad.push(format!(
                "{}: the Secret's value is in /drivers",
                hub.spec.label
            ));
        }
        bad
    }

    /// Deletes every VA left and waits for them to go (the hub detaches
    /// them), then deletes the PVs and waits for them to go too: like
    /// external-attacher, the hub removes its PV finalizer once the PV is
    /// being deleted and no VA uses it. A PV held by our finalizer is a
    /// violation.
    pub(crate) async fn finish(&self, bound: Duration) -> Vec<String> {
        let mut bad = Vec::new();
        let live = self.live();
        self.delete_vas(&live).await;
        if let Err(e) = self.ledger.wait_gone(&live, bound).await {
            bad.push(format!("clean-up: {e}"));
            return bad;
        }
        let pvs: Vec<(String, String)> = self
            .vas
            .lock()
            .unwrap()
            .values()
            .map(|(d, _, pv)| (pv.clone(), attacher_finalizer(&self.mocks[*d].name)))
            .collect();
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let names: Vec<String> = pvs.iter().map(|(p, _)| p.clone()).collect();
        crate::hub::delete_all(&api, &names).await;
        let start = Instant::now();
        loop {
            let mut left = Vec::new();
            for (pv, fin) in &pvs {
                if let Some(p) = api.get_opt(pv).await.expect("get PV")
                    && p.metadata.finalizers.unwrap_or_default().contains(fin)
                {
                    left.push(pv.clone());
                }
            }
            if left.is_empty() {
                return bad;
            }
            if start.elapsed() > bound {
                bad.push(format!(
                    "{} deleted PVs are held by our finalizer after their VAs are gone, e.g. {:?}",
                    left.len(),
                    &left[..left.len().min(3)]
                ));
                return bad;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Standard base64 with padding.
fn base64_encode(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(A[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Writes a kubeconfig equal to `base` but whose server is `server`
/// (e.g. `https://127.0.0.1:<proxy port>`), in `dir`.
pub(crate) fn kubeconfig_via(base: &Path, server: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(base).expect("read the kubeconfig");
    let replaced: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("server:") {
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}server: {server}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert!(
        replaced.contains(server),
        "no server line in {}",
        base.display()
    );
    let path = dir.join(format!("kubeconfig-{}", super::next_id()));
    std::fs::write(&path, replaced).expect("write the kubeconfig");
    path
}

/// The API server's address from a kubeconfig's `server:` line.
pub(crate) fn api_addr(kubeconfig: &Path) -> std::net::SocketAddr {
    let text = std::fs::read_to_string(kubeconfig).expect("read the kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server:"))
        .expect("server line")
        .trim();
    server
        .trim_start_matches("https://")
        .parse()
        .unwrap_or_else(|e| panic!("server {server:?} is not https://IP:port: {e}"))
}

#[test]
fn base64_matches_the_standard_encoding() {
    assert_eq!(base64_encode(b""), "");
    assert_eq!(base64_encode(b"f"), "Zg==");
    assert_eq!(base64_encode(b"fo"), "Zm8=");
    assert_eq!(base64_encode(b"foo"), "Zm9v");
    assert_eq!(base64_encode(b"s3cr3t-x"), "czNjcjN0LXg=");
}
