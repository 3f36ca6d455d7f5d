#!/usr/bin/env bash
# `make bench`: builds the benchmark (tests/bench.rs) in release mode, starts a
# fresh control plane of its own, runs the benchmark against it and stops it
# again, also on failure. The report goes to stdout and target/bench-report.md.
#
# Usage: tests/bench/run.sh            (sizes and repeats: BENCH_* variables,
#                                       see tests/bench.rs)
#
# Then the end-to-end configuration (tests/bench_e2e.rs, tests/bench/e2e.rs):
# Pods through kube-controller-manager, started on the same control plane only
# now (it would add its own load to the runs above); its report goes to
# target/bench-e2e-report.md and is appended to target/bench-report.md.
# BENCH_E2E=0 skips it; BENCH_E2E_ONLY=1 runs only it (then the main report is
# left as it was); sizes: BENCH_E2E_* (tests/bench/e2e.rs).
# Then the rolling updates (`shipped::rolling_update_benchmark` of the `measured` test binary,
# tests/measured/shipped.rs, through the pod runner, which needs root): deploy/overlays/hub,
# deploy/overlays/sidecar and the same Deployment with the Go external-attacher,
# BENCH_ROLLOUT_REPEATS times each (default 3); report target/bench-rollout-report.md,
# appended to target/bench-report.md.
# BENCH_ROLLOUT=0 skips it; BENCH_ROLLOUT_ONLY=1 runs only it (the main report is then left
# as it was).
# BENCH_CLUSTER_DIR overrides the control plane's directory (.work/bench-cluster). With
# CARGO_TARGET_DIR set, the reports go there instead of target/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
dir=${BENCH_CLUSTER_DIR:-$repo/.work/bench-cluster}
profile=${BENCH_PROFILE:---release}
target=${CARGO_TARGET_DIR:-$repo/target}

# Build first (only the benchmarks that run), so that compiling does not compete with the
# measurements (the mock driver too: the benchmark would otherwise build it while it measures
# the API server's write rate).
if [ "${BENCH_ROLLOUT_ONLY:-0}" = 1 ]; then BENCH_E2E=0 BENCH_E2E_ONLY=1; fi
targets=()
[ "${BENCH_E2E_ONLY:-0}" != 1 ] && targets+=(--test bench)
[ "${BENCH_E2E:-1}" != 0 ] && targets+=(--test bench_e2e)
[ "${BENCH_ROLLOUT:-1}" != 0 ] && targets+=(--test measured)
cargo test $profile "${targets[@]}" --no-run
cargo build $profile --quiet --package mock-csi-driver --bin mock-csi-driver

# A fresh control plane: whatever an earlier run left is thrown away.
scripts/cluster-down.sh "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
trap 'scripts/cluster-down.sh "$dir" >/dev/null 2>&1 || true' EXIT
scripts/cluster-up.sh "$dir" >/dev/null
# shellcheck disable=SC1091
. "$dir/env"

if [ "${BENCH_E2E_ONLY:-0}" != 1 ]; then
  t0=$(date +%s)
  cargo test $profile --test bench -- --ignored --nocapture --test-threads=1
  echo "bench: finished in $(( $(date +%s) - t0 )) s" >&2
fi

# --- end to end: Pods through kube-controller-manager ---------------------------
if [ "${BENCH_E2E:-1}" != 0 ]; then
  t0=$(date +%s)
  scripts/cluster-up.sh --controller-manager "$dir" >/dev/null
  rm -f "$target/bench-e2e-report.md"
  cargo test $profile --test bench_e2e -- --ignored --nocapture --test-threads=1
  if [ "${BENCH_E2E_ONLY:-0}" != 1 ] && [ -f "$target/bench-e2e-report.md" ]; then
    { echo; cat "$target/bench-e2e-report.md"; } >> "$target/bench-report.md"
  fi
  echo "bench: end-to-end configuration finished in $(( $(date +%s) - t0 )) s" >&2
fi

# --- rolling updates through the pod runner ---------------------------------------
if [ "${BENCH_ROLLOUT:-1}" != 0 ]; then
  t0=$(date +%s)
  scripts/cluster-up.sh --controller-manager "$dir" >/dev/null
  rm -f "$target/bench-rollout-report.md"
  cargo test $profile --test measured shipped::rolling_update_benchmark -- --ignored --nocapture --test-threads=1
  if [ "${BENCH_E2E_ONLY:-0}" != 1 ] && [ -f "$target/bench-rollout-report.md" ]; then
    { echo; cat "$target/bench-rollout-report.md"; } >> "$target/bench-report.md"
  fi
  echo "bench: rolling updates finished in $(( $(date +%s) - t0 )) s" >&2
fi

echo "bench: report in $target/bench-report.md; scripts/bench-publish.py makes it the one the documents quote (docs/benchmarks.md, the README's table)" >&2
