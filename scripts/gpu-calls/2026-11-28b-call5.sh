# Call 5 of the 2026-11-28b session (bundle of .gpu-tar/commit, the final build): bench-decode with
# the PyTorch baselines first, on a quiet GPU (the headline of decode.md); bench-core and
# bench-graph before (fce9bd2) / after, once each; every test executable alone; llama-server
# --llama-1b at 32 tokens (its own check).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/N5; mkdir -p $L/plain; END=$(( $(date +%s) + 540 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 230 .gpu-bundle/bin/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | grep -E "^ +(1|16|64) |await|early|CPU|OS floor|first token|copy|reduce-overhead|^batch" | head -24 | cut -c1-220
rm -rf /tmp/premove-bin; tar -xJf .gpu-tar/premove.tar.xz -C /tmp
for b in bench-core bench-graph; do
  for side in before after; do
    if [ $side = before ]; then bin=/tmp/premove-bin/$b; else bin=.gpu-bundle/bin/$b; fi
    timeout 60 $bin --json $L/$b-$side.json > $L/$b-$side.log 2>&1; echo "$b $side exit $? at $((SECONDS-T0)) s"
    grep -E "^ *(A|B) |^6 set_param, |^5 await" $L/$b-$side.log | cut -c1-150
  done
done
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((END-$(date +%s)-30)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done 2>&1 | grep -E "gpu_|exit [1-9]|no time"
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "^test .*FAILED|failed:" $L/plain/*.log | head -10
grep -hE "calls_on_handles|1b: |rows 12|rows 64|bf16" $L/plain/gpu_interop.log $L/plain/gpu_llama.log | head -12 | cut -c1-220
R=$((END-$(date +%s)+25)); timeout $((R<60?R:60)) .gpu-bundle/bin/llama-server --llama-1b > $L/ls32.log 2>&1; echo "llama-server --llama-1b exit $? at $((SECONDS-T0)) s"; tail -1 $L/ls32.log | cut -c1-250
tar -czf $OUT/logs-n5.tgz -C /tmp N5; echo "end at $((SECONDS-T0)) s"
