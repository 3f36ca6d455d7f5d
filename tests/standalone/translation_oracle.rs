//! Property test: attacher-hub's CSI-migration translation against csi-translation-lib.
//!
//! A seeded generator (`translation_oracle/generator.rs`) writes thousands of in-tree PVs of
//! the seven migratable plugins, PVs that are not in-tree, VolumeAttachment inline specs and
//! pod inline volumes. The Go tool `translation-oracle` (tools/testbins/csi, built by
//! `tools/testbins/build.sh` with the csi-translation-lib version of the reference
//! external-attacher) does with each what external-attacher v4.13.0 does; this test does the
//! same through `source::volume_source` (on the cached, lean copies of the objects) and
//! `translation::repair_volume_handle`, and
//! compares, byte for byte: driver, volume handle, readOnly, fsType, volume attributes, the
//! five secret references, access modes, volume mode, mount options, the two "migrated"
//! flags, the reconciler's repaired handle, and the error text.
//!
//! Environment:
//! * `TRANSLATION_ORACLE_SEED` (default a fixed seed): another seed explores other cases;
//!   a failure names the seed to reproduce it.
//! * `TRANSLATION_ORACLE_CASES` (default 10000): how many cases.
//! * `TRANSLATION_ORACLE_CASE`: run only this case index (with the seed of the failure).
//! * `TRANSLATION_ORACLE_REPORT`: a file that receives every differing case, one JSON line
//!   each (`{"input", "go", "rust"}`); the failure message shows only the first few.
//! * `ATTACHER_TESTBINS`: the Go tools directory, as for every integration test; when unset,
//!   `tools/testbins/build.sh` is run to find (or build) it. A missing oracle is a failure.

mod generator;
use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use attacher_hub::controller::{source, translation};
use attacher_hub::k8s::lean::{Pv, Va};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec, SecretReference};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::{Value, json};

use generator::{Kind, PLUGINS};

const DEFAULT_SEED: u64 = 0x7a11_5e3d_0c5a_11ed;
const DEFAULT_CASES: u64 = 10_000;

#[test]
fn translation_matches_csi_translation_lib() {
    let seed = env_u64("TRANSLATION_ORACLE_SEED").unwrap_or(DEFAULT_SEED);
    let indices: Vec<u64> = match env_u64("TRANSLATION_ORACLE_CASE") {
        Some(one) => vec![one],
        None => (0..env_u64("TRANSLATION_ORACLE_CASES").unwrap_or(DEFAULT_CASES)).collect(),
    };
    let cases: Vec<(Kind, Value)> = indices.iter().map(|&i| generator::case(seed, i)).collect();

    let started = Instant::now();
    let answers = run_oracle(&oracle_path(), cases.iter().map(|(_, c)| c));
    let oracle_time = started.elapsed();
    assert_eq!(answers.len(), cases.len(), "one oracle answer per case");

    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut stats = Stats::default();
    for ((kind, input), go) in cases.iter().zip(&answers) {
        assert_eq!(go["case"], input["case"], "answers in input order");
        assert!(
            go.get("inputError").is_none(),
            "the oracle could not read case {}: {go}",
            input["case"]
        );
        stats.count(*kind, go);
        let Some(rust) = rust_answer(input, go) else {
            continue; // kube-controller-manager refused the pod volume: nothing reaches us.
        };
        stats.count_repair(&rust);
        let go = comparable(go);
        if rust != go {
            report.push(json!({"input": input, "go": go, "rust": rust}).to_string());
            failures.push(format!(
                "case {} ({kind:?}):\n  input: {input}\n  go:    {go}\n  rust:  {rust}",
                input["case"]
            ));
        }
    }
    if let Some(path) = std::env::var_os("TRANSLATION_ORACLE_REPORT") {
        std::fs::write(&path, report.join("\n") + "\n")
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", Path::new(&path).display()));
    }
    eprintln!(
        "translation oracle: seed {seed}, {} cases in {:.1?} (oracle {:.1?}); {stats}",
        cases.len(),
        started.elapsed(),
        oracle_time
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from csi-translation-lib (seed {seed}; rerun one with \
         TRANSLATION_ORACLE_SEED={seed} TRANSLATION_ORACLE_CASE=<index>):\n{}",
        failures.len(),
        cases.len(),
        failures
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    if indices.len() as u64 >= DEFAULT_CASES {
        stats.assert_coverage();
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value:?} is not a number: {e}")),
    )
}

