"""Whole workflows with the real Claude Code and Codex CLIs; only their model is scripted.

The CLIs are the npm packages .ci/run installs; they talk to
``phasegate.testing.model_server.ScriptedModelServer`` on 127.0.0.1, which
plays a script per role, chosen by a phrase of that role's prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.codex import CodexRunner, own_sandbox_fails, rollout_totals
from phasegate.config.cartridge import RoleBinding
from phasegate.proc.sandbox import Bubblewrap, agent_confinement, bwrap_works
from phasegate.testing.model_server import ScriptedModelServer, Step, ToolCall, key_sha

from agent_cli_kit import (
    BUILD,
    PLAN,
    PLAN_REVIEW,
    REVIEW,
    VERIFY,
    assert_killed_at_timeout,
    assert_no_keys,
    assert_output_streamed,
    assert_review_resumed,
    make_project,
    run_ticket,
    show,
    two_review_rounds,
)
from conftest import agent_cli, git, phasegate_cli

SENTINEL = "sk-sentinel-4f1e9c2b7a3d5e6f"
VERIFIER_KEY = "dummy-verifier-key-0000"

#: What a ticket's run hands phasegate: the key the bindings name and another one they do not.
TICKET_ENV = {"ANTHROPIC_API_KEY": SENTINEL, "OPENAI_API_KEY": SENTINEL}
KEYS = (SENTINEL,)


pytestmark = [pytest.mark.slow, pytest.mark.sandboxed]


def claude_scripts(build: Sequence[Step] | None = None) -> dict[str, list[Step]]:
    write = ToolCall("Write", {"file_path": "{cwd}/feature.txt", "content": "the feature\n"})
    return {
        PLAN: [Step(text="1. Create feature.txt containing 'the feature'.", input_tokens=80)],
        PLAN_REVIEW: [Step(text="The plan is sound.\nVERDICT: approve", input_tokens=80)],
        BUILD: list(
            build
            or [
                Step(tools=(write,), input_tokens=80),
                Step(text="Created feature.txt.", input_tokens=80),
            ]
        ),
        REVIEW: [Step(text="Correct and minimal.\nVERDICT: approve", input_tokens=80)],
        VERIFY: [
            Step(tools=(ToolCall("Read", {"file_path": "{cwd}/feature.txt"}),), input_tokens=80),
            Step(text="feature.txt holds the feature.\nVERDICT: confirmed", input_tokens=80),
        ],
    }


def claude_role(exe: str, url: str, *, extra: str = "", key: bool = True) -> str:
    lines = [
        'runner = "claude-code"',
        f"executable = {json.dumps(exe)}",
        f"base_url = {json.dumps(url)}",
        "timeout = 60",
    ]
    if key:
        lines.append('api_key_env = "ANTHROPIC_API_KEY"')
    env = {"CLAUDE_CODE_MAX_RETRIES": "0"}
    if not key:
        env["ANTHROPIC_API_KEY"] = VERIFIER_KEY
    lines.append("env = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + "}")
    return "\n".join(lines) + "\n" + extra


def reported_usage(
    server: ScriptedModelServer, marker: str, steps: Sequence[Step]
) -> tuple[int, int]:
    """The input and output tokens the server reported to the requests of ``marker``'s
    script (an error answer reports none)."""
    answered = [steps[r.step] for r in server.played(marker) if steps[r.step].status == 200]
    return sum(s.input_tokens for s in answered), sum(s.output_tokens for s in answered)


@pytest.fixture
def claude() -> str:
    return agent_cli("claude")


@pytest.fixture
def codex() -> str:
    return agent_cli("codex")


def test_a_whole_workflow_with_every_role_on_the_real_claude_code_resuming_the_review_session(
    tmp_path: Path, claude: str, server_factory
) -> None:
    rounds = two_review_rounds(lambda text: Step(text=text, input_tokens=80))
    server = server_factory({**rounds, **claude_scripts()})
    roles = {
        role: claude_role(claude, server.url) for role in ("plan", "plan_review", "build", "review")
    }
    roles["verification"] = claude_role(claude, server.url, key=False)
    repo = make_project(tmp_path, roles)

    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["dev_round"]) == ("completed", 2), summary
    assert git(repo, "show", "main:feature.txt") == "the feature"

    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "claude-code", "ok")
        for role in ("plan", "plan_review", "build", "review", "build", "review", "verification")
    ]
    assert all(r["session_id"] for r in runs)
    assert_review_resumed(server, runs)
    # every model request reported 80 + 20 tokens: the totals are sums, in show and status
    model_requests = [r for r in server.requests if r.script]
    assert summary["tokens"] == 100 * len(model_requests) == detail["workflow"]["tokens"]
    status = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    assert status[0]["tokens"] == summary["tokens"]
    assert status[0]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in runs), abs=1e-6)
    assert summary["cost_usd"] > 0

    # the key reached the roles that name it, never the verifier that does not
    by_script = {r.script: r.key_sha for r in model_requests}
    assert by_script[BUILD] == key_sha(SENTINEL)
    assert {r.key_sha for r in model_requests if r.script == VERIFY} == {key_sha(VERIFIER_KEY)}
    assert_output_streamed(repo, summary["id"], roles)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, json.dumps(detail))


ERRORS = {
    # name: (build steps, binding extra, expected error kind, expected status, runs)
    "max_turns": (
        [
            Step(tools=(ToolCall("Write", {"file_path": "{cwd}/x.txt", "content": "x"}),)),
            Step(text="done"),
        ],
        "max_turns = 1\n",
        "max_turns",
        "failed",
        2,
    ),
    "budget": (
        [Step(text="expensive", input_tokens=5_000_000, output_tokens=100_000)],
        "budget_usd = 0.5\n",
        "budget",
        "paused",
        1,
    ),
    "model_http_500": ([Step(status=500)], "", "model_error", "failed", 2),
    "refused_tool_call": (
        [
            Step(tools=(ToolCall("WebFetch", {"url": "http://127.0.0.1:9/", "prompt": "x"}),)),
            Step(text="could not fetch"),
        ],
        "",
        "permission_denied",
        "failed",
        2,
    ),
    "hang": ([Step(hang=True)], "timeout = 4\n", "timeout", "failed", 2),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_real_claude_code_error_paths_end_with_their_named_reason(
    tmp_path: Path, claude: str, server_factory, case: str
) -> None:
    steps, extra, kind, status, runs = ERRORS[case]
    server = server_factory(claude_scripts(build=steps))
    roles = {
        role: claude_role(claude, server.url)
        for role in ("plan", "plan_review", "review", "verification")
    }
    build = claude_role(claude, server.url)
    if "timeout" in extra:
        build = build.replace("timeout = 60\n", "")
    roles["build"] = build + extra
    repo = make_project(tmp_path, roles, extra="[limits]\nagent_retries = 1\n")

    proc = run_ticket(repo, TICKET_ENV, timeout=180)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", status)
    assert kind in summary["error"]
    builds = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    assert [r["error_kind"] for r in builds] == [kind] * runs
    if case == "hang":
        assert_killed_at_timeout(builds, extra)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


CLAUDE_BUDGET_STOPS = {
    # the one turn is the expensive one: the result's ``usage`` is all zeros
    "usage_empty": [Step(text="expensive", input_tokens=5_000_000, output_tokens=100_000)],
    # a cheap tool turn, then the expensive one: ``usage`` holds the first turn only
    "usage_partial": [
        Step(
            tools=(ToolCall("Write", {"file_path": "{cwd}/x.txt", "content": "x"}),),
            input_tokens=10_000,
            output_tokens=500,
        ),
        Step(
            tools=(ToolCall("Write", {"file_path": "{cwd}/y.txt", "content": "y"}),),
            input_tokens=300_000,
            output_tokens=10_000,
        ),
        Step(text="never reached"),
    ],
}


@pytest.mark.parametrize("case", sorted(CLAUDE_BUDGET_STOPS))
def test_a_claude_run_stopped_by_its_budget_records_the_tokens_it_spent(
    tmp_path: Path, claude: str, server_factory, case: str
) -> None:
    steps = CLAUDE_BUDGET_STOPS[case]
    server = server_factory(claude_scripts(build=steps))
    roles = {
        role: claude_role(claude, server.url)
        for role in ("plan", "plan_review", "review", "verification")
    }
    roles["build"] = claude_role(claude, server.url) + "budget_usd = 0.5\n"
    repo = make_project(tmp_path, roles, extra="[limits]\nagent_retries = 1\n")

    proc = run_ticket(repo, TICKET_ENV, timeout=180)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["current_phase"]) == ("paused", "development")
    assert "budget" in summary["error"]
    builds = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    assert [r["error_kind"] for r in builds] == ["budget"]
    # every answered build turn is counted, the one that crossed the cap included
    input_tokens, output_tokens = reported_usage(server, BUILD, steps)
    assert input_tokens >= 300_000
    assert (builds[0]["input_tokens"], builds[0]["output_tokens"]) == (
        input_tokens,
        output_tokens,
    )
    assert builds[0]["cost_usd"] > 0.5
    assert summary["tokens"] >= input_tokens + output_tokens
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


def codex_role(exe: str, url: str) -> str:
    return (
        "\n".join(
            [
                'runner = "codex"',
                f"executable = {json.dumps(exe)}",
                f"base_url = {json.dumps(url + '/v1')}",
                'model = "gpt-test"',
                'api_key_env = "OPENAI_API_KEY"',
                "input_usd_per_mtok = 1.25",
                "output_usd_per_mtok = 10.0",
                "timeout = 60",
                'extra_args = ["-c", "model_providers.phasegate.request_max_retries=0",'
                ' "-c", "model_providers.phasegate.stream_max_retries=0"]',
            ]
        )
        + "\n"
    )


def test_a_whole_workflow_with_every_role_on_the_real_codex_cli(
    tmp_path: Path, codex: str, server_factory
) -> None:
    write = ToolCall("exec_command", {"cmd": "printf 'the feature\\n' > feature.txt"})
    scripts = {
        PLAN: [Step(text="1. Create feature.txt containing 'the feature'.")],
        PLAN_REVIEW: [Step(text="VERDICT: approve")],
        BUILD: [Step(tools=(write,)), Step(text="Created feature.txt.")],
        REVIEW: [Step(text="VERDICT: approve")],
        VERIFY: [
            Step(tools=(ToolCall("exec_command", {"cmd": "cat feature.txt"}),)),
            Step(text="It is there.\nVERDICT: confirmed"),
        ],
    }
    server = server_factory(scripts)
    repo = make_project(
        tmp_path,
        {
            role: codex_role(codex, server.url)
            for role in ("plan", "plan_review", "build", "review", "verification")
        },
    )
    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed", summary
    assert git(repo, "show", "main:feature.txt") == "the feature"
    runs = show(repo, summary["id"])["agent_runs"]
    assert [(r["runner"], r["outcome"]) for r in runs] == [("codex", "ok")] * 5
    # each model request reported 100 + 20 tokens; resumed threads are not counted twice
    requests = [r for r in server.requests if r.script]
    assert summary["tokens"] == 120 * len(requests)
    expected_cost = len(requests) * (100 * 1.25 + 20 * 10.0) / 1e6
    assert summary["cost_usd"] == pytest.approx(expected_cost, rel=1e-6)
    # the verifier's read-only sandbox saw the merged file
    verify_outputs = json.dumps([r.body for r in server.played(VERIFY)])
    assert "the feature" in verify_outputs
    assert_output_streamed(
        repo, summary["id"], ("plan", "plan_review", "build", "review", "verification")
    )
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


def test_a_read_only_role_gets_no_key_unless_the_cartridge_passes_it(
    tmp_path: Path, claude: str, server_factory
) -> None:
    server = server_factory(claude_scripts())
    roles = {
        role: claude_role(claude, server.url)
        for role in ("plan_review", "build", "review", "verification")
    }
    dump = tmp_path / "plan-env.txt"
    # A probe watched from outside: it writes beside the repository, which a sandbox refuses.
    roles["plan"] = (
        f'runner = "command"\ncommand = "env > {dump}; echo 1. the plan"\nsandbox = "none"\n'
    )
    repo = make_project(tmp_path, roles)
    proc = run_ticket(repo, {**TICKET_ENV, "GITHUB_TOKEN": SENTINEL})
    assert proc.returncode == 0, proc.stderr
    env_dump = dump.read_text()
    assert SENTINEL not in env_dump
    assert "ANTHROPIC_API_KEY" not in env_dump and "GITHUB_TOKEN" not in env_dump
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


CODEX_ERRORS = {
    # name: (build steps, binding extra, expected error kind, expected status, runs)
    "model_http_500": ([Step(status=500)], "", "model_error", "failed", 2),
    "hang": ([Step(hang=True)], "timeout = 4\n", "timeout", "failed", 2),
    # priced usage spends the role's cap in one call; the next call is refused before it runs
    "budget": (
        [Step(text="no change yet", input_tokens=400_000, output_tokens=10_000)],
        "budget_usd = 0.25\n",
        "budget",
        "paused",
        1,
    ),
}


@pytest.mark.parametrize("case", sorted(CODEX_ERRORS))
def test_real_codex_error_paths_end_with_their_named_reason(
    tmp_path: Path, codex: str, server_factory, case: str
) -> None:
    steps, extra, kind, status, runs = CODEX_ERRORS[case]
    scripts = {
        PLAN: [Step(text="1. Create feature.txt.")],
        PLAN_REVIEW: [Step(text="VERDICT: approve")],
        BUILD: steps,
    }
    server = server_factory(scripts)
    roles = {
        role: codex_role(codex, server.url)
        for role in ("plan", "plan_review", "review", "verification")
    }
    build = codex_role(codex, server.url)
    if "timeout" in extra:
        build = build.replace("timeout = 60\n", "")
    roles["build"] = build + extra
    repo = make_project(tmp_path, roles, extra="[limits]\nagent_retries = 1\nmax_dev_retries = 1\n")

    started = time.monotonic()
    proc = run_ticket(repo, TICKET_ENV, timeout=180)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", status)
    assert kind in summary["error"]
    builds = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    if case == "budget":
        # the first build spent the cap (and changed nothing: a failed attempt); the retry
        # is refused before it runs
        assert len(builds) == runs and builds[0]["cost_usd"] > 0.25
    else:
        assert [r["error_kind"] for r in builds] == [kind] * runs
    if case == "hang":
        assert time.monotonic() - started < 60
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


# Codex's build: a tool call the server answers at a price, then an HTTP 500 that fails the
# turn. Codex prints no turn.completed (no usage) for it; its session log has the totals.
COSTLY_THEN_500 = [
    Step(
        tools=(ToolCall("exec_command", {"cmd": "echo hi"}),),
        input_tokens=100_000,
        output_tokens=1_000,
    ),
    Step(status=500),
]
COSTLY_TURN_USD = (100_000 * 1.25 + 1_000 * 10.0) / 1e6  # 0.135 at the codex_role prices


def test_a_failed_codex_call_records_what_its_answered_turns_cost(
    tmp_path: Path, codex: str, server_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    finish = [Step(text="Finished.", input_tokens=300, output_tokens=30)]
    server = server_factory({BUILD: COSTLY_THEN_500, "Now finish": finish})
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL)
    cwd = tmp_path / "worktree"
    cwd.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=cwd, check=True)
    binding = RoleBinding(
        runner="codex",
        executable=codex,
        base_url=server.url + "/v1",
        model="gpt-test",
        api_key_env="OPENAI_API_KEY",
        input_usd_per_mtok=1.25,
        output_usd_per_mtok=10.0,
        extra_args=[
            "-c",
            "model_providers.phasegate.request_max_retries=0",
            "-c",
            "model_providers.phasegate.stream_max_retries=0",
        ],
    )
    runner = CodexRunner(binding)
    state = tmp_path / "state"

    def call(prompt: str, session_id: str | None = None):
        request = AgentRequest(
            workflow_id="wf",
            phase="development",
            role="build",
            session_line="main",
            prompt=prompt,
            cwd=cwd,
            timeout_s=60,
            read_only=False,
            session_id=session_id,
            state_dir=state,
        )
        return runner.run(request, threading.Event())

    first = call(f"{BUILD}: create feature.txt")
    assert first.error_kind == "model_error" and first.session_id
    assert reported_usage(server, BUILD, COSTLY_THEN_500) == (100_000, 1_000)
    assert (first.input_tokens, first.output_tokens) == (100_000, 1_000)
    assert first.cost_usd == pytest.approx(COSTLY_TURN_USD, rel=1e-9)
    # the totals came from Codex's own session log of the thread, in the call's CODEX_HOME
    home = state / "codex-home"
    assert list((home / "sessions").glob(f"**/rollout-*-{first.session_id}.jsonl"))
    assert rollout_totals(home, first.session_id)["input_tokens"] == 100_000

    # the same failure on the resumed thread: the log's totals double, the call's spend does not
    second = call(f"{BUILD}: create feature.txt", first.session_id)
    assert second.error_kind == "model_error" and second.session_id == first.session_id
    assert rollout_totals(home, first.session_id)["input_tokens"] == 200_000
    assert (second.input_tokens, second.output_tokens) == (100_000, 1_000)
    assert second.cost_usd == pytest.approx(COSTLY_TURN_USD, rel=1e-9)

    # a turn that completes reports the thread's totals on stdout; only its own part is counted
    third = call("Now finish the work.", first.session_id)
    assert third.ok and third.session_id == first.session_id
    assert (third.input_tokens, third.output_tokens) == (300, 30)
    assert len(server.played(BUILD)) == 4


def test_a_failed_codex_build_spends_the_workflow_budget_and_pauses_it(
    tmp_path: Path, codex: str, server_factory
) -> None:
    scripts = {
        PLAN: [Step(text="1. Create feature.txt.")],
        PLAN_REVIEW: [Step(text="VERDICT: approve")],
        BUILD: COSTLY_THEN_500,
    }
    server = server_factory(scripts)
    roles = {
        role: codex_role(codex, server.url)
        for role in ("plan", "plan_review", "build", "review", "verification")
    }
    # the failed build costs 0.135 USD: over the cap, so its retry must not run
    limits = "[limits]\nagent_retries = 1\nworkflow_budget_usd = 0.1\n"
    repo = make_project(tmp_path, roles, extra=limits)

    proc = run_ticket(repo, TICKET_ENV, timeout=180)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", "paused")
    assert "budget" in summary["error"]
    detail = show(repo, summary["id"])
    builds = [r for r in detail["agent_runs"] if r["role"] == "build"]
    assert [(r["outcome"], r["error_kind"]) for r in builds] == [("failed", "model_error")]
    # the failed run carries exactly what the server reported for the turn it answered
    assert (builds[0]["input_tokens"], builds[0]["output_tokens"]) == reported_usage(
        server, BUILD, COSTLY_THEN_500
    )
    assert (builds[0]["input_tokens"], builds[0]["output_tokens"]) == (100_000, 1_000)
    assert builds[0]["cost_usd"] == pytest.approx(COSTLY_TURN_USD, rel=1e-6)
    assert summary["cost_usd"] > 0.1
    # no model request after the failed call: the cap stopped the retry before it ran
    assert [r.step for r in server.played(BUILD)] == [0, 1]
    assert server.requests[-1].script == BUILD
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


def test_the_own_sandbox_probe_agrees_with_codex_inside_phasegates_sandbox(
    tmp_path: Path, codex: str
) -> None:
    # own_sandbox_fails decides whether Codex keeps its workspace-write sandbox inside
    # phasegate's: it must say what Codex's own sandbox really does there (as root it
    # cannot start, as a person it can), or Codex's every command would fail.
    why_not = bwrap_works()
    if why_not is not None:
        pytest.skip(f"phasegate's sandbox does not work here: {why_not}")
    worktree, home, tmp = tmp_path / "wt", tmp_path / "codex-home", tmp_path / "tmp"
    for path in (worktree, home, tmp):
        path.mkdir()
    argv = Bubblewrap().wrap(
        [codex, "sandbox", "-c", 'sandbox_mode="workspace-write"', "--", "touch", "made"],
        agent_confinement("bwrap", network=True, cwd=worktree, state_dir=home, repo=tmp_path),
        worktree,
        tmp,
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home)}
    done = subprocess.run(argv, cwd=worktree, env=env, capture_output=True, text=True, timeout=60)
    codex_sandbox_starts = done.returncode == 0 and (worktree / "made").exists()
    assert codex_sandbox_starts == (own_sandbox_fails(True) is None), done.stderr
