//! Security and availability details of every shipped shape, each checked on
//! the objects the real tools render (kubectl's kustomize, Helm 4 and 3, the post-renderer)
//! and, where the API server decides, by the API server:
//!
//! * every attacher-hub container runs with `seccompProfile: RuntimeDefault` on the container
//!   (so that it holds in a vendor's pod that sets none), no privilege escalation, every
//!   capability dropped, a read-only root; as the image's user 65532 in the shapes whose driver
//!   sockets allow it (the sidecar and hub shapes), as root only where the socket is a
//!   vendor's or a node's (swap, hub pod, DaemonSet); every container of the project's own
//!   workloads gets the RuntimeDefault profile;
//! * every PodDisruptionBudget has `maxUnavailable` of at least 1 (never `minAvailable`) and
//!   `unhealthyPodEvictionPolicy: AlwaysAllow`, whatever the replica count: none blocks a drain;
//!   the sidecar shapes have one; the components add none to a vendor's Deployment;
//! * the components and the post-renderer keep the vendor's containers in their order, and the
//!   hub-pod component keeps the vendor's flags (its `command` is the image's entrypoint and
//!   `--config`); topology (b) gets one controller per node (a required anti-affinity against
//!   the Deployment's own pods);
//! * the Pod Security levels docs/deploy.md gives hold: the API server admits what each
//!   component adds at that level and refuses it one level stricter;
//! * the chart creates its namespace with its shape's Pod Security labels (`namespace.create`),
//!   with Helm 4 and Helm 3 as docs/deploy.md installs it, and keeps it when uninstalled.

use crate::deploy::image_from_dockerfile;
use crate::support;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::{Value, json};

use support::{Cluster, documents, kind, kubectl, kustomize, name, repo, run};

/// The chart, relative to the repository.
const CHART: &str = "deploy/helm/attacher-hub";

/// Who attacher-hub runs as in a shape: the image's user, or root without capabilities for a
/// root-owned socket of a vendor or a node.
#[derive(Clone, Copy, Debug, PartialEq)]
enum User {
    Image,
    Root,
}

/// One rendered shape: what it is, its objects, who attacher-hub runs as there, and whether
/// the workload is the project's own (every container then gets the RuntimeDefault profile)
/// or a vendor's (only the containers the project adds or changes).
struct Shape {
    what: String,
    objects: Vec<Value>,
    user: User,
    own: bool,
}

/// `helm template attacher-hub <chart> -n <ns> <args>` with Helm `helm`.
fn chart(helm: &str, ns: &str, args: &[&str]) -> Vec<Value> {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["template", "attacher-hub"])
        .arg(repo().join(CHART))
        .args(["--namespace", ns])
        .current_dir(repo().join(CHART))
        .args(args);
    let (ok, out, err) = run(cmd, None);
    assert!(ok, "{helm} template {args:?}: {err}");
    documents(&out)
}

/// PD's manifests as vendored, for the examples (scripts/vendor-manifests.sh).
fn pd_vendor() -> Vec<Value> {
    support::vendor_manifests(&repo().join("deploy/examples/gce-pd/vendor"));
    documents(&kustomize(
        &repo().join("deploy/examples/gce-pd/vendor/overlays/stable-master"),
    ))
}

/// `manifests` through the post-renderer with `args`.
fn post_rendered(manifests: &[Value], args: &[&str]) -> Vec<Value> {
    let cluster = Cluster::get();
    let mut cmd = Command::new(repo().join("deploy/helm-post-renderer/attacher-hub-post-renderer"));
    cmd.args(args).env("KUBECTL", cluster.bin("kubectl"));
    let stream: Vec<String> = manifests
        .iter()
        .map(|o| serde_json::to_string(o).expect("JSON"))
        .collect();
    let (ok, out, err) = run(cmd, Some(&stream.join("\n---\n")));
    assert!(ok, "the post-renderer {args:?}: {err}");
    documents(&out)
}