/// The oracle in the test tools directory the harness uses (`support::testbins`).
fn oracle_path() -> PathBuf {
    support::testbin(support::testbins(), "translation-oracle")
}

/// Feeds every case to one oracle process and reads its answers.
fn run_oracle<'a>(oracle: &Path, cases: impl Iterator<Item = &'a Value>) -> Vec<Value> {
    let mut input = String::new();
    for case in cases {
        input.push_str(&case.to_string());
        input.push('\n');
    }
    let mut child = Command::new(oracle)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", oracle.display()));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let answers: Vec<Value> = BufReader::new(child.stdout.take().expect("piped stdout"))
        .lines()
        .map(|line| {
            let line = line.expect("oracle output");
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("oracle said {line:?}: {e}"))
        })
        .collect();
    writer
        .join()
        .expect("writer thread")
        .expect("writing to the oracle");
    let status = child.wait().expect("oracle exit");
    assert!(status.success(), "{} failed: {status}", oracle.display());
    answers
}

/// The oracle's answer without what only it reports: the spec kube-controller-manager made
/// (fed to our side instead) and the text of a repair error (we report only "no handle").
fn comparable(go: &Value) -> Value {
    let mut go = go.clone();
    if let Some(obj) = go.as_object_mut() {
        obj.remove("inlineVolumeSpec");
        if let Some(repair) = obj.get_mut("repair").and_then(Value::as_object_mut) {
            repair.remove("error");
        }
    }
    go
}

/// Our answer for a case, in the oracle's format; `None` when there is nothing to compare.
fn rust_answer(input: &Value, go: &Value) -> Option<Value> {
    let mut va = VolumeAttachment::default();
    let mut pv = None;
    if let Some(json) = input.get("pv") {
        let parsed: PersistentVolume = serde_json::from_value(json.clone())
            .unwrap_or_else(|e| panic!("case {}: bad PV: {e}", input["case"]));
        va.spec.source.persistent_volume_name =
            Some(parsed.metadata.name.clone().unwrap_or_default());
        pv = Some(parsed);
    } else if let Some(json) = input.get("inlineVolumeSpec") {
        va.spec.source.inline_volume_spec = Some(spec(json, input));
    } else if input.get("podVolume").is_some() {
        // kube-controller-manager's translation is the oracle's; what it wrote into the VA
        // goes through our inline path.
        if go.get("kcmError").is_some() {
            return None;
        }
        let json = go
            .get("inlineVolumeSpec")
            .unwrap_or_else(|| panic!("case {}: no inline spec in {go}", input["case"]));
        va.spec.source.inline_volume_spec = Some(spec(json, input));
    }
    let case = input["case"].clone();
    // Through the cache's own copies, as the attacher reads them: what the lean types drop must
    // not change an answer.
    let va = Va::from(va);
    let pv = pv.map(Pv::from);
    let volume = match source::volume_source(&va, |_| pv.as_ref()) {
        Ok(volume) => volume,
        Err(e) => return Some(json!({"case": case, "error": e.to_string()})),
    };
    let csi = volume.csi().expect("volume_source checks the CSI source");
    let s = &volume.spec;
    let mut answer = json!({
        "case": case,
        "volume": {
            "driver": csi.driver,
            "volumeHandle": csi.volume_handle,
            "readOnly": csi.read_only.unwrap_or(false),
            "fsType": csi.fs_type.clone().unwrap_or_default(),
            "volumeAttributes": csi.volume_attributes.clone().unwrap_or_default(),
            "controllerPublishSecretRef": secret(csi.controller_publish_secret_ref.as_ref()),
            "nodeStageSecretRef": secret(csi.node_stage_secret_ref.as_ref()),
            "nodePublishSecretRef": secret(csi.node_publish_secret_ref.as_ref()),
            "controllerExpandSecretRef": secret(csi.controller_expand_secret_ref.as_ref()),
            "nodeExpandSecretRef": secret(csi.node_expand_secret_ref.as_ref()),
            "accessModes": s.access_modes,
            "volumeMode": s.volume_mode,
            "mountOptions": s.mount_options,
            "migrated": volume.migrated,
            "reconcileMigratable": volume.repairs_handle(),
        },
    });
    if let Some(node_id) = input.get("nodeID").and_then(Value::as_str)
        && volume.repairs_handle()
    {
        let handle = translation::repair_volume_handle(&csi.driver, &csi.volume_handle, node_id);
        answer["repair"] = json!({ "handle": handle });
    }
    Some(answer)
}

