"""docs/cluster.md's "on one machine" block runs as written (info, two sweeps, plot) in a
temporary directory, with the venv's commands first on PATH, and leaves what the page says."""

import os
import pathlib
import re
import subprocess
import sys

from refconv.bench.schema import read_lines

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cluster.md"
MARKER = "<!-- tested: tests/docs_and_tutorials/test_cluster_docs.py -->"


def _tested_block():
    match = re.search(re.escape(MARKER) + r"\n```sh\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    assert match, f"{PAGE.name}: no ```sh block after {MARKER}"
    return match.group(1)


def test_the_local_block_runs_and_leaves_results_and_plots(tmp_path):
    block = _tested_block()
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "CUDA-aware" in result.stdout and "1 rank(s):" in result.stdout  # refconv info
    lines = read_lines(tmp_path / "results.jsonl")
    points = [(line["config"]["sweep"]["scaling"], line["config"]["sweep"]["strategy"], line["config"]["ranks"])
              for line in lines]
    assert points == [("strong", "sample", 1), ("strong", "stationary-x", 1), ("strong", "sample", 2),
                      ("strong", "stationary-x", 2), ("weak", "stationary-x", 1), ("weak", "stationary-x", 2)]
    assert [line["config"]["batch"] for line in lines] == [4, 4, 4, 4, 4, 8]
    for png in ("scaling.png", "breakdown.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "no --machine: the predicted-vs-measured overlay is left out" in result.stdout
