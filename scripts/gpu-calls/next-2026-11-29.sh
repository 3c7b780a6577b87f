# Run as calls a and b of the 2026-11-28d session (docs/results/gpu-runs-2026-11-28d.md), as below.
# What the 2026-11-28c session left to run on the final build (docs/results/gpu-runs-2026-11-28c.md,
# "Not run on the final build"), as two device calls: `bash THIS a` then `bash THIS b`.
# The session left .gpu-tar/ ready for its final library (bundle.tar.xz, commit, and the mutation
# builds mut-copy-wait-not-relaxed and mut-event-check-then-call of gpu_capture_races). If the
# library or tests changed since, prepare here first: scripts/gpu-bundle; git rev-parse HEAD >
# .gpu-tar/commit; cp .gpu-tar/commit .gpu-bundle/.commit; XZ_OPT="-T2 -6" tar -cJf
# .gpu-tar/bundle.tar.xz .gpu-bundle; and for X in copy-wait-not-relaxed event-check-then-call: git
# apply scripts/mutations/X.patch; cargo test --release -p cuda-async-tests --test
# gpu_capture_races --no-run; copy the executable to .gpu-tar/mut-X; git checkout the patched
# files. Carry .gpu-tar.
#   a: gpu_capture_races with the never-run blocking_copies_while_this_thread_captures_another_stream
#      and event_waits_never_meet_a_capture_record, and their mutations (each must fail its test);
#      every other test executable alone (gpu_llama included); the
#      memcheck sweep of every test (37 processes, 8 at a time, the 1B references generated first);
#      then racecheck, one suite at a time alone on the GPU, of gpu_capture_races and of the suites
#      that failed or did not finish beside neighbours in the 2026-11-28c calls (gpu_completion,
#      gpu_graph_build, gpu_soundness, gpu_core), as time allows.
#   b: scripts/dev/attn_lab.cu (never run yet); bench-decode with the PyTorch baselines (decode.md's
#      headline on the final library); llama-server --llama-1b at 32 and 256 tokens.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/N$1; mkdir -p $L; END=$(( $(date +%s) + 560 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
if [ "$1" = a ]; then
  mkdir -p $L/plain
  timeout 60 $(ls .gpu-bundle/tests/*--gpu_capture_races) --test-threads=1 > $L/plain/gpu_capture_races.log 2>&1; echo "gpu_capture_races exit $?: $(grep '^test result' $L/plain/gpu_capture_races.log)"; grep -E "copies read right|returned after|FAILED" $L/plain/gpu_capture_races.log | cut -c1-220
  for m in copy-wait-not-relaxed:blocking_copies_while_this_thread_captures_another_stream event-check-then-call:event_waits_never_meet_a_capture_record; do
    timeout 30 .gpu-tar/mut-${m%%:*} --test-threads=1 ${m#*:} --exact > $L/mut-${m%%:*}.log 2>&1; echo "mutation ${m%%:*} exit $? (must fail): $(grep -E '^test result|FAILED: ' $L/mut-${m%%:*}.log | head -2 | cut -c1-220 | tr '\n' ' ')"
  done
  for t in .gpu-bundle/tests/*; do s=${t##*--}; [ $s = gpu_capture_races ] && continue; timeout 150 $t --test-threads=1 > $L/plain/$s.log 2>&1 || echo "$s exit $?"; done
  cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'; echo "suites done at $((SECONDS-T0)) s"
  grep -hE "^test .*FAILED|FAILED: " $L/plain/*.log | head -8 | cut -c1-220
  (python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $?") &
  python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $?"; wait
  export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall
  { for t in hf_reference_1b_prompt2 hf_reference_1b_rows64 hf_reference_1b_rows12 hf_reference_1b_prompt1 hf_reference_1b_prompt0 rows_equal_alone_in_their_bucket hf_reference_large_buckets hf_reference_small_cublas hf_reference_small fused_products_match_host products_wait_for_weights_written_ahead graph_cache_budget_and_padding refusals kernel_guards cancelled_step_keeps_slots_intact; do echo "gpu_llama $t"; done
    for t in concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay; do echo "gpu_server $t"; done
    for t in .gpu-bundle/tests/*--gpu_*; do s=${t##*--}; case $s in gpu_llama|gpu_server) ;; *) echo "$s ALL";; esac; done; } > $L/mjobs
  mkdir -p $L/m $L/r; MEND=$(( $(date +%s) + 200 ))
  xargs -P 8 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh memcheck $0 $1 '"$MEND $L/m"' ' < $L/mjobs > $L/m.out 2>&1; echo "memcheck jobs ended at $((SECONDS-T0)) s"; cut -c1-200 $L/m.out | grep -vE "memcheck: ok"
  echo "memcheck: $(grep -c 'memcheck: ok' $L/m.out) of $(wc -l < $L/mjobs) jobs ok"
  for s in gpu_capture_races gpu_completion gpu_graph_build gpu_soundness gpu_core; do bash scripts/gpu-calls/san-job.sh racecheck $s ALL $((END-10)) $L/r | cut -c1-200; done
  grep -hE "FAILED: |failure to track" $L/r/*/san/*.log | head -6 | cut -c1-200
else
  nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda scripts/dev/attn_lab.cu -o /tmp/attn_lab > $L/attn_lab_build.log 2>&1; echo "attn_lab build exit $? at $((SECONDS-T0)) s"; grep -iE "error" $L/attn_lab_build.log | head -5
  timeout 120 /tmp/attn_lab > $OUT/attn-lab-h100.txt 2>&1; echo "attn_lab exit $? at $((SECONDS-T0)) s"; cut -c1-200 $OUT/attn-lab-h100.txt
  timeout 230 .gpu-bundle/bin/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100-final.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | grep -E "^ +(1|16|64) |await|median step|early|CPU|OS floor|first token|copy|reduce-overhead|^batch" | head -24 | cut -c1-220
  for n in 32 256; do R=$((END-$(date +%s)-5)); [ $R -gt 20 ] || break; timeout $((R<60?R:60)) .gpu-bundle/bin/llama-server --llama-1b --tokens $n > $L/ls$n.log 2>&1; echo "llama-server --llama-1b --tokens $n exit $? at $((SECONDS-T0)) s"; tail -1 $L/ls$n.log | cut -c1-250; done
fi
tar -czf $OUT/logs-n$1.tgz -C /tmp --exclude ref1b N$1; echo "end at $((SECONDS-T0)) s"
