//! One watch per kind (VolumeAttachment, PersistentVolume, CSINode), shared by
//! every driver, feeding in-memory stores and routing events to drivers.
//!
//! Each object is turned into its [lean](super::lean) copy as it arrives: the stores hold only
//! what the attacher reads.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use k8s_openapi::api::{
    core::v1::PersistentVolume,
    storage::v1::{CSINode, VolumeAttachment},
};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::{Backoff, Doubling};

use super::{
    client::WATCH_TIMEOUT,
    lean::{Cached, CsiNode, Pv, Va},
    stores::{ByName, Store, Stores},
};

/// Receives routed events. Implementations must not block: they look up the
/// driver and add keys to its queues.
pub trait Route: Send + Sync + 'static {
    /// A VolumeAttachment was added or changed (`old` is the cached copy
    /// before the change; on resync `old` and `new` are the same object).
    fn va_applied(&self, old: Option<&Va>, new: &Va);
    /// A VolumeAttachment is gone from the API server.
    fn va_deleted(&self, va: &Va);
    /// A PersistentVolume was added or changed (or re-delivered on resync).
    fn pv_applied(&self, pv: &Pv);
}

/// How the three watches get the state they start from (and start again from, after a watch
/// could not resume).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialList {
    /// A watch that sends the current objects first (`sendInitialEvents=true`, ended by a
    /// bookmark marked `k8s.io/initial-events-end`): the API server serves them from its watch
    /// cache one by one, never building a LIST response. client-go's informers do this by
    /// default since v0.35 (its `WatchListClient` feature), and so external-attacher v4.13.0.
    /// A server that refuses it (the feature off, or too old to know the parameters) gets a
    /// paginated list instead, from then on, as client-go falls back.
    Streaming,
    /// A LIST in pages of 500, then a watch from its resource version.
    Paginated,
}

impl InitialList {
    /// The environment variable client-go reads for the same choice: `false` (or `0`, `f`,
    /// ...: Go's `strconv.ParseBool`) gives [`Paginated`](Self::Paginated), so an operator
    /// who turned streaming lists off for the Go sidecar has them off for attacher-hub too.
    pub const ENV: &'static str = "KUBE_FEATURE_WatchListClient";

    /// The choice of [`ENV`](Self::ENV)'s value: streaming unless it is a false boolean;
    /// a value that is no boolean is named in the error (client-go warns and keeps its
    /// default, which is what the caller does with it).
    pub fn from_env(value: Option<&str>) -> Result<Self, String> {
        match value {
            None => Ok(Self::Streaming),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(Self::Streaming),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(Self::Paginated),
            Some(other) => Err(format!(
                "{}={other:?} is not a boolean (true or false); streaming lists stay on",
                Self::ENV
            )),
        }
    }

    fn config(self) -> watcher::Config {
        let config = watcher::Config::default()
            .timeout(u32::try_from(WATCH_TIMEOUT.as_secs()).unwrap_or(u32::MAX));
        match self {
            Self::Streaming => config.streaming_lists(),
            Self::Paginated => config,
        }
    }
}

/// Whether `error` is the API server refusing a streaming list's parameters (400 Bad Request
/// or 422 Invalid: the WatchList feature is off, or the server predates it), rather than a
/// failure that a retry of the same request may get past.
fn refuses_streaming(error: &watcher::Error) -> bool {
    matches!(
        error,
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
            | watcher::Error::WatchFailed(kube::Error::Api(status))
            if status.code == 400 || status.code == 422
    )
}

