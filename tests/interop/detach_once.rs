//! VAs deleted while their ControllerPublishVolume is under way: each is attached, then
//! unpublished exactly once by attacher-hub, while the Go external-attacher v4.13.0 beside it
//! (same flags, the same kind of driver) is only reported.
//!
//! The race: the attach's own writes (finalizer and annotation, then `attached: true`) come
//! back through the watch while the detach waits for the VA and while it runs, so the VA is
//! queued again; the sync right after the detach can read a cached copy that still shows the
//! finalizer the detach just removed (its deletion not delivered yet), and unpublish a second
//! time (`docs/design.md#own-writes`). The wider the gap between a write and its echo, the
//! likelier: a busy machine shows it in one VA of a few; this test deletes many.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use mock_csi_driver::{MockDriver, fault::Fault};

use crate::retry_pacing::{Side, start_attacher};
use crate::support::{
    Cluster, PvBuilder, WAIT_TIMEOUT, attacher_finalizer, create_csinode, create_node, create_va,
    unique_driver_name, unique_name, wait_deleted,
};

/// VAs deleted mid-publish per side.
const VAS: usize = 24;
/// How long each ControllerPublishVolume takes (below the attachers' `--timeout=2s`).
const PUBLISH_TAKES: Duration = Duration::from_secs(1);

const PUBLISH: &str = "ControllerPublishVolume";
const UNPUBLISH: &str = "ControllerUnpublishVolume";

/// Successful calls of `method` per volume.
fn ok_calls(calls: &[mock_csi_driver::CallRecord], method: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for c in calls
        .iter()
        .filter(|c| c.method == method && c.code.as_deref() == Some("Ok"))
    {
        *out.entry(c.volume_id.clone()).or_default() += 1;
    }
    out
}

/// Successful publishes and unpublishes per volume of one side.
struct Counts {
    publishes: BTreeMap<String, usize>,
    unpublishes: BTreeMap<String, usize>,
}

async fn run(side: Side) -> Counts {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let driver = unique_driver_name(match side {
        Side::Go => "once-go",
        Side::Hub => "once-hub",
    });
    let dir = tempfile::tempdir().expect("a socket directory");
    let socket = dir.path().join("csi.sock");
    let mock = MockDriver::new(&driver)
        .volumes(VAS)
        .fault(PUBLISH, Fault::delay(PUBLISH_TAKES))
        .serve(&socket)
        .await
        .expect("the mock driver serves");
    let mut attacher = start_attacher(side, cluster, &socket);
    let node = unique_name("once-node");
    create_node(&client, &node).await;
    create_csinode(&client, &node, &driver, "nid-once").await;
    let run = unique_name("once");
    let names: Vec<(String, String)> = (0..VAS)
        .map(|i| (format!("{run}-va-{i}"), format!("{run}-pv-{i}")))
        .collect();
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(8, |(i, (va, pv))| {
            let (client, driver, node) = (&client, &driver, &node);
            async move {
                PvBuilder::new(pv, driver, &format!("vol-{i}"))
                    .create(client)
                    .await;
                create_va(client, va, driver, node, pv).await;
            }
        })
        .await;

    // Each VA is deleted as soon as it carries the attacher's finalizer: the attacher's last
    // write before it calls ControllerPublishVolume, which then takes 1 s.
    delete_when_finalized(&client, &driver, &names, side).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    for (va, _) in &names {
        wait_deleted(&vas, va, WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{side:?}: {e}"));
    }
    // Nothing more comes after a settled detach: give a late duplicate its chance to show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = mock.calls();

    // The PVs go too (the attacher removes its PV finalizer once they are deleted).
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for (_, pv) in &names {
        let _ = pvs.delete(pv, &DeleteParams::default()).await;
    }
    for (_, pv) in &names {
        wait_deleted(&pvs, pv, WAIT_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{side:?}: {e}"));
    }
    assert!(
        attacher.exited().is_none(),
        "{side:?}: the attacher kept running"
    );
    attacher.stop().await;
    mock.shutdown().await;
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{run}-{side:?}.log"));
    std::fs::write(
        &log,
        format!("{}\n{}", attacher.stdout(), attacher.stderr()),
    )
    .expect("the attacher's log");
    println!("detach once: {side:?}'s log in {}", log.display());
    Counts {
        publishes: ok_calls(&calls, PUBLISH),
        unpublishes: ok_calls(&calls, UNPUBLISH),
    }
}

/// Deletes each VA of `names` once it carries `driver`'s attacher finalizer.
async fn delete_when_finalized(
    client: &Client,
    driver: &str,
    names: &[(String, String)],
    side: Side,
) {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let finalizer = attacher_finalizer(driver);
    let mut left: Vec<&str> = names.iter().map(|(va, _)| va.as_str()).collect();
    let deadline = tokio::time::Instant::now() + WAIT_TIMEOUT;
    while !left.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{side:?}: VAs never finalized: {left:?}"
        );
        let list = vas
            .list(&ListParams::default())
            .await
            .expect("list VolumeAttachments");
        for va in list.items {
            let name = va.metadata.name.clone().unwrap_or_default();
            let finalized = va
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| *f == finalizer);
            if finalized && let Some(i) = left.iter().position(|n| *n == name) {
                left.swap_remove(i);
                vas.delete(&name, &DeleteParams::default())
                    .await
                    .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vas_deleted_during_slow_publishes_are_unpublished_once() {
    let (go, hub) = tokio::join!(run(Side::Go), run(Side::Hub));
    let twice = |c: &BTreeMap<String, usize>| c.values().filter(|n| **n > 1).count();
    println!(
        "detach once: {VAS} VAs deleted mid-publish; volumes unpublished more than once: Go {}, hub {}; published more than once: Go {}, hub {}",
        twice(&go.unpublishes),
        twice(&hub.unpublishes),
        twice(&go.publishes),
        twice(&hub.publishes)
    );
    let volumes: Vec<String> = (0..VAS).map(|i| format!("vol-{i}")).collect();
    for volume in &volumes {
        let count = |m: &BTreeMap<String, usize>| m.get(volume).copied().unwrap_or(0);
        assert_eq!(
            (count(&hub.publishes), count(&hub.unpublishes)),
            (1, 1),
            "{volume}: the hub's successful ControllerPublishVolume and ControllerUnpublishVolume calls"
        );
        // Go attaches and detaches each too, perhaps more than once.
        assert!(
            count(&go.publishes) >= 1 && count(&go.unpublishes) >= 1,
            "{volume}: Go's calls: publish {}, unpublish {}",
            count(&go.publishes),
            count(&go.unpublishes)
        );
    }
}
