//! attacher-hub among the peers it meets in a real cluster: the
//! VolumeAttachments come from kube-controller-manager's attach-detach
//! controller, made from Pods and their claims, and the driver is the GCE PD
//! CSI driver's own controller service on its fake cloud (`pd-controller`).
//! Nothing here writes a VolumeAttachment by hand.
//!
//! * sidecar mode, the PD driver alone: Pods on two Nodes attach (the VA
//!   kube-controller-manager made is attached, the volume is in
//!   `node.status.volumesAttached`, the disk is on the Node's instance in the
//!   fake cloud, read-only for a ReadOnlyMany volume used on both Nodes); a
//!   read-write volume whose Pod moves to the other Node is detached first,
//!   then attached there; deleted Pods' volumes are detached everywhere;
//! * hub mode, the PD driver and two mock drivers (the project's Rust mock and
//!   the Go mock) in one attacher-hub: the same, for all three drivers;
//! * migration: in-tree `gcePersistentDisk` PVs (with and without a zone
//!   label) and a Pod's inline `gcePersistentDisk` volume, translated by
//!   kube-controller-manager and by the attacher, attach the right disks;
//! * dynamic provisioning: external-provisioner creates the disk and the PV
//!   for a claim of a StorageClass of the PD driver, and the Pod's volume is
//!   attached (and the disk deleted with the claim).
//!
//! kube-controller-manager runs with the shared control plane
//! (`scripts/cluster-up.sh --controller-manager`); every test has its own
//! Nodes, PD controller (its own fake cloud) and attacher. The migration test
//! uses the fixed driver name `pd.csi.storage.gke.io`, which no other test of
//! this binary uses.

use crate::peers;
use crate::support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::process::Command;

use peers::{
    Attacher, NodeIdOf, PEER_TIMEOUT, Stage, driver_name_id, node_name_id, start_attachers,
};
use support::{
    ChildProcess, Cluster, MockCsi, MockCsiOptions, MockProcess, NAMESPACE, PD_MIGRATION_DRIVER,
    PD_ZONE, PdController, PdOptions, PodVolume, Source, StaticVolume, attacher_finalizer,
    create_pod, delete_pod, has_disk, holders, unique_driver_name, unique_name, va_attached, va_pv,
    wait_deleted, wait_for, wait_gone_from_node_status, wait_in_node_status, wait_vas,
};

/// Waits until the VolumeAttachment of `volume` (a PV name; `None`: the
/// inline volume) on `node` exists, is attached and carries the attacher's
/// finalizer; checks that kube-controller-manager named it (`csi-<sha256>`).
async fn expect_va_attached(
    client: &Client,
    driver: &str,
    node: &str,
    volume: Option<&str>,
) -> VolumeAttachment {
    let finalizer = attacher_finalizer(driver);
    let pv = volume.unwrap_or("");
    let vas = wait_vas(
        client,
        driver,
        node,
        &format!("attached ({pv:?})"),
        PEER_TIMEOUT,
        |vas| {
            vas.iter().any(|va| {
                va_pv(va) == pv
                    && va_attached(va)
                    && va
                        .metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == &finalizer)
            })
        },
    )
    .await;
    let va = vas
        .into_iter()
        .find(|va| va_pv(va) == pv)
        .expect("found above");
    let name = va.metadata.name.clone().unwrap_or_default();
    assert!(
        name.starts_with("csi-") && name.len() == 4 + 64,
        "VA {name} is not named by kube-controller-manager (csi-<sha256>)"
    );
    va
}

/// Waits until no VolumeAttachment of `driver` on `node` names PV `volume`.
async fn expect_no_va(client: &Client, driver: &str, node: &str, volume: &str) {
    wait_vas(
        client,
        driver,
        node,
        &format!("without {volume}"),
        PEER_TIMEOUT,
        |vas| !vas.iter().any(|va| va_pv(va) == volume),
    )
    .await;
}

/// A PD volume is attached to `node`: the VA, the node status and the disk on
/// the instance (in `mode`).
async fn expect_pd_attached(
    stage: &Stage,
    node: &str,
    volume: &StaticVolume,
    disk: &str,
    mode: &str,
) {
    expect_va_attached(&stage.client, stage.driver(), node, Some(&volume.name)).await;
    wait_in_node_status(
        &stage.client,
        node,
        &volume.unique_name(PD_ZONE),
        PEER_TIMEOUT,
    )
    .await;
    stage
        .pd
        .wait_attachments(&format!("{disk} on {node} ({mode})"), PEER_TIMEOUT, |a| {
            has_disk(a, node, disk, mode)
        })
        .await;
}

