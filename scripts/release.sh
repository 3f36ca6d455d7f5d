#!/usr/bin/env bash
# `make release`: everything a release publishes, built here and checked, up to
# the push (nothing leaves this machine). Into DIR (default
# ${CARGO_TARGET_DIR:-target}/release-artifacts):
#
#   attacher-hub-<version>-linux-<arch>  the release binary (cargo build --release
#                                        --locked; --version prints <version>)
#   attacher-hub-<version>.oci.tar       the image, an OCI archive of what
#                                        scripts/build-image.sh builds from the
#                                        Dockerfile's last stage, with its OCI labels
#   attacher-hub-<version>.cdx.json      the SBOM (CycloneDX 1.5): the crates of the
#                                        binary (cargo-cyclonedx) and the Debian
#                                        packages whose files the image holds
#   attacher-hub-<version>.tgz           the Helm chart, appVersion <version>, its
#                                        image pinned to the image's digest
#   LICENSE, CHANGELOG.md
#   release.json                         version, revision, image tag, ID and digest,
#                                        the file names above
#   SHA256SUMS                           of every file above
#
# <version> is the binary's own (build.rs: Cargo.toml's version plus what git
# describe adds, e.g. 0.1.0+3.g1a2b3c4); the image tag is the same with `+` as `_`.
# To publish: `skopeo copy oci-archive:<archive> docker://<registry>/attacher-hub:<tag>`
# keeps the digest the chart names; then `helm install ... --set image.repository=...`.
#
# Cached: when the binary (rebuilt by cargo if the sources changed) and every
# other input are those of the last run, nothing is redone. Runs one at a time
# (a lock beside DIR), so concurrent tests share one build.
#
# Usage: scripts/release.sh [--out DIR]
# Tools: buildah (scripts/install-deps.sh --image), helm ($HELM, else the one of
# tools/testbins/build.sh), cargo-cyclonedx (installed by this script at a pinned
# version into $HOME/.cargo/bin). Prints progress on stderr and, as its last
# line on stdout, DIR.
set -euo pipefail
repo_root=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo_root"

# cargo-cyclonedx: the CycloneDX project's own generator for Cargo projects.
CYCLONEDX_VERSION=0.5.9

target=${CARGO_TARGET_DIR:-$repo_root/target}
out=$target/release-artifacts
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "release: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "release: $*" >&2; }
fail() { say "ERROR: $*"; exit 1; }

mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9

