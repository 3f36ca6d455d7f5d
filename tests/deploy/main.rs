//! The integration tests of what `deploy/` and the Dockerfile ship, against the real API
//! server: the overlays and the shipped RBAC, the Helm chart, the container image, the three
//! topologies on the GCE PD driver's manifests, `make demo`, installs side by side and the
//! chart's defaults next to a node plugin (these two on pods, through the pod runner of
//! tests/pods: root). One test binary, so that it is linked once; each module is one former
//! test file, and `cargo test --test deploy NAME::` runs one. (The shipped paths rolled over
//! as rendered are in the `measured` binary.)

#[path = "../pods/mod.rs"]
mod pods;
#[path = "../support/mod.rs"]
mod support;

mod defaults;
mod demo;
mod deploy;
mod hardening;
mod helm;
mod image;
mod installs;
mod topologies;
