//! From a parsed command line to a running hub: the process edge, where
//! errors become exit codes and signals become a shutdown token.

use tokio_util::sync::CancellationToken;

use crate::{
    cli::Args,
    csi::Address,
    driver::{LeaderSettings, Settings},
    hub, leader,
};

/// Why the process could not run; each maps to exit code 1 (fatal start-up
/// error), as in the Go sidecar.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CSI address is not a Unix socket.
    #[error(transparent)]
    Address(#[from] crate::csi::connection::Error),
    /// The host name could not be read for the leader-election identity.
    #[error("leader election identity: {0}")]
    Identity(#[source] leader::Error),
    /// The hub failed.
    #[error(transparent)]
    Hub(#[from] hub::Error),
    /// Not built yet.
    #[error("{0} is not supported yet")]
    Unsupported(&'static str),
}

/// Turns the command line into the hub's configuration (sidecar mode: one
/// driver at `--csi-address`).
pub fn hub_config(args: Args) -> Result<hub::Config, Error> {
    // Exhaustive: a new flag must be placed somewhere here.
    let Args {
        resync,
        timeout,
        retry_interval_start,
        retry_interval_max,
        worker_threads,
        max_entries,
        default_fstype,
        reconcile_sync,
        max_grpc_log_length: _, // responses are logged at trace level only, never truncated
        feature_gates,
        kubeconfig,
        csi_address,
        leader_election,
        kube_api_qps,
        kube_api_burst,
        http_endpoint,
        metrics_address,
        metrics_path,
        automaxprocs: _, // a Go runtime knob; tokio sizes itself from the CPU set
        logging: _,      // applied by main before this runs
        config,
        driver_sockets,
        exit_on_connection_loss,
        graceful_shutdown_timeout,
    } = args;
    if config.is_some() {
        return Err(Error::Unsupported("--config (hub mode)"));
    }
    if driver_sockets.is_some() {
        return Err(Error::Unsupported("--driver-sockets (discovery mode)"));
    }

    let leader = if leader_election.enabled {
        Some(LeaderSettings {
            namespace: leader::resolve_namespace(leader_election.namespace.as_deref()),
            identity: leader::default_identity().map_err(Error::Identity)?,
            lease_duration: leader_election.lease_duration,
            renew_deadline: leader_election.renew_deadline,
            retry_period: leader_election.retry_period,
            labels: leader_election.labels.clone(),
            // attacher-hub always hands its Leases over on a graceful stop;
            // the Go gate ReleaseLeaderElectionOnExit only adds this to Go.
            release_on_exit: true,
        })
    } else {
        None
    };

    let driver = Settings {
        address: csi_address.parse::<Address>()?,
        expected_name: None,
        timeout,
        attach_workers: worker_threads,
        detach_workers: worker_threads,
        retry_interval_start,
        retry_interval_max,
        reconcile_sync,
        max_entries: i32::try_from(max_entries).unwrap_or(i32::MAX),
        default_fstype: default_fstype.unwrap_or_default(),
        kube_api_budget: None,
        leader_election: leader,
        exit_on_connection_loss,
        save_error_code: feature_gates.mutable_csi_node_allocatable_count,
        drain_timeout: graceful_shutdown_timeout,
    };

    let http = match (http_endpoint, metrics_address) {
        (Some(address), _) => Some(hub::HttpConfig {
            address,
            metrics_path: metrics_path.clone(),
            leader_election_health: leader_election.enabled,
        }),
        (None, Some(address)) => Some(hub::HttpConfig {
            address,
            metrics_path: metrics_path.clone(),
            leader_election_health: false,
        }),
        (None, None) => None,
    };

    Ok(hub::Config {
        kubeconfig,
        kube_api_qps,
        kube_api_burst: u32::try_from(kube_api_burst.max(0)).unwrap_or(u32::MAX),
        resync,
        http,
        drivers: vec![driver],
    })
}

/// Cancels the returned token on the first SIGTERM or SIGINT; exits the
/// process with code 1 on the second.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("received a termination signal; stopping (a second signal exits at once)");
        t.cancel();
        wait_for_signal().await;
        tracing::warn!("second termination signal; exiting now");
        std::process::exit(1);
    });
    token
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            // Without signal handlers, wait for Ctrl-C the portable way.
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs the process: builds the configuration and runs the hub until a
/// signal arrives.
pub async fn run(args: Args) -> Result<(), Error> {
    let config = hub_config(args)?;
    let shutdown = shutdown_on_signal();
    hub::run(config, prometheus::Registry::new(), shutdown).await?;
    Ok(())
}

/// An error and its causes on one line, `: `-separated.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
