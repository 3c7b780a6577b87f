# Call 1 of the 2026-11-28b session: the context probe (scripts/dev/ctx_probe.cu: what
# cuCtxGetCurrent costs, and which hot-path driver calls need the calling thread's current
# context), then what the previous session left (next-2026-11-28.sh): the attention mutation,
# bench-async/bench-core before (fce9bd2) and after with timers-only runtimes in both orders, the
# WHILE test's memcheck beside 7 neighbours.
( nvcc -O2 scripts/dev/ctx_probe.cu -lcuda -o /tmp/ctx_probe > /tmp/ctx_probe.build 2>&1 && timeout 60 /tmp/ctx_probe ) 2>&1 | tee $OUT/ctx-probe.txt | head -60; cat /tmp/ctx_probe.build | head -5
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/N1; mkdir -p $L; END=$(( $(date +%s) + 570 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 60 .gpu-tar/mut-attn --test-threads=1 > $L/mut-attn.log 2>&1; echo "attention mutation exit $? (nonzero expected): $(grep -hE '^test result|element|row' $L/mut-attn.log | head -2 | cut -c1-200)"
rm -rf /tmp/premove-bin; tar -xJf .gpu-tar/premove.tar.xz -C /tmp
for order in "before after" "after before"; do
  for b in bench-async bench-core; do
    for side in $order; do
      R=$((END-$(date +%s)-200)); [ $R -gt 10 ] || { echo "$b $side: no time"; continue; }
      if [ $side = before ]; then bin=/tmp/premove-bin/$b; else bin=.gpu-bundle/bin/$b; fi
      timeout $((R<90?R:90)) $bin --json $L/$b-$side-${order%% *}.json > $L/$b-$side.log 2>&1; echo "$b $side exit $? at $((SECONDS-T0)) s"
      grep -E "^ *(A|B|3b|4) " $L/$b-$side.log | cut -c1-150
    done
  done
done
GB=$(ls .gpu-bundle/tests/*--gpu_graph_build); G=$(ls .gpu-bundle/tests/*--gpu_graph)
san="compute-sanitizer --tool memcheck --check-device-heap yes --report-api-errors explicit --leak-check no --target-processes application-only --print-limit 50"
for i in 1 2 3 4 5 6 7; do (timeout 150 $san $G --test-threads=1 > $L/neighbour-$i.log 2>&1) & done; sleep 5
timeout 120 $san $GB --test-threads=1 conditional_while_counts_to_n --exact > $L/while-beside-7.log 2>&1; echo "WHILE memcheck beside 7: rc $? $(grep -hE 'ERROR SUMMARY|^test result|ILLEGAL' $L/while-beside-7.log | head -3 | cut -c1-150 | tr '\n' ' ')"
wait
tar -czf $OUT/logs-n1.tgz -C /tmp N1; echo "end at $((SECONDS-T0)) s"  # the JSONs are in the tarball: a call returns at most 8 files
