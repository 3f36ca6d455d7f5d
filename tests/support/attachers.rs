//! attacher-hub and the reference Go external-attacher as processes with identities of their
//! own (see [`under_hostname`]) and an HTTP listener each, asked what they think: whether they
//! lead a driver, their `/drivers`, their metrics.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{ChildProcess, Cluster, under_hostname, unique_name};

/// A TCP port free at the time of the call.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A Go duration flag value (`4s`, `500ms`).
pub(crate) fn go_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Which program an attacher runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Program {
    /// The attacher-hub binary of this build.
    Hub,
    /// The reference Go external-attacher v4.13.0.
    Go,
}

/// One attacher process.
#[derive(Debug)]
pub(crate) struct Attacher {
    /// Which program.
    pub(crate) program: Program,
    /// Its host name, and so its Lease holder identity.
    pub(crate) identity: String,
    /// Port of its `--http-endpoint` on 127.0.0.1.
    pub(crate) port: u16,
    /// The process.
    pub(crate) process: ChildProcess,
}

impl Attacher {
    /// attacher-hub with `args` (and `--http-endpoint` on a free loopback port), as host
    /// `<tag>-<unique>`.
    pub(crate) fn hub(tag: &str, args: &[String]) -> Attacher {
        Self::hub_with_env(tag, args, &[])
    }

    /// [`Attacher::hub`] with environment variables (e.g. `POD_NAMESPACE`).
    pub(crate) fn hub_with_env(tag: &str, args: &[String], env: &[(&str, &str)]) -> Attacher {
        Self::start(
            Program::Hub,
            tag,
            Path::new(env!("CARGO_BIN_EXE_attacher-hub")),
            args,
            env,
        )
    }

    /// The Go external-attacher with `args` (and `--http-endpoint`), as host `<tag>-<unique>`.
    pub(crate) fn go(cluster: &Cluster, tag: &str, args: &[String]) -> Attacher {
        Self::go_with_env(cluster, tag, args, &[])
    }

    /// [`Attacher::go`] with environment variables (e.g. `POD_NAMESPACE`).
    pub(crate) fn go_with_env(
        cluster: &Cluster,
        tag: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Attacher {
        Self::start(Program::Go, tag, &cluster.bin("csi-attacher"), args, env)
    }

    fn start(
        program: Program,
        tag: &str,
        binary: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Attacher {
        let identity = unique_name(tag);
        let port = free_port();
        let mut all = args.to_vec();
        all.push(format!("--http-endpoint=127.0.0.1:{port}"));
        let label = match program {
            Program::Hub => "attacher-hub",
            Program::Go => "csi-attacher",
        };
        let mut cmd = under_hostname(&identity, binary, &all);
        // Neither program reads a stray POD_NAMESPACE of the test's environment.
        cmd.env_remove("POD_NAMESPACE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Attacher {
            program,
            identity,
            port,
            process: ChildProcess::spawn(&format!("{label}-{tag}"), cmd),
        }
    }

    /// What to ask it through its listener (copyable, for monitor tasks).
    pub(crate) fn probe(&self) -> Probe {
        Probe {
            program: self.program,
            port: self.port,
        }
    }

    /// `GET path`: status and body, `None` when nothing answers within 2 s.
    pub(crate) async fn get(&self, path: &str) -> Option<(u16, String)> {
        self.probe().get(path).await
    }

    /// The hub's `/drivers`.
    pub(crate) async fn drivers(&self) -> Option<Vec<Value>> {
        self.probe().drivers().await
    }

    /// The hub's `/drivers` entry of `driver`.
    pub(crate) async fn driver(&self, driver: &str) -> Option<Value> {
        self.probe().driver(driver).await
    }

    /// `/metrics`.
    pub(crate) async fn metrics(&self) -> Option<String> {
        self.probe().metrics().await
    }

    /// Whether it says it leads `driver` (see [`Probe::leads`]).
    pub(crate) async fn leads(&self, driver: &str) -> Option<bool> {
        self.probe().leads(driver).await
    }

    /// ControllerPublishVolume calls it made (see [`Probe::publish_calls`]).
    pub(crate) async fn publish_calls(&self) -> u64 {
        self.probe().publish_calls().await
    }

    /// Panics (with the logs) if the process has ended.
    pub(crate) fn assert_running(&mut self) {
        if let Some(status) = self.process.exited() {
            panic!("{:?} {} exited: {status}", self.program, self.identity);
        }
    }

    /// Sends `signal` (`-KILL`, `-TERM`).
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.process.id().expect("the process runs");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

/// An attacher's listener: what it says about itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probe {
    /// Which program answers.
    pub(crate) program: Program,
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
}

impl Probe {
    /// `GET path`: status and body, `None` when nothing answers within 2 s.
    pub(crate) async fn get(&self, path: &str) -> Option<(u16, String)> {
        tokio::time::timeout(Duration::from_secs(2), super::http_get(self.port, path))
            .await
            .ok()?
            .ok()
    }

    /// The hub's `/drivers`.
    pub(crate) async fn drivers(&self) -> Option<Vec<Value>> {
        let (status, body) = self.get("/drivers").await?;
        (status == 200)
            .then(|| serde_json::from_str::<Value>(&body).ok())
            .flatten()?
            .as_array()
            .cloned()
    }

    /// The hub's `/drivers` entry of `driver`.
    pub(crate) async fn driver(&self, driver: &str) -> Option<Value> {
        self.drivers()
            .await?
            .into_iter()
            .find(|d| d["name"] == driver)
    }

    /// `/metrics`.
    pub(crate) async fn metrics(&self) -> Option<String> {
        let (status, body) = self.get("/metrics").await?;
        (status == 200).then_some(body)
    }

    /// Whether it says it leads `driver`: the hub's `/drivers` state; Go's
    /// `leader_election_master_status`. `None` when it cannot be asked.
    pub(crate) async fn leads(&self, driver: &str) -> Option<bool> {
        match self.program {
            Program::Hub => Some(self.driver(driver).await?["state"]["state"] == "leading"),
            Program::Go => {
                let body = self.metrics().await?;
                let line = body
                    .lines()
                    .find(|l| l.starts_with("leader_election_master_status{"))?;
                Some(line.rsplit(' ').next()?.parse::<f64>().ok()? == 1.0)
            }
        }
    }

    /// ControllerPublishVolume calls it made (`csi_sidecar_operations_seconds_count`).
    pub(crate) async fn publish_calls(&self) -> u64 {
        let body = self.metrics().await.unwrap_or_default();
        body.lines()
            .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
            .filter(|l| l.contains("ControllerPublishVolume"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

/// Polls `probe` every 100 ms until it yields a value; panics naming `what` after `timeout`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
