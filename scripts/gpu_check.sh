#!/usr/bin/env bash
# Run the CUDA kernels for real on a GPU machine, from a fresh copy of the repository:
#   bash scripts/gpu_check.sh            (uses ./.venv, creating it if missing)
#   VENV=/path/to/venv bash scripts/gpu_check.sh
# Prints the GPU, runs tests/test_kernels.py on the device (NUMBA_ENABLE_CUDASIM=0),
# then the rest of the fast test suite, then the kernel benchmark (writes out.json).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

echo "== nvidia-smi"
nvidia-smi

if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
echo "== installing refconv[test,cuda12]"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test,cuda12]'

export NUMBA_ENABLE_CUDASIM=0
echo "== does CuPy see the GPU?"
"$VENV/bin/python" -c "import cupy; print('cupy', cupy.__version__, 'devices:', cupy.cuda.runtime.getDeviceCount()); assert cupy.cuda.is_available()"

echo "== kernel tests on the device (fast and slow sets)"
"$VENV/bin/python" -m pytest tests/test_kernels.py tests/test_bench.py -q -ra

echo "== the rest of the fast suite"
"$VENV/bin/python" -m pytest -q -ra -m "not slow" --ignore=tests/test_kernels.py --ignore=tests/test_bench.py || echo "(rest of the suite failed: see above)"

echo "== benchmark"
"$VENV/bin/python" -m refconv.bench kernels --json out.json
echo "== wrote out.json"
