//! The scenario table of the differential test.
//!
//! A scenario is data: the objects it creates at its start and the steps it
//! then takes (waits, deletions, fault changes, snapshots). Object names are
//! *roles* (`"pv"`, `"va"`, `"n0"`, ...); the runner turns them into names
//! unique to one run. Every scenario of a batch gets its own mock volume,
//! `vol-<index in the batch>`, so scenarios of a batch never share a volume
//! and the volume IDs are the same in the Go run and the hub run.
//!
//! Scenarios are grouped into batches by what they need from the mock driver
//! (its capabilities) and from the attacher (its flags); a batch gets one mock
//! and one attacher process per implementation.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use mock_csi_driver::{self as mock, fault::Fault};

/// Where the driver name of a batch comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum DriverName {
    /// A fresh unique name per run, so the Go run and the hub run of the
    /// batch can run at the same time without seeing each other's objects.
    Unique,
    /// A fixed name (a CSI-migration target). The Go run and the hub run of
    /// such a batch must not overlap: the runner runs them one after the other.
    Fixed(&'static str),
}

/// Scenarios sharing one mock driver and one attacher per implementation.
pub(crate) struct Batch {
    /// Short name, used in reports.
    pub(crate) name: &'static str,
    /// What the mock advertises.
    pub(crate) capabilities: mock::Capabilities,
    /// Driver name policy.
    pub(crate) driver: DriverName,
    /// `--reconcile-sync` for this batch's attachers.
    pub(crate) reconcile_sync: &'static str,
    /// Run the scenarios one after another (they change mock-wide faults)
    /// rather than all at once.
    pub(crate) sequential: bool,
    /// The scenarios.
    pub(crate) scenarios: Vec<Scenario>,
}

/// One row of the table.
pub(crate) struct Scenario {
    /// Unique within the table; part of object names, so DNS-safe.
    pub(crate) name: String,
    /// What the scenario shows, for readers of the table and the report.
    pub(crate) intent: &'static str,
    /// A mock-wide fault set before anything is created (sequential batches only).
    pub(crate) start_fault: Option<(&'static str, Fault)>,
    /// Objects created, in this order, when the scenario starts.
    pub(crate) setup: Vec<Obj>,
    /// What happens then, in order.
    pub(crate) steps: Vec<Step>,
    /// A difference between Go and the hub that has been reported to the
    /// owner and is not fixed yet: mismatches are listed, not failed.
    pub(crate) known_difference: Option<&'static str>,
}

/// Objects a scenario creates.
pub(crate) enum Obj {
    /// A CSINode for node role `node`.
    CsiNode {
        node: &'static str,
        /// Which driver entry it has.
        entry: NodeEntry,
    },
    /// A Secret in namespace `default` with these data.
    Secret {
        name: &'static str,
        data: &'static [(&'static str, SecretValue)],
    },
    /// A PersistentVolume.
    Pv(PvObj),
    /// A VolumeAttachment on node role `node`.
    Va {
        name: &'static str,
        node: &'static str,
        source: VaSource,
        /// `spec.attacher` names another driver, for which no attacher runs.
        foreign: bool,
    },
    /// A volume created in the mock with CreateVolume, for handles that are
    /// not `vol-N` (translated in-tree volumes). The handle is a template
    /// (see [`Obj::Pv`]'s annotations).
    MockVolume { handle: &'static str },
}

/// A value of a Secret's `data`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SecretValue {
    /// UTF-8 text.
    Text(&'static str),
    /// Raw bytes (which need not be UTF-8).
    Bytes(&'static [u8]),
    /// `len` copies of one byte.
    Filled { byte: u8, len: usize },
}

impl SecretValue {
    pub(crate) fn bytes(self) -> Vec<u8> {
        match self {
            SecretValue::Text(t) => t.as_bytes().to_vec(),
            SecretValue::Bytes(b) => b.to_vec(),
            SecretValue::Filled { byte, len } => vec![byte; len],
        }
    }
}

/// A PersistentVolume to create.
///
/// Strings marked *template* may use `{driver}` (this batch's driver),
/// `{foreign}` (the other driver), `{finalizer}` and `{foreign-finalizer}`
/// (their attacher finalizers) and `{name:ROLE}` (the object name of a role).
pub(crate) struct PvObj {
    pub(crate) name: &'static str,
    pub(crate) source: PvSource,
    /// Create it, then delete it, so that it exists with a deletionTimestamp
    /// (held by `finalizers`, or by an extra `test/keep` if there are none).
    pub(crate) deleting: bool,
    /// Finalizers it is created with (templates).
    pub(crate) finalizers: &'static [&'static str],
    pub(crate) labels: &'static [(&'static str, &'static str)],
    /// Annotations (values are templates).
    pub(crate) annotations: &'static [(&'static str, &'static str)],
}

/// A PV with no extras.
pub(crate) fn pv_obj(name: &'static str, source: PvSource) -> PvObj {
    PvObj {
        name,
        source,
        deleting: false,
        finalizers: &[],
        labels: &[],
        annotations: &[],
    }
}

/// The driver entry of a CSINode.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NodeEntry {
    /// This batch's driver, node ID `nid-<scenario>-<node role>`.
    OurDriver,
    /// This batch's driver under another node ID,
    /// `nid-<scenario>-<node role>-<suffix>` (the node plugin re-registered).
    OurDriverAs(&'static str),
    /// Only some other driver: the node plugin of ours is not registered.
    OtherDriverOnly,
}

/// The volume source of a PV.
pub(crate) enum PvSource {
    /// A CSI source of this batch's driver, volume handle `vol-<index>`.
    Csi(CsiSpec),
    /// A hostPath volume: neither CSI nor migratable.
    HostPath,
    /// An in-tree volume: the spec's volume source and access modes (and
    /// volume mode and claimRef if set) are used; the rest is the default.
    InTree(Box<PersistentVolumeSpec>),
}

/// What a VA attaches.
pub(crate) enum VaSource {
    /// `spec.source.persistentVolumeName` = the PV of this role (which need
    /// not exist).
    Pv(&'static str),
    /// `spec.source.inlineVolumeSpec` with a CSI source.
    Inline(CsiSpec),
}

/// The CSI part of a PV or inline volume spec, and its access modes and mode.
#[derive(Clone, Debug, Default)]
pub(crate) struct CsiSpec {
    pub(crate) access_modes: &'static [&'static str],
    pub(crate) block: bool,
    pub(crate) read_only: Option<bool>,
    pub(crate) fs_type: Option<&'static str>,
    /// Role of the controller-publish Secret (namespace `default`).
    pub(crate) secret: Option<&'static str>,
    pub(crate) attributes: &'static [(&'static str, &'static str)],
    /// Volume handle (template); `None`: the scenario's `vol-<index>`.
    pub(crate) handle: Option<&'static str>,
}

