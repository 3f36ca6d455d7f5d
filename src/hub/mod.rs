//! The hub: shared watches, the registry of drivers, the HTTP listener, and
//! the wiring that runs them until shutdown. Sidecar mode is the hub with one
//! driver.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock, RwLock},
    time::Duration,
};

use dashmap::DashMap;
use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::VolumeAttachment};
use kube::{
    Client,
    runtime::reflector::{ObjectRef, Store},
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub mod driver;

use crate::config::Settings;
use crate::{
    config,
    csi::Address,
    http,
    k8s::{
        budget::{FairCap, Limit},
        router::{self, Route},
        stores::Stores,
    },
    leader::{
        self,
        balance::{self, Balance, Presence},
    },
    metrics::{CsiOperations, HubMetrics},
};
use driver::{Driver, Origin, State};

/// How often queue gauges are refreshed.
const GAUGE_REFRESH: Duration = Duration::from_secs(1);
/// How often a waiting backlog is logged (external-attacher #706 asks for 30 s).
const BACKLOG_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// Errors that end the process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("building the Kubernetes client configuration failed")]
    KubeConfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The Kubernetes client could not be built.
    #[error("building the Kubernetes client failed")]
    KubeClient(#[source] kube::Error),
    /// Metrics could not be registered.
    #[error("registering metrics failed")]
    Metrics(#[source] prometheus::Error),
    /// A task that must live as long as the hub ended.
    #[error("{task} ended unexpectedly ({why})")]
    TaskEnded {
        /// Which task.
        task: &'static str,
        /// How it ended.
        why: String,
    },
    /// The HTTP listener could not bind.
    #[error("listening on {address} failed")]
    Listen {
        /// The address.
        address: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The HTTP listener's settings.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// `host:port`.
    pub address: String,
    /// Path of the metrics handler.
    pub metrics_path: String,
    /// Serve `/healthz/leader-election` (only with `--http-endpoint` and
    /// leader election, as in the Go sidecar).
    pub leader_election_health: bool,
}

/// Everything `run` needs.
#[derive(Clone, Debug)]
pub struct Config {
    /// kubeconfig path; `None`: in-cluster configuration (or the usual
    /// kubeconfig search when not in a cluster).
    pub kubeconfig: Option<PathBuf>,
    /// The optional process-wide API cap at start-up (a reloaded driver file may change it).
    pub api_cap: Limit,
    /// Re-delivery period of every cached object.
    pub resync: Duration,
    /// The diagnostics listener, if any.
    pub http: Option<HttpConfig>,
    /// The drivers at start-up.
    pub drivers: Vec<Settings>,
    /// How the driver list changes at run time.
    pub source: Source,
    /// Spread driver Leases across replicas (hub mode with leader election).
    pub balance: Option<BalanceConfig>,
    /// `--max-grpc-log-length`: cap of logged CSI responses (`<= 0`: none).
    pub max_grpc_log_length: i64,
}

/// Settings of leadership balancing.
#[derive(Clone, Debug)]
pub struct BalanceConfig {
    /// Namespace of the presence Leases (the leader-election namespace).
    pub namespace: String,
    /// This replica's identity.
    pub identity: String,
    /// Presence Lease duration: a replica silent this long no longer counts.
    pub lease_duration: Duration,
    /// How often presence is renewed and the share recomputed.
    pub retry_period: Duration,
}

/// Drivers by the name they report, and by sanitized name (finalizer and
/// Lease names).
#[derive(Debug, Default)]
pub struct Registry {
    by_name: DashMap<String, Arc<Driver>>,
    by_sanitized: DashMap<String, String>,
    /// Held while a name is claimed or released, so that two sockets reporting one name at the
    /// same moment cannot both pass the checks before either inserts (readers never take it).
    claims: std::sync::Mutex<()>,
    /// Every configured slot, named or not, in configuration order.
    slots: RwLock<Vec<Arc<Driver>>>,
    /// Names of removed slots whose metric series are still to be removed.
    retired: std::sync::Mutex<Vec<String>>,
}

impl Registry {
    /// Claims `name` for `driver`. Refused when another socket already serves
    /// the name, or when another name sanitizes to the same finalizer/Lease.
    pub fn register(&self, name: &str, driver: &Arc<Driver>) -> Result<(), String> {
        let _claim = self
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sanitized = crate::names::sanitize_driver_name(name);
        if let Some(existing) = self.by_name.get(name)
            && !Arc::ptr_eq(existing.value(), driver)
        {
            return Err(format!(
                "driver name {name:?} is already served by socket {}; refusing a second socket reporting it",
                existing.settings().address
            ));
        }
        match self.by_sanitized.entry(sanitized.clone()) {
            dashmap::Entry::Occupied(e) if e.get() != name => {
                return Err(format!(
                    "driver name {name:?} collides with driver {:?}: both use finalizer external-attacher/{sanitized} and Lease external-attacher-leader-{sanitized}",
                    e.get()
                ));
            }
            dashmap::Entry::Occupied(_) => {}
            dashmap::Entry::Vacant(e) => {
                e.insert(name.to_string());
            }
        }
        self.by_name.insert(name.to_string(), driver.clone());
        Ok(())
    }

    /// Releases `name` if `driver` holds it.
    pub fn unregister(&self, name: &str, driver: &Arc<Driver>) {
        let _claim = self
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let removed = self
            .by_name
            .remove_if(name, |_, d| Arc::ptr_eq(d, driver))
            .is_some();
        if removed {
            self.by_sanitized
                .remove(&crate::names::sanitize_driver_name(name));
        }
    }

    /// The driver serving `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Driver>> {
        self.by_name.get(name).map(|d| d.value().clone())
    }

    /// The driver whose sanitized name is `sanitized`.
    fn by_sanitized(&self, sanitized: &str) -> Option<(String, Arc<Driver>)> {
        let name = self.by_sanitized.get(sanitized)?.value().clone();
        let driver = self.get(&name)?;
        Some((name, driver))
    }

    /// Adds a configured slot.
    pub fn add_slot(&self, driver: Arc<Driver>) {
        self.slots
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(driver);
    }

    /// Removes a slot (its driver has stopped); its name, if it had one, is retired.
    pub fn remove_slot(&self, driver: &Arc<Driver>) {
        self.slots
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|d| !Arc::ptr_eq(d, driver));
        if let Some(name) = driver.name() {
            self.retired
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(name);
        }
    }

    /// The names of the slots removed since the last call.
    pub fn take_retired(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .retired
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Every configured slot.
    pub fn slots(&self) -> Vec<Arc<Driver>> {
        self.slots
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// State shared by every driver of the process.
pub struct Shared {
    /// API client for watches and writes.
    pub client: Client,
    /// A separate client for leader election, so throttling or a busy
    /// connection of the main client never costs a Lease.
    pub leader_client: Client,
    /// The shared caches.
    pub stores: Stores,
    /// The drivers.
    pub registry: Arc<Registry>,
    /// The CSI call histogram.
    pub csi_ops: CsiOperations,
    /// Per-driver series.
    pub metrics: HubMetrics,
    /// The optional process-wide API cap, shared fairly by the drivers' own budgets.
    pub api_cap: Arc<FairCap>,
    /// Leader-election status per driver name, for health and `/drivers`.
    pub leader_status: DashMap<String, leader::Status>,
    /// This replica's share of driver Leases.
    pub balance: Arc<Balance>,
    /// Cap of logged CSI responses (`--max-grpc-log-length`).
    pub max_grpc_log_length: i64,
    /// Copies of each driver Lease from the Lease watch of `balance_leases`, for its elector.
    pub lease_feeds: DashMap<
        String,
        tokio::sync::watch::Sender<Option<k8s_openapi::api::coordination::v1::Lease>>,
    >,
    /// Cancelled once the supervisor has started the first set of drivers: leadership
    /// balancing waits for it, so its first share counts every configured driver.
    pub first_reconcile: CancellationToken,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("stores", &self.stores)
            .finish_non_exhaustive()
    }
}

/// Routes watch events to drivers.
struct Dispatch {
    registry: Arc<Registry>,
    /// The PV cache, set once the router has made it (before any event).
    pvs: OnceLock<Store<PersistentVolume>>,
}

/// The drivers, by sanitized name, that hold an attacher finalizer on `pv`.
fn finalizer_holders(pv: &PersistentVolume) -> impl Iterator<Item = &str> {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .filter_map(|f| f.strip_prefix(crate::names::FINALIZER_PREFIX))
}

/// The drivers, by sanitized name, to be told about `pv` when a VA naming it
/// is deleted, besides the VA's own driver (`attacher`, which always is).
///
/// Spec section 6: every attacher puts the PV of *any* deleted VA on its PV
/// queue, whatever the VA's driver, because that VA may have been the last
/// one keeping the attacher's finalizer on the PV. Only an attacher holding a
/// finalizer on the PV can have anything to do, so only those are told. A
/// deletion is the only VA event that can release a finalizer: a VA's spec
/// (and so the PV it names) is immutable, and an added VA only keeps one.
fn holders_to_tell<'a>(attacher: &str, pv: &'a PersistentVolume) -> Vec<&'a str> {
    let own = crate::names::sanitize_driver_name(attacher);
    let mut holders: Vec<&str> = finalizer_holders(pv).filter(|s| *s != own).collect();
    holders.dedup();
    holders
}

impl Route for Dispatch {
    fn va_applied(&self, old: Option<&VolumeAttachment>, new: &VolumeAttachment) {
        if let Some(driver) = self.registry.get(&new.spec.attacher) {
            driver.on_va(old, new);
        }
    }

    fn va_deleted(&self, va: &VolumeAttachment) {
        if let Some(driver) = self.registry.get(&va.spec.attacher) {
            driver.on_va_deleted(va);
        }
        let Some(pv) = va
            .spec
            .source
            .persistent_volume_name
            .as_deref()
            .and_then(|name| self.pvs.get()?.get(&ObjectRef::new(name)))
        else {
            return;
        };
        for sanitized in holders_to_tell(&va.spec.attacher, &pv) {
            if let Some((name, driver)) = self.registry.by_sanitized(sanitized) {
                driver.on_pv(&name, &pv);
            }
        }
    }

    fn pv_applied(&self, pv: &PersistentVolume) {
        for sanitized in finalizer_holders(pv) {
            if let Some((name, driver)) = self.registry.by_sanitized(sanitized) {
                driver.on_pv(&name, pv);
            }
        }
    }
}

/// What the HTTP listener reports.
struct HubStatus {
    shared: Arc<Shared>,
    leader_election_health: bool,
}

impl http::Status for HubStatus {
    fn leader_election_healthy(&self) -> Option<bool> {
        if !self.leader_election_health {
            return None;
        }
        // client-go's HealthzAdaptor tolerance.
        const TOLERANCE: Duration = Duration::from_secs(20);
        Some(
            self.shared
                .leader_status
                .iter()
                .all(|s| s.value().check(TOLERANCE).is_ok()),
        )
    }

    fn ready(&self) -> Result<(), String> {
        if !self.shared.stores.is_synced() {
            return Err(
                "the VolumeAttachment and PersistentVolume caches are not synced yet".into(),
            );
        }
        let not_ready: Vec<String> = self
            .shared
            .registry
            .slots()
            .iter()
            .filter(|d| {
                !matches!(
                    d.state(),
                    State::Standby | State::Leading | State::NoControllerService
                )
            })
            .map(|d| {
                format!(
                    "{} ({}): {:?}",
                    d.name().unwrap_or_else(|| "?".into()),
                    d.settings().address,
                    d.state()
                )
            })
            .collect();
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(format!("drivers not ready: {}", not_ready.join("; ")))
        }
    }

    fn drivers(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.shared
                .registry
                .slots()
                .iter()
                .map(|d| d.describe())
                .collect(),
        )
    }
}

