# Call 5 of the 2026-11-28 session: (1) gpu_mma built from the working tree after call 4
# (.gpu-tar/gpu_mma-diag: the SwiGLU-vs-plain diagnostic test added, the refusals test's scratch
# shape fixed); (2) the house-move benchmarks again, this time after-then-before per benchmark;
# (3) memcheck and racecheck of gpu_attention on the bundle of .gpu-tar/commit (the leaner decode
# attention tile). One deadline for all.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/F5; mkdir -p $L; END=$(( $(date +%s) + 560 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 60 .gpu-tar/gpu_mma-diag --test-threads=1 > $L/mma-diag.log 2>&1; echo "gpu_mma (diag build) exit $? at $((SECONDS-T0)) s"; grep -E "^test |^test result|element|accepted|differs|needs" $L/mma-diag.log | grep -v "seed" | head -20 | cut -c1-400
rm -rf /tmp/premove-bin; tar -xJf .gpu-tar/premove.tar.xz -C /tmp
for b in bench-core bench-async bench-graph bench-completion; do
  for side in after before; do
    R=$((END-$(date +%s)-200)); [ $R -gt 10 ] || { echo "$b $side: no time"; continue; }
    if [ $side = before ]; then bin=/tmp/premove-bin/$b; else bin=.gpu-bundle/bin/$b; fi
    timeout $((R<90?R:90)) $bin --json $OUT/$b-$side-2.json > $L/$b-$side.log 2>&1; echo "$b $side exit $? at $((SECONDS-T0)) s"
    grep -E "goals met" $L/$b-$side.log | tail -1
  done
done
bash scripts/gpu-calls/san-job.sh memcheck gpu_attention ALL $((END-100)) $L
bash scripts/gpu-calls/san-job.sh racecheck gpu_attention ALL $END $L
tar -czf $OUT/logs-f5.tgz -C /tmp F5; echo "end at $((SECONDS-T0)) s"
