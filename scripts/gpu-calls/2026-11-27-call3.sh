# The device command of call 3 of 2026-11-27 (docs/results/gpu-runs-2026-11-27.md), run as
# `bash .gpu-tar/callA.sh` with the bundle packed in .gpu-tar/bundle.tar.xz (carried).
tar -xJf .gpu-tar/bundle.tar.xz && B=.gpu-bundle/bin && L=/tmp/L && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in bench-core bench-async bench-graph bench-completion; do timeout 80 $B/$b --json $OUT/$b.json > $L/$b.log 2>&1; echo "$b exit $? at $((SECONDS-T0)) s"; tail -3 $L/$b.log; done
G=(suites run:llama-server:--llama-1b run:llama-server:--llama-1b:--tokens:256)
for s in access async attention capture_races completion core graph graph_build interop kernel_bounds kernel_ops llama mlp multi prefill sampling server soundness user_kernels wakers; do G+=(memcheck:gpu_$s); done
for s in attention sampling prefill kernel_ops kernel_bounds user_kernels mlp server interop graph; do G+=(racecheck:gpu_$s); done
DEADLINE=$((575-SECONDS+T0)) OUT=$L/r scripts/gpu-round.sh "${G[@]}" 2>&1 | tail -150
cp $L/r/logs.tgz $OUT/logs.tgz; tar -czf $OUT/benchlogs.tgz -C $L --exclude r .