async fn kube_config(path: Option<&PathBuf>) -> Result<kube::Config, Error> {
    let boxed = |e: Box<dyn std::error::Error + Send + Sync>| Error::KubeConfig(e);
    match path {
        Some(path) => {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(path).map_err(|e| boxed(e.into()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| boxed(e.into()))
        }
        None => kube::Config::infer().await.map_err(|e| boxed(e.into())),
    }
}

/// Runs the hub until `shutdown` is cancelled, then stops every driver (each
/// drains its in-flight work and vacates its Lease) and returns.
pub async fn run(
    config: Config,
    registry: prometheus::Registry,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let Config {
        kubeconfig,
        api_cap,
        resync,
        http: http_config,
        drivers,
        source,
        balance,
        max_grpc_log_length,
    } = config;

    let kube_cfg = kube_config(kubeconfig.as_ref()).await?;
    let client = crate::k8s::client(&kube_cfg).map_err(Error::KubeClient)?;
    let leader_client = crate::k8s::client(&kube_cfg).map_err(Error::KubeClient)?;

    let csi_ops = CsiOperations::register(&registry).map_err(Error::Metrics)?;
    let metrics = HubMetrics::register(&registry).map_err(Error::Metrics)?;
    #[cfg(target_os = "linux")]
    {
        let pc = prometheus::process_collector::ProcessCollector::for_self();
        registry.register(Box::new(pc)).map_err(Error::Metrics)?;
    }

    let hub_registry = Arc::new(Registry::default());
    let watch_stop = CancellationToken::new();
    let dispatch = Arc::new(Dispatch {
        registry: hub_registry.clone(),
        pvs: OnceLock::new(),
    });
    let (stores, watches) = router::start(client.clone(), dispatch.clone(), resync, &watch_stop);
    // No event flows before `watches` is spawned below.
    let _ = dispatch.pvs.set(stores.pvs.clone());
    // Tasks that live as long as the hub; one that ends early ends the process (the kubelet
    // restarts it) rather than leaving a hub that looks alive but no longer watches, serves or
    // balances.
    let mut critical: JoinSet<()> = JoinSet::new();
    let mut names: HashMap<tokio::task::Id, &'static str> = HashMap::new();
    let mut own = |set: &mut JoinSet<()>, name: &'static str, task| {
        let handle = set.spawn(task);
        names.insert(handle.id(), name);
    };
    own(
        &mut critical,
        "the shared watches",
        Box::pin(watches.instrument(tracing::info_span!("router"))) as CriticalTask,
    );

    let http_stop = CancellationToken::new();
    let shared = Arc::new(Shared {
        client,
        leader_client,
        stores,
        registry: hub_registry.clone(),
        csi_ops,
        metrics,
        api_cap: FairCap::new(api_cap),
        leader_status: DashMap::new(),
        balance: Arc::new(Balance::default()),
        max_grpc_log_length,
        lease_feeds: DashMap::new(),
        first_reconcile: CancellationToken::new(),
    });
    if let Some(b) = balance {
        own(
            &mut critical,
            "leadership balancing",
            Box::pin(
                balance_leases(shared.clone(), b, http_stop.clone())
                    .instrument(tracing::info_span!("balance")),
            ),
        );
    }

    // The listener is up before leader election: standby replicas serve too.
    if let Some(h) = http_config {
        let listener = http::bind(&h.address)
            .await
            .map_err(|source| Error::Listen {
                address: h.address.clone(),
                source,
            })?;
        tracing::info!(address = %h.address, "serving metrics and health");
        let routes = http::Routes {
            metrics_path: h.metrics_path,
            registry,
            status: Arc::new(HubStatus {
                shared: shared.clone(),
                leader_election_health: h.leader_election_health,
            }),
        };
        own(
            &mut critical,
            "the HTTP listener",
            Box::pin(
                http::serve(listener, routes, http_stop.clone())
                    .instrument(tracing::info_span!("http")),
            ),
        );
    }
    own(
        &mut critical,
        "the metrics refresh",
        Box::pin(
            gauges(shared.clone(), http_stop.clone()).instrument(tracing::debug_span!("gauges")),
        ),
    );
    own(
        &mut critical,
        "the API cap",
        Box::pin(
            shared
                .api_cap
                .clone()
                .run(http_stop.clone())
                .instrument(tracing::debug_span!("api-cap")),
        ),
    );

    let supervisor = Supervisor::new(shared.clone(), source)
        .run(drivers, shutdown.clone())
        .instrument(tracing::info_span!("supervisor"));
    tokio::pin!(supervisor);
    let died = tokio::select! {
        () = &mut supervisor => None,
        Some(ended) = critical.join_next_with_id() => {
            let (id, why) = match ended {
                Ok((id, ())) => (id, "it returned".to_owned()),
                Err(e) => (e.id(), if e.is_panic() { format!("it panicked: {}", crate::hub::driver::panic_message(&*e.into_panic())) } else { "it was cancelled".to_owned() }),
            };
            let task = names.get(&id).copied().unwrap_or("a hub task");
            tracing::error!(task, %why, "a critical task ended; stopping the drivers and exiting");
            // Drain the drivers and hand their Leases over before the process ends.
            shutdown.cancel();
            supervisor.await;
            Some(Error::TaskEnded { task, why })
        }
    };
    watch_stop.cancel();
    http_stop.cancel();
    critical.shutdown().await;
    tracing::info!("stopped");
    died.map_or(Ok(()), Err)
}

