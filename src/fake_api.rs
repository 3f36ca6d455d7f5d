//! An in-memory Kubernetes API server for unit tests: a [`kube::Client`] whose requests are
//! answered from a store of VolumeAttachments, PersistentVolumes, Leases and Secrets, with the
//! API server's rules the controllers rely on: unit tests get those rules without a process and
//! run in seconds, the integration tests use the real kube-apiserver (`docs/design.md#fake-api`).
//!
//! * GET, POST (409 `AlreadyExists`), PUT (409 `Conflict` on a stale `resourceVersion`),
//!   PATCH (JSON merge patch and RFC 6902 JSON patch, a failed `test` op answering 422, a
//!   `test` of null passing for a missing path as in the API server) and
//!   DELETE on the objects, and `/status` subresources (a patch of the main resource leaves
//!   `status` alone, a patch of `/status` changes nothing else);
//! * every write bumps one `resourceVersion` counter;
//! * finalizers: DELETE of an object with finalizers only sets its `deletionTimestamp`; an
//!   object being deleted whose last finalizer is removed is gone, and the write answers with
//!   the object as it was last (deletion timestamp, no finalizers);
//! * LIST of a collection (cluster-wide or in one namespace), with a field selector on
//!   `metadata.name`;
//! * a log of every request (method, path, body, answer code), and fault injection: every
//!   request failing with 500, or the next few with 503.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use parking_lot::{Mutex, MutexGuard};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

/// The kinds the fake serves, by their REST path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// `storage.k8s.io/v1` VolumeAttachments (cluster scoped).
    VolumeAttachment,
    /// `v1` PersistentVolumes (cluster scoped).
    PersistentVolume,
    /// `coordination.k8s.io/v1` Leases (namespaced).
    Lease,
    /// `v1` Secrets (namespaced).
    Secret,
}

impl Kind {
    fn of_plural(plural: &str) -> Option<Kind> {
        match plural {
            "volumeattachments" => Some(Kind::VolumeAttachment),
            "persistentvolumes" => Some(Kind::PersistentVolume),
            "leases" => Some(Kind::Lease),
            "secrets" => Some(Kind::Secret),
            _ => None,
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::VolumeAttachment => "volumeattachments",
            Kind::PersistentVolume => "persistentvolumes",
            Kind::Lease => "leases",
            Kind::Secret => "secrets",
        }
    }
}

/// Where an object is stored: kind, namespace (empty for cluster-scoped kinds), name.
type Key = (Kind, String, String);

/// One request as the fake answered it.
#[derive(Clone, Debug)]
pub(crate) struct Logged {
    /// The HTTP method.
    pub(crate) method: Method,
    /// The path, without the query.
    pub(crate) path: String,
    /// The request body, when it was JSON.
    pub(crate) body: Option<Value>,
    /// The status code answered.
    pub(crate) code: u16,
}

impl Logged {
    /// Whether this request wrote (POST, PUT, PATCH, DELETE) and succeeded.
    pub(crate) fn wrote(&self) -> bool {
        self.method != Method::GET && self.code < 300
    }
}

/// What the fake holds.
#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<Key, Value>,
    /// The last `resourceVersion` handed out.
    rv: u64,
    /// Answer every request with 500.
    fail: bool,
    /// Answer this many of the next requests with 503 (a server warming up).
    fail_next: usize,
    /// How long each answer takes (the round trip of a real server).
    latency: std::time::Duration,
    /// Before this many of the next PUTs, store the object again unchanged under a new
    /// `resourceVersion`: a write the client did not see, so that the PUT conflicts.
    unseen_writes: usize,
    log: Vec<Logged>,
}

/// A handle on the fake API server; clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct FakeApi(Arc<Mutex<State>>);

