//! What `deploy/` and the `Dockerfile` ship, checked against the real API
//! server and the real binary:
//!
//! * the Dockerfile builds with the release command CI uses, and its final
//!   stage (binary path, user, entrypoint) is what the manifests expect;
//! * every overlay renders with kubectl's kustomize, and every rendered object
//!   passes a server-side dry run (the Prometheus Operator kinds against the
//!   test-only CRDs in `tests/deploy/monitoring-crds.yaml`);
//! * the shipped RBAC is exactly what attacher-hub uses: authenticated as the
//!   shipped ServiceAccount with the shipped RBAC applied, attacher-hub holds
//!   its Lease, lists the driver's Lease in all namespaces (the cross-namespace
//!   Lease guard) and attaches and detaches VolumeAttachments whose PVs carry a
//!   controller-publish secret; with any single verb of any rule removed, it
//!   does not get there.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::process::Command;

use support::{
    ChildProcess, Cluster, PvBuilder, create_csinode, create_node, create_va, documents,
    is_attached, kind, name, repo, sanitize_driver_name, unique_driver_name, unique_name,
    wait_deleted, wait_for,
};

/// The release build, as CI and the Dockerfile's builder stage run it.
const RELEASE_BUILD: &str = "cargo build --release --locked --bin attacher-hub";

/// The overlays under `deploy/overlays`.
const OVERLAYS: [&str; 5] = [
    "sidecar",
    "hub",
    "daemonset",
    "controller-pool",
    "observability",
];

/// Image name (before the tag) of attacher-hub containers in the overlays.
const IMAGE: &str = "registry.example.com/attacher-hub";

/// The image's user and group (Dockerfile `USER`).
const IMAGE_UID: i64 = 65532;

/// How long each step of an RBAC scenario may take. A healthy hub needs a
/// second or two; variants that lack a rule wait this long at the step that
/// needs it, all in parallel.
const STEP_TIMEOUT: Duration = Duration::from_secs(25);

// === Dockerfile =========================================================

/// One build stage of the Dockerfile: its name and its instructions
/// (keyword in upper case, arguments as written, continuation lines joined).
#[derive(Debug)]
struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter(|(k, _)| k == keyword)
            .map(|(_, a)| a.as_str())
            .collect()
    }

    fn one(&self, keyword: &str) -> &str {
        let all = self.all(keyword);
        assert_eq!(
            all.len(),
            1,
            "stage {:?} has {} {keyword} instructions, expected one",
            self.name,
            all.len()
        );
        all[0]
    }
}

