# The fifth 2026-11-28 session's last device call (after 2026-11-28e.sh a and b), on the same
# bundle (.gpu-tar/bundle.tar.xz of a347f15) plus .gpu-tar/gpu_sampling-new, the gpu_sampling
# test executable of the commit after it (only that test changed: full_vocabulary_rows draws an
# ambiguous row again instead of allowing two per launch):
#   gpu_sampling whole, full_vocabulary_rows five more times (new seeds); racecheck of gpu_graph
#   (one process per test, 6 at a time: the whole suite ran past call a's time) and of the new
#   argmax test.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/Ec; mkdir -p $L/r; END=$(( $(date +%s) + ${1:-380} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
cp .gpu-tar/gpu_sampling-new .gpu-bundle/tests/cuda-async-tests--test--gpu_sampling
S=.gpu-bundle/tests/cuda-async-tests--test--gpu_sampling
timeout 120 $S --test-threads=1 > $L/gpu_sampling.log 2>&1; echo "gpu_sampling exit $?: $(grep '^test result' $L/gpu_sampling.log)"; grep -hE "FAILED: |drawn again" $L/gpu_sampling.log | head -4 | cut -c1-200
for i in 1 2 3 4 5; do timeout 40 $S full_vocabulary_rows --exact > $L/fv$i.log 2>&1; echo "full_vocabulary_rows run $i exit $?: $(grep -hE 'drawn again|FAILED: ' $L/fv$i.log | head -2 | tr '\n' ' ')"; done
echo "plain done at $((SECONDS-T0)) s"
G=$(ls .gpu-bundle/tests/*--gpu_graph); $G --list 2>&1 | sed -nE 's/^\[gpu\] ([a-z_0-9]+): test$/\1/p' > $L/gtests
{ sed 's/^/gpu_graph /' $L/gtests; echo "gpu_sampling argmax_matches_host"; } > $L/rjobs
echo "racecheck jobs: $(wc -l < $L/rjobs)"
xargs -P 6 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$((END-10)) $L/r"' ' < $L/rjobs > $L/r.out 2>&1
echo "racecheck ended at $((SECONDS-T0)) s: $(grep -l ' racecheck: ok' $L/r/*.log | wc -l) of $(wc -l < $L/rjobs) ok"
for f in $L/r/*.log; do grep -q ' racecheck: ok' $f || echo "  not ok: $(grep -E 'racecheck: ' $f | tail -1 | cut -c1-230)"; done
tar -czf $OUT/logs-ec.tgz -C /tmp Ec; echo "end at $((SECONDS-T0)) s"
