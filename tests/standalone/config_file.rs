//! `attacher-hub --config drivers.yaml`: a bad file stops the binary with exit code 2 and a
//! message naming file, line and field, before it contacts the cluster.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longer than any start-up check; a binary still running after it got past them.
const EXIT_DEADLINE: Duration = Duration::from_secs(20);

/// Runs the binary with `--config <file holding text>` and a kubeconfig that does not exist,
/// so that getting as far as the cluster would fail differently (exit 1, another message).
fn run_with_config(text: impl AsRef<[u8]>) -> (tempfile::TempDir, String, Output) {
    run_with_config_and_flags(text, &[])
}

/// [`run_with_config`] with more flags.
fn run_with_config_and_flags(
    text: impl AsRef<[u8]>,
    flags: &[&str],
) -> (tempfile::TempDir, String, Output) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("drivers.yaml");
    std::fs::write(&path, text).expect("writing the driver list");
    let path = path.display().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .args(["--config", &path, "--kubeconfig", "/nonexistent/kubeconfig"])
        .args(flags)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the attacher-hub binary starts");
    let deadline = Instant::now() + EXIT_DEADLINE;
    while child
        .try_wait()
        .expect("waiting for attacher-hub")
        .is_none()
    {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("collecting the output");
    (dir, path, out)
}

#[test]
fn a_bad_duration_exits_2_naming_file_line_and_field_before_touching_the_cluster() {
    let (_dir, path, out) = run_with_config(
        "drivers:\n  - address: /csi/a.sock\n  - address: /csi/b.sock\n    name: b.example.com\n    timeout: 15\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!(
        "attacher-hub: {path}:5:5: drivers[1].timeout: invalid duration \"15\": missing unit"
    );
    assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");
    assert!(
        !stderr.contains("kubeconfig"),
        "it must stop before reading the kubeconfig:\n{stderr}"
    );
}

#[test]
fn an_unknown_key_exits_2_naming_its_line() {
    let (_dir, path, out) =
        run_with_config("drivers:\n  - address: /csi/a.sock\n    tiemout: 5s\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!("{path}:3:5: drivers[0].tiemout: unknown field `tiemout`");
    assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");
}

#[test]
fn names_that_share_a_finalizer_exit_2_naming_both() {
    let (_dir, path, out) = run_with_config(
        "drivers:\n- address: /csi/a.sock\n  name: a.b\n- address: /csi/b.sock\n  name: a-b\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!(
        "{path}:5:3: drivers[1].name: driver names \"a-b\" and \"a.b\" (drivers[0], line 2) both use the finalizer \"external-attacher/a-b\""
    );
    assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");
}

#[test]
fn an_oversized_worker_count_exits_2_naming_its_line_before_allocating_anything() {
    // 10^9 workers per pool used to abort the process (allocation failure, SIGABRT).
    for (workers, line) in [
        (
            "workerThreads: 1000000000",
            "3:5: drivers[0].workerThreads: must be at most 10000, not 1000000000",
        ),
        (
            "workerThreads: {attach: 4, detach: 1000000000}",
            "3:32: drivers[0].workerThreads.detach: must be at most 10000, not 1000000000",
        ),
    ] {
        let (_dir, path, out) = run_with_config(format!(
            "drivers:\n  - address: /csi/a.sock\n    {workers}\n"
        ));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{workers}: stderr: {stderr}");
        let want = format!("attacher-hub: {path}:{line}");
        assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");
    }
}

#[test]
fn a_file_that_is_not_utf8_exits_2_naming_the_first_invalid_byte() {
    // "café" in Latin-1: the é is the single byte 0xe9.
    let (_dir, path, out) =
        run_with_config(b"drivers:\n  - address: /csi/a.sock\n    name: caf\xe9.example.com\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!("attacher-hub: {path}:3:14: not UTF-8: invalid byte 0xe9");
    assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");
}

#[test]
fn a_file_with_a_nul_byte_or_longer_than_the_bound_exits_2_with_a_position() {
    let (_dir, path, out) = run_with_config("drivers:\n  - address: /csi/a.sock\0\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!("attacher-hub: {path}:2:25: unexpected character");
    assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");

    // A number literal longer than the file bound (4 MiB) is refused without parsing it.
    let mut text = b"drivers:\n  - address: /csi/a.sock\n    maxEntries: ".to_vec();
    text.resize(attacher_hub::config::MAX_FILE_BYTES + 10, b'9');
    let (_dir, path, out) = run_with_config(text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!("attacher-hub: {path}:3:");
    assert!(
        stderr.contains(&want) && stderr.contains("the file is longer than 4194304 bytes"),
        "want {want:?} in stderr:\n{stderr}"
    );
}

#[test]
fn a_missing_file_exits_2_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_attacher-hub"))
        .args([
            "--config",
            "/nonexistent/drivers.yaml",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("the attacher-hub binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains("attacher-hub: /nonexistent/drivers.yaml: cannot be read: "),
        "stderr:\n{stderr}"
    );
}

#[test]
fn the_example_file_gets_past_loading_to_the_kubeconfig() {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/drivers.example.yaml"))
            .expect("reading drivers.example.yaml");
    let (_dir, _path, out) = run_with_config(&example);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Exit 1 for the missing kubeconfig: the file was accepted.
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("/nonexistent/kubeconfig"),
        "stderr:\n{stderr}"
    );
}

/// One rule per setting for the flags and the file. The flags' retry pair with the maximum
/// below the start (external-attacher accepts it: every retry waits the maximum) used to fail
/// every entry that set neither field, blamed on the entry.
#[test]
fn the_flags_retry_pair_below_its_start_is_accepted_for_every_entry() {
    let flags = ["--retry-interval-start=10s", "--retry-interval-max=1s"];
    let text = "drivers:\n  - address: /csi/a.sock\n  - address: /csi/b.sock\n    retryIntervalStart: 30s\n";
    let (_dir, _path, out) = run_with_config_and_flags(text, &flags);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Exit 1 for the missing kubeconfig: the file was accepted with the flags.
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("/nonexistent/kubeconfig"),
        "stderr:\n{stderr}"
    );
}

/// The same rule refuses a zero pause from either place, naming the place that set it: the flag,
/// or file:line:column and the field.
#[test]
fn a_zero_pause_is_refused_naming_the_flag_or_the_field_that_set_it() {
    let text = "drivers:\n  - address: /csi/a.sock\n";
    let (_dir, _path, out) = run_with_config_and_flags(text, &["--reconcile-sync=0s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let want = "--reconcile-sync must be greater than zero, not 0s";
    assert!(stderr.contains(want), "want {want:?} in stderr:\n{stderr}");

    let text = "drivers:\n  - address: /csi/a.sock\n    reconcileSync: 0s\n";
    let (_dir, path, out) = run_with_config(text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!("{path}:3:5: drivers[0].reconcileSync: must be greater than zero, not 0s");
    assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");
}

/// A leader-election timing the flags set, used by an entry that turns leader election on (the
/// flags' own check runs only with --leader-election), is named by its flags at the field that
/// turned it on.
#[test]
fn a_flag_value_an_entry_brings_into_use_is_named_by_its_flag() {
    let text = "drivers:\n  - address: /csi/a.sock\n    leaderElection: true\n";
    let flags = ["--leader-election-lease-duration=8s"];
    let (_dir, path, out) = run_with_config_and_flags(text, &flags);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let want = format!(
        "{path}:3:5: drivers[0].leaderElection: --leader-election-lease-duration (8s) must be greater than --leader-election-renew-deadline (10s)"
    );
    assert!(stderr.contains(&want), "want {want:?} in stderr:\n{stderr}");
}
