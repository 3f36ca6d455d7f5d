//! The integration tests that need no control plane: the alert rules under promtool, the lock
//! around the Go tools' cache (two builds at once), the
//! memory a cached object costs, the command line and `drivers.yaml` of the binary, the
//! parsers' property test and the CSI-migration translation against csi-translation-lib (which
//! needs the Go test tools, not an API server). One test binary, so that it is linked once;
//! each module is one former test file, and `cargo test --test standalone NAME::` runs one.

#[path = "../support/mod.rs"]
mod support;

mod alerts;
mod cache_memory;
mod cli;
mod config_file;
mod config_fuzz;
mod testbins_lock;
mod translation_oracle;
