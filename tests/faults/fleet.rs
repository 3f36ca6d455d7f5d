//! The Go side of a comparison: the reference external-attacher (built by
//! `tools/testbins`) as sidecars, one per driver, each behind a proxy of its
//! own and restarted a second after it exits, as the kubelet restarts a
//! container; and a ledger of when each Lease of a namespace was written.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::fhub::Timings;
use super::proxy::Proxy;
use super::world::kubeconfig_via;
use crate::support::{ChildProcess, Cluster};

/// Pause between a sidecar's exit and its restart (the kubelet's first
/// restart of a crashed container is immediate; its back-off starts at 10 s
/// for the next ones, which a 20 s fault does not reach).
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// One Go external-attacher for one driver, behind its own proxy, kept
/// running: restarted [`RESTART_DELAY`] after every exit.
pub(crate) struct GoSidecar {
    /// The driver it serves.
    pub(crate) driver: String,
    /// Its way to the API server.
    pub(crate) proxy: Proxy,
    /// When it exited, each time.
    exits: Arc<Mutex<Vec<Instant>>>,
    /// Stops the supervisor (and the process).
    stop: CancellationToken,
    /// The supervisor.
    task: Option<tokio::task::JoinHandle<()>>,
    /// Keeps the kubeconfig.
    _dir: tempfile::TempDir,
}

impl GoSidecar {
    /// Starts `csi-attacher` for the driver on `socket` with leader election
    /// in `namespace` (`timings`) and the hub's other flags of the fault
    /// suite, through a new proxy to `api`.
    pub(crate) async fn start(
        cluster: &Cluster,
        api: std::net::SocketAddr,
        driver: &str,
        socket: &Path,
        namespace: &str,
        timings: Timings,
    ) -> GoSidecar {
        let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), api).await;
        let dir = tempfile::Builder::new()
            .prefix("ahf-go-")
            .tempdir()
            .expect("temp dir");
        let kubeconfig = kubeconfig_via(
            &cluster.kubeconfig,
            &format!("https://{}", proxy.addr()),
            dir.path(),
        );
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--csi-address={}", socket.display()),
            "--kube-api-qps=200".to_string(),
            "--kube-api-burst=400".to_string(),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "--timeout=10s".to_string(),
            "--leader-election".to_string(),
            format!("--leader-election-namespace={namespace}"),
            format!(
                "--leader-election-lease-duration={}ms",
                timings.lease.as_millis()
            ),
            format!(
                "--leader-election-renew-deadline={}ms",
                timings.renew.as_millis()
            ),
            format!(
                "--leader-election-retry-period={}ms",
                timings.retry.as_millis()
            ),
            "--v=2".to_string(),
        ];
        let bin = cluster.bin("csi-attacher");
        let label = format!("csi-attacher {driver}");
        let exits: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let stop = CancellationToken::new();
        let spawn = move || {
            let mut cmd = Command::new(&bin);
            cmd.args(&args);
            ChildProcess::spawn(&label, cmd)
        };
        let (seen, stopping) = (exits.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut process = spawn();
            loop {
                tokio::select! {
                    () = stopping.cancelled() => {
                        let _ = process.stop().await;
                        return;
                    }
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                if process.exited().is_some() {
                    seen.lock().unwrap().push(Instant::now());
                    tokio::select! {
                        () = stopping.cancelled() => return,
                        () = tokio::time::sleep(RESTART_DELAY) => {}
                    }
                    process = spawn();
                }
            }
        });
        GoSidecar {
            driver: driver.to_string(),
            proxy,
            exits,
            stop,
            task: Some(task),
            _dir: dir,
        }
    }

    /// When it exited so far.
    pub(crate) fn exits(&self) -> Vec<Instant> {
        self.exits.lock().unwrap().clone()
    }

    /// Stops it (SIGTERM, then SIGKILL after 10 s) and its supervisor.
    pub(crate) async fn stop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for GoSidecar {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Per Lease name, each write seen: when, and the holder it named.
type Writes = Arc<Mutex<HashMap<String, Vec<(Instant, String)>>>>;

/// When each Lease of a namespace was seen written (and with which holder),
/// through one watch on a connection of the test's own.
#[derive(Clone)]
pub(crate) struct LeaseLedger {
    writes: Writes,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl LeaseLedger {
    pub(crate) async fn start(client: &Client, namespace: &str) -> LeaseLedger {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let writes: Writes = Arc::default();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let w = writes.clone();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            loop {
                let event = match stream.try_next().await {
                    Ok(Some(e)) => e,
                    Ok(None) => return,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                let now = Instant::now();
                let record = |lease: &Lease| {
                    let holder = lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.holder_identity.clone())
                        .unwrap_or_default();
                    w.lock()
                        .unwrap()
                        .entry(lease.metadata.name.clone().unwrap_or_default())
                        .or_default()
                        .push((now, holder));
                };
                match event {
                    watcher::Event::Apply(l) | watcher::Event::InitApply(l) => record(&l),
                    watcher::Event::InitDone => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    watcher::Event::Init | watcher::Event::Delete(_) => {}
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .expect("the Lease ledger did not list within 30s")
            .expect("the Lease ledger ended");
        LeaseLedger {
            writes,
            task: Arc::new(task),
        }
    }

    /// When `name` was first seen written at or after `t` with a holder
    /// (a renewal or an acquisition).
    pub(crate) fn held_after(&self, name: &str, t: Instant) -> Option<Instant> {
        self.writes
            .lock()
            .unwrap()
            .get(name)?
            .iter()
            .find(|(at, holder)| *at >= t && !holder.is_empty())
            .map(|(at, _)| *at)
    }

    /// Names of the Leases seen so far that start with `prefix`.
    pub(crate) fn names(&self, prefix: &str) -> Vec<String> {
        self.writes
            .lock()
            .unwrap()
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Waits until every Lease in `names` has been written with a holder
    /// after `t`; the time from `t` to the last of them.
    pub(crate) async fn wait_held_after(
        &self,
        names: &[String],
        t: Instant,
        bound: Duration,
    ) -> Result<Duration, String> {
        loop {
            let seen: Vec<Option<Instant>> = names.iter().map(|n| self.held_after(n, t)).collect();
            if seen.iter().all(Option::is_some) {
                let last = seen.into_iter().flatten().max().unwrap_or(t);
                return Ok(last.saturating_duration_since(t));
            }
            if t.elapsed() > bound {
                let missing: Vec<&String> = names
                    .iter()
                    .zip(&seen)
                    .filter(|(_, s)| s.is_none())
                    .map(|(n, _)| n)
                    .collect();
                return Err(format!(
                    "Leases not written within {bound:?} of the return: {missing:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for LeaseLedger {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}
