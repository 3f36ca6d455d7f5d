//! [`Supervisor`]: starts, stops and restarts drivers as the driver list changes (the file
//! re-read on SIGHUP or when its content changes, discovered sockets); drivers whose settings
//! did not change are left alone. Each driver runs [`supervised`]: a panic in it is logged,
//! counted, and the driver started again.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    context::Context,
    discovery::Discovery,
    driver::{Driver, Origin, guard::guarded},
};
use crate::config::{self, Settings};

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
pub(crate) struct Supervisor {
    hub: Arc<Context>,
    source: Source,
    running: HashMap<PathBuf, Running>,
}

impl Supervisor {
    pub(crate) fn new(hub: Arc<Context>, source: Source) -> Self {
        Self {
            hub,
            source,
            running: HashMap::new(),
        }
    }

    pub(crate) async fn run(mut self, initial: Vec<Settings>, shutdown: CancellationToken) {
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
        self.hub.first_reconcile.cancel();

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
                            self.hub.shared.api_cap.set_limit(config.hub_api_cap);
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
            self.hub.registry.remove_slot(&r.driver);
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
            self.hub.registry.remove_slot(&r.driver);
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
            self.hub.registry.add_slot(driver.clone());
            let stop = CancellationToken::new();
            let span = tracing::info_span!("driver", socket = %settings.address);
            let task = tokio::spawn(
                supervised(driver.clone(), self.hub.clone(), stop.clone()).instrument(span),
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

/// Runs a driver; a panic in it is logged and counted, and the driver is
/// started again after a pause. The other drivers never notice.
async fn supervised(driver: Arc<Driver>, hub: Arc<Context>, stop: CancellationToken) {
    const RESTART_AFTER_PANIC: Duration = Duration::from_secs(5);
    loop {
        match guarded(driver.clone().run(hub.shared.clone(), stop.clone())).await {
            Ok(()) => return,
            Err(panic) => {
                let name = driver.name().unwrap_or_default();
                tracing::error!(driver = %name, %panic, "the driver's task panicked; restarting it");
                hub.shared.metrics.count_panic(&name, "driver");
                if let Some(n) = driver.name() {
                    hub.registry.unregister(&n, &driver);
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RESTART_AFTER_PANIC) => {}
                }
            }
        }
    }
}
