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

step "lint: rustfmt, clippy, shellcheck"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
if [ -d shim ]; then shellcheck -s sh shim/*; fi

step "tests: unit, simulation, real sshd, real control plane"
cargo test --all-targets --locked --no-fail-fast
