# Shared helpers for the local control-plane scripts (sourced, not executed).
#
# A cluster directory holds: pki/, etcd/ (data), etcd.log, apiserver.log,
# etcd.pid, apiserver.pid, admin.kubeconfig, attacher.kubeconfig, env,
# startup.txt and lock (taken by cluster-up.sh so parallel callers share one
# control plane).

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# cluster_dir [DIR] -> absolute directory (created), default .work/cluster.
cluster_dir() {
  local d=${1:-$repo_root/.work/cluster}
  mkdir -p "$d"
  (cd "$d" && pwd)
}

# pid_of DIR NAME -> prints the PID recorded in DIR/NAME.pid if that process is
# alive and still one we started for DIR (its command line names DIR).
pid_of() {
  local dir=$1 name=$2 pid
  [ -f "$dir/$name.pid" ] || return 1
  pid=$(cat "$dir/$name.pid")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$dir" || return 1
  echo "$pid"
}

# cluster_healthy DIR -> 0 if etcd and kube-apiserver run from DIR and the
# API server answers /readyz with "ok".
cluster_healthy() {
  local dir=$1 url
  pid_of "$dir" etcd >/dev/null && pid_of "$dir" apiserver >/dev/null || return 1
  [ -f "$dir/env" ] && [ -f "$dir/admin.kubeconfig" ] || return 1
  url=$(sed -n 's/^export ATTACHER_TEST_APISERVER=//p' "$dir/env")
  [ -n "$url" ] || return 1
  [ "$(curl -sS --max-time 5 --cacert "$dir/pki/ca.crt" "$url/readyz" 2>/dev/null)" = ok ]
}

# stop_pid DIR NAME: SIGTERM the recorded process, wait up to 20 s, then SIGKILL.
stop_pid() {
  local dir=$1 name=$2 pid i
  if pid=$(pid_of "$dir" "$name"); then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "cluster: $name (pid $pid) ignored SIGTERM for 20s; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    echo "cluster: stopped $name (pid $pid)" >&2
  fi
  rm -f "$dir/$name.pid"
}
