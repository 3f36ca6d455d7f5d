//! [`Discovery`]: driver sockets found by a glob (`--driver-sockets`) and through the kubelet's
//! plugin registration directory (`--kubelet-registration-dir`).
//!
//! Every socket found is asked who it is before it is served: a connection, GetPluginInfo,
//! GetPluginCapabilities and ControllerGetCapabilities, once per socket file (a driver that
//! starts again makes a new file). Only a driver that answers all of them with a controller
//! service is served, under the name it reported (so that an entry of `drivers.yaml` for that
//! name gives it its settings, its Lease namespace among them, before it ever touches its
//! Lease). The others are recorded, not served: nothing is written to the API server for them,
//! and they show in `/drivers` with the reason:
//!
//! - a *stale socket*: the file exists but nothing listens on it (connecting is refused), as a
//!   driver that exited without removing its socket leaves it; served as soon as a driver
//!   listens there again (a refused connection costs nothing, so it is tried at every scan);
//! - *no controller service*: a node plugin. Either it does not offer the CONTROLLER_SERVICE
//!   plugin capability, or it offers it but answers ControllerGetCapabilities with
//!   `Unimplemented`, as node plugins built from one binary for both roles do (the GCE PD
//!   driver's identity service always offers it, and its node-only deployment registers no
//!   controller service);
//! - *unreachable*: any other failure (the socket may not be opened by this process, the driver
//!   does not answer); asked again at every scan.
//!
//! A served socket whose driver lost its connection is checked again at every scan: when its
//! socket has gone stale, its driver is stopped and the socket recorded as stale.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::{
    config::Settings,
    csi::{self, Address, CallMetrics, Connection, DriverClient, probe::INFO_TIMEOUT},
};

/// Longest a probe of one socket may take (a connection and four calls of at most
/// [`INFO_TIMEOUT`] each, against a driver that accepts the connection but never answers).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// A discovered socket to serve, and the driver that answered there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// The driver's socket.
    pub(crate) address: Address,
    /// The name it reported (and registered, if found through the registration directory).
    pub(crate) name: String,
}

/// Why a discovered socket is not served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Unserved {
    /// The file exists, but nothing listens on it.
    StaleSocket {
        /// What it means, and what happens next.
        reason: String,
    },
    /// A node plugin: no controller service to act for.
    NoControllerService {
        /// What the driver answered.
        reason: String,
    },
    /// The socket could not be asked who it is.
    Unreachable {
        /// Why.
        reason: String,
    },
}

impl Unserved {
    fn reason(&self) -> &str {
        match self {
            Self::StaleSocket { reason }
            | Self::NoControllerService { reason }
            | Self::Unreachable { reason } => reason,
        }
    }
}

/// A discovered socket that is not served, as `/drivers` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The socket (a driver's, or a registration socket).
    pub socket: Address,
    /// The driver name, when it told it.
    pub name: Option<String>,
    /// Why it is not served.
    pub why: Unserved,
    /// Since when it has been so.
    pub since: Timestamp,
}

impl Record {
    /// The `/drivers` entry: the fields of a driver's entry that apply.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "socket": self.socket.to_string(),
            "name": self.name,
            "state": self.why,
            "discovered": true,
            "since": self.since.to_string(),
        })
    }
}

/// What a scan found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// The sockets to serve, by path.
    pub(crate) serve: Vec<Found>,
    /// The sockets found but not served, by path.
    pub(crate) unserved: Vec<Record>,
}

/// What discovery remembers between scans, so that a socket file is asked who it is once.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// CSI sockets: the file probed, and what it answered.
    sockets: HashMap<PathBuf, Probed>,
    /// Registration sockets: the file read, and what it registered.
    registrations: HashMap<PathBuf, (FileId, Registration)>,
    /// Registration sockets found unusable (stale, or not answering), and since when.
    bad_registrations: HashMap<PathBuf, (Unserved, Timestamp)>,
    /// (socket, driver name) of the drivers that dropped the connection when asked
    /// ControllerGetCapabilities: never asked again while this process runs, whatever new
    /// socket file a driver of that name makes at that path.
    crashed: HashSet<(PathBuf, String)>,
}

/// A probed CSI socket.
#[derive(Clone, Debug)]
struct Probed {
    file: FileId,
    outcome: Outcome,
    since: Timestamp,
}

/// What a socket answered.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// A controller plugin of this name.
    Serve(String),
    /// Not served (the name, if it told it).
    Unserved(Option<String>, Unserved),
}

