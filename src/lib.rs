//! attacher-hub: the job of the Kubernetes CSI `external-attacher`, for one or
//! many CSI drivers in one process.
//!
//! ```text
//!                  k8s::router: one watch per kind                hub::driver (one per socket, in hub::Registry)
//!  kube-apiserver ──VA / PV / CSINode──▶ k8s::Stores ──hub::Dispatch──▶ ┌──────────────────────────────────────┐
//!       ▲          (shared caches,      by spec.attacher,               │ attach queue ─▶ attach workers  ─┐   │
//!       │           lean copies of      by PV finalizers                │ detach queue ─▶ detach workers  ─┼─▶ controller ──▶ CSI socket
//!       │           what is read)                                       │ PV queue     ─▶ PV workers      ─┘   │  handlers      (csi::DriverClient)
//!       │                                                               │ reconciler, leader::LeaderElector,   │
//!       │                                                               │ k8s::budget::ApiBudget               │
//!       └──── PATCH VA / VA status / PV, GET Secret (k8s::Writer) ◀─────┴──────────────────────────────────────┘
//! ```
//!
//! Data flow: [`k8s::router`] keeps one watch per kind and, once the shared
//! [`k8s::stores`] hold a change (as a [`k8s::lean`] copy: only the fields the attacher
//! reads), routes it ([`hub::dispatch`]) to the driver
//! named by `spec.attacher` (VAs) or by the finalizers a PV carries. Each
//! [`hub::driver::Driver`] connects to its socket ([`csi`]), probes it, learns
//! its name and capabilities, registers in the [`hub::registry`], wins its
//! Lease ([`leader`], spread across replicas by [`leader::balance`]) and runs
//! its workers over client-go style queues ([`queue`]). Workers call the
//! [`controller`] handlers, whose decisions are pure functions (node IDs,
//! volume sources, in-tree translation, capabilities, patches) and whose
//! writes go through the driver's [`k8s::writer`] and API budget. Sidecar
//! mode is the hub with one driver; [`app`] turns the command line ([`cli`],
//! and [`config`] for `drivers.yaml`) into a running [`hub`], whose
//! [`hub::supervisor`] follows the driver list. [`http`] serves [`metrics`],
//! health, readiness and `/drivers`. [`status`] is the `attacher-hub status`
//! subcommand, a client of `/drivers`. The project's mock CSI driver is the
//! workspace member `crates/mock-csi-driver`, used by the tests only.
//!
//! Layers, from the top; a module uses only modules of the layers below it, and no two modules
//! use each other, even through others (`metrics` shows the Lease guard's view as plain values
//! the hub hands it, not by reading [`leader::guard`]).
//!
//! ```text
//!  app
//!  hub, status (the subcommand)
//!  config
//!  controller
//!  cli
//!  leader
//!  csi, k8s
//!  metrics
//!  telemetry, http, queue
//!  names, random, api_error, backoff
//! ```
//!
//! Uses between top modules, module: the modules it uses (`scripts/check-layers.sh` checks
//! them against the `crate::` paths of the code, tests left out; `make test` runs it):
//!
//! ```text
//! app: cli, config, csi, hub, leader, status, telemetry
//! hub: api_error, backoff, config, controller, csi, http, k8s, leader, metrics, names, queue, random, telemetry
//! status: api_error, cli, k8s
//! config: cli, csi, k8s, leader, names
//! controller: csi, k8s, names
//! cli: leader, telemetry
//! leader: api_error, backoff, k8s, names, random, telemetry
//! csi: backoff, metrics, telemetry
//! k8s: api_error, backoff, metrics, names, random, telemetry
//! metrics: names
//! telemetry: api_error
//! http: -
//! queue: backoff
//! names: -
//! random: -
//! api_error: -
//! backoff: -
//! ```

pub mod api_error;
pub mod app;
pub mod backoff;
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
