# Call 3 of the 2026-11-28 session: issue 20's "ratios unchanged", measured side by side on one
# machine. The four comparison benchmarks built at fce9bd2 (the soundness-round-3 build of
# 2026-11-24, before the house move; .gpu-tar/premove.tar.xz, built here with cargo build
# --release) and the same four from the bundle of .gpu-tar/commit (after the move), alternating
# before/after per benchmark, each with its own JSON. One deadline for all.
T0=$SECONDS; L=/tmp/F3; mkdir -p $L; END=$(( SECONDS + 540 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
rm -rf /tmp/premove-bin; tar -xJf .gpu-tar/premove.tar.xz -C /tmp; cat /tmp/premove-bin/commit
export CUDA_ASYNC_REQUIRE_GPU=1
for b in bench-core bench-async bench-graph bench-completion; do
  for side in before after; do
    R=$((END-SECONDS)); [ $R -gt 10 ] || { echo "$b $side: no time"; continue; }
    if [ $side = before ]; then bin=/tmp/premove-bin/$b; else bin=.gpu-bundle/bin/$b; fi
    timeout $((R<90?R:90)) $bin --json $OUT/$b-$side.json > $L/$b-$side.log 2>&1; echo "$b $side exit $? at $((SECONDS-T0)) s"
    grep -E "goals met|correct|^ *(F[0-9]|[0-9][ab]?|A|B|C) " $L/$b-$side.log | tail -12 | cut -c1-170
  done
done
tar -czf $OUT/logs-f3.tgz -C /tmp F3; echo "end at $((SECONDS-T0)) s"
