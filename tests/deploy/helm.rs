//! The Helm chart `deploy/helm/attacher-hub`, with Helm v4 and v3 (built from
//! `tools/testbins/helm`):
//!
//! * `helm lint --strict` and `helm template` pass for each shape (sidecar,
//!   hub, daemonset, and the daemonset of the controller node pool) with the
//!   chart's `ci/*-values.yaml`, and `lint`, `template`, `install --dry-run`
//!   and `package` pass with no values file at all;
//! * the conventional values of CSI driver charts (`replicaCount`,
//!   `resources`, `extraVolumeMounts`, `serviceMonitor.enabled`, ...) reach
//!   the objects of every shape, and NOTES.txt names kubectl commands only;
//! * the chart and the kustomize overlays render the same objects for the same
//!   settings (normalized: Helm's own labels and the release label dropped,
//!   embedded YAML compared parsed), for the overlays as shipped and for
//!   changed settings, so the two never drift;
//! * every shape, with every option on, passes `helm install --dry-run=server`
//!   and a server-side dry run of each rendered object against the local API
//!   server;
//! * `values.schema.json` refuses bad values with a message naming the key,
//!   and knows exactly the fields of `drivers.yaml`;
//! * every value is documented in the chart's README, the chart's appVersion
//!   is the crate's version, and the alert rules and dashboards are read from
//!   the observability overlay through symbolic links, not copies (a packaged
//!   chart carries them).

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use support::{Cluster, documents, kind, kubectl, kustomize, name, repo, run};

/// The chart, relative to the repository.
const CHART: &str = "deploy/helm/attacher-hub";

/// The shapes and their example values (`ci/<shape>-values.yaml`);
/// `controller-pool` is the daemonset shape of topology (b).
const SHAPES: [&str; 4] = ["sidecar", "hub", "daemonset", "controller-pool"];

/// The Helm binaries of `tools/testbins/helm`: v4 and v3.
const HELMS: [&str; 2] = ["helm", "helm3"];

/// Labels Helm manages, which the kustomize overlays do not carry.
const HELM_LABELS: [&str; 3] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
];

/// The release label, which the chart also puts into selectors (two releases
/// must not select each other's pods).
const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Every option the chart has beyond the overlays' defaults, for the dry runs.
const EVERYTHING_ON: [&str; 4] = [
    "rbac.publishSecrets=true",
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "dashboard.enabled=true",
];

fn chart() -> PathBuf {
    repo().join(CHART)
}

/// `helm template attacher-hub <chart> -n <namespace> -f <values>... --set <set>...`.
fn helm_template(helm: &str, namespace: &str, values: &[&str], set: &[&str]) -> String {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["template", "attacher-hub"])
        .arg(chart())
        .args(["--namespace", namespace]);
    for v in values {
        cmd.arg("-f").arg(chart().join(v));
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    let (ok, out, err) = run(cmd, None);
    assert!(
        ok,
        "{helm} template -n {namespace} {values:?} {set:?} failed:\n{err}"
    );
    out
}

fn values_file(shape: &str) -> String {
    format!("ci/{shape}-values.yaml")
}

// === lint and template ======================================================

#[test]
fn chart_lints_and_renders_each_shape_with_helm_4_and_3() {
    let cluster = Cluster::get();
    for helm in HELMS {
        for shape in SHAPES {
            let values = values_file(shape);
            let mut cmd = Command::new(cluster.bin(helm));
            cmd.args(["lint", "--strict", "-f"])
                .arg(chart().join(&values))
                .arg(chart());
            let (ok, out, err) = run(cmd, None);
            assert!(ok, "{helm} lint --strict -f {values} failed:\n{out}{err}");
            assert!(
                out.contains("0 chart(s) failed") && !out.contains("[WARNING]"),
                "{helm} lint -f {values}:\n{out}"
            );

            let objs = documents(&helm_template(helm, "attacher-hub", &[&values], &[]));
            let kinds: BTreeSet<&str> = objs.iter().map(kind).collect();
            let workload = match shape {
                "daemonset" | "controller-pool" => "DaemonSet",
                _ => "Deployment",
            };
            assert!(
                kinds.contains(workload) && kinds.contains("ClusterRole"),
                "{helm}, {shape}: rendered {kinds:?}"
            );
        }
    }
}

// === the chart and the overlays agree ======================================

/// `kind namespace/name` of an object.
fn key(obj: &Value) -> String {
    format!(
        "{} {}/{}",
        kind(obj),
        obj["metadata"]["namespace"].as_str().unwrap_or("-"),
        name(obj)
    )
}

/// Removes `label` from every map in `v` (labels, selectors, affinity terms).
fn drop_key_everywhere(v: &mut Value, label: &str) {
    match v {
        Value::Object(map) => {
            map.remove(label);
            map.values_mut()
                .for_each(|child| drop_key_everywhere(child, label));
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|child| drop_key_everywhere(child, label)),
        _ => {}
    }
}

