//! The integration tests whose bounds are timings measured on the shared machine, and which
//! therefore take the machine's test slots to themselves through one gate (`support::alone`,
//! `support::shared`): hub mode (its isolation test compares attach latencies) and the shipped
//! paths run as rendered by the pod runner (each rollover bounds attach latency and leaderless
//! time; needs root). One test binary, so that it is linked once; each module is one former
//! test file, and `cargo test --test measured NAME::` runs one. `make bench` runs
//! `shipped::rolling_update_benchmark` from here.

#[path = "../hub/mod.rs"]
mod hub;
#[path = "../pods/mod.rs"]
mod pods;
#[path = "../support/mod.rs"]
mod support;

mod hub_mode;
mod shipped;
