# Call 4 of the 2026-11-28c session (bundle of .gpu-tar/commit = 308a145, library and tests of the
# final commit 2b98042; plus .gpu-tar/bench-decode of a74b150, whose only change is the awaited
# rows' per-step timing; and the pre-move binaries of fce9bd2 in .gpu-tar/premove.tar.xz), cut
# short to keep device time for a fix found meanwhile (the attention lab and the racechecks alone
# moved to a later call):
#   - bench-core before (fce9bd2) / after, 16 pairs alternating which goes first, then 10 pairs
#     with --launches 500 (fewer launches than the launch queue holds: the host's cost alone);
#   - bench-decode (a74b150) at batch 1, --no-torch: the awaited rows over 7 rounds with every
#     step timed (enable_all runtime).
[ -d .gpu-bundle ] && [ "$(cat .gpu-bundle/.commit 2>/dev/null)" = "$(cat .gpu-tar/commit)" ] || { rm -rf .gpu-bundle; tar -xJf .gpu-tar/bundle.tar.xz && cp .gpu-tar/commit .gpu-bundle/.commit; }
T0=$SECONDS; L=/tmp/C4; mkdir -p $L/core; END=$(( $(date +%s) + 300 ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat .gpu-tar/commit
export CUDA_ASYNC_REQUIRE_GPU=1
rm -rf /tmp/premove-bin; tar -xJf .gpu-tar/premove.tar.xz -C /tmp
core() { local side=$1 tag=$2; shift 2; local bin=.gpu-bundle/bin/bench-core; [ $side = before ] && bin=/tmp/premove-bin/bench-core
  timeout 60 $bin --json $L/core/$tag-$side.json "$@" > $L/core/$tag-$side.log 2>&1 || echo "bench-core $tag $side exit $?"; }
for i in $(seq 1 16); do if [ $((i%2)) = 1 ]; then core before d$i; core after d$i; else core after d$i; core before d$i; fi; done; echo "bench-core default pairs done at $((SECONDS-T0)) s"
for i in $(seq 1 10); do if [ $((i%2)) = 1 ]; then core before s$i --launches 500; core after s$i --launches 500; else core after s$i --launches 500; core before s$i --launches 500; fi; done; echo "bench-core 500-launch pairs done at $((SECONDS-T0)) s"
python3 - $L/core <<'PY'
import json, glob, os, statistics as st, sys
d = sys.argv[1]
for tag in ("d", "s"):
    for row in ("A", "B"):
        r = {"before": [], "after": []}; fw = {"before": [], "after": []}
        for side in r:
            for p in sorted(glob.glob(f"{d}/{tag}*-{side}.json")):
                for x in json.load(open(p))["rows"]:
                    if x["name"].startswith(row + " "): r[side].append(x["ratio"]); fw[side].append(x["framework"] - x["raw"])
        if r["before"]:
            print(f"{tag} {row}: n {len(r['before'])}/{len(r['after'])} ratio median before {st.median(r['before']):.4f} after {st.median(r['after']):.4f}; "
                  f"framework-raw us median before {st.median(fw['before']):.4f} after {st.median(fw['after']):.4f}; "
                  f"after>before in {sum(a > b for a, b in zip(r['after'], r['before']))} of {min(len(r['after']), len(r['before']))} pairs")
PY
tar -czf $OUT/bench-core-pairs.tgz -C $L core
for rt in ""; do
  timeout 120 .gpu-tar/bench-decode --no-torch --batches 1 --ttft 128 $rt --json $OUT/bench-decode-await${rt:+-timers}.json > $L/bd$rt.log 2>&1; echo "bench-decode $rt exit $? at $((SECONDS-T0)) s"
  grep -E "^ +1 |blocking|median step|early wakes|CPU|OS floor" $L/bd$rt.log | cut -c1-250
done
tar -czf $OUT/logs-c4.tgz -C /tmp C4; echo "end at $((SECONDS-T0)) s"
