//! The hub: shared watches, the registry of drivers, the HTTP listener, and
//! the wiring that runs them until shutdown. Sidecar mode is the hub with one
//! driver.
//!
//! The parts: [`driver`] (one driver's life), [`registry`] (the drivers by name and slot),
//! [`dispatch`] (watch events to drivers), [`supervisor`] (the running set follows the driver
//! list), [`discovery`] (driver sockets found at run time), [`health`] (what the HTTP listener
//! reports), [`gauges`] (queue and driver gauges), [`balance_loop`] (leadership across replicas;
//! its decisions in [`balance_view`]), [`reload`] (how the driver list's loads went) and
//! [`context`] (what the hub's tasks share), [`unserved`] (drivers with VolumeAttachments
//! waiting and no live attacher, whoever serves them).
//! [`run`] wires them.

pub mod balance_loop;
pub mod balance_view;
pub mod context;
pub mod discovery;
pub mod dispatch;
pub mod driver;
pub mod gauges;
pub mod health;
pub mod registry;
pub mod reload;
pub mod startup;
pub mod supervisor;
pub mod unserved;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::Duration,
};

use dashmap::DashMap;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    config::{NamedSettings, Settings},
    http,
    k8s::{
        budget::{FairCap, Limit},
        router,
    },
    leader::balance::Balance,
    metrics::{CsiOperations, HubMetrics},
};
use balance_loop::balance_leases;
use context::Context;
use dispatch::Dispatch;
use driver::{context::Shared, panic_guard::panic_message};
use health::HubStatus;
use supervisor::Supervisor;

pub use balance_loop::BalanceConfig;
pub use discovery::Discovery;
pub use registry::Registry;
pub use supervisor::{Loader, Source};

/// Errors that end the process.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable kubeconfig or in-cluster configuration.
    #[error(transparent)]
    KubeConfig(crate::k8s::client::ConfigError),
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
    /// Settings for discovered drivers by name (entries of `--config` without an address).
    pub discovered: Vec<NamedSettings>,
    /// How the driver list changes at run time.
    pub source: Source,
    /// Spread driver Leases across replicas (hub mode with leader election).
    pub balance: Option<BalanceConfig>,
    /// `--max-grpc-log-length`: cap of logged CSI responses (`<= 0`: none).
    pub max_grpc_log_length: i64,
}

/// Runs the hub until `shutdown` is cancelled, then stops every driver (each
/// drains its in-flight work and vacates its Lease) and returns.
///
/// The steps, in this order: the API clients, the metrics, the shared watches (the first of
/// the hub's own tasks), what the drivers share, the hub's context, leadership balancing, the
/// HTTP listener (before any driver leads: standby replicas serve too), the metrics refresh and
/// the API cap; then the supervisor runs the drivers until shutdown or until one of the hub's
/// own tasks ends; then those tasks are stopped.
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
        discovered,
        source,
        balance,
        max_grpc_log_length,
    } = config;

    let clients = connect(kubeconfig.as_deref(), &registry).await?;
    let driver_metrics = register_metrics(&registry)?;
    let hub_registry = Arc::new(Registry::default());
    let watch_stop = CancellationToken::new();
    let (stores, watches) = start_watches(&clients, hub_registry.clone(), resync, &watch_stop);
    let mut critical = Critical::default();
    critical.own("the shared watches", watches);

    let http_stop = CancellationToken::new();
    let shared = share(
        clients,
        stores,
        hub_registry.clone(),
        driver_metrics,
        api_cap,
        max_grpc_log_length,
    );
    let hub = context(shared.clone(), hub_registry, &source, &registry)?;
    check_unserved(
        &hub,
        &registry,
        balance.as_ref(),
        &drivers,
        &discovered,
        &mut critical,
        &http_stop,
    )?;
    if let Some(b) = balance {
        critical.own(
            "leadership balancing",
            Box::pin(
                balance_leases(hub.clone(), b, http_stop.clone())
                    .instrument(tracing::info_span!("balance")),
            ),
        );
    }
    critical.own(
        "the start-up watch",
        Box::pin(
            startup::follow(hub.clone(), http_stop.clone())
                .instrument(tracing::debug_span!("startup")),
        ),
    );
    let gauges = gauges::Gauges::new(hub.clone());
    // The listener is up before leader election: standby replicas serve too.
    if let Some(h) = http_config {
        let status = HubStatus {
            hub: hub.clone(),
            leader_election_health: h.leader_election_health,
            gauges: gauges.clone(),
        };
        serve_http(h, registry, status, &mut critical, &http_stop).await?;
    }
    refresh(&mut critical, gauges, &shared, &http_stop);

    let died = supervise(hub, source, drivers, discovered, &shutdown, &mut critical).await;
    watch_stop.cancel();
    http_stop.cancel();
    critical.stop().await;
    tracing::info!("stopped");
    died.map_or(Ok(()), Err)
}

