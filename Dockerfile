# syntax=docker/dockerfile:1
#
# attacher-hub container image.
#
#   docker build -t attacher-hub:0.1.0 .
#
# Without Docker and without pulling base images, scripts/build-image.sh
# (make image) assembles the same runtime stage with buildah FROM scratch,
# reading USER, EXPOSE, ENTRYPOINT, LABEL and the binary's path from the last
# stage; make release (scripts/release.sh) exports that image with the
# binary, an SBOM and the chart pinned to the image's digest.
#
# Stage 1 builds the release binary with exactly the command CI checks
# (tests/deploy/deploy.rs compares the RUN line below with its RELEASE_BUILD
# constant). The builder is Debian 12 (bookworm), so the glibc the binary links
# against is the one of the runtime stage, distroless cc-debian12.
#
# Stage 2 holds the binary, glibc, libgcc and CA certificates, nothing else:
# no shell, no package manager. It runs as the distroless "nonroot" user
# (65532:65532), which the manifests under deploy/ require through
# runAsNonRoot/runAsUser, and it writes nothing to its root filesystem, so it
# runs with readOnlyRootFilesystem: true. All state is in memory; the only
# files it opens are the CSI sockets, the optional --config file and the
# service-account token/CA that client-go-style in-cluster config reads.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# Only what the build reads: manifest, lock file, build script, protos, sources. The workspace's
# other member, crates/mock-csi-driver, must be present for cargo to load the workspace; the
# binary does not depend on it.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto/ proto/
COPY src/ src/
COPY crates/ crates/
RUN cargo build --release --locked --bin attacher-hub

FROM gcr.io/distroless/cc-debian12:nonroot
# OCI labels. scripts/build-image.sh (make image, make release) sets the same ones from these
# lines, filling in VERSION (what `attacher-hub --version` prints), REVISION (the commit),
# CREATED (the commit's time) and SOURCE (IMAGE_SOURCE, else the git remote `origin`). With
# Docker, pass them: --build-arg VERSION=... --build-arg REVISION=$(git rev-parse HEAD) ...
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
ARG SOURCE=
LABEL org.opencontainers.image.title="attacher-hub"
LABEL org.opencontainers.image.description="CSI external-attacher for one or many drivers"
LABEL org.opencontainers.image.licenses="Apache-2.0"
LABEL org.opencontainers.image.version="${VERSION}"
LABEL org.opencontainers.image.revision="${REVISION}"
LABEL org.opencontainers.image.created="${CREATED}"
LABEL org.opencontainers.image.source="${SOURCE}"
COPY --from=builder /src/target/release/attacher-hub /attacher-hub
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/attacher-hub"]
