#!/bin/sh
# A lent GPU's whole check in one call (docs/PERFORMANCE.md, "The GPU check"). `make wheelhouse` copies this script
# into wheelhouse/ as lease.sh beside gpu-check.sh and the wheels; on the box, from the repository's root (its tests
# run too): `sh wheelhouse/lease.sh [MINUTES]`. It prints the card, runs the check within MINUTES (default 7) with
# the parts that took least on an H100 first (bptt, swarm, then kernels, timings), then the CUDA-only tests (at most
# 2 minutes). The JSON and both logs go to $OUT (default: the current folder), so a call cut off keeps them.
set -u
here=$(cd "$(dirname "$0")" && pwd)
minutes=${1:-7}
out=${OUT:-.}
export PYTHONUNBUFFERED=1
export RCSWARM_SITE="${RCSWARM_SITE:-$PWD/.site}"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: no NVIDIA GPU listed"
sh "$here/gpu-check.sh" --quick --budget-minutes "$minutes" --parts bptt swarm kernels timings \
    --out "$out/gpu-check.json" > "$out/check.log" 2>&1
echo "check exit $?"
cat "$out/check.log"
PYTHONPATH="$RCSWARM_SITE" timeout 120 python3 -m pytest -q -p no:cacheprovider -k cuda tests/train tests/kernels \
    > "$out/pytest.log" 2>&1
echo "cuda tests exit $?"
tail -n 25 "$out/pytest.log"
