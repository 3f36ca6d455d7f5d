//! The `attacher-hub` binary: parse arguments, set up logging, run the hub.

fn main() {
    let (args, warnings) = attacher_hub::cli::parse_env_or_exit();
    attacher_hub::telemetry::init_with_verbosity(args.logging.format, args.logging.verbosity);
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        ?args,
        "attacher-hub starting; the controller is not built yet"
    );
}
