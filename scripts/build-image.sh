#!/usr/bin/env bash
# `make image`: builds the attacher-hub OCI image with buildah, FROM scratch,
# without pulling anything. It is the Dockerfile's runtime stage assembled by
# hand: the release binary at the same path, the exact shared libraries it
# links (found with ldd, copied from this Debian 12 system, as distroless
# cc-debian12 ships them), CA certificates, passwd/group entries of the
# distroless users (root, nobody, nonroot 65532) and the copyright files of the
# packages those files come from; no shell, no package manager. The image's
# user, entrypoint and exposed port are read from the Dockerfile's last stage,
# so the two cannot drift (tests/deploy/image.rs checks the result).
#
# Users with Docker build the same image from the Dockerfile instead:
#   docker build -t attacher-hub:0.1.0 .
#
# Usage: scripts/build-image.sh [--binary PATH] [--tag NAME[:TAG]]...
#                               [--storage DIR]
#   --binary PATH  use this attacher-hub binary instead of running the release
#                  build (cargo build --release --locked --bin attacher-hub)
#   --tag REF      tag of the image (repeatable; default
#                  localhost/attacher-hub:<version from Cargo.toml>)
#   --storage DIR  a private container store to build into (DIR/root,
#                  DIR/runroot, vfs driver: no mounts to clean up) instead of
#                  the system's (/var/lib/containers for root), so that tests
#                  do not touch the machine's images
# Prints progress on stderr and, as its last line on stdout, the image ID.
set -euo pipefail
repo_root=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo_root"

binary= storage= tags=()
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift ;;
    --tag) tags+=("${2:?--tag needs an image reference}"); shift ;;
    --storage) storage=${2:?--storage needs a directory}; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "build-image: $*" >&2; }
fail() { say "ERROR: $*"; exit 1; }

command -v buildah >/dev/null || fail "buildah is not installed (scripts/install-deps.sh --image installs it)"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || fail "no version in Cargo.toml"
[ "${#tags[@]}" -gt 0 ] || tags=("localhost/attacher-hub:$version")

# --- the binary ----------------------------------------------------------------
if [ -z "$binary" ]; then
  t0=$(date +%s)
  say "cargo build --release --locked --bin attacher-hub ..."
  cargo build --release --locked --bin attacher-hub
  binary=$repo_root/target/release/attacher-hub
  say "release build took $(( $(date +%s) - t0 ))s"
fi
[ -x "$binary" ] || fail "$binary is not an executable"

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
created=$(git -C "$repo_root" log -1 --format=%ct 2>/dev/null || echo 0)
(cd "$rootfs" && tar --create --sort=name --numeric-owner --owner=0 --group=0 \
  --mtime="@$created" --exclude=./layer.tar --exclude=./home/nonroot --file=layer.tar \
  --transform='s,^\./,,' . && tar --append --numeric-owner --owner="$uid" --group="$gid" \
  --mtime="@$created" --no-recursion --file=layer.tar home/nonroot)
"${b[@]}" add --quiet "$ctr" "$rootfs/layer.tar" / >/dev/null
revision=$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)
"${b[@]}" config \
  --entrypoint "$entrypoint" --cmd '' --user "$user" --port "$expose" --workingdir / \
  --env PATH=/usr/local/bin:/usr/bin:/bin --env SSL_CERT_FILE="$certs" \
  --label org.opencontainers.image.title=attacher-hub \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$revision" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label org.opencontainers.image.description="CSI external-attacher for one or many drivers" \
  --created-by "scripts/build-image.sh (FROM scratch: release binary, its shared libraries, CA certificates)" \
  "$ctr"
# The commit time is the commit's, so the same tree and binary give the same image.
id=$("${b[@]}" commit --quiet --format oci --timestamp "$created" --rm "$ctr" "${tags[0]}")
trap 'rm -rf "$rootfs"' EXIT
for tag in "${tags[@]:1}"; do "${b[@]}" tag "$id" "$tag"; done
size=$("${b[@]}" images --format '{{.Size}}' --filter "id=$id" | head -n 1)
say "built ${tags[*]} ($size; libraries and certificates from $(printf '%s\n' "${packages[@]}" | sort -u | xargs)) in $(( $(date +%s) - t0 ))s"
echo "$id"
