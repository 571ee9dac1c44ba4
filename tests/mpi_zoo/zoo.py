"""The MPI zoo's runner: every program of zoo_programs/ on simulated ranks, classified, in one table.

``python tests/mpi_zoo/zoo.py`` (or ``make zoo``) runs every incorrect program and its correct twin at
each of its world sizes, with the guilty rank first, middle and last, and prints a table by MPI Bugs
Initiative class.  ``--write-baseline`` writes the totals to baseline.json, which
test_zoo.py holds CI to.  How one run is classified (the contract of issue 42):

==============  ============================================================================================
outcome         what the run did
==============  ============================================================================================
detected        raised a ``SimulatedError`` (any subclass but ``Unsupported``) or an ``ArgumentError``
                (:mod:`refconv.checks`: refconv's own wrappers refused an argument before any MPI call,
                on any backend), warned ``ResourceLeak``, or its results hold receive-buffer poison
                (``simulated.poisoned``)
named           detected, and the error's own message (``str(err)``, not its notes) or the warning has
                ``rank {guilty}`` as a word
refused         raised ``Unsupported`` naming a feature the program uses that may be refused (one-sided
                communication, persistent requests); any other refusal is a miss
hung            ``TimeoutError``: still running after the timeout, no deadlock the world saw
crashed         any other exception: an internal error, mpi4py's own, an assertion
missed          returned normally, or the program's own check saw the bug's wrong answer (``WrongAnswer``)
false positive  a correct twin that did anything but return normally without a warning or poison
==============  ============================================================================================

A program counts as detected only when every run of it is (and as named when every detection names
the guilty rank); otherwise it takes its worst run's outcome, in the order crashed, hung, missed,
refused.  Recall is detected / (incorrect programs - refused); specificity is correct twins that pass /
(twins - refused), as MBI counts, except that MBI leaves a tool's crashes and timeouts out of both,
and the zoo counts them as misses.
"""

import argparse
import dataclasses
import json
import pathlib
import re
import statistics
import subprocess
import sys
import time
import warnings

from refconv import simulated
from refconv.checks import ArgumentError
from refconv.simulated import ResourceLeak, SimulatedError, Unsupported

import zoo_programs  # noqa: F401  (registers every program)
from zoo_registry import CLASSES, PROGRAMS, WrongAnswer

HERE = pathlib.Path(__file__).resolve().parent
BASELINE = HERE / "baseline.json"
TIMEOUT = 10.0   # seconds: every program ends within it (issue 42, "Bad input")
REFUSABLE = {"RMA": re.compile(r"(?i)\bWin\b|\bRMA\b|one-sided"),
             "persistent": re.compile(r"(?i)persistent|_init\b|\bStart(all)?\b")}
INCORRECT = ("detected", "missed", "hung", "crashed", "refused")   # a run of an incorrect program
CORRECT = ("passed", "refused", "false positive")                    # a run of a correct twin
WORST_FIRST = ("crashed", "hung", "missed", "refused", "detected")   # a program takes its worst run's outcome
QUIET = (DeprecationWarning, PendingDeprecationWarning)             # warnings that say nothing of the program


@dataclasses.dataclass
class Run:
    """One run of one program: its outcome, whether the guilty rank was named, its message, seconds."""

    outcome: str
    named: bool
    message: str
    seconds: float


