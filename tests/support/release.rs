//! The artifacts of `make release` (`scripts/release.sh`), which the tests run rather than
//! assembling an image of their own: built once per test process (the script reuses them when
//! nothing changed, and serialises concurrent runs), and the image unpacked from its OCI
//! archive as a container runtime would unpack it.
//!
//! Used by the pod runner (`tests/pods/image.rs`) and by `tests/deploy/image.rs`, which checks
//! the artifacts against each other.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use crate::support::{repo, target_dir, testbin, testbins, without_cargo_test_env};

/// `make release`'s output directory and its record (`release.json`).
pub(crate) struct Release {
    /// `target/release-artifacts`.
    pub(crate) dir: PathBuf,
    /// What `release.json` says: version, revision, file names, the image's tag, ID, digest
    /// and labels.
    pub(crate) record: Value,
}

impl Release {
    /// The artifact `release.json` names under `key` (`binary`, `sbom`, `chart`).
    pub(crate) fn file(&self, key: &str) -> PathBuf {
        let name = self.record[key]
            .as_str()
            .unwrap_or_else(|| panic!("release.json names no {key}"));
        self.dir.join(name)
    }

    /// The image's OCI archive.
    pub(crate) fn image_archive(&self) -> PathBuf {
        self.dir.join(self.str(&["image", "archive"]))
    }

    /// A string of the record at `path`.
    pub(crate) fn str(&self, path: &[&str]) -> &str {
        path.iter()
            .fold(&self.record, |v, key| &v[key])
            .as_str()
            .unwrap_or_else(|| panic!("release.json has no string at {path:?}"))
    }
}

/// The release, built by `scripts/release.sh` (or found up to date) on first use.
pub(crate) fn release() -> &'static Release {
    static RELEASE: OnceLock<Release> = OnceLock::new();
    RELEASE.get_or_init(|| {
        let mut cmd = Command::new(repo().join("scripts/release.sh"));
        cmd.env("CARGO_TARGET_DIR", target_dir())
            .env("CARGO", env!("CARGO"))
            .env("HELM", testbin(testbins(), "helm"))
            .current_dir(repo())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit());
        // The nested release build must see the environment of a plain build.
        without_cargo_test_env(&mut cmd);
        let out = cmd.output().expect("run scripts/release.sh");
        assert!(
            out.status.success(),
            "scripts/release.sh failed ({})",
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        let record = std::fs::read_to_string(dir.join("release.json"))
            .unwrap_or_else(|e| panic!("{}/release.json: {e}", dir.display()));
        Release {
            record: serde_json::from_str(&record).expect("release.json is JSON"),
            dir,
        }
    })
}

/// The image of an OCI archive, unpacked: its manifest's digest, its configuration (`config`
/// of the OCI image configuration: `User`, `Entrypoint`, `Cmd`, `Labels`, ...) and its root
/// filesystem (every layer applied in order).
pub(crate) struct Unpacked {
    /// The manifest's digest (`sha256:...`), as `index.json` names it.
    pub(crate) digest: String,
    /// The image configuration's `config` object.
    pub(crate) config: Value,
    /// The root filesystem.
    pub(crate) root: PathBuf,
}

/// The release's image, unpacked once under the target directory (in a directory named by its
/// digest, so that another release never reuses it).
pub(crate) fn unpacked_image() -> &'static Unpacked {
    static IMAGE: OnceLock<Unpacked> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let release = release();
        let digest = release.str(&["image", "digest"]);
        let hex = digest.trim_start_matches("sha256:");
        let dir = target_dir().join("release-unpacked").join(hex);
        if !dir.join("config.json").is_file() {
            let tmp = target_dir()
                .join("release-unpacked")
                .join(format!(".{hex}.{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            unpack(&release.image_archive(), &tmp);
            // Another test process may have unpacked it meanwhile: either copy will do.
            if std::fs::rename(&tmp, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&tmp);
            }
        }
        let layout = std::fs::read_to_string(dir.join("config.json")).expect("config.json");
        let (manifest_digest, config): (String, Value) =
            serde_json::from_str(&layout).expect("config.json");
        Unpacked {
            digest: manifest_digest,
            config,
            root: dir.join("rootfs"),
        }
    })
}

/// Unpacks the OCI archive `archive` into `dir`: `dir/rootfs` and `dir/config.json` (the
/// manifest's digest and the image configuration's `config`).
fn unpack(archive: &Path, dir: &Path) {
    let layout = dir.join("layout");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&layout).expect("create the layout directory");
    std::fs::create_dir_all(&rootfs).expect("create the rootfs directory");
    tar(&[
        "-xf",
        &archive.to_string_lossy(),
        "-C",
        &layout.to_string_lossy(),
    ]);
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let json = |path: PathBuf| -> Value {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let index = json(layout.join("index.json"));
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("index.json names a manifest")
        .to_string();
    let manifest = json(blob(&digest));
    let config = json(blob(manifest["config"]["digest"].as_str().expect("config")));
    for layer in manifest["layers"].as_array().expect("layers") {
        let media = layer["mediaType"].as_str().unwrap_or_default();
        let flag = if media.ends_with("+gzip") {
            "-xzf"
        } else {
            "-xf"
        };
        let path = blob(layer["digest"].as_str().expect("layer digest"));
        tar(&[
            flag,
            &path.to_string_lossy(),
            "-C",
            &rootfs.to_string_lossy(),
        ]);
    }
    let record = serde_json::to_string(&(digest, &config["config"])).expect("JSON");
    std::fs::write(dir.join("config.json"), record).expect("write config.json");
    let _ = std::fs::remove_dir_all(&layout);
}

fn tar(args: &[&str]) {
    let status = Command::new("tar")
        .args(args)
        .stdin(Stdio::null())
        .status()
        .expect("run tar");
    assert!(status.success(), "tar {args:?} failed");
}
