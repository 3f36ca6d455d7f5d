//! An `attacher-hub` process for fault scenarios: its own kubeconfig (usually
//! through a [`Proxy`](super::proxy::Proxy)), optionally inside a network
//! namespace and under a host name of its own (the replica identity), with
//! bounded helpers to read `/drivers` and `/metrics`, to signal it and to
//! measure its memory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Command;

use super::netns::NetNs;
use crate::support::ChildProcess;

/// Bound of one HTTP request to the hub.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// Leader-election timings of a hub.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timings {
    pub(crate) lease: Duration,
    pub(crate) renew: Duration,
    pub(crate) retry: Duration,
}

impl Timings {
    /// client-go's defaults (what a deployment runs with): 15 s, 10 s, 5 s.
    pub(crate) const DEFAULT: Timings = Timings {
        lease: Duration::from_secs(15),
        renew: Duration::from_secs(10),
        retry: Duration::from_secs(5),
    };
    /// Short timings for tests that only need leadership to exist.
    pub(crate) const FAST: Timings = Timings {
        lease: Duration::from_secs(4),
        renew: Duration::from_secs(3),
        retry: Duration::from_secs(1),
    };
}

/// How to start one hub.
#[derive(Clone, Debug)]
pub(crate) struct HubSpec {
    /// Label in logs and messages.
    pub(crate) label: String,
    /// `--kubeconfig`.
    pub(crate) kubeconfig: PathBuf,
    /// `--config` (hub mode), else `csi_address` is used.
    pub(crate) config: Option<PathBuf>,
    /// `--csi-address` (sidecar mode).
    pub(crate) csi_address: Option<PathBuf>,
    /// Leader election in this namespace with these timings.
    pub(crate) leader_election: Option<(String, Timings)>,
    /// Host name (replica identity), in a UTS namespace of its own.
    pub(crate) hostname: Option<String>,
    /// Run inside this network namespace (HTTP on its address).
    pub(crate) netns: Option<Arc<NetNs>>,
    /// `--timeout` (CSI calls).
    pub(crate) timeout: Duration,
    /// `--graceful-shutdown-timeout`, when set.
    pub(crate) graceful: Option<Duration>,
    /// `-v`.
    pub(crate) verbosity: u8,
    /// Further flags, appended last.
    pub(crate) extra_args: Vec<String>,
    /// Run under `prlimit --as=<bytes>` (a cap on address space).
    pub(crate) address_space_limit: Option<u64>,
}

impl HubSpec {
    /// A hub-mode hub reading `config`, through `kubeconfig`.
    pub(crate) fn new(label: &str, kubeconfig: &Path) -> HubSpec {
        HubSpec {
            label: label.to_string(),
            kubeconfig: kubeconfig.to_path_buf(),
            config: None,
            csi_address: None,
            leader_election: None,
            hostname: None,
            netns: None,
            timeout: Duration::from_secs(10),
            graceful: None,
            verbosity: 2,
            extra_args: Vec::new(),
            address_space_limit: None,
        }
    }

    pub(crate) fn config(mut self, path: &Path) -> Self {
        self.config = Some(path.to_path_buf());
        self
    }

    pub(crate) fn csi_address(mut self, path: &Path) -> Self {
        self.csi_address = Some(path.to_path_buf());
        self
    }

    pub(crate) fn leader_election(mut self, namespace: &str, timings: Timings) -> Self {
        self.leader_election = Some((namespace.to_string(), timings));
        self
    }

    pub(crate) fn hostname(mut self, host: &str) -> Self {
        self.hostname = Some(host.to_string());
        self
    }

    pub(crate) fn netns(mut self, ns: Arc<NetNs>) -> Self {
        self.netns = Some(ns);
        self
    }

    pub(crate) fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    pub(crate) fn graceful(mut self, t: Duration) -> Self {
        self.graceful = Some(t);
        self
    }

    pub(crate) fn verbosity(mut self, v: u8) -> Self {
        self.verbosity = v;
        self
    }

    pub(crate) fn arg(mut self, a: impl Into<String>) -> Self {
        self.extra_args.push(a.into());
        self
    }

    pub(crate) fn address_space_limit(mut self, bytes: u64) -> Self {
        self.address_space_limit = Some(bytes);
        self
    }
}

/// A running hub.
#[derive(Debug)]
pub(crate) struct FHub {
    /// The process; killed on drop, logs shown if the test fails.
    pub(crate) process: ChildProcess,
    /// The HTTP listener.
    pub(crate) http: SocketAddr,
    /// How it was started (for a restart).
    pub(crate) spec: HubSpec,
    /// Its PID (kept after exit, for messages).
    pid: u32,
}