/// The hub's API clients, and the address of their API server.
struct Clients {
    /// The drivers' client: their reads and writes.
    client: kube::Client,
    /// The leader elections' client.
    leader_client: kube::Client,
    /// The shared watches' client, on a connection of its own.
    watch_client: kube::Client,
    /// The API server's URL.
    cluster_url: String,
}

/// Finds the API server (`kubeconfig`, else in-cluster configuration first) and makes the
/// hub's clients over two connections, whose metrics go to `registry`.
async fn connect(
    kubeconfig: Option<&std::path::Path>,
    registry: &prometheus::Registry,
) -> Result<Clients, Error> {
    let kube_cfg =
        crate::k8s::client::kube_config(kubeconfig, crate::k8s::client::Search::InClusterFirst)
            .await
            .map_err(Error::KubeConfig)?;
    let connection_metrics = crate::metrics::ConnectionMetrics::new();
    connection_metrics
        .register(registry)
        .map_err(Error::Metrics)?;
    // The drivers' and the leader elections' requests share one connection, as client-go's
    // clientsets made from one configuration share theirs (the leader client is separate for
    // its API budget). The shared watches get a sibling connection, which checks itself when
    // the first stalls (why: `crate::k8s::transport`, "Why a second connection").
    let requests =
        crate::k8s::Transport::new(&kube_cfg, connection_metrics).map_err(Error::KubeClient)?;
    let watches = {
        let _span = tracing::info_span!("watches").entered();
        requests.sibling(&kube_cfg).map_err(Error::KubeClient)?
    };
    let client = crate::k8s::client(&kube_cfg, &requests).map_err(Error::KubeClient)?;
    let leader_client = crate::k8s::client(&kube_cfg, &requests).map_err(Error::KubeClient)?;
    let watch_client = crate::k8s::client(&kube_cfg, &watches).map_err(Error::KubeClient)?;
    Ok(Clients {
        client,
        leader_client,
        watch_client,
        cluster_url: kube_cfg.cluster_url.to_string(),
    })
}

/// Registers the drivers' metrics (CSI operations, then the hub's) and, on Linux, the
/// process's.
fn register_metrics(registry: &prometheus::Registry) -> Result<(CsiOperations, HubMetrics), Error> {
    let csi_ops = CsiOperations::register(registry).map_err(Error::Metrics)?;
    let metrics = HubMetrics::register(registry).map_err(Error::Metrics)?;
    #[cfg(target_os = "linux")]
    {
        let pc = prometheus::process_collector::ProcessCollector::for_self();
        registry.register(Box::new(pc)).map_err(Error::Metrics)?;
    }
    Ok((csi_ops, metrics))
}

