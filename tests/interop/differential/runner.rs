//! Runs the scenario table against one implementation: per batch one
//! in-process Rust mock driver and one attacher process (the Go
//! csi-attacher or attacher-hub), the batch's scenarios, normalized
//! snapshots, and a forced clean-up of every object created.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use attacher_hub::csi::{
    Connection,
    proto::{
        self,
        controller_client::ControllerClient,
        volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode},
    },
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, PersistentVolume, PersistentVolumeSpec, Secret,
};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use mock_csi_driver::CallRecord;
use mock_csi_driver::{MockDriver, MockHandle};

use super::scenarios::{
    Batch, CsiSpec, DriverName, NodeEntry, Obj, PvObj, PvSource, PvState, Scenario, SecretValue,
    Step, VaSource, VaState,
};
use super::snapshot::{Normalizer, PUBLISH, Snapshot, UNPUBLISH};
use crate::infra;
use crate::support::{
    ChildProcess, Cluster, PvBuilder, attacher_finalizer, sanitize_driver_name,
    start_reference_attacher, unique_driver_name, unique_name, va, wait_deleted, wait_for,
};

/// Limit of every wait of a scenario.
const WAIT: Duration = Duration::from_secs(45);

/// Time given to in-flight work (a duplicate publish, a status write) to
/// land before a snapshot is taken.
const SNAPSHOT_SETTLE: Duration = Duration::from_millis(500);

/// Pause between the two waits for an attach error (see
/// `scenarios::VaState::AttachError`): by then the backoff is past 1 s.
const ERROR_SETTLE: Duration = Duration::from_secs(2);

/// Namespace of the publish Secrets.
const SECRET_NAMESPACE: &str = "default";

/// The two implementations under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Impl {
    /// The reference Go csi-attacher v4.13.
    Go,
    /// attacher-hub in sidecar mode.
    Hub,
}

impl Impl {
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Impl::Go => "go",
            Impl::Hub => "hub",
        }
    }
}

/// What one scenario did in one implementation.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) batch: &'static str,
    pub(crate) scenario: String,
    /// Snapshots in the order taken, by label.
    pub(crate) checkpoints: Vec<(String, Snapshot)>,
    /// Why the scenario stopped early (a wait timed out, a create failed).
    pub(crate) failure: Option<String>,
    pub(crate) elapsed: Duration,
    /// Infrastructure errors (API timeouts, cut watches, 429/5xx) in the
    /// attacher's log that concern this scenario, and the test's own API
    /// errors of that kind (see `infra.rs`).
    pub(crate) infra: Vec<String>,
    /// Roles of the VAs the Go attacher re-attached from a stale cache after
    /// attaching them (`docs/design.md#own-writes`); always empty for the hub.
    pub(crate) stale_reattached: BTreeSet<String>,
}

/// Everything a scenario needs from its batch.
struct BatchCtx {
    client: Client,
    driver: String,
    foreign_driver: String,
    run_tag: String,
    mock: MockHandle,
    socket: PathBuf,
    normalizer: Normalizer,
}

/// Objects a scenario created, for the clean-up.
#[derive(Default)]
struct Created {
    vas: Vec<String>,
    pvs: Vec<String>,
    csinodes: Vec<String>,
    secrets: Vec<String>,
}

