.PHONY: test run crds image

# Every test tier; installs what the tiers need first.
test:
	scripts/test.sh

# The main job: `kpssh sim` on its embedded default (a virtual day of 260 hosts in three
# classes with faults, about 7 s in a release build; see docs/simulation.md).
run:
	cargo run --release -- sim --report target/sim-report.html

crds:
	cargo run -q -- crds > charts/kpssh/crds/crds.yaml

# The container image (Containerfile), built offline from scratch around a release build:
# kpssh/kpssh:<version>, the chart's default image. See scripts/image.sh for its options.
image:
	scripts/image.sh
