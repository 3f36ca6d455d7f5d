//! Differential test against a vendor's real controller code: the
//! GCE PD CSI driver's own ControllerPublish/Unpublish rules, on its fake
//! cloud, answer the reference Go external-attacher v4.13.0 and attacher-hub
//! (sidecar mode) in the same scenarios, with the same flags, and the
//! VolumeAttachments come from kube-controller-manager (Pods with claims,
//! nothing written by hand).
//!
//! Each scenario is one Pod with one claim on one Node; the disk, the
//! instance, the volume handle, the node ID or an out-of-band attachment make
//! the driver accept or refuse (its rules, read in
//! `pkg/gce-pd-csi-driver/controller.go` of the pinned module: a volume or node
//! ID it cannot parse, a disk or instance that does not exist, a disk
//! attached elsewhere or here in the other mode, a multi-writer filesystem,
//! a volume context it cannot read; and the forgiving detaches of a deleted
//! disk or instance). Two checkpoints, each at a settled state: once the VA is
//! attached or keeps an attach error (a later retry wrote the same message
//! again: a first error can be a passing one, such as the PV an attacher's
//! cache does not hold yet), and once the Pod is deleted and the VA is gone or
//! keeps a detach error. At each, compared after replacing the run's names by
//! placeholders: the VA (`status.attached`, `attachError` message and
//! `errorCode`, `detachError`, finalizers, annotations), whether the volume
//! is in `node.status.volumesAttached`, the fake cloud's attachments of the
//! scenario's instances, and the Controller(Un)Publish calls the driver
//! answered (node, readonly, access mode, answer; consecutive repeats
//! collapsed: how often an attacher retries is timing, not behaviour).
//!
//! Both sides run at the same time, each with its own driver name, PD
//! controller and attacher. The rerun rule of `infra.rs`
//! applies: a scenario whose outcomes differ while either attacher logged an
//! infrastructure error (or the test's own API calls failed for such a
//! reason) runs again on both sides, at most twice more, and the report says
//! so; a real difference still fails.

use crate::peers;
use crate::support;

use crate::infra;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};

use infra::Side;
use peers::{Attacher, PEER_TIMEOUT, start_attachers};
use support::{
    Cluster, NodeDriver, PD_TOPOLOGY_KEY, PD_ZONE, PdController, PdOptions, PodVolume, Source,
    StaticVolume, controller_manager, create_csinode_with, create_managed_node, create_pod,
    delete_objects, unique_volume_name, vas_of, volumes_attached,
};

/// How often the test posts a Node's status in place of its kubelet.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// How often a scenario runs again after an infrastructure error.
const MAX_RERUNS: usize = 2;

/// The same flags for both attachers (with those of `start_attachers`):
/// retries capped low, so a refused scenario is retried a few times.
const FLAGS: &[&str] = &["--retry-interval-start=1s", "--retry-interval-max=5s"];

/// What is attached out of band before the Pod comes.
#[derive(Clone, Copy, Debug)]
enum Before {
    Nothing,
    /// The disk is attached read-write to another instance.
    InUseElsewhere,
    /// The disk is attached read-only to the Node's own instance.
    ReadOnlyHere,
}

/// What happens out of band once the first checkpoint is reached.
#[derive(Clone, Copy, Debug)]
enum Then {
    Nothing,
    DeleteDisk,
    DeleteInstance,
}

/// One scenario.
#[derive(Clone, Debug)]
struct Scenario {
    name: &'static str,
    intent: &'static str,
    /// The disk exists in the fake cloud.
    disk: bool,
    /// The Node's instance exists.
    instance: bool,
    /// The PV's volume handle; `{disk}` is the disk's name. Default: the disk's ID.
    handle: Option<&'static str>,
    /// The CSINode's node ID for the driver. Default: the instance's ID.
    node_id: Option<&'static str>,
    access_modes: &'static [&'static str],
    block: bool,
    read_only: bool,
    attributes: &'static [(&'static str, &'static str)],
    before: Before,
    then: Then,
    /// What the driver answers ControllerPublish: `None` accepts, `Some(code)`
    /// refuses with that gRPC code (checked on the Go side: the reference).
    publish: Option<i32>,
    /// The same for ControllerUnpublish once the Pod is gone.
    unpublish: Option<i32>,
}

