"""A check command the OS cannot start: doctor names its key and why, and a run
pauses with one line, never a traceback on every resume. A check whose program is
not on the checks' PATH, or whose ``python -m MODULE`` lacks the module, is named by
doctor too: every build would fail on it.

Linux refuses an exec whose one argument is over 128 KiB (E2BIG); a check is one
argument of ``sh -c``, so a 3 MB check string can never start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from phasegate.git.check_probe import program_problem
from phasegate.git.checks import MAX_ARG_BYTES, CheckUnstartable, command_problem, run_checks
from phasegate.tools.doctor import diagnose

from agent_cli_kit import show
from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge

HUGE = "echo " + "x" * 3_000_000  # 3 MB: far over what one exec argument may be


def project(tmp_path: Path, checks: list[str]) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    cartridge = scripted_cartridge(checks=["true"]).replace(
        'checks = ["true"]', f"checks = {json.dumps(checks)}"
    )
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def test_the_limits_are_judged_before_anything_starts(tmp_path: Path) -> None:
    assert command_problem("true") is None
    assert command_problem("echo " + "x" * (MAX_ARG_BYTES // 2)) is None
    too_long = command_problem(HUGE)
    assert too_long is not None and "3,000,005 bytes" in too_long and "E2BIG" in too_long
    assert "NUL" in (command_problem("echo a\0b") or "")
    # The environment counts with the command: ARG_MAX is for both together.
    crowded = {f"V{i}": "y" * 100_000 for i in range(40)}
    assert "environment" in (command_problem("true", crowded) or "")
    # At run time: the key and why, never the 3 MB command itself.
    try:
        run_checks(["true", HUGE], tmp_path, 10)
    except CheckUnstartable as exc:
        message = str(exc)
    else:
        raise AssertionError("a 3 MB check started")
    assert message.startswith("landing_areas.checks[1] cannot start: it is 3,000,005 bytes")
    assert len(message) < 400


def test_doctor_names_the_check_that_cannot_start(tmp_path: Path) -> None:
    repo = project(tmp_path, ["true", HUGE, "echo a\0b"])
    found = diagnose(repo, offline=True)
    assert not found.ok
    problems = [m for m in found.missing if m.startswith("landing_areas.checks[")]
    assert [p.split(" cannot start: ")[0] for p in problems] == [
        "landing_areas.checks[1]",
        "landing_areas.checks[2]",
    ]
    assert "3,000,005 bytes" in problems[0] and "put the command in a script" in problems[0]
    assert "NUL" in problems[1]
    proc = phasegate_cli("doctor", "--repo", str(repo), "--offline", "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["missing"] == found.missing


def test_doctor_names_a_check_whose_program_or_module_is_missing(tmp_path: Path) -> None:
    checks = [
        "python3 -m json.tool --help",  # there: not named
        "no-such-program-of-phasegate --version",
        "CI=1 python3 -m no_such_module_of_phasegate -q",
        # The shell's to read, whatever they hold: left to the run.
        "test -f README.md && no-such-program-of-phasegate",
        "if true; then no-such-program-of-phasegate; fi",
        "python3 -m no_such_module_of_phasegate; true",
        "python3 -m no_such_module_of_phasegate>out.txt",
        "no-such-program-of-phasegate || true",
        "python3 -m $MODULE",
        "python3 -m -q",
    ]
    found = diagnose(project(tmp_path, checks), offline=True)
    assert not found.ok
    problems = [m for m in found.missing if m.startswith("landing_areas.checks[")]
    assert [p.split(" cannot run: ")[0] for p in problems] == [
        "landing_areas.checks[1]",
        "landing_areas.checks[2]",
    ], problems
    assert "`no-such-program-of-phasegate` is not on the PATH the checks get" in problems[0]
    assert "which has no module 'no_such_module_of_phasegate': install" in problems[1]


def test_a_python_m_check_sees_the_commands_own_assignments(tmp_path: Path) -> None:
    src = tmp_path / "src" / "myapp"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    env = {"PATH": os.environ["PATH"]}
    assert program_problem("PYTHONPATH=src python3 -m myapp", env, tmp_path) is None
    assert "has no module 'myapp'" in (program_problem("python3 -m myapp", env, tmp_path) or "")


def test_a_run_pauses_at_its_first_check_that_could_never_pass(tmp_path: Path) -> None:
    repo = project(tmp_path, ["true", "no-such-program-of-phasegate -q"])
    proc = phasegate_cli("run", "--repo", str(repo), "Add the feature", "--json")
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", "paused")
    assert summary["error"].startswith(
        "development: landing_areas.checks[1] cannot run: `no-such-program-of-phasegate` is "
        "not on the PATH the checks get"
    ), summary["error"]
    builds = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    assert len(builds) == 1  # one build, not every attempt's


def test_a_run_pauses_with_one_line_and_every_resume_says_the_same(tmp_path: Path) -> None:
    repo = project(tmp_path, ["true", HUGE])
    proc = phasegate_cli("run", "--repo", str(repo), "Add the feature", "--json")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "x" * 1000 not in proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", "paused")
    shown = phasegate_cli("show", summary["id"], "--repo", str(repo), "--json")
    reason = json.loads(shown.stdout)["workflow"]["error"]
    assert reason.startswith("development: landing_areas.checks[1] cannot start: it is 3,000,005")
    assert "\n" not in reason and len(reason) < 400
    for _ in range(2):
        again = phasegate_cli("resume", summary["id"], "--repo", str(repo), "--json")
        assert again.returncode == 1
        assert "Traceback" not in again.stderr and "x" * 1000 not in again.stderr
        assert json.loads(again.stdout)["status"] == "paused"
    # Fixed in the cartridge, the resume goes on.
    cartridge = (repo / "phasegate.toml").read_text().replace(json.dumps(HUGE), '"true"')
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "commit", "-q", "-am", "a check that starts")
    fixed = phasegate_cli("resume", summary["id"], "--repo", str(repo), "--json")
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["status"] == "completed"
