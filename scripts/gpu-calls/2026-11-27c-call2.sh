# Call 2 of the third 2026-11-27 session: the final library (the reaper's exit drain), alone.
# 1. gpu_completion plain, then under racecheck with nothing else on the GPU (its early-wake
#    timing test failed under racecheck only beside other sanitizer processes so far).
# 2. Background, light: memcheck of gpu_multi::one_rank_smoke_captured twice (its process ended
#    with exit 11 under memcheck before the exit drain), and of the new
#    gpu_graph_build::deferred_drops_finish_before_exit; racecheck of
#    gpu_graph_build::conditional_while_counts_to_n with its whole log kept.
# 3. Foreground: every other test executable of the bundle, plain; one summary line for all.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C2; mkdir -p $L/plain
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1 RUST_BACKTRACE=1
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
suite gpu_completion 100
grep -hE "early wakes" $L/plain/gpu_completion.log
TOOLS=racecheck OUT=$L/rc-completion SAN_TIMEOUT=200 scripts/sanitize.sh gpu_completion > $L/rc-completion.log 2>&1; head -4 $L/rc-completion.log; grep -h "early wakes" $L/rc-completion/san/*.log
echo "racecheck gpu_completion alone done at $((SECONDS-T0)) s"
j() { local tag=$1 tool=$2 suite=$3; shift 3; (TOOLS=$tool OUT=$L/$tag SAN_TIMEOUT=$((560-SECONDS+T0)) SAN_TAG=$tag SAN_ARGS="$*" scripts/sanitize.sh $suite > $L/$tag.log 2>&1) & }
j mm1 memcheck gpu_multi one_rank_smoke_captured --exact
j mm2 memcheck gpu_multi one_rank_smoke_captured --exact
j mdrain memcheck gpu_graph_build deferred_drops_finish_before_exit --exact
j rwhile racecheck gpu_graph_build conditional_while_counts_to_n --exact
for t in .gpu-bundle/tests/*; do
  s=${t##*--}; [ -f $L/plain/$s.log ] && continue
  left=$((575-SECONDS+T0)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }
  suite $s $left
done
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|panicked|DROPPED|RACE-OK" $L/plain/*.log | head -12
wait
for f in $L/mm1.log $L/mm2.log $L/mdrain.log $L/rwhile.log; do echo "== $f"; head -6 $f; done
tail -30 $L/rwhile/san/*.log
tar -czf $OUT/logs-c2.tgz -C /tmp C2; echo "end at $((SECONDS-T0)) s"
