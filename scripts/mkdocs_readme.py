"""MkDocs hook: the README is the site's home page, its ``docs/`` links made relative.

Kept in the README alone, the five-minute introduction cannot drift from the
site's: the hook hands MkDocs the README as ``index.md`` and rewrites each
``](docs/PAGE)`` link to ``](PAGE)``, which ``mkdocs build --strict`` then checks
like any other link.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

__all__ = ["on_files", "on_page_markdown"]


def on_files(files: Files, config: Any) -> Files:
    """Add the README as ``index.md``; a page named so in ``docs/`` would shadow it."""
    readme = Path(config.config_file_path).parent / "README.md"
    text = readme.read_text(encoding="utf-8").replace("](docs/", "](")
    files.append(File.generated(config, "index.md", content=text))
    return files


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """A page's link to the README (``../README.md``, right on GitHub) is the home page here."""
    return markdown.replace("](../README.md", "](index.md")
