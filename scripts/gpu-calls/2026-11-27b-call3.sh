# Call 3 (bundle of the tiled prefill attention): the tests that exercise the new kernel first,
# alone (gpu_prefill, gpu_attention), then the serving check alone, then every suite (run-all)
# beside memcheck and racecheck of the suites the prefill path runs in.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
L=/tmp/L3 && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
for t in gpu_prefill gpu_attention; do CUDA_ASYNC_REQUIRE_GPU=1 timeout 120 .gpu-bundle/tests/*--$t --test-threads=1 > $L/$t.log 2>&1; echo "$t exit $? at $((SECONDS-T0)) s"; grep -E "^test |error|FAIL|---- |vs |differ" $L/$t.log | head -30; done
BIN=.gpu-bundle/bin OUT=$L/serve MODEL_DIR=/tmp/model-1b HEALTH_S=120 LOAD_S=120 timeout 250 scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -5 $L/serve-check.log; cp $L/serve/serve-h100.json $OUT/ 2>/dev/null
G=(suites memcheck:gpu_prefill racecheck:gpu_prefill memcheck:gpu_sampling memcheck:gpu_server memcheck:gpu_attention racecheck:gpu_attention memcheck:gpu_completion)
DEADLINE=$((565-SECONDS+T0)) OUT=$L/r scripts/gpu-round.sh "${G[@]}" 2>&1 | grep -vE "^start " | tail -70
echo "end at $((SECONDS-T0)) s"; cp $L/r/logs.tgz $OUT/logs3.tgz; tar -czf $OUT/serve3.tgz -C $L --exclude model-1b --exclude r .
