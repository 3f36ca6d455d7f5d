//! The alert rules of `deploy/overlays/observability/prometheusrule.yaml`
//! shown to fire and to stay silent: `promtool test rules` (Debian's
//! `prometheus` package) runs the unit tests in `tests/alerts/*.test.yaml`
//! against the rule groups of the PrometheusRule, and every alert in the file
//! must have at least one case where it fires and one where it stays silent.
//! A new alert without both fails here, naming it.
//!
//! Missing `promtool` is a failure, never a skip.
//!
//! Every alert also has a `runbook_url` whose anchor is a heading of `docs/runbooks.md`, and
//! that section says what the alert means, what to look at and what to do, with commands.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use support::{repo, tool};

/// The shipped alert rules.
const RULES: &str = "deploy/overlays/observability/prometheusrule.yaml";

/// The runbooks the alerts point at.
const RUNBOOKS: &str = "docs/runbooks.md";

/// The anchor GitHub (and most Markdown renderers) give a heading: lower case, punctuation
/// other than `-` and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_runbook_url_resolves_to_a_runbook_section_with_its_four_parts() {
    let rules = yaml_file(&repo().join(RULES));
    let text = std::fs::read_to_string(repo().join(RUNBOOKS)).expect("read docs/runbooks.md");
    // Sections by anchor: the text up to the next heading of the same level or above.
    let mut sections: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            current = Some(anchor(h));
            sections.insert(anchor(h), String::new());
        } else if line.starts_with("# ") {
            current = None;
        } else if let Some(a) = &current {
            let body = sections.get_mut(a).expect("section");
            body.push_str(line);
            body.push('\n');
        }
    }
    let mut problems = Vec::new();
    for rule in rules["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
    {
        let Some(alert) = rule["alert"].as_str() else {
            continue;
        };
        let Some(url) = rule["annotations"]["runbook_url"].as_str() else {
            problems.push(format!("{alert}: no runbook_url"));
            continue;
        };
        let Some((page, fragment)) = url.split_once('#') else {
            problems.push(format!("{alert}: {url} names no section"));
            continue;
        };
        if !page.ends_with(RUNBOOKS) {
            problems.push(format!("{alert}: {url} is not {RUNBOOKS}"));
            continue;
        }
        match sections.get(fragment) {
            None => problems.push(format!(
                "{alert}: no heading of {RUNBOOKS} has anchor #{fragment}"
            )),
            Some(body) => {
                for part in [
                    "**What it means.**",
                    "**What to look at.**",
                    "**What to do.**",
                    "```sh",
                ] {
                    if !body.contains(part) {
                        problems.push(format!("{alert}: its section has no {part}"));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The directory of the promtool unit-test files (`*.test.yaml`), which name
/// their rule file `rules.yaml`.
const TESTS_DIR: &str = "tests/alerts";

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

/// The alert names of the shipped rule groups.
fn shipped_alerts(rules: &Value) -> BTreeSet<String> {
    rules["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules of a group"))
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

/// The unit-test files.
fn test_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join(TESTS_DIR))
        .expect("read tests/alerts")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.test.yaml in {TESTS_DIR}");
    files
}

/// Per alert name: (cases where it fires, cases where it stays silent), as
/// `test name @ eval_time`.
type Coverage = BTreeMap<String, (Vec<String>, Vec<String>)>;

fn coverage(files: &[PathBuf]) -> Coverage {
    let mut cov = Coverage::new();
    for file in files {
        let doc = yaml_file(file);
        for test in doc["tests"].as_array().into_iter().flatten() {
            let name = test["name"].as_str().unwrap_or("(unnamed)");
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                let alert = case["alertname"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{}: a case without alertname", file.display()));
                let at = format!("{name} @ {}", case["eval_time"].as_str().unwrap_or("?"));
                let entry = cov.entry(alert.to_string()).or_default();
                let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
                if fires {
                    entry.0.push(at);
                } else {
                    entry.1.push(at);
                }
            }
        }
    }
    cov
}

#[test]
fn every_alert_has_cases_where_it_fires_and_where_it_stays_silent() {
    let alerts = shipped_alerts(&yaml_file(&repo().join(RULES)));
    assert!(!alerts.is_empty(), "no alerts in {RULES}");
    let cov = coverage(&test_files());
    let mut missing = Vec::new();
    for alert in &alerts {
        let (fires, silent) = cov.get(alert).cloned().unwrap_or_default();
        if fires.is_empty() {
            missing.push(format!("{alert}: no case where it fires"));
        }
        if silent.is_empty() {
            missing.push(format!(
                "{alert}: no case where it stays silent (exp_alerts: [])"
            ));
        }
    }
    for alert in cov.keys().filter(|a| !alerts.contains(*a)) {
        missing.push(format!("{alert}: tested, but not in {RULES}"));
    }
    assert!(
        missing.is_empty(),
        "the promtool unit tests in {TESTS_DIR} do not cover the alerts of {RULES}:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn promtool_unit_tests_of_the_alert_rules_pass() {
    let promtool = tool(
        "promtool",
        "install Debian's `prometheus` package (apt-get install prometheus, or scripts/install-deps.sh)",
    );
    let dir = tempfile::Builder::new()
        .prefix("ah-alerts-")
        .tempdir()
        .expect("temporary directory");
    // The rule groups of the PrometheusRule as a plain Prometheus rule file
    // (JSON is YAML), next to copies of the test files, which name it.
    let rules = yaml_file(&repo().join(RULES));
    let file = serde_json::json!({ "groups": rules["spec"]["groups"] });
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_json::to_string_pretty(&file).expect("serialize rules"),
    )
    .expect("write rules.yaml");
    let mut copies = Vec::new();
    for test in test_files() {
        let copy = dir.path().join(test.file_name().expect("file name"));
        std::fs::copy(&test, &copy).expect("copy test file");
        copies.push(copy);
    }

    let out = Command::new(&promtool)
        .args(["test", "rules"])
        .args(&copies)
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", promtool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool test rules failed:\n{text}");
    assert_eq!(
        text.matches("SUCCESS").count(),
        copies.len(),
        "one SUCCESS per test file expected:\n{text}"
    );
}