/// A task the hub owns for its whole life.
type CriticalTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Refreshes queue and driver gauges, and logs any backlog periodically.
async fn gauges(shared: Arc<Shared>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(GAUGE_REFRESH);
    let mut last_log = tokio::time::Instant::now();
    // Adds already counted, per (driver, pool): queues count adds
    // themselves; the counter follows them here.
    let mut counted: HashMap<(String, &'static str), u64> = HashMap::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let log_now = last_log.elapsed() >= BACKLOG_LOG_INTERVAL;
        let slots = shared.registry.slots();
        // Drivers whose slot was removed lose their series, unless another slot serves the
        // name. Done here, by the only task that sets the gauges, so none comes back.
        for gone in shared.registry.take_retired() {
            if slots
                .iter()
                .any(|d| d.name().as_deref() == Some(gone.as_str()))
            {
                continue;
            }
            tracing::debug!(driver = %gone, "removing the metrics of a driver no longer served");
            shared.metrics.remove_driver(&gone);
            shared.csi_ops.remove_driver(&gone);
            counted.retain(|(name, _), _| *name != gone);
        }
        for d in slots {
            let Some(name) = d.name() else { continue };
            let up = matches!(d.state(), State::Standby | State::Leading);
            shared
                .metrics
                .driver_up
                .with_label_values(&[name.as_str()])
                .set(if up { 1.0 } else { 0.0 });
            for (pool, q) in d.queue_depths() {
                let adds = q.adds();
                let before = counted.insert((name.clone(), pool), adds).unwrap_or(0);
                shared
                    .metrics
                    .queue_adds
                    .with_label_values(&[q.name(), name.as_str()])
                    .inc_by(adds.saturating_sub(before));
                let labels = [q.name(), name.as_str(), pool];
                shared
                    .metrics
                    .queue_depth
                    .with_label_values(&labels)
                    .set(q.len() as f64);
                let oldest = q.oldest_age().map_or(0.0, |a| a.as_secs_f64());
                shared
                    .metrics
                    .queue_oldest_age
                    .with_label_values(&labels)
                    .set(oldest);
                let longest = q.longest_processing().map_or(0.0, |a| a.as_secs_f64());
                shared
                    .metrics
                    .queue_longest_running
                    .with_label_values(&labels)
                    .set(longest);
                if log_now && !q.is_empty() {
                    tracing::info!(driver = %name, queue = pool, depth = q.len(), processing = q.processing_len(), oldest_seconds = oldest, "work queue backlog");
                }
            }
        }
        if log_now {
            last_log = tokio::time::Instant::now();
        }
    }
}

