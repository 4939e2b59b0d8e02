"""Runners and answer parsing: the command runner on real processes, the scripted fake."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.command import CommandRunner
from phasegate.agents.runners.scripted import ScriptedRunner
from phasegate.agents.service import AnswerError
from phasegate.config.cartridge import RoleBinding
from phasegate.phases.deps import verdict_parser

from conftest import alive, git, make_repo, phasegate_cli


def command_runner(command: str, **binding: object) -> CommandRunner:
    return CommandRunner(RoleBinding(runner="command", command=command, **binding))


def request(
    cwd: Path,
    *,
    timeout_s: float = 10,
    read_only: bool = False,
    prompt: str = "hi",
    call_index: int = 0,
    role: str = "build",
) -> AgentRequest:
    return AgentRequest(
        workflow_id="wf",
        phase="development",
        role=role,
        session_line="main",
        prompt=prompt,
        cwd=cwd,
        timeout_s=timeout_s,
        read_only=read_only,
        call_index=call_index,
    )


def test_command_runner_gets_the_prompt_on_stdin_env_and_file(tmp_path: Path) -> None:
    script = 'cat; printf "|%s|" "$PHASEGATE_PROMPT"; printf "|"; cat "$PHASEGATE_PROMPT_FILE"'
    result = command_runner(script).run(request(tmp_path, prompt="do it"), threading.Event())
    assert result.ok and result.text == "do it|do it||do it"


def test_command_runner_runs_in_the_worktree_with_role_env(tmp_path: Path) -> None:
    result = command_runner('pwd; echo "$PHASEGATE_ROLE $PHASEGATE_READ_ONLY"').run(
        request(tmp_path, read_only=True, role="review"), threading.Event()
    )
    assert result.text.split() == [str(tmp_path), "review", "1"]


def test_command_runner_reports_a_non_zero_exit_with_stderr(tmp_path: Path) -> None:
    result = command_runner("echo boom >&2; exit 7").run(request(tmp_path), threading.Event())
    assert (result.error_kind, result.exit_code) == ("exit_code", 7)
    assert "boom" in (result.error or "")


def test_command_runner_kills_the_whole_process_group_on_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    result = command_runner(f"sleep 60 & echo $! > {pid_file}; wait").run(
        request(tmp_path, timeout_s=1), threading.Event()
    )
    assert result.error_kind == "timeout"
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not alive(child)


def test_command_runner_stops_when_cancelled(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    result = command_runner("sleep 60").run(request(tmp_path, timeout_s=30), cancel)
    assert result.error_kind == "interrupted"
    assert result.duration_s < 10


def test_scripted_runner_picks_answers_by_call_index_and_repeats_the_last(tmp_path: Path) -> None:
    runner = ScriptedRunner({"build": [{"text": "one"}, {"text": "two"}]})
    texts = [runner.run(request(tmp_path, call_index=i), threading.Event()).text for i in range(4)]
    assert texts == ["one", "two", "two", "two"]


def test_scripted_runner_writes_files_and_applies_patches(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"a.txt": "old\n"})
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-old\n+new"  # no final newline
    runner = ScriptedRunner({"build": [{"text": "ok", "files": {"d/b.txt": "B"}, "patch": patch}]})
    assert runner.run(request(repo), threading.Event()).ok
    assert (repo / "a.txt").read_text() == "new\n"
    assert (repo / "d" / "b.txt").read_text() == "B"


def test_scripted_runner_refuses_to_write_outside_its_worktree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    runner = ScriptedRunner({"build": [{"text": "x", "files": {"../escape.txt": "no"}}]})
    result = runner.run(request(repo), threading.Event())
    assert result.error_kind == "invalid_patch"
    assert not (tmp_path / "escape.txt").exists()


def test_scripted_runner_writes_nothing_for_a_read_only_role(tmp_path: Path) -> None:
    runner = ScriptedRunner({"review": [{"text": "x", "files": {"f.txt": "no"}}]})
    assert runner.run(request(tmp_path, read_only=True, role="review"), threading.Event()).ok
    assert not (tmp_path / "f.txt").exists()


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("Looks good.\nVERDICT: approve", "approve"),
        ("**Verdict:** request-changes\nfix x", "request_changes"),
        ('{"verdict": "approve", "comments": "fine"}', "approve"),
        ("verdict = REVISE", "revise"),
    ],
)
def test_verdict_parser_accepts_a_verdict_line_or_json(text: str, verdict: str) -> None:
    assert verdict_parser(("approve", "revise", "request_changes"))(text).verdict == verdict


@pytest.mark.parametrize("text", ["", "I think it is fine", "VERDICT: maybe", "{not json}"])
def test_verdict_parser_calls_anything_else_garbage(text: str) -> None:
    with pytest.raises(AnswerError):
        verdict_parser(("approve", "revise"))(text)


def test_a_read_only_role_that_writes_is_undone_and_fails(happy_repo: Path, engine_for) -> None:
    cartridge = (
        (happy_repo / "phasegate.toml")
        .read_text()
        .replace(
            '[roles.plan]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n',
            '[roles.plan]\nrunner = "command"\ncommand = "echo sneaky > planted.txt; echo plan"\n',
        )
    )
    assert "planted.txt" in cartridge
    (happy_repo / "phasegate.toml").write_text(cartridge)
    git(happy_repo, "commit", "-qam", "plan writes")
    engine, store = engine_for(happy_repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "failed"
    assert "read_only_violation" in row["error"]
    worktree = Path(row["worktree_path"])
    assert not (worktree / "planted.txt").exists()
    assert git(worktree, "status", "--porcelain") == ""
    runs = [r for r in store.agent_runs(row["id"]) if r["role"] == "plan"]
    assert [r["error_kind"] for r in runs] == ["read_only_violation"] * 3
    violations = [e["data"] for e in store.events(row["id"]) if e["type"] == "violation"]
    assert [(v["name"], v["role"], v["paths"]) for v in violations] == [
        ("read_only_violation", "plan", ["planted.txt"])
    ] * 3
    shown = phasegate_cli("show", row["id"], "--repo", str(happy_repo)).stdout
    assert "violations (3)" in shown and "read_only_violation · plan" in shown


def test_an_agent_sees_only_the_environment_its_binding_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_sentinel_never_passed")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sentinel-passed-by-name")
    monkeypatch.setenv("UNRELATED", "x")
    runner = command_runner("env", pass_env=["OPENAI_API_KEY"], env={"MODE": "ci"})
    seen = dict(
        line.split("=", 1)
        for line in runner.run(request(tmp_path), threading.Event()).text.splitlines()
        if "=" in line
    )
    assert "GITHUB_TOKEN" not in seen and "UNRELATED" not in seen
    assert seen["OPENAI_API_KEY"] == "sk-sentinel-passed-by-name"
    assert seen["MODE"] == "ci" and "PATH" in seen


def test_a_loose_multi_file_patch_applies_as_meant(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"a.txt": "old\n", "b.txt": "b\n"})
    patch = (
        "--- a.txt\n+++ a.txt\n@@ -1 +1 @@\n-old\n+new\n"  # no a/ b/ prefixes
        "diff --git a/c.txt b/c.txt\n"  # a new file without its mode line
        "--- /dev/null\n+++ b/c.txt\n@@ -0,0 +1 @@\n+c\n"
        "--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-b\n+B"  # no diff line, no final newline
    )
    runner = ScriptedRunner({"build": [{"text": "ok", "patch": patch}]})
    assert runner.run(request(repo), threading.Event()).ok
    assert [(repo / n).read_text() for n in ("a.txt", "b.txt", "c.txt")] == ["new\n", "B\n", "c\n"]
    assert not (repo / "dev").exists()
