//! The `attacher-hub` binary's command line: exit codes and output, as external-attacher's.

use crate::support;

use std::io::BufRead;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("the attacher-hub binary runs")
}

/// How long a binary that got past argument parsing may run before the test stops it. Parsing
/// outcomes (help, version, errors) exit within milliseconds; a run goes on to connect to the
/// driver, which these tests do not provide.
const RUN_GRACE: Duration = Duration::from_secs(2);

/// Runs the binary for at most [`RUN_GRACE`]; returns its exit code (`None` if it was still
/// running and got stopped) and its stderr.
fn run_briefly(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the attacher-hub binary starts");
    let deadline = Instant::now() + RUN_GRACE;
    let mut code = None;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("waiting for attacher-hub") {
            code = status.code();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if code.is_none() {
        let _ = child.kill();
    }
    let out = child
        .wait_with_output()
        .expect("collecting attacher-hub's output");
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// What a case expects: the exit code and a text that stdout or stderr must contain.
struct Case {
    args: &'static [&'static str],
    code: i32,
    stdout: &'static str,
    stderr: &'static str,
}

const fn case(
    args: &'static [&'static str],
    code: i32,
    stdout: &'static str,
    stderr: &'static str,
) -> Case {
    Case {
        args,
        code,
        stdout,
        stderr,
    }
}

const USAGE: &str = "Usage of ";

#[test]
fn exit_codes_and_output_match_external_attacher() {
    // Cargo.toml's version, then the build metadata git gives (build.rs), if any.
    let version = format!(" v{}", env!("CARGO_PKG_VERSION"));
    let cases = [
        case(&["--help"], 0, "", USAGE),
        case(&["-help"], 0, "", USAGE),
        case(&["-h"], 0, "", USAGE),
        case(&["--version"], 0, "", ""),
        case(&["-version"], 0, "", ""),
        // A stray word no longer starts an attacher with defaults (Go ignores it).
        case(&["help"], 0, "", USAGE),
        case(
            &["stauts"],
            2,
            "",
            "unknown command \"stauts\": did you mean \"status\"?",
        ),
        case(
            &["--leader-election", "false"],
            2,
            "",
            "a boolean flag takes its value after '=' (-leader-election=false)",
        ),
        case(
            &["--no-such-flag"],
            2,
            "",
            "flag provided but not defined: -no-such-flag\nUsage of ",
        ),
        case(
            &["--timeout=10"],
            2,
            "",
            "invalid value \"10\" for flag -timeout: parse error",
        ),
        case(
            &["-resync", "soon"],
            2,
            "",
            "invalid value \"soon\" for flag -resync: parse error",
        ),
        case(
            &["--worker-threads=0"],
            1,
            "",
            "Option -worker-threads must be greater than zero",
        ),
        case(
            &["-worker-threads=-1"],
            2,
            "",
            "invalid value \"-1\" for flag -worker-threads: parse error",
        ),
        case(
            &["--metrics-address=:8080", "--http-endpoint=:8081"],
            1,
            "",
            "Only one of `--metrics-address` and `--http-endpoint` can be set",
        ),
        case(
            &["--feature-gates=NoSuchGate=true"],
            1,
            "",
            "unrecognized feature gate: NoSuchGate",
        ),
        case(&["--leader-election=maybe"], 2, "", "invalid boolean value"),
        // Above attacher-hub's bounds (Go accepts them): a configuration error.
        case(
            &["--worker-threads=1000000000"],
            1,
            "",
            "--worker-threads must be at most 10000, not 1000000000",
        ),
        case(
            &["--timeout=25h"],
            1,
            "",
            "--timeout must be at most 24h0m0s, not 25h0m0s",
        ),
        case(
            &["--kube-api-qps=Inf"],
            1,
            "",
            "--kube-api-qps must be at most 1000000, not inf",
        ),
        // A per-driver pause of zero, refused as in drivers.yaml (rules.rs); Go accepts it.
        case(
            &["--timeout=0"],
            1,
            "",
            "--timeout must be greater than zero, not 0s",
        ),
        case(
            &["--retry-interval-start=-1s"],
            1,
            "",
            "--retry-interval-start must be greater than zero, not 0s",
        ),
        // Beyond Go's own range: Go's parse error.
        case(
            &["--worker-threads=18446744073709551616"],
            2,
            "",
            "invalid value \"18446744073709551616\" for flag -worker-threads: value out of range",
        ),
        case(&["--logging-format=xml"], 1, "", "--logging-format"),
        case(&["--log-text-split-stream"], 1, "", "LoggingAlphaOptions"),
    ];
    for case in cases {
        let out = run(case.args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(case.code),
            "{:?}: stderr {stderr}",
            case.args
        );
        assert!(
            stdout.contains(case.stdout),
            "{:?}: stdout {stdout:?}",
            case.args
        );
        assert!(
            stderr.contains(case.stderr),
            "{:?}: stderr {stderr:?}",
            case.args
        );
        if case.args[0].ends_with("version") {
            let line = stdout.strip_suffix('\n').expect("one line");
            let (before, metadata) = line.split_once('+').unwrap_or((line, ""));
            assert!(before.ends_with(&version), "{:?}: {stdout:?}", case.args);
            assert!(
                metadata.is_empty() || metadata.contains(".g") || metadata.starts_with('g'),
                "the commit in the build metadata: {stdout:?}"
            );
            assert!(
                stdout.starts_with(env!("CARGO_BIN_EXE_attacher-hub")),
                "argv[0] first: {stdout:?}"
            );
        }
        if case.code != 0 || case.stderr == USAGE {
            assert!(stdout.is_empty(), "{:?}: stdout {stdout:?}", case.args);
        }
    }
}

