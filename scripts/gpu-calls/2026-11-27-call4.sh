# The device command of call 4 of 2026-11-27 (docs/results/gpu-runs-2026-11-27.md), run as
# `bash .gpu-tar/callB.sh` with the bundle packed in .gpu-tar/bundle.tar.xz (carried).
tar -xJf .gpu-tar/bundle.tar.xz && B=.gpu-bundle/bin && L=/tmp/L && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 330 $B/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | tail -32
BIN=$B OUT=$L/serve MODEL_DIR=/tmp/model-1b HEALTH_S=90 LOAD_S=90 timeout 150 scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -14 $L/serve-check.log; cp $L/serve/serve-h100.json $OUT/
R=$((565-SECONDS+T0)); echo "last phase: $R s"
(timeout $R $B/llama-server --llama-1b --tokens 256 > $L/ls256.log 2>&1; echo "exit $?" >> $L/ls256.log) &
(CUDA_ASYNC_REQUIRE_GPU=1 timeout $R .gpu-bundle/tests/*gpu_llama --test-threads=1 hf_reference_1b > $L/llama1b.log 2>&1; echo "exit $?" >> $L/llama1b.log) &
(TOOLS=memcheck OUT=$L/mc SAN_TIMEOUT=$R scripts/sanitize.sh gpu_server > $L/mc.log 2>&1) &
(TOOLS=racecheck OUT=$L/rc SAN_TIMEOUT=$R scripts/sanitize.sh gpu_kernel_bounds > $L/rc.log 2>&1) &
wait; for f in ls256 llama1b mc rc; do echo "== $f"; tail -6 $L/$f.log; done
tar -czf $OUT/logsB.tgz -C $L .
