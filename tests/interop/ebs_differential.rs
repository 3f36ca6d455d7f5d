//! Differential test against the AWS EBS CSI driver's own controller: its
//! ControllerPublish/Unpublish (`pkg/driver/controller.go` of v1.44.0, on our
//! in-memory EC2, `ebs-controller`) answer the reference Go external-attacher
//! v4.13.0 and attacher-hub (sidecar mode) in the same scenarios with the same
//! flags; the VolumeAttachments come from kube-controller-manager (Pods with
//! claims or inline volumes, nothing written by hand).
//!
//! What the driver does with EC2's answers (read in the pinned module): an
//! instance that DescribeInstances does not know is `cloud.ErrNotFound`, which
//! ControllerPublish answers NotFound "Volume ... not found"; every other
//! attach failure (the volume missing, in use by another instance, in another
//! zone, the instance out of attachment slots or of device names) is Internal,
//! quoting EC2's error; a capability other than single-node writer (or
//! multi-node multi-writer on a block volume) is InvalidArgument; and
//! ControllerUnpublish forgives a volume or instance that is gone and a volume
//! not attached there. In-tree `awsElasticBlockStore` PVs and inline volumes
//! are translated to `ebs.csi.aws.com` by kube-controller-manager and the
//! attachers (csi-translation-lib v0.37.2, `plugins/aws_ebs.go`: the handle is
//! the `vol-` ID of `aws://<zone>/<id>` or of a bare ID, with a `partition`
//! attribute; AWS EBS migration is complete, no CSINode annotation needed).
//!
//! Checkpoints wait for a settled state, never for the first one that passes
//! by: a VA is attached (and kube-controller-manager lists the volume in the
//! Node's status), or it carries the same `attachError` across at least two
//! more ControllerPublish answers and [`SETTLE_MIN`] (a transient error, such
//! as a PV the attacher's cache does not have yet, is replaced at the next
//! retry and never becomes an outcome), or the same error for
//! [`SETTLE_WITHOUT_CALLS`] if no call is made; after the Pods are deleted, the
//! VA is gone or its `detachError` settles the same way; after the claim and
//! the PV are deleted, the PV is gone or its finalizers stand unchanged for
//! [`SETTLE_WITHOUT_CALLS`]. EC2's request IDs are new for every request (as
//! on AWS), so error texts are compared, and settle, with them masked. At each
//! checkpoint, with the run's names replaced by placeholders: the VAs
//! (`attached`, `attachError` message and `errorCode`, `detachError`,
//! finalizers, annotations, source), the attacher's PV finalizer, the Node
//! status, the fake EC2's attachments of the scenario's instances (volume,
//! device, state), and per node the Controller(Un)Publish calls with their
//! answers (consecutive repeats collapsed: how often an attacher retries is
//! timing, not behaviour).
//!
//! The driver's name is a constant (`ebs.csi.aws.com`), so the two sides cannot
//! share the cluster at the same time: the Go side runs every scenario (all at
//! once, one attacher, one EBS controller), then the hub side. The rerun rule
//! of `infra.rs` applies: a scenario whose outcomes differ while either side
//! logged an infrastructure error (or the test's own API calls failed for such
//! a reason) runs again on both sides, at most twice more, and the report says
//! so; a real difference still fails.

use crate::peers;
use crate::support;

use crate::infra;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, Container, PersistentVolume, Pod, PodSpec, Volume,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use infra::Side;
use peers::{Attacher, PEER_TIMEOUT, start_attachers};
use support::ebs::{
    EBS_DEVICE_NAMES, EBS_DRIVER, EBS_OTHER_ZONE, EBS_TOPOLOGY_KEYS, EBS_ZONE, EbsController,
    EbsOptions, NewInstance, NewVolume,
};
use support::{
    Cluster, NAMESPACE, NodeDriver, PodVolume, Source, StaticVolume, controller_manager,
    create_csinode_with, create_managed_node, create_pod, delete_objects, unique_volume_name,
    vas_of, volumes_attached,
};

/// How often the test posts a Node's status in place of its kubelet.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// How often a scenario runs again after an infrastructure error.
const MAX_RERUNS: usize = 2;

/// The same flags for both attachers (with those of `start_attachers`):
/// retries capped low, so a refused scenario is retried several times while
/// its error settles.
const FLAGS: &[&str] = &["--retry-interval-start=1s", "--retry-interval-max=5s"];

/// An error is settled once it has stood this long with at least
/// [`SETTLE_RETRIES`] more ControllerPublish (or Unpublish) answers since it
/// first appeared (with `--retry-interval-max=5s`, two retries take at most
/// about 10 s, so the answers, not this, usually decide).
const SETTLE_MIN: Duration = Duration::from_secs(5);

/// See [`SETTLE_MIN`].
const SETTLE_RETRIES: usize = 2;

/// An error that no CSI call accompanies is settled after this long (six
/// retries at the capped interval).
const SETTLE_WITHOUT_CALLS: Duration = Duration::from_secs(30);