def run_once(fn, ranks, guilty, *, feature=None, races=False, timeout=TIMEOUT):
    """Run ``fn(comm, guilty)`` on ``ranks`` simulated ranks; the raw outcome, as if it were incorrect."""
    extra = {"schedules": "all"} if races and ranks <= 4 else {}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            results = simulated.run(fn, ranks, stepped=True, timeout=timeout, args=(guilty,), **extra)
        except TimeoutError as err:
            return Run("hung", False, _first_line(err), time.perf_counter() - start)
        except Exception as err:   # noqa: BLE001  (every exception is an outcome to classify)
            return _raised(err, guilty, feature, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    spoken = [w for w in caught if not issubclass(w.category, QUIET)]
    leaks = [str(w.message) for w in spoken if issubclass(w.category, ResourceLeak)]
    try:
        poison = simulated.poisoned(results)
    except Exception as err:   # noqa: BLE001  (the checker's own failure is a crash)
        return Run("crashed", False, f"poisoned: {type(err).__name__}: {_first_line(err)}", seconds)
    if leaks or poison:
        text = "\n".join(leaks + ([poison] if poison else []))
        return Run("detected", _names_rank(text, guilty), _first_line(text), seconds)
    if spoken:   # a warning of another kind: not a detection, and a correct twin must not warn
        return Run("missed", False, f"warned {spoken[0].category.__name__}: {spoken[0].message}", seconds)
    return Run("missed", False, "", seconds)


def _raised(err, guilty, feature, seconds):
    if type(err) is SimulatedError and err.__cause__ is not None:
        err = err.__cause__   # Python 3.10 (no notes): run wraps a rank's own exception in a SimulatedError
    text = str(err)
    if isinstance(err, Unsupported):
        allowed = feature in REFUSABLE and REFUSABLE[feature].search(text)
        return Run("refused" if allowed else "missed", False, f"refused: {_first_line(text)}", seconds)
    if isinstance(err, (SimulatedError, ArgumentError)):
        return Run("detected", _names_rank(text, guilty), f"{type(err).__name__}: {_first_line(text)}", seconds)
    if isinstance(err, WrongAnswer):
        return Run("missed", False, f"wrong answer: {_first_line(text)}", seconds)
    return Run("crashed", False, f"{type(err).__name__}: {_first_line(text)}", seconds)


def _names_rank(text, guilty):
    return re.search(rf"\brank {guilty}\b", text) is not None


def _first_line(text):
    return str(text).strip().splitlines()[0][:200] if str(text).strip() else ""


def as_twin(run):
    """A run of a correct twin: it passes only when it returned normally with no warning and no poison."""
    if run.outcome == "refused":
        return run
    passed = run.outcome == "missed" and not run.message
    return dataclasses.replace(run, outcome="passed" if passed else "false positive", named=False)


@dataclasses.dataclass
class Verdict:
    """A program's outcome over all its runs, and its twin's."""

    program: object
    outcome: str
    named: bool
    twin: str
    runs: list
    twin_runs: list


def judge(program, timeout=TIMEOUT):
    """Every run of ``program`` and of its twin, and the program's verdict."""
    runs, twin_runs = [], []
    for ranks, guilty in program.runs():
        options = dict(feature=program.feature, races=program.races, timeout=timeout)
        runs.append(run_once(program.incorrect, ranks, guilty, **options))
        twin_runs.append(as_twin(run_once(program.correct, ranks, guilty, **options)))
    outcome = next(o for o in WORST_FIRST if any(r.outcome == o for r in runs))
    named = outcome == "detected" and program.blame and all(r.named for r in runs)
    twin = next(o for o in ("false positive", "refused", "passed") if any(r.outcome == o for r in twin_runs))
    return Verdict(program, outcome, named, twin, runs, twin_runs)


def select(mbi_class=None, match=None, skip=()):
    """The registered programs of one class (or all) whose name contains ``match``, less ``skip``."""
    return [p for p in PROGRAMS if (mbi_class is None or p.mbi_class == mbi_class)
            and (match is None or match in p.name) and p.name not in skip]


def totals(verdicts):
    """``{figure: count}`` over ``verdicts``, with recall, specificity, named fraction, median ms."""
    count = {o: sum(v.outcome == o for v in verdicts) for o in INCORRECT}
    count["named"] = sum(v.named for v in verdicts)
    count["blamable"] = sum(v.outcome == "detected" and v.program.blame for v in verdicts)
    count["programs"] = len(verdicts)
    count["twins passed"] = sum(v.twin == "passed" for v in verdicts)
    count["twins refused"] = sum(v.twin == "refused" for v in verdicts)
    count["false positives"] = sum(v.twin == "false positive" for v in verdicts)
    seconds = [r.seconds for v in verdicts for r in v.runs + v.twin_runs]
    count["runs"] = len(seconds)
    count["recall"] = _ratio(count["detected"], len(verdicts) - count["refused"])
    count["specificity"] = _ratio(count["twins passed"], len(verdicts) - count["twins refused"])
    count["named fraction"] = _ratio(count["named"], count["blamable"])
    count["median ms"] = round(1e3 * statistics.median(seconds), 2) if seconds else None
    return count


def _ratio(a, b):
    return round(a / b, 3) if b else None


COLUMNS = [("programs", "progs"), ("detected", "det"), ("named", "named"), ("missed", "missed"), ("hung", "hung"),
           ("crashed", "crash"), ("refused", "refused"), ("twins refused", "twin ref"),
           ("false positives", "FP"), ("recall", "recall"), ("specificity", "spec"),
           ("named fraction", "named/det"), ("median ms", "ms/run")]


def table(verdicts):
    """The per-class table (and the totals) as text."""
    rows = [(c, totals([v for v in verdicts if v.program.mbi_class == c])) for c in CLASSES]
    rows.append(("total", totals(verdicts)))
    width = max(len(c) for c, _ in rows)
    head = f"{'MBI class':<{width}}  " + "  ".join(f"{label:>{max(len(label), 5)}}" for _, label in COLUMNS)
    lines = [head, "-" * len(head)]
    for name, t in rows:
        cells = ["-" if t[key] is None else str(t[key]) for key, _ in COLUMNS]
        lines.append(f"{name:<{width}}  " + "  ".join(f"{c:>{max(len(label), 5)}}" for c, (_, label) in zip(cells, COLUMNS)))
    return "\n".join(lines)


def details(verdicts, everything=False):
    """One line per program that is not detected-and-named, or whose twin fails (all with ``everything``)."""
    lines = []
    for v in verdicts:
        if everything or v.outcome != "detected" or (v.program.blame and not v.named) or v.twin != "passed":
            bad = next((r for r in v.runs if r.outcome == v.outcome), v.runs[0])
            twin = next((r for r in v.twin_runs if r.outcome == v.twin), v.twin_runs[0])
            lines.append(f"{v.program.name} [{v.program.mbi_class}]: {v.outcome}{' named' if v.named else ''}"
                         f" ({bad.message or 'returned'}); twin {v.twin}"
                         + (f" ({twin.message})" if twin.outcome != "passed" else ""))
    return "\n".join(lines)


def baseline_of(verdicts):
    """What baseline.json keeps: the totals CI holds the zoo to, per class and overall, and the last commit
    that changed refconv/ (the checker measured)."""
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", "refconv"], cwd=HERE.parent.parent,
                            capture_output=True, text=True)   # the last commit that changed the checker
    keep = ("programs", "detected", "named", "missed", "hung", "crashed", "refused", "twins refused",
            "false positives", "blamable")
    per_class = {c: {k: totals([v for v in verdicts if v.program.mbi_class == c])[k] for k in keep} for c in CLASSES}
    return {"refconv commit": commit.stdout.strip(), "totals": {k: totals(verdicts)[k] for k in keep}, "per class": per_class,
            "hung programs": sorted(v.program.name for v in verdicts if "hung" in (v.outcome, *(r.outcome for r in v.twin_runs)))}