/// Collapses runs of whitespace in every `expr` (PromQL, where whitespace
/// means nothing). kustomize re-emits a folded (`>-`) scalar whose first
/// line is followed by more-indented lines with an extra blank line after
/// the first; Helm and promtool read the file as written.
fn collapse_promql_whitespace(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                match child {
                    Value::String(s) if k == "expr" => {
                        *s = s.split_whitespace().collect::<Vec<_>>().join(" ");
                    }
                    _ => collapse_promql_whitespace(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(collapse_promql_whitespace),
        _ => {}
    }
}

/// What the comparison looks at: Helm's labels and the release label
/// dropped, embedded YAML documents (ConfigMap keys ending in .yaml) parsed,
/// whitespace in PromQL collapsed.
fn normalize(mut obj: Value) -> Value {
    if kind(&obj) == "PrometheusRule" {
        collapse_promql_whitespace(&mut obj["spec"]);
    }
    if let Some(labels) = obj["metadata"]["labels"].as_object_mut() {
        for l in HELM_LABELS {
            labels.remove(l);
        }
    }
    drop_key_everywhere(&mut obj, INSTANCE_LABEL);
    if obj["metadata"]["labels"]
        .as_object()
        .is_some_and(|l| l.is_empty())
        && let Some(meta) = obj["metadata"].as_object_mut()
    {
        meta.remove("labels");
    }
    if kind(&obj) == "ConfigMap"
        && let Some(data) = obj["data"].as_object_mut()
    {
        for (k, v) in data.iter_mut() {
            if k.ends_with(".yaml")
                && let Some(text) = v.as_str()
            {
                let parsed: Value = serde_saphyr::from_str(text)
                    .unwrap_or_else(|e| panic!("ConfigMap key {k} is not YAML: {e}"));
                *v = json!({ "parsed YAML": parsed });
            }
        }
    }
    obj
}

/// Paths at which `a` and `b` differ (at most a few dozen).
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    if out.len() > 40 {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => differences(&p, va, vb, out),
                    (Some(va), None) => out.push(format!("{p}: only in the chart: {va}")),
                    (None, Some(vb)) => out.push(format!("{p}: only in kustomize: {vb}")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ if a != b => out.push(format!("{path}: chart {a} != kustomize {b}")),
        _ => {}
    }
}

/// Compares two renderings object by object; panics listing every difference.
fn assert_same_objects(what: &str, chart: &str, kustomize: &str) {
    let index = |yaml: &str| -> BTreeMap<String, Value> {
        let mut map = BTreeMap::new();
        // A chart does not create its namespace (`helm install --namespace`, or
        // --create-namespace, which sets no Pod Security labels); the overlays ship theirs.
        for obj in documents(yaml)
            .into_iter()
            .filter(|o| o["kind"] != "Namespace")
        {
            let k = key(&obj);
            assert!(
                map.insert(k.clone(), normalize(obj)).is_none(),
                "{what}: {k} rendered twice"
            );
        }
        map
    };
    let (from_chart, from_kustomize) = (index(chart), index(kustomize));
    let mut report = Vec::new();
    for k in from_chart
        .keys()
        .filter(|k| !from_kustomize.contains_key(*k))
    {
        report.push(format!("{k}: rendered by the chart only"));
    }
    for k in from_kustomize
        .keys()
        .filter(|k| !from_chart.contains_key(*k))
    {
        report.push(format!("{k}: rendered by kustomize only"));
    }
    for (k, a) in &from_chart {
        if let Some(b) = from_kustomize.get(k) {
            let mut diffs = Vec::new();
            differences("", a, b, &mut diffs);
            report.extend(diffs.into_iter().map(|d| format!("{k}: {d}")));
        }
    }
    assert!(
        report.is_empty(),
        "{what}: the chart and the kustomize overlays differ:\n  {}",
        report.join("\n  ")
    );
    assert!(!from_chart.is_empty(), "{what}: nothing rendered");
}

/// Copies `deploy/{base,components,overlays,transformers}` (following symbolic links) into
/// a fresh directory, where a comparison can add overlays and change settings.
fn deploy_copy() -> tempfile::TempDir {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("create directory");
        for entry in std::fs::read_dir(from).expect("read directory") {
            let path = entry.expect("directory entry").path();
            let target = to.join(path.file_name().expect("file name"));
            if path.is_dir() {
                copy_dir(&path, &target);
            } else {
                std::fs::copy(&path, &target).expect("copy file");
            }
        }
    }
    let tmp = tempfile::Builder::new()
        .prefix("ah-helm-kustomize-")
        .tempdir()
        .expect("temporary directory");
    for part in ["base", "components", "overlays", "transformers"] {
        copy_dir(
            &repo().join("deploy").join(part),
            &tmp.path().join("deploy").join(part),
        );
    }
    tmp
}

