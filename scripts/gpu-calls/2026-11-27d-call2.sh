# Call 2 of the fourth 2026-11-27 session (bundle in .gpu-tar/commit, the final library): first
# conditional_while_counts_to_n under racecheck inside cuda-gdb (following the sanitizer's child,
# stopping at every SIGSEGV), without and with the harness's fault handler; then memcheck of every
# GPU suite on the final library: the light suites whole, one process each, gpu_llama and
# gpu_server one process per test (the long ones first), at most P at a time.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/D2; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
GB=$(ls .gpu-bundle/tests/*--gpu_graph_build); CS=/usr/local/cuda/compute-sanitizer/compute-sanitizer; [ -x $CS ] || CS=$(ls /usr/local/cuda*/compute-sanitizer/compute-sanitizer | head -1)
cat > $L/gdb.cmd <<'G'
set follow-fork-mode child
set detach-on-fork on
set pagination off
set print thread-events off
handle SIGSEGV stop print pass
handle SIGBUS stop print pass
run
info threads
bt 25
continue
bt 25
continue
bt 25
continue
bt 25
G
for h in 0 1; do
  if [ $h = 1 ]; then export CUDA_ASYNC_TEST_FAULT_BACKTRACE=1; else unset CUDA_ASYNC_TEST_FAULT_BACKTRACE; fi
  timeout 100 cuda-gdb -q -batch -x $L/gdb.cmd --args $CS --tool racecheck $GB conditional_while_counts_to_n --exact > $L/gdb-while-h$h.log 2>&1
  echo "== cuda-gdb, handler=$h: exit $? at $((SECONDS-T0)) s"; grep -vE "^\[New |^\[Thread |^\[Detaching|^\[Attaching|^process [0-9]+ is executing" $L/gdb-while-h$h.log | grep -E -A28 "received signal|terminated|exited|test result|FATAL" | cut -c1-200 | head -75
done
unset CUDA_ASYNC_TEST_FAULT_BACKTRACE
python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1 && export LLAMA_REF_DIR_1B=/tmp/ref1b
python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1 && export LLAMA_REF_DIR=/tmp/refsmall
echo "references at $((SECONDS-T0)) s: $LLAMA_REF_DIR_1B $LLAMA_REF_DIR"
{ for t in hf_reference_1b_prompt2 hf_reference_1b_rows64 hf_reference_1b_rows12 hf_reference_1b_prompt1 hf_reference_1b_prompt0 rows_equal_alone_in_their_bucket hf_reference_large_buckets hf_reference_small_cublas hf_reference_small fused_products_match_host graph_cache_budget_and_padding refusals kernel_guards cancelled_step_keeps_slots_intact; do echo "gpu_llama $t"; done
  for t in concurrent_requests_equal_their_replays_part0 concurrent_requests_equal_their_replays_part1 concurrent_requests_equal_their_replays_part2 http_request_and_debug_replay; do echo "gpu_server $t"; done
  for t in .gpu-bundle/tests/*--gpu_*; do s=${t##*--}; case $s in gpu_llama|gpu_server) ;; *) echo "$s ALL";; esac; done; } > $L/jobs
R=$((575-SECONDS+T0)); echo "sanitizer budget $R s, $(wc -l < $L/jobs) jobs"
xargs -P ${P:-10} -L 1 sh -c 'if [ "$1" = ALL ]; then a=""; else a="$1 --exact"; fi; TOOLS=memcheck OUT='"$L"'/$0-$1 SAN_TIMEOUT='"$R"' SAN_TAG=$1 SAN_ARGS="$a" scripts/sanitize.sh $0 > '"$L"'/$0-$1.log 2>&1' < $L/jobs
for f in $L/*-*.log; do grep -hE "memcheck:" "$f" | sed "s/^/${f##*/}: /" | cut -c1-230; done
grep -hE "^(1b|part)" $L/*/san/*.log | head
tar -czf $OUT/logs-d2.tgz -C /tmp D2; echo "end at $((SECONDS-T0)) s"
