"""The docs: the generated cartridge reference is current, every link between pages resolves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
#: A Markdown link or image whose target is a relative path (no scheme, no bare anchor).
LINK = re.compile(r"!?\[[^\]]*\]\((?!https?:|mailto:|#)([^)\s#]+)(?:#[^)\s]*)?\)")


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
