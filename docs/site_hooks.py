"""mkdocs hooks (mkdocs.yml ``hooks:``): put the course and the API reference into the site.

- The tutorials live in ``tutorials/``, outside ``docs/``: every ``tutorials/NN_*.py``
  notebook, ``tutorials/README.md`` and the helper files the notebooks use (copied as
  they are, for download) join the site under ``tutorials/`` (before
  mkdocs-jupyter turns the notebooks into pages).  Links between the two folders are
  written for the repository and rewritten for the site: ``../docs/PAGE.md`` in the
  README becomes ``../PAGE.md``, ``../tutorials/X`` in a docs page ``tutorials/X``.
- ``api/*.md``: one generated page per entry of ``API`` below, each a mkdocstrings
  ``:::`` block, so the reference is built from the docstrings and never edited by hand.
  A package that only re-exports (``REEXPORTS``: ``refconv``, ``refconv.reference``) lists
  the names it imports for its users, read from the package when the site is built.
- The docstrings are reST (Sphinx roles, simple tables, ``::``) and the site is
  Markdown: :class:`RestToMarkdown`, a griffe extension (mkdocs.yml), rewrites each
  docstring with :func:`rest_to_markdown` before mkdocstrings renders it.
- Notebooks executed at build time run in a kernel started from this process: it gets
  ``tutorials/`` on ``PYTHONPATH`` (for ``import course``) and one BLAS thread per process.
"""

import importlib
import inspect
import os
import pathlib
import re

import griffe
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"

# page -> (title, the modules it documents)
API = {
    "refconv": ("refconv", ["refconv"]),
    "layers": ("Layers", ["refconv.layers"]),
    "algorithms": ("Algorithms", ["refconv.algorithms", "refconv.algorithms.spatial",
                                  "refconv.algorithms.stationary_x", "refconv.algorithms.stationary_y",
                                  "refconv.algorithms.stationary_w", "refconv.algorithms.grouped"]),
    "collectives": ("Collectives", ["refconv.collectives"]),
    "distribution": ("Grid, distributions, halos", ["refconv.grid", "refconv.distribution", "refconv.sharding",
                                                     "refconv.halo"]),
    "reference": ("Serial reference", ["refconv.reference"]),
    "cost_model": ("Cost model", ["refconv.cost_model"]),
    "checks": ("Argument checks", ["refconv.checks"]),
    "torch": ("PyTorch interop", ["refconv.torch"]),
    "plan": ("Planning", ["refconv.plan", "refconv.pricing.search", "refconv.pricing.machine", "refconv.pricing.perf"]),
    "testing": ("refconv.testing", ["refconv.testing.strategies", "refconv.testing.check",
                                    "refconv.testing.asserts", "refconv.testing.mutants",
                                    "refconv.testing.mpirun", "refconv.testing.ranks",
                                    "refconv.testing.commands"]),
    "simulated": ("Simulated ranks", ["refconv.simulated", "refconv.simulated.comm", "refconv.simulated.world",
                                      "refconv.simulated.engine", "refconv.simulated.clock",
                                      "refconv.simulated.leaks", "refconv.simulated.groups",
                                      "refconv.commands.simulate", "refconv.commands.simulate_steps"]),
}

REEXPORTS = {"refconv", "refconv.reference"}  # packages whose API is the names they import


