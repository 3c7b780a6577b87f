# Call d of the 2026-11-28d session: the bundle of .gpu-tar-d/commit (af519ab, this session's
# final library), on a fresh machine. Each step bounded by one deadline BUDGET_S seconds out:
#   - bench-decode's awaited rows at batch 1 (--no-torch --batches 1 --ttft 128), the library of
#     62327aa (.gpu-tar-d/bench-decode-62327aa) and this one alternating, 4 pairs, the side that
#     goes first alternating: did the engine's change (completed ops' records dropped outside the
#     sweep) move the awaited step?
#   - memcheck of every test of every GPU suite (37 processes, 8 at a time, the Hugging Face
#     references generated first), with --print-limit 20000 (call c1's gpu_capture_races run
#     printed 200 of 7,376 by-design API errors and so could not be judged);
#   - gpu_graph_build under memcheck alone, three times (its WHILE test faulted or read a wrong
#     value under memcheck beside neighbours in calls a and c1);
#   - racecheck of the await-path suites, 4 at a time.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar-d/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar-d/bundle.tar.xz && cp .gpu-tar-d/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/Dd; mkdir -p $L/ab $L/m $L/r $L/g/1 $L/g/2 $L/g/3; END=$(( $(date +%s) + ${BUDGET_S:-400} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar-d/commit; echo "unpacked at $((SECONDS-T0)) s"
export CUDA_ASYNC_REQUIRE_GPU=1
(python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $?") &
(python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $?") &
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for side in $order; do
    exe=.gpu-bundle/bin/bench-decode; [ $side = old ] && exe=.gpu-tar-d/bench-decode-62327aa
    timeout 60 $exe --no-torch --batches 1 --ttft 128 --json $L/ab/$side-$i.json > $L/ab/$side-$i.log 2>&1
    echo "pair $i $side exit $? at $((SECONDS-T0)) s: $(grep -E '^median step' $L/ab/$side-$i.log | cut -c1-200)"
  done
done
wait
export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall
{ for t in hf_reference_1b_prompt2 hf_reference_1b_rows64 hf_reference_1b_rows12 hf_reference_1b_prompt1 hf_reference_1b_prompt0 rows_equal_alone_in_their_bucket hf_reference_large_buckets hf_reference_small_cublas hf_reference_small fused_products_match_host products_wait_for_weights_written_ahead graph_cache_budget_and_padding refusals kernel_guards cancelled_step_keeps_slots_intact; do echo "gpu_llama $t"; done
  for t in concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay; do echo "gpu_server $t"; done
  for t in .gpu-bundle/tests/*--gpu_*; do s=${t##*--}; case $s in gpu_llama|gpu_server) ;; *) echo "$s ALL";; esac; done; } > $L/mjobs
MEND=$(( $(date +%s) + 200 )); [ $MEND -lt $((END-90)) ] || MEND=$((END-90))
xargs -P 8 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh memcheck $0 $1 '"$MEND $L/m"' ' < $L/mjobs > $L/m.out 2>&1
echo "memcheck jobs ended at $((SECONDS-T0)) s: $(grep -c ' memcheck: ok' $L/m/*.log | grep -c ':1$') of $(wc -l < $L/mjobs) ok"
for f in $L/m/*.log; do grep -q ' memcheck: ok' $f || echo "  not ok: $(grep -E 'memcheck: ' $f | tail -1 | cut -c1-230)"; done
grep -hE "unexpected API error" $L/m/*.log | sort | uniq -c | head -8
for i in 1 2 3; do bash scripts/gpu-calls/san-job.sh memcheck gpu_graph_build ALL $((END-60)) $L/g/$i | cut -c1-200; done
grep -hE "FAILED: " $L/g/*/*.log | head -4 | cut -c1-200
for s in gpu_wakers gpu_completion gpu_async gpu_capture_races; do (bash scripts/gpu-calls/san-job.sh racecheck $s ALL $((END-10)) $L/r | cut -c1-200) & done; wait
tar -czf $OUT/logs-dd.tgz -C /tmp --exclude ref1b --exclude refsmall Dd; echo "end at $((SECONDS-T0)) s"
