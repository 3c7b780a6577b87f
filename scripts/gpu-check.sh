#!/usr/bin/env bash
# One full round of checks on the GPU host, over a bundle built here with scripts/gpu-bundle:
# the GPU suites, every benchmark (JSON), the MLP examples and compute-sanitizer runs. Full logs go
# to $OUT/logs.tgz and the benchmark JSON to $OUT (or ./gpu-out); a condensed summary is printed.
#   scripts/gpu-check.sh [suites|bench|sanitize|all]   (default: all)
# Every step runs even when an earlier one fails; the script then lists the failed steps and exits
# 1 (2 for a usage error). A benchmark fails when it exits non-zero (its correctness check failed,
# or it could not run); a missed performance goal is a result, shown as "goals met: NO", not a
# failure.
set -uo pipefail
B=${BUNDLE:-.gpu-bundle}
R=${OUT:-gpu-out}
mkdir -p "$R" || exit 1
O=$(mktemp -d) || exit 1
trap 'tar -czf "$R/logs.tgz" -C "$O" . ; cp "$O"/*.json "$R"/ 2>/dev/null' EXIT
what=${1:-all}
case $what in
  all | suites | bench | sanitize) ;;
  *)
    echo "usage: $0 [suites|bench|sanitize|all]" >&2
    exit 2
    ;;
esac
failed=()
# step NAME LOG COMMAND...: runs COMMAND with its output in $O/LOG, prints its exit status and
# records NAME as failed if it is non-zero.
step() {
  local name=$1 log=$2 rc
  shift 2
  "$@" >"$O/$log" 2>&1
  rc=$?
  echo "$name exit $rc"
  if [[ $rc != 0 ]]; then
    failed+=("$name (exit $rc, log $log)")
  fi
  return 0
}
if ! nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'; then
  failed+=("nvidia-smi")
fi
if [[ $what == all || $what == suites ]]; then
  step run-all run-all.log "$B/run-all"
  grep -E "^=== |^test result|^!!!|bundle summary" "$O/run-all.log" | grep -vE "0 passed; 0 failed; 0 ignored"
  grep -A25 "^failures:" "$O/run-all.log" | head -80
fi
if [[ $what == all || $what == bench ]]; then
  # Every benchmark program of examples/src/bin (bench-plot draws, it does not measure).
  for b in bench-core bench-async bench-completion bench-graph bench-graph-build bench-allreduce \
    bench-decode mlp; do
    step "$b" "$b.log" "$B/bin/$b" --json "$O/$b.json"
    grep -E "^measurement|^---|  (yes|NO)$|goals met|correctness|[Ee]rror" "$O/$b.log" | head -30
  done
  step mlp-tokio mlp-tokio.log "$B/bin/mlp-tokio"
  tail -4 "$O/mlp-tokio.log"
fi
if [[ $what == all || $what == sanitize ]]; then
  # Every GPU suite under memcheck and racecheck, no test skipped, API errors reported (by-design
  # ones filtered by name in scripts/sanitize-allowed-api-errors.txt); non-zero on any finding.
  suites=()
  for t in "$B"/tests/*--test--gpu_*; do
    [[ -e $t ]] && suites+=("${t##*/}")
  done
  if [[ ${#suites[@]} == 0 ]]; then
    echo "sanitize: no GPU suites in $B/tests"
    failed+=("sanitize (no suites found)")
  else
    OUT="$O" BUNDLE="$B" "$(dirname "$0")/sanitize.sh" "${suites[@]}"
    rc=$?
    echo "sanitize exit $rc"
    [[ $rc == 0 ]] || failed+=("sanitize (exit $rc)")
  fi
fi
if [[ ${#failed[@]} != 0 ]]; then
  echo "gpu-check: ${#failed[@]} step(s) FAILED:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "gpu-check: every step passed"
