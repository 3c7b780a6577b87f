# Call 5 of the fifth 2026-11-27 session (bundle of .gpu-tar/commit, the final build): the
# benchmarks alone on the GPU, one after the other: bench-decode with the PyTorch baselines (the
# gpt-fast style static-cache decode as a CUDA graph and with torch.compile reduce-overhead, the
# Hugging Face CUDA graph, PyTorch's prefill at 512), then bench-completion (the fair 64-task
# benchmark), bench-async and bench-graph (issue 20's ratios). One deadline for all.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/E5; mkdir -p $L; END=$((T0+575)); B=.gpu-bundle/bin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
R=$((END-190-SECONDS)); timeout $R $B/bench-decode --ttft 128,512,2048 --torch-modes cudagraph --torch-static-variants cuda_graph,compile_reduce_overhead --torch-ttft 512 --json $OUT/bench-decode-h100.json > $L/bench-decode.log 2>&1; echo "bench-decode exit $? at $((SECONDS-T0)) s (limit $R)"; grep -vE "^\s*$|it/s\]" $L/bench-decode.log | tail -32
for b in bench-completion bench-async bench-graph; do R=$((END-SECONDS)); [ $R -gt 10 ] || { echo "$b: no time"; continue; }; timeout $((R<65?R:65)) $B/$b --json $OUT/$b.json > $L/$b.log 2>&1; echo "$b exit $? at $((SECONDS-T0)) s"; grep -E "goals met|correct|ratio|^ *(F[0-9]|[0-9][ab]?|A|B) " $L/$b.log | tail -12 | cut -c1-160; done
tar -czf $OUT/logs-e5.tgz -C /tmp E5; echo "end at $((SECONDS-T0)) s"
