//! Rendered manifests: running kubectl, kustomize and Helm as child processes, and reading
//! what they print (multi-document YAML as JSON values).

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use super::Cluster;

/// Runs a command to its end, with `stdin` fed if given; (success, stdout, stderr).
pub(crate) fn run(mut cmd: Command, stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write as _;
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait for the command");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kubectl (the test tools' build) as the admin of the test cluster; (success, stdout + stderr).
pub(crate) fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin("kubectl"));
    cmd.arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(args);
    let (ok, out, err) = run(cmd, stdin);
    (ok, format!("{out}{err}"))
}

/// `kubectl kustomize <dir>`; panics with kubectl's message when it fails.
pub(crate) fn kustomize(dir: &Path) -> String {
    let cluster = Cluster::get();
    let mut cmd = Command::new(cluster.bin("kubectl"));
    cmd.arg("kustomize").arg(dir);
    let (ok, out, err) = run(cmd, None);
    assert!(ok, "kubectl kustomize {} failed:\n{err}", dir.display());
    out
}

/// The objects of a multi-document YAML stream (empty documents left out).
pub(crate) fn documents(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("rendered YAML: {e}\n{yaml}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// An object's `kind`.
pub(crate) fn kind(obj: &Value) -> &str {
    obj["kind"].as_str().unwrap_or_default()
}

/// An object's `metadata.name`.
pub(crate) fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// An object's `metadata.namespace` (empty when cluster-scoped or unset).
pub(crate) fn namespace(obj: &Value) -> &str {
    obj["metadata"]["namespace"].as_str().unwrap_or_default()
}
