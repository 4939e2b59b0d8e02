"""``store.url``: SQLite and PostgreSQL are opened (``postgresql://`` and ``postgres://``),
any other database is refused naming the key (``doctor`` reports it and exits 1, every
command exits 2); a PostgreSQL server that cannot be reached stops every command with
one line and exit 1, the password never shown."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from phasegate.store import StoreUnavailable, StoreUrlUnsupported, open_store, store_url_problem

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

# Port 1 of this machine: refused at once, no DNS, no waiting for a timeout.
PG_URL = "postgresql://phasegate:s3cr3t-pw@127.0.0.1:1/phasegate"


def repo_with_store(tmp_path: Path, url: str) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text("")
    (repo / "phasegate.toml").write_text(scripted_cartridge(extra=f'[store]\nurl = "{url}"\n'))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


@pytest.mark.parametrize("url", [PG_URL, PG_URL.replace("postgresql://", "postgres://")])
def test_an_unreachable_postgresql_is_unavailable_and_its_password_is_never_shown(
    url: str,
) -> None:
    assert store_url_problem(url) is None
    with pytest.raises(StoreUnavailable, match="connection") as raised:
        open_store(url, busy_timeout_s=2)
    assert "s3cr3t-pw" not in str(raised.value)
    assert "127.0.0.1" in str(raised.value)


def test_other_databases_and_drivers_are_refused_naming_store_url() -> None:
    assert "mysql is not a supported store" in (store_url_problem("mysql://h/db") or "")
    problem = store_url_problem("postgresql+asyncpg://u:s3cr3t-pw@h/db")
    assert problem is not None and "store.url" in problem and "s3cr3t-pw" not in problem
    with pytest.raises(StoreUrlUnsupported, match=r"store\.url: .* is not a database URL"):
        open_store("not a url")
    assert store_url_problem("sqlite:///x/state.db") is None


def test_doctor_reports_a_postgresql_server_that_does_not_answer_and_exits_1(
    tmp_path: Path,
) -> None:
    # Found by a fresh user: doctor said "ready" for a store no command could open.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    repo = repo_with_store(tmp_path, f"postgresql://phasegate:s3cr3t-pw@127.0.0.1:{port}/pg")
    proc = phasegate_cli("doctor", "--repo", str(repo), "--json", "--offline")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    found = json.loads(proc.stdout)
    assert [m for m in found["missing"] if m.startswith("store.url: the server does not answer")]
    assert "s3cr3t-pw" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql://u:s3cr3t-pw@127.0.0.1:5432/db?busy_timeout=abc", "busy_timeout='abc'"),
        ("postgresql://u:s3cr3t-pw@127.0.0.1:5432/db?busy_timeout=nan", "busy_timeout='nan'"),
        ("postgresql://u:s3cr3t-pw@127.0.0.1:5432/db?busy_timeout=-5", "busy_timeout='-5'"),
        ("postgresql://u:p%40ss%3Aw%2Fs3cr3t-pw@127.0.0.1/db?busy_timeout=x", "busy_timeout='x'"),
        ("postgresql://u:s3cr3t-pw@127.0.0.1:notaport/db", "not a database URL"),
        ("postgresql://u:s3cr3t-pw@127.0.0.1:5432/db?foo=bar", 'invalid connection option "foo"'),
    ],
)
def test_a_malformed_store_url_is_one_line_naming_the_fault_never_the_password(
    url: str, words: str
) -> None:
    # Found by a fresh user: the busy_timeout message quoted the whole URL, password
    # and all; a bad port, NaN and an option libpq does not know were tracebacks.
    with pytest.raises(StoreUrlUnsupported, match=r"^store\.url: ") as raised:
        open_store(url)
    assert words in str(raised.value)
    assert "s3cr3t-pw" not in str(raised.value) and "\n" not in str(raised.value)


def test_doctor_reports_an_unsupported_store_url_as_a_problem_and_exits_1(tmp_path: Path) -> None:
    repo = repo_with_store(tmp_path, "mysql://phasegate:s3cr3t-pw@db.example/phasegate")
    proc = phasegate_cli("doctor", "--repo", str(repo), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    found = json.loads(proc.stdout)
    assert [m for m in found["missing"] if m.startswith("store.url: mysql is not a supported")]
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
def test_every_command_on_an_unreachable_postgresql_exits_1_with_one_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    repo = repo_with_store(tmp_path, PG_URL)
    proc = phasegate_cli(*args, "--repo", str(repo))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())
    assert "127.0.0.1" in said and "is unavailable: connection" in said
    assert "s3cr3t-pw" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("url", ["postgres://", "postgresql://", "postgresql+psycopg://"])
def test_a_postgresql_url_naming_nothing_is_refused_before_any_connection(url: str) -> None:
    # A new user's bare postgres:// was reported as a missing local socket.
    problem = store_url_problem(url) or ""
    assert problem == (
        f"store.url: {url} names no server and no database; "
        "write postgresql://user:password@host:5432/db"
    )
    assert "s3cr3t" not in (store_url_problem("postgresql://u:s3cr3t@/") or "-s3cr3t")