/// Starts the three watches and the resync timer. Returns the stores at once;
/// they fill in the background. The tasks end when `shutdown` is cancelled;
/// the returned future resolves when all of them have ended.
pub fn start(
    client: Client,
    server: String,
    route: Arc<dyn Route>,
    (resync, initial): (Duration, InitialList),
    shutdown: &CancellationToken,
) -> (
    Stores,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (synced_tx, synced) = watch::channel(false);
    let stores = Stores {
        vas: Store::default(),
        pvs: Store::default(),
        csinodes: Store::default(),
        synced,
    };
    let (va_listed, va_listed_rx) = oneshot::channel();
    let (pv_listed, pv_listed_rx) = oneshot::channel();
    let sync_task = mark_synced(va_listed_rx, pv_listed_rx, synced_tx, shutdown.clone());

    let va_task = {
        let route = route.clone();
        run_watch(
            Api::<VolumeAttachment>::all(client.clone()),
            Mirror::new(stores.vas.clone(), Some(va_listed)),
            move |change| route_va(&*route, change),
            (server.clone(), initial),
            shutdown.clone(),
        )
        .instrument(tracing::info_span!("watch", kind = "VolumeAttachment"))
    };
    let pv_task = {
        let route = route.clone();
        run_watch(
            Api::<PersistentVolume>::all(client.clone()),
            Mirror::new(stores.pvs.clone(), Some(pv_listed)),
            move |change| route_pv(&*route, change),
            (server.clone(), initial),
            shutdown.clone(),
        )
        .instrument(tracing::info_span!("watch", kind = "PersistentVolume"))
    };
    let csinode_task = run_watch(
        Api::<CSINode>::all(client),
        Mirror::<CsiNode>::new(stores.csinodes.clone(), None),
        |_| {},
        (server, initial),
        shutdown.clone(),
    )
    .instrument(tracing::info_span!("watch", kind = "CSINode"));
    let resync_task = resync_loop(stores.clone(), route, resync, shutdown.clone())
        .instrument(tracing::info_span!("resync"));

    let all = async move {
        tokio::join!(va_task, pv_task, csinode_task, resync_task, sync_task);
    };
    (stores, all)
}

/// Marks the stores synced (`synced`) once the first lists of VolumeAttachments and
/// PersistentVolumes are both complete; never if a watch ends before its first list does, or
/// `shutdown` comes first.
async fn mark_synced(
    va_listed: oneshot::Receiver<()>,
    pv_listed: oneshot::Receiver<()>,
    synced: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        () = shutdown.cancelled() => {}
        (va, pv) = futures::future::join(va_listed, pv_listed) => {
            if va.is_ok() && pv.is_ok() {
                tracing::debug!("VolumeAttachment and PersistentVolume caches synced");
                let _ = synced.send(true);
            }
        }
    }
}

/// Routes a change of the VolumeAttachment cache: every change counts.
fn route_va(route: &dyn Route, change: Change<Va>) {
    match change {
        Change::Applied { old, new } => route.va_applied(old.as_deref(), &new),
        Change::Deleted(va) => route.va_deleted(&va),
    }
}

/// Routes a change of the PersistentVolume cache: a PV added or changed (a deletion routes
/// nothing).
fn route_pv(route: &dyn Route, change: Change<Pv>) {
    if let Change::Applied { new, .. } = change {
        route.pv_applied(&new);
    }
}

/// Every `resync` (none if zero), the first a period after the start: [`redeliver`] until
/// `shutdown`.
async fn resync_loop(
    stores: Stores,
    route: Arc<dyn Route>,
    resync: Duration,
    shutdown: CancellationToken,
) {
    if resync.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tracing::debug!("resync");
        redeliver(&stores, &*route);
    }
}

/// Routes every cached VolumeAttachment (as unchanged: `old` and `new` the same) and every
/// cached PersistentVolume again, as an informer's resync does.
fn redeliver(stores: &Stores, route: &dyn Route) {
    for va in stores.vas.state() {
        route.va_applied(Some(&va), &va);
    }
    for pv in stores.pvs.state() {
        route.pv_applied(&pv);
    }
}

/// What changed in a cache, delivered after the cache holds the change (so a
/// worker woken by it reads the new object, as client-go's informers
/// guarantee).
enum Change<T> {
    /// Added or modified; `old` is the copy the cache held before.
    Applied {
        /// The previous copy, if any.
        old: Option<Arc<T>>,
        /// The object now (the cache's own copy).
        new: Arc<T>,
    },
    /// Gone (including objects found missing when a watch is re-listed): its last state.
    Deleted(Arc<T>),
}

