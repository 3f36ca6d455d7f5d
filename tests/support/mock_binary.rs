//! The path of the `mock-csi-driver` binary for tests that run it as a process.
//!
//! The mock is a workspace member of its own (so that the attacher-hub binary carries none of
//! its code or dependencies), and cargo gives an integration test only the paths of its own
//! package's binaries (`CARGO_BIN_EXE_*`). So the harness builds the mock's binary with the
//! cargo, profile and target directory that built the test, once per test process; when it is
//! up to date that is a no-op of a fraction of a second.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The target directory of this build (`target`, or wherever `CARGO_TARGET_DIR` put it): the
/// parent of the directory that holds the attacher-hub binary.
pub(crate) fn target_dir() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .parent()
        .and_then(Path::parent)
        .expect("the target directory")
}

/// `target/<profile>/mock-csi-driver`, built if needed. Panics with cargo's output if the build
/// fails: a test that needs the mock cannot run without it.
pub(crate) fn mock_csi_driver_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // The attacher-hub binary of this build sits in the same directory.
        let profile_dir = Path::new(env!("CARGO_BIN_EXE_attacher-hub"))
            .parent()
            .expect("the binary's directory");
        let target_dir = target_dir();
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev",
            Some(other) => other,
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "--quiet", "--package", "mock-csi-driver", "--bin"])
            .arg("mock-csi-driver")
            .arg("--profile")
            .arg(profile)
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        without_cargo_test_env(&mut build);
        let out = build
            .output()
            .unwrap_or_else(|e| panic!("running cargo to build mock-csi-driver: {e}"));
        assert!(
            out.status.success(),
            "cargo build -p mock-csi-driver failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        profile_dir.join("mock-csi-driver")
    })
}

/// Removes from `cmd` what cargo test sets for this test's own package (CARGO_PKG_*,
/// CARGO_MANIFEST_*, OUT_DIR, ...): build scripts (ring's) watch such variables, so an inner
/// `cargo build` that saw them would rebuild what a plain build made, and the plain build would
/// rebuild it back the next time.
pub(crate) fn without_cargo_test_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || ["CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE", "OUT_DIR"].contains(&name.as_ref())
        {
            cmd.env_remove(name.as_ref());
        }
    }
}