/// A step of a scenario.
pub(crate) enum Step {
    /// Wait until the VA of this role is in this state.
    Wait(&'static str, VaState),
    /// Wait until the PV of this role is in this state.
    WaitPv(&'static str, PvState),
    /// Wait until the mock has answered a ControllerPublishVolume of the VA's
    /// volume and node with OK after a ControllerUnpublishVolume of them.
    WaitRepublished(&'static str),
    /// Wait until the mock has answered a call of this method to the node ID
    /// of this node role and entry with this code (`Ok`, `Internal`, ...).
    WaitCall {
        node: &'static str,
        entry: NodeEntry,
        method: &'static str,
        code: &'static str,
    },
    /// Let a fixed time pass (for "nothing else happens" checks).
    Pause(Duration),
    /// Record a normalized snapshot under this label.
    Snapshot(&'static str),
    /// Create an object (a VA re-created under the same name, a CSINode that
    /// appears late, ...).
    Create(Obj),
    DeleteVa(&'static str),
    DeletePv(&'static str),
    /// Delete the CSINode of this node role (node gone).
    DeleteCsiNode(&'static str),
    /// Replace the data of the Secret of this role.
    SetSecret(&'static str, &'static [(&'static str, SecretValue)]),
    DeleteSecret(&'static str),
    /// Set a mock-wide fault on a CSI method.
    Fault(&'static str, Fault),
    ClearFaults,
    /// Call ControllerUnpublishVolume for this VA's volume and node directly
    /// on the mock, behind the attacher's back.
    UnpublishBehindBack(&'static str),
}

/// States of a VA to wait for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum VaState {
    /// `status.attached == true`.
    Attached,
    /// `status.attachError.message` contains this text, and still does
    /// after a pause.
    ///
    /// Right after an attach adds the PV finalizer, the next attempt (in
    /// either attacher) may still see the PV without it in its cache, add it
    /// again and fail on the JSON Patch's `test` (a 422, "could not add
    /// PersistentVolume finalizer"). Which of the two errors a snapshot
    /// catches then is a matter of timing; the error that stays is not.
    AttachError(&'static str),
    /// `status.detachError.message` contains this text.
    DetachError(&'static str),
    /// The VA carries this batch's attacher finalizer (the attacher's first write of an
    /// attach, made right before it calls ControllerPublishVolume).
    Finalized,
    /// The VA no longer exists.
    Gone,
}

/// States of a PV to wait for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PvState {
    /// The PV no longer exists.
    Gone,
    /// The PV exists without this batch's attacher finalizer.
    Released,
}

const PUBLISH: &str = "ControllerPublishVolume";
const UNPUBLISH: &str = "ControllerUnpublishVolume";

/// Long enough for anything on a shared two-core machine: the differential
/// checks *what* happens, not how fast.
const SETTLE: Duration = Duration::from_secs(2);

/// Set while attacher-hub is known (and reported) to repeat a successful
/// ControllerPublishVolume on some attaches: such repeats are then listed as
/// known differences instead of failing the test. `None`: they fail it.
pub(crate) const KNOWN_DUPLICATE_PUBLISH: Option<&str> = None;

/// The whole table.
pub(crate) fn table() -> Vec<Batch> {
    vec![
        default_batch(),
        snmw_batch(),
        trivial_batch(),
        faults_batch(),
        reconciler_batch(),
        lifecycle_batch(),
        secrets_batch(),
    ]
    .into_iter()
    .chain(in_tree_batches())
    .collect()
}

/// The name of the migration target whose batch runs with a fixed driver name.
pub(crate) const GCE_PD_DRIVER: &str = "pd.csi.storage.gke.io";

fn csi(access_modes: &'static [&'static str]) -> CsiSpec {
    CsiSpec {
        access_modes,
        ..CsiSpec::default()
    }
}

/// CSINode `n0` with our driver, the PV `pv`, and VA `va` of `pv` on `n0`.
fn simple_setup(pv: CsiSpec) -> Vec<Obj> {
    vec![
        Obj::CsiNode {
            node: "n0",
            entry: NodeEntry::OurDriver,
        },
        Obj::Pv(pv_obj("pv", PvSource::Csi(pv))),
        Obj::Va {
            name: "va",
            node: "n0",
            source: VaSource::Pv("pv"),
            foreign: false,
        },
    ]
}

/// The simple setup, expected to end attached.
fn attaches(name: impl Into<String>, intent: &'static str, pv: CsiSpec) -> Scenario {
    Scenario {
        name: name.into(),
        intent,
        start_fault: None,
        setup: simple_setup(pv),
        steps: vec![
            Step::Wait("va", VaState::Attached),
            Step::Snapshot("attached"),
        ],
        known_difference: None,
    }
}

/// Any setup, expected to end with an attach error on `va`.
///
/// `expect` is a part of the error message external-attacher writes
/// (`docs/design.md#volume-source`): the wait is
/// for that error, not for any error, because a first attempt may fail
/// transiently in both attachers (the VA reached the attacher's cache before
/// the PV or the CSINode did).
fn fails(
    name: impl Into<String>,
    intent: &'static str,
    expect: &'static str,
    setup: Vec<Obj>,
) -> Scenario {
    Scenario {
        name: name.into(),
        intent,
        start_fault: None,
        setup,
        steps: vec![
            Step::Wait("va", VaState::AttachError(expect)),
            Step::Snapshot("attach-error"),
        ],
        known_difference: None,
    }
}

/// Both access-mode tables (`docs/design.md#capability`): the same PVs against a driver without
/// and (prefix `snmw-`) with SINGLE_NODE_MULTI_WRITER.
fn access_mode_rows(prefix: &str) -> Vec<Scenario> {
    const ROWS: &[(&str, &[&str], bool)] = &[
        ("rwo", &["ReadWriteOnce"], true),
        ("rox", &["ReadOnlyMany"], true),
        ("rwx", &["ReadWriteMany"], true),
        ("rwop", &["ReadWriteOncePod"], true),
        ("rwx-rox", &["ReadWriteMany", "ReadOnlyMany"], true),
        ("rwx-rwo", &["ReadWriteMany", "ReadWriteOnce"], true),
        ("rox-rwo", &["ReadOnlyMany", "ReadWriteOnce"], false),
        // Not in the table: ReadWriteOncePod with another mode, and no mode at
        // all. The API server refuses such PVs and inline specs ("may not use
        // ReadWriteOncePod with other access modes", "accessModes: Required
        // value"), so no attacher can ever see them; the mapping's errors for
        // them are covered by the unit tests of controller::attachment.
    ];
    ROWS.iter()
        .map(|&(name, modes, ok)| {
            let name = format!("{prefix}mode-{name}");
            if ok {
                attaches(
                    name,
                    "access modes map to the CSI access mode of external-attacher's table",
                    csi(modes),
                )
            } else {
                fails(
                    name,
                    "an access-mode combination CSI cannot express is refused before any CSI call",
                    "CSI does not support",
                    simple_setup(csi(modes)),
                )
            }
        })
        .collect()
}

/// Default capabilities (CONTROLLER_SERVICE, PUBLISH_UNPUBLISH_VOLUME,
/// PUBLISH_READONLY, LIST_VOLUMES with published nodes; no
/// SINGLE_NODE_MULTI_WRITER). Scenarios run concurrently.
fn default_batch() -> Batch {
    let mut s = vec![
        attaches(
            "attach",
            "plain attach: PV and VA finalizers, node-id annotation, attachmentMetadata from the publish context, fsType and volume attributes passed on",
            CsiSpec {
                fs_type: Some("xfs"),
                attributes: &[("pool", "gold"), ("tier", "1")],
                ..csi(&["ReadWriteOnce"])
            },
        ),
        attaches(
            "readonly",
            "readOnly PV on a driver with PUBLISH_READONLY: readonly=true reaches the driver",
            CsiSpec {
                read_only: Some(true),
                ..csi(&["ReadOnlyMany"])
            },
        ),
        attaches(
            "block",
            "volumeMode Block: a block access type, no fsType",
            CsiSpec {
                block: true,
                fs_type: Some("ext4"),
                ..csi(&["ReadWriteOnce"])
            },
        ),
        fails(
            "no-csinode",
            "the node has no CSINode: attach refused with the CSINode error (no VA annotation fallback on attach)",
            "csinode.storage.k8s.io",
            {
                let mut v = simple_setup(csi(&["ReadWriteOnce"]));
                v.remove(0);
                v
            },
        ),
        fails(
            "csinode-other-driver",
            "the CSINode lacks our driver: 'CSINode <node> does not contain driver <driver>'",
            "does not contain driver",
            {
                let mut v = simple_setup(csi(&["ReadWriteOnce"]));
                v[0] = Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OtherDriverOnly,
                };
                v
            },
        ),
        fails(
            "pv-missing",
            "the VA names a PV that does not exist: 'persistentvolume \"<name>\" not found'",
            "not found",
            vec![
                Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OurDriver,
                },
                Obj::Va {
                    name: "va",
                    node: "n0",
                    source: VaSource::Pv("pv"),
                    foreign: false,
                },
            ],
        ),
        fails(
            "pv-deleting",
            "the PV has a deletionTimestamp: attach refused, no PV finalizer added",
            "is marked for deletion",
            {
                let mut v = simple_setup(csi(&["ReadWriteOnce"]));
                v[1] = Obj::Pv(PvObj {
                    deleting: true,
                    ..pv_obj("pv", PvSource::Csi(csi(&["ReadWriteOnce"])))
                });
                v
            },
        ),
        fails(
            "pv-not-csi",
            "a hostPath PV: 'pv spec contained non-csi source that was not migrated'",
            "non-csi source",
            vec![
                Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OurDriver,
                },
                Obj::Pv(pv_obj("pv", PvSource::HostPath)),
                Obj::Va {
                    name: "va",
                    node: "n0",
                    source: VaSource::Pv("pv"),
                    foreign: false,
                },
            ],
        ),
        Scenario {
            name: "inline".into(),
            intent: "VA with an inline CSI volume spec: attached, VA finalizer, no PV involved",
            start_fault: None,
            setup: vec![
                Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OurDriver,
                },
                Obj::Va {
                    name: "va",
                    node: "n0",
                    source: VaSource::Inline(CsiSpec {
                        fs_type: Some("ext4"),
                        attributes: &[("inline", "yes")],
                        ..csi(&["ReadWriteOnce"])
                    }),
                    foreign: false,
                },
            ],
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::Snapshot("attached"),
            ],
            known_difference: None,
        },
        Scenario {
            name: "secret".into(),
            intent: "controllerPublishSecretRef: the Secret's data reach ControllerPublish and ControllerUnpublish",
            start_fault: None,
            setup: {
                let mut v = vec![Obj::Secret {
                    name: "secret",
                    data: &[
                        ("password", SecretValue::Text("s3cret")),
                        ("user", SecretValue::Text("admin")),
                    ],
                }];
                v.extend(simple_setup(CsiSpec {
                    secret: Some("secret"),
                    ..csi(&["ReadWriteOnce"])
                }));
                v
            },
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::Snapshot("attached"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
            known_difference: None,
        },
        fails(
            "secret-missing",
            "the referenced Secret does not exist: 'failed to load secret \"<ns>/<name>\": secrets \"<name>\" not found'",
            "failed to load secret",
            simple_setup(CsiSpec {
                secret: Some("secret"),
                ..csi(&["ReadWriteOnce"])
            }),
        ),
        Scenario {
            name: "detach".into(),
            intent: "VA deleted: ControllerUnpublish, VA finalizer removed, VA gone; the PV keeps its finalizer",
            start_fault: None,
            setup: simple_setup(csi(&["ReadWriteOnce"])),
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::Snapshot("attached"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
            known_difference: None,
        },
        Scenario {
            name: "detach-no-csinode".into(),
            intent: "CSINode deleted after attach: detach takes the node ID from the VA annotation",
            start_fault: None,
            setup: simple_setup(csi(&["ReadWriteOnce"])),
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::DeleteCsiNode("n0"),
                Step::Pause(SETTLE),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
            known_difference: None,
        },
        Scenario {
            name: "pv-finalizer-last-va".into(),
            intent: "PV of two VAs (RWX, two nodes) deleted: its finalizer stays until the last VA is gone",
            start_fault: None,
            setup: vec![
                Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OurDriver,
                },
                Obj::CsiNode {
                    node: "n1",
                    entry: NodeEntry::OurDriver,
                },
                Obj::Pv(pv_obj("pv", PvSource::Csi(csi(&["ReadWriteMany"])))),
                Obj::Va {
                    name: "va0",
                    node: "n0",
                    source: VaSource::Pv("pv"),
                    foreign: false,
                },
                Obj::Va {
                    name: "va1",
                    node: "n1",
                    source: VaSource::Pv("pv"),
                    foreign: false,
                },
            ],
            steps: vec![
                Step::Wait("va0", VaState::Attached),
                Step::Wait("va1", VaState::Attached),
                Step::DeletePv("pv"),
                Step::Pause(SETTLE),
                Step::Snapshot("pv-deleted"),
                Step::DeleteVa("va0"),
                Step::Wait("va0", VaState::Gone),
                Step::Pause(SETTLE),
                Step::Snapshot("one-va-left"),
                Step::DeleteVa("va1"),
                Step::Wait("va1", VaState::Gone),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("all-gone"),
            ],
            known_difference: None,
        },
        Scenario {
            name: "foreign-va".into(),
            intent: "a VA of another driver is never touched (no finalizer, no status, no CSI call); a VA of ours created after it attaches, so the attacher has seen both",
            start_fault: None,
            setup: vec![
                Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OurDriver,
                },
                Obj::Pv(pv_obj("pv", PvSource::Csi(csi(&["ReadWriteMany"])))),
                Obj::Va {
                    name: "foreign",
                    node: "n0",
                    source: VaSource::Pv("pv"),
                    foreign: true,
                },
                Obj::Va {
                    name: "va",
                    node: "n0",
                    source: VaSource::Pv("pv"),
                    foreign: false,
                },
            ],
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::Pause(SETTLE),
                Step::Snapshot("ours-attached"),
            ],
            known_difference: None,
        },
    ];
    s.extend(access_mode_rows(""));
    Batch {
        name: "default",
        capabilities: mock::Capabilities::default(),
        driver: DriverName::Unique,
        reconcile_sync: "10m",
        sequential: false,
        scenarios: s,
    }
}

/// SINGLE_NODE_MULTI_WRITER advertised and PUBLISH_READONLY not: the second
/// access-mode table, and readonly dropped.
fn snmw_batch() -> Batch {
    let mut s = vec![attaches(
        "snmw-readonly",
        "readOnly PV on a driver without PUBLISH_READONLY: readonly=false is sent",
        CsiSpec {
            read_only: Some(true),
            ..csi(&["ReadOnlyMany"])
        },
    )];
    s.extend(access_mode_rows("snmw-"));
    Batch {
        name: "snmw-no-readonly",
        capabilities: mock::Capabilities {
            single_node_multi_writer: true,
            publish_readonly: false,
            ..mock::Capabilities::default()
        },
        driver: DriverName::Unique,
        reconcile_sync: "10m",
        sequential: false,
        scenarios: s,
    }
}

/// A driver without PUBLISH_UNPUBLISH_VOLUME: the trivial handler
/// (`docs/design.md#trivial-handler`).
fn trivial_batch() -> Batch {
    Batch {
        name: "trivial",
        capabilities: mock::Capabilities {
            publish_unpublish: false,
            ..mock::Capabilities::default()
        },
        driver: DriverName::Unique,
        reconcile_sync: "10m",
        sequential: false,
        scenarios: vec![Scenario {
            name: "trivial".into(),
            intent: "trivial handler: VA marked attached with no finalizer, annotation or CSI call; deletion is immediate",
            start_fault: None,
            setup: simple_setup(csi(&["ReadWriteOnce"])),
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::Pause(SETTLE),
                Step::Snapshot("attached"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("deleted"),
            ],
            known_difference: None,
        }],
    }
}

/// One "publish fails with a fault, then succeeds when it is cleared" row.
fn publish_fault_then_ok(
    name: &str,
    intent: &'static str,
    fault: Fault,
    expect: &'static str,
) -> Scenario {
    Scenario {
        name: name.into(),
        intent,
        // In place before the VA exists, so that the first publish fails.
        start_fault: Some((PUBLISH, fault)),
        setup: simple_setup(csi(&["ReadWriteOnce"])),
        steps: vec![
            Step::Wait("va", VaState::AttachError(expect)),
            Step::Snapshot("attach-error"),
            Step::ClearFaults,
            Step::Wait("va", VaState::Attached),
            Step::Snapshot("attached"),
        ],
        known_difference: None,
    }
}

/// Mock-wide faults: one scenario at a time.
fn faults_batch() -> Batch {
    let scenarios = vec![
        publish_fault_then_ok(
            "publish-failed-precondition",
            "ControllerPublish answers FailedPrecondition: attachError with errorCode 9, finalizer kept; attached once the fault is cleared",
            Fault::code(tonic::Code::FailedPrecondition),
            "code = FailedPrecondition",
        ),
        publish_fault_then_ok(
            "publish-resource-exhausted",
            "ControllerPublish answers ResourceExhausted: attachError with errorCode 8 (the kubelet's terminal signal); attached once cleared",
            Fault::code(tonic::Code::ResourceExhausted),
            "code = ResourceExhausted",
        ),
        publish_fault_then_ok(
            "publish-timeout",
            "ControllerPublish takes longer than --timeout=2s: a DeadlineExceeded attachError (errorCode 4); attached once the delay is cleared",
            Fault::delay(Duration::from_secs(6)),
            "DeadlineExceeded",
        ),
        Scenario {
            name: "delete-during-slow-publish".into(),
            intent: "the VA is deleted while its ControllerPublish takes 1 s: attached, then unpublished exactly once by the hub (its own writes' echoes queue the VA again while the cache still shows the copy before the detach) and gone",
            start_fault: Some((PUBLISH, Fault::delay(Duration::from_secs(1)))),
            setup: simple_setup(csi(&["ReadWriteOnce"])),
            steps: vec![
                Step::Wait("va", VaState::Finalized),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
            known_difference: None,
        },
        Scenario {
            name: "detach-fails-then-ok".into(),
            intent: "ControllerUnpublish fails: detachError, VA and finalizer kept; detached once the fault is cleared",
            start_fault: None,
            setup: simple_setup(csi(&["ReadWriteOnce"])),
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::Fault(UNPUBLISH, Fault::code(tonic::Code::Internal)),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::DetachError("code = Internal")),
                Step::Snapshot("detach-error"),
                Step::ClearFaults,
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
            known_difference: None,
        },
        scenario(
            "detach-timeout",
            "ControllerUnpublish takes longer than --timeout=2s: a DeadlineExceeded detachError, VA kept; detached once the delay is cleared",
            simple_setup(csi(&["ReadWriteOnce"])),
            vec![
                Step::Wait("va", VaState::Attached),
                Step::Fault(UNPUBLISH, Fault::delay(Duration::from_secs(6))),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::DetachError("DeadlineExceeded")),
                Step::Snapshot("detach-error"),
                Step::ClearFaults,
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
        Scenario {
            start_fault: Some((PUBLISH, Fault::code(tonic::Code::FailedPrecondition))),
            ..scenario(
                "node-id-changed-while-failing",
                "the node plugin re-registers with a new node ID while publish keeps failing: the next attempts use the new ID and rewrite the VA annotation; attached with it once the fault is cleared",
                simple_setup(csi(&["ReadWriteOnce"])),
                vec![
                    Step::Wait("va", VaState::AttachError("code = FailedPrecondition")),
                    Step::DeleteCsiNode("n0"),
                    Step::Create(Obj::CsiNode {
                        node: "n0",
                        entry: NodeEntry::OurDriverAs("b"),
                    }),
                    Step::WaitCall {
                        node: "n0",
                        entry: NodeEntry::OurDriverAs("b"),
                        method: PUBLISH,
                        code: "FailedPrecondition",
                    },
                    // The error of that call, not of an attempt made while
                    // the CSINode was missing.
                    Step::Wait("va", VaState::AttachError("code = FailedPrecondition")),
                    Step::Snapshot("failing-with-new-id"),
                    Step::ClearFaults,
                    Step::Wait("va", VaState::Attached),
                    Step::Snapshot("attached"),
                ],
            )
        },
    ];
    Batch {
        name: "faults",
        capabilities: mock::Capabilities::default(),
        driver: DriverName::Unique,
        reconcile_sync: "10m",
        sequential: true,
        scenarios,
    }
}

/// The ListVolumes reconciler, every 2 s.
fn reconciler_batch() -> Batch {
    Batch {
        name: "reconciler",
        capabilities: mock::Capabilities::default(),
        driver: DriverName::Unique,
        reconcile_sync: "2s",
        sequential: false,
        scenarios: vec![Scenario {
            name: "reconcile-republish".into(),
            intent: "the driver forgets a publication behind the attacher's back: the reconciler notices (ListVolumes) and ControllerPublish is called again",
            start_fault: None,
            setup: simple_setup(csi(&["ReadWriteOnce"])),
            steps: vec![
                Step::Wait("va", VaState::Attached),
                Step::Snapshot("attached"),
                Step::UnpublishBehindBack("va"),
                Step::WaitRepublished("va"),
                Step::Snapshot("republished"),
            ],
            known_difference: None,
        }],
    }
}

/// A scenario with no start fault and no known difference.
fn scenario(name: &str, intent: &'static str, setup: Vec<Obj>, steps: Vec<Step>) -> Scenario {
    Scenario {
        name: name.into(),
        intent,
        start_fault: None,
        setup,
        steps,
        known_difference: None,
    }
}

/// CSINode of node role `node` with our driver.
fn our_node(node: &'static str) -> Obj {
    Obj::CsiNode {
        node,
        entry: NodeEntry::OurDriver,
    }
}

/// VA `name` of our driver for PV role `pv` on node role `node`.
fn our_va(name: &'static str, node: &'static str, pv: &'static str) -> Obj {
    Obj::Va {
        name,
        node,
        source: VaSource::Pv(pv),
        foreign: false,
    }
}

/// VA `name` of the other driver (no attacher runs for it) for PV role `pv`.
fn foreign_va(name: &'static str, node: &'static str, pv: &'static str) -> Obj {
    Obj::Va {
        name,
        node,
        source: VaSource::Pv(pv),
        foreign: true,
    }
}

/// Our node, a PV with these access modes, our VA and a VA of another driver
/// of the same PV.
fn shared_setup() -> Vec<Obj> {
    vec![
        our_node("n0"),
        Obj::Pv(pv_obj("pv", PvSource::Csi(csi(&["ReadWriteMany"])))),
        our_va("va", "n0", "pv"),
        foreign_va("foreign", "n0", "pv"),
    ]
}

/// Lifecycles: PVs shared with VAs of another driver, PV and VA deleted in
/// every order, VAs re-created under the same name, node IDs that change, a
/// CSINode that appears late. Default capabilities; concurrent.
fn lifecycle_batch() -> Batch {
    let attach = || Step::Wait("va", VaState::Attached);
    let scenarios = vec![
        scenario(
            "shared-foreign-last",
            "PV of our VA and of another driver's VA, deleted: our VA's deletion keeps the finalizer (the other VA still names the PV); the other driver's VA's deletion releases it at once (a VA deletion queues its PV), not at the next resync",
            shared_setup(),
            vec![
                attach(),
                Step::DeletePv("pv"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Pause(SETTLE),
                Step::Snapshot("foreign-va-left"),
                Step::DeleteVa("foreign"),
                Step::Wait("foreign", VaState::Gone),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("all-gone"),
            ],
        ),
        scenario(
            "shared-foreign-first",
            "PV of our VA and of another driver's VA: the other VA goes first, then the PV is deleted; the finalizer stays until our VA is gone",
            shared_setup(),
            vec![
                attach(),
                Step::DeleteVa("foreign"),
                Step::Wait("foreign", VaState::Gone),
                Step::DeletePv("pv"),
                Step::Pause(SETTLE),
                Step::Snapshot("pv-deleted"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("all-gone"),
            ],
        ),
        scenario(
            "held-for-foreign-va",
            "a deleted PV carrying our finalizer and another driver's, named only by the other driver's VA: ours stays while that VA exists and goes when it is deleted; the other driver's finalizer is never touched",
            vec![foreign_va("foreign", "n0", "pv")],
            vec![
                // The VA first, and in the attacher's cache before the PV
                // appears: otherwise the PV may be released before the VA
                // is seen (by either attacher).
                Step::Pause(SETTLE),
                Step::Create(Obj::Pv(PvObj {
                    deleting: true,
                    finalizers: &["{finalizer}", "{foreign-finalizer}"],
                    ..pv_obj("pv", PvSource::Csi(csi(&["ReadWriteOnce"])))
                })),
                Step::Pause(SETTLE),
                Step::Snapshot("held"),
                Step::DeleteVa("foreign"),
                Step::Wait("foreign", VaState::Gone),
                Step::WaitPv("pv", PvState::Released),
                Step::Snapshot("released"),
            ],
        ),
        scenario(
            "stale-pv-finalizer",
            "a PV carrying our finalizer that no VA names: kept while the PV lives, removed when it is deleted",
            vec![Obj::Pv(PvObj {
                finalizers: &["{finalizer}"],
                ..pv_obj("pv", PvSource::Csi(csi(&["ReadWriteOnce"])))
            })],
            vec![
                Step::Pause(SETTLE),
                Step::Snapshot("kept"),
                Step::DeletePv("pv"),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("pv-gone"),
            ],
        ),
        scenario(
            "delete-pv-then-va",
            "attached, then the PV is deleted (finalizer holds it), then the VA: detached, then the PV goes",
            simple_setup(csi(&["ReadWriteOnce"])),
            vec![
                attach(),
                Step::DeletePv("pv"),
                Step::Pause(SETTLE),
                Step::Snapshot("pv-deleting"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("all-gone"),
            ],
        ),
        scenario(
            "delete-va-then-pv",
            "attached, VA deleted and detached (the live PV keeps our finalizer), then the PV is deleted and goes",
            simple_setup(csi(&["ReadWriteOnce"])),
            vec![
                attach(),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Pause(SETTLE),
                Step::Snapshot("va-gone"),
                Step::DeletePv("pv"),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("pv-gone"),
            ],
        ),
        scenario(
            "delete-va-and-pv-at-once",
            "attached, then VA and PV deleted back to back: detached, both gone",
            simple_setup(csi(&["ReadWriteOnce"])),
            vec![
                attach(),
                Step::DeleteVa("va"),
                Step::DeletePv("pv"),
                Step::Wait("va", VaState::Gone),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("all-gone"),
            ],
        ),
        scenario(
            "attach-failed-then-deleted",
            "attach fails after the PV finalizer was added (no CSINode): the VA, without a finalizer, goes at once and releases the deleted PV",
            {
                let mut v = simple_setup(csi(&["ReadWriteOnce"]));
                v.remove(0);
                v
            },
            vec![
                Step::Wait("va", VaState::AttachError("csinode.storage.k8s.io")),
                Step::Snapshot("attach-error"),
                Step::DeletePv("pv"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::WaitPv("pv", PvState::Gone),
                Step::Snapshot("all-gone"),
            ],
        ),
        scenario(
            "va-recreated-same-name",
            "a VA detached and re-created under the same name: published again (nothing remembered from the first VA)",
            simple_setup(csi(&["ReadWriteOnce"])),
            vec![
                attach(),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("first-gone"),
                Step::Create(our_va("va", "n0", "pv")),
                attach(),
                Step::Snapshot("re-attached"),
            ],
        ),
        scenario(
            "va-recreated-other-node",
            "a VA detached and re-created under the same name for another node: published to that node",
            vec![
                our_node("n0"),
                our_node("n1"),
                Obj::Pv(pv_obj("pv", PvSource::Csi(csi(&["ReadWriteOnce"])))),
                our_va("va", "n0", "pv"),
            ],
            vec![
                attach(),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Create(our_va("va", "n1", "pv")),
                attach(),
                Step::Snapshot("re-attached"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
        scenario(
            "node-id-changed",
            "the node plugin re-registers with a new node ID after attach: the detach uses the CSINode's new ID, not the VA annotation",
            simple_setup(csi(&["ReadWriteOnce"])),
            vec![
                attach(),
                Step::DeleteCsiNode("n0"),
                Step::Create(Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OurDriverAs("b"),
                }),
                Step::Pause(SETTLE),
                Step::Snapshot("new-id"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
        scenario(
            "node-plugin-gone",
            "the CSINode loses our driver after attach: the detach falls back to the node ID in the VA annotation",
            simple_setup(csi(&["ReadWriteOnce"])),
            vec![
                attach(),
                Step::DeleteCsiNode("n0"),
                Step::Create(Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OtherDriverOnly,
                }),
                Step::Pause(SETTLE),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
        scenario(
            "csinode-appears-late",
            "the VA comes before the node plugin registers: CSINode error first, attached once the CSINode appears",
            {
                let mut v = simple_setup(csi(&["ReadWriteOnce"]));
                v.remove(0);
                v
            },
            vec![
                Step::Wait("va", VaState::AttachError("csinode.storage.k8s.io")),
                Step::Snapshot("no-csinode"),
                Step::Create(our_node("n0")),
                attach(),
                Step::Snapshot("attached"),
            ],
        ),
        scenario(
            "inline-secret",
            "an inline CSI volume with controllerPublishSecretRef, fsType and attributes: the secret reaches publish and unpublish",
            vec![
                Obj::Secret {
                    name: "secret",
                    data: &[("key", SecretValue::Text("inline-s3cret"))],
                },
                our_node("n0"),
                Obj::Va {
                    name: "va",
                    node: "n0",
                    source: VaSource::Inline(CsiSpec {
                        secret: Some("secret"),
                        fs_type: Some("xfs"),
                        attributes: &[("zone", "z1")],
                        ..csi(&["ReadWriteOnce"])
                    }),
                    foreign: false,
                },
            ],
            vec![
                attach(),
                Step::Snapshot("attached"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
        scenario(
            "inline-readonly",
            "an inline CSI volume, read-only, ReadOnlyMany (the API allows only Filesystem mode inline): readonly=true, MULTI_NODE_READER_ONLY",
            vec![
                our_node("n0"),
                Obj::Va {
                    name: "va",
                    node: "n0",
                    source: VaSource::Inline(CsiSpec {
                        read_only: Some(true),
                        ..csi(&["ReadOnlyMany"])
                    }),
                    foreign: false,
                },
            ],
            vec![attach(), Step::Snapshot("attached")],
        ),
    ];
    Batch {
        name: "lifecycle",
        capabilities: mock::Capabilities::default(),
        driver: DriverName::Unique,
        reconcile_sync: "10m",
        sequential: false,
        scenarios,
    }
}

/// A Secret value that is not UTF-8 (a lone 0xff byte).
const NOT_UTF8: SecretValue = SecretValue::Bytes(b"p\xff55");
/// Everything awkward that is still UTF-8: NUL and other control characters,
/// multi-byte characters, a byte-order mark, a literal replacement character.
const ODD_UTF8: SecretValue = SecretValue::Bytes(
    b"\x00\x01\x7f\n\t \xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbb\xbf\xef\xbf\xbd",
);
/// What the Go attacher's attach and detach fail with for a non-UTF-8 value.
const MARSHAL_ERROR: &str = "grpc: error while marshaling: string field contains invalid UTF-8";

/// `simple_setup` with a controller-publish Secret of these data.
fn secret_setup(data: &'static [(&'static str, SecretValue)]) -> Vec<Obj> {
    let mut v = vec![Obj::Secret {
        name: "secret",
        data,
    }];
    v.extend(simple_setup(CsiSpec {
        secret: Some("secret"),
        ..csi(&["ReadWriteOnce"])
    }));
    v
}

/// Attach, snapshot, detach, snapshot.
fn attach_detach() -> Vec<Step> {
    vec![
        Step::Wait("va", VaState::Attached),
        Step::Snapshot("attached"),
        Step::DeleteVa("va"),
        Step::Wait("va", VaState::Gone),
        Step::Snapshot("detached"),
    ]
}

/// Secrets and their edge values: passed byte for byte, or refused as the Go
/// attacher refuses them. Default capabilities; concurrent.
fn secrets_batch() -> Batch {
    let scenarios = vec![
        scenario(
            "secret-not-utf8",
            "a Secret value that is not UTF-8 is never altered: attach fails with gRPC's marshalling error (errorCode 13), so does the detach; once the Secret is fixed, the detach goes through with the fixed value",
            secret_setup(&[("password", NOT_UTF8), ("user", SecretValue::Text("admin"))]),
            vec![
                Step::Wait("va", VaState::AttachError(MARSHAL_ERROR)),
                Step::Snapshot("attach-error"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::DetachError(MARSHAL_ERROR)),
                Step::Snapshot("detach-error"),
                Step::SetSecret("secret", &[("password", SecretValue::Text("fixed"))]),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
        scenario(
            "secret-not-utf8-fixed",
            "a non-UTF-8 Secret value fixed while the attach is failing: the next attempt reads it again and attaches",
            secret_setup(&[("password", NOT_UTF8)]),
            vec![
                Step::Wait("va", VaState::AttachError(MARSHAL_ERROR)),
                Step::SetSecret("secret", &[("password", SecretValue::Text("fixed"))]),
                Step::Wait("va", VaState::Attached),
                Step::Snapshot("attached"),
            ],
        ),
        scenario(
            "secret-empty",
            "a Secret without data: an empty secrets map",
            secret_setup(&[]),
            attach_detach(),
        ),
        scenario(
            "secret-empty-value",
            "a Secret key with an empty value: the key is sent with an empty string",
            secret_setup(&[
                ("token", SecretValue::Text("")),
                ("user", SecretValue::Text("u")),
            ]),
            attach_detach(),
        ),
        scenario(
            "secret-binary-utf8",
            "control characters, NUL, multi-byte characters, a BOM and a literal U+FFFD: sent byte for byte",
            secret_setup(&[("blob", ODD_UTF8)]),
            attach_detach(),
        ),
        scenario(
            "secret-large",
            "a Secret near the API's 1 MiB limit (two large values): sent whole",
            secret_setup(&[
                (
                    "big",
                    SecretValue::Filled {
                        byte: b'k',
                        len: 700_000,
                    },
                ),
                (
                    "del",
                    SecretValue::Filled {
                        byte: 0x7f,
                        len: 200_000,
                    },
                ),
            ]),
            attach_detach(),
        ),
        scenario(
            "secret-changed",
            "the Secret changes between attach and detach: it is read again, the unpublish gets the new value",
            secret_setup(&[("password", SecretValue::Text("v1"))]),
            vec![
                Step::Wait("va", VaState::Attached),
                Step::SetSecret("secret", &[("password", SecretValue::Text("v2"))]),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
        scenario(
            "secret-deleted-before-detach",
            "the Secret is deleted before the detach: detachError 'failed to load secret', VA kept; detached once the Secret is back",
            secret_setup(&[("password", SecretValue::Text("v1"))]),
            vec![
                Step::Wait("va", VaState::Attached),
                Step::DeleteSecret("secret"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::DetachError("failed to load secret")),
                Step::Snapshot("detach-error"),
                Step::Create(Obj::Secret {
                    name: "secret",
                    data: &[("password", SecretValue::Text("v3"))],
                }),
                Step::Wait("va", VaState::Gone),
                Step::Snapshot("detached"),
            ],
        ),
    ];
    Batch {
        name: "secrets",
        capabilities: mock::Capabilities::default(),
        driver: DriverName::Unique,
        reconcile_sync: "10m",
        sequential: false,
        scenarios,
    }
}

/// One in-tree PV scenario: an optional mock volume, our node, the PV and our VA.
fn in_tree(
    name: &str,
    intent: &'static str,
    handle: Option<&'static str>,
    pv: PvObj,
    steps: Vec<Step>,
) -> Scenario {
    let mut setup: Vec<Obj> = handle
        .map(|h| Obj::MockVolume { handle: h })
        .into_iter()
        .collect();
    setup.extend([our_node("n0"), Obj::Pv(pv), our_va("va", "n0", "pv")]);
    scenario(name, intent, setup, steps)
}

/// A PV spec with only an in-tree source and access modes.
fn in_tree_spec(modes: &[&str], set: impl FnOnce(&mut PersistentVolumeSpec)) -> PvSource {
    let mut spec = PersistentVolumeSpec {
        access_modes: Some(modes.iter().map(|m| (*m).to_string()).collect()),
        ..PersistentVolumeSpec::default()
    };
    set(&mut spec);
    PvSource::InTree(Box::new(spec))
}

/// Attach, detach, then the PV: with no `migrated-to` annotation the PV
/// counts as rolled back (`docs/design.md#pv-finalizer`), so its finalizer
/// goes as soon as no VA names it, while the PV still lives.
fn in_tree_lifecycle() -> Vec<Step> {
    vec![
        Step::Wait("va", VaState::Attached),
        Step::Snapshot("attached"),
        Step::DeleteVa("va"),
        Step::Wait("va", VaState::Gone),
        Step::WaitPv("pv", PvState::Released),
        Step::Snapshot("detached"),
        Step::DeletePv("pv"),
        Step::WaitPv("pv", PvState::Gone),
        Step::Snapshot("pv-gone"),
    ]
}

fn attached() -> Vec<Step> {
    vec![
        Step::Wait("va", VaState::Attached),
        Step::Snapshot("attached"),
    ]
}

fn attach_error(expect: &'static str) -> Vec<Step> {
    vec![
        Step::Wait("va", VaState::AttachError(expect)),
        Step::Snapshot("attach-error"),
    ]
}

/// In-tree PVs of the seven CSI-migration plugins, which both attachers must
/// translate alike (`docs/design.md#volume-source`). One batch per
/// CSI-migration driver (a fixed driver name each).
fn in_tree_batches() -> Vec<Batch> {
    use k8s_openapi::api::core::v1::{
        AWSElasticBlockStoreVolumeSource as Ebs, AzureDiskVolumeSource as AzureDisk,
        AzureFilePersistentVolumeSource as AzureFile, CinderPersistentVolumeSource as Cinder,
        GCEPersistentDiskVolumeSource as Gce, ObjectReference, PortworxVolumeSource as Portworx,
        SecretReference, VsphereVirtualDiskVolumeSource as Vsphere,
    };
    let batch = |name: &'static str, driver: &'static str, scenarios: Vec<Scenario>| Batch {
        name,
        capabilities: mock::Capabilities::default(),
        driver: DriverName::Fixed(driver),
        reconcile_sync: "10m",
        sequential: false,
        scenarios,
    };
    let gce = |pd: &str, fs: Option<&str>, partition: Option<i32>, ro: Option<bool>| {
        let pd = pd.to_string();
        let fs = fs.map(str::to_string);
        move |s: &mut PersistentVolumeSpec| {
            s.gce_persistent_disk = Some(Gce {
                pd_name: pd,
                fs_type: fs,
                partition,
                read_only: ro,
            });
        }
    };
    let gce_batch = batch(
        "in-tree-gce-pd",
        GCE_PD_DRIVER,
        vec![
            in_tree(
                "in-tree-gce-pd",
                "in-tree gcePersistentDisk PV: translated handle (zone from the PV label), fsType and partition; attach, detach, PV finalizer removed on VA deletion (migration rolled back: no migrated-to annotation)",
                Some("projects/UNSPECIFIED/zones/us-central1-a/disks/diff-disk"),
                PvObj {
                    labels: &[("topology.kubernetes.io/zone", "us-central1-a")],
                    ..pv_obj(
                        "pv",
                        in_tree_spec(
                            &["ReadWriteOnce"],
                            gce("diff-disk", Some("ext4"), Some(1), None),
                        ),
                    )
                },
                in_tree_lifecycle(),
            ),
            in_tree(
                "gce-pd-regional",
                "regional PD (two zones in the label): a regions/ handle; ReadWriteMany made ReadWriteOnce (backward-compatible modes); readOnly passed on",
                Some("projects/UNSPECIFIED/regions/us-central1/disks/diff-regional"),
                PvObj {
                    labels: &[(
                        "topology.kubernetes.io/zone",
                        "us-central1-a__us-central1-b",
                    )],
                    ..pv_obj(
                        "pv",
                        in_tree_spec(
                            &["ReadWriteMany"],
                            gce("diff-regional", None, None, Some(true)),
                        ),
                    )
                },
                attached(),
            ),
            in_tree(
                "gce-pd-beta-zone-label",
                "both zone labels: the beta failure-domain label wins; partition 0 is sent as an empty attribute; ReadOnlyMany+ReadWriteOnce made ReadWriteOnce",
                Some("projects/UNSPECIFIED/zones/us-central1-b/disks/diff-beta"),
                PvObj {
                    labels: &[
                        ("failure-domain.beta.kubernetes.io/zone", "us-central1-b"),
                        ("topology.kubernetes.io/zone", "us-central1-a"),
                    ],
                    ..pv_obj(
                        "pv",
                        in_tree_spec(
                            &["ReadOnlyMany", "ReadWriteOnce"],
                            gce("diff-beta", Some("xfs"), Some(0), Some(false)),
                        ),
                    )
                },
                attached(),
            ),
            in_tree(
                "gce-pd-no-zone-block",
                "no zone label: an UNSPECIFIED zone in the handle; volumeMode Block",
                Some("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/diff-nozone"),
                pv_obj(
                    "pv",
                    in_tree_spec(&["ReadWriteOnce"], |s| {
                        gce("diff-nozone", None, None, None)(s);
                        s.volume_mode = Some("Block".into());
                    }),
                ),
                attached(),
            ),
            in_tree(
                "gce-pd-migrated-to",
                "an in-tree PV annotated migrated-to our driver: the finalizer stays after the detach until the PV is deleted",
                Some("projects/UNSPECIFIED/zones/us-central1-c/disks/diff-migrated"),
                PvObj {
                    labels: &[("topology.kubernetes.io/zone", "us-central1-c")],
                    annotations: &[("pv.kubernetes.io/migrated-to", "{driver}")],
                    ..pv_obj(
                        "pv",
                        in_tree_spec(
                            &["ReadWriteOnce"],
                            gce("diff-migrated", Some("ext4"), None, None),
                        ),
                    )
                },
                vec![
                    Step::Wait("va", VaState::Attached),
                    Step::DeleteVa("va"),
                    Step::Wait("va", VaState::Gone),
                    Step::Pause(SETTLE),
                    Step::Snapshot("detached"),
                    Step::DeletePv("pv"),
                    Step::WaitPv("pv", PvState::Gone),
                    Step::Snapshot("pv-gone"),
                ],
            ),
            scenario(
                "gce-inline-migrated",
                "a migrated inline volume (what kube-controller-manager puts in the VA for an inline gcePersistentDisk): attached and detached with the CSI source as given",
                vec![
                    Obj::MockVolume {
                        handle: "projects/UNSPECIFIED/zones/us-central1-a/disks/diff-inline",
                    },
                    our_node("n0"),
                    Obj::Va {
                        name: "va",
                        node: "n0",
                        source: VaSource::Inline(CsiSpec {
                            handle: Some(
                                "projects/UNSPECIFIED/zones/us-central1-a/disks/diff-inline",
                            ),
                            fs_type: Some("ext4"),
                            attributes: &[("partition", "")],
                            ..csi(&["ReadWriteOnce"])
                        }),
                        foreign: false,
                    },
                ],
                attach_detach(),
            ),
        ],
    );
    let ebs = |id: &str, fs: Option<&str>, partition: Option<i32>, ro: Option<bool>| {
        let id = id.to_string();
        let fs = fs.map(str::to_string);
        move |s: &mut PersistentVolumeSpec| {
            s.aws_elastic_block_store = Some(Ebs {
                volume_id: id,
                fs_type: fs,
                partition,
                read_only: ro,
            });
        }
    };
    let ebs_batch = batch(
        "in-tree-aws-ebs",
        "ebs.csi.aws.com",
        vec![
            in_tree(
                "ebs-url-id",
                "awsElasticBlockStore with an aws://zone/vol-… ID: the bare volume ID, fsType, partition 0 as \"0\"; attach, detach, finalizer released",
                Some("vol-0diff1"),
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        ebs("aws://us-east-1a/vol-0diff1", Some("xfs"), None, None),
                    ),
                ),
                in_tree_lifecycle(),
            ),
            in_tree(
                "ebs-bare-id-partition",
                "a bare vol-… ID, partition 3, readOnly, a zone label",
                Some("vol-0diff2"),
                PvObj {
                    labels: &[("topology.kubernetes.io/zone", "us-east-1b")],
                    ..pv_obj(
                        "pv",
                        in_tree_spec(
                            &["ReadWriteOnce"],
                            ebs("vol-0diff2", Some("ext4"), Some(3), Some(true)),
                        ),
                    )
                },
                attached(),
            ),
            in_tree(
                "ebs-bad-id",
                "an aws:// ID that is no volume ID: the translation error in attachError, no CSI call",
                None,
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        ebs("aws://us-east-1a/notavolume", None, None, None),
                    ),
                ),
                attach_error("Invalid format for AWS volume"),
            ),
        ],
    );
    const DISK_URI_1: &str =
        "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Compute/disks/diff-d1";
    const DISK_URI_2: &str =
        "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Compute/disks/diff-d2";
    // Not a managed disk: the API requires a blob URI.
    const BLOB_URI: &str = "https://diffacct.blob.core.windows.net/vhds/diff-d3.vhd";
    let azure_disk = |uri: &'static str,
                      kind: Option<&str>,
                      caching: Option<&str>,
                      fs: Option<&str>,
                      ro: Option<bool>| {
        let (kind, caching, fs) = (
            kind.map(str::to_string),
            caching.map(str::to_string),
            fs.map(str::to_string),
        );
        move |s: &mut PersistentVolumeSpec| {
            s.azure_disk = Some(AzureDisk {
                disk_name: uri.rsplit('/').next().unwrap_or(uri).to_string(),
                disk_uri: uri.into(),
                kind,
                caching_mode: caching,
                fs_type: fs,
                read_only: ro,
            });
        }
    };
    let azure_disk_batch = batch(
        "in-tree-azure-disk",
        "disk.csi.azure.com",
        vec![
            in_tree(
                "azure-disk-managed",
                "azureDisk kind Managed, cachingMode ReadOnly, fsType xfs, readOnly: the disk URI as handle, cachingmode/fstype/kind attributes",
                Some(DISK_URI_1),
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        azure_disk(
                            DISK_URI_1,
                            Some("Managed"),
                            Some("ReadOnly"),
                            Some("xfs"),
                            Some(true),
                        ),
                    ),
                ),
                in_tree_lifecycle(),
            ),
            in_tree(
                "azure-disk-defaults",
                "azureDisk with no kind: the API server defaults it to Shared, which CSI migration refuses (translation error, no CSI call)",
                None,
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        azure_disk(BLOB_URI, None, None, None, None),
                    ),
                ),
                attach_error("is not supported in csi migration"),
            ),
            in_tree(
                "azure-disk-caching-none",
                "azureDisk kind Managed, cachingMode None, fsType left to the API server's default",
                Some(DISK_URI_2),
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        azure_disk(DISK_URI_2, Some("Managed"), Some("None"), None, None),
                    ),
                ),
                attached(),
            ),
        ],
    );
    let azure_file = |secret: &str, share: &str, ns: Option<&str>, ro: Option<bool>| {
        let (secret, share, ns) = (
            secret.to_string(),
            share.to_string(),
            ns.map(str::to_string),
        );
        move |s: &mut PersistentVolumeSpec| {
            s.azure_file = Some(AzureFile {
                secret_name: secret,
                share_name: share,
                secret_namespace: ns,
                read_only: ro,
            });
        }
    };
    let azure_file_batch = batch(
        "in-tree-azure-file",
        "file.csi.azure.com",
        vec![
            in_tree(
                "azure-file-secret-ns",
                "azureFile with secretNamespace and a resource-group annotation: handle rg#account#share#pv#ns (account from the secret name), sharename attribute, readOnly",
                Some("rg-1#diffacct#share1#{name:pv}#default"),
                PvObj {
                    annotations: &[("kubernetes.io/azure-file-resource-group", "rg-1")],
                    ..pv_obj(
                        "pv",
                        in_tree_spec(
                            &["ReadWriteMany"],
                            azure_file(
                                "azure-storage-account-diffacct-secret",
                                "share1",
                                Some("default"),
                                Some(true),
                            ),
                        ),
                    )
                },
                in_tree_lifecycle(),
            ),
            in_tree(
                "azure-file-claim-ns",
                "azureFile without secretNamespace: the namespace comes from the claimRef; a secret name not in the account pattern is the account",
                Some("#plainsecret#share2#{name:pv}#claim-ns"),
                pv_obj(
                    "pv",
                    in_tree_spec(&["ReadWriteMany"], |s| {
                        azure_file("plainsecret", "share2", None, None)(s);
                        s.claim_ref = Some(ObjectReference {
                            namespace: Some("claim-ns".into()),
                            name: Some("claim".into()),
                            ..ObjectReference::default()
                        });
                    }),
                ),
                attached(),
            ),
            in_tree(
                "azure-file-no-namespace",
                "azureFile with neither secretNamespace nor claimRef: the translation error, no CSI call",
                None,
                pv_obj(
                    "pv",
                    in_tree_spec(&["ReadWriteMany"], azure_file("s", "share3", None, None)),
                ),
                attach_error("could not find a secret namespace"),
            ),
        ],
    );
    let cinder_batch = batch(
        "in-tree-cinder",
        "cinder.csi.openstack.org",
        vec![
            in_tree(
                "cinder",
                "cinder volume with fsType, readOnly and a zone label: the volume ID as handle; attach, detach, finalizer released",
                Some("diff-cinder-1"),
                PvObj {
                    labels: &[("topology.kubernetes.io/zone", "nova")],
                    ..pv_obj(
                        "pv",
                        in_tree_spec(&["ReadWriteOnce"], |s| {
                            s.cinder = Some(Cinder {
                                volume_id: "diff-cinder-1".into(),
                                fs_type: Some("ext4".into()),
                                read_only: Some(true),
                                secret_ref: None,
                            });
                        }),
                    )
                },
                in_tree_lifecycle(),
            ),
            in_tree(
                "cinder-secret-ref",
                "cinder volume with a secretRef: the translation drops it, no secrets are sent",
                Some("diff-cinder-2"),
                pv_obj(
                    "pv",
                    in_tree_spec(&["ReadWriteOnce"], |s| {
                        s.cinder = Some(Cinder {
                            volume_id: "diff-cinder-2".into(),
                            fs_type: None,
                            read_only: None,
                            secret_ref: Some(SecretReference {
                                name: Some("cinder-secret".into()),
                                namespace: Some("default".into()),
                            }),
                        });
                    }),
                ),
                attached(),
            ),
        ],
    );
    let vsphere = |path: &str, fs: Option<&str>, policy: Option<&str>| {
        let (path, fs, policy) = (
            path.to_string(),
            fs.map(str::to_string),
            policy.map(str::to_string),
        );
        move |s: &mut PersistentVolumeSpec| {
            s.vsphere_volume = Some(Vsphere {
                volume_path: path,
                fs_type: fs,
                storage_policy_name: policy,
                storage_policy_id: None,
            });
        }
    };
    let vsphere_batch = batch(
        "in-tree-vsphere",
        "csi.vsphere.vmware.com",
        vec![
            in_tree(
                "vsphere-policy",
                "vsphereVolume with a storage policy and fsType: the volume path as handle, storagepolicyname attribute; attach, detach, finalizer released",
                Some("[vsanDatastore] kubevols/diff-1.vmdk"),
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        vsphere(
                            "[vsanDatastore] kubevols/diff-1.vmdk",
                            Some("ext4"),
                            Some("gold"),
                        ),
                    ),
                ),
                in_tree_lifecycle(),
            ),
            in_tree(
                "vsphere-plain",
                "vsphereVolume with no policy and no fsType",
                Some("[ds-2] kubevols/diff-2.vmdk"),
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        vsphere("[ds-2] kubevols/diff-2.vmdk", None, None),
                    ),
                ),
                attached(),
            ),
        ],
    );
    let portworx = |id: &str, fs: Option<&str>, ro: Option<bool>| {
        let (id, fs) = (id.to_string(), fs.map(str::to_string));
        move |s: &mut PersistentVolumeSpec| {
            s.portworx_volume = Some(Portworx {
                volume_id: id,
                fs_type: fs,
                read_only: ro,
            });
        }
    };
    let portworx_batch = batch(
        "in-tree-portworx",
        "pxd.portworx.com",
        vec![
            scenario(
                "portworx-auth-secret",
                "portworxVolume with openstorage.io auth-secret annotations: they become the controller-publish secret, whose data reach publish and unpublish",
                vec![
                    Obj::Secret {
                        name: "secret",
                        data: &[("auth-token", SecretValue::Text("px-token"))],
                    },
                    Obj::MockVolume {
                        handle: "diff-px-1",
                    },
                    our_node("n0"),
                    Obj::Pv(PvObj {
                        annotations: &[
                            ("openstorage.io/auth-secret-name", "{name:secret}"),
                            ("openstorage.io/auth-secret-namespace", "default"),
                        ],
                        ..pv_obj(
                            "pv",
                            in_tree_spec(
                                &["ReadWriteOnce"],
                                portworx("diff-px-1", Some("ext4"), None),
                            ),
                        )
                    }),
                    our_va("va", "n0", "pv"),
                ],
                in_tree_lifecycle(),
            ),
            in_tree(
                "portworx-plain",
                "portworxVolume without annotations, readOnly, fsType xfs: no secrets",
                Some("diff-px-2"),
                pv_obj(
                    "pv",
                    in_tree_spec(
                        &["ReadWriteOnce"],
                        portworx("diff-px-2", Some("xfs"), Some(true)),
                    ),
                ),
                attached(),
            ),
        ],
    );
    vec![
        gce_batch,
        ebs_batch,
        azure_disk_batch,
        azure_file_batch,
        cinder_batch,
        vsphere_batch,
        portworx_batch,
    ]
}