/// The hub binary: this build's, or `$ATTACHER_FAULTS_HUB_BIN` (to run a
/// scenario against another build, e.g. the code before a fix).
pub(crate) fn hub_binary() -> String {
    std::env::var("ATTACHER_FAULTS_HUB_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_attacher-hub").to_string())
}

/// A free TCP port on `ip` at the time of the call.
pub(crate) fn free_port_on(ip: std::net::IpAddr) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("local address")
        .port()
}

/// One `GET` over a fresh connection, bounded by [`HTTP_TIMEOUT`].
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    tokio::time::timeout(HTTP_TIMEOUT, crate::support::http_get_at(addr, path))
        .await
        .map_err(|_| format!("GET {path} from {addr}: no answer within {HTTP_TIMEOUT:?}"))?
        .map_err(|e| format!("GET {path} from {addr}: {e}"))
}

impl FHub {
    /// Starts the hub; does not wait for anything.
    pub(crate) fn spawn(spec: HubSpec) -> FHub {
        let ip: std::net::IpAddr = match &spec.netns {
            Some(ns) => ns.ns_ip().into(),
            None => std::net::Ipv4Addr::LOCALHOST.into(),
        };
        // Inside a namespace the port is free by construction.
        let port = if spec.netns.is_some() {
            free_port_on(std::net::Ipv4Addr::LOCALHOST.into())
        } else {
            free_port_on(ip)
        };
        let http = SocketAddr::new(ip, port);
        let mut args = vec![
            format!("--kubeconfig={}", spec.kubeconfig.display()),
            format!("--http-endpoint={http}"),
            "--kube-api-qps=200".to_string(),
            "--kube-api-burst=400".to_string(),
            "--retry-interval-start=200ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            format!("--timeout={}ms", spec.timeout.as_millis()),
            format!("-v={}", spec.verbosity),
        ];
        if let Some(g) = spec.graceful {
            args.push(format!("--graceful-shutdown-timeout={}ms", g.as_millis()));
        }
        if let Some(c) = &spec.config {
            args.push(format!("--config={}", c.display()));
        }
        if let Some(a) = &spec.csi_address {
            args.push(format!("--csi-address={}", a.display()));
        }
        if let Some((ns, t)) = &spec.leader_election {
            args.extend([
                "--leader-election".to_string(),
                format!("--leader-election-namespace={ns}"),
                format!("--leader-election-lease-duration={}ms", t.lease.as_millis()),
                format!("--leader-election-renew-deadline={}ms", t.renew.as_millis()),
                format!("--leader-election-retry-period={}ms", t.retry.as_millis()),
            ]);
        }
        args.extend(spec.extra_args.iter().cloned());

        // prefix (netns) -> prlimit -> unshare --uts (hostname) -> hub; every
        // step execs, so the PID is the hub's own.
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = &spec.netns {
            argv.extend(ns.prefix());
        }
        if let Some(bytes) = spec.address_space_limit {
            argv.extend(["prlimit".to_string(), format!("--as={bytes}"), "--".into()]);
        }
        if let Some(host) = &spec.hostname {
            argv.extend([
                "unshare".to_string(),
                "--uts".to_string(),
                "sh".to_string(),
                "-c".to_string(),
                "hostname \"$0\" && exec \"$@\"".to_string(),
                host.clone(),
            ]);
        }
        argv.push(hub_binary());
        argv.extend(args);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        let process = ChildProcess::spawn(&spec.label, cmd);
        let pid = process.id().expect("the hub just started");
        FHub {
            process,
            http,
            spec,
            pid,
        }
    }

    /// Starts the hub and waits until its HTTP listener answers `/healthz`.
    pub(crate) async fn start(spec: HubSpec) -> FHub {
        let mut hub = FHub::spawn(spec);
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = http_get(hub.http, "/healthz").await {
                return hub;
            }
            if let Some(status) = hub.process.exited() {
                hub.process.dump_logs();
                panic!("{} exited ({status}) before serving HTTP", hub.spec.label);
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{} did not serve HTTP on {} within 30s",
                hub.spec.label,
                hub.http
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new process with the same spec (after a kill).
    pub(crate) async fn restart(&mut self) {
        let spec = self.spec.clone();
        let old = std::mem::replace(self, FHub::start(spec).await);
        drop(old);
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// `GET path`; panics if the hub does not answer.
    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.http, path)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", self.spec.label))
    }

    /// `/drivers`.
    pub(crate) async fn drivers(&self) -> Vec<Value> {
        let (status, body) = self.get("/drivers").await;
        assert_eq!(status, 200, "/drivers answered {status}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/drivers is not JSON ({e}): {body}"))
    }

