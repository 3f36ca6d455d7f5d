//! [`Writer`]: the few API calls a driver's controller makes (VA and PV patches, Secret reads),
//! each spent from the driver's API budget, bounded in time and counted by outcome.

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

use super::budget::ApiBudget;
use super::pushback::{Kind, Scope, scoped};

/// Deadline of every API request a driver makes (PATCH, Secret GET), on top of the API server's
/// own 60 s request timeout: a request on a connection that went silent fails and is retried
/// with the key's backoff. Waits for the API server's `Retry-After` happen within it.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

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
        // The request's deadline, which a wait for the API server's `Retry-After` must not pass.
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let scope = Scope::new(self.budget.clone(), Kind::Work, deadline);
        let result = match tokio::time::timeout_at(deadline, scoped(scope, request)).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(
                format!("{verb} {resource}/{name}: no answer within {REQUEST_TIMEOUT:?}").into(),
            )),
        };
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
        self.merge_va_part(name, patch, false).await
    }

    /// JSON merge patch on a VolumeAttachment's `status` subresource.
    pub async fn merge_va_status(
        &self,
        name: &str,
        patch: &Value,
    ) -> kube::Result<VolumeAttachment> {
        self.merge_va_part(name, patch, true).await
    }

    /// JSON merge patch on a VolumeAttachment, its `status` subresource or its main resource.
    async fn merge_va_part(
        &self,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> kube::Result<VolumeAttachment> {
        let api = Api::<VolumeAttachment>::all(self.client.clone());
        let params = Self::params();
        let patch = Patch::Merge(patch);
        if status {
            let request = api.patch_status(name, &params, &patch);
            self.send("PATCH", "volumeattachments/status", name, request)
                .await
        } else {
            let request = api.patch(name, &params, &patch);
            self.send("PATCH", "volumeattachments", name, request).await
        }
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

    /// A PersistentVolume read live from the API server (not from the shared cache), for a
    /// JSON Patch whose `test` failed on a stale cached copy.
    pub async fn get_pv(&self, name: &str) -> kube::Result<PersistentVolume> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        self.send("GET", "persistentvolumes", name, api.get(name))
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
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let secret = self.send("GET", "secrets", name, api.get(name)).await?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use serde_json::json;

    use super::*;
    use crate::fake_api::FakeApi;

    #[tokio::test]
    async fn every_request_is_counted_by_verb_resource_and_outcome() {
        let api = FakeApi::default();
        let counter = prometheus::IntCounterVec::new(
            prometheus::Opts::new("requests", "test"),
            &["driver_name", "verb", "resource", "code"],
        )
        .expect("valid");
        let writer = api.writer("d").with_request_counter(counter.clone(), "d");
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some("va".into());
        api.put(&va);
        let patch = json!({ "status": { "attached": true } });
        writer.merge_va_status("va", &patch).await.expect("patched");
        let missing = writer.merge_va("gone", &patch).await.expect_err("404");
        assert!(super::super::is_not_found(&missing));
        api.set_failing(true);
        writer.merge_va("va", &patch).await.expect_err("500");
        let count = |verb: &str, resource: &str, code: &str| {
            counter
                .with_label_values(&["d", verb, resource, code])
                .get()
        };
        assert_eq!(count("PATCH", "volumeattachments/status", "200"), 1);
        assert_eq!(count("PATCH", "volumeattachments", "404"), 1);
        assert_eq!(count("PATCH", "volumeattachments", "500"), 1);
    }

    #[tokio::test]
    async fn secret_data_is_read_live_byte_for_byte() {
        let api = FakeApi::default();
        let mut secret = Secret::default();
        secret.metadata.name = Some("s".into());
        secret.metadata.namespace = Some("ns".into());
        secret.data = Some(
            [("key".to_owned(), ByteString(vec![0xff, 0x00, b'a']))]
                .into_iter()
                .collect(),
        );
        api.put(&secret);
        let data = api.writer("d").secret_data("ns", "s").await.expect("read");
        assert_eq!(data["key"], vec![0xff, 0x00, b'a']);
        assert!(api.writer("d").secret_data("ns", "other").await.is_err());
    }
}
