"""The copilot runner: whole workflows with the real GitHub Copilot CLI, its model scripted.

The CLI is the npm package .ci/run installs in .ci/node (``PHASEGATE_COPILOT_BIN``
points at another). Offline (``COPILOT_OFFLINE``, no GitHub login) it talks
OpenAI chat completions, streaming, to ``ScriptedModelServer`` on 127.0.0.1, its
provider of one's own (``COPILOT_PROVIDER_BASE_URL``). Its tools are Copilot's
own: ``create`` (``path``, ``file_text``), ``view`` (``path``), ``bash``
(``command``, ``description``). Copilot retries a 5xx five times, at least a
second apart: this module's server says ``Retry-After: 0`` on its error
answers, so an error path takes seconds, not twenty. The first tests need no
CLI: they pin how the runner reads Copilot's events and drives it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.copilot import (
    BUILD_EXCLUDED,
    READ_ONLY_TOOLS,
    CopilotRunner,
    binary_version,
    package_cache,
    parse_events,
    usage_since,
)
from phasegate.config.cartridge import RoleBinding
from phasegate.testing.model_server import Step, ToolCall, key_sha

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
    offered_tools,
    role_scripts,
    role_toml,
    run_ticket,
    scripted_servers,
    show,
    two_review_rounds,
)
from conftest import agent_cli, git

slow = pytest.mark.slow

pytestmark = pytest.mark.sandboxed

SENTINEL = "sk-sentinel-5b2d8e1f9c4a7b3e"
OTHER_KEY = "sk-other-provider-key-88bb66"
VERIFIER_KEY = "dummy-verifier-key-1111"
KEY_VAR = "SCRIPTED_MODEL_KEY"

#: What a ticket's run hands phasegate: the key the bindings name and another one they do not.
TICKET_ENV = {KEY_VAR: SENTINEL, "OPENAI_API_KEY": OTHER_KEY}
KEYS = (SENTINEL,)


def create(path: str, content: str) -> ToolCall:
    return ToolCall("create", {"path": path, "file_text": content})


def bash(command: str) -> ToolCall:
    return ToolCall("bash", {"command": command, "description": "run it"})


def copilot_scripts(
    build: Sequence[Step] | None = None, review: Sequence[Step] | None = None
) -> dict[str, list[Step]]:
    return role_scripts(
        build or [Step(tools=(create("feature.txt", "the feature\n"),)), Step(text="Created it.")],
        [
            Step(tools=(ToolCall("view", {"path": "feature.txt"}),)),
            Step(text="feature.txt holds the feature.\nVERDICT: confirmed"),
        ],
        review=review,
    )


def copilot_role(exe: str, url: str, *, key: str | None = None, extra: str = "") -> str:
    """A role bound to the real Copilot CLI; ``key`` set puts the key in the binding's env."""
    return role_toml(
        "copilot",
        exe,
        model="scripted-model",
        base_url=url + "/v1",
        timeout=90,
        key_env=KEY_VAR,
        env={KEY_VAR: key} if key is not None else None,
        extra=extra,
    )


def every_role(exe: str, url: str, **kw: Any) -> dict[str, str]:
    return {
        role: copilot_role(exe, url, **kw)
        for role in ("plan", "plan_review", "build", "review", "verification")
    }


servers = scripted_servers("Retry-After")


@pytest.fixture
def copilot() -> str:
    return agent_cli("copilot")


# -- without the CLI: how the runner reads events and drives Copilot -----------------


def _line(kind: str, data: dict[str, Any] | None = None, **top: Any) -> str:
    return json.dumps({"type": kind, **({"data": data} if data is not None else {}), **top})


