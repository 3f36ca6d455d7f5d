#!/usr/bin/env bash
# `make demo`: attacher-hub serving three CSI drivers at once, on a local
# control plane, at the level a user thinks in: Pods and their claims.
#
#   1. builds attacher-hub and the Rust mock driver (cargo, release) and the
#      Go test tools (through scripts/cluster-up.sh, cached after the first run);
#   2. starts etcd + kube-apiserver + kube-controller-manager (its
#      attach-detach controller and PV binder), or reuses the ones running from
#      CLUSTER_DIR (starting kube-controller-manager there if it does not run);
#   3. starts three CSI drivers in a fresh temporary directory, two of them real
#      vendors' controllers on fake clouds, whose attaches and detaches take
#      --latency ± 20 % as a real cloud's do: the GCE PD driver's controller
#      service (pd-controller) and the AWS EBS driver's (ebs-controller, driver
#      name ebs.csi.aws.com, fixed by the driver), and the project's Rust mock
#      (mock-csi-driver);
#   4. creates Nodes (managed by the attach-detach controller, one instance in
#      each fake cloud) with their CSINodes, and per driver PODS
#      PersistentVolumes, their claims and one Pod each, spread over the
#      Nodes, with kubectl as the admin. No VolumeAttachment: kube-controller-
#      manager creates them from the Pods;
#   5. starts one attacher-hub for all three (hub mode, drivers.yaml, leader
#      election), as the least-privileged attacher identity;
#   6. shows, refreshed every second, `attacher-hub status` (per driver its
#      state, lease holder, queue depths, attached VolumeAttachments and last
#      error) above the Pods per driver whose volumes are attached (listed in
#      their Node's status.volumesAttached); the URLs of /metrics and /drivers
#      are printed before.
#
# Ctrl-C deletes the Pods (kube-controller-manager deletes their
# VolumeAttachments, the hub detaches them), then stops everything the demo
# started: the hub, the drivers, and the control plane if it was not running
# before. On a control plane that keeps running, the demo's objects are
# removed (kube-controller-manager keeps running with it).
#
# Usage: scripts/demo.sh [--until-attached] [--timeout SECONDS] [--pods N]
#                        [--latency DURATION] [--keep-logs]
#                        [--cluster-dir DIR | DIR]
#   --until-attached  non-interactive: exit 0 as soon as every Pod's volumes
#                     are attached and every driver leads (printing the Pods
#                     table, the hub's table and the URLs on stdout), exit 1
#                     after --timeout (default 300) seconds
#   --pods N          Pods (each with one claim) per driver (default 5; --vas
#                     is an older name of it)
#   --latency D       time each attach or detach of the fake clouds of PD and
#                     EBS takes (Go duration, default 1s; 0s: none;
#                     --pd-latency is an older name of it)
#   --cluster-dir DIR control-plane directory (default .work/cluster)
#   --keep-logs       keep the run's directory (sockets, logs, drivers.yaml,
#                     objects.yaml) also after a clean exit; it is always kept
#                     after a failure
# Environment: ATTACHER_HUB_BIN and MOCK_CSI_DRIVER_BIN name prebuilt binaries
# (tests/deploy/demo.rs passes cargo's); when both are set, nothing is built.
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
cd "$repo_root"
# openssl, python3, curl, ... when missing (a fresh machine).
"$repo_root/scripts/install-deps.sh" --no-prometheus --no-image

