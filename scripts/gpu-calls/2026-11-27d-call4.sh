# Call 4 of the fourth 2026-11-27 session (bundle in .gpu-tar/commit, the final library). Call 3 ran
# past the device tool's limit and its logs were lost: every job is now bounded by one deadline.
# 1. The WHILE node under racecheck, the same test binary built at three commits (carried in
#    .gpu-tar/bisect): a678c9f (the library on which it died 4 of 4 in the previous session),
#    473513e, and the final one, alternating, without the harness's handler.
# 2. racecheck of gpu_server, one process per test (the three parts of the concurrent test and the
#    HTTP test), then of gpu_llama's short tests, one process each.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/D4; mkdir -p $L; D=$(( $(date +%s) + 560 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
final=$(ls .gpu-bundle/tests/*--gpu_graph_build)
for k in 1 2 3; do for b in .gpu-tar/bisect/gpu_graph_build-* $final; do
  n=$(basename $b); [ "$b" = "$final" ] && n=final
  timeout 60 compute-sanitizer --tool racecheck --report-api-errors explicit --leak-check no --target-processes application-only --print-limit 200 $b --test-threads=1 conditional_while_counts_to_n --exact > $L/while-$n-$k.log 2>&1
  echo "WHILE racecheck $n run $k: rc $? | $(grep -E '^test result' $L/while-$n-$k.log | cut -c1-40) | last: $(grep -E 'graph built|instantiated|replayed' $L/while-$n-$k.log | tail -1) | $(grep -c 'dereferencing Unified' $L/while-$n-$k.log) UM-fault lines"
done; done
python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1 && export LLAMA_REF_DIR=/tmp/refsmall
echo "reference at $((SECONDS-T0)) s"
printf 'gpu_server %s\n' concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay > $L/jobs-a
printf 'gpu_llama %s\n' hf_reference_small fused_products_match_host graph_cache_budget_and_padding refusals kernel_guards cancelled_step_keeps_slots_intact > $L/jobs-b
xargs -P 4 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$D $L" < $L/jobs-a
echo "server jobs ended at $((SECONDS-T0)) s"
xargs -P 6 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$D $L" < $L/jobs-b
grep -hE "^(part|1b)" $L/*/san/*.log | head
tar -czf $OUT/logs-d4.tgz -C /tmp D4; echo "end at $((SECONDS-T0)) s"
