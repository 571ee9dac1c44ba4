"""Every ```python block in docs/ and tutorials/ runs (blocks of one page share a namespace)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("tutorials/*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_docs_have_pages():
    assert any(p.name == "index.md" for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page, tmp_path, monkeypatch):
    blocks = BLOCK.findall(page.read_text())
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for k, block in enumerate(blocks):
        exec(compile(block, f"{page.name}[block {k}]", "exec"), namespace)
