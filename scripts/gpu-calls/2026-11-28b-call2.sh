# Call 2 of the 2026-11-28b session (bundle of .gpu-tar/commit: no context check on calls that only
# use existing handles; the early-woken await reads its progress mark): gpu_interop first (its new
# test), bench-core and bench-async before (fce9bd2) and after in both orders, every test
# executable alone, the README's main command (bin/llama), llama-server --llama-1b at 32 tokens.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/N2; mkdir -p $L/plain; END=$(( $(date +%s) + 575 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
I=$(ls .gpu-bundle/tests/*--gpu_interop); timeout 60 $I --test-threads=1 > $L/interop.log 2>&1; echo "gpu_interop exit $?: $(grep -E '^test result' $L/interop.log)"; grep -E "calls_on_handles|objects_land" $L/interop.log | cut -c1-200
rm -rf /tmp/premove-bin; tar -xJf .gpu-tar/premove.tar.xz -C /tmp
for order in "before after" "after before"; do
  for b in bench-async bench-core; do
    for side in $order; do
      R=$((END-$(date +%s)-330)); [ $R -gt 10 ] || { echo "$b $side: no time"; continue; }
      if [ $side = before ]; then bin=/tmp/premove-bin/$b; else bin=.gpu-bundle/bin/$b; fi
      timeout $((R<90?R:90)) $bin --json $L/$b-$side-${order%% *}.json > $L/$b-$side.log 2>&1; echo "$b $side exit $? at $((SECONDS-T0)) s"
      grep -E "^ *(A|B|1|3a|3b|4) " $L/$b-$side.log | cut -c1-150
    done
  done
done
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((END-$(date +%s)-75)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done 2>&1 | grep -E "gpu_|exit [1-9]|no time"
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|failed:|panicked" $L/plain/*.log | head -10
R=$((END-$(date +%s)-10)); timeout $((R<60?R:60)) .gpu-bundle/bin/llama > $L/llama.log 2>&1; echo "bin/llama (README main command) exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$" $L/llama.log | tail -14 | cut -c1-200
tar -czf $OUT/logs-n2.tgz -C /tmp N2; echo "end at $((SECONDS-T0)) s"
