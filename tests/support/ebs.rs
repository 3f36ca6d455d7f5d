//! The AWS EBS CSI driver's own controller service on an in-memory EC2
//! (`ebs-controller`, tools/testbins/ebs/cmd/ebs-controller) as a process on a
//! per-test socket, with its test endpoint: the volumes, instances and
//! attachments of the fake EC2, the Controller(Un)PublishVolume calls the
//! driver answered, and changes made behind the driver's back.
//!
//! The driver's name is fixed (`ebs.csi.aws.com`, a constant of the driver,
//! also the name in-tree `awsElasticBlockStore` volumes migrate to), so two
//! attachers cannot serve two EBS controllers in one cluster at the same time:
//! every attacher watches all VolumeAttachments of its driver, whatever the
//! namespace of its Lease. A test that serves the driver (the differential,
//! the migration, `make demo`'s test, the bench) holds its [`turn`] while it
//! does, so that the tests of one test binary take turns; the binaries
//! themselves run one after the other.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::local::http_request;
use super::{Cluster, DriverProcess};

/// How long the program may take to print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The EBS driver's name, and the one in-tree `awsElasticBlockStore` volumes
/// are migrated to (csi-translation-lib's `AWSEBSDriverName`).
pub(crate) const EBS_DRIVER: &str = "ebs.csi.aws.com";

/// The fake EC2's default availability zone (the program's `--zone`).
pub(crate) const EBS_ZONE: &str = "us-east-1a";

/// Another zone of the fake EC2's region.
pub(crate) const EBS_OTHER_ZONE: &str = "us-east-1b";

/// The zone topology keys the EBS node service reports (`topology.ebs.csi.aws.com/zone`,
/// deprecated, and the well-known key); Nodes carry both as labels.
pub(crate) const EBS_TOPOLOGY_KEYS: [&str; 2] = [
    "topology.ebs.csi.aws.com/zone",
    "topology.kubernetes.io/zone",
];

/// How many device names the driver's device manager has for an instance
/// (pkg/cloud/devicemanager/device_names.go of v1.44.0): an instance with
/// this many other devices has none left.
pub(crate) const EBS_DEVICE_NAMES: usize = 127;

/// The turn of the EBS driver's name in this test process: held by a test that
/// runs attachers serving it, for as long as they run.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for the EBS driver's name to be free in this test process, then holds
/// it until the guard is dropped.
pub(crate) async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    TURN.lock().await
}

/// [`turn`] for a test outside an async runtime.
pub(crate) fn turn_blocking() -> tokio::sync::MutexGuard<'static, ()> {
    TURN.blocking_lock()
}

/// Options of `ebs-controller`.
#[derive(Clone, Debug, Default)]
pub(crate) struct EbsOptions {
    /// Instances to create at start (`--instances`), in the default zone.
    pub(crate) instances: Vec<String>,
    /// Volumes to create at start (`--volumes`): gp3, 10 GiB, default zone.
    pub(crate) volumes: Vec<String>,
    /// Time an attachment takes to become attached, and to go once detached
    /// (`--latency`), with ±20 % jitter.
    pub(crate) latency: Option<Duration>,
}

/// A volume to create out of band.
#[derive(Clone, Debug, Default)]
pub(crate) struct NewVolume {
    /// Availability zone; default [`EBS_ZONE`].
    pub(crate) zone: Option<String>,
    /// EBS volume type (`gp3` by default, `io2` for Multi-Attach).
    pub(crate) volume_type: Option<String>,
    /// EBS Multi-Attach (EC2 takes it for io1/io2 only).
    pub(crate) multi_attach: bool,
}

/// An instance to launch out of band.
#[derive(Clone, Debug, Default)]
pub(crate) struct NewInstance {
    /// Availability zone; default [`EBS_ZONE`].
    pub(crate) zone: Option<String>,
    /// How many volumes besides the root volume EC2 lets it have; default:
    /// what the driver's node service would report for its type (26 for m5.large).
    pub(crate) limit: Option<usize>,
    /// Device names taken by volumes the fake does not model (from the AMI).
    pub(crate) other_devices: usize,
}

/// One volume attached (or attaching, or detaching) to an instance.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EbsAttachment {
    /// Volume ID.
    pub(crate) volume: String,
    /// Device name on the instance (`/dev/xvdaa`, ...).
    pub(crate) device: String,
    /// EC2's attachment state: `attaching`, `attached` or `detaching`.
    pub(crate) state: String,
}

/// One volume of the fake EC2.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EbsVolume {
    pub(crate) id: String,
    pub(crate) zone: String,
    #[serde(rename = "type")]
    pub(crate) volume_type: String,
    #[serde(rename = "sizeGiB")]
    pub(crate) size_gib: i64,
    pub(crate) multi_attach: bool,
    /// `available` or `in-use`.
    pub(crate) state: String,
    pub(crate) attached_to: Vec<String>,
}

/// One Controller(Un)PublishVolume call the driver answered.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EbsCall {
    /// `ControllerPublishVolume` or `ControllerUnpublishVolume`.
    pub(crate) method: String,
    pub(crate) volume_id: String,
    pub(crate) node_id: String,
    pub(crate) readonly: bool,
    /// CSI access mode name (publish only).
    #[serde(default)]
    pub(crate) access_mode: String,
    /// Whether the capability is a raw block device (publish only).
    #[serde(default)]
    pub(crate) block: bool,
    /// The `devicePath` of a successful publish's context.
    #[serde(default)]
    pub(crate) device_path: String,
    /// gRPC code name of the answer, `OK` for success.
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
    /// Unix milliseconds of arrival and answer.
    pub(crate) start_ms: i64,
    pub(crate) end_ms: i64,
}