/// Starts the shared watches, their events routed to the drivers of `registry`; they end on
/// `stop`. Returns the caches and the watches' task (not yet spawned: no event flows before).
fn start_watches(
    clients: &Clients,
    registry: Arc<Registry>,
    resync: Duration,
    stop: &CancellationToken,
) -> (crate::k8s::Stores, CriticalTask) {
    let dispatch = Arc::new(Dispatch {
        registry,
        pvs: OnceLock::new(),
    });
    let initial = std::env::var(router::InitialList::ENV).ok();
    let initial = router::InitialList::from_env(initial.as_deref()).unwrap_or_else(|err| {
        tracing::warn!(err, "ignored");
        router::InitialList::Streaming
    });
    tracing::debug!(?initial, "initial lists of the shared watches");
    let (stores, watches) = router::start(
        clients.watch_client.clone(),
        clients.cluster_url.clone(),
        dispatch.clone(),
        (resync, initial),
        stop,
    );
    // No event flows before `watches` is spawned.
    let _ = dispatch.pvs.set(stores.pvs.clone());
    let task = Box::pin(watches.instrument(tracing::info_span!("router")));
    (stores, task)
}

/// What every driver shares: the clients, the caches, the names of `registry`, the metrics,
/// the API cap at start-up, and the leader elections' common state.
fn share(
    clients: Clients,
    stores: crate::k8s::Stores,
    names: Arc<Registry>,
    (csi_ops, metrics): (CsiOperations, HubMetrics),
    api_cap: Limit,
    max_grpc_log_length: i64,
) -> Arc<Shared> {
    Arc::new(Shared {
        client: clients.client,
        leader_client: clients.leader_client,
        stores,
        names,
        csi_ops,
        metrics,
        api_cap: FairCap::new(api_cap),
        leader_status: DashMap::new(),
        balance: Arc::new(Balance::default()),
        max_grpc_log_length,
        lease_feeds: DashMap::new(),
        renew_grid: crate::leader::RenewGrid::new(tokio::time::Instant::now()),
        electors: crate::leader::Runner::new(),
    })
}

/// The hub's context: `shared`, the drivers' `registry`, and the status of the driver list
/// `source` (its metrics registered to `metrics`).
fn context(
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    source: &Source,
    metrics: &prometheus::Registry,
) -> Result<Arc<Context>, Error> {
    Ok(Arc::new(Context {
        shared,
        registry,
        first_reconcile: CancellationToken::new(),
        unserved: parking_lot::Mutex::default(),
        startup: startup::Startup::new(),
        config: reload::ConfigStatus::new(
            config_path(source),
            crate::metrics::config::ConfigMetrics::register(metrics).map_err(Error::Metrics)?,
        ),
    }))
}

/// The driver file `source` reads, as `/drivers` names it (none unless a file).
fn config_path(source: &Source) -> Option<String> {
    match source {
        Source::File { path, .. } => Some(path.display().to_string()),
        _ => None,
    }
}

/// Binds the HTTP listener of `config` and serves `registry`'s metrics and `status` on it (a
/// critical task, until `stop`).
async fn serve_http(
    config: HttpConfig,
    registry: prometheus::Registry,
    status: HubStatus,
    critical: &mut Critical,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let listener = http::bind(&config.address)
        .await
        .map_err(|source| Error::Listen {
            address: config.address.clone(),
            source,
        })?;
    tracing::info!(address = %config.address, "serving metrics and health");
    let routes = http::Routes {
        metrics_path: config.metrics_path,
        registry,
        status: Arc::new(status),
    };
    critical.own(
        "the HTTP listener",
        Box::pin(
            http::serve(listener, routes, stop.clone()).instrument(tracing::info_span!("http")),
        ),
    );
    Ok(())
}

