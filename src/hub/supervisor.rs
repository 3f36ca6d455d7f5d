//! The supervisor: starts, stops and restarts drivers as the driver list changes (the file
//! re-read on SIGHUP or when its content changes, discovered sockets); drivers whose settings
//! did not change are left alone. Each driver runs `supervised`: a panic in it is logged,
//! counted, and the driver started again.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    context::Context,
    discovery::{self, Discovery, Found},
    driver::{Driver, Origin, State, panic_guard::guarded},
};
use crate::config::{self, NamedSettings, Settings};

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

    /// Runs until `shutdown`: `initial` are the drivers at start-up, `named` the settings of
    /// discovered drivers by name.
    pub(crate) async fn run(
        mut self,
        initial: Vec<Settings>,
        named: Vec<NamedSettings>,
        shutdown: CancellationToken,
    ) {
        let mut configured = initial;
        let mut named = named;
        let mut file_digest = match &self.source {
            Source::File { path, .. } => digest(path),
            _ => None,
        };
        let discovery = discovery_of(&self.source);
        let mut memory = discovery::Memory::default();
        let mut found = match &discovery {
            Some(d) => self.scan(d, &mut memory).await,
            None => Vec::new(),
        };
        let mut discovered = resolve(discovery.as_ref(), &named, &found);
        self.apply(&configured, &discovered).await;
        self.hub.first_reconcile.cancel();

        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(SOURCE_POLL_INTERVAL);
        loop {
            let forced = tokio::select! {
                () = shutdown.cancelled() => break,
                () = hangup_or_pending(hangup.as_mut()) => true,
                _ = tick.tick() => false,
            };
            // The running set changes only when the list does: an idle tick costs a read of
            // the file and a scan, not a comparison of every driver's settings.
            let mut changed = false;
            if let Some(config) = self.reload(forced, &mut file_digest) {
                configured = config.drivers;
                named = config.discovered;
                changed = true;
            }
            if let Some(d) = &discovery {
                let now = self.scan(d, &mut memory).await;
                if now != found {
                    found = now;
                    changed = true;
                }
            }
            if changed {
                discovered = resolve(discovery.as_ref(), &named, &found);
                self.apply(&configured, &discovered).await;
            }
        }

        tracing::info!("shutting down: draining drivers and releasing leases");
        let all: Vec<PathBuf> = self.running.keys().cloned().collect();
        self.stop(all).await;
    }

    /// Re-reads the driver file, if the list comes from one, when `forced` (SIGHUP) or when its
    /// content no longer matches `file_digest` (which follows it). Returns the new list if it
    /// is valid (its API cap applied at once); an invalid one is logged, shown in `/drivers`,
    /// and changes nothing.
    fn reload(&self, forced: bool, file_digest: &mut Option<u64>) -> Option<config::Config> {
        let Source::File { path, load, .. } = &self.source else {
            return None;
        };
        let now = digest(path);
        if !reread(forced, *file_digest, now) {
            return None;
        }
        *file_digest = now;
        tracing::info!(path = %path.display(), signal = forced, "re-reading the driver file");
        match load(path) {
            Ok(config) => {
                self.hub.shared.api_cap.set_limit(config.hub_api_cap);
                self.hub.config.reloaded();
                Some(config)
            }
            Err(error) => {
                tracing::error!(%error, "the new driver file is invalid; keeping the running configuration");
                self.hub.config.rejected(&error);
                None
            }
        }
    }

    /// Scans for driver sockets; records the ones not served for `/drivers` and returns the
    /// others. Discovered drivers trying to connect again have their sockets checked for
    /// staleness.
    async fn scan(&self, discovery: &Discovery, memory: &mut discovery::Memory) -> Vec<Found> {
        let reconnecting: HashSet<PathBuf> = self
            .running
            .iter()
            .filter(|(_, r)| {
                r.origin == Origin::Discovered && r.driver.state() == State::Connecting
            })
            .map(|(path, _)| path.clone())
            .collect();
        let scan = discovery.scan(memory, &reconnecting).await;
        *self.hub.unserved.lock() = scan.unserved;
        scan.serve
    }

    /// Stops the drivers at `paths`, all at once (each drains its work and vacates its Lease),
    /// waits for them, and removes their slots.
    async fn stop(&mut self, paths: Vec<PathBuf>) {
        let stopping: Vec<Running> = paths
            .iter()
            .filter_map(|path| self.running.remove(path))
            .collect();
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
        let plan = plan(
            self.running
                .iter()
                .map(|(path, r)| (path, &r.settings, r.origin)),
            configured,
            discovered,
        );
        // Stop what is gone or changed, all at once, then wait for them.
        for path in &plan.stop {
            if let Some(r) = self.running.get(path) {
                log_stopping(r);
            }
        }
        self.stop(plan.stop).await;
        // Start what is new (or changed).
        for (path, settings, origin) in plan.start {
            self.start(path, settings, origin);
        }
    }

    /// Starts the driver of `settings` at `path` in a slot of its own.
    fn start(&mut self, path: PathBuf, settings: Settings, origin: Origin) {
        match &settings.expected_name {
            Some(name) => {
                tracing::info!(driver = %name, socket = %settings.address, ?origin, "starting driver")
            }
            None => tracing::info!(socket = %settings.address, ?origin, "starting driver"),
        }
        let driver = Driver::new(settings.clone(), origin);
        self.hub.registry.add_slot(driver.clone());
        let stop = CancellationToken::new();
        // Every line of the driver's life names it: by its configured name, or by the name
        // it reports once connected (recorded into this span), and by its socket until
        // then.
        let span = match &settings.expected_name {
            Some(name) => {
                tracing::info_span!("driver", driver = %name, socket = %settings.address)
            }
            None => {
                tracing::info_span!("driver", driver = tracing::field::Empty, socket = %settings.address)
            }
        };
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

/// Logs that the running driver `r` is stopped because the list no longer has it as it runs.
fn log_stopping(r: &Running) {
    match r.driver.name().or_else(|| r.settings.expected_name.clone()) {
        Some(name) => {
            tracing::info!(driver = %name, socket = %r.settings.address, "stopping driver (removed or changed)")
        }
        None => {
            tracing::info!(socket = %r.settings.address, "stopping driver (removed or changed)")
        }
    }
}

/// What [`Supervisor::apply`] does to the running set.
#[derive(Debug, PartialEq)]
struct Plan {
    /// The slots to stop (their driver is gone from the list, or its settings or origin
    /// changed), by socket path.
    stop: Vec<PathBuf>,
    /// The drivers to start once those are stopped (new, or changed), by socket path.
    start: Vec<(PathBuf, Settings, Origin)>,
}

/// How the `running` slots (socket path, settings, origin) become `configured` plus the
/// `discovered` sockets that are not configured (a socket both configured and discovered runs
/// as configured). A slot whose settings and origin stay is left alone. Both lists are sorted
/// by path.
fn plan<'a>(
    running: impl IntoIterator<Item = (&'a PathBuf, &'a Settings, Origin)>,
    configured: &[Settings],
    discovered: &[Settings],
) -> Plan {
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
    let mut kept = HashSet::new();
    let mut stop = Vec::new();
    for (path, settings, origin) in running {
        match wanted.get(path) {
            Some((s, o)) if s == settings && *o == origin => {
                kept.insert(path.clone());
            }
            _ => stop.push(path.clone()),
        }
    }
    stop.sort();
    let mut start: Vec<(PathBuf, Settings, Origin)> = wanted
        .into_iter()
        .filter(|(path, _)| !kept.contains(path))
        .map(|(path, (s, o))| (path, s, o))
        .collect();
    start.sort_by(|a, b| a.0.cmp(&b.0));
    Plan { stop, start }
}

