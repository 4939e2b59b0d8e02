"""The mini-swe-agent runner: whole workflows with the real ``mini`` CLI, its model scripted.

The CLI is the PyPI package .ci/run installs in .ci/mswe; it talks OpenAI chat
completions (through litellm) to ``ScriptedModelServer`` on 127.0.0.1. Its
only tool is ``bash``: a scripted turn is reasoning text with a ``bash`` tool
call, and the last turn of a call runs ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
with the answer as its text. The first tests need no CLI: they pin how the
runner configures mini and reads its trajectory.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.agents.process import ProcessOutcome
from phasegate.agents.runners.mini_swe_agent import MiniSweAgentRunner, parse_trajectory
from phasegate.config.cartridge import RoleBinding
from phasegate.testing.model_server import Step, ToolCall, key_sha

from agent_cli_kit import (
    BUILD,
    IN_USD,
    OUT_USD,
    REVIEW,
    STEP_COST,
    VERIFY,
    assert_killed_at_timeout,
    assert_no_keys,
    assert_output_streamed,
    make_project,
    role_scripts,
    role_toml,
    run_ticket,
    show,
)
from conftest import agent_cli, git, phasegate_cli

slow = pytest.mark.slow

pytestmark = pytest.mark.sandboxed

SENTINEL = "sk-sentinel-4f1e9c2b7a3d5e6f"
OTHER_KEY = "sk-other-provider-key-77aa55"
VERIFIER_KEY = "dummy-verifier-key-0000"
KEY_VAR = "SCRIPTED_MODEL_KEY"

#: What a ticket's run hands phasegate: the key the bindings name and another one they do not.
TICKET_ENV = {KEY_VAR: SENTINEL, "OPENAI_API_KEY": OTHER_KEY}
KEYS = (SENTINEL, OTHER_KEY)


def bash(command: str) -> ToolCall:
    return ToolCall("bash", {"command": command})


def answer(text: str, **usage: int) -> Step:
    """The last turn of a call: the answer as text, and the submit command."""
    return Step(text=text, tools=(bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),), **usage)


def mini_scripts(build: Sequence[Step] | None = None) -> dict[str, list[Step]]:
    return role_scripts(
        build
        or [
            Step(text="Writing it.", tools=(bash("printf 'the feature\\n' > feature.txt"),)),
            answer("Created feature.txt."),
        ],
        [
            Step(text="Reading it.", tools=(bash("cat feature.txt"),)),
            answer("feature.txt holds the feature.\nVERDICT: confirmed"),
        ],
        say=answer,
    )


def mini_role(exe: str, url: str, *, key: bool = True, extra: str = "") -> str:
    """A role bound to the real mini. Retries off, so an error path takes one request a try."""
    env = {"MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"}
    if not key:
        env["OPENAI_API_KEY"] = VERIFIER_KEY
    return role_toml(
        "mini-swe-agent",
        exe,
        model="openai/scripted-model",
        base_url=url + "/v1",
        timeout=60,
        key_env=KEY_VAR if key else None,
        env=env,
        more=['extra_args = ["-c", "model.model_kwargs.max_retries=0"]'],
        extra=extra,
    )


@pytest.fixture
def mini() -> str:
    return agent_cli("mini")


# -- how the runner configures mini and reads it (no CLI needed) ---------------------


def _binding(**fields: Any) -> RoleBinding:
    return RoleBinding(runner="mini-swe-agent", model="openai/scripted-model", **fields)


PROMPT = "Implement the plan below: {{ not a template }} ünï 😀 \x85\x9f\u2028 end"


def _request(tmp_path: Path, **fields: Any) -> AgentRequest:
    values: dict[str, Any] = {
        "workflow_id": "wf",
        "phase": "development",
        "role": "build",
        "session_line": "main",
        "prompt": PROMPT,
        "cwd": tmp_path,
        "timeout_s": 60.0,
        "read_only": False,
        "state_dir": tmp_path / "state",
        **fields,
    }
    return AgentRequest(**values)


def test_the_binding_needs_a_model_and_takes_only_the_keys_mini_reads() -> None:
    with pytest.raises(ValueError, match="needs a `model`"):
        RoleBinding(runner="mini-swe-agent")
    with pytest.raises(ValueError, match="`allowed_tools` is not used"):
        _binding(allowed_tools=["Read"])
    runner = make_runner(_binding(max_turns=3, budget_usd=1.0), Path("."))
    assert isinstance(runner, MiniSweAgentRunner) and runner.name == "mini-swe-agent"


def test_the_config_carries_task_limits_and_prices_and_never_the_key(tmp_path: Path) -> None:
    runner = MiniSweAgentRunner(
        _binding(
            base_url="http://127.0.0.1:9/v1",
            api_key_env=KEY_VAR,
            max_turns=7,
            input_usd_per_mtok=IN_USD,
            output_usd_per_mtok=OUT_USD,
            env={"MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"},
        )
    )
    request = _request(tmp_path, budget_usd=0.25)
    home = tmp_path / "home"
    home.mkdir()
    config = runner.config(request, runner._write_registry(home))
    assert config["run"]["task"] == request.prompt
    assert config["agent"]["step_limit"] == 7 and config["agent"]["cost_limit"] == 0.25
    assert "read-only" not in config["agent"]["system_template"]
    assert config["model"]["model_kwargs"]["api_base"] == "http://127.0.0.1:9/v1"
    registry = json.loads(Path(config["model"]["litellm_model_registry"]).read_text())
    assert registry["openai/scripted-model"]["input_cost_per_token"] == IN_USD / 1e6
    read_only = runner.config(_request(tmp_path, read_only=True), None)
    assert "read-only" in read_only["agent"]["system_template"]
    assert read_only["agent"]["cost_limit"] == 0  # no budget: no limit, not mini's $3

    environ = {KEY_VAR: SENTINEL, "OPENAI_API_KEY": OTHER_KEY, "GITHUB_TOKEN": OTHER_KEY}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in environ.items():
            mp.setenv(name, value)
        env = runner.environment(home)
    # the named key, also under the name litellm reads for openai/...; nothing else
    assert env[KEY_VAR] == env["OPENAI_API_KEY"] == SENTINEL
    assert "GITHUB_TOKEN" not in env and env["HOME"] == str(home)
    assert env["MSWEA_CONFIGURED"] == "true" and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    argv = runner.argv(home / "c.yaml", home / "t.json")
    assert SENTINEL not in json.dumps([argv, config])


def _trajectory(status: str, *, calls: int = 1, cost: float = 0.0, **info: Any) -> dict:
    usage = {"prompt_tokens": 100, "completion_tokens": 20}
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for i in range(calls):
        messages.append(
            {"role": "assistant", "content": f"turn {i}", "extra": {"response": {"usage": usage}}}
        )
    messages.append({"role": "exit", "content": info.pop("exit_text", status), "extra": {}})
    model_stats = {"instance_cost": cost, "api_calls": calls}
    return {
        "info": {"exit_status": status, "model_stats": model_stats, **info},
        "messages": messages,
    }


@pytest.mark.parametrize(
    ("trajectory", "limits", "returncode", "kind", "text"),
    [
        (_trajectory("Submitted", calls=2), {}, 0, None, "turn 1"),
        (_trajectory("Submitted", submission="printed\n"), {}, 0, None, "printed"),
        (_trajectory("LimitsExceeded", calls=3), {"step_limit": 3}, 0, "max_turns", "turn 2"),
        (_trajectory("LimitsExceeded", cost=2.0), {"cost_limit": 1.5}, 0, "budget", "turn 0"),
        (_trajectory("RepeatedFormatError"), {}, 0, "model_error", "turn 0"),
        (
            _trajectory("InternalServerError", exit_text="litellm.InternalServerError: 500"),
            {},
            1,
            "model_error",
            "turn 0",
        ),
        (_trajectory("ValueError", exit_text="bad config"), {}, 1, "exit_code", "turn 0"),
        (None, {}, 2, "exit_code", ""),
    ],
)
def test_the_trajectory_decides_the_answer_usage_and_error_kind(
    trajectory: dict | None, limits: dict, returncode: int, kind: str | None, text: str
) -> None:
    outcome = ProcessOutcome("", "Traceback ...", returncode, 1.5)
    result = parse_trajectory(outcome, trajectory, **limits)
    assert result.error_kind == kind, result.error
    assert result.text == text
    if trajectory is not None:
        calls = trajectory["info"]["model_stats"]["api_calls"]
        assert (result.input_tokens, result.output_tokens) == (100 * calls, 20 * calls)
        assert result.cost_usd == trajectory["info"]["model_stats"]["instance_cost"]


@slow
def test_a_prompt_unfit_for_yaml_or_argv_reaches_the_model_unchanged(
    tmp_path: Path, mini: str, server_factory
) -> None:
    server = server_factory({"Implement the plan": [answer("Nothing to do.")]})
    binding = _binding(
        executable=mini,
        base_url=server.url + "/v1",
        env={"OPENAI_API_KEY": VERIFIER_KEY, "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"},
    )
    prompt = PROMPT + " " + "x" * 200_000  # longer than one argv string may be
    result = MiniSweAgentRunner(binding).run(_request(tmp_path, prompt=prompt), threading.Event())
    assert (result.error_kind, result.text) == (None, "Nothing to do."), result.error
    assert (result.input_tokens, result.output_tokens, result.session_id) == (100, 20, None)
    task = server.requests[0].body["messages"][1]["content"]
    assert task.startswith(prompt + "\n\n## How to work here")


# -- whole workflows with the real CLI -------------------------------------------------


@slow
def test_a_whole_workflow_with_every_role_on_the_real_mini_swe_agent(
    tmp_path: Path, mini: str, server_factory
) -> None:
    server = server_factory(mini_scripts())
    roles = {role: mini_role(mini, server.url) for role in ("plan", "plan_review", "build")}
    roles["review"] = mini_role(mini, server.url)
    roles["verification"] = mini_role(mini, server.url, key=False)
    repo = make_project(tmp_path, roles)

    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed", summary
    # the build's bash command wrote the file; it was committed, reviewed, merged
    assert git(repo, "show", "main:feature.txt") == "the feature"

    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "mini-swe-agent", "ok")
        for role in ("plan", "plan_review", "build", "review", "verification")
    ]
    # every model request reported 100 + 20 tokens, priced by the binding
    requests = [r for r in server.requests if r.script]
    assert len(requests) == 7  # one turn per role, two for build and verification
    assert summary["tokens"] == 120 * len(requests) == detail["workflow"]["tokens"]
    assert summary["cost_usd"] == pytest.approx(len(requests) * STEP_COST, rel=1e-6)
    status = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    assert status[0]["tokens"] == summary["tokens"]
    assert status[0]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in runs), abs=1e-9)
    builds = [r for r in runs if r["role"] == "build"]
    assert (builds[0]["input_tokens"], builds[0]["output_tokens"]) == (200, 40)

    # the named key reached its roles (as the variable litellm reads), never the
    # verifier that does not name it; the unnamed OPENAI_API_KEY reached no one
    assert {r.key_sha for r in requests if r.script != VERIFY} == {key_sha(SENTINEL)}
    assert {r.key_sha for r in server.played(VERIFY)} == {key_sha(VERIFIER_KEY)}
    # read-only roles are told so; the verifier's bash saw the merged file
    system = {r.script: r.body["messages"][0]["content"] for r in requests}
    assert "read-only" in system[REVIEW] and "read-only" not in system[BUILD]
    assert "the feature" in json.dumps(server.played(VERIFY)[-1].body["messages"][-1])
    assert_output_streamed(repo, summary["id"], roles)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, json.dumps(detail))


ERRORS = {
    # name: (scripts, binding extra, error kind, a phrase of the error, status, build runs)
    "model_http_500": (
        {BUILD: [Step(status=500)]},
        "",
        "model_error",
        "InternalServerError",
        "failed",
        2,
    ),
    "no_tool_call": (
        {"*": [Step(text="I think it is done.")]},  # mini's format-error turns are prompts too
        "",
        "model_error",
        "without a bash tool call",
        "failed",
        2,
    ),
    "max_turns": (
        {BUILD: [Step(text="x", tools=(bash("touch x.txt"),)), answer("done")]},
        "max_turns = 1\n",
        "max_turns",
        "step limit after 1",
        "failed",
        2,
    ),
    "budget": (
        {
            BUILD: [
                Step(
                    text="expensive",
                    tools=(bash("true"),),
                    input_tokens=5_000_000,
                    output_tokens=100_000,
                )
            ]
        },
        "budget_usd = 0.5\n",
        "budget",
        "budget of $0.5000",
        "paused",
        1,
    ),
    "hang": ({BUILD: [Step(hang=True)]}, "timeout = 4\n", "timeout", "within 4s", "failed", 2),
}


@slow
@pytest.mark.parametrize("case", sorted(ERRORS))
def test_real_mini_swe_agent_error_paths_end_with_their_named_reason(
    tmp_path: Path, mini: str, server_factory, case: str
) -> None:
    scripts, extra, kind, phrase, status, runs = ERRORS[case]
    server = server_factory(scripts)
    repo = make_project(
        tmp_path,
        {"build": mini_role(mini, server.url, extra=extra)},
        extra="[limits]\nagent_retries = 1\n",
    )
    proc = run_ticket(repo, TICKET_ENV, timeout=180)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", status)
    assert kind in summary["error"]
    builds = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    assert [r["error_kind"] for r in builds] == [kind] * runs
    assert all(phrase in r["error"] for r in builds), builds
    if case == "model_http_500":
        assert len(server.requests) == runs  # the binding turned mini's retries off
    if case == "budget":
        assert builds[0]["cost_usd"] == pytest.approx(5_000_000 * 1.25e-6 + 100_000 * 1e-5)
    if case == "hang":
        assert_killed_at_timeout(builds, extra)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


@slow
def test_a_read_only_role_that_writes_is_undone_and_fails(
    tmp_path: Path, mini: str, server_factory
) -> None:
    server = server_factory(
        {REVIEW: [Step(text="x", tools=(bash("echo hi > stray.txt"),)), answer("VERDICT: approve")]}
    )
    repo = make_project(
        tmp_path, {"review": mini_role(mini, server.url)}, extra="[limits]\nagent_retries = 0\n"
    )
    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("pr_review", "failed")
    reviews = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "review"]
    assert [r["error_kind"] for r in reviews] == ["read_only_violation"]
    assert "stray.txt" in reviews[0]["error"]
    assert not list((repo / ".phasegate" / "worktrees").rglob("stray.txt"))
