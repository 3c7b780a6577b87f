# Call 2 of the 2026-11-28c session (bundle of .gpu-tar/commit = 308a145, whose library and tests
# are those of the final commit 2b98042): bench-decode with the PyTorch baselines first, on a quiet
# GPU (decode.md's headline on the final library); every test executable alone (the bundle
# summary); the README's main command (bin/llama); llama-server --llama-1b at 32 tokens (its own
# check). The template is 2026-11-28b-call5.sh.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C2; mkdir -p $L/plain; END=$(( $(date +%s) + 560 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 230 .gpu-bundle/bin/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100-2b98042.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | grep -E "^ +(1|16|64) |await|early|CPU|OS floor|first token|copy|reduce-overhead|^batch" | head -24 | cut -c1-220
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((END-$(date +%s)-75)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done 2>&1 | grep -E "gpu_|exit [1-9]|no time"
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "^test .*FAILED|failed:|panicked" $L/plain/*.log | head -10
grep -hE "current after|1b: |rows 12|rows 64|bf16" $L/plain/gpu_interop.log $L/plain/gpu_llama.log | head -12 | cut -c1-220
R=$((END-$(date +%s)+10)); timeout $((R<45?R:45)) .gpu-bundle/bin/llama > $L/llama.log 2>&1; echo "bin/llama (README main command) exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$" $L/llama.log | tail -6 | cut -c1-200
R=$((END-$(date +%s)+25)); timeout $((R<60?R:60)) .gpu-bundle/bin/llama-server --llama-1b > $L/ls32.log 2>&1; echo "llama-server --llama-1b exit $? at $((SECONDS-T0)) s"; tail -1 $L/ls32.log | cut -c1-250
tar -czf $OUT/logs-c2.tgz -C /tmp C2; echo "end at $((SECONDS-T0)) s"
