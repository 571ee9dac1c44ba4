"""Fault injection: kill, stop or raise on one rank of a 2-rank ``refconv train`` at a
chosen point, and check that the whole job ends, soon, non-zero, with nothing lost.

The faults come from ``REFCONV_FAULT=rank:point:action[:n]`` (``refconv.collectives``):
``kill`` is SIGKILL, ``stop`` SIGSTOP (a frozen rank: its peer's collective watchdog
must end the job), ``raise`` an uncaught exception (the abort hook must end it).
Points: ``startup``, the n-th MPI call of the run (mid-step), inside each collective
kind, and each point of a checkpoint save (``checkpoint.FAULT_POINTS``).

A checkpoint case kills a save at the step of the committed checkpoint (a reused
``--checkpoint-dir``) or at the next step, checks that the directory still holds a
whole checkpoint (checksums), resumes from it, and compares the resumed run's losses
with an uninterrupted run's, exactly.

A few cases run by default; the rest are marked ``extended``.  For the table of every
case (fault, time from the fault to the end of the job, exit status)::

    OMP_NUM_THREADS=1 python tests/test_faults.py [--all]
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from refconv import checkpoint, collectives
from refconv.testing.mpirun import find_mpiexec

TIMEOUT_S = 2.0          # --timeout of the faulted runs: a stopped peer is noticed after this
END_SLACK_S = 8.0        # from the fault to the end of the job, beyond TIMEOUT_S (launch, abort)
HANG_S = 120.0           # a launch that takes longer has hung: the test fails
CHANNEL = ("--grid", "channel=2")      # allreduce, allgather, reduce_scatter, alltoallv
HEIGHT = ("--grid", "height=2")        # allreduce and halo exchanges
# the watchdog's one line: the collective, the communicator, the buffers' shapes, the wait
TIMEOUT_LINE = re.compile(r"^\[rank \d\] refconv: collective timeout: \w+ on communicator '[^']+' "
                          r"\(2 ranks\) with .+: this rank waited \d+\.\d s \(timeout 2 s\); aborting the job$")
TRAIN = ("train", "--max-steps", "4", "--lr-schedule", "constant", "--no-progress",
         "--timeout", str(TIMEOUT_S))


@dataclasses.dataclass(frozen=True)
class Case:
    fault: str                 # REFCONV_FAULT
    grid: tuple = CHANNEL
    same_step: bool = None     # checkpoint cases: save again at the committed step, or the next
    default: bool = False      # in the default suite (else marked extended)

    @property
    def action(self):
        return self.fault.split(":")[2]

    @property
    def point(self):
        return self.fault.split(":")[1]

    def __str__(self):
        where = "" if self.same_step is None else (" (same step)" if self.same_step else " (next step)")
        return f"{self.fault}{where}"


TRAINING_CASES = [Case("1:allreduce:kill:3", default=True),
                  Case("1:allgather:stop:2", default=True),
                  Case("0:reduce_scatter:raise", default=True),
                  Case("1:startup:stop", default=True),
                  Case("1:halo:stop:3", grid=HEIGHT, default=True)]
# (point, n): the n-th visit; "collective" counts every MPI call, so its 30th is mid-step
POINTS = (("startup", 1), ("collective", 30), ("allreduce", 5), ("allgather", 3), ("reduce_scatter", 3),
          ("alltoallv", 3), ("halo", 5), ("split", 4))    # the 4th split: the grid's first sub-communicator
TRAINING_CASES += [Case(f"1:{point}:{action}:{n}", grid=HEIGHT if point == "halo" else CHANNEL)
                   for action in ("kill", "stop", "raise") for point, n in POINTS
                   if (point, action) not in (("startup", "stop"), ("halo", "stop"))]

RANK0_ONLY = ("checkpoint.manifest-temp", "checkpoint.commit", "checkpoint.cleanup")
CHECKPOINT_CASES = [Case("1:checkpoint.shard:kill", same_step=True, default=True),
                    Case("0:checkpoint.commit:kill", same_step=False, default=True)]
CHECKPOINT_CASES += [Case(f"{0 if point in RANK0_ONLY else 1}:{point}:{action}", same_step=same)
                     for action in ("kill", "stop", "raise") for point in checkpoint.FAULT_POINTS
                     for same in (True, False)
                     if (action == "kill" or same)
                     and f"{point}:{action}:{same}" not in ("checkpoint.shard:kill:True",
                                                            "checkpoint.commit:kill:False")]


@dataclasses.dataclass
class Ended:
    status: int
    seconds: float             # from the fault (its REFCONV_FAULT line) to the end of the job
    output: str


def launch(args, *, fault=None, timeout=HANG_S):
    """``mpiexec -n 2 python -m refconv.cli ARGS``; returns Ended (seconds from the fault's line)."""
    mpiexec = find_mpiexec()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.pop("REFCONV_TIMEOUT", None)
    env.pop("REFCONV_FAULT", None)
    if fault:
        env["REFCONV_FAULT"] = fault
    proc = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "refconv.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, fired = [], []

    def read():
        for line in proc.stdout:
            if line.startswith("REFCONV_FAULT:") and not fired:
                fired.append(time.monotonic())
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(5)
        pytest.fail(f"hung: {args} with REFCONV_FAULT={fault} still running after {timeout} s:\n"
                    + "".join(lines))
    end = time.monotonic()
    reader.join(5)
    return Ended(status, end - (fired[0] if fired else start), "".join(lines))


def check_ended(case, ended):
    """The job ended non-zero, soon after the fault, for the reason the action implies."""
    where = f"REFCONV_FAULT={case.fault}:\n{ended.output}"
    assert "REFCONV_FAULT:" in ended.output, f"the fault never fired: {where}"
    assert ended.status != 0, f"exit status 0 after a fault: {where}"
    assert ended.seconds < TIMEOUT_S + END_SLACK_S, f"took {ended.seconds:.1f} s to end: {where}"
    if case.action == "stop":
        timeouts = [line for line in ended.output.splitlines() if "collective timeout" in line]
        assert ended.status == collectives.EXIT_TIMEOUT and len(timeouts) == 1, where
        assert TIMEOUT_LINE.search(timeouts[0]), timeouts[0]
    if case.action == "raise":
        assert "FaultInjected" in ended.output, where


def _marks(case):
    return [] if case.default else [pytest.mark.extended]


@pytest.mark.parametrize("case", [pytest.param(c, id=str(c), marks=_marks(c)) for c in TRAINING_CASES])
def test_training_fault_ends_the_job(case):
    ended = launch([*TRAIN, *case.grid], fault=case.fault)
    check_ended(case, ended)
    if case.action == "stop" and case.point == "allgather":
        assert "allgather on communicator 'channel' (2 ranks)" in ended.output, ended.output


# -- checkpoints -----------------------------------------------------------------------------
def committed(directory):
    """(step, save, the manifest and shard file names) of the checkpoint in ``directory``,
    after checking every shard's SHA-256."""
    with open(os.path.join(directory, checkpoint.MANIFEST)) as f:
        m = json.load(f)
    for s in m["shards"]:
        with open(os.path.join(directory, s["file"]), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == s["sha256"], f"corrupt {s['file']}"
    return m["step"], m["save"], sorted({checkpoint.MANIFEST} | {s["file"] for s in m["shards"]})


def losses(path):
    with open(path) as f:
        return {m["step"]: m["loss"] for m in map(json.loads, f)}


def save_again(case, directory):
    """The faulted run of a checkpoint case.  Same step: another run (lr 0.05, so its shards
    differ) reuses the directory without --resume and saves step 2 again.  Next step: a
    run resumes and saves step 3."""
    again = ["--lr", "0.05", "--max-steps", "2"] if case.same_step else ["--resume", "--max-steps", "1"]
    return [*TRAIN, *CHANNEL, *again, "--checkpoint-dir", str(directory)]


def resume(directory, step, metrics):
    """Resume from ``directory`` (at ``step``) and train to step 4, logging the losses."""
    return launch([*TRAIN, *CHANNEL, "--resume", "--max-steps", str(4 - step),
                   "--checkpoint-dir", str(directory), "--metrics-out", str(metrics)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted 4-step run's losses, and a directory with the checkpoint of step 2."""
    root = tmp_path_factory.mktemp("faults")
    ended = launch([*TRAIN, *CHANNEL, "--metrics-out", str(root / "straight.jsonl")])
    assert ended.status == 0, ended.output
    ended = launch([*TRAIN, *CHANNEL, "--max-steps", "2", "--checkpoint-dir", str(root / "step2")])
    assert ended.status == 0, ended.output
    return losses(root / "straight.jsonl"), root / "step2"


@pytest.fixture(scope="module")
def reused(runs, tmp_path_factory):
    """The losses of steps 3-4 resumed from the lr 0.05 run's checkpoint of step 2, saved whole."""
    root = tmp_path_factory.mktemp("reused")
    shutil.copytree(runs[1], root / "ck")
    assert launch(save_again(Case("0:none:kill", same_step=True), root / "ck")).status == 0
    ended = resume(root / "ck", 2, root / "resumed.jsonl")
    assert ended.status == 0, ended.output
    return losses(root / "resumed.jsonl")


@pytest.mark.parametrize("case", [pytest.param(c, id=str(c), marks=_marks(c)) for c in CHECKPOINT_CASES])
def test_checkpoint_fault_loses_nothing(case, runs, tmp_path, request):
    straight, step2 = runs
    directory = tmp_path / "ck"
    shutil.copytree(step2, directory)
    assert committed(directory)[:2] == (2, 1)
    check_ended(case, launch(save_again(case, directory), fault=case.fault))

    step, save, _ = committed(directory)                 # whole: every checksum matches
    after_commit = checkpoint.FAULT_POINTS.index(case.point) >= checkpoint.FAULT_POINTS.index(
        "checkpoint.commit")
    assert (step, save) == ((2 if case.same_step else 3, 2) if after_commit else (2, 1))

    resumed = resume(directory, step, tmp_path / "resumed.jsonl")
    assert resumed.status == 0 and f"at step {step}" in resumed.output, resumed.output
    want = request.getfixturevalue("reused") if case.same_step and after_commit else straight
    assert losses(tmp_path / "resumed.jsonl") == {s: want[s] for s in range(step + 1, 5)}
    _, _, files = committed(directory)
    assert sorted(os.listdir(directory)) == files        # the killed save's leftovers are gone


def _table(cases):
    """Run ``cases`` (checkpoint ones included) and print a Markdown table of how each ended."""
    import tempfile

    print("| fault injected (REFCONV_FAULT, 2 ranks) | time to end | exit status |")
    print("| --- | --- | --- |")
    root = tempfile.mkdtemp(prefix="refconv-faults-")
    launch([*TRAIN, *CHANNEL, "--max-steps", "2", "--checkpoint-dir", os.path.join(root, "step2")])
    for i, case in enumerate(cases):
        args = [*TRAIN, *case.grid]
        if case.same_step is not None:
            directory = os.path.join(root, f"ck{i}")
            shutil.copytree(os.path.join(root, "step2"), directory)
            args = save_again(case, directory)
        ended = launch(args, fault=case.fault)
        print(f"| `{case}` | {ended.seconds:.1f} s | {ended.status} |", flush=True)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    every = "--all" in sys.argv
    _table([c for c in TRAINING_CASES + CHECKPOINT_CASES if every or c.default])


def test_refconv_timeout_sets_the_default_of_training_and_the_api():
    """REFCONV_TIMEOUT (read at import) is the API's deadline and --timeout's default."""
    code = ("from refconv import collectives; from refconv.train_config import TrainConfig; "
            "print(collectives.get_timeout(), TrainConfig().timeout, TrainConfig(timeout=5).timeout)")
    out = {value: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, REFCONV_TIMEOUT=value)) for value in ("7", "0", "soon")}
    assert out["7"].stdout.split() == ["7.0", "7.0", "5.0"], out["7"].stderr
    assert out["0"].stdout.split() == ["None", "None", "5.0"], out["0"].stderr
    assert "REFCONV_TIMEOUT: expected seconds > 0" in out["soon"].stderr and out["soon"].returncode != 0


@pytest.mark.parametrize("spec", ["1:allreduce", "x:allreduce:kill", "1:allreduce:explode", "1:allreduce:kill:0",
                                  "1:allreduce:kill:2:3"])
def test_a_malformed_fault_is_refused(spec):
    with pytest.raises(ValueError, match="REFCONV_FAULT: expected rank:point:action"):
        collectives.set_fault(spec)


def test_importing_refconv_reads_no_fault_and_the_first_point_does():
    """REFCONV_FAULT has no effect at import (no side effects there): it is read when the first
    point is reached, here the 'startup' point that refconv.cli.main reaches first."""
    env = dict(os.environ, REFCONV_FAULT="0:startup:raise")
    imported = subprocess.run([sys.executable, "-c", "import refconv, refconv.collectives; print('imported')"],
                              capture_output=True, text=True, timeout=60, env=env)
    assert imported.returncode == 0 and imported.stdout.split() == ["imported"], imported.stderr
    code = "from refconv import collectives; collectives.fault_point('startup')"
    reached = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert reached.returncode != 0 and "FaultInjected: REFCONV_FAULT: injected at startup" in reached.stderr, \
        reached.stderr
    command = subprocess.run([sys.executable, "-m", "refconv.cli", "--version"], capture_output=True, text=True,
                             timeout=60, env=env)
    assert command.returncode != 0 and "REFCONV_FAULT: raise at startup" in command.stderr, command.stderr
