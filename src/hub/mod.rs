//! The hub: shared watches, the registry of drivers, the HTTP listener, and
//! the wiring that runs them until shutdown. Sidecar mode is the hub with one
//! driver.
//!
//! The parts: [`driver`] (one driver's life), [`registry`] (the drivers by name and slot),
//! [`dispatch`] (watch events to drivers), [`supervisor`] (the running set follows the driver
//! list), [`discovery`] (driver sockets found at run time), [`status`] (what the HTTP listener
//! reports), [`gauges`] (queue and driver gauges), [`balance_loop`] (leadership across replicas),
//! [`reload`] (how the driver list's loads went) and [`context`] (what the hub's tasks share).
//! [`run`] wires them.

pub mod balance_loop;
pub mod context;
pub mod discovery;
pub mod dispatch;
pub mod driver;
pub mod gauges;
pub mod registry;
pub mod reload;
pub mod status;
pub mod supervisor;

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
use status::HubStatus;
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

    let kube_cfg = crate::k8s::client::kube_config(
        kubeconfig.as_deref(),
        crate::k8s::client::Search::InClusterFirst,
    )
    .await
    .map_err(Error::KubeConfig)?;
    let connection_metrics = crate::metrics::ConnectionMetrics::new();
    connection_metrics
        .register(&registry)
        .map_err(Error::Metrics)?;
    // One connection for both clients, as client-go's clientsets made from one configuration
    // share one: the leader client is separate for its API budget, not for its connection.
    let transport =
        crate::k8s::Transport::new(&kube_cfg, connection_metrics).map_err(Error::KubeClient)?;
    let client = crate::k8s::client(&kube_cfg, &transport).map_err(Error::KubeClient)?;
    let leader_client = crate::k8s::client(&kube_cfg, &transport).map_err(Error::KubeClient)?;

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
    let (stores, watches) = router::start(
        client.clone(),
        kube_cfg.cluster_url.to_string(),
        dispatch.clone(),
        resync,
        &watch_stop,
    );
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
        names: hub_registry.clone(),
        csi_ops,
        metrics,
        api_cap: FairCap::new(api_cap),
        leader_status: DashMap::new(),
        balance: Arc::new(Balance::default()),
        max_grpc_log_length,
        lease_feeds: DashMap::new(),
        renew_grid: crate::leader::RenewGrid::new(tokio::time::Instant::now()),
        electors: crate::leader::Runner::new(),
    });
    let config_path = match &source {
        Source::File { path, .. } => Some(path.display().to_string()),
        _ => None,
    };
    let hub = Arc::new(Context {
        shared: shared.clone(),
        registry: hub_registry.clone(),
        first_reconcile: CancellationToken::new(),
        unserved: parking_lot::Mutex::default(),
        config: reload::ConfigStatus::new(
            config_path,
            crate::metrics::config::ConfigMetrics::register(&registry).map_err(Error::Metrics)?,
        ),
    });
    if let Some(b) = balance {
        own(
            &mut critical,
            "leadership balancing",
            Box::pin(
                balance_leases(hub.clone(), b, http_stop.clone())
                    .instrument(tracing::info_span!("balance")),
            ),
        );
    }

    let gauges = gauges::Gauges::new(hub.clone());
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
                hub: hub.clone(),
                leader_election_health: h.leader_election_health,
                gauges: gauges.clone(),
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
            gauges::retire_and_log(gauges, http_stop.clone())
                .instrument(tracing::debug_span!("gauges")),
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

    let supervisor = Supervisor::new(hub, source)
        .run(drivers, discovered, shutdown.clone())
        .instrument(tracing::info_span!("supervisor"));
    tokio::pin!(supervisor);
    let died = tokio::select! {
        () = &mut supervisor => None,
        Some(ended) = critical.join_next_with_id() => {
            let (id, why) = match ended {
                Ok((id, ())) => (id, "it returned".to_owned()),
                Err(e) => (e.id(), if e.is_panic() { format!("it panicked: {}", panic_message(&*e.into_panic())) } else { "it was cancelled".to_owned() }),
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
    // Let them end on their tokens (the balancing task deletes the replica's presence Lease,
    // within its own bound), then abort what is left.
    let _ = tokio::time::timeout(CRITICAL_STOP_TIMEOUT, async {
        while critical.join_next().await.is_some() {}
    })
    .await;
    critical.shutdown().await;
    tracing::info!("stopped");
    died.map_or(Ok(()), Err)
}

/// How long the hub's own tasks may take to end once the drivers have stopped (the presence
/// Lease's deletion, bounded by [`crate::leader::balance::REMOVE_TIMEOUT`], is the slowest).
const CRITICAL_STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// A task the hub owns for its whole life.
type CriticalTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