const BASE: Scenario = Scenario {
    name: "",
    intent: "",
    disk: true,
    instance: true,
    handle: None,
    node_id: None,
    access_modes: &["ReadWriteOnce"],
    block: false,
    read_only: false,
    attributes: &[],
    before: Before::Nothing,
    then: Then::Nothing,
    publish: None,
    unpublish: None,
};

/// gRPC codes the PD controller answers with.
const NOT_FOUND: i32 = 5;
const INVALID_ARGUMENT: i32 = 3;
const ALREADY_EXISTS: i32 = 6;

fn table() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "attach-detach",
            intent: "an existing disk on an existing instance: attached read-write, detached",
            ..BASE
        },
        Scenario {
            name: "read-only-many",
            intent: "ReadOnlyMany with csi.readOnly: published readonly, attached READ_ONLY",
            access_modes: &["ReadOnlyMany"],
            read_only: true,
            ..BASE
        },
        Scenario {
            name: "multi-writer-block",
            intent: "ReadWriteMany block: MULTI_NODE_MULTI_WRITER, accepted",
            access_modes: &["ReadWriteMany"],
            block: true,
            ..BASE
        },
        Scenario {
            name: "disk-missing",
            intent: "no such disk: NotFound (Could not find disk); the detach finds nothing to do",
            disk: false,
            publish: Some(NOT_FOUND),
            ..BASE
        },
        Scenario {
            name: "disk-missing-no-zone",
            intent: "no such disk, zone left to the driver: NotFound from the key repair; detach forgiven",
            disk: false,
            handle: Some("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/{disk}"),
            publish: Some(NOT_FOUND),
            ..BASE
        },
        Scenario {
            name: "instance-missing",
            intent: "the Node's instance does not exist: NotFound (Could not find instance); detach forgiven",
            instance: false,
            publish: Some(NOT_FOUND),
            ..BASE
        },
        Scenario {
            name: "disk-in-use-elsewhere",
            intent: "the disk is attached read-write to another instance: GCE refuses, InvalidArgument",
            before: Before::InUseElsewhere,
            publish: Some(INVALID_ARGUMENT),
            ..BASE
        },
        Scenario {
            name: "read-only-here",
            intent: "the disk is attached read-only to this instance: AlreadyExists (incompatible); the detach detaches it",
            before: Before::ReadOnlyHere,
            publish: Some(ALREADY_EXISTS),
            ..BASE
        },
        Scenario {
            name: "volume-id-invalid",
            intent: "a handle the driver cannot parse: InvalidArgument on attach and on detach (detachError)",
            handle: Some("not-a-pd-volume-{disk}"),
            publish: Some(INVALID_ARGUMENT),
            unpublish: Some(INVALID_ARGUMENT),
            ..BASE
        },
        Scenario {
            name: "node-id-invalid",
            intent: "a node ID the driver cannot parse: NotFound on attach, InvalidArgument on detach",
            node_id: Some("not-a-pd-node"),
            publish: Some(NOT_FOUND),
            unpublish: Some(INVALID_ARGUMENT),
            ..BASE
        },
        Scenario {
            name: "multi-writer-mount",
            intent: "ReadWriteMany filesystem: InvalidArgument (multi writer with mount access type)",
            access_modes: &["ReadWriteMany"],
            publish: Some(INVALID_ARGUMENT),
            ..BASE
        },
        Scenario {
            name: "force-attach-not-bool",
            intent: "volume context force-attach=maybe: InvalidArgument (bad volume context)",
            attributes: &[("force-attach", "maybe")],
            publish: Some(INVALID_ARGUMENT),
            ..BASE
        },
        Scenario {
            name: "disk-deleted-attached",
            intent: "the disk is deleted while attached: the detach still detaches it from the instance",
            then: Then::DeleteDisk,
            ..BASE
        },
        Scenario {
            name: "instance-deleted-attached",
            intent: "the instance is deleted while the disk is attached: the detach is forgiven",
            then: Then::DeleteInstance,
            ..BASE
        },
    ]
}

/// Normalized facts at one checkpoint, by name.
type Snapshot = BTreeMap<String, String>;

/// One scenario's run on one side.
#[derive(Debug)]
struct Outcome {
    scenario: String,
    checkpoints: Vec<(String, Snapshot)>,
    /// Why the run did not complete, if it did not.
    failure: Option<String>,
    /// Infrastructure errors seen (attacher log lines, the test's own API errors).
    infra: Vec<String>,
    elapsed: Duration,
}

