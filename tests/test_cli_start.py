"""The command line starts without what its command does not use: ``--help`` loads
no GitHub client, no web server, no migrations, no SQLAlchemy and no pydantic; ``status`` on a
SQLite store at the current schema reads it without SQLAlchemy or Alembic
(benchmarks/cli_start.py times them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory

from phasegate.clock import SystemClock
from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import HEAD_REVISION, Store, open_store
from phasegate.store.store import make_dialect
from phasegate.tools.demo import make_sample_project

#: Runs ``phasegate ARGS`` in this process, then prints which of the packages it
#: was given are loaded.
_PROBE = """
import json, sys
from phasegate.cli import main
packages, sys.argv = json.loads(sys.argv[1]), ["phasegate", *sys.argv[2:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps([p for p in packages if p in sys.modules]), file=sys.stderr)
"""

NEVER_AT_START = ["githubkit", "alembic", "fastapi", "uvicorn", "starlette"]


def _loaded(args: list[str], packages: list[str], cwd: Path) -> list[str]:
    """The ``packages`` a fresh ``phasegate ARGS`` process holds once it is done."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(packages), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
        timeout=120,
    )
    loaded: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return loaded


def test_help_loads_no_github_web_migrations_sqlalchemy_or_pydantic(tmp_path: Path) -> None:
    assert _loaded(["--help"], [*NEVER_AT_START, "sqlalchemy", "pydantic"], tmp_path) == []


def test_status_at_the_current_schema_loads_no_github_web_alembic_or_sqlalchemy(
    tmp_path: Path,
) -> None:
    repo = make_sample_project(tmp_path / "calc")
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        Engine(repo, cartridge, store).start("Add subtract()", "Add subtract() to calc")
    finally:
        store.close()
    assert _loaded(["status"], [*NEVER_AT_START, "sqlalchemy"], repo) == []


def test_head_revision_is_alembics_head() -> None:
    config = Config()
    config.set_main_option(
        "script_location", str(Path(__file__).parents[1] / "src/phasegate/store/migrations")
    )
    assert ScriptDirectory.from_config(config).get_current_head() == HEAD_REVISION


def test_a_store_below_head_is_still_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    dialect = make_dialect(url)
    older = Store(dialect.engine(), SystemClock(), dialect)
    older.migrate("0004")
    older.close()
    store = open_store(url)
    try:
        with store.reading() as conn:
            revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        store.close()
    assert revision == HEAD_REVISION