/// What a registration socket registered.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Registration {
    /// A CSI plugin: its name and socket.
    Csi { name: String, endpoint: PathBuf },
    /// Another kind of plugin (a device plugin): ignored.
    Other,
    /// A CSI plugin whose endpoint is not a Unix socket path.
    BadEndpoint(String),
}

/// Which file a path is, so that a new socket at the same path (a driver started again) is
/// asked anew: device, inode and change time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId(u64, u64, i64, i64);

impl FileId {
    /// The file at `path` (following links), if it is a socket.
    fn of_socket(path: &Path) -> Option<Self> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = std::fs::metadata(path).ok()?;
        m.file_type()
            .is_socket()
            .then(|| Self(m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
    }
}

/// What probing a socket file does at this scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// Keep what it answered before.
    Keep,
    /// Connect only: refused means stale; otherwise keep what it answered before, or (after a
    /// stale answer) probe it.
    Connect,
    /// Ask it who it is.
    Probe,
}

/// How a socket known from an earlier scan is checked now. `reconnecting`: its driver is
/// served and has lost its connection.
fn check(before: Option<&Probed>, file: FileId, reconnecting: bool) -> Check {
    let Some(before) = before.filter(|b| b.file == file) else {
        return Check::Probe;
    };
    match &before.outcome {
        Outcome::Serve(_) if reconnecting => Check::Connect,
        Outcome::Serve(_) | Outcome::Unserved(_, Unserved::NoControllerService { .. }) => {
            Check::Keep
        }
        Outcome::Unserved(_, Unserved::StaleSocket { .. }) => Check::Connect,
        Outcome::Unserved(_, Unserved::Unreachable { .. }) => Check::Probe,
    }
}

/// The sockets to look at: those registered with the kubelet (with the name each registered),
/// then those matching the glob, each path once (a registration wins over the glob).
fn candidates(
    registered: Vec<(PathBuf, String)>,
    globbed: Vec<PathBuf>,
) -> Vec<(PathBuf, Option<String>)> {
    let mut candidates: Vec<(PathBuf, Option<String>)> = Vec::new();
    let named = registered.into_iter().map(|(p, n)| (p, Some(n)));
    for (path, name) in named.chain(globbed.into_iter().map(|p| (p, None))) {
        if !candidates.iter().any(|(p, _)| *p == path) {
            candidates.push((path, name));
        }
    }
    candidates
}

/// What a [`Check::Connect`] makes of the connection attempt `connected`, `before` being what
/// the socket answered at the last scan: `Some` outcome, or `None` to probe it.
fn after_connect(connected: Result<(), Unserved>, before: Outcome) -> Option<Outcome> {
    match connected {
        Err(why @ Unserved::StaleSocket { .. }) => Some(Outcome::Unserved(None, why)),
        _ if matches!(before, Outcome::Serve(_)) => Some(before),
        _ => None,
    }
}

/// `outcome` judged against the name the socket was `registered` with the kubelet under, if
/// any: a driver reporting another name is not served.
fn against_registration(outcome: Outcome, registered: Option<String>) -> Outcome {
    match (outcome, registered) {
        (Outcome::Serve(name), Some(registered)) if name != registered => Outcome::Unserved(
            Some(name.clone()),
            Unserved::Unreachable {
                reason: format!(
                    "registered with the kubelet as {registered:?}, but the driver at this socket reports {name:?}"
                ),
            },
        ),
        (outcome, _) => outcome,
    }
}

/// The `/drivers` record of the socket at `path` (none if its path is no address).
fn record(path: &Path, name: Option<String>, why: Unserved, since: Timestamp) -> Option<Record> {
    let socket = path.to_string_lossy().parse::<Address>().ok()?;
    Some(Record {
        socket,
        name,
        why,
        since,
    })
}

impl Scan {
    /// Files the socket `address` by what it answered (`outcome`, so since `since`).
    fn file(&mut self, address: Address, outcome: &Outcome, since: Timestamp) {
        match outcome {
            Outcome::Serve(name) => self.serve.push(Found {
                address,
                name: name.clone(),
            }),
            Outcome::Unserved(name, why) => self.unserved.push(Record {
                socket: address,
                name: name.clone(),
                why: why.clone(),
                since,
            }),
        }
    }

    /// Sorts both lists by socket path.
    fn sort(&mut self) {
        self.serve
            .sort_by(|a, b| a.address.path().cmp(b.address.path()));
        self.unserved
            .sort_by(|a, b| a.socket.path().cmp(b.socket.path()));
    }
}

