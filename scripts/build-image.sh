#!/usr/bin/env bash
# `make image`: builds the attacher-hub OCI image with buildah, FROM scratch,
# without pulling anything. It is the Dockerfile's runtime stage assembled by
# hand: the release binary at the same path, the exact shared libraries it
# links (found with ldd, copied from this Debian 12 system, as distroless
# cc-debian12 ships them), CA certificates, passwd/group entries of the
# distroless users (root, nobody, nonroot 65532) and the copyright files of the
# packages those files come from; no shell, no package manager. The image's
# user, entrypoint, exposed port and labels are read from the Dockerfile's last
# stage, so the two cannot drift (tests/deploy/image.rs checks the result).
# The labels' VERSION is what the binary's --version prints (build.rs stamps
# it), REVISION the commit, CREATED the commit's time (so the same tree and
# binary give the same image), SOURCE $IMAGE_SOURCE or the git remote origin
# (the label is left out when neither is set).
# make release (scripts/release.sh) runs this and exports the image.
#
# Users with Docker build the same image from the Dockerfile instead:
#   docker build -t attacher-hub:0.1.0 .
#
# Usage: scripts/build-image.sh [--binary PATH] [--tag NAME[:TAG]]...
#                               [--storage DIR]
#   --binary PATH  use this attacher-hub binary instead of running the release
#                  build (cargo build --release --locked --bin attacher-hub)
#   --tag REF      tag of the image (repeatable; default
#                  localhost/attacher-hub:<the binary's version, + as _>)
#   --storage DIR  a private container store to build into (DIR/root,
#                  DIR/runroot, vfs driver: no mounts to clean up) instead of
#                  the system's (/var/lib/containers for root), so that tests
#                  do not touch the machine's images
#   --packages F   write the Debian packages whose files the image holds to F,
#                  one "name version architecture" line each (for the SBOM)
# Prints progress on stderr and, as its last line on stdout, the image ID.
set -euo pipefail
repo_root=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo_root"

binary= storage= packages_file= tags=()
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift ;;
    --tag) tags+=("${2:?--tag needs an image reference}"); shift ;;
    --storage) storage=${2:?--storage needs a directory}; shift ;;
    --packages) packages_file=${2:?--packages needs a file}; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "build-image: $*" >&2; }
fail() { say "ERROR: $*"; exit 1; }

command -v buildah >/dev/null || fail "buildah is not installed (scripts/install-deps.sh --image installs it)"

# --- the binary ----------------------------------------------------------------
if [ -z "$binary" ]; then
  t0=$(date +%s)
  say "cargo build --release --locked --bin attacher-hub ..."
  cargo build --release --locked --bin attacher-hub
  binary=${CARGO_TARGET_DIR:-$repo_root/target}/release/attacher-hub
  say "release build took $(( $(date +%s) - t0 ))s"
fi
[ -x "$binary" ] || fail "$binary is not an executable"

# --- what the image says about itself --------------------------------------------
# `attacher-hub v0.1.0+3.g1a2b3c4`: the version build.rs stamped into the binary.
version=$("$binary" --version | awk 'NR == 1 {print $NF}')
version=${version#v}
[ -n "$version" ] || fail "$binary --version printed no version"
revision=$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)
# A binary built from another commit would carry another hash in its version.
if [[ $version =~ [+.]g([0-9a-f]+) ]] && [[ $revision != "${BASH_REMATCH[1]}"* ]]; then
  fail "$binary is version $version, not built from the checked-out commit $revision"
fi
created_epoch=$(git -C "$repo_root" log -1 --format=%ct 2>/dev/null || echo 0)
created=$(date -u -d "@$created_epoch" +%Y-%m-%dT%H:%M:%SZ)
source_url=${IMAGE_SOURCE:-$(git -C "$repo_root" remote get-url origin 2>/dev/null || true)}
[ "${#tags[@]}" -gt 0 ] || tags=("localhost/attacher-hub:${version//+/_}")

