"""The opencode runner: whole workflows with the real ``opencode`` CLI, its model scripted.

The CLI is the npm package .ci/run installs in .ci/node (``PHASEGATE_OPENCODE_BIN``
points at another); it talks OpenAI chat completions, streaming, to
``ScriptedModelServer`` on 127.0.0.1 through the OpenAI-compatible provider the
runner configures. Its tools are opencode's own: ``write`` (``filePath``,
``content``), ``read`` (``filePath``), ``bash`` (``command``, ``description``).
opencode retries a model error five times, 2 s to 30 s apart unless the answer
says otherwise: this module's server says ``Retry-After-Ms: 0`` on its error
answers, as a provider may, so an error path takes seconds. The first tests
need no CLI: they pin how the runner reads opencode's events and configures it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.opencode import (
    BUILD_PERMISSION,
    READ_ONLY_PERMISSION,
    OpencodeRunner,
    _project_configs,
    _undo_schema_stamps,
    parse_events,
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

SENTINEL = "sk-sentinel-4f1e9c2b7a3d5e6f"
OTHER_KEY = "sk-other-provider-key-77aa55"
VERIFIER_KEY = "dummy-verifier-key-0000"
KEY_VAR = "SCRIPTED_MODEL_KEY"

#: What a ticket's run hands phasegate: the key the bindings name and another one they do not.
TICKET_ENV = {KEY_VAR: SENTINEL, "OPENAI_API_KEY": OTHER_KEY}
KEYS = (SENTINEL,)


READ_TOOLS = {"read", "grep", "glob"}


def write(path: str, content: str) -> ToolCall:
    return ToolCall("write", {"filePath": path, "content": content})


def bash(command: str) -> ToolCall:
    return ToolCall("bash", {"command": command, "description": "run it"})


def opencode_scripts(
    build: Sequence[Step] | None = None, review: Sequence[Step] | None = None
) -> dict[str, list[Step]]:
    return role_scripts(
        build
        or [
            Step(tools=(write("feature.txt", "the feature\n"),)),
            Step(text="Created feature.txt."),
        ],
        [
            Step(tools=(ToolCall("read", {"filePath": "feature.txt"}),)),
            Step(text="feature.txt holds the feature.\nVERDICT: confirmed"),
        ],
        review=review,
    )


def opencode_role(exe: str, url: str, *, key: str | None = None, extra: str = "") -> str:
    """A role bound to the real opencode; ``key`` set puts the key in the binding's env."""
    return role_toml(
        "opencode",
        exe,
        model="scripted-model",
        base_url=url + "/v1",
        timeout=60,
        key_env=KEY_VAR,
        env={KEY_VAR: key} if key is not None else None,
        extra=extra,
    )


servers = scripted_servers("Retry-After-Ms")


@pytest.fixture
def opencode() -> str:
    return agent_cli("opencode")


# -- without the CLI: how the runner reads events and configures opencode -----------


def _event(kind: str, part: dict[str, Any], session: str = "ses_1") -> str:
    return json.dumps({"type": kind, "sessionID": session, "part": part})


def test_parse_events_sums_every_step_with_cache_and_reasoning() -> None:
    tokens = {"input": 70, "output": 15, "reasoning": 5, "cache": {"read": 30, "write": 2}}
    stdout = "\n".join(
        [
            "not json",
            _event("text", {"messageID": "m1", "text": "Looking."}),
            _event("step_finish", {"tokens": tokens, "cost": 0.25}),
            _event("text", {"messageID": "m2", "text": "The answer, "}),
            _event("text", {"messageID": "m2", "text": "in two parts."}),
            _event("step_finish", {"tokens": tokens, "cost": "junk"}),
        ]
    )
    parsed = parse_events(stdout)
    assert parsed["session_id"] == "ses_1"
    assert parsed["text"] == "The answer, in two parts."
    assert (parsed["input_tokens"], parsed["output_tokens"]) == (2 * 102, 2 * 20)
    assert parsed["cost_usd"] == 0.25 and parsed["steps"] == 2
    assert parsed["refused"] == [] and parsed["error"] is None


