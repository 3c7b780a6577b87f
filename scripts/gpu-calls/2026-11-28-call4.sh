# Call 4 of the 2026-11-28 session (bundle of .gpu-tar/commit, 4cbe5b2: the tensor-core products and
# the leaner attention tile): the mutation of gpu_mma (the plain products loading weights early) must
# fail its wait test; every test executable plainly, alone; then bench-decode (no PyTorch) of this
# build, of the build before (.gpu-tar/old-bench-decode.tar.xz, e429103) and of this build with the
# tensor-core products on (CUDA_ASYNC_MMA=1). One deadline for all.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/F4; mkdir -p $L/plain; END=$((T0+585))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 60 .gpu-tar/mut-mma-early --test-threads=1 products_wait_for_weights_written_ahead --exact > $L/mut-mma.log 2>&1; echo "mutation mma-early exit $? (nonzero expected): $(grep -hE '^test result|round [0-9]+' $L/mut-mma.log | head -2 | cut -c1-220)"
suite() { local exe=$(ls .gpu-bundle/tests/*--$1 | head -1); timeout $2 $exe --test-threads=1 > $L/plain/$1.log 2>&1; echo "$1 exit $? at $((SECONDS-T0)) s: $(grep '^test result' $L/plain/$1.log)"; }
for t in .gpu-bundle/tests/*; do s=${t##*--}; left=$((330-SECONDS+T0)); [ $left -gt 5 ] || { echo "$s: no time left"; continue; }; suite $s $left; done
cat $L/plain/*.log | grep -E '^test result:' | awk '{p+=$4; f+=$6; i+=$8} END {print "bundle summary: " p " passed, " f " failed, " i " ignored"}'
grep -hE "FAILED|panicked|failed:" $L/plain/*.log | head -20
rm -rf /tmp/oldbd; tar -xJf .gpu-tar/old-bench-decode.tar.xz -C /tmp
bd() { local name=$1; shift; local R=$((END-SECONDS)); [ $R -gt 20 ] || { echo "$name: no time"; return; }; timeout $R "$@" --no-torch --json $OUT/bench-decode-$name.json > $L/bd-$name.log 2>&1; echo "bench-decode $name exit $? at $((SECONDS-T0)) s"; grep -E "^ *(batch|[0-9]+ ) |awaited|time to first|largest difference" $L/bd-$name.log | head -14 | cut -c1-200; }
bd new .gpu-bundle/bin/bench-decode --batches 1,16,64
bd old /tmp/oldbd/bench-decode --batches 1,16,64
CUDA_ASYNC_MMA=1 bd mma .gpu-bundle/bin/bench-decode --batches 16,64
tar -czf $OUT/logs-f4.tgz -C /tmp F4; echo "end at $((SECONDS-T0)) s"