/// Replaces `from` with `to` in a file of the copy; the text must be there,
/// so a changed overlay fails the test instead of being compared unchanged.
fn edit(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).expect("read file");
    assert!(
        text.contains(from),
        "{} no longer contains {from:?}; update tests/deploy/helm.rs",
        file.display()
    );
    std::fs::write(file, text.replace(from, to)).expect("write file");
}

#[test]
fn chart_and_kustomize_overlays_render_the_same_objects() {
    // The overlays as shipped, and the chart's examples of the same settings.
    for (shape, namespace) in [
        ("sidecar", "example-csi"),
        ("hub", "attacher-hub"),
        ("daemonset", "attacher-hub"),
        ("controller-pool", "attacher-hub"),
    ] {
        let chart = helm_template("helm", namespace, &[&values_file(shape)], &[]);
        let overlay = kustomize(&repo().join("deploy/overlays").join(shape));
        assert_same_objects(shape, &chart, &overlay);
    }

    // The chart's defaults (no values file) are the controller pool's DaemonSet, over the
    // directory where controllers export their sockets: never the kubelet plugins directory,
    // whose node plugins may die when asked for a controller service (docs/deploy.md).
    let defaults = helm_template("helm", "attacher-hub", &[], &[]);
    let pool = kustomize(&repo().join("deploy/overlays/controller-pool"));
    assert_same_objects("the chart's defaults", &defaults, &pool);

    let copy = deploy_copy();
    let overlays = copy.path().join("deploy/overlays");

    // Hub with every option: publish-secrets component and observability.
    let everything = overlays.join("hub-everything");
    std::fs::create_dir_all(&everything).expect("create overlay");
    std::fs::write(
        everything.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         namespace: attacher-hub\nresources: [../hub, ../observability]\n\
         components: [../../components/publish-secrets]\n\
         transformers: [../../transformers/install-names]\n",
    )
    .expect("write kustomization");
    let chart = helm_template(
        "helm",
        "attacher-hub",
        &[&values_file("hub")],
        &EVERYTHING_ON,
    );
    assert_same_objects(
        "hub + publish-secrets + observability",
        &chart,
        &kustomize(&everything),
    );

    // The daemonset with other settings: another plugins directory (k0s),
    // node pool, image tag and namespace.
    let ds = overlays.join("daemonset");
    edit(
        &ds.join("node-settings.yaml"),
        "kubeletPluginsDir: /var/lib/kubelet/plugins",
        "kubeletPluginsDir: /var/lib/k0s/kubelet/plugins",
    );
    edit(
        &ds.join("node-settings.yaml"),
        "nodePool: storage",
        "nodePool: gpu",
    );
    edit(
        &ds.join("kustomization.yaml"),
        "newTag: 0.1.0",
        "newTag: 0.2.0",
    );
    edit(
        &ds.join("kustomization.yaml"),
        "namespace: attacher-hub",
        "namespace: storage-system",
    );
    let chart = helm_template(
        "helm",
        "storage-system",
        &[&values_file("daemonset")],
        &[
            "daemonset.kubeletPluginsDir=/var/lib/k0s/kubelet/plugins",
            r"daemonset.nodeSelector.attacher-hub\.example\.com/pool=gpu",
            "image.tag=0.2.0",
        ],
    );
    assert_same_objects("daemonset on k0s", &chart, &kustomize(&ds));

    // The same comparison with Helm v3 for one shape: both render alike.
    let v3 = helm_template(
        "helm3",
        "attacher-hub",
        &[&values_file("hub")],
        &EVERYTHING_ON,
    );
    assert_same_objects("hub with Helm v3", &v3, &kustomize(&everything));
}

// === server-side dry run ====================================================

#[test]
fn every_shape_passes_a_server_side_dry_run() {
    let cluster = Cluster::get();
    apply_monitoring_crds();

    let namespace = format!("ah-helm-{}", std::process::id());
    let (ok, out) = kubectl(&["create", "namespace", &namespace], None);
    assert!(ok, "creating namespace {namespace}: {out}");

    for shape in SHAPES {
        let values = values_file(shape);
        // Helm's own server dry run: the chart installs on this API server
        // (kubeVersion, release bookkeeping). It does not validate objects...
        for helm in HELMS {
            let mut cmd = Command::new(cluster.bin(helm));
            cmd.args(["install", "attacher-hub"])
                .arg(chart())
                .args(["--namespace", &namespace, "--dry-run=server", "-f"])
                .arg(chart().join(&values))
                .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()));
            for s in EVERYTHING_ON {
                cmd.args(["--set", s]);
            }
            let (ok, out, err) = run(cmd, None);
            assert!(
                ok && out.contains("STATUS: pending-install"),
                "{helm} install --dry-run=server, {shape}:\n{out}{err}"
            );
        }
        // ... so every rendered object also goes through the API server's
        // validation and admission as a dry-run apply.
        let yaml = helm_template("helm", &namespace, &[&values], &EVERYTHING_ON);
        let objs = documents(&yaml);
        let (ok, out) = kubectl(
            &["apply", "--dry-run=server", "-o", "name", "-f", "-"],
            Some(&yaml),
        );
        assert!(
            ok,
            "server-side dry run of the {shape} shape failed:\n{out}"
        );
        let accepted = out.lines().filter(|l| !l.trim().is_empty()).count();
        assert_eq!(
            accepted,
            objs.len(),
            "{shape}: the API server accepted {accepted} of {} objects:\n{out}",
            objs.len()
        );
    }
    let (ok, out) = kubectl(&["delete", "namespace", &namespace, "--wait=false"], None);
    assert!(ok, "deleting namespace {namespace}: {out}");
}