impl Memory {
    /// Since when the socket at `path` has answered `outcome`: `None` when that is new (its
    /// answer changed, or it was not known).
    fn since(&self, path: &Path, outcome: &Outcome) -> Option<Timestamp> {
        self.sockets
            .get(path)
            .filter(|before| before.outcome == *outcome)
            .map(|before| before.since)
    }

    /// Forgets the registration sockets not among `sockets` (path and file) now: a removed
    /// file, or a new file at the path (a plugin registered again), is read anew.
    fn forget_registrations(&mut self, sockets: &[(PathBuf, FileId)]) {
        self.registrations
            .retain(|path, (file, _)| sockets.contains(&(path.clone(), *file)));
        self.bad_registrations
            .retain(|path, _| sockets.iter().any(|(p, _)| p == path));
    }

    /// Remembers what the registration `file` at `socket` registered; whether it had been
    /// found unusable before (it answers again).
    fn registration_read(&mut self, socket: &Path, file: FileId, read: Registration) -> bool {
        let recovered = self.bad_registrations.remove(socket).is_some();
        self.registrations
            .insert(socket.to_path_buf(), (file, read));
        recovered
    }

    /// Remembers that the registration socket at `socket` is unusable for `why` (not as read:
    /// it is asked again at the next scan), found so at `now`. Returns since when it has been
    /// so, and whether that is new (a first failure, or another reason).
    fn registration_failed(
        &mut self,
        socket: &Path,
        why: &Unserved,
        now: Timestamp,
    ) -> (Timestamp, bool) {
        match self.bad_registrations.get(socket) {
            Some((before, since)) if before == why => (*since, false),
            _ => {
                self.bad_registrations
                    .insert(socket.to_path_buf(), (why.clone(), now));
                (now, true)
            }
        }
    }
}

/// What the socket at `path` answers at this scan, by its `check` and what it answered
/// `before`; and whether it dropped the connection when asked ControllerGetCapabilities.
async fn checked(
    path: &Path,
    check: Check,
    before: Option<Outcome>,
    crashed: &HashSet<(PathBuf, String)>,
) -> (Outcome, bool) {
    match (check, before) {
        (Check::Keep, Some(before)) => (before, false),
        (Check::Connect, Some(before)) => match after_connect(connect(path).await, before) {
            Some(outcome) => (outcome, false),
            None => probe(path, crashed).await,
        },
        _ => probe(path, crashed).await,
    }
}

/// The sockets in the registration directory `dir` now, with which file each is.
fn registration_sockets(dir: &Path) -> Vec<(PathBuf, FileId)> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter_map(|p| FileId::of_socket(&p).map(|f| (p, f)))
            .collect(),
        Err(error) => {
            tracing::debug!(dir = %dir.display(), %error, "cannot read the plugin registration directory");
            Vec::new()
        }
    }
}

impl Discovery {
    /// Everything discovered now, each socket sorted by path. `reconnecting`: the served
    /// discovered sockets whose driver is trying to connect again (checked for staleness).
    pub(crate) async fn scan(&self, memory: &mut Memory, reconnecting: &HashSet<PathBuf>) -> Scan {
        let mut scan = Scan::default();
        let registered = self.scan_registrations(memory, &mut scan.unserved).await;
        let candidates = candidates(registered, self.scan_glob());

        // Probe what needs it, all at once (a driver that does not answer delays the others
        // by at most `PROBE_TIMEOUT`).
        let checks: Vec<(PathBuf, Option<String>, FileId, Check)> = candidates
            .into_iter()
            .filter_map(|(path, registered)| {
                let file = FileId::of_socket(&path)?;
                let c = check(
                    memory.sockets.get(&path),
                    file,
                    reconnecting.contains(&path),
                );
                Some((path, registered, file, c))
            })
            .collect();
        let crashed = &memory.crashed;
        let outcomes = futures::future::join_all(checks.iter().map(|(path, _, _, c)| {
            let before = memory.sockets.get(path).map(|p| p.outcome.clone());
            checked(path, *c, before, crashed)
        }))
        .await;

        let mut seen = HashSet::new();
        for ((path, registered, file, _), (outcome, crashed)) in checks.into_iter().zip(outcomes) {
            if let (true, Outcome::Unserved(Some(name), _)) = (crashed, &outcome) {
                memory.crashed.insert((path.clone(), name.clone()));
            }
            let outcome = against_registration(outcome, registered);
            let Ok(address) = path.to_string_lossy().parse::<Address>() else {
                continue;
            };
            let since = memory.since(&path, &outcome).unwrap_or_else(|| {
                log_outcome(&address, &outcome);
                Timestamp::now()
            });
            scan.file(address, &outcome, since);
            seen.insert(path.clone());
            memory.sockets.insert(
                path,
                Probed {
                    file,
                    outcome,
                    since,
                },
            );
        }
        memory.sockets.retain(|path, _| seen.contains(path));
        scan.sort();
        scan
    }

