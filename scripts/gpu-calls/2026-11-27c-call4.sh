# Call 4 of the third 2026-11-27 session (bundle in .gpu-tar/commit): the sanitizer runs that did
# not finish in call 3 beside 25 other processes, now 6 side by side with the whole call: racecheck
# of gpu_server::concurrent_requests_equal_their_replays and of gpu_llama's hf_reference_1b,
# hf_reference_large_buckets, hf_reference_small_cublas, rows_equal_alone_in_their_bucket;
# memcheck of gpu_llama::hf_reference_1b. And racecheck of
# gpu_graph_build::conditional_while_counts_to_n with the harness's fault backtrace on.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C4; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
R=$((585-SECONDS+T0))
j() { local tool=$1 suite=$2 t=$3; (TOOLS=$tool OUT=$L/$tool-$suite-$t SAN_TIMEOUT=$R SAN_TAG=$t SAN_ARGS="$t --exact" scripts/sanitize.sh $suite > $L/$tool-$suite-$t.log 2>&1; echo "$tool $suite $t: done at $((SECONDS-T0)) s" >> $L/$tool-$suite-$t.log) & }
j racecheck gpu_server concurrent_requests_equal_their_replays
for t in hf_reference_1b hf_reference_large_buckets hf_reference_small_cublas rows_equal_alone_in_their_bucket; do j racecheck gpu_llama $t; done
j memcheck gpu_llama hf_reference_1b
( CUDA_ASYNC_TEST_FAULT_BACKTRACE=1 TOOLS=racecheck OUT=$L/rwhile SAN_TIMEOUT=120 SAN_TAG=while SAN_ARGS="conditional_while_counts_to_n --exact" scripts/sanitize.sh gpu_graph_build > $L/rwhile.log 2>&1 ) &
wait
echo "== rwhile"; head -2 $L/rwhile.log; grep -vE "^\s*$" $L/rwhile/san/*.log | grep -vE "^=========\s*$" | head -60
echo "== sanitizers"; for f in $L/*-gpu_*.log; do echo "${f##*/}: $(grep -E 'racecheck:|memcheck:' $f | sed -E 's/.*(racecheck|memcheck): //' | cut -c1-170) $(grep done $f)"; done
tar -czf $OUT/logs-c4.tgz -C /tmp C4; echo "end at $((SECONDS-T0)) s"
