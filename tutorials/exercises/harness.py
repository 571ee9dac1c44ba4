"""What ``check(N)`` does: run your code on simulated ranks, compare it with the serial reference, report.

A checker (``checkers/NN_slug.py``) lists its :class:`Part` s.  For each part, in order:

1. the part runs once on its simplest case; a :class:`NotWritten` there (a ``todo("...")``
   left in your file) is reported as "not written yet", naming the part, and the next part runs;
2. Hypothesis draws cases (shapes, uneven splits, world sizes: the part's strategy) and
   ``hypothesis.find`` looks for one where your result differs from the reference, then
   shrinks it to the smallest it can;
3. on a mismatch the report gives that smallest case, the tensor, the first elements that
   differ (rank, local index, yours, the reference's), the likely cause where the difference has
   a known shape (:mod:`.causes`: a partial sum, the halo, a race, a missing dict entry), and a
   picture of the differing cells per rank; a crash gives your code's own frames, a deadlock each
   rank's pending call, a time-out the fewest ranks that also run past it.  Nothing of this
   package's own traceback is shown.

A part with ``after=True`` (the detective's suspects) runs once, after the others, with their
statuses; it raises :class:`Wrong` with its own lines rather than comparing tensors.  The header is
printed at once and each report line as it is made; each stage (loading, each world size drawn,
shrinking, scoring) is said on stderr as it starts.  Your own file, ``NN_slug.py``, is copied
from ``skeletons/`` on first use; a check of it is recorded in ``.progress.json`` (:mod:`.state`).

When every part passes, the checker's score (if it has one) runs your code and the reference
solution on one stated case and prints both side by side (:mod:`.score`).

Every run on ranks has a time limit (:data:`TIMEOUT_S`); a deadlock is reported at once by
:mod:`refconv.simulated`, so a check never hangs.
"""

import ast
import dataclasses
import importlib.util
import os
import re
import pathlib
import sys
import traceback
import types

import numpy
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from refconv import simulated
from refconv.testing.asserts import default_tolerance

HERE = pathlib.Path(__file__).resolve().parent
EXERCISES = ("01_halo_arithmetic", "02_sample_backward", "03_halo_1d", "04_halo_2d", "05_stationary_x",
             "06_stationary_y", "07_stationary_w", "08_segmented_allreduce", "09_predict_the_bytes",
             "10_hybrid_grid", "11_detective", "12_your_own_decomposition", "13_kernel_puzzle")
TIMEOUT_S = 30.0  # one run on simulated ranks; a rank computing forever is no deadlock the world can see
# Hypothesis's settings per part: the learner's profile, and CI's (few examples: all 13 checks in well under
# a minute); REFCONV_EXERCISES_PROFILE names one, else CI's where the CI variable is set
settings.register_profile("exercises", max_examples=40, database=None, derandomize=True, deadline=None,
                          suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink))
settings.register_profile("exercises-ci", settings.get_profile("exercises"), max_examples=6)
PICTURE_ROWS, PICTURE_COLS = 12, 24  # the most cells per rank a picture shows
SHOWN = 64  # an exact result this small is shown whole when its shape is wrong


class NotWritten(Exception):
    """A part of an exercise still calls ``todo``."""

    def __init__(self, part):
        self.part = part
        super().__init__(f"not written yet: replace todo({part!r}) in your file with your code")


def todo(part):
    """Mark a part you have not written yet; the checker says which one."""
    raise NotWritten(part)


def not_written_in(message):
    """The NotWritten that a message (a ``check_layer`` failure, which reports every rank's exception
    as text) tells of, or None."""
    found = re.search(r"NotWritten\(\"not written yet: replace todo\('([^']+)'\)", message)
    return NotWritten(found.group(1)) if found else None


