"""Regenerate, or check, the outputs that the docs show, so that they cannot drift.

A page in docs/ or tutorials/ (or README.md) may show what something prints only
in a *generated* block: a fenced block right after a marker line
``<!-- output -->`` (or ``<!-- output: OPTIONS -->``).  Two kinds:

1. **A command and what it prints.**  A ```console block.  A line starting with
   ``$ `` is a command (continued on the next line while it ends with ``\\``);
   the lines up to the next command are its output::

       <!-- output -->
       ```console
       $ python -m refconv.cost_model --shape 8 64 28 28 --F 64 --K 3 --grid 1 4 1 1
       layer x(8, 64, 28, 28) F=64 K=3 'same' padding on grid (1, 4, 1, 1), float32
       ...
       ```

   Each command runs under bash in a fresh temporary directory (so it cannot
   read or litter the checkout), with ``OMP_NUM_THREADS=1``,
   ``PYTHONUNBUFFERED=1`` and the bin/ of the venv running this script first on
   ``PATH`` (``python``, ``mpiexec`` and ``refconv`` are the venv's).  Its
   stdout and stderr are taken together, as a terminal shows them; it must exit
   with status 0 unless the marker says ``fails``.

2. **What the ```python block above printed.**  ``<!-- output: python -->``
   before a ```text block: the stdout of the nearest ```python block before the
   marker, the page's blocks run in order in one namespace (as
   ``tests/docs_and_tutorials/test_docs.py`` runs them, and checks these).

OPTIONS (space separated):

- ``timings``: every number followed by a unit of time (``ms``, ``s``,
  ``seconds``, ``minutes``), and a share of a time (``37% of its time in flight``), is shown as ``…`` (e.g. ``trained 2 steps: … ms per
  step``), in the page and in the comparison, so run-to-run times never make the
  check fail.  Anything else that varies per run (dates, paths, host names) must
  be left out of the block: show a command whose output does not vary.
- ``extended``: too slow for the default test suite (a multi-rank training run);
  ``tests/test_doc_outputs.py`` marks its check ``extended``.
- ``fails``: the command is meant to exit non-zero (an error message shown on
  purpose).

Usage, from the repository root, with the venv's python::

    .venv/bin/python scripts/doc_outputs.py --check               # every page; exit 1 on a difference
    .venv/bin/python scripts/doc_outputs.py --write docs/models.md
    .venv/bin/python scripts/doc_outputs.py --check --fast        # leave out the extended blocks

To add a generated block to a page: write the marker and the block with the
command and no output, run ``--write`` on the page, read the output it wrote,
and commit both.  ``tests/test_doc_outputs.py`` (commands) and
``tests/docs_and_tutorials/test_docs.py`` (python blocks) then fail whenever the output changes.
"""

import argparse
import contextlib
import dataclasses
import difflib
import io
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- output(?::(?P<options>[^>]*?))? -->\n```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.S | re.M)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
OPTIONS = {"python", "timings", "extended", "fails"}
TIME = re.compile(r"\b\d+(?:\.\d+)?(?= ?(?:ms|s|seconds|minutes)\b)|\b\d+(?=% of its time in flight\b)")
COMMAND_TIMEOUT = 600  # seconds


def pages():
    """Every page that may hold generated blocks."""
    return sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("tutorials/*.md"), ROOT / "README.md"])


@dataclasses.dataclass(frozen=True)
class Block:
    """One generated block of a page: ``body`` is its text as the page shows it."""

    page: str  # for messages
    line: int  # 1-based line of the marker
    options: frozenset
    body: str
    span: tuple  # (start, end) of the body in the page's text
    python_index: int  # kind "python": which ```python block of the page printed it

    @property
    def kind(self):
        return "python" if "python" in self.options else "console"

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def parse(text, page="<page>"):
    """The generated blocks of a page, in order.  A malformed marker raises ``ValueError``."""
    blocks = []
    for m in MARKER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        options = frozenset((m["options"] or "").split())
        if options - OPTIONS:
            raise ValueError(f"{page}:{line}: unknown output option(s) {sorted(options - OPTIONS)}; "
                             f"allowed: {sorted(OPTIONS)}")
        want = "text" if "python" in options else "console"
        if m["lang"] != want:
            raise ValueError(f"{page}:{line}: a <!-- output{': ' + m['options'].strip() if m['options'] else ''} --> "
                             f"block must be ```{want}, got ```{m['lang']}")
        before = len(PYTHON_BLOCK.findall(text[:m.start()]))
        if "python" in options and before == 0:
            raise ValueError(f"{page}:{line}: <!-- output: python --> needs a ```python block above it")
        if "python" not in options and not m["body"].startswith("$ "):
            raise ValueError(f"{page}:{line}: a generated ```console block must start with a '$ ' command line")
        blocks.append(Block(page, line, options, m["body"], m.span("body"), before - 1))
    markers = len(re.findall(r"^<!-- output[ :]", text, re.M))
    if markers != len(blocks):
        raise ValueError(f"{page}: {markers} output markers but {len(blocks)} are followed by a fenced block; "
                         "put the ``` fence on the line right after the marker")
    return blocks