def test_parse_events_takes_the_last_answer_the_refusals_and_the_error() -> None:
    stdout = "\n".join(
        [
            "not json",
            _line("assistant.message", {"content": "Looking.", "toolRequests": []}),
            _line("tool.execution_start", {"toolCallId": "c1", "toolName": "create"}),
            _line("tool.execution_start", {"toolCallId": "c2", "toolName": "bash"}),
            _line("tool.execution_start", {"toolCallId": "c3", "toolName": "edit"}),
            _line("tool.execution_start", {"toolCallId": "c4", "toolName": "view"}),
            _line(
                "tool.execution_complete",
                {"toolCallId": "c1", "success": False, "error": {"code": "denied"}},
            ),
            _line(
                "tool.execution_complete",
                {
                    "toolCallId": "c3",
                    "success": False,
                    "error": {"code": "failure", "message": "Tool 'edit' does not exist."},
                },
            ),
            # a command that failed, a file that is not there: no refusals
            _line(
                "tool.execution_complete",
                {"toolCallId": "c2", "success": False, "error": {"message": "exit 1"}},
            ),
            _line(
                "tool.execution_complete",
                {
                    "toolCallId": "c4",
                    "success": False,
                    "error": {"code": "failure", "message": "Path does not exist"},
                },
            ),
            _line("tool.execution_complete", {"toolCallId": "c4", "success": True}),
            _line("assistant.message", {"content": "The answer.", "toolRequests": []}),
            _line("assistant.message", {"content": "", "toolRequests": [{"name": "view"}]}),
            _line("session.error", {"statusCode": 500, "message": "retried 5 times"}),
            _line("result", sessionId="9d1c", exitCode=1),
        ]
    )
    parsed = parse_events(stdout)
    assert parsed["session_id"] == "9d1c"
    assert parsed["text"] == "The answer."
    assert parsed["refused"] == ["create", "edit"]
    assert parsed["error"] == (500, "retried 5 times")


def test_usage_since_sums_the_records_appended_past_the_offset(tmp_path: Path) -> None:
    record = {"inputTokens": 70, "outputTokens": 15, "cacheReadTokens": 30, "cacheWriteTokens": 2}
    earlier = _line("session.usage_record", {"usage": {"inputTokens": 999, "outputTokens": 9}})
    events = tmp_path / "events.jsonl"
    events.write_text(earlier + "\n")
    offset = events.stat().st_size
    with events.open("a") as f:
        f.write(_line("user.message", {"content": "go"}) + "\n")
        f.write(_line("session.usage_record", {"usage": record}) + "\n")
        f.write(_line("session.usage_record", {"usage": {**record, "outputTokens": "x"}}) + "\n")
        f.write('{"type": "session.usage_record", "data": {"usa')  # cut off by a kill
    # the cache reads are a share of inputTokens already (Copilot's own sum)
    assert usage_since(events, offset) == (2 * 70, 15)
    assert usage_since(events, 0) == (2 * 70 + 999, 24)
    assert usage_since(tmp_path / "none.jsonl", 0) == (0, 0)


def _request(tmp_path: Path, *, read_only: bool) -> AgentRequest:
    return AgentRequest(
        workflow_id="wf",
        phase="development",
        role="review" if read_only else "build",
        session_line="main",
        prompt="do it",
        cwd=tmp_path,
        timeout_s=60,
        read_only=read_only,
        state_dir=tmp_path / "state",
    )