/// Starts the `critical` tasks that keep the hub's state fresh until `stop`: the `gauges`'
/// refresh (and its retiring of gone drivers' series), then the API cap of `shared`.
fn refresh(
    critical: &mut Critical,
    gauges: Arc<gauges::Gauges>,
    shared: &Shared,
    stop: &CancellationToken,
) {
    critical.own(
        "the metrics refresh",
        Box::pin(
            gauges::retire_and_log(gauges, stop.clone()).instrument(tracing::debug_span!("gauges")),
        ),
    );
    critical.own(
        "the API cap",
        Box::pin(
            shared
                .api_cap
                .clone()
                .run(stop.clone())
                .instrument(tracing::debug_span!("api-cap")),
        ),
    );
}

/// Starts the `critical` task that reports drivers nobody attaches for ([`unserved`]), until
/// `stop`, when this replica elects: the Lease namespace of a driver it knows nothing of is the
/// hub's (`balance`), else its first driver's (a sidecar); `discovered` entries give theirs.
/// Its series go to `registry`.
fn check_unserved(
    hub: &Arc<Context>,
    registry: &prometheus::Registry,
    balance: Option<&BalanceConfig>,
    drivers: &[Settings],
    discovered: &[NamedSettings],
    critical: &mut Critical,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let Some(lease_namespace) = balance.map(|b| b.namespace.clone()).or_else(|| {
        drivers
            .iter()
            .find_map(|d| Some(d.leader_election.as_ref()?.namespace.clone()))
    }) else {
        // Without leader election there is no Lease to look at.
        return Ok(());
    };
    let named = discovered
        .iter()
        .filter_map(|n| {
            let le = n.settings().leader_election.as_ref()?;
            Some((n.name().to_string(), le.namespace.clone()))
        })
        .collect();
    let metrics = crate::metrics::UnservedMetrics::register(registry).map_err(Error::Metrics)?;
    critical.own(
        "the unserved-driver check",
        Box::pin(
            unserved::follow(hub.clone(), metrics, lease_namespace, named, stop.clone())
                .instrument(tracing::debug_span!("unserved")),
        ),
    );
    Ok(())
}

/// Runs the drivers of `source` (`drivers` at start-up, `discovered` the settings of
/// discovered ones) until `shutdown`, or until a `critical` task ends: then logs it, stops the
/// drivers (each drains and hands its Lease over before the process ends) and returns the
/// error that ends the process.
async fn supervise(
    hub: Arc<Context>,
    source: Source,
    drivers: Vec<Settings>,
    discovered: Vec<NamedSettings>,
    shutdown: &CancellationToken,
    critical: &mut Critical,
) -> Option<Error> {
    let supervisor = Supervisor::new(hub, source)
        .run(drivers, discovered, shutdown.clone())
        .instrument(tracing::info_span!("supervisor"));
    tokio::pin!(supervisor);
    tokio::select! {
        () = &mut supervisor => None,
        Some((task, why)) = critical.ended() => {
            tracing::error!(task, %why, "a critical task ended; stopping the drivers and exiting");
            // Drain the drivers and hand their Leases over before the process ends.
            shutdown.cancel();
            supervisor.await;
            Some(Error::TaskEnded { task, why })
        }
    }
}