/// Drives one watch of API objects `K` into a store of their lean copies `T`, and reports each
/// change once the store has applied it (see [`Mirror`]).
async fn run_watch<K, T, F>(
    api: Api<K>,
    mut mirror: Mirror<T>,
    on_change: F,
    (server, mut initial): (String, InitialList),
    shutdown: CancellationToken,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + serde::de::DeserializeOwned
        + 'static,
    T: Cached + From<K>,
    F: Fn(Change<T>),
{
    let start = |initial: InitialList| -> WatchStream<K> {
        Box::pin(watcher(api.clone(), initial.config()).backoff(WatchBackoff::default()))
    };
    let mut stream = start(initial);
    let mut log = WatchLog::of::<K>();
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(event)) => {
                // `Init` comes before every attempt to list, failed or not: only what the
                // server sent says it answers.
                if !matches!(event, watcher::Event::Init) {
                    log.delivered(&server);
                }
                mirror.apply(lean_event(event), &on_change);
            }
            Some(Err(error)) if initial == InitialList::Streaming && refuses_streaming(&error) => {
                let err = crate::api_error::one_line(&error, None);
                tracing::info!(%server, err, "the API server refuses streaming lists; listing in pages from now on");
                initial = InitialList::Paginated;
                // The new watcher starts with `Init`: the mirror drops what it had buffered.
                stream = start(initial);
            }
            Some(Err(error)) => log.failed(&server, &error),
            None => return,
        }
    }
}

/// One watch's events as kube's watcher gives them.
type WatchStream<K> =
    std::pin::Pin<Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>>;

