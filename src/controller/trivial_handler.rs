//! The trivial handler, for drivers without CONTROLLER_SERVICE or
//! PUBLISH_UNPUBLISH_VOLUME: marks every VA attached, nothing else
//! (`docs/design.md#trivial-handler`).

use super::sync::{Error, Synced};
use crate::k8s::{self, Writer, lean::Va};

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
    pub async fn sync_va(&self, va: &Va) -> Result<Synced, Error> {
        if va.status.attached {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{DRIVER, lean_va, now, va};
    use crate::fake_api::FakeApi;
    use k8s_openapi::api::storage::v1::VolumeAttachment;

    #[tokio::test]
    async fn every_va_is_marked_attached_once_and_nothing_else_is_written() {
        let api = FakeApi::default();
        let handler = TrivialHandler::new(api.writer(DRIVER));
        let created = api.put(&va(Some("pv1")));
        assert_eq!(
            handler.sync_va(&lean_va(&created)).await.expect("ok"),
            Synced::Attached
        );
        let stored: VolumeAttachment = api.get(None, "va").expect("the VA");
        assert!(stored.status.as_ref().is_some_and(|s| s.attached));
        assert_eq!(stored.metadata.finalizers, created.metadata.finalizers);
        assert_eq!(api.writes().len(), 1);
        // Attached already: no request at all; a deleting VA is treated alike.
        api.clear_log();
        assert_eq!(
            handler.sync_va(&lean_va(&stored)).await.expect("ok"),
            Synced::Unchanged
        );
        let mut deleting = stored.clone();
        deleting.metadata.deletion_timestamp = Some(now());
        assert_eq!(
            handler.sync_va(&lean_va(&deleting)).await.expect("ok"),
            Synced::Unchanged
        );
        assert!(api.log().is_empty());
    }

    #[tokio::test]
    async fn a_vanished_va_is_nothing_to_do_and_an_api_failure_is_an_error() {
        let api = FakeApi::default();
        let handler = TrivialHandler::new(api.writer(DRIVER));
        let never_stored = va(None);
        assert_eq!(
            handler.sync_va(&lean_va(&never_stored)).await.expect("ok"),
            Synced::Unchanged
        );
        api.put(&never_stored);
        api.set_failing(true);
        let err = handler
            .sync_va(&lean_va(&never_stored))
            .await
            .expect_err("fails");
        assert!(
            err.to_string().starts_with("failed to mark as attached: "),
            "{err}"
        );
    }
}