fn parse_dockerfile(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            logical.push(std::mem::take(&mut current));
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical.iter().filter(|l| !l.is_empty()) {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.split_whitespace().collect::<Vec<_>>().join(" ");
        if keyword == "FROM" {
            let words: Vec<&str> = args.split(' ').collect();
            let name = (words.len() == 3 && words[1].eq_ignore_ascii_case("as"))
                .then(|| words[2].to_string());
            stages.push(Stage {
                from: words[0].to_string(),
                name,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((keyword, args));
        }
    }
    stages
}

/// What the manifests must agree with: the final stage's entrypoint and user.
#[derive(Debug)]
pub(crate) struct Image {
    pub(crate) entrypoint: Vec<String>,
    pub(crate) uid: i64,
    pub(crate) gid: i64,
}

/// The Dockerfile's runtime stage, checked against CI's build and the project's layout.
pub(crate) fn image_from_dockerfile() -> Image {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("read Dockerfile");
    let stages = parse_dockerfile(&text);
    assert_eq!(stages.len(), 2, "builder and runtime stages: {stages:#?}");
    let (builder, runtime) = (&stages[0], &stages[1]);
    let builder_name = builder.name.as_deref().expect("the builder stage is named");

    // The builder runs exactly CI's release build, and nothing else.
    assert_eq!(builder.all("RUN"), vec![RELEASE_BUILD], "builder RUN lines");
    assert!(
        builder.from.contains("rust:") && builder.from.contains("bookworm"),
        "builder on a Debian 12 Rust image (glibc of distroless cc-debian12): {}",
        builder.from
    );
    let workdir = builder.one("WORKDIR");
    // Everything the builder copies exists and is let through .dockerignore.
    let dockerignore =
        std::fs::read_to_string(repo().join(".dockerignore")).expect("read .dockerignore");
    let allowed: BTreeSet<&str> = dockerignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    let mut copied = BTreeSet::new();
    for copy in builder.all("COPY") {
        let words: Vec<&str> = copy.split(' ').collect();
        for src in &words[..words.len() - 1] {
            let src = src.trim_end_matches('/');
            assert!(repo().join(src).exists(), "COPY source {src} is missing");
            assert!(allowed.contains(src), ".dockerignore does not let {src} in");
            copied.insert(src.to_string());
        }
    }
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "proto",
        "src",
        "crates",
    ] {
        assert!(
            copied.contains(needed),
            "the builder does not copy {needed}"
        );
    }

    // The runtime stage: distroless, the binary at /attacher-hub, non-root.
    assert!(
        runtime.from.starts_with("gcr.io/distroless/cc-debian12"),
        "runtime base: {}",
        runtime.from
    );
    let binary = format!("{workdir}/target/release/attacher-hub");
    assert_eq!(
        runtime.one("COPY"),
        format!("--from={builder_name} {binary} /attacher-hub"),
        "the runtime stage copies the release binary to /attacher-hub"
    );
    let entrypoint: Vec<String> =
        serde_json::from_str(runtime.one("ENTRYPOINT")).expect("ENTRYPOINT in exec (JSON) form");
    assert_eq!(entrypoint, vec!["/attacher-hub".to_string()]);
    let user = runtime.one("USER");
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    let image = Image {
        entrypoint,
        uid: uid.parse().expect("numeric uid"),
        gid: gid.parse().expect("numeric gid"),
    };
    assert_eq!((image.uid, image.gid), (IMAGE_UID, IMAGE_UID));
    image
}

// === rendering ==========================================================

/// Runs kubectl (the test tools' build) as the admin, with `stdin` if given.
async fn kubectl(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use tokio::io::AsyncWriteExt;
    let mut cmd = Command::new(cluster.bin("kubectl"));
    cmd.arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start kubectl");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("kubectl stdin");
        pipe.write_all(input.as_bytes())
            .await
            .expect("write to kubectl");
        drop(pipe);
    }
    let out = child.wait_with_output().await.expect("run kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `kubectl kustomize <dir>` (kustomize built into kubectl).
async fn kustomize(cluster: &Cluster, dir: &Path) -> String {
    let (ok, out) = kubectl(cluster, &["kustomize", &dir.to_string_lossy()], None).await;
    assert!(ok, "kubectl kustomize {} failed:\n{out}", dir.display());
    out
}

fn find<'a>(objs: &'a [Value], k: &str, n: &str) -> &'a Value {
    objs.iter()
        .find(|o| kind(o) == k && name(o) == n)
        .unwrap_or_else(|| panic!("no {k} {n} in the rendered objects"))
}

/// Creates a namespace with the admin client; an existing one is fine.
async fn ensure_namespace(client: &Client, ns: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let obj = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {ns}: {e}"),
    }
}

// === the Dockerfile and the manifests agree ================================

/// Pod template of a workload object.
fn pod_spec(obj: &Value) -> &Value {
    &obj["spec"]["template"]["spec"]
}

/// A field of the container's securityContext, else of the pod's.
fn security<'a>(pod: &'a Value, container: &'a Value, field: &str) -> &'a Value {
    match &container["securityContext"][field] {
        Value::Null => &pod["securityContext"][field],
        v => v,
    }
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The containerPort of a named (or numeric) port of a container.
fn port_number(container: &Value, port: &Value) -> i64 {
    match port {
        Value::Number(n) => n.as_i64().expect("port number"),
        Value::String(s) => container["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["name"] == *s))
            .and_then(|p| p["containerPort"].as_i64())
            .unwrap_or_else(|| panic!("no port named {s}")),
        other => panic!("bad port {other}"),
    }
}

/// The volume mounted at `mount_path` in `container`, and the mount.
fn volume_at<'a>(pod: &'a Value, container: &'a Value, mount_path: &str) -> (&'a Value, &'a Value) {
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == mount_path))
        .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"));
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
    (volume, mount)
}

