//! The fault suite: the fault matrix (`faults`) and one focused test per bug that fault
//! injection found (`regressions`), over the fault kit of this directory. One test binary, so
//! that it is linked once; `make faults` (scripts/faults.sh) runs the scenarios two at a time
//! and then the regressions one at a time (`cargo test --test faults regressions::
//! -- --test-threads=1`), each part a filter on this binary.

#[path = "../hub/mod.rs"]
mod hub;
// The fault kit: `mod.rs` and its modules in this directory.
#[path = "mod.rs"]
mod kit;
// The bench's runner, for the side-by-side run under API Priority and Fairness
// (`faults::apf_squeeze`).
#[path = "../bench/scenario.rs"]
#[allow(dead_code)]
mod scenario;
// What the runner's workloads cost the control plane (its figures are the bench's).
#[path = "../bench/control_plane.rs"]
#[allow(dead_code)]
mod control_plane;
// The idle windows' requests, from the audit log.
#[path = "../bench/periodic.rs"]
#[allow(dead_code)]
mod periodic;
#[path = "../bench/squeeze.rs"]
#[allow(dead_code)] // its bench section
mod squeeze;
#[path = "../support/mod.rs"]
mod support;

mod faults;
mod regressions;
