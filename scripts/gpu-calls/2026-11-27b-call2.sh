# Call 2: timings alone — bench-decode under four attention split policies (CUDA_ASYNC_ATTN_SPLIT_MIN
# 1 = the earlier policy, 128 = the default, 64, 256), bench-core and bench-async, ncu over one
# batch-1 step and one 512-token prefill (default policy and the earlier one), gpu_completion and
# gpu_llama alone (tests changed after call 1); then racecheck of the suites with kernels of their
# own, bounded by the call's time.
[ -d .gpu-bundle ] || tar -xJf .gpu-tar/bundle.tar.xz; B=.gpu-bundle/bin; L=/tmp/L2 && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; command -v ncu nsys
for m in 1 128 64 256; do CUDA_ASYNC_ATTN_SPLIT_MIN=$m timeout 90 $B/bench-decode --no-torch --ttft 512 --json $OUT/bench-decode-split$m.json > $L/bd$m.log 2>&1; echo "split_min $m exit $? at $((SECONDS-T0)) s"; grep -vE "^\s*$" $L/bd$m.log | tail -12; done
for b in bench-core bench-async; do timeout 70 $B/$b --json $OUT/$b.json > $L/$b.log 2>&1; echo "$b exit $? at $((SECONDS-T0)) s"; grep -E "ratio|goal|correct" $L/$b.log | tail -8; done
for m in 128 1; do CUDA_ASYNC_ATTN_SPLIT_MIN=$m timeout 80 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv $B/bench-decode --profile --batches 1 --ttft 512 > $L/ncu$m.csv 2> $L/ncu$m.err; echo "ncu split_min $m exit $? at $((SECONDS-T0)) s"; tail -2 $L/ncu$m.err; done
for t in gpu_completion gpu_llama; do CUDA_ASYNC_REQUIRE_GPU=1 timeout 100 .gpu-bundle/tests/*--$t --test-threads=1 > $L/$t.log 2>&1; echo "$t exit $? at $((SECONDS-T0)) s"; grep -E "^test result|FAILED|early wakes|free-running|unclear" $L/$t.log | head -8; done
G=()
for s in attention prefill kernel_ops kernel_bounds user_kernels mlp interop graph; do G+=(racecheck:gpu_$s); done
DEADLINE=$((565-SECONDS+T0)) OUT=$L/r scripts/gpu-round.sh "${G[@]}" 2>&1 | tail -60
echo "end at $((SECONDS-T0)) s"; cp $L/r/logs.tgz $OUT/logs2.tgz; tar -czf $OUT/bench2.tgz -C $L --exclude r .
