#!/usr/bin/env bash
# One full round of checks on the GPU host, over a bundle built here with scripts/gpu-bundle:
# the GPU suites, the benchmarks (JSON), the MLP examples and compute-sanitizer runs. Full logs go
# to $OUT/logs.tgz and the benchmark JSON to $OUT (or ./gpu-out); a condensed summary is printed.
#   scripts/gpu-check.sh [suites|bench|sanitize|all]   (default: all)
set -uo pipefail
B=${BUNDLE:-.gpu-bundle}
R=${OUT:-gpu-out}; mkdir -p "$R"
O=$(mktemp -d)
trap 'tar -czf "$R/logs.tgz" -C "$O" . ; cp "$O"/*.json "$R"/ 2>/dev/null' EXIT
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
if [[ $what == all || $what == suites ]]; then
  "$B/run-all" >"$O/run-all.log" 2>&1; echo "run-all exit $?"
  grep -E "^=== |^test result|^!!!|bundle summary" "$O/run-all.log" | grep -vE "0 passed; 0 failed; 0 ignored"
  grep -A25 "^failures:" "$O/run-all.log" | head -80
fi
if [[ $what == all || $what == bench ]]; then
  for b in bench-core bench-async bench-graph bench-graph-build mlp; do
    "$B/bin/$b" --json "$O/$b.json" >"$O/$b.log" 2>&1; echo "$b exit $?"
    grep -E "^measurement|^---|  (yes|NO)$|goals met|correctness|error" "$O/$b.log" | head -30
  done
  "$B/bin/mlp-tokio" >"$O/mlp-tokio.log" 2>&1; echo "mlp-tokio exit $?"; tail -4 "$O/mlp-tokio.log"
fi
if [[ $what == all || $what == sanitize ]]; then
  # Every GPU suite under memcheck and racecheck, no test skipped, API errors reported (by-design
  # ones filtered by name in scripts/sanitize-allowed-api-errors.txt); non-zero on any finding.
  OUT="$O" BUNDLE="$B" "$(dirname "$0")/sanitize.sh" $(cd "$B/tests" && ls | grep -- '--test--gpu_'); echo "sanitize exit $?"
fi
