# Call 7 (final build): llama-server --llama-1b (its own check: every generated token equals the
# same row replayed alone in its bucket, all slots free) at 32 and 256 tokens per request, alone.
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
timeout 70 .gpu-bundle/bin/llama-server --llama-1b > $OUT/ls32.log 2>&1; echo "tokens 32 exit $? at $((SECONDS-T0)) s"; tail -4 $OUT/ls32.log
timeout 100 .gpu-bundle/bin/llama-server --llama-1b --tokens 256 > $OUT/ls256.log 2>&1; echo "tokens 256 exit $? at $((SECONDS-T0)) s"; tail -4 $OUT/ls256.log
