#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels that the GPU host lacks for the official `openai`
# Python client, so that scripts/serve-check.sh can install them offline into /tmp/site and run
# scripts/openai_check.py there. The GPU host has Python 3.12 with httpx, anyio, tqdm,
# typing-extensions, idna, certifi, h11 and httpcore, but not pydantic.
#
# The versions are pinned and mutually compatible (checked against each wheel's Requires-Dist):
#   openai 2.8.0       needs httpx<1 (not httpx2), anyio>=3.5, distro, jiter>=0.10, pydantic>=1.9,
#                      sniffio, tqdm, typing-extensions>=4.11
#   pydantic 2.11.7    needs pydantic-core==2.33.2, annotated-types>=0.6, typing-inspection>=0.4,
#                      typing-extensions>=4.12.2
#   pydantic-core 2.33.2, typing-inspection 0.4.1 (typing-extensions>=4.12), annotated-types 0.7.0,
#   jiter 0.10.0, distro 1.9.0, sniffio 1.3.1
# (openai 3.x moved to httpx2 and pydantic 2.14 needs typing-extensions>=4.16: not used.)
#
# Usage: scripts/fetch-wheels.sh   (from the repository root; re-running skips present wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PINS=(
  openai==2.8.0
  pydantic==2.11.7
  pydantic-core==2.33.2
  annotated-types==0.7.0
  typing-inspection==0.4.1
  distro==1.9.0
  jiter==0.10.0
  sniffio==1.3.1
)
for pin in "${PINS[@]}"; do
  timeout 300 python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$pin"
done
n=$(ls .whl/*.whl | wc -l)
echo "fetch-wheels: ${n} wheels in .whl/ (${#PINS[@]} pinned)"
ls .whl/
