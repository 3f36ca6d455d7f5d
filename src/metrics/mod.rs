//! Prometheus metrics, on one non-global registry created at start-up.
//!
//! Series names, labels and buckets follow the Go sidecars so that existing dashboards and
//! alerts keep working. A low layer: it uses only [`crate::names`]; the CSI client, the API
//! budgets and the hub (which translates the Lease guard's view into plain gauge values) report
//! into it.
//!
//! * [`csi`] — `csi_sidecar_operations_seconds`, one sample per CSI call;
//! * [`hub`] — the per-driver series of the hub (queues, leadership, health, latency, budgets);
//! * [`api`] — what an API budget reports, and its series;
//! * [`connection`] — the connection to the API server (dials, health PINGs, dead connections);
//! * [`config`] — the driver list's reloads;
//! * [`unserved`] — drivers with VolumeAttachments waiting and no live attacher.

pub mod api;
pub mod config;
pub mod connection;
pub mod csi;
pub mod hub;
mod series;
pub mod unserved;

pub use api::{Limiter, Observer};
pub use connection::ConnectionMetrics;
pub use csi::{CSI_OPERATIONS_BUCKETS, CSI_OPERATIONS_NAME, CsiOperations, UNKNOWN_DRIVER};
pub use hub::{API_BUDGET_WAIT_BUCKETS, END_TO_END_BUCKETS, HubMetrics};
pub use unserved::UnservedMetrics;
