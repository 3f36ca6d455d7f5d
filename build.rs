//! Compiles `proto/csi.proto` (and the kubelet's plugin registration API,
//! `proto/pluginregistration.proto`) with protox (pure Rust, no `protoc`) and
//! generates the tonic client and server code into `OUT_DIR`.
//!
//! Every message with a field marked `(csi.v1.csi_secret) = true` is generated
//! without `Debug`; `src/csi/proto.rs` gives those messages a redacting `Debug`.
//! prost requires `Debug` of every message, so forgetting one fails the build.

use std::{env, fs, path::PathBuf};

use prost_reflect::{DescriptorPool, Value};

const PROTO: &str = "proto/csi.proto";
const REGISTRATION_PROTO: &str = "proto/pluginregistration.proto";
const SECRET_OPTION: &str = "csi.v1.csi_secret";

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
