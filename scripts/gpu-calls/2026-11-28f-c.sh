# Call c of the sixth 2026-11-28 session (docs/results/gpu-runs-2026-11-28f.md): the eleven tests of
# gpu_llama and gpu_server whose racecheck did not finish in call b (timeout, or the process killed
# with 8 sanitizer processes beside it), under racecheck limited to the first $N kernel launches of
# each process (compute-sanitizer --launch-count; the rest of the test runs unchecked), 6 at a time.
# Carry .gpu-tar (bundle of 836a253).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
N=${N:-2500}; T0=$SECONDS; L=/tmp/Nc; mkdir -p $L/r; END=$(( $(date +%s) + ${BUDGET:-470} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
(python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $?") &
python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $?"; wait
export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall SAN_TOOL_ARGS="--launch-count $N"
printf '%s\n' "gpu_llama hf_reference_1b_prompt1" "gpu_llama hf_reference_1b_prompt2" "gpu_llama hf_reference_1b_rows12" \
  "gpu_llama hf_reference_1b_rows64" "gpu_llama hf_reference_large_buckets" "gpu_llama hf_reference_small_cublas" \
  "gpu_llama rows_equal_alone_in_their_bucket" "gpu_server concurrent_requests_equal_their_replays_part0" \
  "gpu_server concurrent_requests_equal_their_replays_part1" "gpu_server concurrent_requests_equal_their_replays_part2" \
  "gpu_server http_request_and_debug_replay" > $L/rjobs
xargs -P ${P:-6} -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$((END-10)) $L/r"' ' < $L/rjobs > $L/r.out 2>&1
cat $L/r.out | cut -c1-230
echo "racecheck ended at $((SECONDS-T0)) s: $(grep -l ' racecheck.*: ok' $L/r/*.log | wc -l) of $(wc -l < $L/rjobs) ok"
for f in $L/r/*.log; do grep -q ' racecheck.*: ok' $f || echo "  not ok: $(grep -E 'racecheck' $f | tail -1 | cut -c1-230)"; done
tar -czf $OUT/logs-nc.tgz -C /tmp --exclude ref1b --exclude refsmall Nc; echo "end at $((SECONDS-T0)) s"
