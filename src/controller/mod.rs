//! The per-driver controller: what external-attacher's `pkg/controller` does, split into
//! pure decisions and a thin async shell.
//!
//! * [`attachment`] — the pure helpers of `util.go` and the decisions of `csi_handler.go`:
//!   finalizer and lease names, node-ID resolution, volume source and capability, in-tree
//!   translation for CSI migration, and every PATCH body the attacher writes.
//! * [`predicate`] — `should_enqueue_va_change`, the VA update filter of `controller.go` that
//!   keeps the attacher's own error writes from defeating backoff.
//!
//! Everything here is synchronous and takes plain values (STYLE rule 13); fetching from caches,
//! calling the driver and writing to the API server belong to the callers.

pub mod attachment;
pub mod csi_handler;
pub mod handler;
pub mod predicate;
pub mod trivial_handler;

pub use handler::{Handler, Synced};
