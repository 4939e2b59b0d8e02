"""Hostile input is refused by key or shown harmlessly.

A cartridge nested deep enough to exhaust Python's stack, a ``worktree_root``
that would put worktrees at ``/``, beside the repository or in its checkout,
and terminal escapes in a ticket or in an agent's output: each is exit 2 with
the key named, or printed as visible escapes, never a traceback or a
terminal that clears itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phasegate.config.toml import read_toml
from phasegate.core.terminal import visible

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge


def project(tmp_path: Path, cartridge: str) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("bomb", "named"),
    [
        ("\n[limits]\nx = " + "[" * 5000 + "]" * 5000 + "\n", "line 10, key limits.x"),
        ("\n[roles.plan.env]\na = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", "roles.plan.env.a"),
        ("\n[limits]\ny = " + "[" * 40 + "]" * 40 + "\n", "limits.y"),  # parses, still too deep
    ],
    ids=["arrays-past-the-stack", "inline-tables-past-the-stack", "arrays-past-the-limit"],
)
def test_a_toml_bomb_is_exit_2_naming_the_key(tmp_path: Path, bomb: str, named: str) -> None:
    repo = project(tmp_path, '[workflow]\nbase_branch = "main"\n' + "\n" * 5 + bomb)
    # run refuses (2: bad input); doctor reports the cartridge invalid (1: not ready)
    for command, code in ((["run", "t"], 2), (["doctor"], 1)):
        proc = phasegate_cli(*command, "--repo", str(repo))
        assert proc.returncode == code, proc.stderr + proc.stdout
        said = flat(proc.stderr + proc.stdout)
        assert "Traceback" not in said and "RecursionError" not in said
        assert "nested more than 32 levels deep" in said and named in said, said


def test_a_huge_toml_file_is_refused_by_size(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_text("x = 1\n" + "# padding\n" * 600_000)
    with pytest.raises(Exception, match=r"big.toml: \d+ bytes, more than the 4194304"):
        read_toml(path)


@pytest.mark.parametrize(
    ("root", "why"),
    [
        ("/", "an ancestor of the repository"),
        ("..", "an ancestor of the repository"),
        ("../..", "an ancestor of the repository"),
        (".", "the repository itself"),
        (".git", "inside the checkout"),
        (".git/worktrees-here", "inside the checkout"),
        ("src", "inside the checkout"),
        (".phasegate", "inside the checkout"),
    ],
)
def test_a_worktree_root_outside_the_allowed_places_is_exit_2_naming_the_key(
    tmp_path: Path, root: str, why: str
) -> None:
    extra = f'[landing_areas]\nworktree_root = "{root}"\n'
    text = scripted_cartridge().replace("[landing_areas]\n", extra, 1)
    repo = project(tmp_path, text)
    proc = phasegate_cli("run", "--repo", str(repo), "t")
    said = flat(proc.stderr)
    assert proc.returncode == 2, said
    assert f"landing_areas.worktree_root = '{root}'" in said and why in said, said
    assert not (repo / ".phasegate" / "state.db").exists() or "workflow" not in said
    assert git(repo, "worktree", "list").count("\n") == 0  # no worktree was made anywhere


@pytest.mark.parametrize("root", [".phasegate/elsewhere", "../beside-the-repository"])
def test_a_worktree_root_inside_phasegate_or_outside_the_repository_works(
    tmp_path: Path, root: str
) -> None:
    text = scripted_cartridge().replace(
        "[landing_areas]\n", f'[landing_areas]\nworktree_root = "{root}"\n', 1
    )
    repo = project(tmp_path, text)
    proc = phasegate_cli("run", "--repo", str(repo), "--json", "Add the feature")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "completed"
    assert (repo / root).resolve().is_dir()


EVIL = "\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\\u202eend"


def test_escapes_in_a_ticket_and_in_agent_output_print_as_visible_escapes(tmp_path: Path) -> None:
    # printf turns \\033 into ESC: the agent's stderr carries real escapes
    failing_plan = r"""runner = "command"
