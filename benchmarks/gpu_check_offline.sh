#!/bin/sh
# The GPU check on a box without a package index (docs/PERFORMANCE.md, "The GPU check"): `make wheelhouse` copies
# this script into wheelhouse/ as gpu-check.sh beside rcswarm's wheel and the wheels a CUDA image usually lacks.
# On the box, whose python3 already has a CUDA torch and triton: `sh wheelhouse/gpu-check.sh [rcswarm bench gpu
# arguments]`. The wheels go to $RCSWARM_SITE (default /tmp/rcswarm-site), put first on PYTHONPATH for the check
# and the processes it starts; nothing of the box's own Python is changed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
site=${RCSWARM_SITE:-/tmp/rcswarm-site}
python3 -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" "$here"/*.whl
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m rcswarm.cli bench gpu "$@"
