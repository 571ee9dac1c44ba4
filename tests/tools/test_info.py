"""``refconv info``: alone and under mpiexec, text and JSON; a refused GPU binding
(a fake device count: no GPU here) is one line and exit status 2 on every rank."""

import json
import os
import socket
import subprocess
import sys
import textwrap

from refconv.commands import info
from refconv.bench.schema import ENV, validate
from refconv.testing.mpirun import find_mpiexec

TIMEOUT = 120


def run(args, ranks=1):
    """``refconv ARGS``, under mpiexec when ``ranks`` > 1 (sharing a GPU if the machine has too few)."""
    launch = [find_mpiexec(), "-n", str(ranks)] if ranks > 1 else []
    return subprocess.run([*launch, sys.executable, "-m", "refconv.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=dict(os.environ, REFCONV_OVERSUBSCRIBE_GPUS="1"))


def test_text_names_every_package_and_the_mpi_library():
    result = run(["info"])
    assert result.returncode == 0, result.stderr
    for name in ("refconv", "python", "numpy", "numba", "numba-cuda", "cupy", "mpi4py", "MPI", "CUDA-aware"):
        assert any(line.split()[:1] == [name] or line.strip().startswith(name) for line in result.stdout.splitlines()), (
            name, result.stdout)
    assert "1 rank(s):" in result.stdout


def test_json_under_mpiexec_has_one_row_per_rank():
    result = run(["info", "--json"], ranks=2)
    assert result.returncode == 0, result.stderr
    [text] = result.stdout.splitlines()  # rank 0 prints, once
    record = json.loads(text)
    assert validate(record, ENV) == []
    assert [(r["rank"], r["local_rank"], r["local_size"]) for r in record["ranks"]] == [(0, 0, 2), (1, 1, 2)]
    assert record["mpi"]["ranks"] == 2 and record["versions"] == info.versions()


def test_more_ranks_than_gpus_is_one_line_and_status_2(tmp_path):
    script = tmp_path / "one_gpu.py"
    script.write_text(textwrap.dedent("""
        import sys
        from refconv import cli, device
        device.gpu_count = lambda: 1      # a fake machine with one GPU (the selection is never reached)
        sys.exit(cli.main(["info", "--backend", "cuda"]))
    """))
    result = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, str(script)], capture_output=True,
                            text=True, timeout=TIMEOUT, env=dict(os.environ, REFCONV_OVERSUBSCRIBE_GPUS="0"))
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [f"refconv info: error: 2 ranks on node {socket.gethostname()} share 1 GPU(s) (0): start "
                      f"at most 1 ranks per node, make more GPUs visible (CUDA_VISIBLE_DEVICES), or opt in with "
                      f"--oversubscribe-gpus (REFCONV_OVERSUBSCRIBE_GPUS=1)"], result.stderr
    assert "Traceback" not in result.stderr
