#!/usr/bin/env bash
# Builds (or finds) what the E11 tier (tests/e2e/kubelet.rs) puts on its node host:
#
#   kubelet          from the k8s.io/kubernetes module version that tests/controlplane/go.mod
#                    pins (the control plane's own version), cached in
#                    ${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}/kubelet/<version>/kubelet
#   images/pause.tar the pod sandbox image and
#   images/app.tar   the workload image: OCI image-layout archives of one layer each, holding
#                    the static binary of tests/node/ as /pause or /app; no registry involved.
#                    Cached in ${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}/node-images-<hash>/, <hash>
#                    covering tests/node/, this script and the Go version.
#
# It also checks the host packages the tier runs (containerd, runc, the CNI plugins) and fails
# naming the missing one: scripts/test-deps.sh installs them.
#
# Progress goes to stderr; stdout's last two lines are `kubelet=<path>` and `images=<dir>`.
set -euo pipefail

log() { printf 'node.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache="${KPSSH_CACHE_DIR:-$HOME/.cache/kpssh}"

for tool in containerd ctr runc; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run scripts/test-deps.sh (Debian package containerd / runc)"
done
[[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]] \
  || die "the CNI bridge plugin is missing: run scripts/test-deps.sh (Debian package containernetworking-plugins)"
command -v go >/dev/null 2>&1 || die "go not found in PATH; install Go >= 1.26 (see docs/development.md)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

mkdir -p "$cache"
exec 9>"$cache/.node.lock"
if command -v flock >/dev/null 2>&1; then
  log "taking the build lock $cache/.node.lock"
  flock 9
fi

# --- kubelet, keyed by the Kubernetes version ------------------------------------------------
gomod="$root/tests/controlplane/go.mod"
k8s_ver=$(sed -nE 's#^[[:space:]]*(require[[:space:]]+)?k8s\.io/kubernetes[[:space:]]+(v[^[:space:]]+).*#\2#p' "$gomod" | head -n1)
[[ -n "$k8s_ver" ]] || die "$gomod does not require k8s.io/kubernetes"
kdir="$cache/kubelet/$k8s_ver"
if [[ -x "$kdir/kubelet" ]]; then
  log "cached: $kdir/kubelet"
else
  mkdir -p "$cache/kubelet"
  staging=$(mktemp -d "$cache/kubelet/.build.XXXXXX")
  trap 'rm -rf "$staging"' EXIT
  minor=${k8s_ver#v1.}
  minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_ver -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
  done
  start=$SECONDS
  log "building kubelet $k8s_ver (go $(go env GOVERSION))"
  (cd "$root/tests/controlplane" && go build -trimpath -ldflags="$ldflags" -o "$staging/kubelet" \
    k8s.io/kubernetes/cmd/kubelet) >&2
  [[ -x "$staging/kubelet" ]] || die "build finished but $staging/kubelet is missing"
  chmod 755 "$staging"
  rm -rf "$kdir"
  mv "$staging" "$kdir"
  trap - EXIT
  log "built kubelet in $((SECONDS - start))s: $kdir/kubelet"
fi

# --- the two images, keyed by their sources ----------------------------------------------------
hash=$(
  {
    go env GOVERSION GOARCH
    sha256sum "$root/scripts/node.sh"
    cd "$root/tests/node" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)
idir="$cache/node-images-$hash"
if [[ -s "$idir/pause.tar" && -s "$idir/app.tar" ]]; then
  log "cached: $idir"
else
  staging=$(mktemp -d "$cache/.node-images.XXXXXX")
  trap 'rm -rf "$staging"' EXIT
  start=$SECONDS
  (cd "$root/tests/node" && go build -trimpath -ldflags='-s -w' -o "$staging/node" .) >&2
  arch=$(go env GOARCH)

  sha() { sha256sum "$1" | cut -d' ' -f1; }
  size() { stat -c %s "$1"; }
  # blob FILE: moves FILE into the layout's blobs as sha256:<digest>; prints the digest.
  blob() {
    local d
    d=$(sha "$1")
    mv "$1" "$layout/blobs/sha256/$d"
    printf '%s\n' "$d"
  }

  # image NAME REF: an OCI image-layout archive $staging/NAME.tar holding /NAME (the binary),
  # entrypoint /NAME, named REF for `ctr images import`.
  image() {
    local name=$1 ref=$2 rootfs layer_d config_d manifest_d lsize csize msize
    layout="$staging/$name-layout"
    rootfs="$staging/$name-rootfs"
    mkdir -p "$layout/blobs/sha256" "$rootfs"
    cp "$staging/node" "$rootfs/$name"
    chmod 0755 "$rootfs/$name"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$staging/layer.tar" "$name"
    lsize=$(size "$staging/layer.tar")
    layer_d=$(blob "$staging/layer.tar")
    printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/%s"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
      "$arch" "$name" "$layer_d" > "$staging/config.json"
    csize=$(size "$staging/config.json")
    config_d=$(blob "$staging/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
      "$config_d" "$csize" "$layer_d" "$lsize" > "$staging/manifest.json"
    msize=$(size "$staging/manifest.json")
    manifest_d=$(blob "$staging/manifest.json")
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
      "$manifest_d" "$msize" "$arch" "$ref" "${ref##*:}" > "$layout/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$staging/$name.tar" .
    rm -rf "$layout" "$rootfs"
  }
  # The names are the tier's own (tests/e2e/kubelet.rs): nothing is ever pulled.
  image pause kpssh.test/pause:1
  image app kpssh.test/e11-app:1
  rm -f "$staging/node"
  chmod 755 "$staging"
  rm -rf "$idir"
  mv "$staging" "$idir"
  trap - EXIT
  log "built the images in $((SECONDS - start))s: $idir"
fi

printf 'kubelet=%s\n' "$kdir/kubelet"
printf 'images=%s\n' "$idir"