def test_read_only_roles_are_offered_reading_and_the_key_goes_under_copilots_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VAR, SENTINEL)
    binding = RoleBinding(
        runner="copilot",
        model="scripted-model",
        base_url="http://127.0.0.1:9/v1",
        api_key_env=KEY_VAR,
        input_usd_per_mtok=IN_USD,
        output_usd_per_mtok=OUT_USD,
    )
    runner = make_runner(binding, tmp_path)
    assert isinstance(runner, CopilotRunner)
    read_only = runner.argv(_request(tmp_path, read_only=True), "s-1", resume=True)
    start = read_only.index("--available-tools") + 1
    assert tuple(read_only[start : start + 3]) == READ_ONLY_TOOLS == ("view", "grep", "glob")
    denied = [read_only[i + 1] for i, arg in enumerate(read_only) if arg == "--deny-tool"]
    assert denied == ["write", "shell"]
    assert read_only[read_only.index("--resume") + 1] == "s-1"
    assert "--allow-all-tools" in read_only and "--no-auto-update" in read_only
    assert "--secret-env-vars=COPILOT_PROVIDER_API_KEY" in read_only
    build = runner.argv(_request(tmp_path, read_only=False), "s-2", resume=False)
    assert build[build.index("--excluded-tools") + 1 :][:1] == list(BUILD_EXCLUDED) == ["task"]
    assert "--available-tools" not in build and "--deny-tool" not in build
    assert build[build.index("--session-id") + 1] == "s-2" and "--resume" not in build
    assert "-p" not in build  # the prompt goes on stdin

    env = runner.env(tmp_path / "home", tmp_path / "pkg")
    assert env["COPILOT_PROVIDER_API_KEY"] == SENTINEL and KEY_VAR not in env
    assert env["COPILOT_OFFLINE"] == "true"
    assert env["COPILOT_PROVIDER_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert env["COPILOT_HOME"] == str(tmp_path / "home" / ".copilot")
    assert env["COPILOT_PKG_CACHE_HOME"] == str(tmp_path / "pkg")
    assert SENTINEL not in json.dumps(read_only + build)  # never on argv
    # without base_url: Copilot's own service, nothing of a provider, not offline
    plain = CopilotRunner(RoleBinding(runner="copilot", model="gpt-5.4")).env(tmp_path, None)
    assert "COPILOT_OFFLINE" not in plain and "COPILOT_PROVIDER_BASE_URL" not in plain


def test_without_a_writable_cache_each_home_unpacks_its_own_package(tmp_path: Path) -> None:
    # a program that does not start: no shared package, and no exception (the call
    # itself then fails as runner_error, saying why)
    assert package_cache(str(tmp_path / "missing"), {"XDG_CACHE_HOME": str(tmp_path)}) is None
    assert not (tmp_path / "phasegate").exists()


@slow
def test_the_package_is_unpacked_once_per_version_or_left_to_each_home(
    tmp_path: Path, copilot: str
) -> None:
    assert binary_version(copilot) == "1.0.102"
    # phasegate's cache cannot be made (a file is in the way): None, no exception;
    # Copilot then unpacks its package in the workflow's home
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory\n")
    assert package_cache(copilot, {"XDG_CACHE_HOME": str(blocker), "PATH": "/usr/bin:/bin"}) is None
    # a fresh cache: unpacked there once, the same directory found the next time
    environ = {"XDG_CACHE_HOME": str(tmp_path / "fresh"), "PATH": "/usr/bin:/bin"}
    shared = package_cache(copilot, environ)
    assert shared == tmp_path / "fresh" / "phasegate" / "copilot"
    done = shared / "pkg" / "linux-x64" / "1.0.102" / ".extraction-complete"
    first = done.stat().st_mtime_ns
    assert (shared / "pkg" / "linux-x64" / "1.0.102" / "cli-main.js").is_file()
    assert package_cache(copilot, environ) == shared
    assert done.stat().st_mtime_ns == first
    shutil.rmtree(tmp_path / "fresh")  # 235 MB


def test_a_copilot_binding_needs_a_model() -> None:
    with pytest.raises(ValueError, match="needs a `model`"):
        RoleBinding(runner="copilot")
    with pytest.raises(ValueError, match="max_turns"):
        RoleBinding(runner="copilot", model="m", max_turns=3)


def test_doctor_warns_of_a_copilot_role_that_cannot_sign_in(tmp_path: Path) -> None:
    from phasegate.tools.doctor import diagnose

    roles = {
        "plan": 'runner = "copilot"\nexecutable = "/bin/true"\nmodel = "gpt-5.4"\n',
        "review": (
            'runner = "copilot"\nexecutable = "/bin/true"\nmodel = "gpt-5.4"\n'
            'pass_env = ["COPILOT_GITHUB_TOKEN"]\n'
        ),
        "build": copilot_role("/bin/true", "http://127.0.0.1:9"),
    }
    repo = make_project(tmp_path, roles)
    warnings = diagnose(repo, environ={"PATH": "/usr/bin:/bin"}, offline=True).warnings
    signing_in = [w for w in warnings if "cannot sign in" in w]
    assert len(signing_in) == 1 and signing_in[0].startswith("roles.plan:")


# -- with the real CLI ---------------------------------------------------------------


#: A project's Copilot hooks (``.github/hooks/*.json``): Copilot runs them at a
#: session's start and at each prompt, in a trusted folder only.
PROJECT_HOOKS = {
    ".github/hooks/probe.json": json.dumps(
        {
            "version": 1,
            "hooks": {
                "sessionStart": [{"type": "command", "bash": "touch hook-ran.txt"}],
                "userPromptSubmitted": [{"type": "command", "bash": "touch hook-ran.txt"}],
            },
        }
    )
}


@slow
def test_a_whole_workflow_with_every_role_on_the_real_copilot_resuming_the_review_session(
    tmp_path: Path, copilot: str, servers
) -> None:
    server = servers({**two_review_rounds(), **copilot_scripts()})
    roles = every_role(copilot, server.url)
    roles["verification"] = copilot_role(copilot, server.url, key=VERIFIER_KEY)
    repo = make_project(tmp_path, roles, files=PROJECT_HOOKS)

    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["dev_round"]) == ("completed", 2), summary
    assert git(repo, "show", "main:feature.txt") == "the feature"

    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "copilot", "ok")
        for role in ("plan", "plan_review", "build", "review", "build", "review", "verification")
    ]
    assert all(r["session_id"] and len(r["session_id"]) == 36 for r in runs)
    assert_review_resumed(server, runs)
    # each call counts its own turn, not the resumed session's total
    reviews = [r for r in runs if r["role"] == "review"]
    assert [(r["input_tokens"], r["output_tokens"]) for r in reviews] == [(100, 20)] * 2
    # every model request is a turn of the main loop, each reported 100 + 20 tokens,
    # priced at the binding's prices (Copilot reports no cost for its own provider)
    requests = [r for r in server.requests if r.script]
    assert len(requests) == len(server.requests) == 10
    assert summary["tokens"] == 120 * len(requests) == detail["workflow"]["tokens"]
    assert summary["cost_usd"] == pytest.approx(len(requests) * STEP_COST, rel=1e-6)
    assert [r["cost_usd"] for r in runs if r["role"] == "build"] == [
        pytest.approx(2 * STEP_COST, rel=1e-6)
    ] * 2
    # read-only roles were offered reading tools only; the build its edits and commands
    for marker in (PLAN, PLAN_REVIEW, ROUND_1, ROUND_2, VERIFY):
        assert offered_tools(server, marker) == set(READ_ONLY_TOOLS), marker
    assert {"create", "edit", "bash"} <= offered_tools(server, BUILD)
    assert "task" not in offered_tools(server, BUILD)
    # the verifier read the file through Copilot's view tool
    assert "the feature" in json.dumps(server.played(VERIFY)[-1].body["messages"])

    # the key reached the roles that name it, the verifier its own, never the other key
    assert {r.key_sha for r in server.played(BUILD)} == {key_sha(SENTINEL)}
    assert {r.key_sha for r in server.played(VERIFY)} == {key_sha(VERIFIER_KEY)}
    assert key_sha(OTHER_KEY) not in {r.key_sha for r in requests}
    agents = repo / ".phasegate" / "agents"
    assert_output_streamed(repo, summary["id"], roles)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, json.dumps(detail), dirs=[agents])
    # Copilot kept its sessions in the workflow's own home; its package is not copied there
    homes = list(agents.glob("*/copilot-home"))
    assert len(homes) == 1 and list(homes[0].glob(".copilot/session-state/*/events.jsonl"))
    assert not list(homes[0].rglob("cli-main.js"))
    shared = package_cache(copilot)
    assert shared is not None and list(shared.glob("pkg/linux-x64/*/cli-main.js"))
    # the project's hooks never ran: phasegate does not trust the folder for Copilot
    assert not list(tmp_path.rglob("hook-ran.txt"))
    assert "hook-ran.txt" not in git(repo, "log", "--all", "--name-only", "--format=")


