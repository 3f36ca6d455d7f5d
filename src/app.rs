//! From a parsed command line to a running hub: the process edge, where
//! errors become exit codes and signals become a shutdown token.

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{cli::Args, config, csi::Address, hub, leader, telemetry::error_chain};

/// Why the process could not run; [`Error::exit_code`] gives the exit code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--config`: the driver list is invalid (exit code 2, before touching the cluster).
    #[error(transparent)]
    Config(#[from] config::Error),
    /// The CSI address is not a Unix socket.
    #[error(transparent)]
    Address(#[from] crate::csi::connection::Error),
    /// The host name could not be read for the leader-election identity.
    #[error("leader election identity: {0}")]
    Identity(#[source] leader::Error),
    /// The hub failed.
    #[error(transparent)]
    Hub(#[from] hub::Error),
    /// `--driver-sockets` is not a valid glob (exit code 2, like a bad flag).
    #[error("invalid value {pattern:?} for flag -driver-sockets: {message}")]
    Glob {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    /// 2 for an invalid driver list, else 1 (fatal start-up error, as in the Go sidecar).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Glob { .. } => 2,
            _ => 1,
        }
    }
}

/// Turns the command line into the hub's configuration (sidecar mode: one
/// driver at `--csi-address`).
pub fn hub_config(args: Args) -> Result<hub::Config, Error> {
    // The flags' per-driver settings: the single driver in sidecar mode, the
    // defaults of every entry of `--config`.
    let defaults = config::Defaults::from_args(&args).map_err(Error::Identity)?;
    if args.leader_election.enabled {
        // Once here, rather than on every line of every elector.
        tracing::info!(identity = %defaults.identity(), "leader election identity");
    }
    // Exhaustive: a new flag must be placed somewhere here.
    let Args {
        resync,
        timeout: _,              // in `defaults`
        retry_interval_start: _, // in `defaults`
        retry_interval_max: _,   // in `defaults`
        worker_threads: _,       // in `defaults`
        max_entries: _,          // in `defaults`
        default_fstype: _,       // in `defaults`
        reconcile_sync: _,       // in `defaults`
        max_grpc_log_length,
        feature_gates: _, // in `defaults`
        kubeconfig,
        csi_address,
        leader_election,
        kube_api_qps: _,       // in `defaults`
        kube_api_burst: _,     // in `defaults`
        hub_kube_api_qps: _,   // in `defaults`
        hub_kube_api_burst: _, // in `defaults`
        http_endpoint,
        metrics_address,
        metrics_path,
        automaxprocs: _, // a Go runtime knob; tokio sizes itself from the CPU set
        logging: _,      // applied by main before this runs
        config,
        driver_sockets,
        kubelet_registration_dir,
        exit_on_connection_loss: _,   // in `defaults`
        graceful_shutdown_timeout: _, // in `defaults`
    } = args;
    let discovery = discovery(driver_sockets, kubelet_registration_dir, &defaults)?;
    let (start, source) = driver_source(config, discovery, &csi_address, &defaults)?;
    let http = http_config(
        http_endpoint,
        metrics_address,
        metrics_path,
        leader_election.enabled,
    );
    let balance = if balances(&source, leader_election.enabled) {
        Some(hub::BalanceConfig {
            namespace: leader::resolve_namespace(leader_election.namespace.as_deref()),
            identity: leader::default_identity().map_err(Error::Identity)?,
            lease_duration: leader_election.lease_duration,
            retry_period: leader_election.retry_period,
        })
    } else {
        None
    };
    Ok(hub::Config {
        kubeconfig,
        api_cap: start.hub_api_cap,
        resync,
        http,
        drivers: start.drivers,
        discovered: start.discovered,
        source,
        balance,
        max_grpc_log_length,
    })
}

/// Drivers found on the node (`--driver-sockets`, `--kubelet-registration-dir`), each with the
/// flags' settings; `None` when neither flag is given. The glob is checked here, before
/// anything starts.
fn discovery(
    pattern: Option<String>,
    registration_dir: Option<PathBuf>,
    defaults: &config::Defaults,
) -> Result<Option<hub::Discovery>, Error> {
    if pattern.is_none() && registration_dir.is_none() {
        return Ok(None);
    }
    if let Some(pattern) = &pattern {
        glob::Pattern::new(pattern).map_err(|e| Error::Glob {
            pattern: pattern.clone(),
            message: e.to_string(),
        })?;
    }
    let d = defaults.clone();
    Ok(Some(hub::Discovery {
        pattern,
        registration_dir,
        settings_for: Arc::new(move |address| d.settings_for(address)),
    }))
}

/// The drivers at start-up (with the process-wide API cap) and how the list changes at run
/// time: hub mode reads and checks `--config` before anything else starts, discovery alone
/// starts empty, sidecar mode serves the one driver at `--csi-address`.
fn driver_source(
    file: Option<PathBuf>,
    discovery: Option<hub::Discovery>,
    csi_address: &str,
    defaults: &config::Defaults,
) -> Result<(config::Config, hub::Source), Error> {
    let flags_only = |drivers: Vec<config::Settings>| config::Config {
        drivers,
        discovered: Vec::new(),
        hub_api_cap: defaults.hub_api_cap(),
    };
    match (file, discovery) {
        (Some(path), discover) => {
            let with_discovery = discover.is_some();
            let start = config::load(&path, defaults, with_discovery)?;
            let d = defaults.clone();
            let load: hub::Loader = Arc::new(move |p: &std::path::Path| {
                config::load(p, &d, with_discovery).map_err(|e| e.to_string())
            });
            let source = hub::Source::File {
                path,
                load,
                discover,
            };
            Ok((start, source))
        }
        (None, Some(d)) => Ok((flags_only(Vec::new()), hub::Source::Discover(d))),
        (None, None) => {
            let address = csi_address.parse::<Address>()?;
            let driver = defaults.settings_for(address);
            Ok((flags_only(vec![driver]), hub::Source::Fixed))
        }
    }
}

/// The diagnostics listener: `--http-endpoint` (with the leader-election health check when
/// leader election is on), else the deprecated `--metrics-address` (metrics only), else none.
fn http_config(
    http_endpoint: Option<String>,
    metrics_address: Option<String>,
    metrics_path: String,
    leader_election: bool,
) -> Option<hub::HttpConfig> {
    let (address, leader_election_health) = match (http_endpoint, metrics_address) {
        (Some(address), _) => (address, leader_election),
        (None, Some(address)) => (address, false),
        (None, None) => return None,
    };
    Some(hub::HttpConfig {
        address,
        metrics_path,
        leader_election_health,
    })
}

/// Whether replicas share the drivers' Leases: in hub mode (a file or discovery) with leader
/// election; one fixed driver has nothing to share.
fn balances(source: &hub::Source, leader_election: bool) -> bool {
    leader_election && !matches!(source, hub::Source::Fixed)
}

/// What a stop may take beyond the drain timeout: each driver's Lease release
/// ([`leader::elector::RELEASE_TIMEOUT`], the drivers release in parallel), then the replica's
/// presence Lease ([`leader::balance::REMOVE_TIMEOUT`]), plus a second for the rest.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(
    leader::elector::RELEASE_TIMEOUT.as_secs() + leader::balance::REMOVE_TIMEOUT.as_secs() + 1,
);

/// How long the runtime may wait for blocking tasks (a DNS lookup of the API server, a file
/// read) once `run` has returned.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// Cancels the returned token on the first SIGTERM or SIGINT; exits the process with code 1 on
/// the second, or when the stop has taken longer than `bound` (the drain timeout plus
/// [`SHUTDOWN_SLACK`]): whatever the API server or a driver does, a stop ends in time, before the
/// kubelet's SIGKILL.
pub fn shutdown_on_signal(bound: Duration) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    // Detached on purpose: it lives as long as the process and ends it on a second signal.
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(bound = ?bound, "received a termination signal; stopping (a second signal exits at once)");
        t.cancel();
        tokio::select! {
            () = wait_for_signal() => {
                tracing::warn!("second termination signal; exiting now");
            }
            () = tokio::time::sleep(bound) => {
                tracing::error!(bound = ?bound, "the stop did not finish in time (drain timeout plus Lease releases); exiting now");
            }
        }
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

/// The `attacher-hub` process: with a first argument `status`, the `status` subcommand;
/// otherwise parse the command line, set up logging and run the hub. Returns the exit code: 0,
/// 1 for a fatal error, 2 for bad input (a flag, the driver file, the glob).
pub fn main() -> std::process::ExitCode {
    // Before the sidecar's Go-style flag parser, for which `status` would be
    // a positional argument that ends flag parsing.
    if std::env::args_os().nth(1).is_some_and(|a| a == "status") {
        return crate::status::main(std::env::args_os().skip(2));
    }
    let (args, warnings) = crate::cli::parse_env_or_exit();
    crate::telemetry::init_with_verbosity(args.logging.format, args.logging.verbosity);
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        version = crate::cli::VERSION,
        revision = crate::cli::REVISION,
        "Version"
    );
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(error) => {
            eprintln!("attacher-hub: starting the async runtime failed: {error}");
            return std::process::ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(args));
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            let code = error.exit_code();
            if code == 2 {
                // Bad input: one plain line, like a flag error.
                eprintln!("attacher-hub: {}", error_chain(&error));
            } else {
                tracing::error!(error = %error_chain(&error), "fatal");
            }
            std::process::ExitCode::from(code)
        }
    }
}

