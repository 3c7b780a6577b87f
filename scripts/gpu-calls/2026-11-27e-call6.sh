# Call 6 of the fifth 2026-11-27 session (bundle of .gpu-tar/commit, the final build): ncu over one
# batch-1 decode step and a 512-token prefill; llama-server --llama-1b at 32 tokens; then the WHILE
# test's memcheck failure of call 4 (an illegal address at its first replay, beside 7 other
# memcheck processes; the suite's later tests then failed on the poisoned context): the test
# plainly 30 times, under memcheck alone 3 times, under memcheck beside a memcheck neighbour 3
# times, the CUDA C reproduction under memcheck beside the same neighbour 3 times; memcheck of the
# rest of gpu_graph_build; then racecheck of rows_equal_alone_in_their_bucket until the deadline.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/E6; mkdir -p $L; END=$(( $(date +%s) + 570 )); B=.gpu-bundle/bin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 110 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv $B/bench-decode --profile --batches 1 --ttft 512 > $OUT/ncu-final.csv 2> $L/ncu.err; echo "ncu exit $? at $((SECONDS-T0)) s, $(wc -l < $OUT/ncu-final.csv) lines"; tail -2 $L/ncu.err
timeout 90 $B/llama-server --llama-1b > $L/ls32.log 2>&1; echo "llama-server 32 exit $? at $((SECONDS-T0)) s"; tail -1 $L/ls32.log
GB=$(ls .gpu-bundle/tests/*--gpu_graph_build); G=$(ls .gpu-bundle/tests/*--gpu_graph)
san="compute-sanitizer --tool memcheck --report-api-errors explicit --leak-check no --target-processes application-only --print-limit 50"
ok=0; for i in $(seq 30); do timeout 20 $GB --test-threads=1 conditional_while_counts_to_n --exact > $L/plain-while.log 2>&1 && ok=$((ok+1)); done; echo "WHILE plain: $ok of 30 passed at $((SECONDS-T0)) s"
for i in 1 2 3; do timeout 40 $san $GB --test-threads=1 conditional_while_counts_to_n --exact > $L/mc-alone-$i.log 2>&1; echo "WHILE memcheck alone $i: rc $? $(grep -hE 'ERROR SUMMARY|^test result' $L/mc-alone-$i.log | tr '\n' ' ')"; done
timeout 60 nvcc -arch=sm_90 -rdc=true scripts/repro/while_racecheck.cu -lcudadevrt -o /tmp/while_repro > $L/repro-build.log 2>&1; echo "repro build rc $?"
for i in 1 2 3; do (timeout 45 $san $G --test-threads=1 > $L/neighbour-$i.log 2>&1) & sleep 5
  timeout 30 $san $GB --test-threads=1 conditional_while_counts_to_n --exact > $L/mc-beside-$i.log 2>&1; echo "WHILE memcheck beside a neighbour $i: rc $? $(grep -hE 'ERROR SUMMARY|^test result|ILLEGAL' $L/mc-beside-$i.log | head -3 | cut -c1-120 | tr '\n' ' ')"
  [ -x /tmp/while_repro ] && { timeout 30 $san /tmp/while_repro while > $L/repro-beside-$i.log 2>&1; echo "  repro beside it: rc $? $(grep -hE 'ERROR SUMMARY|ILLEGAL' $L/repro-beside-$i.log | head -2 | cut -c1-120 | tr '\n' ' ')"; }
  wait; echo "  neighbour: $(grep -hE 'ERROR SUMMARY|^test result' $L/neighbour-$i.log | tr '\n' ' ' | cut -c1-160)"; done
timeout 60 $san $GB --test-threads=1 --skip conditional_while_counts_to_n > $L/mc-rest.log 2>&1; echo "gpu_graph_build memcheck without the WHILE test: rc $? $(grep -hE 'ERROR SUMMARY|^test result' $L/mc-rest.log | tr '\n' ' ')"
echo "racecheck from $((SECONDS-T0)) s"; bash scripts/gpu-calls/san-job.sh racecheck gpu_llama rows_equal_alone_in_their_bucket $END $L
tar -czf $OUT/logs-e6.tgz -C /tmp E6; echo "end at $((SECONDS-T0)) s"
