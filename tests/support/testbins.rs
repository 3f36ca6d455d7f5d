//! The Go test tools that `tools/testbins/build.sh` builds (or finds in its cache): where they
//! are for a test that needs no control plane, and one of them by name.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The Go test tools' directory: `ATTACHER_TESTBINS` (the env file of `scripts/cluster-up.sh`
/// sets it), else the last line `tools/testbins/build.sh` prints (it reuses its cache, or
/// builds; its progress goes to stderr), asked once per test process. A test with a control
/// plane takes the directory from [`super::Cluster`] instead.
pub(crate) fn testbins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| match std::env::var_os("ATTACHER_TESTBINS") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/testbins/build.sh");
            let out = Command::new(&script)
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "{} failed ({})",
                script.display(),
                out.status
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
        }
    })
}

/// The test tool `name` in the tools' directory `dir`; panics if it is missing.
pub(crate) fn testbin(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "test tool {} is missing; run `make testbins`",
        path.display()
    );
    path
}
