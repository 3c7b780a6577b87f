# Call 4 of the 2026-11-28b session: an A/B of the awaited decode step, after call 3's headline run
# gave +103.9 us on the enable_all current-thread runtime (and +13.8 us on timers-only ones in the
# next run). Two bench-decode binaries of 0ddf4dd built alike here (cargo build --release -p
# cuda-async-examples --bin bench-decode): `mark` as committed (the early-woken spin also reads the
# op's progress mark), `nomark` with that read disabled (the spin waits for the engine's
# completion, as before 86a4058). Three rounds, each: mark / nomark on enable_all runtimes, then
# mark / nomark with --timers-only; batch 1 only, no PyTorch.
T0=$SECONDS; L=/tmp/N4; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; git log -1 --format=%h 2>/dev/null
export CUDA_ASYNC_REQUIRE_GPU=1
for r in 1 2 3; do
  for rt in all timers; do
    for v in mark nomark; do
      extra=""; [ $rt = timers ] && extra="--timers-only"
      timeout 60 .gpu-tar/ab/bench-decode-$v --batches 1 --ttft 128 --no-torch $extra --json $L/ab-$v-$rt-$r.json > $L/ab-$v-$rt-$r.log 2>&1
      echo "round $r $rt $v exit $? at $((SECONDS-T0)) s: $(grep -E '^batch 1, 8 positions' $L/ab-$v-$rt-$r.log | sed 's/batch 1, 8 positions: //' | cut -c1-170) | $(grep -E '^early wakes' $L/ab-$v-$rt-$r.log | sed 's/early wakes: //' | cut -c1-90)"
    done
  done
done
tar -czf $OUT/logs-n4.tgz -C /tmp N4; echo "end at $((SECONDS-T0)) s"
