"""The gemini runner: whole workflows with the real Gemini CLI, its model scripted.

The CLI is the npm package .ci/run installs (``@google/gemini-cli``, pinned);
``PHASEGATE_GEMINI_BIN`` points the tests at another copy. It talks Gemini's
streamGenerateContent API (``GOOGLE_GEMINI_BASE_URL``) to
``ScriptedModelServer`` (``phasegate.testing.model_gemini``) on 127.0.0.1; its
tools are ``write_file``, ``replace``, ``read_file``, ``run_shell_command``...
The first tests need no CLI: they pin how the runner reads its stream.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.agents.process import ProcessOutcome
from phasegate.agents.runners.gemini import GeminiRunner
from phasegate.agents.runners.gemini_family import parse_stream, transcript_tokens
from phasegate.config.cartridge import RoleBinding
from phasegate.testing import model_gemini
from phasegate.testing.model_server import ScriptedModelServer, Step, ToolCall, key_sha

import agent_cli_kit
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
    processes_under,
    role_scripts,
    role_toml,
    run_ticket,
    show,
    two_review_rounds,
)
from conftest import agent_cli, git, phasegate_cli

pytestmark = pytest.mark.sandboxed
slow = pytest.mark.slow

SENTINEL = "sk-sentinel-4f1e9c2b7a3d5e6f"
VERIFIER_KEY = "dummy-verifier-key-0000"
KEY_VAR = "SCRIPTED_GEMINI_KEY"

#: What a ticket's run hands phasegate: the key the bindings name and another one they do not.
TICKET_ENV = {KEY_VAR: SENTINEL, "GEMINI_API_KEY": SENTINEL}
KEYS = (SENTINEL,)


def write(path: str, content: str) -> ToolCall:
    return ToolCall("write_file", {"file_path": "{cwd}/" + path, "content": content})


def gemini_scripts(build: Sequence[Step] | None = None) -> dict[str, list[Step]]:
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


def gemini_role(exe: str, url: str, *, key: bool = True, extra: str = "") -> str:
    return role_toml(
        "gemini",
        exe,
        model="gemini-2.5-flash",
        base_url=url,
        timeout=60,
        key_env=KEY_VAR if key else None,
        env=None if key else {"GEMINI_API_KEY": VERIFIER_KEY},
        extra=extra,
    )


#: The repository's own Gemini settings: the runner leaves retries to them, and a
#: test wants a scripted error to fail at once, not after ten backed-off attempts.
NO_RETRIES = json.dumps({"general": {"maxAttempts": 1, "retryFetchErrors": False}})


@pytest.fixture
def gemini() -> str:
    wanted = os.environ.get("PHASEGATE_GEMINI_BIN")
    if wanted and not Path(wanted).exists():
        pytest.fail(f"PHASEGATE_GEMINI_BIN={wanted} does not exist (bash .ci/run installs it)")
    return agent_cli("gemini")


# -- how the runner reads Gemini CLI (no CLI needed) ---------------------------------


def _stream(*events: dict[str, Any]) -> str:
    return "\n".join(json.dumps(e) for e in events) + "\n"


INIT = {"type": "init", "session_id": "s-1", "model": "gemini-2.5-flash"}


def _outcome(stdout: str, returncode: int = 0) -> ProcessOutcome:
    return ProcessOutcome(stdout, "", returncode, 1.0)


def _runner() -> GeminiRunner:
    return GeminiRunner(
        RoleBinding(runner="gemini", input_usd_per_mtok=IN_USD, output_usd_per_mtok=OUT_USD)
    )


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


def test_the_answer_follows_the_last_tool_call_and_thinking_counts_as_output(
    tmp_path: Path,
) -> None:
    stdout = _stream(
        INIT,
        {"type": "message", "role": "assistant", "content": "Looking.", "delta": True},
        {"type": "tool_use", "tool_name": "read_file", "tool_id": "t1", "parameters": {}},
        {"type": "tool_result", "tool_id": "t1", "status": "success", "output": "x"},
        {"type": "message", "role": "assistant", "content": "Done ", "delta": True},
        {"type": "message", "role": "assistant", "content": "reading.", "delta": True},
        {
            "type": "result",
            "status": "success",
            # 30 thinking tokens: in the total, not in output_tokens
            "stats": {"input_tokens": 200, "output_tokens": 40, "total_tokens": 270},
        },
    )
    summary = parse_stream(stdout)
    assert (summary.session_id, summary.text) == ("s-1", "Done reading.")
    result = _runner().result(_outcome(stdout), _request(tmp_path))
    assert result.ok and (result.input_tokens, result.output_tokens) == (200, 70)
    assert result.cost_usd == pytest.approx((200 * IN_USD + 70 * OUT_USD) / 1e6)


@pytest.mark.parametrize(
    ("events", "code", "kind"),
    [
        (
            [{"type": "result", "status": "error", "error": {"type": "unknown", "message": "500"}}],
            1,
            "model_error",
        ),
        (
            [{"type": "result", "status": "error", "error": {"type": "FatalTurnLimitedError"}}],
            53,
            "max_turns",
        ),
        (
            [
                {"type": "tool_use", "tool_name": "write_file", "tool_id": "w"},
                {
                    "type": "tool_result",
                    "tool_id": "w",
                    "status": "error",
                    "error": {"type": "tool_not_registered", "message": "not found"},
                },
                {"type": "result", "status": "success", "stats": {}},
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


def test_a_killed_run_counts_the_last_record_of_each_model_message() -> None:
    log = _stream(
        {"id": "m1", "type": "gemini", "tokens": {"input": 1000, "output": 50, "total": 1050}},
        {"id": "m1", "type": "gemini", "tokens": {"input": 1000, "output": 50, "total": 1050}},
        {"id": "m2", "type": "gemini", "tokens": {"input": 300, "output": 5, "thoughts": 7}},
    )
    assert transcript_tokens(log + '{"id": "m3", "tok') == (1300, 62)


def test_the_binding_takes_only_the_keys_gemini_reads_and_maps_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="allowed_tools"):
        RoleBinding(runner="gemini", allowed_tools=["read_file"])
    monkeypatch.setenv(KEY_VAR, SENTINEL)
    binding = RoleBinding(
        runner="gemini", api_key_env=KEY_VAR, base_url="http://127.0.0.1:9", max_turns=3
    )
    runner = make_runner(binding, tmp_path)
    assert isinstance(runner, GeminiRunner)
    assert runner.model_env() == {
        "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9",
        "GEMINI_API_KEY": SENTINEL,
    }
    assert runner.settings(_request(tmp_path))["model"] == {"maxSessionTurns": 3}
    read_only = runner.argv(_request(tmp_path, read_only=True, session_id="s-1"))
    assert read_only[read_only.index("--approval-mode") + 1] == "default"
    assert read_only[-2:] == ["--resume", "s-1"]
    build = runner.argv(_request(tmp_path))
    assert build[build.index("--approval-mode") + 1] == "yolo" and "--resume" not in build


def test_the_scripted_server_plays_gemini_turns_and_masks_its_key() -> None:
    steps = [Step(text="a", tools=(ToolCall("read_file", {"file_path": "{cwd}/x"}),)), Step("b")]
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "- **Workspace Directories:**\n  - /w\n"}]},
            {"role": "user", "parts": [{"text": "marker go"}]},
        ]
    }
    assert model_gemini.prompt_and_turns(body) == ("marker go", 0)
    assert model_gemini.cwd(body) == "/w"
    streamed, chunks = model_gemini.reply(
        "/v1beta/models/m:streamGenerateContent", steps[0], steps[0].tools
    )
    chunks = list(chunks)
    assert streamed and chunks[0]["candidates"][0]["content"]["parts"] == [{"text": "a"}]
    assert chunks[-1]["usageMetadata"]["promptTokenCount"] == 100
    call = chunks[-1]["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call["name"] == "read_file"
    body["contents"] += [
        {"role": "model", "parts": [{"functionCall": call}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {}}}]},
    ]
    assert model_gemini.prompt_and_turns(body) == ("marker go", 1)
    assert model_gemini.is_count_tokens("/v1beta/models/m:countTokens")
    assert model_gemini.error_payload(500, "x")["error"]["status"] == "INTERNAL"
    with ScriptedModelServer({"marker": steps}) as server:
        req = urllib.request.Request(
            server.url + "/v1beta/models/m:generateContent",
            json.dumps(body).encode(),
            {"x-goog-api-key": SENTINEL, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as answer:
            reply = json.loads(answer.read())
    assert reply["candidates"][0]["content"]["parts"] == [{"text": "b"}]
    (recorded,) = server.requests
    assert recorded.headers["x-goog-api-key"] == "***" and recorded.key_sha == key_sha(SENTINEL)


# -- whole workflows with the real CLI -------------------------------------------------


@slow
def test_a_whole_workflow_with_every_role_on_the_real_gemini_cli_resuming_the_review_session(
    tmp_path: Path, gemini: str, server_factory
) -> None:
    server = server_factory({**two_review_rounds(), **gemini_scripts()})
    roles = {
        role: gemini_role(gemini, server.url) for role in ("plan", "plan_review", "build", "review")
    }
    roles["verification"] = gemini_role(gemini, server.url, key=False)
    repo = make_project(tmp_path, roles)

    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["dev_round"]) == ("completed", 2), summary
    # the build's write_file wrote it; it was committed, reviewed, merged
    assert git(repo, "show", "main:feature.txt") == "the feature"

    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "gemini", "ok")
        for role in ("plan", "plan_review", "build", "review", "build", "review", "verification")
    ]
    assert all(r["session_id"] for r in runs)
    assert_review_resumed(server, runs, "contents")
    # every model request reported 100 + 20 tokens, priced by the binding
    requests = [r for r in server.requests if r.script]
    assert len(requests) == 10  # one turn a role's call, two for build and verification
    assert summary["tokens"] == 120 * len(requests) == detail["workflow"]["tokens"]
    assert summary["cost_usd"] == pytest.approx(len(requests) * STEP_COST, rel=1e-6)
    status = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    assert status[0]["tokens"] == summary["tokens"]
    builds = [r for r in runs if r["role"] == "build"]
    assert (builds[0]["input_tokens"], builds[0]["output_tokens"]) == (200, 40)

    # the named key reached its roles as GEMINI_API_KEY, never the verifier
    assert {r.key_sha for r in requests if r.script != VERIFY} == {key_sha(SENTINEL)}
    assert {r.key_sha for r in server.played(VERIFY)} == {key_sha(VERIFIER_KEY)}
    # read-only roles are not even offered the edit and shell tools; the build is
    offered = {
        r.script: {f["name"] for t in r.body.get("tools", []) for f in t["functionDeclarations"]}
        for r in requests
    }
    assert {"write_file", "replace", "run_shell_command"} <= offered[BUILD]
    for role in (PLAN, PLAN_REVIEW, ROUND_1, ROUND_2, VERIFY):
        assert not offered[role] & {"write_file", "replace", "run_shell_command"}, role
    # the verifier's read_file saw the merged file
    assert "the feature" in json.dumps(server.played(VERIFY)[-1].body["contents"][-1])
    assert_output_streamed(repo, summary["id"], roles)
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr, json.dumps(detail))


@slow
def test_a_read_only_role_that_tries_to_edit_is_refused(
    tmp_path: Path, gemini: str, server_factory
) -> None:
    scripts = {
        **gemini_scripts(),
        REVIEW: [Step(tools=(write("stray.txt", "x"),)), Step(text="VERDICT: approve")],
    }
    server = server_factory(scripts)
    roles = {role: gemini_role(gemini, server.url) for role in ("review",)}
    repo = make_project(tmp_path, roles, extra="[limits]\nagent_retries = 0\n")
    proc = run_ticket(repo, TICKET_ENV)
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["current_phase"], summary["status"]) == ("pr_review", "failed")
    reviews = [r for r in show(repo, summary["id"])["agent_runs"] if r["role"] == "review"]
    assert [r["error_kind"] for r in reviews] == ["permission_denied"]
    assert "write_file" in reviews[0]["error"]
    # the CLI refused the call: the model was told, nothing was written
    told = json.dumps(server.played(REVIEW)[-1].body["contents"][-1])
    assert "tool_not_registered" in told or "not found" in told
    assert not list((repo / ".phasegate" / "worktrees").rglob("stray.txt"))
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


ERRORS = {
    # name: (build steps, binding extra, error kind, a phrase of the error, status, runs)
    "model_http_500": ([Step(status=500)], "", "model_error", "500", "failed", 2),
    "hang": ([Step(hang=True)], "timeout = 6\n", "timeout", "within 6s", "failed", 2),
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
def test_real_gemini_error_paths_end_with_their_named_reason(
    tmp_path: Path, gemini: str, server_factory, case: str
) -> None:
    steps, extra, kind, phrase, status, runs = ERRORS[case]
    server = server_factory({**gemini_scripts(), BUILD: steps})
    # only the build runs gemini; the other roles answer from a script
    roles = {"build": gemini_role(gemini, server.url, extra=extra)}
    limits = "[limits]\nagent_retries = 1\nmax_dev_retries = 1\n"
    repo = make_project(tmp_path, roles, extra=limits)

    proc = run_ticket(repo, TICKET_ENV, timeout=180)
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
    if case == "model_http_500":
        assert len(server.played(BUILD)) == runs  # the repository's settings: no retries
    if case == "hang":
        assert_killed_at_timeout(builds, extra)
        assert processes_under(repo) == []  # the CLI and its relaunched child were killed
    assert_no_keys(repo, KEYS, proc.stdout, proc.stderr)


@slow
def test_gemini_cli_s_session_clean_up_never_deletes_a_workflows_session(
    tmp_path: Path, gemini: str, server_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Gemini CLI deletes, at each start and without waiting for it, the session logs
    # it finds older than 30 days (or unusable): it once took a workflow's sessions
    # in CI. A session made to look 6 years old outlives a later run that gives the
    # clean-up time (its model answers after 3 s), and is resumed after it.
    server = server_factory({"*": [Step(text="an answer", delay_s=3.0)]})
    monkeypatch.setenv(KEY_VAR, SENTINEL)
    binding = RoleBinding(
        runner="gemini",
        executable=gemini,
        model="gemini-2.5-flash",
        base_url=server.url,
        api_key_env=KEY_VAR,
    )
    runner = GeminiRunner(binding)
    (tmp_path / "wt").mkdir()
    request = _request(tmp_path / "wt", state_dir=tmp_path / "state", read_only=True)
    first = runner.run(request, threading.Event())
    assert first.ok and first.session_id, first.error
    [log] = (tmp_path / "state" / "gemini-home" / ".gemini" / "tmp").glob("*/chats/*.jsonl")
    log.write_text(re.sub(r"\d{4}-\d{2}-\d{2}T", "2020-01-01T", log.read_text()))
    os.utime(log, (0, 0))
    other = runner.run(request, threading.Event())  # a session of its own
    assert other.ok and other.session_id != first.session_id
    assert log.exists()
    again = runner.run(replace(request, session_id=first.session_id), threading.Event())
    assert again.ok and again.session_id == first.session_id


@slow
def test_gemini_cli_s_own_fake_responses_replay_without_a_server(
    tmp_path: Path, gemini: str
) -> None:
    # --fake-responses (hidden): one JSON line a model call, played in order, in place
    # of the model client. No HTTP (no key, base URL, status or delay is exercised),
    # paths written out in full: a replay aid, not the scripted server's equal.
    cwd = tmp_path / "wt"
    cwd.mkdir()

    def streamed(parts: list[dict[str, Any]]) -> str:
        chunk = {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20},
        }
        return json.dumps({"method": "generateContentStream", "response": [chunk]})

    call = {"name": "write_file", "args": {"file_path": str(cwd / "f.txt"), "content": "f\n"}}
    fake = tmp_path / "fake.jsonl"
    fake.write_text(
        streamed([{"functionCall": call}]) + "\n" + streamed([{"text": "Done."}]) + "\n"
    )
    binding = RoleBinding(
        runner="gemini",
        executable=gemini,
        model="gemini-2.5-flash",
        env={"GEMINI_API_KEY": VERIFIER_KEY},
        extra_args=["--fake-responses", str(fake)],
    )
    result = GeminiRunner(binding).run(
        _request(cwd, state_dir=tmp_path / "state"), threading.Event()
    )
    assert result.ok, result.error
    assert (result.text, result.input_tokens, result.output_tokens) == ("Done.", 200, 40)
    assert (cwd / "f.txt").read_text() == "f\n"


def make_project(tmp_path: Path, roles: Mapping[str, str], *, extra: str = "") -> Path:
    return agent_cli_kit.make_project(
        tmp_path, roles, extra=extra, files={".gemini/settings.json": NO_RETRIES}
    )
