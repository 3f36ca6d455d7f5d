#!/usr/bin/env bash
# `make demo`: attacher-hub serving three CSI drivers at once, on a local
# control plane, watched through a live table.
#
#   1. builds attacher-hub and the Rust mock driver (cargo, release) and the
#      Go test tools (through scripts/cluster-up.sh, cached after the first run);
#   2. starts etcd + kube-apiserver (or reuses the ones running from CLUSTER_DIR);
#   3. starts three mock CSI drivers in a fresh temporary directory: two Rust
#      mocks (mock-csi-driver) and one Go mock (mockcsi);
#   4. creates Nodes, CSINodes, PersistentVolumes and VolumeAttachments
#      (VAS per driver) with kubectl as the admin;
#   5. starts one attacher-hub for all three (hub mode, drivers.yaml, leader
#      election), as the least-privileged attacher identity;
#   6. shows `attacher-hub status --watch`, refreshed every second: per driver
#      its state, lease holder, queue depths, attached VolumeAttachments and
#      last error; the URLs of /metrics and /drivers are printed before.
#
# Ctrl-C deletes the VolumeAttachments (the hub detaches them), then stops
# everything the demo started: the hub, the drivers, and the control plane if
# it was not running before. On a control plane that keeps running, the
# demo's objects are removed.
#
# Usage: scripts/demo.sh [--until-attached] [--timeout SECONDS] [--vas N]
#                        [--keep-logs] [--cluster-dir DIR | DIR]
#   --until-attached  non-interactive: exit 0 as soon as every driver leads and
#                     every VolumeAttachment is attached (printing the final
#                     table and the URLs on stdout; `attacher-hub status
#                     --until-attached`), exit 1
#                     after --timeout (default 300) seconds
#   --vas N           VolumeAttachments per driver (default 5)
#   --cluster-dir DIR control-plane directory (default .work/cluster)
#   --keep-logs       keep the run's directory (sockets, logs, drivers.yaml,
#                     objects.yaml) also after a clean exit; it is always kept
#                     after a failure
# Environment: ATTACHER_HUB_BIN and MOCK_CSI_DRIVER_BIN name prebuilt binaries
# (tests/demo.rs passes cargo's); when both are set, nothing is built.
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
cd "$repo_root"
# openssl, python3, curl, ... when missing (a fresh machine).
"$repo_root/scripts/install-deps.sh" --no-prometheus --no-image

until_attached=0 timeout=300 vas=5 nodes=3 cluster_arg= keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --until-attached) until_attached=1 ;;
    --timeout) timeout=${2:?--timeout needs seconds}; shift ;;
    --timeout=*) timeout=${1#*=} ;;
    --vas) vas=${2:?--vas needs a number}; shift ;;
    --vas=*) vas=${1#*=} ;;
    --keep-logs) keep=1 ;;
    --cluster-dir) cluster_arg=${2:?--cluster-dir needs a directory}; shift ;;
    --cluster-dir=*) cluster_arg=${1#*=} ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) echo "demo: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) cluster_arg=$1 ;;
  esac
  shift
done
[[ $timeout =~ ^[0-9]+$ && $vas =~ ^[1-9][0-9]*$ ]] || { echo "demo: --timeout and --vas take whole numbers" >&2; exit 2; }

say() { echo "demo: $*" >&2; }
t_start=$(date +%s.%N)
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}s')" "$1" "$(date +%s.%N)"; }

# --- state for the cleanup --------------------------------------------------
dir=$(cluster_dir "$cluster_arg")
started_cluster=0
run=$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')   # 4 hex digits: names this run's objects
label=attacher-hub-demo/run
selector=$label=$run
tmp=
hub_pid=
driver_pids=()
objects=0
kubectl=
kubeconfig=
driver_names=()

