"""The aider runner: whole workflows with the real ``aider`` CLI, its model scripted.

The CLI is the PyPI package ``aider-chat`` that .ci/run installs in .ci/aider
(``PHASEGATE_AIDER_BIN`` points elsewhere); it talks OpenAI chat completions
(through litellm) to ``ScriptedModelServer`` on 127.0.0.1. aider has no tools:
a scripted build turn is the *whole* edit format aider parses (the file's path,
then its new content in a fence) and aider itself writes the file. The first
tests need no CLI: they pin how the runner reads aider's logs.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.agents.process import ProcessOutcome
from phasegate.agents.runners.aider import AiderRunner, answers, parse_run
from phasegate.config.cartridge import RoleBinding
from phasegate.proc.sandbox import agent_confinement, bwrap_works
from phasegate.testing.model_server import Step, key_sha

from agent_cli_kit import (
    BUILD,
    REVIEW,
    ROUND_1,
    STEP_COST,
    VERIFY,
    assert_killed_at_timeout,
    assert_no_keys,
    assert_output_streamed,
    assert_review_resumed,
    make_project,
    role_scripts,
    role_toml,
    run_ticket,
    show,
    two_review_rounds,
)
from conftest import agent_cli, git, make_repo, phasegate_cli

slow = pytest.mark.slow

pytestmark = pytest.mark.sandboxed

SENTINEL = "sk-sentinel-aider-8c3e1f0a9b2d"
OTHER_KEY = "sk-other-provider-key-aider-41"
VERIFIER_KEY = "dummy-verifier-key-aider-0000"
KEY_VAR = "SCRIPTED_MODEL_KEY"

#: What a ticket's run hands phasegate: the key the bindings name and another one they do not.
TICKET_ENV = {KEY_VAR: SENTINEL, "OPENAI_API_KEY": OTHER_KEY}
KEYS = (SENTINEL, OTHER_KEY)


#: aider's ``whole`` edit format: the path, then the file's whole content fenced.
WRITE_FEATURE = "I will create it.\n\nfeature.txt\n```\nthe feature\n```\n"


def aider_scripts() -> dict[str, list[Step]]:
    return role_scripts(
        [Step(text=WRITE_FEATURE)],
        [Step(text="feature.txt holds the feature.\nVERDICT: confirmed")],
    )


def aider_role(exe: str, url: str, *, key: bool = True, extra: str = "", args: str = "") -> str:
    """A role bound to the real aider."""
    return role_toml(
        "aider",
        exe,
        model="openai/scripted-model",
        base_url=url + "/v1",
        timeout=90,
        key_env=KEY_VAR if key else None,
        env=None if key else {"OPENAI_API_KEY": VERIFIER_KEY},
        more=[f"extra_args = [{args}]"] if args else (),
        extra=extra,
    )


@pytest.fixture
def aider() -> str:
    return agent_cli("aider")


# -- how the runner drives aider and reads it (no CLI needed) --------------------------


def _binding(**fields: Any) -> RoleBinding:
    return RoleBinding(runner="aider", model="openai/scripted-model", **fields)


def _request(tmp_path: Path, **fields: Any) -> AgentRequest:
    values: dict[str, Any] = {
        "workflow_id": "wf",
        "phase": "development",
        "role": "build",
        "session_line": "main",
        "prompt": "Implement the plan below",
        "cwd": tmp_path,
        "timeout_s": 60.0,
        "read_only": False,
        "state_dir": tmp_path / "state",
        **fields,
    }
    return AgentRequest(**values)


def test_the_binding_needs_a_model_and_takes_only_the_keys_aider_reads() -> None:
    with pytest.raises(ValueError, match="needs a `model`"):
        RoleBinding(runner="aider")
    with pytest.raises(ValueError, match="`max_turns` is not used"):
        _binding(max_turns=3)
    runner = make_runner(_binding(budget_usd=1.0), Path("."))
    assert isinstance(runner, AiderRunner) and runner.name == "aider"


def test_read_only_roles_get_aiders_ask_mode_and_dry_run_and_the_key_stays_off_argv(
    tmp_path: Path,
) -> None:
    runner = AiderRunner(_binding(api_key_env=KEY_VAR, extra_args=["--no-dry-run"]))
    files = {name: tmp_path / name for name in ("message", "analytics", "llm_history")}
    files |= {n: tmp_path / n for n in ("chat_history", "input_history", "env_file")}
    build = runner.argv(_request(tmp_path), files, restore=False)
    review = runner.argv(_request(tmp_path, read_only=True), files, restore=True)
    assert "--dry-run" not in build and "ask" not in build and "--no-git" in build
    assert review[-4:] == ["--edit-format", "ask", "--dry-run", "--no-dry-run"]  # binding last
    assert "--restore-chat-history" in review and "--no-restore-chat-history" in build
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_VAR, SENTINEL)
        mp.setenv("GITHUB_TOKEN", OTHER_KEY)
        env = runner.environment(tmp_path)
    assert env[KEY_VAR] == env["OPENAI_API_KEY"] == SENTINEL and "GITHUB_TOKEN" not in env
    assert SENTINEL not in json.dumps(build + review)


LLM_HISTORY = """\
TO LLM 2026-12-02T03:27:46
-------
SYSTEM Act as an expert
-------
USER Review this
LLM RESPONSE 2026-12-02T03:27:46
TO LLM 2026-12-02T03:27:47
-------
USER again
LLM RESPONSE 2026-12-02T03:27:48
ASSISTANT Looks fine.
ASSISTANT\x20
ASSISTANT LLM RESPONSE 2026-12-02T03:27:48
ASSISTANT VERDICT: approve
"""


def _event(name: str, **props: Any) -> str:
    return json.dumps({"event": name, "properties": props, "user_id": "u", "time": 1})


SENT = _event("message_send", prompt_tokens=100, completion_tokens=20, cost=0.5)


START = _event("message_send_starting")
STOPPED = "Only 3 reflections allowed, stopping."


@pytest.mark.parametrize(
    ("log", "stdout", "returncode", "budget", "kind"),
    [
        ([START, SENT], "", 0, None, None),
        ([START, SENT], "", 0, 0.25, "budget"),
        ([START], "litellm.InternalServerError: x\n", 0, None, "model_error"),
        ([START, SENT], STOPPED, 0, None, "model_error"),
        ([], "Message file not found", 1, None, "exit_code"),
        ([], "", 0, None, "exit_code"),
    ],
)
def test_the_logs_decide_the_answer_usage_and_error_kind(
    log: list[str], stdout: str, returncode: int, budget: float | None, kind: str | None
) -> None:
    # a reply line that looks like a header is still the reply's: it is prefixed
    reply = "Looks fine.\n\nLLM RESPONSE 2026-12-02T03:27:48\nVERDICT: approve"
    assert answers(LLM_HISTORY) == ["", reply]
    outcome = ProcessOutcome(stdout, "", returncode, 1.5)
    result = parse_run(outcome, "\n".join(log), LLM_HISTORY, budget_usd=budget, session_id="s")
    assert result.error_kind == kind, result.error
    assert result.text.endswith("VERDICT: approve") and result.session_id == "s"
    sends = sum('"message_send"' in line for line in log)
    assert (result.input_tokens, result.output_tokens) == (100 * sends, 20 * sends)
    assert result.cost_usd == 0.5 * sends


# -- whole workflows with the real CLI -------------------------------------------------


@slow
def test_a_whole_workflow_with_every_role_on_the_real_aider_restoring_the_review_chat(
    tmp_path: Path, aider: str, server_factory
) -> None:
    server = server_factory({**two_review_rounds(), **aider_scripts()})
    roles = {role: aider_role(aider, server.url) for role in ("plan", "plan_review", "build")}
    roles["review"] = aider_role(aider, server.url)
    roles["verification"] = aider_role(aider, server.url, key=False)
    repo = make_project(tmp_path, roles)

    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["dev_round"]) == ("completed", 2), summary
    # aider parsed the build's whole-file listing and wrote the file; it was
    # committed by phasegate, reviewed, merged
    assert git(repo, "show", "main:feature.txt") == "the feature"

    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "aider", "ok")
        for role in ("plan", "plan_review", "build", "review", "build", "review", "verification")
    ]
    # one session per line: plan and build share main's chat, the build saw the plan
    sessions = {r["role"]: r["session_id"] for r in runs}
    assert sessions["plan"] == sessions["build"] != sessions["review"]
    assert sessions["plan_review"] == sessions["review"]
    assert_review_resumed(server, runs)  # aider restored the review's chat
    build_request = server.played(BUILD)[0].body["messages"]
    assert "Create feature.txt containing" in json.dumps(build_request)
    # read-only roles ran in aider's ask mode, the build in its whole-file mode
    systems = {r.script: r.body["messages"][0]["content"] for r in server.requests}
    assert "file listing" in systems[BUILD] and "file listing" not in systems[ROUND_1]
    # every model request reported 100 + 20 tokens, priced by the binding
    requests = [r for r in server.requests if r.script]
    assert len(requests) == 7 == len(server.requests)  # one turn per role's call, nothing else
    assert summary["tokens"] == 120 * len(requests) == detail["workflow"]["tokens"]
    assert summary["cost_usd"] == pytest.approx(len(requests) * STEP_COST, rel=1e-6)
    status = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    assert status[0]["tokens"] == summary["tokens"]

    # the named key reached its roles (as OPENAI_API_KEY), never the verifier that
    # does not name it; the unnamed OPENAI_API_KEY of phasegate's reached no one
    assert {r.key_sha for r in requests if r.script != VERIFY} == {key_sha(SENTINEL)}
    assert {r.key_sha for r in server.played(VERIFY)} == {key_sha(VERIFIER_KEY)}
    # nothing of aider's in the checkout that was merged
    assert git(repo, "ls-tree", "-r", "--name-only", "main").split() == [
        ".gitignore",
        "README.md",
        "answers.toml",
        "feature.txt",
        "phasegate.toml",
    ]
    assert_output_streamed(repo, summary["id"], roles)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, json.dumps(detail))


ERRORS = {
    # name: (scripts, binding extra, error kind, a phrase of the error, phase, status)
    "model_http_500": (
        {BUILD: [Step(status=500)]},
        "timeout = 150\n",
        "model_error",
        "InternalServerError",
        "development",
        "failed",
    ),
    "hang": (
        {BUILD: [Step(hang=True)]},
        "timeout = 8\n",
        "timeout",
        "within 8s",
        "development",
        "failed",
    ),
    "budget": (
        {BUILD: [Step(text=WRITE_FEATURE, input_tokens=5_000_000, output_tokens=100_000)]},
        "budget_usd = 0.5\n",
        "budget",
        "over the call's budget of $0.5000",
        "development",
        "paused",
    ),
}


@slow
@pytest.mark.parametrize("case", sorted(ERRORS))
def test_real_aider_error_paths_end_with_their_named_reason(
    tmp_path: Path, aider: str, server_factory, case: str
) -> None:
    scripts, extra, kind, phrase, phase, status = ERRORS[case]
    server = server_factory(scripts)
    repo = make_project(
        tmp_path,
        {"build": aider_role(aider, server.url, extra=extra)},
        extra="[limits]\nagent_retries = 0\n",
    )
    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == (phase, status), summary
    assert kind in summary["error"]
    builds = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    assert [r["error_kind"] for r in builds] == [kind]
    assert phrase in builds[0]["error"], builds
    if case == "model_http_500":
        assert len(server.requests) > 1  # aider's own retries: about a minute of them
    if case == "budget":
        assert builds[0]["cost_usd"] == pytest.approx(5_000_000 * 1.25e-6 + 100_000 * 1e-5)
    if case == "hang":
        assert_killed_at_timeout(builds, extra)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


STRAY = "Approving.\n\nstray.txt\n```\nhi\n```\n\nVERDICT: approve"


@slow
def test_a_read_only_roles_edit_is_refused_by_aider(
    tmp_path: Path, aider: str, server_factory
) -> None:
    # aider's ask mode never parses a file listing as an edit; the review stands
    server = server_factory({**aider_scripts(), REVIEW: [Step(text=STRAY)]})
    repo = make_project(tmp_path, {"review": aider_role(aider, server.url)})
    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed", summary
    assert "stray.txt" not in git(repo, "ls-tree", "-r", "--name-only", "main")
    assert not list((repo / ".phasegate" / "worktrees").rglob("stray.txt"))


@slow
def test_a_read_only_role_that_writes_anyway_is_undone_and_fails(
    tmp_path: Path, aider: str, server_factory
) -> None:
    # a binding that switches aider's read-only mode off: AgentService undoes the edit
    server = server_factory({REVIEW: [Step(text=STRAY)]})
    writer = aider_role(aider, server.url, args='"--edit-format", "whole", "--no-dry-run"')
    repo = make_project(tmp_path, {"review": writer}, extra="[limits]\nagent_retries = 0\n")
    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("pr_review", "failed")
    reviews = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "review"]
    assert [r["error_kind"] for r in reviews] == ["read_only_violation"]
    assert "stray.txt" in reviews[0]["error"]
    assert not list((repo / ".phasegate" / "worktrees").rglob("stray.txt"))


@slow
def test_a_fresh_line_starts_a_new_chat_every_call(
    tmp_path: Path, aider: str, server_factory
) -> None:
    server = server_factory({"*": [Step(text="Done.")]})
    runner = AiderRunner(
        _binding(executable=aider, base_url=server.url + "/v1", env={"OPENAI_API_KEY": "k" * 12})
    )
    first = runner.run(_request(tmp_path, session_line="fresh"), threading.Event())
    second = runner.run(_request(tmp_path, session_line="fresh", prompt="again"), threading.Event())
    assert (first.error_kind, first.text, first.session_id) == (None, "Done.", None), first.error
    assert second.ok and second.session_id is None
    assert "Implement the plan" not in json.dumps(server.requests[1].body["messages"])
    assert (first.input_tokens, first.output_tokens) == (100, 20)


@slow
def test_a_write_outside_the_checkout_is_refused_by_the_sandbox_and_recorded(
    tmp_path: Path, aider: str, server_factory
) -> None:
    why = bwrap_works()
    if why is not None:
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n"})
    state = repo / ".phasegate" / "agents" / "wf"
    state.mkdir(parents=True)
    listing = "Both.\n\n../escape.txt\n```\nout\n```\n\ninside.txt\n```\nin\n```\n"
    server = server_factory({BUILD: [Step(text=listing)]})
    runner = AiderRunner(
        _binding(executable=aider, base_url=server.url + "/v1", env={"OPENAI_API_KEY": "k" * 12})
    )
    confinement = agent_confinement("bwrap", network=True, cwd=repo, state_dir=state, repo=repo)
    request = _request(repo, state_dir=state, confinement=confinement)
    result = runner.run(request, threading.Event())
    assert result.ok, result.error
    assert (repo / "inside.txt").read_text() == "in\n"
    assert not (tmp_path / "escape.txt").exists()
    assert [v.name for v in result.violations] == ["sandbox_denied"]
    assert result.violations[0].paths == (str(tmp_path / "escape.txt"),)
    # no price list fetched (aider caches a failed fetch as "{}" in its HOME):
    # the model behind base_url got metadata of its own
    assert not list((state / "aider").rglob("model_prices_and_context_window.json"))