    /// `/drivers`, or `None` if the hub does not answer.
    pub(crate) async fn try_drivers(&self) -> Option<Vec<Value>> {
        let (status, body) = http_get(self.http, "/drivers").await.ok()?;
        (status == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// `/metrics` text.
    pub(crate) async fn metrics(&self) -> String {
        let (status, body) = self.get("/metrics").await;
        assert_eq!(status, 200, "/metrics answered {status}");
        body
    }

    /// Polls `/drivers` until `pred` holds; `Err` with the last document.
    pub(crate) async fn wait_drivers(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Result<Vec<Value>, String> {
        let start = Instant::now();
        let mut last = Vec::new();
        loop {
            if let Some(d) = self.try_drivers().await {
                if pred(&d) {
                    return Ok(d);
                }
                last = d;
            }
            if let Some(status) = self.process.exited() {
                return Err(format!(
                    "{} exited ({status}) while waiting for {what}",
                    self.spec.label
                ));
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "{}: /drivers did not show {what} within {timeout:?}; last: {}",
                    self.spec.label,
                    serde_json::to_string(&last).unwrap_or_default()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until every driver in `names` leads here.
    pub(crate) async fn wait_leading(
        &mut self,
        names: &[String],
        timeout: Duration,
    ) -> Result<(), String> {
        self.wait_drivers(&format!("{names:?} leading"), timeout, |ds| {
            names.iter().all(|n| {
                ds.iter()
                    .any(|d| d["name"] == *n && state_of(d) == "leading")
            })
        })
        .await
        .map(|_| ())
    }

    /// Sends a signal (`"KILL"`, `"TERM"`, `"HUP"`, ...).
    pub(crate) fn signal(&self, signal: &str) {
        let _ = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.pid.to_string()])
            .status();
    }

    /// Waits up to `bound` for the process to exit.
    pub(crate) async fn wait_exit(&mut self, bound: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.process.exited() {
                return Some(s);
            }
            if start.elapsed() > bound {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits up to `bound`: the exit status and how long it
    /// took, or `Err` (after a SIGKILL) if it did not exit in time.
    pub(crate) async fn terminate(
        &mut self,
        bound: Duration,
    ) -> Result<(ExitStatus, Duration), String> {
        if let Some(s) = self.process.exited() {
            return Err(format!("{} had already exited ({s})", self.spec.label));
        }
        let start = Instant::now();
        self.signal("TERM");
        match self.wait_exit(bound).await {
            Some(s) => Ok((s, start.elapsed())),
            None => {
                self.signal("KILL");
                let _ = self.wait_exit(Duration::from_secs(5)).await;
                Err(format!(
                    "{} did not exit within {bound:?} of SIGTERM (killed)",
                    self.spec.label
                ))
            }
        }
    }

    /// SIGKILL and wait.
    pub(crate) async fn kill(&mut self) {
        self.signal("KILL");
        let _ = self.wait_exit(Duration::from_secs(10)).await;
    }

    /// `(VmRSS, VmHWM)` in KiB while it runs.
    pub(crate) fn memory_kib(&self) -> Option<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// stdout and stderr.
    pub(crate) fn log(&self) -> String {
        let mut text = self.process.stderr();
        text.push_str(&self.process.stdout());
        text
    }

    /// Waits until the hub has logged the start of at least `n` calls of CSI
    /// `method` (`ControllerPublishVolume`, `ControllerUnpublishVolume`; the
    /// debug line written just before each call, so needs `-v=2` or more: klog's header, then
    /// the message `"ControllerPublishVolume"` and the driver's fields).
    pub(crate) async fn wait_calls_started(
        &mut self,
        method: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<(), String> {
        let needle = format!("] \"{method}\" driver=");
        self.process.wait_for_output(&needle, n, timeout).await
    }

    /// Lines of the log containing `needle`.
    pub(crate) fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for FHub {
    fn drop(&mut self) {
        // `ATTACHER_FAULTS_DUMP_LOGS=1` shows every hub's log, also of passing tests.
        if !std::thread::panicking() && std::env::var_os("ATTACHER_FAULTS_DUMP_LOGS").is_some() {
            self.process.dump_logs();
        }
    }
}

/// The `state.state` of a `/drivers` entry.
pub(crate) fn state_of(d: &Value) -> &str {
    d["state"]["state"].as_str().unwrap_or("")
}

/// Keys being processed, over every queue of every driver in `/drivers`.
pub(crate) fn processing(drivers: &[Value]) -> u64 {
    drivers
        .iter()
        .flat_map(|d| ["attach", "detach", "pv"].map(|q| d["queues"][q]["processing"].as_u64()))
        .flatten()
        .sum()
}

/// Value of the series `metric{...}` whose labels contain every `labels`
/// fragment (e.g. `driver_name="x"`), summed over matches.
pub(crate) fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    let mut found = None;
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(metric) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if labels.iter().all(|f| rest.contains(f))
            && let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}
