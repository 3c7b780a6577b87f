# Call 4 (final build): timings alone, one after the other — gpu_completion (the early-wake test),
# bench-decode with the PyTorch baselines (gpt-fast style CUDA graph and torch.compile
# reduce-overhead, Hugging Face CUDA graph; PyTorch's time to first token at 512), bench-core,
# bench-async, the serving check (openai wheels carried).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
B=.gpu-bundle/bin; L=/tmp/L4 && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
CUDA_ASYNC_REQUIRE_GPU=1 timeout 60 .gpu-bundle/tests/*--gpu_completion --test-threads=1 > $L/gpu_completion.log 2>&1; echo "gpu_completion exit $? at $((SECONDS-T0)) s"; grep -E "^test result|early wakes|no round" $L/gpu_completion.log
timeout 300 $B/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | tail -30
for b in bench-core bench-async; do timeout 60 $B/$b --json $OUT/$b-h100-final.json > $L/$b.log 2>&1; echo "$b exit $? at $((SECONDS-T0)) s"; grep -E "goals met|correctness|^ *(A|B|1|2|3a|3b|4) " $L/$b.log | tail -10; done
R=$((575-SECONDS+T0)); echo "serve budget $R s"
BIN=.gpu-bundle/bin OUT=$L/serve MODEL_DIR=/tmp/model-1b HEALTH_S=120 LOAD_S=120 timeout $R scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -4 $L/serve-check.log; cp $L/serve/serve-h100.json $OUT/ 2>/dev/null
tar -czf $OUT/logs4.tgz -C $L --exclude model-1b .
