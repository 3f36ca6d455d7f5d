//! The trivial handler, for drivers without CONTROLLER_SERVICE or
//! PUBLISH_UNPUBLISH_VOLUME: marks every VA attached, nothing else (spec 4).

use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::sync::{Error, Synced};
use crate::k8s::{self, Writer};

/// Marks VAs attached without calling the driver.
#[derive(Debug)]
pub struct TrivialHandler {
    writer: Writer,
}

impl TrivialHandler {
    /// A handler writing through `writer`.
    pub fn new(writer: Writer) -> Self {
        Self { writer }
    }

    /// Every VA of the driver, deleting or not: `attached: true` if not yet.
    pub async fn sync_va(&self, va: &VolumeAttachment) -> Result<Synced, Error> {
        if va.status.as_ref().is_some_and(|s| s.attached) {
            return Ok(Synced::Unchanged);
        }
        let name = va.metadata.name.as_deref().unwrap_or_default();
        let patch = serde_json::json!({ "status": { "attached": true } });
        match self.writer.merge_va_status(name, &patch).await {
            Ok(_) => Ok(Synced::Attached),
            // The VA is already gone: nothing to attach.
            Err(e) if k8s::is_not_found(&e) => Ok(Synced::Unchanged),
            Err(e) => Err(Error::Trivial(k8s::error_text(&e))),
        }
    }
}
