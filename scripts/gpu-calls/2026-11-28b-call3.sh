# Call 3 of the 2026-11-28b session (bundle of .gpu-tar/commit, the final library): bench-decode
# with the PyTorch baselines (the headline of decode.md; the awaited row now with the early-woken
# spin reading its progress mark), the same awaited rows on timers-only tokio runtimes (A/B of the
# I/O driver), bench-completion and bench-graph before (fce9bd2) / after in both orders,
# llama-server --llama-1b at 32 tokens (its own check), and, if perf is there, user-space
# instructions per launch of bench-core before / after.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/N3; mkdir -p $L; END=$(( $(date +%s) + 575 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 230 .gpu-bundle/bin/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | grep -E "batch|await|early|CPU|OS floor|first token|^ +(1|16|64) |copy|gpt|torch|ms" | head -40 | cut -c1-220
timeout 60 .gpu-bundle/bin/bench-decode --timers-only --batches 1 --ttft 128 --no-torch --json $L/bench-decode-timers-only.json > $L/bench-decode-timers.log 2>&1; echo "bench-decode --timers-only exit $? at $((SECONDS-T0)) s"; grep -E "await|early|CPU|OS floor" $L/bench-decode-timers.log | cut -c1-220
rm -rf /tmp/premove-bin; tar -xJf .gpu-tar/premove.tar.xz -C /tmp
for order in "before after" "after before"; do
  for b in bench-completion bench-graph; do
    for side in $order; do
      R=$((END-$(date +%s)-100)); [ $R -gt 10 ] || { echo "$b $side: no time"; continue; }
      if [ $side = before ]; then bin=/tmp/premove-bin/$b; else bin=.gpu-bundle/bin/$b; fi
      timeout $((R<60?R:60)) $bin --json $L/$b-$side-${order%% *}.json > $L/$b-$side.log 2>&1; echo "$b $side exit $? at $((SECONDS-T0)) s: $(grep -E 'goals met' $L/$b-$side.log | tail -1)"
    done
  done
done
grep -E "F1 64 tasks vs 64 raw threads, launch \+ synchronize  |cpu" $L/bench-completion-*.log | head -8 | cut -c1-200
R=$((END-$(date +%s)-40)); timeout $((R<100?R:100)) .gpu-bundle/bin/llama-server --llama-1b > $L/ls32.log 2>&1; echo "llama-server --llama-1b exit $? at $((SECONDS-T0)) s"; tail -3 $L/ls32.log | cut -c1-250
if command -v perf > /dev/null; then
  for side in before after; do
    if [ $side = before ]; then bin=/tmp/premove-bin/bench-core; else bin=.gpu-bundle/bin/bench-core; fi
    for n in 100000 300000; do
      R=$((END-$(date +%s)-5)); [ $R -gt 10 ] || break
      timeout $((R<30?R:30)) perf stat -x, -e instructions:u,cycles:u -o $L/perf-$side-$n.txt $bin --launches $n --roundtrips 10 --repeats 3 > /dev/null 2>&1; echo "perf $side $n: $(grep -E 'instructions|cycles' $L/perf-$side-$n.txt | cut -d, -f1,3 | tr '\n' ' ')"
    done
  done
else echo "no perf on this host"; fi
tar -czf $OUT/logs-n3.tgz -C /tmp N3; echo "end at $((SECONDS-T0)) s"