/// gRPC codes the EBS controller answers with (the reference's `errorCode`).
const NOT_FOUND: i32 = 5;
const INVALID_ARGUMENT: i32 = 3;
const INTERNAL: i32 = 13;

/// The volume in the fake EC2.
#[derive(Clone, Copy, Debug)]
enum Vol {
    /// None: never created.
    Missing,
    /// gp3 in the Nodes' zone.
    Gp3,
    /// io2 with Multi-Attach.
    Io2MultiAttach,
    /// gp3 in another zone than the Nodes'.
    OtherZone,
}

/// The Nodes' instances in the fake EC2.
#[derive(Clone, Copy, Debug)]
enum Inst {
    /// None: never launched.
    Missing,
    /// m5.large defaults (26 volume slots).
    Default,
    /// One volume slot, taken by another volume before the Pod comes.
    LimitReached,
    /// Every device name the driver could pick taken by the AMI's devices.
    NamesTaken,
}

/// How the volume reaches the Pod.
#[derive(Clone, Copy, Debug)]
enum Src {
    /// A CSI PV of `ebs.csi.aws.com`, handle the volume ID.
    Csi,
    /// An in-tree `awsElasticBlockStore` PV, `volumeID: aws://<zone>/<id>`,
    /// with the zone label.
    InTreeZoned,
    /// An in-tree PV with the bare volume ID, no label.
    InTreeBare,
    /// An inline `awsElasticBlockStore` volume in the Pod.
    Inline,
}

/// What is done out of band before the Pods come.
#[derive(Clone, Copy, Debug)]
enum Before {
    Nothing,
    /// The volume is attached to an instance outside the cluster.
    InUseElsewhere,
}

/// What is done out of band once the attach checkpoint is reached.
#[derive(Clone, Copy, Debug)]
enum Then {
    Nothing,
    /// EC2 detaches the volume behind the driver's back.
    DetachInCloud,
    /// The first Node's instance is terminated (EC2 detaches its volumes).
    TerminateInstance,
}

/// One scenario.
#[derive(Clone, Debug)]
struct Scenario {
    name: &'static str,
    intent: &'static str,
    volume: Vol,
    instance: Inst,
    src: Src,
    /// Nodes, one Pod each; the Pods come one after the other, each once the
    /// previous one's VA has settled.
    nodes: usize,
    access_modes: &'static [&'static str],
    block: bool,
    /// `csi.readOnly` of the PV and `readOnly` of the Pod's claim.
    read_only: bool,
    before: Before,
    then: Then,
    /// What ControllerPublish answers per Node: `None` accepts, `Some(code)`
    /// refuses (checked on the Go side: the reference).
    publish: &'static [Option<i32>],
    /// Text the reference's first refusal must contain (what the scenario is for).
    says: &'static str,
}

const BASE: Scenario = Scenario {
    name: "",
    intent: "",
    volume: Vol::Gp3,
    instance: Inst::Default,
    src: Src::Csi,
    nodes: 1,
    access_modes: &["ReadWriteOnce"],
    block: false,
    read_only: false,
    before: Before::Nothing,
    then: Then::Nothing,
    publish: &[None],
    says: "",
};

