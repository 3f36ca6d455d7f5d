//! Finding (or starting) the shared local control plane and building clients.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The local control plane shared by every test of a run.
///
/// Found through the environment written by `scripts/cluster-up.sh`
/// (`ATTACHER_TEST_KUBECONFIG`, `ATTACHER_TEST_ATTACHER_KUBECONFIG`,
/// `ATTACHER_TESTBINS`). When `ATTACHER_TEST_KUBECONFIG` is unset the harness
/// runs `scripts/cluster-up.sh` itself (the script's lock lets parallel test
/// binaries share one control plane, which is left running for the next run;
/// `make cluster-down` stops it). A control plane that cannot be had is a test
/// failure, never a skip.
#[derive(Debug)]
pub(crate) struct Cluster {
    /// kubeconfig of `test-admin` (group `system:masters`).
    pub(crate) kubeconfig: PathBuf,
    /// kubeconfig of `system:serviceaccount:default:csi-attacher`, bound to
    /// `scripts/attacher-rbac.yaml` only.
    pub(crate) attacher_kubeconfig: PathBuf,
    /// Directory with the Go test tools (`mockcsi`, `csi-attacher`, `kubectl`, ...).
    pub(crate) testbins: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

impl Cluster {
    /// The shared control plane; starts it on first use if the environment
    /// does not name one. Panics with the reason when there is none.
    pub(crate) fn get() -> &'static Cluster {
        CLUSTER.get_or_init(|| match std::env::var_os("ATTACHER_TEST_KUBECONFIG") {
            Some(kubeconfig) => Cluster::from_env(PathBuf::from(kubeconfig)),
            None => Cluster::start(),
        })
    }

    fn from_env(kubeconfig: PathBuf) -> Cluster {
        let var = |name: &str| {
            std::env::var_os(name).map(PathBuf::from).unwrap_or_else(|| {
                panic!("ATTACHER_TEST_KUBECONFIG is set but {name} is not; source the env file written by scripts/cluster-up.sh")
            })
        };
        Cluster::checked(
            kubeconfig,
            var("ATTACHER_TEST_ATTACHER_KUBECONFIG"),
            var("ATTACHER_TESTBINS"),
        )
    }

    fn start() -> Cluster {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = std::env::var_os("ATTACHER_TEST_CLUSTER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join(".work/cluster"));
        cluster_up(
            &[],
            &dir,
            "no control plane for the integration tests",
            &dir,
        );
        let env_file = dir.join("env");
        let text = std::fs::read_to_string(&env_file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", env_file.display()));
        let env = parse_env_file(&text);
        let get = |name: &str| {
            env.get(name)
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("{} does not define {name}", env_file.display()))
        };
        Cluster::checked(
            get("ATTACHER_TEST_KUBECONFIG"),
            get("ATTACHER_TEST_ATTACHER_KUBECONFIG"),
            get("ATTACHER_TESTBINS"),
        )
    }

    fn checked(kubeconfig: PathBuf, attacher_kubeconfig: PathBuf, testbins: PathBuf) -> Cluster {
        for file in [&kubeconfig, &attacher_kubeconfig] {
            assert!(
                file.is_file(),
                "kubeconfig {} does not exist",
                file.display()
            );
        }
        assert!(
            testbins.is_dir(),
            "test tools directory {} does not exist; run `make testbins`",
            testbins.display()
        );
        Cluster {
            kubeconfig,
            attacher_kubeconfig,
            testbins,
        }
    }

    /// A client with the admin identity. Build one per test: a client is tied
    /// to the Tokio runtime it was created on.
    pub(crate) async fn client(&self) -> Client {
        client_from(&self.kubeconfig).await
    }

    /// A client with the attacher identity (only the RBAC of `docs/design.md#rbac`).
    pub(crate) async fn attacher_client(&self) -> Client {
        client_from(&self.attacher_kubeconfig).await
    }

    /// Path of one of the Go test tools; panics if it is missing.
    pub(crate) fn bin(&self, name: &str) -> PathBuf {
        super::testbin(&self.testbins, name)
    }
}

/// Builds a client from a kubeconfig file with `Config::from_custom_kubeconfig`.
async fn client_from(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("cannot read kubeconfig {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("invalid kubeconfig {}: {e}", path.display()));
    let client = Client::try_from(config)
        .unwrap_or_else(|e| panic!("cannot build a client from {}: {e}", path.display()));
    // Fail here, with the reason, rather than in the middle of a test.
    if let Err(e) = client.apiserver_version().await {
        panic!(
            "the API server of {} does not answer ({e}); is the control plane running? \
             (scripts/cluster-up.sh starts it; unset ATTACHER_TEST_KUBECONFIG to let the tests start it)",
            path.display()
        );
    }
    client
}

/// Parses the `export NAME=value` lines of the env file.
fn parse_env_file(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("export "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches(['"', '\'']).to_string()))
        .collect()
}

/// Runs `scripts/cluster-up.sh FLAGS DIR`; a failure fails the test with `what`, the command,
/// its exit status and where its logs are. stderr is inherited, so that a first (slow) build
/// of the Go tools shows progress.
pub(crate) fn cluster_up(flags: &[&str], dir: &Path, what: &str, logs: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster-up.sh");
    let out = Command::new(&script)
        .args(flags)
        .arg(dir)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{what}: {} {} {} failed ({}); see {}",
        script.display(),
        flags.join(" "),
        dir.display(),
        out.status,
        logs.display(),
    );
}
