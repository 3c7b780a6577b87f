# The fifth 2026-11-28 session's call d: where the launch row's 20 ns since the house move comes
# from (issue 20). Three builds of bench-core, in .gpu-tar-d/pairs/: `premove` (fce9bd2, before the
# move), `final` (this session's library, a347f15/91c804e) and `nobind` (the final library with
# scripts/mutations/launch-no-bind.patch: Function::launch without the per-call context check
# that f9693e9 added after the move, as a soundness fix). Rounds of the three back to back, the
# order rotating from round to round: 18 rounds with the defaults (10,000 launches a sample), then
# 12 with --launches 500 (fewer than the driver's queue holds: the host's cost alone).
T0=$SECONDS; L=/tmp/Ed; mkdir -p $L/core; END=$(( $(date +%s) + ${1:-200} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
export CUDA_ASYNC_REQUIRE_GPU=1
B=.gpu-tar-d/pairs; chmod +x $B/*
core() { local b=$1 tag=$2; shift 2; [ $(( END - $(date +%s) )) -gt 8 ] || return 0
  timeout 30 $B/bench-core-$b --json $L/core/$tag-$b.json "$@" > $L/core/$tag-$b.log 2>&1 || echo "bench-core $b $tag exit $?"; }
orders=("premove final nobind" "final nobind premove" "nobind premove final" "premove nobind final" "final premove nobind" "nobind final premove")
for i in $(seq 1 18); do for b in ${orders[$((i%6))]}; do core $b d$i; done; done; echo "default rounds done at $((SECONDS-T0)) s"
for i in $(seq 1 12); do for b in ${orders[$((i%6))]}; do core $b s$i --launches 500; done; done; echo "500-launch rounds done at $((SECONDS-T0)) s"
python3 - $L/core <<'PY'
import json, glob, statistics as st, sys
d = sys.argv[1]
for g in ("d", "s"):
    for row in ("A", "B"):
        out = []
        for b in ("premove", "final", "nobind"):
            r = [x["ratio"] for p in sorted(glob.glob(f"{d}/{g}*-{b}.json")) for x in json.load(open(p))["rows"] if x["name"].startswith(row + " ")]
            f = [x["framework"] - x["raw"] for p in sorted(glob.glob(f"{d}/{g}*-{b}.json")) for x in json.load(open(p))["rows"] if x["name"].startswith(row + " ")]
            if r: out.append(f"{b} n {len(r)} ratio {st.median(r):.4f} fw-raw {st.median(f)*1000:.1f} ns")
        print(f"{g} {row}: " + "; ".join(out))
PY
tar -czf $OUT/bench-core-triples.tgz -C $L core; echo "end at $((SECONDS-T0)) s"
