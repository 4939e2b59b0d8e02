"""One agent conformance suite: the behaviours every CLI runner shares, on the real programs.

Each test runs, for each program, its real CLI against the scripted model server
(``phasegate.testing.model_server``) in the dialect it speaks, through its
runner (``phasegate.agents.cli_runner.CliRunner``). A program's own quirks stay
in its own file (tests/test_<program>_runner.py, tests/test_real_agents.py).

The shared behaviours, and where each is proved for each program:

1. A whole workflow with every role on the program completes: the build's file
   is merged, every run is ``ok`` with a session, tokens and cost are summed
   from the scripted usage and priced by the binding, the key reaches only the
   roles that name it, read-only roles are not offered the edit tools, what the
   program printed reached the live stream as it ran (``agent_output`` rows of
   every role: ``agent_cli_kit.assert_output_streamed``), and no key is left in
   the output, the store or the program's files.
   (claude-code, codex: test_real_agents.py; gemini, opencode, qwen, copilot,
   aider, mini-swe-agent: their files' ``test_a_whole_workflow_...``.)
2. The review asks for changes once, and the second review round resumes the
   review session (``agent_cli_kit.assert_review_resumed``): in the same whole
   workflow, one run proving 1 and 2, for claude-code, gemini, opencode, qwen,
   copilot and aider (which restores the review chat). Codex's resumed thread is
   counted once in its whole workflow; mini-swe-agent has no sessions.
3. A resumed session the program no longer has is started afresh, and a
   session it has is resumed: **here**, for gemini, qwen, opencode and copilot
   (``test_a_session_the_program_no_longer_has_is_started_afresh``).
4. A read-only role's edit is refused (``permission_denied``) or undone
   (``read_only_violation``: aider, mini-swe-agent). (Their files'
   ``test_a_read_only_role...``.)
5. The error paths end with their named reason: ``model_error`` (HTTP 500),
   ``timeout`` (a hang, killed with its process group), ``max_turns``,
   ``budget``. (Their files' ``test_real_<program>_error_paths_...``.)
6. An answer without a verdict ends as ``garbage``, its usage kept, and the
   review pauses: **here**, for aider, copilot, gemini, opencode and qwen
   (``test_an_answer_without_a_verdict_ends_as_garbage_and_keeps_its_usage``;
   only the review runs the program). The retry of a garbage answer is the
   phases' own, proved in test_bad_input.py.
7. The commands the program runs do not see the model key (neither the
   binding's variable nor the names the program gives it), while the program
   sent it to the model, and no key is left in the output, the store or the
   agents' files: **here**, for codex, gemini, qwen, opencode and copilot
   (``test_the_commands_a_program_runs_do_not_see_the_model_key``; only the
   build runs the program, the other roles answer from a script).

Behaviours 1, 2, 4 and 5 are proved in the per-program files, one run each a
program: their scripts, tool names and request shapes differ per dialect, and
the whole workflow proves 1 and 2 together. Behaviours 3, 6 and 7 are proved here
once for the programs whose files each had a copy of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.config.cartridge import RoleBinding
from phasegate.testing.model_server import ScriptedModelServer, Step, ToolCall, key_sha

from agent_cli_kit import (
    BUILD,
    REVIEW,
    RetryAfterServer,
    assert_no_keys,
    make_project,
    role_toml,
    run_ticket,
)
from conftest import agent_cli, git, phasegate_cli

pytestmark = [pytest.mark.sandboxed, pytest.mark.slow]

KEY = "sk-conformance-sentinel-3c9d1a"
KEY_VAR = "SCRIPTED_MODEL_KEY"
OTHER_KEY = "sk-other-provider-key-5e7f2b"
#: What a ticket's run hands phasegate: the key the bindings name and others they do not.
TICKET_ENV = {KEY_VAR: KEY, "OPENAI_API_KEY": OTHER_KEY, "GEMINI_API_KEY": OTHER_KEY}
#: A session id no program has ever seen (a UUID: Gemini CLI and Copilot ask for one).
FORGOTTEN = "00000000-0000-4000-8000-000000000000"
#: Gemini CLI's retries off, from the workspace's settings: a failed call asks once.
GEMINI_NO_RETRIES = json.dumps({"general": {"maxAttempts": 1, "retryFetchErrors": False}})


def _openai_turns(body: dict[str, Any]) -> int:
    return len(body.get("messages", []))


def _gemini_turns(body: dict[str, Any]) -> int:
    return len(body.get("contents", []))


def _git_init(cwd: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=cwd, check=True)


def _gemini_workspace(cwd: Path) -> None:
    (cwd / ".gemini").mkdir()
    (cwd / ".gemini" / "settings.json").write_text(GEMINI_NO_RETRIES)


def _shell(name: str, field: str = "command", **more: str) -> Callable[[str], ToolCall]:
    return lambda command: ToolCall(name, {field: command, **more})


@dataclass(frozen=True)
class Program:
    """One agent CLI as the suite drives it: its runner, the CLI's name, the model
    and base URL (``{url}`` is the server's), the server's retry header (None: a
    plain server), what its checkout needs, how many turns a request sent, its
    shell tool's call, a variable its commands see (``NAME=value`` or ``NAME=``),
    the variables its key may go by, and the binding's more lines."""

    runner: str
    cli: str
    model: str
    base_url: str
    retry_header: str | None
    workspace: Callable[[Path], None]
    turns: Callable[[dict[str, Any]], int]
    shell: Callable[[str], ToolCall] = _shell("run_shell_command")
    shell_sees: str = "PATH="
    key_names: tuple[str, ...] = ()
    more: tuple[str, ...] = ()

    def binding(self, exe: str, url: str) -> RoleBinding:
        return RoleBinding(
            runner=self.runner,
            executable=exe,
            model=self.model,
            base_url=self.base_url.format(url=url),
            api_key_env=KEY_VAR,
        )

    def server(self, scripts: dict[str, list[Step]]) -> ScriptedModelServer:
        if self.retry_header is None:
            return ScriptedModelServer(scripts).start()
        return RetryAfterServer(scripts, self.retry_header).start()


_OPENCODE_SHELL = _shell("bash", description="run it")

PROGRAMS = {
    "aider": Program(
        "aider",
        "aider",
        "openai/scripted-model",
        "{url}/v1",
        None,
        lambda cwd: None,
        _openai_turns,
        key_names=("OPENAI_API_KEY",),
    ),
    "codex": Program(
        "codex",
        "codex",
        "gpt-test",
        "{url}/v1",
        None,
        _git_init,
        _openai_turns,
        shell=_shell("exec_command", "cmd"),
        key_names=("OPENAI_API_KEY",),
        more=(
            'extra_args = ["-c", "model_providers.phasegate.request_max_retries=0",'
            ' "-c", "model_providers.phasegate.stream_max_retries=0"]',
        ),
    ),
    "gemini": Program(
        "gemini",
        "gemini",
        "gemini-2.5-flash",
        "{url}",
        None,
        _gemini_workspace,
        _gemini_turns,
        shell_sees="GEMINI_CLI=1",
        key_names=("GEMINI_API_KEY",),
    ),
    "qwen": Program(
        "qwen",
        "qwen",
        "m",
        "{url}/v1",
        None,
        lambda cwd: None,
        _openai_turns,
        shell_sees="QWEN_CODE=1",
        key_names=("OPENAI_API_KEY",),
    ),
    "opencode": Program(
        "opencode",
        "opencode",
        "scripted-model",
        "{url}/v1",
        "Retry-After-Ms",
        _git_init,
        _openai_turns,
        shell=_OPENCODE_SHELL,
        shell_sees="XDG_DATA_HOME=",
    ),
    "copilot": Program(
        "copilot",
        "copilot",
        "scripted-model",
        "{url}/v1",
        "Retry-After",
        _git_init,
        _openai_turns,
        shell=_OPENCODE_SHELL,
        shell_sees="COPILOT_HOME=",
        key_names=("COPILOT_PROVIDER_API_KEY",),
    ),
}
#: The programs whose files each proved a session they no longer have starts afresh.
RESUMING = ("copilot", "gemini", "opencode", "qwen")
#: ... that each proved their commands do not see the key.
SHELLS = ("codex", "copilot", "gemini", "opencode", "qwen")
#: ... that each proved an answer without a verdict ends as garbage.
ANSWERING = ("aider", "copilot", "gemini", "opencode", "qwen")


def _cli(program: Program) -> str:
    wanted = os.environ.get(f"PHASEGATE_{program.cli.upper()}_BIN")
    if wanted and not Path(wanted).exists():
        pytest.fail(f"PHASEGATE_{program.cli.upper()}_BIN={wanted} does not exist")
    return agent_cli(program.cli)


@pytest.mark.parametrize("name", RESUMING)
def test_a_session_the_program_no_longer_has_is_started_afresh(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = PROGRAMS[name]
    exe = _cli(program)
    server = program.server({"*": [Step(text="fresh answer")]})
    try:
        monkeypatch.setenv(KEY_VAR, KEY)
        runner = make_runner(program.binding(exe, server.url), tmp_path)
        cwd = tmp_path / "worktree"
        cwd.mkdir()
        program.workspace(cwd)
        request = AgentRequest(
            workflow_id="wf",
            phase="planning",
            role="plan",
            session_line="main",
            prompt="Plan it.",
            cwd=cwd,
            timeout_s=60,
            read_only=True,
            session_id=FORGOTTEN,
            state_dir=tmp_path / "state",
        )
        fresh = runner.run(request, threading.Event())
        assert fresh.ok, fresh.error
        assert fresh.text == "fresh answer"
        assert fresh.session_id not in (None, FORGOTTEN)
        assert (fresh.input_tokens, fresh.output_tokens) == (100, 20)
        assert len(server.requests) == 1  # the failed resume asked the model nothing

        again = runner.run(replace(request, session_id=fresh.session_id), threading.Event())
        assert again.ok and again.text == "fresh answer", again.error
        assert again.session_id == fresh.session_id
        first, resumed = (r.body for r in server.played("*"))
        assert program.turns(resumed) > program.turns(first)  # the earlier turn was sent again
        # A call's settings file is the call's own, never phasegate's environment.
        assert not {"GEMINI_CLI_SYSTEM_SETTINGS_PATH", "QWEN_CODE_SYSTEM_SETTINGS_PATH"} & set(
            os.environ
        )
    finally:
        server.stop()


@pytest.mark.parametrize("name", SHELLS)
def test_the_commands_a_program_runs_do_not_see_the_model_key(tmp_path: Path, name: str) -> None:
    program = PROGRAMS[name]
    exe = _cli(program)
    dump = program.shell("env > shell-env.txt; printf 'the feature\\n' > feature.txt")
    server = program.server({BUILD: [Step(tools=(dump,)), Step(text="done")]})
    try:
        # Only the build runs the program: the other roles answer from answers.toml.
        repo = make_project(tmp_path, {"build": _bound(program, exe, server.url)})
        proc = run_ticket(repo, TICKET_ENV, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        seen = git(repo, "show", "main:shell-env.txt")
        assert "PATH=" in seen and program.shell_sees in seen
        for hidden in (KEY, OTHER_KEY, KEY_VAR, *program.key_names):
            assert hidden not in seen, hidden
        # while the program itself held the key for the model
        assert {r.key_sha for r in server.played(BUILD)} == {key_sha(KEY)}
        assert_no_keys(
            repo, (KEY, OTHER_KEY), proc.stdout, proc.stderr, dirs=[repo / ".phasegate" / "agents"]
        )
    finally:
        server.stop()


def _bound(program: Program, exe: str, url: str) -> str:
    return role_toml(
        program.runner,
        exe,
        model=program.model,
        base_url=program.base_url.format(url=url),
        timeout=90,
        key_env=KEY_VAR,
        more=program.more,
    )


@pytest.mark.parametrize("name", ANSWERING)
def test_an_answer_without_a_verdict_ends_as_garbage_and_keeps_its_usage(
    tmp_path: Path, name: str
) -> None:
    program = PROGRAMS[name]
    exe = _cli(program)
    server = program.server({REVIEW: [Step(text="I have no opinion on this.")]})
    try:
        # Only the review runs the program: the other roles answer from answers.toml.
        repo = make_project(
            tmp_path,
            {"review": _bound(program, exe, server.url)},
            extra="[limits]\nagent_retries = 0\n",
        )
        proc = run_ticket(repo, TICKET_ENV, timeout=300)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        summary = json.loads(proc.stdout)
        # A review with no verdict it could read pauses, as verification does.
        assert (summary["current_phase"], summary["status"]) == ("pr_review", "paused"), summary
        assert "limits.max_review_parse_failures" in summary["error"]
        shown = phasegate_cli("show", summary["id"], "--repo", str(repo), "--json")
        runs = json.loads(shown.stdout)["agent_runs"]
        reviews = [r for r in runs if r["role"] == "review"]
        assert [(r["outcome"], r["error_kind"]) for r in reviews] == [("garbage", "garbage")]
        assert reviews[0]["input_tokens"] == 100  # the garbage call's usage is kept
        assert_no_keys(repo, (KEY, OTHER_KEY), proc.stdout, proc.stderr)
    finally:
        server.stop()
