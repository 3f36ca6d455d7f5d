//! Images of the shipped manifests, mapped to local builds.
//!
//! No image can be pulled here, so each image a shipped manifest names is mapped to a program
//! built from this repository or from the pinned Go modules, laid out as the real image lays
//! it out:
//!
//! * attacher-hub's image (any repository ending in `/attacher-hub`): the image `make release`
//!   builds (`scripts/release.sh`, reused when up to date), unpacked from its OCI archive: its
//!   binary at its path, run with its configuration's user and entrypoint;
//! * the placeholder controller plugins of `deploy/overlays/hub`
//!   (`registry.example.com/<name>-csi-driver`): the project's mock CSI driver, serving the
//!   driver name the table below gives for it, with volumes `vol-0` to `vol-9999`, not listing
//!   published nodes (see [`resolve`]);
//! * the stand-in of the GCE PD driver's node plugin that `tests/deploy/defaults.rs` names: the
//!   mock, dying when asked for the controller service as PD's node plugin does;
//! * the GCE PD CSI driver's image: `pd-controller`, its controller service on its fake cloud;
//! * the AWS EBS CSI driver's image (`aws-ebs-csi-driver`): `ebs-controller`, its controller
//!   service on an in-memory EC2
//!   (which needs no AWS credentials, region or metadata service: the chart's optional
//!   `aws-secret` and `aws-meta` may be absent);
//! * external-attacher's and external-provisioner's images (Kubernetes' `csi-attacher` and
//!   `csi-provisioner`, and the EKS distribution's `external-attacher` and
//!   `external-provisioner` that EBS's chart names): the reference builds of `tools/testbins`.
//!
//! An image not in the table is an error that names it: a test never runs something else in
//! its place silently.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::support::{Cluster, mock_csi_driver_bin, release};

/// What runs for one image: the files the image holds, its user and its entrypoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Image {
    /// Files of the image: (host file, absolute path in the image).
    pub(crate) files: Vec<(PathBuf, String)>,
    /// The image's user and group (`USER`); `None` is root.
    pub(crate) user: Option<(u32, u32)>,
    /// The image's entrypoint (`ENTRYPOINT`), container `command` replaces it.
    pub(crate) entrypoint: Vec<String>,
    /// Arguments the image adds after the entrypoint when the container gives no `args`
    /// (`CMD`).
    pub(crate) cmd: Vec<String>,
}

/// The placeholder controller plugins of the shipped manifests (and of the tests that install
/// several of them side by side, each serving a driver of its own) and the driver name each
/// serves.
const PLACEHOLDERS: [(&str, &str); 7] = [
    (
        "registry.example.com/example-csi-driver",
        "example.csi.example.com",
    ),
    (
        "registry.example.com/fast-disk-csi-driver",
        "fast-disk.csi.example.com",
    ),
    ("registry.example.com/nfs-csi-driver", "nfs.csi.example.com"),
    (
        "registry.example.com/vendor-a-csi-driver",
        "vendor-a.csi.example.com",
    ),
    (
        "registry.example.com/vendor-b-csi-driver",
        "vendor-b.csi.example.com",
    ),
    (
        "registry.example.com/release-a-csi-driver",
        "release-a.csi.example.com",
    ),
    (
        "registry.example.com/release-b-csi-driver",
        "release-b.csi.example.com",
    ),
];

/// The stand-in of the GCE PD driver's node plugin (its `gce-pd-driver` container run with
/// `--run-controller-service=false`), whose image `tests/deploy/defaults.rs` names in its place:
/// the mock serving PD's name, offering the CONTROLLER_SERVICE plugin capability as PD's
/// identity service always does, and exiting with status 2 when asked ControllerGetCapabilities,
/// as PD's node plugin dies (a Go panic: it dereferences its nil controller server).
pub(crate) const PD_NODE_PLUGIN_STAND_IN: &str = "registry.example.com/pd-node-plugin-stand-in";

/// The repository of `image` (no tag, no digest).
pub(crate) fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    // A tag follows the last `:` after the last `/` (a registry port comes before a `/`).
    match image.rfind(':') {
        Some(colon) if colon > image.rfind('/').unwrap_or(0) => &image[..colon],
        _ => image,
    }
}

