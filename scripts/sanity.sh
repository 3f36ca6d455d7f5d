#!/usr/bin/env bash
# Runs csi-sanity v5.6.0 against the project's mock CSI driver.
#
#   scripts/sanity.sh [extra csi-sanity flags, e.g. -ginkgo.focus=ListVolumes]
#
# Gets csi-sanity from tools/testbins/build.sh (waits for a background build
# logged in /tmp/testbins-build.log instead of starting a second one), builds
# mock-csi-driver, serves it on a temporary socket, runs csi-sanity, prints
# Ginkgo's summary and a plain "N passed, N failed" line, and exits non-zero
# on any failed spec. The mock is killed on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."

# Node IDs csi-sanity invents for "node does not exist" (its DefaultIDGenerator
# makes fake-node-id-<uuid>); the mock answers NOT_FOUND for them.
MISSING_NODE_PREFIX=fake-node-id
# NodeGetInfo's limit; csi-sanity publishes this many volumes and expects the next to fail.
MAX_VOLUMES_PER_NODE=4

log=/tmp/testbins-build.log
if [ -f "$log" ] && ! tail -n 1 "$log" | grep -q '^exit'; then
  echo "sanity: waiting for the test-tools build in progress ($log)" >&2
  while ! tail -n 1 "$log" | grep -q '^exit'; do sleep 5; done
fi
bins=$(tools/testbins/build.sh | tail -n 1)
sanity="$bins/csi-sanity"
[ -x "$sanity" ] || { echo "sanity: $sanity not found" >&2; exit 1; }

cargo build --quiet --package mock-csi-driver --bin mock-csi-driver
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
mock="${target_dir:-target}/debug/mock-csi-driver"

work=$(mktemp -d /tmp/attacher-sanity.XXXXXX)
mock_pid=""
cleanup() {
  if [ -n "$mock_pid" ]; then kill "$mock_pid" 2>/dev/null || true; wait "$mock_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
[ -n "${SANITY_KEEP:-}" ] && trap 'echo "sanity: kept $work" >&2; [ -n "$mock_pid" ] && kill "$mock_pid"' EXIT

sock="$work/csi.sock"
"$mock" --endpoint "unix://$sock" --name mock.csi.attacher-hub.io --volumes 2 \
  --max-volumes-per-node "$MAX_VOLUMES_PER_NODE" --missing-node-prefix "$MISSING_NODE_PREFIX" \
  >"$work/mock.out" 2>"$work/mock.log" &
mock_pid=$!
for _ in $(seq 1 100); do
  grep -qx ready "$work/mock.out" 2>/dev/null && break
  kill -0 "$mock_pid" 2>/dev/null || { cat "$work/mock.log" >&2; echo "sanity: mock exited" >&2; exit 1; }
  sleep 0.1
done
grep -qx ready "$work/mock.out" || { echo "sanity: mock not ready" >&2; exit 1; }

set +e
"$sanity" --csi.endpoint="unix://$sock" \
  --csi.mountdir="$work/mount" --csi.stagingdir="$work/staging" \
  --csi.testnodevolumeattachlimit \
  -ginkgo.no-color -ginkgo.junit-report="$work/junit.xml" "$@" >"$work/sanity.out" 2>&1
rc=$?
set -e

# Ginkgo's summary block ("Ran N of M Specs ..." and the pass/fail line).
grep -E '^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!|  \[FAIL\])' "$work/sanity.out" || tail -n 30 "$work/sanity.out"
if [ "$rc" -ne 0 ]; then
  echo "--- csi-sanity output (tail) ---" >&2; tail -n 80 "$work/sanity.out" >&2
  echo "--- mock log (tail) ---" >&2; tail -n 20 "$work/mock.log" >&2
fi
summary=$(grep -Eo '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$work/sanity.out" | tail -n 1 || true)
passed=$(sed -E 's/^([0-9]+) Passed.*/\1/' <<<"$summary")
failed=$(sed -E 's/.*\| ([0-9]+) Failed.*/\1/' <<<"$summary")
skipped=$(sed -E 's/.*\| ([0-9]+) Skipped.*/\1/' <<<"$summary")
if [ -z "$summary" ]; then passed=0; failed=1; skipped=0; fi
# Specs that skipped themselves, by the reason they give (from the JUnit report).
if [ -f "$work/junit.xml" ]; then
  echo "skipped or pending specs by reason:"
  grep -o '<skipped message="[^"]*"' "$work/junit.xml" | sed -E 's/<skipped message="(skipped - )?([^"]*)"/\2/' \
    | sort | uniq -c | sed 's/^/  /' || true
fi
echo "$passed passed, $failed failed ($skipped skipped)"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
