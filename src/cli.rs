//! Command-line arguments.
//!
//! The flag set grows to every external-attacher v4.12 flag in the sidecar
//! issue; for now the binary knows `--version`, `--help` and `--csi-address`.

use clap::Parser;

/// attacher-hub: the CSI external-attacher for one or many drivers.
#[derive(Debug, Parser)]
#[command(name = "attacher-hub", version, about, long_about = None)]
pub struct Args {
    /// Address of the CSI driver socket (`/path`, `unix:///path` or `unix:/path`).
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,
}
