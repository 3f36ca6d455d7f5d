//! The container image `make release` builds, run as the manifests run it, and
//! the release's other artifacts checked against it and against the source:
//!
//! * `scripts/release.sh` (make release) builds it with `scripts/build-image.sh`,
//!   buildah FROM scratch (nothing is pulled), from the release binary (`cargo
//!   build --release --locked --bin attacher-hub`, the Dockerfile's command),
//!   and exports it as an OCI archive, which podman loads here;
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
    Cluster, PvBuilder, WAIT_TIMEOUT, create_node, create_va, http_get, is_attached, release, repo,
    tool, unique_driver_name, unique_name, wait_deleted, wait_for,
};

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
async fn the_release_image_runs_as_the_manifests_run_it() {
    let cluster = Cluster::get();
    // buildah for scripts/release.sh, found on the PATH as the script finds it.
    tool("buildah", IMAGE_TOOLS);
    let podman_bin = tool("podman", IMAGE_TOOLS);
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

    // 1. The release (reused when scripts/release.sh finds it up to date).
    let t0 = Instant::now();
    let release = release::release();
    let release_build = t0.elapsed();
    let binary = release.file("binary");

    // 2. Its image, loaded from the OCI archive.
    let tag = release.str(&["image", "reference"]).to_string();
    let t0 = Instant::now();
    let loaded = podman.ok(&[
        "load",
        "--input",
        &release.image_archive().to_string_lossy(),
    ]);
    assert!(loaded.contains(&tag), "podman load names {tag}:\n{loaded}");
    let build = t0.elapsed();
    cleanup.image = Some(tag.clone());

    // 3. Its configuration is the Dockerfile's runtime stage.
    let inspect: Value = serde_json::from_str(&podman.ok(&["image", "inspect", &tag]))
        .expect("podman image inspect JSON");
    let image = &inspect[0];
    // The image that runs is the one whose digest the release's chart names.
    assert_eq!(
        image["Digest"].as_str(),
        Some(release.str(&["image", "digest"])),
        "the loaded image's manifest digest"
    );
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
        "image {tag}: {:.1} MB ({size} bytes); make release {:.1}s, podman load {:.1}s",
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

/// `make release`'s artifacts agree with the source and with each other: the checksums; the
/// binary's version (Cargo.toml's, with the commit); the image's digest, labels and
/// configuration (the Dockerfile's last stage); the SBOM (the crates of Cargo.lock the binary
/// is built from, and the image's Debian packages); the chart (its versions and the image's
/// digest). Needs buildah and the Go test tools (helm), no control plane.
#[test]
fn release_artifacts_agree_with_the_source_and_with_each_other() {
    tool("buildah", IMAGE_TOOLS);
    let release = release::release();
    let version = release.str(&["version"]).to_string();

    // Every file is listed in SHA256SUMS and matches it; LICENSE and CHANGELOG are the tree's.
    let (ok, out, err) = run(Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&release.dir));
    assert!(
        ok,
        "sha256sum --check in {}:\n{out}{err}",
        release.dir.display()
    );
    let listed: BTreeSet<&str> = out.lines().filter_map(|l| l.strip_suffix(": OK")).collect();
    let archive = release.str(&["image", "archive"]).to_string();
    for name in [
        release.str(&["binary"]),
        release.str(&["sbom"]),
        release.str(&["chart"]),
        archive.as_str(),
        "LICENSE",
        "CHANGELOG.md",
        "release.json",
    ] {
        assert!(listed.contains(name), "SHA256SUMS lists {name}: {listed:?}");
    }
    for name in ["LICENSE", "CHANGELOG.md"] {
        let read =
            |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            read(release.dir.join(name)) == read(repo().join(name)),
            "{name}"
        );
    }

    // The version: what the binary prints, Cargo.toml's, built from the checked-out commit.
    let binary = release.file("binary");
    let (ok, out, _) = run(Command::new(&binary).arg("--version"));
    assert!(ok);
    assert_eq!(out, format!("{} v{version}\n", binary.display()));
    let package = env!("CARGO_PKG_VERSION");
    assert!(
        version == package || version.starts_with(&format!("{package}+")),
        "{version} is Cargo.toml's {package} with build metadata"
    );
    let git = |args: &[&str]| {
        let (ok, out, err) = run(Command::new("git")
            .env("TZ", "UTC")
            .arg("-C")
            .arg(repo())
            .args(args));
        assert!(ok, "git {args:?}: {err}");
        out.trim().to_string()
    };
    let head = git(&["rev-parse", "HEAD"]);
    assert_eq!(release.str(&["revision"]), head);

    check_release_image(release, &version, &head, &git);
    check_release_sbom(release, &version);
    check_release_chart(release, &version);
}

