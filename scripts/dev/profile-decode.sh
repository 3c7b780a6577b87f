#!/usr/bin/env bash
# Kernel-level profile of one decode graph step on the GPU host:
#   scripts/dev/profile-decode.sh BENCH_DECODE_BINARY OUTDIR [BATCH...]
# For each batch size: ncu (clock control off, collection only inside `bench-decode --profile`'s
# one step). Summarise with scripts/dev/ncu_summary.py OUTDIR/ncu-b*.csv.
set -u
b=${1:?bench-decode binary}; out=${2:?outdir}; shift 2
batches=${*:-1 16 64}
mkdir -p "$out"
m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size
for bs in $batches; do
  timeout 150 ncu --profile-from-start off --clock-control none --metrics "$m" --csv --log-file "$out/ncu-b$bs.csv" \
    "$b" --batches "$bs" --context 128 --profile > "$out/ncu-b$bs.stdout" 2>&1
  echo "ncu batch $bs: rc $? lines $(wc -l < "$out/ncu-b$bs.csv")"
done
