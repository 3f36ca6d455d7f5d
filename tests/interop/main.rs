//! The integration tests of attacher-hub beside the reference and the real peers: the
//! differential tests against the Go external-attacher (on the mock and on the GCE PD
//! driver's own controller), the harness hosting the reference, kube-controller-manager and
//! the PD controller around the hub, Leases shared with client-go electors (leader election,
//! interop, the cross-namespace guard) and the documented migrations from the sidecars. One
//! test binary, so that it is linked once; each module is one former test file, and
//! `cargo test --test interop NAME::` runs one (a filter is a substring: `differential::`
//! also matches `pd_differential::`).

#[path = "../peers/mod.rs"]
mod peers;
#[path = "../support/mod.rs"]
mod support;

mod infra;

mod controller_manager;
mod detach_once;
mod differential;
mod discovery_migration;
mod ebs_differential;
mod leader_election;
mod lease_guard;
mod lease_interop;
mod migration;
mod pd_differential;
mod reference_attacher;
mod retry_pacing;
