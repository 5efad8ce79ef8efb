#!/usr/bin/env bash
# Build every test target, then run each test binary under a time limit (KPSSH_TEST_LIMIT
# seconds, default 900). Prints one line per binary (seconds, outcome) and fails if any failed
# or hit the limit. Extra arguments are passed to every test binary (e.g. a name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${KPSSH_TEST_LIMIT:-900}

list=$(mktemp)
trap 'rm -f "$list"' EXIT
cargo test --all-targets --locked --no-run --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        name = m["target"]["name"] if kind == "test" else m["target"]["name"] + " (" + kind + ")"
        print(name + "\t" + m["executable"])
' >"$list"
[ -s "$list" ] || { echo "no test binaries were built" >&2; exit 1; }

summary=""
failed=0
while IFS=$'\t' read -r name exe <&3; do
  printf '\n-- %s\n' "$name" >&2
  start=$(date +%s)
  set +e
  timeout -k 15 "$limit" "$exe" "$@" </dev/null
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  case $rc in
    0) outcome=ok ;;
    124|137) outcome="HUNG: killed after the ${limit}s limit"; failed=1 ;;
    *) outcome="FAILED (exit $rc)"; failed=1 ;;
  esac
  summary+=$(printf '%6ss  %-18s %s' "$took" "$name" "$outcome")$'\n'
done 3<"$list"

printf '\n== test binaries\n%s' "$summary" >&2
exit "$failed"
