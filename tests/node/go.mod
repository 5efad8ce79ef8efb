// The one static binary of the E11 tier's container images (tests/e2e/kubelet.rs): the pod
// sandbox ("pause") and the workload ("app"). Built by scripts/node.sh; standard library only.
module github.com/kpssh/kpssh/tests/node

go 1.26.0