    /// The sockets matching the glob now.
    fn scan_glob(&self) -> Vec<PathBuf> {
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
            .filter(|p| FileId::of_socket(p).is_some())
            .collect()
    }

    /// The CSI plugins registered in the registration directory now: (socket, name). The
    /// registration sockets that cannot be read go to `unserved`.
    async fn scan_registrations(
        &self,
        memory: &mut Memory,
        unserved: &mut Vec<Record>,
    ) -> Vec<(PathBuf, String)> {
        let Some(dir) = &self.registration_dir else {
            return Vec::new();
        };
        let sockets = registration_sockets(dir);
        memory.forget_registrations(&sockets);
        let mut found = Vec::new();
        for (socket, file) in sockets {
            let registration = match registration(memory, &socket, file).await {
                Ok(registration) => registration,
                Err(record) => {
                    unserved.extend(record);
                    continue;
                }
            };
            match registration {
                Registration::Csi { name, endpoint } => found.push((endpoint, name)),
                Registration::Other => {}
                Registration::BadEndpoint(reason) => unserved.extend(record(
                    &socket,
                    None,
                    Unserved::Unreachable { reason },
                    Timestamp::now(),
                )),
            }
        }
        found
    }
}

/// What the registration `file` at `socket` registered: remembered, or read now. Unusable,
/// the `/drivers` record of why (none if its path is no address).
async fn registration(
    memory: &mut Memory,
    socket: &Path,
    file: FileId,
) -> Result<Registration, Option<Record>> {
    if let Some((_, r)) = memory.registrations.get(socket) {
        return Ok(r.clone());
    }
    match read_registration(socket).await {
        Ok(r) => {
            if memory.registration_read(socket, file, r.clone()) {
                tracing::info!(registration = %socket.display(), "the registration socket answers again");
            }
            Ok(r)
        }
        Err(why) => {
            let (since, new) = memory.registration_failed(socket, &why, Timestamp::now());
            if new {
                tracing::info!(registration = %socket.display(), reason = %why.reason(), "a plugin registration socket is not served");
            }
            Err(record(socket, None, why, since))
        }
    }
}

/// Reads a registration socket: refused when stale, as a driver's socket.
async fn read_registration(socket: &Path) -> Result<Registration, Unserved> {
    connect(socket).await?;
    let info = crate::csi::registration::plugin_info(socket)
        .await
        .map_err(|e| Unserved::Unreachable {
            reason: format!("reading the plugin registration failed: {e}"),
        })?;
    if info.r#type != crate::csi::registration::CSI_PLUGIN_TYPE {
        tracing::debug!(registration = %socket.display(), kind = %info.r#type, "not a CSI plugin");
        return Ok(Registration::Other);
    }
    match info.endpoint.parse::<Address>() {
        Ok(address) => {
            tracing::info!(registration = %socket.display(), driver = %info.name, endpoint = %info.endpoint, "found a registered CSI plugin");
            Ok(Registration::Csi {
                name: info.name,
                endpoint: address.path().to_path_buf(),
            })
        }
        Err(error) => {
            let reason = format!(
                "the CSI plugin {:?} registered an unusable endpoint: {error}",
                info.name
            );
            tracing::warn!(registration = %socket.display(), %reason, "registered CSI plugin not served");
            Ok(Registration::BadEndpoint(reason))
        }
    }
}

/// Logs what a socket answered, when that changed.
fn log_outcome(socket: &Address, outcome: &Outcome) {
    match outcome {
        Outcome::Serve(name) => {
            tracing::info!(%socket, driver = %name, "found a driver socket");
        }
        Outcome::Unserved(name, why) => {
            let name = name.as_deref().unwrap_or("-");
            match why {
                Unserved::StaleSocket { reason } => {
                    tracing::info!(%socket, %reason, "stale socket: not served")
                }
                Unserved::NoControllerService { reason } => {
                    tracing::info!(%socket, driver = %name, %reason, "no controller service: recorded, not served")
                }
                Unserved::Unreachable { reason } => {
                    tracing::warn!(%socket, driver = %name, %reason, "discovered socket not served")
                }
            }
        }
    }
}