/// Checks one attacher-hub container against the image and the conventions
/// of every overlay; returns its arguments.
fn check_hub_container<'a>(
    image: &Image,
    what: &str,
    pod: &'a Value,
    c: &'a Value,
) -> Vec<&'a str> {
    match &c["command"] {
        Value::Null => {}
        cmd => assert_eq!(
            strings(cmd),
            image.entrypoint,
            "{what}: command differs from the image's ENTRYPOINT"
        ),
    }
    assert_eq!(security(pod, c, "readOnlyRootFilesystem"), true, "{what}");
    assert_eq!(
        security(pod, c, "allowPrivilegeEscalation"),
        false,
        "{what}"
    );
    assert_eq!(
        strings(&c["securityContext"]["capabilities"]["drop"]),
        vec!["ALL"],
        "{what}: drops every capability"
    );
    assert!(
        c["securityContext"]["capabilities"]["add"].is_null(),
        "{what}: adds no capability"
    );
    let args = strings(&c["args"]);
    assert!(
        args.contains(&"--http-endpoint=:8080") && args.contains(&"--leader-election"),
        "{what}: {args:?}"
    );
    assert_eq!(
        port_number(c, &json!("http-metrics")),
        8080,
        "{what}: metrics port"
    );
    let probe = &c["livenessProbe"]["httpGet"];
    assert_eq!(
        probe["path"], "/healthz/leader-election",
        "{what}: liveness"
    );
    assert_eq!(
        port_number(c, &probe["port"]),
        8080,
        "{what}: liveness port"
    );
    assert!(
        c["env"]
            .as_array()
            .is_some_and(|env| env.iter().any(|e| e["name"] == "POD_NAMESPACE"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace")),
        "{what}: Leases go to the pod's namespace"
    );
    assert!(
        c["resources"]["requests"]["cpu"].is_string()
            && c["resources"]["requests"]["memory"].is_string(),
        "{what}: resource requests"
    );
    args
}

/// The user checks of a container that runs as the image's user.
fn check_image_user(image: &Image, what: &str, pod: &Value, c: &Value) {
    assert_eq!(security(pod, c, "runAsNonRoot"), true, "{what}");
    assert_eq!(security(pod, c, "runAsUser"), image.uid, "{what}");
    assert_eq!(security(pod, c, "runAsGroup"), image.gid, "{what}");
}

/// The attacher-hub containers of a rendered overlay, with their pods.
fn hub_containers(objs: &[Value]) -> Vec<(&Value, &Value, &Value)> {
    let mut out = Vec::new();
    for obj in objs {
        let pod = pod_spec(obj);
        for c in pod["containers"].as_array().into_iter().flatten() {
            if c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with(&format!("{IMAGE}:")))
            {
                out.push((obj, pod, c));
            }
        }
    }
    out
}

