//! kube-controller-manager on the shared control plane: started on first use
//! by `scripts/cluster-up.sh --controller-manager` (idempotent, serialised by
//! the script's lock), then left running with the control plane until
//! `scripts/cluster-down.sh`, as the API server is.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::Cluster;
use super::cluster::cluster_up;

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
        let log = dir.join("controller-manager.log");
        cluster_up(
            &["--controller-manager"],
            dir,
            "kube-controller-manager did not start",
            &log,
        );
        log
    })
}
