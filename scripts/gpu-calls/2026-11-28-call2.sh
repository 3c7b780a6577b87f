# Call 2 of the 2026-11-28 session: where the decode attention's ~14-28 us a layer go. ncu's full
# section set over one rope_attention launch of one graph step at batch 1, 16 and 64 (bundle of
# .gpu-tar/commit; context 128 as bench-decode's default), details page as text.
T0=$SECONDS; L=/tmp/F2; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
export CUDA_ASYNC_REQUIRE_GPU=1
for b in 1 16 64; do
  timeout 150 ncu --profile-from-start off --clock-control none -k regex:rope_attention --launch-count 1 --set full --import-source no .gpu-bundle/bin/bench-decode --profile --batches $b > $OUT/ncu-attn-b$b.txt 2> $L/ncu-$b.err
  echo "batch $b: ncu exit $? at $((SECONDS-T0)) s"; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Memory Throughput|DRAM Throughput|Stall|One or More Eligible|Issued Warp" $OUT/ncu-attn-b$b.txt | head -20
done
echo "end at $((SECONDS-T0)) s"