def mask(text, options):
    """``text`` as the page shows it: times replaced by ``…`` under the ``timings`` option."""
    return TIME.sub("…", text) if "timings" in options else text


def commands(body):
    """The command lines of a console block, each joined across its ``\\`` continuations."""
    out, current = [], None
    for line in body.splitlines():
        if current is not None:  # continuing a command
            current.append(line)
        elif line.startswith("$ "):
            current = [line[2:]]
        else:
            continue
        if not line.endswith("\\"):
            out.append(current)
            current = None
    if current is not None:
        raise ValueError(f"command ends with a continuation '\\': {' '.join(current)!r}")
    return out


def run_command(lines, options):
    """Run one command (its lines, as typed) in a fresh temporary directory; its output, masked."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="refconv-doc-output-") as cwd:
        done = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT)
    output = "\n".join(line.rstrip() for line in done.stdout.rstrip().splitlines())
    if (done.returncode != 0) != ("fails" in options):
        raise RuntimeError(f"`{' '.join(lines)}` exited with status {done.returncode} "
                           f"(expected {'non-zero' if 'fails' in options else '0'}); its output:\n{output}")
    for line in output.splitlines():
        if line.startswith("$ ") or line.startswith("```"):
            raise RuntimeError(f"`{' '.join(lines)}` printed a line a console block cannot hold: {line!r}")
    return mask(output, options)


def regenerate_console(block):
    """The body the block should have: each of its commands followed by its output, now."""
    parts = []
    for lines in commands(block.body):
        output = run_command(lines, block.options)
        parts.append("\n".join(["$ " + lines[0], *lines[1:]] + ([output] if output else [])))
    return "\n".join(parts) + "\n"


def run_python_blocks(text, page="<page>"):
    """Run a page's ```python blocks in order in one namespace; the stdout of each, as a list.

    The blocks run in the current directory; an exception propagates with the block's name
    (``page[block k]``) in its traceback.
    """
    namespace = {"__name__": "__docs__"}
    printed = []
    for k, source in enumerate(PYTHON_BLOCK.findall(text)):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(source, f"{page}[block {k}]", "exec"), namespace)
        printed.append(buffer.getvalue())
    return printed


def python_body(block, printed):
    """The body a ``python`` block should have, given each python block's stdout."""
    output = "\n".join(line.rstrip() for line in printed[block.python_index].rstrip().splitlines())
    return mask(output, block.options) + "\n"


def regenerate(path, text, blocks):
    """``{block: new body}`` for the given blocks of one page (python blocks run in a temporary directory)."""
    new = {b: regenerate_console(b) for b in blocks if b.kind == "console"}
    if any(b.kind == "python" for b in blocks):
        here = os.getcwd()
        with tempfile.TemporaryDirectory(prefix="refconv-doc-output-") as cwd:
            os.chdir(cwd)
            try:
                printed = run_python_blocks(text, path.name)
            finally:
                os.chdir(here)
        new.update({b: python_body(b, printed) for b in blocks if b.kind == "python"})
    return new


def diff(block, new):
    """A unified diff of the page's body against the regenerated one ('' when equal)."""
    return "".join(difflib.unified_diff(block.body.splitlines(True), new.splitlines(True),
                                        f"{block.where} (page)", f"{block.where} (now)"))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Regenerate (--write) or compare (--check) the generated "
                                                 "output blocks of the docs.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report blocks whose output changed; exit 1 if any")
    mode.add_argument("--write", action="store_true", help="rewrite the blocks in place")
    parser.add_argument("--fast", action="store_true", help="leave out the blocks marked extended")
    parser.add_argument("pages", nargs="*", type=pathlib.Path, help="default: every page")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # for python blocks run in this process
    stale = 0
    for path in [p.resolve() for p in args.pages] or pages():
        text = path.read_text()
        name = os.path.relpath(path, ROOT)
        blocks = [b for b in parse(text, name)
                  if not (args.fast and "extended" in b.options)]
        if not blocks:
            continue
        new = regenerate(path, text, blocks)
        changed = [b for b in blocks if new[b] != b.body]
        for b in changed:
            print(diff(b, new[b]) if args.check else f"{b.where}: rewritten")
        stale += len(changed)
        if args.write and changed:
            for b in sorted(changed, key=lambda b: -b.span[0]):  # from the end, so spans stay valid
                text = text[:b.span[0]] + new[b] + text[b.span[1]:]
            path.write_text(text)
        print(f"{name}: {len(blocks)} generated block(s), {len(changed)} "
              f"{'differ' if args.check else 'rewritten'}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