/// Every shape the project ships, rendered.
fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for (overlay, user) in [
        ("sidecar", User::Image),
        ("hub", User::Image),
        ("daemonset", User::Root),
        ("controller-pool", User::Root),
    ] {
        out.push(Shape {
            what: format!("deploy/overlays/{overlay}"),
            objects: documents(&kustomize(&repo().join("deploy/overlays").join(overlay))),
            user,
            own: true,
        });
    }
    for helm in ["helm", "helm3"] {
        for (values, user) in [
            (None, User::Root),
            (Some("sidecar"), User::Image),
            (Some("hub"), User::Image),
            (Some("daemonset"), User::Root),
            (Some("controller-pool"), User::Root),
        ] {
            let file = values.map(|v| format!("ci/{v}-values.yaml"));
            let args: Vec<&str> = file.iter().flat_map(|f| ["-f", f.as_str()]).collect();
            out.push(Shape {
                what: format!(
                    "the chart ({helm}) with {}",
                    file.as_deref().unwrap_or("no values")
                ),
                objects: chart(helm, "attacher-hub", &args),
                user,
                own: true,
            });
        }
    }
    let vendor = pd_vendor();
    for example in ["sidecar-swap", "hub-pod"] {
        out.push(Shape {
            what: format!("deploy/examples/gce-pd/{example}"),
            objects: documents(&kustomize(
                &repo().join("deploy/examples/gce-pd").join(example),
            )),
            user: User::Root,
            own: false,
        });
    }
    out.push(Shape {
        what: "PD through the post-renderer".into(),
        objects: post_rendered(&vendor, &["sidecar-swap"]),
        user: User::Root,
        own: false,
    });
    let drivers = repo().join("deploy/examples/aws-ebs/drivers.yaml");
    out.push(Shape {
        what: "EBS's chart through the post-renderer's hub-pod".into(),
        objects: post_rendered(
            &ebs_chart(),
            &["hub-pod", drivers.to_str().expect("a UTF-8 path")],
        ),
        user: User::Root,
        own: false,
    });
    out
}

/// The AWS EBS driver's own chart with `deploy/examples/aws-ebs/values.yaml`, rendered.
fn ebs_chart() -> Vec<Value> {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin("helm"));
    cmd.args(["template", "aws-ebs-csi-driver"])
        .arg(support::ebs_chart())
        .args(["--namespace", "ebs-csi-driver", "-f"])
        .arg(repo().join("deploy/examples/aws-ebs/values.yaml"));
    let (ok, out, err) = run(cmd, None);
    assert!(ok, "helm template of EBS's chart: {err}");
    documents(&out)
}

/// The pod template of a workload.
fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

/// The workloads (Deployments, DaemonSets) among `objs`.
fn workloads(objs: &[Value]) -> Vec<&Value> {
    objs.iter()
        .filter(|o| matches!(kind(o), "Deployment" | "DaemonSet"))
        .collect()
}

/// Whether `c` runs attacher-hub.
fn is_hub(c: &Value) -> bool {
    c["image"]
        .as_str()
        .is_some_and(|i| i.contains("/attacher-hub"))
}

/// A field of `c`'s securityContext, else of the pod's.
fn effective<'a>(pod: &'a Value, c: &'a Value, field: &str) -> &'a Value {
    match &c["securityContext"][field] {
        Value::Null => &pod["securityContext"][field],
        v => v,
    }
}

