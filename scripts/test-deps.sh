#!/usr/bin/env bash
# Installs what the test tiers need on a fresh Debian machine. Idempotent and quiet when all
# is there; fails loudly when something cannot be installed (a tier must never skip).
set -euo pipefail

need=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
command -v sudo >/dev/null 2>&1 || need+=(sudo)
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v pkill >/dev/null 2>&1 || need+=(procps)
command -v ss >/dev/null 2>&1 || need+=(iproute2)
# promtool checks and unit-tests the chart's alert rules (tests/alerts.rs).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The image tier (tests/image.rs): buildah builds it offline, podman runs it with runc (crun
# refuses a hybrid cgroup layout).
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
# E11 (tests/e2e/kubelet.rs): a real kubelet's runtime and pod network on the node host, and
# what the shipped tls-bootstrap profile uses there (curl fetches the kubelet, iptables
# masquerades the bridge).
command -v containerd >/dev/null 2>&1 || need+=(containerd)
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)

if ((${#need[@]})); then
  echo "test-deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# sshd refuses to start without its privilege-separation directory.
mkdir -p /run/sshd
for tool in /usr/sbin/sshd ssh-keygen sudo shellcheck openssl promtool buildah podman runc containerd ctr iptables curl unshare go cargo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "test-deps: $tool is still missing" >&2; exit 1; }
done