def test_parse_events_finds_refused_calls_and_errors() -> None:
    not_offered = {"status": "error", "error": "Model tried to call unavailable tool 'write'."}
    asked = {"status": "error", "error": "The user rejected permission to use this specific tool"}
    invalid = {
        "status": "completed",
        "input": {"tool": "bash", "error": "Model tried to call unavailable tool 'bash'."},
    }
    failed = {"status": "error", "error": "EROFS: read-only file system, open '/x'"}
    error = {"name": "APIError", "data": {"message": "boom", "statusCode": 500}}
    stdout = "\n".join(
        [
            _event("tool_use", {"tool": "write", "state": not_offered}),
            _event("tool_use", {"tool": "edit", "state": asked}),
            _event("tool_use", {"tool": "invalid", "state": invalid}),
            _event("tool_use", {"tool": "write", "state": failed}),
            json.dumps({"type": "error", "sessionID": "ses_1", "error": error}),
        ]
    )
    parsed = parse_events(stdout)
    # a write the sandbox refused is no permission refusal (it is a sandbox_denied)
    assert parsed["refused"] == ["write", "edit", "bash"]
    assert parsed["error"] == ("APIError", 500, "boom")


def _request(tmp_path: Path, *, read_only: bool, session_id: str | None = None) -> AgentRequest:
    return AgentRequest(
        workflow_id="wf",
        phase="development",
        role="review" if read_only else "build",
        session_line="main",
        prompt="do it",
        cwd=tmp_path,
        timeout_s=60,
        read_only=read_only,
        session_id=session_id,
        state_dir=tmp_path / "state",
    )


