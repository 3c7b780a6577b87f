# What the 2026-11-27 runs left unverified (docs/results/gpu-runs-2026-11-27.md), first of two
# device calls: the serving check with the openai wheels, bench-core/bench-async again (rows A and
# 4), alone; then racecheck of gpu_sampling and gpu_server side by side. Carry .gpu-tar (the bundle
# of the commit to verify, packed as .gpu-tar/bundle.tar.xz, with this file) and .whl
# (scripts/fetch-wheels.sh); run as `bash .gpu-tar/next-verify-1.sh` (copy it there first).
tar -xJf .gpu-tar/bundle.tar.xz && B=.gpu-bundle/bin && L=/tmp/L && mkdir -p $L && T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for b in bench-core bench-async; do timeout 60 $B/$b --json $OUT/$b.json > $L/$b.log 2>&1; echo "$b exit $?"; tail -2 $L/$b.log; done
BIN=$B OUT=$L/serve MODEL_DIR=/tmp/model-1b timeout 300 scripts/serve-check.sh > $L/serve-check.log 2>&1; echo "serve exit $? at $((SECONDS-T0)) s"; tail -14 $L/serve-check.log; cp $L/serve/*.json $OUT/
R=$((570-SECONDS+T0))
# gpu_sampling's first test (many draws for its chi-square) did not finish in 125 s under racecheck
# (H200, 2026-11-27): it gets a process of its own, the other tests another.
(TOOLS=racecheck OUT=$L/a SAN_TIMEOUT=$R SAN_TAG=dist SAN_ARGS="distribution_matches_host --exact" scripts/sanitize.sh gpu_sampling > $L/rs1.log 2>&1) &
(TOOLS=racecheck OUT=$L/c SAN_TIMEOUT=$R SAN_TAG=rest SAN_ARGS="--skip distribution_matches_host" scripts/sanitize.sh gpu_sampling > $L/rs2.log 2>&1) &
(TOOLS=racecheck OUT=$L/b SAN_TIMEOUT=$R scripts/sanitize.sh gpu_server > $L/rv.log 2>&1) &
wait; cat $L/rs1.log $L/rs2.log $L/rv.log; tar -czf $OUT/logs.tgz -C $L --exclude model-1b .
