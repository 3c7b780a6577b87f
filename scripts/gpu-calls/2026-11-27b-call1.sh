# Call 1 of the second 2026-11-27 session (docs/results/gpu-runs-2026-11-27.md): the serving check
# alone (openai wheels carried in .whl), then every suite (run-all) beside memcheck of every GPU
# suite but gpu_llama (call 3 covers it), bounded by the call's time.
[ -d .gpu-bundle ] || tar -xJf .gpu-tar/bundle.tar.xz; L=/tmp/L1 && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
BIN=.gpu-bundle/bin OUT=$L/serve MODEL_DIR=/tmp/model-1b HEALTH_S=120 LOAD_S=120 timeout 260 scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -16 $L/serve-check.log; cp $L/serve/*.json $OUT/ 2>/dev/null
G=(suites)
for s in access async attention capture_races completion core graph graph_build interop kernel_bounds kernel_ops mlp multi prefill sampling server soundness user_kernels wakers; do G+=(memcheck:gpu_$s); done
DEADLINE=$((560-SECONDS+T0)) OUT=$L/r scripts/gpu-round.sh "${G[@]}" 2>&1 | tail -120
echo "end at $((SECONDS-T0)) s"; cp $L/r/logs.tgz $OUT/logs1.tgz; tar -czf $OUT/serve1.tgz -C $L --exclude model-1b serve serve-check.log