// === no values file, conventional values, NOTES ============================

/// The NOTES of `helm install --dry-run=server` of the chart with `args`.
fn dry_run_install(helm: &str, namespace: &str, args: &[&str]) -> String {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin(helm));
    cmd.args(["install", "attacher-hub"])
        .arg(chart())
        .args(["--namespace", namespace, "--dry-run=server"])
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(args);
    let (ok, out, err) = run(cmd, None);
    assert!(
        ok && out.contains("STATUS: pending-install"),
        "{helm} install --dry-run=server {args:?}:\n{out}{err}"
    );
    let notes = out
        .split_once("NOTES:")
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| panic!("{helm} install {args:?} printed no NOTES:\n{out}"));
    // Every command NOTES tells the user to run is a kubectl command (an indented line
    // that starts with a lower-case word; the sidecar shape also prints a container).
    for line in notes.lines().filter(|l| l.starts_with("  ")) {
        let first = line.split_whitespace().next().unwrap_or_default();
        if ["attacher-hub", "helm", "curl"].contains(&first) {
            panic!("{helm} {args:?}: NOTES tell to run `{line}`; only kubectl is assumed");
        }
    }
    assert!(
        notes.contains("kubectl -n ") && notes.contains("kubectl get lease -A"),
        "{helm} {args:?}: NOTES name the kubectl commands to check the release:\n{notes}"
    );
    notes
}

#[test]
fn chart_lints_templates_installs_and_packages_with_no_values_file() {
    let cluster = Cluster::get();
    let namespace = format!("ah-helm-defaults-{}", std::process::id());
    let (ok, out) = kubectl(&["create", "namespace", &namespace], None);
    assert!(ok, "creating namespace {namespace}: {out}");
    for helm in HELMS {
        let mut cmd = Command::new(cluster.bin(helm));
        cmd.args(["lint", "--strict"]).arg(chart());
        let (ok, out, err) = run(cmd, None);
        assert!(
            ok && out.contains("0 chart(s) failed") && !out.contains("[WARNING]"),
            "{helm} lint --strict with no values file:\n{out}{err}"
        );

        let objs = documents(&helm_template(helm, &namespace, &[], &[]));
        let kinds: BTreeSet<&str> = objs.iter().map(kind).collect();
        assert!(
            kinds.contains("DaemonSet") && kinds.contains("ClusterRole"),
            "{helm}: the defaults render the daemonset shape: {kinds:?}"
        );

        let notes = dry_run_install(helm, &namespace, &[]);
        assert!(
            notes.contains("kubectl label node <node> attacher-hub.example.com/pool=storage"),
            "{helm}: NOTES of the defaults say how nodes join the pool:\n{notes}"
        );

        let dir = tempfile::Builder::new()
            .prefix("ah-helm-package-")
            .tempdir()
            .expect("temporary directory");
        let mut cmd = Command::new(cluster.bin(helm));
        cmd.arg("package").arg(chart()).arg("-d").arg(dir.path());
        let (ok, out, err) = run(cmd, None);
        assert!(ok, "{helm} package with no values file:\n{out}{err}");
        let package = dir
            .path()
            .join(format!("attacher-hub-{}.tgz", env!("CARGO_PKG_VERSION")));
        let mut cmd = Command::new(cluster.bin(helm));
        cmd.args(["lint", "--strict"]).arg(&package);
        let (ok, out, err) = run(cmd, None);
        assert!(ok, "{helm} lint of the package:\n{out}{err}");
    }
    // Each shape's NOTES, too.
    for shape in SHAPES {
        let values = chart().join(values_file(shape));
        let values = values.to_string_lossy();
        dry_run_install("helm", &namespace, &["-f", &values]);
    }
    let (ok, out) = kubectl(&["delete", "namespace", &namespace, "--wait=false"], None);
    assert!(ok, "deleting namespace {namespace}: {out}");
}

/// The attacher-hub container of a rendered workload (its image is the chart's).
fn hub_container(workload: &Value) -> &Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| {
            cs.iter().find(|c| {
                c["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("registry.example.com/attacher-hub"))
            })
        })
        .unwrap_or_else(|| panic!("no attacher-hub container in {}", name(workload)))
}

