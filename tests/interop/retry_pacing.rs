//! The pace of ControllerUnpublishVolume retries for a VA whose attaches failed, against the Go
//! external-attacher v4.13.0 on the same failing driver.
//!
//! The Go attacher has one queue for attach and detach, so a VA keeps one failure count: when
//! a VA whose ControllerPublishVolume failed F times is deleted and its
//! ControllerUnpublishVolume fails too, the detach retries continue the doubling where the
//! attaches left off (`--retry-interval-start × 2^(F + i)`), not from the start. attacher-hub
//! attaches and detaches in two pools, which share one failure count per VA
//! (`docs/design.md#work-queue`); before they did, a failing driver got twice the calls.
//!
//! Compared as properties that a busy machine cannot break: a retry timer never fires early, so
//! every interval between two unpublish calls has a lower bound set by the failure count, and
//! load only makes intervals longer. The Go attacher's first detach retry comes at the
//! deadline its last attach failure had set (client-go's delaying queue keeps a key's earlier
//! deadline), so its first interval is left out of its bound; the hub drops that pending
//! attach retry when the VA is deleted, so all of its intervals meet the bound.

use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use mock_csi_driver::{CallRecord, MockDriver, fault::Fault};

use crate::support::{
    ChildProcess, Cluster, PvBuilder, WAIT_TIMEOUT, create_csinode, create_node, create_va,
    start_reference_attacher, unique_driver_name, unique_name, wait_deleted,
};

/// `--retry-interval-start`: short, so that the doubling reaches seconds within a few failures.
const START: Duration = Duration::from_millis(100);
/// Failed attaches before the VA is deleted.
const ATTACH_FAILURES: usize = 4;
/// Failed unpublish calls observed on each side (three intervals).
const UNPUBLISHES: usize = 4;
/// How long the unpublish calls may take to come; the hub's three take 1.6 + 3.2 + 6.4 s.
const OBSERVE: Duration = Duration::from_secs(90);

const PUBLISH: &str = "ControllerPublishVolume";
const UNPUBLISH: &str = "ControllerUnpublishVolume";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The reference external-attacher.
    Go,
    /// attacher-hub in sidecar mode.
    Hub,
}

/// The attacher of `side` on the driver at `socket`, with the same flags on both sides.
pub(crate) fn start_attacher(
    side: Side,
    cluster: &Cluster,
    socket: &std::path::Path,
) -> ChildProcess {
    let flags = [
        "--timeout=2s",
        "--retry-interval-start=100ms",
        "--retry-interval-max=5m",
    ];
    match side {
        Side::Go => start_reference_attacher(cluster, socket, &flags),
        Side::Hub => {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
            cmd.arg(format!(
                "--kubeconfig={}",
                cluster.attacher_kubeconfig.display()
            ))
            .arg(format!("--csi-address={}", socket.display()))
            .args(["--kube-api-qps=100", "--kube-api-burst=200", "-v=4"])
            .args(flags);
            ChildProcess::spawn("attacher-hub", cmd)
        }
    }
}

/// Arrival times (ms since the epoch) of the calls of `method`, oldest first.
fn times(calls: &[CallRecord], method: &str) -> Vec<u64> {
    calls
        .iter()
        .filter(|c| c.method == method)
        .map(|c| c.time_unix_ms)
        .collect()
}

/// What one side did: the number of failed publishes before its first unpublish, and the
/// intervals between its unpublish calls.
#[derive(Debug)]
struct Pace {
    attach_failures: u32,
    intervals: Vec<Duration>,
}

