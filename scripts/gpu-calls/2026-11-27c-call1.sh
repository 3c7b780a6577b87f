# Call 1 of the third 2026-11-27 session, on the bundle of the commit in .gpu-tar/commit.
# 1. Alone, one after the other: gpu_completion (timing-sensitive), gpu_prefill (the tiled kernel's
#    value-loop fix 9c44bb5 and its new test), gpu_attention; llama-server --llama-1b at 32 and
#    256 tokens; the README's main job (bin/llama).
# 2. Then side by side: racecheck of gpu_sampling, every test in a process of its own (the
#    distribution test split per setting; rows_beyond_the_grid's filler rows mostly greedy); the
#    WHILE-node reproduction in plain CUDA C (scripts/repro/while_racecheck.cu) plain, under
#    memcheck and under racecheck; gpu_multi under memcheck, one process per test (which test's
#    process does not end cleanly); racecheck of gpu_completion (the fault child's pending op is
#    now 10 s long).
# 3. In the foreground meanwhile (correctness only, beside the sanitizers): every other test
#    suite of the bundle; the summary line counts all suites of (1) and (3).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C1; mkdir -p $L/plain
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1 RUST_BACKTRACE=1
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for s in gpu_completion gpu_prefill gpu_attention; do suite $s 150; done
grep -hE "early wakes|FAULT" $L/plain/gpu_completion.log | head -4
timeout 90 .gpu-bundle/bin/llama-server --llama-1b > $L/ls32.log 2>&1; echo "llama-server 32 exit $? at $((SECONDS-T0)) s"; tail -3 $L/ls32.log
timeout 150 .gpu-bundle/bin/llama-server --llama-1b --tokens 256 > $L/ls256.log 2>&1; echo "llama-server 256 exit $? at $((SECONDS-T0)) s"; tail -3 $L/ls256.log
timeout 60 .gpu-bundle/bin/llama > $L/llama.log 2>&1; echo "llama (main job) exit $? at $((SECONDS-T0)) s"; tail -4 $L/llama.log
R=$((580-SECONDS+T0))
( nvcc -arch=sm_90 -rdc=true scripts/repro/while_racecheck.cu -lcudadevrt -o /tmp/wr > $L/repro.log 2>&1
  for m in while while1 if; do
    for tool in plain memcheck racecheck; do
      if [ $tool = plain ]; then timeout 60 /tmp/wr $m >> $L/repro.log 2>&1; else timeout 90 compute-sanitizer --tool $tool /tmp/wr $m >> $L/repro.log 2>&1; fi
      echo "repro $m $tool: exit $?" >> $L/repro.log
    done
  done ) &
( OUT=$L CALL_S=$R TOOL=memcheck P=4 bash scripts/gpu-calls/next-sanitize.sh gpu_multi > $L/multi.log 2>&1; echo "multi done at $((SECONDS-T0)) s" >> $L/multi.log ) &
( OUT=$L CALL_S=$R TOOL=racecheck P=8 bash scripts/gpu-calls/next-sanitize.sh gpu_sampling > $L/sampling.log 2>&1; echo "sampling done at $((SECONDS-T0)) s" >> $L/sampling.log ) &
( TOOLS=racecheck OUT=$L/rc-completion SAN_TIMEOUT=$R scripts/sanitize.sh gpu_completion > $L/rc-completion.log 2>&1 ) &
for t in .gpu-bundle/tests/*; do
  s=${t##*--}; [ -f $L/plain/$s.log ] && continue
  left=$((570-SECONDS+T0)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }
  suite $s $left
done
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|panicked" $L/plain/*.log | head -10
wait
echo "== repro"; grep -E "repro|error|Error|ERROR SUMMARY|RACECHECK" $L/repro.log | head -40
echo "== multi"; grep -E "memcheck:|done" $L/multi.log
echo "== sampling"; grep -E "racecheck:|done" $L/sampling.log
echo "== rc-completion"; head -12 $L/rc-completion.log
tar -czf $OUT/logs-c1.tgz -C /tmp C1 LS-memcheck-gpu_multi LS-racecheck-gpu_sampling 2>/dev/null; echo "end at $((SECONDS-T0)) s"
