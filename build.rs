//! Compiles `proto/csi.proto` (and the kubelet's plugin registration API,
//! `proto/pluginregistration.proto`) with protox (pure Rust, no `protoc`) and
//! generates the tonic client and server code into `OUT_DIR`.
//!
//! Every message with a field marked `(csi.v1.csi_secret) = true` is generated
//! without `Debug`; `src/csi/proto.rs` gives those messages a redacting `Debug`.
//! prost requires `Debug` of every message, so forgetting one fails the build.
//!
//! It also stamps the version (`--version`, the start-up log line, the image's
//! labels through `scripts/release.sh`): see [`stamp_version`].

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use prost_reflect::{DescriptorPool, Value};

const PROTO: &str = "proto/csi.proto";
const REGISTRATION_PROTO: &str = "proto/pluginregistration.proto";
const SECRET_OPTION: &str = "csi.v1.csi_secret";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    stamp_version();
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed={REGISTRATION_PROTO}");
    println!("cargo:rerun-if-changed=build.rs");

    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true);
    compiler.open_file("csi.proto")?;
    compiler.open_file("pluginregistration.proto")?;
    let pool: DescriptorPool = compiler.descriptor_pool();

    let secret = pool
        .get_extension_by_name(SECRET_OPTION)
        .ok_or("proto/csi.proto must declare the csi_secret field option")?;
    let mut secret_bearing: Vec<String> = pool
        .all_messages()
        .filter(|m| m.package_name() == "csi.v1")
        .filter(|m| {
            m.fields().any(|f| {
                let options = f.options();
                options.has_extension(&secret)
                    && matches!(*options.get_extension(&secret), Value::Bool(true))
            })
        })
        .map(|m| format!(".{}", m.full_name()))
        .collect();
    secret_bearing.sort();

    // The list is also written out so that a unit test can check that each of
    // these messages redacts its secrets.
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out.join("secret_bearing_messages.txt"),
        secret_bearing.join("\n"),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_debug(secret_bearing)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

/// Sets `ATTACHER_HUB_VERSION` and `ATTACHER_HUB_REVISION` for the crate.
///
/// The version is Cargo.toml's, with what `git describe --tags --match 'v*' --dirty` adds as
/// SemVer build metadata: `0.1.0` on a clean checkout of the tag `v0.1.0`, `0.1.0+5.g1a2b3c4`
/// five commits after it, `0.1.0+g1a2b3c4` when no tag is reachable, `.dirty` at the end when
/// tracked files differ from the commit. The revision is the full commit hash. Without git
/// (a source tarball, a container build that copies no `.git`), the version is Cargo.toml's
/// alone and the revision `unknown`.
///
/// Cargo runs this again when the commit changes (HEAD or the branch it names), when a source
/// file changes (so that `.dirty` follows edits), and when Cargo.toml or Cargo.lock change.
fn stamp_version() {
    let package = env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    for path in ["src", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={path}");
    }
    let revision = git(&["rev-parse", "HEAD"]);
    if revision.is_some() {
        watch_git_head(&git);
    }
    let describe = git(&["describe", "--tags", "--match", "v*", "--always", "--dirty"]);
    let version = describe.map_or_else(|| package.clone(), |d| with_metadata(&package, &d));
    println!("cargo:rustc-env=ATTACHER_HUB_VERSION={version}");
    println!(
        "cargo:rustc-env=ATTACHER_HUB_REVISION={}",
        revision.as_deref().unwrap_or("unknown")
    );
}

/// `package` with the build metadata `describe` (git's output) gives; see [`stamp_version`].
fn with_metadata(package: &str, describe: &str) -> String {
    let (describe, dirty) = match describe.strip_suffix("-dirty") {
        Some(d) => (d, true),
        None => (describe, false),
    };
    let mut metadata: Vec<String> = Vec::new();
    // `v0.1.0`, `v0.1.0-5-g1a2b3c4`, or a bare abbreviated hash when no tag is reachable.
    match describe.rsplitn(3, '-').collect::<Vec<_>>().as_slice() {
        [hash, count, _tag] if hash.starts_with('g') && count.parse::<u64>().is_ok() => {
            metadata.push((*count).to_owned());
            metadata.push((*hash).to_owned());
        }
        _ if describe.starts_with('v') => {}
        _ => metadata.push(format!("g{describe}")),
    }
    if dirty {
        metadata.push("dirty".to_owned());
    }
    if metadata.is_empty() {
        package.to_owned()
    } else {
        format!("{package}+{}", metadata.join("."))
    }
}

/// Asks Cargo to run the build script again when the checked-out commit changes: `HEAD` of
/// this work tree, and the branch file it points to (or `packed-refs`). Only existing files
/// are named: Cargo takes a missing one as changed on every build.
fn watch_git_head(git: &dyn Fn(&[&str]) -> Option<String>) {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) else {
        return;
    };
    let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .map_or_else(|| PathBuf::from(&git_dir), PathBuf::from);
    let mut watched = vec![Path::new(&git_dir).join("HEAD"), common.join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common.join(branch));
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
