"""mkdocs hook (mkdocs.yml ``hooks:``): the exercises join the site under ``tutorials/exercises/``.

Their pages (README.md and ``NN_slug.md``) become pages, and the skeletons, the solutions and the
checker's modules the pages link to are copied as they are, for download.  A page links to the docs
as the repository lays them out (``../../docs/PAGE.md``); on the site that is ``../../PAGE.md``.
"""

import pathlib

from mkdocs.structure.files import File

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def on_files(files, config):
    pages = [HERE / "README.md", *sorted(HERE.glob("[0-9][0-9]_*.md"))]
    code = [*sorted((HERE / "skeletons").glob("[0-9][0-9]_*.py")), HERE / "score.py", HERE / "counting.py",
            HERE / "kit.py",
            *sorted((HERE / "solutions").glob("[0-9][0-9]_*.py"))]
    for path in pages + code:
        files.append(File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith("tutorials/exercises/"):
        return markdown.replace("](../../docs/", "](../../")
    return markdown
