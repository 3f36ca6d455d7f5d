//! `tools/testbins/build.sh` run twice at once for the same cache key, as when `make demo` or a
//! second checkout's `make test` starts while `make test` builds the Go tools in the background:
//! one builds, the other waits for it and reuses what it built. Without the lock both wrote
//! `<key>.partial`, and one failed with `mv: cannot stat '.../<key>.partial/<tool>.new'`.
//!
//! The Go tool chain is stood in for by a script named `go` first on `PATH`: `go version` and
//! `go list` answer at once, `go build -o FILE` writes FILE after a pause (long enough that the
//! two builds overlap) and counts itself in a log, so the test sees how many builds ran.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The stand-in `go`: each `build` sleeps, then writes its `-o` file; every build is logged.
const FAKE_GO: &str = r#"#!/bin/sh
case "$1" in
  version) echo "go version go0.0-fake linux/amd64" ;;
  list) echo "v0.37.0" ;;
  build)
    out=
    while [ $# -gt 0 ]; do
      if [ "$1" = "-o" ]; then out=$2; shift; fi
      shift
    done
    echo "$out" >> "$FAKE_GO_LOG"
    sleep 0.3
    printf '#!/bin/sh\n' > "$out"
    chmod +x "$out"
    ;;
  *) echo "fake go: unexpected arguments: $*" >&2; exit 1 ;;
esac
"#;

#[test]
fn two_builds_of_one_key_at_once_build_once_and_both_succeed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin/");
    let go = bin.join("go");
    std::fs::write(&go, FAKE_GO).expect("the fake go");
    std::fs::set_permissions(&go, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let log = dir.path().join("builds.log");
    let out = dir.path().join("cache/testbins/key");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/testbins/build.sh");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let start = || {
        Command::new(&script)
            .env("PATH", &path)
            .env("FAKE_GO_LOG", &log)
            .env("ATTACHER_TESTBINS", &out)
            .env_remove("TESTBINS_PROFILE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("build.sh starts")
    };
    let first = start();
    let second = start();
    let outputs = [first, second].map(|c| c.wait_with_output().expect("build.sh ends"));
    for (i, o) in outputs.iter().enumerate() {
        assert!(
            o.status.success(),
            "build {i} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let last = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            last.lines().last(),
            Some(out.to_str().expect("UTF-8")),
            "build {i} names the cache directory last"
        );
    }
    let stderr: Vec<String> = outputs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert_eq!(
        stderr
            .iter()
            .filter(|e| e.contains("waiting for it"))
            .count(),
        1,
        "exactly one build waited for the other: {stderr:#?}"
    );
    assert_eq!(
        stderr
            .iter()
            .filter(|e| e.contains("reusing cached binaries"))
            .count(),
        1,
        "the one that waited reused the other's binaries: {stderr:#?}"
    );
    let builds = std::fs::read_to_string(&log).expect("the build log");
    let tools: Vec<&str> = builds.lines().collect();
    let mut unique = tools.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(tools.len(), unique.len(), "no tool built twice: {tools:#?}");
    assert!(
        !Path::new(&format!("{}.partial", out.display())).exists(),
        "no partial directory left behind"
    );
}