/// Connects to `path` and hangs up: refused is a stale socket; any other failure is
/// unreachable.
async fn connect(path: &Path) -> Result<(), Unserved> {
    match tokio::net::UnixStream::connect(path).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(Unserved::StaleSocket {
            reason: format!(
                "nothing listens on {} (connection refused): a socket file left by a driver that exited without removing it; served again once a driver listens on it",
                path.display()
            ),
        }),
        Err(e) => Err(Unserved::Unreachable {
            reason: match path.to_string_lossy().parse::<Address>() {
                Ok(address) => csi::connection::connect_failure(&address, &e),
                Err(_) => format!("cannot connect to {}: {e}", path.display()),
            },
        }),
    }
}

/// Asks the socket at `path` who it is and whether it serves a controller; `crashed`: the
/// (socket, name) pairs not to ask for their controller service. Also says whether the driver
/// dropped the connection when asked ControllerGetCapabilities.
async fn probe(path: &Path, crashed: &HashSet<(PathBuf, String)>) -> (Outcome, bool) {
    match tokio::time::timeout(PROBE_TIMEOUT, ask(path, crashed)).await {
        Ok(outcome) => outcome,
        Err(_) => (
            Outcome::Unserved(
                None,
                Unserved::Unreachable {
                    reason: format!(
                        "the driver at {} did not answer GetPluginInfo and the capability calls within {PROBE_TIMEOUT:?}",
                        path.display()
                    ),
                },
            ),
            false,
        ),
    }
}

/// Why a driver that dropped the connection when asked ControllerGetCapabilities is not
/// served.
const CRASHED: &str = "offers the CONTROLLER_SERVICE plugin capability, but dropped the connection (its process ended?) when asked ControllerGetCapabilities, as the GCE PD driver's node plugin does (it registers a controller service without one, and the call dereferences it); not asked again while attacher-hub runs: a node plugin";

async fn ask(path: &Path, crashed: &HashSet<(PathBuf, String)>) -> (Outcome, bool) {
    let outcome = ask_once(path, crashed).await;
    let dropped = matches!(&outcome, Outcome::Unserved(_, Unserved::NoControllerService { reason }) if reason == CRASHED);
    (outcome, dropped)
}

