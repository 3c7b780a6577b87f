# Call 6 (final build): racecheck of gpu_server and gpu_sampling (two processes), which timed out
# beside a dozen other sanitizer processes in call 5, side by side with nothing else heavy;
# memcheck of both on the final build; racecheck of gpu_core (its timing bound fixed) and of
# gpu_graph_build without conditional_while_counts_to_n (the process died under racecheck in that
# test in call 5), then that test alone under racecheck.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
L=/tmp/L6 && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
R=$((${CALL_S:-540}-SECONDS+T0))
j() { local tag=$1 tool=$2 suite=$3; shift 3; (TOOLS=$tool OUT=$L/$tag SAN_TIMEOUT=$R SAN_TAG=$tag SAN_ARGS="$*" scripts/sanitize.sh $suite > $L/$tag.log 2>&1; echo "$tag exit $? at $((SECONDS-T0)) s" >> $L/$tag.log) & }
j rv racecheck gpu_server
j rs-dist racecheck gpu_sampling distribution_matches_host --exact
j rs-rest racecheck gpu_sampling --skip distribution_matches_host
j mv memcheck gpu_server
j ms memcheck gpu_sampling
j rcore racecheck gpu_core
j rgb racecheck gpu_graph_build --skip conditional_while_counts_to_n
(sleep 60; TOOLS=racecheck OUT=$L/rgw SAN_TIMEOUT=120 SAN_TAG=while SAN_ARGS="conditional_while_counts_to_n --exact" scripts/sanitize.sh gpu_graph_build > $L/rgw.log 2>&1) &
wait; for f in $L/*.log; do echo "== ${f##*/}"; grep -E "memcheck:|racecheck:|exit" $f | head -4; done
tar -czf $OUT/logs6.tgz -C $L .