until_attached=0 timeout=300 vas=5 nodes=3 cluster_arg= keep=0 latency=1s
while [ $# -gt 0 ]; do
  case $1 in
    --until-attached) until_attached=1 ;;
    --timeout) timeout=${2:?--timeout needs seconds}; shift ;;
    --timeout=*) timeout=${1#*=} ;;
    --pods|--vas) vas=${2:?$1 needs a number}; shift ;;
    --pods=*|--vas=*) vas=${1#*=} ;;
    --latency|--pd-latency) latency=${2:?$1 needs a duration}; shift ;;
    --latency=*|--pd-latency=*) latency=${1#*=} ;;
    --keep-logs) keep=1 ;;
    --cluster-dir) cluster_arg=${2:?--cluster-dir needs a directory}; shift ;;
    --cluster-dir=*) cluster_arg=${1#*=} ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) echo "demo: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) cluster_arg=$1 ;;
  esac
  shift
done
[[ $timeout =~ ^[0-9]+$ && $vas =~ ^[1-9][0-9]*$ ]] || { echo "demo: --timeout and --pods take whole numbers" >&2; exit 2; }
[[ $latency =~ ^[0-9]+(ms|s)$ ]] || { echo "demo: --latency takes a duration such as 1s or 500ms" >&2; exit 2; }

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

# demo_vas: "<driver> <node> <name>" of every VolumeAttachment of the demo's
# drivers on the demo's Nodes (kube-controller-manager names them; they carry no
# label of the run, and EBS's driver name is not the run's own).
demo_vas() {
  [ "${#driver_names[@]}" -gt 0 ] || return 0
  k get volumeattachments -o jsonpath='{range .items[*]}{.spec.attacher}{" "}{.spec.nodeName}{" "}{.metadata.name}{"\n"}{end}' 2>/dev/null \
    | grep -F -f <(printf '%s demo-'"$run"'-node-\n' "${driver_names[@]}") || true
}

on_exit() {
  local rc=$? t0 p i
  trap '' INT TERM   # cleanup runs to the end; every wait below is bounded
  echo >&2
  if [ "$objects" = 1 ] && [ -n "$hub_pid" ] && kill -0 "$hub_pid" 2>/dev/null; then
    say "detaching: deleting the $(( vas * ${#driver_names[@]} )) Pods; kube-controller-manager deletes their VolumeAttachments, attacher-hub detaches them ..."
    t0=$(date +%s.%N)
    # No kubelet runs to confirm a graceful deletion: the Pods go at once.
    k -n default delete pods -l "$selector" --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    for i in $(seq 1 300); do
      [ -z "$(demo_vas)" ] && break
      sleep 0.2
    done
    if [ -z "$(demo_vas)" ]; then
      say "detaching: all detached, their VolumeAttachments deleted, in $(since "$t0")"
    else
      say "detaching: not all VolumeAttachments were detached within 60s (hub log: $tmp/hub.log)"
    fi
    # Deleted PVs without VolumeAttachments lose the hub's finalizer.
    k -n default delete pvc -l "$selector" --wait=false >/dev/null 2>&1 || true
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
    k -n default delete pods,pvc -l "$selector" --grace-period=0 --force \
      --ignore-not-found --wait=false >/dev/null 2>&1 || true
    for o in $(demo_vas | awk '{print "volumeattachment/" $3}') \
      $(k get persistentvolumes -l "$selector" -o name 2>/dev/null); do
      k patch "$o" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
      k delete "$o" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    done
    k delete csinodes,nodes -l "$selector" --ignore-not-found --wait=false >/dev/null 2>&1 || true
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
  say "starting etcd, kube-apiserver and kube-controller-manager in $dir (the first run also builds the Go tools: ~25 min on 2 cores) ..."
  started_cluster=1
fi
# Its progress lines (Go tools build, start-up time) are shown; all of its
# output is in $tmp/cluster-up.log.
"$repo_root/scripts/cluster-up.sh" --controller-manager "$dir" 2>&1 >"$tmp/cluster-up.out" | tee "$tmp/cluster-up.log" \
  | sed -u -n '/^cluster: reusing/d; /^\(testbins\|cluster\): /p' >&2 \
  || fail "scripts/cluster-up.sh $dir failed; logs in $dir" "$tmp/cluster-up.log"
kubeconfig=$(tail -n 1 "$tmp/cluster-up.out")
# shellcheck disable=SC1091
. "$dir/env"
kubectl=$ATTACHER_TESTBINS/kubectl
[ "$started_cluster" = 1 ] && say "control plane up at $ATTACHER_TEST_APISERVER in $(since "$t0")"

# --- 3. drivers -------------------------------------------------------------------
declare -A volume_ids driver_kind driver_of
tags=(pd ebs rust)
node_name() { echo "demo-$run-node-$1"; }
ebs_instance() { echo "i-demo-$run-node-$1"; }
# wait_ready TAG PID: waits for the driver's `ready` line.
wait_ready() {
  local tag=$1 pid=$2 i
  for i in $(seq 1 300); do
    grep -qx ready "$tmp/$tag.out" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  fail "driver $tag did not start" "$tmp/$tag.log"
}
# start_driver TAG KIND: starts a driver, waits for `ready`, records volume IDs.
start_driver() {
  local tag=$1 kind=$2 name=$1.demo-$run.example.com sock=$tmp/$1.sock i n disks= instances=
  case $kind in
    pd)
      for ((i = 0; i < vas; i++)); do disks+=${disks:+,}demo-$run-pd-$i; done
      for ((n = 1; n <= nodes; n++)); do instances+=${instances:+,}$(node_name "$n"); done
      setsid "$ATTACHER_TESTBINS/pd-controller" --endpoint="$sock" --name="$name" \
        --instances="$instances" --disks="$disks" --latency="$latency" --jitter=0.2 -v=2 \
        </dev/null >"$tmp/$tag.out" 2>"$tmp/$tag.log" &
      ;;
    ebs)
      name=ebs.csi.aws.com
      for ((i = 0; i < vas; i++)); do disks+=${disks:+,}vol-demo-$run-$i; done
      for ((n = 1; n <= nodes; n++)); do instances+=${instances:+,}$(ebs_instance "$n"); done
      setsid "$ATTACHER_TESTBINS/ebs-controller" --endpoint="$sock" \
        --instances="$instances" --volumes="$disks" --latency="$latency" --jitter=0.2 -v=2 \
        </dev/null >"$tmp/$tag.out" 2>"$tmp/$tag.log" &
      ;;
    rust)
      setsid "$mock_bin" --endpoint "$sock" --name "$name" --volumes "$vas" \
        </dev/null >"$tmp/$tag.out" 2>"$tmp/$tag.log" &
      ;;
  esac
  driver_pids+=($!)
  wait_ready "$tag" "$!"
  case $kind in
    pd)
      volume_ids[$tag]=$(for ((i = 0; i < vas; i++)); do
        printf 'projects/test-project/zones/country-region-zone/disks/demo-%s-pd-%d ' "$run" "$i"; done)
      driver_kind[$name]="GCE PD driver (fake cloud, ${latency} per attach)"
      ;;
    ebs)
      volume_ids[$tag]=${disks//,/ }
      driver_kind[$name]="AWS EBS driver (fake EC2, ${latency} per attach)"
      ;;
    rust)
      volume_ids[$tag]=$(for ((i = 0; i < vas; i++)); do printf 'vol-%d ' "$i"; done)
      driver_kind[$name]="Rust mock-csi-driver"
      ;;
  esac
  driver_names+=("$name")
  driver_of[$tag]=$name
  say "driver $name (${driver_kind[$name]}) serving unix://$sock"
}
for tag in "${tags[@]}"; do start_driver "$tag" "$tag"; done

