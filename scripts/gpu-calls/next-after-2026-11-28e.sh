# What the fifth 2026-11-28 session left to run (docs/results/gpu-runs-2026-11-28e.md), as two
# device calls: `bash THIS a` then `bash THIS b`. The session left .gpu-tar/ ready for 836a253 (its
# last library commit is 3155765): bundle.tar.xz, commit, mut-pool-forgotten. If the library or
# tests changed since, prepare here first: scripts/gpu-bundle; git rev-parse HEAD > .gpu-tar/commit; cp
# .gpu-tar/commit .gpu-bundle/.commit; XZ_OPT="-T2 -6" tar -cJf .gpu-tar/bundle.tar.xz .gpu-bundle;
# git apply scripts/mutations/pool-forgotten.patch; cargo test --release -p cuda-async-tests --test
# gpu_soundness --no-run; copy the executable to .gpu-tar/mut-pool-forgotten; git apply -R the
# patch. Carry .gpu-tar.
#   a: gpu_soundness::graph_pools_survive_recapture and its mutation (must fail); every test
#      executable alone; memcheck of gpu_soundness; racecheck of gpu_prefill and gpu_sampling (one
#      process per test), which ran out of time in call f.
#   b: racecheck of gpu_llama and gpu_server, one process per test, 8 at a time (270 s or more a
#      test under the tool), with the Hugging Face references; what does not finish is reported.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/N$1; mkdir -p $L/plain $L/m $L/r; END=$(( $(date +%s) + 565 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
t() { ls .gpu-bundle/tests/*--$1; }
list() { $(t $1) --list 2>&1 | sed -nE 's/^\[gpu\] ([a-z_0-9]+): test$/\1/p'; }
if [ "$1" = a ]; then
  timeout 150 $(t gpu_soundness) --test-threads=1 graph_pools_survive_recapture --exact > $L/new.log 2>&1; echo "graph_pools_survive_recapture exit $?: $(grep -E '^test result|FAILED: ' $L/new.log | head -2 | tr '\n' ' ' | cut -c1-240)"
  timeout 150 .gpu-tar/mut-pool-forgotten --test-threads=1 graph_pools_survive_recapture --exact > $L/mut.log 2>&1; echo "mutation pool-forgotten exit $? (must fail): $(grep -E '^test result|FAILED: ' $L/mut.log | head -2 | tr '\n' ' ' | cut -c1-240)"
  for x in .gpu-bundle/tests/*; do s=${x##*--}; timeout 150 $x --test-threads=1 > $L/plain/$s.log 2>&1 || echo "$s exit $?"; done
  cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'; echo "suites done at $((SECONDS-T0)) s"
  grep -hE "^test .*FAILED|FAILED: " $L/plain/*.log | head -8 | cut -c1-220
  bash scripts/gpu-calls/san-job.sh memcheck gpu_soundness ALL $((END-150)) $L/m | cut -c1-200 &
  { list gpu_prefill | sed 's/^/gpu_prefill /'; list gpu_sampling | sed 's/^/gpu_sampling /'; } > $L/rjobs
  xargs -P 7 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$((END-10)) $L/r"' ' < $L/rjobs > $L/r.out 2>&1; wait
  echo "racecheck ended at $((SECONDS-T0)) s: $(grep -l ' racecheck: ok' $L/r/*.log | wc -l) of $(wc -l < $L/rjobs) ok"
  for f in $L/r/*.log; do grep -q ' racecheck: ok' $f || echo "  not ok: $(grep -E 'racecheck: ' $f | tail -1 | cut -c1-230)"; done
else
  (python3 scripts/hf_llama_reference.py --out /tmp/ref1b --shape 1b --steps 8 > $L/ref1b.log 2>&1; echo "ref1b rc $?") &
  python3 scripts/hf_llama_reference.py --out /tmp/refsmall --shape small --steps 16 > $L/refsmall.log 2>&1; echo "refsmall rc $?"; wait
  export LLAMA_REF_DIR_1B=/tmp/ref1b LLAMA_REF_DIR=/tmp/refsmall
  { list gpu_llama | sed 's/^/gpu_llama /'; list gpu_server | sed 's/^/gpu_server /'; } > $L/rjobs
  xargs -P 8 -L 1 sh -c 'bash scripts/gpu-calls/san-job.sh racecheck $0 $1 '"$((END-10)) $L/r"' ' < $L/rjobs > $L/r.out 2>&1
  echo "racecheck ended at $((SECONDS-T0)) s: $(grep -l ' racecheck: ok' $L/r/*.log | wc -l) of $(wc -l < $L/rjobs) ok"
  for f in $L/r/*.log; do grep -q ' racecheck: ok' $f || echo "  not ok: $(grep -E 'racecheck: ' $f | tail -1 | cut -c1-230)"; done
fi
tar -czf $OUT/logs-n$1.tgz -C /tmp --exclude ref1b --exclude refsmall N$1; echo "end at $((SECONDS-T0)) s"
