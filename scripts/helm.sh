#!/usr/bin/env bash
# Builds (or finds) the helm binary the chart tests run (tests/chart.rs).
#
# The version is pinned by tests/helm/go.mod (helm.sh/helm/v3). The binary is cached outside
# the work tree in ${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}/helm-<version>/helm and only built
# when it is missing there. If KPSSH_HELM names an executable, it is used as is.
#
# Progress goes to stderr; the last line of stdout is the path of the helm binary.
set -euo pipefail

log() { printf 'helm.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod="$root/tests/helm"

if [[ -n "${KPSSH_HELM:-}" ]]; then
  [[ -x "$KPSSH_HELM" ]] || die "KPSSH_HELM=$KPSSH_HELM is not an executable"
  log "using KPSSH_HELM=$KPSSH_HELM"
  printf '%s\n' "$KPSSH_HELM"
  exit 0
fi

# The require line for helm sits inside the require block (tidy marks it indirect, because
# only the tool directive uses it).
ver=$(sed -nE 's#^[[:space:]]*(require[[:space:]]+)?helm\.sh/helm/v3[[:space:]]+(v[^[:space:]]+).*#\2#p' \
  "$mod/go.mod" | head -n1)
[[ -n "$ver" ]] || die "$mod/go.mod does not require helm.sh/helm/v3"
cache="${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}"
out="$cache/helm-$ver"

if [[ -x "$out/helm" ]]; then
  log "cached: $out/helm"
  printf '%s\n' "$out/helm"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "go not found in PATH; install Go >= 1.26 (see docs/development.md)"

mkdir -p "$cache"
# Several test binaries may ask at once: one builds, the others wait.
exec 9>"$cache/.helm.lock"
if command -v flock >/dev/null 2>&1; then
  log "taking the build lock $cache/.helm.lock"
  flock 9
fi
if [[ -x "$out/helm" ]]; then
  log "cached (built by a concurrent run): $out/helm"
  printf '%s\n' "$out/helm"
  exit 0
fi

staging=$(mktemp -d "$cache/.helm-build.XXXXXX")
chmod 755 "$staging"
trap 'rm -rf "$staging"' EXIT

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# The stamps helm's own release build sets: its version, and the Kubernetes version it assumes
# without a cluster (`helm template`, `helm lint`), derived from client-go v0.<minor> = 1.<minor>.
# Without them helm reports no patch level and assumes Kubernetes 1.20.
client_go=$(sed -nE 's#^[[:space:]]*k8s\.io/client-go[[:space:]]+v0\.([0-9]+)\..*#\1#p' "$mod/go.mod" | head -n1)
[[ -n "$client_go" ]] || die "$mod/go.mod does not pin k8s.io/client-go"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$ver"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_go"
done

start=$SECONDS
log "building helm $ver (go $(go env GOVERSION))"
(cd "$mod" && go build -trimpath -ldflags="$ldflags" -o "$staging/helm" helm.sh/helm/v3/cmd/helm) >&2
[[ -x "$staging/helm" ]] || die "build finished but $staging/helm is missing"
"$staging/helm" version --short >&2 || die "the built helm does not run"

rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
log "built in $((SECONDS - start))s: $out/helm"
printf '%s\n' "$out/helm"
