//! The container image, built here and run as the manifests run it:
//!
//! * `scripts/build-image.sh` builds it with buildah FROM scratch (nothing is
//!   pulled) from the release binary (`cargo build --release --locked --bin
//!   attacher-hub`, the Dockerfile's command);
//! * its configuration is the Dockerfile's runtime stage (entrypoint, user,
//!   exposed port), and it holds the binary, the libraries it links, CA
//!   certificates, passwd/group/nsswitch and copyright files: no shell;
//! * podman (runtime runc) runs it with the manifests' security context
//!   (user 65532, read-only root filesystem, every capability dropped, no
//!   privilege escalation), in-cluster configuration from a mounted
//!   ServiceAccount token against the local API server, the shipped base RBAC
//!   and a mock CSI driver's socket mounted at /csi: it attaches and detaches
//!   a VolumeAttachment, answers /metrics, /healthz/leader-election and
//!   /drivers, and on SIGTERM as PID 1 vacates its Lease and exits 0.
//!
//! Missing buildah, podman or runc, or a podman that cannot run containers
//! here, is a failure with the reason, never a skip
//! (`scripts/install-deps.sh` installs them).

use crate::support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use serde_json::Value;

use mock_csi_driver::MockDriver;
use support::{
    Cluster, PvBuilder, WAIT_TIMEOUT, create_node, create_va, http_get, is_attached, repo, tool,
    unique_driver_name, unique_name, wait_deleted, wait_for,
};

/// The Dockerfile's release build (tests/deploy/deploy.rs checks the Dockerfile runs
/// exactly this).
const RELEASE_BUILD: [&str; 6] = [
    "build",
    "--release",
    "--locked",
    "--bin",
    "attacher-hub",
    "--quiet",
];

/// Bound on the image size: the binary (~18 MB), glibc and CA certificates;
/// far above this, something unintended went in.
const MAX_IMAGE_BYTES: u64 = 40_000_000;

/// How to get the tools the image test needs.
const IMAGE_TOOLS: &str = "the image test needs buildah, podman and runc \
     (scripts/install-deps.sh installs them: apt-get install buildah podman runc)";

/// How long the container may take to exit after SIGTERM (nothing in flight).
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// podman's configuration for the test: runc (crun fails on this kernel's
/// hybrid cgroups), cgroupfs, no default ulimits (refused here), events to a
/// file (no journald).
const CONTAINERS_CONF: &str = "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n";

/// Runs a command to completion; (success, stdout, stderr).
fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// podman with the test's configuration and container storage.
struct Podman {
    bin: PathBuf,
    work: PathBuf,
}

impl Podman {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.env("CONTAINERS_CONF", self.work.join("containers.conf"))
            .arg("--root")
            .arg(self.work.join("storage/root"))
            .arg("--runroot")
            .arg(self.work.join("storage/runroot"))
            .args(["--storage-driver", "vfs"]);
        cmd
    }

    /// Runs podman with `args`; panics with its output unless it succeeds.
    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = run(self.cmd().args(args));
        assert!(ok, "podman {args:?} failed:\n{out}{err}");
        out
    }
}

/// The Dockerfile's last stage: entrypoint, user, exposed port.
fn dockerfile_runtime_stage() -> (Vec<String>, String, String) {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("read Dockerfile");
    let last = text
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("a multi-stage Dockerfile");
    let field = |keyword: &str| {
        last.lines()
            .filter_map(|l| l.strip_prefix(&format!("{keyword} ")))
            .next_back()
            .unwrap_or_else(|| panic!("no {keyword} in the Dockerfile's last stage"))
            .trim()
            .to_string()
    };
    let entrypoint: Vec<String> =
        serde_json::from_str(&field("ENTRYPOINT")).expect("ENTRYPOINT in JSON form");
    (
        entrypoint,
        field("USER"),
        format!("{}/tcp", field("EXPOSE")),
    )
}

/// The libraries `ldd` resolves for `binary`, as absolute paths without the
/// leading slash (as in an image's file list).
fn linked_libraries(binary: &Path) -> BTreeSet<String> {
    let (ok, out, err) = run(Command::new("ldd").arg(binary));
    assert!(ok, "ldd {}: {err}", binary.display());
    out.lines()
        .filter_map(|l| {
            let l = l.trim();
            match l.split_once(" => ") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => l.split_whitespace().next().filter(|p| p.starts_with('/')),
            }
        })
        .map(|p| p.trim_start_matches('/').to_string())
        .collect()
}