/// Runs the scenarios of one batch named in `only` (all of them for `None`)
/// with one implementation and returns one outcome per scenario, in table
/// order. A scenario keeps its index in the batch (and so its mock volume)
/// whatever the selection. Attacher logs are saved to `log_dir`.
pub(crate) async fn run_batch(
    which: Impl,
    batch: &Batch,
    only: Option<&BTreeSet<String>>,
    log_dir: &Path,
) -> Vec<Outcome> {
    let selected: Vec<(usize, &Scenario)> = batch
        .scenarios
        .iter()
        .enumerate()
        .filter(|(_, s)| only.is_none_or(|o| o.contains(&s.name)))
        .collect();
    if selected.is_empty() {
        return Vec::new();
    }
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let driver = match batch.driver {
        DriverName::Unique => unique_driver_name(&format!("{}-{}", which.tag(), batch.name)),
        DriverName::Fixed(name) => name.to_string(),
    };
    let run_tag = unique_name(&format!("{}-{}", which.tag(), batch.name));
    let foreign_driver = unique_driver_name("foreign");
    let normalizer = Normalizer::default()
        .with(&driver, "<driver>")
        .with(&sanitize_driver_name(&driver), "<driver>")
        .with(&foreign_driver, "<foreign-driver>")
        .with(&sanitize_driver_name(&foreign_driver), "<foreign-driver>")
        .with(&run_tag, "<run>");

    let socket_dir = tempfile::Builder::new()
        .prefix("ah-diff-")
        .tempdir()
        .expect("temporary directory for the mock socket");
    let socket = socket_dir.path().join("csi.sock");
    let mock = MockDriver::new(&driver)
        .volumes(batch.scenarios.len())
        .capabilities(batch.capabilities.clone())
        .serve(&socket)
        .await
        .unwrap_or_else(|e| panic!("mock for batch {}: {e}", batch.name));
    let mut attacher = start_attacher(which, cluster, &socket, batch.reconcile_sync);

    let ctx = BatchCtx {
        client,
        driver,
        foreign_driver,
        run_tag,
        mock,
        socket,
        normalizer,
    };
    let results: Vec<(Outcome, Created)> = if batch.sequential {
        let mut v = Vec::new();
        for &(i, s) in &selected {
            v.push(run_scenario(&ctx, batch.name, i, s).await);
        }
        v
    } else {
        futures::future::join_all(
            selected
                .iter()
                .map(|&(i, s)| run_scenario(&ctx, batch.name, i, s)),
        )
        .await
    };

    let exited = attacher.exited();
    attacher.stop().await;
    // The run tag keeps concurrent runs of this test from sharing a file.
    let log = log_dir.join(format!("{}.log", ctx.run_tag));
    let _ = std::fs::write(
        &log,
        format!(
            "driver {}\nrun tag {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            ctx.driver,
            ctx.run_tag,
            attacher.stdout(),
            attacher.stderr()
        ),
    );
    let side = match which {
        Impl::Go => infra::Side::Go,
        Impl::Hub => infra::Side::Hub,
    };
    let text = format!("{}\n{}", attacher.stdout(), attacher.stderr());
    let names: Vec<String> = selected.iter().map(|(_, s)| s.name.clone()).collect();
    let mut troubles = infra::by_scenario(side, &text, &ctx.run_tag, &names);
    let reattached = match which {
        Impl::Go => infra::stale_reattaches(&text),
        Impl::Hub => BTreeSet::new(),
    };
    let mut outcomes = Vec::new();
    for (mut outcome, created) in results {
        outcome.infra = troubles
            .remove(&outcome.scenario)
            .unwrap_or_default()
            .into_iter()
            .map(|l| format!("{} log: {}", which.tag(), ctx.normalizer.apply(&l)))
            .collect();
        if let Some(f) = &outcome.failure
            && infra::is_infra_failure(f)
        {
            outcome.infra.push(format!("the test's own API call: {f}"));
        }
        // An error the attacher saved in a status shows in a snapshot even
        // when its log line is worded otherwise.
        for (label, snap) in &outcome.checkpoints {
            for (field, value) in &snap.fields {
                if infra::is_infra_line(side, value) {
                    outcome
                        .infra
                        .push(format!("{} [{label}] {field}: {value}", which.tag()));
                }
            }
        }
        let prefix = format!("{}-{}-", ctx.run_tag, outcome.scenario);
        outcome.stale_reattached = reattached
            .iter()
            .filter_map(|n| n.strip_prefix(&prefix))
            .map(str::to_string)
            .collect();
        cleanup(&ctx.client, &created).await;
        if let Some(status) = exited {
            outcome.failure.get_or_insert(format!(
                "the {} attacher exited ({status}) during the batch; log {}",
                which.tag(),
                log.display()
            ));
        }
        outcomes.push(outcome);
    }
    ctx.mock.shutdown().await;
    outcomes
}

/// Starts the attacher under test with the test's short intervals.
fn start_attacher(which: Impl, cluster: &Cluster, socket: &Path, reconcile: &str) -> ChildProcess {
    let reconcile = format!("--reconcile-sync={reconcile}");
    let common = [
        "--timeout=2s",
        "--retry-interval-start=200ms",
        "--retry-interval-max=2s",
        reconcile.as_str(),
    ];
    match which {
        Impl::Go => start_reference_attacher(cluster, socket, &common),
        Impl::Hub => {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
            cmd.arg(format!(
                "--kubeconfig={}",
                cluster.attacher_kubeconfig.display()
            ))
            .arg(format!("--csi-address={}", socket.display()))
            .args(["--kube-api-qps=100", "--kube-api-burst=200", "-v=4"])
            .args(common);
            ChildProcess::spawn("attacher-hub", cmd)
        }
    }
}

