# Calls c1 and c2 of the 2026-11-28d session (`bash THIS 1`, `bash THIS 2`): the bundle of .gpu-tar-d/commit (af519ab and after: the
# red-team fixes of this session), on the machine left warm by calls a and b, with what device time
# is left. Each step is bounded by one deadline BUDGET_S seconds out:
#   - gpu_wakers, with a_waker_whose_drop_panics_does_not_stop_the_engine, and its mutation
#     (scripts/mutations/engine-drops-in-sweep.patch: must fail);
#   - gpu_graph (param_handles: the empty tunable op's handle is its own node), and its mutation
#     (scripts/mutations/tunable-skips-empty.patch: must fail);
#   - gpu_capture_races (the pinned copy now asked with cuPointerGetAttributes), then memcheck of
#     it (no API error may remain: the allow-list entry for cuPointerGetAttribute is gone);
#   - every other test executable alone;
#   and in c2: llama-server --llama-1b at 256 and 32 tokens, and bench-decode's awaited rows at
#   batch 1 (--no-torch) on the new completion engine.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar-d/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar-d/bundle.tar.xz && cp .gpu-tar-d/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/Dc; mkdir -p $L/plain $L/san; END=$(( $(date +%s) + ${BUDGET_S:-200} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar-d/commit; echo "unpacked at $((SECONDS-T0)) s"
export CUDA_ASYNC_REQUIRE_GPU=1
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); local left=$((END-$(date +%s)-5)); [ $left -gt 3 ] || { echo "$1: no time left"; return; }; timeout $(( left < $2 ? left : $2 )) $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; grep -hE "^test .*FAILED|FAILED: " $L/plain/$1.log | head -3 | cut -c1-220; }
mut() { timeout 20 .gpu-tar-d/mut-$1 --test-threads=1 $2 --exact > $L/mut-$1.log 2>&1; echo "mutation $1 exit $? (must fail): $(grep -E '^test result|FAILED: |never completed' $L/mut-$1.log | head -2 | cut -c1-220 | tr '\n' ' ')"; }
if [ "${1:-1}" = 1 ]; then
  suite gpu_wakers 40
  mut engine-drops-in-sweep a_waker_whose_drop_panics_does_not_stop_the_engine
  suite gpu_graph 60
  mut tunable-skips-empty param_handles
  suite gpu_capture_races 60
  grep -E "copy_from_host returned after" $L/plain/gpu_capture_races.log | cut -c1-200
  # memcheck, three processes side by side: gpu_capture_races and gpu_graph (no API error may
  # remain from the pageable-copy check), gpu_graph_build (its WHILE test faulted under memcheck
  # beside seven neighbours in call a).
  for s in gpu_capture_races gpu_graph gpu_graph_build; do (bash scripts/gpu-calls/san-job.sh memcheck $s ALL $((END-200)) $L/san > $L/san/$s.out 2>&1) & done; wait
  cut -c1-220 $L/san/*.out; grep -hE "unexpected API|Program hit CUDA_ERROR_ILLEGAL" $L/san/*.log | sort | uniq -c | head -5; echo "memcheck done at $((SECONDS-T0)) s"
  for t in .gpu-bundle/tests/*; do s=${t##*--}; case $s in gpu_wakers|gpu_graph|gpu_capture_races) ;; *) suite $s 150 | grep -vE "exit 0 .*: test result: ok";; esac; done
else
  for n in 256 32; do R=$((END-$(date +%s)-100)); [ $R -gt 20 ] || break; timeout $((R<260?R:260)) .gpu-bundle/bin/llama-server --llama-1b --tokens $n > $L/ls$n.log 2>&1; echo "llama-server --llama-1b --tokens $n exit $? at $((SECONDS-T0)) s"; tail -2 $L/ls$n.log | cut -c1-250; done
  R=$((END-$(date +%s)-5)); if [ $R -gt 40 ]; then timeout $R .gpu-bundle/bin/bench-decode --no-torch --batches 1 --ttft 128 --json $OUT/bench-decode-await-h100-d.json > $L/bd.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -E "^ +1 |blocking|median step|early wakes|CPU|OS floor" $L/bd.log | cut -c1-250; fi
fi
cat $L/plain/*.log 2>/dev/null | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "summary of what ran: " p " passed, " f " failed, " i " ignored"}'
tar -czf $OUT/logs-dc$1.tgz -C /tmp Dc; echo "end at $((SECONDS-T0)) s"
