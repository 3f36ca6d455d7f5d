#!/usr/bin/env bash
# The fault matrix behind `make faults`: every scenario of tests/faults/faults.rs
# (the #[ignore]d ones included) and every regression test of
# tests/faults/regressions.rs (two modules of the `faults` test binary), known
# failures included (ATTACHER_FAULTS=1), against a control plane of their own:
# the scenarios kill and restart etcd and the API server, so they never share
# one with other tests.
#
# Usage: scripts/faults.sh [CLUSTER_DIR]   (default .work/faults-cluster)
#
# Needs root for the black-hole scenarios (network namespaces, iptables).
# Writes target/faults/results.txt (one line per scenario, with its figures and
# violations) and target/faults/test.log, then prints a summary: known failures
# (tests/faults/known.rs) are listed loudly; the exit status is 1 when a test
# not on that list fails, or when a listed test passes (FIXED: take it off).
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
cd "$repo_root"
dir=$(cluster_dir "${1:-$repo_root/.work/faults-cluster}")
out=$repo_root/target/faults
mkdir -p "$out"
t0=$(date +%s)

"$repo_root/scripts/install-deps.sh" --no-prometheus
if [ "$(id -u)" != 0 ]; then
  echo "faults: not root: the black-hole scenarios (network namespace, iptables) will fail" >&2
fi

started=0
cluster_healthy "$dir" || started=1
on_exit() {
  local rc=$?
  if [ "$started" = 1 ]; then "$repo_root/scripts/cluster-down.sh" "$dir" || true; fi
  echo "faults: took $(( $(date +%s) - t0 ))s" >&2
  exit "$rc"
}
trap on_exit EXIT

"$repo_root/scripts/cluster-up.sh" "$dir" >/dev/null
# shellcheck disable=SC1091
. "$dir/env"
export ATTACHER_FAULTS=1
export ATTACHER_FAULTS_CLUSTER_DIR=$dir
export ATTACHER_FAULTS_RESULTS=$out/results.txt
: > "$ATTACHER_FAULTS_RESULTS"

set +e
# Both parts are modules of the one `faults` test binary (tests/faults/main.rs), each run by
# a name filter. Scenarios (and the kit's own unit tests): those that measure recovery
# serialise themselves; the others share.
cargo test --test faults --no-fail-fast -- --include-ignored --test-threads=2 --skip regressions:: 2>&1 | tee "$out/test.log"
faults_rc=${PIPESTATUS[0]}
# Regressions one at a time: several compare durations.
cargo test --test faults --no-fail-fast -- regressions:: --include-ignored --test-threads=1 2>&1 | tee -a "$out/test.log"
regressions_rc=${PIPESTATUS[0]}
set -e

known=$(sed -n 's/^ *"\([a-z0-9_]*\)",.*$/\1/p' tests/faults/known.rs)
# libtest's closing list of each run: "failures:" then one indented name per line, the
# module first (`faults::driver_hang`, `regressions::a_hand_over_leaves_no_gap`).
failed=$(awk '/^failures:$/ {f=1; next} f && /^    [a-z0-9_:]+$/ {sub(/^ +/, ""); print; next} {f=0}' \
  "$out/test.log" | sort -u)
# Passed: the scenarios and the regressions (not the kit's own unit tests).
passed=$(sed -n 's/^test \(\(faults\|regressions\)::[a-z0-9_]*\) \.\.\. ok$/\1/p' "$out/test.log" | sort -u)
fixed=$(grep -o 'FIXED: [a-z0-9_]*' "$out/test.log" | cut -d' ' -f2 | sort -u || true)
new=""
known_failing=""
for t in $failed; do
  # known.rs and the FIXED lines name a test without its module.
  name=${t##*::}
  if printf '%s\n' $fixed | grep -qx "$name"; then continue; fi
  if printf '%s\n' $known | grep -qx "$name"; then known_failing="$known_failing $t"; else new="$new $t"; fi
done

# A binary that did not build (or any other cargo error: a full disk) fails the
# run, as does a run in which nothing passed: no test list means nothing ran.
# (Failing tests make cargo say "error: test failed" / "error: N targets failed": those
# are judged by name above.)
cargo_errors=$(grep '^error: ' "$out/test.log" | grep -v '^error: test failed\|^error: [0-9]* targets* failed' | sort -u || true)
if [ -n "$cargo_errors" ]; then
  echo "faults: cargo stopped with an error (see $out/test.log):" >&2
  printf '%s\n' "$cargo_errors" | head -5 | sed 's/^/  /' >&2
  new="$new (cargo error)"
fi
if [ -z "$passed" ]; then
  echo "faults: no test passed (cargo test exited $faults_rc and $regressions_rc)" >&2
  new="$new (nothing ran)"
fi
echo
echo "================ fault matrix ================"
grep '^FAULTS ' "$ATTACHER_FAULTS_RESULTS" || true
echo "passed: $(printf '%s\n' $passed | grep -c . || true)"
if [ -n "$known_failing" ]; then
  echo "KNOWN FAILURES (tests/faults/known.rs, docs/reliability.md):"
  for t in $known_failing; do echo "  KNOWN FAILURE $t"; done
fi
if [ -n "$fixed" ]; then
  echo "FIXED (passing but still listed in tests/faults/known.rs; remove them):"
  for t in $fixed; do echo "  FIXED $t"; done
fi
if [ -n "$new" ]; then
  echo "NEW FAILURES:"
  for t in $new; do echo "  FAILED $t"; done
fi
echo "results: $ATTACHER_FAULTS_RESULTS; log: $out/test.log"
[ -z "$new" ] && [ -z "$fixed" ]
