# Call 5 of the 2026-11-28c session: the bundle of .gpu-tar/commit (2a65b2c, the copy/capture
# soundness fix), on a fresh machine with about four minutes of device time left. In order, each
# bounded by one deadline BUDGET_S seconds out:
#   - gpu_capture_races, with the two new tests (blocking_waits_never_meet_a_capture,
#     pinned_source_is_read_before_copy_from_host_returns);
#   - their mutations (scripts/mutations/capture-ignores-waiters.patch, pinned-copy-no-wait.patch),
#     each of which must fail its test;
#   - memcheck and racecheck of gpu_capture_races, side by side;
#   - the other test executables alone, the quick ones first, as time allows;
#   - bench-decode at batch 1 (--no-torch), if time is left.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C5; mkdir -p $L/plain $L/san; END=$(( $(date +%s) + ${BUDGET_S:-200} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
C=$(ls .gpu-bundle/tests/*--gpu_capture_races)
timeout 60 $C --test-threads=1 > $L/plain/gpu_capture_races.log 2>&1; echo "gpu_capture_races exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/gpu_capture_races.log)"
grep -E "copies read right|copy_from_host returned after|FAILED" $L/plain/gpu_capture_races.log | cut -c1-250
for m in capture-ignores-waiters pinned-copy-no-wait; do
  t=blocking_waits_never_meet_a_capture; [ $m = pinned-copy-no-wait ] && t=pinned_source_is_read_before_copy_from_host_returns
  timeout 30 .gpu-tar/mut-$m --test-threads=1 $t --exact > $L/mut-$m.log 2>&1
  echo "mutation $m exit $? (must fail): $(grep -E '^test result|FAILED: ' $L/mut-$m.log | head -3 | cut -c1-230 | tr '\n' ' ')"
done
for t in memcheck racecheck; do (bash scripts/gpu-calls/san-job.sh $t gpu_capture_races ALL $((END-60)) $L/san > $L/san/$t.out 2>&1) & done; wait
cut -c1-220 $L/san/*.out; echo "sanitizers done at $((SECONDS-T0)) s"
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for s in gpu_core gpu_access gpu_soundness gpu_async gpu_interop gpu_wakers gpu_user_kernels gpu_graph_build gpu_graph gpu_kernel_bounds gpu_kernel_ops gpu_sampling gpu_attention gpu_server gpu_multi gpu_completion gpu_mlp gpu_prefill gpu_llama; do left=$((END-$(date +%s)-8)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done 2>&1 | grep -E "gpu_|exit [1-9]|no time"
for t in .gpu-bundle/tests/*; do s=${t##*--}; case $s in gpu_*) ;; *) left=$((END-$(date +%s)-5)); [ $left -gt 3 ] && suite $s $left | grep -E "exit [1-9]";; esac; done
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "summary of what ran: " p " passed, " f " failed, " i " ignored"}'
grep -hE "^test .*FAILED|FAILED: " $L/plain/*.log | head -10 | cut -c1-220
R=$((END-$(date +%s))); if [ $R -gt 50 ]; then timeout $((R-5)) .gpu-bundle/bin/bench-decode --no-torch --batches 1 --ttft 128 --json $OUT/bench-decode-h100-c5.json > $L/bd.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -E "^ +1 |blocking|median step|early wakes|CPU|OS floor" $L/bd.log | cut -c1-250; fi
tar -czf $OUT/logs-c5.tgz -C /tmp C5; echo "end at $((SECONDS-T0)) s"
