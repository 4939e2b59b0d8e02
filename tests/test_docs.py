"""The docs: the generated references are current, every link between pages resolves."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
#: A Markdown link or image whose target is a relative path (no scheme, no bare anchor).
LINK = re.compile(r"!?\[[^\]]*\]\((?!https?:|mailto:|#)([^)\s#]+)(?:#[^)\s]*)?\)")
#: A full stop (or ! or ?) after a word and then the next sentence's first letter.
SENTENCE_BREAK = re.compile(r"[\w)`'\"][.!?]\s+[A-Z`]")


def test_the_committed_cartridge_reference_is_what_the_models_give(tmp_path: Path) -> None:
    """Stale means a model in src/phasegate/config/ changed and the generator was not run:
    run `.venv/bin/python scripts/cartridge_reference.py` and commit what it writes."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cartridge_reference.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in ("cartridge.md", "phasegate.schema.json"):
        fresh = (tmp_path / name).read_text(encoding="utf-8")
        committed = (REFERENCE / name).read_text(encoding="utf-8")
        assert committed == fresh, (
            f"docs/reference/{name} is stale: run scripts/cartridge_reference.py and commit it"
        )


def test_the_committed_module_map_is_what_the_tree_gives(tmp_path: Path) -> None:
    """Stale means a module was added, moved or renamed, its docstring's first paragraph
    changed, or the layers in pyproject.toml did: regenerate the page and commit it."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "module_map.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = (tmp_path / "modules.md").read_text(encoding="utf-8")
    committed = (REFERENCE / "modules.md").read_text(encoding="utf-8")
    assert committed == fresh, (
        "docs/reference/modules.md is stale: from the repository root run "
        "`.venv/bin/python scripts/module_map.py` and commit docs/reference/modules.md"
    )


def test_every_module_says_its_one_job_in_one_sentence() -> None:
    """A module's docstring opens with one paragraph that is one sentence: the module map's
    line for it. What else it says goes in the paragraphs after a blank line."""
    unclear = []
    for path in sorted((ROOT / "src" / "phasegate").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        first = " ".join(doc.strip().split("\n\n")[0].split())
        if not first.endswith(".") or SENTENCE_BREAK.search(first):
            unclear.append(f"{path.relative_to(ROOT)}: {first!r}")
    assert unclear == []


def test_every_relative_link_of_the_readme_and_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text(encoding="utf-8"))
        if not (page.parent / target).exists()
    ]
    assert broken == []


def test_the_readme_reads_in_five_minutes() -> None:
    assert (ROOT / "README.md").stat().st_size <= 20 * 1024
