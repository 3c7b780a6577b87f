# Call 5 of the third 2026-11-27 session (bundle in .gpu-tar/commit), alone and one after the
# other: the exit-drain mutation (a gpu_graph_build binary built with the atexit registration
# removed, carried in .gpu-tar/mutants: deferred_drops_finish_before_exit must fail with it and
# pass with the real one); bench-decode with the PyTorch baselines on the final library; the
# serving check (openai wheels carried in .whl).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
B=.gpu-bundle/bin; L=/tmp/C5 && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
for exe in .gpu-tar/mutants/gpu_graph_build-no-exit-drain $(ls .gpu-bundle/tests/*--gpu_graph_build); do
  timeout 60 $exe deferred_drops_finish_before_exit --exact --test-threads=1 > $L/drain.log 2>&1; echo "${exe##*/}: exit $?: $(grep -hE '^test result|child:|exited before' $L/drain.log | tr '\n' ' ')"
done
timeout 300 $B/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | tail -34
R=$((580-SECONDS+T0)); echo "serve budget $R s"
BIN=.gpu-bundle/bin OUT=$L/serve MODEL_DIR=/tmp/model-1b HEALTH_S=120 LOAD_S=120 timeout $R scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -6 $L/serve-check.log; cp $L/serve/serve-h100.json $OUT/ 2>/dev/null
tar -czf $OUT/logs-c5.tgz -C /tmp --exclude model-1b C5; echo "end at $((SECONDS-T0)) s"