#[tokio::test]
async fn dockerfile_and_manifests_agree() {
    let cluster = Cluster::get();
    let image = image_from_dockerfile();
    let overlays = repo().join("deploy/overlays");

    // Sidecar: external-attacher's arguments, socket on a memory emptyDir.
    let objs = documents(&kustomize(cluster, &overlays.join("sidecar")).await);
    let hubs = hub_containers(&objs);
    assert_eq!(
        hubs.len(),
        1,
        "one attacher-hub container in the sidecar overlay"
    );
    let (_, pod, c) = hubs[0];
    let args = check_hub_container(&image, "sidecar", pod, c);
    check_image_user(&image, "sidecar", pod, c);
    assert!(args.contains(&"--csi-address=$(ADDRESS)"), "{args:?}");
    let address = c["env"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["name"] == "ADDRESS"))
        .and_then(|e| e["value"].as_str())
        .expect("env ADDRESS");
    let socket_dir = Path::new(address).parent().expect("socket directory");
    let (volume, _) = volume_at(pod, c, &socket_dir.to_string_lossy());
    assert_eq!(
        volume["emptyDir"]["medium"], "Memory",
        "socket on a memory emptyDir"
    );
    let drivers: Vec<&Value> = pod["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter(|d| d["name"] != c["name"])
        .collect();
    assert!(
        drivers
            .iter()
            .any(|d| volume_at(pod, d, &socket_dir.to_string_lossy()).0 == volume),
        "the driver container shares the socket volume"
    );

    // Hub: two replicas, drivers.yaml from a ConfigMap, sockets shared in the pod.
    let objs = documents(&kustomize(cluster, &overlays.join("hub")).await);
    let hubs = hub_containers(&objs);
    assert_eq!(hubs.len(), 1);
    let (deployment, pod, c) = hubs[0];
    assert_eq!(kind(deployment), "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let args = check_hub_container(&image, "hub", pod, c);
    check_image_user(&image, "hub", pod, c);
    let config = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .expect("--config");
    assert_eq!(config, "/etc/attacher-hub/drivers.yaml");
    let (volume, mount) = volume_at(pod, c, "/etc/attacher-hub");
    assert!(
        mount["subPath"].is_null(),
        "no subPath, so edits reach the pod"
    );
    let cm = find(
        &objs,
        "ConfigMap",
        volume["configMap"]["name"]
            .as_str()
            .expect("a ConfigMap volume"),
    );
    let drivers_yaml: Value = serde_saphyr::from_str(
        cm["data"]["drivers.yaml"]
            .as_str()
            .expect("drivers.yaml in the ConfigMap"),
    )
    .expect("drivers.yaml is YAML");
    let entries = drivers_yaml["drivers"].as_array().expect("drivers: list");
    assert!(entries.len() >= 2, "the example serves several drivers");
    for entry in entries {
        let address = entry["address"].as_str().expect("address");
        let path = Path::new(address.strip_prefix("unix://").unwrap_or(address));
        let dir = path.parent().expect("socket dir").to_string_lossy();
        let (socket_volume, _) = volume_at(pod, c, &dir);
        assert_eq!(socket_volume["emptyDir"]["medium"], "Memory");
        let served = pod["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .filter(|d| d["name"] != c["name"])
            .any(|d| strings(&d["args"]).iter().any(|a| a.contains(address)));
        assert!(served, "no driver container listens on {address}");
    }
    let readiness = &c["readinessProbe"]["httpGet"];
    assert_eq!(readiness["path"], "/readyz");
    assert_eq!(port_number(c, &readiness["port"]), 8080);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let pdb = objs
        .iter()
        .find(|o| kind(o) == "PodDisruptionBudget")
        .expect("a PodDisruptionBudget");
    for (k, v) in pdb["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("PDB selector")
    {
        assert_eq!(&labels[k], v, "the PDB selects the hub pods");
    }
    // One replica at a time, whatever the replica count: never `minAvailable`, which with one
    // replica refuses every eviction (tests/deploy/hardening.rs checks every budget).
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"]["minAvailable"].is_null());
    // A replica that is not Ready serves nothing; evicting it never waits for the budget.
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    let anti = &pod["affinity"]["podAntiAffinity"];
    assert!(
        anti["preferredDuringSchedulingIgnoredDuringExecution"].is_array()
            || anti["requiredDuringSchedulingIgnoredDuringExecution"].is_array(),
        "podAntiAffinity"
    );

    // DaemonSet: discovery under a hostPath; the one documented root container.
    let objs = documents(&kustomize(cluster, &overlays.join("daemonset")).await);
    let hubs = hub_containers(&objs);
    assert_eq!(hubs.len(), 1);
    let (ds, pod, c) = hubs[0];
    assert_eq!(kind(ds), "DaemonSet");
    let args = check_hub_container(&image, "daemonset", pod, c);
    let glob = args
        .iter()
        .find_map(|a| a.strip_prefix("--driver-sockets="))
        .expect("--driver-sockets");
    assert_eq!(glob, "/var/lib/kubelet/plugins/*/csi.sock");
    let (volume, mount) = volume_at(pod, c, "/var/lib/kubelet/plugins");
    assert_eq!(
        mount["readOnly"], true,
        "plugins directory mounted read-only"
    );
    assert_eq!(
        volume["hostPath"]["path"], "/var/lib/kubelet/plugins",
        "hostPath from node-settings.yaml"
    );
    assert_eq!(
        pod["nodeSelector"]["attacher-hub.example.com/pool"], "storage",
        "node pool from node-settings.yaml"
    );
    assert!(
        objs.iter().all(|o| name(o) != "attacher-hub-node-settings"),
        "node-settings.yaml is local configuration, not sent to the cluster"
    );
    // Root (to reach root-owned 0755 driver sockets) without any capability.
    assert_eq!(security(pod, c, "runAsUser"), 0);
    assert_eq!(security(pod, c, "runAsNonRoot"), false);

    // Every overlay runs attacher-hub only as checked above.
    for overlay in OVERLAYS {
        let objs = documents(&kustomize(cluster, &overlays.join(overlay)).await);
        for (obj, pod, _) in hub_containers(&objs) {
            assert_eq!(
                pod["serviceAccountName"],
                "attacher-hub",
                "{overlay}: {}",
                name(obj)
            );
        }
    }
}

// === every overlay passes a server-side dry run =============================

#[tokio::test]
async fn every_overlay_renders_and_passes_a_server_side_dry_run() {
    let cluster = Cluster::get();
    let client = cluster.client().await;

    // The Prometheus Operator kinds, from the test-only CRDs.
    let crds = repo().join("tests/deploy/monitoring-crds.yaml");
    let (ok, out) = kubectl(
        cluster,
        &["apply", "--server-side", "-f", &crds.to_string_lossy()],
        None,
    )
    .await;
    assert!(ok, "applying the test CRDs: {out}");
    let (ok, out) = kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
        None,
    )
    .await;
    assert!(ok, "test CRDs not established: {out}");

    for overlay in OVERLAYS {
        let yaml = kustomize(cluster, &repo().join("deploy/overlays").join(overlay)).await;
        let objs = documents(&yaml);
        assert!(!objs.is_empty(), "{overlay} renders nothing");
        let namespaces: BTreeSet<&str> = objs
            .iter()
            .filter_map(|o| o["metadata"]["namespace"].as_str())
            .collect();
        for ns in &namespaces {
            ensure_namespace(&client, ns).await;
        }
        let (ok, out) = kubectl(
            cluster,
            &["apply", "--dry-run=server", "-o", "name", "-f", "-"],
            Some(&yaml),
        )
        .await;
        assert!(ok, "server-side dry run of {overlay} failed:\n{out}");
        // kubectl prints the accepted objects as `kind/name`; warnings (Pod Security's, for
        // a namespace a test left at another level) come on lines of their own.
        let accepted = out
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("Warning:"))
            .count();
        assert_eq!(
            accepted,
            objs.len(),
            "{overlay}: the API server accepted {accepted} of {} objects:\n{out}",
            objs.len()
        );
    }
}

// === RBAC: exactly the verbs attacher-hub uses ==============================

/// The base RBAC plus the publish-secrets and lease-guard components, rendered
/// through a kustomization next to copies of the directories (kustomize
/// refuses absolute paths, and the target directory may be anywhere).
async fn render_shipped_rbac(cluster: &Cluster) -> Vec<Value> {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("create directory");
        for entry in std::fs::read_dir(from).expect("read directory") {
            let entry = entry.expect("directory entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("file type").is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).expect("copy file");
            }
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("ah-rbac-render-")
        .tempdir()
        .expect("temporary kustomization directory");
    for part in [
        "deploy/base/rbac",
        "deploy/components/publish-secrets",
        "deploy/components/lease-guard",
    ] {
        copy_dir(&repo().join(part), &dir.path().join(part));
    }
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources:\n  - deploy/base/rbac\n\
         components:\n  - deploy/components/publish-secrets\n  - deploy/components/lease-guard\n",
    )
    .expect("write kustomization");
    documents(&kustomize(cluster, dir.path()).await)
}

/// One verb of one resource in one rule of a shipped (Cluster)Role.
#[derive(Clone, Debug)]
struct Grant {
    kind: String,
    role: String,
    resource: String,
    verb: String,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {} {}",
            self.kind, self.role, self.resource, self.verb
        )
    }
}