command = "printf '\\033[2J\\033]0;pwned\\007' >&2; exit 3"
"""
    repo = project(tmp_path, scripted_cartridge(role_overrides={"plan": failing_plan}))
    proc = phasegate_cli("run", "--repo", str(repo), "--title", "T" + EVIL, "the ticket" + EVIL)
    assert proc.returncode == 1, proc.stderr
    workflow_id = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)[0]["id"]
    for printed in (
        proc.stdout + proc.stderr,
        phasegate_cli("status", "--repo", str(repo)).stdout,
        phasegate_cli("show", workflow_id, "--repo", str(repo)).stdout,
    ):
        assert "\x1b" not in printed and "\x07" not in printed and "\u202e" not in printed
    shown = phasegate_cli("show", workflow_id, "--repo", str(repo)).stdout
    assert "\\x1b[2J" in shown and "\\x1b]0;pwned\\x07" in shown  # the title, visibly
    assert "\\u202eend" in shown
    # the agent's stderr is the failure's reason: escaped as well
    assert shown.count("\\x1b]0;pwned") >= 2, shown
    # --json keeps the text as it was (JSON escapes it)
    raw = json.loads(phasegate_cli("show", workflow_id, "--repo", str(repo), "--json").stdout)
    assert raw["workflow"]["title"] == "T" + EVIL


def test_a_nul_in_an_agent_answer_reaches_neither_the_next_agent_nor_the_store(
    tmp_path: Path,
) -> None:
    # The plan holds a NUL; the plan reviewer, a command too, gets the plan in its
    # environment, which no process may be started with.
    plan = 'runner = "command"\ncommand = "printf \'1. Add x\\\\000y.\\\\n\'"\n'
    review = 'runner = "command"\ncommand = "echo \'VERDICT: approve\'"\n'
    cartridge = scripted_cartridge(role_overrides={"plan": plan, "plan_review": review})
    repo = project(tmp_path, cartridge)
    proc = phasegate_cli("run", "--repo", str(repo), "the ticket")
    assert "Traceback" not in proc.stderr and "null byte" not in proc.stdout + proc.stderr
    workflow_id = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)[0]["id"]
    shown = json.loads(phasegate_cli("show", workflow_id, "--repo", str(repo), "--json").stdout)
    assert shown["workflow"]["current_phase"] != "planning", shown["workflow"]
    assert "\ufffd" in json.dumps(shown, ensure_ascii=False)


def test_visible_escapes_every_control_character_but_newline_and_tab() -> None:
    assert visible("a\x00b\x1b\x7f\x9bc\td\ne\u2066") == "a\\x00b\\x1b\\x7f\\x9bc\td\ne\\u2066"
    assert visible("x\ty\nz", one_line=True) == "x\\ty\\nz"
    assert visible("plain text, ünïcödé ✓") == "plain text, ünïcödé ✓"


def test_log_lines_show_control_characters_as_escapes() -> None:
    import logging

    from phasegate.cli import _VisibleFormatter

    record = logging.LogRecord("engine", logging.WARNING, "", 0, "phase %s: %s", ("x", EVIL), None)
    line = _VisibleFormatter("%(levelname)s: %(message)s").format(record)
    assert line.startswith("WARNING: phase x: \\x1b[2J") and "\x1b" not in line


def test_a_ticket_that_is_not_utf8_is_exit_2_naming_it(tmp_path: Path) -> None:
    repo = project(tmp_path, scripted_cartridge())
    exe = Path(sys.executable).parent / "phasegate"
    # argv bytes that are not UTF-8 (Python holds them as lone surrogates)
    raw = subprocess.run(
        [exe.as_posix().encode(), b"run", b"--repo", str(repo).encode(), b"bad \x9b31m"],
        capture_output=True,
        text=True,
    )
    assert raw.returncode == 2 and "argument 4 is not UTF-8 text" in raw.stderr, raw.stderr
    ticket = tmp_path / "ticket.md"
    ticket.write_bytes(b"bad \x9b ticket\n")
    proc = phasegate_cli("run", "--repo", str(repo), "--ticket", str(ticket))
    assert proc.returncode == 2 and f"{ticket}: not UTF-8 text (byte 4)" in proc.stderr
    assert "Traceback" not in raw.stderr + proc.stderr
    status = phasegate_cli("status", "--repo", str(repo), "--json")
    assert json.loads(status.stdout) == []  # nothing was filed


def test_a_ticket_over_a_megabyte_is_exit_2_without_reading_it_whole(tmp_path: Path) -> None:
    # Second fresh-user trial: `--ticket /dev/zero` grew to 18 GB; 50 MB was stored whole.
    repo = project(tmp_path, scripted_cartridge())
    big = tmp_path / "big.md"
    big.write_text("word " * 240_000)  # 1.2 MB
    for source in ("/dev/zero", str(big)):
        proc = phasegate_cli("run", "--repo", str(repo), "--ticket", source, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "the ticket is over 1000000 bytes" in flat(proc.stderr)
    assert json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout) == []
