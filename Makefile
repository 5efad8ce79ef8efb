.PHONY: test run crds

# Every test tier; installs what the tiers need first.
test:
	scripts/test.sh

# The main job: `kpssh sim` on its embedded default (a virtual day of 260 hosts in three
# classes with faults, about 7 s in a release build; see docs/simulation.md).
run:
	cargo run --release -- sim --report target/sim-report.html

crds:
	cargo run -q -- crds > charts/kpssh/crds/crds.yaml