# --- 4. Kubernetes objects ----------------------------------------------------------
# Nodes demo-<run>-node-<n> under the attach-detach controller, each with one
# CSINode listing all three drivers (the PD driver's node ID names the
# Node's instance, the EBS driver's is its EC2 instance ID, i-demo-<run>-node-<n>);
# then per driver PODS PersistentVolumes, each with its claim (pre-bound: the
# PV binder binds them) and a Pod using it, spread over the Nodes
# (spec.nodeName: no scheduler runs). kube-controller-manager creates the
# VolumeAttachments.
yaml=$tmp/objects.yaml
meta() { printf 'metadata:\n  name: %s\n  labels:\n    %s: "%s"\n' "$1" "$label" "$run"; }
{
  for ((n = 1; n <= nodes; n++)); do
    node=$(node_name "$n")
    printf -- '---\napiVersion: v1\nkind: Node\n'; meta "$node"
    printf '  annotations:\n    volumes.kubernetes.io/controller-managed-attach-detach: "true"\n'
    printf -- '---\napiVersion: storage.k8s.io/v1\nkind: CSINode\n'; meta "$node"
    printf 'spec:\n  drivers:\n'
    for tag in "${tags[@]}"; do
      name=${driver_of[$tag]}
      case $tag in
        pd) node_id=projects/test-project/zones/country-region-zone/instances/$node ;;
        ebs) node_id=$(ebs_instance "$n") ;;
        *) node_id=$node ;;
      esac
      printf '    - name: %s\n      nodeID: %s\n' "$name" "$node_id"
    done
  done
  for tag in "${tags[@]}"; do
    name=${driver_of[$tag]} i=0
    for vol in ${volume_ids[$tag]}; do
      obj=demo-$run-$tag-$i node=$(node_name $(( i % nodes + 1 )))
      printf -- '---\napiVersion: v1\nkind: PersistentVolume\n'; meta "$obj"
      printf 'spec:\n  capacity: {storage: 10Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: ""\n'
      printf '  persistentVolumeReclaimPolicy: Retain\n  csi: {driver: %s, volumeHandle: "%s"}\n' "$name" "$vol"
      printf '  claimRef: {namespace: default, name: %s}\n' "$obj"
      printf -- '---\napiVersion: v1\nkind: PersistentVolumeClaim\n'; meta "$obj"
      printf '  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: ""\n'
      printf '  volumeName: %s\n  resources: {requests: {storage: 10Gi}}\n' "$obj"
      printf -- '---\napiVersion: v1\nkind: Pod\n'; meta "$obj"
      printf '  namespace: default\nspec:\n  nodeName: %s\n' "$node"
      printf '  containers: [{name: app, image: registry.k8s.io/pause:3.10}]\n'
      printf '  volumes: [{name: data, persistentVolumeClaim: {claimName: %s}}]\n' "$obj"
      i=$((i + 1))
    done
  done
} >"$yaml"
k create -f "$yaml" >"$tmp/create.log" 2>&1 || { objects=1; fail "kubectl create -f $yaml failed" "$tmp/create.log"; }
objects=1
say "created $nodes Nodes with CSINodes, and per driver $vas PersistentVolumes, claims and Pods (label $selector);"
say "  kube-controller-manager creates the VolumeAttachments; see them with: $kubectl --kubeconfig $kubeconfig get pods,volumeattachments"