#[test]
fn conventional_values_of_csi_driver_charts_reach_every_shape() {
    let set = [
        "replicaCount=3",
        "resources.requests.cpu=5m",
        "resources.limits.memory=1Gi",
        "image.pullPolicy=Always",
        "imagePullSecrets[0].name=regcred",
        "podAnnotations.example\\.com/owner=storage",
        "podLabels.team=storage",
        "priorityClassName=system-cluster-critical",
        "nodeSelector.disk=ssd",
        "tolerations[0].key=storage",
        "tolerations[0].operator=Exists",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=disk",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "extraArgs[0]=--kube-api-qps=20",
        "extraEnv[0].name=EXTRA",
        "extraEnv[0].value=yes",
        "extraVolumes[0].name=extra",
        "extraVolumes[0].emptyDir.medium=Memory",
        "extraVolumeMounts[0].name=extra",
        "extraVolumeMounts[0].mountPath=/extra",
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
    ];
    for helm in HELMS {
        for shape in SHAPES {
            let objs = documents(&helm_template(
                helm,
                "attacher-hub",
                &[&values_file(shape)],
                &set,
            ));
            let what = format!("{helm}, {shape}");
            let workload = objs
                .iter()
                .find(|o| kind(o) == "Deployment" || kind(o) == "DaemonSet")
                .unwrap_or_else(|| panic!("{what}: no workload"));
            if kind(workload) == "Deployment" {
                assert_eq!(workload["spec"]["replicas"], 3, "{what}: replicaCount");
            }
            let pod = &workload["spec"]["template"];
            assert_eq!(
                pod["metadata"]["annotations"]["example.com/owner"], "storage",
                "{what}"
            );
            assert_eq!(pod["metadata"]["labels"]["team"], "storage", "{what}");
            let spec = &pod["spec"];
            assert_eq!(
                spec["priorityClassName"], "system-cluster-critical",
                "{what}"
            );
            assert_eq!(spec["imagePullSecrets"][0]["name"], "regcred", "{what}");
            assert_eq!(spec["nodeSelector"]["disk"], "ssd", "{what}");
            assert_eq!(spec["tolerations"][0]["key"], "storage", "{what}");
            assert!(
                spec["affinity"]["nodeAffinity"].is_object(),
                "{what}: affinity"
            );
            assert!(
                spec["volumes"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v["name"] == "extra")),
                "{what}: extraVolumes"
            );
            let c = hub_container(workload);
            assert_eq!(c["imagePullPolicy"], "Always", "{what}");
            assert_eq!(
                c["resources"],
                json!({"requests": {"cpu": "5m"}, "limits": {"memory": "1Gi"}}),
                "{what}: resources"
            );
            assert!(
                c["args"]
                    .as_array()
                    .is_some_and(|a| a.contains(&json!("--kube-api-qps=20"))),
                "{what}: extraArgs"
            );
            assert!(
                c["env"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e["name"] == "EXTRA")),
                "{what}: extraEnv"
            );
            assert!(
                c["volumeMounts"].as_array().is_some_and(|m| m
                    .iter()
                    .any(|m| m["name"] == "extra" && m["mountPath"] == "/extra")),
                "{what}: extraVolumeMounts"
            );
            let kinds: BTreeSet<&str> = objs.iter().map(kind).collect();
            assert!(
                kinds.contains("ServiceMonitor") && kinds.contains("PrometheusRule"),
                "{what}: {kinds:?}"
            );
        }
    }
}

/// The values of security, network, update strategy, spread, Lease namespace and monitoring
/// (none of which the overlays have): each set, in each shape and with both Helms.
fn operator_values() -> Value {
    json!({
        "podSecurityContext": {
            "runAsNonRoot": false,
            "fsGroup": 2000,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "securityContext": {
            "runAsNonRoot": false,
            "runAsUser": 0,
            "runAsGroup": 0,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}
        },
        "hostNetwork": true,
        "httpPort": 9808,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "daemonset": {
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {
                "maxSkew": 2,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"team": "storage"}}
            }
        ],
        "leaderElection": {"namespace": "kube-system"},
        "serviceMonitor": {
            "enabled": true,
            "honorLabels": true,
            "relabelings": [
                {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}
            ],
            "metricRelabelings": [
                {"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}
            ]
        },
        "prometheusRule": {
            "enabled": true,
            "runbookURL": "https://wiki.example.org/storage/attacher-hub-runbooks"
        }
    })
}

/// The Prometheus Operator kinds, from the test-only CRDs (as tests/deploy/deploy.rs).
fn apply_monitoring_crds() {
    let crds = repo().join("tests/deploy/monitoring-crds.yaml");
    let (ok, out) = kubectl(
        &["apply", "--server-side", "-f", &crds.to_string_lossy()],
        None,
    );
    assert!(ok, "applying the test CRDs: {out}");
    let (ok, out) = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
        None,
    );
    assert!(ok, "test CRDs not established: {out}");
}

