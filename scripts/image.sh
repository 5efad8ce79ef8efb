#!/usr/bin/env bash
# Builds kpssh's container image offline (Containerfile; no base image is pulled): `make image`.
#
#   scripts/image.sh [--binary PATH] [--tag NAME:TAG]
#
# --binary  the kpssh executable to package; default target/release/kpssh, built first with
#           `cargo build --release --locked` when missing.
# --tag     default kpssh/kpssh:<version of Cargo.toml>, the chart's default image.
#
# The build context is a root file system assembled here: the binary at /kpssh, every shared
# library it links and the dynamic loader at the paths ldd reports, /etc/passwd and /etc/group
# with the nonroot user 65532 (the image's USER), and the CA bundle of this machine. It is built
# with buildah, else podman (Debian: apt-get install buildah). The last line of stdout is the
# image name.
set -euo pipefail

log() { printf 'image.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[[ -n "$version" ]] || die "no version in Cargo.toml"
binary=""
tag="kpssh/kpssh:$version"
while (($#)); do
  case $1 in
    --binary) [[ $# -ge 2 ]] || die "--binary needs a path"; binary=$2; shift 2 ;;
    --tag) [[ $# -ge 2 ]] || die "--tag needs a name"; tag=$2; shift 2 ;;
    *) die "unknown argument $1 (use --binary PATH, --tag NAME:TAG)" ;;
  esac
done

if [[ -z "$binary" ]]; then
  binary="$root/target/release/kpssh"
  if [[ ! -x "$binary" ]]; then
    log "building $binary"
    (cd "$root" && cargo build --release --locked) >&2
  fi
fi
[[ -x "$binary" ]] || die "$binary is not an executable"

if command -v buildah >/dev/null 2>&1; then
  builder=(buildah build)
elif command -v podman >/dev/null 2>&1; then
  builder=(podman build)
else
  die "neither buildah nor podman is installed (Debian: apt-get install buildah podman)"
fi

ctx=$(mktemp -d "${TMPDIR:-/tmp}/kpssh-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
chmod 755 "$ctx"

install -D -m 0755 "$binary" "$ctx/kpssh"
# The libraries and the loader, at the paths the binary will look for them.
libs=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
for lib in $libs; do
  real=$(readlink -f "$lib")
  install -D -m 0755 "$real" "$ctx$lib"
done
grep -q 'ld-linux' <<<"$libs" || log "warning: no dynamic loader found by ldd (a static binary?)"
mkdir -p "$ctx/etc" "$ctx/tmp"
chmod 1777 "$ctx/tmp"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/etc/group"
mkdir -p "$ctx/home/nonroot"
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$ctx/etc/ssl/certs/ca-certificates.crt"
fi

log "building $tag with ${builder[*]} (context $(du -sh "$ctx" | cut -f1))"
"${builder[@]}" --pull=never --build-arg "VERSION=$version" -f "$root/Containerfile" -t "$tag" "$ctx" >&2
printf '%s\n' "$tag"