/// The base RBAC (deploy/base/rbac) for a ServiceAccount `attacher-hub` in
/// `ns`, cluster-scoped names suffixed with `ns` so parallel runs do not meet.
fn base_rbac(cluster: &Cluster, ns: &str) -> String {
    let (ok, out, err) = run(Command::new(cluster.bin("kubectl"))
        .arg("kustomize")
        .arg(repo().join("deploy/base/rbac")));
    assert!(ok, "kubectl kustomize deploy/base/rbac: {err}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&out).expect("rendered RBAC");
    let mut objs = Vec::new();
    for mut obj in docs.into_iter().filter(|d| !d.is_null()) {
        let cluster_scoped = matches!(
            obj["kind"].as_str(),
            Some("ClusterRole" | "ClusterRoleBinding")
        );
        if cluster_scoped {
            let name = format!("{}-{ns}", obj["metadata"]["name"].as_str().unwrap_or(""));
            obj["metadata"]["name"] = Value::String(name);
        } else {
            obj["metadata"]["namespace"] = Value::String(ns.to_string());
        }
        if obj["kind"] == "ClusterRoleBinding" {
            let role = format!("{}-{ns}", obj["roleRef"]["name"].as_str().unwrap_or(""));
            obj["roleRef"]["name"] = Value::String(role);
        }
        if let Some(subjects) = obj["subjects"].as_array_mut() {
            for s in subjects {
                s["namespace"] = Value::String(ns.to_string());
            }
        }
        objs.push(serde_json::to_string(&obj).expect("JSON"));
    }
    objs.join("\n---\n")
}

fn kubectl(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write as _;
    let mut child = Command::new(cluster.bin("kubectl"))
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubectl");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write to kubectl");
    }
    let out = child.wait_with_output().expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// Removes the test's container, image, namespace and cluster-scoped RBAC
/// also when the test fails half-way.
struct Cleanup<'a> {
    podman: &'a Podman,
    container: String,
    image: Option<String>,
    cluster: &'a Cluster,
    namespace: Option<String>,
    work: Option<tempfile::TempDir>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            let (_, out, err) = run(self.podman.cmd().args(["logs", &self.container]));
            eprintln!("--- container log ---\n{out}{err}");
        }
        let _ = run(self.podman.cmd().args(["rm", "--force", &self.container]));
        if let Some(image) = &self.image {
            let _ = run(self.podman.cmd().args(["rmi", "--force", image]));
        }
        if let Some(ns) = &self.namespace {
            for obj in [
                format!("clusterrolebinding/attacher-hub-{ns}"),
                format!("clusterrole/attacher-hub-{ns}"),
                format!("namespace/{ns}"),
            ] {
                let _ = run(Command::new(self.cluster.bin("kubectl"))
                    .arg(format!(
                        "--kubeconfig={}",
                        self.cluster.kubeconfig.display()
                    ))
                    .args(["delete", "--ignore-not-found", "--wait=false", &obj]));
            }
        }
        if let Some(work) = self.work.take()
            && failed
        {
            eprintln!("image test files kept in {}", work.keep().display());
        }
    }
}

