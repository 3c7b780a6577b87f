# The fifth 2026-11-28 session's last call (device time left: about 190 s after the start):
# racecheck of the GPU suites not racechecked on the final library yet, one process per suite, 8
# at a time, bounded by the deadline (gpu_llama and gpu_server take 270 s or more a test under
# racecheck: left for a later session). Bundle of a347f15 plus the gpu_sampling executable of
# 91c804e, as in 2026-11-28e-c.sh. Timing tests fail beside other sanitizer processes (known:
# gpu_completion's early wake, gpu_access's overlap tests); what matters here is the hazard count.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
cp .gpu-tar/gpu_sampling-new .gpu-bundle/tests/cuda-async-tests--test--gpu_sampling
T0=$SECONDS; L=/tmp/Ef; mkdir -p $L/r; END=$(( $(date +%s) + ${1:-150} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
for s in gpu_async gpu_wakers gpu_kernel_ops gpu_attention gpu_interop gpu_user_kernels gpu_kernel_bounds gpu_mlp gpu_completion gpu_core gpu_access gpu_soundness gpu_capture_races gpu_prefill gpu_sampling gpu_multi; do echo "$s ALL"; done > $L/rjobs
xargs -P 8 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$((END-8)) $L/r"' ' < $L/rjobs > $L/r.out 2>&1
echo "racecheck ended at $((SECONDS-T0)) s: $(grep -l ' racecheck: ok' $L/r/*.log | wc -l) of $(wc -l < $L/rjobs) ok"
cut -c1-230 $L/r.out
for f in $L/r/*/san/*.log; do h=$(grep -cE "Race reported" $f); [ "$h" != 0 ] && echo "  $(basename $f): $h race reports; first: $(grep -m1 -E 'Race reported' $f | cut -c1-160)"; done
tar -czf $OUT/logs-ef.tgz -C /tmp Ef; echo "end at $((SECONDS-T0)) s"