#[test]
fn every_container_we_add_or_change_has_the_runtime_default_seccomp_profile() {
    let image = image_from_dockerfile();
    let mut problems = Vec::new();
    for shape in shapes() {
        let mut hubs = 0;
        for w in workloads(&shape.objects) {
            let p = pod(w);
            for c in p["containers"].as_array().into_iter().flatten() {
                let what = format!(
                    "{}: {} {}, container {}",
                    shape.what,
                    kind(w),
                    name(w),
                    c["name"]
                );
                if shape.own && effective(p, c, "seccompProfile")["type"] != "RuntimeDefault" {
                    problems.push(format!("{what}: no RuntimeDefault seccomp profile"));
                }
                if !is_hub(c) {
                    continue;
                }
                hubs += 1;
                let sc = &c["securityContext"];
                if sc["seccompProfile"]["type"] != "RuntimeDefault" {
                    problems.push(format!(
                        "{what}: no RuntimeDefault seccomp profile on the container: {sc}"
                    ));
                }
                if sc["allowPrivilegeEscalation"] != false
                    || sc["readOnlyRootFilesystem"] != true
                    || sc["capabilities"]["drop"] != json!(["ALL"])
                    || !sc["capabilities"]["add"].is_null()
                    || sc["privileged"] == true
                {
                    problems.push(format!("{what}: {sc}"));
                }
                let (uid, non_root) = (
                    effective(p, c, "runAsUser"),
                    effective(p, c, "runAsNonRoot"),
                );
                let ok = match shape.user {
                    User::Image => *uid == json!(image.uid) && *non_root == json!(true),
                    User::Root => *uid == json!(0) && *non_root == json!(false),
                };
                if !ok {
                    problems.push(format!(
                        "{what}: runs as {uid} (runAsNonRoot {non_root}), expected {:?}",
                        shape.user
                    ));
                }
            }
        }
        if hubs == 0 {
            problems.push(format!("{}: no attacher-hub container", shape.what));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Whether `selector` (matchLabels) selects pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
}

#[test]
fn pod_disruption_budgets_never_block_a_drain() {
    let mut problems = Vec::new();
    let mut shapes: Vec<(String, Vec<Value>)> =
        shapes().into_iter().map(|s| (s.what, s.objects)).collect();
    // One replica: the budget must still let a drain evict it.
    for shape in ["hub", "sidecar"] {
        let values = format!("ci/{shape}-values.yaml");
        shapes.push((
            format!("the chart with {values}, one replica"),
            chart(
                "helm",
                "attacher-hub",
                &["-f", &values, "--set", "replicaCount=1"],
            ),
        ));
    }
    // The budgets a vendor ships itself (EBS's chart has one for its controller), which the
    // components and the post-renderer leave as they are: the vendor's, not ours.
    let vendors_own: Vec<Value> = pd_vendor()
        .into_iter()
        .chain(ebs_chart())
        .filter(|o| kind(o) == "PodDisruptionBudget")
        .collect();
    for (what, objs) in &shapes {
        let budgets: Vec<&Value> = objs
            .iter()
            .filter(|o| kind(o) == "PodDisruptionBudget" && !vendors_own.contains(o))
            .collect();
        for w in workloads(objs) {
            let labels = &w["spec"]["template"]["metadata"]["labels"];
            let mine: Vec<&&Value> = budgets
                .iter()
                .filter(|b| selects(&b["spec"]["selector"], labels))
                .collect();
            let vendor = !what.starts_with("deploy/overlays") && !what.starts_with("the chart");
            match (kind(w), vendor) {
                // A drain leaves DaemonSet pods alone; a vendor's Deployment keeps its own
                // budgets (a pod under two budgets cannot be evicted at all).
                ("DaemonSet", _) | (_, true) => {
                    if !mine.is_empty() {
                        problems.push(format!("{what}: {} {} got a budget", kind(w), name(w)));
                    }
                }
                _ => {
                    if mine.len() != 1 {
                        problems.push(format!(
                            "{what}: {} {} has {} budgets, expected one",
                            kind(w),
                            name(w),
                            mine.len()
                        ));
                    }
                }
            }
        }
        for b in budgets {
            let spec = &b["spec"];
            let max = &spec["maxUnavailable"];
            let lets_one_go = max.as_i64().is_some_and(|m| m >= 1)
                || max.as_str().is_some_and(|p| p.ends_with('%') && p != "0%");
            if !lets_one_go || !spec["minAvailable"].is_null() {
                problems.push(format!(
                    "{what}: budget {} may block a drain: {spec}",
                    name(b)
                ));
            }
            if spec["unhealthyPodEvictionPolicy"] != "AlwaysAllow" {
                problems.push(format!("{what}: budget {}: {spec}", name(b)));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The names of a workload's containers, in order.
fn container_names(w: &Value) -> Vec<String> {
    pod(w)["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The one Deployment named `n` among `objs`.
fn deployment<'a>(objs: &'a [Value], n: &str) -> &'a Value {
    objs.iter()
        .find(|o| kind(o) == "Deployment" && name(o) == n)
        .unwrap_or_else(|| panic!("no Deployment {n}"))
}

/// The container named `n` of `w`.
fn container<'a>(w: &'a Value, n: &str) -> &'a Value {
    pod(w)["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == n))
        .unwrap_or_else(|| panic!("no container {n}"))
}

#[test]
fn components_keep_the_vendors_containers_and_flags_and_put_one_exported_controller_per_node() {
    const PD: &str = "csi-gce-pd-controller";
    let vendor = pd_vendor();
    let before = deployment(&vendor, PD);
    let order = container_names(before);
    let without_attacher: Vec<String> = order
        .iter()
        .filter(|n| *n != "csi-attacher")
        .cloned()
        .collect();
    let render = |example: &str| -> Vec<Value> {
        documents(&kustomize(
            &repo().join("deploy/examples/gce-pd").join(example),
        ))
    };
    let pool_args = [
        "export-controller-socket",
        "/var/lib/attacher-hub/controllers/pd.csi.storage.gke.io",
        "storage",
    ];
    let results = [
        ("sidecar-swap", render("sidecar-swap"), &order),
        ("hub-pod", render("hub-pod"), &order),
        (
            "controller-pool",
            render("controller-pool"),
            &without_attacher,
        ),
        (
            "post-renderer sidecar-swap",
            post_rendered(&vendor, &["sidecar-swap"]),
            &order,
        ),
        (
            "post-renderer export-controller-socket",
            post_rendered(&vendor, &pool_args),
            &without_attacher,
        ),
    ];
    for (what, objs, expected) in &results {
        assert_eq!(
            &container_names(deployment(objs, PD)),
            *expected,
            "{what}: the vendor's containers are not in their order (the first is what \
             `kubectl logs` and `kubectl exec` pick)"
        );
    }

    // The hub pod keeps the vendor's flags, env, ports and liveness probe; the image's
    // entrypoint runs with --config before them.
    let image = image_from_dockerfile();
    let go = container(before, "csi-attacher");
    let hub = container(deployment(&results[1].1, PD), "csi-attacher");
    for field in ["args", "env", "ports", "livenessProbe"] {
        assert_eq!(
            hub[field], go[field],
            "hub-pod: the vendor's {field} changed"
        );
    }
    let mut command = image.entrypoint.clone();
    command.push("--config=/etc/attacher-hub/drivers.yaml".into());
    assert_eq!(hub["command"], json!(command), "hub-pod: command");
    assert_eq!(
        hub["readinessProbe"]["httpGet"]["port"], go["ports"][0]["containerPort"],
        "hub-pod: readiness on the vendor's --http-endpoint port"
    );

    // Topology (b): one controller per node, whoever exports it.
    for (what, objs, _) in &results[2..] {
        if !what.contains("controller") {
            continue;
        }
        let d = deployment(objs, PD);
        let terms = &pod(d)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
        let labels = &d["spec"]["template"]["metadata"]["labels"];
        let one_per_node = terms.as_array().into_iter().flatten().any(|t| {
            t["topologyKey"] == "kubernetes.io/hostname" && selects(&t["labelSelector"], labels)
        });
        assert!(
            one_per_node,
            "{what}: no required anti-affinity keeps two of the Deployment's pods off one node: {terms}"
        );
        // Only the Deployment's own pods: another driver's controller may share the node.
        let other = deployment(&results[0].1, PD);
        let mut other_labels = other["spec"]["template"]["metadata"]["labels"].clone();
        other_labels["attacher-hub.example.com/socket-export"] = json!("another-controller");
        assert!(
            !terms
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| selects(&t["labelSelector"], &other_labels)),
            "{what}: the anti-affinity also keeps other controllers away: {terms}"
        );
    }
}

// === Pod Security levels ======================================================

/// The Pod Security levels from the most to the least strict.
const LEVELS: [&str; 3] = ["restricted", "baseline", "privileged"];

/// A namespace enforcing `level` (made once per test process).
fn level_namespace(level: &str) -> String {
    let ns = format!("ah-psa-{level}-{}", std::process::id());
    let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns,
        "labels": {"pod-security.kubernetes.io/enforce": level}}});
    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&obj.to_string()));
    assert!(ok, "namespace {ns}: {out}");
    ns
}

