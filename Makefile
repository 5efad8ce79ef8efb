.PHONY: test run crds

# Every test tier; installs what the tiers need first.
test:
	scripts/test.sh

# The main job: simulate a fleet under kpssh (a small shipped scenario; `kpssh sim` with no
# arguments runs the built-in day of a few hundred hosts, see docs/simulation.md).
run:
	cargo run -- sim --scenario examples/sim/csv.yaml --report target/sim-report.html

crds:
	cargo run -q -- crds > charts/kpssh/crds/crds.yaml