# --- what the Dockerfile's runtime stage says -------------------------------------
# The lines after the last FROM: COPY --from=<builder> <binary> <destination>,
# USER uid:gid, EXPOSE port, ENTRYPOINT ["..."].
runtime=$(awk '/^FROM /{stage=""} {stage = stage $0 "\n"} END{printf "%s", stage}' Dockerfile)
field() { printf '%s' "$runtime" | sed -n "s/^$1 \(.*\)$/\1/p" | tail -n 1; }
user=$(field USER) expose=$(field EXPOSE) entrypoint=$(field ENTRYPOINT)
destination=$(field COPY | awk '{print $NF}')
[[ $user =~ ^[0-9]+:[0-9]+$ ]] || fail "Dockerfile: USER uid:gid expected in the last stage, got '$user'"
[[ $entrypoint == \[*\] ]] || fail "Dockerfile: ENTRYPOINT in JSON form expected, got '$entrypoint'"
[[ $destination == /* ]] || fail "Dockerfile: COPY of the binary to an absolute path expected, got '$destination'"
uid=${user%%:*} gid=${user##*:}
[[ $expose == */* ]] || expose=$expose/tcp   # what Docker records for EXPOSE 8080
# LABEL key="value" lines, one label each, ${VERSION} and the like filled in.
labels=()
while IFS= read -r label; do
  [ -n "$label" ] || continue
  key=${label%%=*} value=${label#*=}
  value=${value#\"} value=${value%\"}
  value=${value//'${VERSION}'/$version} value=${value//'${REVISION}'/$revision}
  value=${value//'${CREATED}'/$created} value=${value//'${SOURCE}'/$source_url}
  [[ $value == *'${'* ]] && fail "Dockerfile: LABEL $key uses an argument this script does not know: $value"
  # An empty value (no SOURCE known) is left out rather than set empty.
  [ -n "$value" ] && labels+=(--label "$key=$value")
done < <(printf '%s' "$runtime" | sed -n 's/^LABEL \([^ =]*=".*"\)$/\1/p')
[ "${#labels[@]}" -gt 0 ] || fail "Dockerfile: no LABEL key=\"value\" lines in the last stage"

# --- the root filesystem -----------------------------------------------------------
rootfs=$(mktemp -d "${TMPDIR:-/tmp}/attacher-hub-rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
install -D -m 0755 "$binary" "$rootfs$destination"
# The dynamic loader and every library ldd resolves, at the paths the binary
# asks for (the loader's path is the ELF interpreter).
packages=()
libs=$(ldd "$binary" | awk '/=> \// {print $3; next} /^[[:space:]]*\// {print $1}')
[ -n "$libs" ] || fail "ldd found no libraries in $binary (a static binary needs no image of this kind)"
for lib in $libs; do
  install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
  # The package that ships it (dpkg knows the path it installed, before /usr merging).
  pkg=$(dpkg -S "$lib" 2>/dev/null | head -n 1 | cut -d: -f1 || true)
  [ -n "$pkg" ] || pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -n 1 | cut -d: -f1 || true)
  [ -n "$pkg" ] && packages+=("$pkg")
done
certs=/etc/ssl/certs/ca-certificates.crt
[ -f "$certs" ] || fail "$certs is missing (apt-get install ca-certificates)"
install -D -m 0644 "$certs" "$rootfs$certs"
packages+=(ca-certificates)
for pkg in $(printf '%s\n' "${packages[@]}" | sort -u); do
  if [ -f "/usr/share/doc/$pkg/copyright" ]; then
    install -D -m 0644 "/usr/share/doc/$pkg/copyright" "$rootfs/usr/share/doc/$pkg/copyright"
  fi
done
if [ -n "$packages_file" ]; then
  printf '%s\n' "${packages[@]}" | sort -u | xargs dpkg-query -W \
    -f='${Package} ${Version} ${Architecture}\n' >"$packages_file"
fi
# The users and groups of distroless: root, nobody and the image's user.
mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/home/nonroot"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n' \
  "$uid" "$gid" >"$rootfs/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:%s:\n' "$gid" >"$rootfs/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
chmod 1777 "$rootfs/tmp"
chmod 0700 "$rootfs/home/nonroot"

# --- the image ----------------------------------------------------------------------
b=(buildah)
[ -n "$storage" ] && b+=(--root "$storage/root" --runroot "$storage/runroot" --storage-driver vfs)
t0=$(date +%s)
ctr=$("${b[@]}" from --quiet scratch)
cleanup_ctr() { "${b[@]}" rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$rootfs"; }
trap cleanup_ctr EXIT
# One layer from a tar archive: owners (root, and the image's user for its
# home directory, as in distroless), modes and times exactly as given.
(cd "$rootfs" && tar --create --sort=name --numeric-owner --owner=0 --group=0 \
  --mtime="@$created_epoch" --exclude=./layer.tar --exclude=./home/nonroot --file=layer.tar \
  --transform='s,^\./,,' . && tar --append --numeric-owner --owner="$uid" --group="$gid" \
  --mtime="@$created_epoch" --no-recursion --file=layer.tar home/nonroot)
"${b[@]}" add --quiet "$ctr" "$rootfs/layer.tar" / >/dev/null
"${b[@]}" config \
  --entrypoint "$entrypoint" --cmd '' --user "$user" --port "$expose" --workingdir / \
  --env PATH=/usr/local/bin:/usr/bin:/bin --env SSL_CERT_FILE="$certs" \
  "${labels[@]}" \
  --created-by "scripts/build-image.sh (FROM scratch: release binary, its shared libraries, CA certificates)" \
  "$ctr"
# The commit time is the commit's, so the same tree and binary give the same image.
id=$("${b[@]}" commit --quiet --format oci --timestamp "$created_epoch" --rm "$ctr" "${tags[0]}")
trap 'rm -rf "$rootfs"' EXIT
for tag in "${tags[@]:1}"; do "${b[@]}" tag "$id" "$tag"; done
size=$("${b[@]}" images --format '{{.Size}}' --filter "id=$id" | head -n 1)
say "built ${tags[*]} ($size; libraries and certificates from $(printf '%s\n' "${packages[@]}" | sort -u | xargs)) in $(( $(date +%s) - t0 ))s"
echo "$id"