/// Whether the API server admits `pod` (a pod spec) in a namespace enforcing `level`
/// (a server-side dry run: nothing is made); the refusal when it does not.
fn admitted(pod: &Value, level: &str) -> Result<(), String> {
    let ns = level_namespace(level);
    let obj = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ah-psa-probe", "namespace": ns}, "spec": pod});
    let (ok, out) = kubectl(
        &["create", "--dry-run=server", "-o", "name", "-f", "-"],
        Some(&obj.to_string()),
    );
    if ok { Ok(()) } else { Err(out) }
}

/// The pod that holds only what a component adds or changes in a vendor's pod: `containers`
/// (as rendered) and the volumes they mount (as rendered).
fn pod_of(workload: &Value, containers: &[&str]) -> Value {
    let p = pod(workload);
    let cs: Vec<Value> = containers
        .iter()
        .map(|n| container(workload, n).clone())
        .collect();
    let mounted: Vec<Value> = cs
        .iter()
        .flat_map(|c| c["volumeMounts"].as_array().cloned().unwrap_or_default())
        .map(|m| m["name"].clone())
        .collect();
    let volumes: Vec<&Value> = p["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| mounted.contains(&v["name"]))
        .collect();
    json!({"containers": cs, "volumes": volumes})
}

/// Checks that `pod` is admitted at `level` and refused at the next stricter one.
fn assert_level(what: &str, pod: &Value, level: &str, problems: &mut Vec<String>) {
    if let Err(why) = admitted(pod, level) {
        problems.push(format!("{what}: refused at {level}: {why}"));
    }
    let i = LEVELS.iter().position(|l| *l == level).expect("a level");
    if i > 0 {
        let stricter = LEVELS[i - 1];
        if admitted(pod, stricter).is_ok() {
            problems.push(format!(
                "{what}: admitted at {stricter}, so docs/deploy.md's {level} is more than it needs"
            ));
        }
    }
}

#[test]
fn the_pod_security_levels_docs_deploy_md_gives_hold() {
    let mut problems = Vec::new();
    const PD: &str = "csi-gce-pd-controller";
    let render = |example: &str| -> Vec<Value> {
        documents(&kustomize(
            &repo().join("deploy/examples/gce-pd").join(example),
        ))
    };
    pd_vendor();
    // What the components add to a vendor's pod: (a) and (c) the attacher container (on the
    // pod's socket emptyDir and, in (c), the drivers.yaml ConfigMap), (b) the hostPath the
    // socket directory becomes (with a container that asks for nothing).
    let swap = render("sidecar-swap");
    assert_level(
        "(a) sidecar swap",
        &pod_of(deployment(&swap, PD), &["csi-attacher"]),
        "baseline",
        &mut problems,
    );
    let hub_pod = render("hub-pod");
    assert_level(
        "(c) hub pod",
        &pod_of(deployment(&hub_pod, PD), &["csi-attacher"]),
        "baseline",
        &mut problems,
    );
    let pool = render("controller-pool");
    let exported = deployment(&pool, PD);
    let socket_dir = pod(exported)["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "socket-dir"))
        .expect("socket-dir")
        .clone();
    let nothing = json!({"name": "driver", "image": "registry.example.com/example-csi-driver:1.0.0",
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}]});
    assert_level(
        "(b) the exported socket directory",
        &json!({"containers": [nothing], "volumes": [socket_dir]}),
        "privileged",
        &mut problems,
    );
    // The project's own shapes, at the level of their namespace (the overlays ship it, the
    // chart renders it with namespace.create).
    for (what, objs) in [
        (
            "deploy/overlays/sidecar",
            documents(&kustomize(&repo().join("deploy/overlays/sidecar"))),
        ),
        (
            "deploy/overlays/hub",
            documents(&kustomize(&repo().join("deploy/overlays/hub"))),
        ),
        (
            "deploy/overlays/controller-pool",
            documents(&kustomize(&repo().join("deploy/overlays/controller-pool"))),
        ),
        (
            "the chart's defaults",
            chart("helm", "attacher-hub", &["--set", "namespace.create=true"]),
        ),
        (
            "the chart's hub shape",
            chart(
                "helm",
                "attacher-hub",
                &["-f", "ci/hub-values.yaml", "--set", "namespace.create=true"],
            ),
        ),
        (
            "the chart's sidecar shape",
            chart(
                "helm",
                "example-csi",
                &[
                    "-f",
                    "ci/sidecar-values.yaml",
                    "--set",
                    "namespace.create=true",
                ],
            ),
        ),
    ] {
        let ns = objs
            .iter()
            .find(|o| kind(o) == "Namespace")
            .unwrap_or_else(|| panic!("{what}: no Namespace"));
        let level = ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: {ns}"))
            .to_string();
        for w in workloads(&objs) {
            assert_level(
                &format!("{what}: {} {}", kind(w), name(w)),
                &pod(w).clone(),
                &level,
                &mut problems,
            );
        }
    }
    for level in LEVELS {
        let (_, _) = kubectl(
            &[
                "delete",
                "namespace",
                &level_namespace(level),
                "--wait=false",
            ],
            None,
        );
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// `helm <args>` against the test cluster.
fn helm(helm: &str, args: &[&str]) -> (bool, String) {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(args)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()));
    let (ok, out, err) = run(cmd, None);
    (ok, format!("{out}{err}"))
}

