# Call 1 of the fifth 2026-11-27 session (bundle in .gpu-tar/commit: the final library f9693e9):
# the two mutation builds of gpu_interop (cached bind restored; 16-byte check removed) must fail
# their tests; every test executable plainly, alone; scripts/serve-check.sh (openai wheels in
# .whl); bench-core for the per-call context check. Every step bounded by one deadline.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/E1; mkdir -p $L/plain; END=$((T0+575))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
for m in bind:objects_land_in_our_context_after_cudarc_switches_it align:wrap_checks; do
  timeout 30 .gpu-tar/mut-${m%%:*} --test-threads=1 ${m#*:} --exact > $L/mut-${m%%:*}.log 2>&1; echo "mutation ${m%%:*} exit $? (nonzero expected): $(grep -hE '^test result|panicked|Error|refused' $L/mut-${m%%:*}.log | head -3 | cut -c1-200)"; done
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((260-SECONDS+T0)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|panicked|DROPPED|part [0-9]:|1b prompt|1b, " $L/plain/*.log | head -20
R=$((END-60-SECONDS)); echo "serve budget $R s"
BIN=.gpu-bundle/bin OUT=$L/serve MODEL_DIR=/tmp/model-1b HEALTH_S=120 LOAD_S=120 timeout $R scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -8 $L/serve-check.log; cp $L/serve/serve-h100.json $OUT/ 2>/dev/null
R=$((END-SECONDS)); [ $R -gt 15 ] && { timeout $R .gpu-bundle/bin/bench-core --json $OUT/bench-core.json > $L/bench-core.log 2>&1; echo "bench-core exit $? at $((SECONDS-T0)) s"; grep -E "goals met|correct|^ *(A|B|C) " $L/bench-core.log | tail -8; }
tar -czf $OUT/logs-e1.tgz -C /tmp --exclude model-1b E1; echo "end at $((SECONDS-T0)) s"