#[test]
fn security_network_strategy_spread_lease_and_monitoring_values_reach_every_shape() {
    let cluster = Cluster::get();
    apply_monitoring_crds();
    let dir = tempfile::Builder::new()
        .prefix("ah-helm-values-")
        .tempdir()
        .expect("temporary directory");
    let file = dir.path().join("operator-values.json");
    let values = operator_values();
    std::fs::write(&file, values.to_string()).expect("write values");
    let file = file.to_string_lossy().to_string();
    let namespace = format!("ah-helm-values-{}", std::process::id());
    let (ok, out) = kubectl(&["create", "namespace", &namespace], None);
    assert!(ok, "creating namespace {namespace}: {out}");
    for helm in HELMS {
        for shape in SHAPES {
            let what = format!("{helm}, {shape}");
            let shape_values = chart().join(values_file(shape));
            let mut cmd = Command::new(cluster.bin(helm));
            cmd.args(["lint", "--strict", "-f"])
                .arg(&shape_values)
                .args(["-f", &file])
                .arg(chart());
            let (ok, out, err) = run(cmd, None);
            assert!(
                ok && out.contains("0 chart(s) failed") && !out.contains("[WARNING]"),
                "{what}: helm lint --strict:\n{out}{err}"
            );
            let yaml = helm_template(helm, &namespace, &[&values_file(shape), &file], &[]);
            let objs = documents(&yaml);
            let workload = objs
                .iter()
                .find(|o| kind(o) == "Deployment" || kind(o) == "DaemonSet")
                .unwrap_or_else(|| panic!("{what}: no workload"));
            let spec = &workload["spec"];
            let pod = &spec["template"]["spec"];
            assert_eq!(
                pod["securityContext"], values["podSecurityContext"],
                "{what}"
            );
            assert_eq!(pod["hostNetwork"], true, "{what}");
            assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet", "{what}");
            let c = hub_container(workload);
            assert_eq!(c["securityContext"], values["securityContext"], "{what}");
            assert_eq!(c["ports"][0]["containerPort"], 9808, "{what}");
            let args: Vec<&str> = c["args"]
                .as_array()
                .expect("args")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            for arg in [
                "--http-endpoint=:9808",
                "--leader-election-namespace=kube-system",
            ] {
                assert!(args.contains(&arg), "{what}: {arg} not in {args:?}");
            }
            if kind(workload) == "Deployment" {
                assert_eq!(spec["strategy"], values["strategy"], "{what}");
                let spread = pod["topologySpreadConstraints"].as_array().expect("spread");
                assert_eq!(spread.len(), 2, "{what}");
                assert_eq!(
                    spread[0]["labelSelector"]["matchLabels"], spec["selector"]["matchLabels"],
                    "{what}: a constraint without a selector selects the release's pods"
                );
                assert_eq!(
                    spread[1], values["topologySpreadConstraints"][1],
                    "{what}: a constraint with a selector is kept as given"
                );
            } else {
                assert_eq!(
                    spec["updateStrategy"], values["daemonset"]["updateStrategy"],
                    "{what}"
                );
                assert!(pod["topologySpreadConstraints"].is_null(), "{what}");
            }
            let monitor = objs
                .iter()
                .find(|o| kind(o) == "ServiceMonitor")
                .unwrap_or_else(|| panic!("{what}: no ServiceMonitor"));
            let endpoint = &monitor["spec"]["endpoints"][0];
            assert_eq!(endpoint["honorLabels"], true, "{what}");
            for key in ["relabelings", "metricRelabelings"] {
                assert_eq!(
                    endpoint[key], values["serviceMonitor"][key],
                    "{what}: {key}"
                );
            }
            let rule = objs
                .iter()
                .find(|o| kind(o) == "PrometheusRule")
                .unwrap_or_else(|| panic!("{what}: no PrometheusRule"));
            let mut runbooks = 0;
            for group in rule["spec"]["groups"].as_array().expect("groups") {
                for r in group["rules"].as_array().expect("rules") {
                    if let Some(url) = r["annotations"]["runbook_url"].as_str() {
                        runbooks += 1;
                        let anchor = url
                            .strip_prefix("https://wiki.example.org/storage/attacher-hub-runbooks#")
                            .unwrap_or_else(|| panic!("{what}: {url}"));
                        assert_eq!(
                            anchor,
                            r["alert"].as_str().unwrap_or_default().to_lowercase(),
                            "{what}: the anchor is kept"
                        );
                    }
                }
            }
            assert!(runbooks > 5, "{what}: {runbooks} runbook URLs");
            // The API server accepts every object as rendered.
            if helm == "helm" {
                let (ok, out) = kubectl(
                    &["apply", "--dry-run=server", "-o", "name", "-f", "-"],
                    Some(&yaml),
                );
                assert!(ok, "{what}: server-side dry run:\n{out}");
            }
        }
    }
    let (ok, out) = kubectl(&["delete", "namespace", &namespace, "--wait=false"], None);
    assert!(ok, "deleting namespace {namespace}: {out}");
}

