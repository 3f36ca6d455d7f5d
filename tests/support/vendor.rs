//! Vendors' real CSI driver manifests: the GCE PD CSI driver pinned in
//! `tools/testbins/pd/go.mod`, put where the shipped examples take them from by
//! `scripts/vendor-manifests.sh` (from the Go module cache, or, on a fresh machine, downloaded
//! into it by `go mod download`), as a user does; and the AWS EBS CSI driver's Helm chart of the
//! module pinned in `tools/testbins/ebs/go.mod`, read where the Go module cache holds it.
//! Manifests that cannot be had are a test failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::{repo, run};

/// The module of the GCE PD CSI driver (its version is the one `tools/testbins/pd/go.mod` pins).
pub(crate) const GCE_PD_MODULE: &str = "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver";

/// Runs `scripts/vendor-manifests.sh dir`: PD's `deploy/kubernetes` at the pinned version in
/// `dir`, which the examples of `deploy/examples/gce-pd` name as `../vendor`.
pub(crate) fn vendor_manifests(dir: &Path) {
    let script = repo().join("scripts/vendor-manifests.sh");
    let mut cmd = Command::new(&script);
    cmd.arg(dir);
    let (ok, out, err) = run(cmd, None);
    assert!(
        ok,
        "{} {} failed (Go is needed for the test tools):\n{out}{err}",
        script.display(),
        dir.display()
    );
    let version = std::fs::read_to_string(dir.join("VERSION")).unwrap_or_default();
    assert!(
        version.starts_with(&format!("{GCE_PD_MODULE}@v1.28.1")),
        "{} holds {version:?}; is tools/testbins/pd/go.mod still on v1.28.1?",
        dir.display()
    );
    assert!(
        dir.join("base/controller/controller.yaml").is_file(),
        "{} has no base/controller/controller.yaml",
        dir.display()
    );
}

/// The module of the AWS EBS CSI driver (its version is the one `tools/testbins/ebs/go.mod`
/// pins).
pub(crate) const EBS_MODULE: &str = "github.com/kubernetes-sigs/aws-ebs-csi-driver";

/// The version of [`EBS_MODULE`] the tests expect `tools/testbins/ebs/go.mod` to pin.
const EBS_VERSION: &str = "v1.44.0";

/// The EBS driver's own Helm chart (`charts/aws-ebs-csi-driver` of the pinned module) in the
/// Go module cache, downloaded into it first when missing (`go mod download`, the module
/// proxy). The cache is read-only: Helm only reads the chart.
pub(crate) fn ebs_chart() -> PathBuf {
    static CHART: OnceLock<PathBuf> = OnceLock::new();
    CHART
        .get_or_init(|| {
            let go = |args: &[&str]| {
                let mut cmd = Command::new("go");
                cmd.args(args)
                    .current_dir(repo().join("tools/testbins/ebs"))
                    .env("GOFLAGS", "-mod=mod")
                    .env("GOTOOLCHAIN", "local");
                let (ok, out, err) = run(cmd, None);
                assert!(
                    ok,
                    "go {args:?} in tools/testbins/ebs failed (Go is needed for the test \
                     tools):\n{out}{err}"
                );
                out
            };
            go(&["mod", "download", EBS_MODULE]);
            let listed = go(&["list", "-m", "-f", "{{.Version}} {{.Dir}}", EBS_MODULE]);
            let (version, dir) = listed
                .trim()
                .split_once(' ')
                .unwrap_or_else(|| panic!("go list -m {EBS_MODULE}: {listed:?}"));
            assert_eq!(
                version, EBS_VERSION,
                "is tools/testbins/ebs/go.mod still on {EBS_VERSION}?"
            );
            let chart = Path::new(dir).join("charts/aws-ebs-csi-driver");
            assert!(
                chart.join("Chart.yaml").is_file(),
                "{} has no Chart.yaml",
                chart.display()
            );
            chart
        })
        .clone()
}

/// Copies `from` into `to` (created), following symbolic links and making every copy writable.
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()))
    {
        let path = entry.expect("directory entry").path();
        let target = to.join(path.file_name().expect("file name"));
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target)
                .unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
            let mut perms = std::fs::metadata(&target).expect("metadata").permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perms.set_readonly(false);
            std::fs::set_permissions(&target, perms).expect("make the copy writable");
        }
    }
}
