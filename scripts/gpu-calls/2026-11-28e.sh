# The fifth 2026-11-28 session's device calls on its library (`bash THIS a`, then `bash THIS b`),
# carrying .gpu-tar/ (bundle.tar.xz and commit of the build, and one mutation build of a test
# executable per line of MUTS below: .gpu-tar/mut-NAME). Each phase checks the time left, so the
# logs are always packed before the device tool's 600 s limit. The mutation builds travel packed
# as .gpu-tar/muts.tar.xz.
#   a: the round's new GPU tests, then each mutation (each must fail its test); every test
#      executable alone; the memcheck sweep (8 processes at a time, the 1B references first); then
#      memcheck of gpu_completion and gpu_graph_build alone (their timing tests and WHILE graphs
#      misbehaved only beside other sanitizer processes); racecheck of the suites the round touched.
#   b: llama-server --llama-1b at 256 and 32 tokens; bench-decode with the PyTorch baselines;
#      bench-completion (the fair 64-task F1 row); bench-core (the launch rows of issue 20).
MUTS="wait-by-address:gpu_access:a_freed_mark_never_stands_in_for_a_new_wait
argmax-zero-sign:gpu_sampling:argmax_matches_host
blas-empty-sum:gpu_blas:empty_products
reset-id-last:gpu_graph:panicking_output_drop_leaves_handles_stale
panicking-body-kept:gpu_graph_build:panicking_body_leaves_no_node
embed-handles-unchecked:gpu_graph_build:graphs_with_handles_are_not_embedded
edge-data-null:gpu_graph_build:building_on_overlapped_launches
deps-edge-data-null:gpu_graph_build:building_on_overlapped_launches"
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
[ -f .gpu-tar/muts.tar.xz ] && tar -xJf .gpu-tar/muts.tar.xz -C .gpu-tar
T0=$SECONDS; L=/tmp/E$1; mkdir -p $L; END=$(( $(date +%s) + 565 ))
left() { echo $((END - $(date +%s))); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
t() { ls .gpu-bundle/tests/*--$1; }
if [ "$1" = a ]; then
  mkdir -p $L/plain $L/mut
  for s in gpu_blas gpu_graph_build; do timeout 90 $(t $s) --test-threads=1 > $L/plain/$s.log 2>&1; echo "$s exit $?: $(grep '^test result' $L/plain/$s.log)"; grep -hE "FAILED: " $L/plain/$s.log | head -4 | cut -c1-240; done
  for x in gpu_sampling:argmax_matches_host gpu_graph:panicking_output_drop_leaves_handles_stale gpu_access:a_freed_mark_never_stands_in_for_a_new_wait; do
    timeout 60 $(t ${x%%:*}) --test-threads=1 ${x#*:} --exact > $L/new-${x#*:}.log 2>&1; echo "${x%%:*} ${x#*:} exit $?: $(grep -E '^test result|FAILED: ' $L/new-${x#*:}.log | head -2 | cut -c1-200 | tr '\n' ' ')"
  done
  echo "$MUTS" | while IFS=: read m s n; do
    timeout 40 .gpu-tar/mut-$m --test-threads=1 $n --exact > $L/mut/$m.log 2>&1; echo "mutation $m ($s $n) exit $? (must fail): $(grep -E '^test result|FAILED: ' $L/mut/$m.log | head -2 | cut -c1-230 | tr '\n' ' ')"
  done
  echo "new tests and mutations done at $((SECONDS-T0)) s"
  for x in .gpu-bundle/tests/*; do s=${x##*--}; case $s in gpu_blas|gpu_graph_build) continue;; esac; timeout 150 $x --test-threads=1 > $L/plain/$s.log 2>&1 || echo "$s exit $?"; done
  cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'; echo "suites done at $((SECONDS-T0)) s"
  grep -hE "^test .*FAILED|FAILED: " $L/plain/*.log | head -8 | cut -c1-220
  (python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $?") &
  python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $?"; wait
  export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall
  { for x in hf_reference_1b_prompt2 hf_reference_1b_rows64 hf_reference_1b_rows12 hf_reference_1b_prompt1 hf_reference_1b_prompt0 rows_equal_alone_in_their_bucket hf_reference_large_buckets hf_reference_small_cublas hf_reference_small fused_products_match_host products_wait_for_weights_written_ahead graph_cache_budget_and_padding refusals kernel_guards cancelled_step_keeps_slots_intact; do echo "gpu_llama $x"; done
    for x in concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay; do echo "gpu_server $x"; done
    for x in .gpu-bundle/tests/*--gpu_*; do s=${x##*--}; case $s in gpu_llama|gpu_server|gpu_completion|gpu_graph_build) ;; *) echo "$s ALL";; esac; done; } > $L/mjobs
  mkdir -p $L/m $L/m1 $L/r; MEND=$(( $(date +%s) + 170 )); [ $MEND -gt $((END-150)) ] && MEND=$((END-150))
  xargs -P 8 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh memcheck $0 $1 '"$MEND $L/m"' ' < $L/mjobs > $L/m.out 2>&1
  echo "memcheck sweep ended at $((SECONDS-T0)) s: $(grep -l ' memcheck: ok' $L/m/*.log | wc -l) of $(wc -l < $L/mjobs) ok"
  for f in $L/m/*.log; do grep -q ' memcheck: ok' $f || echo "  not ok: $(grep -E 'memcheck: ' $f | tail -1 | cut -c1-230)"; done
  for s in gpu_completion gpu_graph_build; do bash scripts/gpu-calls/san-job.sh memcheck $s ALL $((END-60)) $L/m1 | cut -c1-200; done
  for s in gpu_graph_build gpu_blas gpu_graph gpu_access gpu_sampling; do [ $(left) -gt 25 ] || break; bash scripts/gpu-calls/san-job.sh racecheck $s ALL $((END-10)) $L/r | cut -c1-200; done
else
  for n in 256 32; do R=$(( $(left) - 400 )); [ $R -gt 20 ] || break; timeout $((R<130?R:130)) .gpu-bundle/bin/llama-server --llama-1b --tokens $n > $L/ls$n.log 2>&1; echo "llama-server --llama-1b --tokens $n exit $? at $((SECONDS-T0)) s"; tail -1 $L/ls$n.log | cut -c1-250; done
  R=$(( $(left) - 150 )); timeout $((R<240?R:240)) .gpu-bundle/bin/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100-e.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | grep -E "^ +(1|16|64) |await|median step|early|CPU|OS floor|first token|copy|reduce-overhead|^batch" | head -24 | cut -c1-220
  R=$(( $(left) - 70 )); [ $R -gt 30 ] && { timeout $((R<120?R:120)) .gpu-bundle/bin/bench-completion --json $OUT/bench-completion-h100-e.json > $L/bench-completion.log 2>&1; echo "bench-completion exit $? at $((SECONDS-T0)) s"; grep -E "F1 " $L/bench-completion.log | head -4 | cut -c1-220; }
  R=$(( $(left) - 5 )); [ $R -gt 30 ] && { timeout $R .gpu-bundle/bin/bench-core --json $OUT/bench-core-h100-e.json > $L/bench-core.log 2>&1; echo "bench-core exit $? at $((SECONDS-T0)) s"; grep -E "^[AB] " $L/bench-core.log | cut -c1-200; }
fi
tar -czf $OUT/logs-e$1.tgz -C /tmp --exclude ref1b --exclude refsmall E$1; echo "end at $((SECONDS-T0)) s"
