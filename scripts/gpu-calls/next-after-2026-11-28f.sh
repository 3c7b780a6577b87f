# What the sixth 2026-11-28 session (docs/results/gpu-runs-2026-11-28f.md) left to run, as device
# calls on one GPU: `bash THIS a`, `bash THIS b`, `bash THIS c`. Carry .gpu-tar (bundle.tar.xz and
# commit of the session's final commit, muts.tar.xz with the mutation builds named below). If the
# library or tests changed since: scripts/gpu-bundle; git rev-parse HEAD > .gpu-tar/commit; cp
# .gpu-tar/commit .gpu-bundle/.commit; XZ_OPT="-T2 -6" tar -cJf .gpu-tar/bundle.tar.xz .gpu-bundle;
# and rebuild the mutation executables (scripts/mutations/X.patch applied, `cargo test --release -p
# cuda-async-tests --test SUITE --no-run`, the executable copied to .gpu-tar/muts/X, the patch
# reverted; then tar -cJf .gpu-tar/muts.tar.xz -C .gpu-tar muts).
#   a: the raw-driver probe of page-locked allocation and module loads racing thread-local captures
#      on another thread (a crash is a signal exit: then cuda-core must gate them as it gates
#      cuCtxSynchronize); the sixth round's new tests and their mutations (each must fail); every
#      test executable alone; memcheck and racecheck of the suites the round touched.
#   b, c: racecheck of the gpu_llama and gpu_server tests that have not finished under racecheck
#      on this library (4 processes at a time; 11 tests over the two calls).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
[ -d .gpu-tar/muts ] || tar -xJf .gpu-tar/muts.tar.xz -C .gpu-tar
T0=$SECONDS; L=/tmp/N$1; mkdir -p $L/plain $L/m $L/r; END=$(( $(date +%s) + 560 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
t() { ls .gpu-bundle/tests/*--$1; }
one() { timeout 150 $1 --test-threads=1 $2 --exact > $L/$3.log 2>&1; echo "$3 exit $?: $(grep -E '^test result|FAILED: ' $L/$3.log | head -2 | tr '\n' ' ' | cut -c1-260)"; }
if [ "$1" = a ]; then
  for m in "thread-local 5 host-alloc" "relaxed 5 host-alloc" "global 5 host-alloc" "thread-local 5 module"; do
    timeout 30 .gpu-bundle/bin/capture-race-probe $m > $L/probe.log 2>&1; echo "probe $m: exit $? | $(tail -4 $L/probe.log | tr '\n' ' ' | cut -c1-300)"
  done
  one "$(t gpu_graph_build)" empty_memset_and_copy_nodes new-empty
  one .gpu-tar/muts/empty-node-driver empty_memset_and_copy_nodes "mutation-empty-node-driver(must-fail)"
  one "$(t gpu_interop)" refused_slice_is_not_freed_into_cudarcs_capture new-refused-slice
  one .gpu-tar/muts/refused-slice-freed-in-capture refused_slice_is_not_freed_into_cudarcs_capture "mutation-refused-slice-freed-in-capture(must-fail)"
  one "$(t gpu_mlp)" mlp_refusals new-mlp-refusals
  one "$(t gpu_capture_races)" page_locked_memory_on_a_capturing_thread new-page-locked
  one "$(t gpu_core)" disk_cache_hit_and_corruption new-cache-program-name
  one .gpu-tar/muts/kernel-key-no-program disk_cache_hit_and_corruption "mutation-kernel-key-no-program(must-fail)"
  one .gpu-tar/muts/pinned-drop-in-capture page_locked_memory_on_a_capturing_thread "mutation-pinned-drop-in-capture(must-fail)"
  one .gpu-tar/muts/pinned-new-in-capture page_locked_memory_on_a_capturing_thread "mutation-pinned-new-in-capture(must-fail)"
  for x in .gpu-bundle/tests/*; do s=${x##*--}; timeout 150 $x --test-threads=1 > $L/plain/$s.log 2>&1 || echo "$s exit $?"; done
  cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'; echo "suites done at $((SECONDS-T0)) s"
  grep -hE "^test .*FAILED|FAILED: " $L/plain/*.log | head -8 | cut -c1-220
  printf '%s\n' "memcheck gpu_graph_build" "memcheck gpu_interop" "memcheck gpu_mlp" "memcheck gpu_capture_races" "racecheck gpu_interop" "racecheck gpu_mlp" "racecheck gpu_capture_races" > $L/jobs
  xargs -P 7 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh $0 $1 ALL '"$((END-70)) $L/m"' ' < $L/jobs > $L/m.out 2>&1; cat $L/m.out | cut -c1-220
  bash scripts/gpu-calls/san-job.sh racecheck gpu_graph_build ALL $((END-10)) $L/r | cut -c1-220
else
  (python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $?") &
  python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $?"; wait
  export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall
  if [ "$1" = b ]; then
    printf '%s\n' "gpu_llama hf_reference_1b_prompt1" "gpu_llama hf_reference_1b_rows12" "gpu_llama hf_reference_small_cublas" \
      "gpu_server concurrent_requests_equal_their_replays_part0" "gpu_server http_request_and_debug_replay" "gpu_llama rows_equal_alone_in_their_bucket" > $L/rjobs
  else
    printf '%s\n' "gpu_llama hf_reference_1b_prompt2" "gpu_llama hf_reference_1b_rows64" "gpu_llama hf_reference_large_buckets" \
      "gpu_server concurrent_requests_equal_their_replays_part1" "gpu_server concurrent_requests_equal_their_replays_part2" > $L/rjobs
  fi
  xargs -P 4 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$((END-10)) $L/r"' ' < $L/rjobs > $L/r.out 2>&1
  cat $L/r.out | cut -c1-220
  echo "racecheck ended at $((SECONDS-T0)) s: $(grep -l ' racecheck.*: ok' $L/r/*.log | wc -l) of $(wc -l < $L/rjobs) ok"
fi
tar -czf $OUT/logs-n$1.tgz -C /tmp --exclude ref1b --exclude refsmall N$1; echo "end at $((SECONDS-T0)) s"