async fn ask_once(path: &Path, crashed: &HashSet<(PathBuf, String)>) -> Outcome {
    let unreachable = |name: Option<String>, reason: String| {
        Outcome::Unserved(name, Unserved::Unreachable { reason })
    };
    if let Err(why) = connect(path).await {
        return Outcome::Unserved(None, why);
    }
    let address = match path.to_string_lossy().parse::<Address>() {
        Ok(a) => a,
        Err(e) => return unreachable(None, e.to_string()),
    };
    let connection = match Connection::connect(address, Some(Duration::ZERO)).await {
        Ok(c) => c,
        Err(e) => return unreachable(None, e.to_string()),
    };
    // The probe's calls are not the driver's: they go to a registry nobody reads.
    let ops = match crate::metrics::CsiOperations::register(&prometheus::Registry::new()) {
        Ok(ops) => ops,
        Err(e) => return unreachable(None, format!("metrics of the probe: {e}")),
    };
    let client = DriverClient::new(&connection, CallMetrics::new(ops));
    let name = match csi::probe::plugin_name(&client).await {
        Ok(n) => n,
        Err(e) => return unreachable(None, format!("GetPluginInfo failed: {e}")),
    };
    let named = |why| Outcome::Unserved(Some(name.clone()), why);
    match client.plugin_capabilities(INFO_TIMEOUT).await {
        Ok(caps) if csi::probe::offers_controller_service(&caps) => {}
        Ok(_) => {
            return named(Unserved::NoControllerService {
                reason: "does not offer the CONTROLLER_SERVICE plugin capability: a node plugin"
                    .into(),
            });
        }
        Err(e) => {
            return named(Unserved::Unreachable {
                reason: format!("GetPluginCapabilities failed: {e}"),
            });
        }
    }
    if crashed.contains(&(path.to_path_buf(), name.clone())) {
        return named(Unserved::NoControllerService {
            reason: CRASHED.into(),
        });
    }
    let losses = connection.losses();
    match client.controller_capabilities(INFO_TIMEOUT).await {
        Ok(_) => Outcome::Serve(name),
        // The connection ended under the call: the driver's process most likely died of it.
        Err(_) if *losses.borrow() > 0 => named(Unserved::NoControllerService {
            reason: CRASHED.into(),
        }),
        Err(e) if e.code() == tonic::Code::Unimplemented => named(Unserved::NoControllerService {
            reason: format!(
                "offers the CONTROLLER_SERVICE plugin capability but does not serve it (ControllerGetCapabilities: {e}): a node plugin"
            ),
        }),
        Err(e) => named(Unserved::Unreachable {
            reason: format!("ControllerGetCapabilities failed: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use crate::config::Defaults;
    use crate::csi::fake::FakeCsi;

    /// Discovery over `<dir>/*/csi.sock`, with the flags' defaults.
    fn glob_in(dir: &Path) -> Discovery {
        let defaults = Defaults::with_identity(&Args::default(), "test-host".into());
        Discovery {
            pattern: Some(format!("{}/*/csi.sock", dir.display())),
            registration_dir: None,
            settings_for: Arc::new(move |a| defaults.settings_for(a)),
        }
    }

    /// `<dir>/<name>/csi.sock`, its directory created.
    fn socket_in(dir: &Path, name: &str) -> PathBuf {
        std::fs::create_dir_all(dir.join(name)).expect("a directory");
        dir.join(name).join("csi.sock")
    }

    /// A socket file nobody listens on, as a driver killed without removing it leaves it.
    fn stale_socket(path: &Path) {
        drop(std::os::unix::net::UnixListener::bind(path).expect("bind"));
        assert!(FileId::of_socket(path).is_some(), "the socket file stays");
    }

    fn states(scan: &Scan) -> Vec<(String, &Unserved)> {
        scan.unserved
            .iter()
            .map(|r| (r.socket.path().display().to_string(), &r.why))
            .collect()
    }

    #[tokio::test]
    async fn a_stale_socket_is_recorded_not_served_and_served_once_a_driver_listens_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let discovery = glob_in(dir.path());
        let path = socket_in(dir.path(), "d1");
        stale_socket(&path);
        let mut memory = Memory::default();
        let none = HashSet::new();

        let first = discovery.scan(&mut memory, &none).await;
        assert!(first.serve.is_empty(), "{first:?}");
        assert_eq!(first.unserved.len(), 1, "{first:?}");
        let record = &first.unserved[0];
        assert_eq!(record.socket.path(), path);
        match &record.why {
            Unserved::StaleSocket { reason } => {
                assert!(reason.contains(&path.display().to_string()), "{reason}")
            }
            other => panic!("not stale: {other:?}"),
        }
        // The next scan says the same, since the same time.
        let second = discovery.scan(&mut memory, &none).await;
        assert_eq!(second.unserved, first.unserved);

        // A driver starts again at that path (removing the old file first, as drivers do).
        std::fs::remove_file(&path).expect("remove");
        let fake = FakeCsi::new("d1.csi.example.com");
        let server = fake.serve_unix(&path, true);
        let third = discovery.scan(&mut memory, &none).await;
        assert_eq!(
            third.serve,
            vec![Found {
                address: path.to_str().expect("UTF-8").parse().expect("a path"),
                name: "d1.csi.example.com".into(),
            }]
        );
        assert!(third.unserved.is_empty(), "{third:?}");

        // Served and connected, the socket is not asked again.
        let asked = fake.calls_of("GetPluginInfo").len();
        let fourth = discovery.scan(&mut memory, &none).await;
        assert_eq!(fourth.serve, third.serve);
        assert_eq!(fake.calls_of("GetPluginInfo").len(), asked);

        // The driver dies without removing its socket: once its served driver tries to
        // connect again, the socket is found stale and no longer served.
        drop(server);
        tokio::task::yield_now().await;
        let kept = discovery.scan(&mut memory, &none).await;
        assert_eq!(
            kept.serve, third.serve,
            "a connected driver's socket is left alone"
        );
        let reconnecting: HashSet<PathBuf> = [path.clone()].into();
        let fifth = discovery.scan(&mut memory, &reconnecting).await;
        assert!(fifth.serve.is_empty(), "{fifth:?}");
        assert!(
            matches!(states(&fifth)[..], [(_, Unserved::StaleSocket { .. })]),
            "{fifth:?}"
        );
    }

    #[tokio::test]
    async fn a_node_plugin_that_offers_the_controller_service_without_serving_it_is_not_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let discovery = glob_in(dir.path());
        let node = FakeCsi::new("pd.csi.storage.gke.io");
        let _node = node.serve_unix(&socket_in(dir.path(), "node"), false);
        let controller = FakeCsi::new("controller.csi.example.com");
        let _controller = controller.serve_unix(&socket_in(dir.path(), "controller"), true);
        let mut memory = Memory::default();

        let scan = discovery.scan(&mut memory, &HashSet::new()).await;
        let served: Vec<&str> = scan.serve.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(served, ["controller.csi.example.com"]);
        assert_eq!(scan.unserved.len(), 1, "{scan:?}");
        let record = &scan.unserved[0];
        assert_eq!(record.name.as_deref(), Some("pd.csi.storage.gke.io"));
        match &record.why {
            Unserved::NoControllerService { reason } => {
                assert!(reason.contains("does not serve it"), "{reason}")
            }
            other => panic!("not a node plugin: {other:?}"),
        }
        let entry = record.describe();
        assert_eq!(entry["state"]["state"], "noControllerService");
        assert_eq!(entry["discovered"], true);
        // Asked once: the next scan keeps the answer.
        let asked = node.calls_of("GetPluginInfo").len();
        let again = discovery.scan(&mut memory, &HashSet::new()).await;
        assert_eq!(again.unserved, scan.unserved);
        assert_eq!(node.calls_of("GetPluginInfo").len(), asked);
    }

    fn stale(reason: &str) -> Unserved {
        Unserved::StaleSocket {
            reason: reason.into(),
        }
    }

    fn unreachable(reason: &str) -> Unserved {
        Unserved::Unreachable {
            reason: reason.into(),
        }
    }

    /// The registered sockets come first, with their names; a globbed socket also registered
    /// is looked at once, as registered.
    #[test]
    fn a_socket_both_registered_and_globbed_is_a_candidate_once_as_registered() {
        let p = PathBuf::from;
        let got = candidates(
            vec![
                (p("/r/b.sock"), "b".into()),
                (p("/r/a.sock"), "a".into()),
                (p("/r/b.sock"), "b2".into()),
            ],
            vec![p("/g/c.sock"), p("/r/a.sock"), p("/g/c.sock")],
        );
        assert_eq!(
            got,
            [
                (p("/r/b.sock"), Some("b".into())),
                (p("/r/a.sock"), Some("a".into())),
                (p("/g/c.sock"), None),
            ]
        );
        assert!(candidates(Vec::new(), Vec::new()).is_empty());
    }

    /// A socket checked by connecting: refused is stale whatever it answered before; otherwise
    /// a served driver stays served, and anything else is probed.
    #[test]
    fn a_connection_check_finds_a_stale_socket_keeps_a_served_one_and_probes_the_rest() {
        let serve = Outcome::Serve("d".into());
        let was_stale = Outcome::Unserved(None, stale("before"));
        assert_eq!(
            after_connect(Err(stale("now")), serve.clone()),
            Some(Outcome::Unserved(None, stale("now")))
        );
        assert_eq!(
            after_connect(Err(stale("now")), was_stale.clone()),
            Some(Outcome::Unserved(None, stale("now")))
        );
        assert_eq!(after_connect(Ok(()), serve.clone()), Some(serve.clone()));
        assert_eq!(
            after_connect(Err(unreachable("denied")), serve.clone()),
            Some(serve)
        );
        assert_eq!(after_connect(Ok(()), was_stale.clone()), None);
        assert_eq!(after_connect(Err(unreachable("denied")), was_stale), None);
    }

    /// A driver served under another name than it registered with the kubelet is not served.
    #[test]
    fn a_driver_reporting_another_name_than_it_registered_is_not_served() {
        let serve = Outcome::Serve("a.example.com".into());
        assert_eq!(against_registration(serve.clone(), None), serve);
        assert_eq!(
            against_registration(serve.clone(), Some("a.example.com".into())),
            serve
        );
        match against_registration(serve, Some("b.example.com".into())) {
            Outcome::Unserved(Some(name), Unserved::Unreachable { reason }) => {
                assert_eq!(name, "a.example.com");
                assert!(reason.contains("\"b.example.com\""), "{reason}");
            }
            other => panic!("served: {other:?}"),
        }
        let node = Outcome::Unserved(Some("n".into()), unreachable("x"));
        assert_eq!(against_registration(node.clone(), Some("m".into())), node);
    }

    /// A socket's answer keeps the time it was first given; a new answer is new.
    #[test]
    fn an_answer_given_again_keeps_its_first_time() {
        let then = Timestamp::from_second(1_000).expect("a time");
        let mut memory = Memory::default();
        let path = Path::new("/p/csi.sock");
        let serve = Outcome::Serve("d".into());
        assert_eq!(memory.since(path, &serve), None, "not known");
        memory.sockets.insert(
            path.to_path_buf(),
            Probed {
                file: FileId(1, 2, 3, 4),
                outcome: serve.clone(),
                since: then,
            },
        );
        assert_eq!(memory.since(path, &serve), Some(then));
        assert_eq!(
            memory.since(path, &Outcome::Unserved(None, stale("gone"))),
            None
        );
        assert_eq!(memory.since(Path::new("/q/csi.sock"), &serve), None);
    }

    /// A registration read is remembered for its file; an unusable one keeps the time it was
    /// first found so for the same reason, and is forgotten with its file.
    #[test]
    fn registrations_are_remembered_by_file_and_failures_by_reason() {
        let (t1, t2) = (
            Timestamp::from_second(1_000).expect("a time"),
            Timestamp::from_second(2_000).expect("a time"),
        );
        let socket = Path::new("/reg/a.sock");
        let (file, newer) = (FileId(1, 1, 1, 1), FileId(1, 1, 2, 2));
        let mut memory = Memory::default();

        assert_eq!(
            memory.registration_failed(socket, &stale("x"), t1),
            (t1, true)
        );
        assert_eq!(
            memory.registration_failed(socket, &stale("x"), t2),
            (t1, false)
        );
        assert_eq!(
            memory.registration_failed(socket, &unreachable("y"), t2),
            (t2, true),
            "another reason"
        );
        let read = Registration::Csi {
            name: "a".into(),
            endpoint: PathBuf::from("/plugins/a/csi.sock"),
        };
        assert!(
            memory.registration_read(socket, file, read.clone()),
            "answers again"
        );
        assert!(memory.bad_registrations.is_empty());
        assert_eq!(memory.registrations[socket], (file, read.clone()));
        assert!(!memory.registration_read(socket, file, read));

        // The same file stays; a new file at the path, or none, is forgotten.
        memory.forget_registrations(&[(socket.to_path_buf(), file)]);
        assert_eq!(memory.registrations.len(), 1);
        memory.forget_registrations(&[(socket.to_path_buf(), newer)]);
        assert!(memory.registrations.is_empty());
        memory.registration_failed(socket, &stale("x"), t1);
        memory.forget_registrations(&[(socket.to_path_buf(), newer)]);
        assert_eq!(memory.bad_registrations.len(), 1, "the path is still there");
        memory.forget_registrations(&[]);
        assert!(memory.bad_registrations.is_empty());
    }

    /// A scan files each socket by its answer, and sorts both lists by path.
    #[test]
    fn a_scan_files_served_and_unserved_sockets_sorted_by_path() {
        let at = |s: &str| -> Address { s.parse().expect("a path") };
        let since = Timestamp::from_second(1_000).expect("a time");
        let mut scan = Scan::default();
        scan.file(at("/b/csi.sock"), &Outcome::Serve("b".into()), since);
        scan.file(at("/a/csi.sock"), &Outcome::Serve("a".into()), since);
        scan.file(
            at("/d/csi.sock"),
            &Outcome::Unserved(Some("d".into()), unreachable("x")),
            since,
        );
        scan.unserved
            .extend(record(Path::new("/c/reg.sock"), None, stale("y"), since));
        scan.sort();
        let served: Vec<&str> = scan.serve.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(served, ["a", "b"]);
        assert_eq!(
            scan.unserved,
            [
                Record {
                    socket: at("/c/reg.sock"),
                    name: None,
                    why: stale("y"),
                    since,
                },
                Record {
                    socket: at("/d/csi.sock"),
                    name: Some("d".into()),
                    why: unreachable("x"),
                    since,
                },
            ]
        );
    }

    #[test]
    fn a_socket_is_asked_again_only_when_its_file_or_its_answer_calls_for_it() {
        let file = FileId(1, 2, 3, 4);
        let probed = |outcome| Probed {
            file,
            outcome,
            since: Timestamp::now(),
        };
        let serve = probed(Outcome::Serve("d".into()));
        let reason = String::new;
        let unserved = |why| probed(Outcome::Unserved(None, why));
        assert_eq!(check(None, file, false), Check::Probe);
        assert_eq!(check(Some(&serve), file, false), Check::Keep);
        assert_eq!(check(Some(&serve), file, true), Check::Connect);
        assert_eq!(check(Some(&serve), FileId(1, 2, 3, 5), false), Check::Probe);
        let stale = unserved(Unserved::StaleSocket { reason: reason() });
        assert_eq!(check(Some(&stale), file, false), Check::Connect);
        let node = unserved(Unserved::NoControllerService { reason: reason() });
        assert_eq!(check(Some(&node), file, false), Check::Keep);
        let unreachable = unserved(Unserved::Unreachable { reason: reason() });
        assert_eq!(check(Some(&unreachable), file, false), Check::Probe);
    }
}
