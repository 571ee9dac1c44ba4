"""examples/slurm/: the sbatch scripts parse (``bash -n``), and run end to end on this
machine through fake ``sbatch`` and ``srun`` commands put first on PATH: ``sbatch``
sets the job's Slurm variables and runs the script; ``srun -n N ...`` logs its
arguments and runs the program with ``mpiexec -n N``.  The sizes are shrunk through
the scripts' own environment overrides (one strategy, 1-2 ranks, a tiny layer)."""

import os
import pathlib
import stat
import subprocess
import sys

import pytest

from refconv.bench.schema import read_lines

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "examples" / "slurm").glob("*.sbatch"))
TIMEOUT = 300

# srun's documented options that the scripts use (srun(1), Slurm 22.05 and later): a
# name the shim does not know fails the job, so a misspelt or made-up option is caught.
SRUN = r"""#!/bin/bash
# fake srun: log the arguments, check each option against srun(1), run the program under mpiexec
echo "srun $*" >> "$SHIM_LOG"
n=1; nodes=""; cpus=""
while [ $# -gt 0 ]; do
    case "$1" in
        -n|--ntasks) n=$2; shift 2 ;;
        --ntasks=*) n=${1#--ntasks=}; shift ;;
        -N|--nodes) nodes=$2; shift 2 ;;
        --nodes=*) nodes=${1#--nodes=}; shift ;;
        -c|--cpus-per-task) cpus=$2; shift 2 ;;
        --cpus-per-task=*) cpus=${1#--cpus-per-task=}; shift ;;
        --gpu-bind=*|--distribution=*|--gpus-per-task=*|--exact) shift ;;
        -*) echo "fake srun: $1 is not an srun option the examples should use" >&2; exit 2 ;;
        *) break ;;
    esac
done
# since Slurm 22.05 srun inherits neither --cpus-per-task nor a node count that fits the step
[ -n "$cpus" ] || { echo "fake srun: no --cpus-per-task (srun does not inherit sbatch's)" >&2; exit 2; }
[ -n "$nodes" ] || { echo "fake srun: no -N (the step would spread over every node of the job)" >&2; exit 2; }
[ $(( (n + nodes - 1) / nodes )) -le 4 ] || { echo "fake srun: more than 4 tasks per node" >&2; exit 2; }
exec mpiexec -n "$n" "$@"
"""
SBATCH = r"""#!/bin/bash
# fake sbatch: log the arguments, set the job's variables, run the script in the foreground
echo "sbatch $*" >> "$SHIM_LOG"
nodes=1
while [ $# -gt 1 ]; do
    case "$1" in --nodes=*) nodes=${1#--nodes=} ;; esac
    shift
done
SLURM_JOB_ID=4242 SLURM_NNODES=$nodes SLURM_CPUS_PER_TASK=1 exec bash "$1"
"""


def _shims(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("sbatch", SBATCH)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SHIM_LOG=str(tmp_path / "shim.log"),
               VENV=sys.prefix, OMP_NUM_THREADS="1", RANKS="1,2", STRATEGIES="stationary-x", SHAPE="tiny",
               BATCH="4", STEP_BATCH="4", REPEAT="1", WARMUP="0", OUT=str(tmp_path / "out"),
               REFCONV_OVERSUBSCRIBE_GPUS="1")  # a test machine may have fewer GPUs than 4 ranks
    return env


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


def _run(tmp_path, *sbatch_args):
    env = _shims(tmp_path)
    result = subprocess.run(["sbatch", *sbatch_args], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, (tmp_path / "shim.log").read_text().splitlines(), tmp_path / "out"


def test_one_node_script_runs_info_sweep_and_plot(tmp_path):
    result, log, out = _run(tmp_path, "examples/slurm/one_node.sbatch")
    assert log[0] == "sbatch examples/slurm/one_node.sbatch"
    assert log[1] == "srun -N 1 -n 4 --gpu-bind=none --cpus-per-task=1 refconv info"
    assert [entry.split()[:7] for entry in log[2:]] == [
        ["srun", "-N", "1", "-n", "1", "--gpu-bind=none", "--cpus-per-task=1"],
        ["srun", "-N", "1", "-n", "2", "--gpu-bind=none", "--cpus-per-task=1"]]
    assert "4 rank(s):" in (out / "info.txt").read_text()
    lines = read_lines(out / "results.jsonl")
    assert [(line["config"]["ranks"], line["label"]) for line in lines] == [(1, "serial stationary-x"),
                                                                          (2, "channel=2 stationary-x")]
    for png in ("scaling.png", "breakdown.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in result.stdout


@pytest.mark.extended  # 8 ranks of refconv info and two sweeps: ~20 s on 2 cores
def test_multi_node_script_runs_both_sweeps(tmp_path):
    result, log, out = _run(tmp_path, "--nodes=2", "examples/slurm/multi_node.sbatch")
    assert log[1] == "srun -N 2 -n 8 --gpu-bind=none --distribution=block --cpus-per-task=1 refconv info"  # 2 x 4 GPUs
    assert all(entry.startswith(("srun -N 1 -n 1 ", "srun -N 1 -n 2 ")) for entry in log[2:]), log
    lines = read_lines(out / "results.jsonl")
    assert [(line["bench"], line["config"]["sweep"]["scaling"], line["config"]["ranks"]) for line in lines] == [
        ("step", "weak", 1), ("step", "weak", 2), ("layer", "strong", 1), ("layer", "strong", 2)]
    assert lines[1]["config"]["batch"] == 8  # weak: 4 per rank
    assert (out / "scaling.png").exists() and (out / "breakdown.png").exists()