fn grants(objs: &[Value]) -> Vec<Grant> {
    let mut out = Vec::new();
    for obj in objs
        .iter()
        .filter(|o| kind(o) == "ClusterRole" || kind(o) == "Role")
    {
        for rule in obj["rules"].as_array().expect("rules") {
            let resources = strings(&rule["resources"]);
            assert_eq!(resources.len(), 1, "one resource per rule: {rule}");
            for verb in strings(&rule["verbs"]) {
                out.push(Grant {
                    kind: kind(obj).to_string(),
                    role: name(obj).to_string(),
                    resource: resources[0].to_string(),
                    verb: verb.to_string(),
                });
            }
        }
    }
    out
}

/// The shipped objects moved to namespace `ns`, cluster-scoped names given
/// the suffix `-<ns>` (so that variants run side by side), without `removed`.
fn variant_objects(shipped: &[Value], ns: &str, removed: Option<&Grant>) -> Vec<Value> {
    let cluster_scoped = |k: &str| k == "ClusterRole" || k == "ClusterRoleBinding";
    let mut objs = shipped.to_vec();
    for obj in &mut objs {
        let k = kind(obj).to_string();
        if cluster_scoped(&k) {
            let n = format!("{}-{ns}", name(obj));
            obj["metadata"]["name"] = json!(n);
        } else {
            obj["metadata"]["namespace"] = json!(ns);
        }
        if obj["roleRef"]["kind"] == "ClusterRole" {
            let n = format!(
                "{}-{ns}",
                obj["roleRef"]["name"].as_str().unwrap_or_default()
            );
            obj["roleRef"]["name"] = json!(n);
        }
        if let Some(subjects) = obj["subjects"].as_array_mut() {
            for s in subjects {
                s["namespace"] = json!(ns);
            }
        }
        if let Some(g) = removed
            && k == g.kind
            && name(obj)
                .strip_suffix(&format!("-{ns}"))
                .unwrap_or(name(obj))
                == g.role
        {
            let rules = obj["rules"].as_array_mut().expect("rules");
            for rule in rules.iter_mut() {
                if strings(&rule["resources"]) == [g.resource.as_str()] {
                    let verbs: Vec<&str> = strings(&rule["verbs"])
                        .into_iter()
                        .filter(|v| *v != g.verb)
                        .collect();
                    rule["verbs"] = json!(verbs);
                }
            }
            rules.retain(|r| !strings(&r["verbs"]).is_empty());
        }
    }
    objs
}