/// How often the driver file and the discovery glob are checked for changes.
const SOURCE_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Reads and validates the driver file; the error text names file, line and
/// field.
pub type Loader = Arc<dyn Fn(&Path) -> Result<config::Config, String> + Send + Sync>;

/// Where the driver list comes from at run time.
#[derive(Clone)]
pub enum Source {
    /// The start-up list never changes (sidecar mode).
    Fixed,
    /// `--config`: re-read on SIGHUP and whenever the file's content changes
    /// (which also catches a ConfigMap mount swapping its `..data` link).
    File {
        /// The file.
        path: PathBuf,
        /// Reads and validates it.
        load: Loader,
        /// Sockets matching this glob are drivers too (`--driver-sockets`).
        discover: Option<Discovery>,
    },
    /// `--driver-sockets` alone: every matching socket is a driver.
    Discover(Discovery),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed => f.write_str("Fixed"),
            Self::File { path, discover, .. } => f
                .debug_struct("File")
                .field("path", path)
                .field("discover", discover)
                .finish_non_exhaustive(),
            Self::Discover(d) => f.debug_tuple("Discover").field(d).finish(),
        }
    }
}

/// Discovery of driver sockets: by a glob, and/or through the kubelet's
/// plugin registration directory.
#[derive(Clone)]
pub struct Discovery {
    /// The glob, e.g. `/var/lib/kubelet/plugins/*/csi.sock`.
    pub pattern: Option<String>,
    /// The kubelet's plugin registration directory, e.g.
    /// `/var/lib/kubelet/plugins_registry`: every `CSIPlugin` registered there
    /// is a driver, at the endpoint and with the name it registered.
    pub registration_dir: Option<PathBuf>,
    /// Settings of a discovered socket (the flags' defaults).
    pub settings_for: Arc<dyn Fn(Address) -> Settings + Send + Sync>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("pattern", &self.pattern)
            .field("registration_dir", &self.registration_dir)
            .finish_non_exhaustive()
    }
}

