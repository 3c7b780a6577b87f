# The seventh 2026-11-28 session's device calls on a machine of four H200s (`nvidia-h200-x4`), each
# GPU its own lane: every test process sees one GPU (CUDA_VISIBLE_DEVICES), except the two-GPU
# tests, which see two. Carry .gpu-tar (bundle.tar.xz and commit of the library to verify,
# muts.tar.xz with the mutation builds). `bash THIS 1`, `bash THIS 2`, `BUDGET=400 bash THIS 3`.
#   1: GPU 0: the raw-driver probe of page-locked allocation and module loads racing thread-local
#      captures; the sixth round's new tests and their mutations (each must fail); every test
#      executable alone; the two-GPU tests on GPUs 0 and 1; memcheck and racecheck of the suites
#      the round touched. GPUs 1-3: racecheck of the eleven gpu_llama / gpu_server tests that never
#      finished under racecheck, three or four processes a GPU, with a monitor of GPU and CPU load
#      (to tell whether racecheck is bound by the GPU or by the host).
#   2: the rest of the sanitizer pass on this library: memcheck of every test of every GPU suite,
#      racecheck of every other suite (per test where a whole suite runs too long), and again the
#      long racechecks that call 1 did not finish (JOBS2_EXTRA).
#   3: the library with the two fixes that calls 1 and 2 led to: the fixed tests and their
#      mutations, every test executable, the two-GPU tests, memcheck and racecheck of the suites
#      the fixes touched, then memcheck of the quick suites until the deadline.
#   6 (for the next session, first): as 3, with the seventh round's GPU tests and mutations
#      (pinned-drop-waits, pinned-transfer-host-wait, pinned-transfer-no-wait, handle-untracked:
#      each must fail; built from scripts/mutations/NAME.patch into .gpu-tar/muts/NAME);
#      the bundle and muts.tar.xz rebuilt first.
#   4, 5 (for the next session, four GPUs): what call 3 left of the sanitizer pass on the final
#      library (docs/results/gpu-runs-2026-11-28g.md, "What this leaves"). 4: memcheck of every
#      gpu_llama / gpu_server test, of gpu_prefill and gpu_sampling per test, gpu_completion,
#      gpu_graph_build and gpu_kernel_bounds alone; racecheck of gpu_graph_build and
#      gpu_completion alone, gpu_blas, the eight quick gpu_llama tests. 5: racecheck of the
#      batched gpu_llama tests and the gpu_server tests (cuBLAS nvjet kernels: hazards expected
#      inside them; sanitize.sh names that case).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
[ -d .gpu-tar/muts ] || [ ! -f .gpu-tar/muts.tar.xz ] || tar -xJf .gpu-tar/muts.tar.xz -C .gpu-tar
T0=$SECONDS; L=/tmp/G$1; mkdir -p $L/plain $L/r $L/m; END=$(( $(date +%s) + ${BUDGET:-565} ))
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit; nproc; free -g | head -2
export CUDA_ASYNC_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t() { ls .gpu-bundle/tests/*--$1; }
one() { [ -x "$1" ] || return 0; timeout -k 5 150 $1 --test-threads=1 $2 --exact > $L/$3.log 2>&1; echo "$3 exit $?: $(grep -E '^test result|FAILED: ' $L/$3.log | head -2 | tr '\n' ' ' | cut -c1-260)"; }
# lane GPU P TOOL JOBFILE: the jobs ("SUITE TEST|ALL"), P at a time on one GPU, each bounded by END;
# logs under $L/r-TOOL, verdicts in $L/lane-GPU-TOOL-JOBFILE.out.
lane() { mkdir -p $L/r-$3; CUDA_VISIBLE_DEVICES=$1 xargs -P $2 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh '"$3"' $0 $1 '"$((END-8)) $L/r-$3"' ' < $4 > $L/lane-$1-$3-$(basename $4).out 2>&1; }
list() { $(t $1) --list 2>&1 | sed -nE 's/^\[gpu\] ([a-z_0-9]+): test$/\1/p' | sed "s/^/$1 /"; }
monitor() { while [ $(date +%s) -lt $((END-5)) ]; do { date +%T; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader | tr '\n' ' '; echo; top -b -n1 -w 200 | sed -n '1,4p;7,20p'; } >> $L/monitor.log; sleep 30; done; }
refs() { (CUDA_VISIBLE_DEVICES=$1 python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $? at $((SECONDS-T0)) s") &
  CUDA_VISIBLE_DEVICES=$1 python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $? at $((SECONDS-T0)) s"; wait; touch /tmp/refs.done; }
export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall
newtests() {
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
  [ -d .gpu-tar/muts ] || echo "(no mutation builds carried: the mutation lines above did not run)"
}
monitor & MON=$!
if [ "$1" = 1 ]; then
  if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
    printf '%s\n' "gpu_llama hf_reference_1b_prompt1" "gpu_llama hf_reference_1b_rows64" "gpu_llama hf_reference_small_cublas" "gpu_server concurrent_requests_equal_their_replays_part2" > $L/j1
    printf '%s\n' "gpu_llama hf_reference_1b_prompt2" "gpu_llama hf_reference_1b_rows12" "gpu_server concurrent_requests_equal_their_replays_part0" "gpu_server http_request_and_debug_replay" > $L/j2
    printf '%s\n' "gpu_llama hf_reference_large_buckets" "gpu_llama rows_equal_alone_in_their_bucket" "gpu_server concurrent_requests_equal_their_replays_part1" > $L/j3
    (refs 3; lane 1 4 racecheck $L/j1 & lane 2 4 racecheck $L/j2 & lane 3 3 racecheck $L/j3 & wait) > $L/long.out 2>&1 & LONG=$!
  else # two GPUs: four of the eleven on GPU 1
    printf '%s\n' "gpu_llama hf_reference_1b_prompt1" "gpu_llama hf_reference_1b_prompt2" "gpu_llama hf_reference_1b_rows12" "gpu_llama hf_reference_small_cublas" > $L/j1
    (refs 1; lane 1 4 racecheck $L/j1) > $L/long.out 2>&1 & LONG=$!
  fi
  export CUDA_VISIBLE_DEVICES=0
  for m in "thread-local 5 host-alloc" "relaxed 5 host-alloc" "global 5 host-alloc" "thread-local 5 module"; do
    timeout 30 .gpu-bundle/bin/capture-race-probe $m > $L/probe.log 2>&1; echo "probe $m: exit $? | $(tail -4 $L/probe.log | tr '\n' ' ' | cut -c1-300)"
  done
  newtests
  echo "new tests and mutations done at $((SECONDS-T0)) s"; while [ ! -f /tmp/refs.done ]; do sleep 2; done
  for x in .gpu-bundle/tests/*; do s=${x##*/}; timeout 150 $x --test-threads=1 > $L/plain/$s.log 2>&1 || echo "$s exit $?"; done
  cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary (one GPU): " p " passed, " f " failed, " i " ignored"}'; echo "suites done at $((SECONDS-T0)) s"
  grep -hE "^test .*FAILED|FAILED: " $L/plain/*.log | head -8 | cut -c1-220
  mkdir -p $L/two; for f in $L/plain/*.log; do grep -qE '^test result: ok.* [1-9][0-9]* ignored' $f || continue; s=$(basename $f .log)
    CUDA_VISIBLE_DEVICES=0,1 CUDA_ASYNC_REQUIRE_GPU=2 timeout 120 .gpu-bundle/tests/$s --test-threads=1 > $L/two/$s.log 2>&1; echo "two GPUs: $s exit $?: $(grep -E '^test result' $L/two/$s.log)"; grep -hE "FAILED: " $L/two/$s.log | head -3 | cut -c1-220; done
  echo "two-GPU runs done at $((SECONDS-T0)) s"
  printf '%s\n' "gpu_interop ALL" "gpu_mlp ALL" "gpu_capture_races ALL" > $L/j0; lane 0 3 memcheck $L/j0; lane 0 3 racecheck $L/j0
  printf '%s\n' "gpu_graph_build ALL" > $L/j0g; lane 0 1 memcheck $L/j0g; lane 0 1 racecheck $L/j0g
  echo "GPU 0 done at $((SECONDS-T0)) s"; wait $LONG
elif [ "$1" = 4 ] || [ "$1" = 5 ]; then
  # What call 3 left of the sanitizer pass on the final library, over four GPUs (next session).
  [ -f /tmp/refs.done ] || refs 0
  if [ "$1" = 4 ]; then
    list gpu_llama > $L/a0; list gpu_server >> $L/a0
    { list gpu_prefill; list gpu_sampling; } > $L/a1; printf '%s\n' "gpu_completion ALL" "gpu_graph_build ALL" "gpu_kernel_bounds ALL" > $L/a1b
    printf '%s\n' "gpu_graph_build ALL" > $L/a2; printf '%s\n' "gpu_completion ALL" "gpu_blas ALL" > $L/a2b
    printf 'gpu_llama %s\n' hf_reference_1b_prompt0 hf_reference_small graph_cache_budget_and_padding products_wait_for_weights_written_ahead cancelled_step_keeps_slots_intact fused_products_match_host refusals kernel_guards > $L/a3
    lane 0 4 memcheck $L/a0 & P0=$!
    (lane 1 6 memcheck $L/a1; lane 1 1 memcheck $L/a1b) & P1=$!
    (lane 2 1 racecheck $L/a2; lane 2 1 racecheck $L/a2b) & P2=$!
    lane 3 4 racecheck $L/a3 & P3=$!
  else # the long racechecks, each with a GPU (or half of one) to itself
    printf 'gpu_llama %s\n' hf_reference_1b_rows12 > $L/b0; printf 'gpu_llama %s\n' hf_reference_1b_rows64 > $L/b1
    printf 'gpu_llama %s\n' hf_reference_large_buckets rows_equal_alone_in_their_bucket > $L/b2
    printf 'gpu_server %s\n' concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay > $L/b3
    lane 0 1 racecheck $L/b0 & P0=$!; lane 1 1 racecheck $L/b1 & P1=$!; lane 2 2 racecheck $L/b2 & P2=$!; lane 3 4 racecheck $L/b3 & P3=$!
  fi
  for p in $P0 $P1 $P2 $P3; do while kill -0 $p 2>/dev/null && [ $(date +%s) -lt $((END+5)) ]; do sleep 2; done; done
elif [ "$1" = 3 ] || [ "$1" = 6 ]; then
  # 3: the library with the two fixes; 6 (next session): the seventh round's library. Then: the fixed tests and their mutations, every test executable,
  # the two-GPU tests, memcheck and racecheck of the suites the fixes touched.
  (refs 1) > $L/refs.out 2>&1 & RF=$!
  m() { timeout -k 5 ${4:-60} env $3 $1 --test-threads=1 $2 --exact > $L/$5.log 2>&1; echo "$5 exit $?: $(grep -E '^test result|FAILED: ' $L/$5.log | head -2 | tr '\n' ' ' | cut -c1-300)"; }
  if [ "$1" = 3 ]; then
    m "$(t gpu_multi)" captured_all_reduce_two_devices "CUDA_VISIBLE_DEVICES=0,1 CUDA_ASYNC_REQUIRE_GPU=2" 60 fixed-captured-all-reduce
    m .gpu-tar/muts/runtime-connect-on captured_all_reduce_two_devices "CUDA_VISIBLE_DEVICES=0,1 CUDA_ASYNC_REQUIRE_GPU=2" 60 "mutation-runtime-connect-on(must-fail)"
    m "$(t gpu_interop)" refused_slice_is_not_freed_into_cudarcs_capture CUDA_VISIBLE_DEVICES=0 30 fixed-refused-slice
    m .gpu-tar/muts/drop-leak-uncounted refused_slice_is_not_freed_into_cudarcs_capture CUDA_VISIBLE_DEVICES=0 30 "mutation-drop-leak-uncounted(must-fail)"
    m .gpu-tar/muts/refused-slice-freed-in-capture refused_slice_is_not_freed_into_cudarcs_capture CUDA_VISIBLE_DEVICES=0 30 "mutation-refused-slice-freed-in-capture(must-fail)"
    m .gpu-tar/muts/pinned-new-in-capture page_locked_memory_on_a_capturing_thread CUDA_VISIBLE_DEVICES=0 30 "mutation-pinned-new-in-capture(must-fail)"
  else # the seventh round's GPU tests and mutations (each must fail), and the NCCL fix again
    m "$(t gpu_async)" cancelled_copy_out_does_not_block_the_executor CUDA_VISIBLE_DEVICES=0 60 new-cancelled-copy-out
    m .gpu-tar/muts/pinned-drop-waits cancelled_copy_out_does_not_block_the_executor CUDA_VISIBLE_DEVICES=0 60 "mutation-pinned-drop-waits(must-fail)"
    m "$(t gpu_async)" a_transfer_queues_behind_the_previous_one_on_the_gpu CUDA_VISIBLE_DEVICES=0 60 new-transfer-behind-previous
    m .gpu-tar/muts/pinned-transfer-host-wait a_transfer_queues_behind_the_previous_one_on_the_gpu CUDA_VISIBLE_DEVICES=0 60 "mutation-pinned-transfer-host-wait(must-fail)"
    m .gpu-tar/muts/pinned-transfer-no-wait a_transfer_queues_behind_the_previous_one_on_the_gpu CUDA_VISIBLE_DEVICES=0 60 "mutation-pinned-transfer-no-wait(must-fail)"
    m "$(t gpu_graph_build)" set_conditional_orders_before_its_if CUDA_VISIBLE_DEVICES=0 60 new-handle-ordering
    m .gpu-tar/muts/handle-untracked set_conditional_orders_before_its_if CUDA_VISIBLE_DEVICES=0 60 "mutation-handle-untracked(must-fail)"
    m "$(t gpu_multi)" captured_all_reduce_two_devices "CUDA_VISIBLE_DEVICES=0,1 CUDA_ASYNC_REQUIRE_GPU=2" 60 captured-all-reduce
  fi
  echo "fixes and mutations done at $((SECONDS-T0)) s"; wait $RF; cat $L/refs.out
  printf '%s\n' "gpu_interop ALL" "gpu_multi ALL" > $L/j1m; printf '%s\n' "gpu_interop ALL" "gpu_multi ALL" > $L/j1r
  (lane 1 2 memcheck $L/j1m; lane 1 2 racecheck $L/j1r; mkdir -p $L/r-two; CUDA_VISIBLE_DEVICES=0,1 CUDA_ASYNC_REQUIRE_GPU=2 bash scripts/gpu-calls/san-job.sh memcheck gpu_multi ALL $((END-8)) $L/r-two > $L/lane-01-memcheck-two.out 2>&1
   rest=$(grep -vE "^gpu_(llama|server|graph_build|completion|interop|multi|prefill|sampling) " <(for x in .gpu-bundle/tests/*--gpu_*; do echo "${x##*--} ALL"; done)); echo "$rest" > $L/j1rest; lane 1 6 memcheck $L/j1rest) & P1=$!
  P2= P3=
  if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then # GPUs 2 and 3: racecheck of the quick suites, per test where a suite runs long
    for x in .gpu-bundle/tests/*--gpu_*; do s=${x##*--}; case $s in gpu_llama|gpu_server|gpu_graph|gpu_graph_build|gpu_blas|gpu_sampling|gpu_prefill|gpu_interop|gpu_multi) ;; *) echo "$s ALL";; esac; done > $L/j2r
    { list gpu_graph; list gpu_sampling; list gpu_prefill; } > $L/j3r
    lane 2 6 racecheck $L/j2r & P2=$!
    lane 3 6 racecheck $L/j3r & P3=$!
  fi
  export CUDA_VISIBLE_DEVICES=0
  for x in .gpu-bundle/tests/*; do s=${x##*/}; timeout -k 5 150 $x --test-threads=1 > $L/plain/$s.log 2>&1 || echo "$s exit $?"; done
  cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary (one GPU): " p " passed, " f " failed, " i " ignored"}'; echo "suites done at $((SECONDS-T0)) s"
  grep -hE "^test .*FAILED|FAILED: " $L/plain/*.log | head -8 | cut -c1-220
  mkdir -p $L/two; for f in $L/plain/*.log; do grep -qE '^test result: ok.* [1-9][0-9]* ignored' $f || continue; s=$(basename $f .log)
    CUDA_VISIBLE_DEVICES=0,1 CUDA_ASYNC_REQUIRE_GPU=2 timeout -k 5 120 .gpu-bundle/tests/$s --test-threads=1 > $L/two/$s.log 2>&1; echo "two GPUs: $s exit $?: $(grep -E '^test result' $L/two/$s.log)"; grep -hE "FAILED: " $L/two/$s.log | head -3 | cut -c1-220; done
  # Never wait past the deadline (a process that outlives its timeout must not cost the logs).
  for p in $P1 $P2 $P3; do while kill -0 $p 2>/dev/null && [ $(date +%s) -lt $((END+5)) ]; do sleep 2; done; done
else
  [ -f /tmp/refs.done ] || refs 0
  for x in .gpu-bundle/tests/*--gpu_*; do s=${x##*--}; case $s in gpu_llama|gpu_server|gpu_prefill|gpu_sampling) list $s;; *) echo "$s ALL";; esac; done > $L/all
  grep -vE "^gpu_(llama|server|graph_build|completion) " $L/all > $L/m0; echo "gpu_completion ALL" > $L/m0b
  grep -E "^gpu_(llama|server) " $L/all > $L/m1
  grep -vE "^gpu_(llama|server|graph|graph_build|blas|sampling) " $L/all > $L/r2
  { list gpu_graph; list gpu_sampling; echo "gpu_blas ALL"; } > $L/r3
  QUICK2=${QUICK2-"gpu_llama hf_reference_1b_prompt0 gpu_llama hf_reference_small gpu_llama graph_cache_budget_and_padding gpu_llama products_wait_for_weights_written_ahead gpu_llama cancelled_step_keeps_slots_intact gpu_llama fused_products_match_host gpu_llama refusals gpu_llama kernel_guards"}
  { printf '%s\n' ${QUICK2:-} | paste -d' ' - -; printf '%s\n' ${JOBS2_EXTRA:-} | paste -d' ' - -; } | grep . > $L/r1
  if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
    (CUDA_VISIBLE_DEVICES=0 newtests; lane 0 6 memcheck $L/m0; lane 0 1 memcheck $L/m0b) & P0=$!
    (lane 1 6 memcheck $L/m1; [ -s $L/r1 ] && lane 1 4 racecheck $L/r1) & P1=$!
    lane 2 6 racecheck $L/r2 & P2=$!
    (lane 3 6 racecheck $L/r3; echo "gpu_graph_build ALL" > $L/r3b; lane 3 1 racecheck $L/r3b) & P3=$!
  else # two GPUs: first the NCCL capture diagnosis on both
    for v in "NCCL_DEBUG=WARN" "NCCL_DEBUG=WARN NCCL_RUNTIME_CONNECT=0"; do
      env $v CUDA_VISIBLE_DEVICES=0,1 CUDA_ASYNC_REQUIRE_GPU=2 NCCL_GRAPH_REGISTER=0 timeout 60 $(t gpu_multi) --test-threads=1 captured_all_reduce_two_devices --exact > $L/nccl.log 2>&1
      echo "captured_all_reduce_two_devices with $v: exit $?"; grep -vE '^\s*$' $L/nccl.log | grep -vE "^running|^failures|^test result" | head -12 | cut -c1-250
    done
    (CUDA_VISIBLE_DEVICES=0 newtests; lane 0 6 memcheck $L/m0; lane 0 1 memcheck $L/m0b; lane 0 6 racecheck $L/r2) & P0=$!
    (lane 1 6 memcheck $L/m1; lane 1 6 racecheck $L/r3; [ -s $L/r1 ] && lane 1 4 racecheck $L/r1) & P1=$!
    P2= P3=
  fi
  wait $P0 $P1 $P2 $P3
fi
for f in $L/lane-*.out; do echo "== ${f##*/}: $(grep -c ': ok' $f) ok of $(wc -l < $f)"; grep -v ': ok' $f | cut -c1-230; done
kill $MON 2>/dev/null; echo "end of lanes at $((SECONDS-T0)) s"; cat $L/long.out 2>/dev/null; dmesg 2>/dev/null | grep -iE "killed process|out of memory|oom" | tail -5
tar -czf $OUT/logs-g$1.tgz -C /tmp --exclude ref1b --exclude refsmall G$1; echo "end at $((SECONDS-T0)) s"
