//! kube-controller-manager on the shared control plane: started on first use
//! by `scripts/cluster-up.sh --controller-manager` (idempotent, serialised by
//! the script's lock), then left running with the control plane until
//! `scripts/cluster-down.sh`, as the API server is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::Cluster;

/// Makes sure kube-controller-manager (attach-detach controller and PV
/// binder) runs against `cluster`; returns the path of its log. A controller
/// manager that cannot be started fails the test, with the script's reason.
pub(crate) fn controller_manager(cluster: &Cluster) -> &'static Path {
    static LOG: OnceLock<PathBuf> = OnceLock::new();
    LOG.get_or_init(|| {
        let dir = cluster
            .kubeconfig
            .parent()
            .expect("the admin kubeconfig lives in the cluster directory");
        let script = super::repo().join("scripts/cluster-up.sh");
        let out = Command::new(&script)
            .arg("--controller-manager")
            .arg(dir)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "kube-controller-manager did not start: {} --controller-manager {} failed ({}); see {}",
            script.display(),
            dir.display(),
            out.status,
            dir.join("controller-manager.log").display()
        );
        dir.join("controller-manager.log")
    })
}