#[tokio::test]
async fn image_built_here_runs_as_the_manifests_run_it() {
    let cluster = Cluster::get();
    let (buildah, podman_bin) = (tool("buildah", IMAGE_TOOLS), tool("podman", IMAGE_TOOLS));
    tool("runc", IMAGE_TOOLS);
    let work = tempfile::Builder::new()
        .prefix("ah-image-")
        .tempdir()
        .expect("temporary directory");
    chmod(work.path(), 0o755);
    std::fs::write(work.path().join("containers.conf"), CONTAINERS_CONF).expect("containers.conf");
    let podman = Podman {
        bin: podman_bin,
        work: work.path().to_path_buf(),
    };
    // Short: also the container's host name (at most 64 characters).
    let container = format!("ah-image-{}", std::process::id());
    let mut cleanup = Cleanup {
        podman: &podman,
        container: container.clone(),
        image: None,
        cluster,
        namespace: None,
        work: Some(work),
    };
    let work = podman.work.clone();

    // podman must be able to run containers here at all; say why not if it cannot.
    let (ok, out, err) = run(podman.cmd().args(["info", "--format", "json"]));
    assert!(
        ok,
        "podman cannot work on this machine, so the image cannot be run:\n{out}{err}\n\
         (this test runs podman as root with runtime runc, cgroupfs and the configuration in \
         {}/containers.conf)",
        work.display()
    );
    let info: Value = serde_json::from_str(&out).expect("podman info JSON");
    eprintln!(
        "podman {} with {} on cgroups {}",
        info["version"]["Version"],
        info["host"]["ociRuntime"]["name"],
        info["host"]["cgroupVersion"]
    );

    // 1. The release binary (a no-op when scripts/test.sh has built it).
    let t0 = Instant::now();
    let mut release = Command::new(env!("CARGO"));
    release.args(RELEASE_BUILD).current_dir(repo());
    support::without_cargo_test_env(&mut release);
    let (ok, _, err) = run(&mut release);
    assert!(ok, "cargo {RELEASE_BUILD:?} failed:\n{err}");
    let release_build = t0.elapsed();
    let binary = repo().join("target/release/attacher-hub");

    // 2. The image.
    let tag = format!("localhost/attacher-hub:{container}");
    let t0 = Instant::now();
    let (ok, out, err) = run(Command::new(repo().join("scripts/build-image.sh"))
        .arg("--binary")
        .arg(&binary)
        .arg("--tag")
        .arg(&tag)
        .arg("--storage")
        .arg(work.join("storage"))
        .env("PATH", {
            let dir = buildah.parent().expect("buildah's directory").to_path_buf();
            let path = std::env::var_os("PATH").unwrap_or_default();
            std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&path)))
                .expect("PATH")
        }));
    assert!(ok, "scripts/build-image.sh failed:\n{out}{err}");
    let build = t0.elapsed();
    cleanup.image = Some(tag.clone());
    let image_id = out.lines().last().unwrap_or_default().trim().to_string();
    assert_eq!(image_id.len(), 64, "the last line is the image ID:\n{out}");

    // 3. Its configuration is the Dockerfile's runtime stage.
    let inspect: Value = serde_json::from_str(&podman.ok(&["image", "inspect", &tag]))
        .expect("podman image inspect JSON");
    let image = &inspect[0];
    let (entrypoint, user, port) = dockerfile_runtime_stage();
    let config = &image["Config"];
    assert_eq!(config["Entrypoint"], serde_json::json!(entrypoint));
    assert_eq!(config["User"], user);
    assert!(
        config["ExposedPorts"].get(&port).is_some(),
        "exposes {port}: {config}"
    );
    assert!(
        config["Cmd"].as_array().is_none_or(Vec::is_empty),
        "no default command: {config}"
    );
    let size = image["Size"].as_u64().expect("image size");
    eprintln!(
        "image {tag}: {:.1} MB ({size} bytes); release build {:.1}s, image build {:.1}s",
        size as f64 / 1e6,
        release_build.as_secs_f64(),
        build.as_secs_f64()
    );
    assert!(size < MAX_IMAGE_BYTES, "the image is {size} bytes");

    // 4. What is in it: the binary, its libraries, certificates, account
    //    files and copyright notices; no shell, nothing else.
    let created = podman.ok(&["create", "--name", &container, &tag]);
    assert!(!created.trim().is_empty());
    let archive = work.join("rootfs.tar");
    podman.ok(&["export", "--output", &archive.to_string_lossy(), &container]);
    let (ok, listing, err) = run(Command::new("tar").arg("-tf").arg(&archive));
    assert!(ok, "listing the image's files: {err}");
    let files: BTreeSet<String> = listing
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| l.trim_start_matches("./").to_string())
        .collect();
    let mut expected: BTreeSet<String> = linked_libraries(&binary);
    expected.extend(
        [
            entrypoint[0].trim_start_matches('/'),
            "etc/passwd",
            "etc/group",
            "etc/nsswitch.conf",
            "etc/ssl/certs/ca-certificates.crt",
        ]
        .map(str::to_string),
    );
    let (docs, rest): (BTreeSet<String>, BTreeSet<String>) = files
        .iter()
        .cloned()
        .partition(|f| f.starts_with("usr/share/doc/") && f.ends_with("/copyright"));
    assert_eq!(
        rest, expected,
        "files of the image (besides copyright notices)"
    );
    assert!(
        docs.iter().any(|d| d.contains("/libc6/")),
        "glibc's copyright notice ships with glibc: {docs:?}"
    );
    let (ok, _, err) = run(podman.cmd().args([
        "run",
        "--rm",
        "--pull=never",
        "--network=none",
        "--entrypoint=/bin/sh",
        &tag,
        "-c",
        "true",
    ]));
    assert!(!ok, "the image has a shell");
    assert!(
        err.contains("/bin/sh") && err.contains("no such file"),
        "running /bin/sh fails for want of it:\n{err}"
    );
    podman.ok(&["rm", &container]);

    // 5. In the cluster: a namespace, the shipped base RBAC for the
    //    ServiceAccount attacher-hub, a token for it (what the kubelet mounts).
    let ns = container.clone();
    cleanup.namespace = Some(ns.clone());
    kubectl(cluster, &["create", "namespace", &ns], None);
    kubectl(
        cluster,
        &["apply", "-f", "-"],
        Some(&base_rbac(cluster, &ns)),
    );
    let token = kubectl(
        cluster,
        &[
            "create",
            "token",
            "attacher-hub",
            "-n",
            &ns,
            "--duration=1h",
        ],
        None,
    );
    let sa_dir = work.join("serviceaccount");
    std::fs::create_dir_all(&sa_dir).expect("serviceaccount dir");
    std::fs::write(sa_dir.join("token"), token.trim()).expect("token");
    std::fs::write(sa_dir.join("namespace"), &ns).expect("namespace");
    let pki = cluster
        .kubeconfig
        .parent()
        .expect("cluster directory")
        .join("pki/ca.crt");
    std::fs::copy(&pki, sa_dir.join("ca.crt")).expect("ca.crt");
    for f in ["token", "namespace", "ca.crt"] {
        chmod(&sa_dir.join(f), 0o644);
    }
    chmod(&sa_dir, 0o755);
    let admin = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("kubeconfig");
    let server = admin.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .expect("server URL");
    let api_port = server
        .rsplit(':')
        .next()
        .expect("port")
        .trim_end_matches('/');

    // 6. A mock CSI driver whose socket the container's user can connect to
    //    (the manifests run the driver as the same user).
    let driver = unique_driver_name("image");
    let csi_dir = work.join("csi");
    std::fs::create_dir_all(&csi_dir).expect("socket dir");
    chmod(&csi_dir, 0o755);
    let socket = csi_dir.join("csi.sock");
    let mock = MockDriver::new(&driver)
        .volumes(1)
        .serve(&socket)
        .await
        .unwrap_or_else(|e| panic!("serving mock {driver}: {e}"));
    std::os::unix::fs::chown(&socket, Some(65532), Some(65532)).expect("chown socket");

    // 7. The container, as the sidecar manifest runs it: its arguments (the
    //    HTTP endpoint on loopback: the container shares the host's network),
    //    POD_NAMESPACE, user 65532, read-only root filesystem without tmpfs,
    //    no capabilities, no privilege escalation.
    let http_port = free_port();
    let mount = |from: &Path, to: &str, ro: bool| {
        format!(
            "--volume={}:{to}{}",
            from.display(),
            if ro { ":ro" } else { "" }
        )
    };
    let t0 = Instant::now();
    podman.ok(&[
        "run",
        "--detach",
        "--pull=never",
        "--name",
        &container,
        "--hostname",
        &container,
        "--network=host",
        "--user=65532:65532",
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        &mount(&csi_dir, "/csi", false),
        &mount(
            &sa_dir,
            "/var/run/secrets/kubernetes.io/serviceaccount",
            true,
        ),
        "--env=KUBERNETES_SERVICE_HOST=127.0.0.1",
        &format!("--env=KUBERNETES_SERVICE_PORT={api_port}"),
        &format!("--env=POD_NAMESPACE={ns}"),
        "--env=ADDRESS=/csi/csi.sock",
        &tag,
        "--csi-address=/csi/csi.sock",
        "--leader-election",
        &format!("--http-endpoint=127.0.0.1:{http_port}"),
    ]);
    let started = loop {
        if let Ok((200, _)) = http_get(http_port, "/healthz").await {
            break t0.elapsed();
        }
        let state = podman.ok(&["inspect", "--format", "{{.State.Status}}", &container]);
        assert!(
            state.trim() == "running",
            "the container is {state} before serving HTTP"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no HTTP on port {http_port} within 60s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The process really runs as 65532 without capabilities.
    let top = podman.ok(&["top", &container, "user", "capeff"]);
    let row: Vec<&str> = top
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert!(
        matches!(row.as_slice(), ["65532", "none"] | ["nonroot", "none"]),
        "process user and effective capabilities: {top}"
    );

    // 8. Attach and detach a VolumeAttachment.
    let client = cluster.client().await;
    let node = unique_name("ah-image-node");
    create_node(&client, &node).await;
    let csinodes: Api<CSINode> = Api::all(client.clone());
    csinodes
        .create(
            &PostParams::default(),
            &CSINode {
                status: None,
                metadata: ObjectMeta {
                    name: Some(node.clone()),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![CSINodeDriver {
                        name: driver.clone(),
                        node_id: node.clone(),
                        ..CSINodeDriver::default()
                    }],
                },
            },
        )
        .await
        .expect("create CSINode");
    let pv_name = unique_name("ah-image-pv");
    PvBuilder::new(&pv_name, &driver, "vol-0")
        .create(&client)
        .await;
    let va_name = unique_name("ah-image-va");
    create_va(&client, &va_name, &driver, &node, &pv_name).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let t0 = Instant::now();
    wait_for(
        &vas,
        &va_name,
        "status.attached=true",
        is_attached(),
        WAIT_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("the containerized hub did not attach: {e}"));
    let attached = t0.elapsed();
    vas.delete(&va_name, &DeleteParams::default())
        .await
        .expect("delete the VolumeAttachment");
    wait_deleted(&vas, &va_name, WAIT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("the containerized hub did not detach: {e}"));
    let calls: Vec<String> = mock
        .calls()
        .into_iter()
        .filter(|c| c.method.starts_with("Controller") && c.method.ends_with("ublishVolume"))
        .map(|c| format!("{} {:?}", c.method, c.grpc_code()))
        .collect();
    assert!(
        calls.contains(&"ControllerPublishVolume Some(Ok)".to_string())
            && calls.contains(&"ControllerUnpublishVolume Some(Ok)".to_string()),
        "the driver saw {calls:?}"
    );

    // 9. The HTTP endpoints of the manifests' probes and of Prometheus.
    let (status, body) = http_get(http_port, "/healthz/leader-election")
        .await
        .expect("GET /healthz/leader-election");
    assert_eq!((status, body.as_str()), (200, "ok"), "liveness probe");
    let (status, metrics) = http_get(http_port, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    for needle in [
        format!(
            "csi_sidecar_operations_seconds_count{{driver_name=\"{driver}\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/ControllerPublishVolume\"}}"
        ),
        format!("leader_election_master_status{{driver_name=\"{driver}\""),
        "process_resident_memory_bytes".to_string(),
    ] {
        assert!(metrics.contains(&needle), "/metrics lacks {needle}");
    }
    let (status, drivers) = http_get(http_port, "/drivers").await.expect("GET /drivers");
    let drivers: Value = serde_json::from_str(&drivers).expect("/drivers JSON");
    assert_eq!(status, 200);
    assert_eq!(drivers[0]["state"]["state"], "leading", "{drivers}");
    let lease_name = drivers[0]["lease"]
        .as_str()
        .expect("lease name")
        .to_string();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease = leases.get(&lease_name).await.expect("the driver's Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        drivers[0]["leaseHolder"].as_str(),
        "the Lease is held in the pod's namespace by the container"
    );

    // 10. SIGTERM to PID 1: an orderly exit with code 0.
    let t0 = Instant::now();
    podman.ok(&["kill", "--signal=TERM", &container]);
    let mut waiter = podman
        .cmd()
        .args(["wait", &container])
        .stdout(Stdio::piped())
        .spawn()
        .expect("podman wait");
    let code = loop {
        if let Some(status) = waiter.try_wait().expect("podman wait") {
            let mut out = String::new();
            use std::io::Read as _;
            waiter
                .stdout
                .take()
                .expect("stdout")
                .read_to_string(&mut out)
                .expect("read podman wait");
            assert!(status.success(), "podman wait failed");
            break out.trim().to_string();
        }
        assert!(
            t0.elapsed() < STOP_TIMEOUT,
            "the container did not exit within {STOP_TIMEOUT:?} of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stopped = t0.elapsed();
    let (_, out, err) = run(podman.cmd().args(["logs", &container]));
    let log = format!("{out}{err}");
    assert_eq!(code, "0", "exit code after SIGTERM; log:\n{log}");
    assert!(
        log.contains("received a termination signal"),
        "the hub handled SIGTERM itself:\n{log}"
    );
    // ... having vacated its Lease, so the next leader need not wait it out.
    let lease = leases.get(&lease_name).await.expect("the driver's Lease");
    assert!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .is_none_or(str::is_empty),
        "the Lease is vacated on SIGTERM: {:?}",
        lease.spec
    );
    eprintln!(
        "container: HTTP up {:.1}s after start, attached in {:.1}s, exited {:.1}s after SIGTERM",
        started.as_secs_f64(),
        attached.as_secs_f64(),
        stopped.as_secs_f64()
    );

    // The PV keeps the hub's finalizer until deleted; clean it up.
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let _ = pvs
        .patch(
            &pv_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let _ = pvs.delete(&pv_name, &DeleteParams::default()).await;
    drop(mock);
    drop(cleanup);
}
