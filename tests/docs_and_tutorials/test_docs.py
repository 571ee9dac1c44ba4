"""The docs cannot rot: their code runs and the outputs they show are regenerated and compared.

- Every ```python block in docs/, tutorials/ and README.md runs (blocks of one page share a
  namespace and run in a temporary directory).  A ```text block marked
  ``<!-- output: python -->`` must be what the python block above it printed.
- Every ```console block marked ``<!-- output -->`` (in docs/, tutorials/ or
  README.md) is rerun by ``scripts/doc_outputs.py`` and must show what its
  commands print today; blocks marked ``extended`` are checked under the
  ``extended`` marker only.

When a check fails, ``.venv/bin/python scripts/doc_outputs.py --write <page>``
rewrites the page's blocks; read the new output before committing it.
"""

import importlib.util
import pathlib
import pydoc
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import doc_outputs  # noqa: E402  (scripts/ is not a package)

PAGES = sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("tutorials/*.md")]) + [ROOT / "README.md"]  # its layer script too


def _name(path):
    return str(path.relative_to(ROOT))


def _compare(block, new):
    """Fail with a diff (and the command that rewrites the page) when the page shows another output."""
    if new != block.body:
        pytest.fail(f"{block.where} shows an output that is no longer what it prints:\n{doc_outputs.diff(block, new)}"
                    f"\nrerun: .venv/bin/python scripts/doc_outputs.py --write {block.page}", pytrace=False)


def test_docs_have_pages():
    assert any(p.name == "index.md" for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_code_blocks_run(page, tmp_path, monkeypatch):
    text = page.read_text()
    monkeypatch.chdir(tmp_path)
    printed = doc_outputs.run_python_blocks(text, page.name)
    for block in doc_outputs.parse(text, _name(page)):
        if block.kind == "python":
            _compare(block, doc_outputs.python_body(block, printed))


NAMED = re.compile(r"`(refconv(?:\.[A-Za-z_]\w*)+)")  # `refconv.pricing.perf.local_conv_shape`, ...


def test_named_refconv_objects_exist():
    """Every `refconv.x.y` a page or tutorial names in code font is a module or an attribute today
    (refconv.torch's only where torch is installed, as in CI)."""
    sources = [*PAGES, *ROOT.glob("tutorials/*.py")]
    names = {(_name(p), n) for p in sources for n in NAMED.findall(p.read_text())}
    if importlib.util.find_spec("torch") is None:
        names = {(p, n) for p, n in names if not n.startswith("refconv.torch")}
    assert len(names) > 50  # the pattern still finds the pages' names
    missing = sorted(f"{page}: {name}" for page, name in names if pydoc.locate(name) is None)
    assert not missing, "named in the docs but not in refconv:\n" + "\n".join(missing)


def test_output_markers_are_well_formed():
    for page in doc_outputs.pages():
        doc_outputs.parse(page.read_text(), _name(page))  # raises on a marker without its block


def _console_blocks():
    params = []
    for page in doc_outputs.pages():
        try:
            blocks = doc_outputs.parse(page.read_text(), _name(page))
        except ValueError:
            continue  # test_output_markers_are_well_formed reports it
        for b in blocks:
            if b.kind == "console":
                marks = [pytest.mark.extended] if "extended" in b.options else []
                params.append(pytest.param(b, id=b.where, marks=marks))
    return params


@pytest.mark.parametrize("block", _console_blocks())
def test_console_output_is_current(block):
    _compare(block, doc_outputs.regenerate_console(block))


def test_a_generated_block_is_checked_by_default():
    """The default suite must compare at least one command's output (not only extended ones)."""
    default = [p for p in _console_blocks() if not p.marks]
    assert default, "every generated console block is marked extended: keep a cheap one in the default suite"


# -- the mechanism itself, on small made-up pages -------------------------------------------------

PAGE = """# A page

<!-- output: timings -->
```console
$ echo "hello"; echo "took 12.5 ms, 3 s and 2 steps, 64 samples"
$ echo a \\
  b
stale
```

```python
print(1 + 1)
```

<!-- output: python -->
```text
3
```
"""


def test_check_reports_stale_blocks_and_write_fixes_them(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    assert doc_outputs.main(["--check", str(page)]) == 1
    assert "-stale" in capsys.readouterr().out
    assert doc_outputs.main(["--write", str(page)]) == 0
    text = page.read_text()
    assert "$ echo \"hello\"; echo \"took 12.5 ms, 3 s and 2 steps, 64 samples\"\nhello\n" \
           "took … ms, … s and 2 steps, 64 samples\n$ echo a \\\n  b\na b\n```" in text
    assert "<!-- output: python -->\n```text\n2\n```" in text
    assert doc_outputs.main(["--check", str(page)]) == 0


def test_a_failing_command_is_an_error_unless_marked():
    block = doc_outputs.parse("<!-- output -->\n```console\n$ echo oops; exit 3\n```\n")[0]
    with pytest.raises(RuntimeError, match="exited with status 3"):
        doc_outputs.regenerate_console(block)
    block = doc_outputs.parse("<!-- output: fails -->\n```console\n$ echo oops; exit 3\n```\n")[0]
    assert doc_outputs.regenerate_console(block) == "$ echo oops; exit 3\noops\n"


@pytest.mark.parametrize("text, message", [
    ("<!-- output: sometimes -->\n```console\n$ true\n```\n", "unknown output option"),
    ("<!-- output -->\n```text\n$ true\n```\n", "must be ```console"),
    ("<!-- output -->\n```console\ntrue\n```\n", "must start with a '\\$ ' command"),
    ("<!-- output: python -->\n```text\n1\n```\n", "needs a ```python block above"),
    ("<!-- output -->\n\n```console\n$ true\n```\n", "fence on the line right after"),
])
def test_malformed_markers_are_rejected(text, message):
    with pytest.raises(ValueError, match=message):
        doc_outputs.parse(text)


# -- README.md's Layout table names every folder -------------------------------------------------------
SKIPPED_FOLDERS = {"__pycache__"}


def _layout_paths():
    """The backticked paths of README.md's Layout section (``refconv/train/``, ``tests/mpi/``, ...)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout\n")
    section = text[start:text.index("\n## ", start + 1)]
    return set(re.findall(r"`([^`\s]+)`", section))


def _folders(under):
    """The folders directly in ``under`` (a folder of the repository), read from the filesystem now."""
    return sorted(f"{p.relative_to(ROOT)}/" for p in (ROOT / under).iterdir()
                  if p.is_dir() and p.name not in SKIPPED_FOLDERS and not p.name.startswith(".")
                  and not p.name.endswith(".egg-info"))


def _tracked_top_folders():
    """The top-level folders git tracks a file in (.ci/ included; .venv/ and build outputs are not tracked)."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"no git checkout to list the tracked folders of: {listed.stderr.strip()}")
    return sorted({f"{line.split('/')[0]}/" for line in listed.stdout.splitlines() if "/" in line})


@pytest.mark.parametrize("kind", ["top level", "refconv", "tests"])
def test_the_layout_table_names_every_folder(kind):
    folders = {"top level": _tracked_top_folders, "refconv": lambda: _folders("refconv"),
               "tests": lambda: _folders("tests")}[kind]()
    named = _layout_paths()
    missing = [f for f in folders if f not in named]
    assert folders and not missing, \
        f"README.md's Layout table names no row for these folders ({kind}): {', '.join(missing)}: add them, in backticks"
