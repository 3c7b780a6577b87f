# Call 7 of the fourth 2026-11-27 session (the last ~50 s, on the still-warm machine): the WHILE
# test under racecheck beside one other racecheck process, with core dumps on and no handler, and
# the faulting thread's backtrace from the core (library names and offsets).
T0=$SECONDS; L=/tmp/D7; mkdir -p $L; export CUDA_ASYNC_REQUIRE_GPU=1
S=$(ls .gpu-bundle/tests/*--gpu_server); GB=$(ls .gpu-bundle/tests/*--gpu_graph_build)
san="compute-sanitizer --tool racecheck --report-api-errors explicit --leak-check no --target-processes application-only --print-limit 200"
(timeout 25 $san $S --test-threads=1 concurrent_requests_equal_their_replays_part1 --exact > $L/neighbour.log 2>&1) &
sleep 6; cd $L; ulimit -c unlimited
timeout 20 $san $OLDPWD/$GB --test-threads=1 conditional_while_counts_to_n --exact > $L/while.log 2>&1; echo "WHILE rc $? at $((SECONDS-T0)) s; cores: $(ls -la $L | grep core | head -2)"
c=$(ls $L/core* 2>/dev/null | head -1); [ -n "$c" ] && timeout 20 cuda-gdb -q -batch -ex 'bt 16' -ex 'info threads' $OLDPWD/$GB $c 2>&1 | grep -vE '^\[New LWP' | cut -c1-170 | head -45; rm -f $L/core*
wait; echo "end at $((SECONDS-T0)) s"
