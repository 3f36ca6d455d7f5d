//! attacher-hub: the job of the Kubernetes CSI `external-attacher`, for one or
//! many CSI drivers in one process.
//!
//! ```text
//!   kube-apiserver ──watch VA/PV/CSINode──▶ router ──▶ per-driver queues ──▶ workers
//!                                                          │                    │
//!                                                   registry of drivers   ControllerPublish /
//!                                                   (one Lease each)      ControllerUnpublish
//!                                                                               │
//!                                                                    driver Unix sockets (csi)
//! ```
//!
//! The crate is a library with a thin binary (`src/main.rs`). `csi` is the CSI
//! client layer; `mock` is the project's own mock CSI driver, used by tests and
//! benchmarks and shipped as the `mock-csi-driver` binary.

pub mod app;
pub mod balance;
pub mod budget;
pub mod cli;
pub mod config;
pub mod controller;
pub mod csi;
pub mod driver;
pub mod http;
pub mod hub;
pub mod k8s;
pub mod leader;
pub mod metrics;
pub mod mock;
pub mod queue;
pub mod router;
pub mod telemetry;
