# Call e of the 2026-11-28d session: bench-decode's awaited rows at batch 1 (--no-torch --batches 1
# --ttft 128) of three builds, rotating the order, 4 rounds: "old" (the library of 62327aa), "new"
# (af519ab: completed ops' records dropped in run_wakers after the task's wake) and "V" (the same,
# with the record dropped before the wake, the order of the sweep's drop before af519ab). Call d
# found the current-thread awaited step higher on af519ab than on 62327aa in 4 of 4 pairs.
T0=$SECONDS; L=/tmp/De; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
export CUDA_ASYNC_REQUIRE_GPU=1
for i in 1 2 3 4; do
  case $i in 1) order="old new V";; 2) order="new V old";; 3) order="V old new";; 4) order="old V new";; esac
  for side in $order; do
    timeout 60 .gpu-tar-e/bench-decode-$side --no-torch --batches 1 --ttft 128 --json $L/$side-$i.json > $L/$side-$i.log 2>&1
    echo "round $i $side exit $? at $((SECONDS-T0)) s: $(grep -E '^median step' $L/$side-$i.log | cut -c1-200); $(grep -E '^early wakes' $L/$side-$i.log | cut -c1-90)"
  done
done
tar -czf $OUT/logs-de.tgz -C /tmp De; echo "end at $((SECONDS-T0)) s"