/// Runs the process: builds the configuration and runs the hub until a
/// signal arrives.
pub async fn run(args: Args) -> Result<(), Error> {
    let bound = args.graceful_shutdown_timeout + SHUTDOWN_SLACK;
    let config = hub_config(args)?;
    let shutdown = shutdown_on_signal(bound);
    hub::run(config, prometheus::Registry::new(), shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Parsed, parse_from};

    fn args(list: &[&str]) -> Args {
        let argv = std::iter::once("attacher-hub")
            .chain(list.iter().copied())
            .map(str::to_owned);
        match parse_from(argv) {
            Ok(Parsed::Run(args, _)) => *args,
            other => panic!("{list:?}: {other:?}"),
        }
    }

    #[test]
    fn sidecar_mode_serves_one_fixed_driver_and_health_only_on_the_http_endpoint() {
        let c = hub_config(args(&[
            "--csi-address=/run/csi/socket",
            "--http-endpoint=:8080",
            "--leader-election",
        ]))
        .expect("valid");
        assert!(matches!(c.source, hub::Source::Fixed));
        assert_eq!(c.drivers.len(), 1);
        assert_eq!(c.drivers[0].address.to_string(), "unix:///run/csi/socket");
        assert!(c.drivers[0].leader_election.is_some());
        assert!(c.balance.is_none(), "one driver: nothing to balance");
        let http = c.http.expect("a listener");
        assert_eq!(
            (http.address.as_str(), http.leader_election_health),
            (":8080", true)
        );
        // The deprecated metrics address serves metrics only.
        let c = hub_config(args(&["--metrics-address=:9090", "--leader-election"])).expect("valid");
        let http = c.http.expect("a listener");
        assert_eq!(
            (http.address.as_str(), http.leader_election_health),
            (":9090", false)
        );
        assert!(hub_config(args(&[])).expect("valid").http.is_none());
    }

    #[test]
    fn hub_mode_reads_the_file_and_balances_with_leader_election() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("drivers.yaml");
        std::fs::write(
            &file,
            "drivers:\n  - address: /csi/a.sock\n  - address: /csi/b.sock\n",
        )
        .expect("write");
        let config = format!("--config={}", file.display());
        let c = hub_config(args(&[&config, "--leader-election"])).expect("valid");
        assert_eq!(c.drivers.len(), 2);
        assert!(matches!(c.source, hub::Source::File { .. }));
        assert!(c.balance.is_some());
        let c = hub_config(args(&[&config])).expect("valid");
        assert!(c.balance.is_none());
    }

    #[test]
    fn the_http_endpoint_wins_over_the_metrics_address_and_alone_serves_leader_health() {
        let http = |endpoint: Option<&str>, metrics: Option<&str>, le: bool| {
            http_config(
                endpoint.map(str::to_owned),
                metrics.map(str::to_owned),
                "/m".to_owned(),
                le,
            )
            .map(|h| (h.address, h.metrics_path, h.leader_election_health))
        };
        let served =
            |address: &str, health: bool| Some((address.to_owned(), "/m".to_owned(), health));
        assert_eq!(http(Some(":1"), Some(":2"), true), served(":1", true));
        assert_eq!(http(Some(":1"), None, false), served(":1", false));
        assert_eq!(http(None, Some(":2"), true), served(":2", false));
        assert_eq!(http(None, None, true), None);
    }

    #[test]
    fn only_a_file_or_discovery_with_leader_election_balances() {
        let discover = || hub::Discovery {
            pattern: None,
            registration_dir: None,
            settings_for: Arc::new(|_: Address| -> config::Settings { unreachable!() }),
        };
        assert!(balances(&hub::Source::Discover(discover()), true));
        assert!(!balances(&hub::Source::Discover(discover()), false));
        assert!(!balances(&hub::Source::Fixed, true));
        assert!(!balances(&hub::Source::Fixed, false));
    }

    #[test]
    fn discovery_alone_starts_with_no_driver_and_the_flags_api_cap() {
        let args = args(&["--driver-sockets=/csi/*.sock", "--hub-kube-api-qps=7"]);
        let defaults = config::Defaults::from_args(&args).expect("defaults");
        let found = discovery(args.driver_sockets.clone(), None, &defaults).expect("valid glob");
        let (start, source) = driver_source(None, found, "/unused", &defaults).expect("valid");
        assert!(
            matches!(source, hub::Source::Discover(d) if d.pattern.as_deref() == Some("/csi/*.sock"))
        );
        assert!(start.drivers.is_empty() && start.discovered.is_empty());
        assert_eq!(start.hub_api_cap, defaults.hub_api_cap());
        // Neither flag: no discovery, so the one driver of the command line.
        assert!(
            discovery(None, None, &defaults)
                .expect("nothing to check")
                .is_none()
        );
    }

    #[test]
    fn bad_input_is_exit_code_2_and_a_bad_socket_exit_code_1() {
        let e = hub_config(args(&["--config=/nonexistent/drivers.yaml"])).expect_err("no file");
        assert_eq!(e.exit_code(), 2);
        assert!(error_chain(&e).contains("/nonexistent/drivers.yaml"), "{e}");
        let e = hub_config(args(&["--driver-sockets=/csi/[*.sock"])).expect_err("bad glob");
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string()
                .starts_with("invalid value \"/csi/[*.sock\" for flag -driver-sockets")
        );
        let e = hub_config(args(&["--csi-address=tcp://h:1"])).expect_err("not a socket");
        assert_eq!(e.exit_code(), 1);
    }
}