impl FakeApi {
    /// A client whose requests this fake answers (default namespace `default`).
    pub(crate) fn client(&self) -> Client {
        let fake = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let fake = fake.clone();
            async move { Ok::<_, Infallible>(fake.handle(req).await) }
        });
        Client::new(svc, "default")
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock()
    }

    /// Stores `object` as if another client wrote it (a new `resourceVersion`); returns it as
    /// stored.
    pub(crate) fn put<K>(&self, object: &K) -> K
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let kind = Kind::of_plural(&K::plural(&())).expect("a kind the fake serves");
        let mut value = serde_json::to_value(object).expect("serializable object");
        let meta = &value["metadata"];
        let key = (
            kind,
            meta["namespace"].as_str().unwrap_or_default().to_owned(),
            meta["name"].as_str().expect("a named object").to_owned(),
        );
        let mut st = self.state();
        st.rv += 1;
        value["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        st.objects.insert(key, value.clone());
        serde_json::from_value(value).expect("the object reads back")
    }

    /// The stored object `name` (in `namespace` for namespaced kinds), if any.
    pub(crate) fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let kind = Kind::of_plural(&K::plural(&())).expect("a kind the fake serves");
        let key = (
            kind,
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        let value = self.state().objects.get(&key).cloned()?;
        Some(serde_json::from_value(value).expect("the object reads back"))
    }

    /// A driver's [`Writer`](crate::k8s::writer::Writer) through this fake, with an unlimited
    /// API budget.
    pub(crate) fn writer(&self, driver: &str) -> crate::k8s::writer::Writer {
        use crate::k8s::budget::{ApiBudget, FairCap, Limit};
        let budget = ApiBudget::new(
            driver,
            Limit::Unlimited,
            FairCap::new(Limit::Unlimited),
            Box::new(Quiet),
        );
        crate::k8s::writer::Writer::new(self.client(), budget)
    }

    /// Every request so far, oldest first.
    pub(crate) fn log(&self) -> Vec<Logged> {
        self.state().log.clone()
    }

    /// The successful writes so far, oldest first.
    pub(crate) fn writes(&self) -> Vec<Logged> {
        self.log().into_iter().filter(Logged::wrote).collect()
    }

    /// Forgets the requests so far.
    pub(crate) fn clear_log(&self) {
        self.state().log.clear();
    }

    /// Answers every request with 500 (`true`) or normally again (`false`).
    pub(crate) fn set_failing(&self, failing: bool) {
        self.state().fail = failing;
    }

    /// Answers the next `n` requests with 503.
    pub(crate) fn fail_next(&self, n: usize) {
        self.state().fail_next = n;
    }

    /// Takes `latency` to answer each request from now on.
    pub(crate) fn set_latency(&self, latency: std::time::Duration) {
        self.state().latency = latency;
    }

    /// Makes each of the next `n` PUTs meet a write it did not see (answered 409 Conflict).
    pub(crate) fn unseen_write_before_next_puts(&self, n: usize) {
        self.state().unseen_writes = n;
    }

    /// How many of the requests to fail are left.
    pub(crate) fn failures_left(&self) -> usize {
        self.state().fail_next
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let latency = self.state().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut st = self.state();
        let (code, answer) = st.answer(&method, &path, &query, &content_type, body.clone());
        st.log.push(Logged {
            method,
            path,
            body,
            code: code.as_u16(),
        });
        let mut resp = Response::new(Body::from(answer.to_string().into_bytes()));
        *resp.status_mut() = code;
        resp
    }
}

/// An API budget observer that records nothing.
#[derive(Debug)]
struct Quiet;

impl crate::metrics::Observer for Quiet {
    fn waited(&self, _: std::time::Duration) {}
    fn throttled(&self, _: crate::metrics::Limiter) {}
}

/// A `metav1.Status` body.
fn status(code: StatusCode, reason: &str, message: &str) -> (StatusCode, Value) {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "code": code.as_u16(), "reason": reason, "message": message,
    });
    (code, body)
}

/// The kind, namespace, name and subresource a path addresses (`name` empty for a collection).
fn parse_path(path: &str) -> Option<(Kind, String, String, bool)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest = match parts.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] => ((*ns).to_owned(), rest),
        rest => (String::new(), rest),
    };
    match rest {
        [plural] => Some((Kind::of_plural(plural)?, namespace, String::new(), false)),
        [plural, name] => Some((
            Kind::of_plural(plural)?,
            namespace,
            (*name).to_owned(),
            false,
        )),
        [plural, name, "status"] => Some((
            Kind::of_plural(plural)?,
            namespace,
            (*name).to_owned(),
            true,
        )),
        _ => None,
    }
}