def public_names(module_name):
    """The names a re-exporting package offers: its ``__all__`` (refconv's load on first use), else its public
    attributes that are not modules."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or list(vars(module))
    return [name for name in names if name.isidentifier() and not name.startswith("_")
            and not inspect.ismodule(getattr(module, name))]


def api_block(module_name):
    """The mkdocstrings block of one module (a re-exporting package lists its names)."""
    if module_name not in REEXPORTS:
        return f"::: {module_name}"
    members = ", ".join(public_names(module_name))
    return f"::: {module_name}\n    options:\n      members: [{members}]"


# -- reST docstrings as Markdown --------------------------------------------------------------------
ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const|ref|doc|term):`([^`]+)`")
BORDER = re.compile(r"^( *)(=+)((?: +=+)+) *$")


def _role(match):
    text = match[1]
    if "<" in text and text.endswith(">"):  # :ref:`words <target>`: the words
        return f"`{text[:text.index('<')].strip()}`"
    return f"`{text.lstrip('~').rsplit('.', 1)[-1] if text.startswith('~') else text}`"


def _cells(line, spans):
    return [line[start:stop if i + 1 < len(spans) else None].strip() for i, (start, stop) in enumerate(spans)]


def _table(lines, indent):
    """A reST simple table (its lines, border to border) as a Markdown table."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", lines[0])]
    body = [line[indent:] if line.strip() else "" for line in lines]
    spans = [(a - indent, b - indent) for a, b in spans]
    rows, header = [], None
    for line in body[1:]:
        if BORDER.match(" " * indent + line):
            if header is None:
                header, rows = rows, []
            continue
        cells = _cells(line, spans)
        if not any(cells):
            continue
        if rows and not cells[0]:  # a continuation line: its text joins the row above
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    header = header or [[""] * len(spans)]
    head = [" ".join(parts).strip() for parts in zip(*header)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(spans)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return [" " * indent + line for line in out]


def rest_to_markdown(text):
    """A reST docstring as Markdown: Sphinx roles become code (``:func:`f``` -> ```f```), simple
    tables (``===  ===`` borders) Markdown tables, and a paragraph's closing ``::`` a colon."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        border = BORDER.match(lines[i])
        if border:
            indent, ends = len(border[1]), [j for j in range(i + 1, len(lines)) if lines[j] == lines[i]]
            last = ends[1] if len(ends) > 1 else (ends[0] if ends else None)
            if last is not None:
                if out and out[-1].strip():
                    out.append("")
                out += _table(lines[i:last + 1], indent)
                i = last + 1
                continue
        out.append(lines[i])
        i += 1
    text = ROLE.sub(_role, "\n".join(out))
    text = re.sub(r"(?m)^(\s*)::$", "", text)  # a lone "::" introduces the block after it
    return re.sub(r"(?m)(\S)::$", r"\1:", text)


class RestToMarkdown(griffe.Extension):
    """Every docstring, rewritten by :func:`rest_to_markdown` when griffe loads it."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = rest_to_markdown(obj.docstring.value)


def on_config(config):
    path = [str(TUTORIALS), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    return config


@event_priority(100)  # before mkdocs-jupyter wraps the notebooks
def on_files(files, config):
    helpers = [TUTORIALS / "course.py", TUTORIALS / "layer_job.py", TUTORIALS / "mixed_strategies.yaml"]
    for path in [TUTORIALS / "README.md", *sorted(TUTORIALS.glob("[0-9][0-9]_*.py")), *helpers]:
        files.append(File(f"tutorials/{path.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    for page, (title, modules) in API.items():
        content = f"# {title}\n\n" + "\n\n".join(api_block(m) for m in modules) + "\n"
        files.append(File.generated(config, f"api/{page}.md", content=content))
    return files


NOTEBOOK_EXERCISE = re.compile(r'href="exercises/([0-9][0-9]_[a-z0-9_]+)\.md"')


def on_page_content(html, page, config, files):
    """A notebook's links to the exercises (``exercises/NN_slug.md`` beside it in the repository): on the
    site the notebook is a folder of its own (``tutorials/NN_name/``), the exercise a page beside it."""
    if re.fullmatch(r"tutorials/[0-9][0-9]_\w+\.py", page.file.src_uri):
        return NOTEBOOK_EXERCISE.sub(r'href="../exercises/\1/"', html)
    return html


def on_page_markdown(markdown, page, config, files):
    """Links written for the repository (``tutorials/`` beside ``docs/``) made right for the site."""
    if page.file.src_uri.startswith("tutorials/"):
        return markdown.replace("](../docs/", "](../")
    return markdown.replace("](../tutorials/", "](tutorials/")