/// The release's image: its manifest digest, its OCI labels, its configuration (the Dockerfile's
/// last stage) and the binary in it (the released one).
fn check_release_image(
    release: &release::Release,
    version: &str,
    head: &str,
    git: &dyn Fn(&[&str]) -> String,
) {
    let image = release::unpacked_image();
    assert_eq!(image.digest, release.str(&["image", "digest"]));
    let labels = &image.config["Labels"];
    let created = git(&[
        "log",
        "-1",
        "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
        "--format=%cd",
    ]);
    for (key, want) in [
        ("title", "attacher-hub"),
        ("version", version),
        ("revision", head),
        ("licenses", env!("CARGO_PKG_LICENSE")),
        ("created", &created),
    ] {
        let key = format!("org.opencontainers.image.{key}");
        assert_eq!(labels[&key].as_str(), Some(want), "label {key}: {labels}");
    }
    assert!(
        labels["org.opencontainers.image.description"].is_string(),
        "{labels}"
    );
    // Where the source is: IMAGE_SOURCE, else the git remote origin; no label without either.
    let source = std::env::var("IMAGE_SOURCE")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            let (ok, out, _) = run(Command::new("git")
                .arg("-C")
                .arg(repo())
                .args(["remote", "get-url", "origin"]));
            ok.then(|| out.trim().to_string())
        });
    assert_eq!(
        labels["org.opencontainers.image.source"].as_str(),
        source.as_deref(),
        "{labels}"
    );
    assert_eq!(&release.record["image"]["labels"], labels);
    let (entrypoint, user, port) = dockerfile_runtime_stage();
    assert_eq!(image.config["Entrypoint"], serde_json::json!(entrypoint));
    assert_eq!(image.config["User"], user);
    assert!(image.config["ExposedPorts"].get(&port).is_some());
    let in_image = image.root.join(entrypoint[0].trim_start_matches('/'));
    let released = release.file("binary");
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(
        read(&in_image) == read(&released),
        "the image's {} is the released binary",
        entrypoint[0]
    );
}

/// The SBOM lists exactly the crates of Cargo.lock that the binary is built from (its normal
/// and build dependencies, all the way down, for the target it names) and the Debian packages
/// whose files the image holds.
fn check_release_sbom(release: &release::Release, version: &str) {
    let text = std::fs::read_to_string(release.file("sbom")).expect("the SBOM");
    let sbom: Value = serde_json::from_str(&text).expect("the SBOM is JSON");
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["metadata"]["component"]["name"], "attacher-hub");
    assert_eq!(sbom["metadata"]["component"]["version"], version);
    let components = sbom["components"].as_array().expect("components");
    let purls: Vec<&str> = components
        .iter()
        .filter_map(|c| c["purl"].as_str())
        .collect();
    let crates: BTreeSet<(String, String)> = components
        .iter()
        .filter(|c| {
            c["purl"]
                .as_str()
                .is_some_and(|p| p.starts_with("pkg:cargo/"))
        })
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["version"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let target = sbom["metadata"]["properties"]
        .as_array()
        .and_then(|p| {
            p.iter()
                .find(|p| p["name"] == "cdx:rustc:sbom:target:triple")
        })
        .and_then(|p| p["value"].as_str())
        .expect("the SBOM names its target");
    let lock = cargo_lock_packages();
    for c in &crates {
        assert!(lock.contains(c), "{c:?} of the SBOM is not in Cargo.lock");
    }
    let built_from = dependencies_of_the_binary(target);
    assert_eq!(
        crates.difference(&built_from).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "crates in the SBOM that the binary is not built from"
    );
    assert_eq!(
        built_from.difference(&crates).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "crates the binary is built from that the SBOM leaves out"
    );
    for package in ["libc6", "libgcc-s1", "ca-certificates"] {
        let (ok, out, _) = run(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]));
        assert!(ok, "dpkg-query {package}");
        assert!(
            purls
                .iter()
                .any(|p| p.starts_with(&format!("pkg:deb/debian/{package}@{out}?"))),
            "the SBOM lists {package} {out}: {purls:?}"
        );
    }
}