def test_the_config_gives_read_only_roles_reading_and_the_build_no_subagent(
    tmp_path: Path,
) -> None:
    binding = RoleBinding(
        runner="opencode",
        model="qwen/qwen3-coder",
        base_url="http://127.0.0.1:9/v1",
        api_key_env=KEY_VAR,
        input_usd_per_mtok=IN_USD,
        output_usd_per_mtok=OUT_USD,
    )
    runner = make_runner(binding, tmp_path)
    assert isinstance(runner, OpencodeRunner)
    key = tmp_path / "key"
    read_only = runner.config(_request(tmp_path, read_only=True), key)
    assert read_only["permission"] == READ_ONLY_PERMISSION
    allowed = {tool for tool, rule in READ_ONLY_PERMISSION.items() if rule == "allow"}
    assert allowed == READ_TOOLS | {"list"}
    assert next(iter(READ_ONLY_PERMISSION)) == "*"  # first: the later rules win over it
    build = runner.config(_request(tmp_path, read_only=False), key)
    assert build["permission"] == BUILD_PERMISSION
    assert BUILD_PERMISSION["task"] == "deny" and BUILD_PERMISSION["*"] == "allow"
    # a model id with a slash stays whole under phasegate's provider
    assert build["model"] == "phasegate/qwen/qwen3-coder" == build["small_model"]
    provider = build["provider"]["phasegate"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:9/v1", "apiKey": f"{{file:{key}}}"}
    cost = provider["models"]["qwen/qwen3-coder"]["cost"]
    assert (cost["input"], cost["output"], cost["cache_read"]) == (IN_USD, OUT_USD, IN_USD)
    assert build["snapshot"] is False and build["share"] == "disabled"
    # the role's permission is also its agent's own, which wins over the top-level one
    assert build["agent"]["phasegate"]["permission"] == BUILD_PERMISSION
    assert read_only["agent"]["phasegate"]["permission"] == READ_ONLY_PERMISSION
    argv = runner.argv(_request(tmp_path, read_only=False, session_id="ses_9"))
    assert argv[1:6] == ["run", "--format", "json", "--agent", "phasegate"]
    assert argv[argv.index("--session") + 1] == "ses_9"
    assert argv[argv.index("--model") + 1] == "phasegate/qwen/qwen3-coder"
    assert "--title" in argv  # no extra, unreported title call
    # without base_url the model is opencode's provider/model and no provider is written
    plain = OpencodeRunner(RoleBinding(runner="opencode", model="anthropic/claude-sonnet-4-5"))
    assert "provider" not in plain.config(_request(tmp_path, read_only=True), None)


def test_only_opencodes_schema_stamp_on_a_project_config_is_undone(tmp_path: Path) -> None:
    stamped, edited = tmp_path / "opencode.json", tmp_path / ".opencode" / "opencode.jsonc"
    edited.parent.mkdir()
    stamped.write_text('  {"model": "x/y"}\n')
    edited.write_text('{"model": "x/y"}\n')
    before = _project_configs(tmp_path)
    stamp = '{\n  "$schema": "https://opencode.ai/config.json",'  # as opencode 1.18.33 writes it
    stamped.write_text(stamp + '"model": "x/y"}\n')
    edited.write_text(stamp + '"model": "x/z"}\n')  # the agent changed it too: its change
    _undo_schema_stamps(before)
    assert stamped.read_text() == '  {"model": "x/y"}\n'
    assert edited.read_text() == stamp + '"model": "x/z"}\n'


def test_an_opencode_binding_needs_a_model() -> None:
    with pytest.raises(ValueError, match="needs a `model`"):
        RoleBinding(runner="opencode")
    with pytest.raises(ValueError, match="max_turns"):
        RoleBinding(runner="opencode", model="m", max_turns=3)


# -- with the real CLI ---------------------------------------------------------------


@slow
def test_a_whole_workflow_with_every_role_on_the_real_opencode_resuming_the_review_session(
    tmp_path: Path, opencode: str, servers
) -> None:
    server = servers({**two_review_rounds(), **opencode_scripts()})
    roles = {
        role: opencode_role(opencode, server.url)
        for role in ("plan", "plan_review", "build", "review")
    }
    roles["verification"] = opencode_role(opencode, server.url, key=VERIFIER_KEY)
    repo = make_project(tmp_path, roles)

    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["dev_round"]) == ("completed", 2), summary
    assert git(repo, "show", "main:feature.txt") == "the feature"

    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "opencode", "ok")
        for role in ("plan", "plan_review", "build", "review", "build", "review", "verification")
    ]
    assert all(r["session_id"] and r["session_id"].startswith("ses_") for r in runs)
    # every model request is a turn of the main loop (no title call), each reported
    # 100 + 20 tokens, priced by opencode at the binding's prices
    requests = [r for r in server.requests if r.script]
    assert len(requests) == len(server.requests) == 10
    assert summary["tokens"] == 120 * len(requests) == detail["workflow"]["tokens"]
    assert summary["cost_usd"] == pytest.approx(len(requests) * STEP_COST, rel=1e-6)
    assert [r["cost_usd"] for r in runs if r["role"] == "build"] == [
        pytest.approx(2 * STEP_COST, rel=1e-6)
    ] * 2
    # read-only roles were offered reading tools only; the build its edits and commands
    for marker in (PLAN, PLAN_REVIEW, ROUND_1, ROUND_2, VERIFY):
        assert offered_tools(server, marker) == READ_TOOLS, marker
    assert {"write", "edit", "bash"} <= offered_tools(server, BUILD)
    assert "task" not in offered_tools(server, BUILD)
    # the verifier read the file through opencode's read tool
    assert "the feature" in json.dumps(server.played(VERIFY)[-1].body["messages"])
    assert_review_resumed(server, runs)

    # the key reached the roles that name it, the verifier its own, never the other key
    assert {r.key_sha for r in server.played(BUILD)} == {key_sha(SENTINEL)}
    assert {r.key_sha for r in server.played(VERIFY)} == {key_sha(VERIFIER_KEY)}
    assert key_sha(OTHER_KEY) not in {r.key_sha for r in requests}
    assert_output_streamed(repo, summary["id"], roles)
    assert_no_keys(
        repo,
        KEYS,
        proc.stdout,
        proc.stderr,
        json.dumps(detail),
        dirs=[repo / ".phasegate" / "agents"],
    )
    # opencode kept its sessions in the workflow's own home, none of them outside
    homes = list((repo / ".phasegate" / "agents").glob("*/opencode-home"))
    assert len(homes) == 1 and list(homes[0].rglob("opencode.db"))
    assert not list((repo / ".phasegate" / "agents").glob("*/opencode-call-*"))


#: A project's opencode config that would let its agents write: an agent's own
#: permission wins over the top-level one in opencode.
PERMISSIVE_PROJECT = {
    "opencode.json": json.dumps(
        {
            "default_agent": "mine",
            "permission": {"*": "allow"},
            "agent": {
                "mine": {"mode": "primary", "permission": {"*": "allow"}},
                "phasegate": {"permission": {"*": "allow", "edit": "allow", "bash": "allow"}},
            },
        }
    ),
    ".opencode/agents/build.md": (
        "---\ndescription: builds\nmode: primary\npermission:\n  edit: allow\n"
        "  bash: allow\n---\nYou build.\n"
    ),
}


