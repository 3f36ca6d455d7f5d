//! The per-driver controller: what external-attacher's `pkg/controller` does, split into
//! pure decisions and a thin async shell.
//!
//! The pure decisions (the counterpart of `util.go` and of the decisions in `csi_handler.go`,
//! `docs/design.md#volume-source` to `docs/design.md#va-update-filter`): nothing in them performs
//! I/O; callers pass the objects they read from the caches and get back node IDs, CSI volumes
//! and capabilities, PATCH bodies and yes/no decisions.
//!
//! * [`node_id`] — the CSI node ID of a VA's node;
//! * [`source`] — the volume of a VA (PV or inline spec), in-tree PVs translated by
//!   [`translation`] (csi-translation-lib);
//! * [`capability`] — the volume capability and `readonly` of ControllerPublish;
//! * [`patches`] — every PATCH body, and which PV events matter;
//! * [`error`] — why a volume could not be resolved (the `attachError` texts);
//! * [`predicate`] — `should_enqueue_va_change`, the VA update filter of `controller.go` that
//!   keeps the attacher's own error writes from defeating backoff.
//!
//! The async shell: [`csi_handler`] (attach, detach, PV finalizers, the ListVolumes reconciler)
//! and [`trivial_handler`], chosen by [`handler`] from the driver's capabilities; both return a
//! [`sync`] outcome. They fetch from the caches, call the driver and write to the API server.

pub mod capability;
pub mod csi_handler;
pub mod error;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod handler;
pub mod node_id;
pub mod patches;
pub mod predicate;
pub mod source;
pub mod sync;
pub mod translation;
pub mod trivial_handler;

pub use handler::Handler;
pub use sync::Synced;
