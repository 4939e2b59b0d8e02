"""Ctrl-C, SIGTERM and a closed terminal (SIGHUP) leave the workflow resumable, with nothing
half-committed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import alive, git, make_repo, phasegate_cli, scripted_cartridge

SLOW_BUILD = """import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text(str(__import__("os").getpid()))
time.sleep(60)
"""


def _run_with_a_slow_build(tmp_path: Path) -> tuple[Path, Path, subprocess.Popen[str]]:
    """``phasegate run`` on a repository whose build agent writes its pid to the
    marker and sleeps; returned once the agent runs."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    marker = tmp_path / "build.pid"
    agent = tmp_path / "slow_build.py"
    agent.write_text(SLOW_BUILD)
    (repo / "answers.toml").write_text(
        '[[plan]]\ntext = "plan"\n[[plan_review]]\ntext = "VERDICT: approve"\n'
        '[[build]]\ntext = "built"\n[build.files]\n"f.txt" = "f\\n"\n'
        '[[review]]\ntext = "VERDICT: approve"\n[[verification]]\ntext = "VERDICT: confirmed"\n'
    )
    slow = f'runner = "command"\ncommand = "{sys.executable} {agent} {marker}"\ntimeout = 120\n'
    (repo / "phasegate.toml").write_text(scripted_cartridge(role_overrides={"build": slow}))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")

    exe = Path(sys.executable).parent / "phasegate"
    proc = subprocess.Popen(
        [str(exe), "run", "--repo", str(repo), "--json", "the ticket"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline, "the build agent never started"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return repo, marker, proc


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stops_the_agent_and_resume_finishes(tmp_path: Path, sig: signal.Signals) -> None:
    repo, marker, proc = _run_with_a_slow_build(tmp_path)
    agent_pid = int(marker.read_text())
    held = phasegate_cli("status", "--repo", str(repo))
    assert "not being advanced" not in held.stdout, held.stdout  # the run holds it
    started = time.monotonic()
    proc.send_signal(sig)
    out, errors = proc.communicate(timeout=30)
    assert proc.returncode == 130, errors
    assert time.monotonic() - started < 15
    summary = json.loads(out)
    assert (summary["current_phase"], summary["status"]) == ("development", "developing")
    # the notice names what continues it: a second Ctrl-C would quit before the summary
    stopping = " ".join(errors.split())
    assert f"`phasegate resume {summary['id']} --repo {repo.resolve()}` continues it" in stopping
    assert not alive(agent_pid)
    # status says nobody goes on with it, and what does
    left = " ".join(phasegate_cli("status", "--repo", str(repo)).stdout.split())
    assert f"{summary['id']} is not being advanced now (no worker holds it)" in left, left
    # named with the repository it is in: the person is elsewhere
    resume = f"`phasegate resume {summary['id']} --repo {repo.resolve()}` goes on with it"
    assert resume in left, left
    inside = " ".join(phasegate_cli("status", cwd=repo).stdout.split())
    assert f"`phasegate resume {summary['id']}` goes on with it" in inside, inside

    # resume with a build agent that answers at once
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    git(repo, "commit", "-qam", "fast build")
    done = phasegate_cli("resume", summary["id"], "--repo", str(repo), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    show = json.loads(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json").stdout)
    assert not [m for m in show["milestones"] if m["status"] == "in_progress"]
    assert git(repo, "show", "main:f.txt") == "f"
    assert "not being advanced" not in phasegate_cli("status", "--repo", str(repo)).stdout


@pytest.mark.slow
def test_a_signal_stops_a_running_check_at_once(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    marker = tmp_path / "check.pid"
    (repo / "answers.toml").write_text(
        '[[plan]]\ntext = "plan"\n[[plan_review]]\ntext = "VERDICT: approve"\n'
        '[[build]]\ntext = "built"\n[build.files]\n"f.txt" = "f\\n"\n'
        '[[review]]\ntext = "VERDICT: approve"\n[[verification]]\ntext = "VERDICT: confirmed"\n'
    )
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=[f"echo $$ > {marker}; sleep 120"])
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")

    exe = Path(sys.executable).parent / "phasegate"
    proc = subprocess.Popen(
        [str(exe), "run", "--repo", str(repo), "--json", "the ticket"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline, "the check never started"
        time.sleep(0.05)
    check_pid = int(marker.read_text())
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, errors = proc.communicate(timeout=30)
    assert proc.returncode == 130, errors
    assert time.monotonic() - started < 10  # not the check's 120 s
    assert not alive(check_pid)
    summary = json.loads(out)
    assert (summary["current_phase"], summary["status"]) == ("development", "developing")
    # the notice names what continues it: a second Ctrl-C would quit before the summary
    stopping = " ".join(errors.split())
    assert f"`phasegate resume {summary['id']} --repo {repo.resolve()}` continues it" in stopping


@pytest.mark.slow
def test_a_killed_run_holds_nothing_in_status_and_resume_takes_it_at_once(
    tmp_path: Path,
) -> None:
    repo, marker, proc = _run_with_a_slow_build(tmp_path)
    agent_pid = int(marker.read_text())
    proc.kill()  # SIGKILL: no handler runs, the lease stays written
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while alive(agent_pid):  # its supervisor stops it when phasegate dies
        assert time.monotonic() < deadline, "the build agent outlived phasegate"
        time.sleep(0.05)
    [row] = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    assert row["worker"] is None, row  # the lease's holder is gone, though unexpired
    said = " ".join(phasegate_cli("status", "--repo", str(repo)).stdout.split())
    assert f"{row['id']} is not being advanced now (no worker holds it)" in said, said
    # the dead run's unexpired lease refuses no one
    done = phasegate_cli("resume", row["id"], "--no-advance", "--repo", str(repo), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "developing"


def test_a_reader_gone_while_a_workflow_runs_stops_it_gently_and_quietly() -> None:
    from phasegate.cli import _app

    read, write = os.pipe()
    os.close(read)  # the reader went: `phasegate run ... | head` after head's exit
    stopped = threading.Event()
    out = os.fdopen(write, "w")
    console = _app.err.__class__(file=out)
    _app.reader_gone.append(stopped.set)
    try:
        console.print("a line nobody reads")
        console.print("and another")
    finally:
        _app.reader_gone.remove(stopped.set)
        out.close()  # the console pointed its descriptor at /dev/null: nothing fails
    assert stopped.is_set() and console.quiet  # no exit mid-run: the engine stops itself
