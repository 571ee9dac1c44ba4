"""``python -m refconv.bench kernels --quick`` runs and prints one row per pass and shape."""

import json
import subprocess
import sys

from refconv import arrays
from refconv.bench import PASSES, QUICK_SHAPES


def test_quick_kernel_bench(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "refconv.bench", "kernels", "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    text = result.stdout
    impl = "refconv v2" if arrays.gpu_available() else "refconv numpy"
    if not arrays.gpu_available():
        assert "ran on the CPU" in text
    for shape in QUICK_SHAPES:
        for pass_ in PASSES:
            assert any(line.startswith(shape) and pass_ in line and impl in line for line in text.splitlines()), (
                f"no row for {shape} {pass_} {impl} in:\n{text}")
    rows = json.loads(out.read_text())["rows"]
    assert {(r["shape"], r["pass_"]) for r in rows} == {(s, p) for s in QUICK_SHAPES for p in PASSES}
    assert all(r["ms"] > 0 and r["gflops"] > 0 for r in rows)