/// A scenario's view of its batch: names and IDs of its roles.
struct ScenarioCtx<'a> {
    batch: &'a BatchCtx,
    index: usize,
    scenario: &'a Scenario,
}

impl ScenarioCtx<'_> {
    /// Object name of a role, unique to this run.
    fn name(&self, role: &str) -> String {
        format!("{}-{}-{role}", self.batch.run_tag, self.scenario.name)
    }

    /// CSI node ID of a node role with our driver; the same in both runs.
    fn node_id(&self, node: &str, entry: NodeEntry) -> String {
        match entry {
            NodeEntry::OurDriverAs(suffix) => format!("nid-{}-{node}-{suffix}", self.scenario.name),
            NodeEntry::OurDriver | NodeEntry::OtherDriverOnly => {
                format!("nid-{}-{node}", self.scenario.name)
            }
        }
    }

    /// The scenario's own mock volume.
    fn volume(&self) -> String {
        format!("vol-{}", self.index)
    }

    /// A template with its placeholders filled in (see [`crate::scenarios::PvObj`]).
    fn fill(&self, template: &str) -> String {
        let b = self.batch;
        let mut out = template
            .replace("{driver}", &b.driver)
            .replace("{foreign}", &b.foreign_driver)
            .replace("{finalizer}", &attacher_finalizer(&b.driver))
            .replace(
                "{foreign-finalizer}",
                &attacher_finalizer(&b.foreign_driver),
            );
        while let Some(start) = out.find("{name:") {
            let Some(len) = out[start..].find('}') else {
                break;
            };
            let role = out[start + "{name:".len()..start + len].to_string();
            out.replace_range(start..=start + len, &self.name(&role));
        }
        out
    }

    /// Every object the scenario creates, at its start or in a step.
    fn objects(&self) -> impl Iterator<Item = &Obj> {
        self.scenario
            .setup
            .iter()
            .chain(self.scenario.steps.iter().filter_map(|s| match s {
                Step::Create(o) => Some(o),
                _ => None,
            }))
    }

    /// Volume handles whose calls belong to this scenario.
    fn handles(&self) -> BTreeSet<String> {
        let mut h = BTreeSet::from([self.volume()]);
        for o in self.objects() {
            match o {
                Obj::MockVolume { handle } => {
                    h.insert(self.fill(handle));
                }
                Obj::Va {
                    source:
                        VaSource::Inline(CsiSpec {
                            handle: Some(handle),
                            ..
                        }),
                    ..
                } => {
                    h.insert(self.fill(handle));
                }
                _ => {}
            }
        }
        h
    }

    /// Node IDs of this scenario's nodes: a call to one of them belongs to
    /// the scenario whatever volume it names (a wrongly translated handle
    /// shows up in the comparison instead of being filtered out).
    fn node_ids(&self) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        for o in self.objects() {
            if let Obj::CsiNode { node, entry } = o {
                ids.insert(self.node_id(node, *entry));
            }
        }
        ids
    }

    /// The node role of a VA role (as first created).
    fn va_node(&self, va_role: &str) -> &'static str {
        self.objects()
            .find_map(|o| match o {
                Obj::Va { name, node, .. } if *name == va_role => Some(*node),
                _ => None,
            })
            .unwrap_or_else(|| panic!("scenario {} has no VA {va_role}", self.scenario.name))
    }

    /// The scenario's calls to the mock, oldest first.
    fn calls(&self) -> Vec<CallRecord> {
        let (handles, nodes) = (self.handles(), self.node_ids());
        self.batch
            .mock
            .calls()
            .into_iter()
            .filter(|c| {
                (c.method == PUBLISH || c.method == UNPUBLISH)
                    && (handles.contains(&c.volume_id) || nodes.contains(&c.node_id))
            })
            .collect()
    }

    fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.batch.client.clone())
    }

    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.batch.client.clone())
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.batch.client.clone(), SECRET_NAMESPACE)
    }
}

