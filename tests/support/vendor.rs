//! A vendor's real CSI driver manifests: the GCE PD CSI driver pinned in
//! `tools/testbins/pd/go.mod`, found in (or, on a fresh machine, downloaded
//! into) the Go module cache by `go mod download`. A module that cannot be had
//! is a test failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::repo;

/// The module of the GCE PD CSI driver (its version is the one `tools/testbins/pd/go.mod` pins).
pub(crate) const GCE_PD_MODULE: &str = "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver";

/// `deploy/kubernetes` of the pinned GCE PD CSI driver in the Go module cache (read-only:
/// copy it before building kustomizations next to it).
pub(crate) fn gce_pd_manifests() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let module_dir = repo().join("tools/testbins/pd");
        let out = Command::new("go")
            .args(["mod", "download", "-json", GCE_PD_MODULE])
            .current_dir(&module_dir)
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run `go mod download` for {GCE_PD_MODULE} (Go is needed for the test tools): {e}")
            });
        let text = String::from_utf8_lossy(&out.stdout);
        let info: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "`go mod download -json {GCE_PD_MODULE}` in {} failed ({}): {e}\n{text}{}",
                module_dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        if let Some(error) = info["Error"].as_str() {
            panic!("`go mod download {GCE_PD_MODULE}`: {error}");
        }
        let dir = PathBuf::from(
            info["Dir"]
                .as_str()
                .unwrap_or_else(|| panic!("`go mod download -json` printed no Dir: {text}")),
        )
        .join("deploy/kubernetes");
        assert!(
            dir.join("base/controller/controller.yaml").is_file(),
            "{} has no base/controller/controller.yaml; is tools/testbins/pd/go.mod still on v1.28.1?",
            dir.display()
        );
        dir
    })
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
