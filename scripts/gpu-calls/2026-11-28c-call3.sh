# Call 3 of the 2026-11-28c session (bundle of .gpu-tar/commit = 308a145, library and tests of the
# final commit 2b98042: a context check on every call, Stream's drop binding before it abandons a capture):
# memcheck of every test of every GPU suite (gpu_llama and gpu_server one process per test, the
# others one process per suite), beside racecheck of four quick suites (interop, core, async,
# attention; no kernel changed since the last racecheck sweeps). At most P1 memcheck and P2
# racecheck processes at a time, all bounded by one deadline 470 s out (the template is
# 2026-11-28b-call6.sh); llama-server --llama-1b --tokens 256 at the end if time is left.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C3; mkdir -p $L; END=$(( $(date +%s) + 470 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
(python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $?") &
python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $?"; wait
export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall; echo "references at $((SECONDS-T0)) s"
{ for t in hf_reference_1b_prompt2 hf_reference_1b_rows64 hf_reference_1b_rows12 hf_reference_1b_prompt1 hf_reference_1b_prompt0 rows_equal_alone_in_their_bucket hf_reference_large_buckets hf_reference_small_cublas hf_reference_small fused_products_match_host products_wait_for_weights_written_ahead graph_cache_budget_and_padding refusals kernel_guards cancelled_step_keeps_slots_intact; do echo "gpu_llama $t"; done
  for t in concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay; do echo "gpu_server $t"; done
  for t in .gpu-bundle/tests/*--gpu_*; do s=${t##*--}; case $s in gpu_llama|gpu_server) ;; *) echo "$s ALL";; esac; done; } > $L/mjobs
{ for s in gpu_interop gpu_core gpu_async gpu_attention; do echo "$s ALL"; done; } > $L/rjobs
echo "memcheck $(wc -l < $L/mjobs) jobs, racecheck $(wc -l < $L/rjobs) jobs, deadline in $((END-$(date +%s))) s"
mkdir -p $L/m $L/r
(xargs -P ${P1:-8} -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh memcheck $0 $1 '"$END $L/m"' ' < $L/mjobs > $L/m.out 2>&1; echo "memcheck jobs ended at $((SECONDS-T0)) s") &
xargs -P ${P2:-2} -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$END $L/r"' ' < $L/rjobs > $L/r.out 2>&1; echo "racecheck jobs ended at $((SECONDS-T0)) s"
wait
echo "== memcheck"; cut -c1-200 $L/m.out; echo "== racecheck"; cut -c1-200 $L/r.out
grep -hE "^(1b|part [0-9])" $L/m/*/san/*.log | head -12
R=$((END+10-$(date +%s))); [ $R -gt 30 ] && { timeout $R .gpu-bundle/bin/llama-server --llama-1b --tokens 256 > $L/ls256.log 2>&1; echo "llama-server 256 exit $? at $((SECONDS-T0)) s"; tail -3 $L/ls256.log; }
tar -czf $OUT/logs-c3.tgz -C /tmp --exclude ref1b C3; echo "end at $((SECONDS-T0)) s"
