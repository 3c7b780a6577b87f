# Call 2 of the fifth 2026-11-27 session (bundle of f9693e9): the products lab (scripts/dev/gemv_lab.cu,
# nvcc here) alone on the GPU; then racecheck of gpu_server part 0 (the job never finished before)
# beside one queue of single racecheck jobs: deferred_drops_finish_before_exit, gpu_llama's
# hf_reference_1b_prompt2 and rows_equal_alone_in_their_bucket. Every job bounded by one deadline.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/E2; mkdir -p $L; END=$(( $(date +%s) + 565 )); export CUDA_ASYNC_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
timeout 150 nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda scripts/dev/gemv_lab.cu -o /tmp/gemv_lab > $L/lab-build.log 2>&1; echo "lab build exit $? at $((SECONDS-T0)) s"; grep -E "error" $L/lab-build.log | head -10
[ -x /tmp/gemv_lab ] && { timeout 90 /tmp/gemv_lab > $L/lab.log 2>&1; echo "lab exit $? at $((SECONDS-T0)) s"; cat $L/lab.log; }
LLAMA_REF_DIR_1B=/tmp/ref1b; export LLAMA_REF_DIR_1B
(timeout 150 python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b exit $? at $((SECONDS-T0)) s") &
bash scripts/gpu-calls/san-job.sh racecheck gpu_server concurrent_requests_equal_their_replays_part0 $END $L &
wait %1
for j in "gpu_graph_build deferred_drops_finish_before_exit" "gpu_llama hf_reference_1b_prompt2" "gpu_llama rows_equal_alone_in_their_bucket"; do bash scripts/gpu-calls/san-job.sh racecheck $j $END $L; done
wait; echo "jobs ended at $((SECONDS-T0)) s"
grep -h "^test result\|FAILED\|panicked\|part 0\|1b, " $L/*/san/*.log | head -12
tar -czf $OUT/logs-e2.tgz -C /tmp E2; echo "end at $((SECONDS-T0)) s"