/// One VA of a fresh driver whose ControllerPublishVolume and ControllerUnpublishVolume both
/// fail: attached in vain [`ATTACH_FAILURES`] times, then deleted; the unpublish calls that
/// follow, then the VA detached once the driver recovers.
async fn run(side: Side) -> Pace {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let driver = unique_driver_name(match side {
        Side::Go => "pace-go",
        Side::Hub => "pace-hub",
    });
    let dir = tempfile::tempdir().expect("a socket directory");
    let socket = dir.path().join("csi.sock");
    let mock = MockDriver::new(&driver)
        .volumes(1)
        .fault(PUBLISH, Fault::code(tonic::Code::Internal))
        .fault(UNPUBLISH, Fault::code(tonic::Code::Internal))
        .serve(&socket)
        .await
        .expect("the mock driver serves");
    let mut attacher = start_attacher(side, cluster, &socket);

    let node = unique_name("pace-node");
    create_node(&client, &node).await;
    create_csinode(&client, &node, &driver, "nid-pace").await;
    let pv = unique_name("pace-pv");
    PvBuilder::new(&pv, &driver, "vol-0").create(&client).await;
    let va = unique_name("pace-va");
    create_va(&client, &va, &driver, &node, &pv).await;

    let calls_of = |method: &'static str| {
        let mock = &mock;
        move || times(&mock.calls(), method).len()
    };
    wait_until(
        &format!("{side:?}: {ATTACH_FAILURES} failed publishes"),
        WAIT_TIMEOUT,
        calls_of(PUBLISH),
        ATTACH_FAILURES,
    )
    .await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    vas.delete(&va, &Default::default())
        .await
        .expect("delete the VA");
    wait_until(
        &format!("{side:?}: {UNPUBLISHES} failed unpublishes"),
        OBSERVE,
        calls_of(UNPUBLISH),
        UNPUBLISHES,
    )
    .await;
    let calls = mock.calls();
    let unpublishes = times(&calls, UNPUBLISH);
    let first = unpublishes[0];
    let attach_failures = times(&calls, PUBLISH)
        .into_iter()
        .filter(|t| *t < first)
        .count();

    // The driver recovers: the VA goes, nothing is left behind.
    mock.clear_faults();
    wait_deleted(&vas, &va, WAIT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{side:?}: {e}"));
    assert!(
        attacher.exited().is_none(),
        "{side:?}: the attacher kept running"
    );
    attacher.stop().await;
    mock.shutdown().await;

    Pace {
        attach_failures: u32::try_from(attach_failures).expect("a few"),
        intervals: unpublishes[..UNPUBLISHES]
            .windows(2)
            .map(|w| Duration::from_millis(w[1].saturating_sub(w[0])))
            .collect(),
    }
}

/// Polls `count` until it reaches `want`; panics after `limit`.
async fn wait_until(what: &str, limit: Duration, count: impl Fn() -> usize, want: usize) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let n = count();
        if n >= want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {n} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The least interval between the `i`-th and the next unpublish call when the VA's failures
/// before the `i`-th were `attach_failures + i`: `START × 2^(attach_failures + i)`, less 5 %
/// for the two clocks that time it.
fn least_interval(attach_failures: u32, i: usize) -> Duration {
    let exponent = attach_failures + u32::try_from(i).expect("a few");
    (START * 2u32.pow(exponent)).mul_f64(0.95)
}

#[tokio::test]
async fn detach_retries_continue_the_attach_backoff_as_in_go() {
    let (go, hub) = tokio::join!(run(Side::Go), run(Side::Hub));
    println!("retry pacing: Go {go:?}, hub {hub:?}");
    // Both sides follow one rule, so the hub never calls the failing driver more often than
    // Go; the rule is checked on Go too, so that it is the reference's, not ours.
    for (side, pace) in [(Side::Go, &go), (Side::Hub, &hub)] {
        assert!(
            pace.attach_failures >= u32::try_from(ATTACH_FAILURES).expect("small"),
            "{side:?}: {pace:?}"
        );
        // Go's first detach retry fires at the deadline of its last attach retry.
        let skip = usize::from(side == Side::Go);
        for (i, interval) in pace.intervals.iter().enumerate().skip(skip) {
            let least = least_interval(pace.attach_failures, i);
            assert!(
                *interval >= least,
                "{side:?}: unpublish retry {} came {interval:?} after the one before, at least {least:?} expected (the failure count of the attaches carries over): {pace:?}",
                i + 1
            );
            // Not a doubling more than the rule either (a count that grew twice per failure
            // would pass the lower bound); four times the bound leaves room for a busy machine.
            assert!(
                *interval < least * 4,
                "{side:?}: unpublish retry {} came {interval:?} after the one before, well past the {least:?} the rule sets: {pace:?}",
                i + 1
            );
        }
    }
}
