#!/usr/bin/env bash
# `make compat`: the integration tests that touch the API server, against other Kubernetes
# releases than the one `make test` uses.
#
# Usage: scripts/compat.sh [PROFILE...]   (default: v1.36 v1.38; `current` is the default pins)
#
# A profile is a directory tools/testbins/compat/PROFILE (see tools/testbins/build.sh): its
# kube-apiserver, kube-controller-manager, kubectl, etcd and reference external-attacher are
# built once and cached like the other test tools (TESTBINS_PROFILE=PROFILE build.sh). For each
# profile this script starts a control plane of its own in .work/compat-PROFILE, runs the tests
# of each module of COMPAT_TESTS there (a former test file, tests/GROUP/NAME.rs, declared by
# the test binary GROUP's main.rs: cargo test --test GROUP with the module's tests by their
# exact names; tests that start kube-controller-manager take it from the same profile), and
# stops the control plane again.
#
# The results (versions as the binaries report them, date, commit, passed/failed per test
# module) go to COMPAT_REPORT (default docs/compat.md), which the README quotes; each module's
# output to .work/compat-PROFILE/NAME.log. Exits non-zero when any test failed.
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
cd "$repo_root"

tests=${COMPAT_TESTS:-leader_election lease_interop differential controller_manager topologies}
report=${COMPAT_REPORT:-$repo_root/docs/compat.md}
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(v1.36 v1.38)
for p in "${profiles[@]}"; do
  if [ "$p" != current ] && [ ! -f tools/testbins/compat/$p/versions ]; then
    echo "compat: unknown profile '$p': tools/testbins/compat/$p/versions does not exist (profiles: current $(cd tools/testbins/compat && echo */ | tr -d /))" >&2
    exit 2
  fi
done

# The test binary whose main.rs declares module NAME (tests/GROUP/main.rs: `mod NAME;`).
group_of() {
  local main
  main=$(grep -lx "mod $1;" tests/*/main.rs | head -n 1)
  if [ -z "$main" ]; then
    echo "compat: no test binary declares the module '$1' (tests/*/main.rs)" >&2
    exit 2
  fi
  basename "$(dirname "$main")"
}
# The full names of module NAME's tests in test binary GROUP, for libtest's --exact: a plain
# filter `NAME::` is a substring and would also take a module whose name ends in NAME
# (`differential::` matches `pd_differential::`). Listing runs no test.
module_tests() {
  cargo test --quiet --test "$1" -- --list --format terse 2>/dev/null | sed -n "s/^\($2::.*\): test$/\1/p"
}
for t in $tests; do group_of "$t" >/dev/null; done # an unknown name stops here
groups=$(for t in $tests; do group_of "$t"; done | sort -u)

# The tests' own builds first, once for every profile (and so that their time is not a test's).
for g in $groups; do cargo test --no-run --quiet --test "$g" 2>&1 | grep -v '^ *Executable' >&2 || true; done
cargo build --quiet --bin attacher-hub
for t in $tests; do
  if [ -z "$(module_tests "$(group_of "$t")" "$t")" ]; then
    echo "compat: the module '$t' of test binary '$(group_of "$t")' has no tests" >&2
    exit 2
  fi
done

commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
rows=()
failed=0
dir=
cleanup() { [ -n "$dir" ] && "$repo_root/scripts/cluster-down.sh" "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT

for p in "${profiles[@]}"; do
  if [ "$p" = current ]; then unset TESTBINS_PROFILE; else export TESTBINS_PROFILE=$p; fi
  t0=$(date +%s)
  bins=$(env -u ATTACHER_TESTBINS tools/testbins/build.sh | tail -n 1)
  echo "compat: $p: tools in $bins ($(( $(date +%s) - t0 ))s)" >&2
  apiserver=$("$bins/kube-apiserver" --version | awk '{print $2}')
  etcd=$("$bins/etcd" --version | awk '/^etcd Version/ {print $3}')
  attacher=$("$bins/csi-attacher" --version | awk '{print $2}')
  dir=$repo_root/.work/compat-$p
  "$repo_root/scripts/cluster-down.sh" "$dir" >/dev/null 2>&1 || true
  (env -u ATTACHER_TESTBINS scripts/cluster-up.sh "$dir" >/dev/null)
  results=()
  for t in $tests; do
    log=$dir/$t.log
    started=$(date +%s)
    set +e
    group=$(group_of "$t")
    # shellcheck disable=SC2046 # one argument per test name
    (
      # shellcheck disable=SC1091
      . "$dir/env"
      cargo test --quiet --test "$group" -- --exact $(module_tests "$group" "$t") --nocapture
    ) >"$log" 2>&1
    rc=$?
    set -e
    secs=$(( $(date +%s) - started ))
    passed=$(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    nfailed=$(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' "$log" | awk '{s+=$1} END {print s+0}')
    if [ "$rc" = 0 ]; then verdict=pass; else verdict=FAIL; failed=1; fi
    echo "compat: $p: $t: $verdict ($passed passed, $nfailed failed, ${secs}s; $log)" >&2
    results+=("$t: $verdict ($passed passed, $nfailed failed)")
  done
  "$repo_root/scripts/cluster-down.sh" "$dir" >/dev/null 2>&1 || true
  dir=
  rows+=("| $p | kube-apiserver, kube-controller-manager, kubectl $apiserver; etcd $etcd; external-attacher $attacher | $(IFS=';'; echo "${results[*]}" | sed 's/;/; /g') |")
done

{
  echo "# Compatibility runs (\`make compat\`)"
  echo
  echo "Written by \`scripts/compat.sh\` on $(date -u +%Y-%m-%d) at commit $commit$dirty: the integration tests"
  echo "that touch the API server, each test module against a control plane of the release named,"
  echo "with that release's kube-controller-manager and the reference external-attacher built for it."
  echo
  echo "| profile | versions | test modules |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$report"
echo "compat: report in $report" >&2
exit "$failed"
