//! A vendor's real CSI driver manifests: the GCE PD CSI driver pinned in
//! `tools/testbins/pd/go.mod`, put where the shipped examples take them from by
//! `scripts/vendor-manifests.sh` (from the Go module cache, or, on a fresh machine, downloaded
//! into it by `go mod download`), as a user does. Manifests that cannot be had are a test
//! failure, never a skip.

use std::path::Path;
use std::process::Command;

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
