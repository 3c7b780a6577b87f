# One sanitizer job of a device call, bounded by the call's deadline (so the call's logs are always
# packed before the device tool's limit):
#   bash scripts/gpu-calls/san-job.sh TOOL SUITE TEST|ALL DEADLINE_EPOCH_S LOGDIR
tool=$1 suite=$2 t=$3 d=$4 L=$5
R=$((d - $(date +%s))); [ $R -gt 10 ] || { echo "$suite $t: no time left"; exit 0; }
if [ "$t" = ALL ]; then a=""; else a="$t --exact"; fi
TOOLS=$tool OUT=$L/$suite-$t SAN_TIMEOUT=$R SAN_TAG=$t SAN_ARGS="$a" scripts/sanitize.sh "$suite" > "$L/$suite-$t.log" 2>&1
echo "$suite $t done at $(date +%T): $(grep -hE "$tool( \(.*\))?:" "$L/$suite-$t.log" | cut -c40-150)"