/// One side of one pass: its run tag, driver, PD controller and attacher.
struct SideCtx {
    client: Client,
    tag: String,
    driver: String,
    pd: PdController,
}

impl SideCtx {
    fn name(&self, scenario: &str, role: &str) -> String {
        format!("{}-{scenario}-{role}", self.tag)
    }

    /// Replaces this run's names by placeholders.
    fn normalize(&self, text: &str, va: Option<&str>) -> String {
        let mut out = text.to_string();
        if let Some(va) = va {
            out = out.replace(va, "<va>");
        }
        out.replace(&self.tag, "<run>")
    }
}

/// Four hex digits of the clock, distinct between passes of a run and runs.
fn token() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{:05x}", ms & 0xf_ffff)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn go_and_hub_agree_on_the_pd_controllers_answers() {
    let started = Instant::now();
    let cluster = Cluster::get();
    controller_manager(cluster);
    let table = table();
    let mut pass_no = 0;
    let (mut go, mut hub) = run_pass(cluster, &table, pass_no).await;
    let mut reruns = Vec::new();
    for attempt in 1..=MAX_RERUNS {
        let again: Vec<Scenario> = table
            .iter()
            .filter(|s| {
                let (g, h) = (find(&go, s.name), find(&hub, s.name));
                let hit = !g.infra.is_empty() || !h.infra.is_empty();
                hit && !differences(g, h).is_empty()
            })
            .cloned()
            .collect();
        if again.is_empty() {
            break;
        }
        for s in &again {
            let lines: Vec<String> = [find(&go, s.name), find(&hub, s.name)]
                .iter()
                .flat_map(|o| o.infra.iter().map(|l| format!("    {l}")))
                .collect();
            reruns.push(format!(
                "{}: outcomes differed after an infrastructure error; run {} of {}:\n{}",
                s.name,
                attempt + 1,
                MAX_RERUNS + 1,
                lines.join("\n")
            ));
        }
        pass_no += 1;
        let (g, h) = run_pass(cluster, &again, pass_no).await;
        for o in g {
            replace(&mut go, o);
        }
        for o in h {
            replace(&mut hub, o);
        }
    }

    let mut report = format!(
        "{:<26} {:>6} {:>6}  {:<9} outcome (Go, last checkpoint)\n",
        "scenario", "go s", "hub s", "verdict"
    );
    let mut failures = Vec::new();
    for s in &table {
        let (g, h) = (find(&go, s.name), find(&hub, s.name));
        let diffs = differences(g, h);
        let summary = g
            .checkpoints
            .last()
            .map_or("-".to_string(), |(label, snap)| {
                format!("[{label}] {}", summary(snap))
            });
        report.push_str(&format!(
            "{:<26} {:>6.1} {:>6.1}  {:<9} {summary}\n",
            s.name,
            g.elapsed.as_secs_f64(),
            h.elapsed.as_secs_f64(),
            if diffs.is_empty() {
                "same"
            } else {
                "DIFFERENT"
            },
        ));
        if !diffs.is_empty() {
            failures.push(format!(
                "scenario {} ({}):\n  {}",
                s.name,
                s.intent,
                diffs.join("\n  ")
            ));
        }
        if let Some(wrong) = unexpected(s, g) {
            failures.push(format!(
                "scenario {} ({}) does not show what it is for: {wrong}",
                s.name, s.intent
            ));
        }
    }
    println!("{report}");
    println!(
        "pd differential: {} scenarios in {:.1}s",
        table.len(),
        started.elapsed().as_secs_f64()
    );
    if !reruns.is_empty() {
        println!(
            "run again after an infrastructure error (the last run decides):\n{}",
            reruns.join("\n")
        );
    }
    assert!(
        failures.is_empty(),
        "Go csi-attacher and attacher-hub differ against the PD controller:\n\n{}",
        failures.join("\n\n")
    );
}

fn find<'a>(all: &'a [Outcome], scenario: &str) -> &'a Outcome {
    all.iter()
        .find(|o| o.scenario == scenario)
        .unwrap_or_else(|| panic!("no outcome for {scenario}"))
}

fn replace(all: &mut [Outcome], new: Outcome) {
    if let Some(slot) = all.iter_mut().find(|o| o.scenario == new.scenario) {
        *slot = new;
    }
}

