#!/usr/bin/env bash
# Puts the GCE PD CSI driver's own manifests (its deploy/kubernetes directory)
# at the version tools/testbins/pd/go.mod pins into DIR (default
# deploy/examples/gce-pd/vendor), where the examples of
# deploy/examples/gce-pd take them from: they then render with no network.
# The manifests come from the Go module cache (`go mod download`, which
# fetches the module once when the cache does not hold it yet). DIR is
# git-ignored: the project commits no third-party files.
#
# Usage: scripts/vendor-manifests.sh [DIR]
#
# Run it again after changing the pinned version; with DIR already holding
# that version it does nothing.
set -euo pipefail

module=sigs.k8s.io/gcp-compute-persistent-disk-csi-driver
repo=$(cd "$(dirname "$0")/.." && pwd -P)
dest=${1:-$repo/deploy/examples/gce-pd/vendor}

fail() {
  echo "vendor-manifests.sh: $*" >&2
  exit 1
}

command -v go >/dev/null 2>&1 ||
  fail "go is not on PATH (Go takes the manifests from its module cache; scripts/install-deps.sh installs it)"

# The pinned version, in the module cache.
cd "$repo/tools/testbins/pd"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
go mod download "$module" ||
  fail "go mod download $module failed (in tools/testbins/pd): the module cache lacks it and it could not be fetched"
read -r version source < <(go list -m -f '{{.Version}} {{.Dir}}' "$module")
manifests=$source/deploy/kubernetes
[ -f "$manifests/overlays/stable-master/kustomization.yaml" ] ||
  fail "$manifests has no overlays/stable-master; is $module@$version the version the examples expect?"

stamp="$module@$version"
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$stamp" ]; then
  exit 0
fi

# Copied next to DIR and moved into place, so DIR is never half filled. The
# module cache is read-only: the copy is made writable.
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d "$(dirname "$dest")/.vendor-manifests.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -R "$manifests/." "$tmp/"
chmod -R u+w,go+rX "$tmp"
echo "$stamp" >"$tmp/VERSION"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "$dest: $stamp deploy/kubernetes"
