//! Driver and attacher processes for tests: per-test sockets and log files
//! in temporary directories, killed when dropped, logs shown when a test fails.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::process::{Child, Command};

use super::Cluster;

/// How many trailing log lines a failed test shows per stream.
const LOG_TAIL_LINES: usize = 100;

/// How long a process may take to create its socket or print its ready line.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Poll interval for files (sockets, logs) written by a child process.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A child process whose stdout and stderr go to files in its own temporary
/// directory. Dropping it kills the process; dropping it while the test
/// panics also prints the last lines of both logs and keeps the directory.
#[derive(Debug)]
pub(crate) struct ChildProcess {
    /// Short name used in messages (`mockcsi`, `csi-attacher`, ...).
    name: String,
    /// The running process (`kill_on_drop`).
    child: Child,
    /// File receiving the process's stdout.
    stdout_path: PathBuf,
    /// File receiving the process's stderr.
    stderr_path: PathBuf,
    /// Directory holding both logs; kept (not deleted) after a failed test.
    log_dir: Option<TempDir>,
}

impl ChildProcess {
    /// Spawns `cmd` with stdin closed and stdout/stderr captured to files.
    pub(crate) fn spawn(name: &str, mut cmd: Command) -> ChildProcess {
        let log_dir = tempfile::Builder::new()
            .prefix(&format!("ah-{name}-"))
            .tempdir()
            .expect("cannot create a temporary directory for logs");
        let stdout_path = log_dir.path().join("stdout.log");
        let stderr_path = log_dir.path().join("stderr.log");
        let open =
            |p: &Path| File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        cmd.stdin(Stdio::null())
            .stdout(open(&stdout_path))
            .stderr(open(&stderr_path))
            .kill_on_drop(true);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start {name} ({:?}): {e}",
                cmd.as_std().get_program()
            )
        });
        ChildProcess {
            name: name.to_string(),
            child,
            stdout_path,
            stderr_path,
            log_dir: Some(log_dir),
        }
    }

    /// The process ID while the process runs.
    pub(crate) fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Everything written to stdout so far.
    pub(crate) fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// Everything written to stderr so far.
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Number of occurrences of `needle` in stdout and stderr together.
    pub(crate) fn count_in_output(&self, needle: &str) -> usize {
        self.stdout().matches(needle).count() + self.stderr().matches(needle).count()
    }

    /// The exit status if the process has ended.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until `needle` has appeared at least `times` times in stdout or
    /// stderr. Fails early if the process exits.
    pub(crate) async fn wait_for_output(
        &mut self,
        needle: &str,
        times: usize,
        timeout: Duration,
    ) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let seen = self.count_in_output(needle);
            if seen >= times {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(format!(
                    "{} exited ({status}) before printing {needle:?} {times} time(s)",
                    self.name
                ));
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "{} printed {needle:?} {seen} time(s), not {times}, within {timeout:?}",
                    self.name
                ));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Stops the process: SIGTERM, then SIGKILL after 10 s. Returns its exit status.
    pub(crate) async fn stop(&mut self) -> Option<ExitStatus> {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            if let Ok(status) =
                tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await
            {
                return status.ok();
            }
            let _ = self.child.start_kill();
        }
        self.child.wait().await.ok()
    }

    /// Prints the tail of both logs to stderr (shown by libtest for failed tests).
    pub(crate) fn dump_logs(&self) {
        for (stream, path) in [("stdout", &self.stdout_path), ("stderr", &self.stderr_path)] {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(LOG_TAIL_LINES);
            eprintln!(
                "----- {} {stream}: last {} of {} lines ({}) -----",
                self.name,
                lines.len() - from,
                lines.len(),
                path.display()
            );
            for line in &lines[from..] {
                eprintln!("{line}");
            }
        }
        eprintln!("----- end of {} logs -----", self.name);
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
            if let Some(dir) = self.log_dir.take() {
                eprintln!("{} logs kept in {}", self.name, dir.keep().display());
            }
        }
    }
}

/// A CSI driver process serving a Unix socket in its own temporary directory.
#[derive(Debug)]
pub(crate) struct DriverProcess {
    /// The driver process (dropped, and so killed, before the socket directory).
    pub(crate) process: ChildProcess,
    /// Path of the driver's Unix socket.
    pub(crate) socket: PathBuf,
    /// Directory of the socket, removed on drop.
    _socket_dir: TempDir,
}

