#!/usr/bin/env bash
# `make demo`: starts (or reuses) the local control plane and two mock CSI
# drivers, each on its own Unix socket, as a hub would serve them. The hub's
# attach/detach controller is not part of the crate yet, so the demo stops
# there and says so. On a terminal it keeps the drivers running until Ctrl-C;
# otherwise it stops them right away. A control plane the demo started is
# stopped on exit.
#
# Usage: scripts/demo.sh [CLUSTER_DIR]
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
cd "$repo_root"
dir=$(cluster_dir "${1:-}")
demo=$repo_root/.work/demo
mkdir -p "$demo"

started=0
cluster_healthy "$dir" || started=1
pids=()
on_exit() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$started" = 1 ]; then "$repo_root/scripts/cluster-down.sh" "$dir" || true; fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

kubeconfig=$("$repo_root/scripts/cluster-up.sh" "$dir" | tail -n 1)
# shellcheck disable=SC1091
. "$dir/env"

for name in demo-a.csi.example.com demo-b.csi.example.com; do
  sock=$demo/$name.sock
  "$ATTACHER_TESTBINS/mockcsi" --endpoint="$sock" --name="$name" --volumes=2 -v=2 \
    >"$demo/$name.out" 2>"$demo/$name.log" &
  pids+=($!)
  for _ in $(seq 1 100); do grep -qx ready "$demo/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -qx ready "$demo/$name.out" || { echo "demo: driver $name did not start; see $demo/$name.log" >&2; exit 1; }
  echo "demo: driver $name listening on unix://$sock, volumes: $(grep '^vol-' "$demo/$name.out" | tr '\n' ' ')"
done

cat <<MSG

demo: the control plane is up: $ATTACHER_TEST_APISERVER
      $ATTACHER_TESTBINS/kubectl --kubeconfig $kubeconfig get volumeattachments
demo: two mock CSI drivers are serving (logs in $demo).
demo: attacher-hub's attach/detach controller is not built yet, so nothing
      attaches their volumes in this demo; the integration tests show the
      reference Go external-attacher doing it (cargo test --test reference_attacher).
MSG

if [ -t 0 ]; then
  echo "demo: press Ctrl-C to stop the drivers."
  wait
fi