// === values validation ======================================================

#[test]
fn values_schema_refuses_bad_values_naming_the_key() {
    let cluster = Cluster::get();
    // (values file, --set, text the error must contain)
    let cases: [(&str, &[&str], &str); 17] = [
        ("hub", &["mode=hubb"], "/mode"),
        ("hub", &["hub.replica=3"], "replica"),
        ("hub", &["replicaCount=-1"], "/replicaCount"),
        (
            "hub",
            &["hub.drivers[0].address=csi.sock"],
            "/hub/drivers/0/address",
        ),
        ("hub", &["hub.drivers[1].workers=4"], "workers"),
        (
            "hub",
            &["hub.drivers[0].timeout=15"],
            "/hub/drivers/0/timeout",
        ),
        (
            "daemonset",
            &["daemonset.kubeletPluginsDir=plugins"],
            "kubeletPluginsDir",
        ),
        ("sidecar", &["image.digest=latest"], "/image/digest"),
        ("sidecar", &["serviceMonitor.interval=30"], "interval"),
        ("hub", &["httpPort=0"], "httpPort"),
        ("hub", &["hostNetwork=yes"], "hostNetwork"),
        ("hub", &["strategy.type=Rolling"], "strategy"),
        (
            "daemonset",
            &["daemonset.updateStrategy.type=Recreate"],
            "updateStrategy",
        ),
        (
            "hub",
            &["topologySpreadConstraints[0].maxSkew=1"],
            "topologySpreadConstraints",
        ),
        (
            "hub",
            &["serviceMonitor.relabelings[0].action=rename"],
            "relabelings",
        ),
        (
            "hub",
            &["prometheusRule.runbookURL=wiki/runbooks.md"],
            "runbookURL",
        ),
        (
            "sidecar",
            &["leaderElection.namespace=Kube_System"],
            "leaderElection",
        ),
    ];
    for helm in HELMS {
        for (shape, set, needle) in cases {
            let mut cmd = Command::new(cluster.bin(helm));
            cmd.args(["template", "attacher-hub"])
                .arg(chart())
                .arg("-f")
                .arg(chart().join(values_file(shape)));
            for s in set {
                cmd.args(["--set", s]);
            }
            let (ok, out, err) = run(cmd, None);
            assert!(!ok, "{helm}: {shape} with {set:?} was accepted:\n{out}");
            assert!(
                err.contains("schema") && err.contains(needle),
                "{helm}: {shape} with {set:?}: the error does not name {needle}:\n{err}"
            );
        }
        // The hub shape names its drivers: without any it is refused naming hub.drivers.
        let mut cmd = Command::new(cluster.bin(helm));
        cmd.args(["template", "attacher-hub"])
            .arg(chart())
            .args(["--set", "mode=hub"]);
        let (ok, _, err) = run(cmd, None);
        assert!(
            !ok && err.contains("/hub/drivers"),
            "{helm}: the hub shape without drivers must be refused naming hub.drivers:\n{err}"
        );
    }
}

/// The property names of a schema object.
fn property_names(schema: &Value) -> BTreeSet<String> {
    schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn values_schema_knows_exactly_the_fields_of_drivers_yaml() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("values.schema.json")).expect("read schema"),
    )
    .expect("values.schema.json is JSON");
    let entry = &schema["properties"]["hub"]["properties"]["drivers"]["items"];
    // drivers.example.yaml writes out every field in its first entry.
    let example: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("drivers.example.yaml")).expect("read example"),
    )
    .expect("drivers.example.yaml is YAML");
    let first = &example["drivers"][0];
    let fields: BTreeSet<String> = first
        .as_object()
        .expect("a driver entry")
        .keys()
        .cloned()
        .collect();
    assert_eq!(property_names(entry), fields, "driver entry fields");
    let leader = entry["properties"]["leaderElection"]["oneOf"]
        .as_array()
        .and_then(|alts| alts.iter().find(|a| a["type"] == "object"))
        .expect("leaderElection as an object");
    let leader_fields: BTreeSet<String> = first["leaderElection"]
        .as_object()
        .expect("leaderElection settings")
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        property_names(leader),
        leader_fields,
        "leaderElection fields"
    );
    assert_eq!(entry["required"], json!(["address"]));
    assert_eq!(entry["additionalProperties"], false);
}

// === documentation, version and shared files ==================================

