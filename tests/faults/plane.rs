//! The fault suite's own control plane: `scripts/faults.sh` starts it with
//! `scripts/cluster-up.sh` in a directory of its own and names it in
//! `ATTACHER_FAULTS_CLUSTER_DIR`. Scenarios that kill etcd or the API server
//! need it and refuse to run on any other (a shared control plane must never
//! be killed under other tests).
//!
//! A killed component is started again with exactly the command line it had
//! (read from `/proc/<pid>/cmdline`), in a session of its own, appending to
//! its log, and its new PID goes to `<dir>/<name>.pid` so that
//! `scripts/cluster-down.sh` still stops it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::Cluster;

/// The environment variable naming the fault suite's cluster directory.
pub(crate) const DIR_ENV: &str = "ATTACHER_FAULTS_CLUSTER_DIR";

/// A component of the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Component {
    Etcd,
    ApiServer,
}

impl Component {
    fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "apiserver",
        }
    }
}

/// The fault suite's control plane.
#[derive(Debug)]
pub(crate) struct Plane {
    dir: PathBuf,
}

impl Plane {
    /// The control plane of `ATTACHER_FAULTS_CLUSTER_DIR`, which must be the
    /// one the test harness uses. Panics with instructions otherwise.
    pub(crate) fn get(cluster: &Cluster) -> Plane {
        let dir = std::env::var_os(DIR_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                panic!(
                    "this scenario kills etcd or the API server, so it needs the fault suite's own \
                 control plane: run it with `make faults` (scripts/faults.sh sets {DIR_ENV})"
                )
            });
        let admin = dir.join("admin.kubeconfig");
        assert!(
            same_file(&admin, &cluster.kubeconfig),
            "{DIR_ENV}={} but the tests use {}; refusing to kill a control plane other tests may share",
            dir.display(),
            cluster.kubeconfig.display()
        );
        Plane { dir }
    }

    fn pid(&self, c: Component) -> u32 {
        let file = self.dir.join(format!("{}.pid", c.name()));
        std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{} does not hold a PID: {e}", file.display()))
    }

    /// SIGKILLs `c`, waits until it is gone, and returns its command line.
    pub(crate) fn kill9(&self, c: Component) -> Vec<String> {
        let pid = self.pid(c);
        let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("{} (pid {pid}) is not running: {e}", c.name()));
        let argv: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        assert!(
            argv.iter().any(|a| a.contains(self.dir.to_str().unwrap())),
            "pid {pid} does not belong to {}: {argv:?}",
            self.dir.display()
        );
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let start = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{} (pid {pid}) survived SIGKILL for 10s",
                c.name()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        argv
    }

    /// Starts `c` again with `argv`.
    pub(crate) fn start(&self, c: Component, argv: &[String]) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join(format!("{}.log", c.name())))
            .expect("open the component's log");
        let child = Command::new("setsid")
            .args(argv)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("restarting {}: {e}", c.name()));
        std::fs::write(
            self.dir.join(format!("{}.pid", c.name())),
            format!("{}\n", child.id()),
        )
        .expect("write the PID file");
        // The child outlives this handle; `setsid` execs (the test process is
        // not a group leader), so the PID is the component's.
        drop(child);
    }
}

/// Waits until the API server answers through `client`; returns how long it took.
pub(crate) async fn wait_api(client: &kube::Client, bound: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(3), api.get("default")).await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "the API server did not answer within {bound:?} after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