# -- what a checker declares ------------------------------------------------------------------------
@dataclasses.dataclass
class Compared:
    """One tensor, per rank: yours and the reference's.  ``reduction`` is the length of the sum
    that made it (the tolerance grows with it); ``exact`` compares integers exactly."""

    name: str
    actual: list
    expected: list
    reduction: int = 1
    exact: bool = False
    label: str = "rank"  # what the entries of ``actual`` are: ranks, or a kernel's blocks
    note: str = ""  # how to read it, said once
    kind: str = "array"  # "dict": each entry a dict, compared key by key (causes.mismatch_dict)
    hints: bool = True  # whether a mismatch may name its likely cause (causes.explain); the detective's may not
    lookalikes: object = None  # () -> [(what, per-rank arrays)]: wrong answers a cause hint recognises
    edges: tuple = None  # per trailing spatial axis, the halo's width: a difference only there is the halo
    reruns: object = None  # () -> more ``actual`` of the same case: a difference between them is a race


class Wrong(Exception):
    """A part's verdict that is not a tensor to compare: ``lines`` are the report's lines."""

    def __init__(self, lines):
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


@dataclasses.dataclass
class Part:
    """One part of an exercise: ``run(module, case)`` returns a list of :class:`Compared`;
    ``cases`` is the Hypothesis strategy of its cases; ``describe(case)`` says a case in words."""

    name: str
    cases: object
    run: object
    describe: object = repr
    bonus: bool = False  # a bonus part left unwritten does not keep the exercise from passing
    after: bool = False  # runs once, with ``run(module, case, earlier)``: the statuses of the parts before it


@dataclasses.dataclass
class Result:
    """What ``check`` found: ``status`` per part ("passed", "not written", "failed"), and the report."""

    number: int
    status: dict
    report: str

    @property
    def passed(self):
        return bool(self.status) and all(s in ("passed", "bonus not written") for s in self.status.values())

    def __str__(self):
        return self.report

    def __repr__(self):  # a notebook shows this under the report check() printed: short
        parts = ", ".join(f"{p} {s}" for p, s in self.status.items())
        return f"<exercise {self.number}: {'passed' if self.passed else 'not yet'} ({parts})>"


# -- loading the code to check ----------------------------------------------------------------------
def slug(number):
    if not 1 <= number <= len(EXERCISES):
        raise ValueError(f"exercise: expected a number in [1, {len(EXERCISES)}], got {number!r}")
    return EXERCISES[number - 1]


def path_of(number, solution=False, skeleton=False):
    """Your file of exercise ``number`` (git-ignored, made from its skeleton), its reference ``solution``
    or its pristine ``skeleton``."""
    folder = HERE / "solutions" if solution else HERE / "skeletons" if skeleton else HERE
    return folder / f"{slug(number)}.py"


def your_file(number, say=print):
    """Your file of exercise ``number``; on first use it is copied from the skeleton, and ``say`` says so."""
    path = path_of(number)
    if not path.exists():
        path.write_text(path_of(number, skeleton=True).read_text())
        say(f"made tutorials/exercises/{path.name} from its skeleton: edit it there")
    return path


def load(number, solution=False, skeleton=False, say=print):
    """Your file for exercise ``number`` (or the solution, or the skeleton), read afresh: edits show at once;
    ``say`` tells that your file was made from its skeleton."""
    path = path_of(number, solution, skeleton) if solution or skeleton else your_file(number, say)
    tag = "_solution" if solution else "_skeleton" if skeleton else ""
    return module_from_source(path.read_text(), str(path), f"exercise_{number:02d}{tag}")