/// A client certificate and kubeconfig for `system:serviceaccount:<ns>:<sa>`
/// (groups `system:serviceaccounts`, `system:serviceaccounts:<ns>`), signed
/// by the test control plane's CA as scripts/cluster-up.sh does.
async fn service_account_kubeconfig(cluster: &Cluster, dir: &Path, ns: &str, sa: &str) -> PathBuf {
    let pki = cluster
        .kubeconfig
        .parent()
        .expect("cluster directory")
        .join("pki");
    let run = |args: Vec<String>| async move {
        let out = Command::new("openssl")
            .args(&args)
            .output()
            .await
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();
    std::fs::write(
        dir.join("client.ext"),
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE\n",
    )
    .expect("write client.ext");
    run(vec![
        "req".into(),
        "-newkey".into(),
        "ec".into(),
        "-pkeyopt".into(),
        "ec_paramgen_curve:prime256v1".into(),
        "-nodes".into(),
        "-keyout".into(),
        p("sa.key"),
        "-out".into(),
        p("sa.csr"),
        "-subj".into(),
        format!(
            "/O=system:serviceaccounts/O=system:serviceaccounts:{ns}/CN=system:serviceaccount:{ns}:{sa}"
        ),
    ])
    .await;
    let serial = format!(
        "0x{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    );
    run(vec![
        "x509".into(),
        "-req".into(),
        "-in".into(),
        p("sa.csr"),
        "-CA".into(),
        pki.join("ca.crt").to_string_lossy().into_owned(),
        "-CAkey".into(),
        pki.join("ca.key").to_string_lossy().into_owned(),
        "-set_serial".into(),
        serial,
        "-days".into(),
        "1".into(),
        "-out".into(),
        p("sa.crt"),
        "-extfile".into(),
        p("client.ext"),
    ])
    .await;
    let admin = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("admin kubeconfig");
    let server = admin.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .expect("server URL");
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n- name: sa\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n\
             contexts:\n- name: local\n  context: {{cluster: local, user: sa, namespace: {ns}}}\n\
             current-context: local\n",
            ca = pki.join("ca.crt").display(),
            crt = p("sa.crt"),
            key = p("sa.key"),
        ),
    )
    .expect("write kubeconfig");
    path
}

