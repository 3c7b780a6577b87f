#!/usr/bin/env bash
# gpu-round.sh: one batched round of GPU work inside one device call (10 minutes at most), over a
# bundle built here with scripts/gpu-bundle and carried packed (tar -cJf .gpu-tar/bundle.tar.xz
# .gpu-bundle). The named jobs run in parallel, each in its own process group, each bounded by
# DEADLINE seconds (default 540); their logs are packed into $OUT/logs.tgz and their JSON reports
# copied to $OUT (at most 8 files come back from a device call, so everything else is in the tar).
#
#   scripts/gpu-round.sh JOB...        jobs:
#     suites            every bundled test executable (run-all), one after the other
#     suite:NAME        one test executable whose name ends in NAME (e.g. suite:gpu_prefill)
#     memcheck:NAME     compute-sanitizer memcheck over one suite (scripts/sanitize.sh)
#     racecheck:NAME    compute-sanitizer racecheck over one suite
#     serve             scripts/serve-check.sh (HEALTH_S 240, LOAD_S 200 unless set)
#     bench:NAME[:ARGS] one benchmark program of the bundle, --json into the logs (ARGS: words
#                       separated by colons, e.g. bench:bench-decode:--ttft:128,512,2048)
#     run:NAME[:ARGS]   one program of the bundle as is (ARGS as for bench:)
#
# Parallel jobs share the GPU: their timings are not reported from such a round; correctness is.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
DEADLINE=${DEADLINE:-540}
R=${OUT:-gpu-out}
mkdir -p "$R"
L=$(mktemp -d)
if [[ ! -d .gpu-bundle && -f .gpu-tar/bundle.tar.xz ]]; then
  tar -xJf .gpu-tar/bundle.tar.xz || exit 2
fi
export CUDA_ASYNC_REQUIRE_GPU=${CUDA_ASYNC_REQUIRE_GPU:-1} RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit: /'
pids=()
names=()
for job in "$@"; do
  name=${job//[:,\/]/_}
  case $job in
    suites) cmd=(.gpu-bundle/run-all) ;;
    suite:*)
      exe=$(ls .gpu-bundle/tests/*"${job#suite:}" 2>/dev/null | head -1)
      cmd=("$exe" --test-threads=1)
      ;;
    memcheck:* | racecheck:*)
      cmd=(env TOOLS="${job%%:*}" OUT="$L/$name" SAN_TIMEOUT="$DEADLINE" scripts/sanitize.sh "${job#*:}")
      ;;
    serve)
      cmd=(env BIN=.gpu-bundle/bin OUT="$L/serve" MODEL_DIR="${MODEL_DIR:-/tmp/model-1b}" HEALTH_S="${HEALTH_S:-240}" LOAD_S="${LOAD_S:-200}" scripts/serve-check.sh)
      ;;
    bench:*)
      spec=${job#bench:}
      IFS=: read -r -a words <<<"$spec"
      cmd=(".gpu-bundle/bin/${words[0]}" "${words[@]:1}" --json "$L/$name.json")
      ;;
    run:*)
      spec=${job#run:}
      IFS=: read -r -a words <<<"$spec"
      cmd=(".gpu-bundle/bin/${words[0]}" "${words[@]:1}")
      ;;
    *)
      echo "unknown job: $job" >&2
      exit 2
      ;;
  esac
  echo "start $name: ${cmd[*]}"
  setsid timeout --kill-after=10 "$DEADLINE" "${cmd[@]}" >"$L/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
done
fails=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  echo "job ${names[$i]}: exit $rc"
  [[ $rc == 0 ]] || fails=$((fails + 1))
done
# Condensed view of every log: suite results, failures, summaries.
for f in "$L"/*.log; do
  echo "=== ${f##*/}"
  grep -E "^=== |^test result|^!!!|bundle summary|panicked|FAILED|FAIL|^failures:|summary|exit [0-9]|goals met|ratio|tokens/s" "$f" |
    grep -vE "0 passed; 0 failed; 0 ignored" | head -60
done
cp "$L"/*.json "$R"/ 2>/dev/null
cp "$L"/serve/*.json "$R"/ 2>/dev/null
tar -czf "$R/logs.tgz" -C "$L" .
echo "gpu-round: $fails of ${#pids[@]} jobs failed"
exit $((fails > 0))
