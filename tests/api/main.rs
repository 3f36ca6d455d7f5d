//! The integration tests of attacher-hub against the API server of the shared control plane:
//! the kube client and the CSI client, per-driver API budgets, discovery by registration and
//! by sockets, one watch per kind, Prometheus on the metrics, the shipped RBAC derived from
//! behaviour and `attacher-hub status`. One test binary, so that it is linked once; each
//! module is one former test file, and `cargo test --test api NAME::` runs one.

#[path = "../hub/mod.rs"]
mod hub;
#[path = "../support/mod.rs"]
mod support;

mod api_budget;
mod cluster_client;
mod csi_client;
mod discovery_registration;
mod discovery_sockets;
mod hub_watches;
mod prometheus;
mod rbac_behaviour;
mod status_command;
