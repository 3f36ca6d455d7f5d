//! The project's kube client against the local control plane: a
//! VolumeAttachment round trip, a status patch through the status
//! subresource, and the limits of the attacher identity's RBAC.

use crate::support;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use support::{Cluster, create_va, unique_driver_name, unique_name};

#[tokio::test]
async fn volume_attachment_round_trips_spec_and_status() {
    let cluster = Cluster::get();
    let admin = cluster.client().await;
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());

    let name = unique_name("va");
    let driver = unique_driver_name("drv");
    let node = unique_name("node");
    let pv = unique_name("pv");
    let created = create_va(&admin, &name, &driver, &node, &pv).await;
    assert!(
        created.metadata.uid.is_some(),
        "the API server assigns a uid"
    );
    // Go serialises the zero status (`attached` is not omitempty).
    assert!(
        created.status.as_ref().is_none_or(|s| !s.attached),
        "a new VA is not attached: {:?}",
        created.status
    );

    let read = vas.get(&name).await.expect("read the VA back");
    assert_eq!(read.spec.attacher, driver);
    assert_eq!(read.spec.node_name, node);
    assert_eq!(
        read.spec.source.persistent_volume_name.as_deref(),
        Some(pv.as_str())
    );
    assert!(read.spec.source.inline_volume_spec.is_none());
    assert_eq!(read.metadata.uid, created.metadata.uid);

    // The attacher writes status through the status subresource, with its own identity.
    let attacher_vas: Api<VolumeAttachment> = Api::all(cluster.attacher_client().await);
    let status = json!({
        "status": {
            "attached": true,
            "attachmentMetadata": {"devicePath": "/dev/mock", "readonly": "false"},
        }
    });
    attacher_vas
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the attacher identity may patch volumeattachments/status");

    let read = vas
        .get(&name)
        .await
        .expect("read the VA after the status patch");
    let got = read.status.expect("status is set");
    assert!(got.attached);
    let metadata = got.attachment_metadata.expect("attachmentMetadata is set");
    assert_eq!(
        metadata.get("devicePath").map(String::as_str),
        Some("/dev/mock")
    );
    assert_eq!(metadata.get("readonly").map(String::as_str), Some("false"));
    assert_eq!(
        read.spec.attacher, driver,
        "a status patch leaves the spec alone"
    );

    // Through the main resource the status is ignored (status subresource semantics).
    let ignored = json!({"status": {"attached": false}});
    let after = vas
        .patch(&name, &PatchParams::default(), &Patch::Merge(&ignored))
        .await
        .expect("merge patch on the main resource");
    assert!(after.status.is_some_and(|s| s.attached));

    vas.delete(&name, &Default::default())
        .await
        .expect("delete the VA");
}

#[tokio::test]
async fn attacher_identity_has_only_the_attacher_rbac() {
    let cluster = Cluster::get();
    let attacher = cluster.attacher_client().await;

    let vas: Api<VolumeAttachment> = Api::all(attacher.clone());
    vas.list(&Default::default())
        .await
        .expect("the attacher identity may list volumeattachments");

    let va = support::va(&unique_name("va"), "x.csi.test", "node", "pv");
    let err = vas
        .create(&PostParams::default(), &va)
        .await
        .expect_err("creating a VA is not in the attacher's RBAC");
    assert_forbidden(&err);

    let nodes: Api<Node> = Api::all(attacher);
    let err = nodes
        .list(&Default::default())
        .await
        .expect_err("reading nodes is not in the attacher's RBAC");
    assert_forbidden(&err);
}

fn assert_forbidden(err: &kube::Error) {
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "expected 403, got {status:?}"),
        other => panic!("expected a 403 from the API server, got {other}"),
    }
}
