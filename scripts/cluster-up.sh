#!/usr/bin/env bash
# Starts a local Kubernetes control plane (etcd + kube-apiserver; no
# controllers unless asked for, no kubelet) on free loopback ports, in the
# background.
#
# Usage: scripts/cluster-up.sh [--controller-manager] [DIR]
#                                        (DIR defaults to .work/cluster)
#
# - TLS with a throw-away CA, client-certificate authentication, RBAC.
# - DIR/admin.kubeconfig: user test-admin in system:masters.
# - DIR/attacher.kubeconfig: user system:serviceaccount:default:csi-attacher,
#   bound to scripts/attacher-rbac.yaml (least privilege, spec section 9).
# - DIR/env: `export` lines for ATTACHER_TEST_KUBECONFIG,
#   ATTACHER_TEST_ATTACHER_KUBECONFIG, ATTACHER_TESTBINS, ATTACHER_TEST_APISERVER.
# - DIR/*.pid, DIR/*.log: the two processes; scripts/cluster-down.sh stops them.
# - DIR/startup.txt: start-up time and resident memory of this start.
# - DIR/audit.log: the API server's audit log (JSON lines, metadata only) of
#   every request made by a ServiceAccount (group system:serviceaccounts);
#   tests/api/rbac_behaviour.rs derives the RBAC a mode needs from it. Other
#   users' requests are not logged, so the tests' own traffic costs nothing.
# - --controller-manager also starts kube-controller-manager (if it does not
#   run yet) with the attach-detach controller, which creates and deletes the
#   VolumeAttachments of scheduled Pods, the PV binder, which binds claims
#   (and asks external provisioners for volumes), and the Deployment,
#   ReplicaSet and DaemonSet controllers, which make the Pods of the shipped
#   workloads that tests/pods runs (rolling updates included); as user
#   kube-controller-manager in system:masters (DIR/controller-manager.kubeconfig),
#   no leader election, no serving port; log in DIR/controller-manager.log.
#   Tests that need it ask for it; it then runs until scripts/cluster-down.sh.
#
# Idempotent: when a healthy control plane already runs from DIR it is reused.
# Concurrent callers are serialised by a lock on DIR/lock.
# The last line printed on stdout is the admin kubeconfig path.
set -euo pipefail
. "$(dirname "$0")/cluster-lib.sh"
with_cm=0
if [ "${1:-}" = --controller-manager ]; then with_cm=1; shift; fi
dir=$(cluster_dir "${1:-}")

exec 9>"$dir/lock"
flock 9

if cluster_healthy "$dir"; then
  # The Go tools may have changed since it started (a new pin, a new tool): point the env
  # at the current build, which build.sh reuses or makes.
  bins=$("$repo_root/tools/testbins/build.sh" | tail -n 1)
  sed -i "s|^export ATTACHER_TESTBINS=.*|export ATTACHER_TESTBINS=$bins|" "$dir/env"
  echo "cluster: reusing the control plane running from $dir" >&2
  if [ "$with_cm" = 1 ]; then start_controller_manager "$dir" "$bins" || exit 1; fi
  echo "$dir/admin.kubeconfig"
  exit 0
fi

