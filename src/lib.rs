//! attacher-hub: the job of the Kubernetes CSI `external-attacher`, for one or
//! many CSI drivers in one process.
//!
//! ```text
//!                      one watch per kind                      per driver (hub::Registry)
//!  kube-apiserver ──VA / PV / CSINode──▶ router ──route by──▶ ┌──────────────────────────────┐
//!       ▲          (shared caches,      spec.attacher,        │ attach queue ─▶ attach pool  │
//!       │           managedFields       PV finalizers         │ detach queue ─▶ detach pool  │──▶ CSI socket
//!       │           stripped)                                 │ PV queue     ─▶ PV pool      │   (csi client)
//!       │                                                     │ reconciler, Lease, budget    │
//!       └──── PATCH VA / VA status / PV (k8s::Writer) ◀───────┴──────────────────────────────┘
//! ```
//!
//! Data flow: [`router`] keeps one watch per kind and routes each change,
//! after the shared cache holds it, to the driver named by `spec.attacher`
//! (VAs) or by the finalizers a PV carries. Each [`driver::Driver`] connects
//! to its socket ([`csi`]), probes it, learns its name and capabilities,
//! registers in the [`hub::Registry`], wins its Lease ([`leader`], spread
//! across replicas by [`balance`]) and runs its workers over client-go style
//! queues ([`queue`]). Workers call the [`controller`] handlers, whose
//! decisions are pure functions in [`controller::attachment`]. Sidecar mode is
//! the hub with one driver; [`app`] turns the command line ([`cli`], and
//! [`config`] for `drivers.yaml`) into a running [`hub`]. [`http`] serves
//! metrics ([`metrics`]), health, readiness and `/drivers`.
//! [`status`] is the `attacher-hub status` subcommand, a client of `/drivers`.

pub mod app;
pub mod cli;
pub mod config;
pub mod controller;
pub mod csi;
#[cfg(test)]
pub(crate) mod fake_api;
pub mod http;
pub mod hub;
pub mod k8s;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod queue;
pub mod random;
pub mod status;
pub mod telemetry;
