#!/usr/bin/env bash
# Builds cuda-core/cuda/set_conditional.fatbin from cuda-core/cuda/set_conditional.cu with nvcc
# (CUDA 12.4+), linking the device runtime. Run it on a machine with the CUDA toolkit (the GPU
# host has one) and commit the result; cuda-core embeds it with include_bytes!.
#   scripts/build-set-conditional.sh [OUT]      (default: cuda-core/cuda/set_conditional.fatbin)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src="$here/cuda-core/cuda/set_conditional.cu"
out=${1:-"$here/cuda-core/cuda/set_conditional.fatbin"}
tmp=$(mktemp -d)
# Relocatable device code for Hopper and newer Ampere/Ada targets, then a device link against
# libcudadevrt into a fatbin the driver can load directly (cuModuleLoadData).
archs=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_89,code=sm_89 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90)
nvcc "${archs[@]}" -rdc=true -c "$src" -o "$tmp/set_conditional.o"
nvcc "${archs[@]}" -dlink -fatbin "$tmp/set_conditional.o" -lcudadevrt -o "$out"
rm -rf "$tmp"
ls -l "$out"
