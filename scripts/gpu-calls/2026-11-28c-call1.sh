# Call 1 of the 2026-11-28c session: what the 2026-11-28b session left to run (its
# next-2026-11-29.sh, unchanged below this header), on the bundle of 308a145 (library and tests
# identical to the final commit 2b98042 of that session) and two mutation builds of gpu_interop.
#   - gpu_interop on the final build, with the two context tests (their first GPU run in this
#     form), printing what the driver reports as current after a context is destroyed elsewhere;
#   - the mutations: record-no-bind (Event::record without its bind) must fail
#     every_call_binds_while_another_context_is_current ("Event::record left another context
#     current"); launch-no-bind shows whether a launch with a destroyed context current needs the
#     bind (calls_after_the_current_context_is_destroyed_elsewhere, call 0): informative, either way;
#   - gpu_graph_build under memcheck: alone twice; as a whole suite beside 7 memcheck neighbours
#     twice; beside 7 with its WHILE test skipped twice (is the fault after the WHILE test the
#     tool's, and does it need that test?);
#   - racecheck of the suites not run on this library since 54a0e70, as time allows.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/X1; mkdir -p $L; END=$(( $(date +%s) + 560 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
I=$(ls .gpu-bundle/tests/*--gpu_interop)
timeout 60 $I --test-threads=1 > $L/interop.log 2>&1; echo "gpu_interop exit $?: $(grep -E '^test result' $L/interop.log)"; grep -E "current after|calls_|every_call|objects_land" $L/interop.log | cut -c1-200
for m in record-no-bind launch-no-bind; do
  t=calls_after_the_current_context_is_destroyed_elsewhere; [ $m = record-no-bind ] && t=every_call_binds_while_another_context_is_current
  timeout 60 .gpu-tar/mut-$m --test-threads=1 $t --exact > $L/mut-$m.log 2>&1
  echo "mutation $m exit $?: $(grep -E '^test result|current after|Error|error' $L/mut-$m.log | head -4 | cut -c1-200 | tr '\n' ' ')"
done
GB=$(ls .gpu-bundle/tests/*--gpu_graph_build); G=$(ls .gpu-bundle/tests/*--gpu_graph)
san="compute-sanitizer --tool memcheck --report-api-errors explicit --leak-check no --target-processes application-only --print-limit 50"
for i in 1 2; do timeout 60 $san $GB --test-threads=1 > $L/gb-alone-$i.log 2>&1; echo "gpu_graph_build memcheck alone $i: rc $? $(grep -hE 'ERROR SUMMARY|^test result' $L/gb-alone-$i.log | tr '\n' ' ' | cut -c1-200)"; done
for mode in whole skip-while; do
  for i in 1 2; do
    extra=""; [ $mode = skip-while ] && extra="--skip conditional_while_counts_to_n"
    for j in 1 2 3 4 5 6 7; do (timeout 120 $san $G --test-threads=1 > $L/nb-$mode-$i-$j.log 2>&1) & done; sleep 3
    timeout 110 $san $GB --test-threads=1 $extra > $L/gb-$mode-$i.log 2>&1; echo "gpu_graph_build memcheck beside 7, $mode, $i: rc $? $(grep -hE 'ERROR SUMMARY|^test result' $L/gb-$mode-$i.log | tr '\n' ' ' | cut -c1-200)"
    wait
  done
done
{ for s in gpu_access gpu_capture_races gpu_completion gpu_graph gpu_kernel_ops gpu_kernel_bounds gpu_mlp gpu_sampling gpu_soundness gpu_user_kernels gpu_wakers gpu_prefill; do echo "$s ALL"; done; } > $L/rjobs
mkdir -p $L/r; xargs -P 4 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$END $L/r"' ' < $L/rjobs > $L/r.out 2>&1; cut -c1-200 $L/r.out
tar -czf $OUT/logs-x1.tgz -C /tmp X1; echo "end at $((SECONDS-T0)) s"
