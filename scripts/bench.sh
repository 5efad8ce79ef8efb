#!/usr/bin/env bash
# Runs the benchmarks of docs/performance.md (issue #10): installs what they need (the test
# dependencies, Debian's pssh and ansible-core, the cached control plane), then
# `cargo bench --bench NAME` for each NAME given (default: all). Each prints its table and
# writes target/bench/NAME.json. Sizes can be changed with the KPSSH_BENCH_* variables that
# docs/performance.md lists.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
need=()
command -v parallel-ssh >/dev/null 2>&1 || need+=(pssh)
command -v ansible >/dev/null 2>&1 || need+=(ansible-core)
if ((${#need[@]})); then
  echo "bench: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
for tool in parallel-ssh ansible; do
  command -v "$tool" >/dev/null 2>&1 || { echo "bench: $tool is still missing" >&2; exit 1; }
done
KPSSH_CONTROLPLANE_DIR=${KPSSH_CONTROLPLANE_DIR:-$(scripts/controlplane.sh | tail -n 1)}
export KPSSH_CONTROLPLANE_DIR

benches=("$@")
((${#benches[@]})) || benches=(fanout burst provisioning)
for b in "${benches[@]}"; do
  echo "== cargo bench --bench $b" >&2
  cargo bench --locked --bench "$b"
done
