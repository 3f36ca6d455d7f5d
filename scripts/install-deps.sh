#!/usr/bin/env bash
# Installs the Debian packages the checks need when they are missing, so
# that `make test` works on a fresh machine: openssl (the control plane's
# PKI), python3 (free ports), curl, util-linux (flock,
# setsid, unshare, prlimit), make, prometheus (Prometheus and promtool for
# tests/api/prometheus.rs and tests/standalone/alerts.rs; left out with --no-prometheus),
# buildah, podman and runc (the image: scripts/build-image.sh and
# tests/deploy/image.rs; left out with --no-image), and for `make faults` iproute2
# and iptables (the black-hole scenarios' network namespaces and packet
# drops), and bubblewrap (the pod runner of tests/pods, which runs the
# shipped manifests' containers; it also uses iproute2's network namespaces
# and util-linux's nsenter and setpriv). The demo needs none of the optional
# ones.
# Go and Rust must already be there.
set -euo pipefail
with_prometheus=1 with_image=1
for arg in "$@"; do
  case $arg in
    --no-prometheus) with_prometheus=0 ;;
    --no-image) with_image=0 ;;
    *) echo "install-deps: unknown argument $arg" >&2; exit 2 ;;
  esac
done

missing=()
need() { # command package
  command -v "$1" >/dev/null 2>&1 || missing+=("$2")
}
need openssl openssl
need python3 python3
need curl curl
need flock util-linux
need setsid util-linux
need unshare util-linux
need make make
need prlimit util-linux
need ip iproute2
need iptables iptables
need bwrap bubblewrap
need nsenter util-linux
need setpriv util-linux
if [ "$with_prometheus" = 1 ]; then
  need prometheus prometheus
  need promtool prometheus
fi
if [ "$with_image" = 1 ]; then
  # runc, not podman's default crun, which fails on hybrid cgroup hierarchies
  # (tests/deploy/image.rs configures podman to use runc).
  need buildah buildah
  need podman podman
  need runc runc
  need tar tar
fi

if [ "${#missing[@]}" -gt 0 ]; then
  # De-duplicate, keep order.
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++')
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "install-deps: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
      exit 1
    }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q >&2
  $sudo apt-get install -y -q --no-install-recommends ca-certificates "${missing[@]}" >&2
fi

for tool in go cargo; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "install-deps: $tool is required but not installed" >&2
    exit 1
  }
done
