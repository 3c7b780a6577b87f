# Call 7 of the third 2026-11-27 session (bundle in .gpu-tar/commit): conditional_while_counts_to_n
# under racecheck four times WITH the harness's fault backtrace (CUDA_ASYNC_TEST_FAULT_BACKTRACE=1),
# after it died in 4 of 4 runs without it in call 6 (and passed in the one run with it in call 4).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C7; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
for k in 1 2 3 4; do CUDA_ASYNC_TEST_FAULT_BACKTRACE=1 TOOLS=racecheck OUT=$L/rwhile$k SAN_TIMEOUT=100 SAN_TAG=while$k SAN_ARGS="conditional_while_counts_to_n --exact" scripts/sanitize.sh gpu_graph_build > $L/rwhile$k.log 2>&1; echo "with backtrace, run $k at $((SECONDS-T0)) s: $(head -1 $L/rwhile$k.log | cut -c1-130) | last: $(grep -E 'graph built|instantiated|replayed|FATAL' $L/rwhile$k/san/*.log | tail -1)"; done
grep -h -A25 FATAL $L/rwhile*/san/*.log | head -40
tar -czf $OUT/logs-c7.tgz -C /tmp C7; echo "end at $((SECONDS-T0)) s"
