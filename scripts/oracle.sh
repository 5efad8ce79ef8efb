#!/usr/bin/env bash
# Builds (or finds) the reference-oracle binary of kpssh's oracle tests (tests/oracles/): Go's
# text/template, the Go provider's JoinHash, Karpenter core's NodePool hash and scheduling
# requirements, from the Go module tests/oracle/ (versions pinned by its go.mod / go.sum).
#
# The binary is cached outside the work tree in
# ${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}/oracle-<hash>/oracle, where <hash> covers every file
# of tests/oracle/ and the Go version, and is only built when it is missing there; once the
# Go module cache holds the dependencies a rebuild needs no network. If KPSSH_ORACLE names an
# executable, it is used as is.
#
# Progress goes to stderr; the last line of stdout is the path of the oracle binary.
set -euo pipefail

log() { printf 'oracle.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod="$root/tests/oracle"

if [[ -n "${KPSSH_ORACLE:-}" ]]; then
  [[ -x "$KPSSH_ORACLE" ]] || die "KPSSH_ORACLE=$KPSSH_ORACLE is not an executable"
  log "using KPSSH_ORACLE=$KPSSH_ORACLE"
  printf '%s\n' "$KPSSH_ORACLE"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "go not found in PATH; install Go >= 1.26 (see docs/development.md)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# The sources' hash: file names and contents, plus the toolchain (text/template is the
# toolchain's own package, so another Go version is another oracle).
hash=$(
  cd "$mod"
  {
    go env GOVERSION
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)
cache="${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}"
out="$cache/oracle-$hash"

if [[ -x "$out/oracle" ]]; then
  log "cached: $out/oracle"
  printf '%s\n' "$out/oracle"
  exit 0
fi

mkdir -p "$cache"
# Several test binaries may ask at once: one builds, the others wait.
exec 9>"$cache/.oracle.lock"
if command -v flock >/dev/null 2>&1; then
  log "taking the build lock $cache/.oracle.lock"
  flock 9
fi
if [[ -x "$out/oracle" ]]; then
  log "cached (built by a concurrent run): $out/oracle"
  printf '%s\n' "$out/oracle"
  exit 0
fi

staging=$(mktemp -d "$cache/.oracle-build.XXXXXX")
chmod 755 "$staging"
trap 'rm -rf "$staging"' EXIT

start=$SECONDS
log "building the oracles (go $(go env GOVERSION))"
(cd "$mod" && go build -trimpath -ldflags='-s -w' -o "$staging/oracle" .) >&2
[[ -x "$staging/oracle" ]] || die "build finished but $staging/oracle is missing"

rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
log "built in $((SECONDS - start))s: $out/oracle"
printf '%s\n' "$out/oracle"
