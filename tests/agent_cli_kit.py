"""What the tests of the real agent CLIs share (claude-code, codex, mini-swe-agent,
aider, gemini, opencode, ...): a project whose roles a test binds, a ticket run
through the real ``phasegate`` CLI, a workflow shown as JSON, and the check that
no key was left in the output, the store or an agent's own files.

The markers are the first words of phasegate's prompt for each role: a scripted
model server tells the roles' requests apart by them.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge

__all__ = [
    "BUILD",
    "PLAN",
    "PLAN_REVIEW",
    "REVIEW",
    "VERIFY",
    "assert_no_keys",
    "make_project",
    "processes_under",
    "run_ticket",
    "show",
]

PLAN = "You are planning a change"
PLAN_REVIEW = "Review this implementation plan"
BUILD = "Implement the plan below"
REVIEW = "Review this pull request"
VERIFY = "You are an independent verifier"


def make_project(
    tmp_path: Path,
    roles: Mapping[str, str],
    *,
    extra: str = "",
    files: Mapping[str, str] | None = None,
) -> Path:
    """A repository at ``tmp_path/repo`` with ``files`` besides a README, whose
    cartridge binds ``roles`` (role → a ``[roles.X]`` table's lines; the others
    scripted, from ``answers.toml``), appends ``extra`` and checks that
    ``feature.txt`` exists; committed."""
    repo = make_repo(
        tmp_path / "repo",
        {
            "README.md": "# r\n",
            ".gitignore": ".phasegate/\n",
            "answers.toml": HAPPY_ANSWERS,
            **(files or {}),
        },
    )
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=["test -f feature.txt"], role_overrides=dict(roles), extra=extra)
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def run_ticket(
    repo: Path, env: Mapping[str, str], *, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``phasegate run --json "Add feature.txt"`` in ``repo`` with ``env`` added to
    the environment (the keys a test hands phasegate, named by a binding or not)."""
    return phasegate_cli(
        "run", "--repo", str(repo), "--json", "Add feature.txt", timeout=timeout, env=dict(env)
    )


def show(repo: Path, workflow_id: str) -> dict:
    """``phasegate show ID --json``, parsed; fails the test when it fails."""
    out = phasegate_cli("show", workflow_id, "--repo", str(repo), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def assert_no_keys(
    repo: Path, keys: Iterable[str], *outputs: str, dirs: Iterable[Path] = ()
) -> None:
    """None of ``keys`` in ``outputs``, in the store's file (its bytes and its SQL
    dump) or in any file under ``dirs`` (an agent's own sessions and settings)."""
    db = repo / ".phasegate" / "state.db"
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
    files = [p for d in dirs for p in Path(d).rglob("*") if p.is_file()]
    for key in keys:
        for text in outputs:
            assert key not in text
        assert key.encode() not in db.read_bytes()
        assert key not in dump
        for path in files:
            assert key.encode() not in path.read_bytes(), path


def processes_under(root: Path) -> list[int]:
    """The pids of the processes whose working directory lies under ``root``: what
    an agent left running (none, once phasegate killed its process group)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(proc.joinpath("cwd").resolve()).startswith(str(root)):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids
