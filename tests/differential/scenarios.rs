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

use attacher_hub::mock::{self, fault::Fault};

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
    /// A Secret in namespace `default` with these string data.
    Secret {
        name: &'static str,
        data: &'static [(&'static str, &'static str)],
    },
    /// A PersistentVolume.
    Pv {
        name: &'static str,
        source: PvSource,
        /// Create it with the extra finalizer `test/keep`, then delete it, so
        /// that it exists with a deletionTimestamp.
        deleting: bool,
    },
    /// A VolumeAttachment on node role `node`.
    Va {
        name: &'static str,
        node: &'static str,
        source: VaSource,
        /// `spec.attacher` names another driver, for which no attacher runs.
        foreign: bool,
    },
    /// A volume created in the mock with CreateVolume, for handles that are
    /// not `vol-N` (translated in-tree volumes).
    MockVolume { handle: &'static str },
}

/// The driver entry of a CSINode.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NodeEntry {
    /// This batch's driver, node ID `nid-<scenario>-<node role>`.
    OurDriver,
    /// Only some other driver: the node plugin of ours is not registered.
    OtherDriverOnly,
}

/// The volume source of a PV.
pub(crate) enum PvSource {
    /// A CSI source of this batch's driver, volume handle `vol-<index>`.
    Csi(CsiSpec),
    /// A hostPath volume: neither CSI nor migratable.
    HostPath,
    /// An in-tree GCE PD, translated for `pd.csi.storage.gke.io`.
    GcePd {
        pd_name: &'static str,
        zone: &'static str,
        fs_type: &'static str,
        partition: i32,
    },
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
}

/// A step of a scenario.
pub(crate) enum Step {
    /// Wait until the VA of this role is in this state.
    Wait(&'static str, VaState),
    /// Wait until the PV of this role is gone.
    WaitPvGone(&'static str),
    /// Wait until the mock has answered a ControllerPublishVolume of the VA's
    /// volume and node with OK after a ControllerUnpublishVolume of them.
    WaitRepublished(&'static str),
    /// Let a fixed time pass (for "nothing else happens" checks).
    Pause(Duration),
    /// Record a normalized snapshot under this label.
    Snapshot(&'static str),
    DeleteVa(&'static str),
    DeletePv(&'static str),
    /// Delete the CSINode of this node role (node gone).
    DeleteCsiNode(&'static str),
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
    /// `status.attachError.message` contains this text.
    AttachError(&'static str),
    /// `status.detachError.message` contains this text.
    DetachError(&'static str),
    /// The VA no longer exists.
    Gone,
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
        migration_batch(),
    ]
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
        Obj::Pv {
            name: "pv",
            source: PvSource::Csi(pv),
            deleting: false,
        },
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
/// `expect` is a part of the error message the spec prescribes: the wait is
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

/// Both access-mode tables (spec 3.4): the same PVs against a driver without
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
                    "access modes map to the CSI access mode of spec 3.4's table",
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
                v[1] = Obj::Pv {
                    name: "pv",
                    source: PvSource::Csi(csi(&["ReadWriteOnce"])),
                    deleting: true,
                };
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
                Obj::Pv {
                    name: "pv",
                    source: PvSource::HostPath,
                    deleting: false,
                },
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
                    data: &[("password", "s3cret"), ("user", "admin")],
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
                Obj::Pv {
                    name: "pv",
                    source: PvSource::Csi(csi(&["ReadWriteMany"])),
                    deleting: false,
                },
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
                Step::WaitPvGone("pv"),
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
                Obj::Pv {
                    name: "pv",
                    source: PvSource::Csi(csi(&["ReadWriteMany"])),
                    deleting: false,
                },
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

/// A driver without PUBLISH_UNPUBLISH_VOLUME: the trivial handler (spec 4).
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

/// An in-tree GCE PD PV handled by the migration driver (fixed name).
fn migration_batch() -> Batch {
    const HANDLE: &str = "projects/UNSPECIFIED/zones/us-central1-a/disks/diff-disk";
    Batch {
        name: "migration",
        capabilities: mock::Capabilities::default(),
        driver: DriverName::Fixed(GCE_PD_DRIVER),
        reconcile_sync: "10m",
        sequential: false,
        scenarios: vec![Scenario {
            name: "in-tree-gce-pd".into(),
            intent: "in-tree gcePersistentDisk PV: translated handle (zone from the PV label), fsType and partition; attach, detach, PV finalizer removed on PV deletion",
            start_fault: None,
            setup: vec![
                Obj::MockVolume { handle: HANDLE },
                Obj::CsiNode {
                    node: "n0",
                    entry: NodeEntry::OurDriver,
                },
                Obj::Pv {
                    name: "pv",
                    source: PvSource::GcePd {
                        pd_name: "diff-disk",
                        zone: "us-central1-a",
                        fs_type: "ext4",
                        partition: 1,
                    },
                    deleting: false,
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
                Step::Snapshot("attached"),
                Step::DeleteVa("va"),
                Step::Wait("va", VaState::Gone),
                // The PV queue acts on the VA's deletion: the migrated-to
                // rule (spec 3.8) lets the finalizer go although the PV stays.
                Step::Pause(SETTLE),
                Step::Snapshot("detached"),
                Step::DeletePv("pv"),
                Step::WaitPvGone("pv"),
                Step::Snapshot("pv-gone"),
            ],
            known_difference: None,
        }],
    }
}