/// `event` with its object turned into the lean copy the store keeps.
fn lean_event<K, T: From<K>>(event: watcher::Event<K>) -> watcher::Event<T> {
    match event {
        watcher::Event::Apply(obj) => watcher::Event::Apply(T::from(obj)),
        watcher::Event::Delete(obj) => watcher::Event::Delete(T::from(obj)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(T::from(obj)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Pause before watching again after a failed watch, shaped as client-go's reflector's
/// (`k8s.io/client-go/tools/cache/reflector.go`: 800 ms doubling, each pause jittered by up to
/// as much again, back to the start once no failure came for 2 minutes): [`WATCH_BACKOFF_MIN`]
/// doubling up to [`WATCH_BACKOFF_MAX`], each pause between that and twice that, back to the
/// minimum after [`WATCH_BACKOFF_RESET`] without a failure.
///
/// Only the cap differs: the reflector's 30 s (30-60 s pauses) suits a process with a few
/// informers per controller, thousands in a cluster; the hub has three watches whatever the
/// number of drivers, and a watch that retries late leaves every driver blind after the API
/// server is back (docs/reliability.md, item 7), so pauses stop growing at 2-4 s: the first
/// attach after a 20 s cut-off comes within 5 s of the server's return (regressions'
/// `recovery_after_a_visible_cut_off_is_prompt`), at the load the hub had before.
///
/// A success does not reset it: kube's watcher yields `Event::Init` before each attempt to
/// list, and [`StreamBackoff`](kube::runtime::utils::StreamBackoff) resets its backoff on any
/// item, so a reset on success kept every retry at the first pause while the server was away.
#[derive(Debug)]
pub(crate) struct WatchBackoff {
    /// Failures since the backoff last started over, and the pauses (before jitter) they earn.
    failures: Backoff,
    /// When the last failure came.
    last_failure: Option<tokio::time::Instant>,
}

/// First pause of [`WatchBackoff`] (before jitter), client-go's `defaultBackoffInit`.
const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(800);
/// Longest pause of [`WatchBackoff`] (before jitter).
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A failure after this long without one starts over from [`WATCH_BACKOFF_MIN`] (client-go's
/// `defaultBackoffReset`).
const WATCH_BACKOFF_RESET: Duration = Duration::from_secs(120);

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            failures: Backoff::new(Doubling::new(WATCH_BACKOFF_MIN, WATCH_BACKOFF_MAX)),
            last_failure: None,
        }
    }
}

impl WatchBackoff {
    /// Counts a failure at `now` and returns its pause before jitter: the doubling starts over
    /// when the last failure came more than [`WATCH_BACKOFF_RESET`] ago.
    fn fail_at(&mut self, now: tokio::time::Instant) -> Duration {
        if self
            .last_failure
            .is_some_and(|at| now.duration_since(at) > WATCH_BACKOFF_RESET)
        {
            self.failures.reset();
        }
        self.last_failure = Some(now);
        self.failures.fail()
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    /// The pause after a failure that happens now.
    fn next(&mut self) -> Option<Duration> {
        let pause = self.fail_at(tokio::time::Instant::now());
        // client-go's `wait.Jitter(d, 1.0)`: d + rand·d.
        Some(pause.mul_f64(1.0 + crate::random::random_unit()))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    /// Called on every item of the stream, `Event::Init` of a failing list included: the
    /// backoff starts over only after [`WATCH_BACKOFF_RESET`] without a failure (see the type).
    fn reset(&mut self) {}
}

/// A warning about a failing watch at most this often per watched kind; the failures in
/// between are counted in the next warning (and logged at debug level). With three watches
/// that is six warning lines a minute while the API server is away.
const WATCH_LOG_EVERY: Duration = Duration::from_secs(30);

/// What the log says about one watch's failures: the first failure and then at most one
/// warning per [`WATCH_LOG_EVERY`], each naming the API server and the cause, and the
/// recovery once.
#[derive(Debug)]
struct WatchLog {
    /// Warnings at most every [`WATCH_LOG_EVERY`].
    throttle: crate::telemetry::Throttle,
    /// The watched resource with its group (`volumeattachments.storage.k8s.io`), for a refusal.
    resource: String,
}

impl WatchLog {
    /// The log of the watch of `K`.
    fn of<K: Resource<DynamicType = ()>>() -> Self {
        let (plural, group) = (K::plural(&()), K::group(&()));
        Self {
            throttle: crate::telemetry::Throttle::new(WATCH_LOG_EVERY),
            resource: if group.is_empty() {
                plural.into_owned()
            } else {
                format!("{plural}.{group}")
            },
        }
    }

    /// A failure of the watch of `server`: on one line, a refusal naming the grant it lacks.
    fn failed(&mut self, server: &str, error: &watcher::Error) {
        let grant = crate::api_error::Grant {
            verb: match error {
                watcher::Error::InitialListFailed(_) => "list",
                _ => "watch",
            },
            resource: &self.resource,
            namespace: None,
            granted_by: "add the ClusterRole of deploy/base/rbac (chart: rbac.create)",
        };
        let err = crate::api_error::one_line(error, Some(&grant));
        match self.throttle.failed() {
            Some(failures) => {
                tracing::warn!(%server, err, failures, "watch failed; retrying with backoff");
            }
            None => {
                let failures = self.throttle.failures();
                tracing::debug!(%server, err, failures, "watch failed");
            }
        }
    }

    /// The watch delivered again.
    fn delivered(&mut self, server: &str) {
        let failures = self.throttle.succeeded();
        if failures > 0 {
            tracing::info!(%server, failures, "watch resumed");
        }
    }
}

/// A store kept in step with a watch, reporting what changed.
///
/// Changes are reported after the store applied them. Objects of a re-list
/// (the watch restarted) are reported once the whole list has replaced the
/// store, and objects missing from it as deleted: a deletion that happened
/// while the watch was down is not lost. The first list is not reported:
/// nothing acts before the caches are synced, and then every driver starts
/// from the full cache. While a list is in progress the store keeps serving
/// what it held before.
struct Mirror<T: Cached> {
    store: Store<T>,
    /// The objects of the list in progress.
    buffer: std::collections::HashSet<ByName<T>>,
    /// Their order, when the list replaces a store that drivers already act on (the changes
    /// are reported in list order).
    listed: Vec<Arc<T>>,
    /// The list in progress replaces a store that drivers already act on.
    relisting: bool,
    /// Told once, when the first list is complete.
    first_list: Option<oneshot::Sender<()>>,
}

impl<T: Cached> Mirror<T> {
    fn new(store: Store<T>, first_list: Option<oneshot::Sender<()>>) -> Self {
        Self {
            store,
            buffer: std::collections::HashSet::new(),
            listed: Vec::new(),
            relisting: false,
            first_list,
        }
    }

    fn apply(&mut self, event: watcher::Event<T>, on_change: impl Fn(Change<T>)) {
        match event {
            watcher::Event::Apply(obj) => {
                let new = Arc::new(obj);
                let old = self.store.apply(new.clone());
                on_change(Change::Applied { old, new });
            }
            watcher::Event::Delete(obj) => {
                self.store.delete(obj.name());
                on_change(Change::Deleted(Arc::new(obj)));
            }
            watcher::Event::Init => {
                self.buffer.clear();
                self.listed.clear();
                // Not the first list once the first has completed.
                self.relisting = self.first_list.is_none();
            }
            watcher::Event::InitApply(obj) => {
                let obj = Arc::new(obj);
                if self.relisting {
                    self.listed.push(obj.clone());
                }
                self.buffer.replace(ByName(obj));
            }
            watcher::Event::InitDone => {
                let before = self.store.replace(std::mem::take(&mut self.buffer));
                if let Some(tx) = self.first_list.take() {
                    let _ = tx.send(());
                }
                if !std::mem::take(&mut self.relisting) {
                    return;
                }
                for new in self.listed.drain(..) {
                    let old = before.get(new.name()).map(|o| o.0.clone());
                    on_change(Change::Applied { old, new });
                }
                for gone in before {
                    if self.store.get(gone.0.name()).is_none() {
                        on_change(Change::Deleted(gone.0));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[test]
    fn the_initial_list_follows_client_gos_switch_and_names_a_bad_value() {
        assert_eq!(InitialList::from_env(None), Ok(InitialList::Streaming));
        for on in ["true", "1", "T"] {
            assert_eq!(InitialList::from_env(Some(on)), Ok(InitialList::Streaming));
        }
        for off in ["false", "0", "F", "FALSE"] {
            assert_eq!(InitialList::from_env(Some(off)), Ok(InitialList::Paginated));
        }
        let err = InitialList::from_env(Some("no")).expect_err("not a Go boolean");
        assert!(err.contains("KUBE_FEATURE_WatchListClient=\"no\""), "{err}");
    }

    /// An API server that refuses `sendInitialEvents` (422, as one with the WatchList feature
    /// off answers): the watch falls back to a LIST, fills its store from it, and never asks
    /// for a streaming list again. One that accepts it is never sent a LIST.
    #[tokio::test]
    async fn a_server_refusing_streaming_lists_gets_a_paginated_list_instead() {
        for refuses in [true, false] {
            let requests: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
            let seen = requests.clone();
            let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let query = req.uri().query().unwrap_or_default().to_string();
                seen.lock().push(query.clone());
                async move {
                    let va = |name: &str| {
                        serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                            "metadata": {"name": name, "resourceVersion": "7"},
                            "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": name}}})
                    };
                    let (code, body) = if !query.contains("watch=true") {
                        (200, serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachmentList",
                            "metadata": {"resourceVersion": "7"}, "items": [va("listed")]}).to_string())
                    } else if query.contains("sendInitialEvents=true") && refuses {
                        (422, serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                            "reason": "Invalid", "code": 422,
                            "message": "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"}).to_string())
                    } else if query.contains("sendInitialEvents=true") {
                        let added = serde_json::json!({"type": "ADDED", "object": va("streamed")});
                        let mut end = va("");
                        end["metadata"]["annotations"] =
                            serde_json::json!({"k8s.io/initial-events-end": "true"});
                        let bookmark = serde_json::json!({"type": "BOOKMARK", "object": end});
                        (200, format!("{added}\n{bookmark}\n"))
                    } else {
                        // The watch after the list: nothing happens before the test ends.
                        std::future::pending::<()>().await;
                        unreachable!()
                    };
                    let mut resp = http::Response::new(kube::client::Body::from(body.into_bytes()));
                    *resp.status_mut() = http::StatusCode::from_u16(code).expect("a status code");
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let client = Client::new(svc, "default");
            let store: Store<Va> = Store::default();
            let (listed_tx, listed) = oneshot::channel();
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(run_watch(
                Api::<VolumeAttachment>::all(client),
                Mirror::new(store.clone(), Some(listed_tx)),
                |_| {},
                ("https://fake".to_string(), InitialList::Streaming),
                shutdown.clone(),
            ));
            tokio::time::timeout(Duration::from_secs(10), listed)
                .await
                .expect("the store filled within 10 s")
                .expect("the watch ran");
            let expected = if refuses { "listed" } else { "streamed" };
            assert!(
                store.get(expected).is_some(),
                "refuses {refuses}: {expected} cached"
            );
            shutdown.cancel();
            task.await.expect("the watch ends on shutdown");
            let requests = requests.lock().clone();
            let lists = requests
                .iter()
                .filter(|q| !q.contains("watch=true"))
                .count();
            let streams = requests
                .iter()
                .filter(|q| q.contains("sendInitialEvents=true"))
                .count();
            if refuses {
                assert_eq!((lists, streams), (1, 1), "{requests:#?}");
            } else {
                assert_eq!((lists, streams), (0, 1), "{requests:#?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn watch_backoff_grows_to_its_cap_jittered_upward_and_starts_over_after_a_quiet_spell() {
        let mut b = WatchBackoff::default();
        for i in 0..8 {
            let nominal = (WATCH_BACKOFF_MIN * 2u32.pow(i)).min(WATCH_BACKOFF_MAX);
            let p = b.next().expect("never gives up");
            assert!(p >= nominal && p < nominal * 2, "pause {i}: {p:?}");
            tokio::time::advance(p).await;
        }
        // A success does not start it over (see `a_failing_list_backs_off_...`).
        kube::runtime::utils::Backoff::reset(&mut b);
        assert!(b.next().expect("pause") >= WATCH_BACKOFF_MAX);
        // Two minutes without a failure do.
        tokio::time::advance(WATCH_BACKOFF_RESET + Duration::from_millis(1)).await;
        assert!(b.next().expect("pause") < WATCH_BACKOFF_MIN * 2);
    }

    /// The pauses before jitter: 0.8 s, 1.6 s, then 2 s; a failure exactly two minutes after
    /// the last one keeps the pace, one later than that starts over.
    #[test]
    fn watch_backoff_pauses_before_jitter_double_and_start_over_only_after_two_quiet_minutes() {
        let ms = Duration::from_millis;
        let mut b = WatchBackoff::default();
        let mut now = tokio::time::Instant::now();
        let mut pauses = Vec::new();
        for _ in 0..4 {
            pauses.push(b.fail_at(now));
            now += ms(10);
        }
        assert_eq!(pauses, [ms(800), ms(1600), ms(2000), ms(2000)]);
        now += WATCH_BACKOFF_RESET - ms(10);
        assert_eq!(
            b.fail_at(now),
            ms(2000),
            "two minutes to the nanosecond: no reset"
        );
        now += WATCH_BACKOFF_RESET + Duration::from_nanos(1);
        assert_eq!(b.fail_at(now), ms(800));
        assert_eq!(b.fail_at(now), ms(1600));
    }

    /// Regression: kube's watcher yields `Event::Init` before each attempt to list, and kube's
    /// `StreamBackoff` resets its backoff on every item; a backoff that started over on reset
    /// retried a failing list at its first pause forever (160 warnings in 20 s).
    #[tokio::test(start_paused = true)]
    async fn a_failing_list_backs_off_although_the_watcher_yields_init_before_each_attempt() {
        let attempts = futures::stream::unfold(0u32, |n| async move {
            let item: Result<watcher::Event<()>, &str> = if n % 2 == 0 {
                Ok(watcher::Event::Init)
            } else {
                Err("connection refused")
            };
            Some((item, n + 1))
        });
        let mut stream = std::pin::pin!(kube::runtime::utils::StreamBackoff::new(
            attempts,
            WatchBackoff::default()
        ));
        // The pauses between failures grow to the cap, and stay there.
        let mut last = tokio::time::Instant::now();
        let mut gaps = Vec::new();
        while gaps.len() < 8 {
            if let Some(Err(_)) = stream.next().await {
                gaps.push(last.elapsed());
                last = tokio::time::Instant::now();
            }
        }
        for (i, gap) in gaps.iter().enumerate().skip(1) {
            // Gap i follows failure i-1, whose pause was the (i-1)-th: 0.8 s, 1.6 s, then 2 s.
            let nominal = (WATCH_BACKOFF_MIN * 2u32.pow(i as u32 - 1)).min(WATCH_BACKOFF_MAX);
            assert!(
                *gap >= nominal && *gap < nominal * 2,
                "gap {i}: {gap:?} (all: {gaps:?})"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_warns_once_then_at_most_every_thirty_seconds_and_says_when_it_resumes()
    {
        let mut log = crate::telemetry::Throttle::new(WATCH_LOG_EVERY);
        assert_eq!(log.failed(), Some(1), "the first failure warns");
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(log.failed(), None, "no second warning within 30 s");
        }
        tokio::time::advance(WATCH_LOG_EVERY).await;
        assert_eq!(log.failed(), Some(21), "counting the ones in between");
        assert_eq!(log.succeeded(), 22);
        assert_eq!(log.failed(), Some(1), "a new run warns at once");
    }

    fn va(name: &str, rv: &str) -> Va {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some(name.into());
        va.metadata.resource_version = Some(rv.into());
        Va::from(va)
    }

    /// What a change says, as (kind, name, old rv, new rv).
    fn describe(c: &Change<Va>) -> (String, String, String, String) {
        let rv = |v: &Va| {
            v.metadata
                .resource_version
                .as_deref()
                .unwrap_or_default()
                .to_owned()
        };
        match c {
            Change::Applied { old, new } => (
                "applied".into(),
                new.name().into(),
                old.as_deref().map(rv).unwrap_or_default(),
                rv(new),
            ),
            Change::Deleted(o) => ("deleted".into(), o.name().into(), rv(o), String::new()),
        }
    }

    /// What a [`Route`] was told, in order.
    #[derive(Default)]
    struct Routed(std::sync::Mutex<Vec<String>>);

    impl Routed {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().expect("not poisoned"))
        }
    }

    impl Route for Routed {
        fn va_applied(&self, old: Option<&Va>, new: &Va) {
            let rv = |v: &Va| v.metadata.resource_version.clone().unwrap_or_default();
            let line = format!(
                "va {} {}->{}",
                new.name(),
                old.map(rv).unwrap_or_default(),
                rv(new)
            );
            self.0.lock().expect("not poisoned").push(line);
        }
        fn va_deleted(&self, va: &Va) {
            let line = format!("va {} deleted", va.name());
            self.0.lock().expect("not poisoned").push(line);
        }
        fn pv_applied(&self, pv: &Pv) {
            let line = format!("pv {}", pv.name());
            self.0.lock().expect("not poisoned").push(line);
        }
    }

    fn pv(name: &str) -> Pv {
        let mut pv = PersistentVolume::default();
        pv.metadata.name = Some(name.into());
        Pv::from(pv)
    }

    /// Stores holding `vas` and `pvs`.
    fn stores_with(vas: &[Va], pvs: &[Pv]) -> Stores {
        let stores = Stores {
            vas: Store::default(),
            pvs: Store::default(),
            csinodes: Store::default(),
            synced: watch::channel(true).1,
        };
        for va in vas {
            stores.vas.apply(Arc::new(va.clone()));
        }
        for pv in pvs {
            stores.pvs.apply(Arc::new(pv.clone()));
        }
        stores
    }

    #[test]
    fn every_va_change_is_routed_and_of_the_pvs_only_what_is_applied() {
        let routed = Routed::default();
        route_va(&routed, applied(None, va("a", "1")));
        route_va(&routed, applied(Some(va("a", "1")), va("a", "2")));
        route_va(&routed, Change::Deleted(Arc::new(va("a", "3"))));
        route_pv(&routed, applied(None, pv("p")));
        route_pv(&routed, Change::Deleted(Arc::new(pv("p"))));
        assert_eq!(
            routed.take(),
            ["va a ->1", "va a 1->2", "va a deleted", "pv p"]
        );
    }

    fn applied<T>(old: Option<T>, new: T) -> Change<T> {
        Change::Applied {
            old: old.map(Arc::new),
            new: Arc::new(new),
        }
    }

    /// A resync routes every cached VA (unchanged: old and new the same) and PV, a period after
    /// the start and every period after that, until the shutdown; a zero period, never.
    #[tokio::test(start_paused = true)]
    async fn a_resync_routes_every_cached_object_each_period_until_the_shutdown() {
        let period = Duration::from_secs(10);
        let stores = stores_with(&[va("a", "1"), va("b", "2")], &[pv("p")]);
        let routed = Arc::new(Routed::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(resync_loop(
            stores.clone(),
            routed.clone(),
            period,
            shutdown.clone(),
        ));
        let every = ["pv p", "va a 1->1", "va b 2->2"];
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        tokio::time::sleep(period - Duration::from_millis(1)).await;
        assert!(routed.take().is_empty(), "not before a period");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(sorted(routed.take()), every);
        tokio::time::sleep(period).await;
        assert_eq!(sorted(routed.take()), every);
        shutdown.cancel();
        task.await.expect("ends at the shutdown");
        tokio::time::sleep(3 * period).await;
        assert!(routed.take().is_empty());

        let idle = Arc::new(Routed::default());
        resync_loop(
            stores,
            idle.clone(),
            Duration::ZERO,
            CancellationToken::new(),
        )
        .await;
        assert!(idle.take().is_empty());
    }

    /// The stores count as synced once both first lists are complete: not when a watch ended
    /// before its first list did, nor after the shutdown.
    #[tokio::test]
    async fn the_stores_are_synced_once_the_va_and_pv_lists_are_both_complete() {
        let channels = || {
            let (va_tx, va_rx) = oneshot::channel::<()>();
            let (pv_tx, pv_rx) = oneshot::channel::<()>();
            let (synced_tx, synced) = watch::channel(false);
            (va_tx, va_rx, pv_tx, pv_rx, synced_tx, synced)
        };

        let (va_tx, va_rx, pv_tx, pv_rx, synced_tx, synced) = channels();
        va_tx.send(()).expect("listening");
        pv_tx.send(()).expect("listening");
        mark_synced(va_rx, pv_rx, synced_tx, CancellationToken::new()).await;
        assert!(*synced.borrow(), "both lists complete");

        let (va_tx, va_rx, pv_tx, pv_rx, synced_tx, synced) = channels();
        va_tx.send(()).expect("listening");
        drop(pv_tx);
        mark_synced(va_rx, pv_rx, synced_tx, CancellationToken::new()).await;
        assert!(
            !*synced.borrow(),
            "the PV watch ended before its first list"
        );

        let (_va_tx, va_rx, _pv_tx, pv_rx, synced_tx, synced) = channels();
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        mark_synced(va_rx, pv_rx, synced_tx, shutdown).await;
        assert!(!*synced.borrow(), "the shutdown came first");
    }

    #[test]
    fn changes_are_reported_after_the_store_holds_them_and_relists_report_missed_deletions() {
        let store = Store::<Va>::default();
        let (listed_tx, mut listed) = oneshot::channel();
        let mut mirror = Mirror::new(store.clone(), Some(listed_tx));
        let seen: RefCell<Vec<(String, String, String, String)>> = RefCell::new(Vec::new());
        let probe = store.clone();
        let record = |c: Change<Va>| {
            // The store already holds what is reported.
            if let Change::Applied { new, .. } = &c {
                let now = probe.get(new.name()).expect("in the store");
                assert_eq!(now.metadata.resource_version, new.metadata.resource_version);
            }
            seen.borrow_mut().push(describe(&c));
        };

        // The first list fills the store, reports nothing, and says it is complete.
        mirror.apply(watcher::Event::Init, record);
        mirror.apply(watcher::Event::InitApply(va("a", "1")), record);
        mirror.apply(watcher::Event::InitApply(va("b", "2")), record);
        assert!(store.is_empty(), "a list shows once complete");
        assert!(listed.try_recv().is_err());
        mirror.apply(watcher::Event::InitDone, record);
        assert!(listed.try_recv().is_ok());
        assert!(seen.borrow().is_empty());
        assert_eq!(store.len(), 2);

        // Live events are reported with the previous copy.
        mirror.apply(watcher::Event::Apply(va("a", "3")), record);
        mirror.apply(watcher::Event::Apply(va("c", "4")), record);
        assert_eq!(
            seen.borrow_mut().drain(..).collect::<Vec<_>>(),
            vec![
                ("applied".into(), "a".into(), "1".into(), "3".into()),
                ("applied".into(), "c".into(), String::new(), "4".into()),
            ]
        );

        // The watch restarts: b was deleted and a changed meanwhile; the store keeps serving
        // the old copies until the list is complete.
        mirror.apply(watcher::Event::Init, record);
        mirror.apply(watcher::Event::InitApply(va("a", "7")), record);
        mirror.apply(watcher::Event::InitApply(va("c", "4")), record);
        assert!(store.get("b").is_some());
        mirror.apply(watcher::Event::InitDone, record);
        assert_eq!(
            seen.borrow_mut().drain(..).collect::<Vec<_>>(),
            vec![
                ("applied".into(), "a".into(), "3".into(), "7".into()),
                ("applied".into(), "c".into(), "4".into(), "4".into()),
                ("deleted".into(), "b".into(), "2".into(), String::new()),
            ]
        );
        assert!(store.get("b").is_none());

        // A deletion reports the object's last state, as the watch delivers it.
        mirror.apply(watcher::Event::Delete(va("c", "9")), record);
        assert_eq!(
            seen.borrow().clone(),
            vec![("deleted".into(), "c".into(), "9".into(), String::new())]
        );
        assert_eq!(store.len(), 1);
    }
}