# --- 5. attacher-hub --------------------------------------------------------------
{
  echo "# attacher-hub demo run $run: the PD and EBS drivers and the Rust mock"
  echo "drivers:"
  for tag in "${tags[@]}"; do echo "  - address: unix://$tmp/$tag.sock"; done
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
# `attacher-hub status` reads the hub's /drivers and counts each driver's
# VolumeAttachments; scripts/demo-pods.py shows the Pods per driver whose
# volumes are attached (in their Node's status.volumesAttached).
say "metrics: $hub_url/metrics"
say "drivers: $hub_url/drivers"
status=("$hub_bin" status --address "$hub_url" --kubeconfig "$kubeconfig" --interval 1s)
pods=("$repo_root/scripts/demo-pods.py" --kubectl "$kubectl" --kubeconfig "$kubeconfig"
  --selector "$selector")
for n in "${driver_names[@]}"; do pods+=(--kind "$n=${driver_kind[$n]}"); done
if [ "$until_attached" = 1 ]; then
  "${pods[@]}" --until-attached --expect $(( vas * ${#driver_names[@]} )) --timeout "$timeout" || exit $?
  echo
  "${status[@]}" --until-attached --wait-timeout 60s || exit $?
  echo "metrics:  $hub_url/metrics"
  echo "drivers:  $hub_url/drivers"
  say "every Pod's volumes attached $(since "$hub_t0") after attacher-hub started"
else
  interrupt_rc=0
  "${pods[@]}" --watch --hub-status "${status[@]}" || { rc=$?; [ "$rc" = 130 ] && exit 0; exit "$rc"; }
fi