# stop PID NAME: SIGTERM, up to 15 s, then SIGKILL.
stop() {
  local pid=$1 name=$2 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    say "$name (pid $pid) ignored SIGTERM for 15s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }

on_exit() {
  local rc=$? t0 p i
  trap '' INT TERM   # cleanup runs to the end; every wait below is bounded
  echo >&2
  if [ "$objects" = 1 ] && [ -n "$hub_pid" ] && kill -0 "$hub_pid" 2>/dev/null; then
    say "detaching: deleting the $(( vas * ${#driver_names[@]} )) VolumeAttachments; attacher-hub detaches them ..."
    t0=$(date +%s.%N)
    k delete volumeattachments -l "$selector" --wait=false >/dev/null 2>&1 || true
    if k wait --for=delete volumeattachments -l "$selector" --timeout=30s >/dev/null 2>&1; then
      say "detaching: all detached and deleted in $(since "$t0")"
    else
      say "detaching: not all VolumeAttachments were detached within 30s (hub log: $tmp/hub.log)"
    fi
    # Deleted PVs without VolumeAttachments lose the hub's finalizer. (They
    # stay, held by kubernetes.io/pv-protection: this control plane runs no
    # controller-manager to lift it; the clean-up below does.)
    k delete persistentvolumes -l "$selector" --wait=false >/dev/null 2>&1 || true
    for i in $(seq 1 25); do
      if ! k get persistentvolumes -l "$selector" -o jsonpath='{.items[*].metadata.finalizers}' 2>/dev/null \
        | grep -q external-attacher/; then
        say "detaching: attacher-hub took its finalizers off the deleted PersistentVolumes"
        break
      fi
      [ "$i" = 25 ] && say "detaching: some deleted PersistentVolumes still carry attacher-hub's finalizer after 5s (the clean-up removes it)"
      sleep 0.2
    done
  fi
  [ -n "$hub_pid" ] && { stop "$hub_pid" attacher-hub; say "stopped attacher-hub"; }
  for p in "${driver_pids[@]}"; do stop "$p" driver; done
  [ "${#driver_pids[@]}" -gt 0 ] && say "stopped the drivers"
  if [ "$started_cluster" = 1 ]; then
    "$repo_root/scripts/cluster-down.sh" "$dir" 2>/dev/null || true
    say "stopped the control plane it had started"
  elif [ "$objects" = 1 ]; then
    # A control plane that keeps running gets back to where it was. Whatever
    # is left (the hub died early) loses its finalizers first.
    for kind in volumeattachments persistentvolumes; do
      k get "$kind" -l "$selector" -o name 2>/dev/null | while read -r o; do
        k patch "$o" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
      done
    done
    k delete volumeattachments,persistentvolumes,csinodes,nodes -l "$selector" \
      --ignore-not-found --wait=false >/dev/null 2>&1 || true
    for n in "${driver_names[@]}"; do
      k -n default delete lease "external-attacher-leader-${n//[^a-zA-Z0-9-]/-}" \
        --ignore-not-found >/dev/null 2>&1 || true
    done
    say "removed the demo's objects from the control plane at $dir"
  fi
  if [ -n "$tmp" ]; then
    if [ "$keep" = 0 ] && { [ "$rc" = 0 ] || [ "$rc" = 130 ]; }; then rm -rf "$tmp"; else say "logs kept in $tmp"; fi
  fi
  say "done in $(since "$t_start") (exit $rc)"
  exit "$rc"
}
trap on_exit EXIT
# Ctrl-C during the set-up is a failure (130); while the table shows, it is
# the normal way to end the demo (0).
interrupt_rc=130
trap 'exit $interrupt_rc' INT TERM

fail() { # message [log file]
  say "ERROR: $1"
  if [ -n "${2:-}" ] && [ -f "$2" ]; then
    echo "---- last lines of $2 ----" >&2
    tail -n 30 "$2" >&2
  fi
  exit 1
}

# Sockets, logs and generated files of this run (short path: socket names are
# limited to 107 bytes).
tmp=$(mktemp -d "${TMPDIR:-/tmp}/attacher-hub-demo.XXXXXX")

# --- 1. build -----------------------------------------------------------------
t0=$(date +%s.%N)
if [ -n "${ATTACHER_HUB_BIN:-}" ] && [ -n "${MOCK_CSI_DRIVER_BIN:-}" ]; then
  hub_bin=$ATTACHER_HUB_BIN mock_bin=$MOCK_CSI_DRIVER_BIN
  say "using prebuilt $hub_bin and $mock_bin"
else
  say "building attacher-hub and mock-csi-driver (cargo build --release) ..."
  cargo build --release --package attacher-hub --package mock-csi-driver --bin attacher-hub --bin mock-csi-driver
  hub_bin=$repo_root/target/release/attacher-hub mock_bin=$repo_root/target/release/mock-csi-driver
  say "built in $(since "$t0")"
fi

# --- 2. control plane -----------------------------------------------------------
t0=$(date +%s.%N)
if cluster_healthy "$dir"; then
  say "reusing the control plane running from $dir"
else
  say "starting etcd and kube-apiserver in $dir (the first run also builds the Go tools: ~15 min on 2 cores) ..."
  started_cluster=1
fi
# Its progress lines (Go tools build, start-up time) are shown; all of its
# output is in $tmp/cluster-up.log.
"$repo_root/scripts/cluster-up.sh" "$dir" 2>&1 >"$tmp/cluster-up.out" | tee "$tmp/cluster-up.log" \
  | sed -u -n '/^cluster: reusing/d; /^\(testbins\|cluster\): /p' >&2 \
  || fail "scripts/cluster-up.sh $dir failed; logs in $dir" "$tmp/cluster-up.log"
kubeconfig=$(tail -n 1 "$tmp/cluster-up.out")
# shellcheck disable=SC1091
. "$dir/env"
kubectl=$ATTACHER_TESTBINS/kubectl
[ "$started_cluster" = 1 ] && say "control plane up at $ATTACHER_TEST_APISERVER in $(since "$t0")"

# --- 3. drivers -------------------------------------------------------------------
declare -A volume_ids mock_kind
# start_driver TAG KIND: starts a mock, waits for `ready`, records volume IDs.
start_driver() {
  local tag=$1 kind=$2 name=$1.demo-$run.example.com sock=$tmp/$1.sock i
  if [ "$kind" = go ]; then
    setsid "$ATTACHER_TESTBINS/mockcsi" --endpoint="$sock" --name="$name" --volumes="$vas" -v=2 \
      </dev/null >"$tmp/$tag.out" 2>"$tmp/$tag.log" &
  else
    setsid "$mock_bin" --endpoint "$sock" --name "$name" --volumes "$vas" \
      </dev/null >"$tmp/$tag.out" 2>"$tmp/$tag.log" &
  fi
  driver_pids+=($!)
  for i in $(seq 1 300); do
    grep -qx ready "$tmp/$tag.out" 2>/dev/null && break
    kill -0 "$!" 2>/dev/null || break
    sleep 0.1
  done
  grep -qx ready "$tmp/$tag.out" 2>/dev/null || fail "driver $name did not start" "$tmp/$tag.log"
  if [ "$kind" = go ]; then
    # mockcsi prints "vol-<i> <volume id>" per pre-created volume.
    volume_ids[$tag]=$(awk '/^vol-/ {print $2}' "$tmp/$tag.out" | tr '\n' ' ')
    mock_kind[$name]="Go mockcsi"
  else
    volume_ids[$tag]=$(for ((i = 0; i < vas; i++)); do printf 'vol-%d ' "$i"; done)
    mock_kind[$name]="Rust mock-csi-driver"
  fi
  driver_names+=("$name")
  say "driver $name (${mock_kind[$name]}) serving unix://$sock"
}
start_driver rust-a rust
start_driver rust-b rust
start_driver go go

# --- 4. Kubernetes objects ----------------------------------------------------------
# Nodes demo-<run>-node-<n>, each with one CSINode listing all three drivers
# (the Go mock knows a single node, named like the driver), then per driver
# VAS PersistentVolumes and one VolumeAttachment each, spread over the nodes.
# They exist before the hub starts, so it finds them pending in its first list.
yaml=$tmp/objects.yaml
meta() { printf 'metadata:\n  name: %s\n  labels:\n    %s: "%s"\n' "$1" "$label" "$run"; }
{
  for ((n = 1; n <= nodes; n++)); do
    node=demo-$run-node-$n
    printf -- '---\napiVersion: v1\nkind: Node\n'; meta "$node"
    printf -- '---\napiVersion: storage.k8s.io/v1\nkind: CSINode\n'; meta "$node"
    printf 'spec:\n  drivers:\n'
    for tag in rust-a rust-b go; do
      name=$tag.demo-$run.example.com
      node_id=$node; [ "$tag" = go ] && node_id=$name
      printf '    - name: %s\n      nodeID: %s\n' "$name" "$node_id"
    done
  done
  for tag in rust-a rust-b go; do
    name=$tag.demo-$run.example.com i=0
    for vol in ${volume_ids[$tag]}; do
      obj=demo-$run-$tag-$i node=demo-$run-node-$(( i % nodes + 1 ))
      printf -- '---\napiVersion: v1\nkind: PersistentVolume\n'; meta "$obj"
      printf 'spec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n'
      printf '  persistentVolumeReclaimPolicy: Retain\n  csi: {driver: %s, volumeHandle: "%s"}\n' "$name" "$vol"
      printf -- '---\napiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\n'; meta "$obj"
      printf 'spec:\n  attacher: %s\n  nodeName: %s\n  source: {persistentVolumeName: %s}\n' "$name" "$node" "$obj"
      i=$((i + 1))
    done
  done
} >"$yaml"
k create -f "$yaml" >"$tmp/create.log" 2>&1 || { objects=1; fail "kubectl create -f $yaml failed" "$tmp/create.log"; }
objects=1
say "created $nodes Nodes with CSINodes, and $vas PersistentVolumes + $vas VolumeAttachments per driver (label $selector)"
say "  see them with: $kubectl --kubeconfig $kubeconfig get volumeattachments -l $selector"

# --- 5. attacher-hub --------------------------------------------------------------
{
  echo "# attacher-hub demo run $run: the three mock drivers"
  echo "drivers:"
  for tag in rust-a rust-b go; do echo "  - address: unix://$tmp/$tag.sock"; done
} >"$tmp/drivers.yaml"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
hub_url=http://127.0.0.1:$port
hub_t0=$(date +%s.%N)
setsid "$hub_bin" --config "$tmp/drivers.yaml" --kubeconfig "$ATTACHER_TEST_ATTACHER_KUBECONFIG" \
  --http-endpoint "127.0.0.1:$port" --leader-election --leader-election-namespace default \
  --kube-api-qps 50 --kube-api-burst 100 </dev/null >"$tmp/hub.log" 2>&1 &
hub_pid=$!
for _ in $(seq 1 300); do
  curl -fsS --max-time 1 "$hub_url/drivers" >/dev/null 2>&1 && break
  kill -0 "$hub_pid" 2>/dev/null || fail "attacher-hub exited at start" "$tmp/hub.log"
  sleep 0.1
done
curl -fsS --max-time 1 "$hub_url/drivers" >/dev/null 2>&1 || fail "attacher-hub's $hub_url/drivers did not answer within 30s" "$tmp/hub.log"
say "attacher-hub (pid $hub_pid) serving the three drivers; config $tmp/drivers.yaml, log $tmp/hub.log"

say "setup took $(since "$t_start")"

# --- 6. the table ---------------------------------------------------------------------
# `attacher-hub status` reads the hub's /drivers and counts this run's
# VolumeAttachments (selected by the run's label) per driver.
say "metrics: $hub_url/metrics"
say "drivers: $hub_url/drivers"
status=("$hub_bin" status --address "$hub_url" --kubeconfig "$kubeconfig" --selector "$selector"
  --interval 1s)
if [ "$until_attached" = 1 ]; then
  "${status[@]}" --until-attached --wait-timeout "${timeout}s" || exit $?
  echo "metrics:  $hub_url/metrics"
  echo "drivers:  $hub_url/drivers"
  say "every VolumeAttachment attached $(since "$hub_t0") after attacher-hub started"
else
  interrupt_rc=0
  "${status[@]}" --watch || { rc=$?; [ "$rc" = 130 ] && exit 0; exit "$rc"; }
fi
