//! The `attacher-hub` binary: parse arguments, set up logging, run the hub;
//! or, with a first argument `status`, the `status` subcommand.

fn main() -> std::process::ExitCode {
    // Before the sidecar's Go-style flag parser, for which `status` would be
    // a positional argument that ends flag parsing.
    if std::env::args_os().nth(1).is_some_and(|a| a == "status") {
        return attacher_hub::status::main(std::env::args_os().skip(2));
    }
    let (args, warnings) = attacher_hub::cli::parse_env_or_exit();
    attacher_hub::telemetry::init_with_verbosity(args.logging.format, args.logging.verbosity);
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "Version");
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(error) => {
            eprintln!("attacher-hub: starting the async runtime failed: {error}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(attacher_hub::app::run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            let code = error.exit_code();
            if code == 2 {
                // Bad input: one plain line, like a flag error.
                eprintln!("attacher-hub: {}", attacher_hub::app::error_chain(&error));
            } else {
                tracing::error!(error = %attacher_hub::app::error_chain(&error), "fatal");
            }
            std::process::ExitCode::from(code)
        }
    }
}