/// A PD volume is detached from `node`: no VA, not in the node status, the
/// disk not on the instance.
async fn expect_pd_detached(stage: &Stage, node: &str, volume: &StaticVolume, disk: &str) {
    expect_no_va(&stage.client, stage.driver(), node, &volume.name).await;
    wait_gone_from_node_status(
        &stage.client,
        node,
        &volume.unique_name(PD_ZONE),
        PEER_TIMEOUT,
    )
    .await;
    stage
        .pd
        .wait_attachments(&format!("{disk} off {node}"), PEER_TIMEOUT, |a| {
            !holders(a, disk).contains(&node.to_string())
        })
        .await;
}

/// The same story in both modes; in hub mode two mock drivers ride along.
async fn pods_attach_move_and_detach(which: Attacher) {
    let cluster = Cluster::get();
    let hub_mode = which == Attacher::Hub;
    let pd_driver = unique_driver_name("pd");
    let rust_driver = unique_driver_name("rust");
    let go_driver = unique_driver_name("go");
    let others: Vec<(String, NodeIdOf)> = if hub_mode {
        vec![
            (rust_driver.clone(), node_name_id),
            (go_driver.clone(), driver_name_id),
        ]
    } else {
        Vec::new()
    };
    let disks = [unique_name("d0"), unique_name("d1"), unique_name("dro")];
    let mut stage = Stage::new(
        cluster,
        &pd_driver,
        2,
        PdOptions {
            disks: disks.to_vec(),
            ..PdOptions::default()
        },
        &others,
    )
    .await;
    let client = stage.client.clone();
    let (n0, n1) = (stage.nodes[0].clone(), stage.nodes[1].clone());

    let mut sockets = vec![(pd_driver.clone(), stage.socket().to_path_buf())];
    let mut mocks = None;
    if hub_mode {
        let rust = MockProcess::start(&rust_driver, 2).await;
        let go = MockCsi::start(
            cluster,
            &go_driver,
            MockCsiOptions {
                volumes: 2,
                ..MockCsiOptions::default()
            },
        )
        .await;
        sockets.push((rust_driver.clone(), rust.socket().to_path_buf()));
        sockets.push((go_driver.clone(), go.socket().to_path_buf()));
        mocks = Some((rust, go));
    }
    let _attachers = start_attachers(cluster, which, &sockets, &[]);

    // Two read-write disks and one read-only-many disk (readOnly, as GCE
    // attaches a disk to several instances only read-only).
    let pd = |disk: &str| Source::csi(&pd_driver, &PdController::volume_id(disk));
    let rw0 = StaticVolume::new(&unique_name("rw0"), pd(&disks[0]));
    let rw1 = StaticVolume::new(&unique_name("rw1"), pd(&disks[1]));
    let ro = StaticVolume::new(
        &unique_name("ro"),
        Source::Csi {
            driver: pd_driver.clone(),
            volume_handle: PdController::volume_id(&disks[2]),
            read_only: true,
            volume_attributes: BTreeMap::new(),
        },
    )
    .access_modes(&["ReadOnlyMany"]);
    let mut volumes = vec![rw0.clone(), rw1.clone(), ro.clone()];
    if let Some((_, go)) = &mocks {
        volumes.push(StaticVolume::new(
            &unique_name("rust"),
            Source::csi(&rust_driver, "vol-0"),
        ));
        volumes.push(StaticVolume::new(
            &unique_name("go"),
            Source::csi(&go_driver, &go.volumes[0]),
        ));
    }
    for v in &volumes {
        v.create(&client).await;
        stage.volumes.push(v.name.clone());
    }
    let ro_use = PodVolume::Claim {
        claim: ro.name.clone(),
        read_only: true,
    };
    let (p0, p1) = (unique_name("p0"), unique_name("p1"));
    let mut p0_volumes = vec![PodVolume::claim(&rw0.name), ro_use.clone()];
    let mut p1_volumes = vec![PodVolume::claim(&rw1.name), ro_use.clone()];
    if hub_mode {
        p0_volumes.push(PodVolume::claim(&volumes[3].name));
        p1_volumes.push(PodVolume::claim(&volumes[4].name));
    }
    create_pod(&client, &p0, &n0, &p0_volumes).await;
    create_pod(&client, &p1, &n1, &p1_volumes).await;
    stage.pods.extend([p0.clone(), p1.clone()]);

    // Both Pods' volumes attached, the read-only-many one on both Nodes.
    expect_pd_attached(&stage, &n0, &rw0, &disks[0], "READ_WRITE").await;
    expect_pd_attached(&stage, &n1, &rw1, &disks[1], "READ_WRITE").await;
    expect_pd_attached(&stage, &n0, &ro, &disks[2], "READ_ONLY").await;
    expect_pd_attached(&stage, &n1, &ro, &disks[2], "READ_ONLY").await;
    if hub_mode {
        for (node, v, driver) in [
            (&n0, &volumes[3], &rust_driver),
            (&n1, &volumes[4], &go_driver),
        ] {
            expect_va_attached(&client, driver, node, Some(&v.name)).await;
            let Source::Csi { volume_handle, .. } = &v.source else {
                unreachable!("mock volumes are CSI volumes")
            };
            wait_in_node_status(
                &client,
                node,
                &support::unique_volume_name(driver, volume_handle),
                PEER_TIMEOUT,
            )
            .await;
        }
    }

    // The read-write volume's Pod moves to the other Node: detached from the
    // first one before it is attached to the second (kube-controller-manager
    // holds the attach while the volume is attached elsewhere; GCE would
    // refuse it too, and the fake cloud says so).
    delete_pod(&client, &p0, PEER_TIMEOUT).await;
    let p0b = unique_name("p0b");
    create_pod(&client, &p0b, &n1, &[PodVolume::claim(&rw0.name)]).await;
    stage.pods.push(p0b.clone());
    expect_pd_detached(&stage, &n0, &rw0, &disks[0]).await;
    expect_pd_attached(&stage, &n1, &rw0, &disks[0], "READ_WRITE").await;
    // p0 was the read-only volume's only user on n0.
    expect_pd_detached(&stage, &n0, &ro, &disks[2]).await;
    let attachments = stage.pd.attachments().await;
    assert_eq!(
        holders(&attachments, &disks[0]),
        std::slice::from_ref(&n1),
        "{attachments:?}"
    );
    assert_eq!(
        holders(&attachments, &disks[2]),
        std::slice::from_ref(&n1),
        "{attachments:?}"
    );
    let calls = stage.pd.calls().await;
    let vol0 = PdController::volume_id(&disks[0]);
    let off_n0 = calls
        .iter()
        .filter(|c| c.method == "ControllerUnpublishVolume" && c.volume_id == vol0)
        .filter(|c| c.node_id == PdController::node_id(&n0) && c.code == "OK")
        .map(|c| c.end_ms)
        .max()
        .unwrap_or_else(|| panic!("no ControllerUnpublish of {vol0} from {n0}: {calls:#?}"));
    let on_n1 = calls
        .iter()
        .filter(|c| c.method == "ControllerPublishVolume" && c.volume_id == vol0)
        .filter(|c| c.node_id == PdController::node_id(&n1))
        .map(|c| c.start_ms)
        .min()
        .unwrap_or_else(|| panic!("no ControllerPublish of {vol0} to {n1}: {calls:#?}"));
    assert!(
        off_n0 <= on_n1,
        "{vol0} was published to {n1} (at {on_n1}) before it was unpublished from {n0} (at {off_n0}): {calls:#?}"
    );
    let refused: Vec<_> = calls.iter().filter(|c| c.code != "OK").collect();
    assert!(
        refused.is_empty(),
        "the PD controller refused calls: {refused:#?}"
    );

    // Every Pod deleted: every volume detached, everywhere.
    delete_pod(&client, &p1, PEER_TIMEOUT).await;
    delete_pod(&client, &p0b, PEER_TIMEOUT).await;
    expect_pd_detached(&stage, &n1, &rw1, &disks[1]).await;
    expect_pd_detached(&stage, &n1, &rw0, &disks[0]).await;
    expect_pd_detached(&stage, &n1, &ro, &disks[2]).await;
    if hub_mode {
        for (node, v, driver) in [
            (&n0, &volumes[3], &rust_driver),
            (&n1, &volumes[4], &go_driver),
        ] {
            expect_no_va(&client, driver, node, &v.name).await;
            let Source::Csi { volume_handle, .. } = &v.source else {
                unreachable!("mock volumes are CSI volumes")
            };
            wait_gone_from_node_status(
                &client,
                node,
                &support::unique_volume_name(driver, volume_handle),
                PEER_TIMEOUT,
            )
            .await;
        }
    }
    let attachments = stage.pd.attachments().await;
    assert!(
        attachments.values().all(Vec::is_empty),
        "disks still attached: {attachments:?}"
    );
    stage.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_mode_pods_on_two_nodes_attach_move_and_detach() {
    pods_attach_move_and_detach(Attacher::HubSidecar).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_mode_pd_and_two_mocks_pods_attach_move_and_detach() {
    pods_attach_move_and_detach(Attacher::Hub).await;
}

/// One run of the migration story with `which`.
async fn migrated_volumes_attach(which: Attacher) {
    let cluster = Cluster::get();
    let disks = [
        unique_name("zoned"),
        unique_name("unzoned"),
        unique_name("inline"),
    ];
    let mut stage = Stage::new(
        cluster,
        PD_MIGRATION_DRIVER,
        1,
        PdOptions {
            disks: disks.to_vec(),
            ..PdOptions::default()
        },
        &[],
    )
    .await;
    let client = stage.client.clone();
    let node = stage.nodes[0].clone();
    let _attachers = start_attachers(
        cluster,
        which,
        &[(
            PD_MIGRATION_DRIVER.to_string(),
            stage.socket().to_path_buf(),
        )],
        &[],
    );

    // One PV with the zone label (its handle names the zone), one without
    // (the driver finds the zone), and an inline volume in the Pod.
    let zoned = StaticVolume::new(
        &unique_name("zoned"),
        Source::GcePd {
            pd_name: disks[0].clone(),
        },
    )
    .label("topology.kubernetes.io/zone", PD_ZONE);
    let unzoned = StaticVolume::new(
        &unique_name("unzoned"),
        Source::GcePd {
            pd_name: disks[1].clone(),
        },
    );
    for v in [&zoned, &unzoned] {
        v.create(&client).await;
        stage.volumes.push(v.name.clone());
    }
    let pod = unique_name("pod");
    create_pod(
        &client,
        &pod,
        &node,
        &[
            PodVolume::claim(&zoned.name),
            PodVolume::claim(&unzoned.name),
            PodVolume::GcePd {
                pd_name: disks[2].clone(),
            },
        ],
    )
    .await;
    stage.pods.push(pod.clone());

    for (volume, zone) in [
        (Some(zoned.name.as_str()), PD_ZONE),
        (Some(unzoned.name.as_str()), "UNSPECIFIED"),
    ] {
        expect_va_attached(&client, PD_MIGRATION_DRIVER, &node, volume).await;
        let v = if volume == Some(zoned.name.as_str()) {
            &zoned
        } else {
            &unzoned
        };
        wait_in_node_status(&client, &node, &v.unique_name(zone), PEER_TIMEOUT).await;
    }
    // The inline volume: a VA with the translated spec inline.
    let inline = expect_va_attached(&client, PD_MIGRATION_DRIVER, &node, None).await;
    let spec = inline
        .spec
        .source
        .inline_volume_spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .unwrap_or_else(|| panic!("inline VA without a CSI inline spec: {inline:?}"));
    assert_eq!(
        spec.volume_handle,
        format!("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/{}", disks[2])
    );
    wait_in_node_status(
        &client,
        &node,
        &support::unique_volume_name(PD_MIGRATION_DRIVER, &spec.volume_handle),
        PEER_TIMEOUT,
    )
    .await;
    // The right disks, read-write, on the Node's instance.
    stage
        .pd
        .wait_attachments("the three disks on the node", PEER_TIMEOUT, |a| {
            disks.iter().all(|d| has_disk(a, &node, d, "READ_WRITE"))
        })
        .await;
    let attachments = stage.pd.attachments().await;
    assert_eq!(attachments[&node].len(), 3, "{attachments:?}");

    delete_pod(&client, &pod, PEER_TIMEOUT).await;
    wait_vas(
        &client,
        PD_MIGRATION_DRIVER,
        &node,
        "gone",
        PEER_TIMEOUT,
        <[_]>::is_empty,
    )
    .await;
    stage
        .pd
        .wait_attachments("no disk on the node", PEER_TIMEOUT, |a| a[&node].is_empty())
        .await;
    support::wait_volumes_attached(&client, &node, "empty", PEER_TIMEOUT, <[_]>::is_empty).await;
    stage.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrated_in_tree_pd_volumes_attach_the_right_disks_in_sidecar_and_hub_mode() {
    // The same driver name in both runs: one after the other.
    migrated_volumes_attach(Attacher::HubSidecar).await;
    migrated_volumes_attach(Attacher::Hub).await;
}

/// external-provisioner v6.4.0 for the driver at `socket`, as the admin.
fn start_provisioner(cluster: &Cluster, socket: &std::path::Path) -> ChildProcess {
    let mut cmd = Command::new(cluster.bin("csi-provisioner"));
    cmd.arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .arg(format!("--csi-address={}", socket.display()))
        .args(["--timeout=30s", "--retry-interval-start=500ms", "--v=4"]);
    ChildProcess::spawn("csi-provisioner", cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_a_pd_storage_class_is_provisioned_and_its_pod_attached() {
    let cluster = Cluster::get();
    let driver = unique_driver_name("pd");
    let mut stage = Stage::new(cluster, &driver, 1, PdOptions::default(), &[]).await;
    let client = stage.client.clone();
    let node = stage.nodes[0].clone();
    let _attacher = start_attachers(
        cluster,
        Attacher::HubSidecar,
        &[(driver.clone(), stage.socket().to_path_buf())],
        &[],
    );
    let mut provisioner = start_provisioner(cluster, stage.socket());

    let class = unique_name("sc");
    let classes = Api::<StorageClass>::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClass {
                metadata: ObjectMeta {
                    name: Some(class.clone()),
                    ..ObjectMeta::default()
                },
                provisioner: driver.clone(),
                parameters: Some(BTreeMap::from([(
                    "type".to_string(),
                    "pd-balanced".to_string(),
                )])),
                reclaim_policy: Some("Delete".to_string()),
                volume_binding_mode: Some("Immediate".to_string()),
                ..StorageClass::default()
            },
        )
        .await
        .expect("create StorageClass");
    let claim = unique_name("claim");
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    claims
        .create(
            &PostParams::default(),
            &PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(claim.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".to_string()]),
                    storage_class_name: Some(class.clone()),
                    resources: Some(k8s_openapi::api::core::v1::VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity("10Gi".to_string()),
                        )])),
                        ..Default::default()
                    }),
                    ..PersistentVolumeClaimSpec::default()
                }),
                ..PersistentVolumeClaim::default()
            },
        )
        .await
        .expect("create PVC");

    // The PV binder asks the provisioner, the provisioner has the driver
    // create the disk and creates the PV, the binder binds the claim.
    let bound = wait_for(
        &claims,
        &claim,
        "status.phase=Bound",
        |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.phase.as_deref() == Some("Bound"))
        },
        PEER_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| {
        provisioner.dump_logs();
        panic!("{e}")
    });
    let pv_name = bound
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .expect("a bound claim names its PV");
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pv = pvs.get(&pv_name).await.expect("the provisioned PV");
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("a CSI PV");
    let disk = handle.rsplit('/').next().unwrap_or_default().to_string();
    assert!(
        stage
            .pd
            .disks()
            .await
            .contains(&format!("{PD_ZONE}/{disk}")),
        "the fake cloud has no disk {disk} for {handle}"
    );

    let pod = unique_name("pod");
    create_pod(&client, &pod, &node, &[PodVolume::claim(&claim)]).await;
    stage.pods.push(pod.clone());
    expect_va_attached(&client, &driver, &node, Some(&pv_name)).await;
    wait_in_node_status(
        &client,
        &node,
        &support::unique_volume_name(&driver, &handle),
        PEER_TIMEOUT,
    )
    .await;
    stage
        .pd
        .wait_attachments("the provisioned disk on the node", PEER_TIMEOUT, |a| {
            has_disk(a, &node, &disk, "READ_WRITE")
        })
        .await;

    // Pod, then claim deleted: detached, then the disk and the PV deleted.
    delete_pod(&client, &pod, PEER_TIMEOUT).await;
    expect_no_va(&client, &driver, &node, &pv_name).await;
    claims
        .delete(&claim, &DeleteParams::default())
        .await
        .expect("delete PVC");
    wait_deleted(&pvs, &pv_name, PEER_TIMEOUT)
        .await
        .unwrap_or_else(|e| {
            provisioner.dump_logs();
            panic!("{e}")
        });
    assert!(
        !stage
            .pd
            .disks()
            .await
            .contains(&format!("{PD_ZONE}/{disk}")),
        "disk {disk} was not deleted with its claim"
    );
    provisioner.stop().await;
    let _ = classes.delete(&class, &DeleteParams::default()).await;
    stage.cleanup().await;
}
