#!/usr/bin/env bash
# Builds (or finds) the control-plane binaries for kpssh's tier-4 tests:
# etcd, kube-apiserver, kube-scheduler and kube-controller-manager.
#
# Versions are pinned by tests/controlplane/go.mod (Kubernetes) and
# tests/controlplane/etcd/go.mod (etcd). Binaries are cached outside the work
# tree in ${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}/controlplane/k8s-<ver>-etcd-<ver>/
# and only built when one of the four is missing there.
# If KUBEBUILDER_ASSETS names a directory holding all four, it is used as is.
#
# Progress goes to stderr; the last line of stdout is the directory.
set -euo pipefail

readonly BINARIES=(etcd kube-apiserver kube-scheduler kube-controller-manager)

log() { printf 'controlplane.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

has_all() {
  local dir=$1 b
  for b in "${BINARIES[@]}"; do
    [[ -x "$dir/$b" ]] || return 1
  done
}

# Prints the version the given go.mod requires for a module (require line
# inside or outside a require block).
required_version() {
  local gomod=$1 module=$2 v
  v=$(sed -nE "s#^[[:space:]]*(require[[:space:]]+)?${module//./\\.}[[:space:]]+(v[^[:space:]]+).*#\\2#p" "$gomod" | head -n1)
  [[ -n "$v" ]] || die "$gomod does not require $module"
  printf '%s\n' "$v"
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
k8s_mod="$root/tests/controlplane"
etcd_mod="$root/tests/controlplane/etcd"

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if has_all "$KUBEBUILDER_ASSETS"; then
    log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    printf '%s\n' "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks one of ${BINARIES[*]}; building instead"
fi

k8s_ver=$(required_version "$k8s_mod/go.mod" k8s.io/kubernetes)
etcd_ver=$(required_version "$etcd_mod/go.mod" go.etcd.io/etcd/server/v3)
cache="${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}/controlplane"
out="$cache/k8s-$k8s_ver-etcd-$etcd_ver"

if has_all "$out"; then
  log "cached: $out"
  printf '%s\n' "$out"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "go not found in PATH; install Go >= 1.26 (see docs/development.md)"

mkdir -p "$cache"
# Several test binaries may ask at once: one builds, the others wait.
exec 9>"$cache/.lock"
if command -v flock >/dev/null 2>&1; then
  log "taking the build lock $cache/.lock"
  flock 9
fi
if has_all "$out"; then
  log "cached (built by a concurrent run): $out"
  printf '%s\n' "$out"
  exit 0
fi

staging=$(mktemp -d "$cache/.build.XXXXXX")
chmod 755 "$staging"
trap 'rm -rf "$staging"' EXIT

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
minor=${k8s_ver#v1.}
minor=${minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_ver -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean"
done

start=$SECONDS
log "building etcd $etcd_ver (go $(go env GOVERSION))"
(cd "$etcd_mod" && go build -trimpath -ldflags='-s -w' -o "$staging/etcd" .) >&2
log "building kube-apiserver, kube-scheduler, kube-controller-manager $k8s_ver"
(cd "$k8s_mod" && go build -trimpath -ldflags="$k8s_ldflags" -o "$staging/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager) >&2
has_all "$staging" || die "build finished but binaries are missing in $staging"

rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
log "built in $((SECONDS - start))s: $out"
printf '%s\n' "$out"
