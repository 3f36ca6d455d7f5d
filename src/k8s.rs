//! The few Kubernetes API calls the controllers make, each behind the API
//! budgets, and error texts shaped like client-go's.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::{
    core::v1::{PersistentVolume, Secret},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::Value;

use crate::budget::Budget;

/// Field manager recorded in `managedFields` for our patches (the Go
/// attacher's client-go default is the binary name).
pub const FIELD_MANAGER: &str = "csi-attacher";

/// API access of one driver's controller: the shared client, the process-wide
/// budget and the driver's own budget.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    budgets: Vec<Arc<Budget>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("budgets", &self.budgets)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// API access with the given budgets, taken in order before each request.
    pub fn new(client: Client, budgets: Vec<Arc<Budget>>) -> Self {
        Self { client, budgets }
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn spend(&self) {
        for b in &self.budgets {
            b.acquire().await;
        }
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        }
    }

    /// JSON merge patch on a VolumeAttachment's main resource.
    pub async fn merge_va(&self, name: &str, patch: &Value) -> kube::Result<VolumeAttachment> {
        self.spend().await;
        Api::<VolumeAttachment>::all(self.client.clone())
            .patch(name, &Self::params(), &Patch::Merge(patch))
            .await
    }

    /// JSON merge patch on a VolumeAttachment's `status` subresource.
    pub async fn merge_va_status(
        &self,
        name: &str,
        patch: &Value,
    ) -> kube::Result<VolumeAttachment> {
        self.spend().await;
        Api::<VolumeAttachment>::all(self.client.clone())
            .patch_status(name, &Self::params(), &Patch::Merge(patch))
            .await
    }

    /// JSON Patch (RFC 6902) on a PersistentVolume.
    pub async fn json_patch_pv(&self, name: &str, patch: Value) -> kube::Result<PersistentVolume> {
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
        self.spend().await;
        Api::<PersistentVolume>::all(self.client.clone())
            .patch(name, &Self::params(), &Patch::<()>::Json(patch))
            .await
    }

    /// A Secret's data, byte for byte, read live (never cached). Whether the
    /// values can be sent is for the CSI client to say (see
    /// [`crate::csi::redact::NotUtf8`]); nothing is altered here.
    pub async fn secret_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> kube::Result<HashMap<String, Vec<u8>>> {
        self.spend().await;
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect())
    }
}

/// The text of an API error as client-go prints it: the server's message for
/// API errors (for example `volumeattachments.storage.k8s.io "x" not found`),
/// else the error itself.
pub fn error_text(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// Whether the error is a 404 from the API server.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}