@slow
def test_a_read_only_roles_edit_is_refused_and_fails_the_call(
    tmp_path: Path, opencode: str, servers
) -> None:
    # even in a project whose own opencode config allows every tool to its agents
    tries = [
        Step(tools=(write("sneaky.txt", "x\n"),)),
        Step(tools=(bash("touch sneaky.txt"),)),
        Step(text="Could not write.\nVERDICT: approve"),
    ]
    server = servers(opencode_scripts(review=tries))
    repo = make_project(
        tmp_path,
        {role: opencode_role(opencode, server.url) for role in ("review",)},
        extra="[limits]\nagent_retries = 0\n",
        files=PERMISSIVE_PROJECT,
    )
    proc = run_ticket(repo, TICKET_ENV)
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("pr_review", "failed"), summary
    assert "permission_denied" in summary["error"]
    reviews = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "review"]
    assert [(r["outcome"], r["error_kind"]) for r in reviews] == [("failed", "permission_denied")]
    assert "write" in reviews[0]["error"] and "bash" in reviews[0]["error"]
    # opencode never offered the tools: the calls were refused before anything ran
    assert offered_tools(server, REVIEW) == READ_TOOLS
    assert not list(repo.parent.rglob("sneaky.txt"))
    # opencode stamps a "$schema" into the project's opencode.json at every start; the
    # runner put it back each time, so the change is the build's file alone
    changed = git(repo, "diff", "--name-only", "main", summary["branch_name"])
    assert changed.splitlines() == ["feature.txt"]
    assert "sneaky.txt" not in git(repo, "log", "--all", "--name-only", "--format=")
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, dirs=[repo / ".phasegate" / "agents"])


ERRORS = {
    # name: (build steps, binding extra, kind, runs of the build); each ends development failed
    "model_http_500": ([Step(status=500)], "", "model_error", 2),
    # one answered turn, then the model never answers: killed, its finished turn counted
    "hang": (
        [Step(tools=(write("feature.txt", "f\n"),)), Step(hang=True)],
        # long enough for opencode's start and first turn on a loaded two-core machine
        # (8 s was not; 20 s was not once, its second call killed before its first turn)
        "timeout = 40\n",
        "timeout",
        1,  # not retried: the wait is the test's cost, and the retry is the phases' own
    ),
}


@slow
@pytest.mark.parametrize("case", sorted(ERRORS))
def test_real_opencode_error_paths_end_with_their_named_reason(
    tmp_path: Path, opencode: str, servers, case: str
) -> None:
    build, extra, kind, runs = ERRORS[case]
    server = servers(opencode_scripts(build=build))
    # only the build runs opencode; the others answer from a script
    roles = {"build": opencode_role(opencode, server.url, extra=extra)}
    limits = f"[limits]\nagent_retries = {runs - 1}\nmax_dev_retries = 0\n"
    repo = make_project(tmp_path, roles, extra=limits)

    proc = run_ticket(repo, TICKET_ENV, timeout=240)
    assert (proc.returncode, bool(proc.stdout)) == (1, True), proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("development", "failed"), summary
    assert kind in summary["error"]
    calls = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "build"]
    assert [r["error_kind"] for r in calls] == [kind] * runs
    if case == "model_http_500":
        # opencode's own retries (up to 5 a call: a call made 5 tries, not 6, once in a
        # loaded CI run), then the named failure; the status is in it
        assert "500" in calls[0]["error"]
        assert runs * 3 <= len(server.played(BUILD)) <= runs * 6
        assert all(r["input_tokens"] == 0 for r in calls)
    if case == "hang":
        assert_killed_at_timeout(calls, extra)
        # the turn that was answered before the hang is counted, and priced
        assert [(r["input_tokens"], r["output_tokens"]) for r in calls] == [(100, 20)] * runs
        assert calls[0]["cost_usd"] == pytest.approx(STEP_COST, rel=1e-6)
    # the role's tokens are those of every turn the server answered, failed calls' too
    scripts = opencode_scripts(build=build)
    answered = [r for r in server.requests if r.script and _answered(scripts[r.script], r.step)]
    assert sum(r["input_tokens"] + r["output_tokens"] for r in calls) == 120 * len(answered)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, dirs=[repo / ".phasegate" / "agents"])


def _answered(steps: Sequence[Step], index: int | None) -> bool:
    """Whether the scripted server answered step ``index`` of ``steps`` (no error, no hang)."""
    if index is None or index >= len(steps):
        return False
    return steps[index].status == 200 and not steps[index].hang