#[test]
fn usage_lists_every_external_attacher_flag() {
    let out = run(&["--help"]);
    let usage = String::from_utf8_lossy(&out.stderr);
    for flag in [
        "resync",
        "timeout",
        "retry-interval-start",
        "retry-interval-max",
        "worker-threads",
        "max-entries",
        "default-fstype",
        "reconcile-sync",
        "max-grpc-log-length",
        "feature-gates",
        "version",
        "kubeconfig",
        "csi-address",
        "leader-election",
        "leader-election-namespace",
        "leader-election-lease-duration",
        "leader-election-renew-deadline",
        "leader-election-retry-period",
        "leader-election-labels",
        "kube-api-qps",
        "kube-api-burst",
        "http-endpoint",
        "metrics-address",
        "metrics-path",
        "automaxprocs",
        "v",
        "vmodule",
        "logging-format",
        "log-flush-frequency",
    ] {
        assert!(
            usage
                .lines()
                .any(|line| line.split_whitespace().next() == Some(&format!("-{flag}"))),
            "-{flag} missing from the usage"
        );
    }
}

/// The argument lists of real manifests get past argument parsing (no exit 2, no usage text);
/// legacy klog flags produce a warning.
#[test]
fn manifest_argument_lists_start_the_binary() {
    let manifests: [&[&str]; 4] = [
        // external-attacher's example Deployment, $(ADDRESS) substituted.
        &[
            "--v=5",
            "--csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock",
            "--leader-election",
            "--http-endpoint=:8080",
        ],
        // An old (v2.x era) manifest.
        &[
            "--v=5",
            "--csi-address=/csi/csi.sock",
            "--leader-election=true",
            "--retry-interval-start=500ms",
            "--logtostderr",
        ],
        // A retry maximum below its start (Go accepts it; every retry waits the maximum).
        &[
            "--csi-address=/csi/csi.sock",
            "--retry-interval-start=10s",
            "--retry-interval-max=1s",
        ],
        // A v4.12 manifest.
        &[
            "-v=2",
            "-csi-address=/csi/csi.sock",
            "-leader-election",
            "-leader-election-namespace=kube-system",
            "-http-endpoint=:8080",
            "-timeout=60s",
            "-worker-threads=20",
            "-kube-api-qps=50",
            "-kube-api-burst=100",
            "-feature-gates=ReleaseLeaderElectionOnExit=true",
            "-automaxprocs",
        ],
    ];
    for args in manifests {
        let (code, stderr) = run_briefly(args);
        assert_ne!(code, Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains(USAGE), "{args:?}: {stderr}");
        assert_eq!(
            stderr.contains("-logtostderr is a klog flag"),
            args.contains(&"--logtostderr"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn logging_format_json_gives_json_lines() {
    let (code, stderr) = run_briefly(&["--logging-format=json", "--logtostderr"]);
    assert_ne!(code, Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(!lines.is_empty(), "the klog warning is logged");
    for line in lines {
        let value: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
        // Kubernetes' structured JSON (component-base logs/json): ts, caller, msg, and v except
        // on error lines, which have err instead (the run may end on a missing kubeconfig).
        for key in ["ts", "caller", "msg"] {
            assert!(value.get(key).is_some(), "no {key}: {line}");
        }
        assert!(
            value.get("v").is_some() || value.get("err").is_some(),
            "neither v nor err: {line}"
        );
        assert!(value.get("fields").is_none(), "{line}");
    }
}

/// A kubeconfig whose server refuses every connection (port 1 on loopback).
const DEAD_KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: c
  context:
    cluster: c
    user: u
current-context: c
users:
- name: u
  user:
    token: t
";

/// How long the hub runs against an API server that is not there.
const UNREACHABLE_RUN: Duration = Duration::from_secs(45);

#[test]
fn an_unreachable_api_server_is_named_with_its_cause_a_few_times_a_minute() {
    // The watches and a driver's elector all fail; the log stays a few lines a minute.
    let dir = tempfile::tempdir().expect("a temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, DEAD_KUBECONFIG).expect("write the kubeconfig");
    let socket = dir.path().join("csi.sock");
    // A ready driver, so that its elector tries the API server too.
    let mut driver = Command::new(support::mock_csi_driver_bin())
        .arg(format!("--endpoint={}", socket.display()))
        .arg("--name=unreachable.csi.example.com")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the mock driver starts");
    let mut ready = String::new();
    std::io::BufReader::new(driver.stdout.take().expect("its stdout"))
        .read_line(&mut ready)
        .expect("the mock driver says ready");
    assert_eq!(ready.trim(), "ready");
    let mut child = Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--csi-address={}", socket.display()))
        .arg("--leader-election")
        .arg("--leader-election-namespace=default")
        // Debug lines show every failed attempt, so that their pace can be read too.
        .arg("--v=2")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the attacher-hub binary starts");
    std::thread::sleep(UNREACHABLE_RUN);
    let _ = child.kill();
    let _ = driver.kill();
    let _ = driver.wait();
    let out = child.wait_with_output().expect("collecting its output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("driver ready"),
        "the driver became ready: {stderr}"
    );

    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with('W') || l.starts_with('E'))
        .collect();
    let watch_warnings: Vec<&&str> = warnings
        .iter()
        .filter(|l| l.contains("\"watch failed"))
        .collect();
    // Each warning names the server and the cause.
    assert!(!watch_warnings.is_empty(), "{stderr}");
    for line in &watch_warnings {
        assert!(
            line.contains("server=\"https://127.0.0.1:1/\"")
                && line.contains("Connection refused")
                && line.contains("kind="),
            "{line}"
        );
    }
    // The first failure of each of the three watches, then at most one warning per watch
    // every 30 s: at most six watch warnings in 45 s (eight a minute at worst), where a
    // retry every 0.4 s logged 160 lines in 20 s.
    assert!(
        (3..=6).contains(&watch_warnings.len()),
        "{} watch warnings in {UNREACHABLE_RUN:?}:\n{}",
        watch_warnings.len(),
        watch_warnings
            .iter()
            .map(|l| **l)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The driver's elector: the first failure, then one warning per 30 s (it tries every
    // 0.5-2 s).
    let lease_warnings = warnings
        .iter()
        .filter(|l| l.contains("\"failed to acquire lease\""))
        .count();
    assert!(
        (1..=2).contains(&lease_warnings),
        "{lease_warnings} lease warnings in {UNREACHABLE_RUN:?}:\n{}",
        warnings.join("\n")
    );
    assert!(
        warnings.len() <= 12,
        "{} warnings in {UNREACHABLE_RUN:?}:\n{}",
        warnings.len(),
        warnings.join("\n")
    );
    // The attempts back off: 0.8 s doubling to 2 s, each pause up to twice that, is at most
    // 24 attempts per watch in 45 s (a retry every 0.4 s made over 100).
    let attempts = stderr
        .lines()
        .filter(|l| l.contains("\"watch failed") && l.contains("kind=\"VolumeAttachment\""))
        .count();
    assert!(
        (3..=24).contains(&attempts),
        "{attempts} attempts of the VolumeAttachment watch in {UNREACHABLE_RUN:?}"
    );
}
