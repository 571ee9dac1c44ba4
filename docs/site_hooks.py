"""mkdocs hooks (mkdocs.yml ``hooks:``): put the course and the API reference into the site.

- The tutorials live in ``tutorials/``, outside ``docs/``: every ``tutorials/NN_*.py``
  notebook, ``tutorials/README.md`` and the helper files the notebooks use (copied as
  they are, for download) join the site under ``tutorials/`` (before
  mkdocs-jupyter turns the notebooks into pages).  Links between the two folders are
  written for the repository and rewritten for the site: ``../docs/PAGE.md`` in the
  README becomes ``../PAGE.md``, ``../tutorials/X`` in a docs page ``tutorials/X``.
- ``api/*.md``: one generated page per entry of ``API`` below, each a mkdocstrings
  ``:::`` block, so the reference is built from the docstrings and never edited by hand.
- Notebooks executed at build time run in a kernel started from this process: it gets
  ``tutorials/`` on ``PYTHONPATH`` (for ``import course``) and one BLAS thread per process.
"""

import os
import pathlib

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
                                    "refconv.testing.mpirun"]),
}


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
        content = f"# {title}\n\n" + "\n\n".join(f"::: {m}" for m in modules) + "\n"
        files.append(File.generated(config, f"api/{page}.md", content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    """Links written for the repository (``tutorials/`` beside ``docs/``) made right for the site."""
    if page.file.src_uri.startswith("tutorials/"):
        return markdown.replace("](../docs/", "](../")
    return markdown.replace("](../tutorials/", "](tutorials/")