/// Every (name, version) of Cargo.lock.
fn cargo_lock_packages() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(repo().join("Cargo.lock")).expect("Cargo.lock");
    let mut packages = BTreeSet::new();
    for block in text.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(&format!("{key} = \""))
                    .and_then(|v| v.strip_suffix('"'))
                    .map(str::to_string)
            })
        };
        if let (Some(name), Some(version)) = (field("name"), field("version")) {
            packages.insert((name, version));
        }
    }
    packages
}

/// The packages attacher-hub is built from for `target`: its normal and build dependencies
/// and theirs, all the way down (`cargo metadata`'s resolve graph), itself left out.
fn dependencies_of_the_binary(target: &str) -> BTreeSet<(String, String)> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args([
        "metadata",
        "--format-version=1",
        "--locked",
        "--offline",
        "--filter-platform",
        target,
    ])
    .current_dir(repo());
    support::without_cargo_test_env(&mut cmd);
    let (ok, out, err) = run(&mut cmd);
    assert!(ok, "cargo metadata: {err}");
    let metadata: Value = serde_json::from_str(&out).expect("cargo metadata JSON");
    let nodes = metadata["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes");
    let packages = metadata["packages"].as_array().expect("packages");
    let root = packages
        .iter()
        .find(|p| p["name"] == "attacher-hub")
        .and_then(|p| p["id"].as_str())
        .expect("attacher-hub's package id");
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        let node = nodes
            .iter()
            .find(|n| n["id"] == id)
            .expect("a resolve node");
        for dep in node["deps"].as_array().into_iter().flatten() {
            let built = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            let pkg = dep["pkg"].as_str().expect("a dependency's id");
            if built && seen.insert(pkg) {
                todo.push(pkg);
            }
        }
    }
    packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| seen.contains(id)))
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["version"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The chart: packaged with the release's version as its version and appVersion, and its image
/// named by the image's digest when rendered.
fn check_release_chart(release: &release::Release, version: &str) {
    let chart = release.file("chart");
    let member = |name: &str| {
        let (ok, out, err) = run(Command::new("tar")
            .arg("-xzOf")
            .arg(&chart)
            .arg(format!("attacher-hub/{name}")));
        assert!(ok, "{name} in {}: {err}", chart.display());
        serde_saphyr::from_str::<Value>(&out).expect("YAML")
    };
    let chart_yaml = member("Chart.yaml");
    assert_eq!(chart_yaml["version"], version);
    assert_eq!(chart_yaml["appVersion"], version);
    let digest = release.str(&["image", "digest"]);
    assert_eq!(member("values.yaml")["image"]["digest"], digest);
    let helm = support::testbin(support::testbins(), "helm");
    let (ok, out, err) = run(Command::new(helm)
        .args(["template", "attacher-hub"])
        .arg(&chart)
        .args(["--namespace", "attacher-hub"]));
    assert!(ok, "helm template {}: {err}", chart.display());
    let image = format!("image: registry.example.com/attacher-hub@{digest}");
    assert!(
        out.contains(&image),
        "the rendered chart runs {image}:\n{out}"
    );
}
