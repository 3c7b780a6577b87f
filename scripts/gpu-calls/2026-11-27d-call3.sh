# Call 3 of the fourth 2026-11-27 session (bundle in .gpu-tar/commit, the final library): the WHILE
# node under racecheck without the harness's handler (Rust's own in place) twice with core dumps on,
# with both signals at their default action twice, and the cores' threads' backtraces; memcheck of
# gpu_completion alone (its early-wake test failed beside 9 other sanitizer processes in call 2);
# then racecheck of gpu_llama and gpu_server, one process per test, the longest first.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/D3; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
GB=$(ls .gpu-bundle/tests/*--gpu_graph_build)
w() { TOOLS=racecheck OUT=$L/$1 SAN_TIMEOUT=60 SAN_TAG=$1 SAN_ARGS="conditional_while_counts_to_n --exact" scripts/sanitize.sh gpu_graph_build > $L/$1.log 2>&1; echo "$1 at $((SECONDS-T0)) s: $(head -1 $L/$1.log | cut -c40-120) | last: $(grep -E 'graph built|instantiated|replayed|FATAL' $L/$1/san/*.log | tail -1)"; }
(ulimit -c 16000000; w rust1; ls -la core* 2>/dev/null; for c in core*; do [ -f "$c" ] && timeout 120 cuda-gdb -q -batch -ex 'info threads' -ex 'thread apply all bt 14' $GB $c > $L/core-rust1.txt 2>&1; done; rm -f core*
 w rust2; ls -la core* 2>/dev/null; rm -f core*)
grep -vE "^\[New LWP" $L/core-rust1.txt 2>/dev/null | grep -E -B3 -A22 "SIGSEGV|signal 11|Program terminated" | cut -c1-180 | head -60
grep -E "^\* |^Thread " $L/core-rust1.txt 2>/dev/null | cut -c1-160 | head -30
CUDA_ASYNC_TEST_FAULT_BACKTRACE=default w default1; CUDA_ASYNC_TEST_FAULT_BACKTRACE=default w default2
CUDA_ASYNC_TEST_FAULT_BACKTRACE=1 w handler1
python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1 && export LLAMA_REF_DIR_1B=/tmp/ref1b
python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1 && export LLAMA_REF_DIR=/tmp/refsmall
echo "references at $((SECONDS-T0)) s"
TOOLS=memcheck OUT=$L/mcompletion SAN_TIMEOUT=120 scripts/sanitize.sh gpu_completion > $L/mcompletion.log 2>&1; head -1 $L/mcompletion.log | cut -c1-200; grep -h "early wakes" $L/mcompletion/san/*.log | head -3
{ for t in rows_equal_alone_in_their_bucket hf_reference_large_buckets hf_reference_1b_rows64 hf_reference_1b_prompt2 hf_reference_1b_rows12 hf_reference_small_cublas hf_reference_small hf_reference_1b_prompt1 hf_reference_1b_prompt0 fused_products_match_host graph_cache_budget_and_padding refusals kernel_guards cancelled_step_keeps_slots_intact; do echo "gpu_llama $t"; done
  for t in concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay; do echo "gpu_server $t"; done; } > $L/jobs
R=$((580-SECONDS+T0)); echo "racecheck budget $R s, $(wc -l < $L/jobs) jobs"
xargs -P ${P:-9} -L 1 sh -c 'TOOLS=racecheck OUT='"$L"'/$0-$1 SAN_TIMEOUT='"$R"' SAN_TAG=$1 SAN_ARGS="$1 --exact" scripts/sanitize.sh $0 > '"$L"'/$0-$1.log 2>&1; echo "$0 $1 done at $(date +%T)"' < $L/jobs
for f in $L/gpu_*-*.log; do grep -hE "racecheck:" "$f" | sed "s/^/${f##*/}: /" | cut -c1-200; done
tar -czf $OUT/logs-d3.tgz -C /tmp D3; echo "end at $((SECONDS-T0)) s"
