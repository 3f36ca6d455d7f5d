//! The `attacher-hub` binary: parse arguments, set up logging, run the hub.

use clap::Parser;

fn main() {
    let args = attacher_hub::cli::Args::parse();
    attacher_hub::telemetry::init(attacher_hub::telemetry::Format::Text, "info");
    tracing::info!(csi_address = %args.csi_address, "attacher-hub starting; the controller is not built yet");
}
