# Second of two device calls (see next-verify-1.sh): gpu_llama under racecheck, covered whole by
# two processes side by side (all tests but hf_reference_1b, and hf_reference_1b alone), and under
# memcheck, each bounded by the call's time.
tar -xJf .gpu-tar/bundle.tar.xz && L=/tmp/L && mkdir -p $L && T0=$SECONDS
R=$((570-SECONDS+T0))
(TOOLS=racecheck OUT=$L/a SAN_TIMEOUT=$R SAN_TAG=rest SAN_ARGS="--skip hf_reference_1b" scripts/sanitize.sh gpu_llama > $L/r1.log 2>&1) &
(TOOLS=racecheck OUT=$L/b SAN_TIMEOUT=$R SAN_TAG=1b SAN_ARGS="hf_reference_1b --exact" scripts/sanitize.sh gpu_llama > $L/r2.log 2>&1) &
(TOOLS=memcheck OUT=$L/c SAN_TIMEOUT=$R scripts/sanitize.sh gpu_llama > $L/m.log 2>&1) &
wait; cat $L/r1.log $L/r2.log $L/m.log; tar -czf $OUT/logs.tgz -C $L .
