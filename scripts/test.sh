#!/usr/bin/env bash
# The one command that runs every test tier on a fresh machine (README "Test").
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }

step "dependencies"
scripts/test-deps.sh

step "control plane binaries (built once, cached under ~/.cache/kpssh)"
KPSSH_CONTROLPLANE_DIR=$(scripts/controlplane.sh | tail -n 1)
export KPSSH_CONTROLPLANE_DIR
echo "control plane: $KPSSH_CONTROLPLANE_DIR" >&2

step "helm (built once from its Go module, cached under ~/.cache/kpssh)"
KPSSH_HELM=$(scripts/helm.sh | tail -n 1)
export KPSSH_HELM
echo "helm: $KPSSH_HELM" >&2

step "reference oracles (built once from tests/oracle, cached under ~/.cache/kpssh)"
# Go programs computing the reference answers of tests/oracles/ (S60, S61); run-tests.sh runs
# that test binary with the others.
KPSSH_ORACLE=$(scripts/oracle.sh | tail -n 1)
export KPSSH_ORACLE
echo "oracle: $KPSSH_ORACLE" >&2

step "E11 node: kubelet and pod images (built once, cached under ~/.cache/kpssh)"
# The kubelet from the control plane's own k8s.io/kubernetes module, and the pause and workload
# images as OCI archives of tests/node's static binary (tests/e2e/kubelet.rs).
node_out=$(scripts/node.sh)
KPSSH_NODE_KUBELET=$(printf '%s\n' "$node_out" | sed -n 's/^kubelet=//p')
KPSSH_NODE_IMAGES=$(printf '%s\n' "$node_out" | sed -n 's/^images=//p')
export KPSSH_NODE_KUBELET KPSSH_NODE_IMAGES
echo "node: kubelet $KPSSH_NODE_KUBELET, images $KPSSH_NODE_IMAGES" >&2

step "lint: rustfmt, clippy, shellcheck"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
if [ -d shim ]; then shellcheck -s sh shim/*; fi
shellcheck scripts/*.sh

step "tests: unit, simulation, real sshd, real control plane"
# Each test binary runs under a time limit, so a hang fails that binary with a message instead
# of stalling the whole run; a summary of every binary's time and outcome closes the run.
scripts/run-tests.sh