/// Whether the reference's outcome is the one the scenario is for (so that
/// agreement is not agreement on a broken set-up): `None` if it is.
fn unexpected(s: &Scenario, go: &Outcome) -> Option<String> {
    let at = |label: &str, key: &str| {
        go.checkpoints
            .iter()
            .find(|c| c.0 == label)
            .and_then(|c| c.1.get(key).cloned())
            .unwrap_or_default()
    };
    if go.failure.is_some() {
        return None; // reported as a difference already
    }
    let attach = match s.publish {
        None => at("attach", "va.attached") == "true",
        Some(code) => at("attach", "va.attachError.errorCode") == code.to_string(),
    };
    // external-attacher sets no errorCode on detach errors: the message says it.
    let detach = match s.unpublish {
        None => at("detach", "va.exists") == "false",
        Some(code) => at("detach", "va.detachError.message").starts_with(&format!(
            "rpc error: code = {:?} ",
            tonic::Code::from_i32(code)
        )),
    };
    (!attach || !detach).then(|| {
        format!(
            "expected publish {:?} and unpublish {:?} (None: accepted), the Go run shows {:?}",
            s.publish, s.unpublish, go.checkpoints
        )
    })
}

/// A one-line summary of a snapshot for the report.
fn summary(snap: &Snapshot) -> String {
    let get = |k: &str| snap.get(k).map_or("", String::as_str);
    if get("va.exists") == "false" {
        return "VA gone".to_string();
    }
    let mut s = format!("attached={}", get("va.attached"));
    for key in ["va.attachError.errorCode", "va.detachError.errorCode"] {
        if !get(key).is_empty() {
            s.push_str(&format!(" {}={}", key.trim_start_matches("va."), get(key)));
        }
    }
    for key in ["va.attachError.message", "va.detachError.message"] {
        let m = get(key);
        if !m.is_empty() {
            let short: String = m.chars().take(70).collect();
            s.push_str(&format!(" {short:?}"));
        }
    }
    s
}

/// Differences between the Go and hub outcomes of one scenario.
fn differences(go: &Outcome, hub: &Outcome) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(f) = &go.failure {
        out.push(format!("the Go run did not complete: {f}"));
    }
    if let Some(f) = &hub.failure {
        out.push(format!("the hub run did not complete: {f}"));
    }
    let labels = |o: &Outcome| {
        o.checkpoints
            .iter()
            .map(|c| c.0.clone())
            .collect::<Vec<_>>()
    };
    if labels(go) != labels(hub) {
        out.push(format!(
            "checkpoints differ: Go {:?}, hub {:?}",
            labels(go),
            labels(hub)
        ));
    }
    for ((label, g), (_, h)) in go.checkpoints.iter().zip(&hub.checkpoints) {
        let keys: BTreeSet<&String> = g.keys().chain(h.keys()).collect();
        for k in keys {
            let (gv, hv) = (g.get(k), h.get(k));
            if gv != hv {
                out.push(format!("[{label}] {k}: Go {gv:?}, hub {hv:?}"));
            }
        }
    }
    out
}

/// Runs `scenarios` once on both sides at the same time.
async fn run_pass(
    cluster: &'static Cluster,
    scenarios: &[Scenario],
    pass_no: usize,
) -> (Vec<Outcome>, Vec<Outcome>) {
    let t = token();
    tokio::join!(
        run_side(cluster, Side::Go, scenarios, format!("go{t}{pass_no}")),
        run_side(cluster, Side::Hub, scenarios, format!("hub{t}{pass_no}")),
    )
}

