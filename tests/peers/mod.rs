//! Helpers for the tests in which real peers surround the attacher:
//! kube-controller-manager creates the VolumeAttachments from Pods, the GCE PD
//! driver's own controller service answers on its fake cloud, and attacher-hub
//! (in sidecar or hub mode) or the Go external-attacher does the attaching.
//!
//! A [`Stage`] is one test's world: Nodes under the attach-detach controller
//! (one fake-cloud instance each), their CSINodes, the PD controller and the
//! objects the test created, removed again when the test ends.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use tokio::process::Command;

use crate::support::{
    ChildProcess, Cluster, NodeDriver, PD_TOPOLOGY_KEY, PD_ZONE, PdController, PdOptions,
    controller_manager, create_csinode_with, create_managed_node, delete_objects,
    start_reference_attacher, unique_name,
};

/// Which attacher serves the drivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attacher {
    /// attacher-hub in sidecar mode: `--csi-address`, one driver.
    HubSidecar,
    /// attacher-hub in hub mode: `--config drivers.yaml`, every driver of the stage.
    Hub,
    /// The reference Go external-attacher v4.13.0, one per driver.
    Go,
}

impl Attacher {
    /// A short tag for names and messages.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Attacher::HubSidecar => "sidecar",
            Attacher::Hub => "hub",
            Attacher::Go => "go",
        }
    }
}

/// A running attacher (or, for [`Attacher::Go`], one per driver), killed on drop.
#[derive(Debug)]
pub(crate) struct Attachers {
    pub(crate) processes: Vec<ChildProcess>,
    /// The hub's driver file, for hub mode.
    _config: Option<tempfile::TempDir>,
}

impl Attachers {
    /// Everything the attacher processes logged so far.
    pub(crate) fn log(&self) -> String {
        self.processes
            .iter()
            .map(|p| format!("{}{}", p.stderr(), p.stdout()))
            .collect()
    }

    /// Stops every process (SIGTERM, then SIGKILL).
    pub(crate) async fn stop(&mut self) {
        for p in &mut self.processes {
            p.stop().await;
        }
    }
}

/// Starts `which` for the drivers listening on `sockets` (name, socket), with
/// the attacher identity (scripts/attacher-rbac.yaml) and `extra` flags last.
/// Hub and Go get the same flags.
pub(crate) fn start_attachers(
    cluster: &Cluster,
    which: Attacher,
    sockets: &[(String, PathBuf)],
    extra: &[&str],
) -> Attachers {
    let hub = |args: Vec<String>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
        cmd.arg(format!(
            "--kubeconfig={}",
            cluster.attacher_kubeconfig.display()
        ))
        .args([
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            "--timeout=15s",
            "-v=4",
        ])
        .args(args)
        .args(extra);
        ChildProcess::spawn("attacher-hub", cmd)
    };
    match which {
        Attacher::HubSidecar => {
            assert_eq!(sockets.len(), 1, "sidecar mode serves one driver");
            let args = vec![format!("--csi-address={}", sockets[0].1.display())];
            Attachers {
                processes: vec![hub(args)],
                _config: None,
            }
        }
        Attacher::Hub => {
            let dir = tempfile::Builder::new()
                .prefix("ah-peers-")
                .tempdir()
                .expect("temp dir");
            let path = dir.path().join("drivers.yaml");
            let mut yaml = String::from("drivers:\n");
            for (name, socket) in sockets {
                yaml.push_str(&format!(
                    "  - address: unix://{}\n    name: {name}\n",
                    socket.display()
                ));
            }
            std::fs::write(&path, yaml).expect("write drivers.yaml");
            Attachers {
                processes: vec![hub(vec![format!("--config={}", path.display())])],
                _config: Some(dir),
            }
        }
        // start_reference_attacher sets the same QPS, burst and timeout.
        Attacher::Go => Attachers {
            processes: sockets
                .iter()
                .map(|(_, socket)| start_reference_attacher(cluster, socket, extra))
                .collect(),
            _config: None,
        },
    }
}

/// How a driver names a Node: its node ID from (driver name, node name).
pub(crate) type NodeIdOf = fn(&str, &str) -> String;

/// One test's world around the PD controller.
pub(crate) struct Stage {
    pub(crate) cluster: &'static Cluster,
    pub(crate) client: Client,
    /// The Nodes (and fake-cloud instances), in order.
    pub(crate) nodes: Vec<String>,
    /// The PD controller.
    pub(crate) pd: PdController,
    /// Claims and PVs to delete at the end (same names).
    pub(crate) volumes: Vec<String>,
    /// Pods to delete at the end.
    pub(crate) pods: Vec<String>,
}

impl Stage {
    /// Makes sure kube-controller-manager runs, starts the PD controller as
    /// `driver` with one instance per node, and creates `nodes` Nodes whose
    /// CSINodes list the PD driver (with its topology key) and `others`
    /// (driver name, node ID for a node name).
    pub(crate) async fn new(
        cluster: &'static Cluster,
        driver: &str,
        nodes: usize,
        pd_opts: PdOptions,
        others: &[(String, NodeIdOf)],
    ) -> Stage {
        controller_manager(cluster);
        let client = cluster.client().await;
        let nodes: Vec<String> = (0..nodes).map(|i| unique_name(&format!("n{i}"))).collect();
        let mut opts = pd_opts;
        opts.instances.extend(nodes.iter().cloned());
        let pd = PdController::start(cluster, driver, opts).await;
        for node in &nodes {
            create_managed_node(&client, node, &[(PD_TOPOLOGY_KEY, PD_ZONE)]).await;
            let mut drivers = vec![
                NodeDriver::new(driver, &PdController::node_id(node)).topology_key(PD_TOPOLOGY_KEY),
            ];
            for (name, node_id) in others {
                drivers.push(NodeDriver::new(name, &node_id(name, node)));
            }
            create_csinode_with(&client, node, &drivers).await;
        }
        Stage {
            cluster,
            client,
            nodes,
            pd,
            volumes: Vec::new(),
            pods: Vec::new(),
        }
    }

    /// The PD driver's name.
    pub(crate) fn driver(&self) -> &str {
        &self.pd.driver
    }

    /// The PD controller's socket.
    pub(crate) fn socket(&self) -> &Path {
        self.pd.socket()
    }

    /// Deletes the objects the stage created or was told about.
    pub(crate) async fn cleanup(&self) {
        delete_objects(&self.client, &self.pods, &self.volumes, &self.nodes).await;
    }
}

/// A node ID equal to the node's name (the Rust mock accepts any).
pub(crate) fn node_name_id(_driver: &str, node: &str) -> String {
    node.to_string()
}

/// A node ID equal to the driver's name (the Go mock knows one node, so named).
pub(crate) fn driver_name_id(driver: &str, _node: &str) -> String {
    driver.to_string()
}

/// Generous limit for a change that needs kube-controller-manager, the
/// attacher and the driver in turn, on two cores shared with everything else.
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(90);
