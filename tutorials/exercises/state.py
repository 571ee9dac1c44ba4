"""A learner's progress: each exercise's last status and the hints given, in ``tutorials/exercises/.progress.json``
(git-ignored), and what ``reset N`` and ``hint N`` do with it.

The file is ``{"5": {"status": "passed" | "not yet" | "not written", "hints": 2}}``, written whole to a
temporary file and then moved over the old one, so an interrupted write never leaves half a file.
"""

import datetime
import json
import os
import re
import shutil

from tutorials.exercises import harness

STATUSES = ("passed", "not yet", "not written")


def _file():
    return harness.HERE / ".progress.json"


def load():
    """Every exercise's entry so far (``{}`` before the first check)."""
    try:
        return json.loads(_file().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def save(progress):
    tmp = _file().with_suffix(".json.tmp")
    tmp.write_text(json.dumps(progress, indent=1, sort_keys=True))
    os.replace(tmp, _file())


def entry(number):
    return {"status": "not started", "hints": 0, **load().get(str(number), {})}


def _update(number, **fields):
    progress = load()
    progress[str(number)] = {**entry(number), **fields}
    save(progress)


def record(number, status):
    """Exercise ``number``'s status after a check of the learner's own file."""
    if status not in STATUSES:
        raise ValueError(f"status: expected one of {STATUSES}, got {status!r}")
    _update(number, status=status)


# -- hints, one at a time -------------------------------------------------------------------------------------
def hints(number):
    """The bullets under the ``## Hints`` heading of exercise ``number``'s page (or its collapsed ``???``
    block), each joined into one line."""
    page = (harness.HERE / f"{harness.slug(number)}.md").read_text()
    found = re.search(r"^(## Hints|\?\?\? note \"Hints[^\n]*)\n(.*?)(?=^#|\Z)", page, re.M | re.S)
    if not found:
        return []
    bullets = []
    for line in found.group(2).splitlines():
        text = line.strip()
        if text.startswith("- "):
            bullets.append(text[2:])
        elif text and bullets:
            bullets[-1] += " " + text
    return bullets


def next_hint(number):
    """The next hint of exercise ``number`` as the line to print; the count given is kept."""
    given, every = entry(number)["hints"], hints(number)
    if given >= len(every):
        return (f"no more hints for exercise {number} ({len(every)} given); the reference solution is "
                f"tutorials/exercises/solutions/{harness.slug(number)}.py")
    _update(number, hints=given + 1)
    return f"hint {given + 1} of {len(every)}: {every[given]}"


# -- reset -----------------------------------------------------------------------------------------------------
def reset(number, now=None):
    """Exercise ``number``'s file made its skeleton again; the learner's file, if it differs, is moved to
    ``.backup/`` first (never overwritten: a name taken gets ``-2``, ``-3``, ...).  Returns the line to print."""
    yours, skeleton = harness.path_of(number), harness.path_of(number, skeleton=True)
    _update(number, hints=0)
    if yours.exists() and yours.read_text() == skeleton.read_text():
        return f"exercise {number} is its skeleton already: nothing to keep"
    kept = None
    if yours.exists():
        stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
        folder = harness.HERE / ".backup"
        folder.mkdir(exist_ok=True)
        kept, k = folder / f"{yours.stem}-{stamp}.py", 2
        while kept.exists():
            kept, k = folder / f"{yours.stem}-{stamp}-{k}.py", k + 1
        shutil.move(yours, kept)
    shutil.copyfile(skeleton, yours)
    if kept is None:
        return f"exercise {number} is its skeleton: tutorials/exercises/{yours.name}"
    return (f"exercise {number} is its skeleton again; your file is kept as "
            f"tutorials/exercises/.backup/{kept.name}")
