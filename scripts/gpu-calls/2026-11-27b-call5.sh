# Call 5 (final build): bench-decode with the PyTorch baselines alone; then, side by side, the
# sanitizer runs not yet done on the final library: racecheck of gpu_sampling (two processes),
# gpu_server, gpu_completion and the suites with no kernels of their own; memcheck of gpu_completion
# and gpu_multi (with three plain runs of gpu_multi).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
B=.gpu-bundle/bin; L=/tmp/L5 && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
timeout 290 $B/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | tail -24
R=$((${CALL_S:-480}-SECONDS+T0)); echo "sanitizers: $R s"
j() { local tag=$1 tool=$2 suite=$3; shift 3; (TOOLS=$tool OUT=$L/$tag SAN_TIMEOUT=$R SAN_TAG=$tag SAN_ARGS="$*" scripts/sanitize.sh $suite > $L/$tag.log 2>&1; echo "$tag exit $? at $((SECONDS-T0)) s" >> $L/$tag.log) & }
j rs-dist racecheck gpu_sampling distribution_matches_host --exact
j rs-rest racecheck gpu_sampling --skip distribution_matches_host
j rv racecheck gpu_server
j rc racecheck gpu_completion
j mc memcheck gpu_completion
j mm memcheck gpu_multi
for s in gpu_access gpu_async gpu_capture_races gpu_core gpu_graph_build gpu_multi gpu_soundness gpu_wakers; do j r-$s racecheck $s; done
(for i in 1 2 3; do CUDA_ASYNC_REQUIRE_GPU=1 .gpu-bundle/tests/*--gpu_multi --test-threads=1 > $L/multi$i.txt 2>&1; echo "gpu_multi plain run $i exit $?"; done > $L/multi.log 2>&1) &
wait; for f in $L/*.log; do [ "${f##*/}" = bench-decode.log ] && continue; echo "== ${f##*/}"; grep -E "memcheck:|racecheck:|exit|plain run" $f | head -4; done
tar -czf $OUT/logs5.tgz -C $L .
