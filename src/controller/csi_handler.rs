//! The CSI handler: attach, detach, PV finalizers and the ListVolumes
//! reconciler, as external-attacher's `csi_handler.go` does them
//! (`docs/design.md#attach`, `docs/design.md#detach`, `docs/design.md#pv-finalizer`,
//! `docs/design.md#reconciler`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use parking_lot::Mutex;

use super::{
    capability, error, node_id, patches,
    source::{self, Source},
    sync::{Error, Synced},
    translation::repair_volume_handle,
};
use crate::{
    csi::{self, Capabilities, DriverClient, PublishRequest, Secrets, UnpublishRequest},
    k8s::{
        self,
        lean::{Pv, Va},
        stores::Stores,
        writer::Writer,
    },
};

/// Settings of the CSI handler.
#[derive(Clone, Debug)]
pub struct Config {
    /// Deadline of ControllerPublish/Unpublish and of one reconcile pass.
    pub timeout: Duration,
    /// fsType when the PV has none (`--default-fstype`).
    pub default_fstype: String,
    /// `max_entries` of ListVolumes (`--max-entries`).
    pub max_entries: i32,
    /// Whether `errorCode` is written (feature gate MutableCSINodeAllocatableCount).
    pub save_error_code: bool,
}

/// Attach and detach for a driver with PUBLISH_UNPUBLISH_VOLUME.
#[derive(Debug)]
pub struct CsiHandler {
    /// The driver name (`spec.attacher`).
    driver: String,
    /// Calls to the driver.
    client: DriverClient,
    /// What the driver can do.
    caps: Capabilities,
    /// API writes.
    writer: Writer,
    /// The shared caches.
    stores: Stores,
    /// Timeouts and defaults.
    config: Config,
    /// VAs the reconciler found out of sync; consumed by the next sync.
    force_sync: Mutex<HashSet<String>>,
    /// Our `attached: true` status patches. While the cache holds an older copy of such a VA,
    /// its sync waits for the echo instead of publishing again (`docs/design.md#own-writes`).
    attached: OwnWrites,
    /// Our finished detaches (the last write of each: the finalizer's removal, or the status
    /// after it). While the cache holds an older copy of such a VA, which still shows our
    /// finalizer, its sync waits for the echo instead of unpublishing again.
    detached: OwnWrites,
}

/// The handler's own writes to VAs that a cached copy may not show yet: VA name → (UID, the
/// resourceVersion our write made, or `None` when our write removed the object).
#[derive(Debug, Default)]
struct OwnWrites(Mutex<HashMap<String, (String, Option<String>)>>);

impl OwnWrites {
    fn remember(&self, name: &str, uid: &str, written: Option<String>) {
        self.0
            .lock()
            .insert(name.to_owned(), (uid.to_owned(), written));
    }

    fn forget(&self, name: &str) {
        self.0.lock().remove(name);
    }

    #[cfg(test)]
    fn contains(&self, name: &str) -> bool {
        self.0.lock().contains_key(name)
    }