def markdown(baseline):
    """The figures of ``baseline`` (baseline.json's dict) as the Markdown table docs/simulated-ranks.md shows."""
    head = ["MBI class", "programs", "detected", "guilty rank named", "missed", "hung", "crashed", "refused",
            "twins rejected", "recall", "specificity"]
    lines = [f"Measured with `refconv/` as of commit {baseline['refconv commit']} (`tests/mpi_zoo/baseline.json`):", "",
             "| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for name, t in [*baseline["per class"].items(), ("total", baseline["totals"])]:
        scored, twins = t["programs"] - t["refused"], t["programs"] - t["twins refused"]
        recall = f"{_ratio(t['detected'], scored):.2f}" if scored else "-"
        specificity = f"{_ratio(twins - t['false positives'], twins):.2f}" if twins else "-"
        named = f"{t['named']} of {t['blamable']}" if t["blamable"] else "-"
        cells = [t["programs"], t["detected"], named, t["missed"], t["hung"], t["crashed"], t["refused"],
                 t["false positives"], recall, specificity]
        lines.append("| " + " | ".join([f"**{name}**" if name == "total" else name, *map(str, cells)]) + " |")
    return "\n".join(lines)


def regressions(now, before, where="total"):
    """What got worse than ``before`` (a baseline's totals): fewer detected or named, more FP, crashes or hangs."""
    worse = [f"{where}: {k} {now[k]} < baseline {before[k]}" for k in ("detected", "named") if now[k] < before[k]]
    worse += [f"{where}: {k} {now[k]} > baseline {before[k]}" for k in ("false positives", "crashed", "hung")
              if now[k] > before[k]]
    return worse


def regressions_by_class(verdicts, baseline):
    """:func:`regressions` of the totals and of each class (a gain in one class cannot hide a loss in another)."""
    worse = regressions(totals(verdicts), baseline["totals"])
    for c in CLASSES:
        worse += regressions(totals([v for v in verdicts if v.program.mbi_class == c]), baseline["per class"][c], c)
    return worse


def run_zoo(programs, timeout=TIMEOUT, slow=(), slow_timeout=None):
    """Verdicts of ``programs``; those named in ``slow`` (known to hang) run last, with ``slow_timeout``."""
    first = [judge(p, timeout) for p in programs if p.name not in slow]
    return first + [judge(p, slow_timeout or timeout) for p in programs if p.name in slow]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class", dest="mbi_class", choices=CLASSES, help="only this MBI class")
    parser.add_argument("--match", help="only programs whose name contains this")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds a run may take (default 10)")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line for every program, not only the misses")
    parser.add_argument("--write-baseline", action="store_true", help=f"write the totals to {BASELINE.name}")
    parser.add_argument("--markdown", action="store_true",
                        help=f"print {BASELINE.name}'s figures as docs/simulated-ranks.md's table, and run nothing")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(BASELINE.read_text())))
        return
    programs = select(args.mbi_class, args.match)
    start = time.perf_counter()
    verdicts = run_zoo(programs, args.timeout)
    wall = time.perf_counter() - start
    print(details(verdicts, args.verbose))
    print()
    print(table(verdicts))
    print(f"\n{len(programs)} incorrect programs and their twins, {totals(verdicts)['runs']} runs in {wall:.1f} s")
    if args.write_baseline:
        if args.mbi_class or args.match:
            parser.error("--write-baseline needs the whole zoo (no --class, no --match)")
        BASELINE.write_text(json.dumps(baseline_of(verdicts), indent=2) + "\n")
        print(f"wrote {BASELINE}")


if __name__ == "__main__":
    sys.exit(main())
