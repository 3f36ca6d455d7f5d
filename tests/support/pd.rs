//! The GCE PD CSI driver's own controller service on its fake cloud
//! (`pd-controller`, tools/testbins/pd/cmd/pd-controller) as a process on a
//! per-test socket, with its test endpoint: the fake cloud's attachments, the
//! Controller(Un)PublishVolume calls it answered, and out-of-band changes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::local::http_request;
use super::{Cluster, DriverProcess};

/// How long the program may take to print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The fake cloud's project and zone (the program's defaults, those of the
/// driver's own sanity test).
pub(crate) const PD_PROJECT: &str = "test-project";
/// See [`PD_PROJECT`].
pub(crate) const PD_ZONE: &str = "country-region-zone";

/// The driver name under which in-tree `gcePersistentDisk` volumes are migrated.
pub(crate) const PD_MIGRATION_DRIVER: &str = "pd.csi.storage.gke.io";

/// Options of `pd-controller`.
#[derive(Clone, Debug, Default)]
pub(crate) struct PdOptions {
    /// Instances to create at start (one per test Node, named like it).
    pub(crate) instances: Vec<String>,
    /// Disks to create at start.
    pub(crate) disks: Vec<String>,
    /// Time each AttachDisk / DetachDisk takes (`--latency`), with ±20 % jitter.
    pub(crate) latency: Option<Duration>,
}

/// One disk attached to an instance in the fake cloud.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Attachment {
    /// Disk name.
    pub(crate) disk: String,
    /// `READ_WRITE` or `READ_ONLY`.
    pub(crate) mode: String,
}

/// One Controller(Un)PublishVolume call the driver answered.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PdCall {
    /// `ControllerPublishVolume` or `ControllerUnpublishVolume`.
    pub(crate) method: String,
    pub(crate) volume_id: String,
    pub(crate) node_id: String,
    pub(crate) readonly: bool,
    /// CSI access mode name (publish only).
    #[serde(default)]
    pub(crate) access_mode: String,
    /// gRPC code name of the answer, `OK` for success.
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
    /// Unix milliseconds of arrival and answer.
    pub(crate) start_ms: i64,
    pub(crate) end_ms: i64,
}

/// A running `pd-controller`.
#[derive(Debug)]
pub(crate) struct PdController {
    /// The driver name it reports.
    pub(crate) driver: String,
    /// The process and its socket.
    pub(crate) process: DriverProcess,
    /// Its test endpoint.
    http: SocketAddr,
}

impl PdController {
    /// Starts `pd-controller --name <driver>` and waits for its `ready` line.
    pub(crate) async fn start(cluster: &Cluster, driver: &str, opts: PdOptions) -> PdController {
        let program = cluster.bin("pd-controller");
        let name = driver.to_string();
        let mut process = DriverProcess::start("pd-controller", &program, move |socket| {
            let mut args = vec![
                format!("--endpoint={}", socket.display()),
                format!("--name={name}"),
                format!("--instances={}", opts.instances.join(",")),
                format!("--disks={}", opts.disks.join(",")),
                "-v=4".to_string(),
            ];
            if let Some(latency) = opts.latency {
                args.push(format!("--latency={}ms", latency.as_millis()));
            }
            args
        })
        .await;
        process
            .process
            .wait_for_output("ready\n", 1, READY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("pd-controller {driver} did not become ready: {e}"));
        let http = process
            .process
            .stdout()
            .lines()
            .find_map(|l| l.strip_prefix("http "))
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("pd-controller printed no `http <address>` line"));
        PdController {
            driver: driver.to_string(),
            process,
            http,
        }
    }

    /// Path of the driver's socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.process.socket
    }

    /// The CSINode node ID of the instance named `instance`.
    pub(crate) fn node_id(instance: &str) -> String {
        format!("projects/{PD_PROJECT}/zones/{PD_ZONE}/instances/{instance}")
    }

    /// The CSI volume ID of disk `disk` in the default zone.
    pub(crate) fn volume_id(disk: &str) -> String {
        format!("projects/{PD_PROJECT}/zones/{PD_ZONE}/disks/{disk}")
    }

    /// Disks attached per live instance (every live instance is listed).
    pub(crate) async fn attachments(&self) -> BTreeMap<String, Vec<Attachment>> {
        let body = self.request("GET", "/attachments").await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/attachments ({e}): {body}"))
    }

    /// The disks of the fake cloud, as `<zone>/<name>`.
    pub(crate) async fn disks(&self) -> Vec<String> {
        let body = self.request("GET", "/disks").await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/disks ({e}): {body}"))
    }

    /// The Controller(Un)PublishVolume calls answered so far, in order of answer.
    pub(crate) async fn calls(&self) -> Vec<PdCall> {
        let body = self.request("GET", "/calls").await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/calls ({e}): {body}"))
    }

    /// Creates disk `name` out of band.
    pub(crate) async fn create_disk(&self, name: &str) {
        self.request("POST", &format!("/disks?name={name}")).await;
    }

    /// Deletes disk `name` out of band.
    pub(crate) async fn delete_disk(&self, name: &str) {
        self.request("DELETE", &format!("/disks?name={name}")).await;
    }

    /// Creates instance `name`.
    pub(crate) async fn create_instance(&self, name: &str) {
        self.request("POST", &format!("/instances?name={name}"))
            .await;
    }

    /// Deletes instance `name`.
    pub(crate) async fn delete_instance(&self, name: &str) {
        self.request("DELETE", &format!("/instances?name={name}"))
            .await;
    }

    /// Attaches `disk` to `instance` out of band, in `mode` (`READ_WRITE` or `READ_ONLY`).
    pub(crate) async fn attach(&self, instance: &str, disk: &str, mode: &str) {
        self.request(
            "POST",
            &format!("/attach?instance={instance}&disk={disk}&mode={mode}"),
        )
        .await;
    }

    /// Polls the fake cloud until `pred` holds for the attachments; returns them.
    pub(crate) async fn wait_attachments(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&BTreeMap<String, Vec<Attachment>>) -> bool,
    ) -> BTreeMap<String, Vec<Attachment>> {
        let start = std::time::Instant::now();
        loop {
            let now = self.attachments().await;
            if pred(&now) {
                return now;
            }
            assert!(
                start.elapsed() < timeout,
                "the fake cloud did not show {what} within {timeout:?}; attachments: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One request to the test endpoint; panics unless it answers 200.
    async fn request(&self, method: &str, path: &str) -> String {
        let (status, body) = http_request(self.http, method, path)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} on pd-controller: {e}"));
        assert_eq!(status, 200, "{method} {path} on pd-controller: {body}");
        body
    }
}

/// Whether `instance` has `disk` attached in `mode` in `attachments`.
pub(crate) fn has_disk(
    attachments: &BTreeMap<String, Vec<Attachment>>,
    instance: &str,
    disk: &str,
    mode: &str,
) -> bool {
    attachments
        .get(instance)
        .is_some_and(|l| l.iter().any(|a| a.disk == disk && a.mode == mode))
}

/// The instances that have `disk` attached, in any mode.
pub(crate) fn holders(attachments: &BTreeMap<String, Vec<Attachment>>, disk: &str) -> Vec<String> {
    attachments
        .iter()
        .filter(|(_, l)| l.iter().any(|a| a.disk == disk))
        .map(|(i, _)| i.clone())
        .collect()
}
