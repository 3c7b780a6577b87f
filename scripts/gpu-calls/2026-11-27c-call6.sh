# Call 6 of the third 2026-11-27 session (bundle in .gpu-tar/commit): the sanitizer runs that did
# not finish beside 6 others in call 4, now 4 side by side: racecheck of
# gpu_server::concurrent_requests_equal_their_replays, gpu_llama::hf_reference_1b and
# gpu_llama::rows_equal_alone_in_their_bucket; memcheck of gpu_llama::hf_reference_1b. Beside
# them, light: memcheck of the whole gpu_multi suite (its process exit, with the exit drain), and
# conditional_while_counts_to_n under racecheck four times without the fault backtrace (it died
# in 4 of 4 runs before the backtrace handler, passed in the 1 run with it).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C6; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
R=$((585-SECONDS+T0))
j() { local tool=$1 suite=$2 t=$3; (TOOLS=$tool OUT=$L/$tool-$suite-$t SAN_TIMEOUT=$R SAN_TAG=$t SAN_ARGS="$t --exact" scripts/sanitize.sh $suite > $L/$tool-$suite-$t.log 2>&1; echo "done at $((SECONDS-T0)) s" >> $L/$tool-$suite-$t.log) & }
j racecheck gpu_server concurrent_requests_equal_their_replays
j racecheck gpu_llama hf_reference_1b
j racecheck gpu_llama rows_equal_alone_in_their_bucket
j memcheck gpu_llama hf_reference_1b
( TOOLS=memcheck OUT=$L/mmulti SAN_TIMEOUT=300 scripts/sanitize.sh gpu_multi > $L/mmulti.log 2>&1 ) &
( for k in 1 2 3 4; do TOOLS=racecheck OUT=$L/rwhile$k SAN_TIMEOUT=120 SAN_TAG=while$k SAN_ARGS="conditional_while_counts_to_n --exact" scripts/sanitize.sh gpu_graph_build > $L/rwhile$k.log 2>&1; echo "while run $k: $(head -1 $L/rwhile$k.log | cut -c1-120) | last: $(grep -E 'graph built|instantiated|replayed' $L/rwhile$k/san/*.log | tail -1)"; done > $L/rwhile.txt ) &
wait
echo "== while"; cat $L/rwhile.txt
echo "== gpu_multi memcheck"; head -3 $L/mmulti.log
echo "== sanitizers"; for f in $L/*-gpu_*.log; do echo "${f##*/}: $(grep -E 'racecheck:|memcheck:' $f | sed -E 's/.*(racecheck|memcheck): //' | cut -c1-170) $(grep done $f)"; done
tar -czf $OUT/logs-c6.tgz -C /tmp C6; echo "end at $((SECONDS-T0)) s"
