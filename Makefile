.PHONY: test run crds

# Every test tier; installs what the tiers need first.
test:
	scripts/test.sh

# The main job on its embedded default.
run:
	cargo run --release -- crds

crds:
	cargo run -q -- crds > charts/kpssh/crds/crds.yaml
