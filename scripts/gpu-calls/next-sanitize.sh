# What the 2026-11-27 sessions left unverified under the sanitizers (docs/results/gpu-runs-2026-11-27b.md),
# for the next device call: every test of the named suites in a process of its own under one tool,
# at most P at a time, each bounded by the call's time. Carry .gpu-tar (the bundle of the commit to
# verify, packed as .gpu-tar/bundle.tar.xz, with this file) and run e.g.
#   TOOL=racecheck P=8 bash .gpu-tar/next-sanitize.sh gpu_sampling gpu_server
#   TOOL=racecheck P=6 bash .gpu-tar/next-sanitize.sh gpu_llama
#   TOOL=memcheck  P=6 bash .gpu-tar/next-sanitize.sh gpu_llama
# (racecheck of gpu_sampling's rows_beyond_the_grid ran past 340 s, gpu_server's first test past
# 540 s, beside other sanitizer processes: give them a call of their own.)
[ -d .gpu-bundle ] || tar -xJf .gpu-tar/bundle.tar.xz
L=${LSDIR:-/tmp/LS-${TOOL:-racecheck}-$1} && mkdir -p $L && T0=$SECONDS; R=$((${CALL_S:-570}-SECONDS+T0))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for suite in "$@"; do
  exe=$(ls .gpu-bundle/tests/*--"$suite" | head -1)
  "$exe" --list 2>/dev/null | sed -n 's/: test$//p' | sed 's/^\[gpu\] //' | while read -r t; do echo "$suite $t"; done
done > $L/jobs
cat $L/jobs
xargs -P "${P:-8}" -L 1 sh -c 'TOOLS='"${TOOL:-racecheck}"' OUT='"$L"'/$0-$1 SAN_TIMEOUT='"$R"' SAN_TAG=$1 SAN_ARGS="$1 --exact" scripts/sanitize.sh $0 > '"$L"'/$0-$1.log 2>&1' < $L/jobs
for f in $L/*.log; do grep -hE "memcheck:|racecheck:" "$f"; done
tar -czf $OUT/logs-sanitize-${TOOL:-racecheck}-$1.tgz -C $L .
