"""The documentation site builds with ``mkdocs build --strict``: no broken link, no missing page.

Needs the ``docs`` extra (mkdocs-material, mkdocs-jupyter, mkdocstrings), which the
``test`` extra pulls in: without mkdocs the tests fail, saying what to install (a
skip here could only hide a broken install).  The default test builds without executing
the notebooks (tests/docs_and_tutorials/test_tutorials.py runs them); the ``extended`` one builds the
site as ``make docs`` does, notebooks executed, and looks for their outputs.
"""

import functools
import html
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def needs_mkdocs(test):
    """Fail, naming the install, when mkdocs is missing (``pip install -e '.[test]'`` brings it)."""
    def run(*args, **kwargs):
        assert importlib.util.find_spec("mkdocs") is not None, "mkdocs is not installed: pip install -e '.[test]'"
        return test(*args, **kwargs)
    return functools.wraps(test)(run)


def build(site, execute, timeout):
    env = dict(os.environ, REFCONV_DOCS_EXECUTE="true" if execute else "false", NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return site


@needs_mkdocs
def test_site_builds_strictly(tmp_path):
    site = build(tmp_path / "site", execute=False, timeout=300)
    notebooks = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
    for nb in notebooks:                                   # every tutorial is a page
        assert (site / "tutorials" / nb.stem / "index.html").is_file(), nb.name
    assert (site / "tutorials" / "index.html").is_file()  # the course's README
    api = (site / "api" / "testing" / "index.html").read_text()
    assert "expect_mismatch" in api and "check_layer" in api  # the API reference comes from docstrings
    assert (site / "stationary_w" / "index.html").is_file()
    check_api_pages(site)
    assert broken_links(site) == []


def broken_links(site):
    """``(page, href)`` of every relative link of the built site to a missing page or anchor.
    mkdocs checks the Markdown pages' anchors (mkdocs.yml ``validation``); this also sees the
    notebooks' pages, whose tables of contents mkdocs-jupyter writes (a heading with code in it
    got an anchor its link did not match).  404.html's links are absolute, for any depth."""
    ids, bad = {}, []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html" or "assets" in page.relative_to(site).parts:
            continue
        for href in re.findall(r'href="([^"]+)"', page.read_text(errors="replace")):
            href = html.unescape(href)
            link = urllib.parse.urlparse(href)
            if link.scheme or href.startswith(("//", "mailto:")):
                continue
            target = (page.parent / urllib.parse.unquote(link.path)).resolve() if link.path else page
            target = target / "index.html" if target.is_dir() else target
            if not target.exists():
                bad.append((str(page.relative_to(site)), href))
            elif link.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'id="([^"]+)"', target.read_text(errors="replace")))
                if link.fragment not in ids[target]:
                    bad.append((str(page.relative_to(site)), href))
    return bad


def _hooks():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import site_hooks
    finally:
        sys.path.pop(0)
    return site_hooks


def check_api_pages(site):
    """Every API page shows its API: a re-exporting package each name it offers, and no page
    raw reST (a Sphinx role such as :func:, a simple table's ===== border, a paragraph's ::)."""
    hooks = _hooks()
    for page, (_, modules) in hooks.API.items():
        html = (site / "api" / page / "index.html").read_text()
        article = html[html.index("<article"):html.index("</article>")]
        text = re.sub(r"<[^>]+>", "", article)
        assert not re.search(r":(func|class|mod|meth|attr|data|exc|obj):", text), page
        assert not re.search(r"(?m)^\s*=+  +=+", text) and not re.search(r"(?m)\S::$", text), page
        for module in modules:
            names = hooks.public_names(module) if module in hooks.REEXPORTS else []
            missing = [name for name in names if f'id="{module}.{name}"' not in article]
            assert not missing, f"api/{page}: {module} does not show {missing}"
        assert len(text.split()) > 100, f"api/{page} is nearly empty"


@needs_mkdocs
def test_rest_docstrings_become_markdown():
    hooks = _hooks()
    text = ("A :func:`f`, a :class:`~refconv.plan.Machine` and :ref:`the page <target>`.\n\n"
            "  =====  ============\n  name   meaning\n  =====  ============\n  a      first\n"
            "         and more\n  b      ``second``\n  =====  ============\n\nAn example::\n\n    x = 1\n")
    assert hooks.rest_to_markdown(text) == (
        "A `f`, a `Machine` and `the page`.\n\n"
        "  | name | meaning |\n  |---|---|\n  | a | first and more |\n  | b | ``second`` |\n\n"
        "An example:\n\n    x = 1\n")


@pytest.mark.extended
@needs_mkdocs
def test_site_renders_the_tutorials_with_their_outputs(tmp_path):
    site = build(tmp_path / "site", execute=True, timeout=900)
    page = (site / "tutorials" / "07_stationary_w" / "index.html").read_text()
    assert "tutorial 7: all checks passed" in page and "data:image/png;base64" in page


@needs_mkdocs
def test_a_tutorial_runs_headless_as_a_notebook_as_tutorials_readme_says(tmp_path):
    """tutorials/README.md: ``jupytext --to ipynb --execute`` from tutorials/ (here with -o, so the
    tree stays clean); the notebook it writes by default, and metrics.jsonl, are ignored by git."""
    out = tmp_path / "01.ipynb"
    jupytext = pathlib.Path(sys.executable).parent / "jupytext"
    r = subprocess.run([str(jupytext), "--to", "ipynb", "--execute", "01_serial_convolution.py", "-o", str(out)],
                       cwd=ROOT / "tutorials", capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr

    cells = json.loads(out.read_text())["cells"]
    assert sum(len(c.get("outputs", [])) for c in cells if c["cell_type"] == "code") > 0
    ignored = subprocess.run(["git", "check-ignore", "tutorials/01_serial_convolution.ipynb", "metrics.jsonl"],
                             cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == ["tutorials/01_serial_convolution.ipynb", "metrics.jsonl"]