def module_from_source(source, filename, name):
    """A module run from ``source`` (kept as ``__source__``); its frames carry ``filename`` (tests plant
    bugs this way)."""
    module = types.ModuleType(name)
    module.__file__, module.__source__ = filename, source
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def functions(source):
    """``{name: its AST dumped}`` of the top-level functions of ``source``: equal dumps are the same code,
    whatever the comments and spacing."""
    return {node.name: ast.dump(node) for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


def checker(number):
    spec = importlib.util.spec_from_file_location(f"exercise_checker_{number:02d}",
                                                  HERE / "checkers" / f"{slug(number)}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- running on ranks -------------------------------------------------------------------------------
def on_ranks(fn, ranks, *args):
    """``fn(comm, *args)`` on ``ranks`` simulated ranks: the list of results, rank 0's first (a rank
    that outlives the time limit is stopped by refconv.simulated)."""
    return simulated.run(fn, ranks, args=args, timeout=TIMEOUT_S)


# -- comparing --------------------------------------------------------------------------------------
def mismatch(c):
    """None when every rank's ``c.actual`` matches ``c.expected``; else the report's lines."""
    from tutorials.exercises import causes

    if c.kind == "dict":
        return causes.mismatch_dict(c)
    if len(c.actual) != len(c.expected):
        return [f"{c.name}: {len(c.actual)} results for {len(c.expected)} {c.label}s"]
    masks, first, shapes = [], [], []
    for r, (a, e) in enumerate(zip(c.actual, c.expected)):
        e = numpy.asarray(e)
        try:
            a = numpy.asarray(a, dtype=e.dtype if c.exact else None)
        except (TypeError, ValueError):
            shapes.append(f"{c.label} {r}: yours is {a!r}, not an array like the reference's {e.shape}")
            continue
        if a.shape != e.shape:
            shapes.append(f"{c.label} {r}: yours has shape {a.shape}, the reference {e.shape}")
            if c.exact and max(a.size, e.size) <= SHOWN:  # small: show both
                shapes += [f"  yours     {a.tolist()}", f"  reference {e.tolist()}"]
            continue
        if c.exact:
            bad = a != e
        else:
            rtol, atol = default_tolerance(e.dtype, c.reduction)
            bad = ~numpy.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        masks.append((r, bad))
        first += [(r, tuple(int(k) for k in i), a[tuple(i)], e[tuple(i)]) for i in numpy.argwhere(bad)[:3]]
    note = [f"  ({c.note})"] if c.note else []
    if shapes:
        return [f"{c.name}: shapes differ"] + note + [f"  {s}" for s in shapes]
    bad_ranks = [r for r, bad in masks if bad.any()]
    if not bad_ranks:
        return None
    total = sum(int(bad.sum()) for _, bad in masks)
    cells = sum(bad.size for _, bad in masks)
    lines = [f"{c.name} differs on {c.label}{'s' if len(bad_ranks) > 1 else ''} {', '.join(map(str, bad_ranks))}: "
             f"{total} of {cells} elements; first:"] + note
    lines += [f"  {c.label} {r} {c.name}{list(i)}: yours {_num(a)}, reference {_num(e)}" for r, i, a, e in first[:5]]
    if c.hints:
        lines += causes.explain(c, masks)
    return lines + picture(c.name, masks, c.label)


def _num(v):
    return f"{v:.6g}" if isinstance(v, (float, numpy.floating)) else str(v)


def picture(name, masks, label="rank"):
    """The differing cells of each rank, side by side: ``x`` where some element over the leading
    axes differs, ``.`` where all agree; the last two axes are the rows and columns."""
    grids = []
    for r, bad in masks:
        grid = bad.reshape(1, 1) if bad.ndim == 0 else bad.reshape(1, -1) if bad.ndim == 1 else \
            bad.reshape(-1, *bad.shape[-2:]).any(axis=0)
        rows = ["".join("x" if v else "." for v in row[:PICTURE_COLS]) + (">" if grid.shape[1] > PICTURE_COLS else "")
                for row in grid[:PICTURE_ROWS]]
        if grid.shape[0] > PICTURE_ROWS:
            rows.append("v")
        grids.append((f"{label} {r}", rows))
    axes = "the elements" if all(b.ndim <= 1 for _, b in masks) else "rows x columns of the last two axes"
    width = [max(len(t), *(len(s) for s in rows)) + 3 for t, rows in grids]
    lines = [f"  {name}, {axes} (x: differs):", "    " + "".join(t.ljust(w) for (t, _), w in zip(grids, width))]
    for k in range(max(len(rows) for _, rows in grids)):
        cells = ((rows[k] if k < len(rows) else "").ljust(w) for (_, rows), w in zip(grids, width))
        lines.append("    " + "".join(cells))
    return [line.rstrip() for line in lines]


# -- one part ---------------------------------------------------------------------------------------
TIMED_OUT = "your code ran past the time limit"


def attempt(part, module, case):
    """None when the part passes on ``case``; else the failure's lines.  NotWritten propagates."""
    try:
        compared = part.run(module, case)
    except NotWritten:
        raise
    except Wrong as exc:
        return exc.lines
    except simulated.Deadlock as exc:
        return ["your code deadlocked: every rank waits for a call no other rank makes",
                *without_our_frames(str(exc), module)]
    except TimeoutError as exc:
        return [f"{TIMED_OUT} of {TIMEOUT_S:g} s on this case (a loop that never ends?):",
                *without_our_frames(str(exc), module)]
    except Exception as exc:  # the learner's crash: their frames, not ours
        return crash_report(exc, module)
    for c in compared:
        lines = mismatch(c)
        if lines:
            return lines
    return None


def without_our_frames(report, module):
    """A report's lines without the frames of this package (the checker's calls into your code): each is
    a ``File "...", line N`` line and the line of code under it."""
    own, lines, skip = getattr(module, "__file__", None), [], False
    for line in report.splitlines():
        found = re.search(r'File "([^"]+)", line \d+', line)
        if found:
            skip = found.group(1) != own and found.group(1).startswith(str(HERE))
        elif not line.startswith("        "):  # a code line sits under its File line; anything else ends it
            skip = False
        if not skip:
            lines.append(line)
    return lines


def crash_report(exc, module):
    """The learner's exception: its type and message, the frames of their file, the ranks' note."""
    own = getattr(module, "__file__", None)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == own]
    lines = [f"your code raised {type(exc).__name__}: {exc}".rstrip()]
    if frames:
        lines.append("  in your file:")
        lines += ["    " + s.rstrip().replace("\n", "\n    ") for s in traceback.format_list(frames[-4:])]
    for note in getattr(exc, "__notes__", []):
        lines += ["  " + line for line in note.splitlines()]
    return lines


def profile(examples=None):
    """The Hypothesis settings of a check: the profile (see above), with ``examples`` per part if given."""
    name = os.environ.get("REFCONV_EXERCISES_PROFILE") or ("exercises-ci" if os.environ.get("CI") else "exercises")
    chosen = settings.get_profile(name)
    return chosen if examples is None else settings(chosen, max_examples=examples)


def _silent(text):
    pass


def _to_stderr(text):
    print("  ... " + text, file=sys.stderr, flush=True)


def fewer_ranks(case):
    """The same case on fewer ranks, fewest first (none where a case's ranks are not a field of its own)."""
    ranks = getattr(case, "ranks", None)
    fields = {f.name for f in dataclasses.fields(case)} if dataclasses.is_dataclass(case) else ()
    if not isinstance(ranks, int) or "ranks" not in fields:
        return []
    return [dataclasses.replace(case, ranks=k) for k in range(1, ranks)]


def _smaller_timeout(part, module, case):
    """The fewest ranks of ``case`` that also run past the time limit: ``(case, lines)``, or None."""
    for smaller in fewer_ranks(case):
        try:
            lines = attempt(part, module, smaller)
        except NotWritten:
            return None
        if lines and lines[0].startswith(TIMED_OUT):
            return smaller, lines
    return None


def check_part(part, module, quiet, progress=_silent, earlier=None):
    """``(status, lines)`` of one part, its cases drawn with the settings ``quiet``; ``progress`` hears of
    each stage; an ``after`` part runs once with the statuses of the ``earlier`` parts."""
    if part.after:
        progress(f"{part.name}: checking")
        try:
            lines = attempt(dataclasses.replace(part, run=lambda m, case: part.run(m, case, earlier or {})),
                             module, None)
        except NotWritten as exc:
            return "not written", [f"{part.name}: {exc}"]
        return ("failed", [f"{part.name}: FAILED", *("  " + line for line in lines)]) if lines else \
            ("passed", [f"{part.name}: passed"])
    progress(f"{part.name}: its simplest case")
    simplest = find(part.cases, lambda case: True, settings=quiet)
    found, tried, sizes = {}, [], set()

    def fails(case):
        if case in found:
            return True  # Hypothesis replays its final case: the same verdict, not run again
        if any(lines[0].startswith(TIMED_OUT) for lines in found.values() if isinstance(lines, list)):
            return False  # no shrinking past a time-out: each try would cost TIMEOUT_S more (fewer ranks: below)
        ranks = getattr(case, "ranks", None)
        if ranks not in sizes:
            sizes.add(ranks)
            if ranks is not None:
                progress(f"{part.name}: drawing cases on {ranks} rank{'s' if ranks != 1 else ''}")
        tried.append(case)
        try:
            lines = attempt(part, module, case)
        except NotWritten as exc:
            found["not written"] = exc
            return True
        if lines:
            if not found:
                progress(f"{part.name}: a case fails; shrinking it")
            found[case] = lines
        return bool(lines)

    try:
        attempt(part, module, simplest)  # a todo left in the part shows here, before any search
    except NotWritten as exc:
        return "not written", [f"{part.name}: {exc}"]
    try:
        case = find(part.cases, fails, settings=quiet)
    except NoSuchExample:
        n = len(tried)  # Hypothesis stops early where a strategy has fewer distinct cases than asked for
        return "passed", [f"{part.name}: passed ({n} drawn case{'s' if n > 1 else ''})"]
    if "not written" in found:
        return "not written", [f"{part.name}: {found['not written']}"]
    lines = found.get(case) or attempt(part, module, case)
    if lines and lines[0].startswith(TIMED_OUT):
        progress(f"{part.name}: a time-out; trying fewer ranks")
        case, lines = _smaller_timeout(part, module, case) or (case, lines)
    return "failed", [f"{part.name}: FAILED on the smallest case found: {part.describe(case)}",
                      *("  " + line for line in lines)]


def check(number, *, solution=False, skeleton=False, module=None, examples=None, out=None, progress=None,
          parts=None):
    """Check exercise ``number``: your file, the reference ``solution``, its pristine ``skeleton`` or
    ``module`` (any module with the skeleton's functions); print the report (``out``, default print, a line
    as soon as it is made) and return a :class:`Result`.  ``progress`` hears each stage as it starts
    (default: to stderr; False: silent).  ``parts``: the names of the only parts to check (no score then,
    and nothing recorded).  Only a check of your own file is recorded in your progress (:mod:`.state`)."""
    from tutorials.exercises import state

    out = print if out is None else out
    progress = _to_stderr if progress is None else progress or _silent
    spec = checker(number)
    name = "the reference solution" if solution else "a module given" if module is not None else \
        f"the skeleton, tutorials/exercises/skeletons/{slug(number)}.py" if skeleton else \
        f"tutorials/exercises/{slug(number)}.py"
    lines = []

    def say(line):
        lines.append(line)
        out(line)
        sys.stdout.flush()

    say(f"exercise {number}: {spec.TITLE}, checking {name}")
    yours = module is None and not solution and not skeleton and parts is None
    if module is None:
        progress("loading your file" if yours else f"loading {name}")
        try:
            module = load(number, solution, skeleton, say=progress)
        except Exception as exc:  # a syntax error, an import that fails: the learner's file, not a check
            say(f"your file does not load: {type(exc).__name__}: {exc}")
            if yours:
                state.record(number, "not yet")
            return Result(number, {"loading": "failed"}, "\n".join(lines))
    quiet = profile(examples)
    status = {}
    unknown = set(parts or ()) - {part.name for part in spec.PARTS}
    if unknown:
        raise ValueError(f"parts: exercise {number} has no part {sorted(unknown)}; its parts: "
                         f"{[part.name for part in spec.PARTS]}")
    for part in spec.PARTS:
        if parts is not None and part.name not in parts:
            continue
        status[part.name], part_lines = check_part(part, module, quiet, progress, earlier=dict(status))
        if part.bonus and status[part.name] == "not written":
            status[part.name] = "bonus not written"
        for line in part_lines:
            say(line)
    result = Result(number, status, "")
    if result.passed and parts is not None:
        say(f"passes (only {', '.join(parts)} checked)")
    elif result.passed:
        say("every part passes")
        if getattr(spec, "score", None):
            progress("scoring on the score's case")
            for line in spec.score(module, load(number, solution=True)):
                say(line)
        else:
            say(f"no score: {spec.NO_SCORE}")
    elif status:
        todo_parts = [p for p, s in status.items() if s not in ("passed", "bonus not written")]
        say(f"not yet: {', '.join(todo_parts)}")
    if yours:
        written = any(s not in ("not written", "bonus not written") for s in status.values())
        state.record(number, "passed" if result.passed else "not yet" if written else "not written")
    result.report = "\n".join(lines)
    return result

