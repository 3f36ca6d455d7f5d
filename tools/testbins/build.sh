#!/usr/bin/env bash
# Builds (or reuses) the Go test tools: kube-apiserver, kube-controller-manager,
# kubectl, etcd, mockcsi, csi-attacher, csi-provisioner, csi-sanity,
# translation-oracle, pd-controller, helm (v4) and helm3.
#
# Binaries are cached under $HOME/.cache/attacher-hub/testbins/<key>, where the
# key hashes the Go version, every go.mod/go.sum, the sources of our own tools
# (mockcsi, translation-oracle, pd-controller) and this script, so any change to a pin rebuilds
# and an unchanged tree reuses. Module and build caches are Go's own
# ($HOME/go/pkg/mod, $HOME/.cache/go-build).
#
# TESTBINS_PROFILE=NAME builds another Kubernetes release for `make compat`
# (scripts/compat.sh): tools/testbins/compat/NAME/versions overrides the
# versions below (and sets GOTOOLCHAIN when that release needs a newer Go), and
# each module directory there (k8s, csi, etcd) replaces ours: its go.mod/go.sum
# and any cmd/*/main.go it has are laid over a copy of our tree. Binaries of the
# modules a profile does not replace are copied from the default build (built
# first when missing). A profile has a key of its own, which also hashes its files.
#
# The last line printed is the directory holding the binaries.
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
here=$(cd "$(dirname "$0")" && pwd)

KUBE_VERSION=v1.37.2
ATTACHER_VERSION=v4.13.0
SANITY_VERSION=v5.6.0
HELM_VERSION=v4.3.2
HELM3_VERSION=v3.22.0
PROVISIONER_VERSION=v6.4.0
BINARIES="etcd mockcsi csi-attacher kube-apiserver kubectl csi-sanity translation-oracle helm helm3
  kube-controller-manager csi-provisioner pd-controller ebs-controller"

profile=${TESTBINS_PROFILE:-}
pdir=
if [ -n "$profile" ]; then
  pdir=$here/compat/$profile
  if [ ! -f "$pdir/versions" ]; then
    echo "testbins: unknown TESTBINS_PROFILE '$profile': $pdir/versions does not exist (profiles: $(cd "$here/compat" && echo */ | tr -d /))" >&2
    exit 1
  fi
  # shellcheck disable=SC1091
  . "$pdir/versions"
  export GOTOOLCHAIN
fi

key=$( { go version
         cat "$here"/*/go.mod "$here"/*/go.sum "$here"/*/cmd/*/main.go "$here/build.sh"
         if [ -n "$pdir" ]; then echo "profile $profile"; find "$pdir" -type f | sort | xargs cat; fi
       } | sha256sum | cut -c1-16)
out=${ATTACHER_TESTBINS:-${XDG_CACHE_HOME:-$HOME/.cache}/attacher-hub/testbins/$key}
if [ -n "$profile" ]; then out=${XDG_CACHE_HOME:-$HOME/.cache}/attacher-hub/testbins/$profile-$key; fi

# One build per key at a time: `make test` builds in the background while a `make demo`,
# `make testbins` or a second checkout's `make test` may start; without the lock both would
# write the same "$out.partial" (one's mv finds the other's file gone). The second waits, then
# finds the binaries complete. The lock lives beside the cache directory, so any two clones
# of the project (same $HOME) share it; it is released when this script's process ends.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
if ! flock -n 9; then
  echo "testbins: another build of key $key is under way; waiting for it ($out.lock)" >&2
  flock 9
fi

complete=1
for b in $BINARIES; do [ -x "$out/$b" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "testbins: reusing cached binaries (key $key)" >&2
  echo "$out"
  exit 0
fi

echo "testbins: building into $out (a cold build took 53 minutes on 2 shared cores; with Go's build cache warm, minutes)" >&2
tmp="$out.partial"
mkdir -p "$tmp"
started=$(date +%s)
src=$here
if [ -n "$profile" ]; then
  default=$(env -u TESTBINS_PROFILE -u ATTACHER_TESTBINS "$here/build.sh" | tail -n 1)
  src=$out.src
  rm -rf "$src"
  mkdir -p "$src"
  for m in etcd k8s csi helm pd provisioner; do cp -r "$here/$m" "$src/$m"; done
  for m in "$pdir"/*/; do cp -r "$m." "$src/$(basename "$m")/"; done
fi
step() { # name dir ldflags package
  local name=$1 dir=$2 ldflags=$3 pkg=$4 t0
  if [ -x "$tmp/$name" ]; then return; fi
  if [ -n "$profile" ] && [ ! -d "$pdir/$dir" ]; then
    cp "$default/$name" "$tmp/$name"
    echo "testbins: $name from the default build (profile $profile keeps its $dir module)" >&2
    return
  fi
  t0=$(date +%s)
  (cd "$src/$dir" && go build -trimpath -pgo=off -ldflags "-s -w $ldflags" -o "$tmp/$name.new" "$pkg")
  mv "$tmp/$name.new" "$tmp/$name"
  echo "testbins: built $name in $(( $(date +%s) - t0 ))s ($(du -h "$tmp/$name" | cut -f1))" >&2
}

kminor=${KUBE_VERSION#v1.}; kminor=${kminor%%.*}
KLDFLAGS="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kminor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z"

step etcd etcd "" go.etcd.io/etcd/server/v3
step mockcsi k8s "" ./cmd/mockcsi
step csi-attacher csi "-X main.version=$ATTACHER_VERSION" github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher
step kube-apiserver k8s "$KLDFLAGS" k8s.io/kubernetes/cmd/kube-apiserver
step kubectl k8s "$KLDFLAGS" k8s.io/kubernetes/cmd/kubectl
step csi-sanity csi "-X main.VERSION=$SANITY_VERSION" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
step translation-oracle csi "" ./cmd/translation-oracle
step helm helm "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" helm.sh/helm/v4/cmd/helm
# Helm v3 takes the Kubernetes version it assumes without a cluster from ldflags (its Makefile's).
h3=$(cd "$src/helm" && go list -f '{{.Version}}' -m k8s.io/client-go | cut -d. -f2)
h3="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$h3 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$h3"
step helm3 helm "-X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION $h3" helm.sh/helm/v3/cmd/helm
# The peers around the hub (issue 19): the attach-detach controller that creates
# VolumeAttachments from Pods, the provisioner that creates PVs, and the GCE PD
# driver's own controller service on its fake cloud (cmd/pd-controller, ours).
step kube-controller-manager k8s "$KLDFLAGS" k8s.io/kubernetes/cmd/kube-controller-manager
step csi-provisioner provisioner "-X main.version=$PROVISIONER_VERSION" github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
step pd-controller pd "" ./cmd/pd-controller
# The AWS EBS driver's own controller service on an in-memory EC2 (cmd/ebs-controller, ours);
# GetPluginInfo reports the module's version, stamped in as the driver's own release build does.
step ebs-controller ebs "-X github.com/kubernetes-sigs/aws-ebs-csi-driver/pkg/driver.driverVersion=$(cd "$src/ebs" && go list -m -f '{{.Version}}' github.com/kubernetes-sigs/aws-ebs-csi-driver)" ./cmd/ebs-controller

rm -rf "$out"
mv "$tmp" "$out"
if [ -n "$profile" ]; then rm -rf "$src"; fi
echo "testbins: done in $(( $(date +%s) - started ))s" >&2
echo "$out"
