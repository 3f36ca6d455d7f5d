//! Images of the shipped manifests, mapped to local builds.
//!
//! No image can be pulled here, so each image a shipped manifest names is mapped to a program
//! built from this repository or from the pinned Go modules, laid out as the real image lays
//! it out:
//!
//! * attacher-hub's image (any repository ending in `/attacher-hub`): the release binary at the
//!   path, user and entrypoint the Dockerfile's final stage gives (read from the Dockerfile, so
//!   that the runner follows it when it changes);
//! * the placeholder controller plugins of `deploy/overlays/hub`
//!   (`registry.example.com/<name>-csi-driver`): the project's mock CSI driver, serving the
//!   driver name the table below gives for it, with volumes `vol-0` to `vol-9999`, not listing
//!   published nodes (see [`resolve`]);
//! * the stand-in of the GCE PD driver's node plugin that `tests/deploy/defaults.rs` names: the
//!   mock, dying when asked for the controller service as PD's node plugin does;
//! * the GCE PD CSI driver's image: `pd-controller`, its controller service on its fake cloud;
//! * external-attacher's and external-provisioner's images: the reference builds of
//!   `tools/testbins`.
//!
//! An image not in the table is an error that names it: a test never runs something else in
//! its place silently.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::support::{Cluster, mock_csi_driver_bin, repo};

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
        "csi-attacher" => Ok(testbin("csi-attacher", "/csi-attacher")),
        "csi-provisioner" => Ok(testbin("csi-provisioner", "/csi-provisioner")),
        _ => Err(format!(
            "no local build for image {image}: tests/pods/image.rs maps attacher-hub, the \
             placeholder drivers, the GCE PD driver, csi-attacher and csi-provisioner"
        )),
    }
}

/// attacher-hub's image: the release binary where the Dockerfile puts it.
fn attacher_hub() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
        let mut image = from_dockerfile(&dockerfile).unwrap_or_else(|e| panic!("Dockerfile: {e}"));
        image.files = vec![(release_binary(), image.files[0].1.clone())];
        image
    })
}

/// The final stage of a Dockerfile: the binary it copies from the builder, `USER`,
/// `ENTRYPOINT` and `CMD` (exec form). The host file of the binary is left empty.
pub(crate) fn from_dockerfile(text: &str) -> Result<Image, String> {
    let joined = text.replace("\\\n", " ");
    let last_stage: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect::<Vec<_>>()
        .rsplit(|l| l.to_ascii_uppercase().starts_with("FROM "))
        .next()
        .map(<[&str]>::to_vec)
        .unwrap_or_default();
    let args = |keyword: &str| {
        last_stage.iter().rev().find_map(|l| {
            let (k, rest) = l.split_once(char::is_whitespace)?;
            k.eq_ignore_ascii_case(keyword).then(|| rest.trim())
        })
    };
    let exec_form = |rest: &str| -> Result<Vec<String>, String> {
        serde_json::from_str(rest).map_err(|e| format!("not an exec form ({e}): {rest}"))
    };
    let copy = args("COPY").ok_or("the final stage copies no binary")?;
    let target = copy
        .split_whitespace()
        .last()
        .ok_or("COPY without a target")?;
    let user = match args("USER") {
        None => None,
        Some(u) => {
            let (uid, gid) = u.split_once(':').unwrap_or((u, u));
            Some((
                uid.parse().map_err(|_| format!("USER {u}: not numeric"))?,
                gid.parse().map_err(|_| format!("USER {u}: not numeric"))?,
            ))
        }
    };
    Ok(Image {
        files: vec![(PathBuf::new(), target.to_string())],
        user,
        entrypoint: args("ENTRYPOINT")
            .map(exec_form)
            .transpose()?
            .unwrap_or_default(),
        cmd: args("CMD").map(exec_form).transpose()?.unwrap_or_default(),
    })
}

/// `target/release/attacher-hub`, built (or found up to date) once per test binary with the
/// command CI and the Dockerfile use.
pub(crate) fn release_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build
            .args(["build", "--release", "--locked", "--bin", "attacher-hub"])
            .current_dir(repo());
        crate::support::without_cargo_test_env(&mut build);
        let status = build.status().expect("run cargo build --release");
        assert!(status.success(), "cargo build --release failed");
        crate::support::target_dir().join("release/attacher-hub")
    })
    .clone()
}

#[test]
fn the_final_stage_of_the_dockerfile_gives_path_user_and_entrypoint() {
    let text = "FROM rust AS builder\nUSER 1\nCOPY . .\nENTRYPOINT [\"/x\"]\n\
                FROM base:nonroot\nCOPY --from=builder /src/target/release/a \\\n  /a\n\
                USER 65532:65533\nEXPOSE 8080\nENTRYPOINT [\"/a\", \"--flag\"]\n";
    let image = from_dockerfile(text).expect("parsed");
    assert_eq!(image.files[0].1, "/a");
    assert_eq!(image.user, Some((65532, 65533)));
    assert_eq!(image.entrypoint, ["/a", "--flag"]);
    assert!(image.cmd.is_empty());
    assert!(from_dockerfile("FROM x\nENTRYPOINT /a\nCOPY a /a\n").is_err());
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
