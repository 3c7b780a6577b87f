# Call 7 of the 2026-11-28 session (bundle of .gpu-tar/commit, the final build 14c45a0): bench-decode
# with the PyTorch baselines, the headline command of decode.md, then memcheck of gpu_llama's
# small-shape Hugging Face test until one deadline (the budget's last ~250 s).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/F7; mkdir -p $L; END=$(( $(date +%s) + 215 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 180 .gpu-bundle/bin/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | tail -30 | cut -c1-220
bash scripts/gpu-calls/san-job.sh memcheck gpu_llama hf_reference_small $END $L
cp $L/bench-decode.log $OUT/; tar -czf $OUT/logs-f7.tgz -C /tmp F7 2>/dev/null; echo "end at $((SECONDS-T0)) s"