impl DriverProcess {
    /// Starts `program` with the arguments `args(socket path)` and waits until
    /// the socket file exists.
    pub(crate) async fn start(
        name: &str,
        program: &Path,
        args: impl FnOnce(&Path) -> Vec<String>,
    ) -> DriverProcess {
        let socket_dir = tempfile::Builder::new()
            .prefix("ah-sock-")
            .tempdir()
            .expect("cannot create a temporary directory for a socket");
        let socket = socket_dir.path().join("csi.sock");
        let mut cmd = Command::new(program);
        cmd.args(args(&socket));
        let mut process = ChildProcess::spawn(name, cmd);
        let start = Instant::now();
        while !socket.exists() {
            if let Some(status) = process.exited() {
                panic!(
                    "{name} exited ({status}) before creating {}",
                    socket.display()
                );
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "{name} did not create {} within {START_TIMEOUT:?}",
                socket.display()
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        DriverProcess {
            process,
            socket,
            _socket_dir: socket_dir,
        }
    }

    /// The socket as a `unix://` endpoint URL.
    pub(crate) fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

/// Options of the Go `mockcsi` driver (tools/testbins/k8s/cmd/mockcsi).
#[derive(Clone, Debug)]
pub(crate) struct MockCsiOptions {
    /// Volumes to pre-create (`--volumes`).
    pub(crate) volumes: usize,
    /// Sleep before every Controller(Un)PublishVolume (`--publish-delay`).
    pub(crate) publish_delay: Option<Duration>,
    /// Fail every Nth Controller(Un)PublishVolume (`--fail-every`; 0: never).
    pub(crate) fail_every: u64,
    /// gRPC code name of injected failures (`--fail-code`, e.g. `Unavailable`).
    pub(crate) fail_code: Option<String>,
    /// Restrict injected failures to this method (`--fail-method`).
    pub(crate) fail_method: Option<String>,
    /// Do not advertise PUBLISH_UNPUBLISH_VOLUME (`--disable-attach`).
    pub(crate) disable_attach: bool,
    /// Further arguments, appended last.
    pub(crate) extra_args: Vec<String>,
}

impl Default for MockCsiOptions {
    fn default() -> Self {
        MockCsiOptions {
            volumes: 2,
            publish_delay: None,
            fail_every: 0,
            fail_code: None,
            fail_method: None,
            disable_attach: false,
            extra_args: Vec::new(),
        }
    }
}

/// The Go mock CSI driver on a per-test socket. Its only node ID is its
/// driver name; it logs `"call" method="<RPC>"` for every call (`-v=2`).
#[derive(Debug)]
pub(crate) struct MockCsi {
    /// Driver name (`--name`), also the node ID the mock accepts.
    pub(crate) driver: String,
    /// IDs of the pre-created volumes, in order (`vol-0`, `vol-1`, ...).
    pub(crate) volumes: Vec<String>,
    /// The process and its socket.
    pub(crate) driver_process: DriverProcess,
}

impl MockCsi {
    /// Starts `mockcsi --name <driver>` and waits for its `ready` line.
    pub(crate) async fn start(cluster: &Cluster, driver: &str, opts: MockCsiOptions) -> MockCsi {
        let program = cluster.bin("mockcsi");
        let driver_name = driver.to_string();
        let mut driver_process = DriverProcess::start("mockcsi", &program, move |socket| {
            let mut args = vec![
                format!("--endpoint={}", socket.display()),
                format!("--name={driver_name}"),
                format!("--volumes={}", opts.volumes),
                "-v=2".to_string(),
            ];
            if let Some(delay) = opts.publish_delay {
                args.push(format!("--publish-delay={}ms", delay.as_millis()));
            }
            if opts.fail_every > 0 {
                args.push(format!("--fail-every={}", opts.fail_every));
            }
            if let Some(code) = opts.fail_code {
                args.push(format!("--fail-code={code}"));
            }
            if let Some(method) = opts.fail_method {
                args.push(format!("--fail-method={method}"));
            }
            if opts.disable_attach {
                args.push("--disable-attach".to_string());
            }
            args.extend(opts.extra_args);
            args
        })
        .await;
        driver_process
            .process
            .wait_for_output("ready\n", 1, START_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("mockcsi {driver} did not become ready: {e}"));
        let volumes = driver_process
            .process
            .stdout()
            .lines()
            .filter(|l| l.starts_with("vol-"))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect();
        MockCsi {
            driver: driver.to_string(),
            volumes,
            driver_process,
        }
    }

    /// The node ID to put into CSINode entries for this driver.
    pub(crate) fn node_id(&self) -> &str {
        &self.driver
    }

    /// Path of the driver's socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.driver_process.socket
    }

    /// How many calls of CSI method `method` (e.g. `ControllerPublishVolume`) the mock has logged.
    pub(crate) fn calls(&self, method: &str) -> usize {
        self.driver_process
            .process
            .count_in_output(&call_marker(method))
    }

    /// Waits until the mock has logged at least `times` calls of `method`.
    pub(crate) async fn wait_for_calls(
        &mut self,
        method: &str,
        times: usize,
        timeout: Duration,
    ) -> Result<(), String> {
        self.driver_process
            .process
            .wait_for_output(&call_marker(method), times, timeout)
            .await
    }
}

/// The klog line fragment mockcsi writes for each call of `method`.
fn call_marker(method: &str) -> String {
    format!("\"call\" method=\"{method}\"")
}

/// Starts the reference Go external-attacher (v4.13.0) with the attacher
/// identity against the CSI socket `socket`, with an API budget high enough
/// (100 QPS, burst 200) that client-side throttling does not set a local
/// test's pace, and `-v=5` logs. `extra_args` come last and so override the
/// defaults.
pub(crate) fn start_reference_attacher(
    cluster: &Cluster,
    socket: &Path,
    extra_args: &[&str],
) -> ChildProcess {
    let mut cmd = Command::new(cluster.bin("csi-attacher"));
    cmd.arg(format!(
        "--kubeconfig={}",
        cluster.attacher_kubeconfig.display()
    ))
    .arg(format!("--csi-address={}", socket.display()))
    .args([
        "--kube-api-qps=100",
        "--kube-api-burst=200",
        "--timeout=15s",
        "--v=5",
    ])
    .args(extra_args);
    ChildProcess::spawn("csi-attacher", cmd)
}

/// `program args…` in a new UTS namespace whose host name is `hostname` (`unshare --uts`,
/// root only). attacher-hub and external-attacher take their Lease holder identity from the
/// host name, so processes on one machine need one each to be told apart, as pods are. `unshare`
/// and `sh` both exec, so the child's PID is the program's.
pub(crate) fn under_hostname(hostname: &str, program: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--uts",
        "--",
        "sh",
        "-c",
        r#"hostname "$1" && shift && exec "$@""#,
        "sh",
        hostname,
    ])
    .arg(program)
    .args(args);
    cmd
}
