# Call 6 of the 2026-11-28 session, the final build (bundle of .gpu-tar/commit: the leaner decode
# attention tile; the tensor-core products out of the library again): every test executable
# plainly, alone; llama-server --llama-1b at 32 and 256 tokens per request (its own check: every
# served token equals its row replayed alone in its bucket); then memcheck of gpu_prefill (the
# cached attention variant changed too) and of gpu_llama's large-bucket Hugging Face test, racecheck
# of gpu_prefill's token-by-token test, until one deadline.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/F6; mkdir -p $L/plain; END=$(( $(date +%s) + 575 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((240-SECONDS+T0)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done 2>&1 | grep -E "gpu_|exit [1-9]|no time"
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|failed:" $L/plain/*.log | head -10
timeout 80 .gpu-bundle/bin/llama-server --llama-1b > $L/ls32.log 2>&1; echo "llama-server tokens 32 exit $? at $((SECONDS-T0)) s"; tail -3 $L/ls32.log | cut -c1-250
timeout 110 .gpu-bundle/bin/llama-server --llama-1b --tokens 256 > $L/ls256.log 2>&1; echo "llama-server tokens 256 exit $? at $((SECONDS-T0)) s"; tail -3 $L/ls256.log | cut -c1-250
bash scripts/gpu-calls/san-job.sh memcheck gpu_prefill ALL $((END-150)) $L
bash scripts/gpu-calls/san-job.sh racecheck gpu_prefill prefill_matches_token_by_token $((END-60)) $L
bash scripts/gpu-calls/san-job.sh memcheck gpu_llama hf_reference_large_buckets $END $L
cp $L/ls32.log $L/ls256.log $OUT/ 2>/dev/null
tar -czf $OUT/logs-f6.tgz -C /tmp F6 2>/dev/null; ls -la $OUT; echo "end at $((SECONDS-T0)) s"