/// How long the hub's own tasks may take to end once the drivers have stopped (the presence
/// Lease's deletion, bounded by [`crate::leader::balance::REMOVE_TIMEOUT`], is the slowest).
const CRITICAL_STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// A task the hub owns for its whole life.
type CriticalTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The tasks that live as long as the hub, by name. One that ends early ends the process (the
/// kubelet restarts it) rather than leaving a hub that looks alive but no longer watches,
/// serves or balances.
#[derive(Default)]
struct Critical {
    tasks: JoinSet<()>,
    names: HashMap<tokio::task::Id, &'static str>,
}

impl Critical {
    /// Spawns `task`, known as `name`.
    fn own(&mut self, name: &'static str, task: CriticalTask) {
        let handle = self.tasks.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// The first task to end, by name, and how it ended; `None` when there is none left.
    async fn ended(&mut self) -> Option<(&'static str, String)> {
        let (id, how) = match self.tasks.join_next_with_id().await? {
            Ok((id, ())) => (id, Ending::Returned),
            Err(e) if e.is_panic() => {
                let id = e.id();
                (id, Ending::Panicked(panic_message(&*e.into_panic())))
            }
            Err(e) => (e.id(), Ending::Cancelled),
        };
        Some((self.name(id), how.why()))
    }

    /// The name of the task `id`.
    fn name(&self, id: tokio::task::Id) -> &'static str {
        self.names.get(&id).copied().unwrap_or("a hub task")
    }

    /// Lets the tasks end on their tokens (the balancing task deletes the replica's presence
    /// Lease, within its own bound) for at most [`CRITICAL_STOP_TIMEOUT`], then aborts what is
    /// left.
    async fn stop(mut self) {
        let _ = tokio::time::timeout(CRITICAL_STOP_TIMEOUT, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.shutdown().await;
    }
}

/// How a critical task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ending {
    /// Its future returned.
    Returned,
    /// It panicked with this message.
    Panicked(String),
    /// It was aborted.
    Cancelled,
}

impl Ending {
    /// What the log line and the error say of it.
    fn why(self) -> String {
        match self {
            Self::Returned => "it returned".to_owned(),
            Self::Panicked(message) => format!("it panicked: {message}"),
            Self::Cancelled => "it was cancelled".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_a_critical_task_ended_is_told_in_words() {
        assert_eq!(Ending::Returned.why(), "it returned");
        assert_eq!(Ending::Panicked("boom".into()).why(), "it panicked: boom");
        assert_eq!(Ending::Cancelled.why(), "it was cancelled");
    }

    /// Each task that ends is named, with how it ended; a task it does not know is "a hub
    /// task"; nothing is left once all have ended.
    #[tokio::test(start_paused = true)]
    async fn the_first_critical_task_to_end_is_named_with_how_it_ended() {
        let mut critical = Critical::default();
        let (go, gone) = (CancellationToken::new(), CancellationToken::new());
        let returns = go.clone();
        critical.own(
            "returns",
            Box::pin(async move { returns.cancelled().await }),
        );
        critical.own("waits", Box::pin(std::future::pending()));
        go.cancel();
        assert_eq!(
            critical.ended().await,
            Some(("returns", "it returned".to_owned()))
        );
        let panics = gone.clone();
        critical.own(
            "panics",
            Box::pin(async move {
                panics.cancelled().await;
                panic!("out of luck");
            }),
        );
        gone.cancel();
        assert_eq!(
            critical.ended().await,
            Some(("panics", "it panicked: out of luck".to_owned()))
        );
        critical.tasks.abort_all();
        assert_eq!(
            critical.ended().await,
            Some(("waits", "it was cancelled".to_owned()))
        );
        assert_eq!(critical.ended().await, None);
        let stray = tokio::spawn(async {}).id();
        assert_eq!(critical.name(stray), "a hub task");
    }

    /// Stopping waits for the tasks that end on their own, within the bound, and aborts the
    /// others after it.
    #[tokio::test(start_paused = true)]
    async fn stopping_the_critical_tasks_waits_at_most_the_bound() {
        let mut critical = Critical::default();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        critical.own(
            "quick",
            Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = done_tx.send(());
            }),
        );
        critical.own("stuck", Box::pin(std::future::pending()));
        let started = tokio::time::Instant::now();
        critical.stop().await;
        assert_eq!(started.elapsed(), CRITICAL_STOP_TIMEOUT);
        assert!(done.await.is_ok(), "the quick task ran to its end");
    }

    #[test]
    fn only_a_driver_file_names_its_path() {
        assert_eq!(config_path(&Source::Fixed), None);
        let file = Source::File {
            path: "/etc/attacher-hub/drivers.yaml".into(),
            load: Arc::new(|_| Err(String::new())),
            discover: None,
        };
        assert_eq!(
            config_path(&file).as_deref(),
            Some("/etc/attacher-hub/drivers.yaml")
        );
    }
}
