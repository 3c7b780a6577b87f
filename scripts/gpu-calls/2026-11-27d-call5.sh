# Call 5 of the fourth 2026-11-27 session (bundle in .gpu-tar/commit, the final library), the last
# of the session's device time (about 430 s): racecheck of gpu_server's concurrent test part 1;
# while it runs (the condition under which the WHILE test died in every earlier run: other sanitizer processes on the
# GPU), the WHILE test and the plain CUDA C reproduction under racecheck, alternating.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/D5; mkdir -p $L; D=$(( $(date +%s) + 370 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
(nvcc -arch=sm_90 -rdc=true scripts/repro/while_racecheck.cu -lcudadevrt -o /tmp/while_racecheck > $L/nvcc.log 2>&1; echo "nvcc exit $?" >> $L/nvcc.log) &
echo "gpu_server concurrent_requests_equal_their_replays_part1" > $L/jobs
(xargs -P 4 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$D $L" < $L/jobs > $L/jobs.out 2>&1) &
wait %1; cat $L/nvcc.log; sleep 10
GB=$(ls .gpu-bundle/tests/*--gpu_graph_build)
for k in 1 2 3 4 5 6; do
  [ $(( D - $(date +%s) )) -gt 60 ] || break
  timeout 60 compute-sanitizer --tool racecheck --report-api-errors explicit --leak-check no --target-processes application-only --print-limit 200 $GB --test-threads=1 conditional_while_counts_to_n --exact > $L/while-$k.log 2>&1; rc=$?
  echo "[$((SECONDS-T0)) s, $(pgrep -c -f 'compute-sanitizer') sanitizer processes] WHILE test run $k: rc $rc | $(grep -E '^test result' $L/while-$k.log | cut -c1-30) | last: $(grep -E 'instantiated|replayed' $L/while-$k.log | tail -1) | $(grep -c 'dereferencing Unified' $L/while-$k.log) UM-fault lines"
  for m in while edges; do timeout 60 compute-sanitizer --tool racecheck /tmp/while_racecheck $m > $L/repro-$m-$k.log 2>&1; rc=$?; echo "   repro $m run $k: rc $rc | $(grep -E 'repro .*: ok|RACECHECK SUMMARY|Error' $L/repro-$m-$k.log | head -2 | tr '\n' ' ')"; done
done
wait; cat $L/jobs.out
grep -hE "^part" $L/*/san/*.log | head
tar -czf $OUT/logs-d5.tgz -C /tmp D5; echo "end at $((SECONDS-T0)) s"
