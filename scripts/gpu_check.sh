#!/usr/bin/env bash
# The one-shot device check, one command: its step limits add up to 500 s on one H200
# (under the 600 s a device machine allows one command):
#   bash scripts/gpu_check.sh              # on a GPU machine; results in $OUT (default gpu_out/)
#   bash scripts/gpu_check.sh --dry-run    # the rehearsal on a CPU: the simulator, tiny shapes (make gpu-dry-run)
#   bash scripts/gpu_check.sh --only env compile tests; bash scripts/gpu_check.sh --only kernels ranks train
#                                          # the same in two calls, each under 300 s
# It installs nothing and needs no network.  It uses, in this order: $PYTHON if set, this
# tree's .venv (make setup) if there is one, else the machine's python3 (a GPU image with
# numba-cuda, CuPy, mpi4py and torch).  When refconv is not installed for that Python, a
# folder of links stands in for the install (kernels/ is installed as refconv.kernels).
# Its first step is a preflight: it imports what every step needs and, for a missing module,
# prints the wheels to carry (pip download here, pip install --no-index there).
# The steps, their limits and what they write: scripts/gpu_check.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
echo "== python: $PYTHON ($("$PYTHON" --version 2>&1))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if ! "$PYTHON" -c "import refconv.kernels" 2>/dev/null; then
    SHIM="$(cd "$OUT" && pwd)/site"
    rm -rf "$SHIM" && mkdir -p "$SHIM/refconv"
    for entry in "$PWD"/refconv/*; do ln -s "$entry" "$SHIM/refconv/"; done
    ln -s "$PWD/kernels" "$SHIM/refconv/kernels"
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
    echo "== refconv is not installed for $PYTHON: importing it from $SHIM (links into this tree)"
fi
exec "$PYTHON" scripts/gpu_check.py --out "$OUT" "$@"
