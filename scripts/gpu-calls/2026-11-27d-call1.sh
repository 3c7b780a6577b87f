# Call 1 of the fourth 2026-11-27 session (bundle in .gpu-tar/commit: the final library of 929beb2
# with the long tests split): conditional_while_counts_to_n under racecheck with the harness's fault
# backtrace (3 runs), once without it under gdb following the sanitizer's child; every test
# executable plainly, alone; then scripts/serve-check.sh (openai wheels carried in .whl).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/D1; mkdir -p $L/plain
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
GB=$(ls .gpu-bundle/tests/*--gpu_graph_build)
for k in 1 2 3; do CUDA_ASYNC_TEST_FAULT_BACKTRACE=1 TOOLS=racecheck OUT=$L/rwhile$k SAN_TIMEOUT=60 SAN_TAG=while$k SAN_ARGS="conditional_while_counts_to_n --exact" scripts/sanitize.sh gpu_graph_build > $L/rwhile$k.log 2>&1; echo "with backtrace, run $k at $((SECONDS-T0)) s: $(head -1 $L/rwhile$k.log | cut -c1-120) | last: $(grep -E 'graph built|instantiated|replayed|FATAL' $L/rwhile$k/san/*.log | tail -1)"; done
grep -h -A30 FATAL $L/rwhile*/san/*.log | head -40
echo "gdb: $(command -v gdb) cuda-gdb: $(command -v cuda-gdb) core_pattern: $(cat /proc/sys/kernel/core_pattern)"
G=$(command -v gdb || command -v cuda-gdb)
[ -n "$G" ] && timeout 90 $G -q -batch -ex 'set follow-fork-mode child' -ex 'set detach-on-fork on' -ex 'set pagination off' -ex 'handle SIGSEGV stop print' -ex run -ex 'info threads' -ex 'bt 30' -ex 'thread apply all bt 12' --args compute-sanitizer --tool racecheck $GB conditional_while_counts_to_n --exact > $L/gdb-while.log 2>&1; echo "gdb run exit $? at $((SECONDS-T0)) s"; grep -vE "^\[New Thread|^\[Thread .* exited" $L/gdb-while.log | grep -A60 -E "SIGSEGV|signal" | head -90
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((330-SECONDS+T0)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|panicked|DROPPED|part [0-9]:|1b prompt|1b, " $L/plain/*.log | head -20
R=$((585-SECONDS+T0)); echo "serve budget $R s"
BIN=.gpu-bundle/bin OUT=$L/serve MODEL_DIR=/tmp/model-1b HEALTH_S=120 LOAD_S=120 timeout $R scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -6 $L/serve-check.log; cp $L/serve/serve-h100.json $OUT/ 2>/dev/null
tar -czf $OUT/logs-d1.tgz -C /tmp --exclude model-1b D1; echo "end at $((SECONDS-T0)) s"
