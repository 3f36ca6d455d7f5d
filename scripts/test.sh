#!/usr/bin/env bash
# The whole check behind `make test`: rustfmt check, clippy with -D warnings,
# then every unit and integration test against a local control plane, then
# `make sanity`. A control plane this script starts is stopped on exit, also
# on failure; one that was already running (make cluster-up) is reused and
# left running.
#
# Usage: scripts/test.sh [CLUSTER_DIR]
#
# TEST_UNDER_LOAD=1 runs the same checks on a busy machine, as a loaded CI runner or a
# developer's laptop is: one busy loop per core (TEST_LOAD_LOOPS to choose how many) from the
# start, and, once the Go tools are built, a second control plane in .work/load-cluster with a
# client that keeps writing to it. All of it is stopped on exit. A test that fails only then
# has a bound or a checkpoint that depends on timing (docs/testing.md, "Under load").
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
cd "$repo_root"
dir=$(cluster_dir "${1:-}")

timings=()
phase() { # name command...
  local name=$1 t0
  shift
  t0=$(date +%s)
  echo "test: $name" >&2
  "$@"
  timings+=("$name $(( $(date +%s) - t0 ))s")
}

started=0
load_pids=()
load_cluster=
# Stops the load of TEST_UNDER_LOAD (busy loops, the writer, the second control plane).
stop_load() {
  local pid
  for pid in "${load_pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  load_pids=()
  if [ -n "$load_cluster" ]; then
    "$repo_root/scripts/cluster-down.sh" "$load_cluster" >/dev/null 2>&1 || true
    load_cluster=
  fi
}
on_exit() {
  local rc=$?
  stop_load
  if [ -n "${testbins_pid:-}" ] && kill -0 "$testbins_pid" 2>/dev/null; then
    kill -- "-$testbins_pid" 2>/dev/null || true
  fi
  if [ "$started" = 1 ]; then "$repo_root/scripts/cluster-down.sh" "$dir" || true; fi
  echo "test: timings: ${timings[*]:-none}" >&2
  [ "$rc" = 0 ] && echo "test: all checks passed" >&2 || echo "test: FAILED (exit $rc)" >&2
  exit "$rc"
}
trap on_exit EXIT

# Debian packages the checks need (Prometheus, buildah/podman, openssl, ...), when missing.
"$repo_root/scripts/install-deps.sh"

# The Go test tools (tools/testbins/build.sh) are most of a cold run. They build in the
# background while the Rust side compiles: each fills the other's idle stretches (module
# downloads, single-threaded links, the long tail of one big crate). On a warm cache build.sh
# only reuses. Nothing else runs build.sh until this build has ended (cluster-up.sh comes
# after the wait), so two builds never write the same cache directory; on an early exit the
# build is stopped with its Go children (its own session, hence setsid).
mkdir -p "$repo_root/.work"
testbins_log=$repo_root/.work/testbins-build.log
setsid "$repo_root/tools/testbins/build.sh" >"$testbins_log" 2>&1 &
testbins_pid=$!
testbins_wait() {
  if ! wait "$testbins_pid"; then
    echo "test: building the Go test tools failed; the end of $testbins_log:" >&2
    tail -n 30 "$testbins_log" >&2
    return 1
  fi
  testbins_pid=
  grep '^testbins: ' "$testbins_log" >&2 || true
}

if [ "${TEST_UNDER_LOAD:-0}" = 1 ]; then
  loops=${TEST_LOAD_LOOPS:-$(nproc)}
  echo "test: under load: $loops busy loop(s), then a second control plane with a writer" >&2
  for _ in $(seq "$loops"); do
    setsid bash -c 'while :; do :; done' &
    load_pids+=("$!")
  done
fi

phase "cargo fmt --check" cargo fmt --all -- --check
# No comment or document points to a reason kept outside the repository, and every
# docs/design.md#anchor the code links to exists (scripts/check-reasons.sh says where).
phase "check reasons" "$repo_root/scripts/check-reasons.sh"
# The README's benchmark figures are exactly those of the report in docs/benchmarks.md.
phase "check figures" "$repo_root/scripts/bench-publish.py" --check
# The uses between top modules are those src/lib.rs lists (scripts/check-layers.sh names any other).
phase "check layers" "$repo_root/scripts/check-layers.sh"
# No production function is over 80 lines, but for the declarative tables the script lists.
phase "check functions" "$repo_root/scripts/check-functions.sh"
phase "cargo clippy" cargo clippy --all-targets -- -D warnings
# The release binary the image is built from (tests/deploy/image.rs), built once here
# so that its time shows in the timings; the test's own build is then a no-op.
phase "release build" cargo build --release --locked --bin attacher-hub

# Every test binary, before the control plane: this is the build the Go tools overlap.
phase "cargo test build" cargo test --no-run --quiet
phase "Go test tools" testbins_wait

# The second control plane of TEST_UNDER_LOAD, and a client that keeps it busy: a ConfigMap
# created, changed and deleted, over and over (each kubectl call is a process start and a TLS
# handshake, as a second test suite's clients would be).
if [ "${TEST_UNDER_LOAD:-0}" = 1 ]; then
  load_cluster=$repo_root/.work/load-cluster
  "$repo_root/scripts/cluster-up.sh" "$load_cluster" >/dev/null
  bins=$(sed -n 's/^export ATTACHER_TESTBINS=//p' "$load_cluster/env")
  setsid bash -c '
    kc=(--kubeconfig "$1/admin.kubeconfig")
    i=0
    while :; do
      i=$((i + 1))
      "$2/kubectl" "${kc[@]}" create configmap "load-$i" --from-literal=n="$i" >/dev/null 2>&1
      "$2/kubectl" "${kc[@]}" label configmap "load-$i" round="$i" >/dev/null 2>&1
      "$2/kubectl" "${kc[@]}" delete configmap "load-$i" --wait=false >/dev/null 2>&1
    done' load-writer "$load_cluster" "$bins" &
  load_pids+=("$!")
fi

cluster_healthy "$dir" || started=1

# cluster-up.sh fails (non-zero) when the control plane cannot start; so does this script.
phase "cluster-up" "$repo_root/scripts/cluster-up.sh" "$dir" >/dev/null
# shellcheck disable=SC1091
. "$dir/env"
# --no-fail-fast: one failing test binary must not hide the results of the others.
phase "cargo test" cargo test --no-fail-fast
phase "sanity" "${MAKE:-make}" --no-print-directory sanity
