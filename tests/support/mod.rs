//! Shared harness for the integration tests: a real kube-apiserver (started
//! by `scripts/cluster-up.sh` unless the environment names one), clients for
//! the admin and the least-privileged attacher identity, object fixtures,
//! watch-based waits, and CSI driver / attacher processes on per-test sockets.
//!
//! Every integration test file includes it with `mod support;` and uses a
//! subset, hence the module-wide allowances for unused items and re-exports.
#![allow(dead_code, unused_imports)]

mod apiserver_metrics;
mod attachers;
mod audit;
mod cluster;
mod controller_manager;
pub(crate) mod ebs;
mod fixtures;
mod gate;
mod local;
mod manifests;
mod mock_binary;
mod mock_process;
mod names;
mod pd;
mod proc_stats;
mod process;
pub(crate) mod release;
mod testbins;
mod va_watch;
mod vendor;
mod wait;
mod workload;

pub(crate) use apiserver_metrics::{
    ApiServerMetrics, RequestKind, metrics_text as apiserver_metrics_text,
};
pub(crate) use attachers::{Attacher, Probe, Program, eventually, free_port, go_duration};
pub(crate) use audit::{audit_events, forbidden};
pub(crate) use cluster::Cluster;
pub(crate) use controller_manager::controller_manager;
pub(crate) use fixtures::{
    PvBuilder, attacher_finalizer, create_csinode, create_node, create_va, has_finalizer,
    is_attached, sanitize_driver_name, va,
};
pub(crate) use gate::{Alone, alone, shared};
pub(crate) use local::{http_get, http_get_at, repo, request_over, tool};
pub(crate) use manifests::{documents, kind, kubectl, kustomize, name, namespace, run};
pub(crate) use mock_binary::{mock_csi_driver_bin, target_dir, without_cargo_test_env};
pub(crate) use mock_process::MockProcess;
pub(crate) use names::{test_name, unique_driver_name, unique_name};
pub(crate) use pd::{
    Attachment, PD_MIGRATION_DRIVER, PD_PROJECT, PD_ZONE, PdCall, PdController, PdOptions,
    has_disk, holders,
};
pub(crate) use proc_stats::{
    TCP_ESTABLISHED, TcpSocket, cpu_seconds, status_mib, tcp_connections_to, tcp_sockets,
};
pub(crate) use process::{
    ChildProcess, DriverProcess, MockCsi, MockCsiOptions, start_reference_attacher, under_hostname,
};
pub(crate) use testbins::{testbin, testbins};
pub(crate) use va_watch::{OnWatchError, watch_vas};
pub(crate) use vendor::{EBS_MODULE, GCE_PD_MODULE, copy_tree, ebs_chart, vendor_manifests};
pub(crate) use wait::{WaitError, wait_deleted, wait_for};
pub(crate) use workload::{
    NAMESPACE, NodeDriver, PD_TOPOLOGY_KEY, PodVolume, Source, StaticVolume, create_csinode_with,
    create_managed_node, create_pod, delete_objects, delete_pod, kubelet_heartbeat,
    unique_volume_name, va_attached, va_pv, vas_of, volumes_attached, wait_gone_from_node_status,
    wait_in_node_status, wait_vas, wait_volumes_attached,
};

/// Default time allowed for a condition that a healthy controller reaches in
/// well under a second; generous because the two cores are shared with etcd,
/// the API server and the Go processes.
pub(crate) const WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
