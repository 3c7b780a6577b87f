# Call 7 of the fifth 2026-11-27 session (bundle of .gpu-tar/commit, the final build): racecheck of
# gpu_server::concurrent_requests_equal_their_replays_part0 alone on the GPU (it never finished
# beside other sanitizer processes), bounded by one deadline.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/E7; mkdir -p $L; END=$(( $(date +%s) + 575 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
bash scripts/gpu-calls/san-job.sh racecheck gpu_server concurrent_requests_equal_their_replays_part0 $END $L
grep -h "^test result\|part 0\|ERROR SUMMARY" $L/*/san/*.log | head -5
tar -czf $OUT/logs-e7.tgz -C /tmp E7; echo "end at $((SECONDS-T0)) s"