fn table() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "attach-detach",
            intent: "a gp3 volume on an instance: attached at the first device name, detached",
            ..BASE
        },
        Scenario {
            name: "read-only",
            intent: "csi.readOnly on a ReadWriteOnce volume: published readonly, EBS attaches it",
            read_only: true,
            ..BASE
        },
        Scenario {
            name: "read-only-many",
            intent: "ReadOnlyMany: MULTI_NODE_READER_ONLY is not an EBS capability, InvalidArgument",
            access_modes: &["ReadOnlyMany"],
            publish: &[Some(INVALID_ARGUMENT)],
            says: "Volume capability not supported",
            ..BASE
        },
        Scenario {
            name: "block",
            intent: "a raw block ReadWriteOnce volume: attached",
            block: true,
            ..BASE
        },
        Scenario {
            name: "io2-multi-attach",
            intent: "an io2 Multi-Attach volume, ReadWriteMany block, on two Nodes: attached to both",
            volume: Vol::Io2MultiAttach,
            nodes: 2,
            access_modes: &["ReadWriteMany"],
            block: true,
            publish: &[None, None],
            ..BASE
        },
        Scenario {
            name: "gp3-two-nodes",
            intent: "a gp3 volume, ReadWriteMany block, on two Nodes: EC2 refuses the second (VolumeInUse)",
            nodes: 2,
            access_modes: &["ReadWriteMany"],
            block: true,
            publish: &[None, Some(INTERNAL)],
            says: "VolumeInUse",
            ..BASE
        },
        Scenario {
            name: "multi-writer-mount",
            intent: "ReadWriteMany filesystem: multi-node multi-writer only for block, InvalidArgument",
            access_modes: &["ReadWriteMany"],
            publish: &[Some(INVALID_ARGUMENT)],
            says: "Volume capability not supported",
            ..BASE
        },
        Scenario {
            name: "volume-missing",
            intent: "no such volume: Internal (InvalidVolume.NotFound from AttachVolume); the detach is forgiven",
            volume: Vol::Missing,
            publish: &[Some(INTERNAL)],
            says: "InvalidVolume.NotFound",
            ..BASE
        },
        Scenario {
            name: "instance-missing",
            intent: "the Node's instance does not exist: NotFound (the driver says the volume); detach forgiven",
            instance: Inst::Missing,
            publish: &[Some(NOT_FOUND)],
            says: "not found",
            ..BASE
        },
        Scenario {
            name: "in-use-elsewhere",
            intent: "the volume is attached to another instance: Internal (VolumeInUse); the detach is forgiven, the other attachment stays",
            before: Before::InUseElsewhere,
            publish: &[Some(INTERNAL)],
            says: "VolumeInUse",
            ..BASE
        },
        Scenario {
            name: "other-zone",
            intent: "the volume is in another zone than the instance: Internal (InvalidVolume.ZoneMismatch)",
            volume: Vol::OtherZone,
            publish: &[Some(INTERNAL)],
            says: "InvalidVolume.ZoneMismatch",
            ..BASE
        },
        Scenario {
            name: "detached-in-cloud",
            intent: "attached, then detached by EC2 behind the driver's back: the unpublish finds it available and succeeds",
            then: Then::DetachInCloud,
            ..BASE
        },
        Scenario {
            name: "instance-terminated",
            intent: "attached, then the instance is terminated: the unpublish finds no instance and succeeds",
            then: Then::TerminateInstance,
            ..BASE
        },
        Scenario {
            name: "volume-limit",
            intent: "the instance's attachment slots are used up: Internal (AttachmentLimitExceeded)",
            instance: Inst::LimitReached,
            publish: &[Some(INTERNAL)],
            says: "AttachmentLimitExceeded",
            ..BASE
        },
        Scenario {
            name: "device-names-used-up",
            intent: "every device name of the instance is taken: Internal (no free device name), EC2 never asked",
            instance: Inst::NamesTaken,
            publish: &[Some(INTERNAL)],
            says: "could not get a free device name",
            ..BASE
        },
        Scenario {
            name: "in-tree-pv",
            intent: "an in-tree awsElasticBlockStore PV (aws://zone/vol-…, zone label): migrated to ebs.csi.aws.com, attached, detached",
            src: Src::InTreeZoned,
            ..BASE
        },
        Scenario {
            name: "in-tree-pv-bare-id",
            intent: "an in-tree PV with a bare vol-… ID and no zone label: migrated, attached, detached",
            src: Src::InTreeBare,
            ..BASE
        },
        Scenario {
            name: "in-tree-pv-missing",
            intent: "an in-tree PV of a volume that does not exist: the driver's Internal (InvalidVolume.NotFound)",
            src: Src::InTreeZoned,
            volume: Vol::Missing,
            publish: &[Some(INTERNAL)],
            says: "InvalidVolume.NotFound",
            ..BASE
        },
        Scenario {
            name: "in-tree-inline",
            intent: "a Pod's inline awsElasticBlockStore volume: the VA carries the translated spec, attached, detached",
            src: Src::Inline,
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

/// One side of one pass: its run tag, EBS controller and API client.
struct SideCtx {
    client: Client,
    tag: String,
    ebs: EbsController,
}

/// The scenario's objects, named for this run.
struct Names {
    /// Node names, also the instance IDs and the driver's node IDs.
    nodes: Vec<String>,
    /// The volume ID in EC2 (the CSI handle).
    volume: String,
    /// PV and claim.
    pv: String,
    /// One Pod per Node.
    pods: Vec<String>,
    /// An instance outside the cluster.
    other: String,
    /// A volume that takes the instance's last slot.
    filler: String,
}

impl SideCtx {
    fn names(&self, s: &Scenario) -> Names {
        let base = format!("{}-{}", self.tag, s.name);
        Names {
            nodes: (0..s.nodes).map(|i| format!("i-{base}-n{i}")).collect(),
            volume: format!("vol-{base}"),
            pv: format!("{base}-v"),
            pods: (0..s.nodes).map(|i| format!("{base}-p{i}")).collect(),
            other: format!("i-{base}-x"),
            filler: format!("vol-{base}-f"),
        }
    }

    /// Replaces this run's names by placeholders (`vas`: VA names, numbered)
    /// and EC2's request IDs by `<id>`.
    fn normalize(&self, text: &str, vas: &[String]) -> String {
        let mut out = without_request_ids(text);
        for (i, va) in vas.iter().enumerate() {
            if !va.is_empty() {
                out = out.replace(va, &format!("<va{i}>"));
            }
        }
        out.replace(&self.tag, "<run>")
    }
}

/// `text` with each EC2 request ID (`RequestID: <uuid>`, new for every
/// request, as on AWS) replaced by `<id>`.
fn without_request_ids(text: &str) -> String {
    const KEY: &str = "RequestID: ";
    const UUID_LEN: usize = 36;
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(KEY) {
        let (head, tail) = rest.split_at(at + KEY.len());
        out.push_str(head);
        let id = tail.get(..UUID_LEN).unwrap_or("");
        let uuid = id.len() == UUID_LEN
            && id.char_indices().all(|(i, c)| {
                if [8, 13, 18, 23].contains(&i) {
                    c == '-'
                } else {
                    c.is_ascii_hexdigit()
                }
            });
        if uuid {
            out.push_str("<id>");
            rest = &tail[UUID_LEN..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// Five hex digits of the clock, distinct between passes of a run and runs.
fn token() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{:05x}", ms & 0xf_ffff)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn go_and_hub_agree_on_the_ebs_controllers_answers() {
    let _ebs = support::ebs::turn().await;
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
    report(&table, &go, &hub, started, &reruns);
}

/// Prints the table and fails on a difference or on a reference outcome that
/// is not what its scenario is for.
fn report(
    table: &[Scenario],
    go: &[Outcome],
    hub: &[Outcome],
    started: Instant,
    reruns: &[String],
) {
    let mut text = format!(
        "{:<22} {:>6} {:>6}  {:<9} outcome (Go)\n",
        "scenario", "go s", "hub s", "verdict"
    );
    let mut failures = Vec::new();
    for s in table {
        let (g, h) = (find(go, s.name), find(hub, s.name));
        let diffs = differences(g, h);
        let summary = summary(g);
        text.push_str(&format!(
            "{:<22} {:>6.1} {:>6.1}  {:<9} {summary}\n",
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
    println!("{text}");
    println!(
        "ebs differential: {} scenarios in {:.1}s",
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
        "Go csi-attacher and attacher-hub differ against the EBS controller:\n\n{}",
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
    if go.failure.is_some() {
        return None; // reported as a difference already
    }
    let at = |label: &str, key: &str| {
        go.checkpoints
            .iter()
            .find(|c| c.0 == label)
            .and_then(|c| c.1.get(key).cloned())
            .unwrap_or_default()
    };
    let mut wrong = Vec::new();
    for (i, expected) in s.publish.iter().enumerate() {
        let ok = match expected {
            None => at("attach", &format!("n{i}.va.attached")) == "true",
            Some(code) => {
                at("attach", &format!("n{i}.va.attachError.errorCode")) == code.to_string()
                    && at("attach", &format!("n{i}.va.attachError.message")).contains(s.says)
            }
        };
        if !ok {
            wrong.push(format!(
                "node {i}: expected publish {expected:?} ({:?})",
                s.says
            ));
        }
        // Every EBS unpublish of these scenarios succeeds: the VA goes.
        if at("detach", &format!("n{i}.va.exists")) != "false" {
            wrong.push(format!("node {i}: the VA did not go"));
        }
    }
    if !matches!(s.src, Src::Inline) && at("pv-deleted", "pv.exists") != "false" {
        wrong.push("the deleted PV did not go".to_string());
    }
    (!wrong.is_empty()).then(|| {
        format!(
            "{}; the Go run shows {:?}",
            wrong.join(", "),
            go.checkpoints
        )
    })
}

/// A one-line summary of an outcome for the report: per checkpoint, what
/// each Node's VA shows (`ok`, gone, or the error's code and its gist) and
/// whether the PV went.
fn summary(o: &Outcome) -> String {
    let mut parts = Vec::new();
    for (label, snap) in &o.checkpoints {
        let get = |k: String| snap.get(&k).map_or("", String::as_str);
        let mut nodes = Vec::new();
        for i in 0.. {
            let exists = get(format!("n{i}.va.exists"));
            if exists.is_empty() {
                break;
            }
            let code = get(format!("n{i}.va.attachError.errorCode"));
            let detach = get(format!("n{i}.va.detachError.message"));
            nodes.push(if exists == "false" {
                "gone".to_string()
            } else if !detach.is_empty() {
                format!("detachError {}", gist(detach))
            } else if get(format!("n{i}.va.attached")) == "true" {
                "ok".to_string()
            } else {
                format!(
                    "{code} {}",
                    gist(get(format!("n{i}.va.attachError.message")))
                )
            });
        }
        if let Some(exists) = snap.get("pv.exists") {
            nodes.push(
                if exists == "false" {
                    "PV gone"
                } else {
                    "PV stays"
                }
                .to_string(),
            );
        }
        parts.push(format!("{label}: {}", nodes.join(", ")));
    }
    parts.join("; ")
}

/// The gist of an error text: EC2's error code if it quotes one, else the
/// start of its innermost cause.
fn gist(message: &str) -> String {
    if let Some(at) = message.find("api error ") {
        let rest = &message[at + "api error ".len()..];
        return rest.split(':').next().unwrap_or(rest).to_string();
    }
    let cause = message.rsplit(": ").next().unwrap_or(message);
    let cause = cause.split("desc = ").last().unwrap_or(cause);
    cause.chars().take(40).collect()
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

/// Runs `scenarios` on the Go side, then on the hub side (one driver name: not at once).
async fn run_pass(
    cluster: &'static Cluster,
    scenarios: &[Scenario],
    pass_no: usize,
) -> (Vec<Outcome>, Vec<Outcome>) {
    let t = token();
    let go = run_side(cluster, Side::Go, scenarios, format!("go{t}{pass_no}")).await;
    let hub = run_side(cluster, Side::Hub, scenarios, format!("hub{t}{pass_no}")).await;
    (go, hub)
}

/// One side: an EBS controller and an attacher for every scenario, run concurrently.
async fn run_side(
    cluster: &'static Cluster,
    side: Side,
    scenarios: &[Scenario],
    tag: String,
) -> Vec<Outcome> {
    let ebs = EbsController::start(cluster, EbsOptions::default()).await;
    let which = match side {
        Side::Go => Attacher::Go,
        Side::Hub => Attacher::HubSidecar,
    };
    let mut attachers = start_attachers(
        cluster,
        which,
        &[(EBS_DRIVER.to_string(), ebs.socket().to_path_buf())],
        FLAGS,
    );
    let ctx = Arc::new(SideCtx {
        client: cluster.client().await,
        tag: tag.clone(),
        ebs,
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
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ebs-differential");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{tag}.log")), &log);
    let _ = std::fs::write(
        dir.join(format!("{tag}.ebs-controller.log")),
        ctx.ebs.process.process.stderr(),
    );
    let checkpoints: BTreeMap<&str, _> = outcomes
        .iter()
        .map(|o| (o.scenario.as_str(), &o.checkpoints))
        .collect();
    let _ = std::fs::write(
        dir.join(format!("{tag}.outcomes.json")),
        serde_json::to_string_pretty(&checkpoints).unwrap_or_default(),
    );
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

/// The fake EC2 and the cluster objects of a scenario, up to (not including) the Pods.
async fn set_up(ctx: &SideCtx, s: &Scenario, n: &Names) -> Result<(), String> {
    let client = &ctx.client;
    match s.volume {
        Vol::Missing => {}
        Vol::Gp3 => ctx.ebs.create_volume(&n.volume, NewVolume::default()).await,
        Vol::Io2MultiAttach => {
            let io2 = NewVolume {
                volume_type: Some("io2".into()),
                multi_attach: true,
                ..NewVolume::default()
            };
            ctx.ebs.create_volume(&n.volume, io2).await;
        }
        Vol::OtherZone => {
            let other = NewVolume {
                zone: Some(EBS_OTHER_ZONE.into()),
                ..NewVolume::default()
            };
            ctx.ebs.create_volume(&n.volume, other).await;
        }
    }
    for node in &n.nodes {
        let instance = match s.instance {
            Inst::Missing => None,
            Inst::Default => Some(NewInstance::default()),
            Inst::LimitReached => Some(NewInstance {
                limit: Some(1),
                ..NewInstance::default()
            }),
            Inst::NamesTaken => Some(NewInstance {
                limit: Some(EBS_DEVICE_NAMES + 10),
                other_devices: EBS_DEVICE_NAMES,
                ..NewInstance::default()
            }),
        };
        if let Some(i) = instance {
            ctx.ebs.create_instance(node, i).await;
        }
        if matches!(s.instance, Inst::LimitReached) {
            ctx.ebs.create_volume(&n.filler, NewVolume::default()).await;
            ctx.ebs.attach(&n.filler, node).await?;
        }
        let labels: Vec<(&str, &str)> = EBS_TOPOLOGY_KEYS.iter().map(|k| (*k, EBS_ZONE)).collect();
        create_managed_node(client, node, &labels).await;
        let mut driver = NodeDriver::new(EBS_DRIVER, node);
        for key in EBS_TOPOLOGY_KEYS {
            driver = driver.topology_key(key);
        }
        create_csinode_with(client, node, &[driver]).await;
    }
    if let Before::InUseElsewhere = s.before {
        ctx.ebs
            .create_instance(&n.other, NewInstance::default())
            .await;
        ctx.ebs.attach(&n.volume, &n.other).await?;
    }
    match s.src {
        Src::Csi => csi_volume(s, n).create(client).await,
        Src::InTreeZoned | Src::InTreeBare => create_in_tree_pv(client, s, n).await,
        Src::Inline => {}
    }
    Ok(())
}

/// The CSI PV and claim of a scenario.
fn csi_volume(s: &Scenario, n: &Names) -> StaticVolume {
    let mut v = StaticVolume::new(
        &n.pv,
        Source::Csi {
            driver: EBS_DRIVER.to_string(),
            volume_handle: n.volume.clone(),
            read_only: s.read_only,
            volume_attributes: BTreeMap::new(),
        },
    )
    .access_modes(s.access_modes);
    if s.block {
        v = v.volume_mode("Block");
    }
    v
}

/// An in-tree `awsElasticBlockStore` PV and its claim.
async fn create_in_tree_pv(client: &Client, s: &Scenario, n: &Names) {
    let claim = csi_volume(s, n);
    let mut pv = claim.pv();
    let zoned = matches!(s.src, Src::InTreeZoned);
    if zoned {
        pv.metadata.labels = Some(BTreeMap::from([(
            "topology.kubernetes.io/zone".to_string(),
            EBS_ZONE.to_string(),
        )]));
    }
    let spec = pv.spec.as_mut().expect("StaticVolume::pv has a spec");
    spec.csi = None;
    spec.aws_elastic_block_store = Some(in_tree_source(&n.volume, zoned, s.read_only));
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap_or_else(|e| panic!("creating PV {}: {e}", n.pv));
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &claim.pvc())
        .await
        .unwrap_or_else(|e| panic!("creating PVC {}: {e}", n.pv));
}

/// An in-tree EBS source: `aws://<zone>/<id>` or the bare ID.
fn in_tree_source(volume: &str, zoned: bool, read_only: bool) -> AWSElasticBlockStoreVolumeSource {
    AWSElasticBlockStoreVolumeSource {
        volume_id: if zoned {
            format!("aws://{EBS_ZONE}/{volume}")
        } else {
            volume.to_string()
        },
        fs_type: Some("ext4".to_string()),
        read_only: read_only.then_some(true),
        ..AWSElasticBlockStoreVolumeSource::default()
    }
}

/// Pod `name` on `node` with the scenario's volume.
async fn create_scenario_pod(ctx: &SideCtx, s: &Scenario, n: &Names, name: &str, node: &str) {
    if !matches!(s.src, Src::Inline) {
        let claim = PodVolume::Claim {
            claim: n.pv.clone(),
            read_only: s.read_only,
        };
        create_pod(&ctx.client, name, node, &[claim]).await;
        return;
    }
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![Container {
                name: "app".to_string(),
                image: Some("registry.k8s.io/pause:3.10".to_string()),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: "v0".to_string(),
                aws_elastic_block_store: Some(in_tree_source(&n.volume, true, s.read_only)),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {name}: {e}"));
}

/// Runs one scenario, pushing its checkpoints; an error (or a panic, caught
/// by the caller) says why it could not complete.
async fn run_scenario(
    ctx: &SideCtx,
    s: &Scenario,
    checkpoints: &mut Vec<(String, Snapshot)>,
) -> Result<(), String> {
    let n = ctx.names(s);
    set_up(ctx, s, &n).await?;
    let mut vas = Vec::new();
    for (pod, node) in n.pods.iter().zip(&n.nodes) {
        create_scenario_pod(ctx, s, &n, pod, node).await;
        vas.push(settle_attach(ctx, &n, node).await?);
    }
    checkpoints.push(("attach".to_string(), snapshot(ctx, s, &n, &vas).await));

    let first = &n.nodes[0];
    match s.then {
        Then::Nothing => {}
        Then::DetachInCloud => ctx.ebs.detach(&n.volume, first).await?,
        Then::TerminateInstance => ctx.ebs.terminate_instance(first).await,
    }

    // The Pods go one at a time, the last Node's first, each once the
    // previous one's VA has settled: a refused VA on a later Node must not
    // still be retried when the first Node's detach frees the volume (a retry
    // landing in that window would attach it: timing, not behaviour).
    // Heartbeats tell kube-controller-manager that nothing is mounted (a
    // volume whose attach failed is otherwise assumed mounted for 6 minutes);
    // a kubelet posts them, here a task does.
    let heartbeats = {
        let (client, nodes) = (ctx.client.clone(), n.nodes.clone());
        tokio::spawn(async move {
            loop {
                for node in &nodes {
                    support::kubelet_heartbeat(&client, node).await;
                }
                tokio::time::sleep(HEARTBEAT).await;
            }
        })
    };
    let mut settled = Ok(());
    for (pod, node) in n.pods.iter().zip(&n.nodes).rev() {
        support::delete_pod(&ctx.client, pod, PEER_TIMEOUT).await;
        settled = settled.and(settle_detach(ctx, &n, node).await);
    }
    heartbeats.abort();
    settled?;
    checkpoints.push(("detach".to_string(), snapshot(ctx, s, &n, &vas).await));

    // Checkpoint 3 (a PV's scenarios): the claim and the PV deleted; the
    // attacher removes its PV finalizer once no VA names the PV (Go only for a
    // PV being deleted), and the PV goes.
    if !matches!(s.src, Src::Inline) {
        delete_objects(&ctx.client, &[], std::slice::from_ref(&n.pv), &[]).await;
        let pv = settle_pv_gone(ctx, &n.pv).await;
        checkpoints.push(("pv-deleted".to_string(), pv));
    }
    Ok(())
}

/// Waits until PV `name` is gone, or its finalizers have stood unchanged for
/// [`SETTLE_WITHOUT_CALLS`]; returns its facts then.
async fn settle_pv_gone(ctx: &SideCtx, name: &str) -> Snapshot {
    let api = Api::<PersistentVolume>::all(ctx.client.clone());
    let mut last: Option<(Vec<String>, Instant)> = None;
    loop {
        let pv = api
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("reading PV {name}: {e}"));
        let Some(pv) = pv else {
            return Snapshot::from([("pv.exists".to_string(), "false".to_string())]);
        };
        let mut finalizers = pv.metadata.finalizers.unwrap_or_default();
        finalizers.sort();
        match &last {
            Some((f, since)) if *f == finalizers => {
                if since.elapsed() >= SETTLE_WITHOUT_CALLS {
                    return Snapshot::from([
                        ("pv.exists".to_string(), "true".to_string()),
                        ("pv.finalizers".to_string(), finalizers.join(",")),
                    ]);
                }
            }
            _ => last = Some((finalizers, Instant::now())),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The one VA of `node`, if any; more than one is an error.
async fn the_va(ctx: &SideCtx, node: &str) -> Result<Option<VolumeAttachment>, String> {
    let vas = vas_of(&ctx.client, EBS_DRIVER, node).await;
    if vas.len() > 1 {
        return Err(format!("{} VolumeAttachments on {node}", vas.len()));
    }
    Ok(vas.into_iter().next())
}

/// How many `method` calls for the volume on `node` the driver has answered.
async fn answered(ctx: &SideCtx, method: &str, volume: &str, node: &str) -> usize {
    ctx.ebs
        .calls()
        .await
        .iter()
        .filter(|c| c.method == method && c.volume_id == volume && c.node_id == node)
        .count()
}

/// Tracks one error text while it stands, to tell when it has settled.
struct Settling {
    text: String,
    since: Instant,
    calls_then: usize,
}

impl Settling {
    /// Records `text` as seen now (with `calls` answered so far); true once
    /// the same text has settled (see [`SETTLE_MIN`], [`SETTLE_WITHOUT_CALLS`]).
    fn seen(slot: &mut Option<Settling>, text: &str, calls: usize) -> bool {
        match slot {
            Some(s) if s.text == text => {
                let age = s.since.elapsed();
                (age >= SETTLE_MIN && calls >= s.calls_then + SETTLE_RETRIES)
                    || age >= SETTLE_WITHOUT_CALLS
            }
            _ => {
                *slot = Some(Settling {
                    text: text.to_string(),
                    since: Instant::now(),
                    calls_then: calls,
                });
                false
            }
        }
    }
}

/// Waits until the VA of `node` is attached (and in the Node's status) or its
/// `attachError` has settled; returns the VA's name.
async fn settle_attach(ctx: &SideCtx, n: &Names, node: &str) -> Result<String, String> {
    let start = Instant::now();
    let mut error: Option<Settling> = None;
    loop {
        let va = the_va(ctx, node).await?;
        let status = va
            .as_ref()
            .and_then(|va| va.status.clone())
            .unwrap_or_default();
        let name = va
            .as_ref()
            .and_then(|va| va.metadata.name.clone())
            .unwrap_or_default();
        if status.attached {
            let handle = unique_volume_name(EBS_DRIVER, &n.volume);
            wait_until(|| async { volumes_attached(&ctx.client, node).await.contains(&handle) })
                .await
                .map_err(|()| format!("the attached volume never reached the status of {node}"))?;
            return Ok(name);
        }
        match status.attach_error.and_then(|e| e.message) {
            Some(text) => {
                let calls = answered(ctx, "ControllerPublishVolume", &n.volume, node).await;
                if Settling::seen(&mut error, &without_request_ids(&text), calls) {
                    return Ok(name);
                }
            }
            None => error = None,
        }
        if start.elapsed() > PEER_TIMEOUT {
            return Err(format!(
                "the VA on {node} neither attached nor settled on an error within {PEER_TIMEOUT:?}: {}",
                serde_json::to_string(&va).unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the VA of `node` is gone or its `detachError` has settled.
async fn settle_detach(ctx: &SideCtx, n: &Names, node: &str) -> Result<(), String> {
    let start = Instant::now();
    let mut error: Option<Settling> = None;
    loop {
        let Some(va) = the_va(ctx, node).await? else {
            return Ok(());
        };
        let detach_error = va.status.as_ref().and_then(|s| s.detach_error.clone());
        match detach_error.and_then(|e| e.message) {
            Some(text) => {
                let calls = answered(ctx, "ControllerUnpublishVolume", &n.volume, node).await;
                if Settling::seen(&mut error, &without_request_ids(&text), calls) {
                    return Ok(());
                }
            }
            None => error = None,
        }
        if start.elapsed() > PEER_TIMEOUT {
            return Err(format!(
                "the VA on {node} neither went nor settled on an error within {PEER_TIMEOUT:?}: {}",
                serde_json::to_string(&va).unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The attacher's finalizers on PV `name` (those named `external-attacher/…`).
async fn attacher_pv_finalizers(client: &Client, name: &str) -> Vec<String> {
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading PV {name}: {e}"));
    let mut out: Vec<String> = pv
        .and_then(|pv| pv.metadata.finalizers)
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.starts_with("external-attacher/"))
        .collect();
    out.sort();
    out
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

/// The normalized facts of a scenario now (`vas`: the VA names, per node).
async fn snapshot(ctx: &SideCtx, s: &Scenario, n: &Names, vas: &[String]) -> Snapshot {
    let norm = |t: &str| ctx.normalize(t, vas);
    let mut out = Snapshot::new();
    for (i, node) in n.nodes.iter().enumerate() {
        let p = format!("n{i}.");
        let va = vas_of(&ctx.client, EBS_DRIVER, node)
            .await
            .into_iter()
            .next();
        out.insert(format!("{p}va.exists"), va.is_some().to_string());
        if let Some(va) = &va {
            for (k, v) in va_facts(va) {
                out.insert(format!("{p}{k}"), norm(&v));
            }
        }
        let listed = volumes_attached(&ctx.client, node)
            .await
            .contains(&unique_volume_name(EBS_DRIVER, &n.volume));
        out.insert(
            format!("{p}node.status.volumesAttached"),
            listed.to_string(),
        );
    }
    if !matches!(s.src, Src::Inline) {
        let finalizers = attacher_pv_finalizers(&ctx.client, &n.pv).await;
        out.insert("pv.finalizers".into(), finalizers.join(","));
    }
    let attachments = ctx.ebs.attachments().await;
    let mut cloud: Vec<String> = n
        .nodes
        .iter()
        .chain([&n.other])
        .filter_map(|i| attachments.get(i).map(|l| (i, l)))
        .flat_map(|(i, l)| {
            l.iter()
                .map(move |a| format!("{i}:{}:{}:{}", a.volume, a.device, a.state))
        })
        .collect();
    cloud.sort();
    out.insert("cloud".into(), norm(&cloud.join(" ")));
    // Per node, the calls for the scenario's volume, consecutive repeats collapsed.
    let calls = ctx.ebs.calls().await;
    for (i, node) in n.nodes.iter().enumerate() {
        let mut lines: Vec<String> = Vec::new();
        for c in calls
            .iter()
            .filter(|c| &c.node_id == node && c.volume_id == n.volume)
        {
            let line = norm(&format!(
                "{} ro={} mode={} block={} -> {} {} {}",
                c.method, c.readonly, c.access_mode, c.block, c.code, c.message, c.device_path
            ));
            if lines.last() != Some(&line) {
                lines.push(line);
            }
        }
        out.insert(format!("n{i}.calls"), lines.join(" | "));
    }
    out
}

/// The compared facts of one VA (not normalized).
fn va_facts(va: &VolumeAttachment) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let st = va.status.clone().unwrap_or_default();
    out.push(("va.attached".to_string(), st.attached.to_string()));
    for (key, err) in [
        ("attachError", &st.attach_error),
        ("detachError", &st.detach_error),
    ] {
        if let Some(e) = err {
            out.push((
                format!("va.{key}.message"),
                e.message.clone().unwrap_or_default(),
            ));
            out.push((
                format!("va.{key}.errorCode"),
                e.error_code.map_or(String::new(), |c| c.to_string()),
            ));
        }
    }
    let mut finalizers = va.metadata.finalizers.clone().unwrap_or_default();
    finalizers.sort();
    out.push(("va.finalizers".to_string(), finalizers.join(",")));
    let annotations: Vec<String> = va
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    out.push(("va.annotations".to_string(), annotations.join(",")));
    let source = &va.spec.source;
    let inline = source
        .inline_volume_spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| format!("{}^{} {:?}", c.driver, c.volume_handle, c.volume_attributes))
        .unwrap_or_default();
    out.push((
        "va.spec".to_string(),
        format!(
            "attacher={} node={} pv={} inline={inline}",
            va.spec.attacher,
            va.spec.node_name,
            source.persistent_volume_name.as_deref().unwrap_or("")
        ),
    ));
    out
}

/// Removes what a scenario left: VAs and PVs stuck with a finalizer lose it.
async fn cleanup(ctx: &SideCtx, s: &Scenario) {
    let n = ctx.names(s);
    let strip = PatchParams::default();
    let no_finalizers = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    let vas = Api::<VolumeAttachment>::all(ctx.client.clone());
    for node in &n.nodes {
        for va in vas_of(&ctx.client, EBS_DRIVER, node).await {
            let name = va.metadata.name.unwrap_or_default();
            let _ = vas.patch(&name, &strip, &no_finalizers).await;
            let _ = vas.delete(&name, &DeleteParams::default()).await;
        }
    }
    let pvs = Api::<PersistentVolume>::all(ctx.client.clone());
    let _ = pvs.patch(&n.pv, &strip, &no_finalizers).await;
    delete_objects(&ctx.client, &n.pods, std::slice::from_ref(&n.pv), &n.nodes).await;
}
