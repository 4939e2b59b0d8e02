"""A ``store.url`` this version cannot open (PostgreSQL, until its issue lands):
``doctor`` reports it by its key and exits 1; every command stops with one line
naming ``store.url`` and exits 2, never a traceback (issue 9, item 12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasegate.store import StoreUrlUnsupported, open_store, store_url_problem

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

PG_URL = "postgresql://phasegate:s3cr3t-pw@db.example:5432/phasegate"


@pytest.fixture
def pg_repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text("")
    (repo / "phasegate.toml").write_text(scripted_cartridge(extra=f'[store]\nurl = "{PG_URL}"\n'))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def test_open_store_refuses_postgresql_naming_store_url_and_hiding_the_password() -> None:
    with pytest.raises(StoreUrlUnsupported, match=r"store\.url: PostgreSQL is not supported yet"):
        open_store(PG_URL)
    problem = store_url_problem(PG_URL)
    assert problem is not None and "sqlite:///" in problem and "s3cr3t-pw" not in problem
    assert store_url_problem("sqlite:///x/state.db") is None
    assert "mysql is not a supported store" in (store_url_problem("mysql://h/db") or "")


def test_doctor_reports_a_postgresql_store_url_as_a_problem_and_exits_1(pg_repo: Path) -> None:
    proc = phasegate_cli("doctor", "--repo", str(pg_repo), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    found = json.loads(proc.stdout)
    assert [m for m in found["missing"] if m.startswith("store.url: PostgreSQL is not supported")]
    assert "s3cr3t-pw" not in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("show", "deadbeef"),
        ("run", "Add feature.txt"),
        ("worker", "--once"),
    ],
)
def test_every_command_on_a_postgresql_store_url_exits_2_with_one_line(
    pg_repo: Path, args: tuple[str, ...]
) -> None:
    proc = phasegate_cli(*args, "--repo", str(pg_repo))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())
    assert "store.url: PostgreSQL is not supported yet; use sqlite:///" in said
    assert "s3cr3t-pw" not in proc.stdout + proc.stderr