@slow
def test_a_read_only_roles_edit_is_refused_and_fails_the_call(
    tmp_path: Path, copilot: str, servers
) -> None:
    tries = [
        Step(tools=(create("sneaky.txt", "x\n"),)),
        Step(tools=(bash("touch sneaky.txt"),)),
        Step(text="Could not write.\nVERDICT: approve"),
    ]
    server = servers(copilot_scripts(review=tries))
    repo = make_project(
        tmp_path,
        {"review": copilot_role(copilot, server.url)},
        extra="[limits]\nagent_retries = 0\n",
    )
    proc = run_ticket(repo, TICKET_ENV)
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("pr_review", "failed"), summary
    assert "permission_denied" in summary["error"]
    reviews = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "review"]
    assert [(r["outcome"], r["error_kind"]) for r in reviews] == [("failed", "permission_denied")]
    assert "create" in reviews[0]["error"] and "bash" in reviews[0]["error"]
    # Copilot never offered the tools: the calls were refused before anything ran
    assert offered_tools(server, REVIEW) == set(READ_ONLY_TOOLS)
    assert not list(repo.parent.rglob("sneaky.txt"))
    changed = git(repo, "diff", "--name-only", "main", summary["branch_name"])
    assert changed.splitlines() == ["feature.txt"]
    assert "sneaky.txt" not in git(repo, "log", "--all", "--name-only", "--format=")
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, dirs=[repo / ".phasegate" / "agents"])