/// The settings of each discovered driver: those `drivers.yaml` gives its name, else the
/// flags'; either way it must keep reporting the name it was found with.
fn resolve(
    discovery: Option<&Discovery>,
    named: &[NamedSettings],
    found: &[Found],
) -> Vec<Settings> {
    let Some(discovery) = discovery else {
        return Vec::new();
    };
    found
        .iter()
        .map(|f| match named.iter().find(|n| n.name() == f.name) {
            Some(n) => n.at(f.address.clone()),
            None => {
                let mut s = (discovery.settings_for)(f.address.clone());
                s.expected_name = Some(f.name.clone());
                s
            }
        })
        .collect()
}

/// Where `source` discovers drivers, if it does.
fn discovery_of(source: &Source) -> Option<Discovery> {
    match source {
        Source::File { discover, .. } => discover.clone(),
        Source::Discover(d) => Some(d.clone()),
        Source::Fixed => None,
    }
}

/// Whether the driver file is read again: on SIGHUP (`forced`), or when its fingerprint `now`
/// differs from the one read `before` (it became readable or unreadable too).
fn reread(forced: bool, before: Option<u64>, now: Option<u64>) -> bool {
    forced || now != before
}

/// The next SIGHUP of `hangup`; never, without one.
async fn hangup_or_pending(hangup: Option<&mut tokio::signal::unix::Signal>) {
    match hangup {
        Some(h) => {
            h.recv().await;
        }
        None => std::future::pending::<()>().await,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use crate::config::Defaults;
    use crate::fake_api::FakeApi;
    use crate::hub::context::tests::context;
    use crate::k8s::stores::TestStores;

    /// The settings the flags give a socket (nobody listens there: its driver keeps trying to
    /// connect until it is stopped).
    fn settings(dir: &Path, socket: &str) -> Settings {
        let defaults = Defaults::with_identity(&Args::default(), "test-host".into());
        let path = dir.join(socket);
        defaults.settings_for(path.to_str().expect("UTF-8 path").parse().expect("a path"))
    }

    /// A supervisor of a fixed list, its sockets in a fresh directory, its caches.
    fn fixed() -> (tempfile::TempDir, TestStores, Supervisor) {
        let dir = tempfile::tempdir().expect("tempdir");
        let caches = TestStores::new();
        let hub = context(&FakeApi::default(), caches.stores.clone());
        (dir, caches, Supervisor::new(hub, Source::Fixed))
    }

    /// The running drivers, by socket file name.
    fn slots(sup: &Supervisor) -> HashMap<String, Arc<Driver>> {
        sup.hub
            .registry
            .slots()
            .into_iter()
            .map(|d| {
                let file = d.settings().address.path().file_name().expect("a file");
                (file.to_string_lossy().into_owned(), d)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_new_driver_list_restarts_what_changed_starts_what_is_new_and_stops_what_is_gone() {
        let (dir, _caches, mut sup) = fixed();
        let (a, b, c) = (
            settings(dir.path(), "a.sock"),
            settings(dir.path(), "b.sock"),
            settings(dir.path(), "c.sock"),
        );
        sup.apply(&[a.clone(), b.clone()], &[]).await;
        let first = slots(&sup);
        assert_eq!(first.len(), 2);
        assert!(first.values().all(|d| d.state() == State::Connecting));

        // a changes, b stays, c is new.
        let mut a2 = a.clone();
        a2.timeout = Duration::from_secs(7);
        sup.apply(&[a2.clone(), b.clone(), c.clone()], &[]).await;
        let second = slots(&sup);
        assert_eq!(second.len(), 3);
        assert!(
            !Arc::ptr_eq(&first["a.sock"], &second["a.sock"]),
            "restarted"
        );
        assert_eq!(first["a.sock"].state(), State::Stopped);
        assert_eq!(second["a.sock"].settings().timeout, Duration::from_secs(7));
        assert!(
            Arc::ptr_eq(&first["b.sock"], &second["b.sock"]),
            "untouched"
        );
        assert_eq!(second["b.sock"].state(), State::Connecting);

        // b is gone; the same list again changes nothing.
        sup.apply(&[a2.clone(), c.clone()], &[]).await;
        let third = slots(&sup);
        assert_eq!(third.len(), 2);
        assert_eq!(second["b.sock"].state(), State::Stopped);
        sup.apply(&[a2.clone(), c.clone()], &[]).await;
        let fourth = slots(&sup);
        assert!(
            ["a.sock", "c.sock"]
                .iter()
                .all(|s| Arc::ptr_eq(&third[*s], &fourth[*s]))
        );

        let all: Vec<PathBuf> = sup.running.keys().cloned().collect();
        sup.stop(all).await;
        assert!(sup.hub.registry.slots().is_empty());
        assert!(fourth.values().all(|d| d.state() == State::Stopped));
    }

    #[tokio::test]
    async fn a_configured_socket_wins_over_the_same_socket_discovered() {
        let (dir, _caches, mut sup) = fixed();
        let (a, d) = (
            settings(dir.path(), "a.sock"),
            settings(dir.path(), "d.sock"),
        );
        sup.apply(std::slice::from_ref(&a), &[a.clone(), d.clone()])
            .await;
        assert_eq!(sup.running.len(), 2);
        let origin = |sup: &Supervisor, s: &Settings| sup.running[s.address.path()].origin;
        assert_eq!(origin(&sup, &a), Origin::Configured);
        assert_eq!(origin(&sup, &d), Origin::Discovered);
        // Configured later, the discovered socket restarts as a configured driver.
        let discovered = slots(&sup)["d.sock"].clone();
        sup.apply(&[a.clone(), d.clone()], std::slice::from_ref(&d))
            .await;
        assert_eq!(origin(&sup, &d), Origin::Configured);
        assert_eq!(discovered.state(), State::Stopped);
        let all: Vec<PathBuf> = sup.running.keys().cloned().collect();
        sup.stop(all).await;
    }

    /// The running slots as [`plan`] takes them.
    fn slots_of(running: &[(PathBuf, Settings, Origin)]) -> Vec<(&PathBuf, &Settings, Origin)> {
        running.iter().map(|(p, s, o)| (p, s, *o)).collect()
    }

    fn path(s: &Settings) -> PathBuf {
        s.address.path().to_path_buf()
    }

    /// A changed driver is stopped and started again, a new one started, a gone one stopped, an
    /// unchanged one left alone; both lists come sorted by socket path.
    #[test]
    fn the_plan_stops_what_is_gone_or_changed_and_starts_what_is_new_or_changed() {
        let dir = Path::new("/plan");
        let (a, b, c, d) = (
            settings(dir, "a.sock"),
            settings(dir, "b.sock"),
            settings(dir, "c.sock"),
            settings(dir, "d.sock"),
        );
        let mut a2 = a.clone();
        a2.timeout = Duration::from_secs(7);
        let running = [
            (path(&d), d.clone(), Origin::Configured),
            (path(&b), b.clone(), Origin::Configured),
            (path(&a), a.clone(), Origin::Configured),
        ];
        let got = plan(slots_of(&running), &[c.clone(), b.clone(), a2.clone()], &[]);
        assert_eq!(got.stop, [path(&a), path(&d)]);
        assert_eq!(
            got.start,
            [
                (path(&a), a2, Origin::Configured),
                (path(&c), c.clone(), Origin::Configured),
            ]
        );
        // The same list again changes nothing.
        let running = [
            (path(&b), b.clone(), Origin::Configured),
            (path(&c), c.clone(), Origin::Configured),
        ];
        let same = plan(slots_of(&running), &[b, c], &[]);
        assert_eq!(
            same,
            Plan {
                stop: Vec::new(),
                start: Vec::new()
            }
        );
    }

    /// A socket both configured and discovered runs as configured; one that was discovered
    /// and is configured now starts again as configured, and the other way round.
    #[test]
    fn the_plan_runs_a_socket_configured_and_discovered_as_configured() {
        let dir = Path::new("/plan");
        let (a, d) = (settings(dir, "a.sock"), settings(dir, "d.sock"));
        let fresh = plan(
            slots_of(&[]),
            std::slice::from_ref(&a),
            &[a.clone(), d.clone()],
        );
        assert!(fresh.stop.is_empty());
        assert_eq!(
            fresh.start,
            [
                (path(&a), a.clone(), Origin::Configured),
                (path(&d), d.clone(), Origin::Discovered),
            ]
        );
        let running = [
            (path(&a), a.clone(), Origin::Configured),
            (path(&d), d.clone(), Origin::Discovered),
        ];
        let configured = plan(
            slots_of(&running),
            &[a.clone(), d.clone()],
            std::slice::from_ref(&d),
        );
        assert_eq!(configured.stop, [path(&d)]);
        assert_eq!(
            configured.start,
            [(path(&d), d.clone(), Origin::Configured)]
        );
        let running = [
            (path(&a), a.clone(), Origin::Configured),
            (path(&d), d.clone(), Origin::Configured),
        ];
        let discovered = plan(
            slots_of(&running),
            std::slice::from_ref(&a),
            std::slice::from_ref(&d),
        );
        assert_eq!(discovered.stop, [path(&d)]);
        assert_eq!(discovered.start, [(path(&d), d, Origin::Discovered)]);
    }

    #[test]
    fn the_driver_file_is_read_again_on_sighup_or_when_its_content_changes() {
        assert!(!reread(false, Some(1), Some(1)));
        assert!(reread(true, Some(1), Some(1)), "SIGHUP");
        assert!(reread(false, Some(1), Some(2)));
        assert!(reread(false, Some(1), None), "it became unreadable");
        assert!(reread(false, None, Some(1)), "it became readable");
        assert!(!reread(false, None, None));
    }

    #[test]
    fn only_a_file_with_a_glob_and_a_glob_alone_discover_drivers() {
        let discovery = Discovery {
            pattern: Some("/plugins/*/csi.sock".into()),
            registration_dir: None,
            settings_for: Arc::new(|_| unreachable!("not asked")),
        };
        let file = |discover| Source::File {
            path: "/etc/drivers.yaml".into(),
            load: Arc::new(|_| Err(String::new())),
            discover,
        };
        let pattern = |s: &Source| discovery_of(s).and_then(|d| d.pattern);
        assert_eq!(pattern(&Source::Fixed), None);
        assert_eq!(pattern(&file(None)), None);
        assert_eq!(
            pattern(&file(Some(discovery.clone()))).as_deref(),
            Some("/plugins/*/csi.sock")
        );
        assert_eq!(
            pattern(&Source::Discover(discovery)).as_deref(),
            Some("/plugins/*/csi.sock")
        );
    }

    /// A discovered driver gets the settings `drivers.yaml` gives its name (its Lease namespace
    /// among them), else the flags'; either way it must keep reporting that name.
    #[test]
    fn a_discovered_driver_takes_the_settings_of_its_name() {
        let mut args = Args::default();
        args.leader_election.enabled = true;
        let defaults = Defaults::with_identity(&args, "test-host".into());
        let d = defaults.clone();
        let discovery = Discovery {
            pattern: Some("/plugins/*/csi.sock".into()),
            registration_dir: None,
            settings_for: Arc::new(move |a| d.settings_for(a)),
        };
        let named = crate::config::parse(
            "drivers:\n- name: pd.csi.storage.gke.io\n  leaderElection: {namespace: kube-system}\n",
            "drivers.yaml",
            &defaults,
            true,
        )
        .expect("valid")
        .discovered;
        let found = |socket: &str, name: &str| Found {
            address: socket.parse().expect("a path"),
            name: name.into(),
        };
        let got = resolve(
            Some(&discovery),
            &named,
            &[
                found("/plugins/pd/csi.sock", "pd.csi.storage.gke.io"),
                found("/plugins/nfs/csi.sock", "nfs.csi.example.com"),
            ],
        );
        let lease_ns = |s: &Settings| s.leader_election.as_ref().map(|le| le.namespace.clone());
        assert_eq!(got[0].address.to_string(), "unix:///plugins/pd/csi.sock");
        assert_eq!(
            got[0].expected_name.as_deref(),
            Some("pd.csi.storage.gke.io")
        );
        assert_eq!(lease_ns(&got[0]).as_deref(), Some("kube-system"));
        assert_eq!(got[1].expected_name.as_deref(), Some("nfs.csi.example.com"));
        assert_eq!(
            lease_ns(&got[1]),
            Some(crate::leader::resolve_namespace(None))
        );
        assert!(resolve(None, &named, &[]).is_empty());
    }

    /// The driver file is re-read when its content changes: a valid new list is applied, an
    /// invalid one is refused and the running drivers are kept.
    #[tokio::test(start_paused = true)]
    async fn a_changed_driver_file_is_applied_and_an_invalid_one_keeps_the_running_drivers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("drivers.yaml");
        let entry = |socket: &str| format!("  - address: {}\n", dir.path().join(socket).display());
        std::fs::write(&file, format!("drivers:\n{}", entry("a.sock"))).expect("write");
        let defaults = Defaults::with_identity(&Args::default(), "test-host".into());
        let load: Loader = Arc::new(move |p: &Path| {
            crate::config::load(p, &defaults, false).map_err(|e| e.to_string())
        });
        let initial = load(&file).expect("valid").drivers;
        let caches = TestStores::new();
        let hub = context(&FakeApi::default(), caches.stores.clone());
        let source = Source::File {
            path: file.clone(),
            load,
            discover: None,
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(Supervisor::new(hub.clone(), source).run(
            initial,
            Vec::new(),
            shutdown.clone(),
        ));
        let sockets = || {
            let mut names: Vec<String> = hub
                .registry
                .slots()
                .iter()
                .map(|d| d.settings().address.to_string())
                .collect();
            names.sort();
            names
        };
        tokio::time::sleep(SOURCE_POLL_INTERVAL).await;
        assert_eq!(sockets().len(), 1);
        assert!(hub.first_reconcile.is_cancelled());

        std::fs::write(
            &file,
            format!("drivers:\n{}{}", entry("a.sock"), entry("b.sock")),
        )
        .expect("write");
        tokio::time::sleep(SOURCE_POLL_INTERVAL * 2).await;
        let two = sockets();
        assert_eq!(two.len(), 2, "{two:?}");

        std::fs::write(&file, "drivers: [").expect("write");
        tokio::time::sleep(SOURCE_POLL_INTERVAL * 2).await;
        assert_eq!(sockets(), two, "an invalid file changes nothing");

        shutdown.cancel();
        task.await.expect("the supervisor ends");
        assert!(sockets().is_empty());
    }
}
