//! The few Kubernetes API calls the controllers make, each behind the
//! driver's API budget, and error texts shaped like client-go's.

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

use crate::budget::ApiBudget;

/// Field manager recorded in `managedFields` for our patches (the Go
/// attacher's client-go default is the binary name).
pub const FIELD_MANAGER: &str = "csi-attacher";

/// API access of one driver's controller: the shared client, spent from the
/// driver's own [`ApiBudget`] (which includes the hub's optional cap), with
/// every request counted by outcome.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    budget: Arc<ApiBudget>,
    /// `attacher_hub_api_requests_total`, and the driver's label value.
    requests: Option<(prometheus::IntCounterVec, String)>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// API access spending `budget` before each request.
    pub fn new(client: Client, budget: Arc<ApiBudget>) -> Self {
        Self {
            client,
            budget,
            requests: None,
        }
    }

    /// Counts every request in `counter` (`attacher_hub_api_requests_total`) under `driver`.
    pub fn with_request_counter(
        mut self,
        counter: prometheus::IntCounterVec,
        driver: &str,
    ) -> Self {
        self.requests = Some((counter, driver.to_owned()));
        self
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The driver's API budget.
    pub fn budget(&self) -> &Arc<ApiBudget> {
        &self.budget
    }

    /// Spends budget for one request, sends it, and counts its outcome.
    async fn send<T>(
        &self,
        verb: &str,
        resource: &str,
        name: &str,
        request: impl std::future::Future<Output = kube::Result<T>>,
    ) -> kube::Result<T> {
        self.budget
            .acquire(verb, &format!("{resource}/{name}"))
            .await;
        let result = request.await;
        if let Some((counter, driver)) = &self.requests {
            let code = match &result {
                Ok(_) => "200".to_owned(),
                Err(kube::Error::Api(status)) => status.code.to_string(),
                Err(_) => "error".to_owned(),
            };
            counter
                .with_label_values(&[driver.as_str(), verb, resource, code.as_str()])
                .inc();
        }
        result
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        }
    }

    /// JSON merge patch on a VolumeAttachment's main resource.
    pub async fn merge_va(&self, name: &str, patch: &Value) -> kube::Result<VolumeAttachment> {
        let api = Api::<VolumeAttachment>::all(self.client.clone());
        let params = Self::params();
        let patch = Patch::Merge(patch);
        self.send(
            "PATCH",
            "volumeattachments",
            name,
            api.patch(name, &params, &patch),
        )
        .await
    }

    /// JSON merge patch on a VolumeAttachment's `status` subresource.
    pub async fn merge_va_status(
        &self,
        name: &str,
        patch: &Value,
    ) -> kube::Result<VolumeAttachment> {
        let api = Api::<VolumeAttachment>::all(self.client.clone());
        let params = Self::params();
        let patch = Patch::Merge(patch);
        self.send(
            "PATCH",
            "volumeattachments/status",
            name,
            api.patch_status(name, &params, &patch),
        )
        .await
    }

    /// JSON Patch (RFC 6902) on a PersistentVolume.
    pub async fn json_patch_pv(&self, name: &str, patch: Value) -> kube::Result<PersistentVolume> {
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let params = Self::params();
        let patch = Patch::<()>::Json(patch);
        self.send(
            "PATCH",
            "persistentvolumes",
            name,
            api.patch(name, &params, &patch),
        )
        .await
    }

    /// A Secret's data as strings, read live (never cached).
    pub async fn secret_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> kube::Result<HashMap<String, String>> {
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let secret = self.send("GET", "secrets", name, api.get(name)).await?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
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
