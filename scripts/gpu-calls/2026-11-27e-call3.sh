# Call 3 of the fifth 2026-11-27 session (bundle of .gpu-tar/commit: early weight loads in the
# decode products and the eight-warp decode attention): bench-decode --no-torch alone under the
# four settings (CUDA_ASYNC_GEMV_PRELOAD 1/0 x CUDA_ASYNC_ATTN_WARPS 8/4), the products lab; then
# the mutation build of gpu_llama (plain products load weights early); every test executable
# plainly; then llama-server --llama-1b at 32 tokens. One deadline for all.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/E3; mkdir -p $L/plain; END=$((T0+570)); B=.gpu-bundle/bin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
for c in "1 8" "0 8" "1 4" "0 4"; do set -- $c; R=$((END-300-SECONDS)); [ $R -gt 20 ] || { echo "preload $1 warps $2: no time"; continue; }
  CUDA_ASYNC_GEMV_PRELOAD=$1 CUDA_ASYNC_ATTN_WARPS=$2 timeout $((R<90?R:90)) $B/bench-decode --no-torch --ttft 512 --json $OUT/bd-p$1-w$2.json > $L/bd-p$1-w$2.log 2>&1
  echo "preload $1 warps $2 exit $? at $((SECONDS-T0)) s"; grep -E "attention:|^ *(1|16|64) |ttft|TTFT|await" $L/bd-p$1-w$2.log | head -12; done
timeout 60 nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda scripts/dev/gemv_lab.cu -o /tmp/gemv_lab > $L/lab-build.log 2>&1 && timeout 40 /tmp/gemv_lab > $L/lab.log 2>&1; echo "lab exit $? at $((SECONDS-T0)) s"; grep -E "all|differ" $L/lab.log
timeout 60 .gpu-tar/mut-early --test-threads=1 products_wait_for_weights_written_ahead --exact > $L/mut-early.log 2>&1; echo "mutation early (plain products load weights early) exit $? (nonzero expected): $(grep -hE '^test result|round [0-9]+' $L/mut-early.log | head -2 | cut -c1-200)"
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((END-60-SECONDS)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done 2>&1 | grep -vE "ok. 0 passed|exit 0 .* ok\. [0-9]+ passed; 0 failed" 
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|panicked at|1b prompt [0-9]:|1b, |part [0-9]:|largest relative" $L/plain/*.log | grep -v "gpu_async.rs\|gpu_graph.rs\|gpu_soundness.rs\|gpu_wakers.rs" | head -20
R=$((END-SECONDS)); [ $R -gt 20 ] && { timeout $R $B/llama-server --llama-1b > $L/ls32.log 2>&1; echo "llama-server 32 exit $? at $((SECONDS-T0)) s"; tail -3 $L/ls32.log; }
tar -czf $OUT/logs-e3.tgz -C /tmp E3; echo "end at $((SECONDS-T0)) s"
