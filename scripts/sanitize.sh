#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over every GPU suite of a bundle (scripts/gpu-bundle),
# with NO test skipped and API-error reporting ON. Exits non-zero on any failed test, memory error,
# race hazard, timeout, or API error that is not one of the by-design errors listed (by error name
# and driver call) in scripts/sanitize-allowed-api-errors.txt.
#   scripts/sanitize.sh [SUITE...]        (default: every test executable in $BUNDLE/tests)
#   env: BUNDLE (default .gpu-bundle), OUT (logs; default gpu-out), TOOLS (default "memcheck racecheck"),
#        SAN_TIMEOUT (seconds per suite and tool; default 900), SAN_ARGS (extra arguments of the suite,
#        e.g. "--skip hf_reference_1b" in one process and "hf_reference_1b --exact" in another, so
#        that a long suite is covered whole by two processes run side by side), SAN_TAG (added to
#        the log names, to tell such processes apart), SAN_TOOL_ARGS (extra arguments of the tool,
#        e.g. "--launch-count 2500": only the first 2,500 kernel launches of the process are checked,
#        the rest run unchecked; a run so limited says so in its verdict line), SAN_VERDICT_LOG and
#        SAN_VERDICT_RC (judge a log written earlier, with the tool's exit status then, instead of
#        running the tool: one suite and tool)
# Note: racecheck of gpu_graph_build::conditional_while_counts_to_n needs the GPU to itself: while
# another sanitizer process shares the GPU, the tool's own library faults in that test's first WHILE
# replay (docs/results/gpu-runs-2026-11-27d.md); alone it is clean. Under memcheck beside 7 other
# sanitizer processes it once hit an illegal address at that replay, with no kernel access reported
# (docs/results/gpu-runs-2026-11-27e.md, call 4); alone and beside one neighbour it was clean. In
# the whole suite's process beside 9 other sanitizer processes it passed, and the next test's first
# synchronize found the context faulted (LAUNCH_FAILED, no access reported; gpu-runs-2026-11-28b.md,
# call 6). Give gpu_graph_build a sanitizer process and the GPU of its own.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
B=${BUNDLE:-.gpu-bundle}
R=${OUT:-gpu-out}; mkdir -p "$R/san"
allowed="$here/sanitize-allowed-api-errors.txt"
tools=${TOOLS:-memcheck racecheck}
if [[ $# -gt 0 ]]; then suites=("$@"); else suites=(); for t in "$B"/tests/*; do suites+=("${t##*/}"); done; fi
# At least one GPU required (a caller may require more, e.g. 2 on a two-GPU host).
export CUDA_ASYNC_REQUIRE_GPU=${CUDA_ASYNC_REQUIRE_GPU:-1}
bad=0
for s in "${suites[@]}"; do
  exe="$B/tests/$s"; [[ -x $exe ]] || exe=$(ls "$B"/tests/*"$s" 2>/dev/null | head -1)
  [[ -x $exe ]] || { echo "no such suite: $s"; bad=1; continue; }
  name=${exe##*/}
  for tool in $tools; do
    log="$R/san/$name-$tool${SAN_TAG:+-$SAN_TAG}.log"
    # application-only: the suites' own processes. gpu_completion starts child processes: one whose
    # only job is a deliberate kernel trap (an await of faulted work must fail, not hang; the tool
    # would report that trap as an error), and one for the nested await on an engine thread (killed
    # if it hangs).
    if [[ -n ${SAN_VERDICT_LOG:-} ]]; then
      # Judge a log written earlier (e.g. on a GPU host) again, with this script's rules and the
      # allowed list as they are now; SAN_VERDICT_RC is the tool's exit status then.
      cp "$SAN_VERDICT_LOG" "$log"; rc=${SAN_VERDICT_RC:-0}
    else
      timeout -k 10 "${SAN_TIMEOUT:-900}" compute-sanitizer --tool "$tool" --report-api-errors explicit --leak-check no \
        --target-processes application-only \
        --print-limit 20000 ${SAN_TOOL_ARGS:-} "$exe" --test-threads=1 ${SAN_ARGS:-} >"$log" 2>&1
      rc=$?
    fi
    result=$(grep -E '^test result' "$log" | tail -1)
    # API errors: "Program hit CUDA_ERROR_X (error N) due to ... on CUDA API call to cuY." (driver
    # calls), or "Program hit cudaErrorX ... to cudaY." (runtime calls, made inside libraries).
    # Some are reported without either name ("Program hit error 704 on CUDA API call."): they are
    # listed as error_N on (unnamed).
    api=$({ grep -oE 'Program hit [A-Za-z_]+ \(error [0-9]+\) due to .* on CUDA API call to [A-Za-z0-9_]+' "$log" |
      sed -E 's/Program hit ([A-Za-z_]+) .* call to ([A-Za-z0-9_]+)/\1 \2/'
      grep -oE 'Program hit error [0-9]+ on CUDA API call\.' "$log" | sed -E 's/Program hit error ([0-9]+) .*/error_\1 (unnamed)/'; } | sort | uniq -c)
    unexpected=0
    while read -r count err call; do
      [[ -z ${err:-} ]] && continue
      if ! awk -v k="$err $call" 'index($0, k " ") == 1 || $0 == k {f = 1} END {exit !f}' "$allowed"; then unexpected=$((unexpected + count)); echo "  unexpected API error: $count x $err on $call"; fi
    done <<<"$api"
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
    errs=$(sed -nE 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/p' <<<"$summary"); errs=${errs:-0}
    hazards=$(sed -nE 's/.*RACECHECK SUMMARY: ([0-9]+) hazard.*/\1/p' <<<"$summary"); hazards=${hazards:-0}
    # racecheck counts its own "failure to track a kernel launch" (a tool limitation with kernels
    # launched from several threads into and around graphs) as an error although it reports no
    # race; it is named here, printed, and subtracted only when no race report is in the log.
    untracked=$(grep -c 'Internal Sanitizer Error: Detected a failure to track a kernel launch' "$log")
    if [[ $tool == racecheck && $untracked -gt 0 ]] && ! grep -qE 'Race reported|Hazard' "$log"; then
      echo "  note: racecheck could not track a kernel launch ($untracked x, a tool limitation); no race reported"
      hazards=$((hazards > untracked ? hazards - untracked : 0))
      errs=$((errs > untracked ? errs - untracked : 0))
    fi
    apitotal=$(awk '{s+=$1} END {print s+0}' <<<"$api")
    memerrs=$((errs - apitotal)); ((memerrs < 0)) && memerrs=0
    verdict=ok
    # A filtered run in which no test passed (a filter that matched nothing) verified nothing.
    if [[ $rc -ne 0 && $rc -ne 99 ]] || ! grep -q ' 0 failed' <<<"$result" ||
      { [[ -n ${SAN_ARGS:-} ]] && grep -q 'ok\. 0 passed' <<<"$result"; } ||
      ((unexpected > 0 || memerrs > 0 || hazards > 0)); then
      verdict=FAIL; bad=1
      [[ $rc -eq 124 ]] && verdict="FAIL (timeout)"
      # Hazards reported only inside NVIDIA's closed library kernels (cuBLAS's nvjet_sm90_*, whose
      # bulk-copy pipelines racecheck is reported not to model: docs/results/soundness.md) are
      # named as such. Still a FAIL: explained, not proven false.
      kernels=$(grep -oE 'Race reported between [A-Za-z]+ access at [A-Za-z0-9_]+' "$log" | awk '{print $NF}' | sort -u)
      if [[ $tool == racecheck && -n $kernels ]] && ! grep -qvE '^nvjet_sm90_' <<<"$kernels"; then
        verdict="$verdict (hazards only inside cuBLAS kernels: $(wc -l <<<"$kernels") nvjet_sm90 kernels)"
      fi
    fi
    echo "$name $tool${SAN_TOOL_ARGS:+ ($SAN_TOOL_ARGS)}: $verdict | rc $rc | ${result:-no test result} | $summary | api errors $apitotal (unexpected $unexpected)"
    [[ $verdict == ok ]] || grep -E '^test .*FAILED|Invalid|Race|Hazard|Error' "$log" | head -15 | sed 's/^/    /'
  done
done
echo "sanitizer round: $([[ $bad == 0 ]] && echo PASS || echo FAIL)"
exit $bad