impl Discovery {
    /// The sockets matching the glob now, as driver settings.
    fn scan_glob(&self) -> Vec<Settings> {
        let Some(pattern) = &self.pattern else {
            return Vec::new();
        };
        let paths = match glob::glob(pattern) {
            Ok(paths) => paths,
            Err(error) => {
                tracing::warn!(%pattern, %error, "invalid driver socket glob");
                return Vec::new();
            }
        };
        paths
            .filter_map(Result::ok)
            .filter(|p| is_socket(p))
            .filter_map(|p| p.to_str().and_then(|s| s.parse::<Address>().ok()))
            .map(|a| (self.settings_for)(a))
            .collect()
    }

    /// The CSI plugins registered in the registration directory now.
    async fn scan_registrations(
        &self,
        known: &mut HashMap<PathBuf, Option<Settings>>,
    ) -> Vec<Settings> {
        let Some(dir) = &self.registration_dir else {
            return Vec::new();
        };
        let sockets: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| is_socket(p))
                .collect(),
            Err(error) => {
                tracing::debug!(dir = %dir.display(), %error, "cannot read the plugin registration directory");
                Vec::new()
            }
        };
        known.retain(|path, _| sockets.contains(path));
        let mut found = Vec::new();
        for socket in sockets {
            if let Some(known) = known.get(&socket) {
                found.extend(known.clone());
                continue;
            }
            let settings = match crate::csi::registration::plugin_info(&socket).await {
                Ok(info) if info.r#type == crate::csi::registration::CSI_PLUGIN_TYPE => {
                    match info.endpoint.parse::<Address>() {
                        Ok(address) => {
                            tracing::info!(registration = %socket.display(), driver = %info.name, endpoint = %info.endpoint, "found a registered CSI plugin");
                            let mut s = (self.settings_for)(address);
                            s.expected_name = Some(info.name).filter(|n| !n.is_empty());
                            Some(s)
                        }
                        Err(error) => {
                            tracing::warn!(registration = %socket.display(), %error, "registered CSI plugin has an unusable endpoint");
                            None
                        }
                    }
                }
                Ok(info) => {
                    tracing::debug!(registration = %socket.display(), kind = %info.r#type, "not a CSI plugin");
                    None
                }
                Err(error) => {
                    // Not cached: asked again on the next scan.
                    tracing::debug!(%error, "reading a plugin registration failed");
                    continue;
                }
            };
            found.extend(settings.clone());
            known.insert(socket, settings);
        }
        found
    }

    /// Everything discovered now, sorted by socket, without duplicates.
    async fn scan(&self, known: &mut HashMap<PathBuf, Option<Settings>>) -> Vec<Settings> {
        let mut found = self.scan_registrations(known).await;
        for s in self.scan_glob() {
            if !found.iter().any(|f| f.address == s.address) {
                found.push(s);
            }
        }
        found.sort_by(|a, b| a.address.path().cmp(b.address.path()));
        found
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// A driver slot that is running.
struct Running {
    settings: Settings,
    origin: Origin,
    driver: Arc<Driver>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Starts, stops and restarts drivers as the driver list changes; drivers
/// whose settings did not change are left alone.
struct Supervisor {
    shared: Arc<Shared>,
    source: Source,
    running: HashMap<PathBuf, Running>,
}

impl Supervisor {
    fn new(shared: Arc<Shared>, source: Source) -> Self {
        Self {
            shared,
            source,
            running: HashMap::new(),
        }
    }

    async fn run(mut self, initial: Vec<Settings>, shutdown: CancellationToken) {
        let mut configured = initial;
        let mut file_digest = match &self.source {
            Source::File { path, .. } => digest(path),
            _ => None,
        };
        let discovery = match &self.source {
            Source::File { discover, .. } => discover.clone(),
            Source::Discover(d) => Some(d.clone()),
            Source::Fixed => None,
        };
        let mut registrations = HashMap::new();
        let mut discovered = match &discovery {
            Some(d) => d.scan(&mut registrations).await,
            None => Vec::new(),
        };
        self.apply(&configured, &discovered).await;
        self.shared.first_reconcile.cancel();

        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(SOURCE_POLL_INTERVAL);
        loop {
            let forced = tokio::select! {
                () = shutdown.cancelled() => break,
                _ = async {
                    match hangup.as_mut() {
                        Some(h) => { h.recv().await; }
                        None => std::future::pending::<()>().await,
                    }
                } => true,
                _ = tick.tick() => false,
            };
            if let Source::File { path, load, .. } = &self.source {
                let now = digest(path);
                if forced || now != file_digest {
                    file_digest = now;
                    tracing::info!(path = %path.display(), signal = forced, "re-reading the driver file");
                    match load(path) {
                        Ok(config) => {
                            configured = config.drivers;
                            self.shared.api_cap.set_limit(config.hub_api_cap);
                        }
                        Err(error) => {
                            tracing::error!(%error, "the new driver file is invalid; keeping the running configuration")
                        }
                    }
                }
            }
            if let Some(d) = &discovery {
                discovered = d.scan(&mut registrations).await;
            }
            self.apply(&configured, &discovered).await;
        }

        tracing::info!("shutting down: draining drivers and releasing leases");
        let stopping: Vec<Running> = self.running.drain().map(|(_, r)| r).collect();
        for r in &stopping {
            r.stop.cancel();
        }
        for r in stopping {
            let _ = r.task.await;
            self.shared.registry.remove_slot(&r.driver);
        }
    }

    /// Makes the running set equal to `configured` plus the discovered
    /// sockets that are not configured.
    async fn apply(&mut self, configured: &[Settings], discovered: &[Settings]) {
        let mut desired: Vec<(Settings, Origin)> = configured
            .iter()
            .cloned()
            .map(|s| (s, Origin::Configured))
            .collect();
        for d in discovered {
            if !desired.iter().any(|(s, _)| s.address == d.address) {
                desired.push((d.clone(), Origin::Discovered));
            }
        }
        let wanted: HashMap<PathBuf, (Settings, Origin)> = desired
            .into_iter()
            .map(|(s, o)| (s.address.path().to_path_buf(), (s, o)))
            .collect();

        // Stop what is gone or changed, all at once, then wait for them.
        let stale: Vec<PathBuf> = self
            .running
            .iter()
            .filter(|(path, r)| {
                wanted
                    .get(*path)
                    .is_none_or(|(s, o)| *s != r.settings || *o != r.origin)
            })
            .map(|(path, _)| path.clone())
            .collect();
        let mut stopping = Vec::new();
        for path in stale {
            if let Some(r) = self.running.remove(&path) {
                tracing::info!(socket = %r.settings.address, "stopping driver (removed or changed)");
                r.stop.cancel();
                stopping.push(r);
            }
        }
        for r in stopping {
            let _ = r.task.await;
            self.shared.registry.remove_slot(&r.driver);
        }

        // Start what is new (or changed).
        let mut new: Vec<(PathBuf, (Settings, Origin))> = wanted
            .into_iter()
            .filter(|(path, _)| !self.running.contains_key(path))
            .collect();
        new.sort_by(|a, b| a.0.cmp(&b.0));
        for (path, (settings, origin)) in new {
            tracing::info!(socket = %settings.address, ?origin, "starting driver");
            let driver = Driver::new(settings.clone(), origin);
            self.shared.registry.add_slot(driver.clone());
            let stop = CancellationToken::new();
            let span = tracing::info_span!("driver", socket = %settings.address);
            let task = tokio::spawn(
                supervised(driver.clone(), self.shared.clone(), stop.clone()).instrument(span),
            );
            self.running.insert(
                path,
                Running {
                    settings,
                    origin,
                    driver,
                    stop,
                    task,
                },
            );
        }
    }
}

/// A cheap fingerprint of a file's content (`None` if unreadable).
fn digest(path: &Path) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let bytes = std::fs::read(path).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// Keeps this replica's presence Lease, recomputes its share of driver Leases, and hands
/// surplus drivers over to other replicas. One watch on the namespace's Leases tells which
/// replicas of our group are alive and when a driver Lease is handed over, so that a replica
/// below its share takes it at once (no gap between the giver's release and the taker's
/// next retry).
async fn balance_leases(shared: Arc<Shared>, config: BalanceConfig, stop: CancellationToken) {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::runtime::{WatchStreamExt, watcher};

    let api = kube::Api::<Lease>::namespaced(shared.leader_client.clone(), &config.namespace);
    // A replica's presence expires before its driver Leases do (they are renewed as often and
    // last a retry period longer), so when a dead replica's driver Leases expire the survivors
    // already count it out and may take them at once.
    let presence_duration = config
        .lease_duration
        .saturating_sub(config.retry_period)
        .max(config.retry_period * 2);
    let presence = Presence::new(
        api.clone(),
        &config.identity,
        presence_duration,
        config.retry_period,
    );
    let mut leases: HashMap<String, Lease> = HashMap::new();
    let mut listing: HashMap<String, Lease> = HashMap::new();
    let mut events = watcher(
        api,
        watcher::Config::default()
            .timeout(u32::try_from(crate::k8s::WATCH_TIMEOUT.as_secs()).unwrap_or(u32::MAX)),
    )
    .backoff(router::WatchBackoff::default())
    .boxed();

    // The first share must count every configured driver, not the few started so far.
    tokio::select! {
        () = stop.cancelled() => return,
        () = shared.first_reconcile.cancelled() => {}
    }
    let mut tick = tokio::time::interval(config.retry_period);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            event = events.next() => {
                match event {
                    Some(Ok(event)) => apply_lease_event(&shared, &mut leases, &mut listing, event),
                    Some(Err(error)) => tracing::debug!(%error, "the Lease watch failed; retrying"),
                    None => break,
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        // Drivers with a Lease: every replica of the group has the same list, so the share is
        // computed over all of them, ready here or not.
        let slots = shared.registry.slots();
        let candidates: Vec<_> = slots
            .iter()
            .filter(|d| d.settings().leader_election.is_some())
            .collect();
        let group = balance::group_key(
            candidates
                .iter()
                .map(|d| d.settings().address.path().to_str().unwrap_or_default()),
        );
        let known: Vec<Lease> = leases.values().cloned().collect();
        let round = tokio::select! {
            () = stop.cancelled() => break,
            r = presence.round(&shared.balance, candidates.len(), &group, &known) => r,
        };
        if let Err(error) = round {
            tracing::warn!(%error, "renewing replica presence failed");
            continue;
        }
        let surplus = shared.balance.surplus();
        if surplus > 0 {
            // Hand over the drivers with the greatest names, deterministically.
            let mut leading: Vec<_> = candidates
                .iter()
                .filter(|d| d.state() == State::Leading)
                .collect();
            leading.sort_by_key(|d| std::cmp::Reverse(d.name()));
            for d in leading.into_iter().take(surplus) {
                tracing::info!(driver = ?d.name(), "over this replica's share; handing the driver over");
                d.hand_over();
            }
        }
    }
    presence.remove().await;
}

/// Keeps `leases` in step with the Lease watch and passes every driver Lease it sees to that
/// Lease's elector (which then knows of renewals, releases and deletions at once).
fn apply_lease_event(
    shared: &Shared,
    leases: &mut HashMap<String, k8s_openapi::api::coordination::v1::Lease>,
    listing: &mut HashMap<String, k8s_openapi::api::coordination::v1::Lease>,
    event: kube::runtime::watcher::Event<k8s_openapi::api::coordination::v1::Lease>,
) {
    use kube::runtime::watcher::Event;
    let name =
        |l: &k8s_openapi::api::coordination::v1::Lease| l.metadata.name.clone().unwrap_or_default();
    let feed = |name: &str, lease: Option<&k8s_openapi::api::coordination::v1::Lease>| {
        if let Some(tx) = shared.lease_feeds.get(name) {
            tx.send_replace(lease.cloned());
        }
    };
    match event {
        Event::Apply(lease) => {
            feed(&name(&lease), Some(&lease));
            leases.insert(name(&lease), lease);
        }
        Event::InitApply(lease) => {
            feed(&name(&lease), Some(&lease));
            listing.insert(name(&lease), lease);
        }
        Event::Delete(lease) => {
            feed(&name(&lease), None);
            leases.remove(&name(&lease));
        }
        Event::Init => listing.clear(),
        Event::InitDone => std::mem::swap(leases, listing),
    }
}

/// Runs a driver; a panic in it is logged and counted, and the driver is
/// started again after a pause. The other drivers never notice.
async fn supervised(driver: Arc<Driver>, shared: Arc<Shared>, stop: CancellationToken) {
    const RESTART_AFTER_PANIC: Duration = Duration::from_secs(5);
    loop {
        match crate::hub::driver::guarded(driver.clone().run(shared.clone(), stop.clone())).await {
            Ok(()) => return,
            Err(panic) => {
                let name = driver.name().unwrap_or_default();
                tracing::error!(driver = %name, %panic, "the driver's task panicked; restarting it");
                shared.metrics.count_panic(&name, "driver");
                if let Some(n) = driver.name() {
                    shared.registry.unregister(&n, &driver);
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RESTART_AFTER_PANIC) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pv(finalizers: &[&str]) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv".into()),
                finalizers: Some(finalizers.iter().map(|f| (*f).to_string()).collect()),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        }
    }

    #[test]
    fn a_deleted_va_tells_every_other_driver_holding_a_finalizer_on_its_pv() {
        let shared = pv(&[
            "kubernetes.io/pv-protection",
            "external-attacher/a-csi-io",
            "external-attacher/b-csi-io",
            "example.com/other",
        ]);
        // The VA's own driver is told anyway (on_va_deleted): not twice.
        assert_eq!(holders_to_tell("a.csi.io", &shared), ["b-csi-io"]);
        assert_eq!(holders_to_tell("b.csi.io", &shared), ["a-csi-io"]);
        // A VA of a driver holding nothing on the PV still releases the others.
        assert_eq!(
            holders_to_tell("c.csi.io", &shared),
            ["a-csi-io", "b-csi-io"]
        );
        // No attacher finalizer: nobody to tell.
        assert!(holders_to_tell("c.csi.io", &pv(&["kubernetes.io/pv-protection"])).is_empty());
        assert!(holders_to_tell("c.csi.io", &PersistentVolume::default()).is_empty());
    }

    fn driver(socket: &str) -> Arc<Driver> {
        let defaults =
            crate::config::Defaults::with_identity(&crate::cli::Args::default(), "h".into());
        Driver::new(
            defaults.settings_for(socket.parse().expect("socket path")),
            Origin::Discovered,
        )
    }

    #[test]
    fn two_sockets_reporting_one_name_at_once_never_both_register() {
        for round in 0..200 {
            let registry = Arc::new(Registry::default());
            let (a, b) = (driver("/a.sock"), driver("/b.sock"));
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let racers: Vec<_> = [a.clone(), b.clone()]
                .into_iter()
                .map(|d| {
                    let (registry, barrier) = (registry.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        registry.register("same.csi.io", &d).is_ok()
                    })
                })
                .collect();
            let won: Vec<bool> = racers
                .into_iter()
                .map(|t| t.join().expect("racer"))
                .collect();
            assert_eq!(
                won.iter().filter(|w| **w).count(),
                1,
                "round {round}: {won:?}"
            );
            // The loser's unregister does not release the winner's name.
            let (winner, loser) = if won[0] { (&a, &b) } else { (&b, &a) };
            registry.unregister("same.csi.io", loser);
            assert!(
                registry
                    .get("same.csi.io")
                    .is_some_and(|d| Arc::ptr_eq(&d, winner))
            );
        }
    }

    #[test]
    fn finalizer_holders_are_the_sanitized_driver_names() {
        let p = pv(&[
            "external-attacher/x-y-zX",
            "external-attacherx/no",
            "external-attacher/",
        ]);
        assert_eq!(finalizer_holders(&p).collect::<Vec<_>>(), ["x-y-zX", ""]);
    }
}
