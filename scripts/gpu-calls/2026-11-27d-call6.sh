# Call 6 of the fourth 2026-11-27 session (the last ~120 s of device time): the WHILE test under
# racecheck beside one other racecheck process (gpu_server part 1, killed afterwards), three times
# with the harness's fault backtrace and once without it as the control.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/D6; mkdir -p $L; export CUDA_ASYNC_REQUIRE_GPU=1
S=$(ls .gpu-bundle/tests/*--gpu_server); GB=$(ls .gpu-bundle/tests/*--gpu_graph_build)
san="compute-sanitizer --tool racecheck --report-api-errors explicit --leak-check no --target-processes application-only --print-limit 200"
(timeout 45 $san $S --test-threads=1 concurrent_requests_equal_their_replays_part1 --exact > $L/neighbour.log 2>&1) &
sleep 6
for k in h1 h2 h3 none; do
  if [ $k = none ]; then unset CUDA_ASYNC_TEST_FAULT_BACKTRACE; else export CUDA_ASYNC_TEST_FAULT_BACKTRACE=1; fi
  timeout 25 $san $GB --test-threads=1 conditional_while_counts_to_n --exact > $L/while-$k.log 2>&1; rc=$?
  echo "[$((SECONDS-T0)) s] WHILE $k: rc $rc | $(grep -E '^test result' $L/while-$k.log | cut -c1-30) | last: $(grep -E 'instantiated|replayed' $L/while-$k.log | tail -1) | FATAL lines $(grep -c FATAL $L/while-$k.log)"
  grep -A24 FATAL $L/while-$k.log | cut -c1-160 | head -26
done
wait; tar -czf $OUT/logs-d6.tgz -C /tmp D6; echo "end at $((SECONDS-T0)) s"
