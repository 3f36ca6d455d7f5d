//! `make demo` end to end in its non-interactive mode: `scripts/demo.sh
//! --until-attached` starts two Rust mocks, one Go mock and attacher-hub on the
//! shared control plane, creates VolumeAttachments for all three drivers and
//! exits once they are attached, printing the final table of `attacher-hub
//! status` on stdout.
//!
//! The demo gets the control-plane directory of the harness's cluster, so it
//! reuses that cluster instead of starting another, and cargo's own binaries,
//! so it does not run a release build inside the test.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use support::Cluster;

/// VolumeAttachments per driver (the demo's default).
const VAS_PER_DRIVER: usize = 5;

#[test]
fn demo_until_attached_prints_three_leading_drivers_with_every_va_attached() {
    let cluster = Cluster::get();
    let cluster_dir = cluster
        .kubeconfig
        .parent()
        .expect("the admin kubeconfig lives in the cluster directory");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo.sh");

    let start = Instant::now();
    let out = Command::new(&script)
        .arg("--until-attached")
        .args(["--timeout", "180"])
        .args(["--vas", &VAS_PER_DRIVER.to_string()])
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

    // The table of `attacher-hub status`: a header line starting with DRIVER,
    // then one row per driver: DRIVER STATE LEASE-HOLDER QUEUES ATTACHED
    // LAST-ERROR.
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("DRIVER "))
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
            driver.contains(".demo-"),
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
            format!("{VAS_PER_DRIVER}/{VAS_PER_DRIVER}"),
            "{driver} has not every VA attached:\n{stdout}"
        );
    }
    // The drivers: two Rust mocks and one Go mock, as announced on stderr.
    let mut mocks: Vec<&str> = rows
        .iter()
        .map(|row| {
            let announced = stderr
                .lines()
                .find(|l| l.contains(&format!("driver {} (", row[0])))
                .unwrap_or_else(|| panic!("driver {} not announced:\n{stderr}", row[0]));
            if announced.contains("(Go mockcsi)") {
                "mockcsi"
            } else {
                "mock-csi-driver"
            }
        })
        .collect();
    mocks.sort_unstable();
    assert_eq!(
        mocks,
        ["mock-csi-driver", "mock-csi-driver", "mockcsi"],
        "two Rust mocks and one Go mock expected:\n{stderr}"
    );
    let total = 3 * VAS_PER_DRIVER;
    assert!(
        stdout.contains(&format!("attached: {total}/{total} VolumeAttachments")),
        "summary line missing:\n{stdout}"
    );
    for path in ["/metrics", "/drivers"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.contains("http://127.0.0.1:") && l.trim_end().ends_with(path)),
            "no {path} URL in:\n{stdout}"
        );
    }
}
