//! The handler a driver gets from its capabilities: the CSI handler with CONTROLLER_SERVICE
//! and PUBLISH_UNPUBLISH_VOLUME, the trivial handler otherwise (`docs/design.md#startup`).

use super::{
    csi_handler::CsiHandler,
    sync::{Error, Synced},
    trivial_handler::TrivialHandler,
};
use crate::{
    csi,
    k8s::lean::{Pv, Va},
};

/// CSI handler for drivers that attach, trivial handler for the others.
#[derive(Debug)]
pub enum Handler {
    /// ControllerPublish/Unpublish, finalizers, reconciler.
    Csi(Box<CsiHandler>),
    /// Marks VAs attached; nothing else.
    Trivial(TrivialHandler),
}

impl Handler {
    /// Whether detaches go through ControllerUnpublish (only the CSI handler
    /// has a detach path; the trivial handler treats every VA alike).
    pub fn detaches(&self) -> bool {
        matches!(self, Self::Csi(_))
    }

    /// `syncVA`: attach or detach depending on the deletion timestamp.
    pub async fn sync_va(&self, va: &Va) -> Result<Synced, Error> {
        match self {
            Self::Csi(h) if va.metadata.deletion_timestamp.is_some() => h.sync_detach(va).await,
            Self::Csi(h) => h.sync_attach(va).await,
            Self::Trivial(h) => h.sync_va(va).await,
        }
    }

    /// `syncPV`: PV finalizer removal (nothing for the trivial handler).
    pub async fn sync_pv(&self, pv: &Pv) -> Result<(), Error> {
        match self {
            Self::Csi(h) => h.sync_pv(pv).await,
            Self::Trivial(_) => Ok(()),
        }
    }

    /// Lets the handler drop memory about a deleted VA.
    pub fn va_deleted(&self, name: &str) {
        if let Self::Csi(h) = self {
            h.va_deleted(name);
        }
    }

    /// One reconciler pass: names of VAs to force-sync.
    pub async fn reconcile(&self) -> Result<Vec<String>, csi::CallError> {
        match self {
            Self::Csi(h) => h.reconcile().await,
            Self::Trivial(_) => Ok(Vec::new()),
        }
    }
}