async fn run_scenario(
    batch: &BatchCtx,
    batch_name: &'static str,
    index: usize,
    scenario: &Scenario,
) -> (Outcome, Created) {
    let started = Instant::now();
    let ctx = ScenarioCtx {
        batch,
        index,
        scenario,
    };
    let mut created = Created::default();
    let mut checkpoints = Vec::new();
    let result = async {
        if let Some((method, fault)) = &scenario.start_fault {
            batch.mock.set_fault(method, fault.clone());
        }
        for obj in &scenario.setup {
            create(&ctx, obj, &mut created).await?;
        }
        for step in &scenario.steps {
            run_step(&ctx, step, &mut checkpoints, &mut created).await?;
        }
        Ok::<(), String>(())
    }
    .await;
    if scenario.start_fault.is_some() || scenario.steps.iter().any(|s| matches!(s, Step::Fault(..)))
    {
        batch.mock.clear_faults();
    }
    let failure = match result {
        Ok(()) => None,
        Err(e) => {
            // What the objects looked like when the scenario gave up.
            checkpoints.push(("at-failure".to_string(), snapshot(&ctx).await));
            Some(e)
        }
    };
    let outcome = Outcome {
        batch: batch_name,
        scenario: scenario.name.clone(),
        checkpoints,
        failure,
        elapsed: started.elapsed(),
        infra: Vec::new(),
        stale_reattached: BTreeSet::new(),
    };
    (outcome, created)
}

