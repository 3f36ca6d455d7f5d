//! What one sync of a VolumeAttachment or PersistentVolume gives: what it did ([`Synced`]), or
//! why it failed ([`Error`], whose text is what external-attacher saves in `attachError` and
//! `detachError`). Shared by the CSI and the trivial handler.

use crate::csi;

/// What a successful sync did, so that end-to-end latency is observed once per attach or
/// detach, never for a sync that found nothing to do (a resync, the echo of our own write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synced {
    /// This sync marked the VA attached.
    Attached,
    /// This sync detached the volume (ControllerUnpublish succeeded, finalizer removed).
    Detached,
    /// Nothing needed doing.
    Unchanged,
}

/// Why a sync failed. The `Display` text is exactly what external-attacher
/// saves in `attachError.message` / `detachError.message`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The volume could not be resolved (source, PV, translation, capability).
    #[error(transparent)]
    Volume(#[from] super::error::Error),
    /// No CSI node ID for the node.
    #[error(transparent)]
    NodeId(#[from] super::node_id::NodeIdError),
    /// Adding the PV finalizer failed.
    #[error("could not add PersistentVolume finalizer: {0}")]
    PvFinalizer(String),
    /// Reading the publish secret failed.
    #[error("failed to load secret \"{namespace}/{name}\": {message}")]
    Secret {
        /// Secret namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// The API error text.
        message: String,
    },
    /// Saving the finalizer and node-ID annotation on the VA failed.
    #[error("could not save VolumeAttachment: {0}")]
    SaveVa(String),
    /// The CSI call failed.
    #[error(transparent)]
    Csi(#[from] csi::CallError),
    /// Writing `attached: true` failed.
    #[error("failed to mark as attached: {0}")]
    MarkAttached(String),
    /// Removing the finalizer or writing `attached: false` failed.
    #[error("could not mark as detached: {0}")]
    MarkDetached(String),
    /// Removing the PV finalizer failed.
    #[error("failed to remove finalizer from PersistentVolume: {0}")]
    RemovePvFinalizer(String),
    /// Writing the status of the trivial handler failed.
    #[error("failed to mark as attached: {0}")]
    Trivial(String),
}

impl Error {
    /// The PV the sync found missing from the cache, if that is why it failed.
    pub fn missing_pv(&self) -> Option<&str> {
        match self {
            Self::Volume(super::error::Error::PvNotFound { name }) => Some(name),
            _ => None,
        }
    }

    /// The gRPC code to save as `attachError.errorCode` (CSI errors only).
    pub fn grpc_code(&self) -> Option<i32> {
        match self {
            Self::Csi(e) => Some(e.code() as i32),
            _ => None,
        }
    }
}