fn spec(json: &Value, input: &Value) -> PersistentVolumeSpec {
    serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("case {}: bad inline spec: {e}", input["case"]))
}

fn secret(r: Option<&SecretReference>) -> Value {
    r.map_or(Value::Null, |r| {
        json!({
            "name": r.name.clone().unwrap_or_default(),
            "namespace": r.namespace.clone().unwrap_or_default(),
        })
    })
}

/// What the generated cases covered, so that a generator change cannot quietly stop
/// exercising a plugin or an outcome.
#[derive(Default)]
struct Stats {
    /// Per kind: (translated, refused).
    outcomes: BTreeMap<Kind, (usize, usize)>,
    /// Distinct error texts, shortened to their first 60 characters.
    errors: BTreeMap<String, usize>,
    /// Reconciler handle repairs compared: (repaired, VA skipped).
    repairs: (usize, usize),
}

impl Stats {
    fn count(&mut self, kind: Kind, go: &Value) {
        let entry = self.outcomes.entry(kind).or_default();
        let error = go.get("error").or_else(|| go.get("kcmError"));
        match error.and_then(Value::as_str) {
            Some(e) => {
                entry.1 += 1;
                *self.errors.entry(e.chars().take(60).collect()).or_default() += 1;
            }
            None => entry.0 += 1,
        }
    }

    fn count_repair(&mut self, rust: &Value) {
        match rust.get("repair").map(|r| &r["handle"]) {
            Some(Value::Null) => self.repairs.1 += 1,
            Some(_) => self.repairs.0 += 1,
            None => {}
        }
    }

    fn assert_coverage(&self) {
        assert!(
            self.repairs.0 >= 100 && self.repairs.1 >= 100,
            "handle repairs: {} repaired, {} skipped",
            self.repairs.0,
            self.repairs.1
        );
        for (plugin, name) in PLUGINS.iter().enumerate() {
            let (ok, _) = self
                .outcomes
                .get(&Kind::InTreePv(plugin))
                .copied()
                .unwrap_or_default();
            assert!(ok >= 200, "only {ok} translated {name} PVs");
        }
        for (kind, min_ok) in [(Kind::OtherPv, 100), (Kind::InlineSpec, 100)] {
            let (ok, refused) = self.outcomes.get(&kind).copied().unwrap_or_default();
            assert!(
                ok >= min_ok && refused >= 20,
                "{kind:?}: {ok} ok, {refused} refused"
            );
        }
        for wanted in [
            "failed to translate in tree pv to CSI: failed to translate Kubernetes ID to EBS Volume ID Invalid format",
            "failed to translate in tree pv to CSI: failed to translate Kubernetes ID to EBS Volume ID Invalid disk name",
            "failed to translate in tree pv to CSI: failed to get region from zones: zone in unexpected",
            "failed to translate in tree pv to CSI: failed to get region from zones: multiple or no",
            "failed to translate in tree pv to CSI: kind(",
            "failed to translate in tree pv to CSI: could not find a secret namespace",
            "pv spec contained non-csi source that was not migrated",
            "inline volume spec contains nil CSI source",
        ] {
            let n: usize = self
                .errors
                .iter()
                .filter(|(text, _)| wanted.starts_with(text.as_str()) || text.starts_with(wanted))
                .map(|(_, n)| n)
                .sum();
            assert!(n >= 5, "only {n} cases failed with {wanted:?}");
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .outcomes
            .iter()
            .map(|(kind, (ok, refused))| {
                let name = match kind {
                    Kind::InTreePv(p) => PLUGINS[*p].to_owned(),
                    Kind::PodVolume(p) => format!("pod {}", PLUGINS[*p]),
                    other => format!("{other:?}"),
                };
                format!("{name} {ok}+{refused}")
            })
            .collect();
        write!(
            f,
            "translated+refused per kind: {}; {} distinct error texts; handle repairs: {} \
             repaired, {} skipped",
            parts.join(", "),
            self.errors.len(),
            self.repairs.0,
            self.repairs.1
        )
    }
}
