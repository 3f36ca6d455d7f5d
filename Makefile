# Entry points for humans and CI. Recipes stay thin: the logic lives in
# scripts/ and tools/testbins/build.sh.
#
#   make demo          local demo: control plane, three CSI drivers, attacher-hub attaching their volumes
#   make test          fmt check, clippy -D warnings, unit + integration tests, csi-sanity
#   make testbins      build or reuse the Go test tools (last line: their directory)
#   make cluster-up    start etcd + kube-apiserver (last line: admin kubeconfig path)
#   make cluster-down  stop them
#   make bench         one attacher-hub against a fleet of Go external-attachers (report in target/bench-report.md)
#   make compat        the API-server integration tests against Kubernetes 1.36 and 1.38's beta
#                      (their tools built and cached like testbins; results in docs/compat.md)
#   make faults        the fault matrix and regression tests on a control plane of their own
#                      (root for the black-hole scenarios; results in target/faults/; docs/reliability.md)
#   make image         build the container image with buildah (FROM scratch, nothing pulled)
#   make release       binary, image (OCI archive), SBOM, chart pinned to the image's digest,
#                      LICENSE, CHANGELOG and checksums in target/release-artifacts/

# Where the local control plane keeps its state, logs and kubeconfigs.
CLUSTER_DIR ?= .work/cluster
# The fault suite's own control plane (its scenarios kill etcd and the API server).
FAULTS_CLUSTER_DIR ?= .work/faults-cluster

.PHONY: demo test testbins cluster-up cluster-down sanity fmt clippy bench faults image compat release

demo:
	@scripts/demo.sh --cluster-dir $(CLUSTER_DIR) $(DEMO_ARGS)

test:
	@MAKE="$(MAKE)" scripts/test.sh $(CLUSTER_DIR)

testbins:
	@tools/testbins/build.sh

cluster-up:
	@scripts/cluster-up.sh $(CLUSTER_DIR)

cluster-down:
	@scripts/cluster-down.sh $(CLUSTER_DIR)

sanity:
	@scripts/sanity.sh

fmt:
	cargo fmt --all

clippy:
	cargo clippy --all-targets -- -D warnings

# Sizes and repeats: BENCH_* variables (tests/bench.rs); runs on a fresh control plane of its own.
# Then the end-to-end configuration (Pods through kube-controller-manager): BENCH_E2E=0 skips it,
# BENCH_E2E_ONLY=1 runs only it (tests/bench/e2e.rs, docs/benchmarks.md).
bench:
	@tests/bench/run.sh

faults:
	@scripts/faults.sh $(FAULTS_CLUSTER_DIR)

# COMPAT_PROFILES: tools/testbins/compat/<name> (and `current`); COMPAT_TESTS: test modules
# (tests/<binary>/<module>.rs, e.g. leader_election).
COMPAT_PROFILES ?= v1.36 v1.38
compat:
	@scripts/compat.sh $(COMPAT_PROFILES)

image:
	@scripts/build-image.sh $(IMAGE_ARGS)

release:
	@scripts/release.sh $(RELEASE_ARGS)