# --- the binary --------------------------------------------------------------------
say "cargo build --release --locked --bin attacher-hub ..."
"${CARGO:-cargo}" build --release --locked --bin attacher-hub --quiet
binary=$target/release/attacher-hub
version=$("$binary" --version | awk 'NR == 1 {print $NF}')
version=${version#v}
tag=${version//+/_}
case $(uname -m) in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch=$(uname -m) ;;
esac

# --- cached? ----------------------------------------------------------------------------
inputs() {
  sha256sum "$binary" Dockerfile scripts/build-image.sh scripts/release.sh LICENSE \
    CHANGELOG.md Cargo.lock Cargo.toml
  find deploy/helm/attacher-hub -type f -print0 | sort -z | xargs -0 sha256sum
  echo "cargo-cyclonedx $CYCLONEDX_VERSION"
}
stamp=$(inputs | sha256sum | cut -d' ' -f1)
if [ -f "$out/release.json" ] && [ "$(cat "$out/.inputs" 2>/dev/null)" = "$stamp" ] \
  && (cd "$out" && sha256sum --quiet --check SHA256SUMS) >/dev/null 2>&1; then
  say "up to date: $out (version $version)"
  echo "$out"
  exit 0
fi
rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/attacher-hub-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
install -m 0755 "$binary" "$out/attacher-hub-$version-linux-$arch"
cp LICENSE CHANGELOG.md "$out/"

# --- the image ------------------------------------------------------------------------
storage=$target/release-storage
b=(buildah --root "$storage/root" --runroot "$storage/runroot" --storage-driver vfs)
image_ref=localhost/attacher-hub:$tag
image_id=$(scripts/build-image.sh --binary "$binary" --tag "$image_ref" --storage "$storage" \
  --packages "$work/packages.txt" | tail -n 1)
archive=attacher-hub-$version.oci.tar
"${b[@]}" push --quiet --format oci --compression-format gzip --digestfile "$work/digest" "$image_id" \
  "oci-archive:$out/$archive:$image_ref" >/dev/null
digest=$(cat "$work/digest")
[[ $digest == sha256:* ]] || fail "buildah push wrote no digest"
"${b[@]}" inspect --type image "$image_id" >"$work/inspect.json"
"${b[@]}" rmi --force "$image_id" >/dev/null
say "image $image_ref: $digest"

# --- the SBOM ---------------------------------------------------------------------------
cyclonedx=$HOME/.cargo/bin/cargo-cyclonedx
if ! "$cyclonedx" cyclonedx --version 2>/dev/null | grep -q " $CYCLONEDX_VERSION\$"; then
  say "installing cargo-cyclonedx $CYCLONEDX_VERSION into $HOME/.cargo/bin ..."
  "${CARGO:-cargo}" install --quiet --locked --root "$HOME/.cargo" cargo-cyclonedx --version "$CYCLONEDX_VERSION"
fi
sbom_name=attacher-hub-$version
# The crates built for this machine's target (the binary's), build scripts' included. It writes
# next to each package's Cargo.toml: a name of our own, moved away at once. Its timestamp is
# the commit's (SOURCE_DATE_EPOCH).
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0) \
  "$cyclonedx" cyclonedx --manifest-path Cargo.toml --format json --spec-version 1.5 \
  --override-filename "$sbom_name" --quiet >&2
mv "$repo_root/$sbom_name.json" "$work/crates.cdx.json"
find "$repo_root/crates" -name "$sbom_name.json" -delete
python3 - "$work/crates.cdx.json" "$work/packages.txt" "$out/$sbom_name.cdx.json" \
  "$version" "$digest" <<'PY'
import json, sys
crates, packages, target, version, digest = sys.argv[1:]
bom = json.load(open(crates))
# The image: the binary's crates, and the Debian packages whose files are in it.
for line in open(packages):
    name, pkg_version, arch = line.split()
    bom.setdefault("components", []).append({
        "type": "library",
        "bom-ref": f"pkg:deb/debian/{name}@{pkg_version}?arch={arch}",
        "name": name,
        "version": pkg_version,
        "purl": f"pkg:deb/debian/{name}@{pkg_version}?arch={arch}",
        "description": "Debian package whose files the image holds",
    })
component = bom["metadata"]["component"]
component["version"] = version
component.setdefault("properties", []).append(
    {"name": "attacher-hub:image-digest", "value": digest})
json.dump(bom, open(target, "w"), indent=2)
PY

# --- the chart --------------------------------------------------------------------------
if [ -z "${HELM:-}" ]; then
  HELM=$(nice -n 19 tools/testbins/build.sh | tail -n 1)/helm
fi
[ -x "$HELM" ] || fail "no helm at $HELM"
mkdir -p "$work/chart"
# -L: the chart links files it shares with deploy/ (dashboards, alerts); copy what they name.
cp -RL deploy/helm/attacher-hub "$work/chart/"
values=$work/chart/attacher-hub/values.yaml
# The packaged copy names the image by digest (the tag is then unused).
sed -i 's|^  digest: ""$|  digest: "'"$digest"'"|' "$values"
grep -qx "  digest: \"$digest\"" "$values" || fail "values.yaml has no '  digest: \"\"' line under image"
"$HELM" package "$work/chart/attacher-hub" --version "$version" --app-version "$version" \
  --destination "$work" >&2
mv "$work/attacher-hub-$version.tgz" "$out/"

# --- the record and the sums ----------------------------------------------------------------
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
python3 - "$out/release.json" "$version" "$revision" "$arch" "$image_ref" "$image_id" \
  "$digest" "$archive" "$work/inspect.json" <<'PY'
import json, sys
out, version, revision, arch, ref, image_id, digest, archive, inspect = sys.argv[1:]
labels = json.load(open(inspect))["OCIv1"]["config"].get("Labels", {})
json.dump({
    "version": version,
    "revision": revision,
    "binary": f"attacher-hub-{version}-linux-{arch}",
    "image": {"reference": ref, "id": image_id, "digest": digest, "archive": archive,
              "labels": labels},
    "sbom": f"attacher-hub-{version}.cdx.json",
    "chart": f"attacher-hub-{version}.tgz",
}, open(out, "w"), indent=2)
PY
(cd "$out" && find . -maxdepth 1 -type f ! -name SHA256SUMS ! -name .inputs -printf '%P\n' \
  | sort | xargs sha256sum >SHA256SUMS)
echo "$stamp" >"$out/.inputs"
say "$(cd "$out" && ls | xargs) in $out"
echo "$out"
