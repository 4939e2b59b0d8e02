"""The qwen runner: whole workflows with the real Qwen Code CLI, its model scripted.

The CLI is the npm package .ci/run installs (``@qwen-code/qwen-code``, pinned);
``PHASEGATE_QWEN_BIN`` points the tests at another copy. It talks OpenAI chat
completions, streaming, to ``ScriptedModelServer`` on 127.0.0.1 (the server
reads the working directory from the context Qwen Code sends first); its tools
are ``write_file`` (``file_path``, ``content``), ``edit``, ``read_file``
(``file_path``), ``run_shell_command`` (``command``)... Qwen Code tries a 5xx
answer 7 times with backoff (about 85 s; no setting changes it), so the model
error here is a 400, which it does not retry. The first tests need no CLI:
they pin how the runner reads its stream and configures it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.agents.process import ProcessOutcome
from phasegate.agents.runners.qwen import QwenRunner, parse_qwen_stream
from phasegate.config.cartridge import RoleBinding
from phasegate.proc.sandbox import agent_confinement, bwrap_works
from phasegate.testing.model_server import Step, ToolCall, _cwd, key_sha

from agent_cli_kit import (
    BUILD,
    IN_USD,
    OUT_USD,
    PLAN,
    PLAN_REVIEW,
    REVIEW,
    ROUND_1,
    ROUND_2,
    STEP_COST,
    VERIFY,
    assert_killed_at_timeout,
    assert_no_keys,
    assert_output_streamed,
    assert_review_resumed,
    make_project,
    processes_under,
    role_scripts,
    role_toml,
    run_ticket,
    show,
    two_review_rounds,
)
from conftest import HAPPY_ANSWERS, agent_cli, git, make_repo, phasegate_cli

pytestmark = pytest.mark.sandboxed
slow = pytest.mark.slow

SENTINEL = "sk-sentinel-4f1e9c2b7a3d5e6f"
OTHER_KEY = "sk-other-provider-key-77aa55"
VERIFIER_KEY = "dummy-verifier-key-0000"
KEY_VAR = "SCRIPTED_QWEN_KEY"

#: What a ticket's run hands phasegate: the key the bindings name and another one they do not.
TICKET_ENV = {KEY_VAR: SENTINEL, "OPENAI_API_KEY": OTHER_KEY}
KEYS = (SENTINEL, OTHER_KEY)


EDIT_TOOLS = {"write_file", "edit", "run_shell_command"}


def write(path: str, content: str) -> ToolCall:
    return ToolCall("write_file", {"file_path": "{cwd}/" + path, "content": content})


def qwen_scripts(build: Sequence[Step] | None = None) -> dict[str, list[Step]]:
    return role_scripts(
        build
        or [
            Step(text="Writing it.", tools=(write("feature.txt", "the feature\n"),)),
            Step(text="Created feature.txt."),
        ],
        [
            Step(tools=(ToolCall("read_file", {"file_path": "{cwd}/feature.txt"}),)),
            Step(text="feature.txt holds the feature.\nVERDICT: confirmed"),
        ],
    )


def qwen_role(exe: str, url: str, *, key: bool = True, extra: str = "") -> str:
    return role_toml(
        "qwen",
        exe,
        model="qwen3-coder-plus",
        base_url=url + "/v1",
        timeout=90,
        key_env=KEY_VAR if key else None,
        env=None if key else {"OPENAI_API_KEY": VERIFIER_KEY},
        extra=extra,
    )


ROLES = ("plan", "plan_review", "build", "review", "verification")
#: The answers of the roles a test leaves scripted (make_project binds them to it).
SCRIPTED = {"answers.toml": HAPPY_ANSWERS}


@pytest.fixture
def qwen() -> str:
    wanted = os.environ.get("PHASEGATE_QWEN_BIN")
    if wanted and not Path(wanted).exists():
        pytest.fail(f"PHASEGATE_QWEN_BIN={wanted} does not exist (bash .ci/run installs it)")
    return agent_cli("qwen")


# -- how the runner reads Qwen Code (no CLI needed) ----------------------------------


def _stream(*events: dict[str, Any]) -> str:
    return "\n".join(json.dumps(e) for e in events) + "\n"


INIT = {"type": "system", "subtype": "init", "session_id": "s-1", "model": "m"}


def _assistant(*blocks: dict[str, Any], usage: dict[str, int] | None = None, parent=None):
    message = {"role": "assistant", "content": list(blocks), "usage": usage or {}}
    return {
        "type": "assistant",
        "session_id": "s-1",
        "parent_tool_use_id": parent,
        "message": message,
    }


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tool(tool_id: str, tool: str, **given: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": tool, "input": given}


def _tool_result(tool_id: str, content: str, *, error: bool = False) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": tool_id, "is_error": error, "content": content}
    return {"type": "user", "session_id": "s-1", "message": {"role": "user", "content": [block]}}


def _result(**fields: Any) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "session_id": "s-1",
        **fields,
    }


def _outcome(stdout: str, returncode: int = 0, stderr: str = "") -> ProcessOutcome:
    return ProcessOutcome(stdout, stderr, returncode, 1.0)


def _runner(**fields: Any) -> QwenRunner:
    values = {"input_usd_per_mtok": IN_USD, "output_usd_per_mtok": OUT_USD, **fields}
    return QwenRunner(RoleBinding(runner="qwen", model="m", **values))


def _real_runner(qwen: str, url: str) -> QwenRunner:
    """The runner of the real CLI at ``qwen`` against the scripted server at ``url``,
    its key the binding's own (a test's environment does not change)."""
    binding = RoleBinding(
        runner="qwen",
        executable=qwen,
        model="m",
        base_url=url + "/v1",
        env={"OPENAI_API_KEY": SENTINEL},
    )
    return QwenRunner(binding)


def _request(tmp_path: Path, **fields: Any) -> AgentRequest:
    values: dict[str, Any] = {
        "workflow_id": "wf",
        "phase": "development",
        "role": "build",
        "session_line": "main",
        "prompt": f"{BUILD}: do it",
        "cwd": tmp_path,
        "timeout_s": 60.0,
        "read_only": False,
        "state_dir": tmp_path / "state",
        **fields,
    }
    return AgentRequest(**values)


def test_tokens_are_this_process_s_responses_not_the_resumed_session_s_total(
    tmp_path: Path,
) -> None:
    stdout = _stream(
        INIT,
        _assistant(_text("Looking."), usage={"input_tokens": 0, "output_tokens": 0}),
        _assistant(
            _tool("t1", "read_file", file_path="/w/x"),
            usage={"input_tokens": 200, "output_tokens": 40, "total_tokens": 240},
        ),
        _tool_result("t1", "x"),
        # a sub-agent's response is spent too, its text is not the answer
        _assistant(_text("sub says"), usage={"input_tokens": 50, "output_tokens": 5}, parent="a"),
        # 30 thinking tokens: in the total, not in output_tokens
        _assistant(
            _text("Done "),
            _text("reading."),
            usage={"input_tokens": 300, "output_tokens": 10, "total_tokens": 340},
        ),
        # the whole session's usage, the earlier rounds' with it
        _result(result="Done reading.", usage={"input_tokens": 9000, "output_tokens": 900}),
    )
    summary = parse_qwen_stream(stdout)
    assert (summary.session_id, summary.text) == ("s-1", "Done reading.")
    result = _runner().result(_outcome(stdout), _request(tmp_path))
    assert result.ok and (result.input_tokens, result.output_tokens) == (550, 85)
    assert result.cost_usd == pytest.approx((550 * IN_USD + 85 * OUT_USD) / 1e6)


DENIED = 'Qwen Code requires permission to use "write_file", but that permission was declined.'


@pytest.mark.parametrize(
    ("events", "code", "kind"),
    [
        (
            [_result(subtype="error_during_execution", is_error=True, error={"message": "[API"})],
            1,
            "model_error",
        ),
        ([_assistant(_tool("r", "read_file"))], 53, "max_turns"),
        (
            [
                _assistant(_tool("w", "write_file")),
                _tool_result("w", DENIED, error=True),
                _result(result="ok", permission_denials=[{"tool_name": "write_file"}]),
            ],
            0,
            "permission_denied",
        ),
        (
            [
                _assistant(_tool("c", "tool_call", name="edit", arguments={})),
                _tool_result("c", '[tool_call bridge refused] Deferred tool "edit"', error=True),
                _result(result="ok"),
            ],
            0,
            "permission_denied",
        ),
        ([], 1, "exit_code"),
        ([], 0, "model_error"),
    ],
)
def test_how_a_run_ended_names_its_error_kind(
    tmp_path: Path, events: list[dict[str, Any]], code: int, kind: str
) -> None:
    result = _runner().result(_outcome(_stream(INIT, *events), code), _request(tmp_path))
    assert result.error_kind == kind, result.error
    if kind == "permission_denied":
        assert "write_file" in result.error or "edit" in result.error


def test_the_binding_takes_only_the_keys_qwen_reads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed_tools"):
        RoleBinding(runner="qwen", model="m", allowed_tools=["read_file"])
    with pytest.raises(ValueError, match="needs a `model`"):
        RoleBinding(runner="qwen")
    runner = make_runner(RoleBinding(runner="qwen", model="m", max_turns=3), tmp_path)
    assert isinstance(runner, QwenRunner)
    read_only = runner.argv(_request(tmp_path, read_only=True, session_id="s-1"))
    assert read_only[1:5] == ["--output-format", "stream-json", "--approval-mode", "default"]
    assert read_only[-4:] == ["--model", "m", "--resume", "s-1"] and "-p" not in read_only
    build = runner.argv(_request(tmp_path))
    assert build[build.index("--approval-mode") + 1] == "yolo" and "--resume" not in build
    settings = runner.settings(_request(tmp_path, read_only=True))
    assert settings["model"] == {"maxSessionTurns": 3}
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert settings["security"] == {"folderTrust": {"enabled": True}}
    assert runner.settings(_request(tmp_path))["security"] == {"folderTrust": {"enabled": False}}


def test_the_key_is_in_the_call_s_system_settings_not_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VAR, SENTINEL)
    monkeypatch.setenv("OPENAI_API_KEY", OTHER_KEY)  # phasegate's, named by no binding
    runner = _runner(api_key_env=KEY_VAR, base_url="http://127.0.0.1:9/v1")
    request = _request(tmp_path)
    request.state_dir.mkdir()
    with runner.call_env(request, {"HOME": "/h"}) as env:
        assert SENTINEL not in env.values() and OTHER_KEY not in env.values()
        assert KEY_VAR not in env and "OPENAI_API_KEY" not in env
        assert env["HOME"] == "/h" and env["QWEN_CODE_NO_RELAUNCH"] == "true"
        path = Path(env["QWEN_CODE_SYSTEM_SETTINGS_PATH"])
        assert path.stat().st_mode & 0o077 == 0
        assert json.loads(path.read_text()) == {
            "security": {
                "auth": {
                    "selectedType": "openai",
                    "apiKey": SENTINEL,
                    "baseUrl": "http://127.0.0.1:9/v1",
                }
            },
            "model": {"baseUrl": "http://127.0.0.1:9/v1"},
        }
    assert not path.exists() and list(request.state_dir.iterdir()) == []
    # a key the binding's env sets as OPENAI_API_KEY goes the same way
    runner = QwenRunner(RoleBinding(runner="qwen", model="m", env={"OPENAI_API_KEY": "v-key"}))
    with runner.call_env(request, {}) as env:
        assert "OPENAI_API_KEY" not in env
        said = json.loads(Path(env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_text())
        assert said["security"]["auth"]["apiKey"] == "v-key"


def test_the_scripted_server_finds_qwen_code_s_working_directory() -> None:
    context = "<system-reminder>\nMy operating system is: linux\n"
    context += "I'm currently working in the directory: /w/t\nHere is the folder structure"
    body = {
        "messages": [
            {"role": "system", "content": "You are Qwen Code"},
            {"role": "user", "content": [{"type": "text", "text": context}]},
        ]
    }
    assert _cwd(body) == "/w/t"
    assert _cwd({"system": "Primary working directory: /c/d\n"}) == "/c/d"


# -- whole workflows with the real CLI -------------------------------------------------


def _offered(record) -> set[str]:
    return {t["function"]["name"] for t in record.body.get("tools", [])}


@slow
def test_a_whole_workflow_with_every_role_on_the_real_qwen_cli_resuming_the_review_session(
    tmp_path: Path, qwen: str, server_factory
) -> None:
    server = server_factory({**two_review_rounds(), **qwen_scripts()})
    roles = {role: qwen_role(qwen, server.url) for role in ROLES if role != "verification"}
    roles["verification"] = qwen_role(qwen, server.url, key=False)
    repo = make_project(tmp_path, roles)

    proc = run_ticket(repo, TICKET_ENV, timeout=400)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["dev_round"]) == ("completed", 2), summary
    # the build's write_file wrote it; it was committed, reviewed, merged
    assert git(repo, "show", "main:feature.txt") == "the feature"

    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "qwen", "ok")
        for role in ("plan", "plan_review", "build", "review", "build", "review", "verification")
    ]
    assert all(r["session_id"] for r in runs)
    assert_review_resumed(server, runs)
    # the resumed round counts its own call, not the session's total
    reviews = [r for r in runs if r["role"] == "review"]
    assert [(r["input_tokens"], r["output_tokens"]) for r in reviews] == [(100, 20)] * 2
    # every model request reported 100 + 20 tokens, priced by the binding
    requests = [r for r in server.requests if r.script]
    assert len(requests) == len(server.requests) == 10  # no background memory call
    assert summary["tokens"] == 120 * len(requests) == detail["workflow"]["tokens"]
    assert summary["cost_usd"] == pytest.approx(len(requests) * STEP_COST, rel=1e-6)
    status = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    assert status[0]["tokens"] == summary["tokens"]
    builds = [r for r in runs if r["role"] == "build"]
    assert (builds[0]["input_tokens"], builds[0]["output_tokens"]) == (200, 40)

    # the named key reached its roles, the verifier's its own, phasegate's OPENAI_API_KEY none
    assert {r.key_sha for r in requests if r.script != VERIFY} == {key_sha(SENTINEL)}
    assert {r.key_sha for r in server.played(VERIFY)} == {key_sha(VERIFIER_KEY)}
    assert {r.body["model"] for r in requests} == {"qwen3-coder-plus"}
    # read-only roles are not even offered the edit and shell tools; the build is
    offered = {r.script: _offered(r) for r in requests}
    assert offered[BUILD] >= EDIT_TOOLS
    for role in (PLAN, PLAN_REVIEW, ROUND_1, ROUND_2, VERIFY):
        assert not offered[role] & EDIT_TOOLS, role
    # the verifier's read_file saw the merged file
    assert "the feature" in json.dumps(server.played(VERIFY)[-1].body["messages"][-1])
    state = repo / ".phasegate" / "agents"
    assert list(state.rglob("projects/*/chats/*.jsonl"))  # Qwen Code's own sessions
    assert detail["violations"] == []  # confined, it wrote nothing outside its areas
    assert_output_streamed(repo, summary["id"], roles)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, json.dumps(detail), dirs=[state])


@slow
def test_a_read_only_role_that_tries_to_edit_is_refused(
    tmp_path: Path, qwen: str, server_factory
) -> None:
    shell = ToolCall("run_shell_command", {"command": "touch stray-shell.txt"})
    scripts = {
        **qwen_scripts(),
        REVIEW: [
            Step(tools=(write("stray.txt", "x"),)),
            Step(tools=(shell,)),
            Step(text="VERDICT: approve"),
        ],
    }
    server = server_factory(scripts)
    roles = {"review": qwen_role(qwen, server.url)}
    repo = make_project(tmp_path, roles, extra="[limits]\nagent_retries = 0\n")
    proc = run_ticket(repo, TICKET_ENV, timeout=400)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("pr_review", "failed")
    reviews = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "review"]
    assert [r["error_kind"] for r in reviews] == ["permission_denied"]
    assert "write_file" in reviews[0]["error"] and "run_shell_command" in reviews[0]["error"]
    # the CLI refused the calls: the model was told, nothing was written
    told = json.dumps(server.played(REVIEW)[-1].body["messages"][-2:])
    assert "requires permission" in told
    worktrees = repo / ".phasegate" / "worktrees"
    assert not list(worktrees.rglob("stray.txt")) and not list(worktrees.rglob("stray-shell.txt"))
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


@slow
def test_a_read_only_role_does_not_read_the_checkout_s_settings(
    tmp_path: Path, qwen: str, server_factory
) -> None:
    # A .qwen/settings.json the build may have written: a turn limit of 1, and
    # the shell allowed. A reviewer ignores it (an untrusted folder); a build reads it.
    server = server_factory(
        {
            "*": [
                Step(tools=(ToolCall("run_shell_command", {"command": "touch ran.txt"}),)),
                Step(text="done"),
            ]
        }
    )
    runner = _real_runner(qwen, server.url)
    cwd = tmp_path / "wt"
    (cwd / ".qwen").mkdir(parents=True)
    (cwd / ".qwen" / "settings.json").write_text(
        json.dumps(
            {
                "model": {"maxSessionTurns": 1},
                "permissions": {"allow": ["run_shell_command"]},
                "tools": {"approvalMode": "yolo"},
            }
        )
    )
    reviewer = runner.run(
        _request(cwd, read_only=True, state_dir=tmp_path / "s1"), threading.Event()
    )
    assert reviewer.error_kind == "permission_denied", reviewer.error
    assert "run_shell_command" in reviewer.error and not (cwd / "ran.txt").exists()
    build = runner.run(_request(cwd, state_dir=tmp_path / "s2"), threading.Event())
    assert build.error_kind == "max_turns", build.error
    assert (cwd / "ran.txt").exists()  # yolo ran it, then the checkout's limit stopped it


ERRORS = {
    # name: (build steps, binding extra, error kind, a phrase of the error, status, runs)
    "model_http_400": ([Step(status=400)], "", "model_error", "400", "failed", 2),
    # one answered call, then a model that never answers: killed, its spend kept
    "hang": (
        [Step(tools=(write("x.txt", "x"),)), Step(hang=True)],
        # its start and first turn fit on a loaded two-core machine (opencode's 20 s did not)
        "timeout = 40\n",
        "timeout",
        "within 40s",
        "failed",
        1,  # not retried: the wait is the test's cost, and the retry is the phases' own
    ),
    "max_turns": (
        [Step(tools=(write("x.txt", "x"),)), Step(text="done")],
        "max_turns = 1\n",
        "max_turns",
        "turn limit",
        "failed",
        2,
    ),
    # priced usage spends the role's cap in one call; the retry is refused before it runs
    "budget": (
        [Step(text="no change yet", input_tokens=400_000, output_tokens=10_000)],
        "budget_usd = 0.25\n",
        "budget",
        "",
        "paused",
        1,
    ),
}


@slow
@pytest.mark.parametrize("case", sorted(ERRORS))
def test_real_qwen_error_paths_end_with_their_named_reason(
    tmp_path: Path, qwen: str, server_factory, case: str
) -> None:
    steps, extra, kind, phrase, status, runs = ERRORS[case]
    server = server_factory({**qwen_scripts(), BUILD: steps})
    # only the build runs qwen; the other roles answer from a script
    roles = {"build": qwen_role(qwen, server.url, extra=extra)}
    limits = f"[limits]\nagent_retries = {0 if case == 'hang' else 1}\nmax_dev_retries = 1\n"
    repo = make_project(tmp_path, roles, extra=limits, files=SCRIPTED)

    proc = run_ticket(repo, TICKET_ENV, timeout=300)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", status), summary
    assert kind in summary["error"]
    builds = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    if case == "budget":
        assert len(builds) == runs
        assert builds[0]["cost_usd"] == pytest.approx(400_000 * 1.25e-6 + 10_000 * 1e-5)
    else:
        assert [r["error_kind"] for r in builds] == [kind] * runs
        assert all(phrase in r["error"] for r in builds), builds
    if case == "model_http_400":
        assert len(server.played(BUILD)) == runs  # a 400 is not retried
    if case == "max_turns":
        assert all(r["input_tokens"] == 100 for r in builds)  # its one answered call
    if case == "hang":
        assert len(server.played(BUILD)) == 2 * runs  # it reached the model each time
        assert all((r["input_tokens"], r["output_tokens"]) == (100, 20) for r in builds)
        assert_killed_at_timeout(builds, extra)
        assert processes_under(repo) == []  # the CLI and whatever it started were killed
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


@slow
def test_under_bubblewrap_a_write_outside_the_checkout_is_refused_and_recorded(
    tmp_path: Path, qwen: str, server_factory
) -> None:
    why = bwrap_works()
    if why is not None:
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n"})
    state = repo / ".phasegate" / "agents" / "wf"
    state.mkdir(parents=True)
    escape = ToolCall(
        "run_shell_command", {"command": "echo out > ../escape.txt; echo in > in.txt"}
    )
    server = server_factory({BUILD: [Step(tools=(escape,)), Step(text="done")]})
    runner = _real_runner(qwen, server.url)
    confinement = agent_confinement("bwrap", network=True, cwd=repo, state_dir=state, repo=repo)
    result = runner.run(_request(repo, state_dir=state, confinement=confinement), threading.Event())
    assert result.ok, result.error
    assert (repo / "in.txt").read_text() == "in\n" and not (tmp_path / "escape.txt").exists()
    assert [v.name for v in result.violations] == ["sandbox_denied"], result.violations