/// One side: a PD controller and an attacher for every scenario, run concurrently.
async fn run_side(
    cluster: &'static Cluster,
    side: Side,
    scenarios: &[Scenario],
    tag: String,
) -> Vec<Outcome> {
    let driver = format!("{tag}.pd.csi.test");
    let pd = PdController::start(cluster, &driver, PdOptions::default()).await;
    let which = match side {
        Side::Go => Attacher::Go,
        Side::Hub => Attacher::HubSidecar,
    };
    let mut attachers = start_attachers(
        cluster,
        which,
        &[(driver.clone(), pd.socket().to_path_buf())],
        FLAGS,
    );
    let ctx = Arc::new(SideCtx {
        client: cluster.client().await,
        tag: tag.clone(),
        driver,
        pd,
    });
    let tasks: Vec<_> = scenarios
        .iter()
        .cloned()
        .map(|s| {
            let ctx = Arc::clone(&ctx);
            tokio::spawn(async move {
                let started = Instant::now();
                let mut checkpoints = Vec::new();
                let result = run_scenario(&ctx, &s, &mut checkpoints).await;
                (checkpoints, result, started.elapsed())
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for (s, task) in scenarios.iter().zip(tasks) {
        let (checkpoints, failure, elapsed) = match task.await {
            Ok((c, Ok(()), e)) => (c, None, e),
            Ok((c, Err(e), el)) => (c, Some(e), el),
            Err(e) => (Vec::new(), Some(panic_text(e)), Duration::ZERO),
        };
        outcomes.push(Outcome {
            scenario: s.name.to_string(),
            checkpoints,
            failure,
            infra: Vec::new(),
            elapsed,
        });
    }
    attachers.stop().await;
    let log = attachers.log();
    let names: Vec<String> = scenarios.iter().map(|s| s.name.to_string()).collect();
    let mut infra = infra::by_scenario(side, &log, &tag, &names);
    for o in &mut outcomes {
        o.infra = infra.remove(&o.scenario).unwrap_or_default();
        if let Some(f) = &o.failure
            && infra::is_infra_failure(f)
        {
            o.infra.push(format!("the test's own API call: {f}"));
        }
    }
    for s in scenarios {
        cleanup(&ctx, s).await;
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pd-differential");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{tag}.log")), &log);
    outcomes
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
            .unwrap_or_else(|| "panic".to_string()),
        Err(e) => e.to_string(),
    }
}

/// The scenario's objects, named for this run.
struct Names {
    node: String,
    disk: String,
    volume: String,
    pod: String,
    other: String,
}

fn names(ctx: &SideCtx, s: &Scenario) -> Names {
    Names {
        node: ctx.name(s.name, "n"),
        disk: ctx.name(s.name, "d"),
        volume: ctx.name(s.name, "v"),
        pod: ctx.name(s.name, "p"),
        other: ctx.name(s.name, "x"),
    }
}

/// Runs one scenario, pushing its checkpoints; an error (or a panic, caught
/// by the caller) says why it could not complete.
async fn run_scenario(
    ctx: &SideCtx,
    s: &Scenario,
    checkpoints: &mut Vec<(String, Snapshot)>,
) -> Result<(), String> {
    let n = names(ctx, s);
    let client = &ctx.client;
    if s.instance {
        ctx.pd.create_instance(&n.node).await;
    }
    if s.disk {
        ctx.pd.create_disk(&n.disk).await;
    }
    match s.before {
        Before::Nothing => {}
        Before::InUseElsewhere => {
            ctx.pd.create_instance(&n.other).await;
            ctx.pd.attach(&n.other, &n.disk, "READ_WRITE").await;
        }
        Before::ReadOnlyHere => ctx.pd.attach(&n.node, &n.disk, "READ_ONLY").await,
    }
    create_managed_node(client, &n.node, &[(PD_TOPOLOGY_KEY, PD_ZONE)]).await;
    let node_id = s
        .node_id
        .map_or_else(|| PdController::node_id(&n.node), str::to_string);
    create_csinode_with(
        client,
        &n.node,
        &[NodeDriver::new(&ctx.driver, &node_id).topology_key(PD_TOPOLOGY_KEY)],
    )
    .await;
    let handle = s.handle.map_or_else(
        || PdController::volume_id(&n.disk),
        |h| h.replace("{disk}", &n.disk),
    );
    let mut volume = StaticVolume::new(
        &n.volume,
        Source::Csi {
            driver: ctx.driver.clone(),
            volume_handle: handle.clone(),
            read_only: s.read_only,
            volume_attributes: s
                .attributes
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
    )
    .access_modes(s.access_modes);
    if s.block {
        volume = volume.volume_mode("Block");
    }
    volume.create(client).await;
    create_pod(
        client,
        &n.pod,
        &n.node,
        &[PodVolume::Claim {
            claim: n.volume.clone(),
            read_only: s.read_only,
        }],
    )
    .await;

    // Checkpoint 1: attached, or refused for good.
    let va = wait_settled(ctx, &n.node, Phase::Attach)
        .await?
        .expect("an attach settles with a VA");
    let va_name = va.metadata.name.clone().unwrap_or_default();
    if va.status.as_ref().is_some_and(|st| st.attached) {
        // Attached: wait until kube-controller-manager has seen it.
        wait_until(|| async {
            volumes_attached(client, &n.node)
                .await
                .contains(&unique_volume_name(&ctx.driver, &handle))
        })
        .await
        .map_err(|()| "the attached volume never reached node.status".to_string())?;
    }
    checkpoints.push((
        "attach".to_string(),
        snapshot(ctx, s, &n, &handle, &va_name).await,
    ));

    match s.then {
        Then::Nothing => {}
        Then::DeleteDisk => ctx.pd.delete_disk(&n.disk).await,
        Then::DeleteInstance => ctx.pd.delete_instance(&n.node).await,
    }

    // Checkpoint 2: the Pod deleted; the VA gone, or stuck with a detach error.
    // Heartbeats tell kube-controller-manager that nothing is mounted (a
    // volume whose attach failed is otherwise assumed mounted for 6 minutes);
    // a kubelet posts them, here the waiting loop does.
    support::delete_pod(client, &n.pod, PEER_TIMEOUT).await;
    let heartbeats = {
        let (client, node) = (client.clone(), n.node.clone());
        tokio::spawn(async move {
            loop {
                support::kubelet_heartbeat(&client, &node).await;
                tokio::time::sleep(HEARTBEAT).await;
            }
        })
    };
    let gone = wait_settled(ctx, &n.node, Phase::Detach).await;
    heartbeats.abort();
    gone?;
    checkpoints.push((
        "detach".to_string(),
        snapshot(ctx, s, &n, &handle, &va_name).await,
    ));
    Ok(())
}

/// Which end a checkpoint waits for.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// The VA attached, or its `attachError` kept.
    Attach,
    /// The VA gone, or its `detachError` kept.
    Detach,
}

impl Phase {
    /// Whether `va` shows the phase's success.
    fn done(self, va: Option<&VolumeAttachment>) -> bool {
        match self {
            Phase::Attach => va.is_some_and(|va| va.status.as_ref().is_some_and(|st| st.attached)),
            Phase::Detach => va.is_none(),
        }
    }

    /// The phase's error on `va`: its message and when it was written.
    fn error(self, va: Option<&VolumeAttachment>) -> Option<(String, Option<String>)> {
        let st = va?.status.as_ref()?;
        let e = match self {
            Phase::Attach => st.attach_error.as_ref(),
            Phase::Detach => st.detach_error.as_ref(),
        }?;
        Some((
            e.message.clone().unwrap_or_default(),
            e.time.as_ref().map(|t| t.0.to_string()),
        ))
    }
}

/// Waits for the VA of the scenario's Node to settle in `phase`: its success, or an error that
/// the attacher keeps, written again by a later retry with the same message. A first error
/// may be passing: the VA's watch event can reach an attacher before its PV's, and both
/// attachers then fail with "persistentvolume ... not found" once and succeed on the retry;
/// which error a side showed first is timing, not behaviour. Returns the VA (`None`: gone).
async fn wait_settled(
    ctx: &SideCtx,
    node: &str,
    phase: Phase,
) -> Result<Option<VolumeAttachment>, String> {
    let what = format!("{phase:?}: done, or an error");
    let mut va = wait_va(ctx, node, &what, |va| {
        phase.done(va) || phase.error(va).is_some()
    })
    .await?;
    loop {
        let Some((message, time)) = phase
            .error(va.as_ref())
            .filter(|_| !phase.done(va.as_ref()))
        else {
            return Ok(va);
        };
        // The next retry (at most --retry-interval-max away) writes the error again, with a
        // new time, or succeeds.
        let next = wait_va(ctx, node, &format!("{what} after {message:?}"), |now| {
            phase.done(now)
                || phase
                    .error(now)
                    .is_some_and(|(m, t)| m != message || t != time)
        })
        .await?;
        if phase
            .error(next.as_ref())
            .is_some_and(|(m, _)| m == message)
        {
            return Ok(next);
        }
        va = next;
    }
}

/// Polls the VA of the scenario's Node until `pred` holds; returns it.
async fn wait_va(
    ctx: &SideCtx,
    node: &str,
    what: &str,
    pred: impl Fn(Option<&VolumeAttachment>) -> bool,
) -> Result<Option<VolumeAttachment>, String> {
    let start = Instant::now();
    loop {
        let vas = vas_of(&ctx.client, &ctx.driver, node).await;
        if vas.len() > 1 {
            return Err(format!("{} VolumeAttachments on {node}", vas.len()));
        }
        let va = vas.into_iter().next();
        if pred(va.as_ref()) {
            return Ok(va);
        }
        if start.elapsed() > PEER_TIMEOUT {
            return Err(format!(
                "the VA on {node} was not {what} within {PEER_TIMEOUT:?}: {}",
                serde_json::to_string(&va).unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `cond` until it holds, at most [`PEER_TIMEOUT`].
async fn wait_until<F, Fut>(cond: F) -> Result<(), ()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        if start.elapsed() > PEER_TIMEOUT {
            return Err(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The normalized facts of a scenario now.
async fn snapshot(ctx: &SideCtx, s: &Scenario, n: &Names, handle: &str, va_name: &str) -> Snapshot {
    let norm = |t: &str| ctx.normalize(t, Some(va_name));
    let mut out = Snapshot::new();
    let va = vas_of(&ctx.client, &ctx.driver, &n.node)
        .await
        .into_iter()
        .next();
    out.insert("va.exists".into(), va.is_some().to_string());
    if let Some(va) = &va {
        let st = va.status.clone().unwrap_or_default();
        out.insert("va.attached".into(), st.attached.to_string());
        for (key, err) in [
            ("attachError", &st.attach_error),
            ("detachError", &st.detach_error),
        ] {
            if let Some(e) = err {
                out.insert(
                    format!("va.{key}.message"),
                    norm(e.message.as_deref().unwrap_or("")),
                );
                out.insert(
                    format!("va.{key}.errorCode"),
                    e.error_code.map_or(String::new(), |c| c.to_string()),
                );
            }
        }
        let mut finalizers = va.metadata.finalizers.clone().unwrap_or_default();
        finalizers.sort();
        out.insert("va.finalizers".into(), norm(&finalizers.join(",")));
        let annotations: Vec<String> = va
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.insert("va.annotations".into(), norm(&annotations.join(",")));
        out.insert(
            "va.metadata".into(),
            norm(&format!(
                "attacher={} node={}",
                va.spec.attacher, va.spec.node_name
            )),
        );
    }
    let listed = volumes_attached(&ctx.client, &n.node)
        .await
        .contains(&unique_volume_name(&ctx.driver, handle));
    out.insert("node.status.volumesAttached".into(), listed.to_string());
    let attachments = ctx.pd.attachments().await;
    let mut cloud: Vec<String> = [&n.node, &n.other]
        .into_iter()
        .filter_map(|i| attachments.get(i).map(|l| (i, l)))
        .flat_map(|(i, l)| l.iter().map(move |a| format!("{i}:{}:{}", a.disk, a.mode)))
        .collect();
    cloud.sort();
    out.insert("cloud".into(), norm(&cloud.join(" ")));
    // The calls for this scenario's volume or node, consecutive repeats collapsed.
    let node_id = s
        .node_id
        .map_or_else(|| PdController::node_id(&n.node), str::to_string);
    let mut calls: Vec<String> = Vec::new();
    for c in ctx.pd.calls().await {
        if c.volume_id != handle && c.node_id != node_id {
            continue;
        }
        let line = norm(&format!(
            "{} node={} ro={} mode={} -> {} {}",
            c.method, c.node_id, c.readonly, c.access_mode, c.code, c.message
        ));
        if calls.last() != Some(&line) {
            calls.push(line);
        }
    }
    out.insert("calls".into(), calls.join(" | "));
    out
}

/// Removes what a scenario left: VAs and PVs stuck with a finalizer lose it.
async fn cleanup(ctx: &SideCtx, s: &Scenario) {
    let n = names(ctx, s);
    let strip = PatchParams::default();
    let no_finalizers = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    let vas = Api::<VolumeAttachment>::all(ctx.client.clone());
    for va in vas_of(&ctx.client, &ctx.driver, &n.node).await {
        let name = va.metadata.name.unwrap_or_default();
        let _ = vas.patch(&name, &strip, &no_finalizers).await;
        let _ = vas.delete(&name, &DeleteParams::default()).await;
    }
    let pvs = Api::<PersistentVolume>::all(ctx.client.clone());
    let _ = pvs.patch(&n.volume, &strip, &no_finalizers).await;
    delete_objects(
        &ctx.client,
        std::slice::from_ref(&n.pod),
        std::slice::from_ref(&n.volume),
        std::slice::from_ref(&n.node),
    )
    .await;
}