async fn run_step(
    ctx: &ScenarioCtx<'_>,
    step: &Step,
    checkpoints: &mut Vec<(String, Snapshot)>,
    created: &mut Created,
) -> Result<(), String> {
    let n = &ctx.batch.normalizer;
    match step {
        Step::Wait(role, state) => wait_va(ctx, role, *state).await?,
        Step::WaitPv(role, state) => {
            let result = match state {
                PvState::Gone => wait_deleted(&ctx.pvs(), &ctx.name(role), WAIT).await,
                PvState::Released => {
                    let finalizer = attacher_finalizer(&ctx.batch.driver);
                    wait_for(
                        &ctx.pvs(),
                        &ctx.name(role),
                        &format!("no finalizer {finalizer}"),
                        move |pv: Option<&PersistentVolume>| {
                            pv.is_some_and(|pv| {
                                !pv.metadata
                                    .finalizers
                                    .iter()
                                    .flatten()
                                    .any(|f| *f == finalizer)
                            })
                        },
                        WAIT,
                    )
                    .await
                    .map(drop)
                }
            };
            result.map_err(|e| n.apply(&format!("PV {role}: {e}")))?;
        }
        Step::WaitRepublished(role) => {
            let node = ctx.node_id(ctx.va_node(role), NodeEntry::OurDriver);
            let volume = ctx.volume();
            wait_calls(
                ctx,
                &format!(
                    "a successful ControllerPublishVolume of {volume}@{node} after its unpublish"
                ),
                |calls| {
                    calls
                        .iter()
                        .filter(|c| c.volume_id == volume && c.node_id == node)
                        .skip_while(|c| c.method != UNPUBLISH)
                        .any(|c| c.method == PUBLISH && c.code.as_deref() == Some("Ok"))
                },
            )
            .await?;
        }
        Step::WaitCall {
            node,
            entry,
            method,
            code,
        } => {
            let node = ctx.node_id(node, *entry);
            wait_calls(
                ctx,
                &format!("a {method} to {node} answered {code}"),
                |calls| {
                    calls.iter().any(|c| {
                        c.method == *method && c.node_id == node && c.code.as_deref() == Some(*code)
                    })
                },
            )
            .await?;
        }
        Step::Pause(d) => tokio::time::sleep(*d).await,
        Step::Snapshot(label) => {
            tokio::time::sleep(SNAPSHOT_SETTLE).await;
            checkpoints.push((label.to_string(), snapshot(ctx).await));
        }
        Step::Create(obj) => create(ctx, obj, created).await?,
        Step::DeleteVa(role) => {
            ctx.vas()
                .delete(&ctx.name(role), &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting VA {role}: {e}"))?;
        }
        Step::DeletePv(role) => {
            ctx.pvs()
                .delete(&ctx.name(role), &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting PV {role}: {e}"))?;
        }
        Step::DeleteCsiNode(role) => {
            let api = Api::<CSINode>::all(ctx.batch.client.clone());
            api.delete(&ctx.name(role), &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting CSINode {role}: {e}"))?;
            // Gone from the API before anything re-creates it.
            wait_deleted(&api, &ctx.name(role), WAIT)
                .await
                .map_err(|e| n.apply(&format!("CSINode {role}: {e}")))?;
        }
        Step::SetSecret(role, data) => {
            // One write replacing `data` whole, so no reader ever sees a
            // half-updated Secret.
            let api = ctx.secrets();
            let mut secret = api
                .get(&ctx.name(role))
                .await
                .map_err(|e| format!("reading Secret {role}: {e}"))?;
            secret.data = Some(secret_data(data));
            api.replace(&ctx.name(role), &PostParams::default(), &secret)
                .await
                .map_err(|e| format!("updating Secret {role}: {e}"))?;
        }
        Step::DeleteSecret(role) => {
            ctx.secrets()
                .delete(&ctx.name(role), &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting Secret {role}: {e}"))?;
        }
        Step::Fault(method, fault) => ctx.batch.mock.set_fault(method, fault.clone()),
        Step::ClearFaults => ctx.batch.mock.clear_faults(),
        Step::UnpublishBehindBack(role) => {
            let mut c = controller(&ctx.batch.socket).await?;
            c.controller_unpublish_volume(proto::ControllerUnpublishVolumeRequest {
                volume_id: ctx.volume(),
                node_id: ctx.node_id(ctx.va_node(role), NodeEntry::OurDriver),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("unpublishing behind the attacher's back: {e}"))?;
        }
    }
    Ok(())
}

/// Waits until the scenario's calls satisfy `done`.
async fn wait_calls(
    ctx: &ScenarioCtx<'_>,
    what: &str,
    done: impl Fn(&[CallRecord]) -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    while !done(&ctx.calls()) {
        if start.elapsed() > WAIT {
            return Err(format!("no {what} within {WAIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A Secret's `data`, base64-encoded as the API wants it.
fn secret_data(data: &[(&str, SecretValue)]) -> BTreeMap<String, ByteString> {
    data.iter()
        .map(|(k, v)| ((*k).to_string(), ByteString(v.bytes())))
        .collect()
}

async fn wait_va(ctx: &ScenarioCtx<'_>, role: &str, state: VaState) -> Result<(), String> {
    let api = ctx.vas();
    let name = ctx.name(role);
    let status = |va: Option<&VolumeAttachment>| va.and_then(|v| v.status.clone());
    let r = match state {
        VaState::Attached => wait_for(
            &api,
            &name,
            "status.attached=true",
            move |va: Option<&VolumeAttachment>| status(va).is_some_and(|s| s.attached),
            WAIT,
        )
        .await
        .map(drop),
        VaState::AttachError(text) => {
            let what = format!("status.attachError.message containing {text:?}");
            let wait = || {
                wait_for(
                    &api,
                    &name,
                    &what,
                    move |va: Option<&VolumeAttachment>| {
                        status(va)
                            .and_then(|s| s.attach_error)
                            .and_then(|e| e.message)
                            .is_some_and(|m| m.contains(text))
                    },
                    WAIT,
                )
            };
            // Once more after the backoff has grown (see VaState::AttachError).
            match wait().await {
                Ok(_) => {
                    tokio::time::sleep(ERROR_SETTLE).await;
                    wait().await.map(drop)
                }
                Err(e) => Err(e),
            }
        }
        VaState::DetachError(text) => wait_for(
            &api,
            &name,
            &format!("status.detachError.message containing {text:?}"),
            move |va: Option<&VolumeAttachment>| {
                status(va)
                    .and_then(|s| s.detach_error)
                    .and_then(|e| e.message)
                    .is_some_and(|m| m.contains(text))
            },
            WAIT,
        )
        .await
        .map(drop),
        VaState::Finalized => {
            let finalizer = attacher_finalizer(&ctx.batch.driver);
            wait_for(
                &api,
                &name,
                &format!("finalizer {finalizer}"),
                move |va: Option<&VolumeAttachment>| {
                    va.is_some_and(|va| {
                        va.metadata
                            .finalizers
                            .iter()
                            .flatten()
                            .any(|f| *f == finalizer)
                    })
                },
                WAIT,
            )
            .await
            .map(drop)
        }
        VaState::Gone => wait_deleted(&api, &name, WAIT).await,
    };
    r.map_err(|e| ctx.batch.normalizer.apply(&format!("VA {role}: {e}")))
}

/// The scenario's objects and calls now, normalized.
async fn snapshot(ctx: &ScenarioCtx<'_>) -> Snapshot {
    let n = &ctx.batch.normalizer;
    let mut s = Snapshot::default();
    let mut seen = BTreeSet::new();
    for obj in ctx.objects() {
        match obj {
            Obj::Va { name, .. } if seen.insert(("va", *name)) => {
                let va = ctx.vas().get_opt(&ctx.name(name)).await.ok().flatten();
                s.va(name, va.as_ref(), n);
            }
            Obj::Pv(PvObj { name, .. }) if seen.insert(("pv", *name)) => {
                let pv = ctx.pvs().get_opt(&ctx.name(name)).await.ok().flatten();
                s.pv(name, pv.as_ref(), n);
            }
            _ => {}
        }
    }
    s.calls(&ctx.calls(), n);
    s
}

/// A Controller client on the mock's socket.
async fn controller(socket: &Path) -> Result<ControllerClient<tonic::transport::Channel>, String> {
    let address = socket
        .to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad socket path {}", socket.display()))?;
    let conn = Connection::connect(address, Some(Duration::from_secs(10)))
        .await
        .map_err(|e| format!("connecting to the mock: {e}"))?;
    Ok(ControllerClient::new(conn.channel()))
}

/// The CSI source, access modes and volume mode of a PV or inline spec.
fn csi_spec(ctx: &ScenarioCtx<'_>, spec: &CsiSpec) -> PersistentVolumeSpec {
    let handle = spec.handle.map_or_else(|| ctx.volume(), |h| ctx.fill(h));
    let mut b =
        PvBuilder::new("unused", &ctx.batch.driver, &handle).access_modes(spec.access_modes);
    if spec.block {
        b = b.volume_mode("Block");
    }
    if let Some(ro) = spec.read_only {
        b = b.read_only(ro);
    }
    if let Some(fs) = spec.fs_type {
        b = b.fs_type(fs);
    }
    if let Some(secret) = spec.secret {
        b = b.controller_publish_secret(&ctx.name(secret), SECRET_NAMESPACE);
    }
    for (k, v) in spec.attributes {
        b = b.volume_attribute(k, v);
    }
    b.build().spec.expect("the builder sets a spec")
}

fn remember(list: &mut Vec<String>, name: String) {
    if !list.contains(&name) {
        list.push(name);
    }
}

async fn create(ctx: &ScenarioCtx<'_>, obj: &Obj, created: &mut Created) -> Result<(), String> {
    let client = &ctx.batch.client;
    let pp = PostParams::default();
    match obj {
        Obj::CsiNode { node, entry } => {
            let name = ctx.name(node);
            let (driver, id) = match entry {
                NodeEntry::OurDriver | NodeEntry::OurDriverAs(_) => {
                    (ctx.batch.driver.clone(), ctx.node_id(node, *entry))
                }
                NodeEntry::OtherDriverOnly => {
                    (ctx.batch.foreign_driver.clone(), "foreign-node".to_string())
                }
            };
            let csinode = CSINode {
                status: None,
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![CSINodeDriver {
                        name: driver,
                        node_id: id,
                        ..CSINodeDriver::default()
                    }],
                },
            };
            Api::<CSINode>::all(client.clone())
                .create(&pp, &csinode)
                .await
                .map_err(|e| format!("creating CSINode {node}: {e}"))?;
            remember(&mut created.csinodes, name);
        }
        Obj::Secret { name, data } => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(ctx.name(name)),
                    ..ObjectMeta::default()
                },
                data: Some(secret_data(data)),
                ..Default::default()
            };
            ctx.secrets()
                .create(&pp, &secret)
                .await
                .map_err(|e| format!("creating Secret {name}: {e}"))?;
            remember(&mut created.secrets, ctx.name(name));
        }
        Obj::Pv(PvObj {
            name,
            source,
            deleting,
            finalizers,
            labels,
            annotations,
        }) => {
            let pv_name = ctx.name(name);
            let mut pv = PvBuilder::new(&pv_name, &ctx.batch.driver, &ctx.volume()).build();
            let spec = pv.spec.as_mut().expect("the builder sets a spec");
            match source {
                PvSource::Csi(c) => {
                    let s = csi_spec(ctx, c);
                    spec.csi = s.csi;
                    spec.access_modes = s.access_modes;
                    spec.volume_mode = s.volume_mode;
                }
                PvSource::HostPath => {
                    spec.csi = None;
                    spec.host_path = Some(HostPathVolumeSource {
                        path: "/tmp/attacher-hub-differential".into(),
                        type_: None,
                    });
                }
                PvSource::InTree(in_tree) => {
                    let in_tree = (**in_tree).clone();
                    *spec = PersistentVolumeSpec {
                        capacity: spec.capacity.take(),
                        persistent_volume_reclaim_policy: spec
                            .persistent_volume_reclaim_policy
                            .take(),
                        ..in_tree
                    };
                }
            }
            let mut finalizers: Vec<String> = finalizers.iter().map(|f| ctx.fill(f)).collect();
            if *deleting && finalizers.is_empty() {
                finalizers.push("test/keep".to_string());
            }
            if !finalizers.is_empty() {
                pv.metadata.finalizers = Some(finalizers);
            }
            if !labels.is_empty() {
                pv.metadata.labels = Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                        .collect(),
                );
            }
            if !annotations.is_empty() {
                pv.metadata.annotations = Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), ctx.fill(v)))
                        .collect(),
                );
            }
            let api = ctx.pvs();
            api.create(&pp, &pv)
                .await
                .map_err(|e| format!("creating PV {name}: {e}"))?;
            remember(&mut created.pvs, pv_name.clone());
            if *deleting {
                api.delete(&pv_name, &DeleteParams::default())
                    .await
                    .map_err(|e| format!("deleting PV {name}: {e}"))?;
            }
        }
        Obj::Va {
            name,
            node,
            source,
            foreign,
        } => {
            let attacher = if *foreign {
                &ctx.batch.foreign_driver
            } else {
                &ctx.batch.driver
            };
            let mut obj = match source {
                VaSource::Pv(pv) => va(&ctx.name(name), attacher, &ctx.name(node), &ctx.name(pv)),
                VaSource::Inline(c) => {
                    let mut v = va(&ctx.name(name), attacher, &ctx.name(node), "unused");
                    let full = csi_spec(ctx, c);
                    v.spec.source.persistent_volume_name = None;
                    v.spec.source.inline_volume_spec = Some(PersistentVolumeSpec {
                        access_modes: full.access_modes,
                        volume_mode: full.volume_mode,
                        csi: full.csi,
                        ..PersistentVolumeSpec::default()
                    });
                    v
                }
            };
            obj.metadata.name = Some(ctx.name(name));
            ctx.vas()
                .create(&pp, &obj)
                .await
                .map_err(|e| format!("creating VA {name}: {e}"))?;
            remember(&mut created.vas, ctx.name(name));
        }
        Obj::MockVolume { handle } => {
            let handle = ctx.fill(handle);
            let mut c = controller(&ctx.batch.socket).await?;
            c.create_volume(proto::CreateVolumeRequest {
                name: handle.clone(),
                volume_capabilities: vec![proto::VolumeCapability {
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                }],
                ..Default::default()
            })
            .await
            .map_err(|e| format!("creating mock volume {handle}: {e}"))?;
        }
    }
    Ok(())
}

/// Removes every object a scenario created, finalizers first (the attacher
/// is stopped by now, and no controller-manager runs).
async fn cleanup(client: &Client, created: &Created) {
    let unfinalize = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    let pp = PatchParams::default();
    let dp = DeleteParams::default();
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    for name in &created.vas {
        let _ = vas.patch(name, &pp, &unfinalize).await;
        let _ = vas.delete(name, &dp).await;
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for name in &created.pvs {
        let _ = pvs.patch(name, &pp, &unfinalize).await;
        let _ = pvs.delete(name, &dp).await;
    }
    let csinodes: Api<CSINode> = Api::all(client.clone());
    for name in &created.csinodes {
        let _ = csinodes.delete(name, &dp).await;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SECRET_NAMESPACE);
    for name in &created.secrets {
        let _ = secrets.delete(name, &dp).await;
    }
}