/// Dotted paths of the leaves of `v` (an empty map or list is a leaf).
fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&p, child, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[test]
fn every_value_is_documented_and_the_chart_installs_this_version() {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("values.yaml")).expect("read values.yaml"),
    )
    .expect("values.yaml is YAML");
    let readme = std::fs::read_to_string(chart().join("README.md")).expect("read README.md");
    let mut paths = Vec::new();
    leaves("", &values, &mut paths);
    // The leaves below a map-valued default are that map's own entries.
    let undocumented: Vec<&String> = paths
        .iter()
        .filter(|p| !p.starts_with("daemonset.nodeSelector.") && !p.contains("resources."))
        .filter(|p| !p.starts_with("dashboard.labels."))
        .filter(|p| !readme.contains(&format!("`{p}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "values missing from the README's table: {undocumented:?}"
    );
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("values.schema.json")).expect("read schema"),
    )
    .expect("values.schema.json is JSON");
    for p in &paths {
        let mut node = &schema;
        for part in p.split('.') {
            // A free-form map (labels, resource quantities) holds any key.
            if node["properties"].is_null() && node["type"] == "object" {
                break;
            }
            node = &node["properties"][part];
            assert!(!node.is_null(), "value {p} is not in values.schema.json");
        }
    }

    let chart_yaml: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("read Chart.yaml"),
    )
    .expect("Chart.yaml is YAML");
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn chart_reads_alert_rules_and_dashboards_from_the_observability_overlay() {
    // A packaged chart carries the linked files: it renders as the directory does.
    let cluster = Cluster::get();
    let dir = tempfile::Builder::new()
        .prefix("ah-helm-package-")
        .tempdir()
        .expect("temporary directory");
    let (ok, out, err) = run(
        {
            let mut cmd = Command::new(cluster.bin("helm"));
            cmd.arg("package").arg(chart()).arg("-d").arg(dir.path());
            cmd
        },
        None,
    );
    assert!(ok, "helm package failed:\n{out}{err}");
    let package = dir
        .path()
        .join(format!("attacher-hub-{}.tgz", env!("CARGO_PKG_VERSION")));
    let mut cmd = Command::new(cluster.bin("helm"));
    cmd.args(["template", "attacher-hub"])
        .arg(&package)
        .args(["--namespace", "attacher-hub", "-f"])
        .arg(chart().join(values_file("hub")));
    for s in EVERYTHING_ON {
        cmd.args(["--set", s]);
    }
    let (ok, from_package, err) = run(cmd, None);
    assert!(ok, "helm template of the package failed:\n{err}");
    let from_dir = helm_template(
        "helm",
        "attacher-hub",
        &[&values_file("hub")],
        &EVERYTHING_ON,
    );
    assert_eq!(documents(&from_package), documents(&from_dir));
    assert!(
        from_package.contains("kind: PrometheusRule") && from_package.contains("attacher-hub.json")
    );

    let observability = repo().join("deploy/overlays/observability");
    for (link, target) in [
        (
            "files/prometheusrule.yaml",
            observability.join("prometheusrule.yaml"),
        ),
        ("files/dashboards", observability.join("dashboards")),
    ] {
        let path = chart().join(link);
        let meta =
            std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            meta.file_type().is_symlink(),
            "{} must be a symbolic link to {} (one copy of the rules and dashboards)",
            path.display(),
            target.display()
        );
        assert_eq!(
            std::fs::canonicalize(&path).expect("resolve link"),
            std::fs::canonicalize(&target).expect("resolve target"),
            "{link}"
        );
    }
}

// === links ====================================================================

/// The Markdown files whose relative links must resolve: every one under `deploy/` (but a
/// vendor's manifests that `scripts/vendor-manifests.sh` puts in `vendor/`) and `docs/*.md`.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "vendor") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("deploy"), &mut files);
    for entry in std::fs::read_dir(repo().join("docs")).expect("read docs/") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The link targets of a Markdown text: inline links `[text](target)` and `![alt](target)`,
/// and reference definitions `[label]: target`, outside fenced code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans hold no links.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(rest) = prose.trim_start().strip_prefix('[')
            && let Some((_, target)) = rest.split_once("]: ")
        {
            out.push(
                target
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            out.push(target.trim_matches(['<', '>']).to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_markdown_link_under_deploy_and_docs_resolves() {
    let files = markdown_files();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("deploy/helm/attacher-hub/README.md")),
        "the chart's README is among {files:?}"
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read Markdown");
        for target in link_targets(&text) {
            let is_url = target
                .split_once(':')
                .is_some_and(|(scheme, _)| !scheme.is_empty() && !scheme.contains('/'));
            if target.is_empty() || target.starts_with('#') || is_url {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            checked += 1;
            let resolved = file.parent().expect("a directory").join(path);
            if !resolved.exists() {
                broken.push(format!(
                    "{}: {target}",
                    file.strip_prefix(repo()).unwrap_or(file).display()
                ));
            }
        }
    }
    assert!(checked > 10, "only {checked} relative links found");
    assert!(
        broken.is_empty(),
        "relative links to files that do not exist:\n  {}",
        broken.join("\n  ")
    );
}
