#!/bin/sh
# A lent GPU's whole check in one call (docs/PERFORMANCE.md, "The GPU check"). `make wheelhouse` copies this script
# into wheelhouse/ as lease.sh beside gpu-check.sh and the wheels; on the box, from the repository's root (its tests
# run too): `sh wheelhouse/lease.sh [MINUTES]`. It prints the card, runs the check within MINUTES (default 7) with
# the parts that took least on an H100 first (bptt, swarm, then kernels, timings), then the CUDA-only tests (at most
# 2 minutes; they need the box's pytest). The JSON and both logs go to $OUT (default: the current folder), so a call
# cut off keeps them. Exit status: 0 when the check and the tests passed, else 1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
minutes=${1:-7}
out=${OUT:-.}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export RCSWARM_SITE="${RCSWARM_SITE:-$PWD/.site}"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: no NVIDIA GPU listed"
sh "$here/gpu-check.sh" --quick --budget-minutes "$minutes" --parts bptt swarm kernels timings \
    --out "$out/gpu-check.json" > "$out/check.log" 2>&1
check=$?
echo "check exit $check"
cat "$out/check.log"
if python3 -c "import pytest" 2>/dev/null; then
    PYTHONPATH="$RCSWARM_SITE${PYTHONPATH:+:$PYTHONPATH}" timeout 120 python3 -m pytest -q -p no:cacheprovider \
        -k cuda tests/train tests/kernels tests/models > "$out/pytest.log" 2>&1
    tests=$?
else
    echo "pytest is not installed for python3 here: the CUDA-only tests did not run" > "$out/pytest.log"
    tests=1
fi
echo "cuda tests exit $tests"
tail -n 25 "$out/pytest.log"
[ "$check" -eq 0 ] && [ "$tests" -eq 0 ]
