//! The reference Go external-attacher (v4.13.0), hosted by the harness
//! against the Go mock CSI driver, attaches and detaches a VolumeAttachment.
//! Later tests run attacher-hub through the same harness.

use crate::support;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;

use support::{
    Cluster, MockCsi, MockCsiOptions, PvBuilder, WAIT_TIMEOUT, attacher_finalizer, create_csinode,
    create_node, create_va, has_finalizer, is_attached, start_reference_attacher,
    unique_driver_name, unique_name, wait_deleted, wait_for,
};

#[tokio::test]
async fn reference_attacher_attaches_and_detaches_through_the_harness() {
    let cluster = Cluster::get();
    let client = cluster.client().await;

    let driver = unique_driver_name("ref");
    let mut mock = MockCsi::start(cluster, &driver, MockCsiOptions::default()).await;
    assert_eq!(mock.volumes.len(), 2, "mockcsi pre-created two volumes");
    let mut attacher = start_reference_attacher(cluster, mock.socket(), &[]);

    let node = unique_name("node");
    create_node(&client, &node).await;
    create_csinode(&client, &node, &driver, mock.node_id()).await;
    let pv = unique_name("pv");
    PvBuilder::new(&pv, &driver, &mock.volumes[0])
        .create(&client)
        .await;
    let va_name = unique_name("va");
    create_va(&client, &va_name, &driver, &node, &pv).await;

    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let finalizer = attacher_finalizer(&driver);
    assert_ne!(
        finalizer,
        format!("external-attacher/{driver}"),
        "the driver name is sanitized"
    );

    let attached = wait_for(
        &vas,
        &va_name,
        "status.attached=true",
        is_attached(),
        WAIT_TIMEOUT,
    )
    .await
    .unwrap();
    let finalizers = attached.metadata.finalizers.unwrap_or_default();
    assert!(
        finalizers.contains(&finalizer),
        "VA finalizers {finalizers:?} lack {finalizer}"
    );
    // The Go attacher may publish again when its own VA update comes back
    // before the status does; publish is idempotent, so only "at least once" is asserted.
    assert!(mock.calls("ControllerPublishVolume") >= 1);
    wait_for(
        &pvs,
        &pv,
        &format!("finalizer {finalizer}"),
        has_finalizer(&finalizer),
        WAIT_TIMEOUT,
    )
    .await
    .unwrap();

    vas.delete(&va_name, &Default::default())
        .await
        .expect("delete the VA");
    mock.wait_for_calls("ControllerUnpublishVolume", 1, WAIT_TIMEOUT)
        .await
        .unwrap();
    wait_deleted(&vas, &va_name, WAIT_TIMEOUT).await.unwrap();

    assert!(
        attacher.exited().is_none(),
        "csi-attacher kept running through the test"
    );
    attacher.stop().await;
}

#[test]
fn harness_sanitizes_driver_names_like_external_attacher() {
    // A dot becomes `-`; a trailing `-` gets an `X` (`docs/design.md#names`).
    assert_eq!(
        support::sanitize_driver_name("hostpath.csi.k8s.io"),
        "hostpath-csi-k8s-io"
    );
    assert_eq!(support::sanitize_driver_name("csi-driver."), "csi-driver-X");
    assert_eq!(
        attacher_finalizer("ebs.csi.aws.com"),
        "external-attacher/ebs-csi-aws-com"
    );
}

#[test]
fn harness_names_are_unique_dns_labels_even_for_long_test_names() {
    let a = unique_name("a-very-long-tag-that-goes-on-and-on");
    let b = unique_name("a-very-long-tag-that-goes-on-and-on");
    let driver = unique_driver_name("drv");
    assert_ne!(a, b);
    for name in [&a, &b, &driver] {
        assert!(name.len() <= 63, "{name} is longer than 63");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
            "{name} is not DNS-1123"
        );
        assert!(
            name.starts_with(|c: char| c.is_ascii_alphanumeric()),
            "{name}"
        );
        assert!(
            name.ends_with(|c: char| c.is_ascii_alphanumeric()),
            "{name}"
        );
    }
    assert!(
        a.starts_with("harness-names-are-unique"),
        "{a} carries the test name"
    );
}