    /// Whether `va` is a cached copy older than our write to it. Once the cache has caught up
    /// (or the name belongs to another VA now) the memory is dropped.
    fn is_behind(&self, va: &Va) -> bool {
        let name = va.metadata.name.as_deref().unwrap_or_default();
        let mut writes = self.0.lock();
        let Some((uid, written)) = writes.get(name) else {
            return false;
        };
        if va.metadata.uid.as_deref() != Some(uid.as_str()) {
            // A new VA with the same name.
            writes.remove(name);
            return false;
        }
        let cached = va.metadata.resource_version.as_deref().unwrap_or_default();
        let behind = match written {
            // Our write deleted the object: every copy of it is older.
            None => return true,
            Some(written) => match compare_resource_versions(cached, written) {
                Some(order) => order.is_lt(),
                // Not comparable (not an etcd-backed server): the copy is stale unless it is
                // the one we wrote.
                None => return cached != written.as_str(),
            },
        };
        if !behind {
            writes.remove(name);
        }
        behind
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl CsiHandler {
    /// A handler for `driver`.
    pub fn new(
        driver: String,
        client: DriverClient,
        caps: Capabilities,
        writer: Writer,
        stores: Stores,
        config: Config,
    ) -> Self {
        Self {
            driver,
            client,
            caps,
            writer,
            stores,
            config,
            force_sync: Mutex::new(HashSet::new()),
            attached: OwnWrites::default(),
            detached: OwnWrites::default(),
        }
    }

    /// Drops per-VA memory of a deleted VA.
    pub fn va_deleted(&self, name: &str) {
        self.attached.forget(name);
        self.detached.forget(name);
        self.force_sync.lock().remove(name);
    }

    /// Whether the handler remembers its own `attached: true` write to the VA `name`.
    #[cfg(test)]
    pub(crate) fn remembers(&self, name: &str) -> bool {
        self.attached.contains(name)
    }

    /// Whether the handler remembers its own finished detach of the VA `name`.
    #[cfg(test)]
    pub(crate) fn remembers_detach(&self, name: &str) -> bool {
        self.detached.contains(name)
    }

    fn take_force_sync(&self, name: &str) -> bool {
        self.force_sync.lock().remove(name)
    }

    /// `syncAttach` (`docs/design.md#attach`).
    pub async fn sync_attach(&self, va: &Va) -> Result<Synced, Error> {
        let name = va.metadata.name.clone().unwrap_or_default();
        let forced = self.take_force_sync(&name);
        if !forced {
            if va.status.attached {
                return Ok(Synced::Unchanged);
            }
            if self.attached.is_behind(va) {
                tracing::debug!("already marked attached; waiting for the watch to catch up");
                return Ok(Synced::Unchanged);
            }
        }
        match self.csi_attach(va).await {
            Ok(context) => {
                let context: BTreeMap<String, String> = context.into_iter().collect();
                let mut patch = patches::attached_status_patch(va, &context);
                // The cached copy may not show an attach error we saved on an
                // earlier try yet; clear it in any case (external-attacher's
                // result: no attachError on an attached VA).
                if let Some(status) = patch.get_mut("status").and_then(|s| s.as_object_mut()) {
                    status.insert("attachError".to_string(), serde_json::Value::Null);
                }
                let written = self
                    .writer
                    .merge_va_status(&name, &patch)
                    .await
                    .map_err(|e| Error::MarkAttached(k8s::error_text(&e)))?;
                let uid = va.metadata.uid.as_deref().unwrap_or_default();
                let rv = written.metadata.resource_version.unwrap_or_default();
                self.attached.remember(&name, uid, Some(rv));
                tracing::info!("attached");
                // A forced sync of a VA that was attached already re-publishes; it is not a
                // new attach.
                let was_attached = va.status.attached;
                Ok(if was_attached {
                    Synced::Unchanged
                } else {
                    Synced::Attached
                })
            }
            Err(error) => {
                let code = if self.config.save_error_code {
                    error.grpc_code()
                } else {
                    None
                };
                let patch = patches::attach_error_patch(&error.to_string(), &now(), code);
                if let Err(e) = self.writer.merge_va_status(&name, &patch).await {
                    tracing::warn!(error = %k8s::error_text(&e), "could not save attach error");
                }
                Err(error)
            }
        }
    }

    async fn csi_attach(&self, va: &Va) -> Result<HashMap<String, String>, Error> {
        let volume = match source::va_source(va)? {
            Source::PersistentVolume(pv_name) => {
                let pv = self
                    .stores
                    .pv(pv_name)
                    .ok_or_else(|| error::Error::PvNotFound {
                        name: pv_name.to_string(),
                    })?;
                source::check_pv_attachable(&pv)?;
                self.ensure_pv_finalizer(&pv).await?;
                source::pv_volume(&pv)?
            }
            Source::Inline(spec) => source::Volume::inline(spec.clone()),
        };
        let csi_source = volume.csi()?;
        let capability = capability::volume_capability(
            &volume.spec,
            &self.config.default_fstype,
            self.caps.single_node_multi_writer,
        )?;
        let readonly = capability::readonly(csi_source, self.caps.publish_readonly);
        let secrets = self
            .secrets(csi_source.controller_publish_secret_ref.as_ref())
            .await?;
        let node_name = &va.spec.node_name;
        let csinode = self.stores.csinode(node_name);
        let node_id = node_id::node_id(&self.driver, node_name, csinode.as_deref(), None)?;

        if let Some(patch) = patches::va_metadata_patch(va, &self.driver, &node_id) {
            let name = va.metadata.name.as_deref().unwrap_or_default();
            self.writer
                .merge_va(name, &patch)
                .await
                .map_err(|e| Error::SaveVa(k8s::error_text(&e)))?;
        }

        let request = PublishRequest {
            volume_id: csi_source.volume_handle.clone(),
            node_id,
            capability,
            readonly,
            volume_context: csi_source
                .volume_attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            secrets,
            migrated: volume.migrated,
        };
        tracing::debug!(volume = %request.volume_id, node = %request.node_id, "ControllerPublishVolume");
        Ok(self.client.publish(request, self.config.timeout).await?)
    }

    /// Adds our finalizer to the PV (`docs/design.md#attach`, step 2). The JSON Patch is built
    /// from the cached copy, with a `test` of the list it replaces; when the cache is behind
    /// (our own earlier add has not come back through the watch yet, or another controller
    /// changed the list), the API server refuses it with 422, and the patch is built once more
    /// from a live read, instead of failing the attach until the watch catches up.
    async fn ensure_pv_finalizer(&self, pv: &Pv) -> Result<(), Error> {
        let Some(patch) = patches::pv_finalizer_add_patch(pv, &self.driver) else {
            return Ok(());
        };
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let fail = |e: kube::Error| Error::PvFinalizer(k8s::error_text(&e));
        match self.writer.json_patch_pv(name, patch).await {
            Ok(_) => Ok(()),
            Err(e) if k8s::is_unprocessable(&e) => {
                tracing::debug!(
                    pv = name,
                    "cached PersistentVolume is stale; adding the finalizer to a live copy"
                );
                let live = Pv::from(self.writer.get_pv(name).await.map_err(fail)?);
                match patches::pv_finalizer_add_patch(&live, &self.driver) {
                    None => Ok(()),
                    Some(patch) => self
                        .writer
                        .json_patch_pv(name, patch)
                        .await
                        .map(drop)
                        .map_err(fail),
                }
            }
            Err(e) => Err(fail(e)),
        }
    }

    async fn secrets(
        &self,
        secret_ref: Option<&k8s_openapi::api::core::v1::SecretReference>,
    ) -> Result<Option<Secrets>, Error> {
        let Some(r) = secret_ref else { return Ok(None) };
        let namespace = r.namespace.clone().unwrap_or_default();
        let name = r.name.clone().unwrap_or_default();
        match self.writer.secret_data(&namespace, &name).await {
            Ok(data) => Ok(Some(Secrets::new(data))),
            Err(e) => Err(Error::Secret {
                namespace,
                name,
                message: k8s::error_text(&e),
            }),
        }
    }

    /// `syncDetach` (`docs/design.md#detach`).
    pub async fn sync_detach(&self, va: &Va) -> Result<Synced, Error> {
        let name = va.metadata.name.clone().unwrap_or_default();
        let forced = self.take_force_sync(&name);
        let finalizer = crate::names::finalizer_name(&self.driver);
        let has_finalizer = va
            .metadata
            .finalizers
            .as_deref()
            .unwrap_or_default()
            .contains(&finalizer);
        // A copy older than our own finished detach still shows our finalizer: unpublishing
        // again would call the driver twice for one detach (forced or not: the reconciler may
        // judge the same stale copy).
        if self.detached.is_behind(va) {
            tracing::debug!("already detached; waiting for the watch to catch up");
            return Ok(Synced::Unchanged);
        }
        // A copy read before the VA's deletion arrived (a worker may hold it while it waits
        // for a CSI call slot): the deletion has dropped the memory above, and the VA is gone,
        // its finalizer removed. Checked after the memory, which the deletion's event drops
        // only once the cache no longer holds the VA.
        if !self.still_cached(va) {
            tracing::debug!("the VolumeAttachment is gone; nothing to detach");
            return Ok(Synced::Unchanged);
        }
        if !forced && !has_finalizer {
            return Ok(Synced::Unchanged);
        }
        let result = match self.csi_detach(va).await {
            Ok(()) => self.mark_as_detached(va).await,
            Err(e) => Err(e),
        };
        if let Err(error) = &result {
            let patch = patches::detach_error_patch(&error.to_string(), &now());
            if let Err(e) = self.writer.merge_va_status(&name, &patch).await
                && !k8s::is_not_found(&e)
            {
                tracing::warn!(error = %k8s::error_text(&e), "could not save detach error");
            }
        } else {
            tracing::info!("detached");
        }
        result.map(|()| Synced::Detached)
    }

    async fn csi_detach(&self, va: &Va) -> Result<(), Error> {
        let volume = source::volume_source(va, |n| self.stores.pv(n))?;
        let csi_source = volume.csi()?;
        let secrets = self
            .secrets(csi_source.controller_publish_secret_ref.as_ref())
            .await?;
        let node_name = &va.spec.node_name;
        let csinode = self.stores.csinode(node_name);
        let node_id = node_id::node_id(&self.driver, node_name, csinode.as_deref(), Some(va))?;
        let request = UnpublishRequest {
            volume_id: csi_source.volume_handle.clone(),
            node_id,
            secrets,
            migrated: volume.migrated,
        };
        tracing::debug!(volume = %request.volume_id, node = %request.node_id, "ControllerUnpublishVolume");
        Ok(self.client.unpublish(request, self.config.timeout).await?)
    }

    /// `markAsDetached`: our finalizer first, then the status, so a VA being deleted never
    /// shows our finalizer with `attached: false` (`docs/design.md#detach`, step 5).
    async fn mark_as_detached(&self, va: &Va) -> Result<(), Error> {
        let name = va.metadata.name.as_deref().unwrap_or_default();
        // The resourceVersion of our last write (`None`: the object is gone).
        let mut last = None;
        if let Some(patch) = patches::va_finalizer_removal_patch(va, &self.driver) {
            let written = self
                .writer
                .merge_va(name, &patch)
                .await
                .map_err(|e| Error::MarkDetached(k8s::error_text(&e)))?;
            if patches::deleted_by_finalizer_removal(&written) {
                // The API server removed the object with its last finalizer: a status
                // patch now could only answer 404 (Go sends it anyway; the objects and CSI
                // calls are the same without it, and the detach costs one write, not two).
                self.detach_done(va, None);
                return Ok(());
            }
            last = Some(written.metadata.resource_version);
        }
        if let Some(patch) = patches::detached_status_patch(va) {
            match self.writer.merge_va_status(name, &patch).await {
                Ok(written) => last = Some(written.metadata.resource_version),
                Err(e) if k8s::is_not_found(&e) => last = Some(None),
                Err(e) => return Err(Error::MarkDetached(k8s::error_text(&e))),
            }
        }
        match last {
            Some(written) => self.detach_done(va, written),
            None => self.attached.forget(name),
        }
        Ok(())
    }

    /// Whether the cache still holds `va` (by name and UID).
    fn still_cached(&self, va: &Va) -> bool {
        let name = va.metadata.name.as_deref().unwrap_or_default();
        self.stores
            .va(name)
            .is_some_and(|cached| cached.metadata.uid == va.metadata.uid)
    }

    /// Remembers our finished detach of `va` (our last write made `written`; `None`: the object
    /// is gone), until the cache shows it.
    fn detach_done(&self, va: &Va, written: Option<String>) {
        let name = va.metadata.name.as_deref().unwrap_or_default();
        let uid = va.metadata.uid.as_deref().unwrap_or_default();
        self.attached.forget(name);
        self.detached.remember(name, uid, written);
        // The watch may have told of the deletion already (`va_deleted` came before this
        // memory): then nothing would ever drop it.
        if self
            .stores
            .va(name)
            .is_none_or(|cached| cached.metadata.uid.as_deref() != Some(uid))
        {
            self.detached.forget(name);
        }
    }

    /// `SyncNewOrUpdatedPersistentVolume` (`docs/design.md#pv-finalizer`): removes our PV
    /// finalizer once the PV is being deleted and no VA names it.
    pub async fn sync_pv(&self, pv: &Pv) -> Result<(), Error> {
        let in_use = |name: &str| self.stores.vas.any(|va| patches::va_uses_pv(va, name));
        let Some(index) = patches::pv_needs_finalizer_removal(pv, &self.driver, in_use) else {
            return Ok(());
        };
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let fail = |e: kube::Error| Error::RemovePvFinalizer(k8s::error_text(&e));
        let patch = patches::pv_finalizer_removal_patch(index, &self.driver);
        match self.writer.json_patch_pv(name, patch).await {
            Ok(_) => {}
            // The cached list is stale (the `test` of our finalizer at `index` failed): decide
            // again on a live copy, as for the add.
            Err(e) if k8s::is_unprocessable(&e) => {
                tracing::debug!(
                    pv = name,
                    "cached PersistentVolume is stale; removing the finalizer from a live copy"
                );
                let live = Pv::from(self.writer.get_pv(name).await.map_err(fail)?);
                let Some(index) = patches::pv_needs_finalizer_removal(&live, &self.driver, in_use)
                else {
                    return Ok(());
                };
                let patch = patches::pv_finalizer_removal_patch(index, &self.driver);
                self.writer.json_patch_pv(name, patch).await.map_err(fail)?;
            }
            Err(e) => return Err(fail(e)),
        }
        tracing::info!(pv = name, "removed PersistentVolume finalizer");
        Ok(())
    }

    /// One pass of the ListVolumes reconciler (`docs/design.md#reconciler`): the names of
    /// VAs whose `attached` disagrees with what the driver reports. They are
    /// marked for a forced sync; the caller enqueues them. Writes nothing.
    pub async fn reconcile(&self) -> Result<Vec<String>, csi::CallError> {
        if !self.caps.can_reconcile() {
            return Ok(Vec::new());
        }
        let vas = self.stores.vas.state();
        let published = self
            .client
            .list_published(self.config.max_entries, self.config.timeout)
            .await?;
        let mut out_of_sync = Vec::new();
        for va in vas.iter().filter(|va| va.spec.attacher == self.driver) {
            let Some(name) = va.metadata.name.clone() else {
                continue;
            };
            let node_name = &va.spec.node_name;
            let csinode = self.stores.csinode(node_name);
            let Ok(node_id) =
                node_id::node_id(&self.driver, node_name, csinode.as_deref(), Some(va))
            else {
                continue;
            };
            let Ok(volume) = source::volume_source(va, |n| self.stores.pv(n)) else {
                continue;
            };
            let Ok(csi_source) = volume.csi() else {
                continue;
            };
            // external-attacher repairs with the driver named in the (translated) CSI source,
            // not with its own name.
            let handle = if volume.repairs_handle() {
                match repair_volume_handle(&csi_source.driver, &csi_source.volume_handle, &node_id)
                {
                    Some(h) => h,
                    None => continue,
                }
            } else {
                csi_source.volume_handle.clone()
            };
            let found = published
                .get(&handle)
                .is_some_and(|nodes| nodes.contains(&node_id));
            let attached = va.status.attached;
            if found != attached {
                tracing::info!(va = %name, published = found, attached, "VolumeAttachment attached status and actual state do not match");
                // A sync is forced only where a normal one would do nothing:
                // an attached VA whose volume is not published (publish it
                // again), or a deleting VA that is still published (detach
                // it even if our finalizer is gone). A VA that is published
                // but not yet marked attached gets a normal sync, which
                // attaches it; forcing that one could publish twice when the
                // worker attaches it meanwhile.
                let deleting = va.metadata.deletion_timestamp.is_some();
                if !found || deleting {
                    self.force_sync.lock().insert(name.clone());
                }
                out_of_sync.push(name);
            }
        }
        Ok(out_of_sync)
    }
}

/// Orders two resourceVersions of one object from one API server, as
/// apimachinery's `CompareResourceVersion` (Kubernetes 1.33+) does: they are
/// decimal integers, compared by length, then digit by digit. `None` when
/// either is not such a number.
fn compare_resource_versions(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let valid =
        |v: &str| !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) && !v.starts_with('0');
    if !valid(a) || !valid(b) {
        return None;
    }
    Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::*;
    use crate::csi::fake::FakeCsi;
    use crate::fake_api::FakeApi;
    use crate::k8s::stores::TestStores;
    use crate::names::NODE_ID_ANNOTATION;
    use k8s_openapi::api::{
        core::v1::PersistentVolume,
        storage::v1::{VolumeAttachment, VolumeAttachmentStatus},
    };

    /// A CSI handler between a fake API server, a fake driver and caches filled by hand.
    struct World {
        api: FakeApi,
        csi: FakeCsi,
        caches: TestStores,
        handler: CsiHandler,
    }

    async fn world(caps: Capabilities, save_error_code: bool) -> World {
        let api = FakeApi::default();
        let csi = FakeCsi::new(DRIVER);
        let caches = TestStores::new();
        let handler = CsiHandler::new(
            DRIVER.to_owned(),
            csi.client().await,
            caps,
            api.writer(DRIVER),
            caches.stores.clone(),
            Config {
                timeout: Duration::from_secs(5),
                default_fstype: "ext4".into(),
                max_entries: 0,
                save_error_code,
            },
        );
        World {
            api,
            csi,
            caches,
            handler,
        }
    }

    fn attaching() -> Capabilities {
        Capabilities {
            controller_service: true,
            publish_unpublish: true,
            list_volumes: true,
            list_volumes_published_nodes: true,
            ..Capabilities::default()
        }
    }

    impl World {
        /// The PV `pv1` (CSI, handle `handle`, RWO), the CSINode of `node` and a VA `va` of it,
        /// in the API server and in the caches.
        fn volume(&mut self, pv_finalizers: &[&str], va: VolumeAttachment) -> VolumeAttachment {
            let pv = pv_finalizers_of(pv("pv1", csi_spec(&["ReadWriteOnce"])), pv_finalizers);
            let pv = self.api.put(&pv);
            self.caches.apply_pv(&pv);
            self.caches.apply_csinode(&csinode(&[(DRIVER, "id-1")]));
            let mut va = va;
            va.metadata.uid = Some("uid-of-va".into());
            let va = self.api.put(&va);
            self.caches.apply_va(&va);
            va
        }

        fn stored_va(&self) -> Option<VolumeAttachment> {
            self.api.get(None, "va")
        }

        fn stored_pv(&self) -> PersistentVolume {
            self.api.get(None, "pv1").expect("the PV")
        }

        /// The paths of the successful writes, in order.
        fn written(&self) -> Vec<String> {
            self.api
                .writes()
                .iter()
                .map(|w| {
                    format!(
                        "{} {}",
                        w.method,
                        w.path.rsplit("/v1/").next().unwrap_or("")
                    )
                })
                .collect()
        }
    }

    fn pv_finalizers_of(pv: PersistentVolume, f: &[&str]) -> PersistentVolume {
        pv_finalizers(pv, (!f.is_empty()).then_some(f))
    }

    fn attached_va() -> VolumeAttachment {
        let va = va_annotated(va_finalizers(va(Some("pv1")), &[FIN]), "id-1");
        with_status(
            va,
            VolumeAttachmentStatus {
                attached: true,
                ..VolumeAttachmentStatus::default()
            },
        )
    }

    fn deleting_va(finalizers: &[&str]) -> VolumeAttachment {
        let mut va = attached_va();
        va.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        va.metadata.deletion_timestamp = Some(crate::controller::fixtures::now());
        va
    }

    #[tokio::test]
    async fn an_attach_adds_the_pv_finalizer_saves_the_va_publishes_and_marks_it_attached() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[], va(Some("pv1")));
        let synced = w
            .handler
            .sync_attach(&lean_va(&va))
            .await
            .expect("attached");
        assert_eq!(synced, Synced::Attached);
        let publishes = w.csi.calls_of("ControllerPublishVolume");
        assert_eq!(publishes.len(), 1);
        assert_eq!(
            (
                publishes[0].volume_id.as_str(),
                publishes[0].node_id.as_str()
            ),
            ("handle", "id-1")
        );
        // PV finalizer first, then the VA's finalizer and node ID, then its status.
        assert_eq!(
            w.written(),
            [
                "PATCH persistentvolumes/pv1",
                "PATCH volumeattachments/va",
                "PATCH volumeattachments/va/status",
            ]
        );
        assert!(
            w.stored_pv()
                .metadata
                .finalizers
                .unwrap_or_default()
                .contains(&FIN.to_owned())
        );
        let stored = w.stored_va().expect("the VA");
        assert_eq!(stored.metadata.finalizers, Some(vec![FIN.to_owned()]));
        assert_eq!(
            stored.metadata.annotations.unwrap_or_default()[NODE_ID_ANNOTATION],
            "id-1"
        );
        let status = stored.status.expect("a status");
        assert!(status.attached);
        assert_eq!(
            status.attachment_metadata.unwrap_or_default(),
            map(&[("devicePath", "handle")])
        );
        assert!(status.attach_error.is_none());
    }

    #[tokio::test]
    async fn a_stale_copy_of_a_va_marked_attached_waits_for_the_echo_instead_of_publishing_again() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[], va(Some("pv1")));
        w.handler
            .sync_attach(&lean_va(&va))
            .await
            .expect("attached");
        // The cache still holds the copy from before our status write.
        let again = w
            .handler
            .sync_attach(&lean_va(&va))
            .await
            .expect("no error");
        assert_eq!(again, Synced::Unchanged);
        assert_eq!(w.csi.calls_of("ControllerPublishVolume").len(), 1);
        // Once the cache shows the written copy, nothing is left to do either.
        let echo = w.stored_va().expect("the VA");
        assert_eq!(
            w.handler.sync_attach(&lean_va(&echo)).await.expect("ok"),
            Synced::Unchanged
        );
        assert_eq!(w.csi.calls_of("ControllerPublishVolume").len(), 1);
    }

    #[tokio::test]
    async fn a_failed_publish_saves_the_attach_error_with_its_grpc_code() {
        for save_error_code in [true, false] {
            let mut w = world(attaching(), save_error_code).await;
            let va = w.volume(&[], va(Some("pv1")));
            w.csi
                .fail_next_publish(tonic::Status::resource_exhausted("no room"));
            let err = w
                .handler
                .sync_attach(&lean_va(&va))
                .await
                .expect_err("fails");
            assert_eq!(
                err.to_string(),
                "rpc error: code = ResourceExhausted desc = no room"
            );
            let stored = w.stored_va().expect("the VA");
            let status = stored.status.expect("a status");
            assert!(!status.attached);
            let error = status.attach_error.expect("attachError");
            assert_eq!(error.message.as_deref(), Some(err.to_string().as_str()));
            assert_eq!(
                error.error_code,
                save_error_code.then_some(tonic::Code::ResourceExhausted as i32)
            );
        }
    }

    #[tokio::test]
    async fn a_va_whose_pv_is_missing_saves_the_external_attacher_text() {
        let mut w = world(attaching(), true).await;
        let va = w.api.put(&va(Some("gone")));
        w.caches.apply_va(&va);
        let err = w
            .handler
            .sync_attach(&lean_va(&va))
            .await
            .expect_err("fails");
        assert_eq!(err.to_string(), "persistentvolume \"gone\" not found");
        assert!(w.csi.calls_of("ControllerPublishVolume").is_empty());
        let stored = w.stored_va().expect("the VA");
        assert_eq!(
            stored
                .status
                .and_then(|s| s.attach_error)
                .and_then(|e| e.message),
            Some(err.to_string())
        );
    }

    #[tokio::test]
    async fn a_detach_unpublishes_and_removes_the_finalizer_without_writing_a_deleted_va() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], deleting_va(&[FIN]));
        let synced = w
            .handler
            .sync_detach(&lean_va(&va))
            .await
            .expect("detached");
        assert_eq!(synced, Synced::Detached);
        let unpublishes = w.csi.calls_of("ControllerUnpublishVolume");
        assert_eq!(unpublishes.len(), 1);
        assert_eq!(
            (
                unpublishes[0].volume_id.as_str(),
                unpublishes[0].node_id.as_str()
            ),
            ("handle", "id-1")
        );
        // The last finalizer went: the VA is gone, and no status patch follows.
        assert_eq!(w.written(), ["PATCH volumeattachments/va"]);
        assert!(w.stored_va().is_none());
    }

    /// After our detach removed the VA, the cache may still hold its copy with our finalizer
    /// (an echo of an earlier write queues it again before the deletion arrives): that copy
    /// must not call ControllerUnpublishVolume a second time, forced by the reconciler or not.
    #[tokio::test]
    async fn a_stale_copy_of_a_va_we_detached_does_not_unpublish_again() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], deleting_va(&[FIN]));
        let stale = lean_va(&va);
        assert_eq!(
            w.handler.sync_detach(&stale).await.expect("detached"),
            Synced::Detached
        );
        assert!(w.stored_va().is_none(), "gone with our finalizer");
        assert!(w.handler.remembers_detach("va"));
        for forced in [false, true] {
            if forced {
                w.handler.force_sync.lock().insert("va".into());
            }
            assert_eq!(
                w.handler.sync_detach(&stale).await.expect("no error"),
                Synced::Unchanged
            );
        }
        assert_eq!(w.csi.calls_of("ControllerUnpublishVolume").len(), 1);
        assert_eq!(
            w.written(),
            ["PATCH volumeattachments/va"],
            "no 404 status patch"
        );
        // The deletion's event drops the memory.
        w.handler.va_deleted("va");
        assert!(!w.handler.remembers_detach("va"));
    }

    /// Kept by another finalizer, the VA gets a newer copy from our status write; older copies
    /// wait for it, and once the cache shows it the memory goes.
    #[tokio::test]
    async fn a_copy_older_than_our_detached_status_waits_for_the_echo() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], deleting_va(&[FIN, "example.com/other"]));
        w.handler
            .sync_detach(&lean_va(&va))
            .await
            .expect("detached");
        assert_eq!(
            w.handler.sync_detach(&lean_va(&va)).await.expect("ok"),
            Synced::Unchanged
        );
        assert_eq!(w.csi.calls_of("ControllerUnpublishVolume").len(), 1);
        let echo = w.stored_va().expect("kept by the other finalizer");
        w.caches.apply_va(&echo);
        assert_eq!(
            w.handler.sync_detach(&lean_va(&echo)).await.expect("ok"),
            Synced::Unchanged
        );
        assert!(!w.handler.remembers_detach("va"), "the cache caught up");
        assert_eq!(w.csi.calls_of("ControllerUnpublishVolume").len(), 1);
    }

    /// A new VA under the name of one we detached is not the old one: it detaches normally.
    #[tokio::test]
    async fn a_new_va_under_a_detached_name_is_detached_again() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], deleting_va(&[FIN]));
        w.handler
            .sync_detach(&lean_va(&va))
            .await
            .expect("detached");
        let mut again = deleting_va(&[FIN]);
        again.metadata.uid = Some("another-uid".into());
        let again = w.api.put(&again);
        w.caches.apply_va(&again);
        w.handler
            .sync_detach(&lean_va(&again))
            .await
            .expect("detached");
        assert_eq!(w.csi.calls_of("ControllerUnpublishVolume").len(), 2);
    }

    /// A worker can hold a copy read before the VA's deletion arrived (it waited for a CSI
    /// call slot meanwhile), after the deletion's event dropped the memory of our detach: the
    /// cache no longer holding the VA is enough to know there is nothing to detach.
    #[tokio::test]
    async fn a_copy_of_a_va_the_cache_no_longer_holds_does_not_unpublish() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], deleting_va(&[FIN]));
        let stale = lean_va(&va);
        w.handler.sync_detach(&stale).await.expect("detached");
        w.caches.delete_va(&va);
        w.handler.va_deleted("va");
        assert_eq!(
            w.handler.sync_detach(&stale).await.expect("no error"),
            Synced::Unchanged
        );
        assert_eq!(w.csi.calls_of("ControllerUnpublishVolume").len(), 1);
        assert!(!w.handler.remembers_detach("va"), "nothing left behind");
    }

    #[tokio::test]
    async fn a_detach_of_a_va_kept_by_another_finalizer_also_marks_it_detached() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], deleting_va(&[FIN, "example.com/other"]));
        w.handler
            .sync_detach(&lean_va(&va))
            .await
            .expect("detached");
        assert_eq!(
            w.written(),
            [
                "PATCH volumeattachments/va",
                "PATCH volumeattachments/va/status"
            ]
        );
        let stored = w.stored_va().expect("kept by the other finalizer");
        assert_eq!(
            stored.metadata.finalizers,
            Some(vec!["example.com/other".to_owned()])
        );
        assert!(!stored.status.expect("a status").attached);
    }

    #[tokio::test]
    async fn a_failed_unpublish_keeps_the_finalizer_and_saves_the_detach_error() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], deleting_va(&[FIN]));
        w.csi
            .fail_next_unpublish(tonic::Status::unavailable("driver busy"));
        let err = w
            .handler
            .sync_detach(&lean_va(&va))
            .await
            .expect_err("fails");
        let stored = w.stored_va().expect("kept");
        assert_eq!(stored.metadata.finalizers, Some(vec![FIN.to_owned()]));
        let error = stored
            .status
            .and_then(|s| s.detach_error)
            .expect("detachError");
        assert_eq!(error.message, Some(err.to_string()));
        // Retried later, it detaches.
        w.caches.apply_va(&w.stored_va().expect("kept"));
        let retry = w.stored_va().expect("kept");
        w.handler
            .sync_detach(&lean_va(&retry))
            .await
            .expect("detached");
        assert!(w.stored_va().is_none());
    }

    #[tokio::test]
    async fn a_deleted_pv_loses_our_finalizer_only_once_no_va_names_it() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN, "kubernetes.io/pv-protection"], attached_va());
        let deleting = deleting(w.stored_pv());
        let deleting = w.api.put(&deleting);
        w.caches.apply_pv(&deleting);
        w.api.clear_log();
        w.handler.sync_pv(&lean_pv(&deleting)).await.expect("ok");
        assert!(w.api.writes().is_empty(), "a VA still names the PV");
        w.caches.delete_va(&va);
        w.handler.sync_pv(&lean_pv(&deleting)).await.expect("ok");
        assert_eq!(w.written(), ["PATCH persistentvolumes/pv1"]);
        assert_eq!(
            w.stored_pv().metadata.finalizers,
            Some(vec!["kubernetes.io/pv-protection".to_owned()])
        );
    }

    #[tokio::test]
    async fn a_stale_cached_pv_gets_our_finalizer_on_a_live_copy_instead_of_failing_the_attach() {
        // Our own earlier add has not come back through the watch: the live PV has the
        // finalizer, the cache does not. The `test` fails (422); the live copy needs nothing.
        let mut w = world(attaching(), true).await;
        let first = w.volume(&[], va(Some("pv1")));
        w.api.put(&pv_finalizers_of(w.stored_pv(), &[FIN]));
        w.api.clear_log();
        assert_eq!(
            w.handler
                .sync_attach(&lean_va(&first))
                .await
                .expect("attached"),
            Synced::Attached
        );
        assert_eq!(
            w.written(),
            [
                "PATCH volumeattachments/va",
                "PATCH volumeattachments/va/status"
            ]
        );
        assert_eq!(
            w.stored_pv().metadata.finalizers,
            Some(vec![FIN.to_owned()])
        );

        // Another controller added its finalizer since the cached copy: ours is appended to
        // the live list, the other one is kept.
        let mut w = world(attaching(), true).await;
        let second = w.volume(&[], va(Some("pv1")));
        w.api.put(&pv_finalizers_of(w.stored_pv(), &["other/keep"]));
        w.handler
            .sync_attach(&lean_va(&second))
            .await
            .expect("attached");
        assert_eq!(
            w.stored_pv().metadata.finalizers,
            Some(vec!["other/keep".to_owned(), FIN.to_owned()])
        );
        assert_eq!(w.csi.calls_of("ControllerPublishVolume").len(), 1);
    }

    #[tokio::test]
    async fn a_stale_cached_pv_loses_our_finalizer_from_a_live_copy() {
        // The cache shows ours second; another controller has removed the first since.
        let mut w = world(attaching(), true).await;
        let va = w.volume(&["other/first", FIN], attached_va());
        w.caches.delete_va(&va);
        let cached = deleting(w.stored_pv());
        let cached = w.api.put(&cached);
        w.caches.apply_pv(&cached);
        w.api.put(&pv_finalizers_of(w.stored_pv(), &[FIN]));
        w.api.clear_log();
        w.handler.sync_pv(&lean_pv(&cached)).await.expect("removed");
        // No finalizer was left on the deleted PV: the API server removed it.
        assert!(w.api.get::<PersistentVolume>(None, "pv1").is_none());
        assert_eq!(
            w.written(),
            ["PATCH persistentvolumes/pv1"],
            "the stale patch is refused, the live one applies"
        );
    }

    #[tokio::test]
    async fn the_reconciler_forces_a_publish_of_an_attached_va_the_driver_does_not_report() {
        let mut w = world(attaching(), true).await;
        let va = w.volume(&[FIN], attached_va());
        // The driver reports the volume on another node only.
        w.csi.set_published("handle", &["other-node"]);
        let out_of_sync = w.handler.reconcile().await.expect("listed");
        assert_eq!(out_of_sync, ["va"]);
        // The next sync publishes again although the VA says attached.
        w.handler
            .sync_attach(&lean_va(&va))
            .await
            .expect("republished");
        assert_eq!(w.csi.calls_of("ControllerPublishVolume").len(), 1);
        // A VA the driver reports on its node is in sync.
        w.csi.set_published("handle", &["id-1"]);
        assert!(w.handler.reconcile().await.expect("listed").is_empty());
    }

    #[test]
    fn resource_versions_compare_as_numbers() {
        use std::cmp::Ordering::*;
        assert_eq!(compare_resource_versions("99", "100"), Some(Less));
        assert_eq!(compare_resource_versions("100", "100"), Some(Equal));
        assert_eq!(compare_resource_versions("1000", "999"), Some(Greater));
        assert_eq!(compare_resource_versions("abc", "100"), None);
        assert_eq!(compare_resource_versions("", "100"), None);
        assert_eq!(compare_resource_versions("0100", "100"), None);
    }
}
