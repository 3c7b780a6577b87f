# Call 3 of the third 2026-11-27 session (bundle in .gpu-tar/commit):
# 1. gpu_llama plain, alone (fused_products_match_host's norm_f32 bound now includes rounding
#    flips of the normalised row; it failed once in call 2).
# 2. Side by side, every test in a process of its own: racecheck of gpu_server, gpu_llama and
#    gpu_sampling's six distribution tests (now 5,000 draws); memcheck of gpu_llama; racecheck of
#    gpu_graph_build::conditional_while_counts_to_n (now printing its progress), and the CUDA C
#    reproduction's new "edges" mode plain and under racecheck.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C3; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1 RUST_BACKTRACE=1
exe=$(ls .gpu-bundle/tests/*--gpu_llama | head -1)
timeout 150 $exe --test-threads=1 > $L/plain-gpu_llama.log 2>&1; echo "gpu_llama plain exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain-gpu_llama.log)"
grep -A3 "^---- " $L/plain-gpu_llama.log | head
R=$((585-SECONDS+T0))
mk() { local suite=$1; shift; local e=$(ls .gpu-bundle/tests/*--$suite | head -1); "$e" --list 2>/dev/null | sed -n 's/: test$//p' | sed 's/^\[gpu\] //' | while read -r t; do echo "$suite $t"; done; }
{ mk gpu_server; mk gpu_llama; mk gpu_sampling | grep distribution_; } > $L/rjobs
mk gpu_llama > $L/mjobs
run_jobs() { local tool=$1 p=$2 jobs=$3; xargs -P $p -L 1 sh -c 'TOOLS='"$tool"' OUT='"$L"'/'"$tool"'-$0-$1 SAN_TIMEOUT='"$R"' SAN_TAG=$1 SAN_ARGS="$1 --exact" scripts/sanitize.sh $0 > '"$L"'/'"$tool"'-$0-$1.log 2>&1' < $jobs; }
run_jobs racecheck 20 $L/rjobs &
run_jobs memcheck 6 $L/mjobs &
( TOOLS=racecheck OUT=$L/rwhile SAN_TIMEOUT=120 SAN_TAG=while SAN_ARGS="conditional_while_counts_to_n --exact" scripts/sanitize.sh gpu_graph_build > $L/rwhile.log 2>&1
  nvcc -arch=sm_90 -rdc=true scripts/repro/while_racecheck.cu -lcudadevrt -o /tmp/wr > $L/repro.log 2>&1
  timeout 60 /tmp/wr edges >> $L/repro.log 2>&1; echo "repro edges plain: exit $?" >> $L/repro.log
  timeout 120 compute-sanitizer --tool racecheck /tmp/wr edges >> $L/repro.log 2>&1; echo "repro edges racecheck: exit $?" >> $L/repro.log ) &
wait
echo "== rwhile"; head -3 $L/rwhile.log; grep -E "graph built|instantiated|replayed|WHILE ran|Error|error" $L/rwhile/san/*.log | head
echo "== repro"; cat $L/repro.log | grep -vE "^\s*$" | tail -12
echo "== racecheck"; for f in $L/racecheck-*.log; do echo "${f##*/racecheck-}: $(grep -E 'racecheck:' $f | sed 's/.*racecheck: //' | cut -c1-150)"; done
echo "== memcheck"; for f in $L/memcheck-*.log; do echo "${f##*/memcheck-}: $(grep -E 'memcheck:' $f | sed 's/.*memcheck: //' | cut -c1-150)"; done
tar -czf $OUT/logs-c3.tgz -C /tmp C3; echo "end at $((SECONDS-T0)) s"
