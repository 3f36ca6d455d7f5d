# Shared helpers for the local control-plane scripts (sourced, not executed).
#
# A cluster directory holds: pki/, etcd/ (data), etcd.log, apiserver.log,
# etcd.pid, apiserver.pid, admin.kubeconfig, attacher.kubeconfig, env,
# startup.txt and lock (taken by cluster-up.sh so parallel callers share one
# control plane); once a caller asked for it, also controller-manager.pid,
# controller-manager.log and controller-manager.kubeconfig.

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
  local dir=$1 name=$2 pid cmd
  [ -f "$dir/$name.pid" ] || return 1
  pid=$(cat "$dir/$name.pid")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  # Not `tr | grep -q`: under pipefail, tr's SIGPIPE when grep stops early
  # would fail the test for a process that matches.
  cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *"$dir"* ]] || return 1
  echo "$pid"
}

# alive DIR NAME: the process recorded in DIR/NAME.pid a moment ago by the
# caller still runs. For start-up loops only: pid_of's command-line check
# (against a stale pid file) can fail in the instant between the fork and the
# exec of a process just started with `setsid ... &`, which on a loaded machine
# is long enough to be seen.
alive() {
  local pid
  pid=$(cat "$1/$2.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
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

# write_kubeconfig USER FILE: a kubeconfig for client certificate DIR/pki/USER.{crt,key}
# against the API server URL $api_url, trusting DIR/pki/ca.crt ($pki is DIR/pki).
write_kubeconfig() {
  local user=$1 file=$2
  b64() { base64 -w0 < "$1"; }
  cat > "$file" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $api_url
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(b64 "$pki/$user.crt")
    client-key-data: $(b64 "$pki/$user.key")
contexts:
- name: local
  context: {cluster: local, user: $user, namespace: default}
current-context: local
KUBECONFIG
}

# start_controller_manager DIR BINS: starts kube-controller-manager (from BINS)
# for the control plane running from DIR, unless it already runs: the
# attach-detach controller, the PV binder and the Deployment, ReplicaSet and
# DaemonSet controllers only, no leader election, no
# serving port, as user kube-controller-manager (system:masters). Returns
# non-zero, after showing the end of its log, if it does not come up.
start_controller_manager() {
  local dir=$1 bins=$2 log=$1/controller-manager.log end
  local pki=$dir/pki api_url
  if pid_of "$dir" controller-manager >/dev/null; then return 0; fi
  [ -x "$bins/kube-controller-manager" ] || { echo "cluster: $bins/kube-controller-manager is missing" >&2; return 1; }
  api_url=$(sed -n 's/^export ATTACHER_TEST_APISERVER=//p' "$dir/env")
  if [ ! -f "$pki/controller-manager.crt" ]; then
    if ! (cd "$pki" \
      && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout controller-manager.key \
        -out controller-manager.csr -subj "/O=system:masters/CN=kube-controller-manager" \
      && openssl x509 -req -in controller-manager.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
        -out controller-manager.crt -days 3650 -extfile client.ext \
      && rm -f controller-manager.csr) >/dev/null 2>&1; then
      echo "cluster: cannot make the controller-manager's client certificate in $pki" >&2
      return 1
    fi
  fi
  write_kubeconfig controller-manager "$dir/controller-manager.kubeconfig"
  # Its own session (it outlives the caller) and no fd 9 (DIR/lock), as the
  # API server. --v=2 logs each attach and detach it starts.
  setsid "$bins/kube-controller-manager" --kubeconfig="$dir/controller-manager.kubeconfig" \
    --controllers=attachdetach,persistentvolume-binder,deployment,replicaset,daemonset \
    --leader-elect=false --secure-port=0 --v=2 </dev/null >"$log" 2>&1 9>&- &
  echo $! > "$dir/controller-manager.pid"
  # Up when the attach-detach controller has started and every controller's
  # wait for its informers has ended (klog does not name the controller there).
  end=$(( $(date +%s) + 120 ))
  until grep -q '"Starting attach detach controller"' "$log" 2>/dev/null \
    && [ "$(grep -c '"Caches are synced"' "$log")" -ge "$(grep -c '"Waiting for caches to sync"' "$log")" ]; do
    if ! alive "$dir" controller-manager || [ "$(date +%s)" -ge "$end" ]; then
      echo "cluster: kube-controller-manager did not start; last lines of $log:" >&2
      tail -n 30 "$log" >&2 || true
      stop_pid "$dir" controller-manager
      return 1
    fi
    sleep 0.2
  done
  echo "cluster: kube-controller-manager (attach-detach, PV binder, Deployments, ReplicaSets, DaemonSets) running from $dir; log $log" >&2
}