#[test]
fn the_chart_creates_its_namespace_with_the_pod_security_labels_of_its_shape() {
    let chart = repo().join(CHART);
    let chart = chart.to_string_lossy();
    // docs/deploy.md: the namespace made first, then taken over (Helm 3 and 4); with Helm 4,
    // which creates by server-side apply, --create-namespace alone.
    for (h, shape, level, first) in [
        ("helm", "daemonset", "privileged", true),
        ("helm3", "hub", "restricted", true),
        ("helm", "sidecar", "restricted", false),
    ] {
        let ns = format!("ah-ns-{h}-{shape}-{}", std::process::id());
        let values = format!("{chart}/ci/{shape}-values.yaml");
        let how = if first {
            let (ok, out) = kubectl(&["create", "namespace", &ns], None);
            assert!(ok, "{out}");
            "--take-ownership"
        } else {
            "--create-namespace"
        };
        let (ok, out) = helm(
            h,
            &[
                "install",
                "attacher-hub",
                &chart,
                "-n",
                &ns,
                how,
                "--set",
                "namespace.create=true",
                "-f",
                &values,
            ],
        );
        assert!(
            ok,
            "{h} install {how} into {ns}, as docs/deploy.md writes it:\n{out}"
        );
        let (ok, out) = kubectl(&["get", "namespace", &ns, "-o", "json"], None);
        assert!(ok, "{out}");
        let labels: BTreeMap<String, String> = serde_json::from_value(
            serde_json::from_str::<Value>(&out).expect("JSON")["metadata"]["labels"].clone(),
        )
        .expect("labels");
        assert_eq!(
            labels
                .get("pod-security.kubernetes.io/enforce")
                .map(String::as_str),
            Some(level),
            "{h}, {shape}: {labels:?}"
        );
        if level != "privileged" {
            for mode in ["audit", "warn"] {
                assert_eq!(
                    labels
                        .get(&format!("pod-security.kubernetes.io/{mode}"))
                        .map(String::as_str),
                    Some(level),
                    "{h}, {shape}: {labels:?}"
                );
            }
        }
        let (ok, out) = helm(h, &["uninstall", "attacher-hub", "-n", &ns]);
        assert!(ok, "{h} uninstall: {out}");
        let (ok, out) = kubectl(&["get", "namespace", &ns, "-o", "name"], None);
        assert!(
            ok,
            "{h}: the release's namespace is kept when it is uninstalled: {out}"
        );
        let (_, _) = kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
    }
}