# Leftovers of a crashed or half-started control plane.
stop_pid "$dir" controller-manager
stop_pid "$dir" apiserver
stop_pid "$dir" etcd
rm -rf "$dir/pki" "$dir/etcd" "$dir/certs" "$dir/env" "$dir"/*.kubeconfig "$dir"/*.log

bins=$("$repo_root/tools/testbins/build.sh" | tail -n 1)
for b in etcd kube-apiserver kubectl; do
  [ -x "$bins/$b" ] || { echo "cluster: $bins/$b is missing" >&2; exit 1; }
done

t0=$(date +%s.%N)

# --- PKI (EC P-256; IP SAN 127.0.0.1 for rustls) ---------------------------
pki=$dir/pki
mkdir -p "$pki"
(
  cd "$pki"
  q() { "$@" >/dev/null 2>&1 || { echo "cluster: failed: $*" >&2; exit 1; }; }
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  q openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 3650 -subj "/CN=attacher-hub-test-ca"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=critical,CA:FALSE\n' > server.ext
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE\n' > client.ext
  sign() { # name subject extfile
    q openssl req "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "$2"
    q openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 -extfile "$3"
  }
  sign apiserver "/CN=kube-apiserver" server.ext
  sign admin "/O=system:masters/CN=test-admin" client.ext
  sign attacher "/O=system:serviceaccounts/O=system:serviceaccounts:default/CN=system:serviceaccount:default:csi-attacher" client.ext
  # One private key serves both --service-account-signing-key-file and
  # --service-account-key-file.
  q openssl ecparam -name prime256v1 -genkey -noout -out sa.key
  rm -f ./*.csr
)

# --- ports ----------------------------------------------------------------
# Bind three sockets to port 0 at once so the kernel hands out distinct free
# ports, then release them for etcd and the API server.
read -r etcd_port peer_port api_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
api_url=https://127.0.0.1:$api_port

# --- etcd -----------------------------------------------------------------
# Both servers run in their own session (setsid) so that they outlive the
# caller, and without fd 9 (9>&-) so that they do not hold DIR/lock.
setsid "$bins/etcd" --name=default --data-dir="$dir/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="default=http://127.0.0.1:$peer_port" \
  --unsafe-no-fsync --log-level=warn </dev/null >"$dir/etcd.log" 2>&1 9>&- &
echo $! > "$dir/etcd.pid"

fail() { # message log
  echo "cluster: $1; last lines of $2:" >&2
  tail -n 40 "$2" >&2 || true
  stop_pid "$dir" apiserver
  stop_pid "$dir" etcd
  exit 1
}
wait_until() { # seconds name log probe...
  local secs=$1 name=$2 log=$3 end
  shift 3
  end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    alive "$dir" "$name" || fail "$name exited during start-up" "$log"
    [ "$(date +%s)" -lt "$end" ] || fail "$name not ready after ${secs}s" "$log"
    sleep 0.1
  done
}
wait_until 30 etcd "$dir/etcd.log" curl -fsS --max-time 2 "http://127.0.0.1:$etcd_port/health"

# --- kube-apiserver --------------------------------------------------------
# Audit: metadata (who, verb, resource, namespace, response code) of the
# requests of ServiceAccounts only; nothing for anyone else.
cat > "$dir/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
POLICY
# ServiceAccount and StorageObjectInUseProtection admission need controllers
# that do not run here (default service accounts; removal of the pv-protection
# finalizer), so they are off. The `none` endpoint reconciler allows the
# loopback advertise address.
setsid "$bins/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$etcd_port" \
  --bind-address=127.0.0.1 --secure-port="$api_port" \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --cert-dir="$dir/certs" \
  --client-ca-file="$pki/ca.crt" \
  --authorization-mode=RBAC \
  --service-account-issuer="$api_url" \
  --service-account-key-file="$pki/sa.key" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 \
  --disable-admission-plugins=ServiceAccount,StorageObjectInUseProtection \
  --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/audit.log" \
  --audit-log-format=json --audit-log-maxsize=0 --audit-log-mode=blocking \
  --v=1 </dev/null >"$dir/apiserver.log" 2>&1 9>&- &
echo $! > "$dir/apiserver.pid"

wait_until 120 apiserver "$dir/apiserver.log" \
  sh -c "[ \"\$(curl -sS --max-time 2 --cacert '$pki/ca.crt' '$api_url/readyz')\" = ok ]"
wait_until 60 apiserver "$dir/apiserver.log" \
  curl -fsS --max-time 2 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
  "$api_url/api/v1/namespaces/default"

# --- kubeconfigs ------------------------------------------------------------
write_kubeconfig admin "$dir/admin.kubeconfig"
write_kubeconfig attacher "$dir/attacher.kubeconfig"

"$bins/kubectl" --kubeconfig "$dir/admin.kubeconfig" apply -f "$repo_root/scripts/attacher-rbac.yaml" >&2 \
  || fail "applying scripts/attacher-rbac.yaml failed" "$dir/apiserver.log"

t1=$(date +%s.%N)
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
api_rss=$(rss_kb "$(pid_of "$dir" apiserver)")
etcd_rss=$(rss_kb "$(pid_of "$dir" etcd)")
startup=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
cat > "$dir/startup.txt" <<STARTUP
started_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
startup_seconds=$startup
apiserver_rss_kib=$api_rss
etcd_rss_kib=$etcd_rss
api_url=$api_url
STARTUP

cat > "$dir/env" <<ENV
export ATTACHER_TEST_KUBECONFIG=$dir/admin.kubeconfig
export ATTACHER_TEST_ATTACHER_KUBECONFIG=$dir/attacher.kubeconfig
export ATTACHER_TESTBINS=$bins
export ATTACHER_TEST_APISERVER=$api_url
ENV

echo "cluster: up at $api_url in ${startup}s (PKI + etcd + apiserver + RBAC; apiserver RSS $((api_rss / 1024)) MiB, etcd RSS $((etcd_rss / 1024)) MiB); logs in $dir" >&2
if [ "$with_cm" = 1 ]; then start_controller_manager "$dir" "$bins" || exit 1; fi
echo "$dir/admin.kubeconfig"
