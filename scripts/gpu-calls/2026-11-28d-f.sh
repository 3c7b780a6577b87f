# Call f of the 2026-11-28d session: the bundle of .gpu-tar-f/commit (the second red-team round of
# this session on top of af519ab), on a fresh machine with the session's last device time. Each
# step bounded by one deadline BUDGET_S seconds out:
#   - gpu_graph (a scope whose capture is replaced inside its closure), gpu_graph_build (a failed
#     conditional body leaves no node), gpu_prefill (an evicted, recaptured bucket forgets the last
#     results), and the three mutations (each must fail its test);
#   - the README's main command (bin/llama);
#   - the suites whose code changed: gpu_core, gpu_user_kernels (the NVRTC cache), gpu_soundness,
#     gpu_server, gpu_llama; memcheck of gpu_graph_build and gpu_graph side by side, as time allows.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar-f/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar-f/bundle.tar.xz && cp .gpu-tar-f/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/Df; mkdir -p $L/plain $L/san; END=$(( $(date +%s) + ${BUDGET_S:-200} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar-f/commit; echo "unpacked at $((SECONDS-T0)) s"
export CUDA_ASYNC_REQUIRE_GPU=1
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); local left=$((END-$(date +%s)-5)); [ $left -gt 3 ] || { echo "$1: no time left"; return; }; timeout $(( left < $2 ? left : $2 )) $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; grep -hE "^test .*FAILED|FAILED: " $L/plain/$1.log | head -3 | cut -c1-220; }
mut() { timeout 20 .gpu-tar-f/mut-$1 --test-threads=1 $2 --exact > $L/mut-$1.log 2>&1; echo "mutation $1 exit $? (must fail): $(grep -E '^test result|FAILED: ' $L/mut-$1.log | head -2 | cut -c1-220 | tr '\n' ' ')"; }
suite gpu_graph 40
suite gpu_graph_build 40
suite gpu_prefill 60
mut scope-capture-unchecked param_handles
mut failed-body-kept conditional_if
mut evict-keeps-last eviction_forgets_the_last_results
left=$((END-$(date +%s)-5)); timeout $((left<45?left:45)) .gpu-bundle/bin/llama > $L/llama.log 2>&1; echo "bin/llama (README main command) exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$" $L/llama.log | tail -3 | cut -c1-200
for s in gpu_core gpu_user_kernels gpu_soundness; do suite $s 60; done
for s in gpu_graph_build gpu_graph; do (bash scripts/gpu-calls/san-job.sh memcheck $s ALL $((END-120)) $L/san | cut -c1-200) & done; wait
for s in gpu_server gpu_llama; do suite $s 120; done
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "summary of what ran: " p " passed, " f " failed, " i " ignored"}'
tar -czf $OUT/logs-df.tgz -C /tmp Df; echo "end at $((SECONDS-T0)) s"