ERRORS = {
    # name: (build steps, binding extra, kind, runs of the build); each ends development failed
    "model_http_500": ([Step(status=500)], "", "model_error", 2),
    # one answered turn, then the model never answers: killed, its finished turn counted
    "hang": (
        [Step(tools=(create("feature.txt", "f\n"),)), Step(hang=True)],
        # its start and first turn fit on a loaded two-core machine (opencode's 20 s did not)
        "timeout = 30\n",
        "timeout",
        1,  # not retried: the wait is the test's cost, and the retry is the phases' own
    ),
}


@slow
@pytest.mark.parametrize("case", sorted(ERRORS))
def test_real_copilot_error_paths_end_with_their_named_reason(
    tmp_path: Path, copilot: str, servers, case: str
) -> None:
    build, extra, kind, runs = ERRORS[case]
    server = servers(copilot_scripts(build=build))
    # only the build runs copilot; the others answer from a script
    roles = {"build": copilot_role(copilot, server.url, extra=extra)}
    limits = f"[limits]\nagent_retries = {runs - 1}\nmax_dev_retries = 0\n"
    repo = make_project(tmp_path, roles, extra=limits)

    proc = run_ticket(repo, TICKET_ENV, timeout=240)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", "failed"), summary
    assert kind in summary["error"]
    calls = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    assert [r["error_kind"] for r in calls] == [kind] * runs
    if case == "model_http_500":
        # Copilot's own retries (5 a call), then the named failure; the status is in it
        assert "500" in calls[0]["error"]
        assert len(server.played(BUILD)) == runs * 6
        assert all(r["input_tokens"] == 0 for r in calls)
    if case == "hang":
        assert_killed_at_timeout(calls, extra)
        # the turn that was answered before the hang is counted, and priced
        assert [(r["input_tokens"], r["output_tokens"]) for r in calls] == [(100, 20)] * runs
        assert calls[0]["cost_usd"] == pytest.approx(STEP_COST, rel=1e-6)
    # the role's tokens are those of every turn the server answered, failed calls' too
    scripts = copilot_scripts(build=build)
    answered = [r for r in server.requests if r.script and _answered(scripts[r.script], r.step)]
    assert sum(r["input_tokens"] + r["output_tokens"] for r in calls) == 120 * len(answered)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, dirs=[repo / ".phasegate" / "agents"])


def _answered(steps: Sequence[Step], index: int | None) -> bool:
    """Whether the scripted server answered step ``index`` of ``steps`` (no error, no hang)."""
    if index is None or index >= len(steps):
        return False
    return steps[index].status == 200 and not steps[index].hang


@slow
def test_an_anthropic_provider_is_driven_through_the_bindings_env(
    tmp_path: Path, copilot: str, servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = servers({"*": [Step(text="planned", input_tokens=70, output_tokens=9)]})
    monkeypatch.setenv(KEY_VAR, SENTINEL)
    cwd = tmp_path / "worktree"
    cwd.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=cwd, check=True)
    binding = RoleBinding(
        runner="copilot",
        executable=copilot,
        model="claude-sonnet-4.6",
        base_url=server.url,  # Copilot adds /v1/messages itself
        api_key_env=KEY_VAR,
        env={"COPILOT_PROVIDER_TYPE": "anthropic"},
        input_usd_per_mtok=IN_USD,
        output_usd_per_mtok=OUT_USD,
    )
    request = AgentRequest(
        workflow_id="wf",
        phase="planning",
        role="plan",
        session_line="main",
        prompt="Plan it.",
        cwd=cwd,
        timeout_s=60,
        read_only=True,
        state_dir=tmp_path / "state",
    )
    result = CopilotRunner(binding).run(request, threading.Event())
    assert result.ok, result.error
    assert result.text == "planned"
    assert (result.input_tokens, result.output_tokens) == (70, 9)
    assert result.cost_usd == pytest.approx((70 * IN_USD + 9 * OUT_USD) / 1e6, rel=1e-6)
    [sent] = server.requests
    assert sent.path == "/v1/messages" and sent.key_sha == key_sha(SENTINEL)
    assert {tool["name"] for tool in sent.body["tools"]} == set(READ_ONLY_TOOLS)
