#!/usr/bin/env bash
# Stops the local control plane started by scripts/cluster-up.sh in DIR
# (default .work/cluster): kube-controller-manager (if it runs) first, then
# kube-apiserver, then etcd, each by its recorded PID, waiting until each has
# exited. Safe to run when nothing runs.
#
# Usage: scripts/cluster-down.sh [DIR]
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
dir=$(cluster_dir "${1:-}")
exec 9>"$dir/lock"
flock 9
stop_pid "$dir" controller-manager
stop_pid "$dir" apiserver
stop_pid "$dir" etcd
rm -f "$dir/env"