// === a drain, through the eviction API ==========================================

/// The one pod of `deployment` in `ns`, once the ReplicaSet made it, marked Ready as a kubelet
/// would (no kubelet runs here: the pod stays unscheduled, which the budget does not look at).
async fn ready_pod(client: &kube::Client, ns: &str, selector: &str) -> Result<String, String> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let name = loop {
        let list = pods
            .list(&kube::api::ListParams::default().labels(selector))
            .await
            .map_err(|e| e.to_string())?;
        if let [pod] = list.items.as_slice() {
            break pod.metadata.name.clone().unwrap_or_default();
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "no single pod {selector} in {ns}: {}",
                list.items.len()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    pods.patch_status(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}})),
    )
    .await
    .map_err(|e| format!("pod {name}: {e}"))?;
    Ok(name)
}

/// Waits until kube-controller-manager's disruption controller has counted the one Ready pod
/// under the budget of `ns` (its status observed the budget's generation and one healthy pod).
async fn budget_counted(client: &kube::Client, ns: &str) -> Result<(), String> {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let api: kube::Api<PodDisruptionBudget> = kube::Api::namespaced(client.clone(), ns);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let list = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let counted = list.items.first().is_some_and(|b| {
            let status = b.status.clone().unwrap_or_default();
            status.observed_generation.unwrap_or(0) >= b.metadata.generation.unwrap_or(1)
                && status.current_healthy == Some(1)
        });
        if counted {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the disruption controller did not count the pod under the budget: {:?}",
                list.items.first().and_then(|b| b.status.clone())
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Evicts `pod` of `ns` through the eviction API, as `kubectl drain` does: the HTTP status
/// (201: evicted; 429: the budget refuses). The client retries a 429 as client-go does (the
/// API server asks to retry later), so an eviction still refused after `patience` is a 429.
async fn evict(client: &kube::Client, ns: &str, pod: &str, patience: std::time::Duration) -> u16 {
    use k8s_openapi::api::core::v1::Pod;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    match tokio::time::timeout(
        patience,
        pods.evict(pod, &kube::api::EvictParams::default()),
    )
    .await
    {
        Ok(Ok(_)) => 201,
        Ok(Err(kube::Error::Api(s))) => s.code,
        Ok(Err(e)) => panic!("evicting {ns}/{pod}: {e}"),
        Err(_) => 429,
    }
}

/// The chart's hub and sidecar shapes with one replica (a small cluster, or a test one):
/// with kube-controller-manager's disruption controller computing the budgets, a drain evicts
/// the only Ready replica through the eviction API. The same budget with `minAvailable: 1`
/// (what the chart shipped before) refuses it, which shows the test sees a blocked drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_evicts_the_only_replica_of_each_shape() {
    let cluster = Cluster::get();
    support::controller_manager(cluster);
    let client = cluster.client().await;
    let dir = cluster.kubeconfig.parent().expect("cluster directory");
    let mut cmd = tokio::process::Command::new(cluster.bin("kube-controller-manager"));
    cmd.arg(format!(
        "--kubeconfig={}",
        dir.join("controller-manager.kubeconfig").display()
    ))
    .args([
        "--controllers=disruption",
        "--leader-elect=false",
        "--secure-port=0",
    ]);
    let mut disruption = support::ChildProcess::spawn("disruption-controller", cmd);
    let mut problems = Vec::new();

    for (shape, values, selector) in [
        (
            "hub",
            "ci/hub-values.yaml",
            "app.kubernetes.io/component=hub",
        ),
        (
            "sidecar",
            "ci/sidecar-values.yaml",
            "app.kubernetes.io/name=example-csi-controller",
        ),
    ] {
        for (budget, expected) in [("as shipped", 201), ("with minAvailable: 1", 429)] {
            let ns = format!("ah-drain-{shape}-{}-{}", expected, std::process::id());
            let mut objs = chart("helm", &ns, &["-f", values, "--set", "replicaCount=1"]);
            objs.retain(|o| matches!(kind(o), "Deployment" | "PodDisruptionBudget" | "ConfigMap"));
            if expected == 429 {
                for o in objs.iter_mut().filter(|o| kind(o) == "PodDisruptionBudget") {
                    let spec = o["spec"].as_object_mut().expect("spec");
                    spec.remove("maxUnavailable");
                    spec.insert("minAvailable".into(), json!(1));
                }
            }
            let mut list = vec![json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns}})];
            list.extend(objs);
            let list = json!({"apiVersion": "v1", "kind": "List", "items": list});
            let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&list.to_string()));
            assert!(ok, "{shape}: {out}");
            let what = format!("{shape}, one replica, budget {budget}");
            match ready_pod(&client, &ns, selector).await {
                Err(e) => problems.push(format!("{what}: {e}")),
                Ok(pod) => {
                    // Once the disruption controller has counted the Ready pod: the shipped
                    // budget lets the eviction through, the old one refuses it (for 10 s, as
                    // long as a drain's retries would show).
                    if let Err(e) = budget_counted(&client, &ns).await {
                        problems.push(format!("{what}: {e}"));
                    }
                    let patience = std::time::Duration::from_secs(10);
                    let code = evict(&client, &ns, &pod, patience).await;
                    if code != expected {
                        problems.push(format!(
                            "{what}: eviction answered {code}, expected {expected}"
                        ));
                    }
                }
            }
            // No namespace controller runs here to empty a deleted namespace.
            let (_, _) = kubectl(
                &[
                    "delete",
                    "deployments,replicasets,pods,poddisruptionbudgets,configmaps",
                    "--all",
                    "-n",
                    &ns,
                    "--grace-period=0",
                    "--force",
                ],
                None,
            );
            let (_, _) = kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
        }
    }
    if !problems.is_empty() {
        disruption.dump_logs();
    }
    disruption.stop().await;
    assert!(problems.is_empty(), "{problems:#?}");
}