impl State {
    fn answer(
        &mut self,
        method: &Method,
        path: &str,
        query: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        if self.fail {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "failing",
            );
        }
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "warming up",
            );
        }
        let Some((kind, namespace, mut name, subresource)) = parse_path(path) else {
            return status(StatusCode::NOT_FOUND, "NotFound", "no such path");
        };
        if *method == Method::GET && name.is_empty() {
            return (StatusCode::OK, self.list(kind, &namespace, query));
        }
        if *method == Method::POST {
            let Some(obj) = &body else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "no body");
            };
            obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .clone_into(&mut name);
        }
        let key = (kind, namespace, name);
        let not_found = || {
            let message = format!("{} \"{}\" not found", kind.plural(), key.2);
            status(StatusCode::NOT_FOUND, "NotFound", &message)
        };
        let current = self.objects.get(&key).cloned();
        match *method {
            Method::GET => match current {
                Some(obj) => (StatusCode::OK, obj),
                None => not_found(),
            },
            Method::POST => {
                if current.is_some() {
                    let message = format!("{} \"{}\" already exists", kind.plural(), key.2);
                    return status(StatusCode::CONFLICT, "AlreadyExists", &message);
                }
                let obj = body.unwrap_or_default();
                (StatusCode::CREATED, self.store(key, obj))
            }
            Method::PUT => {
                let Some(mut current) = current else {
                    return not_found();
                };
                if self.unseen_writes > 0 {
                    self.unseen_writes -= 1;
                    current = self.write(key.clone(), current);
                }
                let obj = body.unwrap_or_default();
                if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        "the object has been modified",
                    );
                }
                (StatusCode::OK, self.write(key, obj))
            }
            Method::PATCH => {
                let Some(current) = current else {
                    return not_found();
                };
                let patch = body.unwrap_or_default();
                let mut next = current.clone();
                if content_type.starts_with("application/json-patch+json") {
                    // As the API server's JSON patch: a `test` of null passes for a path that
                    // does not exist.
                    let patch: Vec<Value> = patch
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|op| {
                            let path = op["path"].as_str().unwrap_or_default();
                            !(op["op"] == "test"
                                && op["value"].is_null()
                                && next.pointer(path).is_none())
                        })
                        .collect();
                    let ops: json_patch::Patch = match serde_json::from_value(Value::Array(patch)) {
                        Ok(ops) => ops,
                        Err(e) => {
                            return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string());
                        }
                    };
                    if let Err(e) = json_patch::patch(&mut next, &ops) {
                        let code = StatusCode::UNPROCESSABLE_ENTITY;
                        return status(code, "Invalid", &e.to_string());
                    }
                } else {
                    json_patch::merge(&mut next, &patch);
                }
                // A subresource changes only its part; the main resource never its status.
                if subresource {
                    let mut only_status = current.clone();
                    only_status["status"] = next["status"].clone();
                    next = only_status;
                } else {
                    next["status"] = current["status"].clone();
                }
                (StatusCode::OK, self.write(key, next))
            }
            Method::DELETE => {
                let Some(mut current) = current else {
                    return not_found();
                };
                let finalizers = current["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if finalizers {
                    current["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    (StatusCode::OK, self.store(key, current))
                } else {
                    self.objects.remove(&key);
                    (StatusCode::OK, current)
                }
            }
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "no"),
        }
    }

    /// The objects of `kind` (in `namespace`, or all when empty) as a list, filtered by the
    /// query's field selector on `metadata.name` if it has one.
    fn list(&self, kind: Kind, namespace: &str, query: &str) -> Value {
        let name = query.split('&').find_map(|kv| {
            let selector = kv.strip_prefix("fieldSelector=")?;
            let selector = selector.replace("%3D", "=").replace("%3d", "=");
            selector.strip_prefix("metadata.name=").map(str::to_owned)
        });
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|((k, ns, n), _)| {
                *k == kind
                    && (namespace.is_empty() || ns == namespace)
                    && name.as_ref().is_none_or(|want| want == n)
            })
            .map(|(_, v)| v.clone())
            .collect();
        json!({
            "kind": "List", "apiVersion": "v1",
            "metadata": { "resourceVersion": self.rv.to_string() },
            "items": items,
        })
    }

    /// Stores `obj` with a new `resourceVersion`, unless it is being deleted and has no
    /// finalizer left: then it is gone, and the answer is the object as it was last.
    fn write(&mut self, key: Key, obj: Value) -> Value {
        let deleting = !obj["metadata"]["deletionTimestamp"].is_null();
        let finalizers = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if deleting && !finalizers {
            self.objects.remove(&key);
            return obj;
        }
        self.store(key, obj)
    }

    fn store(&mut self, key: Key, mut obj: Value) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.objects.insert(key, obj.clone());
        obj
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::Api;
    use kube::api::{DeleteParams, Patch, PatchParams};

    fn va(name: &str, finalizers: &[&str]) -> VolumeAttachment {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some(name.into());
        va.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        va.spec.attacher = "d".into();
        va
    }

    #[tokio::test]
    async fn an_object_with_finalizers_is_deleted_when_its_last_finalizer_goes() {
        let fake = FakeApi::default();
        fake.put(&va("a", &["f"]));
        let api = Api::<VolumeAttachment>::all(fake.client());
        api.delete("a", &DeleteParams::default())
            .await
            .expect("delete");
        let stored: VolumeAttachment = fake.get(None, "a").expect("still there");
        assert!(stored.metadata.deletion_timestamp.is_some());
        let patch = json!({ "metadata": { "finalizers": null } });
        let answer = api
            .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch");
        assert!(answer.metadata.deletion_timestamp.is_some());
        assert!(fake.get::<VolumeAttachment>(None, "a").is_none());
        assert_eq!(fake.writes().len(), 2);
    }

    #[tokio::test]
    async fn status_and_main_resource_patches_change_only_their_part() {
        let fake = FakeApi::default();
        fake.put(&va("a", &[]));
        let api = Api::<VolumeAttachment>::all(fake.client());
        let both =
            json!({ "metadata": { "labels": { "x": "y" } }, "status": { "attached": true } });
        api.patch("a", &PatchParams::default(), &Patch::Merge(&both))
            .await
            .expect("patch");
        let a: VolumeAttachment = fake.get(None, "a").expect("a");
        assert!(a.status.is_none() && a.metadata.labels.is_some());
        api.patch_status("a", &PatchParams::default(), &Patch::Merge(&both))
            .await
            .expect("patch status");
        let a: VolumeAttachment = fake.get(None, "a").expect("a");
        assert!(a.status.as_ref().is_some_and(|s| s.attached));
        // One resourceVersion per write: the put, then two patches.
        assert_eq!(a.metadata.resource_version.as_deref(), Some("3"));
    }
}
