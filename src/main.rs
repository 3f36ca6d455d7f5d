//! The `attacher-hub` binary: everything it does is [`attacher_hub::app::main`] (the `status`
//! subcommand, or parse the flags, set up logging, run the hub until a signal), so that the
//! library holds the logic and its tests.

fn main() -> std::process::ExitCode {
    attacher_hub::app::main()
}
