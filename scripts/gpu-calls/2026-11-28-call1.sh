# Call 1 of the 2026-11-28 session: the tensor-core products lab (scripts/dev/mma_lab.cu, built
# here with nvcc: cuBLAS against kernels/cuda/mma.cu at 16/32/64 rows, every product type of the
# Llama-3.2-1B step), then ncu of one batched decode step at 16 and 64 rows on the bundle of
# .gpu-tar/commit (the cuBLAS path the decoder runs above 8 rows), to see where those steps go.
T0=$SECONDS; L=/tmp/F1; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
timeout 120 nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda -Xptxas -v scripts/dev/mma_lab.cu -lcublas -o /tmp/mma_lab > $L/build.txt 2>&1; echo "lab build rc $? at $((SECONDS-T0)) s"
grep -E "error" $L/build.txt | head -20
grep -A1 -E "Compiling entry function '(mma_|_Z)" $L/build.txt | grep -E "mma_|spill" | head -40 > $OUT/lab-ptxas.txt; grep -B1 -A2 "mma_.*_n8'" $L/build.txt | grep -E "Used|spill" | head -12
[ -x /tmp/mma_lab ] && timeout 240 /tmp/mma_lab > $OUT/mma-lab.txt 2>&1; echo "lab rc $? at $((SECONDS-T0)) s"; grep -E "==|best|ALL|error|NaN" $OUT/mma-lab.txt
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
export CUDA_ASYNC_REQUIRE_GPU=1
timeout 150 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv .gpu-bundle/bin/bench-decode --profile --batches 16,64 > $OUT/ncu-b16-64.csv 2> $L/ncu.err; echo "ncu exit $? at $((SECONDS-T0)) s, $(wc -l < $OUT/ncu-b16-64.csv) lines"; tail -2 $L/ncu.err
cp $L/build.txt $OUT/lab-build.txt; echo "end at $((SECONDS-T0)) s"