/// The image that runs for `image`, or why there is none.
pub(crate) fn resolve(image: &str) -> Result<Image, String> {
    let repo_name = repository(image);
    if repo_name == "attacher-hub" || repo_name.ends_with("/attacher-hub") {
        return Ok(attacher_hub().clone());
    }
    if let Some((_, driver)) = PLACEHOLDERS.iter().find(|(r, _)| *r == repo_name) {
        return Ok(Image {
            files: vec![(mock_csi_driver_bin().to_path_buf(), "/csi-driver".into())],
            user: None,
            // Volumes vol-0 ... vol-9999 exist in the mock's pretend storage. Each pod's mock
            // keeps its attachments in its own memory, where a real driver's backend is shared
            // by every replica; so that a new leader does not take every attachment for lost
            // and publish it again, the placeholder does not list published nodes (as many
            // drivers do not), and the attacher trusts the VolumeAttachments' status.
            entrypoint: vec![
                "/csi-driver".into(),
                format!("--name={driver}"),
                "--volumes=10000".into(),
                "--no-published-nodes".into(),
            ],
            cmd: Vec::new(),
        });
    }
    if repo_name == PD_NODE_PLUGIN_STAND_IN {
        return Ok(Image {
            files: vec![(mock_csi_driver_bin().to_path_buf(), "/csi-driver".into())],
            user: None,
            entrypoint: vec![
                "/csi-driver".into(),
                "--name=pd.csi.storage.gke.io".into(),
                "--fault".into(),
                "ControllerGetCapabilities=exit:2".into(),
            ],
            cmd: Vec::new(),
        });
    }
    let testbin = |name: &str, at: &str| Image {
        files: vec![(Cluster::get().bin(name), at.to_string())],
        user: None,
        entrypoint: vec![at.to_string()],
        cmd: Vec::new(),
    };
    match repo_name.rsplit('/').next().unwrap_or(repo_name) {
        // The driver's image runs /gce-pd-csi-driver; pd-controller takes its flags.
        "gcp-compute-persistent-disk-csi-driver" => {
            Ok(testbin("pd-controller", "/gce-pd-csi-driver"))
        }
        // The driver's image runs /bin/aws-ebs-csi-driver; ebs-controller serves its
        // controller service (the container's arguments are the tests' to give). The chart
        // names no command, only arguments, so the stand-in may sit elsewhere: at the root,
        // since a container's /bin here is the host's /usr/bin (the runner's usr-merged
        // layout), where no file of an image can be put.
        "aws-ebs-csi-driver" => Ok(testbin("ebs-controller", "/aws-ebs-csi-driver")),
        "csi-attacher" | "external-attacher" => Ok(testbin("csi-attacher", "/csi-attacher")),
        "csi-provisioner" | "external-provisioner" => {
            Ok(testbin("csi-provisioner", "/csi-provisioner"))
        }
        _ => Err(format!(
            "no local build for image {image}: tests/pods/image.rs maps attacher-hub, the \
             placeholder drivers, the GCE PD and AWS EBS drivers, external-attacher \
             (csi-attacher) and external-provisioner (csi-provisioner)"
        )),
    }
}

/// attacher-hub's image: the one `make release` built, its entrypoint's file taken from its
/// root filesystem, its user, entrypoint and command from its configuration.
fn attacher_hub() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let unpacked = release::unpacked_image();
        from_config(&unpacked.config, &unpacked.root)
            .unwrap_or_else(|e| panic!("the release image's configuration: {e}"))
    })
}

/// What runs for an image of configuration `config` (the OCI image configuration's `config`)
/// whose root filesystem is at `root`: the entrypoint's file, the user, entrypoint and command.
pub(crate) fn from_config(
    config: &serde_json::Value,
    root: &std::path::Path,
) -> Result<Image, String> {
    let strings = |key: &str| -> Vec<String> {
        config[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let entrypoint = strings("Entrypoint");
    let program = entrypoint.first().ok_or("no Entrypoint")?.clone();
    let user = match config["User"].as_str().filter(|u| !u.is_empty()) {
        None => None,
        Some(u) => {
            let (uid, gid) = u.split_once(':').unwrap_or((u, u));
            Some((
                uid.parse().map_err(|_| format!("User {u}: not numeric"))?,
                gid.parse().map_err(|_| format!("User {u}: not numeric"))?,
            ))
        }
    };
    let file = root.join(program.trim_start_matches('/'));
    if !file.is_file() {
        return Err(format!("the entrypoint {program} is not in the image"));
    }
    Ok(Image {
        files: vec![(file, program)],
        user,
        entrypoint,
        cmd: strings("Cmd"),
    })
}

/// attacher-hub's binary as the release image holds it: `make release` run (or found up to
/// date) and its image unpacked, once per test binary.
pub(crate) fn release_binary() -> PathBuf {
    attacher_hub().files[0].0.clone()
}

#[test]
fn repositories_lose_their_tag_but_keep_a_registry_port() {
    assert_eq!(
        repository("registry.example.com/attacher-hub:0.1.0"),
        "registry.example.com/attacher-hub"
    );
    assert_eq!(repository("localhost:5000/a/b"), "localhost:5000/a/b");
    assert_eq!(
        repository("localhost:5000/a/b:v1@sha256:00"),
        "localhost:5000/a/b"
    );
    assert!(resolve("registry.example.com/unknown:1").is_err());
}

#[test]
fn an_image_configuration_gives_its_file_user_entrypoint_and_command() {
    let root = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(root.path().join("a"), b"").expect("the entrypoint's file");
    let config = serde_json::json!({
        "User": "65532:65533",
        "Entrypoint": ["/a", "--flag"],
        "Cmd": ["x"],
    });
    let image = from_config(&config, root.path()).expect("valid");
    assert_eq!(image.files, vec![(root.path().join("a"), "/a".to_string())]);
    assert_eq!(image.user, Some((65532, 65533)));
    assert_eq!(image.entrypoint, ["/a", "--flag"]);
    assert_eq!(image.cmd, ["x"]);
    let root_user = serde_json::json!({"Entrypoint": ["/a"]});
    assert_eq!(
        from_config(&root_user, root.path()).expect("valid").user,
        None
    );
    let missing = serde_json::json!({"Entrypoint": ["/b"]});
    assert!(from_config(&missing, root.path()).is_err());
}