/// A running `ebs-controller`.
#[derive(Debug)]
pub(crate) struct EbsController {
    /// The process and its socket.
    pub(crate) process: DriverProcess,
    /// Its test endpoint.
    http: SocketAddr,
}

impl EbsController {
    /// Starts `ebs-controller` and waits for its `ready` line.
    pub(crate) async fn start(cluster: &Cluster, opts: EbsOptions) -> EbsController {
        let program = cluster.bin("ebs-controller");
        let mut process = DriverProcess::start("ebs-controller", &program, move |socket| {
            let mut args = vec![
                format!("--endpoint={}", socket.display()),
                format!("--instances={}", opts.instances.join(",")),
                format!("--volumes={}", opts.volumes.join(",")),
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
            .unwrap_or_else(|e| panic!("ebs-controller did not become ready: {e}"));
        let http = process
            .process
            .stdout()
            .lines()
            .find_map(|l| l.strip_prefix("http "))
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("ebs-controller printed no `http <address>` line"));
        EbsController { process, http }
    }

    /// Path of the driver's socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.process.socket
    }

    /// Volumes attached per instance (every instance is listed).
    pub(crate) async fn attachments(&self) -> BTreeMap<String, Vec<EbsAttachment>> {
        let body = self.request("GET", "/attachments").await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/attachments ({e}): {body}"))
    }

    /// The volumes of the fake EC2, by ID.
    pub(crate) async fn volumes(&self) -> Vec<EbsVolume> {
        let body = self.request("GET", "/volumes").await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/volumes ({e}): {body}"))
    }

    /// The Controller(Un)PublishVolume calls answered so far, in order of answer.
    pub(crate) async fn calls(&self) -> Vec<EbsCall> {
        let body = self.request("GET", "/calls").await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/calls ({e}): {body}"))
    }

    /// Creates volume `id` out of band.
    pub(crate) async fn create_volume(&self, id: &str, v: NewVolume) {
        let mut path = format!("/volumes?id={id}");
        if let Some(zone) = &v.zone {
            path.push_str(&format!("&zone={zone}"));
        }
        if let Some(t) = &v.volume_type {
            path.push_str(&format!("&type={t}"));
        }
        if v.multi_attach {
            path.push_str("&multiAttach=true");
        }
        self.request("POST", &path).await;
    }

    /// Deletes volume `id` (EC2 refuses a volume in use: an error).
    pub(crate) async fn delete_volume(&self, id: &str) -> Result<(), String> {
        self.try_request("DELETE", &format!("/volumes?id={id}"))
            .await
            .map(drop)
    }

    /// Launches instance `id`.
    pub(crate) async fn create_instance(&self, id: &str, i: NewInstance) {
        let mut path = format!("/instances?id={id}&otherDevices={}", i.other_devices);
        if let Some(zone) = &i.zone {
            path.push_str(&format!("&zone={zone}"));
        }
        if let Some(limit) = i.limit {
            path.push_str(&format!("&limit={limit}"));
        }
        self.request("POST", &path).await;
    }

    /// Terminates instance `id` (EC2 detaches its volumes).
    pub(crate) async fn terminate_instance(&self, id: &str) {
        self.request("DELETE", &format!("/instances?id={id}")).await;
    }

    /// Attaches `volume` to `instance` out of band, at once; EC2's refusal is the error.
    pub(crate) async fn attach(&self, volume: &str, instance: &str) -> Result<(), String> {
        self.try_request(
            "POST",
            &format!("/attach?volume={volume}&instance={instance}"),
        )
        .await
        .map(drop)
    }

    /// Detaches `volume` from `instance` out of band, at once; EC2's refusal is the error.
    pub(crate) async fn detach(&self, volume: &str, instance: &str) -> Result<(), String> {
        self.try_request(
            "POST",
            &format!("/detach?volume={volume}&instance={instance}"),
        )
        .await
        .map(drop)
    }

    /// Polls the fake EC2 until `pred` holds for the attachments; returns them.
    pub(crate) async fn wait_attachments(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&BTreeMap<String, Vec<EbsAttachment>>) -> bool,
    ) -> BTreeMap<String, Vec<EbsAttachment>> {
        let start = std::time::Instant::now();
        loop {
            let now = self.attachments().await;
            if pred(&now) {
                return now;
            }
            assert!(
                start.elapsed() < timeout,
                "the fake EC2 did not show {what} within {timeout:?}; attachments: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One request to the test endpoint; panics unless it answers 200.
    async fn request(&self, method: &str, path: &str) -> String {
        self.try_request(method, path)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} on ebs-controller: {e}"))
    }

    /// One request to the test endpoint: the body of a 200, else the status and body.
    async fn try_request(&self, method: &str, path: &str) -> Result<String, String> {
        let (status, body) = http_request(self.http, method, path)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} on ebs-controller: {e}"));
        if status == 200 {
            Ok(body)
        } else {
            Err(format!("{status}: {}", body.trim_end()))
        }
    }
}

/// Whether `instance` has `volume` attached (state `attached`) in `attachments`.
pub(crate) fn ebs_attached(
    attachments: &BTreeMap<String, Vec<EbsAttachment>>,
    instance: &str,
    volume: &str,
) -> bool {
    attachments.get(instance).is_some_and(|l| {
        l.iter()
            .any(|a| a.volume == volume && a.state == "attached")
    })
}
