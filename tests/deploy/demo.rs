//! `make demo` end to end in its non-interactive mode: `scripts/demo.sh
//! --until-attached` starts the GCE PD and AWS EBS drivers' own controllers on
//! their fake clouds, one Rust mock and attacher-hub on the shared control plane
//! (with kube-controller-manager), creates Pods with claims for all three
//! drivers (no VolumeAttachment: kube-controller-manager makes them) and exits
//! once every Pod's volumes are attached, printing the Pods per driver and the
//! final table of `attacher-hub status` on stdout.
//!
//! The demo gets the control-plane directory of the harness's cluster, so it
//! reuses that cluster instead of starting another, and cargo's own binaries,
//! so it does not run a release build inside the test. It keeps its run
//! directory (`--keep-logs`) so that the test can read the objects it created.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use support::Cluster;
use support::ebs::EBS_DRIVER;

/// Pods per driver (the demo's default).
const PODS_PER_DRIVER: usize = 5;

#[test]
fn demo_until_attached_creates_pods_and_prints_three_leading_drivers_with_every_pod_attached() {
    let cluster = Cluster::get();
    // The demo serves `ebs.csi.aws.com`, whose name no other test may serve meanwhile.
    let _ebs = support::ebs::turn_blocking();
    let cluster_dir = cluster
        .kubeconfig
        .parent()
        .expect("the admin kubeconfig lives in the cluster directory");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo.sh");

    let start = Instant::now();
    let out = Command::new(&script)
        .arg("--until-attached")
        .args(["--timeout", "180"])
        .args(["--pods", &PODS_PER_DRIVER.to_string()])
        .arg("--keep-logs")
        .arg("--cluster-dir")
        .arg(cluster_dir)
        .env("ATTACHER_HUB_BIN", env!("CARGO_BIN_EXE_attacher-hub"))
        .env("MOCK_CSI_DRIVER_BIN", support::mock_csi_driver_bin())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "demo took {:.1}s\n--- stdout ---\n{stdout}--- stderr ---\n{stderr}",
        start.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "scripts/demo.sh --until-attached failed ({})",
        out.status
    );

    // The table of `attacher-hub status` (after the Pods table): a header line
    // starting with DRIVER and naming STATE, then one row per driver: DRIVER
    // STATE LEASE-HOLDER QUEUES ATTACHED LAST-ERROR.
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("DRIVER ") && l.contains(" STATE "))
        .unwrap_or_else(|| panic!("no table header in stdout:\n{stdout}"));
    let rows: Vec<Vec<&str>> = lines[header + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "three driver rows expected:\n{stdout}");

    for row in &rows {
        // The last column, the driver's last error, is free text; an error on
        // the way (e.g. a CSINode not in the cache yet) may stay there.
        assert!(row.len() >= 6, "unexpected row {row:?} in:\n{stdout}");
        let (driver, state, holder, queues, attached) = (row[0], row[1], row[2], row[3], row[4]);
        assert!(
            driver.contains(".demo-") || driver == EBS_DRIVER,
            "driver name {driver} in:\n{stdout}"
        );
        assert_eq!(state, "leading", "{driver} does not lead:\n{stdout}");
        assert_ne!(holder, "-", "{driver} has no lease holder:\n{stdout}");
        assert!(
            queues
                .split('/')
                .filter(|q| q.parse::<u64>().is_ok())
                .count()
                == 3,
            "{driver}: queue depths attach/detach/pv expected, got {queues}:\n{stdout}"
        );
        assert_eq!(
            attached,
            format!("{PODS_PER_DRIVER}/{PODS_PER_DRIVER}"),
            "{driver} has not every VA attached:\n{stdout}"
        );
    }
    // The drivers: the PD and EBS controllers and one Rust mock, as announced on stderr.
    let mut kinds: Vec<&str> = rows
        .iter()
        .map(|row| {
            let announced = stderr
                .lines()
                .find(|l| l.contains(&format!("driver {} (", row[0])))
                .unwrap_or_else(|| panic!("driver {} not announced:\n{stderr}", row[0]));
            if announced.contains("(AWS EBS driver") {
                "ebs-controller"
            } else if announced.contains("(GCE PD driver") {
                "pd-controller"
            } else {
                "mock-csi-driver"
            }
        })
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["ebs-controller", "mock-csi-driver", "pd-controller"],
        "the PD and EBS drivers and one Rust mock expected:\n{stderr}"
    );
    let total = 3 * PODS_PER_DRIVER;
    assert!(
        stdout.contains(&format!("attached: {total}/{total} VolumeAttachments")),
        "summary line missing:\n{stdout}"
    );
    // Notes under the table (the demo's attacher identity may not list Leases in all
    // namespaces, so each driver has a `lease guard unavailable` note): each one line naming
    // the cause and the fix, never a dump of an API error (they were 1,500 characters each).
    for note in lines.iter().filter(|l| l.starts_with("note: ")) {
        let (_, what) = note
            .split_once(": ")
            .and_then(|(_, rest)| rest.split_once(": "))
            .unwrap_or_else(|| panic!("a note without a driver: {note}"));
        assert!(
            what.chars().count() < 200,
            "a note of {} characters: {note}",
            what.chars().count()
        );
        for dump in [
            "Status {",
            "ErrorResponse {",
            "ApiError",
            "Failed to parse error data",
        ] {
            assert!(!note.contains(dump), "a dump ({dump}) in a note: {note}");
        }
    }

    // The Pods table: every driver's Pods attached, seen in the Nodes' status.
    let pods_header = lines
        .iter()
        .position(|l| l.starts_with("DRIVER ") && l.contains("PODS ATTACHED"))
        .unwrap_or_else(|| panic!("no Pods table in stdout:\n{stdout}"));
    let pod_rows: Vec<&str> = lines[pods_header + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .copied()
        .collect();
    assert_eq!(pod_rows.len(), 3, "three driver rows of Pods:\n{stdout}");
    for row in &pod_rows {
        assert!(
            row.contains(&format!(" {PODS_PER_DRIVER}/{PODS_PER_DRIVER} ")),
            "not every Pod attached in {row:?}:\n{stdout}"
        );
    }
    assert!(
        stdout.contains(&format!("pods: {total}/{total} with every volume attached")),
        "Pods summary missing:\n{stdout}"
    );

    // What the demo created: Pods and claims, never a VolumeAttachment.
    let kept = stderr
        .lines()
        .find_map(|l| l.strip_prefix("demo: logs kept in "))
        .unwrap_or_else(|| panic!("the run directory was not kept:\n{stderr}"))
        .trim()
        .to_string();
    let objects = std::fs::read_to_string(Path::new(&kept).join("objects.yaml"))
        .unwrap_or_else(|e| panic!("{kept}/objects.yaml: {e}"));
    let count = |kind: &str| objects.matches(&format!("\nkind: {kind}\n")).count();
    assert_eq!(count("Pod"), total, "{objects}");
    assert_eq!(count("PersistentVolumeClaim"), total, "{objects}");
    assert_eq!(
        count("VolumeAttachment"),
        0,
        "the demo wrote VolumeAttachments:\n{objects}"
    );
    let _ = std::fs::remove_dir_all(&kept);
    for path in ["/metrics", "/drivers"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.contains("http://127.0.0.1:") && l.trim_end().ends_with(path)),
            "no {path} URL in:\n{stdout}"
        );
    }
}