/// A namespace name short enough for the certificate's group
/// `system:serviceaccounts:<ns>` (an O attribute holds at most 64 bytes).
fn short_namespace() -> String {
    use std::sync::atomic::AtomicU32;
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    format!(
        "ah-rbac-{:x}-{:x}-{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// How far a scenario got.
#[derive(Debug)]
enum Outcome {
    /// Every step happened.
    Passed,
    /// `step` did not happen within its time.
    Failed { step: &'static str, why: String },
}

/// Runs attacher-hub as the shipped ServiceAccount of a fresh namespace with
/// `objects` (the shipped RBAC, maybe less one verb) applied, and walks it
/// through what it must do. Cleans up what it created.
async fn rbac_scenario(cluster: &Cluster, shipped: &[Value], removed: Option<Grant>) -> Outcome {
    let client = cluster.client().await;
    let ns = short_namespace();
    ensure_namespace(&client, &ns).await;
    let objects = variant_objects(shipped, &ns, removed.as_ref());
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let (ok, out) = kubectl(cluster, &["apply", "-f", "-"], Some(&list.to_string())).await;
    assert!(ok, "applying the RBAC of {ns}: {out}");

    let dir = tempfile::Builder::new()
        .prefix("ah-rbac-")
        .tempdir()
        .expect("temp dir");
    let kubeconfig = service_account_kubeconfig(cluster, dir.path(), &ns, "attacher-hub").await;

    // The driver, its publish secret, and the first volume, made before the
    // hub starts (found by the initial lists).
    let driver = unique_driver_name("rbac");
    let socket = dir.path().join("csi.sock");
    let mock = mock_csi_driver::MockDriver::new(&driver)
        .volumes(2)
        .serve(&socket)
        .await
        .expect("start the mock driver");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("publish".to_string()),
                    ..ObjectMeta::default()
                },
                string_data: Some(BTreeMap::from([(
                    "password".to_string(),
                    "s3cret".to_string(),
                )])),
                ..Secret::default()
            },
        )
        .await
        .expect("create the publish secret");
    let node1 = unique_name("node1");
    create_node(&client, &node1).await;
    create_csinode(&client, &node1, &driver, &node1).await;
    let (pv1, va1) = (unique_name("pv1"), unique_name("va1"));
    PvBuilder::new(&pv1, &driver, "vol-0")
        .controller_publish_secret("publish", &ns)
        .create(&client)
        .await;
    create_va(&client, &va1, &driver, &node1, &pv1).await;

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attacher-hub"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--csi-address={}", socket.display()))
        .args([
            "--leader-election",
            &format!("--leader-election-namespace={ns}"),
            "--leader-election-lease-duration=6s",
            "--leader-election-renew-deadline=4s",
            "--leader-election-retry-period=1s",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
            "--timeout=5s",
            "-v=4",
        ]);
    // Paginated lists, as where the API server refuses streaming ones: the watches then also
    // `list` PVs, VAs and CSINodes, which the RBAC grants for that fallback (a streaming list
    // is a `watch`; tests/api/rbac_behaviour.rs records both).
    cmd.env("KUBE_FEATURE_WatchListClient", "false");
    // Also names the log directory: no `/`.
    let label = match &removed {
        None => "attacher-hub-shipped-rbac".to_string(),
        Some(g) => format!("attacher-hub-without-{}-{}", g.resource, g.verb).replace('/', "-"),
    };
    let mut hub = ChildProcess::spawn(&label, cmd);

    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease_name = format!("external-attacher-leader-{}", sanitize_driver_name(&driver));
    let identity = attacher_hub::leader::default_identity().expect("host name");
    let node2 = unique_name("node2");
    let (pv2, va2) = (unique_name("pv2"), unique_name("va2"));

    let outcome = async {
        let fail = |step: &'static str| {
            move |e: support::WaitError| Outcome::Failed {
                step,
                why: e.to_string(),
            }
        };
        wait_for(&vas, &va1, "attached", is_attached(), STEP_TIMEOUT)
            .await
            .map_err(fail("attach a VA listed at start"))?;
        // Made after the initial lists: only watches can tell the hub.
        create_node(&client, &node2).await;
        create_csinode(&client, &node2, &driver, &node2).await;
        PvBuilder::new(&pv2, &driver, "vol-1")
            .controller_publish_secret("publish", &ns)
            .create(&client)
            .await;
        create_va(&client, &va2, &driver, &node2, &pv2).await;
        wait_for(&vas, &va2, "attached", is_attached(), STEP_TIMEOUT)
            .await
            .map_err(fail("attach a VA, PV and CSINode created later"))?;
        // The Lease is ours and renewed (not just acquired).
        let start = Instant::now();
        loop {
            let lease = leases.get_opt(&lease_name).await.ok().flatten();
            let spec = lease.and_then(|l| l.spec).unwrap_or_default();
            let renewed = matches!((&spec.acquire_time, &spec.renew_time),
                (Some(a), Some(r)) if r.0 > a.0);
            if spec.holder_identity.as_deref() == Some(identity.as_str()) && renewed {
                break;
            }
            if start.elapsed() > STEP_TIMEOUT {
                return Err(Outcome::Failed {
                    step: "hold the Lease",
                    why: format!("Lease {ns}/{lease_name}: {spec:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The cross-namespace Lease guard listed the driver's Lease in all namespaces.
        hub.wait_for_output("no other namespace holds the Lease", 1, STEP_TIMEOUT)
            .await
            .map_err(|why| Outcome::Failed {
                step: "list Leases in all namespaces (the Lease guard)",
                why,
            })?;
        for va in [&va1, &va2] {
            vas.delete(va, &DeleteParams::default())
                .await
                .expect("delete a VA");
        }
        for va in [&va1, &va2] {
            wait_deleted(&vas, va, STEP_TIMEOUT)
                .await
                .map_err(fail("detach"))?;
        }
        let left = mock.state().attachments();
        if !left.is_empty() {
            return Err(Outcome::Failed {
                step: "detach",
                why: format!("the driver still publishes {left:?}"),
            });
        }
        Ok::<(), Outcome>(())
    }
    .await
    .err()
    .unwrap_or(Outcome::Passed);

    if removed.is_none() && !matches!(outcome, Outcome::Passed) {
        hub.dump_logs();
    }
    hub.stop().await;
    mock.shutdown().await;

    // Clean up, finalizers included (a hub that failed may have left some).
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let pp = PatchParams::default();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for va in [&va1, &va2] {
        let _ = vas.patch(va, &pp, &unfinalize).await;
        let _ = vas.delete(va, &DeleteParams::default()).await;
    }
    for pv in [&pv1, &pv2] {
        let _ = pvs.patch(pv, &pp, &unfinalize).await;
        let _ = pvs.delete(pv, &DeleteParams::default()).await;
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let csinodes: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(client.clone());
    for node in [&node1, &node2] {
        let _ = csinodes.delete(node, &DeleteParams::default()).await;
        let _ = nodes.delete(node, &DeleteParams::default()).await;
    }
    let (_, _) = kubectl(
        cluster,
        &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
        Some(&list.to_string()),
    )
    .await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shipped_rbac_is_exactly_what_attacher_hub_uses() {
    let cluster = Cluster::get();
    let shipped = render_shipped_rbac(cluster).await;
    let grants = grants(&shipped);
    // What the ServiceAccount gets, for the log of this test.
    for g in &grants {
        eprintln!("shipped: {g}");
    }
    assert!(
        grants
            .iter()
            .any(|g| g.resource == "secrets" && g.verb == "get"),
        "the publish-secrets component grants secrets get"
    );

    let started = Instant::now();
    // A PV's live `get` happens only when the finalizer patch was built from a stale cached
    // copy, which this scenario cannot bring about on demand; tests/api/rbac_behaviour.rs brings it
    // about (two VAs of one PV at once) and requires the grant.
    let runs = std::iter::once(None)
        .chain(
            grants
                .iter()
                .filter(|g| !(g.resource == "persistentvolumes" && g.verb == "get"))
                .cloned()
                .map(Some),
        )
        .map(|removed| {
            let shipped = shipped.clone();
            async move {
                let outcome = rbac_scenario(cluster, &shipped, removed.clone()).await;
                (removed, outcome)
            }
        });
    let results = futures::future::join_all(runs).await;
    eprintln!("{} scenarios in {:?}", results.len(), started.elapsed());

    let mut unused = Vec::new();
    for (removed, outcome) in &results {
        match (removed, outcome) {
            (None, Outcome::Passed) => eprintln!("shipped RBAC: every step passed"),
            (None, Outcome::Failed { step, why }) => {
                panic!("with the shipped RBAC, attacher-hub failed to {step}: {why}")
            }
            (Some(g), Outcome::Failed { step, .. }) => {
                eprintln!("without {g}: cannot {step}");
            }
            (Some(g), Outcome::Passed) => unused.push(g.to_string()),
        }
    }
    assert!(
        unused.is_empty(),
        "attacher-hub did everything without these rules, so they are not needed: {unused:?}"
    );
}
